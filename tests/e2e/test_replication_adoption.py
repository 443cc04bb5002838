"""Adoption (issue 26, step 3), over loopback: once every link from an origin has been down
for --adopt-after, the peer republishes each message some channel had not finished, with the
origin's ID and timestamp, to the channels that had not finished it; a deferred message keeps
its due time; the topics and channels are registered with nsqlookupd; the shadow is retired."""

from __future__ import annotations

import json
import os

import pytest
import pytest_twisted
import treq
from twisted.internet import reactor

from nsqtw.embed import start_nsqd
from nsqtw.lookupd.embed import start_nsqlookupd
from nsqtw.testing import body_command, command, connect_raw, mpub_command

from replication_support import sleep, text_id, until

pytestmark = pytest.mark.e2e


@pytest_twisted.ensureDeferred
async def test_the_peer_delivers_what_the_dead_origin_had_not_finished():
    lookupd = await start_nsqlookupd()
    peer = await start_nsqd(replication_insecure=True, node_id=2, replication_address="127.0.0.1:0", adopt_after=0.5,
                            lookupd_tcp_addresses=[lookupd.tcp_address])
    origin = await start_nsqd(replication_insecure=True, node_id=1, replica_peers=[f"127.0.0.1:{peer._service.replication_port}"])
    try:
        await until(lambda: origin._service.replication.origin.in_sync() == 1)
        c = await connect_raw(origin.tcp_port)
        c.send(command("SUB", "t", "c"))
        assert await c.response() == b"OK"
        p = await connect_raw(origin.tcp_port)
        p.send(mpub_command("t", [b"m%d" % i for i in range(10)]))
        assert await p.response() == b"OK"
        p.send(body_command("DPUB", "t", 1500, body=b"later"))
        assert await p.response() == b"OK"
        c.send(command("RDY", 3))
        first = [await c.message() for _ in range(3)]
        for m in first:
            c.send(command("FIN", text_id(m.id)))
        await until(lambda: peer._service.shadow_files.states[1].count() == 8)
        shadowed = {m.frame[18:34]: int.from_bytes(m.frame[8:16], "big")
                    for m in peer._service.shadow_files.states[1].unfinished()}
        # the origin dies (its links drop); nothing is adopted before --adopt-after
        await p.close()
        await c.close()
        await origin.stop()
        await sleep(0.2)
        assert not peer._service.adoption.adopted
        await until(lambda: peer._service.adoption.adopted, 5)
        assert peer._service.adoption.adopted[0][:3] == (1, 8, 0)
        assert 1 not in peer._service.shadow_files.states
        assert any(n.startswith("nsqtw-shadow.1.adopted.") for n in os.listdir(peer._service.data_path))
        # a stock consumer of the survivor gets the 7 unfinished messages at once, the deferred one later
        s = await connect_raw(peer.tcp_port)
        s.send(command("SUB", "t", "c"))
        assert await s.response() == b"OK"
        s.send(command("RDY", 20))
        got = [await s.message() for _ in range(7)]
        assert sorted(m.body for m in got) == sorted(b"m%d" % i for i in range(3, 10))
        for m in got:  # the origin's IDs and timestamps
            mid = m.id if isinstance(m.id, bytes) else m.id.encode()
            assert shadowed[mid] == m.timestamp
        later = await s.message(timeout=5)
        assert later.body == b"later"
        assert reactor.seconds() - later.timestamp / 1e9 >= 1.4  # not before its due time
        await s.close()
        # nsqlookupd knows the survivor has the topic and channel
        r = await treq.get(f"http://{lookupd.http_address}/lookup?topic=t")
        doc = json.loads(await r.content())
        assert [p["tcp_port"] for p in doc["producers"]] == [peer.tcp_port] and doc["channels"] == ["c"]
        stats = json.loads(await (await treq.get(f"http://127.0.0.1:{peer.http_port}/stats?format=json")).content())
        assert stats["replication"]["adopted"][0]["messages"] == 8
    finally:
        await peer.stop()
        await lookupd.stop()


@pytest_twisted.ensureDeferred
async def test_an_origin_that_comes_back_in_time_is_not_adopted():
    peer = await start_nsqd(replication_insecure=True, node_id=2, replication_address="127.0.0.1:0", adopt_after=1.0)
    origin = await start_nsqd(replication_insecure=True, node_id=1, replica_peers=[f"127.0.0.1:{peer._service.replication_port}"])
    try:
        await until(lambda: origin._service.replication.origin.in_sync() == 1)
        r = await treq.post(f"http://127.0.0.1:{origin.http_port}/pub?topic=t", b"x")
        assert r.code == 200
        link = next(iter(peer._service.replication_listener.factory.protocols))
        link.transport.abortConnection()  # a dropped link; the origin reconnects within a second
        await until(lambda: origin._service.replication.origin.in_sync() == 0)
        await until(lambda: origin._service.replication.origin.in_sync() == 1, 5)
        await sleep(1.2)
        assert not peer._service.adoption.adopted and peer._service.shadow_files.states[1].count() == 1
    finally:
        await origin.stop()
        await peer.stop()


@pytest_twisted.ensureDeferred
async def test_a_restarted_peer_adopts_the_shadow_it_kept_on_disk(tmp_path):
    data = str(tmp_path / "peer")
    os.mkdir(data)
    peer = await start_nsqd(replication_insecure=True, node_id=2, replication_address="127.0.0.1:0", adopt_after=60, data_path=data)
    origin = await start_nsqd(replication_insecure=True, node_id=1, replica_peers=[f"127.0.0.1:{peer._service.replication_port}"])
    await until(lambda: origin._service.replication.origin.in_sync() == 1)
    r = await treq.post(f"http://127.0.0.1:{origin.http_port}/mpub?topic=t", b"a\nb")
    assert r.code == 200
    await origin.stop()
    await peer.stop()
    peer = await start_nsqd(replication_insecure=True, node_id=2, replication_address="127.0.0.1:0", adopt_after=0.3, data_path=data)
    try:
        await until(lambda: peer._service.adoption.adopted, 5)
        s = await connect_raw(peer.tcp_port)
        s.send(command("SUB", "t", "c"))
        assert await s.response() == b"OK"
        s.send(command("RDY", 5))
        assert sorted([(await s.message()).body for _ in range(2)]) == [b"a", b"b"]
        await s.close()
    finally:
        await peer.stop()
