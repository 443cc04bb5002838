"""Drain (nsq#1302) and planned maintenance over loopback: a draining node refuses publishes
(TCP E_PUB_FAILED, HTTP 503 DRAINING, /ping 503), leaves nsqlookupd, delivers what it holds
or hands it to a replica peer in sync (adopted at once, with its consent, not after
--adopt-after); a maintenance window keeps the peers from adopting a node that is down for
longer than --adopt-after; a SIGTERM with --drain-timeout drains before the process exits."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
import treq

from nsqtw.embed import start_nsqd
from nsqtw.lookupd.embed import start_nsqlookupd
from nsqtw.testing import body_command, command, connect_raw

from replication_support import (
    ChildNsqd, count, data_dir, drain, publish, secret_file, sleep, text_id, until,
)

pytestmark = pytest.mark.e2e

TIMEOUT = 1.0


async def get_json(port: int, path: str) -> Any:
    r = await treq.get(f"http://127.0.0.1:{port}{path}")
    return json.loads(await r.content())


async def post(port: int, path: str, body: bytes = b"") -> tuple[int, bytes]:
    r = await treq.post(f"http://127.0.0.1:{port}{path}", body)
    return r.code, await r.content()


async def pub_refused(port: int) -> bytes:
    """A PUB's error frame on a fresh connection."""
    c = await connect_raw(port)
    try:
        c.send(body_command("PUB", "t", body=b"refused"))
        try:
            await c.response()
        except AssertionError as e:
            return str(e).encode()
        return b"OK"
    finally:
        await c.close()


@pytest_twisted.ensureDeferred
async def test_a_drain_without_a_peer_refuses_publishes_leaves_lookupd_and_delivers_what_it_holds():
    lookupd = await start_nsqlookupd()
    node = await start_nsqd(lookupd_tcp_addresses=[lookupd.tcp_address])
    try:
        acknowledged = await publish(node.tcp_port, "t", b"m", 20)
        assert len(acknowledged) == 20
        c = await connect_raw(node.tcp_port)
        c.send(command("SUB", "t", "c"))
        assert await c.response() == b"OK"

        async def producers() -> list[int]:
            doc = await get_json(lookupd.http_port, "/lookup?topic=t")
            return [p["tcp_port"] for p in doc.get("producers") or []]

        for _ in range(100):
            if await producers():
                break
            await sleep(0.05)
        assert await producers() == [node.tcp_port]
        code, body = await post(node.http_port, "/drain")
        assert code == 200 and json.loads(body)["state"] == "draining"
        # refused at once, on every path
        assert b"E_PUB_FAILED" in await pub_refused(node.tcp_port)
        code, body = await post(node.http_port, "/pub?topic=t", b"x")
        assert code == 503 and json.loads(body) == {"message": "DRAINING"}
        r = await treq.get(f"http://127.0.0.1:{node.http_port}/ping")
        assert r.code == 503 and b"draining" in await r.content()
        # consumers stop discovering it
        for _ in range(100):
            if not await producers():
                break
            await sleep(0.05)
        assert await producers() == []
        progress = await get_json(node.http_port, "/drain")
        assert progress["state"] == "draining" and progress["queued"] + progress["in_flight"] == 20
        assert progress["peer"] is None
        stats = await get_json(node.http_port, "/stats?format=json")
        assert stats["drain"]["state"] == "draining"
        text = (await (await treq.get(f"http://127.0.0.1:{node.http_port}/stats")).content()).decode()
        assert "Drain: draining: " in text
        # the connected consumer still gets everything
        c.send(command("RDY", 50))
        got = []
        for _ in range(20):
            m = await c.message()
            got.append(m.body)
            c.send(command("FIN", text_id(m.id)))
        assert count(acknowledged, got) == (0, 0)
        await until(lambda: node._service.drain.drain.state == "drained", 5)
        progress = await get_json(node.http_port, "/drain")
        assert progress["state"] == "drained" and progress["queued"] == progress["in_flight"] == 0
        assert progress["handed_off"] == 0
        metrics = (await (await treq.get(f"http://127.0.0.1:{node.http_port}/metrics")).content()).decode()
        assert 'nsq_drain_state{state="drained"} 1' in metrics
        await c.close()
        # cancelled: it serves again and registers again
        r = await treq.delete(f"http://127.0.0.1:{node.http_port}/drain")
        assert json.loads(await r.content())["state"] == "serving"
        assert await publish(node.tcp_port, "t", b"again", 1) == [b"again0"]
        assert "drain" not in await get_json(node.http_port, "/stats?format=json")  # Go's document again
        for _ in range(100):
            if await producers():
                break
            await sleep(0.05)
        assert await producers() == [node.tcp_port]
    finally:
        await node.stop()
        await lookupd.stop()


async def replicated_pair(tmp_path: Path, **origin_options: Any) -> tuple[Any, Any]:
    secret = secret_file(tmp_path)
    peer = await start_nsqd(node_id=2, replication_address="127.0.0.1:0", data_path=data_dir(tmp_path, "peer"),
                            replication_secret_file=secret, replication_timeout=TIMEOUT, adopt_after=60.0)
    origin = await start_nsqd(node_id=1, replica_peers=[f"127.0.0.1:{peer._service.replication_port}"],
                              data_path=data_dir(tmp_path, "origin"), replication_secret_file=secret,
                              replication_timeout=TIMEOUT, **origin_options)
    await until(lambda: origin._service.replication.origin.in_sync() == 1)
    return origin, peer


