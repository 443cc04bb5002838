"""nsqtw-stats' accounting on a small synthetic snapshot set, against values computed by hand.

Node A (snapshots every 10 s, t = 0..150):
  * topic ``t`` and channel ``healthy``: a steady 500 msg/s, depth 0, 7 messages always in flight;
  * topic ``t2``: 20 msg/s with no channel, so its depth grows, until channel ``late`` is created at
    t = 73 and takes over the topic's backlog (1,460 messages, counted in the channel's
    message_count); the channel's consumer finishes 30/s: backlog 1,390 at t = 80, then -10/s.
Node B (topic ``tb``, 10 msg/s): snapshots t = 0..50, a restart at t = 58 (start_time), then
  snapshots t = 64..114 with counters from zero.
Node C (topic ``tc``): snapshots t = 0..50, then none until t = 190 (a gap over windows 60 and 120).
"""

from __future__ import annotations

import io

import pytest

from spark_data import channel, line, topic

pytestmark = pytest.mark.spark

# without pyspark every test here is skipped, saying why (not failed at its first import)
pytest.importorskip("pyspark", reason="the Spark tests need the nsqtw[spark] extra (pyspark, pyarrow; make test installs it)")


T0 = 1_700_000_040  # a minute boundary
START = T0 - 1000
A = "a.acc:4151"
B = "b.acc:4151"
C = "c.acc:4151"


def _node_a() -> list[bytes]:
    out = []
    for s in range(0, 151, 10):
        healthy = channel("healthy", msgs=500 * s, depth=0, in_flight=7, clients=2)
        t = topic("t", msgs=500 * s, channels=[healthy])
        if s < 73:
            t2 = topic("t2", msgs=20 * s, depth=20 * s)
        else:
            backlog = 1390 - 10 * (s - 80)
            late = channel("late", msgs=1600 + 20 * (s - 80), depth=backlog - 5, in_flight=5, clients=1)
            t2 = topic("t2", msgs=20 * s, depth=0, channels=[late])
        out.append(line(T0 + s, "a.acc", 4151, START, [t, t2]))
    return out


def _node_b() -> list[bytes]:
    out = [line(T0 + s, "b.acc", 4151, START, [topic("tb", msgs=10 * s)]) for s in range(0, 51, 10)]
    out += [line(T0 + s, "b.acc", 4151, T0 + 58, [topic("tb", msgs=10 * (s - 58))]) for s in range(64, 115, 10)]
    return out


def _node_c() -> list[bytes]:
    return [line(T0 + s, "c.acc", 4151, START, [topic("tc", msgs=s)]) for s in [*range(0, 51, 10), 190, 200]]


@pytest.fixture(scope="module")
def snapshot_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("acc")
    (d / "nsqd-stats.2023-11-14_22.a_acc_4151.jsonl").write_bytes(b"".join(_node_a()))
    (d / "nsqd-stats.2023-11-14_22.b_acc_4151.jsonl").write_bytes(b"".join(_node_b()))
    (d / "nsqd-stats.2023-11-14_22.c_acc_4151.jsonl").write_bytes(b"".join(_node_c()))
    return d


@pytest.fixture(scope="module")
def rows(spark, snapshot_dir):
    from nsqtw.spark.stats import compute_stats, read_snapshots

    out = {}
    for r in compute_stats(read_snapshots(spark, [str(snapshot_dir)]), window=60.0).collect():
        out[(r["node"], r["topic"], r["channel"], int(r["window_start"].timestamp()) - T0)] = r.asDict()
    return out


def approx(v):
    return pytest.approx(v, rel=1e-9, abs=1e-9)


def test_healthy_channel_keeps_up(rows) -> None:
    """Depth 0, 7 in flight, no growth: "keeping up", drain time = in-flight backlog / finish rate."""
    for k in (0, 60, 120):
        r = rows[(A, "t", "healthy", k)]
        assert r["finish_rate"] == approx(500.0) and r["backlog_growth_rate"] == approx(0)
        assert r["drain_state"] == "keeping up" and r["time_to_drain_s"] == approx(7 / 500)
    assert rows[(A, "t", None, 0)]["drain_state"] == "empty"


def test_growing_and_draining(rows) -> None:
    """A growing backlog never drains at its rates (null); a shrinking one drains in backlog / shrink rate."""
    t2 = rows[(A, "t2", None, 0)]
    assert t2["drain_state"] == "growing" and t2["time_to_drain_s"] is None
    assert rows[(A, "t2", None, 60)]["drain_state"] == "empty"
    late = rows[(A, "t2", "late", 120)]
    assert late["backlog_last"] == 690 and late["backlog_growth_rate"] == approx(-10.0)
    assert late["drain_state"] == "draining" and late["time_to_drain_s"] == approx(69.0)


def test_last_partial_window_rated_over_observed_time(rows) -> None:
    """Window 120 holds snapshots 120..150 only: 30 s observed, a steady 500/s stays 500/s."""
    r = rows[(A, "t", "healthy", 120)]
    assert r["covered_s"] == approx(30) and r["published"] == approx(15000)
    assert r["publish_rate"] == approx(500.0)
    assert rows[(A, "t", None, 120)]["publish_rate"] == approx(500.0)


