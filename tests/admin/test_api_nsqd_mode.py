"""nsqadmin's JSON API in --nsqd-http-address mode against two live embedded nsqd over loopback."""

from __future__ import annotations

import gzip

import pytest
import pytest_twisted

from admin_helpers import call, create_channel, find_channel, find_topic, nsqd_stats, publish, within
from nsqtw.testing import command, connect_raw, identify_command

pytestmark = pytest.mark.e2e


async def subscribe(nsqd, topic: str, channel: str, rdy: int = 1, **identify):
    """A raw V2 consumer SUBscribed to topic/channel (with IDENTIFY fields when given)."""
    client = await connect_raw(nsqd.tcp_port)
    if identify:
        client.send(identify_command(**identify))
        await client.response()
    client.send(command("SUB", topic, channel) + command("RDY", rdy))
    assert await client.response() == b"OK"
    return client


@pytest_twisted.ensureDeferred
async def test_topics_are_the_union_of_every_nsqd(admin, nsqds) -> None:
    """GET /api/topics lists each topic once, sorted, whichever nsqd has it."""
    await publish(nsqds[0], "beta", [b"1"])
    await publish(nsqds[1], "alpha", [b"1"])
    await publish(nsqds[1], "beta", [b"1"])
    code, doc, headers = await call("GET", admin.url + "api/topics")
    assert code == 200
    assert doc == {"topics": ["alpha", "beta"], "message": ""}
    assert headers.getRawHeaders(b"x-nsq-content-type") == [b"nsq; version=1.0"]


@pytest_twisted.ensureDeferred
async def test_topic_stats_are_summed_per_node(admin, nsqds) -> None:
    """GET /api/topics/:topic has one row per nsqd and totals that add them up, channels merged by name."""
    await publish(nsqds[0], "orders", [b"a", b"b", b"c"])
    await publish(nsqds[1], "orders", [b"d", b"e"])
    await create_channel(nsqds[0], "orders", "archive")
    await create_channel(nsqds[1], "orders", "archive")
    await create_channel(nsqds[1], "orders", "billing")
    await publish(nsqds[1], "orders", [b"f"])
    code, doc, _ = await call("GET", admin.url + "api/topics/orders")
    assert code == 200, doc
    assert doc["node"] == "*" and doc["topic_name"] == "orders" and doc["message"] == ""
    assert doc["message_count"] == 6
    assert doc["depth"] == 0  # what queued at the topic moved into the first channel created
    nodes = {n["node"]: n for n in doc["nodes"]}
    assert set(nodes) == {nsqds[0].http_address, nsqds[1].http_address}
    assert nodes[nsqds[0].http_address]["message_count"] == 3
    assert nodes[nsqds[1].http_address]["message_count"] == 3
    channels = {c["channel_name"]: c for c in doc["channels"]}
    assert set(channels) == {"archive", "billing"}
    assert channels["archive"]["node"] == "*" and len(channels["archive"]["nodes"]) == 2
    assert channels["billing"]["depth"] == 1 and len(channels["billing"]["nodes"]) == 1
    assert channels["archive"]["depth"] == 3 + 3
    assert doc["memory_depth"] == doc["depth"] - doc["backend_depth"]
    assert set(doc) >= {"hostname", "paused", "e2e_processing_latency", "backend_depth"}


@pytest_twisted.ensureDeferred
async def test_channel_stats_include_clients_from_every_node(admin, nsqds) -> None:
    """GET /api/topics/:t/:c lists each connected consumer with its node, user agent, state and RDY."""
    a = await subscribe(nsqds[0], "jobs", "work", rdy=3, client_id="w1", hostname="w1.example",
                        user_agent="worker/1.0", feature_negotiation=True)
    b = await subscribe(nsqds[1], "jobs", "work", rdy=5, client_id="w2", hostname="w2.example",
                        user_agent="worker/2.0", feature_negotiation=True)
    try:
        await publish(nsqds[0], "jobs", [b"x"])
        await within(a.message())
        code, doc, _ = await call("GET", admin.url + "api/topics/jobs/work")
        assert code == 200, doc
        assert doc["client_count"] == 2 and doc["in_flight_count"] == 1 and doc["message_count"] == 1
        clients = {c["client_id"]: c for c in doc["clients"]}
        assert clients["w1"]["node"] == nsqds[0].http_address
        assert clients["w2"]["node"] == nsqds[1].http_address
        assert clients["w1"]["user_agent"] == "worker/1.0" and clients["w2"]["ready_count"] == 5
        assert clients["w1"]["in_flight_count"] == 1 and clients["w1"]["state"] == 3
        assert clients["w1"]["connected"] >= 0 and clients["w1"]["tls"] is False
        assert [c["hostname"] for c in doc["clients"]] == ["w1.example", "w2.example"]
    finally:
        await a.close()
        await b.close()


