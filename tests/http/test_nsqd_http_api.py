"""nsqd's HTTP API endpoint by endpoint (nsqd/http.go, internal/http_api): statuses, error texts, the V1
envelope headers, publish semantics and the /stats filters.  Most requests go through klein's resource with
treq.testing.StubTreq against a live embedded nsqd's service; a few go over real HTTP with treq."""

from __future__ import annotations

import json
import struct

import pytest
import pytest_twisted
import treq
from treq.testing import StubTreq

from nsqtw.nsqd.http import NsqdHTTPAPI
from nsqtw.testing import command, connect_raw

from nsqd_http_helpers import _Ordered, raw_http, shape_diff

pytestmark = pytest.mark.e2e

JSON = "application/json; charset=utf-8"
TEXT = "text/plain; charset=utf-8"
NSQ = "nsq; version=1.0"
BASE = "http://nsqd"


class Api:
    """Requests to the nsqd klein resource, in memory."""

    def __init__(self, nsqd) -> None:
        self.nsqd = nsqd
        self.stub = StubTreq(NsqdHTTPAPI(nsqd._service).resource())

    async def call(self, method: str, path: str, body: bytes = None):
        resp = await self.stub.request(method, BASE + path, data=body)
        content = await self.stub.content(resp)
        self.stub.flush()
        return resp.code, resp.headers, content

    async def expect_error(self, method: str, path: str, status: int, text: str, body: bytes = None) -> None:
        code, headers, content = await self.call(method, path, body)
        assert (code, content) == (status, json.dumps({"message": text}, separators=(",", ":")).encode()), path
        assert headers.getRawHeaders("content-type") == [JSON]
        assert headers.getRawHeaders("x-nsq-content-type") == [NSQ]

    async def expect_empty_ok(self, method: str, path: str) -> None:
        code, headers, content = await self.call(method, path)
        assert (code, content) == (200, b""), path
        assert headers.getRawHeaders("x-nsq-content-type") == [NSQ]

    async def expect_ok_text(self, method: str, path: str, body: bytes = None) -> None:
        code, headers, content = await self.call(method, path, body)
        assert (code, content) == (200, b"OK"), (path, content)
        assert headers.getRawHeaders("content-type") == [TEXT]
        assert headers.getRawHeaders("x-nsq-content-type") == [NSQ]

    async def stats(self, query: str = ""):
        code, _, content = await self.call("GET", "/stats?format=json" + query)
        assert code == 200
        return json.loads(content)


@pytest.fixture
def api(nsqd):
    return Api(nsqd)


# --- /ping and the envelope ------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_ping_is_plain_text_without_v1_header(api):
    """/ping answers 200 OK as plain text and, unlike V1 answers, no X-NSQ-Content-Type."""
    code, headers, content = await api.call("GET", "/ping")
    assert (code, content) == (200, b"OK")
    assert headers.getRawHeaders("content-type") == [TEXT]
    assert not headers.hasHeader("x-nsq-content-type")


@pytest_twisted.ensureDeferred
async def test_ping_unhealthy_is_500_plain(api, nsqd):
    """An unhealthy nsqd answers /ping with 500 and its health text, still plain text."""
    nsqd._broker.health = "NOK - disk full"
    try:
        code, headers, content = await api.call("GET", "/ping")
        assert (code, content) == (500, b"NOK - disk full")
        assert not headers.hasHeader("x-nsq-content-type")
    finally:
        nsqd._broker.health = "OK"


@pytest.mark.parametrize("method,path,allow", [
    ("GET", "/pub", "OPTIONS, POST"),
    ("PUT", "/mpub", "OPTIONS, POST"),
    ("POST", "/ping", "GET, OPTIONS"),
    ("POST", "/stats", "GET, OPTIONS"),
    ("GET", "/topic/create", "OPTIONS, POST"),
    ("GET", "/channel/unpause", "OPTIONS, POST"),
    ("DELETE", "/config/mem_queue_size", "GET, OPTIONS, PUT"),
])
@pytest_twisted.ensureDeferred
async def test_wrong_method_is_405_with_allow(api, method, path, allow):
    """A known path with the wrong method: 405 METHOD_NOT_ALLOWED JSON and httprouter's sorted Allow."""
    code, headers, content = await api.call(method, path)
    assert (code, content) == (405, b'{"message":"METHOD_NOT_ALLOWED"}')
    assert headers.getRawHeaders("allow") == [allow]
    assert headers.getRawHeaders("x-nsq-content-type") == [NSQ]


