"""
A tiny HTML builder that escapes everything it is not told is markup.

Pages are built from :func:`el` calls: text children and attribute values are
escaped, :class:`Markup` (what ``el`` returns) is not, so nothing a topic,
channel, user agent or upstream error says can break out of its cell.  The
number formats here match the page script's (``static/admin.js``) so a
server-rendered cell and a refreshed one read the same.
"""

from __future__ import annotations

import html
from typing import Any
from collections.abc import Iterable

__all__ = ["Markup", "escape", "el", "join", "commafy", "nanotohuman", "fmt_rate", "fmt_seconds", "percentile_label"]

_VOID = {"br", "hr", "img", "input", "link", "meta", "col", "wbr"}


class Markup(str):
    """Text that is already HTML (built by :func:`el` or :func:`escape`)."""

    __slots__ = ()


Child = None | str | int | float | Markup | Iterable[Any]


def escape(value: Any) -> Markup:
    if isinstance(value, Markup):
        return value
    if value is None:
        return Markup("")
    return Markup(html.escape(str(value), quote=True))


def join(children: Iterable[Any]) -> Markup:
    """Concatenate children, escaping text; lists and generators are flattened; None is skipped."""
    out = []
    for child in children:
        if child is None or child is False:
            continue
        if isinstance(child, (str, int, float)):
            out.append(escape(child))
        else:
            out.append(join(child))
    return Markup("".join(out))


def _attr_name(name: str) -> str:
    if name.endswith("_"):
        name = name[:-1]
    return name.replace("_", "-")


def el(tag: str, *children: Any, **attrs: Any) -> Markup:
    """``el("td", 5, class_="num", data_v="depth")`` -> ``<td class="num" data-v="depth">5</td>``.

    A value of True writes a bare attribute; None or False leaves it out.
    """
    parts = [tag]
    for name, value in attrs.items():
        if value is None or value is False:
            continue
        if value is True:
            parts.append(_attr_name(name))
        else:
            parts.append(f'{_attr_name(name)}="{escape(value)}"')
    head = "<" + " ".join(parts) + ">"
    if tag in _VOID:
        return Markup(head)
    return Markup(head + join(children) + f"</{tag}>")


def commafy(n: int | None) -> str:
    """``1234567`` -> ``1,234,567`` (nsqadmin's ``commafy``)."""
    return f"{int(n or 0):,}"


def _trim(x: float) -> str:
    text = f"{x:.2f}".rstrip("0").rstrip(".")
    return text or "0"


def nanotohuman(n: float | None) -> str:
    """Nanoseconds as nsqadmin prints them (``1h2m3.5s``, ``529.8ms``, ``12us``)."""
    if n is None:
        return ""
    n = float(n)
    s = ""
    if n >= 3_600_000_000_000:
        s = f"{int(n // 3_600_000_000_000)}h"
        n %= 3_600_000_000_000
    if n >= 60_000_000_000:
        s += f"{int(n // 60_000_000_000)}m"
        n %= 60_000_000_000
    if n >= 1_000_000_000 or s:
        # below a minute after hours or minutes, always seconds: 1h39m0.28s, never 1h39m277.81ms
        return s + _trim(n / 1e9) + "s"
    if n >= 1_000_000:
        return s + _trim(n / 1e6) + "ms"
    if n >= 1_000:
        return s + _trim(n / 1e3) + "us"
    return _trim(n) + "ns"


def fmt_seconds(seconds: float | None) -> str:
    """A duration in whole seconds as ``3d4h``, ``2h5m``, ``4m10s`` or ``12s`` (uptimes, ages)."""
    if seconds is None:
        return ""
    n = max(0, int(seconds))
    days, rest = divmod(n, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes}m"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def fmt_rate(rate: float | None) -> str:
    """A message rate (``12.3/s``), or an en dash before there are two samples."""
    if rate is None:
        return "\u2013"
    return f"{rate:.1f}/s"


def percentile_label(q: float) -> Markup:
    """``0.99`` -> ``99<sup>th</sup>`` (nsqadmin's ``floatToPercent`` + ``percSuffix``)."""
    pct = int(q * 100 + 1e-9)
    v = pct % 10
    suffix = {1: "st", 2: "nd", 3: "rd"}.get(v, "th")
    return join([str(pct), el("sup", suffix)])
