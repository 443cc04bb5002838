"""Catch-up and the adopted-epoch handshake (issue 26, steps 3 and 4), over loopback: a peer
restarted under load catches up from a snapshot (catching_up, then in_sync) and, after the
origin dies, adopts everything outstanding, including what was published while it was down;
an origin that comes back with its data drops the backlog a peer adopted, and delivers it
when no peer can tell."""

from __future__ import annotations

import json
import os

import pytest
import pytest_twisted
import treq
from twisted.internet import defer

from nsqtw.embed import start_nsqd
from nsqtw.testing import body_command, command, connect_raw, mpub_command

from replication_support import free_port, sleep, text_id, until

pytestmark = pytest.mark.e2e


async def drain(node, topic: str, channel: str, n: int) -> list[bytes]:
    s = await connect_raw(node.tcp_port)
    s.send(command("SUB", topic, channel))
    assert await s.response() == b"OK"
    s.send(command("RDY", 500))
    got = []
    for _ in range(n):
        m = await s.message()
        got.append(m.body)
        s.send(command("FIN", text_id(m.id)))
    await s.close()
    return got


async def stats(node) -> dict:
    r = await treq.get(f"http://127.0.0.1:{node.http_port}/stats?format=json")
    return json.loads(await r.content())


@pytest_twisted.ensureDeferred
async def test_a_restarted_peer_catches_up_and_adopts_what_was_published_while_it_was_down(tmp_path):
    peer_data, origin_data = str(tmp_path / "peer"), str(tmp_path / "origin")
    os.mkdir(peer_data)
    os.mkdir(origin_data)
    peer = await start_nsqd(replication_insecure=True, node_id=2, replication_address="127.0.0.1:0", adopt_after=60, data_path=peer_data)
    port = peer._service.replication_port
    origin = await start_nsqd(replication_insecure=True, node_id=1, replica_peers=[f"127.0.0.1:{port}"], data_path=origin_data,
                              replication_degraded="accept")
    rep = origin._service.replication.origin
    seen_states = []
    linked = rep.linked

    def watch_linked(*args, **kw):
        frames = linked(*args, **kw)
        seen_states.append(rep.peer_stats(0.0)[0]["state"])
        return frames

    rep.linked = watch_linked
    publisher = None
    try:
        await until(lambda: rep.in_sync() == 1)
        c = await connect_raw(origin.tcp_port)
        c.send(command("SUB", "t", "c"))
        assert await c.response() == b"OK"
        p = await connect_raw(origin.tcp_port)
        p.send(mpub_command("t", [b"a%d" % i for i in range(10)]))
        assert await p.response() == b"OK"
        c.send(command("RDY", 4))
        first = [await c.message() for _ in range(4)]
        c.send(command("RDY", 0))
        for m in first[:3]:  # three finished, one stays in flight on the origin
            c.send(command("FIN", text_id(m.id)))
        await until(lambda: peer._service.shadow_files.states[1].count() == 7)

        # load keeps coming while the peer restarts (degraded=accept: acknowledged without it)
        acknowledged = [b"a%d" % i for i in range(10)]
        stop = []

        async def publish() -> None:
            n = 0
            while not stop:
                body = b"b%d" % n
                p.send(body_command("PUB", "t", body=body))
                assert await p.response() == b"OK"
                acknowledged.append(body)
                n += 1
                await sleep(0.005)

        publisher = defer.ensureDeferred(publish())
        await sleep(0.05)
        await peer.stop()
        await until(lambda: rep.in_sync() == 0)
        await sleep(0.1)
        down = len(acknowledged)
        peer = await start_nsqd(replication_insecure=True, node_id=2, replication_address=f"127.0.0.1:{port}", adopt_after=60,
                                data_path=peer_data)
        await until(lambda: rep.in_sync() == 1)
        await sleep(0.05)
        stop.append(True)
        await publisher
        publisher = None
        assert len(acknowledged) > down  # some were published while the peer was down...
        assert seen_states == ["catching_up", "catching_up"]  # ...then it caught up, both times
        doc = await stats(origin)
        (entry,) = doc["replication"]["peers"]
        assert entry["state"] == "in_sync" and entry["catch_ups"] == 2 and "lag_messages" in entry
        assert peer._service.shadow_files.states[1].snapshots == 2  # the first replayed from its log, then the new one
        outstanding = len(acknowledged) - 3
        await until(lambda: peer._service.shadow_files.states[1].count() == outstanding)

        # the origin dies: the peer adopts everything outstanding, the in-flight one included
        await c.close()
        await p.close()
        await origin.stop()
        peer._service.adoption.policy.adopt_after = 0.2
        await until(lambda: peer._service.adoption.adopted)
        assert peer._service.adoption.adopted[0][:3] == (1, outstanding, 0)
        got = await drain(peer, "t", "c", outstanding)
        assert sorted(got) == sorted(b for b in acknowledged if b not in {m.body for m in first[:3]})
    finally:
        if publisher is not None:
            stop.append(True)
        await origin.stop()
        await peer.stop()