@pytest.mark.parametrize("path", ["/", "/nope", "/topic", "/topic/create/extra", "/put", "/create_topic",
                                  "/mput", "/debug/nothing"])
@pytest_twisted.ensureDeferred
async def test_unknown_path_is_404(api, path):
    """Unknown paths (including the pre-1.0 endpoints removed in 1.0) answer 404 NOT_FOUND JSON."""
    await api.expect_error("GET", path, 404, "NOT_FOUND")


@pytest_twisted.ensureDeferred
async def test_empty_answers_have_no_content_type(nsqd):
    """POST /topic/create answers an empty 200 with no Content-Type, like nsqd."""
    ours = await raw_http(nsqd.http_port, "POST", "/topic/create?topic=t")
    assert (ours.status, ours.body) == (200, b"")
    assert ours.header("x-nsq-content-type") == NSQ
    assert ours.header("content-type") is None


# --- /pub -----------------------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_pub_ok_creates_topic(api, nsqd):
    """POST /pub answers OK (text/plain, V1 header) and queues the body on the auto-created topic."""
    await api.expect_ok_text("POST", "/pub?topic=t", b"hello")
    t = nsqd._broker.find_topic("t")
    assert (t.message_count, t.message_bytes) == (1, 5)


@pytest.mark.parametrize("path,body,status,text", [
    ("/pub?topic=t", b"", 400, "MSG_EMPTY"),
    ("/pub", b"", 400, "MSG_EMPTY"),  # the body is checked before the topic
    ("/pub", b"x", 400, "MISSING_ARG_TOPIC"),
    ("/pub?topic=", b"x", 400, "INVALID_TOPIC"),
    ("/pub?topic=bad!name", b"x", 400, "INVALID_TOPIC"),
    ("/pub?topic=" + "a" * 65, b"x", 400, "INVALID_TOPIC"),
    ("/pub?topic=t&defer=abc", b"x", 400, "INVALID_DEFER"),
    ("/pub?topic=t&defer=-1", b"x", 400, "INVALID_DEFER"),
    ("/pub?topic=t&defer=3600001", b"x", 400, "INVALID_DEFER"),
    ("/pub?topic=t&defer=1.5", b"x", 400, "INVALID_DEFER"),
    ("/pub?topic=t&defer=", b"x", 400, "INVALID_DEFER"),
])
@pytest_twisted.ensureDeferred
async def test_pub_errors(api, nsqd, path, body, status, text):
    """/pub's errors, in nsqd's order of checks."""
    await api.expect_error("POST", path, status, text, body)
    assert "t" not in nsqd._broker.topics or nsqd._broker.find_topic("t").message_count == 0


@pytest.mark.nsqd_options(max_msg_size=100)
@pytest_twisted.ensureDeferred
async def test_pub_msg_too_big(api, nsqd):
    """A body over --max-msg-size is 413 MSG_TOO_BIG; exactly the maximum is accepted."""
    await api.expect_error("POST", "/pub?topic=t", 413, "MSG_TOO_BIG", b"x" * 101)
    await api.expect_ok_text("POST", "/pub?topic=t", b"x" * 100)
    assert nsqd._broker.find_topic("t").message_count == 1


@pytest.mark.nsqd_options(max_msg_size=100)
@pytest_twisted.ensureDeferred
async def test_pub_msg_too_big_over_http(nsqd):
    """Over real HTTP a Content-Length above --max-msg-size is refused with 413 MSG_TOO_BIG."""
    ours = await raw_http(nsqd.http_port, "POST", "/pub?topic=t", b"y" * 5000)
    assert (ours.status, ours.body) == (413, b'{"message":"MSG_TOO_BIG"}')


@pytest_twisted.ensureDeferred
async def test_pub_defer_bounds(api, nsqd):
    """defer=0 publishes at once; defer=--max-req-timeout is accepted and the message is deferred."""
    nsqd._broker.get_topic("t").get_channel("c", 0)
    await api.expect_ok_text("POST", "/pub?topic=t&defer=0", b"now")
    await api.expect_ok_text("POST", "/pub?topic=t&defer=3600000", b"later")
    ch = nsqd._broker.find_channel("t", "c")
    assert (ch.depth(), len(ch.deferred), ch.message_count) == (1, 1, 2)


