"""Consumer state follows the messages to the peer (issue 26, step 2), over loopback: a
consumer's FINs on the origin empty the peer's shadow, a REQ with a delay moves the shadowed
due time, deleting a channel or topic drops what only it held, and ephemeral channels are not
replicated."""

from __future__ import annotations

import json

import pytest
import pytest_twisted
import treq
from twisted.internet import reactor

from nsqtw.embed import start_nsqd
from nsqtw.testing import command, connect_raw, mpub_command

from replication_support import until

pytestmark = pytest.mark.e2e


@pytest_twisted.async_yield_fixture
async def pair():
    peer = await start_nsqd(replication_insecure=True, node_id=2, replication_address="127.0.0.1:0")
    origin = await start_nsqd(replication_insecure=True, node_id=1, replica_peers=[f"127.0.0.1:{peer._service.replication_port}"])
    await until(lambda: origin._service.replication.origin.in_sync() == 1)
    yield origin, peer
    await origin.stop()
    await peer.stop()


def shadow(peer):
    return peer._service.shadow_files.states[1]


async def consumer(origin, topic: str, channel: str):
    c = await connect_raw(origin.tcp_port)
    c.send(command("SUB", topic, channel))
    assert await c.response() == b"OK"
    return c


@pytest_twisted.ensureDeferred
async def test_fins_empty_the_shadow_and_req_moves_its_due_time(pair):
    origin, peer = pair
    a = await consumer(origin, "t", "a")
    b = await consumer(origin, "t", "b")
    eph = await consumer(origin, "t", "e#ephemeral")
    await until(lambda: shadow(peer).topics.get("t") == {"a", "b"})  # the ephemeral one is not there
    p = await connect_raw(origin.tcp_port)
    p.send(mpub_command("t", [b"m%d" % i for i in range(10)]))
    assert await p.response() == b"OK"
    assert shadow(peer).count() == 10
    a.send(command("RDY", 10))
    ids = [(await a.message()).id for _ in range(10)]
    for i in ids:
        a.send(command("FIN", i.decode() if isinstance(i, bytes) else i))
    await until(lambda: all(m.pending == {"b"} for m in shadow(peer).messages.values()))
    b.send(command("RDY", 10))
    got = [await b.message() for _ in range(10)]
    for m in got[:9]:
        b.send(command("FIN", m.id.decode() if isinstance(m.id, bytes) else m.id))
    last = got[9].id.decode() if isinstance(got[9].id, bytes) else got[9].id
    b.send(command("REQ", last, 60000))
    await until(lambda: shadow(peer).count() == 1)
    [(mid, m)] = shadow(peer).messages.items()
    await until(lambda: m.due > 0)
    assert abs(m.due / 1e9 - reactor.seconds() - 60) < 10
    # the peer's /stats shows the shadow
    doc = json.loads(await (await treq.get(f"http://127.0.0.1:{peer.http_port}/stats?format=json")).content())
    assert doc["replication"]["shadows"][0]["origin_node_id"] == 1
    assert doc["replication"]["shadows"][0]["unfinished_messages"] == 1
    for c in (a, b, eph, p):
        await c.close()


@pytest_twisted.ensureDeferred
async def test_channel_and_topic_deletion_drop_what_only_they_held(pair):
    origin, peer = pair
    http = f"http://127.0.0.1:{origin.http_port}"
    for t in ("t", "u"):
        assert (await treq.post(f"{http}/topic/create?topic={t}")).code == 200
        assert (await treq.post(f"{http}/channel/create?topic={t}&channel=a")).code == 200
    r = await treq.post(f"{http}/mpub?topic=t", b"1\n2")
    assert r.code == 200
    r = await treq.post(f"{http}/pub?topic=u", b"3")
    assert r.code == 200
    assert shadow(peer).count() == 3
    await treq.post(f"{http}/channel/delete?topic=t&channel=a")
    await until(lambda: shadow(peer).count() == 1)
    await treq.post(f"{http}/topic/delete?topic=u")
    await until(lambda: not shadow(peer).messages and "u" not in shadow(peer).topics)


@pytest_twisted.ensureDeferred
async def test_a_peer_linked_late_learns_the_topology(pair):
    """Topics and channels created before the link came up are sent when it does."""
    origin, peer = pair
    port = peer._service.replication_port
    http = f"http://127.0.0.1:{origin.http_port}"
    assert (await treq.post(f"{http}/topic/create?topic=old")).code == 200
    assert (await treq.post(f"{http}/channel/create?topic=old&channel=c")).code == 200
    await peer.stop()
    await until(lambda: origin._service.replication.origin.in_sync() == 0)
    peer2 = await start_nsqd(replication_insecure=True, node_id=3, replication_address=f"127.0.0.1:{port}")
    try:
        await until(lambda: 1 in peer2._service.shadow_files.states
                    and peer2._service.shadow_files.states[1].topics.get("old") == {"c"}, 10)
    finally:
        await peer2.stop()
