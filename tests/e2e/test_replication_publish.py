"""Replicated publish end to end over loopback: two embedded nsqd, one the origin
(``--replica-peer``), one the peer (``--replication-address``).  A publisher's OK comes only
once the peer stored the message in its shadow log, with its ID and timestamp; with the peer
gone a publish is refused (``E_PUB_FAILED``, HTTP 503) unless degraded=accept, and /ping and
/stats say which; a stalled peer and one speaking another protocol are out of sync."""

from __future__ import annotations

import json
import os
import socket

import pytest
import pytest_twisted
import treq
from twisted.internet import protocol, reactor
from twisted.internet.endpoints import TCP4ServerEndpoint

from nsqtw.embed import start_nsqd
from nsqtw.nsqd.replication import shadow_path
from nsqtw.protocol.frames import FRAME_ERROR
from nsqtw.protocol.replication import MSG, read_shadow_records, split_frames
from nsqtw.testing import body_command, command, connect_raw, mpub_command

from replication_support import until

pytestmark = pytest.mark.e2e


def shadow(peer, origin_id: int) -> list[tuple[str, int, bytes]]:
    path = shadow_path(peer._service.data_path, origin_id)
    if not os.path.exists(path):
        return []
    with open(path, "rb") as f:
        data = f.read()
    return [(topic, due, frame) for _, entries in read_shadow_records(data)
            for kind, topic, _, due, frames in entries if kind == MSG for frame in split_frames(frames)]


@pytest_twisted.async_yield_fixture
async def pair():
    peer = await start_nsqd(replication_insecure=True, node_id=2, replication_address="127.0.0.1:0")
    origin = await start_nsqd(replication_insecure=True, node_id=1, replica_peers=[f"127.0.0.1:{peer._service.replication_port}"])
    await until(lambda: origin._service.replication.origin.in_sync() == 1)
    yield origin, peer
    await origin.stop()
    await peer.stop()


@pytest_twisted.ensureDeferred
async def test_pub_mpub_dpub_ok_only_after_the_peer_stored_them(pair):
    """PUB, MPUB and DPUB over TCP, /pub and /mpub over HTTP: each OK arrives with every
    message already in the peer's shadow log, same ID and timestamp as the origin's copy."""
    origin, peer = pair
    c = await connect_raw(origin.tcp_port)
    c.send(body_command("PUB", "t", body=b"one"))
    assert await c.response() == b"OK"
    assert [f[-3:] for _, _, f in shadow(peer, 1)] == [b"one"]
    c.send(mpub_command("t", [b"two", b"three"]))
    assert await c.response() == b"OK"
    c.send(body_command("DPUB", "t", 60000, body=b"later"))
    assert await c.response() == b"OK"
    r = await treq.post(f"http://127.0.0.1:{origin.http_port}/pub?topic=t", b"four")
    assert r.code == 200 and await r.content() == b"OK"
    r = await treq.post(f"http://127.0.0.1:{origin.http_port}/mpub?topic=t", b"five\nsix")
    assert r.code == 200
    rows = shadow(peer, 1)
    assert [f[34:] for _, _, f in rows] == [b"one", b"two", b"three", b"later", b"four", b"five", b"six"]
    assert {t for t, _, _ in rows} == {"t"}
    due = [d for _, d, f in rows if f.endswith(b"later")][0]
    assert due > 0 and abs(due / 1e9 - reactor.seconds() - 60) < 10
    # the origin's queue holds the same frames (IDs and timestamps kept)
    cons = await connect_raw(origin.tcp_port)
    cons.send(command("SUB", "t", "c"))
    assert await cons.response() == b"OK"
    cons.send(command("RDY", 10))
    got = {}
    for _ in range(6):
        m = await cons.message()
        got[m.body] = (m.id, m.timestamp)
    stored = {f[34:]: (f[18:34], int.from_bytes(f[8:16], "big")) for _, _, f in rows}
    for body, (mid, ts) in got.items():
        assert stored[body] == (mid, ts)
    await cons.close()
    await c.close()
    stats = json.loads(await (await treq.get(f"http://127.0.0.1:{origin.http_port}/stats?format=json")).content())
    rep = stats["replication"]
    assert rep["status"] == "ok" and rep["peers_in_sync"] == 1 and rep["replicated_messages"] == 7
    assert rep["peers"][0]["state"] == "in_sync" and rep["peers"][0]["node_id"] == 2


@pytest_twisted.ensureDeferred
async def test_unreplicated_stats_and_ping_unchanged():
    nsqd = await start_nsqd()
    try:
        stats = json.loads(await (await treq.get(f"http://127.0.0.1:{nsqd.http_port}/stats?format=json")).content())
        assert "replication" not in stats
        assert nsqd._service.replication is None and type(nsqd._service.broker).__name__ == "Broker"
    finally:
        await nsqd.stop()