@pytest_twisted.ensureDeferred
async def test_pub_defer_delivers_after_the_delay(nsqd):
    """A /pub?defer=150 message reaches a subscribed consumer only after the delay (real HTTP, real scan)."""
    cons = await connect_raw(nsqd.tcp_port)
    cons.send(command("SUB", "t", "c") + command("RDY", 5))
    assert await cons.response() == b"OK"
    from twisted.internet import reactor
    sent_at = reactor.seconds()
    r = await treq.post(f"http://{nsqd.http_address}/pub?topic=t&defer=150", data=b"deferred")
    assert (r.code, await r.content()) == (200, b"OK")
    stats = json.loads(await (await treq.get(f"http://{nsqd.http_address}/stats?format=json")).content())
    assert stats["topics"][0]["channels"][0]["deferred_count"] == 1
    msg = await cons.message(timeout=5)
    assert msg.body == b"deferred" and msg.attempts == 1
    assert reactor.seconds() - sent_at >= 0.15
    await cons.close()


# --- /mpub ----------------------------------------------------------------------------------------------


async def _bodies(nsqd, topic: str):
    """Drain what a fresh channel of ``topic`` holds (messages published before it existed go to it)."""
    cons = await connect_raw(nsqd.tcp_port)
    cons.send(command("SUB", topic, "drain") + command("RDY", 2500))
    assert await cons.response() == b"OK"
    n = nsqd._broker.find_topic(topic).message_count
    out = [(await cons.message()).body for _ in range(n)]
    await cons.close()
    return out


@pytest_twisted.ensureDeferred
async def test_mpub_text_mode_splitting(api, nsqd):
    """Text /mpub: split on \\n, trailing \\n stripped, \\r kept, empty lines skipped."""
    await api.expect_ok_text("POST", "/mpub?topic=t", b"a\r\nb\n\n\nc\n\n")
    assert await _bodies(nsqd, "t") == [b"a\r", b"b", b"c"]


@pytest_twisted.ensureDeferred
async def test_mpub_text_no_trailing_newline_and_no_messages(api, nsqd):
    """The last line needs no newline; a body of only newlines publishes nothing yet answers OK."""
    await api.expect_ok_text("POST", "/mpub?topic=t", b"one\ntwo")
    assert await _bodies(nsqd, "t") == [b"one", b"two"]
    await api.expect_ok_text("POST", "/mpub?topic=u", b"\n\n\n")
    await api.expect_ok_text("POST", "/mpub?topic=v", b"")
    assert nsqd._broker.find_topic("u").message_count == 0
    assert nsqd._broker.find_topic("v").message_count == 0


@pytest.mark.parametrize("path,status,text", [
    ("/mpub", 400, "MISSING_ARG_TOPIC"),
    ("/mpub?topic=bad!", 400, "INVALID_TOPIC"),
])
@pytest_twisted.ensureDeferred
async def test_mpub_topic_errors(api, path, status, text):
    """/mpub's topic errors are /pub's."""
    await api.expect_error("POST", path, status, text, b"a\nb\n")


@pytest.mark.nsqd_options(max_msg_size=10, max_body_size=100)
@pytest_twisted.ensureDeferred
async def test_mpub_size_limits(api, nsqd):
    """A line over --max-msg-size is 413 MSG_TOO_BIG; a body over --max-body-size is 413 BODY_TOO_BIG;
    nothing is published by a refused /mpub."""
    await api.expect_error("POST", "/mpub?topic=t", 413, "MSG_TOO_BIG", b"ok\n" + b"x" * 11 + b"\n")
    await api.expect_error("POST", "/mpub?topic=t", 413, "BODY_TOO_BIG", b"abcdefghi\n" * 11)
    assert nsqd._broker.find_topic("t").message_count == 0
    await api.expect_ok_text("POST", "/mpub?topic=t", b"x" * 10 + b"\n")


def binary(*bodies: bytes, count: int = None) -> bytes:
    n = len(bodies) if count is None else count
    return struct.pack(">i", n) + b"".join(struct.pack(">i", len(b)) + b for b in bodies)


@pytest.mark.parametrize("flag", ["true", "1", "yes", "anything"])
@pytest_twisted.ensureDeferred
async def test_mpub_binary_mode(api, nsqd, flag):
    """binary=true|1 (and, deprecated, any unrecognised value) reads [num][size][data]... with no outer size."""
    await api.expect_ok_text("POST", f"/mpub?topic=t&binary={flag}", binary(b"a\nb", b"\x00\xff", b"c"))
    assert await _bodies(nsqd, "t") == [b"a\nb", b"\x00\xff", b"c"]


