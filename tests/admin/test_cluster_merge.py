"""clusterinfo's pure half: merging lookupd and nsqd documents into nsqadmin's shapes, and the
Upstream fetcher over an in-memory treq (``StubTreq``) with its timeout on a ``task.Clock``."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from klein import Klein
from treq.testing import StubTreq
from twisted.internet import defer
from twisted.internet.task import Clock

from nsqtw.admin.cluster import (
    ClusterInfo, E2eAggregate, FetchError, Producer, UpstreamError, Upstream, aggregate_stats,
    counter_stats, merge_lookupd_nodes, merge_topic_producers, producer_from_nsqd, semver_key, topic_totals,
    warning_message,
)


@pytest.fixture
def go_stats(fixtures_dir) -> dict[str, Any]:
    """Real Go nsqd 1.3.0 /stats (one topic ``events``, channel ``archive``, one client, e2e percentiles)."""
    raw = (fixtures_dir / "go-nsqd-1.3.0-http" / "stats-json.txt").read_text()
    return json.loads(raw.split("\n\n", 1)[1].strip())


def node(port: int, hostname: str = "host") -> Producer:
    return Producer(hostname=hostname, broadcast_address="10.0.0.1", http_port=port, tcp_port=port - 1)


def test_topic_totals_add_up_nodes_from_go_stats(go_stats) -> None:
    """Two nodes with Go's /stats: totals double, channels merge by name, clients are tagged with their node."""
    second = copy.deepcopy(go_stats)
    second["topics"][0]["channels"][0]["e2e_processing_latency"] = {
        "count": 6, "percentiles": [{"quantile": 0.99, "value": 100}, {"quantile": 0.5, "value": 50}]}
    per_node, channels = aggregate_stats([(node(4151, "b"), go_stats), (node(4152, "a"), second)], "events", "",
                                         now=1795302693)
    assert [t.node for t in per_node] == ["10.0.0.1:4152", "10.0.0.1:4151"]  # sorted by hostname
    total = topic_totals("events", per_node).to_json()
    assert total["node"] == "*" and total["message_count"] == 8 and total["depth"] == 0
    assert len(total["nodes"]) == 2 and total["nodes"][0]["hostname"] == "a"
    (archive,) = total["channels"]
    assert archive["in_flight_count"] == 4 and archive["client_count"] == 2 and archive["node"] == "*"
    ch = channels["archive"].to_json()
    assert [c["node"] for c in ch["clients"]] == ["10.0.0.1:4151", "10.0.0.1:4152"]
    client = ch["clients"][0]
    assert client["client_id"] == "worker-1" and client["user_agent"] == "example-client/1.0"
    assert client["connected"] == 10 * 1_000_000_000 and client["state"] == 3
    e2e = ch["e2e_processing_latency"]
    p99 = next(p for p in e2e["percentiles"] if p["quantile"] == 0.99)
    assert e2e["count"] == 8 and e2e["host"] == "*"
    assert p99["max"] == 529798926 and p99["min"] == 100
    assert p99["average"] == pytest.approx((529798926 * 2 + 100 * 6) / 8)
    assert list(p99) == sorted(p99)  # Go marshals map keys sorted


def test_per_node_rows_keep_nsqds_values(go_stats) -> None:
    """A node's topic row has memory_depth = depth - backend_depth and its channels' per-node numbers."""
    go_stats["topics"][0]["depth"] = 7
    go_stats["topics"][0]["backend_depth"] = 3
    per_node, _ = aggregate_stats([(node(4151), go_stats)], "", "", now=0)
    row = per_node[0].to_json()
    assert (row["depth"], row["memory_depth"], row["backend_depth"]) == (7, 4, 3)
    assert row["nodes"] is None and row["channels"][0]["nodes"] is None
    pct = row["e2e_processing_latency"]["percentiles"][0]
    assert pct == {"average": 529798926, "count": 2, "max": 529798926, "min": 529798926, "quantile": 0.99,
                   "value": 529798926}


