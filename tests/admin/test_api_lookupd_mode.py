"""nsqadmin's JSON API in --lookupd-http-address mode: an embedded nsqlookupd and two nsqd registered
with it over loopback, and nsqadmin fanning actions out to both kinds (nsqadmin's ``clusterinfo``)."""

from __future__ import annotations

import pytest
import pytest_twisted

from admin_helpers import call, create_channel, find_channel, find_topic, nsqd_stats, publish, registered

pytestmark = pytest.mark.e2e


async def lookupd_get(lookupd, path: str):
    code, doc, _ = await call("GET", f"http://{lookupd.http_address}{path}")
    return code, doc


@pytest_twisted.ensureDeferred
async def test_topics_come_from_lookupd(cluster) -> None:
    """/api/topics is nsqlookupd's /topics: every registered topic, sorted."""
    admin, lookupd, nodes, peers = cluster
    await publish(nodes[0], "zeta", [b"1"])
    await publish(nodes[1], "alpha", [b"1"])
    for p in peers:
        await registered(p)
    code, doc, _ = await call("GET", admin.url + "api/topics")
    assert (code, doc) == (200, {"topics": ["alpha", "zeta"], "message": ""})


@pytest_twisted.ensureDeferred
async def test_nodes_carry_lookupd_connections_and_topics(cluster) -> None:
    """/api/nodes merges lookupd's /nodes: remote_addresses name the lookupd, topics carry tombstones."""
    admin, lookupd, nodes, peers = cluster
    await publish(nodes[0], "t", [b"1"])
    await registered(peers[0])
    code, doc, _ = await call("GET", admin.url + "api/nodes")
    assert code == 200 and doc["message"] == ""
    by_port = {n["http_port"]: n for n in doc["nodes"]}
    assert set(by_port) == {nodes[0].http_port, nodes[1].http_port}
    first = by_port[nodes[0].http_port]
    assert first["topics"] == [{"topic": "t", "tombstoned": False}]
    (conn,) = first["remote_addresses"]
    assert conn.startswith(f"{lookupd.http_address}/127.0.0.1:")
    assert first["remote_address"] and first["out_of_date"] is False and first["version"] == "1.3.0"


@pytest_twisted.ensureDeferred
async def test_topic_stats_use_lookupd_producers(cluster) -> None:
    """/api/topics/:topic asks lookupd's /lookup for producers, then each producer's /stats."""
    admin, lookupd, nodes, peers = cluster
    await publish(nodes[0], "orders", [b"1", b"2"])
    await publish(nodes[1], "orders", [b"3"])
    for p in peers:
        await registered(p)
    code, doc, _ = await call("GET", admin.url + "api/topics/orders")
    assert code == 200, doc
    assert doc["depth"] == 3 and {n["node"] for n in doc["nodes"]} == {nodes[0].http_address, nodes[1].http_address}


@pytest_twisted.ensureDeferred
async def test_unknown_topic_is_a_404(cluster) -> None:
    """lookupd answers 404 TOPIC_NOT_FOUND for a topic it never saw; nsqadmin says 404 TOPIC_NOT_FOUND
    (Go's nsqadmin says 502 with lookupd's raw answer inside, issue 17 item 6), and the page is an HTML 404."""
    admin, _, _, _ = cluster
    code, doc, _ = await call("GET", admin.url + "api/topics/never")
    assert (code, doc) == (404, {"message": "TOPIC_NOT_FOUND"})
    code, html, _ = await call("GET", admin.url + "topics/never")
    assert code == 404 and "<html" in html and "TOPIC_NOT_FOUND" in html and "UPSTREAM" not in html


@pytest_twisted.ensureDeferred
async def test_create_topic_and_channel_everywhere(cluster) -> None:
    """POST /api/topics registers topic and channel on lookupd and creates the channel on the producers."""
    admin, lookupd, nodes, peers = cluster
    await publish(nodes[0], "made", [b"1"])
    await registered(peers[0])
    code, doc, _ = await call("POST", admin.url + "api/topics", {"topic": "made", "channel": "here"})
    assert (code, doc) == (200, {"message": ""})
    assert (await lookupd_get(lookupd, "/channels?topic=made"))[1]["channels"] == ["here"]
    assert find_channel(await nsqd_stats(nodes[0]), "made", "here") is not None
    assert find_topic(await nsqd_stats(nodes[1]), "made") is None  # not a producer of it

    code, doc, _ = await call("POST", admin.url + "api/topics", {"topic": "planned"})
    assert code == 200
    assert "planned" in (await lookupd_get(lookupd, "/topics"))[1]["topics"]


