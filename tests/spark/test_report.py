"""The HTML report's SVG charts: axes cover the data, lines stay inside the plot, no scripts."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

from nsqtw.spark.report import line_chart, nice_ticks


def test_ticks_cover_the_data() -> None:
    """The top tick is at or above the largest value; steps are 1, 2 or 5 times a power of ten."""
    assert nice_ticks(0, 4200) == [0, 1000, 2000, 3000, 4000, 5000]
    assert nice_ticks(0, 200) == [0, 50, 100, 150, 200]
    assert nice_ticks(0, 0.03)[-1] >= 0.03


def test_line_chart_points_inside_plot() -> None:
    """Every polyline point lies inside the plot rectangle; the legend names every series."""
    t0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
    series = {"orders/c": [(t0 + timedelta(minutes=i), float(i * i)) for i in range(30)],
              "<evil>": [(t0 + timedelta(minutes=i), 5.0) for i in range(30)]}
    svg = line_chart("rates", series, "msg/s", width=600, height=250)
    assert svg.startswith("<svg") and svg.endswith("</svg>") and "<script" not in svg
    assert "&lt;evil&gt;" in svg and "orders/c" in svg
    left, top, width, height = 70, 30, 600 - 70 - 20, 250 - 30 - 40
    for pts in re.findall(r'points="([^"]+)"', svg):
        for pair in pts.split():
            x, y = map(float, pair.split(","))
            assert left - 0.1 <= x <= left + width + 0.1 and top - 0.1 <= y <= top + height + 0.1
    assert "no data" in line_chart("empty", {}, "")


def _labels(svg: str) -> list[str]:
    return re.findall(r'text-anchor="middle">([^<]+)</text>', svg)


def test_time_axis_ticks_on_round_distinct_times() -> None:
    """A short span gets second ticks (no repeated 13:17 labels); a long one whole half hours, not 00:47."""
    from nsqtw.spark.report import time_ticks

    t0 = datetime(2024, 1, 1, 13, 17, 5, tzinfo=timezone.utc)
    short = {"s": [(t0 + timedelta(seconds=s), 1.0) for s in range(0, 156, 5)]}
    labels = _labels(line_chart("x", short))
    assert labels and len(labels) == len(set(labels)), labels
    assert all(lb.endswith(("00", "30")) for lb in labels), labels
    t1 = datetime(2024, 1, 1, 0, 47, 13, tzinfo=timezone.utc)
    long = {"s": [(t1 + timedelta(minutes=m), 1.0) for m in range(0, 168)]}
    labels = _labels(line_chart("x", long))
    assert labels == ["01:00", "01:30", "02:00", "02:30", "03:00", "03:30"], labels
    for lo, hi in ((0, 59), (100, 7300), (1_700_000_000, 1_700_000_000 + 3 * 86400)):
        ticks = time_ticks(lo, hi)
        steps = {round(b - a, 6) for a, b in zip(ticks[:-1], ticks[1:], strict=True)}
        assert len(steps) == 1 and all(t % next(iter(steps)) == 0 for t in ticks) and lo <= ticks[0] <= ticks[-1] <= hi
    days = {"s": [(t1 + timedelta(hours=h), 1.0) for h in range(0, 80)]}
    labels = _labels(line_chart("x", days))
    assert len(labels) == len(set(labels)) and all("-" in lb for lb in labels)


def test_gaps_and_restarts_marked() -> None:
    t0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
    series = {"a": [(t0 + timedelta(minutes=i), 1.0) for i in range(60)]}
    marks = {"gaps": [(t0 + timedelta(minutes=10), t0 + timedelta(minutes=15), "n1:4151")],
             "restarts": [(t0 + timedelta(minutes=30), "n2:4151")]}
    svg = line_chart("x", series, marks=marks)
    assert svg.count('class="gap"') == 1 and "no snapshots from n1:4151" in svg
    assert svg.count('class="restart"') == 1 and "restart (counters reset) of n2:4151" in svg
    assert 'class="gap"' not in line_chart("x", series)


def test_a_series_keeps_its_colour_across_charts() -> None:
    """A channel drawn in several charts has one colour in all of them, whatever else each chart holds."""
    from datetime import datetime, timezone

    from nsqtw.spark.report import render_report

    t = datetime(2024, 1, 1, tzinfo=timezone.utc)
    pts = [(t, 1.0)]
    series = {"finish_rate": {"a/c1": pts, "b/c2": pts}, "depth": {"b/c2": pts}, "requeue_rate": {"x/y": pts, "b/c2": pts}}
    page = render_report([], series, "1m", (t, t), 0)
    import re
    colours = set(re.findall(r'<polyline fill="none" stroke="(#[0-9a-f]+)"[^>]*><title>b/c2</title>', page))
    assert len(colours) == 1
    assert len(set(re.findall(r'stroke="(#[0-9a-f]+)"[^>]*><title>(?:a/c1|b/c2|x/y)</title>', page))) == 3


def test_summary_says_a_growing_backlog_grows_and_when() -> None:
    from datetime import datetime, timezone

    from nsqtw.spark.report import drain_text, format_summary

    assert drain_text("growing", None, 12.5) == "never (+12.50/s)" and drain_text("growing", None) == "never"
    row = {"node": "n", "topic": "t", "channel": "c", "publish_rate": 20.0, "finish_rate": 7.5, "requeued": 0,
           "timed_out": 0, "depth_max": 100, "backlog_last": 100, "drain_state": "growing", "time_to_drain_s": None,
           "backlog_growth_rate": 12.5, "drain_window_start": datetime(2024, 1, 1, 10, 5, tzinfo=timezone.utc),
           "clients_max": 1, "e2e_p99_ms": None, "restarts": 0}
    text = format_summary([row])
    assert "never (+12.50/s)" in text and "01-01 10:05Z" in text and "drain at" in text