async def _adopted_pair(tmp_path):
    """A pair whose origin published five messages to t/c and stopped; the peer adopted them."""
    peer_data, origin_data = str(tmp_path / "peer"), str(tmp_path / "origin")
    os.mkdir(peer_data)
    os.mkdir(origin_data)
    peer = await start_nsqd(replication_insecure=True, node_id=2, replication_address="127.0.0.1:0", adopt_after=0.3, data_path=peer_data)
    origin = await start_nsqd(replication_insecure=True, node_id=1, replica_peers=[f"127.0.0.1:{peer._service.replication_port}"],
                              data_path=origin_data)
    try:
        await until(lambda: origin._service.replication.origin.in_sync() == 1)
        epoch = origin._service.replication.epoch
        for path in ("topic/create?topic=t", "channel/create?topic=t&channel=c"):
            r = await treq.post(f"http://127.0.0.1:{origin.http_port}/{path}")
            assert r.code == 200
        r = await treq.post(f"http://127.0.0.1:{origin.http_port}/mpub?topic=t", b"m0\nm1\nm2\nm3\nm4")
        assert r.code == 200
        await until(lambda: peer._service.shadow_files.states[1].count() == 5)
    except BaseException:
        await peer.stop()
        raise
    finally:
        await origin.stop()  # its queues stay in its data path
    return peer, origin_data, epoch


@pytest_twisted.ensureDeferred
async def test_an_origin_coming_back_drops_the_backlog_its_peer_adopted(tmp_path):
    peer, origin_data, epoch = await _adopted_pair(tmp_path)
    origin = None
    try:
        await until(lambda: peer._service.adoption.adopted)
        assert (1, epoch) in peer._service.shadow_files.adopted  # the adopted epoch, kept on disk
        assert os.path.exists(os.path.join(peer._service.data_path, f"nsqtw-adopted.1.{epoch}"))
        origin = await start_nsqd(replication_insecure=True, node_id=1, replica_peers=[f"127.0.0.1:{peer._service.replication_port}"],
                                  data_path=origin_data)
        assert origin._service.broker.topics["t"].channels["c"].depth() == 5  # its backlog, reloaded
        rep = origin._service.replication
        await until(lambda: rep.adoptions_reported and rep.origin.in_sync() == 1)
        assert rep.adoptions_reported == [(f"127.0.0.1:{peer._service.replication_port}", 5, 0)]
        assert origin._service.broker.topics["t"].channels["c"].depth() == 0
        assert rep.epoch > epoch  # a new epoch from here on
        assert (await stats(origin))["replication"]["epoch"] == rep.epoch
        # the peer delivers them, once
        assert sorted(await drain(peer, "t", "c", 5)) == [b"m%d" % i for i in range(5)]
    finally:
        if origin is not None:
            await origin.stop()
        await peer.stop()


@pytest_twisted.ensureDeferred
async def test_an_origin_that_cannot_ask_delivers_its_backlog(tmp_path):
    peer, origin_data, _ = await _adopted_pair(tmp_path)
    await until(lambda: peer._service.adoption.adopted)
    await peer.stop()  # no peer reachable: the origin cannot tell, so it delivers (duplicates, never loss)
    origin = await start_nsqd(replication_insecure=True, node_id=1, replica_peers=["127.0.0.1:1"], data_path=origin_data,
                              replication_degraded="accept")
    try:
        assert sorted(await drain(origin, "t", "c", 5)) == [b"m%d" % i for i in range(5)]
        assert origin._service.replication.adoptions_reported == []
    finally:
        await origin.stop()


