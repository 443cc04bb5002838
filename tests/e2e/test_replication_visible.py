"""Replication made visible, end to end over loopback (issue 26, item 5): a replicated pair's
/stats (text and format=json), Prometheus /metrics and nsqadmin's node page show each peer's
sync state (in sync / down) and lag in messages and seconds, and the adopted origins (origin,
epoch, when, messages) once the peer adopted its dead origin; an unreplicated nsqd shows none."""

from __future__ import annotations

import json

import pytest
import pytest_twisted
import treq

from nsqtw.embed import start_nsqadmin, start_nsqd
from nsqtw.testing import body_command, connect_raw, mpub_command

from replication_support import until

pytestmark = pytest.mark.e2e


async def get(url: str) -> tuple[int, bytes]:
    r = await treq.get(url, persistent=False)
    return r.code, await r.content()


async def stats(node) -> dict:
    code, body = await get(f"http://127.0.0.1:{node.http_port}/stats?format=json")
    assert code == 200
    return json.loads(body)


def metric_lines(body: bytes) -> set[str]:
    return set(body.decode().splitlines())


@pytest_twisted.ensureDeferred
async def test_stats_metrics_and_nsqadmin_show_peers_lag_and_adoption():
    peer = await start_nsqd(replication_insecure=True, node_id=2, replication_address="127.0.0.1:0", adopt_after=0.3)
    address = f"127.0.0.1:{peer._service.replication_port}"
    origin = await start_nsqd(replication_insecure=True, node_id=1, replica_peers=[address], replication_degraded="accept")
    admin = await start_nsqadmin(nsqd_http_addresses=[f"127.0.0.1:{origin.http_port}",
                                                      f"127.0.0.1:{peer.http_port}"])
    try:
        await until(lambda: origin._service.replication.origin.in_sync() == 1)
        c = await connect_raw(origin.tcp_port)
        c.send(mpub_command("t", [b"a", b"b", b"c"]))
        assert await c.response() == b"OK"

        # in sync: acknowledged, so no lag
        (p,) = (await stats(origin))["replication"]["peers"]
        assert (p["address"], p["sync_state"], p["state"], p["node_id"]) == (address, "in_sync", "in_sync", 2)
        assert (p["lag_messages"], p["lag_seconds"], p["unacked_batches"]) == (0, 0.0, 0)
        code, text = await get(f"http://127.0.0.1:{origin.http_port}/stats")
        assert code == 200 and f"[peer {address}] in_sync (in_sync) lag: 0 messages".encode() in text
        code, body = await get(f"http://127.0.0.1:{origin.http_port}/metrics")
        lines = metric_lines(body)
        assert code == 200 and f'nsq_replication_peer_in_sync{{peer="{address}"}} 1' in lines
        assert f'nsq_replication_peer_lag_messages{{peer="{address}"}} 0' in lines
        assert "nsq_replication_replicated_messages_total 3" in lines

        # nsqadmin's node page: the origin's peers
        code, page = await get(f"http://{admin.http_address}/nodes/127.0.0.1:{origin.http_port}")
        assert code == 200
        html = page.decode()
        assert "<h2>Replication</h2>" in html and f'data-row="peer:{address}:in_sync"' in html and "in sync" in html

        # the peer dies: down, lagging by what the origin accepted since (degraded=accept)
        await c.close()
        await peer.stop()
        await until(lambda: origin._service.replication.origin.in_sync() == 0)
        c = await connect_raw(origin.tcp_port)
        c.send(mpub_command("t", [b"d", b"e"]))
        assert await c.response() == b"OK"
        (p,) = (await stats(origin))["replication"]["peers"]
        assert (p["sync_state"], p["lag_messages"]) == ("down", 2) and p["state"] != "in_sync"
        code, body = await get(f"http://127.0.0.1:{origin.http_port}/metrics")
        lines = metric_lines(body)
        assert f'nsq_replication_peer_in_sync{{peer="{address}"}} 0' in lines
        assert f'nsq_replication_peer_down{{peer="{address}"}} 1' in lines
        assert f'nsq_replication_peer_lag_messages{{peer="{address}"}} 2' in lines
        code, page = await get(f"http://{admin.http_address}/api/nodes/127.0.0.1:{origin.http_port}")
        doc = json.loads(page)
        assert doc["replication"]["peers"][0]["sync_state"] == "down"
        await c.close()
    finally:
        await admin.stop()
        await origin.stop()
        if peer._service.running:
            await peer.stop()


@pytest_twisted.ensureDeferred
async def test_the_adopter_shows_the_origins_it_adopted():
    peer = await start_nsqd(replication_insecure=True, node_id=2, replication_address="127.0.0.1:0", adopt_after=0.3)
    origin = await start_nsqd(replication_insecure=True, node_id=1, replica_peers=[f"127.0.0.1:{peer._service.replication_port}"])
    admin = await start_nsqadmin(nsqd_http_addresses=[f"127.0.0.1:{peer.http_port}"])
    try:
        await until(lambda: origin._service.replication.origin.in_sync() == 1)
        c = await connect_raw(origin.tcp_port)
        c.send(mpub_command("t", [b"a", b"b", b"c"]))
        assert await c.response() == b"OK"
        c.send(body_command("PUB", "t", body=b"d"))
        assert await c.response() == b"OK"
        shadow = (await stats(peer))["replication"]["shadows"]
        assert [(s["origin_node_id"], s["unfinished_messages"]) for s in shadow] == [(1, 4)]
        await c.close()
        await origin.stop()
        await until(lambda: peer._service.adoption.adopted)
        (ad,) = (await stats(peer))["replication"]["adopted"]
        assert (ad["origin_node_id"], ad["messages"], ad["refused"]) == (1, 4, 0)
        assert ad["epoch"] == int(ad["at"] * 1e9) and ad["epoch"] > 0
        code, text = await get(f"http://127.0.0.1:{peer.http_port}/stats")
        assert f"Adopted node 1 (epoch {ad['epoch']}): 4 messages republished here".encode() in text
        code, body = await get(f"http://127.0.0.1:{peer.http_port}/metrics")
        lines = metric_lines(body)
        assert 'nsq_replication_adopted_messages_total{origin_node_id="1"} 4' in lines
        assert 'nsq_replication_adoptions_total{origin_node_id="1"} 1' in lines
        code, page = await get(f"http://{admin.http_address}/nodes/127.0.0.1:{peer.http_port}")
        html = page.decode()
        assert code == 200 and "Adopted origins" in html and f'data-row="adopted:1:{ad["epoch"]}"' in html
    finally:
        await admin.stop()
        if origin._service.running:
            await origin.stop()
        await peer.stop()


@pytest_twisted.ensureDeferred
async def test_an_unreplicated_node_shows_no_replication_anywhere():
    nsqd = await start_nsqd()
    admin = await start_nsqadmin(nsqd_http_addresses=[f"127.0.0.1:{nsqd.http_port}"])
    try:
        assert "replication" not in await stats(nsqd)
        code, text = await get(f"http://127.0.0.1:{nsqd.http_port}/stats")
        assert code == 200 and b"Replication" not in text
        code, body = await get(f"http://127.0.0.1:{nsqd.http_port}/metrics")
        assert code == 200 and b"nsq_replication" not in body
        code, page = await get(f"http://{admin.http_address}/nodes/127.0.0.1:{nsqd.http_port}")
        assert code == 200 and b"<h2>Replication</h2>" not in page
        code, page = await get(f"http://{admin.http_address}/api/nodes/127.0.0.1:{nsqd.http_port}")
        assert "replication" not in json.loads(page)
    finally:
        await admin.stop()
        await nsqd.stop()
