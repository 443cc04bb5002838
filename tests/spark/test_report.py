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
