"""Reproduce every exchange recorded from Go's nsqd 1.3.0 (tests/fixtures/go-nsqd-1.3.0-http) against an
embedded nsqtw nsqd, and compare status, headers, body and JSON shape (key order and types)."""

from __future__ import annotations

import json
import re
import socket

import pytest
import pytest_twisted

from nsqtw.testing import body_command, command, connect_raw, identify_command

from nsqd_http_helpers import fixture, raw_http, shape_diff

pytestmark = pytest.mark.e2e


E2E = dict(e2e_processing_latency_percentiles=[0.99, 0.5])

# fixture -> (method, path, body); the README says which request each file is
SIMPLE = {
    "ping.txt": ("GET", "/ping", None),
    "info.txt": ("GET", "/info", None),
    "not-found.txt": ("GET", "/no/such/path", None),
    "wrong-method.txt": ("GET", "/pub", None),
    "config-mem.txt": ("GET", "/config/mem_queue_size", None),
    "config-bad.txt": ("GET", "/config/no_such_option", None),
    "pub-empty.txt": ("POST", "/pub?topic=events", b""),
    "pub-missing-topic.txt": ("POST", "/pub", b"hello"),
    "pub-bad-topic.txt": ("POST", "/pub?topic=bad!name", b"hello"),
    "mpub-text.txt": ("POST", "/mpub?topic=events", b"a\nb\n"),
    "topic-delete-404.txt": ("POST", "/topic/delete?topic=missing", None),
    "channel-create-404.txt": ("POST", "/channel/create?topic=missing&channel=archive", None),
}

#: headers whose values must match Go's exactly (Date and the framing headers are checked separately)
COMPARED = ("content-type", "x-nsq-content-type", "allow")


@pytest.mark.parametrize("name", sorted(SIMPLE))
@pytest_twisted.ensureDeferred
async def test_simple_exchange_matches_go(nsqd, name):
    """Status, reason, the compared headers' presence and values, and the body (shape for JSON)."""
    method, path, body = SIMPLE[name]
    go = fixture(name)
    ours = await raw_http(nsqd.http_port, method, path, body)
    assert (ours.status, ours.reason) == (go.status, go.reason)
    for h in COMPARED:
        assert ours.header(h) == go.header(h), h
    if name == "info.txt":
        assert shape_diff(ours.json(), go.json()) == []
    else:
        assert ours.body == go.body


@pytest_twisted.ensureDeferred
async def test_answers_carry_content_length_like_go(nsqd):
    """Go frames its answers with Content-Length, never chunked."""
    for name in ("ping.txt", "info.txt", "not-found.txt", "config-mem.txt"):
        method, path, body = SIMPLE[name]
        ours = await raw_http(nsqd.http_port, method, path, body)
        assert ours.header("transfer-encoding") is None, name
        assert ours.header("content-length") == str(len(ours.body)), name


@pytest_twisted.ensureDeferred
async def test_date_header_present(nsqd):
    """Every answer has a Date header, as Go's do."""
    for name, (method, path, body) in SIMPLE.items():
        ours = await raw_http(nsqd.http_port, method, path, body)
        assert ours.header("date"), name


# --- /stats, in the state the fixtures were captured in ------------------------------------------------


async def build_fixture_state(nsqd):
    """Topic events, channel archive; a consumer worker-1 that PUBs 1 over TCP, 3 more over HTTP,
    RDY 5, FINs 2 and holds 2 (the README's capture state)."""
    import treq

    cons = await connect_raw(nsqd.tcp_port)
    cons.send(identify_command(client_id="worker-1", hostname="worker-1.example",
                               user_agent="example-client/1.0", feature_negotiation=True))
    await cons.response()
    cons.send(command("SUB", "events", "archive") + body_command("PUB", "events", body=b"tcp-1"))
    assert await cons.response() == b"OK"
    assert await cons.response() == b"OK"
    for body in (b"http-1", b"http-2", b"http-3"):
        r = await treq.post(f"http://{nsqd.http_address}/pub?topic=events", data=body)
        assert r.code == 200
        await r.content()
    cons.send(command("RDY", 5))
    msgs = [await cons.message() for _ in range(4)]
    # a FIN of an unknown ID answers a harmless non-fatal error: awaiting it orders the two FINs before
    # the /stats request made afterwards
    cons.send(command("FIN", msgs[0].id.decode()) + command("FIN", msgs[1].id.decode())
              + command("FIN", "0000000000000000"))
    assert (await cons.error()).startswith(b"E_FIN_FAILED")
    return cons