@pytest_twisted.ensureDeferred
async def test_unknown_channel_is_just_a_message(admin, nsqds) -> None:
    """A channel no nsqd has answers 200 with only ``message``, as nsqadmin's nil ChannelStats does."""
    code, doc, _ = await call("GET", admin.url + "api/topics/nothing/here")
    assert (code, doc) == (200, {"message": ""})


@pytest_twisted.ensureDeferred
async def test_nodes_and_node(admin, nsqds) -> None:
    """/api/nodes describes each nsqd from /info; /api/nodes/:node has its topics, clients and totals."""
    await publish(nsqds[0], "t1", [b"a", b"b"])
    consumer = await subscribe(nsqds[0], "t1", "c1")
    try:
        code, doc, _ = await call("GET", admin.url + "api/nodes")
        assert code == 200 and doc["message"] == ""
        by_port = {n["http_port"]: n for n in doc["nodes"]}
        node = by_port[nsqds[0].http_port]
        assert node["tcp_port"] == nsqds[0].tcp_port and node["version"] == "1.3.0"
        assert node["broadcast_address"] == "127.0.0.1" and node["topics"] == [{"topic": "t1", "tombstoned": False}]
        assert node["remote_addresses"] is None and node["out_of_date"] is False
        assert by_port[nsqds[1].http_port]["topics"] is None

        code, doc, _ = await call("GET", admin.url + f"api/nodes/{nsqds[0].http_address}")
        assert code == 200, doc
        assert doc["node"] == nsqds[0].http_address and doc["total_messages"] == 2 and doc["total_clients"] == 1
        (topic,) = doc["topics"]
        assert topic["topic_name"] == "t1" and topic["channels"][0]["clients"][0]["node"] == nsqds[0].http_address

        code, doc, _ = await call("GET", admin.url + "api/nodes/10.9.9.9:1")
        assert (code, doc) == (404, {"message": "NODE_NOT_FOUND"})
    finally:
        await consumer.close()


@pytest_twisted.ensureDeferred
async def test_counter_counts_messages_per_channel_and_node(admin, nsqds) -> None:
    """/api/counter keys message counts by topic:channel:node, as nsqadmin's counter page sums them."""
    await create_channel(nsqds[0], "c", "x")
    await create_channel(nsqds[1], "c", "x")
    await publish(nsqds[0], "c", [b"1", b"2"])
    await publish(nsqds[1], "c", [b"3"])
    code, doc, _ = await call("GET", admin.url + "api/counter")
    assert code == 200
    assert doc["stats"] == {
        f"c:x:{nsqds[0].http_address}": {"node": nsqds[0].http_address, "topic_name": "c", "channel_name": "x",
                                         "message_count": 2},
        f"c:x:{nsqds[1].http_address}": {"node": nsqds[1].http_address, "topic_name": "c", "channel_name": "x",
                                         "message_count": 1},
    }


@pytest_twisted.ensureDeferred
async def test_topic_actions_reach_every_nsqd(admin, nsqds) -> None:
    """POST /api/topics/:topic pause, unpause and empty run on every nsqd that has the topic."""
    for n in nsqds:
        await publish(n, "t", [b"1", b"2"])
    code, doc, _ = await call("POST", admin.url + "api/topics/t", {"action": "pause"})
    assert (code, doc) == (200, {"message": ""})
    for n in nsqds:
        assert find_topic(await nsqd_stats(n), "t")["paused"] is True
    assert (await call("GET", admin.url + "api/topics/t"))[1]["paused"] is True
    await call("POST", admin.url + "api/topics/t", {"action": "unpause"})
    for n in nsqds:
        assert find_topic(await nsqd_stats(n), "t")["paused"] is False
    await call("POST", admin.url + "api/topics/t", {"action": "empty"})
    for n in nsqds:
        assert find_topic(await nsqd_stats(n), "t")["depth"] == 0


