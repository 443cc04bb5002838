"""nsqtw-stats on a real local Spark: rates across resets, gaps and nodes equal hand-computed values."""

from __future__ import annotations

import io
import os

import pytest

from spark_data import channel, line, topic

pytestmark = pytest.mark.spark

# without pyspark every test here is skipped, saying why (not failed at its first import)
pytest.importorskip("pyspark", reason="the Spark tests need the nsqtw[spark] extra (pyspark, pyarrow; make test installs it)")


T0 = 1_700_000_040  # a minute boundary (2023-11-14T22:14:00Z)
START_A = T0 - 1000


def _counter(t: float) -> int:
    """Node A's channel message_count: 2/s until t=100, then 8/s (the broker restarts at t=185)."""
    return 2 * t if t <= 100 else 200 + 8 * (t - 100)


def _depth(t: float) -> int:
    return {60: 10, 150: 100, 160: 110, 170: 120, 180: 130, 190: 130, 200: 120, 210: 110, 220: 100,
            230: 90, 240: 80}.get(t, 10)


def _node_a_lines() -> list:
    out = []
    times = [0, 10, 20, 30, 40, 50, 60, 150, 160, 170, 180, 190, 200, 210, 220, 230, 240]
    for t in times:
        if t < 185:
            start, msgs, req, tmo, clients = START_A, _counter(t), 3, (1 if t >= 170 else 0), 3
        else:  # restarted at T0+185: counters start again from zero, 4/s
            start, msgs, req, tmo, clients = T0 + 185, 4 * (t - 185), 0, 0, 1
        ch = channel("c", msgs=msgs, depth=_depth(t), in_flight=2, req=req, tmo=tmo, clients=clients,
                     pct={0.99: 5e6 + t * 1e3, 0.5: 1e6})
        tp = topic("orders", msgs=msgs, nbytes=10 * msgs, channels=[ch])
        out.append(line(T0 + t, "a.example", 4151, start, [tp]))
    return out


def _node_b_lines() -> list:
    """Node B: topic deleted and re-created between t=10 and t=20 (same start_time); a duplicated line."""
    out = []
    for t, msgs in ((0, 100), (10, 150), (10, 150), (20, 5), (30, 25)):
        out.append(line(T0 + t, "b.example", 4151, START_A, [topic("orders", msgs=msgs, nbytes=msgs)]))
    return out


@pytest.fixture(scope="module")
def snapshot_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("snapshots")
    a = _node_a_lines()
    (d / "nsqd-stats.2023-11-14_22.a_example_4151.jsonl").write_bytes(b"".join(a[:12]))
    # the next hour's file of node A, with a torn last line as a reader may see mid-write
    (d / "nsqd-stats.2023-11-14_23.a_example_4151.jsonl").write_bytes(b"".join(a[12:]) + b'{"timestamp":17')
    (d / "nsqd-stats.2023-11-14_22.b_example_4151.jsonl").write_bytes(b"".join(_node_b_lines()))
    (d / "README.txt").write_text("not a snapshot")
    return d


@pytest.fixture(scope="module")
def rows(spark, snapshot_dir):
    from nsqtw.spark.stats import compute_stats, read_snapshots

    df = compute_stats(read_snapshots(spark, [str(snapshot_dir)]), window=60.0)
    out = {}
    for r in df.collect():
        k = int(r["window_start"].timestamp()) - T0
        out[(r["node"], r["channel"], k)] = r.asDict()
    return out


def approx(v):
    return pytest.approx(v, rel=1e-9, abs=1e-9)


def test_steady_window(rows) -> None:
    """Window 0: publish 2/s, finish 2/s, no requeues, depth 10, e2e p99 is the window's worst."""
    r = rows[("a.example:4151", "c", 0)]
    assert r["samples"] == 6 and r["covered_s"] == approx(60)
    assert r["published"] == approx(120) and r["publish_rate"] == approx(2.0)
    assert r["finish_rate"] == approx(2.0) and r["requeue_rate"] == approx(0) and r["timeout_rate"] == approx(0)
    assert r["depth_max"] == 10 and r["depth_mean"] == approx(10) and r["backlog_last"] == 12
    assert r["backlog_growth_rate"] == approx(0)
    # a steady backlog keeps up: its drain time is the backlog over the finish rate, not "never"
    assert r["drain_state"] == "keeping up" and r["time_to_drain_s"] == approx(12 / 2.0)
    assert r["e2e_ms"] == {"0.99": approx(5.05), "0.5": approx(1.0)}
    assert r["clients_max"] == 3 and r["level"] == "channel" and r["hostname"] == "a.example.local"
    assert r["date"].isoformat() == "2023-11-14"


def test_gap_is_spread_over_the_windows_it_covers(rows) -> None:
    """The 90 s gap (60..150] is spread 60/90 into window 1 and 30/90 into window 2."""
    w1 = rows[("a.example:4151", "c", 60)]
    assert w1["samples"] == 1 and w1["covered_s"] == approx(60)
    assert w1["published"] == approx(320) and w1["publish_rate"] == approx(320 / 60)
    assert w1["finished"] == approx(260) and w1["finish_rate"] == approx(260 / 60)
    assert w1["backlog_growth_rate"] == approx(1.0)
    w2 = rows[("a.example:4151", "c", 120)]
    assert w2["samples"] == 3 and w2["covered_s"] == approx(60)
    assert w2["published"] == approx(400) and w2["finish_rate"] == approx(340 / 60)
    assert w2["depth_max"] == 120 and w2["depth_mean"] == approx(110) and w2["backlog_last"] == 122
    assert w2["timed_out"] == approx(1) and w2["timeout_rate"] == approx(1 / 60)
    assert w2["requeued"] == approx(0)


