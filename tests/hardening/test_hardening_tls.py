"""
TLS refusals (the happy paths are in tests/negotiation): client-certificate
policies (``require``: no certificate is refused, any certificate passes;
``require-verify``: a certificate from another CA is refused),
``--tls-min-version=tls1.3`` refusing a TLS 1.2-only client on the TCP
upgrade and on the HTTPS listener, the same policies on HTTPS, and garbage
where a TLS handshake should be.  Each refused connection leaves no client
behind in the broker, nothing is published, and nothing is logged as an
unhandled error.

Clients are Python's ``ssl`` over blocking sockets in a thread (so the TLS
version and certificate are exactly what each case needs), plus nsqtw's own
client for the no-certificate case.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import struct
import urllib.error
import urllib.request
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer, threads

from nsqtw.client import Config, Producer
from nsqtw.embed import start_nsqd
from nsqtw.protocol.frames import MAGIC_V2
from nsqtw.testing.certs import make_certificates

from hardening_support import LogWatch, until

pytestmark = pytest.mark.e2e


@pytest.fixture
def certs(tmp_path) -> dict[str, str]:
    os.mkdir(tmp_path / "ca1")
    return make_certificates(str(tmp_path / "ca1"))


@pytest.fixture
def other_ca(tmp_path) -> dict[str, str]:
    """A second, unrelated CA with its own client certificate."""
    os.mkdir(tmp_path / "ca2")
    return make_certificates(str(tmp_path / "ca2"), client_cn="stranger")


def _read_frame(sock: Any) -> tuple[int, bytes]:
    head = b""
    while len(head) < 8:
        chunk = sock.recv(8 - len(head))
        if not chunk:
            raise ConnectionError("closed")
        head += chunk
    size, ftype = struct.unpack(">ii", head)
    data = b""
    while len(data) < size - 4:
        chunk = sock.recv(size - 4 - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return ftype, data


def tls_upgrade(port: int, ca: str, cert: str | None = None, key: str | None = None,
                max_version: ssl.TLSVersion | None = None) -> str:
    """IDENTIFY tls_v1, then the TLS handshake and a PUB over TLS: "ok", or "refused: <why>" (blocking)."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        ident = json.dumps({"feature_negotiation": True, "tls_v1": True}).encode()
        raw.sendall(MAGIC_V2 + b"IDENTIFY\n" + struct.pack(">i", len(ident)) + ident)
        ftype, data = _read_frame(raw)
        assert ftype == 0 and json.loads(data)["tls_v1"] is True, data
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.load_verify_locations(ca)
        if max_version is not None:
            ctx.maximum_version = max_version
        if cert:
            ctx.load_cert_chain(cert, key)
        try:
            tls = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
            assert _read_frame(tls) == (0, b"OK")
            tls.sendall(b"PUB secure\n" + struct.pack(">i", 2) + b"hi")
            assert _read_frame(tls) == (0, b"OK")
            tls.close()
            return "ok"
        except (ssl.SSLError, ConnectionError, OSError) as e:
            return f"refused: {type(e).__name__}: {e}"
    finally:
        raw.close()


def https_get(port: int, ca: str, cert: str | None = None, key: str | None = None,
              max_version: ssl.TLSVersion | None = None) -> str:
    ctx = ssl.create_default_context(cafile=ca)
    if max_version is not None:
        ctx.maximum_version = max_version
    if cert:
        ctx.load_cert_chain(cert, key)
    try:
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/ping", context=ctx, timeout=5) as r:
            return f"{r.status} {r.read().decode()}"
    except (ssl.SSLError, urllib.error.URLError, ConnectionError, OSError) as e:
        return f"refused: {type(e).__name__}: {e}"


async def _broker(certs: dict[str, str], **opts: Any) -> Any:
    return await start_nsqd(tls_cert=certs["server"], tls_key=certs["server_key"], https_address="127.0.0.1:0",
                            **opts)


async def _no_clients_left(nsqd: Any) -> None:
    await until(lambda: not nsqd._broker.clients, 5, what="the refused client to be gone")


@pytest_twisted.ensureDeferred
async def test_require_refuses_a_client_without_certificate(certs, other_ca):
    """--tls-client-auth-policy=require: no certificate is refused; any certificate (even another CA's) passes."""
    with LogWatch() as watch:
        nsqd = await _broker(certs, tls_client_auth_policy="require")
        try:
            refused = await threads.deferToThread(tls_upgrade, nsqd.tcp_port, certs["ca"])
            assert refused.startswith("refused: SSLError") and "CERTIFICATE_REQUIRED" in refused, refused
            await _no_clients_left(nsqd)
            assert "secure" not in nsqd._broker.topics
            stranger = await threads.deferToThread(tls_upgrade, nsqd.tcp_port, certs["ca"], other_ca["client"],
                                                   other_ca["client_key"])
            assert stranger == "ok"
            assert (await threads.deferToThread(https_get, nsqd.https_port, certs["ca"])).startswith("refused")
            assert await threads.deferToThread(https_get, nsqd.https_port, certs["ca"], certs["client"],
                                               certs["client_key"]) == "200 OK"
        finally:
            await nsqd.stop()
    assert not watch.bad, watch.describe()


@pytest_twisted.ensureDeferred
async def test_require_refuses_nsqtw_client_without_certificate(certs):
    """nsqtw's own Producer without a certificate fails to publish against require; nothing is published."""
    from twisted.internet import reactor
    nsqd = await _broker(certs, tls_client_auth_policy="require")
    producer = Producer(nsqd.tcp_address, Config(tls_v1=True, tls_root_ca_file=certs["ca"]))
    try:
        with pytest.raises(Exception) as caught:
            await producer.publish("secure", b"x").addTimeout(10, reactor)
        assert not isinstance(caught.value, defer.TimeoutError), "refused, not hung"
        assert "secure" not in nsqd._broker.topics
    finally:
        await producer.stop()
        await nsqd.stop()