@pytest_twisted.ensureDeferred
async def test_channel_actions_and_deletes(admin, nsqds) -> None:
    """Channel pause/empty, then DELETE of the channel and of the topic, on both nsqd."""
    for n in nsqds:
        await create_channel(n, "t", "c")
        await publish(n, "t", [b"1"])
    code, _, _ = await call("POST", admin.url + "api/topics/t/c", {"action": "pause"})
    assert code == 200
    for n in nsqds:
        assert find_channel(await nsqd_stats(n), "t", "c")["paused"] is True
    await call("POST", admin.url + "api/topics/t/c", {"action": "empty"})
    for n in nsqds:
        assert find_channel(await nsqd_stats(n), "t", "c")["depth"] == 0
    code, doc, _ = await call("DELETE", admin.url + "api/topics/t/c")
    assert (code, doc) == (200, {"message": ""})
    for n in nsqds:
        assert find_channel(await nsqd_stats(n), "t", "c") is None
    code, doc, _ = await call("DELETE", admin.url + "api/topics/t")
    assert (code, doc) == (200, {"message": ""})
    for n in nsqds:
        assert find_topic(await nsqd_stats(n), "t") is None


@pytest_twisted.ensureDeferred
async def test_invalid_action_and_body(admin, nsqds) -> None:
    """An unknown action is 400 INVALID_ACTION; a body that is not JSON is 400 INVALID_BODY."""
    await publish(nsqds[0], "t", [b"1"])
    assert (await call("POST", admin.url + "api/topics/t", {"action": "explode"}))[:2] == (
        400, {"message": "INVALID_ACTION"})
    assert (await call("POST", admin.url + "api/topics/t", raw=b"{nope"))[:2] == (400, {"message": "INVALID_BODY"})
    assert (await call("POST", admin.url + "api/topics", {"topic": "bad topic!"}))[:2] == (
        400, {"message": "INVALID_TOPIC"})
    assert (await call("POST", admin.url + "api/topics", {"topic": "ok", "channel": "b@d"}))[:2] == (
        400, {"message": "INVALID_CHANNEL"})


@pytest_twisted.ensureDeferred
async def test_create_without_lookupd_creates_on_every_nsqd(admin, nsqds) -> None:
    """POST /api/topics in --nsqd-http-address mode creates the topic and channel on each nsqd (an nsqtw
    addition: nsqadmin would only talk to lookupd, of which there is none)."""
    code, doc, _ = await call("POST", admin.url + "api/topics", {"topic": "fresh", "channel": "ch"})
    assert (code, doc) == (200, {"message": ""})
    for n in nsqds:
        assert find_channel(await nsqd_stats(n), "fresh", "ch") is not None


@pytest_twisted.ensureDeferred
async def test_partial_failure_is_a_warning(start_admin, nsqds) -> None:
    """With one nsqd down the answer still comes, with ``message`` starting ``WARNING:``."""
    await publish(nsqds[0], "t", [b"1"])
    admin = await start_admin(nsqd_http_addresses=[nsqds[0].http_address, "127.0.0.1:1"])
    code, doc, _ = await call("GET", admin.url + "api/topics")
    assert code == 200 and doc["topics"] == ["t"]
    assert doc["message"].startswith("WARNING: ") and "127.0.0.1:1" in doc["message"]
    code, doc, _ = await call("GET", admin.url + "api/topics/t")
    assert code == 200 and doc["message"].startswith("WARNING: ") and doc["depth"] == 1


@pytest_twisted.ensureDeferred
async def test_total_failure_is_502_upstream_error(start_admin) -> None:
    """When no nsqd answers the API says 502 ``UPSTREAM_ERROR: failed to query any nsqd: ...``."""
    admin = await start_admin(nsqd_http_addresses=["127.0.0.1:1"])
    for path in ("api/topics", "api/topics/t", "api/topics/t/c", "api/nodes", "api/counter"):
        code, doc, _ = await call("GET", admin.url + path)
        assert code == 502, path
        assert doc["message"].startswith("UPSTREAM_ERROR: failed to query any nsqd: "), doc
    code, doc, _ = await call("POST", admin.url + "api/topics/t", {"action": "pause"})
    assert code == 502 and doc["message"].startswith("UPSTREAM_ERROR: ")


