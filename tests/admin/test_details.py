"""Issue 17 items 4 and 6: trouble that stands out, and the details (durations, 404s, labels, disconnects)."""

from __future__ import annotations

from typing import Any

import pytest
import pytest_twisted
from twisted.internet import protocol, task
from twisted.internet.endpoints import TCP4ClientEndpoint, TCP4ServerEndpoint
from twisted.logger import globalLogPublisher

from admin_helpers import call, create_channel
from nsqtw.admin.history import History, current_value, rising
from nsqtw.admin.html import nanotohuman
from nsqtw.admin.nodes import NodeBook

pytestmark = pytest.mark.e2e


def test_durations_after_hours_and_minutes_are_seconds() -> None:
    """1h39m plus 277.81 ms reads 1h39m0.28s (it read 1h39m277.81ms, in nsqadmin too)."""
    assert nanotohuman(3600e9 + 39 * 60e9 + 277.81e6) == "1h39m0.28s"
    assert nanotohuman(60e9 + 5e6) == "1m0.01s" and nanotohuman(3600e9) == "1h0s"
    assert nanotohuman(277.81e6) == "277.81ms"


def test_node_book_unreachable_then_gone_then_forgotten() -> None:
    """A node that stops answering is unreachable since its first failure; one nsqlookupd stops listing
    is gone since then; both keep their last-seen time and topics; gone ones are forgotten after retention."""
    clock = task.Clock()
    book = NodeBook(clock, retention=60)
    book.listed(["a:1", "b:1"])
    book.answered("a:1", {"topics": [{"topic_name": "t", "depth": 3, "channels": [
        {"channel_name": "c", "depth": 4, "message_count": 9, "client_count": 1}]}], "start_time": 5}, full=True)
    book.answered("b:1", {"topics": [{"topic_name": "t", "channels": []}]}, full=True)
    clock.advance(10)
    book.failed("a:1", "no answer")
    clock.advance(5)
    book.failed("a:1", "no answer again")
    a = book.get("a:1")
    assert a is not None and (a.status, a.unreachable_since, a.last_seen) == ("unreachable", 10, 0)
    assert (a.depth, a.clients, a.counts) == (7, 1, {"t:c": 9})
    book.listed(["a:1"])
    b = book.get("b:1")
    assert b is not None and (b.status, b.since) == ("gone", 15)
    assert [s.address for s in book.failing("t")] == ["a:1", "b:1"]
    assert [s.address for s in book.failing("t", present=["a:1"])] == ["b:1"]
    assert book.failing_channel("t", "c") == [a, b]  # b never reported channels: it may hold c
    clock.advance(61)
    book.forget()
    assert book.get("b:1") is None and book.get("a:1") is a
    book.answered("a:1")
    assert a.status == "ok" and a.last_seen == 76


def test_history_gap_is_not_the_last_value() -> None:
    """A topic whose node failed the newest poll has None there; cells show it as 'last', not current."""
    from nsqtw.admin.cluster import TopicStats

    h = History(10, 1.0)
    h.record(0, [TopicStats(node="n:1", topic_name="t", depth=5, message_count=5)])
    h.record(1, [], failed=["n:1"])
    series = h.overview()["topics"]["t"]["depth"]
    assert series == [5, None] and current_value(series) == (None, 5)
    assert current_value([1, 2]) == (2, None) and rising([1, 3]) and not rising([3, None])


@pytest_twisted.ensureDeferred
async def test_unknown_pages_are_html_404s_and_api_ones_json(admin) -> None:
    code, html, headers = await call("GET", admin.url + "no/such/page")
    assert code == 404 and headers.getRawHeaders(b"content-type") == [b"text/html; charset=utf-8"]
    assert "<html" in html and "NOT_FOUND" in html and 'href="/nodes"' in html
    code, doc, _ = await call("GET", admin.url + "api/no/such")
    assert (code, doc) == (404, {"message": "NOT_FOUND"})