@pytest_twisted.ensureDeferred
async def test_a_drain_hands_the_backlog_to_a_peer_in_sync_at_once(tmp_path):
    """--adopt-after is a minute: the peer adopts with the origin's consent, not on a timer;
    what the origin's consumer finished before is not handed off (no duplicates)."""
    origin, peer = await replicated_pair(tmp_path)
    try:
        acknowledged = await publish(origin.tcp_port, "t", b"m", 50)
        assert len(acknowledged) == 50
        first = await drain(origin.tcp_port, "t", "c", set(acknowledged[:10]))
        done_here = first[:len(first)]
        await until(lambda: peer._service.shadow_files.states[1].count() == 50 - len(done_here))
        code, body = await post(origin.http_port, "/drain")
        assert code == 200
        await until(lambda: origin._service.drain.drain.state == "drained", 10)
        progress = await get_json(origin.http_port, "/drain")
        assert progress["handed_off"] == 50 - len(done_here)
        assert progress["peer"] == f"127.0.0.1:{peer._service.replication_port}"
        assert progress["queued"] == progress["in_flight"] == 0
        assert [o for o, _, _ in peer._service.adoption.handed_over] == [1]
        stats = await get_json(peer.http_port, "/stats?format=json")
        assert stats["replication"]["handed_over"][0]["messages"] == 50 - len(done_here)
        rest = await drain(peer.tcp_port, "t", "c", set(acknowledged) - set(done_here))
        assert count(acknowledged, done_here + rest) == (0, 0)
        assert b"E_PUB_FAILED" in await pub_refused(origin.tcp_port)
        assert not peer._service.adoption.adopted  # a hand-off, not the adoption of a lost node
        # cancelled, it serves again; a second drain hands off what came since (a new epoch)
        r = await treq.delete(f"http://127.0.0.1:{origin.http_port}/drain")
        assert json.loads(await r.content())["state"] == "serving"
        again = await publish(origin.tcp_port, "t", b"again", 5)
        await until(lambda: peer._service.shadow_files.states[1].count() == 5)
        await post(origin.http_port, "/drain")
        await until(lambda: origin._service.drain.drain.state == "drained", 10)
        assert [n for _, n, _ in peer._service.adoption.handed_over] == [50 - len(done_here), 5]
        assert count(again, await drain(peer.tcp_port, "t", "c", set(again))) == (0, 0)
    finally:
        await origin.stop()
        await peer.stop()


@pytest_twisted.ensureDeferred
async def test_a_maintenance_window_longer_than_adopt_after_keeps_the_messages_on_the_node(tmp_path):
    """The origin asks for ten minutes, then stops for three times --adopt-after: the peer
    keeps the window through the dropped link and adopts nothing; the origin comes back with
    every message, and its return ends the window."""
    secret = secret_file(tmp_path)
    peer = await start_nsqd(node_id=2, replication_address="127.0.0.1:0", data_path=data_dir(tmp_path, "peer"),
                            replication_secret_file=secret, replication_timeout=TIMEOUT, adopt_after=0.5)
    flags = dict(node_id=1, replica_peers=[f"127.0.0.1:{peer._service.replication_port}"],
                 data_path=data_dir(tmp_path, "origin"), replication_secret_file=secret,
                 replication_timeout=TIMEOUT, replication_degraded="accept")
    origin = await start_nsqd(**flags)
    try:
        await until(lambda: origin._service.replication.origin.in_sync() == 1)
        acknowledged = await publish(origin.tcp_port, "t", b"m", 30)
        await until(lambda: peer._service.shadow_files.states[1].count() == 30)
        code, body = await post(origin.http_port, "/replication/maintenance?for=10m")
        doc = json.loads(body)
        assert code == 200 and doc["active"] and doc["peers_told"] == [f"127.0.0.1:{peer._service.replication_port}"]
        assert (await post(origin.http_port, "/replication/maintenance?for=soon"))[0] == 400
        await until(lambda: peer._service.shadow_factory.maintenance.remaining(peer._service.reactor.seconds()))
        stats = await get_json(peer.http_port, "/stats?format=json")
        assert stats["replication"]["maintenance_windows"][0]["origin_node_id"] == 1
        metrics = (await (await treq.get(f"http://127.0.0.1:{peer.http_port}/metrics")).content()).decode()
        assert 'nsq_replication_origin_maintenance_seconds{origin_node_id="1"}' in metrics
        await origin.stop()
        await sleep(3 * 0.5 + TIMEOUT)
        assert not peer._service.adoption.adopted
        assert peer._service.shadow_files.states[1].count() == 30
        origin = await start_nsqd(**flags)
        await until(lambda: origin._service.replication.origin.in_sync() == 1, 10)
        await until(lambda: not peer._service.shadow_factory.maintenance.until)  # it is back
        delivered = await drain(origin.tcp_port, "t", "c", set(acknowledged))
        assert count(acknowledged, delivered) == (0, 0)
        assert not peer._service.adoption.adopted
    finally:
        await origin.stop()
        await peer.stop()