@pytest.mark.parametrize("flag", ["false", "0"])
@pytest_twisted.ensureDeferred
async def test_mpub_binary_false_is_text(api, nsqd, flag):
    """binary=false|0 keeps text mode."""
    await api.expect_ok_text("POST", f"/mpub?topic=t&binary={flag}", b"a\nb\n")
    assert await _bodies(nsqd, "t") == [b"a", b"b"]


@pytest.mark.parametrize("body,text", [
    (b"", "BAD_BODY"),
    (b"\x00\x00", "BAD_BODY"),
    (binary(count=0), "BAD_BODY"),
    (struct.pack(">i", -1), "BAD_BODY"),
    (binary(b"a", b"b", count=3), "BAD_MESSAGE"),
    (struct.pack(">i", 1) + struct.pack(">i", 0), "BAD_MESSAGE"),
    (struct.pack(">i", 1) + struct.pack(">i", 5) + b"ab", "BAD_MESSAGE"),
    (struct.pack(">i", 1) + struct.pack(">i", 1048577) + b"x", "BAD_MESSAGE"),
])
@pytest_twisted.ensureDeferred
async def test_mpub_binary_errors(api, nsqd, body, text):
    """Binary /mpub errors are readMPUB's codes without 'E_', with status 413; nothing is published."""
    await api.expect_error("POST", "/mpub?topic=t&binary=true", 413, text, body)
    assert nsqd._broker.find_topic("t").message_count == 0


# --- topics -----------------------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_topic_create(api, nsqd):
    """/topic/create answers an empty 200 and creates the topic; name errors are 400."""
    await api.expect_empty_ok("POST", "/topic/create?topic=t")
    assert "t" in nsqd._broker.topics
    await api.expect_error("POST", "/topic/create", 400, "MISSING_ARG_TOPIC")
    await api.expect_error("POST", "/topic/create?topic=a+b", 400, "INVALID_TOPIC")


@pytest_twisted.ensureDeferred
async def test_topic_delete(api, nsqd):
    """/topic/delete: 400 MISSING_ARG_TOPIC, 404 TOPIC_NOT_FOUND (no name validation), 200 deletes."""
    await api.expect_error("POST", "/topic/delete", 400, "MISSING_ARG_TOPIC")
    await api.expect_error("POST", "/topic/delete?topic=bad!", 404, "TOPIC_NOT_FOUND")
    await api.expect_error("POST", "/topic/delete?topic=nope", 404, "TOPIC_NOT_FOUND")
    await api.expect_empty_ok("POST", "/topic/create?topic=t")
    await api.expect_empty_ok("POST", "/topic/delete?topic=t")
    assert "t" not in nsqd._broker.topics


@pytest_twisted.ensureDeferred
async def test_topic_empty(api, nsqd):
    """/topic/empty: 400 MISSING_ARG_TOPIC / INVALID_TOPIC, 404 TOPIC_NOT_FOUND, 200 drops the backlog."""
    await api.expect_error("POST", "/topic/empty", 400, "MISSING_ARG_TOPIC")
    await api.expect_error("POST", "/topic/empty?topic=bad!", 400, "INVALID_TOPIC")
    await api.expect_error("POST", "/topic/empty?topic=nope", 404, "TOPIC_NOT_FOUND")
    await api.expect_ok_text("POST", "/mpub?topic=t", b"a\nb\n")
    assert nsqd._broker.find_topic("t").depth() == 2
    await api.expect_empty_ok("POST", "/topic/empty?topic=t")
    assert nsqd._broker.find_topic("t").depth() == 0


@pytest.mark.parametrize("action", ["pause", "unpause"])
@pytest_twisted.ensureDeferred
async def test_topic_pause_errors(api, action):
    """/topic/(un)pause: 400 MISSING_ARG_TOPIC, 404 TOPIC_NOT_FOUND (no name validation)."""
    await api.expect_error("POST", f"/topic/{action}", 400, "MISSING_ARG_TOPIC")
    await api.expect_error("POST", f"/topic/{action}?topic=bad!", 404, "TOPIC_NOT_FOUND")