@pytest_twisted.ensureDeferred
async def test_unknown_channel_page_is_a_404_not_no_producers(admin, nsqds) -> None:
    """/topics/orders/nochannel used to answer 200 'No producers exist' though orders has producers."""
    await create_channel(nsqds[0], "orders", "archive")
    code, html, _ = await call("GET", admin.url + "topics/orders/nochannel")
    assert code == 404 and "CHANNEL_NOT_FOUND" in html and "No producers" not in html
    code, _, _ = await call("GET", admin.url + "topics/orders/archive")
    assert code == 200


@pytest_twisted.ensureDeferred
async def test_glyphs_and_charts_have_titles_and_labels(admin, nsqds) -> None:
    await create_channel(nsqds[0], "t", "c")
    code, html, _ = await call("GET", admin.url + "topics/t")
    assert code == 200
    assert (f'title="tombstone topic t on {nsqds[0].http_address}" '
            f'aria-label="tombstone topic t on {nsqds[0].http_address}"') in html
    import re
    svgs = re.findall(r"<svg[^>]*>.*?</svg>", html)
    assert svgs and all('aria-label="' in s and "<title>" in s for s in svgs), svgs


class _Silent(protocol.Protocol):
    """An 'nsqd' that accepts connections and never answers (hung)."""

    def connectionMade(self) -> None:
        self.factory.connected.append(self)

    def connectionLost(self, reason: Any = None) -> None:
        self.factory.lost.append(self)


@pytest_twisted.ensureDeferred
async def test_browser_going_away_is_one_log_line(start_admin) -> None:
    """A client that disconnects while nsqadmin waits for a hung nsqd: one log line, the upstream call
    is cancelled (the hung server sees its connection closed), no traceback or error is logged."""
    from twisted.internet import reactor

    factory = protocol.Factory.forProtocol(_Silent)
    factory.connected, factory.lost = [], []  # type: ignore[attr-defined]  # test-only attributes on the factory
    port = await TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(factory)
    events: list[dict[str, Any]] = []
    globalLogPublisher.addObserver(events.append)

    async def until(check: Any, what: str) -> None:
        deadline = reactor.seconds() + 10
        while not check():
            assert reactor.seconds() < deadline, what
            await task.deferLater(reactor, 0.02, lambda: None)

    try:
        admin = await start_admin(nsqd_http_addresses=[f"127.0.0.1:{port.getHost().port}"],
                                  http_client_request_timeout=30.0, history_interval=3600.0)
        await until(lambda: len(factory.connected) == 1, "the history poller's call")
        events.clear()
        client = await TCP4ClientEndpoint(reactor, "127.0.0.1", admin.http_port).connect(
            protocol.Factory.forProtocol(protocol.Protocol))
        client.transport.write(b"GET /topics HTTP/1.1\r\nHost: x\r\n\r\n")
        await until(lambda: len(factory.connected) == 2, "nsqadmin to ask the hung nsqd for the page")
        upstream = factory.connected[1]
        client.transport.loseConnection()
        await until(lambda: upstream in factory.lost, "the page's upstream call to be cancelled")
        texts = [e.get("log_format", "") for e in events]
        went = [e for e in events if "went away" in (e.get("log_format") or "")]
        assert len(went) == 1, texts
        bad = [e for e in events if e.get("log_failure") is not None or e.get("isError")
               or str(e.get("log_level", "")).endswith(("error", "critical"))]
        assert bad == [], bad
    finally:
        globalLogPublisher.removeObserver(events.append)
        await port.stopListening()


def _chan(node: str, depth: int, backend: int, msgs: int, in_flight: int = 0, timeouts: int = 0,
          clients: int = 1) -> Any:
    from nsqtw.admin.cluster import ChannelStats, TopicStats

    cs = ChannelStats(node=node, topic_name="t", channel_name="c", depth=depth, memory_depth=depth - backend,
                      backend_depth=backend, message_count=msgs, in_flight_count=in_flight,
                      timeout_count=timeouts, client_count=clients)
    return TopicStats(node=node, topic_name="t", message_count=msgs, channels=[cs])