@pytest_twisted.ensureDeferred
async def test_an_origin_back_before_adoption_keeps_its_backlog(tmp_path):
    peer_data, origin_data = str(tmp_path / "peer"), str(tmp_path / "origin")
    os.mkdir(peer_data)
    os.mkdir(origin_data)
    peer = await start_nsqd(replication_insecure=True, node_id=2, replication_address="127.0.0.1:0", adopt_after=60, data_path=peer_data)
    address = f"127.0.0.1:{peer._service.replication_port}"
    origin = await start_nsqd(replication_insecure=True, node_id=1, replica_peers=[address], data_path=origin_data)
    try:
        await until(lambda: origin._service.replication.origin.in_sync() == 1)
        r = await treq.post(f"http://127.0.0.1:{origin.http_port}/mpub?topic=t", b"x\ny")
        assert r.code == 200
        await origin.stop()
        origin = await start_nsqd(replication_insecure=True, node_id=1, replica_peers=[address], data_path=origin_data)
        await until(lambda: origin._service.replication.origin.in_sync() == 1)
        assert origin._service.replication.adoptions_reported == []  # the peer did not adopt it
        assert not peer._service.adoption.adopted
        assert sorted(await drain(origin, "t", "c", 2)) == [b"x", b"y"]
    finally:
        await origin.stop()
        await peer.stop()


def _gated_proxy(port: int):
    """A TCP forwarder to ``port`` that holds what the far end answers until ``open()``."""
    from twisted.internet import reactor
    from twisted.protocols import portforward

    held: list = []
    gate = {"open": False}

    class Client(portforward.ProxyClient):
        def dataReceived(self, data: bytes) -> None:
            if gate["open"]:
                super().dataReceived(data)
            else:
                held.append((self, data))

    class ClientFactory(portforward.ProxyClientFactory):
        protocol = Client

    class Server(portforward.ProxyServer):
        clientProtocolFactory = ClientFactory

    factory = portforward.ProxyFactory("127.0.0.1", port)
    factory.protocol = Server
    listening = reactor.listenTCP(0, factory, interface="127.0.0.1")

    def open_gate() -> None:
        gate["open"] = True
        for client, data in held:
            portforward.ProxyClient.dataReceived(client, data)
        held.clear()

    return listening, open_gate, held


@pytest_twisted.ensureDeferred
async def test_a_consumer_of_a_returning_origin_gets_nothing_its_peer_adopted(tmp_path):
    """Delivery waits for the peers' answer: a consumer connected to the returning origin
    before its peer answered HELLO gets none of the backlog the peer adopted (delivered there
    once), only what is published after."""
    peer, origin_data, _ = await _adopted_pair(tmp_path)
    origin = None
    s = None
    proxy, open_gate, held = _gated_proxy(peer._service.replication_port)
    try:
        await until(lambda: peer._service.adoption.adopted)
        origin = await start_nsqd(replication_insecure=True, node_id=1, replica_peers=[f"127.0.0.1:{proxy.getHost().port}"],
                                  data_path=origin_data)
        rep = origin._service.replication
        await until(lambda: held)  # the peer answered; the answer is held back
        assert origin._service.broker.delivery_held and not rep.adoptions_reported
        assert (await stats(origin))["replication"]["delivery_held"] is True
        s = await connect_raw(origin.tcp_port)
        s.send(command("SUB", "t", "c"))
        assert await s.response() == b"OK"
        s.send(command("RDY", 100))
        await sleep(0.2)
        assert not origin._service.broker.topics["t"].channels["c"].inflight  # nothing handed out
        open_gate()
        await until(lambda: rep.adoptions_reported)
        assert rep.adoptions_reported[0][1:] == (5, 0) and not origin._service.broker.delivery_held
        r = await treq.post(f"http://127.0.0.1:{origin.http_port}/pub?topic=t", b"after")
        assert r.code == 200
        assert (await s.message()).body == b"after"  # the first it gets: none of the five
        assert sorted(await drain(peer, "t", "c", 5)) == [b"m%d" % i for i in range(5)]
    finally:
        if s is not None:
            await s.close()
        if origin is not None:
            await origin.stop()
        await peer.stop()
        await proxy.stopListening()