def test_channel_filter_and_keys(go_stats) -> None:
    """Without a topic the channel map is keyed topic:channel; a channel filter drops the others."""
    _, channels = aggregate_stats([(node(4151), go_stats)], "", "", now=0)
    assert set(channels) == {"events:archive"}
    _, channels = aggregate_stats([(node(4151), go_stats)], "events", "other", now=0)
    assert channels == {}


def test_counter_stats_per_node() -> None:
    """/api/counter's stats: one entry per topic:channel:node with that node's message count."""
    doc = {"topics": [{"topic_name": "t", "channels": [{"channel_name": "c", "message_count": 5}]}]}
    doc2 = {"topics": [{"topic_name": "t", "channels": [{"channel_name": "c", "message_count": 2}]}]}
    _, channels = aggregate_stats([(node(1), doc), (node(2), doc2)], "", "", now=0)
    assert counter_stats(channels) == {
        "t:c:10.0.0.1:1": {"node": "10.0.0.1:1", "topic_name": "t", "channel_name": "c", "message_count": 5},
        "t:c:10.0.0.1:2": {"node": "10.0.0.1:2", "topic_name": "t", "channel_name": "c", "message_count": 2},
    }


def test_e2e_aggregate_merges_quantiles() -> None:
    """Averages are count-weighted; a quantile only one node has is appended; a node without e2e is skipped."""
    a = E2eAggregate.from_nsqd({"count": 2, "percentiles": [{"quantile": 0.99, "value": 100}]})
    b = E2eAggregate.from_nsqd({"count": 6, "percentiles": [{"quantile": 0.99, "value": 400},
                                                            {"quantile": 0.5, "value": 10}]})
    total = E2eAggregate(topic="t")
    total.add(a)
    total.add(None)
    total.add(b)
    doc = total.to_json()
    assert doc["count"] == 8 and doc["topic"] == "t" and doc["host"] == "*"
    p99, p50 = doc["percentiles"]
    assert (p99["quantile"], p99["min"], p99["max"], p99["count"]) == (0.99, 100, 400, 8)
    assert p99["average"] == pytest.approx(325.0)
    assert (p50["quantile"], p50["average"], p50["count"]) == (0.5, 10, 6)
    assert E2eAggregate.from_nsqd({"count": 0, "percentiles": None}).to_json()["percentiles"] is None


def test_lookupd_nodes_union_by_tcp_address() -> None:
    """GetLookupdProducers: a node two lookupds know appears once with both connections; topics are
    sorted with their tombstones; older versions are out_of_date; rows sort by hostname."""
    def entry(host, port, version, topics, tomb, remote):
        return {"remote_address": remote, "hostname": host, "broadcast_address": host, "tcp_port": port,
                "http_port": port + 1, "version": version, "topics": topics, "tombstones": tomb}
    l1 = {"producers": [entry("b", 4150, "1.3.0", ["z", "a"], [False, True], "10.1.1.1:5000"),
                        entry("a", 4250, "1.2.1", [], [], "10.1.1.2:5001")]}
    l2 = {"producers": [entry("b", 4150, "1.3.0", ["z", "a"], [False, True], "10.1.1.1:6000")]}
    merged = merge_lookupd_nodes([("lk1:4161", l1), ("lk2:4161", l2)])
    assert [p.hostname for p in merged] == ["a", "b"]
    a, b = (p.to_json() for p in merged)
    assert b["remote_addresses"] == ["lk1:4161/10.1.1.1:5000", "lk2:4161/10.1.1.1:6000"]
    assert b["topics"] == [{"topic": "a", "tombstoned": True}, {"topic": "z", "tombstoned": False}]
    assert a["out_of_date"] is True and b["out_of_date"] is False
    assert a["topics"] == [] and a["remote_addresses"] == ["lk1:4161/10.1.1.2:5001"]
    assert list(b) == ["remote_addresses", "remote_address", "hostname", "broadcast_address", "tcp_port",
                       "http_port", "version", "topics", "out_of_date"]


