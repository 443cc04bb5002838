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
from collections.abc import Mapping, Sequence

__all__ = ["line_chart", "render_report", "nice_ticks", "utc_text", "SUMMARY_COLUMNS", "summary_table",
           "format_summary", "drain_text", "series_colors"]

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


def _ts(value: datetime | float) -> float:
    return value.timestamp() if isinstance(value, datetime) else float(value)


#: Tick steps for the time axis (seconds): round minutes, hours and days.
TIME_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200,
              86400, 2 * 86400, 7 * 86400, 14 * 86400, 28 * 86400)


def time_ticks(x0: float, x1: float, count: int = 6) -> list[float]:
    """Tick times (unix seconds) on round UTC times (whole minutes, hours, days) inside [x0, x1]."""
    span = max(x1 - x0, 1.0)
    step = next((s for s in TIME_STEPS if span / s <= count), TIME_STEPS[-1])
    first = math.ceil(x0 / step - 1e-9) * step
    ticks = []
    t = float(first)
    while t <= x1 + 1e-6:
        ticks.append(t)
        t += step
    return ticks


def time_label(t: float, span: float) -> str:
    """A tick label: seconds only when the axis is that short, the date when it spans days."""
    fmt = "%H:%M:%S" if span < 600 else ("%m-%d %H:%M" if span > 86400 else "%H:%M")
    return datetime.fromtimestamp(t, timezone.utc).strftime(fmt)


def line_chart(title: str, series: dict[str, list[Point]], unit: str = "", width: int = 900,
               height: int = 280, marks: Mapping[str, Sequence[Any]] | None = None,
               colors: Mapping[str, str] | None = None) -> str:
    """An SVG line chart; x is time (UTC), one coloured polyline and legend entry per series.

    ``marks``: ``restarts`` [(time, node)] drawn as dashed red lines, ``gaps`` [(start, end, node)]
    as grey bands (no snapshots there).  ``colors``: a series' colour, so that it keeps it across
    charts (by default the palette in order)."""
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
    for t in time_ticks(x0, x1):
        x = sx(t)
        label = time_label(t, x1 - x0)
        parts.append(f'<line x1="{x:.1f}" y1="{top + ph}" x2="{x:.1f}" y2="{top + ph + 4}" stroke="#888"/>')
        parts.append(f'<text x="{x:.1f}" y="{top + ph + 17}" font-size="11" text-anchor="middle">{label}</text>')
    for start, end, node in (marks or {}).get("gaps", ()):
        a, b = max(x0, _ts(start)), min(x1, _ts(end))
        if b > a:
            parts.append(f'<rect class="gap" x="{sx(a):.1f}" y="{top}" width="{sx(b) - sx(a):.1f}" height="{ph}" '
                         f'fill="#bbb" fill-opacity="0.35"><title>no snapshots from {esc(str(node))}: '
                         f'{esc(utc_text(start))} .. {esc(utc_text(end))}</title></rect>')
    for when, node in (marks or {}).get("restarts", ()):
        t = _ts(when)
        if x0 <= t <= x1:
            parts.append(f'<line class="restart" x1="{sx(t):.1f}" y1="{top}" x2="{sx(t):.1f}" y2="{top + ph}" '
                         f'stroke="#d62728" stroke-dasharray="4 3"><title>restart (counters reset) of '
                         f'{esc(str(node))} in the window from {esc(utc_text(when))}</title></line>')
    if unit:
        parts.append(f'<text x="14" y="{top + ph / 2:.0f}" font-size="11" transform="rotate(-90 14 '
                     f'{top + ph / 2:.0f})" text-anchor="middle">{esc(unit)}</text>')
    for i, (name, pts) in enumerate(series.items()):
        color = (colors or {}).get(name) or PALETTE[i % len(PALETTE)]
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


# --- the summary table (printed by nsqtw-stats and repeated in the report) ---------------------------

def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:,.{digits}f}"
    return f"{value:,}"


def _fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def drain_text(state: str | None, seconds: float | None, growth: float | None = None) -> str:
    """The "drain in" cell: a time while draining, "keeping up", "no consumer" or "stalled" for a
    backlog nothing finishes, "never" only for a growing backlog (with its growth rate, messages/s,
    when known)."""
    if state == "empty":
        return "0s"
    if state == "draining":
        return _fmt_duration(seconds)
    if state in ("keeping up", "no consumer", "stalled"):
        return state
    if state == "growing":
        return f"never (+{_fmt(float(growth))}/s)" if growth is not None else "never"
    return "-"


