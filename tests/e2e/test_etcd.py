"""etcd where several nodes must agree, against a real etcd (Debian's etcd-server) on loopback:
two survivors that cannot see each other and only one adopts, five ``--node-id=auto`` nodes
with five ids, a node that loses its lease and stops claiming its id, states recorded."""

from __future__ import annotations

import json
from typing import Any

import pytest
import pytest_twisted
import treq
from twisted.internet import defer

from nsqtw.embed import start_nsqd
from nsqtw.options import AUTO_NODE_ID

from etcd_support import etcd  # noqa: F401  (the fixture)
from replication_support import (
    BlackholeProxy, ChildNsqd, count, data_dir, drain, free_port, publish, secret_file, sleep, until,
)

pytestmark = pytest.mark.e2e

TIMEOUT = 1.0
ADOPT_AFTER = 1.0


async def _ids(server: Any) -> dict[int, dict[str, Any]]:
    gateway = server.gateway()
    try:
        kvs = await gateway.get_prefix(b"/nsqtw/ids/")
    finally:
        await gateway.close()
    return {int(kv.key.rsplit(b"/", 1)[1]): {"lease": kv.lease, **json.loads(kv.value)} for kv in kvs}


@pytest_twisted.ensureDeferred
async def test_two_survivors_partitioned_from_each_other_and_only_one_adopts(tmp_path, etcd):  # noqa: F811
    """A mesh of three where nodes 2 and 3 reach each other through proxies; the proxies turn
    into a blackhole (each survivor sees only node 1), then node 1 is lost: by the peers' own
    rule both would adopt (neither sees the other hold the shadow); under etcd's lease one
    adopts, the other stands by (keeping its copy, adopting nothing): every acknowledged
    message delivered once."""
    ports = [free_port() for _ in range(3)]
    proxy23, proxy32 = BlackholeProxy(ports[2]), BlackholeProxy(ports[1])
    via23, via32 = await proxy23.listen(), await proxy32.listen()
    peers = {1: [ports[1], ports[2]], 2: [ports[0], via23], 3: [ports[0], via32]}
    secret = secret_file(tmp_path)
    nodes = []
    try:
        for i in (1, 2, 3):
            nodes.append(await start_nsqd(
                node_id=i, replication_address=f"127.0.0.1:{ports[i - 1]}", data_path=data_dir(tmp_path, f"n{i}"),
                replica_peers=[f"127.0.0.1:{p}" for p in peers[i]], replication_min_acks=1,
                replication_secret_file=secret, replication_timeout=TIMEOUT, adopt_after=ADOPT_AFTER,
                etcd_endpoints=[etcd.url]))
        one, two, three = nodes
        await until(lambda: all(n._service.replication.origin.in_sync() == 2 for n in nodes), 15)
        acknowledged = await publish(one.tcp_port, "t", b"one", 40)
        assert len(acknowledged) == 40
        await until(lambda: all(n._service.shadow_files.states.get(1) is not None
                                and n._service.shadow_files.states[1].count() == 40 for n in (two, three)))
        proxy23.blackhole = proxy32.blackhole = True
        # each survivor drops the silent link to the other: it sees node 1 only
        await until(lambda: all(n._service.replication.origin.in_sync() == 1 for n in (two, three)), TIMEOUT + 10)
        await one.stop()
        nodes.remove(one)

        def of_one(n: Any) -> list[Any]:
            return [a for a in n._service.adoption.adopted if a[0] == 1]

        def standing_by(n: Any) -> list[int]:
            return [s["for_node_id"] for s in n._service.adoption.status()["standing_by"] if s["origin_node_id"] == 1]

        def settled() -> bool:
            return bool((of_one(two) and standing_by(three)) or (of_one(three) and standing_by(two)))

        await until(settled, ADOPT_AFTER + TIMEOUT + 15)
        adopter, other = (two, three) if of_one(two) else (three, two)
        adopter_id = adopter._service.options.node_id
        # the other stands by for the holder of the lease, keeping its copy while the adopter's
        # own peers have not stored what it adopted (the only one it could reach is behind the
        # partition); it asks etcd again every second, and is told the same
        asked = len(other._service.adoption.arbiter.answers)
        assert standing_by(other) == [adopter_id] and not of_one(other) and asked
        assert other._service.shadow_files.states[1].count() == 40
        assert of_one(adopter)[0][:2] == (1, 40)
        delivered = await drain(adopter.tcp_port, "t", "c", set(acknowledged))
        delivered += await drain(other.tcp_port, "t", "c", set(), seconds=1.0)
        assert count(acknowledged, delivered) == (0, 0)
        # the partition heals: the adopter's peer catches up (its snapshot holds the adopted
        # messages), so the adoption is stored at last and the other drops its copy (without
        # that, a later loss of the adopter would have it adopt them again: duplicates)
        proxy23.blackhole = proxy32.blackhole = False
        await until(lambda: other._service.shadow_files.states.get(1) is None, TIMEOUT + 20)
        assert not of_one(other)
    finally:
        for n in nodes:
            await n.stop()
        await proxy23.close()
        await proxy32.close()