@pytest.mark.nsqd_options(**E2E)
@pytest_twisted.ensureDeferred
async def test_stats_json_matches_go_shape(nsqd):
    """/stats?format=json: every key in Go's order with Go's JSON types, recursively (values ignored)."""
    cons = await build_fixture_state(nsqd)
    go = fixture("stats-json.txt")
    ours = await raw_http(nsqd.http_port, "GET", "/stats?format=json")
    assert ours.status == 200
    for h in COMPARED:
        assert ours.header(h) == go.header(h), h
    assert shape_diff(ours.json(), go.json()) == []
    doc = ours.json()
    topic = doc.get("topics")[0]
    ch = topic.get("channels")[0]
    assert (topic.get("topic_name"), topic.get("message_count"), topic.get("message_bytes")) == ("events", 4, 23)
    assert (ch.get("channel_name"), ch.get("message_count"), ch.get("in_flight_count"), ch.get("client_count")) \
        == ("archive", 4, 2, 1)
    client = ch.get("clients")[0]
    assert (client.get("client_id"), client.get("hostname"), client.get("user_agent")) \
        == ("worker-1", "worker-1.example", "example-client/1.0")
    assert (client.get("ready_count"), client.get("in_flight_count"), client.get("finish_count")) == (5, 2, 2)
    assert client.get("pub_counts")[0].get("count") == 1
    e2e = ch.get("e2e_processing_latency")
    assert e2e.get("count") == 2 and [p.get("quantile") for p in e2e.get("percentiles")] == [0.99, 0.5]
    await cons.close()


@pytest.mark.nsqd_options(**E2E)
@pytest_twisted.ensureDeferred
async def test_stats_topic_channel_filtered_matches_go_shape(nsqd):
    """/stats?format=json&topic=&channel=&include_clients=false&include_mem=false: clients and producers
    null, no memory key."""
    cons = await build_fixture_state(nsqd)
    go = fixture("stats-topic-channel.txt")
    ours = await raw_http(nsqd.http_port, "GET",
                          "/stats?format=json&topic=events&channel=archive&include_clients=false&include_mem=false")
    assert ours.status == 200
    assert shape_diff(ours.json(), go.json()) == []
    assert ours.json().get("producers") is None
    await cons.close()


@pytest.mark.nsqd_options(**E2E)
@pytest_twisted.ensureDeferred
async def test_stats_json_of_a_channel_holding_messages_matches_go_shape(nsqd):
    """A channel with queued messages and no consumer has Go's keys too: nsqtw's ``oldest_message_ts``
    goes out only when asked (``include_oldest_message_ts=true``, which nsqadmin sends)."""
    cons = await build_fixture_state(nsqd)
    for body in (b"queued-1", b"queued-2"):
        r = await raw_http(nsqd.http_port, "POST", "/pub?topic=events", body)
        assert r.status == 200
    await cons.close()  # its two in-flight messages go back to the queue: four held, none consumed
    go = fixture("stats-topic-channel.txt")
    path = "/stats?format=json&topic=events&channel=archive&include_clients=false&include_mem=false"
    ours = await raw_http(nsqd.http_port, "GET", path)
    assert ours.json().get("topics")[0].get("channels")[0].get("depth") > 0
    assert shape_diff(ours.json(), go.json()) == []
    asked = await raw_http(nsqd.http_port, "GET", path + "&include_oldest_message_ts=true")
    assert isinstance(asked.json().get("topics")[0].get("channels")[0].get("oldest_message_ts"), int)