@pytest_twisted.ensureDeferred
async def test_topic_pause_and_unpause(api, nsqd):
    """Pausing a topic holds new messages at the topic (paused: true in /stats); unpausing releases them."""
    await api.expect_empty_ok("POST", "/topic/create?topic=t")
    await api.expect_empty_ok("POST", "/channel/create?topic=t&channel=c")
    await api.expect_empty_ok("POST", "/topic/pause?topic=t")
    await api.expect_ok_text("POST", "/pub?topic=t", b"x")
    s = (await api.stats())["topics"][0]
    assert (s["paused"], s["depth"], s["channels"][0]["depth"]) == (True, 1, 0)
    await api.expect_empty_ok("POST", "/topic/unpause?topic=t")
    s = (await api.stats())["topics"][0]
    assert (s["paused"], s["depth"], s["channels"][0]["depth"]) == (False, 0, 1)


# --- channels ---------------------------------------------------------------------------------------------


CHANNEL_ARG_ERRORS = [
    ("", 400, "MISSING_ARG_TOPIC"),
    ("?channel=c", 400, "MISSING_ARG_TOPIC"),
    ("?topic=bad!&channel=c", 400, "INVALID_ARG_TOPIC"),
    ("?topic=t", 400, "MISSING_ARG_CHANNEL"),
    ("?topic=t&channel=bad!", 400, "INVALID_ARG_CHANNEL"),
    ("?topic=nope&channel=c", 404, "TOPIC_NOT_FOUND"),
]


@pytest.mark.parametrize("action", ["create", "delete", "empty", "pause", "unpause"])
@pytest.mark.parametrize("query,status,text", CHANNEL_ARG_ERRORS)
@pytest_twisted.ensureDeferred
async def test_channel_argument_errors(api, nsqd, action, query, status, text):
    """Every /channel/* endpoint: the four 400s in order, then 404 TOPIC_NOT_FOUND."""
    nsqd._broker.get_topic("t")
    await api.expect_error("POST", f"/channel/{action}{query}", status, text)


@pytest.mark.parametrize("action", ["delete", "empty", "pause", "unpause"])
@pytest_twisted.ensureDeferred
async def test_channel_not_found(api, nsqd, action):
    """delete, empty, pause and unpause of a missing channel: 404 CHANNEL_NOT_FOUND."""
    nsqd._broker.get_topic("t")
    await api.expect_error("POST", f"/channel/{action}?topic=t&channel=nope", 404, "CHANNEL_NOT_FOUND")


@pytest_twisted.ensureDeferred
async def test_channel_create_needs_existing_topic_and_gets_the_backlog(api, nsqd):
    """/channel/create works only for an existing topic, and the new channel receives the topic's backlog."""
    await api.expect_error("POST", "/channel/create?topic=t&channel=c", 404, "TOPIC_NOT_FOUND")
    await api.expect_ok_text("POST", "/mpub?topic=t", b"1\n2\n3\n")
    await api.expect_empty_ok("POST", "/channel/create?topic=t&channel=c")
    await api.expect_empty_ok("POST", "/channel/create?topic=t&channel=c")  # idempotent
    s = (await api.stats())["topics"][0]
    assert [c["channel_name"] for c in s["channels"]] == ["c"]
    assert (s["depth"], s["channels"][0]["depth"]) == (0, 3)


@pytest_twisted.ensureDeferred
async def test_channel_delete_empty_pause_unpause(api, nsqd):
    """The channel lifecycle over HTTP, checked in /stats."""
    await api.expect_empty_ok("POST", "/topic/create?topic=t")
    await api.expect_empty_ok("POST", "/channel/create?topic=t&channel=c")
    await api.expect_empty_ok("POST", "/channel/create?topic=t&channel=d")
    await api.expect_ok_text("POST", "/mpub?topic=t", b"1\n2\n")
    await api.expect_empty_ok("POST", "/channel/empty?topic=t&channel=c")
    chans = {c["channel_name"]: c for c in (await api.stats())["topics"][0]["channels"]}
    assert (chans["c"]["depth"], chans["d"]["depth"]) == (0, 2)
    await api.expect_empty_ok("POST", "/channel/pause?topic=t&channel=d")
    chans = {c["channel_name"]: c for c in (await api.stats())["topics"][0]["channels"]}
    assert (chans["c"]["paused"], chans["d"]["paused"]) == (False, True)
    await api.expect_empty_ok("POST", "/channel/unpause?topic=t&channel=d")
    await api.expect_empty_ok("POST", "/channel/delete?topic=t&channel=c")
    chans = [c["channel_name"] for c in (await api.stats())["topics"][0]["channels"]]
    assert chans == ["d"]


