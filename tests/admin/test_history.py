"""nsqadmin's own /stats history (what the graphs draw): the pure ring of samples, and the poller
running on a ``MemoryReactorClock`` against an in-memory fake nsqd (``StubTreq``)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import pytest_twisted

from klein import Klein
from treq.testing import StubTreq
from twisted.internet.testing import MemoryReactorClock

from nsqtw.admin.cluster import ChannelStats, TopicStats
from nsqtw.admin.history import History, last_value
from nsqtw.admin.options import AdminOptions
from nsqtw.admin.service import AdminService


def row(topic: str, node: str, depth: int, count: int, channels: dict[str, tuple] = None) -> TopicStats:
    """One node's topic row as aggregate_stats makes it; channels are name -> (depth, in_flight, count)."""
    chans = [ChannelStats(node=node, topic_name=topic, channel_name=name, depth=d, in_flight_count=f,
                          message_count=m, client_count=1)
             for name, (d, f, m) in (channels or {}).items()]
    return TopicStats(node=node, topic_name=topic, depth=depth, message_count=count, channels=chans)


def test_rates_are_per_second_and_summed_over_nodes() -> None:
    """Two nodes each adding messages over 5 s give the summed per-second rate; the first point has none."""
    h = History(size=10, interval=5.0)
    h.record(100.0, [row("t", "a:1", 0, 10), row("t", "b:1", 0, 0)])
    h.record(105.0, [row("t", "a:1", 5, 60), row("t", "b:1", 0, 25)])
    doc = h.overview()
    assert doc["timestamps"] == [100, 105] and doc["interval"] == 5.0
    assert doc["topics"]["t"]["message_count"] == [10, 85]
    assert doc["topics"]["t"]["depth"] == [0, 5]
    assert doc["topics"]["t"]["rate"] == [None, 15.0]
    topic = h.topic("t")
    assert topic["nodes"]["a:1"]["rate"] == [None, 10.0] and topic["nodes"]["b:1"]["rate"] == [None, 5.0]


def test_restart_and_missing_nodes_never_spike() -> None:
    """A node whose counter falls (restart) adds 0, and a node absent from a poll is left out of the rate."""
    h = History(size=10, interval=1.0)
    h.record(0.0, [row("t", "a", 0, 1000), row("t", "b", 0, 500)])
    h.record(1.0, [row("t", "a", 0, 3), row("t", "b", 0, 510)])      # a restarted
    h.record(2.0, [row("t", "b", 0, 520)])                             # a missed the poll
    h.record(3.0, [row("t", "a", 0, 13), row("t", "b", 0, 530)])      # a is back: no jump for it
    assert h.overview()["topics"]["t"]["rate"] == [None, 10.0, 10.0, 10.0]


def test_channels_series_and_gaps() -> None:
    """Channel series carry depth, in-flight and rate; a topic missing from a sample leaves None."""
    h = History(size=10, interval=1.0)
    h.record(0.0, [row("t", "a", 0, 0, {"c": (4, 1, 0)})])
    h.record(1.0, [])
    h.record(2.0, [row("t", "a", 0, 0, {"c": (2, 3, 7)})])
    h.record(3.0, [row("t", "a", 0, 0, {"c": (0, 0, 9)})])
    ch = h.channel("t", "c")
    assert ch["channel"]["depth"] == [4, None, 2, 0]
    assert ch["channel"]["in_flight_count"] == [1, None, 3, 0]
    assert ch["channel"]["rate"] == [None, None, None, 2.0]
    assert h.topic("t")["channels"]["c"]["message_count"] == [0, None, 7, 9]
    assert h.overview()["total"]["rate"] == [None, None, None, 2.0]
    assert last_value(ch["channel"]["depth"]) == 0 and last_value([1, None]) == 1 and last_value([]) is None


def test_ring_keeps_only_the_newest_samples() -> None:
    """Past ``--history-size`` samples the oldest are dropped."""
    h = History(size=3, interval=1.0)
    for t in range(5):
        h.record(float(t), [row("t", "a", t, t)])
    assert h.timestamps() == [2, 3, 4] and h.overview()["topics"]["t"]["depth"] == [2, 3, 4]


def test_overview_reports_channel_count_and_paused() -> None:
    """The topics page reads channel_count and paused from the newest sample."""
    h = History(size=3, interval=1.0)
    r = row("t", "a", 0, 0, {"x": (0, 0, 0), "y": (0, 0, 0)})
    r.paused = True
    h.record(0.0, [r])
    t = h.overview()["topics"]["t"]
    assert t["channel_count"] == 2 and t["paused"] is True


# --- the poller on a fake clock -----------------------------------------------------------------------------


class FakeNsqd:
    """An nsqd HTTP API whose topic message count the test sets between polls."""

    app = Klein()

    def __init__(self) -> None:
        self.count = 0
        self.stats_calls = 0

    @app.route("/info")
    def info(self, request: Any) -> bytes:
        return json.dumps({"version": "1.3.0", "broadcast_address": "fake", "hostname": "fake", "http_port": 4151,
                           "tcp_port": 4150}).encode()

    @app.route("/stats")
    def stats(self, request: Any) -> bytes:
        self.stats_calls += 1
        return json.dumps({"topics": [{"topic_name": "t", "depth": 3, "backend_depth": 0,
                                       "message_count": self.count, "channels": [
                                           {"channel_name": "c", "depth": 3, "message_count": self.count}]}]}).encode()