@pytest_twisted.ensureDeferred
async def test_peer_gone_refuses_publishes_and_ping_says_so(pair):
    origin, peer = pair
    await peer.stop()
    await until(lambda: origin._service.replication.origin.in_sync() == 0)
    c = await connect_raw(origin.tcp_port)
    c.send(body_command("PUB", "t", body=b"x"))
    err = await c.error()
    assert err.startswith(b"E_PUB_FAILED PUB failed replication: 0 of 1 peers in sync")
    await c.closed
    r = await treq.post(f"http://127.0.0.1:{origin.http_port}/pub?topic=t", b"x")
    assert r.code == 503 and json.loads(await r.content())["message"] == "EXITING"
    r = await treq.get(f"http://127.0.0.1:{origin.http_port}/ping")
    assert r.code == 500 and (await r.content()).startswith(b"NOK - replication: 0 of 1 peers in sync")
    text = await (await treq.get(f"http://127.0.0.1:{origin.http_port}/stats")).content()
    assert b"Replication: degraded-refusing" in text and b"out_of_sync" in text


@pytest_twisted.ensureDeferred
async def test_degraded_accept_publishes_without_peers():
    origin = await start_nsqd(replication_insecure=True, node_id=1, replica_peers=["127.0.0.1:1"], replication_degraded="accept")
    try:
        c = await connect_raw(origin.tcp_port)
        c.send(body_command("PUB", "t", body=b"x"))
        assert await c.response() == b"OK"
        r = await treq.get(f"http://127.0.0.1:{origin.http_port}/ping")
        assert r.code == 200 and (await r.content()).startswith(b"OK - degraded")
        await c.close()
    finally:
        await origin.stop()


@pytest_twisted.ensureDeferred
async def test_peer_coming_back_is_in_sync_again(pair):
    origin, peer = pair
    port = peer._service.replication_port
    await peer.stop()
    await until(lambda: origin._service.replication.origin.in_sync() == 0)
    peer2 = await start_nsqd(replication_insecure=True, node_id=3, replication_address=f"127.0.0.1:{port}")
    try:
        await until(lambda: origin._service.replication.origin.in_sync() == 1, 10)
        c = await connect_raw(origin.tcp_port)
        c.send(body_command("PUB", "t", body=b"back"))
        assert await c.response() == b"OK"
        assert [f[34:] for _, _, f in shadow(peer2, 1)] == [b"back"]
        await c.close()
    finally:
        await peer2.stop()


class _Silent(protocol.Protocol):
    """Accepts the link and never answers (a stalled peer)."""


class _WrongProtocol(protocol.Protocol):
    def dataReceived(self, data: bytes) -> None:
        self.transport.write(b"\x00\x00\x00\x1e\x00\x00\x00\x01E_BAD_PROTOCOL wrong protocol")


async def _serve(proto_class):
    f = protocol.Factory.forProtocol(proto_class)
    return await TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(f)


@pytest_twisted.ensureDeferred
async def test_stalled_peer_and_wrong_protocol_are_out_of_sync():
    silent = await _serve(_Silent)
    wrong = await _serve(_WrongProtocol)
    origin = await start_nsqd(replication_insecure=True, node_id=1, replication_timeout=0.3, replication_min_acks=1,
                              replica_peers=[f"127.0.0.1:{silent.getHost().port}",
                                             f"127.0.0.1:{wrong.getHost().port}"])
    try:
        rep = origin._service.replication.origin
        await until(lambda: all(p.state == "out_of_sync" for p in rep.peers.values()))
        reasons = {a.rsplit(":", 1)[1]: p.reason for a, p in rep.peers.items()}
        assert "stalled" in reasons[str(silent.getHost().port)]
        assert "not a replication frame" in reasons[str(wrong.getHost().port)] \
            or "did not answer HELLO" in reasons[str(wrong.getHost().port)]
        c = await connect_raw(origin.tcp_port)
        c.send(body_command("PUB", "t", body=b"x"))
        assert (await c.error()).startswith(b"E_PUB_FAILED")
    finally:
        await origin.stop()
        await silent.stopListening()
        await wrong.stopListening()


@pytest_twisted.ensureDeferred
async def test_a_peer_that_stalls_after_a_batch_fails_the_held_publish():
    """The peer accepts HELLO and acknowledges the catch-up snapshot, then never ACKs again:
    after --replication-timeout the held PUB is refused."""
    from nsqtw.protocol import replication as wire

    class _NoAck(protocol.Protocol):
        def connectionMade(self) -> None:
            self.decoder = wire.LinkDecoder(expect_magic=True)
            self.acked = False

        def dataReceived(self, data: bytes) -> None:
            for kind, body in self.decoder.feed(data):
                if kind == wire.HELLO:
                    self.transport.write(wire.encode_hello(9, b"x" * 16, "noack"))
                elif kind == wire.BATCH and not self.acked:  # the snapshot, then silence
                    self.acked = True
                    self.transport.write(wire.encode_ack(int.from_bytes(body[:8], "big")))

    port = await _serve(_NoAck)
    origin = await start_nsqd(replication_insecure=True, node_id=1, replication_timeout=0.3,
                              replica_peers=[f"127.0.0.1:{port.getHost().port}"])
    try:
        await until(lambda: origin._service.replication.origin.in_sync() == 1)
        c = await connect_raw(origin.tcp_port)
        c.send(body_command("PUB", "t", body=b"x"))
        ftype, data = await c.frame()
        assert ftype == FRAME_ERROR and data.startswith(b"E_PUB_FAILED PUB failed replication: 0 of 1")
    finally:
        await origin.stop()
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_same_node_id_is_refused():
    peer = await start_nsqd(replication_insecure=True, node_id=5, replication_address="127.0.0.1:0")
    origin = await start_nsqd(replication_insecure=True, node_id=5, replica_peers=[f"127.0.0.1:{peer._service.replication_port}"])
    try:
        rep = origin._service.replication.origin
        await until(lambda: next(iter(rep.peers.values())).reason != "")
        assert "--node-id" in next(iter(rep.peers.values())).reason
        assert rep.in_sync() == 0
        ok, text = origin._service.replication_health()  # /ping says why, not only that it refuses
        assert not ok and "--node-id=5" in text and "publishes refused" in text
    finally:
        await origin.stop()
        await peer.stop()