@pytest_twisted.ensureDeferred
async def test_delete_topic_on_lookupd_and_every_producer(cluster) -> None:
    """DELETE /api/topics/:topic removes it from lookupd and from every nsqd that had it."""
    admin, lookupd, nodes, peers = cluster
    for n, p in zip(nodes, peers, strict=True):
        await publish(n, "gone", [b"1"])
        await registered(p)
    code, doc, _ = await call("DELETE", admin.url + "api/topics/gone")
    assert (code, doc) == (200, {"message": ""})
    for n in nodes:
        assert find_topic(await nsqd_stats(n), "gone") is None
    for p in peers:
        await registered(p)
    assert "gone" not in (await lookupd_get(lookupd, "/topics"))[1]["topics"]


@pytest_twisted.ensureDeferred
async def test_delete_channel_on_lookupd_and_every_producer(cluster) -> None:
    """DELETE /api/topics/:topic/:channel removes the channel from lookupd and each producer."""
    admin, lookupd, nodes, peers = cluster
    for n, p in zip(nodes, peers, strict=True):
        await create_channel(n, "t", "c")
        await registered(p)
    code, doc, _ = await call("DELETE", admin.url + "api/topics/t/c")
    assert code == 200, doc
    for n in nodes:
        assert find_channel(await nsqd_stats(n), "t", "c") is None
        assert find_topic(await nsqd_stats(n), "t") is not None
    for p in peers:
        await registered(p)
    assert (await lookupd_get(lookupd, "/channels?topic=t"))[1]["channels"] == []


@pytest_twisted.ensureDeferred
async def test_pause_reaches_producers_found_through_lookupd(cluster) -> None:
    """POST /api/topics/:t/:c {"action":"pause"} pauses the channel on every producer lookupd lists."""
    admin, lookupd, nodes, peers = cluster
    for n, p in zip(nodes, peers, strict=True):
        await create_channel(n, "t", "c")
        await registered(p)
    code, doc, _ = await call("POST", admin.url + "api/topics/t/c", {"action": "pause"})
    assert (code, doc) == (200, {"message": ""})
    for n in nodes:
        assert find_channel(await nsqd_stats(n), "t", "c")["paused"] is True


@pytest_twisted.ensureDeferred
async def test_tombstone_topic_producer(cluster) -> None:
    """DELETE /api/nodes/:node {"topic"} tombstones the node on lookupd and deletes the topic on that node."""
    admin, lookupd, nodes, peers = cluster
    for n, p in zip(nodes, peers, strict=True):
        await publish(n, "tomb", [b"1"])
        await registered(p)
    node = nodes[0].http_address
    code, doc, _ = await call("DELETE", admin.url + f"api/nodes/{node}", {"topic": "tomb"})
    assert (code, doc) == (200, {"message": ""})
    assert find_topic(await nsqd_stats(nodes[0]), "tomb") is None
    assert find_topic(await nsqd_stats(nodes[1]), "tomb") is not None
    code, doc = await lookupd_get(lookupd, "/lookup?topic=tomb")
    assert [p["http_port"] for p in doc["producers"]] == [nodes[1].http_port]
    assert (await call("DELETE", admin.url + f"api/nodes/{node}", {"topic": "no such!"}))[:2] == (
        400, {"message": "INVALID_TOPIC"})


@pytest_twisted.ensureDeferred
async def test_inactive_topics_are_those_without_producers(cluster) -> None:
    """/api/topics?inactive=true maps each topic lookupd knows but no nsqd produces to its channels."""
    admin, lookupd, nodes, peers = cluster
    await publish(nodes[0], "live", [b"1"])
    await registered(peers[0])
    await call("POST", f"http://{lookupd.http_address}/channel/create?topic=legacy&channel=old")
    code, doc, _ = await call("GET", admin.url + "api/topics?inactive=true")
    assert (code, doc) == (200, {"topics": {"legacy": ["old"]}, "message": ""})


