"""nsqtw_cluster with per-node options: a replicated pair and a mesh of three, ready only once
every replication link is in sync, a secret made for the test, and a node killed."""

from __future__ import annotations

import os

import pytest
import pytest_twisted

from nsqtw.testing.pytest_plugin import _node_options, replication_security_options


@pytest.mark.nsqtw_cluster(nodes=[{"mem_queue_size": 5}, {"mem_queue_size": 7, "msg_timeout": 5.0}])
@pytest_twisted.ensureDeferred
async def test_each_node_gets_its_own_options(nsqtw_cluster):
    a, b = nsqtw_cluster.nsqds
    assert (a.options.mem_queue_size, b.options.mem_queue_size, b.options.msg_timeout) == (5, 7, 5.0)
    assert (a.options.node_id, b.options.node_id) == (1, 2)
    assert nsqtw_cluster.replication_addresses == [None, None]
    assert len(nsqtw_cluster.lookupd.producers()) == 2


@pytest.mark.nsqtw_cluster(nodes=[{"replicate_to": [1]}, {"adopt_after": 0.3}])
@pytest_twisted.ensureDeferred
async def test_a_replicated_pair_is_in_sync_at_once_and_the_replica_adopts_a_killed_origin(nsqtw_cluster):
    origin, replica = nsqtw_cluster.nsqds
    assert replica.replication_address is not None
    assert origin.options.replica_peers == [replica.replication_address]
    assert nsqtw_cluster.links_in_sync()
    [peer] = origin._service.replication_stats()["peers"]
    assert peer["state"] == "in_sync"
    await origin.publish("orders", b"first")  # accepted: the link is in sync from the start
    await origin.multi_publish("orders", [b"second", b"third"])
    await nsqtw_cluster.kill(0)
    got = await replica.wait_for_messages("orders", "ch", 3, timeout=10)
    assert sorted(m.body for m in got) == [b"first", b"second", b"third"]


@pytest.mark.nsqtw_cluster(nodes=[{"replicate_to": [1, 2]}, {"replicate_to": [0, 2]}, {"replicate_to": [0, 1]}])
@pytest_twisted.ensureDeferred
async def test_a_mesh_of_three(nsqtw_cluster):
    addresses = nsqtw_cluster.replication_addresses
    assert None not in addresses and len(set(addresses)) == 3
    for i, node in enumerate(nsqtw_cluster.nsqds):
        assert sorted(node.options.replica_peers) == sorted(a for j, a in enumerate(addresses) if j != i)
        assert [p["state"] for p in node._service.replication_stats()["peers"]] == ["in_sync", "in_sync"]
    for node in nsqtw_cluster.nsqds:
        await node.publish("t", b"from " + node.options.broadcast_address.encode())


@pytest_twisted.ensureDeferred
async def test_the_cluster_makes_a_secret_file_and_deletes_it(nsqtw_cluster):
    path = nsqtw_cluster.secret_file
    assert path is not None and len(open(path).read().strip()) == 64
    assert os.stat(path).st_mode & 0o077 == 0  # readable by its owner only
    await nsqtw_cluster.stop()
    assert not os.path.exists(path)


def test_node_options_name_the_replicas_and_refuse_a_bad_index():
    specs = _node_options(0, [{"replicate_to": [1]}, {}], {"msg_timeout": 9.0}, "/secret")
    assert specs[0]["replica_peers"] == [specs[1]["replication_address"]]
    assert specs[1]["replication_address"].startswith("127.0.0.1:")
    assert specs[0]["msg_timeout"] == specs[1]["msg_timeout"] == 9.0
    assert "replicate_to" not in specs[0]
    # the seam where the nodes' shared secret goes: every replicated node gets its options
    for key, value in replication_security_options("/secret").items():
        assert specs[0][key] == specs[1][key] == value
    with pytest.raises(ValueError, match="node 0: replicate_to names node 0"):
        _node_options(0, [{"replicate_to": [0]}], {}, "/secret")


@pytest.mark.nsqtw_cluster(nodes=[{"replicate_to": [1]}, {}])
@pytest_twisted.ensureDeferred
async def test_a_cut_link_refuses_publishes_until_the_clock_lets_it_reconnect(nsqtw_clock, nsqtw_cluster):
    from nsqtw.errors import PubFailed
    from nsqtw.client import Producer

    origin, _ = nsqtw_cluster.nsqds
    assert nsqtw_cluster.cut_link(0, 1)
    await origin.wait_until(lambda: not nsqtw_cluster.links_in_sync())
    producer = Producer(origin.tcp_address)
    try:
        with pytest.raises(PubFailed):  # --replication-degraded=refuse: no replica in sync
            await producer.publish("t", b"refused")
        nsqtw_clock.advance(1)  # the origin's reconnect timer
        await nsqtw_cluster.wait_in_sync()
        await producer.publish("t", b"accepted")
    finally:
        await producer.stop()
    # the refused publish was stored before its durability failed: it is recorded, and queued
    assert [p.body for p in origin.published("t")] == [b"refused", b"accepted"]
    assert origin.depth("t") == 2
