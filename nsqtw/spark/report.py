"""
The one-page HTML report of ``nsqtw-stats --html``: inline SVG line charts, no JavaScript, no CDN.

:func:`line_chart` draws one chart from ``{series name: [(datetime, value)]}``;
:func:`render_report` lays out the charts and the summary table.  Plain
string building: the page must open from a file on an air-gapped laptop.
"""

from __future__ import annotations

import html
import math
from datetime import datetime, timezone
from typing import Any
from collections.abc import Sequence

__all__ = ["line_chart", "render_report", "nice_ticks", "utc_text"]

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf")

Point = tuple[datetime, float]


def utc_text(value: datetime | None) -> str:
    """A collected Spark timestamp (naive, local time) as UTC text."""
    if value is None:
        return "-"
    return datetime.fromtimestamp(value.timestamp(), timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2, 5 x 10^n steps) covering [lo, hi]."""
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(1, count)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks = [round(start, 10)]
    while ticks[-1] < hi - step * 1e-9:
        ticks.append(round(ticks[-1] + step, 10))
    return ticks


def _short(v: float) -> str:
    a = abs(v)
    if a >= 1e9:
        return f"{v / 1e9:g}G"
    if a >= 1e6:
        return f"{v / 1e6:g}M"
    if a >= 1e3:
        return f"{v / 1e3:g}k"
    return f"{v:g}"


def line_chart(title: str, series: dict[str, list[Point]], unit: str = "", width: int = 900,
               height: int = 280) -> str:
    """An SVG line chart; x is time (UTC), one coloured polyline and legend entry per series."""
    esc = html.escape
    points = [p for pts in series.values() for p in pts]
    head = f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height + 24 * ((len(series) + 3) // 4)}" ' \
           f'viewBox="0 0 {width} {height + 24 * ((len(series) + 3) // 4)}" role="img" aria-label="{esc(title)}">'
    parts = [head, f"<title>{esc(title)}</title>"]
    if not points:
        parts.append(f'<text x="{width // 2}" y="{height // 2}" text-anchor="middle" fill="#888">no data</text></svg>')
        return "".join(parts)
    left, right, top, bottom = 70, 20, 30, 40
    pw, ph = width - left - right, height - top - bottom
    xs = [p[0].timestamp() for p in points]
    x0, x1 = min(xs), max(xs)
    if x1 == x0:
        x1 = x0 + 60
    y_ticks = nice_ticks(min(0.0, min(p[1] for p in points)), max(p[1] for p in points))
    y0, y1 = y_ticks[0], y_ticks[-1]
    if y1 == y0:
        y1 = y0 + 1

    def sx(t: float) -> float:
        return left + (t - x0) / (x1 - x0) * pw

    def sy(v: float) -> float:
        return top + ph - (v - y0) / (y1 - y0) * ph

    parts.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="#fafafa" stroke="#ccc"/>')
    for v in y_ticks:
        y = sy(v)
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}" stroke="#e5e5e5"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end">{esc(_short(v))}</text>')
    for i in range(6):
        t = x0 + (x1 - x0) * i / 5
        x = sx(t)
        label = datetime.fromtimestamp(t, timezone.utc).strftime("%m-%d %H:%M" if x1 - x0 > 86400 else "%H:%M")
        parts.append(f'<line x1="{x:.1f}" y1="{top + ph}" x2="{x:.1f}" y2="{top + ph + 4}" stroke="#888"/>')
        parts.append(f'<text x="{x:.1f}" y="{top + ph + 17}" font-size="11" text-anchor="middle">{label}</text>')
    if unit:
        parts.append(f'<text x="14" y="{top + ph / 2:.0f}" font-size="11" transform="rotate(-90 14 '
                     f'{top + ph / 2:.0f})" text-anchor="middle">{esc(unit)}</text>')
    for i, (name, pts) in enumerate(series.items()):
        color = PALETTE[i % len(PALETTE)]
        if pts:
            coords = " ".join(f"{sx(t.timestamp()):.1f},{sy(v):.1f}" for t, v in sorted(pts))
            parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{coords}">'
                         f'<title>{esc(name)}</title></polyline>')
        lx = left + (i % 4) * (pw // 4)
        ly = height + 14 + 24 * (i // 4)
        parts.append(f'<rect x="{lx}" y="{ly - 9}" width="12" height="4" fill="{color}"/>'
                     f'<text x="{lx + 16}" y="{ly - 4}" font-size="11">{esc(name[:40])}</text>')
    parts.append("</svg>")
    return "".join(parts)


_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;color:#222}
h1{font-size:20px} h2{font-size:16px;margin-top:28px}
table{border-collapse:collapse;font-size:12px} th,td{padding:3px 8px;border-bottom:1px solid #eee}
th{background:#f3f3f3;text-align:left} td.n{text-align:right;font-variant-numeric:tabular-nums}
.note{color:#666;font-size:12px;max-width:900px}
"""


def render_report(summary_rows: Sequence[Any], series: dict[str, dict[str, list[Point]]], window: str,
                  span: tuple[datetime | None, datetime | None], total: int) -> str:
    """The whole page."""
    from .stats import SUMMARY_COLUMNS, summary_table

    esc = html.escape
    charts = [
        ("Publish rate by topic (all nodes)", "publish_rate", "msg/s"),
        ("Finish rate by channel (all nodes)", "finish_rate", "msg/s"),
        ("Channel depth, mean per window (all nodes)", "depth", "messages"),
        ("Topic depth, mean per window (all nodes)", "topic_depth", "messages"),
        ("Requeue rate by channel", "requeue_rate", "msg/s"),
        ("Timeout rate by channel", "timeout_rate", "msg/s"),
    ]
    body = [f"<h1>NSQ stats report</h1><p class='note'>{total} node/topic/channel series; "
            f"windows of {esc(window)}; {esc(utc_text(span[0]))} .. {esc(utc_text(span[1]))}. "
            "Finish rate = messages put to the channel minus the change of its backlog "
            "(depth + in flight + deferred).</p>"]
    for title, key, unit in charts:
        body.append(f"<h2>{esc(title)}</h2>")
        body.append(line_chart(title, series.get(key, {}), unit))
    body.append("<h2>Summary</h2><table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in SUMMARY_COLUMNS) + "</tr>")
    for line in summary_table(summary_rows):
        body.append("<tr>" + "".join(
            f"<td>{esc(c)}</td>" if i < 3 else f"<td class='n'>{esc(c)}</td>" for i, c in enumerate(line)) + "</tr>")
    body.append("</table>")
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>NSQ stats report</title>"
            f"<style>{_CSS}</style></head><body>" + "\n".join(body) + "</body></html>\n")