@pytest_twisted.ensureDeferred
async def test_five_auto_nodes_get_five_distinct_ids(tmp_path, etcd):  # noqa: F811
    """Five nodes started at once with --node-id=auto: five ids, each held in etcd under its
    node's lease, each the one its broker mints message IDs with; a clean stop frees its id."""
    nodes = await defer.gatherResults([
        defer.ensureDeferred(start_nsqd(node_id=AUTO_NODE_ID, etcd_endpoints=[etcd.url],
                                        data_path=data_dir(tmp_path, f"n{i}"), replication_timeout=TIMEOUT))
        for i in range(5)])
    try:
        ids = [n._service.options.node_id for n in nodes]
        assert len(set(ids)) == 5 and all(0 <= i < 1024 for i in ids)
        assert [n._service.broker.guid.node_part >> 12 for n in nodes] == ids
        held = await _ids(etcd)
        assert sorted(held) == sorted(ids)
        assert len({v["lease"] for v in held.values()}) == 5
    finally:
        await nodes[0].stop()
        gone = ids[0]
        assert gone not in await _ids(etcd)
        for n in nodes[1:]:
            await n.stop()


async def _ping(port: int) -> tuple[int, str]:
    response = await treq.get(f"http://127.0.0.1:{port}/ping", persistent=False)
    return response.code, (await treq.content(response)).decode()


async def _ping_until(port: int, want: Any, seconds: float = 15.0) -> tuple[int, str]:
    """/ping every 50 ms until ``want((status, text))``; the last answer."""
    for _ in range(int(seconds / 0.05)):
        answer = await _ping(port)
        if want(answer):
            return answer
        await sleep(0.05)
    return answer


@pytest_twisted.ensureDeferred
async def test_a_node_that_loses_its_lease_stops_claiming_its_id(tmp_path, etcd):  # noqa: F811
    """The drop-in nsqd with --node-id=auto: its lease revoked and its id taken by another
    node meanwhile, it says so (log and /ping 503) and never takes the id back from its
    holder; once the holder lets go, it holds its id again (/ping 200).  (/ping answers 500
    when not ok, as for every other replication problem.)"""
    node = await ChildNsqd.start(data_dir(tmp_path, "node"), "--node-id=auto", f"--etcd-endpoints={etcd.url}",
                                 f"--replication-timeout={TIMEOUT}s")
    gateway = etcd.gateway()
    try:
        held = await _ids(etcd)
        assert len(held) == 1
        (node_id, doc), = held.items()
        assert await _ping(node.http_port) == (200, "OK")
        other, _ = await gateway.grant(30)
        await gateway.revoke(doc["lease"])
        created, _ = await gateway.create(f"/nsqtw/ids/{node_id}".encode(), b'{"node_key": "another node"}', other)
        assert created
        code, text = await _ping_until(node.http_port, lambda a: a[0] != 200)
        assert code == 500 and f"node id {node_id} is no longer held in etcd" in text  # at the next renewal
        code, text = await _ping_until(node.http_port, lambda a: "held by another" in a[1])
        assert code == 500 and f"node id {node_id} is held by another node" in text
        assert any("no longer held in etcd" in line for line in node.lines)
        kv = await gateway.get(f"/nsqtw/ids/{node_id}".encode())
        assert kv is not None and kv.lease == other and b"another node" in kv.value  # not taken back
        await gateway.revoke(other)
        assert await _ping_until(node.http_port, lambda a: a[0] == 200) == (200, "OK")
        kv = await gateway.get(f"/nsqtw/ids/{node_id}".encode())
        assert kv is not None and kv.lease != other
    finally:
        await gateway.close()
        await node.kill()