@pytest_twisted.ensureDeferred
async def test_require_verify_refuses_another_ca(certs, other_ca):
    """--tls-client-auth-policy=require-verify: a certificate from another CA (and none) is refused on the
    TCP upgrade and on HTTPS; the CA's own client certificate passes."""
    with LogWatch() as watch:
        nsqd = await _broker(certs, tls_client_auth_policy="require-verify", tls_root_ca_file=certs["ca"])
        try:
            for cert, key in ((other_ca["client"], other_ca["client_key"]), (None, None)):
                outcome = await threads.deferToThread(tls_upgrade, nsqd.tcp_port, certs["ca"], cert, key)
                # both CAs are named "nsqtw test CA": the stranger's signature fails against ours
                assert outcome.startswith("refused: SSLError") and any(
                    alert in outcome for alert in ("CERTIFICATE_REQUIRED", "DECRYPT_ERROR", "UNKNOWN_CA",
                                                   "BAD_CERTIFICATE")), outcome
                https = await threads.deferToThread(https_get, nsqd.https_port, certs["ca"], cert, key)
                assert https.startswith("refused"), https
            await _no_clients_left(nsqd)
            assert "secure" not in nsqd._broker.topics
            assert await threads.deferToThread(tls_upgrade, nsqd.tcp_port, certs["ca"], certs["client"],
                                               certs["client_key"]) == "ok"
            assert await threads.deferToThread(https_get, nsqd.https_port, certs["ca"], certs["client"],
                                               certs["client_key"]) == "200 OK"
        finally:
            await nsqd.stop()
    assert not watch.bad, watch.describe()


@pytest_twisted.ensureDeferred
async def test_min_version_tls13_refuses_tls12_client(certs):
    """--tls-min-version=tls1.3: a client capped at TLS 1.2 is refused (TCP upgrade and HTTPS); TLS 1.3 passes."""
    with LogWatch() as watch:
        nsqd = await _broker(certs, tls_min_version=0x0304)
        try:
            old = await threads.deferToThread(tls_upgrade, nsqd.tcp_port, certs["ca"], None, None,
                                              ssl.TLSVersion.TLSv1_2)
            assert old.startswith("refused: SSLError") and "PROTOCOL_VERSION" in old, old
            assert (await threads.deferToThread(https_get, nsqd.https_port, certs["ca"], None, None,
                                                ssl.TLSVersion.TLSv1_2)).startswith("refused")
            await _no_clients_left(nsqd)
            assert "secure" not in nsqd._broker.topics
            assert await threads.deferToThread(tls_upgrade, nsqd.tcp_port, certs["ca"]) == "ok"
            assert await threads.deferToThread(https_get, nsqd.https_port, certs["ca"]) == "200 OK"
        finally:
            await nsqd.stop()
    assert not watch.bad, watch.describe()


def _garbage_after_tls_answer(port: int, garbage: bytes) -> tuple[bool, bytes]:
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        ident = json.dumps({"feature_negotiation": True, "tls_v1": True}).encode()
        raw.sendall(MAGIC_V2 + b"IDENTIFY\n" + struct.pack(">i", len(ident)) + ident)
        _read_frame(raw)
        raw.sendall(garbage)
        got = b""
        try:
            while True:
                chunk = raw.recv(4096)
                if not chunk:
                    return True, got
                got += chunk
        except TimeoutError:
            return False, got
        except ConnectionError:
            return True, got
    finally:
        raw.close()


@pytest.mark.parametrize("garbage", [b"PUB t\n\x00\x00\x00\x01x", b"\x16\x03\x01\xff\xff" + b"\x00" * 64,
                                     os.urandom(300)], ids=["plain command", "bad record", "noise"])
@pytest_twisted.ensureDeferred
async def test_garbage_instead_of_tls_handshake(certs, garbage):
    """After tls_v1 was agreed, plain commands or noise instead of a ClientHello close the connection;
    nothing is published and nothing is logged as an unhandled error."""
    with LogWatch() as watch:
        nsqd = await _broker(certs)
        try:
            closed, _ = await threads.deferToThread(_garbage_after_tls_answer, nsqd.tcp_port, garbage)
            assert closed
            await _no_clients_left(nsqd)
            assert "t" not in nsqd._broker.topics
        finally:
            await nsqd.stop()
    assert not watch.bad, watch.describe()


@pytest_twisted.ensureDeferred
async def test_plain_http_and_noise_on_https_listener(certs):
    """Plain HTTP and random bytes sent to the HTTPS port are closed; HTTPS keeps serving."""
    with LogWatch() as watch:
        nsqd = await _broker(certs)
        try:
            def plain() -> bytes:
                s = socket.create_connection(("127.0.0.1", nsqd.https_port), timeout=5)
                s.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n" + os.urandom(200))
                got = b""
                try:
                    while True:
                        chunk = s.recv(4096)
                        if not chunk:
                            break
                        got += chunk
                except (TimeoutError, ConnectionError):
                    pass
                s.close()
                return got

            got = await threads.deferToThread(plain)
            assert b"200" not in got
            assert await threads.deferToThread(https_get, nsqd.https_port, certs["ca"]) == "200 OK"
        finally:
            await nsqd.stop()
    assert not watch.bad, watch.describe()