def test_topic_producers_dedupe_by_http_address() -> None:
    """GetLookupdTopicProducers unions /lookup answers by broadcast_address:http_port."""
    p = {"broadcast_address": "h", "http_port": 1, "tcp_port": 2, "hostname": "h", "version": "1.3.0"}
    q = dict(p, http_port=3)
    merged = merge_topic_producers([{"producers": [p, q]}, {"producers": [p]}])
    assert [m.http_address for m in merged] == ["h:1", "h:3"] and merged[0].topics is None


def test_producer_from_nsqd_info() -> None:
    """--nsqd-http-address mode: /info gives the identity; an old nsqd without broadcast_address falls back
    to the configured address; the configured address is where nsqadmin keeps talking to it."""
    info = {"version": "1.3.0", "broadcast_address": "nsqd-1", "hostname": "nsqd-1.local", "http_port": 4151,
            "tcp_port": 4150}
    p = producer_from_nsqd("127.0.0.1:4151", info, {"topics": [{"topic_name": "t"}]})
    assert (p.http_address, p.base_url, p.hostname) == ("nsqd-1:4151", "http://127.0.0.1:4151", "nsqd-1.local")
    assert p.to_json()["topics"] == [{"topic": "t", "tombstoned": False}]
    old = producer_from_nsqd("10.0.0.9:4151", {"version": "0.3.8", "tcp_port": 4150}, {"topics": []})
    assert (old.http_address, old.hostname, old.topics) == ("10.0.0.9:4151", "10.0.0.9", None)


def test_semver_and_warnings() -> None:
    """Versions compare numerically, pre-releases sort first, junk is 0.0.0; warnings join with '; '."""
    assert semver_key("1.2.10") > semver_key("1.2.9") > semver_key("1.2.9-rc.1") > semver_key("junk")
    assert semver_key("junk") == semver_key("0.0.0")
    assert warning_message([]) == "" and warning_message(["a", "b"]) == "WARNING: a; b"


# --- Upstream + ClusterInfo over StubTreq ------------------------------------------------------------------


class FakeNsqd:
    """Just enough of nsqd's HTTP API for the fetch layer."""

    app = Klein()

    def __init__(self) -> None:
        self.posts = []
        self.stats = {"topics": [{"topic_name": "t", "depth": 1, "message_count": 3, "channels": []}]}

    @app.route("/info")
    def info(self, request):
        request.setHeader(b"Content-Type", b"application/json")
        return json.dumps({"version": "1.3.0", "broadcast_address": "fake", "hostname": "fake", "http_port": 4151,
                           "tcp_port": 4150}).encode()

    @app.route("/stats")
    def stats(self, request):
        assert request.getHeader(b"accept") == b"application/vnd.nsq; version=1.0"
        return json.dumps(self.stats).encode()

    @app.route("/topic/pause", methods=["POST"])
    def pause(self, request):
        self.posts.append(request.uri)
        request.setResponseCode(404)
        return b'{"message":"TOPIC_NOT_FOUND"}'


def upstream_over(resource, clock) -> Upstream:
    return Upstream(StubTreq(resource), clock, 5.0, "test")


class HangingClient:
    """A treq-like client whose requests never get an answer (a wedged upstream)."""

    def __init__(self) -> None:
        self.cancelled = 0

    def request(self, method, url, **kwargs):
        def cancel(d):
            self.cancelled += 1
        return defer.Deferred(cancel)

    def get(self, url, **kwargs):
        return self.request("GET", url, **kwargs)

    def post(self, url, **kwargs):
        return self.request("POST", url, **kwargs)