@pytest_twisted.ensureDeferred
async def test_ephemeral_names_survive_the_url(admin, nsqds) -> None:
    """A ``#ephemeral`` topic and channel, percent-encoded in the path, are found and paused."""
    consumer = await subscribe(nsqds[0], "tmp#ephemeral", "c#ephemeral")
    try:
        code, doc, _ = await call("GET", admin.url + "api/topics/tmp%23ephemeral/c%23ephemeral")
        assert code == 200 and doc["channel_name"] == "c#ephemeral" and doc["client_count"] == 1
        code, _, _ = await call("POST", admin.url + "api/topics/tmp%23ephemeral/c%23ephemeral", {"action": "pause"})
        assert code == 200
        assert find_channel(await nsqd_stats(nsqds[0]), "tmp#ephemeral", "c#ephemeral")["paused"] is True
    finally:
        await consumer.close()


@pytest_twisted.ensureDeferred
async def test_history_samples_and_rates(admin, nsqds) -> None:
    """Each poll adds a sample; /api/history reports depth, message counts and a per-second rate."""
    await publish(nsqds[0], "h", [b"1"])
    await within(admin.poll())
    await publish(nsqds[0], "h", [b"2", b"3", b"4"])
    await publish(nsqds[1], "h", [b"5"])
    await within(admin.poll())
    code, doc, _ = await call("GET", admin.url + "api/history")
    assert code == 200
    series = doc["topics"]["h"]
    assert series["message_count"][-1] == 5 and series["depth"][-1] == 5
    assert series["rate"][-1] is not None and series["rate"][-1] > 0
    code, doc, _ = await call("GET", admin.url + "api/history/h")
    assert set(doc["nodes"]) >= {nsqds[0].http_address}
    assert doc["topic"]["message_count"][-1] == 5


@pytest_twisted.ensureDeferred
async def test_ping_static_gzip_and_unknown_routes(admin) -> None:
    """/ping is plain OK; static files are served; gzip is used when accepted; unknown paths are NOT_FOUND."""
    assert (await call("GET", admin.url + "ping"))[:2] == (200, "OK")
    code, text, headers = await call("GET", admin.url + "static/admin.js")
    assert code == 200 and "data-spark" in text
    assert headers.getRawHeaders(b"content-type")[0].startswith(b"text/javascript") or \
        headers.getRawHeaders(b"content-type")[0].startswith(b"application/javascript")
    assert (await call("GET", admin.url + "static/..%2Fapp.py"))[:2] == (404, {"message": "NOT_FOUND"})
    assert (await call("GET", admin.url + "static/missing.css"))[:2] == (404, {"message": "NOT_FOUND"})
    assert (await call("GET", admin.url + "api/nope"))[:2] == (404, {"message": "NOT_FOUND"})
    code, doc, _ = await call("PATCH", admin.url + "api/topics")
    assert (code, doc) == (405, {"message": "METHOD_NOT_ALLOWED"})
    from twisted.internet import reactor
    import treq
    from twisted.web.client import Agent
    from twisted.web.http_headers import Headers

    # a bare Agent: treq would ask for gzip itself and decode it out of sight
    response = await within(Agent(reactor).request(b"GET", (admin.url + "api/topics").encode(),
                                                   Headers({b"Accept-Encoding": [b"gzip"]})))
    body = await within(treq.content(response))
    assert response.headers.getRawHeaders(b"content-encoding") == [b"gzip"]
    assert b'"topics"' in gzip.decompress(body)


@pytest_twisted.ensureDeferred
async def test_channel_oldest_message_is_asked_for_and_shown(admin, nsqds) -> None:
    """nsqadmin asks nsqd for ``include_oldest_message_ts`` (off by default, to keep Go's /stats), so a
    channel holding messages still has its oldest message's time in nsqadmin's API."""
    await create_channel(nsqds[0], "aging", "slow")
    await publish(nsqds[0], "aging", [b"a", b"b"])
    plain = await nsqd_stats(nsqds[0])
    [chan] = [c for t in plain["topics"] if t["topic_name"] == "aging" for c in t["channels"]]
    assert chan["depth"] == 2 and "oldest_message_ts" not in chan  # Go's document by default
    code, doc, _ = await call("GET", admin.url + "api/topics/aging/slow")
    assert code == 200, doc
    assert doc["depth"] == 2
    assert isinstance(doc["oldest_message_ts"], int) and doc["oldest_message_ts"] > 0