@pytest_twisted.ensureDeferred
async def test_channel_pause_stops_delivery_over_tcp(api, nsqd):
    """A consumer on a paused channel gets nothing until /channel/unpause."""
    cons = await connect_raw(nsqd.tcp_port)
    cons.send(command("SUB", "t", "c") + command("RDY", 5))
    assert await cons.response() == b"OK"
    await api.expect_empty_ok("POST", "/channel/pause?topic=t&channel=c")
    await api.expect_ok_text("POST", "/pub?topic=t", b"held")
    assert nsqd._broker.find_channel("t", "c").depth() == 1
    await api.expect_empty_ok("POST", "/channel/unpause?topic=t&channel=c")
    assert (await cons.message()).body == b"held"
    await cons.close()


# --- /config --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("opt,value", [
    ("mem_queue_size", 10000),
    ("msg_timeout", 60_000_000_000),
    ("max_msg_size", 1048576),
    ("max_req_timeout", 3_600_000_000_000),
    ("log_level", 2),
    ("nsqlookupd_tcp_addresses", []),
    ("max_rdy_count", 2500),
    ("snappy", True),
    ("deflate", True),
    ("max_deflate_level", 6),
    ("e2e_processing_latency_percentiles", []),
    ("statsd_prefix", "nsq.%s"),
])
@pytest_twisted.ensureDeferred
async def test_config_get(api, opt, value):
    """GET /config/:opt answers the option as Go's RespondV1 does (durations in ns; a string option is the raw
    string as text/plain, anything else JSON), looked up by config name."""
    code, headers, content = await api.call("GET", f"/config/{opt}")
    if isinstance(value, str):
        assert (code, content) == (200, value.encode())
        assert headers.getRawHeaders("content-type") == [TEXT]
    else:
        assert code == 200 and json.loads(content) == value
        assert headers.getRawHeaders("content-type") == [JSON]


@pytest_twisted.ensureDeferred
async def test_config_get_by_cfg_tag(api, nsqd):
    """Options renamed by a cfg tag are found by that name (id, not node_id)."""
    code, _, content = await api.call("GET", "/config/id")
    assert code == 200 and json.loads(content) == nsqd.options.node_id
    await api.expect_error("GET", "/config/node_id", 400, "INVALID_OPTION")
    await api.expect_error("GET", "/config/mem-queue-size", 400, "INVALID_OPTION")


@pytest_twisted.ensureDeferred
async def test_config_put(api):
    """PUT /config/log_level and /config/nsqlookupd_tcp_addresses change them; other PUTs and bad values fail."""
    code, _, content = await api.call("PUT", "/config/log_level", b"debug")
    assert (code, json.loads(content)) == (200, 1)
    code, _, content = await api.call("GET", "/config/log_level")
    assert json.loads(content) == 1
    code, _, content = await api.call("PUT", "/config/nsqlookupd_tcp_addresses", b"[]")
    assert (code, json.loads(content)) == (200, [])
    await api.expect_error("PUT", "/config/log_level", 400, "INVALID_VALUE", b"loud")
    await api.expect_error("PUT", "/config/nsqlookupd_tcp_addresses", 400, "INVALID_VALUE", b"{not json")
    await api.expect_error("PUT", "/config/log_level", 413, "INVALID_VALUE", b"")
    await api.expect_error("PUT", "/config/mem_queue_size", 400, "INVALID_OPTION", b"5")


# --- /stats -----------------------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_stats_empty_broker(api):
    """With no topics: topics is [] (not null), producers null, memory present."""
    doc = await api.stats()
    assert list(doc) == ["version", "health", "start_time", "topics", "memory", "producers"]
    assert (doc["version"], doc["health"], doc["topics"], doc["producers"]) == ("1.3.0", "OK", [], None)


@pytest_twisted.ensureDeferred
async def test_stats_unknown_topic_is_null(api):
    """topic= naming no topic gives topics null and producers null."""
    await api.expect_ok_text("POST", "/pub?topic=t", b"x")
    doc = await api.stats("&topic=nope")
    assert doc["topics"] is None and doc["producers"] is None