def test_upstream_get_and_error_text() -> None:
    """A 200 is decoded JSON; a non-200 is a FetchError quoting status and body."""
    fake, clock = FakeNsqd(), Clock()
    up = upstream_over(fake.app.resource(), clock)
    got = []
    defer.ensureDeferred(up.get_json("http://x:4151/stats?format=json")).addCallback(got.append)
    assert got == [fake.stats]
    failures = []
    defer.ensureDeferred(up.post("http://x:4151/topic/pause?topic=t")).addErrback(failures.append)
    (f,) = failures
    assert f.check(FetchError)
    assert str(f.value) == ('POST "http://x:4151/topic/pause?topic=t": got response 404 Not Found '
                            '"{\\"message\\":\\"TOPIC_NOT_FOUND\\"}"')


def test_upstream_times_out_on_the_injected_clock() -> None:
    """A /stats that never answers fails with FetchError once --http-client-request-timeout passes on the clock."""
    client, clock = HangingClient(), Clock()
    up = Upstream(client, clock, 5.0, "test")
    results = []
    defer.ensureDeferred(up.get_json("http://x:4151/stats")).addBoth(results.append)
    clock.advance(4.9)
    assert results == []
    clock.advance(0.2)
    (f,) = results
    assert f.check(FetchError) and "no answer within 5s" in str(f.value)
    assert client.cancelled == 1


def test_cluster_total_failure_raises_upstream_error() -> None:
    """When every nsqd times out, ClusterInfo raises UpstreamError('failed to query any nsqd: ...')."""
    clock = Clock()
    ci = ClusterInfo(Upstream(HangingClient(), clock, 5.0, "test"), lambda: ([], ["x:4151", "y:4151"]), clock)
    results = []
    defer.ensureDeferred(ci.topics()).addBoth(results.append)
    clock.advance(6)
    (f,) = results
    assert f.check(UpstreamError) and str(f.value).startswith("failed to query any nsqd: ")
    assert str(f.value).count("no answer within 5s") == 2


def test_cluster_actions_collect_errors_as_warnings() -> None:
    """A fan-out whose nsqd POST fails still succeeds, with the failure in the returned error list."""
    fake, clock = FakeNsqd(), Clock()
    ci = ClusterInfo(upstream_over(fake.app.resource(), clock), lambda: ([], ["x:4151"]), clock)
    results = []
    defer.ensureDeferred(ci.topic_action("t", "pause")).addBoth(results.append)
    (errors,) = results
    assert fake.posts == [b"/topic/pause?topic=t"]
    assert len(errors) == 1 and "TOPIC_NOT_FOUND" in errors[0]


def test_concurrent_identical_gets_share_one_request() -> None:
    """Open tabs and the history poller asking one nsqd the same thing at once cost it one request
    (issue 27 item 9); a caller that goes away only stops waiting, and when the last one goes the
    request is cancelled."""
    calls: list[tuple[str, defer.Deferred]] = []
    cancelled: list[str] = []
    up = Upstream(object(), Clock(), 1.0, "test")

    async def request(method: str, url: str, body: Any = None, headers: Any = None) -> bytes:
        d: defer.Deferred = defer.Deferred(lambda _: cancelled.append(url))
        calls.append((url, d))
        return await d
    up.request = request  # type: ignore[method-assign]  # the one call every GET goes through
    a, b = [], []
    defer.ensureDeferred(up.get_json("http://x/stats")).addCallback(a.append)
    defer.ensureDeferred(up.get_json("http://x/stats")).addCallback(b.append)
    assert len(calls) == 1
    calls[0][1].callback(b'{"n": 1}')
    assert a == b == [{"n": 1}] and a[0] is not b[0]  # each caller gets its own document
    # a new GET after the answer is a new request
    c = defer.ensureDeferred(up.get_json("http://x/stats"))
    d = defer.ensureDeferred(up.get_json("http://x/stats"))
    assert len(calls) == 2
    c.cancel()
    c.addErrback(lambda f: f.trap(defer.CancelledError))
    assert cancelled == []  # d still waits
    d.cancel()
    d.addErrback(lambda f: f.trap(defer.CancelledError))
    assert cancelled == ["http://x/stats"]