@pytest_twisted.ensureDeferred
async def test_record_state_is_readable_by_every_node(tmp_path, etcd):  # noqa: F811
    """The API the drain and maintenance states are recorded with: a document under
    <prefix>/nodes/<id>/state, read back by another node."""
    a = await start_nsqd(node_id=4, etcd_endpoints=[etcd.url], data_path=data_dir(tmp_path, "a"))
    b = await start_nsqd(node_id=AUTO_NODE_ID, etcd_endpoints=[etcd.url], data_path=data_dir(tmp_path, "b"))
    try:
        await a._service.etcd.record_state("maintenance", {"until": 1234.5})
        await a._service.etcd.record_state("drain", {"state": "draining"})
        assert await b._service.etcd.read_state(4) == {"maintenance": {"until": 1234.5}, "drain": {"state": "draining"}}
        gateway = etcd.gateway()
        try:
            kv = await gateway.get(b"/nsqtw/nodes/4/state")
        finally:
            await gateway.close()
        assert kv is not None and json.loads(kv.value)["node_id"] == 4
    finally:
        await a.stop()
        await b.stop()


@pytest_twisted.ensureDeferred
async def test_the_all_in_one_runs_with_etcd_and_an_auto_node_id(tmp_path, etcd):  # noqa: F811
    """``twistd nsqtw --etcd-endpoints=... --node-id=auto``: nsqd is built once its id is claimed,
    and is pointed at the all-in-one's own nsqlookupd only then."""
    from twisted.internet import reactor

    from nsqtw.allinone.service import build_allinone
    from nsqtw.options import NsqdOptions

    options = NsqdOptions(node_id=AUTO_NODE_ID, etcd_endpoints=[etcd.url], tcp_address="127.0.0.1:0",
                          http_address="127.0.0.1:0", https_address="", data_path=str(tmp_path),
                          broadcast_address="127.0.0.1")
    svc = build_allinone(options, reactor, lookupd_tcp_address="127.0.0.1:0", lookupd_http_address="127.0.0.1:0",
                         admin_http_address="")
    svc.startService()
    try:
        await svc.ready()
        await until(lambda: any(a.endswith(f":{svc.lookupd.tcp_port}")
                                for a in svc.nsqd.options.lookupd_tcp_addresses), 10)
        assert list((await _ids(etcd)).keys()) == [svc.nsqd.options.node_id]
    finally:
        await svc.stopService()


@pytest_twisted.ensureDeferred
async def test_a_drain_is_recorded_in_etcd_and_removed_when_it_is_cancelled(tmp_path, etcd):  # noqa: F811
    """POST /drain on a node with --etcd-endpoints: its drain is in <prefix>/nodes/<id>/state for
    the other nodes to read; DELETE /drain (serving again) removes it."""
    a = await start_nsqd(node_id=6, etcd_endpoints=[etcd.url], data_path=data_dir(tmp_path, "a"))
    b = await start_nsqd(node_id=7, etcd_endpoints=[etcd.url], data_path=data_dir(tmp_path, "b"))
    try:
        resp = await treq.post(f"http://127.0.0.1:{a.http_port}/drain")
        await resp.content()
        assert resp.code == 200
        states: dict[str, Any] = {}

        async def read() -> bool:
            states.clear()
            states.update(await b._service.etcd.read_state(6))
            return "drain" in states

        for _ in range(250):
            if await read():
                break
            await sleep(0.02)
        assert states["drain"]["state"] in ("draining", "drained")
        resp = await treq.delete(f"http://127.0.0.1:{a.http_port}/drain")
        await resp.content()
        for _ in range(250):
            if not await read():
                break
            await sleep(0.02)
        assert "drain" not in states
    finally:
        await a.stop()
        await b.stop()