def test_restart_resets_counters(rows) -> None:
    """The restart at 185 s: deltas restart from zero and only 185..240 counts; drain time estimated."""
    r = rows[("a.example:4151", "c", 180)]
    assert r["restarts"] == 1
    assert r["covered_s"] == approx(55)
    assert r["published"] == approx(220) and r["publish_rate"] == approx(4.0)
    assert r["finished"] == approx(270) and r["finish_rate"] == approx(270 / 55)
    assert r["requeued"] == approx(0) and r["timed_out"] == approx(0)
    assert r["depth_max"] == 130 and r["depth_mean"] == approx(680 / 6) and r["backlog_last"] == 92
    assert r["backlog_growth_rate"] == approx(-50 / 55)
    assert r["time_to_drain_s"] == approx(92 / (50 / 55))
    assert r["clients_max"] == 3 and r["clients_mean"] == approx(8 / 6)
    last = rows[("a.example:4151", "c", 240)]
    assert last["samples"] == 1 and last["covered_s"] == 0 and last["publish_rate"] is None


def test_topic_rows(rows) -> None:
    """Topic-level rows (channel null) carry publish and byte rates and no finish rate."""
    r = rows[("a.example:4151", None, 180)]
    assert r["level"] == "topic" and r["publish_rate"] == approx(4.0)
    assert r["publish_bytes_rate"] == approx(40.0) and r["finish_rate"] is None


def test_counter_decrease_without_restart_and_duplicates(rows) -> None:
    """Node B's topic re-created (counter 150 -> 5): delta 5, not -145; its duplicated line counts once."""
    r = rows[("b.example:4151", None, 0)]
    assert r["samples"] == 4
    assert r["restarts"] == 1
    assert r["published"] == approx(50 + 5 + 20) and r["publish_rate"] == approx(75 / 30)
    assert ("b.example:4151", "c", 0) not in rows


def test_cli_writes_parquet_by_date_summary_and_html(spark, snapshot_dir, tmp_path) -> None:
    """The CLI job writes date-partitioned Parquet, prints the table and an SVG-only HTML report."""
    from nsqtw.spark.stats import build_parser, run

    out_dir = tmp_path / "out.parquet"
    report = tmp_path / "report.html"
    # the fixture's torn last line is rejected: accepted here with --max-bad-records 1
    args = build_parser().parse_args([str(snapshot_dir), "-o", str(out_dir), "--html", str(report),
                                      "--max-bad-records", "1"])
    buf, err = io.StringIO(), io.StringIO()
    res = run(args, spark=spark, out=buf, err=err)
    assert res["series"] == 3 and res["rejected_lines"] == 1 and res["first_rejected_line"] == 6
    assert "nsqtw-stats: warning: 1 of 23 input lines rejected (first: " in err.getvalue()
    assert sorted(os.listdir(out_dir))[-1] == "date=2023-11-14" and "_rejected" in os.listdir(out_dir)
    rejected = spark.read.json(str(out_dir / "_rejected")).collect()
    assert [r["value"] for r in rejected] == ['{"timestamp":17']
    back = spark.read.parquet(str(out_dir))
    assert back.where("node = 'a.example:4151' AND channel = 'c'").count() == 5
    text = buf.getvalue()
    assert "a.example:4151" in text and "(topic)" in text and "pub/s" in text
    # channel c overall: published 120+320+400+220 over 235 s covered
    c_line = [ln for ln in text.splitlines() if ln.startswith("a.example:4151") and " c " in ln][0]
    assert f"{(120 + 320 + 400 + 220) / 235:,.2f}" in c_line
    page = report.read_text()
    assert page.count("<svg") == 6 and "<script" not in page and "http://www.w3.org/2000/svg" in page
    assert "<polyline" in page and "orders/c" in page


def test_csv_and_json_outputs_and_summary_json(spark, snapshot_dir, tmp_path) -> None:
    """--format csv|json write the same table (CSV: a header, e2e_ms as JSON); --summary-json holds the
    run's figures and every series' row for a scheduler."""
    import json

    from nsqtw.spark.stats import build_parser, run

    for fmt in ("csv", "json"):
        out_dir = tmp_path / f"out.{fmt}"
        summary = tmp_path / f"summary-{fmt}.json"
        args = build_parser().parse_args([str(snapshot_dir), "-o", str(out_dir), "--format", fmt, "--quiet",
                                          "--max-bad-records", "1", "--summary-json", str(summary)])
        res = run(args, spark=spark, out=io.StringIO(), err=io.StringIO())
        reader = spark.read.option("header", "true") if fmt == "csv" else spark.read
        back = getattr(reader, fmt)(str(out_dir))
        assert back.count() == res["rows_written"] > 0
        assert back.where("node = 'a.example:4151' AND channel = 'c'").count() == 5
        doc = json.loads(summary.read_text())
        assert doc["series_count"] == 3 and doc["rejected_lines"] == 1 and doc["first_rejected_line"] == 6
        assert doc["format"] == fmt and doc["rows_written"] == res["rows_written"]
        assert {s["topic"] for s in doc["series"]} == {"orders"} and len(doc["series"]) == 3
        assert doc["first"].endswith("Z") and "T" in doc["first"]