def test_peer_list_naming_the_node_itself_is_one_fatal_line(tmp_path):
    """The drop-in command refuses to start, with one FATAL line naming the flag."""
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.run(
        [sys.executable, "-m", "nsqtw.cli", "--tcp-address=127.0.0.1:0", "--http-address=", "--https-address=",
         f"--data-path={tmp_path}", f"--replication-address=0.0.0.0:{port}",
         f"--replica-peer=127.0.0.1:{port}", "--node-id=1", "--replication-insecure"], capture_output=True,
        text=True, timeout=60)
    assert proc.returncode == 1
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "FATAL" in lines[0] and "--replica-peer" in lines[0] and "itself" in lines[0]


@pytest_twisted.ensureDeferred
async def test_with_sync_every_1_the_ok_waits_for_both_and_a_refusal_names_replication():
    """--sync-every=1 and replication share the one barrier: OK once both are done; a refusal
    from the replication side still reads E_PUB_FAILED with its reason."""
    peer = await start_nsqd(replication_insecure=True, node_id=2, replication_address="127.0.0.1:0")
    origin = await start_nsqd(replication_insecure=True, node_id=1, sync_every=1,
                              replica_peers=[f"127.0.0.1:{peer._service.replication_port}"])
    try:
        await until(lambda: origin._service.replication.origin.in_sync() == 1)
        c = await connect_raw(origin.tcp_port)
        c.send(body_command("PUB", "t", body=b"both"))
        assert await c.response() == b"OK"
        assert [f[34:] for _, _, f in shadow(peer, 1)] == [b"both"]
        await peer.stop()
        await until(lambda: origin._service.replication.origin.in_sync() == 0)
        c.send(body_command("PUB", "t", body=b"refused"))
        assert (await c.error()).startswith(b"E_PUB_FAILED PUB failed replication: 0 of 1 peers in sync")
        r = await treq.post(f"http://127.0.0.1:{origin.http_port}/pub?topic=t", b"x")
        assert r.code == 503
    finally:
        await origin.stop()
        await peer.stop()


@pytest_twisted.ensureDeferred
async def test_a_peer_whose_disk_is_full_refuses_and_is_out_of_sync(pair):
    """The peer's shadow log cannot be written (ENOSPC): it answers E_STORE_FAILED and closes;
    the origin puts it out of sync and, with --replication-min-acks=1, refuses the publish."""
    import errno

    origin, peer = pair
    files = peer._service.shadow_files

    def full(origin_id: int, *parts: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    files._append = full
    c = await connect_raw(origin.tcp_port)
    c.send(body_command("PUB", "t", body=b"x"))
    ftype, data = await c.frame()
    assert ftype == FRAME_ERROR and data.startswith(b"E_PUB_FAILED")
    peer_state = next(iter(origin._service.replication.origin.peers.values()))
    assert peer_state.state != "in_sync"
    await until(lambda: "E_STORE_FAILED" in peer_state.reason)
    assert "No space left on device" in peer_state.reason
    await c.close()


@pytest_twisted.ensureDeferred
async def test_the_origins_link_sends_eagerly(pair):
    """The origin's link is an outgoing connection: the socket seam's eager write is attached
    to it (a batch leaves at once, not at the next reactor iteration); NSQTW_FAST_IO=0 would
    turn it off as everywhere."""
    from twisted.internet import tcp

    from nsqtw.runtime import seam

    origin, _ = pair
    link = next(iter(origin._service.replication.links.values()))
    assert type(link.transport) is tcp.Client
    assert link._seam is not None and link.write == link._seam.write
    assert seam.attach_client(object(), lambda data: None) is None


@pytest_twisted.ensureDeferred
async def test_the_tcp_answers_wait_on_the_replication_barrier_without_a_deferred(pair):
    """A replicated nsqd's TCP publishes hold their answers with the replication service's
    plain-callable barrier (one per PUB on the hot path); with --sync-every=1 too they use the
    Deferred that waits for both (see the test above)."""
    origin, _ = pair
    service = origin._service
    assert service.tcp_factory.sync_hold == service.replication.hold