def _text_patterns():
    num = r"\d+"
    dur = r"(?:\d+h)?(?:\d+m)?\d+(?:\.\d+)?(?:ns|µs|us|ms|s)"
    human = r"\d+\.\d(?:ns|us|ms|s)"
    pats = [
        r"nsqd v1\.3\.0 \(built w/.+\)",
        r"start_time \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:Z|[+-]\d\d:\d\d)",
        r"uptime " + dur,
        r"",
        r"Health: OK",
        r"",
        r"Memory:",
    ]
    for key in ("heap_objects", "heap_idle_bytes", "heap_in_use_bytes", "heap_released_bytes", "gc_pause_usec_100",
                "gc_pause_usec_99", "gc_pause_usec_95", "next_gc_bytes", "gc_total_runs"):
        pats.append(re.escape(f"   {key:<25s}\t") + num)
    client = (r"\[V2 worker-1\.example:\d+ example-client/1\.0\] msgs: 1        topics: events=1 connected: "
              r"\d+s")
    pats += [
        r"",
        r"Topics:",
        rf"   \[events         \] depth: 0     be-depth: 0     msgs: 4        e2e%: {human}, {human}",
        rf"      \[archive                  \] depth: 0     be-depth: 0     inflt: 2    def: 0    re-q: 0     "
        rf"timeout: 0     msgs: 4        e2e%: {human}, {human}",
        r"        " + client,
        r"",
        r"Producers:",
        r"   " + client,
    ]
    return pats


@pytest.mark.nsqd_options(**E2E)
@pytest_twisted.ensureDeferred
async def test_stats_text_matches_go_line_shapes(nsqd):
    """/stats (text): the same lines as Go's printStats, line for line (values that vary are patterns)."""
    cons = await build_fixture_state(nsqd)
    go = fixture("stats-text.txt")
    ours = await raw_http(nsqd.http_port, "GET", "/stats")
    assert ours.status == 200
    for h in COMPARED:
        assert ours.header(h) == go.header(h), h
    go_lines = go.body.decode().split("\n")
    our_lines = ours.body.decode().split("\n")
    pats = _text_patterns() + [""]
    assert len(go_lines) == len(pats), "the patterns no longer describe Go's fixture"
    for pat, line in zip(pats, go_lines, strict=True):
        assert re.fullmatch(pat, line), (pat, line)
    assert len(our_lines) == len(go_lines), ours.body.decode()
    for pat, line in zip(pats, our_lines, strict=True):
        assert re.fullmatch(pat, line), (pat, line)
    await cons.close()


@pytest_twisted.ensureDeferred
async def test_info_every_field(nsqd):
    """/info: version, broadcast_address, hostname, real ports, start_time and the limits in Go's units (ns)."""
    ours = await raw_http(nsqd.http_port, "GET", "/info")
    info = json.loads(ours.body)
    assert list(info) == ["version", "broadcast_address", "hostname", "http_port", "tcp_port", "start_time",
                          "max_heartbeat_interval", "max_output_buffer_size", "max_output_buffer_timeout",
                          "max_deflate_level"]
    assert info["version"] == "1.3.0"
    assert info["broadcast_address"] == nsqd.options.broadcast_address
    assert info["hostname"] == socket.gethostname()
    assert (info["http_port"], info["tcp_port"]) == (nsqd.http_port, nsqd.tcp_port)
    assert info["start_time"] == int(nsqd._broker.start_time)
    assert info["max_heartbeat_interval"] == 60_000_000_000
    assert info["max_output_buffer_size"] == 65536
    assert info["max_output_buffer_timeout"] == 30_000_000_000
    assert info["max_deflate_level"] == 6
