"""Feature negotiation against nsqtw's nsqd: TLS, snappy and deflate upgrades, each confirmed by
an OK through the new layer, with nsqtw's client and with raw bytes; --tls-required policies."""

from __future__ import annotations

import json
import ssl
import struct
import zlib

import pytest
import pytest_twisted
import treq
from twisted.internet import defer, reactor, threads

from nsqtw.client import Config, Consumer, Producer
from nsqtw.embed import start_nsqd
from nsqtw.testing import command, connect_raw, identify_command
from nsqtw.testing.certs import make_certificates

pytestmark = pytest.mark.e2e


@pytest.fixture
def certs(tmp_path):
    return make_certificates(str(tmp_path))


async def _round_trip(nsqd, config: Config, n: int = 20):
    producer = Producer(nsqd.tcp_address, config)
    await producer.multi_publish("secure", [b"m%d" % i for i in range(n)])
    got = []
    done = defer.Deferred()

    def handle(msg):
        got.append(msg.body)
        if len(got) == n and not done.called:
            done.callback(None)

    consumer = Consumer("secure", "c", handle, config.copy(max_in_flight=10))
    await consumer.connect_to_nsqd(nsqd.tcp_address)
    await done.addTimeout(10, reactor)
    await consumer.stop()
    await producer.stop()
    return got


@pytest_twisted.ensureDeferred
async def test_tls_round_trip_and_stats(certs):
    """tls_v1 upgrades to TLS; messages flow both ways; /stats reports tls and its version."""
    nsqd = await start_nsqd(tls_cert=certs["server"], tls_key=certs["server_key"])
    try:
        config = Config(tls_v1=True, tls_root_ca_file=certs["ca"])
        got = await _round_trip(nsqd, config)
        assert sorted(got) == sorted(b"m%d" % i for i in range(20))
        producer = Producer(nsqd.tcp_address, config)
        await producer.publish("secure", b"x")
        client = next(c for c in nsqd._broker.clients.values() if c.pub_counts)
        from nsqtw.nsqd.stats.snapshot import client_stats
        st = client_stats(client)
        assert st["tls"] is True and st["tls_version"].startswith("TLS1.")
        await producer.stop()
    finally:
        await nsqd.stop()


@pytest.mark.parametrize("feature", ["snappy", "deflate"])
@pytest_twisted.ensureDeferred
async def test_compression_round_trip(feature):
    """snappy and deflate negotiate with nsqtw's client and carry every message."""
    nsqd = await start_nsqd()
    try:
        config = Config(**{feature: True, "deflate_level": 3})
        got = await _round_trip(nsqd, config, n=50)
        assert len(got) == 50
        sub = next(c for c in nsqd._broker.clients.values() if c.state >= 3) if any(
            c.state >= 3 for c in nsqd._broker.clients.values()) else None
        assert sub is None or getattr(sub, feature)
    finally:
        await nsqd.stop()


@pytest_twisted.ensureDeferred
async def test_raw_deflate_upgrade_answers_compressed_ok():
    """After the JSON answer, nsqd's OK and every later frame are raw DEFLATE, level capped."""
    nsqd = await start_nsqd(max_deflate_level=4)
    try:
        raw = await connect_raw(nsqd.tcp_port)
        raw.send(identify_command(feature_negotiation=True, deflate=True, deflate_level=9))
        answer = json.loads(await raw.response())
        assert answer["deflate"] is True and answer["deflate_level"] == 4 and answer["snappy"] is False
        await defer.succeed(None)
        # everything after the JSON frame is compressed: decode the raw stream ourselves
        d = zlib.decompressobj(-15)
        comp = zlib.compressobj(4, zlib.DEFLATED, -15)
        waited = 0
        while b"OK" not in d.decompress(raw.received[raw.received.index(b"}") + 1:]) and waited < 50:
            await threads.deferToThread(lambda: None)
            waited += 1
        raw.send(comp.compress(command("PUB", "z") + struct.pack(">i", 3) + b"abc") + comp.flush(zlib.Z_SYNC_FLUSH))
        for _ in range(100):
            if "z" in nsqd._broker.topics:
                break
            await threads.deferToThread(lambda: None)
        assert nsqd._broker.find_topic("z").message_count == 1
        await raw.close()
    finally:
        await nsqd.stop()


@pytest_twisted.ensureDeferred
async def test_snappy_and_deflate_together_is_identify_failed():
    """Asking for both compressions is E_IDENTIFY_FAILED, fatal."""
    nsqd = await start_nsqd()
    try:
        raw = await connect_raw(nsqd.tcp_port)
        raw.send(identify_command(feature_negotiation=True, deflate=True, snappy=True))
        assert await raw.error() == b"E_IDENTIFY_FAILED cannot enable both deflate and snappy compression"
        await raw.closed
    finally:
        await nsqd.stop()


@pytest_twisted.ensureDeferred
async def test_features_off_answer_false():
    """--snappy=false --deflate=false and no certificate: everything negotiates false."""
    nsqd = await start_nsqd(snappy=False, deflate=False)
    try:
        raw = await connect_raw(nsqd.tcp_port)
        raw.send(identify_command(feature_negotiation=True, deflate=True, snappy=True, tls_v1=True))
        answer = json.loads(await raw.response())
        assert (answer["tls_v1"], answer["snappy"], answer["deflate"]) == (False, False, False)
        raw.send(command("NOP") + command("SUB", "t", "c"))
        assert await raw.response() == b"OK"
        await raw.close()
    finally:
        await nsqd.stop()


@pytest_twisted.ensureDeferred
async def test_tls_required_refuses_plain_commands_and_plain_http(certs):
    """--tls-required=true: commands before TLS are fatal E_INVALID; plain HTTP answers 403
    TLS_REQUIRED with the HTTPS port, and HTTPS serves the API."""
    nsqd = await start_nsqd(tls_cert=certs["server"], tls_key=certs["server_key"], tls_required=2,
                            https_address="127.0.0.1:0")
    try:
        raw = await connect_raw(nsqd.tcp_port)
        raw.send(command("SUB", "t", "c"))
        assert await raw.error() == b"E_INVALID cannot SUB in current state (TLS required)"
        await raw.closed
        r = await treq.get(f"http://{nsqd.http_address}/ping")
        body = json.loads(await r.content())
        assert r.code == 403 and body == {"message": "TLS_REQUIRED", "https_port": nsqd.https_port}
        ctx = ssl.create_default_context(cafile=certs["ca"])

        def https_ping():
            import urllib.request
            with urllib.request.urlopen(f"https://127.0.0.1:{nsqd.https_port}/ping", context=ctx) as resp:
                return resp.status, resp.read()

        assert await threads.deferToThread(https_ping) == (200, b"OK")
        got = await _round_trip(nsqd, Config(tls_v1=True, tls_root_ca_file=certs["ca"]), n=5)
        assert len(got) == 5
    finally:
        await nsqd.stop()


@pytest.mark.parametrize("policy", ["require", "require-verify"])
@pytest_twisted.ensureDeferred
async def test_client_certificate_policies(certs, policy):
    """require / require-verify: a client with a certificate from the CA gets through."""
    nsqd = await start_nsqd(tls_cert=certs["server"], tls_key=certs["server_key"], tls_client_auth_policy=policy,
                            tls_root_ca_file=certs["ca"])
    try:
        config = Config(tls_v1=True, tls_root_ca_file=certs["ca"], tls_cert=certs["client"], tls_key=certs["client_key"])
        got = await _round_trip(nsqd, config, n=3)
        assert len(got) == 3
    finally:
        await nsqd.stop()