@pytest_twisted.ensureDeferred
async def test_stats_topic_and_channel_filters(api, nsqd):
    """topic= keeps one topic; channel= keeps that channel and drops topics without it."""
    for t in ("a", "b"):
        await api.expect_empty_ok("POST", f"/topic/create?topic={t}")
        await api.expect_empty_ok("POST", f"/channel/create?topic={t}&channel=x")
    await api.expect_empty_ok("POST", "/channel/create?topic=a&channel=y")
    doc = await api.stats("&topic=a")
    assert [t["topic_name"] for t in doc["topics"]] == ["a"]
    assert [c["channel_name"] for c in doc["topics"][0]["channels"]] == ["x", "y"]
    doc = await api.stats("&channel=y")
    assert [(t["topic_name"], [c["channel_name"] for c in t["channels"]]) for t in doc["topics"]] == [("a", ["y"])]
    doc = await api.stats("&topic=b&channel=y")
    assert doc["topics"] == []


@pytest_twisted.ensureDeferred
async def test_stats_topics_and_channels_sorted_by_name(api):
    """Topics and channels are listed by name."""
    for t in ("zeta", "alpha", "mid"):
        await api.expect_empty_ok("POST", f"/topic/create?topic={t}")
    for c in ("q", "b", "k"):
        await api.expect_empty_ok("POST", f"/channel/create?topic=mid&channel={c}")
    doc = await api.stats()
    assert [t["topic_name"] for t in doc["topics"]] == ["alpha", "mid", "zeta"]
    assert [c["channel_name"] for c in doc["topics"][1]["channels"]] == ["b", "k", "q"]


@pytest.mark.parametrize("value,included", [("false", False), ("0", False), ("true", True), ("1", True),
                                            ("maybe", True), ("", True)])
@pytest_twisted.ensureDeferred
async def test_stats_include_clients(api, nsqd, value, included):
    """include_clients=false|0 nulls every channel's clients and the producers; client_count stays."""
    cons = await connect_raw(nsqd.tcp_port)
    cons.send(command("SUB", "t", "c") + b"PUB t\n" + struct.pack(">i", 1) + b"x")
    assert await cons.response() == b"OK" and await cons.response() == b"OK"
    doc = await api.stats(f"&include_clients={value}")
    ch = doc["topics"][0]["channels"][0]
    assert ch["client_count"] == 1
    if included:
        assert len(ch["clients"]) == 1 and len(doc["producers"]) == 1
        assert doc["producers"][0]["pub_counts"] == [{"topic": "t", "count": 1}]
    else:
        assert ch["clients"] is None and doc["producers"] is None
    await cons.close()


@pytest.mark.parametrize("value,included", [("false", False), ("0", False), ("true", True), ("x", True)])
@pytest_twisted.ensureDeferred
async def test_stats_include_mem(api, value, included):
    """include_mem=false|0 drops the memory key entirely; its nine keys are Go's names otherwise."""
    doc = await api.stats(f"&include_mem={value}")
    assert ("memory" in doc) is included
    if included:
        assert list(doc["memory"]) == ["heap_objects", "heap_idle_bytes", "heap_in_use_bytes", "heap_released_bytes",
                                       "gc_pause_usec_100", "gc_pause_usec_99", "gc_pause_usec_95", "next_gc_bytes",
                                       "gc_total_runs"]
        assert all(isinstance(v, int) and v >= 0 for v in doc["memory"].values())


@pytest_twisted.ensureDeferred
async def test_stats_pub_counts_filtered_by_topic(api, nsqd):
    """A producer's pub_counts holds one entry, the filtered topic's when topic= is given."""
    prod = await connect_raw(nsqd.tcp_port)
    for t in ("a", "b", "b"):
        prod.send(b"PUB " + t.encode() + b"\n" + struct.pack(">i", 1) + b"x")
        assert await prod.response() == b"OK"
    doc = await api.stats("&topic=b")
    assert doc["producers"][0]["pub_counts"] == [{"topic": "b", "count": 2}]
    doc = await api.stats()
    assert len(doc["producers"][0]["pub_counts"]) == 1
    await prod.close()


@pytest.mark.parametrize("fmt", ["", "&format=text", "&format=xml"])
@pytest_twisted.ensureDeferred
async def test_stats_text_is_the_default(api, fmt):
    """Anything but format=json is the text page (text/plain, V1 header)."""
    code, headers, content = await api.call("GET", "/stats?" + fmt.lstrip("&"))
    assert code == 200 and content.startswith(b"nsqd v1.3.0 (built w/")
    assert headers.getRawHeaders("content-type") == [TEXT]
    assert headers.getRawHeaders("x-nsq-content-type") == [NSQ]
    assert b"\nTopics: None\n" in content and b"\nProducers: None\n" in content