@pytest_twisted.ensureDeferred
async def test_a_returning_origin_whose_peer_does_not_answer_delivers_after_the_timeout(tmp_path):
    """A peer that accepts the link and never answers HELLO holds the backlog back for at
    most --replication-timeout; then it is delivered (duplicates, never loss)."""
    from twisted.internet import reactor
    from twisted.internet.protocol import Factory, Protocol

    peer, origin_data, _ = await _adopted_pair(tmp_path)
    await until(lambda: peer._service.adoption.adopted)
    await peer.stop()
    mute = reactor.listenTCP(0, Factory.forProtocol(Protocol), interface="127.0.0.1")
    origin = await start_nsqd(replication_insecure=True, node_id=1, replica_peers=[f"127.0.0.1:{mute.getHost().port}"],
                              data_path=origin_data, replication_timeout=2.0, replication_degraded="accept")
    try:
        assert origin._service.broker.delivery_held
        assert (await stats(origin))["replication"]["delivery_held"] is True
        assert sorted(await drain(origin, "t", "c", 5)) == [b"m%d" % i for i in range(5)]
        assert not origin._service.broker.delivery_held
    finally:
        await origin.stop()
        await mute.stopListening()


@pytest_twisted.ensureDeferred
async def test_a_peer_catches_up_with_a_backlog_larger_than_the_lag_limit(tmp_path, monkeypatch):
    """A backlog of more messages than a peer may lag behind: the snapshot goes out a few
    batches at a time as the peer stores them, so the peer is never dropped as fallen behind
    (before, every message of the snapshot counted as lag at once: a peer could not catch up
    with an origin holding more than a million messages, and publishes were refused)."""
    from functools import partial

    import nsqtw.nsqd.replication as service_module
    from nsqtw.nsqd.core.replication import outstanding as real_outstanding

    monkeypatch.setattr(service_module, "outstanding", partial(real_outstanding, entry_bytes=2000))
    peer_port = free_port()
    origin = await start_nsqd(replication_insecure=True, node_id=1, replica_peers=[f"127.0.0.1:{peer_port}"],
                              data_path=str(tmp_path), replication_degraded="accept", mem_queue_size=1000)
    rep = origin._service.replication.origin
    rep.max_lag = 100
    at_link = []
    linked = rep.linked

    def small_batches(address, node_id, now, snapshot=None, batch_bytes=0):
        frames = linked(address, node_id, now, snapshot, batch_bytes=2000)
        at_link.append((rep.peers[address].lag_messages, rep.behind(), len(frames)))
        return frames

    rep.linked = small_batches
    os.mkdir(tmp_path / "peer")
    peer = None
    try:
        p = await connect_raw(origin.tcp_port)
        p.send(command("SUB", "t", "c"))  # the channel exists; nobody reads it
        assert await p.response() == b"OK"
        p2 = await connect_raw(origin.tcp_port)
        for k in range(30):
            p2.send(mpub_command("t", [b"m%04d" % (k * 100 + i) for i in range(100)]))
            assert await p2.response() == b"OK"
        peer = await start_nsqd(replication_insecure=True, node_id=2, replication_address=f"127.0.0.1:{peer_port}", adopt_after=60,
                                data_path=str(tmp_path / "peer"))
        await until(lambda: rep.in_sync() == 1)
        (lag, behind, sent), = at_link
        assert lag <= 100 and behind == [] and sent < 20  # a window of the snapshot, not all of it
        await until(lambda: peer._service.shadow_files.states[1].count() == 3000)
        assert (await stats(origin))["replication"]["peers"][0]["catch_ups"] == 1  # never dropped
        await p.close()
        await p2.close()
    finally:
        await origin.stop()
        if peer is not None:
            await peer.stop()