def test_chart_series_rates_finish_and_gaps() -> None:
    """Publish rate from message counts; finish rate as the Spark job computes it (put minus the growth
    of what the channel holds); a sample where a node of the scope failed is a gap in every series."""
    h = History(10, 10.0)
    h.record(0, [_chan("a:1", 0, 0, 0)])
    h.record(10, [_chan("a:1", 50, 20, 100, in_flight=10)])   # 100 put, 60 more held: 4/s finished
    h.record(20, [], failed=["a:1"])
    h.record(30, [_chan("a:1", 0, 0, 150)])
    h.record(40, [_chan("a:1", 0, 0, 250, timeouts=5)])
    doc = h.charts(topic="t", channel="c")
    s = doc["series"]
    assert doc["timestamps"] == [0, 10, 20, 30, 40] and doc["gaps"] == [False, False, True, False, False]
    assert s["memory_depth"] == [0, 30, None, 0, 0] and s["backend_depth"] == [0, 20, None, 0, 0]
    assert s["publish_rate"] == [None, 10.0, None, None, 10.0]
    assert s["finish_rate"] == [None, 4.0, None, None, 10.0]
    assert s["timeout_rate"] == [None, 0.0, None, None, 0.5] and s["clients"] == [1, 1, None, 1, 1]
    assert h.charts(topic="t", channel="c", since=25)["timestamps"] == [30, 40]
    assert h.charts(node="a:1")["series"]["memory_depth"][1] == 30
    assert h.charts(topic="nope")["series"]["memory_depth"] == [None] * 5


def test_history_retention_thins_old_samples_and_bounds_memory() -> None:
    """Beyond the newest ``size`` samples, at most one per retention/720 s is kept, none older than
    the retention: a day of 1 s samples with a 1 h retention keeps 10 + at most 721."""
    from nsqtw.admin.history import COARSE_POINTS

    h = History(10, 1.0, retention=3600)
    for t in range(86_400):
        h.record(float(t), [])
    assert len(h.samples) == 10 and len(h.coarse) <= COARSE_POINTS + 1
    window = h.window()
    assert window[0].t >= 86_399 - 3600 - h.coarse_step and window[-1].t == 86_399
    assert all(b.t - a.t >= h.coarse_step for a, b in zip(h.coarse, list(h.coarse)[1:], strict=False))


@pytest_twisted.ensureDeferred
async def test_nsqd_mode_keeps_a_configured_node_that_never_answers(start_admin, nsqds) -> None:
    """With --nsqd-http-address, a configured nsqd that hangs is listed on /nodes as unreachable (never
    seen) and the counter says its sum is partial, instead of the node silently vanishing."""
    from twisted.internet import reactor

    factory = protocol.Factory.forProtocol(_Silent)
    factory.connected, factory.lost = [], []  # type: ignore[attr-defined]  # test-only attributes on the factory
    port = await TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(factory)
    hung = f"127.0.0.1:{port.getHost().port}"
    try:
        admin = await start_admin(nsqd_http_addresses=[nsqds[0].http_address, hung],
                                  http_client_request_timeout=0.5, history_interval=3600.0)
        code, doc, _ = await call("GET", admin.url + "api/nodes")
        assert code == 200 and doc["partial"] == {"answered": 1, "total": 2}
        by_status = {n["status"]: n for n in doc["nodes"]}
        assert by_status["unreachable"]["last_seen"] is None and "no answer within" in by_status["unreachable"]["error"]
        assert by_status["ok"]["uptime_seconds"] >= 0
        code, doc, _ = await call("GET", admin.url + "api/counter")
        assert code == 200 and doc["partial"] == {"answered": 1, "total": 2}
        code, html, _ = await call("GET", admin.url + "nodes")
        assert code == 200 and "unreachable since" in html and "last seen <span class=\"muted\">never</span>" in html
        assert 'class="live warn"' in html
    finally:
        for p in list(factory.connected):
            p.transport.abortConnection()
        await port.stopListening()