class SplitClient:
    """Hosts ``up`` answer at once (a FakeNsqd); host ``hung`` answers only when the test says."""

    def __init__(self, fake: FakeNsqd) -> None:
        self.stub = StubTreq(fake.app.resource())
        self.waiting: list[tuple[str, dict, defer.Deferred]] = []

    def get(self, url, **kwargs):
        if "//hung:" in url:
            d = defer.Deferred()
            self.waiting.append((url, kwargs, d))
            return d
        return self.stub.get(url, **kwargs)

    def answer_all(self) -> None:
        waiting, self.waiting = self.waiting, []
        for url, kwargs, d in waiting:
            if not d.called:
                self.stub.get(url.replace("//hung:", "//up:"), **kwargs).chainDeferred(d)


def test_a_page_waits_briefly_for_a_node_known_not_to_answer_and_books_each_answer_when_it_came() -> None:
    """The first look waits out the request timeout for a hung nsqd (nothing was known); the next
    one answers after KNOWN_DOWN_WAIT, from what is known, while the hung node is asked again in
    the background; its late answer marks it answering again.  Each node's "last seen" is when its
    own answer came, not when the slowest node's did."""
    from nsqtw.admin.cluster import KNOWN_DOWN_WAIT, NotYet
    from nsqtw.admin.nodes import OK, UNREACHABLE

    clock = Clock()
    clock.advance(1000)
    client = SplitClient(FakeNsqd())
    ci = ClusterInfo(Upstream(client, clock, 5.0, "test"), lambda: ([], []), clock)
    up = Producer(hostname="up", broadcast_address="up", http_port=4151)
    hung = Producer(hostname="hung", broadcast_address="hung", http_port=4151)
    first = []
    defer.ensureDeferred(ci.nsqd_stats_failed([up, hung])).addBoth(first.append)
    clock.advance(4.9)
    assert first == []  # nothing known of hung yet: the page waits for it
    clock.advance(0.2)
    (_, _, errors, failed), = first
    assert failed == ["hung:4151"] and "no answer within 5s" in errors[0]
    assert ci.book.get("up:4151").last_seen == 1000  # when up answered, not when hung timed out
    assert ci.book.get("hung:4151").status == UNREACHABLE

    second = []
    defer.ensureDeferred(ci.nsqd_stats_failed([up, hung])).addBoth(second.append)
    clock.advance(KNOWN_DOWN_WAIT)
    (_, _, errors, failed), = second
    assert failed == ["hung:4151"] and "not answering since" in errors[0]
    assert [d.called for _, _, d in client.waiting] == [True, False]  # the first timed out; asked again
    client.answer_all()
    assert ci.book.get("hung:4151").status == OK and ci.book.get("hung:4151").last_seen == clock.seconds()
    assert NotYet.__mro__[1] is FetchError


def test_peek_names_a_node_that_held_the_channel_and_is_gone_from_nsqlookupd() -> None:
    """The Messages panel lists every node it asked, and also the ones nsqadmin knows held the
    channel but no longer asks (gone from nsqlookupd): their messages cannot be peeked, and it says so."""
    fake, clock = FakeNsqd(), Clock()
    clock.advance(3600)
    ci = ClusterInfo(upstream_over(fake.app.resource(), clock), lambda: ([], ["x:4151"]), clock)
    ci.book.answered("old:4151", {"topics": [{"topic_name": "t", "channels": [{"channel_name": "c"}]}]}, full=True)
    clock.advance(60)
    ci.book.listed([])  # nsqlookupd no longer lists it
    got = []
    defer.ensureDeferred(ci.peek("t", "c", 5)).addBoth(got.append)
    (doc,) = got
    nodes = {n["node"]: n for n in doc["nodes"]}
    assert set(nodes) == {"fake:4151", "old:4151"}
    old = nodes["old:4151"]
    assert old["ok"] is False and old["status"] == "gone"
    assert old["error"].startswith("gone from nsqlookupd since 01:01:00Z, last seen 01:00:00Z")