@pytest_twisted.ensureDeferred
async def test_maintenance_on_stop_tells_the_peers_as_the_node_stops(tmp_path):
    secret = secret_file(tmp_path)
    peer = await start_nsqd(node_id=2, replication_address="127.0.0.1:0", data_path=data_dir(tmp_path, "peer"),
                            replication_secret_file=secret, replication_timeout=TIMEOUT, adopt_after=0.5)
    origin = await start_nsqd(node_id=1, replica_peers=[f"127.0.0.1:{peer._service.replication_port}"],
                              data_path=data_dir(tmp_path, "origin"), replication_secret_file=secret,
                              replication_timeout=TIMEOUT, maintenance_on_stop=600.0)
    try:
        await until(lambda: origin._service.replication.origin.in_sync() == 1)
        await publish(origin.tcp_port, "t", b"m", 5)
        await until(lambda: peer._service.shadow_files.states[1].count() == 5)
        await origin.stop()
        await sleep(3 * 0.5 + TIMEOUT)
        assert not peer._service.adoption.adopted
        assert peer._service.shadow_factory.maintenance.until
    finally:
        await origin.stop()
        await peer.stop()


@pytest_twisted.ensureDeferred
async def test_sigterm_with_drain_timeout_drains_before_the_process_exits(tmp_path):
    child = await ChildNsqd.start(data_dir(tmp_path, "node"), "--drain-timeout=30s")
    try:
        acknowledged = await publish(child.tcp_port, "t", b"m", 10)
        c = await connect_raw(child.tcp_port)
        c.send(command("SUB", "t", "c"))
        assert await c.response() == b"OK"
        child.signal(signal.SIGTERM)
        # still serving: draining, publishes refused, the consumer gets what is left
        for _ in range(200):
            r = await treq.get(f"http://127.0.0.1:{child.http_port}/ping")
            if r.code == 503:
                break
            await r.content()
            await sleep(0.02)
        assert b"draining" in await r.content()
        assert b"E_PUB_FAILED" in await pub_refused(child.tcp_port)
        assert not child.ended.called
        c.send(command("RDY", 20))
        got = []
        for _ in range(10):
            m = await c.message()
            got.append(m.body)
            c.send(command("FIN", text_id(m.id)))
        assert count(acknowledged, got) == (0, 0)
        await until(lambda: child.ended.called, 10)
        assert any("DRAIN: drained" in line for line in child.lines), child.lines[-10:]
        await c.close()
    finally:
        await child.kill()


@pytest_twisted.ensureDeferred
async def test_a_second_sigterm_stops_at_once_and_what_is_left_stays_in_the_data_path(tmp_path):
    path = data_dir(tmp_path, "node")
    child = await ChildNsqd.start(path, "--drain-timeout=10m")
    try:
        acknowledged = await publish(child.tcp_port, "t", b"m", 3)
        c = await connect_raw(child.tcp_port)
        c.send(command("SUB", "t", "c"))  # a consumer that takes nothing: the drain cannot finish
        assert await c.response() == b"OK"
        child.signal(signal.SIGTERM)
        for _ in range(200):
            r = await treq.get(f"http://127.0.0.1:{child.http_port}/ping")
            await r.content()
            if r.code == 503:
                break
            await sleep(0.02)
        assert r.code == 503 and not child.ended.called
        child.signal(signal.SIGTERM)
        await until(lambda: child.ended.called, 10)  # not the ten minutes of its --drain-timeout
        assert any("stopping before the drain is done" in line for line in child.lines), child.lines[-10:]
        await c.close()
    finally:
        await child.kill()
    child = await ChildNsqd.start(path)
    try:
        assert count(acknowledged, await drain(child.tcp_port, "t", "c", set(acknowledged))) == (0, 0)
    finally:
        await child.kill()


@pytest_twisted.ensureDeferred
async def test_a_peer_that_drains_too_refuses_the_hand_off_and_the_node_keeps_its_messages(tmp_path):
    origin, peer = await replicated_pair(tmp_path)
    try:
        acknowledged = await publish(origin.tcp_port, "t", b"m", 10)
        await until(lambda: peer._service.shadow_files.states[1].count() == 10)
        assert (await post(peer.http_port, "/drain"))[0] == 200
        await post(origin.http_port, "/drain")
        await until(lambda: origin._service.drain.drain.handoff_error, 10)
        progress = await get_json(origin.http_port, "/drain")
        assert progress["handoff_error"] == "this node drains too" and progress["state"] == "draining"
        assert progress["queued"] == 10 and not peer._service.adoption.handed_over
        # delivered from the origin meanwhile: nothing lost, nothing twice
        assert count(acknowledged, await drain(origin.tcp_port, "t", "c", set(acknowledged))) == (0, 0)
        await until(lambda: origin._service.drain.drain.state == "drained", 10)
    finally:
        await origin.stop()
        await peer.stop()