@pytest_twisted.ensureDeferred
async def test_stats_text_paused_markers(api):
    """Paused topics are prefixed '*P ' and paused channels '   *P ' in the text page."""
    await api.expect_empty_ok("POST", "/topic/create?topic=t")
    await api.expect_empty_ok("POST", "/channel/create?topic=t&channel=c")
    await api.expect_empty_ok("POST", "/topic/pause?topic=t")
    await api.expect_empty_ok("POST", "/channel/pause?topic=t&channel=c")
    _, _, content = await api.call("GET", "/stats?include_mem=false")
    lines = content.decode().split("\n")
    assert any(ln.startswith("*P [t              ] depth: 0 ") for ln in lines), lines
    assert any(ln.startswith("   *P [c                        ] depth: 0 ") for ln in lines), lines
    assert "Memory:" not in lines


@pytest_twisted.ensureDeferred
async def test_stats_client_fields_match_go(api, nsqd):
    """A consumer's ClientV2Stats has Go's keys in Go's order (pub_counts omitted when empty)."""
    cons = await connect_raw(nsqd.tcp_port)
    cons.send(command("SUB", "t", "c") + command("RDY", 3))
    assert await cons.response() == b"OK"
    code, _, content = await api.call("GET", "/stats?format=json")
    client = json.loads(content, object_pairs_hook=_Ordered).get("topics")[0].get("channels")[0].get("clients")[0]
    assert client.keys() == ["client_id", "hostname", "version", "remote_address", "state", "ready_count",
                             "in_flight_count", "message_count", "finish_count", "requeue_count", "connect_ts",
                             "sample_rate", "deflate", "snappy", "user_agent", "tls", "tls_cipher_suite",
                             "tls_version", "tls_negotiated_protocol", "tls_negotiated_protocol_is_mutual"]
    assert (client.get("version"), client.get("state"), client.get("ready_count")) == ("V2", 3, 3)
    assert client.get("remote_address").startswith("127.0.0.1:")
    await cons.close()


def test_shape_diff_detects_changes():
    """The shape comparison catches a reordered key, a changed type and a missing key."""
    go = json.loads('{"a":1,"b":[{"c":"x","d":null}],"e":0.5}', object_pairs_hook=_Ordered)
    same = json.loads('{"a":7,"b":[{"c":"y","d":null},{"c":"z","d":null}],"e":0.25}', object_pairs_hook=_Ordered)
    assert shape_diff(same, go) == []
    for bad in ('{"b":[],"a":1,"e":0.5}', '{"a":"1","b":[{"c":"x","d":null}],"e":0.5}',
                '{"a":1,"b":[{"c":"x"}],"e":0.5}', '{"a":1,"b":[{"c":"x","d":3}],"e":0.5}',
                '{"a":1,"b":[{"c":"x","d":null}],"e":1}'):
        assert shape_diff(json.loads(bad, object_pairs_hook=_Ordered), go) != [], bad


@pytest_twisted.ensureDeferred
async def test_stats_text_consumer_line(api, nsqd):
    """A consumer that never published is printed with Go's consumer format
    '[V2 %-21s] state: %d inflt: %-4d rdy: %-4d fin: %-8d re-q: %-8d msgs: %-8d connected: %s'."""
    from nsqtw.testing import body_command, identify_command
    cons = await connect_raw(nsqd.tcp_port)
    cons.send(identify_command(hostname="h", user_agent="ua") + command("SUB", "t", "c") + command("RDY", 5))
    assert await cons.response() == b"OK" and await cons.response() == b"OK"
    prod = await connect_raw(nsqd.tcp_port)
    prod.send(body_command("PUB", "t", body=b"x"))
    assert await prod.response() == b"OK"
    await cons.message()
    (client,) = nsqd._broker.find_channel("t", "c").clients.values()
    port = client.remote_address.rsplit(":", 1)[1]
    ident = f"h:{port} ua"
    _, _, content = await api.call("GET", "/stats?include_mem=false")
    lines = content.decode().split("\n")
    expected = (f"        [V2 {ident:<21}] state: 3 inflt: 1    rdy: 5    fin: 0        re-q: 0        "
                f"msgs: 1        connected: ")
    assert any(ln.startswith(expected) and ln[len(expected):].rstrip("s").isdigit() for ln in lines), lines
    await cons.close()
    await prod.close()