@pytest_twisted.ensureDeferred
async def test_a_dead_lookupd_is_a_warning(start_admin, cluster) -> None:
    """With a second, unreachable lookupd the answers still come, with a WARNING naming it."""
    _, lookupd, nodes, peers = cluster
    await publish(nodes[0], "t", [b"1"])
    await registered(peers[0])
    admin = await start_admin(lookupd_http_addresses=[lookupd.http_address, "127.0.0.1:1"])
    code, doc, _ = await call("GET", admin.url + "api/topics")
    assert code == 200 and doc["topics"] == ["t"]
    assert doc["message"].startswith("WARNING: ") and "127.0.0.1:1" in doc["message"]
    code, doc, _ = await call("GET", admin.url + "api/nodes")
    assert code == 200 and len(doc["nodes"]) == 2 and doc["message"].startswith("WARNING: ")
    code, doc, _ = await call("POST", admin.url + "api/topics", {"topic": "n"})
    assert code == 200 and doc["message"].startswith("WARNING: ")


@pytest_twisted.ensureDeferred
async def test_lookupd_list_can_be_changed_at_runtime(start_admin, cluster) -> None:
    """PUT /config/nsqlookupd_http_addresses swaps the lookupd list the next call uses."""
    _, lookupd, nodes, peers = cluster
    await publish(nodes[0], "t", [b"1"])
    await registered(peers[0])
    admin = await start_admin(lookupd_http_addresses=["127.0.0.1:1"])
    assert (await call("GET", admin.url + "api/topics"))[0] == 502
    code, doc, _ = await call("PUT", admin.url + "config/nsqlookupd_http_addresses", [lookupd.http_address])
    assert (code, doc) == (200, [lookupd.http_address])
    code, doc, _ = await call("GET", admin.url + "api/topics")
    assert (code, doc["topics"]) == (200, ["t"])
    code, doc, _ = await call("PUT", admin.url + "config/nsqlookupd_http_addresses", raw=b"[]")
    assert (code, doc) == (400, {"message": "INVALID_VALUE"})


@pytest_twisted.ensureDeferred
async def test_channels_lookupd_knows_are_listed_not_no_channels(cluster) -> None:
    """/topics/refunds said "No channels exist" while nsqlookupd listed two (issue 17 item 6): channels
    registered with nsqlookupd that no answering nsqd has are listed as such."""
    admin, lookupd, nodes, peers = cluster
    await publish(nodes[0], "refunds", [b"r"])
    await registered(peers[0])
    for c in ("audit", "ledger"):
        code, _, _ = await call("POST", f"http://{lookupd.http_address}/channel/create?topic=refunds&channel={c}")
        assert code == 200
    code, doc, _ = await call("GET", admin.url + "api/topics/refunds")
    assert code == 200 and doc["channels_elsewhere"] == ["audit", "ledger"] and doc["channels"] is None
    code, html, _ = await call("GET", admin.url + "topics/refunds")
    assert code == 200 and "No channels exist" not in html
    assert 'data-row="elsewhere:audit"' in html and "registered with nsqlookupd; no answering nsqd has it" in html
    code, html, _ = await call("GET", admin.url + "topics/refunds/audit")
    assert code == 200 and "No nsqd has this channel now." in html


@pytest.mark.admin_options(history_interval=3600.0)
@pytest_twisted.ensureDeferred
async def test_the_node_list_answers_from_lookupd_and_recent_polls(cluster) -> None:
    """/api/nodes asks nsqlookupd for the nodes and shows what nsqadmin's recent /stats polls
    learnt of each: a node heard from within two history intervals is not asked again; a node
    not heard from lately is (issue 47)."""
    admin, lookupd, nodes, peers = cluster
    for p in peers:
        await registered(p)
    service = admin._service
    await service.poller.poll_once()
    book = service.cluster.book
    seen = {n.http_address: book.get(n.http_address).last_seen for n in nodes}
    assert all(v is not None for v in seen.values())
    code, doc, _ = await call("GET", admin.url + "api/nodes")
    assert code == 200 and len(doc["nodes"]) == 2 and "partial" not in doc
    assert {n.http_address: book.get(n.http_address).last_seen for n in nodes} == seen  # nobody asked
    old = nodes[1].http_address
    book.get(old).last_seen -= 3 * 3600.0  # not heard from for three intervals
    code, doc, _ = await call("GET", admin.url + "api/nodes")
    assert code == 200 and len(doc["nodes"]) == 2
    assert book.get(old).last_seen > seen[old]  # asked now
    assert book.get(nodes[0].http_address).last_seen == seen[nodes[0].http_address]