def test_new_channel_first_interval_and_taken_over_backlog(rows) -> None:
    """Channel ``late`` first appears at t = 80: its first interval (70, 80] counts, and the 1,460
    messages it took over from the topic at creation are arrivals (in message_count), not only
    finishes: window 60 publishes 1,600 + 4 x 200 over 50 s and finishes 210 + 4 x 300."""
    r = rows[(A, "t2", "late", 60)]
    assert r["covered_s"] == approx(50)
    assert r["published"] == approx(2400) and r["publish_rate"] == approx(48.0)
    assert r["finished"] == approx(1410) and r["finish_rate"] == approx(28.2)
    assert r["backlog_growth_rate"] == approx(19.8) and r["drain_state"] == "growing"
    assert r["restarts"] == 0


def test_restart_counted_in_the_window_of_its_start_time(rows) -> None:
    """start_time T0+58 is in window 0, the first snapshot after it (T0+64) in window 60."""
    w0, w1 = rows[(B, "tb", None, 0)], rows[(B, "tb", None, 60)]
    assert w0["restarts"] == 1 and w1["restarts"] == 0
    assert w0["covered_s"] == approx(52) and w0["published"] == approx(520) and w0["publish_rate"] == approx(10)
    assert w1["covered_s"] == approx(54) and w1["published"] == approx(540) and w1["publish_rate"] == approx(10)


def test_summary_says_keeping_up_not_never(spark, snapshot_dir) -> None:
    """The printed summary: "keeping up" for the healthy channel, a time for the draining one."""
    from nsqtw.spark.stats import build_parser, run

    buf = io.StringIO()
    run(build_parser().parse_args([str(snapshot_dir), "-o", "", "--quiet"]), spark=spark, out=buf)
    lines = buf.getvalue().splitlines()
    healthy = [ln for ln in lines if " healthy " in ln][0]
    late = [ln for ln in lines if " late " in ln][0]
    assert "keeping up" in healthy and "never" not in healthy
    assert "1m09s" in late
    assert "never" not in buf.getvalue()


def test_report_marks_restarts_and_gaps(spark, snapshot_dir, tmp_path) -> None:
    """chart_marks: node B's restart in window 0; node C's windows 60 and 120 without a snapshot; both drawn."""
    from datetime import datetime, timezone

    from nsqtw.spark.stats import build_parser, chart_marks, compute_stats, read_snapshots, run

    result = compute_stats(read_snapshots(spark, [str(snapshot_dir)]), window=60.0)
    marks = chart_marks(result)

    def ts(v):
        return int(v.timestamp()) - T0

    assert [(ts(t), n) for t, n in marks["restarts"]] == [(0, B)]
    assert [(ts(a), ts(b), n) for a, b, n in marks["gaps"]] == [(60, 180, C)]
    report = tmp_path / "r.html"
    run(build_parser().parse_args([str(snapshot_dir), "-o", "", "--quiet", "--html", str(report)]), spark=spark,
        out=io.StringIO())
    page = report.read_text()
    assert 'class="restart"' in page and 'class="gap"' in page and "no snapshots from c.acc:4151" in page
    assert datetime.fromtimestamp(T0, timezone.utc).strftime("%H:%M") in page


def test_a_backlog_nothing_finishes_is_no_consumer_or_stalled_not_keeping_up(spark, tmp_path) -> None:
    """Channel ``orphan`` holds 1,720 messages with no client and finishes nothing: "no consumer";
    ``stuck`` has two clients that finish nothing: "stalled"; topic ``parked`` holds messages no
    channel takes: "stalled".  None of them drains (no drain time), and the printed summary says so."""
    from nsqtw.spark.stats import build_parser, compute_stats, read_snapshots, run

    lines = []
    for s in range(0, 61, 10):
        orphan = channel("orphan", msgs=1720, depth=1720)
        stuck = channel("stuck", msgs=1720, depth=1700, in_flight=20, clients=2)
        lines.append(line(T0 + s, "d.acc", 4151, START, [topic("held", msgs=1720, channels=[orphan, stuck]),
                                                         topic("parked", msgs=300, depth=300)]))
    (tmp_path / "nsqd-stats.2023-11-14_22.d_acc_4151.jsonl").write_bytes(b"".join(lines))
    got = {(r["topic"], r["channel"]): r for r in
           compute_stats(read_snapshots(spark, [str(tmp_path)]), window=60.0).collect()
           if int(r["window_start"].timestamp()) == T0}
    assert got[("held", "orphan")]["drain_state"] == "no consumer"
    assert got[("held", "stuck")]["drain_state"] == "stalled"
    assert got[("parked", None)]["drain_state"] == "stalled"
    assert all(r["time_to_drain_s"] is None for r in got.values() if r["drain_state"] != "empty")
    buf = io.StringIO()
    run(build_parser().parse_args([str(tmp_path), "-o", "", "--quiet"]), spark=spark, out=buf)
    printed = buf.getvalue()
    assert "keeping up" not in printed
    assert "no consumer" in [ln for ln in printed.splitlines() if " orphan " in ln][0]