def test_poller_samples_every_interval_on_the_injected_clock() -> None:
    """The service polls at start and then every --history-interval of the clock; stopping stops it."""
    fake = FakeNsqd()
    reactor = MemoryReactorClock()
    reactor.advance(1000)
    opts = AdminOptions(nsqd_http_addresses=["fake:4151"], http_address="127.0.0.1:0", history_interval=5.0,
                        history_size=4)
    service = AdminService(opts, reactor, http_client=StubTreq(fake.app.resource()))
    service.startService()
    try:
        assert service.history.timestamps() == [1000]
        fake.count = 50
        reactor.advance(5)
        fake.count = 75
        reactor.advance(5)
        doc = service.history.overview()
        assert doc["timestamps"] == [1000, 1005, 1010]
        assert doc["topics"]["t"]["rate"] == [None, 10.0, 5.0]
        assert doc["topics"]["t"]["depth"] == [3, 3, 3] and doc["message"] == ""
        assert service.history.channel("t", "c")["channel"]["message_count"] == [0, 50, 75]
    finally:
        service.stopService()
    calls = fake.stats_calls
    reactor.advance(60)
    assert fake.stats_calls == calls and len(service.history.timestamps()) == 3


def test_poller_records_upstream_errors_as_message() -> None:
    """When no nsqd answers, the sample added is a gap (no topics: nothing frozen as current) and the
    history's message says why."""
    reactor = MemoryReactorClock()
    opts = AdminOptions(nsqd_http_addresses=["fake:4151"], http_address="127.0.0.1:0")
    broken = Klein()

    @broken.route("/<path:rest>")
    def fail(request: Any, rest: str) -> bytes:
        request.setResponseCode(500)
        return b"boom"

    service = AdminService(opts, reactor, http_client=StubTreq(broken.resource()))
    service.startService()
    try:
        assert service.history.timestamps() == [0] and service.history.samples[-1].topics == {}
        assert service.history.overview()["message"].startswith("UPSTREAM_ERROR: failed to query any nsqd: ")
    finally:
        service.stopService()


# --- --history-path: the history survives a restart of nsqadmin (issue 27) ------------------------


@pytest_twisted.ensureDeferred
async def test_history_path_keeps_the_charts_across_a_restart(nsqds, start_admin, tmp_path) -> None:
    import json as _json

    from admin_helpers import call, create_channel, publish

    await create_channel(nsqds[0], "kept", "c")
    await publish(nsqds[0], "kept", [b"k"] * 42)
    first = await start_admin(nsqd_http_addresses=[n.http_address for n in nsqds], history_interval=3600.0,
                              history_path=str(tmp_path))
    for _ in range(3):
        await first.poll()
    before = first._history.charts(topic="kept", channel="c")
    assert before["series"]["memory_depth"][-1] == 42
    await first.stop()  # writes the file (off the reactor) before it is done
    saved = _json.loads((tmp_path / "nsqadmin.history.json").read_text())
    assert saved["format"] == 1 and len(saved["samples"]) == len(before["timestamps"]) >= 3

    again = await start_admin(nsqd_http_addresses=[n.http_address for n in nsqds], history_interval=3600.0,
                              history_path=str(tmp_path))
    after = again._history.charts(topic="kept", channel="c")
    assert after["timestamps"] == before["timestamps"]
    assert after["series"]["memory_depth"] == before["series"]["memory_depth"]
    code, doc, _ = await call("GET", again.url + "api/charts/topics/kept/c?range=3600")
    assert code == 200 and doc["series"]["memory_depth"][-1] == 42
    assert again._history.overview()["topics"]["kept"]["depth"][-1] == 0  # the topic's own queue: all in c


@pytest_twisted.ensureDeferred
async def test_history_path_must_be_a_directory(nsqds, start_admin, tmp_path) -> None:
    from nsqtw.options import OptionError

    with pytest.raises(OptionError, match="--history-path .*: not a directory"):
        await start_admin(nsqd_http_addresses=[nsqds[0].http_address], history_path=str(tmp_path / "missing"))
    # an unreadable file is not fatal: nsqadmin starts with an empty history and says so
    (tmp_path / "nsqadmin.history.json").write_text("{not json")
    admin = await start_admin(nsqd_http_addresses=[nsqds[0].http_address], history_path=str(tmp_path),
                              history_interval=3600.0)
    assert admin._history.timestamps() == [] or len(admin._history.timestamps()) <= 1


def test_a_node_silent_for_longer_than_the_range_still_makes_its_polls_gaps() -> None:
    """Node b held the topic, then stopped answering: the 5-minute range (``since``) shows its
    failed polls as gaps, as the longer range does, not the other node's sum alone."""
    h = History(size=200, interval=10.0)
    for t in range(0, 100, 10):
        h.record(float(t), [row("t", "a", 1, t), row("t", "b", 2, t)])
    for t in range(100, 500, 10):  # b hung: its polls fail for 400 s
        h.record(float(t), [row("t", "a", 1, t)], failed=["b"])
    whole = h.charts(topic="t")
    recent = h.charts(topic="t", since=500 - 300)
    assert whole["gaps"][-30:] == recent["gaps"] == [True] * 30
    assert recent["series"]["memory_depth"] == [None] * 30
    assert recent["created"] == whole["created"] == 0
