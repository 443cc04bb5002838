"""Replication under the faults it is bought for, over loopback, counting as Jepsen does
(acknowledged, lost, duplicated): an origin frozen (SIGSTOP: a hung host), a silent partition
that heals before the origin is killed, an outsider on the replication port, and a mesh of
three losing one node under load.  The origin is a child process where the fault needs one
(a signal); the peers run in the test's reactor, so their state is read directly."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

from nsqtw.embed import start_nsqd
from nsqtw.protocol import replication as wire
from nsqtw.testing import connect_raw

from replication_support import (
    BlackholeProxy, ChildNsqd, count, data_dir, drain, free_port, publish, secret_file, sleep, until,
)

pytestmark = pytest.mark.e2e

TIMEOUT = 1.0
ADOPT_AFTER = 1.0


async def secured_peer(tmp_path: Path, **options: Any) -> Any:
    settings: dict[str, Any] = dict(node_id=2, replication_address="127.0.0.1:0", data_path=data_dir(tmp_path, "peer"),
                                    replication_secret_file=secret_file(tmp_path), replication_timeout=TIMEOUT,
                                    adopt_after=ADOPT_AFTER)
    settings.update(options)
    return await start_nsqd(**settings)


@pytest_twisted.ensureDeferred
async def test_a_frozen_origin_is_adopted_and_nothing_acknowledged_is_lost(tmp_path):
    """SIGSTOP: the origin's TCP connection stays open (the kernel answers for it), but it
    sends nothing: the peer's link falls silent for --replication-timeout, is dropped, and the
    origin is adopted --adopt-after later."""
    peer = await secured_peer(tmp_path)
    origin = await ChildNsqd.start(
        data_dir(tmp_path, "origin"), "--node-id=1", f"--replica-peer=127.0.0.1:{peer._service.replication_port}",
        f"--replication-secret-file={secret_file(tmp_path)}", f"--replication-timeout={TIMEOUT}s")
    try:
        await until(lambda: peer._service.adoption.links.get(1))
        acknowledged = await publish(origin.tcp_port, "t", b"a", 60)
        assert len(acknowledged) == 60
        await until(lambda: peer._service.shadow_files.states[1].count() == 60)
        origin.signal(signal.SIGSTOP)
        # within --adopt-after + --replication-timeout + a second (the bound here is generous:
        # a loaded machine must not fail it; the log says when it happened)
        await until(lambda: peer._service.adoption.adopted, ADOPT_AFTER + TIMEOUT + 10)
        assert peer._service.adoption.adopted[0][:2] == (1, 60)
        delivered = await drain(peer.tcp_port, "t", "c", set(acknowledged))
        assert count(acknowledged, delivered) == (0, 0)
    finally:
        await origin.kill()
        await peer.stop()


@pytest_twisted.ensureDeferred
async def test_a_healed_silent_partition_leaves_no_stale_link_and_a_later_kill_is_adopted(tmp_path):
    """The link goes through a proxy that turns into a blackhole (nothing forwarded, nothing
    closed) for longer than --replication-timeout, then heals: both ends dropped the silent
    link and the origin links again; then it is killed (and its data wiped): the peer adopts
    everything acknowledged, before and after the partition."""
    peer = await secured_peer(tmp_path, adopt_after=4.0)
    proxy = BlackholeProxy(peer._service.replication_port)
    proxy_port = await proxy.listen()
    origin = await ChildNsqd.start(
        data_dir(tmp_path, "origin"), "--node-id=1", f"--replica-peer=127.0.0.1:{proxy_port}",
        f"--replication-secret-file={secret_file(tmp_path)}", f"--replication-timeout={TIMEOUT}s",
        "--replication-degraded=accept")
    try:
        await until(lambda: peer._service.adoption.links.get(1))
        acknowledged = await publish(origin.tcp_port, "t", b"before", 30)
        await until(lambda: peer._service.shadow_files.states[1].count() == 30)
        first_links = set(peer._service.shadow_factory.protocols)
        proxy.blackhole = True
        # the peer drops the silent link (no FIN, no RST reached it) within the timeout
        await until(lambda: not peer._service.adoption.links.get(1), TIMEOUT + 5)
        assert not peer._service.adoption.adopted  # not for --adopt-after yet
        proxy.blackhole = False
        # the origin links again through the healed path; the stale sockets are gone
        await until(lambda: peer._service.adoption.links.get(1) == 1, 10)
        assert not first_links & set(peer._service.shadow_factory.protocols)
        acknowledged += await publish(origin.tcp_port, "t", b"after", 30)
        await until(lambda: peer._service.shadow_files.states[1].count() == 60)
        await origin.kill()
        await until(lambda: peer._service.adoption.adopted, 4.0 + TIMEOUT + 10)
        delivered = await drain(peer.tcp_port, "t", "c", set(acknowledged))
        assert count(acknowledged, delivered) == (0, 0) and len(acknowledged) == 60
    finally:
        await origin.kill()
        await proxy.close()
        await peer.stop()


@pytest_twisted.ensureDeferred
async def test_an_outsider_without_the_secret_cannot_inject_wipe_or_hold_off_adoption(tmp_path):
    """From a process that reaches the port: a fake origin's batch, an empty snapshot claiming
    the real origin's id, a link held open with that id: each refused or ignored; the shadow
    stays whole and the origin is adopted on time when it dies."""
    peer = await secured_peer(tmp_path)
    origin = await start_nsqd(node_id=1, replica_peers=[f"127.0.0.1:{peer._service.replication_port}"],
                              replication_secret_file=secret_file(tmp_path), replication_timeout=TIMEOUT,
                              data_path=data_dir(tmp_path, "origin"))
    outsiders: list[Any] = []
    try:
        await until(lambda: origin._service.replication.origin.in_sync() == 1)
        acknowledged = await publish(origin.tcp_port, "payments", b"p", 20)
        await until(lambda: peer._service.shadow_files.states[1].count() == 20)
        port = peer._service.replication_port

        async def outsider(*frames: bytes) -> Any:
            c = await connect_raw(port, send_magic=False)
            c.send(wire.MAGIC + wire.encode_hello(1, b"x" * 16, "fake", nonce=b"n" * 16))
            for f in frames:
                c.send(f)
            outsiders.append(c)
            return c

        wipe = wire.encode_batch(1 << 40, [(wire.SNAP_BEGIN, "", "", 0, wire.epoch_data(1)),
                                           (wire.SNAP_END, "", "", 0, b"")])
        inject = wire.encode_batch(1 << 41, [wire.message_entry("payments", 0, b"forged")])
        await outsider(wire.encode_auth(b""), wipe)
        await outsider(wire.encode_auth(b"\0" * 32), inject)
        holder = await outsider()  # HELLO only, then held open
        # a frame announcing 256 MiB is refused on its head; a slow-loris is closed at the deadline
        huge = await connect_raw(port, send_magic=False)
        huge.send(wire.MAGIC + (256 * 1024 * 1024).to_bytes(4, "big") + bytes([wire.HELLO]) + b"x" * 100)
        loris = await connect_raw(port, send_magic=False)
        loris.send(wire.MAGIC[:5])
        outsiders.extend((huge, loris))
        await until(lambda: not huge.transport.connected)
        more = await publish(origin.tcp_port, "payments", b"q", 10)  # the origin publishes as before
        assert len(more) == 10
        acknowledged += more
        await until(lambda: not loris.transport.connected, TIMEOUT + 5)
        await sleep(0.3)
        assert peer._service.shadow_files.states[1].count() == 30
        assert peer._service.adoption.links.get(1) == 1  # the real origin's link only
        await origin.stop()
        await until(lambda: peer._service.adoption.adopted, ADOPT_AFTER + TIMEOUT + 10)
        assert holder is not None
        delivered = await drain(peer.tcp_port, "payments", "c", set(acknowledged))
        assert count(acknowledged, delivered) == (0, 0) and b"forged" not in delivered
    finally:
        for c in outsiders:
            await c.close()
        await peer.stop()


async def _mesh(tmp_path: Path, n: int = 3) -> list[Any]:
    ports = [free_port() for _ in range(n)]
    secret = secret_file(tmp_path)
    nodes = []
    for i in range(n):
        nodes.append(await start_nsqd(
            node_id=i + 1, replication_address=f"127.0.0.1:{ports[i]}", data_path=data_dir(tmp_path, f"n{i + 1}"),
            replica_peers=[f"127.0.0.1:{p}" for j, p in enumerate(ports) if j != i],
            replication_min_acks=1, replication_secret_file=secret, replication_timeout=TIMEOUT,
            adopt_after=ADOPT_AFTER))
    return nodes


@pytest_twisted.ensureDeferred
async def test_three_nodes_losing_one_keep_publishing_and_exactly_one_survivor_adopts(tmp_path):
    """A mesh of three, --replication-min-acks=1, under load: node 1 is lost; nodes 2 and 3
    go on accepting publishes (each still has a peer in sync), node 2 (the lowest id that
    holds node 1's shadow) adopts its backlog and node 3 stands by, then drops its copy once
    node 2 says its own peers stored what it adopted: every acknowledged message delivered,
    none twice."""
    nodes = await _mesh(tmp_path)
    one, two, three = nodes
    try:
        await until(lambda: all(n._service.replication.origin.in_sync() == 2 for n in nodes), 15)
        acknowledged = await publish(one.tcp_port, "t", b"one", 40)
        acknowledged += await publish(two.tcp_port, "t", b"two", 20)
        acknowledged += await publish(three.tcp_port, "t", b"three", 20)
        assert len(acknowledged) == 80
        await until(lambda: all(n._service.shadow_files.states.get(1) is not None
                                and n._service.shadow_files.states[1].count() == 40 for n in (two, three)))
        await one.stop()
        # the survivors accept publishes at once (no 5 s hang, no refusal)
        acknowledged += await publish(two.tcp_port, "t", b"two-after", 10)
        acknowledged += await publish(three.tcp_port, "t", b"three-after", 10)
        assert len(acknowledged) == 100
        await until(lambda: two._service.adoption.adopted and 1 in three._service.adoption.forgotten,
                    ADOPT_AFTER + TIMEOUT + 10)
        assert not three._service.adoption.adopted
        assert three._service.adoption.forgotten[1][0] == 2
        doc = three._service.replication_stats()
        assert doc["adoption"]["adopted_by_peer"][0]["peer_node_id"] == 2
        want = set(acknowledged)
        delivered = await drain(two.tcp_port, "t", "c", {b for b in want if not b.startswith(b"three")})
        delivered += await drain(three.tcp_port, "t", "c", {b for b in want if b.startswith(b"three")})
        lost, duplicated = count(acknowledged, delivered)
        assert lost == 0 and duplicated == 0
    finally:
        for n in (two, three):
            await n.stop()


@pytest_twisted.ensureDeferred
async def test_links_over_mutual_tls_replicate_and_refuse_a_node_without_a_certificate(tmp_path):
    """--replication-tls with --tls-root-ca-file: the links are TLS, each end requires the other's
    certificate signed by the CA (no secret needed); a plain connection, or a node whose
    certificate the CA did not sign, never gets a link."""
    from nsqtw.testing.certs import make_certificates

    certs = make_certificates(data_dir(tmp_path, "certs"))
    other = make_certificates(data_dir(tmp_path, "other"))  # another CA's certificates
    tls = dict(replication_tls=True, tls_cert=certs["server"], tls_key=certs["server_key"],
               tls_root_ca_file=certs["ca"], replication_timeout=TIMEOUT, adopt_after=ADOPT_AFTER)
    peer = await start_nsqd(node_id=2, replication_address="127.0.0.1:0", data_path=data_dir(tmp_path, "peer"),
                            **tls)
    address = f"127.0.0.1:{peer._service.replication_port}"
    stranger = await start_nsqd(node_id=3, replica_peers=[address], data_path=data_dir(tmp_path, "stranger"),
                                **dict(tls, tls_cert=other["server"], tls_key=other["server_key"],
                                       tls_root_ca_file=other["ca"]))
    origin = await start_nsqd(node_id=1, replica_peers=[address], data_path=data_dir(tmp_path, "origin"), **tls)
    try:
        await until(lambda: origin._service.replication.origin.in_sync() == 1)
        acknowledged = await publish(origin.tcp_port, "t", b"tls", 20)
        await until(lambda: peer._service.shadow_files.states[1].count() == 20)
        plain = await connect_raw(peer._service.replication_port, send_magic=False)
        plain.send(wire.MAGIC + wire.encode_hello(1, b"x" * 16, "plain", nonce=b"n" * 16))
        await sleep(0.5)
        assert stranger._service.replication.origin.in_sync() == 0
        assert 3 not in peer._service.shadow_files.states and peer._service.adoption.links.get(1) == 1
        await plain.close()
        await origin.stop()
        await until(lambda: peer._service.adoption.adopted, ADOPT_AFTER + TIMEOUT + 10)
        delivered = await drain(peer.tcp_port, "t", "c", set(acknowledged))
        assert count(acknowledged, delivered) == (0, 0)
    finally:
        await stranger.stop()
        await peer.stop()