def _short_time(value: datetime | None) -> str:
    if value is None:
        return "-"
    return datetime.fromtimestamp(value.timestamp(), timezone.utc).strftime("%m-%d %H:%MZ")


SUMMARY_COLUMNS = ("node", "topic", "channel", "pub/s", "fin/s", "requeued", "timed out", "depth max",
                   "backlog", "drain in", "drain at", "clients", "e2e p99 ms", "restarts")


def _get(row: Any, key: str) -> Any:
    try:
        return row[key]
    except (KeyError, ValueError, IndexError):
        return None


def summary_table(rows: Sequence[Any]) -> list[list[str]]:
    """Rates over the whole input; "drain in" from the series' last window with rates ("drain at")."""
    table = []
    for r in rows:
        topic_empty = r["channel"] is None and r["drain_state"] == "empty"
        table.append([
            r["node"], r["topic"], r["channel"] if r["channel"] is not None else "(topic)",
            _fmt(r["publish_rate"]), _fmt(r["finish_rate"]),
            _fmt(r["requeued"], 0), _fmt(r["timed_out"], 0), _fmt(r["depth_max"]),
            _fmt(r["backlog_last"]),
            "-" if topic_empty else drain_text(r["drain_state"], r["time_to_drain_s"], _get(r, "backlog_growth_rate")),
            "-" if topic_empty else _short_time(_get(r, "drain_window_start")),
            _fmt(r["clients_max"]), _fmt(r["e2e_p99_ms"]), _fmt(r["restarts"]),
        ])
    return table


def format_summary(rows: Sequence[Any], total: int | None = None) -> str:
    """A plain-text table with aligned columns."""
    table = summary_table(rows)
    widths = [len(h) for h in SUMMARY_COLUMNS]
    for line in table:
        widths = [max(w, len(cell)) for w, cell in zip(widths, line, strict=True)]
    left = {0, 1, 2}

    def fmt_line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))

    out = [fmt_line(SUMMARY_COLUMNS), "  ".join("-" * w for w in widths)]
    out.extend(fmt_line(line) for line in table)
    if total is not None and total > len(rows):
        out.append(f"... {total - len(rows)} more series in the output (--limit to print more)")
    return "\n".join(out) + "\n"


_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;color:#222}
h1{font-size:20px} h2{font-size:16px;margin-top:28px}
table{border-collapse:collapse;font-size:12px} th,td{padding:3px 8px;border-bottom:1px solid #eee}
th{background:#f3f3f3;text-align:left} td.n{text-align:right;font-variant-numeric:tabular-nums}
.note{color:#666;font-size:12px;max-width:900px}
"""


def series_colors(charts: Any) -> dict[str, str]:
    """One colour per series name over all charts (in order of first appearance), so a channel is
    the same colour in its finish-rate, depth, requeue and timeout charts."""
    colors: dict[str, str] = {}
    for series in charts:
        for name in series:
            if name not in colors:
                colors[name] = PALETTE[len(colors) % len(PALETTE)]
    return colors


def render_report(summary_rows: Sequence[Any], series: dict[str, dict[str, list[Point]]], window: str,
                  span: tuple[datetime | None, datetime | None], total: int,
                  marks: Mapping[str, Sequence[Any]] | None = None) -> str:
    """The whole page."""
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
            "(depth + in flight + deferred). Dashed red lines: restarts (counters reset); grey bands: "
            "no snapshots from a node. In the table, pub/s and fin/s are means over the whole span; drain in "
            "comes from each series' last window with rates (drain at).</p>"]
    colors = series_colors(series.get(key, {}) for _title, key, _unit in charts)
    for title, key, unit in charts:
        body.append(f"<h2>{esc(title)}</h2>")
        body.append(line_chart(title, series.get(key, {}), unit, marks=marks, colors=colors))
    body.append("<h2>Summary</h2><table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in SUMMARY_COLUMNS) + "</tr>")
    for line in summary_table(summary_rows):
        body.append("<tr>" + "".join(
            f"<td>{esc(c)}</td>" if i < 3 else f"<td class='n'>{esc(c)}</td>" for i, c in enumerate(line)) + "</tr>")
    body.append("</table>")
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>NSQ stats report</title>"
            f"<style>{_CSS}</style></head><body>" + "\n".join(body) + "</body></html>\n")
