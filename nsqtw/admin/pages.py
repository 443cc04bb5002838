"""
nsqadmin's pages, rendered on the server from the same JSON the ``/api/*`` routes answer.

Each ``*_page`` function takes the API document(s) and a :class:`PageContext`
and returns a :class:`Page`; :func:`render` puts it into
``templates/layout.html``.  Live refresh is the page script's job: rows carry
``data-row`` (the key the script finds in the API answer), ``data-hist`` (where
their series are in ``/api/history``) and ``data-paused``; cells carry
``data-v`` (the field they show) and sparklines ``data-spark``.  When the set
of rows or a paused flag changes, the script fetches the page again with
``?fragment=1`` and swaps ``<main>``.  Action buttons are only rendered for
admins.
"""

from __future__ import annotations

import string
import time
from importlib import resources
from typing import Any
from collections.abc import Sequence
from urllib.parse import quote

import attr

from .. import NSQ_VERSION, __version__
from .history import GROWING_POLLS, current_value, growing, last_value, rising
from .html import Markup, commafy, el, escape, fmt_rate, fmt_seconds, join, nanotohuman, percentile_label

__all__ = ["PageContext", "Page", "render", "topics_page", "topic_page", "channel_page", "nodes_page",
           "node_page", "lookup_page", "counter_page", "error_page", "not_found_page", "confirm_text",
           "policy_panel", "policy_text"]

CLIENT_STATES = {0: "init", 1: "disconnected", 2: "connected", 3: "subscribed", 4: "closing"}


@attr.s(frozen=True, slots=True)
class PageContext:
    base: str = attr.ib()
    is_admin: bool = attr.ib()
    user: str = attr.ib(default="")
    lookupds: Sequence[str] = attr.ib(default=())
    nsqds: Sequence[str] = attr.ib(default=())
    refresh_ms: int = attr.ib(default=5000)
    acl_enforced: bool = attr.ib(default=False)
    #: the admin's clock when the page is built (ages of the oldest queued messages)
    now: float = attr.ib(default=0.0)

    def url(self, path: str) -> str:
        return (self.base.rstrip("/") + path) or "/"


@attr.s(slots=True)
class Page:
    title: str = attr.ib()
    name: str = attr.ib()
    content: Markup = attr.ib()
    api: str = attr.ib(default="")
    history: str = attr.ib(default="")
    status: int = attr.ib(default=200)
    nav: str = attr.ib(default="")
    #: why the picture is partial (some upstream failed); the footer's live dot starts as a warning
    trouble: str = attr.ib(default="")


def q(name: str) -> str:
    """A topic, channel or node as one URL path segment."""
    return quote(name, safe="")


def _template() -> string.Template:
    text = resources.files("nsqtw.admin").joinpath("templates/layout.html").read_text("utf-8")
    return string.Template(text)


_LAYOUT: string.Template | None = None


def render(ctx: PageContext, page: Page) -> str:
    """The whole HTML document for ``page``."""
    global _LAYOUT
    if _LAYOUT is None:
        _LAYOUT = _template()
    nav_items = [("topics", "Topics", "/topics"), ("nodes", "Nodes", "/nodes"),
                 ("counter", "Counter", "/counter"), ("lookup", "Lookup", "/lookup")]
    nav = join(el("a", label, href=ctx.url(path), class_="active" if page.nav == key else None)
               for key, label, path in nav_items)
    if ctx.acl_enforced:
        who = el("span", ctx.user or "anonymous", class_="user") + (
            el("span", "admin", class_="badge admin") if ctx.is_admin else el("span", "read-only", class_="badge"))
    else:
        who = el("span", "no ACL: everyone is admin", class_="badge", title="start nsqadmin with --admin-user to restrict actions")
    if ctx.lookupds:
        cluster = join(["nsqlookupd ", join(join([", " if i else "", el("span", a, class_="addr")])
                                             for i, a in enumerate(ctx.lookupds))])
    else:
        cluster = join(["nsqd ", join(join([", " if i else "", el("span", a, class_="addr")])
                                      for i, a in enumerate(ctx.nsqds))])
    return _LAYOUT.substitute(
        title=escape(page.title),
        static=escape(ctx.url("/static")),
        base=escape(ctx.base),
        home=escape(ctx.url("/")),
        page=escape(page.name),
        api=escape(page.api),
        history=escape(page.history),
        refresh=escape(str(ctx.refresh_ms)),
        admin="true" if ctx.is_admin else "false",
        nav=nav,
        who=who,
        cluster=cluster,
        version=escape(f"nsqtw {__version__} \u00b7 NSQ {NSQ_VERSION}"),
        live_class="live warn" if page.trouble else "live",
        live_text="partial" if page.trouble else "live",
        live_title=escape(page.trouble or "live refresh"),
        content=page.content,
    )


# --- shared pieces ---------------------------------------------------------------


def _warning(message: str) -> Markup:
    if not message:
        return Markup("")
    return el("div", message, class_="alert warning", role="alert")


def _notice(title: str, *text: Any) -> Markup:
    return el("div", el("strong", title), " ", *text, class_="alert notice")


def _crumbs(ctx: PageContext, *items: Any) -> Markup:
    parts: list[Any] = []
    for i, (label, href) in enumerate(items):
        if i:
            parts.append(el("span", "/", class_="sep"))
        parts.append(el("a", label, href=href) if href else el("span", label, class_="here"))
    return el("nav", *parts, class_="crumbs")


def _paused_badge(paused: bool) -> Markup:
    return el("span", "paused", class_="badge paused") if paused else Markup("")


def _num(value: Any, field: str) -> Markup:
    return el("td", commafy(value), class_="num", data_v=field)


def _ts(t: float | None) -> Markup:
    """A point in time (UTC on the server; the page script shows it in local time with its age)."""
    if t is None:
        return el("span", "never", class_="muted")
    stamp = time.strftime("%H:%M:%S", time.gmtime(t))
    iso = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
    return el("time", f"{stamp} UTC", datetime=iso, data_ts=str(int(t)))


def _status_badge(state: dict[str, Any]) -> Markup:
    """``unreachable since ...`` / ``gone since ...`` with the last-seen time, or ``reachable``."""
    status = state.get("status", "ok")
    if status == "ok":
        return el("span", "reachable", class_="badge ok", data_status="ok")
    word = "unreachable" if status == "unreachable" else "gone from nsqlookupd"
    title = (state.get("error") or "") if status == "unreachable" else \
        "nsqlookupd no longer lists this node (it stopped, or lost its connection)"
    return join([
        el("span", word, " since ", _ts(state.get("since")), class_="badge danger", data_status=status,
           title=title or None),
        " ", el("small", "last seen ", _ts(state.get("last_seen")), class_="muted last-seen"),
    ])


def _partial_badge(partial: dict[str, Any] | None, block: bool = False) -> Markup:
    if not partial:
        return Markup("")
    return el("span", f"partial: {partial['answered']} of {partial['total']} nodes",
              class_="badge warn partial" + (" block-badge" if block else ""),
              title="the total covers only the nodes that answered; the others are listed above with when "
                    "they were last seen")


def _missing_rows(ctx: PageContext, missing: list[dict[str, Any]], width: int) -> list[Markup]:
    """A row per node that should be here but did not answer: no numbers, only when it was last seen."""
    rows = []
    for m in missing:
        node = m.get("node", "")
        rows.append(el(
            "tr",
            el("td", el("a", _host_port(m), href=ctx.url(f"/nodes/{q(node)}")), class_="name"),
            el("td", el("div", _status_badge(m), " ",
                        el("span", "no current numbers from this node; totals below leave it out", class_="muted"),
                        class_="failed-text"),
               colspan=str(width - 1), class_="failed-cell"),
            class_="failed", data_row=f"missing:{node}", data_status=m.get("status"),
        ))
    return rows


def _mem_disk(doc: dict[str, Any]) -> Markup:
    return el("td", f"{commafy(doc.get('memory_depth'))} + {commafy(doc.get('backend_depth'))}",
              class_="num muted", data_v="mem_disk")


def _oldest(ctx: PageContext, doc: dict[str, Any]) -> Markup:
    """How long the oldest queued message has waited (nsqtw's nsqd reports it; Go's does not: "–")."""
    ts = doc.get("oldest_message_ts")
    if ts is None:
        title = ("nothing queued" if not doc.get("depth") else
                 "this nsqd does not report its oldest message (Go's nsqd does not)")
        return el("td", "\u2013", class_="num muted", data_v="oldest", title=title)
    age = max(0.0, ctx.now - ts)
    return el("td", fmt_seconds(age), class_="num", data_v="oldest",
              title="the oldest queued message was published " +
                    time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts)))


def _spark(path: str, label: str = "", wide: bool = False) -> Markup:
    label = label or path.replace("/", " ")
    return el("svg", el("title", label), class_="spark wide" if wide else "spark", data_spark=path, role="img",
              aria_label=label, viewBox="0 0 120 24" if not wide else "0 0 600 120",
              preserveAspectRatio="none")


def _grid(*children: Any, cls: str = "grid") -> Markup:
    """A table in a horizontally scrolling box (wide tables never push the page sideways)."""
    return el("div", el("table", *children, class_=cls), class_="scroll")


def _percentiles(doc: dict[str, Any]) -> list[float]:
    e2e = doc.get("e2e_processing_latency") or {}
    return [p.get("quantile", 0.0) for p in (e2e.get("percentiles") or [])]


def _e2e_cells(doc: dict[str, Any], quantiles: Sequence[float]) -> list[Markup]:
    e2e = doc.get("e2e_processing_latency") or {}
    by_q = {p.get("quantile"): p for p in (e2e.get("percentiles") or [])}
    cells = []
    for quant in quantiles:
        p = by_q.get(quant)
        if p is None:
            cells.append(el("td", "", class_="num", data_v=f"e2e:{quant:g}"))
            continue
        avg = p.get("average", p.get("value"))
        cells.append(el("td", nanotohuman(avg), class_="num", data_v=f"e2e:{quant:g}",
                        title=f"min {nanotohuman(p.get('min'))}, max {nanotohuman(p.get('max'))}"))
    return cells


def _e2e_heads(quantiles: Sequence[float]) -> list[Markup]:
    return [el("th", percentile_label(quant), class_="num e2e") for quant in quantiles]


def _host_port(doc: dict[str, Any]) -> str:
    """``hostname:http_port`` for a node row (what nsqadmin shows), from ``node`` and ``hostname``."""
    node = doc.get("node", "")
    hostname = doc.get("hostname", "")
    port = node.rsplit(":", 1)[-1] if ":" in node else ""
    return f"{hostname}:{port}" if hostname and port else node


def _node_link(ctx: PageContext, doc: dict[str, Any]) -> Markup:
    node = doc.get("node", "")
    label = _host_port(doc)
    if label != node and doc.get("hostname") and not node.startswith(doc.get("hostname", "") + ":"):
        return join([el("a", label, href=ctx.url(f"/nodes/{q(node)}")), " ",
                     el("small", f"({node})", class_="muted block")])
    return el("a", label, href=ctx.url(f"/nodes/{q(node)}"))


def _button(text: str, action: str, kind: str, confirm: str, label: str | None = None, **data: Any) -> Markup:
    return el("button", text, type="button", class_=f"btn {kind}", data_action=action, data_confirm=confirm,
              title=label, aria_label=label, **{f"data_{k}": v for k, v in data.items()})


def _rate_cell(hist: dict[str, Any] | None) -> Markup:
    return el("td", fmt_rate(last_value((hist or {}).get("rate"))), class_="num rate", data_v="rate")


# --- charts (the long series of /api/charts/...; drawn by the page script) -------------------

#: (chart key, title, series, legend labels, unit)
CHARTS: tuple[tuple[str, str, str, str, str], ...] = (
    ("depth", "Depth", "memory_depth,backend_depth", "memory,disk", "count"),
    ("rates", "Publish and finish rate", "publish_rate,finish_rate", "publish,finish", "rate"),
    ("inflight", "In flight and deferred", "in_flight_count,deferred_count", "in flight,deferred", "count"),
    ("trouble", "Requeue and timeout rate", "requeue_rate,timeout_rate", "requeued,timed out", "rate"),
    ("clients", "Connected clients", "clients", "clients", "count"),
)
RANGES = ((300, "5 min"), (3600, "1 h"), (21600, "6 h"))


#: a topic's rates chart: its finish rate adds up its channels, each of which gets every message
TOPIC_RATES = ("rates", "Publish rate, and finish rate of all its channels together", "publish_rate,finish_rate",
               "publish,finish (all channels)", "rate")


def charts_panel(ctx: PageContext, api: str, what: str, e2e: bool = False, depth_title: str = "",
                 topic: bool = False) -> Markup:
    """Time-series charts of ``what`` (a topic, channel or node) with a range picker and hover read-out;
    ``depth_title`` renames the Depth chart (a topic's is everything it holds: its queue and its channels');
    ``topic``: the rates chart says that its finish rate is all the channels' together (each channel gets
    every message, so with two channels keeping up it reads twice the publish rate)."""
    charts = list(CHARTS)
    if depth_title:
        charts[0] = ("depth", depth_title) + charts[0][2:]
    if topic:
        charts[1] = TOPIC_RATES
    if e2e:
        charts.append(("e2e", "End-to-end latency", "e2e:*", "", "ns"))
    figures = []
    for key, title, series, labels, unit in charts:
        label = f"{title} of {what}, over time"
        figures.append(el(
            "figure",
            el("figcaption", title, el("span", "", class_="readout", aria_live="off")),
            el("svg", el("title", label), class_="chart", role="img", aria_label=label, viewBox="0 0 480 170"),
            el("div", class_="legend"),
            el("p", "", class_="chart-note hint"),
            class_="chart-box", data_chart=key, data_series=series, data_labels=labels, data_unit=unit))
    picker = el("div", *(el("button", label, type="button", class_="btn range" + (" active" if i == 0 else ""),
                            data_range=str(seconds), aria_pressed="true" if i == 0 else "false")
                         for i, (seconds, label) in enumerate(RANGES)),
                class_="ranges", role="group", aria_label="time range")
    return el("section", el("h2", "History ", el("small", "(shaded red: a node did not answer; amber: a node had "
                                                           "left, the line is the others' share)", class_="muted")),
              picker, el("div", *figures, class_="charts"), class_="charts-panel", data_charts=api)


# --- topics --------------------------------------------------------------------------


def _current_cell(series: Any, field: str, fmt: Any = commafy) -> Markup:
    """A number from the newest poll; when that poll had none, the last one seen, greyed and labelled."""
    value, stale = current_value(series)
    if value is not None:
        return el("td", fmt(value), class_="num", data_v=field, data_sort=str(value))
    if stale is not None:
        return el("td", el("span", "last ", fmt(stale), class_="stale",
                           title="no node holding this topic answered the newest poll; this is the last value seen"),
                  class_="num", data_v=field, data_sort="-1")
    return el("td", "\u2013", class_="num", data_v=field, data_sort="-1")


def _alert_badges(alerts: list[dict[str, str]] | None) -> list[Markup]:
    return [el("span", a.get("label", ""), class_=f"badge {a.get('kind', 'warn')}", title=a.get("title"),
               data_alert=a.get("label", "")) for a in alerts or []]


def node_alerts_banner(ctx: PageContext, alerts: dict[str, list[dict[str, str]]] | None) -> Markup:
    """One line per node that refuses publishes, cannot store replicas, fails an adoption or
    holds an adopted backlog (the Topics page: producers publishing there are refused)."""
    if not alerts:
        return Markup("")
    items = [el("li", el("a", node, href=ctx.url(f"/nodes/{q(node)}")), " ", *_alert_badges(found))
             for node, found in sorted(alerts.items())]
    return el("section", el("ul", *items), class_="node-alerts", role="status")


def topics_page(ctx: PageContext, topics: list[str], history: dict[str, Any], message: str,
                missing_by_topic: dict[str, list[str]] | None = None,
                alerts: dict[str, list[dict[str, str]]] | None = None) -> Page:
    """Every topic, with its channel backlog, messages, rate and sparklines from the admin's history."""
    hist_topics = history.get("topics") or {}
    missing_by_topic = missing_by_topic or {}
    rows = []
    for name in topics:
        h = hist_topics.get(name) or {}
        badges: list[Any] = [_paused_badge(bool(h.get("paused")))]
        if name.endswith("#ephemeral"):
            badges.append(el("span", "ephemeral", class_="badge info",
                             title="nsqd deletes it when its last channel's last consumer leaves"))
        depth_now, _ = current_value(h.get("depth"))
        missing = missing_by_topic.get(name) or []
        if missing:
            badges.append(el("span", f"{len(missing)} node{'s' if len(missing) != 1 else ''} not answering",
                             class_="badge danger", title=", ".join(missing), data_row=f"missing-topic:{name}"))
        elif depth_now is None:
            badges.append(el("span", "inactive", class_="badge",
                             title="no nsqd produces this topic now (see the Lookup page)"))
        backlog, _ = current_value(h.get("backlog"))
        rows.append(el(
            "tr",
            el("td", el("a", name, href=ctx.url(f"/topics/{q(name)}")), " ", *badges, class_="name",
               data_sort=name),
            el("td", "" if h.get("channel_count") is None else commafy(h.get("channel_count")),
               class_="num", data_v="channel_count", data_sort=str(h.get("channel_count") or 0)),
            _current_cell(h.get("backlog"), "backlog"),
            _current_cell(h.get("depth"), "depth"),
            _current_cell(h.get("message_count"), "message_count"),
            _current_cell(h.get("rate"), "rate", fmt_rate),
            el("td", _spark(f"topics/{name}/backlog", f"channel backlog of {name}"), class_="graph"),
            el("td", _spark(f"topics/{name}/rate", f"publish rate of {name}"), class_="graph"),
            data_row=f"topic:{name}", data_hist=f"topics/{name}", data_paused="1" if h.get("paused") else None,
            class_=("trouble" if backlog else None),
        ))
    if rows:
        def head(label: str, title: str, cls: str = "num") -> Markup:
            return el("th", label, class_=f"{cls} sortable", title=title, tabindex="0", aria_sort="none")
        table = _grid(el("thead", el("tr", head("Topic", "sort by name", "text"),
                                     head("Channels", "how many channels"),
                                     head("Channel backlog", "messages waiting in the topic's channels"),
                                     head("Topic depth", "messages waiting in the topic's own queue "
                                                         "(before channels copy them)"),
                                     head("Messages", "messages published since the nsqd started"),
                                     head("Rate", "publish rate over the last poll interval"),
                                     el("th", "Backlog graph", class_="graph"),
                                     el("th", "Rate graph", class_="graph"))),
                      el("tbody", *rows), cls="grid sortable-table")
    else:
        table = _notice("No topics found.", "Publish to any nsqd, or create one on the ",
                        el("a", "Lookup", href=ctx.url("/lookup")), " page.")
    content = join([
        el("header", el("h1", "Topics", " ", el("span", str(len(topics)), class_="count")), class_="page-head"),
        _warning(message),
        node_alerts_banner(ctx, alerts),
        el("p", f"Numbers and graphs come from nsqadmin's own /stats history (one sample every "
                f"{history.get('interval', 0):g}s). Click a column heading to sort.", class_="hint"),
        table,
    ])
    return Page("Topics", "topics", content, api=ctx.url("/api/topics"), history=ctx.url("/api/history"), nav="topics")


# --- topic ---------------------------------------------------------------------------


def _on_nodes(n: int) -> str:
    return f"on {n} node" + ("" if n == 1 else "s")


def _n(doc: dict[str, Any], key: str) -> int:
    return int(doc.get(key) or 0)


def _missing_note(doc: dict[str, Any]) -> str:
    """What a confirmation must say about the nodes holding this that do not answer now."""
    missing = doc.get("nodes_missing") or []
    if not missing:
        return ""
    names = ", ".join(f"{m.get('node', '')} {m.get('status', '')}" for m in missing)
    one = len(missing) == 1
    return (f" {_plural(len(missing), 'more node')} holding it {'does' if one else 'do'} not answer ({names}): "
            f"{'its' if one else 'their'} messages are not counted here and this does not reach "
            f"{'it' if one else 'them'}.")


def _held(queued: int, in_flight: int, deferred: int) -> str:
    return f"{commafy(queued)} queued, {commafy(in_flight)} in flight, {commafy(deferred)} deferred"


def confirm_text(action: str, topic: str, channel: str, doc: dict[str, Any]) -> str:
    """The confirmation for ``action`` on a topic or channel, from its API document (``/api/topics/...``).

    It says what nsqd really does: ``/channel/empty`` and ``/channel/delete`` drop the queued, in-flight
    and deferred messages alike.  The page script builds the same text (``confirmText`` in admin.js)
    from each live refresh, so the counts are the ones the table shows when the button is pressed."""
    nodes = len(doc.get("nodes") or [])
    where = _on_nodes(nodes)
    note = _missing_note(doc)
    if channel and action in ("redrive", "empty_dead"):
        return _dead_confirm(action, topic, channel, doc, where, note)
    if channel:
        label = f"{topic}/{channel}"
        queued, in_flight, deferred = _n(doc, "depth"), _n(doc, "in_flight_count"), _n(doc, "deferred_count")
        total = queued + in_flight + deferred
        held = _held(queued, in_flight, deferred)
        if action == "empty":
            return (f"Empty channel {label}: discard all {commafy(total)} messages {where} ({held})? "
                    "In-flight and deferred messages are dropped too; consumers cannot finish the ones they "
                    f"hold.{note}")
        if action == "delete":
            return (f"Delete channel {label} everywhere: all {commafy(total)} messages {where} ({held}) are "
                    f"discarded and its {_plural(_n(doc, 'client_count'), 'consumer')} disconnected.{note}")
        if action == "pause":
            return (f"Pause channel {label} {where}? Consumers get no messages until it is unpaused; "
                    f"messages keep queueing.{note}")
        return f"Unpause channel {label} {where}? Consumers get messages again.{note}"
    channels = doc.get("channels") or []
    if action == "empty":
        return (f"Empty topic {topic}: discard the {commafy(_n(doc, 'depth'))} messages queued at the topic "
                f"{where}? Its channels keep theirs.{note}")
    if action == "delete":
        held_by_channels = sum(_n(c, "depth") + _n(c, "in_flight_count") + _n(c, "deferred_count")
                               for c in channels)
        everything = _n(doc, "depth") + held_by_channels
        return (f"Delete topic {topic} everywhere: its {_plural(len(channels), 'channel')} and all "
                f"{commafy(everything)} messages {where} (at the topic and in its channels: queued, in flight "
                f"and deferred) are discarded, and nsqlookupd forgets it.{note}")
    if action == "pause":
        return (f"Pause topic {topic} {where}? New messages queue at the topic and its channels get nothing "
                f"until it is unpaused.{note}")
    return f"Unpause topic {topic} {where}? Messages flow to its channels again.{note}"


def _dead_messages(n: int) -> str:
    return f"{commafy(n)} dead message" + ("" if n == 1 else "s")


def _dead_confirm(action: str, topic: str, channel: str, doc: dict[str, Any], where: str, note: str) -> str:
    """What ``redrive`` and ``empty_dead`` do to the channel's dead letters (nsqtw's channel policies)."""
    dead = _n(doc, "dead_count")
    if action == "redrive":
        return (f"Put the {_dead_messages(dead)} of {topic}/{channel} {where} back into the channel with fresh "
                f"attempts; consumers receive them again.{note}")
    dlt = (doc.get("policy") or {}).get("dead_letter_topic")
    copies = f" Copies already published to the dead-letter topic {dlt} stay there." if dlt else ""
    return f"Drop the {_dead_messages(dead)} of {topic}/{channel} {where} for good; they cannot be recovered.{copies}{note}"


def _tombstone(topic: str, node: str) -> Markup:
    text = (f"Tombstone topic {topic} on {node}: nsqlookupd stops handing this node out for the topic and the "
            "topic (with every message it holds there) is deleted from that node.")
    return el("button", "\u2718", type="button", class_="btn link red", data_action="tombstone",
              data_confirm=text, data_topic=topic, data_node=node,
              title=f"tombstone topic {topic} on {node}", aria_label=f"tombstone topic {topic} on {node}")


def topic_page(ctx: PageContext, topic: str, stats: dict[str, Any], history: dict[str, Any], message: str) -> Page:
    nodes = stats.get("nodes") or []
    channels = stats.get("channels") or []
    missing = stats.get("nodes_missing") or []
    partial = stats.get("partial")
    paused = bool(stats.get("paused"))
    parts: list[Any] = [
        _crumbs(ctx, ("Topics", ctx.url("/topics")), (topic, None)),
        el("header", el("h1", el("span", "Topic", class_="kind"), " ", topic, " ", _paused_badge(paused), " ",
                        _partial_badge(partial)),
           class_="page-head", data_row="total", data_paused="1" if paused else None),
        _warning(message),
    ]
    if not nodes and not missing:
        parts.append(_notice("No nsqd produces this topic now.", "nsqlookupd knows it, but no node holds it. See ",
                             el("a", "Lookup", href=ctx.url("/lookup")), " for more information."))
    else:
        if ctx.is_admin and nodes:
            parts.append(el(
                "div",
                _button("Empty Queue", "empty", "warn", confirm_text("empty", topic, "", stats), topic=topic),
                _button("Delete Topic", "delete", "danger", confirm_text("delete", topic, "", stats), topic=topic),
                (_button("Unpause Topic", "unpause", "ok", confirm_text("unpause", topic, "", stats), topic=topic)
                 if paused else
                 _button("Pause Topic", "pause", "primary", confirm_text("pause", topic, "", stats), topic=topic)),
                class_="actions"))
        quantiles = _percentiles(stats)
        hist_nodes = history.get("nodes") or {}
        width = 8 + len(quantiles)
        rows = []
        for n in nodes:
            node = n.get("node", "")
            tomb = _tombstone(topic, node) if ctx.is_admin else ""
            rows.append(el(
                "tr",
                el("td", tomb, _node_link(ctx, n), " ", _paused_badge(bool(n.get("paused"))), class_="name"),
                _num(n.get("depth"), "depth"), _mem_disk(n), _num(n.get("message_count"), "message_count"),
                _rate_cell(hist_nodes.get(node)),
                el("td", commafy(len(n.get("channels") or [])), class_="num", data_v="channel_count"),
                *_e2e_cells(n, quantiles),
                el("td", _spark(f"nodes/{node}/depth", f"topic depth on {node}"), class_="graph"),
                el("td", _spark(f"nodes/{node}/rate", f"publish rate on {node}"), class_="graph"),
                data_row=f"node:{node}", data_hist=f"nodes/{node}", data_paused="1" if n.get("paused") else None,
            ))
        rows += _missing_rows(ctx, missing, width)
        rows.append(el(
            "tr",
            el("td", "Total", " ", _partial_badge(partial, block=True), class_="name"),
            _num(stats.get("depth"), "depth"), _mem_disk(stats), _num(stats.get("message_count"), "message_count"),
            _rate_cell(history.get("topic")),
            el("td", commafy(len(channels)), class_="num", data_v="channel_count"),
            *_e2e_cells(stats, quantiles),
            el("td", _spark("topic/depth", f"topic depth of {topic}"), class_="graph"),
            el("td", _spark("topic/rate", f"publish rate of {topic}"), class_="graph"),
            class_="total", data_row="total", data_hist="topic", data_paused="1" if paused else None,
        ))
        e2e_head = (el("tr", el("th", colspan=6), el("th", "E2E processing latency", colspan=len(quantiles),
                                                        class_="group"), el("th", colspan=2), class_="group-row")
                    if quantiles else "")
        parts.append(el("section", el("h2", "Topic message queue"), _grid(el("thead", e2e_head, el(
            "tr", el("th", "nsqd host"), el("th", "Depth", class_="num"), el("th", "Memory + Disk", class_="num"),
            el("th", "Messages", class_="num"), el("th", "Rate", class_="num"), el("th", "Channels", class_="num"),
            *_e2e_heads(quantiles), el("th", "Depth graph", class_="graph"), el("th", "Rate graph", class_="graph"))),
            el("tbody", *rows))))

    parts.append(_channels_table(ctx, topic, channels, history.get("channels") or {},
                                 stats.get("channels_elsewhere") or [], bool(missing)))
    if nodes or missing:
        parts.append(charts_panel(ctx, ctx.url(f"/api/charts/topics/{q(topic)}"), f"topic {topic}",
                                  depth_title="Backlog (topic queue and channels)", topic=True))
    if nodes and not channels:
        # before it has channels, a topic keeps its messages in its own queue: show those
        parts.append(peek_panel(ctx, ctx.url(f"/api/topic-peek/{q(topic)}"), states=False))
    title = f"Topic {topic}"
    return Page(title, "topic", join(parts), api=ctx.url(f"/api/topics/{q(topic)}"),
                history=ctx.url(f"/api/history/{q(topic)}"), nav="topics")


def channel_trouble(c: dict[str, Any], hist: dict[str, Any] | None, key: str) -> list[Markup]:
    """Badges for a channel that needs an operator: a backlog nobody consumes, timeouts still rising.

    Each carries ``data-row="<key>:backlog|timeouts"`` so the page script re-renders when one
    appears or goes (it computes the same rules from the API answer)."""
    out = []
    if int(c.get("depth") or 0) > 0 and int(c.get("client_count") or 0) == 0 and not c.get("paused"):
        out.append(el("span", "backlog, no consumer", class_="badge danger trouble-badge", data_row=f"{key}:backlog",
                      title=f"{commafy(c.get('depth'))} messages wait and no client is subscribed"))
    if int(c.get("client_count") or 0) > 0 and not c.get("paused") and growing((hist or {}).get("depth")):
        out.append(el("span", "growing", class_="badge warn trouble-badge", data_row=f"{key}:growing",
                      title=f"the backlog grew at each of the last {GROWING_POLLS} polls: its consumers fall "
                            "behind"))
    if rising((hist or {}).get("timeout_count")):
        out.append(el("span", "timeouts rising", class_="badge warn trouble-badge", data_row=f"{key}:timeouts",
                      title="messages timed out (not finished in time) since the previous poll"))
    return out


def _channels_table(ctx: PageContext, topic: str, channels: list[dict[str, Any]],
                    hist_channels: dict[str, Any], elsewhere: Sequence[str] = (), partial: bool = False) -> Markup:
    if not channels and not elsewhere:
        return el("section", el("h2", "Channel message queues"),
                  _notice("No channels exist for this topic.", "Messages will queue at the topic until a channel "
                          "is created."))
    quantiles: list[float] = []
    for c in channels:
        for quant in _percentiles(c):
            if quant not in quantiles:
                quantiles.append(quant)
    rows = []
    for c in channels:
        name = c.get("channel_name", "")
        trouble = channel_trouble(c, hist_channels.get(name), f"trouble:{name}")
        rows.append(el(
            "tr",
            el("td", el("a", name, href=ctx.url(f"/topics/{q(topic)}/{q(name)}")), " ",
               _paused_badge(bool(c.get("paused"))), " ", *trouble, class_="name"),
            _num(c.get("depth"), "depth"), _mem_disk(c), _oldest(ctx, c),
            _num(c.get("in_flight_count"), "in_flight_count"), _num(c.get("deferred_count"), "deferred_count"),
            _num(c.get("requeue_count"), "requeue_count"), _num(c.get("timeout_count"), "timeout_count"),
            _num(c.get("message_count"), "message_count"), _rate_cell(hist_channels.get(name)),
            _num(c.get("client_count"), "client_count"),
            *_e2e_cells(c, quantiles),
            el("td", _spark(f"channels/{name}/depth", f"depth of channel {name}"), class_="graph"),
            el("td", _spark(f"channels/{name}/rate", f"finish rate of channel {name}"), class_="graph"),
            data_row=f"channel:{name}", data_hist=f"channels/{name}", data_paused="1" if c.get("paused") else None,
            class_="trouble" if trouble else None,
        ))
    for name in elsewhere:
        where = ("last reported by a node that does not answer now" if partial
                 else "registered with nsqlookupd; no answering nsqd has it")
        rows.append(el("tr", el("td", el("a", name, href=ctx.url(f"/topics/{q(topic)}/{q(name)}")), class_="name"),
                       el("td", where, colspan=str(12 + len(quantiles)), class_="muted"),
                       class_="elsewhere", data_row=f"elsewhere:{name}"))
    e2e_head = (el("tr", el("th", colspan=11), el("th", "E2E processing latency", colspan=len(quantiles),
                                                     class_="group"), el("th", colspan=2), class_="group-row") if quantiles else "")
    def sortable(label: str, cls: str = "num", title: str | None = None) -> Markup:
        return el("th", label, class_=f"{cls} sortable", tabindex="0", aria_sort="none", title=title)
    head = el("tr", sortable("Channel", "text"), sortable("Depth"), sortable("Memory + Disk"),
              sortable("Oldest", title="how long the oldest queued message has waited"),
              sortable("In-Flight"), sortable("Deferred"), sortable("Requeued"), sortable("Timed Out"),
              sortable("Messages"), sortable("Rate"), sortable("Clients", title="connections"),
              *[el("th", percentile_label(quant), class_="num e2e sortable", tabindex="0", aria_sort="none")
                for quant in quantiles],
              el("th", "Depth graph", class_="graph"), el("th", "Rate graph", class_="graph"))
    return el("section", el("h2", "Channel message queues"),
              _grid(el("thead", e2e_head, head), el("tbody", *rows), cls="grid sortable-table"))


# --- channel ---------------------------------------------------------------------------


def channel_page(ctx: PageContext, topic: str, channel: str, stats: dict[str, Any], history: dict[str, Any],
                 message: str) -> Page:
    nodes = stats.get("nodes") or []
    missing = stats.get("nodes_missing") or []
    partial = stats.get("partial")
    paused = bool(stats.get("paused"))
    parts: list[Any] = [
        _crumbs(ctx, ("Topics", ctx.url("/topics")), (topic, ctx.url(f"/topics/{q(topic)}")), (channel, None)),
        el("header", el("h1", el("span", "Channel", class_="kind"), " ", topic, el("span", " / ", class_="sep"),
                        channel, " ", _paused_badge(paused), " ", _partial_badge(partial)),
           class_="page-head", data_row="total", data_paused="1" if paused else None),
        _warning(message),
    ]
    if not nodes and not missing:
        parts.append(_notice("No nsqd has this channel now.", "nsqlookupd has it registered, but no node holds it. "
                             "See ", el("a", "Lookup", href=ctx.url("/lookup")), " for more information."))
    else:
        if ctx.is_admin and nodes:
            def button(text: str, action: str, kind: str) -> Markup:
                return _button(text, action, kind, confirm_text(action, topic, channel, stats), topic=topic,
                               channel=channel)
            parts.append(el(
                "div",
                button("Empty Queue", "empty", "warn"),
                button("Delete Channel", "delete", "danger"),
                button("Unpause Channel", "unpause", "ok") if paused else button("Pause Channel", "pause", "primary"),
                class_="actions"))
        quantiles = _percentiles(stats)
        hist_nodes = history.get("nodes") or {}

        def row(doc: dict[str, Any], first: Markup, key: str, hist: Any, spark: str, cls: str | None = None
                ) -> Markup:
            return el(
                "tr", el("td", first, " ", _paused_badge(bool(doc.get("paused"))) if key != "total" else "",
                         class_="name"),
                _num(doc.get("depth"), "depth"), _mem_disk(doc), _oldest(ctx, doc),
                _num(doc.get("in_flight_count"), "in_flight_count"), _num(doc.get("deferred_count"), "deferred_count"),
                _num(doc.get("requeue_count"), "requeue_count"), _num(doc.get("timeout_count"), "timeout_count"),
                _num(doc.get("message_count"), "message_count"), _rate_cell(hist),
                _num(doc.get("client_count"), "client_count"),
                *_e2e_cells(doc, quantiles),
                el("td", _spark(f"{spark}/depth", f"depth ({'all nodes' if key == 'total' else key})"),
                   class_="graph"),
                el("td", _spark(f"{spark}/rate", f"finish rate ({'all nodes' if key == 'total' else key})"),
                   class_="graph"),
                class_=cls, data_row=key, data_hist=spark, data_paused="1" if doc.get("paused") else None)

        rows = [row(n, _node_link(ctx, n), f"node:{n.get('node', '')}", hist_nodes.get(n.get("node", "")),
                    f"nodes/{n.get('node', '')}") for n in nodes]
        rows += _missing_rows(ctx, missing, 13 + len(quantiles))
        rows.append(row(stats, join(["Total ", _partial_badge(partial, block=True)]), "total", history.get("channel"), "channel",
                        cls="total"))
        e2e_head = (el("tr", el("th", colspan=11), el("th", "E2E processing latency", colspan=len(quantiles),
                                                         class_="group"), el("th", colspan=2), class_="group-row") if quantiles else "")
        head = el("tr", el("th", "nsqd host"), el("th", "Depth", class_="num"), el("th", "Memory + Disk", class_="num"),
                  el("th", "Oldest", class_="num", title="how long the oldest queued message has waited"),
                  el("th", "In-Flight", class_="num"), el("th", "Deferred", class_="num"),
                  el("th", "Requeued", class_="num"), el("th", "Timed Out", class_="num"),
                  el("th", "Messages", class_="num"), el("th", "Rate", class_="num"),
                  el("th", "Clients", class_="num", title="connections"), *_e2e_heads(quantiles),
                  el("th", "Depth graph", class_="graph"), el("th", "Rate graph", class_="graph"))
        parts.append(el("section", el("h2", "Channel"),
                        _grid(el("thead", e2e_head, head), el("tbody", *rows))))
    if any("policy" in n for n in nodes):
        parts.append(policy_panel(ctx, topic, channel, stats))
    parts.append(_clients_table(ctx, stats.get("clients") or []))
    if nodes or missing:
        parts.append(charts_panel(ctx, ctx.url(f"/api/charts/topics/{q(topic)}/{q(channel)}"),
                                  f"channel {topic}/{channel}", e2e=True))
    if nodes:
        parts.append(peek_panel(ctx, ctx.url(f"/api/topics/{q(topic)}/{q(channel)}/peek"), states=True))
    return Page(f"Channel {topic}/{channel}", "channel", join(parts),
                api=ctx.url(f"/api/topics/{q(topic)}/{q(channel)}"),
                history=ctx.url(f"/api/history/{q(topic)}/{q(channel)}"), nav="topics")


#: a policy's settings as the channel page labels them: (setting, label, what it does)
POLICY_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("max_attempts", "Max attempts", "a message delivered this many times is kept as a dead letter instead of "
                                     "being delivered again"),
    ("max_age", "Max age", "a queued message older than this (from its publish time) is not delivered"),
    ("max_depth", "Max depth", "the most messages the channel queues; at the bound, overflow decides"),
    ("max_rate", "Max rate", "messages a second delivered to all the channel's consumers together"),
    ("dead_letter_topic", "Dead-letter topic", "each dead message is also published to this topic"),
)


def policy_text(policy: dict[str, Any] | None, name: str) -> str:
    """One setting of a channel's policy as the page shows it (``off`` when it is not set)."""
    value = (policy or {}).get(name)
    if value is None or value == "":
        return "off"
    if name == "max_depth":
        overflow = (policy or {}).get("overflow") or "drop-oldest"
        return f"{commafy(value)} ({'refuse publishes' if overflow == 'refuse' else 'drop oldest'})"
    if name == "max_rate":
        return f"{value}/s"
    if name == "max_attempts":
        return commafy(value)
    return str(value)


def policy_panel(ctx: PageContext, topic: str, channel: str, stats: dict[str, Any]) -> Markup:
    """nsqtw's channel policy (dead letters, maximum age, bounded depth, delivery rate) on each nsqd
    holding the channel, with what it did (dead letters kept, messages expired and dropped); for admins,
    the redrive and empty-dead-letters buttons and a form that changes the policy on every node."""
    nodes = stats.get("nodes") or []
    differ = bool(stats.get("policies_differ"))
    go_title = "this nsqd does not report channel policies (Go's nsqd has none)"

    def counts(doc: dict[str, Any]) -> list[Markup]:
        if "policy" not in doc:
            return [el("td", "–", class_="num muted", title=go_title) for _ in range(3)]
        return [_num(doc.get("dead_count"), "dead_count"), _num(doc.get("expired_count"), "expired_count"),
                _num(doc.get("dropped_count"), "dropped_count")]

    def settings(doc: dict[str, Any], total: bool = False) -> list[Markup]:
        if total and differ:
            return [el("td", "differs by node", class_="muted", colspan=str(len(POLICY_FIELDS)))]
        if "policy" not in doc:
            return [el("td", "–", class_="muted", title=go_title) for _ in POLICY_FIELDS]
        policy = doc.get("policy")
        return [el("td", policy_text(policy, name), class_="muted" if policy_text(policy, name) == "off" else None,
                   data_setting=name) for name, _, _ in POLICY_FIELDS]

    rows = [el("tr", el("td", _node_link(ctx, n), class_="name"), *settings(n), *counts(n),
               data_row=f"node:{n.get('node', '')}") for n in nodes]
    rows.append(el("tr", el("td", "Total", class_="name"), *settings(stats, total=True), *counts(stats),
                   class_="policy-total", data_row="total"))
    head = el("tr", el("th", "nsqd host"),
              *[el("th", label, title=what) for _, label, what in POLICY_FIELDS],
              el("th", "Dead", class_="num", title="dead letters kept: messages given up on (redrive puts them back)"),
              el("th", "Expired", class_="num", title="messages that reached max age"),
              el("th", "Dropped", class_="num", title="messages dropped by max age or max depth without dead letters"))
    parts: list[Any] = [el("h2", "Policy and dead letters"),
                        _grid(el("thead", head), el("tbody", *rows), cls="grid policy-table")]
    if differ:
        parts.append(el("p", "The nodes holding this channel have different policies (see each row); saving "
                             "sends the settings you change to every node.", class_="alert warning"))
    if ctx.is_admin and nodes:
        parts.append(el(
            "div",
            _button("Redrive dead letters", "redrive", "primary", confirm_text("redrive", topic, channel, stats),
                    topic=topic, channel=channel),
            _button("Empty dead letters", "empty_dead", "danger", confirm_text("empty_dead", topic, channel, stats),
                    topic=topic, channel=channel),
            class_="actions"))
        parts.append(_policy_form(topic, channel, stats, len(nodes)))
    return el("section", *parts, class_="policy", id="policy")


def _policy_form(topic: str, channel: str, stats: dict[str, Any], holders: int) -> Markup:
    """The policy editor: each field starts at the channel's setting (empty: off); the page script sends
    only the fields changed, after a confirmation naming each change."""
    nodes = stats.get("nodes") or []
    policy = stats.get("policy")
    if stats.get("policies_differ"):
        policy = next((n.get("policy") for n in nodes if n.get("policy") is not None), None)
    cur = policy or {}

    def value(name: str) -> str:
        v = cur.get(name)
        return "" if v is None else str(v)

    def field(name: str, label: str, **attrs: Any) -> Markup:
        return el("label", label, el("input", name=name, value=value(name), placeholder="off", **attrs))

    overflow = cur.get("overflow") or "drop-oldest"
    return el(
        "form",
        field("max_attempts", "Max attempts", type="number", min="0", max="65535", step="1"),
        field("max_age", "Max age", type="text", pattern=r"([0-9]+(\.[0-9]*)?(ns|us|ms|s|m|h))+",
              title="a duration: 90s, 10m, 1h30m"),
        field("max_depth", "Max depth", type="number", min="0", step="1"),
        el("label", "Overflow", el("select", *(el("option", label, value=v, selected=v == overflow) for v, label in (
            ("drop-oldest", "drop oldest"), ("refuse", "refuse publishes"))), name="overflow",
            data_initial=overflow)),
        field("max_rate", "Max rate (msg/s)", type="number", min="0", step="any"),
        field("dead_letter_topic", "Dead-letter topic", type="text", pattern=r"[.a-zA-Z0-9_\-]+(#ephemeral)?",
              maxlength="64"),
        el("button", "Save policy", type="submit", class_="btn primary"),
        el("p", "An empty field turns the setting off. Only the settings you change are sent, to the "
                f"{_plural(holders, 'nsqd')} holding the channel.", class_="hint"),
        id="policy-form", class_="create policy-form", data_topic=topic, data_channel=channel,
        data_nodes=str(holders))


def peek_panel(ctx: PageContext, api: str, states: bool) -> Markup:
    """The Messages panel: what nsqd's peek lists, loaded when asked (never on its own)."""
    state_picker = el("select", *(el("option", label, value=value) for value, label in (
        ("all", "all states"), ("queued", "queued"), ("in_flight", "in flight"), ("deferred", "deferred"),
        ("dead", "dead"))),
        class_="peek-state", aria_label="state") if states else ""
    return el(
        "section",
        el("h2", "Messages"),
        el("div", el("button", "Load messages", type="button", class_="btn primary peek-load"), " ",
           state_picker, " ",
           el("label", "show ", el("input", type="number", min="1", max="1000", value="20", class_="peek-n",
                                   aria_label="how many"), " at most"),
           class_="actions"),
        el("p", "Node by node, in the order each nsqd delivers, at most the count per state. Bodies are one "
                "line each (text, JSON, or hex when not UTF-8); open one to see all of it, JSON pretty-printed. "
                "Nothing changes for consumers.", class_="hint"),
        el("div", class_="peek-out", role="region", aria_live="polite"),
        el("script", src=ctx.url("/static/peek.js"), defer="defer"),
        class_="peek", data_peek=api)


def client_key(c: dict[str, Any]) -> str:
    return f"client:{c.get('node', '')}/{c.get('remote_address', '')}"


def _client_attrs(c: dict[str, Any]) -> Markup:
    labels = []
    if c.get("sample_rate"):
        labels.append(el("span", f"Sampled {c['sample_rate']}%", class_="badge info"))
    if c.get("tls"):
        detail = " ".join(x for x in (c.get("tls_version"), c.get("tls_cipher_suite"),
                                      c.get("tls_negotiated_protocol")) if x)
        labels.append(el("span", "TLS", class_="badge warn", title=detail or None))
    if c.get("deflate"):
        labels.append(el("span", "Deflate", class_="badge"))
    if c.get("snappy"):
        labels.append(el("span", "Snappy", class_="badge primary"))
    if c.get("authed"):
        ident = c.get("auth_identity") or ""
        badge = el("span", "Authed" + (f": {ident}" if ident else ""), class_="badge ok")
        url = c.get("auth_identity_url") or ""
        if url.startswith(("http://", "https://")):
            badge = el("a", badge, href=url, rel="noopener")
        labels.append(badge)
    if not labels:
        labels.append(el("span", "plain", class_="muted"))
    return join(labels)


def _clients_table(ctx: PageContext, clients: list[dict[str, Any]]) -> Markup:
    if not clients:
        return el("section", el("h2", "Client connections"), _notice("No clients connected to this channel."))
    rows = []
    for c in clients:
        state = c.get("state")
        rows.append(el(
            "tr",
            el("td", el("span", c.get("remote_address", ""), class_="mono"),
               el("small", c.get("hostname", ""), class_="muted block") if c.get("hostname") else "", class_="name"),
            el("td", c.get("client_id", ""), class_="mono"),
            el("td", el("small", c.get("user_agent", "")) if c.get("user_agent") else el("span", "\u2013", class_="muted")),
            el("td", _client_attrs(c), data_v="attrs"),
            el("td", CLIENT_STATES.get(state, "") if state is not None else "\u2013", data_v="state"),
            el("td", el("a", c.get("node", ""), href=ctx.url(f"/nodes/{q(c.get('node', ''))}"))),
            _num(c.get("in_flight_count"), "in_flight_count"),
            _num(c.get("ready_count"), "ready_count"),
            _num(c.get("finish_count"), "finish_count"),
            _num(c.get("requeue_count"), "requeue_count"),
            _num(c.get("message_count"), "message_count"),
            el("td", nanotohuman(c.get("connected")), class_="num", data_v="connected"),
            data_row=client_key(c),
        ))
    head = el("tr", el("th", "Client host"), el("th", "Client ID"), el("th", "User-Agent"), el("th", "Attributes"),
              el("th", "State"), el("th", "nsqd host"), el("th", "In-Flight", class_="num"),
              el("th", "RDY", class_="num", title="ready count"), el("th", "Finished", class_="num"),
              el("th", "Requeued", class_="num"), el("th", "Messages", class_="num"),
              el("th", "Connected", class_="num"))
    return el("section", el("h2", "Client connections ", el("span", str(len(clients)), class_="count")),
              _grid(el("thead", head), el("tbody", *rows), cls="grid clients"))


# --- nodes -------------------------------------------------------------------------------


def node_key(p: dict[str, Any]) -> str:
    host = p.get("broadcast_address", "")
    if ":" in host:
        host = f"[{host}]"
    return f"{host}:{p.get('http_port', 0)}"


def _uptime(p: dict[str, Any]) -> Markup:
    up = p.get("uptime_seconds")
    if up is None:
        return el("td", "\u2013", class_="num muted", data_sort="-1")
    return el("td", fmt_seconds(up), class_="num", data_sort=str(up),
              title=f"started {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(p.get('start_time') or 0))}")


def _opt_num(value: Any, field: str, stale: bool) -> Markup:
    if value is None:
        return el("td", "\u2013", class_="num muted", data_v=field, data_sort="-1")
    if stale:
        return el("td", el("span", "last ", commafy(value), class_="stale", title="the last value this node reported"),
                  class_="num", data_sort=str(value))
    return el("td", commafy(value), class_="num", data_v=field, data_sort=str(value))


def nodes_page(ctx: PageContext, nodes: list[dict[str, Any]], message: str,
               partial: dict[str, Any] | None = None) -> Page:
    lookupd_mode = bool(ctx.lookupds)
    rows = []
    for p in nodes:
        addr = node_key(p)
        topics = p.get("topics") or []
        conns = p.get("remote_addresses") or []
        status = p.get("status", "ok")
        ok = status == "ok"
        conn_cell = ""
        if lookupd_mode:
            conn_cell = el("td", el("span", str(len(conns)),
                                    class_="badge" + (" warn" if len(conns) != len(ctx.lookupds) else ""),
                                    title="\n".join(conns) or "not registered with any nsqlookupd"), class_="num")
        badges = [el("a", t.get("topic", ""), href=ctx.url(f"/topics/{q(t.get('topic', ''))}"),
                     class_="badge " + ("warn" if t.get("tombstoned") else "primary"),
                     title="this topic is currently tombstoned on this node" if t.get("tombstoned") else None)
                  for t in topics]
        rows.append(el(
            "tr",
            el("td", p.get("hostname", ""), class_="name", data_sort=p.get("hostname", "")),
            el("td", el("a", addr, href=ctx.url(f"/nodes/{q(addr)}")),
               el("small", f"TCP {p.get('tcp_port', '')}", class_="muted block"), data_sort=addr),
            # no data-v: the live refresh never rewrites this cell (a change of status re-renders the row,
            # so the "since" and "last seen" times stay)
            el("td", _status_badge(p), *[join([" ", b]) for b in _alert_badges(p.get("alerts"))],
               " " if status == "gone" and ctx.is_admin else "",
               _button("Forget", "forget", "link red",
                       f"Forget node {addr}? nsqadmin stops listing it and stops calling totals partial because of "
                       "it (now, not after --history-retention). It comes back if nsqlookupd lists it again.",
                       label=f"forget node {addr}", node=addr)
               if status == "gone" and ctx.is_admin else "", data_sort=status, class_="status"),
            el("td", p.get("version", ""), " ",
               el("span", "out of date", class_="badge warn") if p.get("out_of_date") else "",
               data_sort=p.get("version", "")),
            _uptime(p),
            _opt_num(p.get("depth"), "depth", not ok),
            _opt_num(p.get("clients"), "clients", not ok),
            conn_cell,
            el("td", el("span", str(len(topics)), class_="count"), " ", *badges, class_="topics"),
            data_row=f"node:{addr}" if ok else f"missing:{addr}", data_status=status,
            class_=("failed" if not ok else "warning" if p.get("out_of_date") else None),
        ))

    def head(label: str, cls: str = "", title: str | None = None) -> Markup:
        return el("th", label, class_=(cls + " sortable").strip(), tabindex="0", aria_sort="none", title=title)
    head_row = el("tr", head("Hostname"), head("HTTP address"), head("Reachability"), head("Version"),
                  head("Uptime", "num", "since the nsqd started (its /stats start_time)"),
                  head("Depth", "num", "messages waiting on the node (topics and channels)"),
                  head("Clients", "num", "channel subscriptions"),
                  el("th", "Lookupd conns.", class_="num") if lookupd_mode else "", el("th", "Topics"))
    body = (_grid(el("thead", head_row), el("tbody", *rows), cls="grid sortable-table") if rows
            else _notice("No nsqd nodes found."))
    content = join([el("header", el("h1", "nsqd nodes ", el("span", str(len(nodes)), class_="count"), " ",
                                    _partial_badge(partial)), class_="page-head"),
                    _warning(message), body])
    return Page("Nodes", "nodes", content, api=ctx.url("/api/nodes"), nav="nodes")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _node_clients(ctx: PageContext, clients: list[dict[str, Any]], width: int) -> list[Markup]:
    """One row per consumer of a channel on the node page (as Go's nsqadmin shows them)."""
    rows = []
    for c in clients:
        state = c.get("state")
        rows.append(el(
            "tr",
            el("td", el("span", c.get("remote_address", ""), class_="mono"), " ",
               el("small", c.get("client_id", "") or c.get("hostname", ""), class_="muted"), class_="client indent2"),
            el("td", join([el("small", c.get("user_agent", "")) if c.get("user_agent") else "", " ",
                           _client_attrs(c), " ",
                           el("span", CLIENT_STATES.get(state, "") if state is not None else "", class_="muted"),
                           el("span", f" connected {nanotohuman(c.get('connected'))}", class_="muted")]),
               colspan=str(width - 7)),
            # under In-Flight, Deferred / RDY, Requeued / Finished, Timed Out / Requeued, Messages
            _num(c.get("in_flight_count"), "in_flight_count"),
            _num(c.get("ready_count"), "ready_count"),
            _num(c.get("finish_count"), "finish_count"),
            _num(c.get("requeue_count"), "requeue_count"),
            _num(c.get("message_count"), "message_count"),
            el("td", ""),
            data_row=client_key(c), class_="client-row",
        ))
    return rows


def node_page(ctx: PageContext, node: str, doc: dict[str, Any], message: str) -> Page:
    topics = doc.get("topics") or []
    status = doc.get("status") or {}
    n_channels = sum(len(t.get("channels") or []) for t in topics)
    down = bool(status) and status.get("status", "ok") != "ok" and not topics

    def card(value: Any, last: Any, field: str, label: str) -> Markup:
        if not down:
            shown: Any = commafy(value)
        elif last is None:
            shown = el("span", "\u2013", class_="stale", title="this node does not answer: no current number")
        else:
            shown = el("span", "last ", commafy(last), class_="stale",
                       title="this node does not answer: the last number it reported")
        return el("div", el("span", shown, class_="big", data_v=None if down else field),
                  el("span", label), class_="card")
    cards = el("div",
               card(len(topics), len(status.get("topics") or []), "topic_count", "topics"),
               card(n_channels, status.get("channel_count"), "channel_count", "channels"),
               card(doc.get("total_clients"), status.get("clients"), "total_clients", "clients"),
               card(doc.get("total_messages"), None, "total_messages", "messages"),
               el("div", el("span", fmt_seconds(status.get("uptime_seconds")) or "\u2013", class_="big"),
                  el("span", "uptime"), class_="card"),
               class_="cards", data_row="total")
    width = 9
    rows = []
    for t in topics:
        name = t.get("topic_name", "")
        tomb = _tombstone(name, node) if ctx.is_admin else ""
        rows.append(el(
            "tr",
            el("td", tomb, el("a", name, href=ctx.url(f"/topics/{q(name)}")), " ",
               _paused_badge(bool(t.get("paused"))), " ",
               el("small", _plural(len(t.get("channels") or []), "channel"), class_="muted"), class_="name"),
            _num(t.get("depth"), "depth"), _mem_disk(t),
            el("td", "", colspan=4), _num(t.get("message_count"), "message_count"), el("td", ""),
            class_="topic-row", data_row=f"topic:{name}", data_paused="1" if t.get("paused") else None,
        ))
        for c in t.get("channels") or []:
            cname = c.get("channel_name", "")
            trouble = channel_trouble(c, None, f"trouble:{name}/{cname}")
            rows.append(el(
                "tr",
                el("td", el("a", cname, href=ctx.url(f"/topics/{q(name)}/{q(cname)}")), " ",
                   _paused_badge(bool(c.get("paused"))), " ", *trouble, class_="name indent"),
                _num(c.get("depth"), "depth"), _mem_disk(c),
                _num(c.get("in_flight_count"), "in_flight_count"), _num(c.get("deferred_count"), "deferred_count"),
                _num(c.get("requeue_count"), "requeue_count"), _num(c.get("timeout_count"), "timeout_count"),
                _num(c.get("message_count"), "message_count"), _num(c.get("client_count"), "client_count"),
                data_row=f"channel:{name}/{cname}", data_paused="1" if c.get("paused") else None,
                class_="trouble" if trouble else None,
            ))
            rows += _node_clients(ctx, c.get("clients") or [], width)
    head = el("tr", el("th", "Topic / channel / client"), el("th", "Depth", class_="num"),
              el("th", "Memory + Disk", class_="num"), el("th", "In-Flight", class_="num"),
              el("th", "Deferred / RDY", class_="num", title="channel: deferred; client: ready count"),
              el("th", "Requeued / Finished", class_="num", title="channel: requeued; client: finished"),
              el("th", "Timed Out / Requeued", class_="num", title="channel: timed out; client: requeued"),
              el("th", "Messages", class_="num"), el("th", "Clients", class_="num"))
    if rows:
        table = _grid(el("thead", head), el("tbody", *rows))
    elif status.get("status", "ok") != "ok":
        table = _notice("No current numbers.", "This node does not answer; it last reported the topics ",
                        ", ".join(status.get("topics") or []) or "(none)", ".")
    else:
        table = _notice("This node has no topics.")
    state_line = (el("p", _status_badge(status), class_="node-status", data_row="status",
                     data_paused="1" if status.get("status", "ok") != "ok" else None)
                  if status else Markup(""))
    content = join([
        _crumbs(ctx, ("Nodes", ctx.url("/nodes")), (node, None)),
        el("header", el("h1", el("span", "nsqd", class_="kind"), " ", node), class_="page-head"),
        state_line,
        _warning(message), cards, table,
        drain_panel(ctx, node, doc.get("drain"), doc.get("replication"), down),
        replication_panel(doc.get("replication")),
        charts_panel(ctx, ctx.url(f"/api/charts/nodes/{q(node)}"), f"node {node}"),
    ])
    return Page(f"Node {node}", "node", content, api=ctx.url(f"/api/nodes/{q(node)}"), nav="nodes")


_SYNC_BADGES = {"in_sync": ("in sync", "ok"), "catching_up": ("catching up", "warn"), "down": ("down", "danger")}


def drain_confirm_text(node: str, rep: dict[str, Any] | None) -> str:
    """What the drain dialog says will happen to ``node`` (its /stats replication section
    says whether a replica peer can take its messages)."""
    peers = [p for p in (rep or {}).get("peers") or [] if p.get("sync_state") == "in_sync"]
    if peers:
        rest = (f"Then it holds delivery, gives the messages in flight up to 2 seconds to be finished, and "
                f"hands everything still queued, deferred or in flight to a replica peer in sync "
                f"({', '.join(str(p.get('address')) for p in peers)}), which adopts it at once; messages still "
                "in flight then may be delivered twice.")
    elif rep and "peers" in rep:
        rest = ("No replica peer is in sync now: it keeps delivering to its connected consumers, and hands "
                "what is left to a peer as soon as one is in sync.")
    else:
        rest = ("It keeps delivering its messages to the consumers connected to it; what they do not take "
                "stays on it.")
    return (f"Drain node {node}? It refuses every publish from now on (producers get E_PUB_FAILED, HTTP 503 "
            "DRAINING, and /ping answers 503, so they move to other nodes) and unregisters its topics from "
            f"nsqlookupd (consumers stop discovering it). {rest} It stays up until it is stopped; "
            "the Undrain button makes it serve again.")


def drain_panel(ctx: PageContext, node: str, drain: dict[str, Any] | None, rep: dict[str, Any] | None,
                down: bool) -> Markup:
    """A node's drain (nsqtw): its progress while it drains; for an admin, the button that starts
    it (with a dialog saying what happens) or cancels it."""
    parts: list[Any] = []
    state = (drain or {}).get("state", "serving")
    if state != "serving":
        assert drain is not None
        peer = f", {commafy(drain.get('handed_off', 0))} handed off to {drain['peer']}" if drain.get("peer") else ""
        parts.append(el("p", el("span", state, class_="badge warn"), " ",
                        f"publishes refused, topics unregistered from nsqlookupd; {commafy(drain.get('queued', 0))} "
                        f"messages queued, {commafy(drain.get('in_flight', 0))} in flight{peer}",
                        class_="drain-status", data_row=f"drain:{state}"))
    if ctx.is_admin and not down:
        if state == "serving":
            parts.append(_button("Drain", "drain", "warn", drain_confirm_text(node, rep),
                                 label=f"drain node {node}", node=node))
        else:
            parts.append(_button("Undrain", "undrain", "primary",
                                 f"Undrain node {node}? It accepts publishes again and registers its topics with "
                                 "nsqlookupd again.", label=f"undrain node {node}", node=node))
    if not parts:
        return Markup("")
    return el("section", el("h2", "Drain"), *parts, class_="drain")


def replication_panel(rep: dict[str, Any] | None) -> Markup:
    """nsqtw's replication of one node (its /stats ``replication`` section): per peer its sync
    state and lag in messages and seconds, the origins it keeps a shadow of, the origins it
    adopted.  Nothing for a node without replication (any Go nsqd)."""
    if not rep:
        return Markup("")
    parts: list[Any] = [el("h2", "Replication")]
    if "peers" in rep:
        status = str(rep.get("status", ""))
        parts.append(el("p", el("span", status, class_="badge " + ("ok" if status == "ok" else "danger")), " ",
                        f"{rep.get('peers_in_sync', 0)} of {len(rep.get('peers') or [])} peers in sync, "
                        f"--replication-min-acks={rep.get('min_acks')}, degraded mode {rep.get('degraded_mode')}; "
                        f"{commafy(rep.get('replicated_messages', 0))} messages replicated, "
                        f"{commafy(rep.get('refused_publishes', 0))} publishes refused",
                        class_="replication-status", data_row=f"replication:{status}"))
        rows = []
        for peer in rep.get("peers") or []:
            label, cls = _SYNC_BADGES.get(str(peer.get("sync_state")), (str(peer.get("state", "")), "warn"))
            rows.append(el(
                "tr", el("td", str(peer.get("address", "")), class_="mono"),
                el("td", "" if peer.get("node_id") is None else str(peer["node_id"]), class_="num"),
                el("td", el("span", label, class_=f"badge {cls}"), " ",
                   el("small", str(peer.get("reason") or ""), class_="muted")),
                el("td", commafy(peer.get("lag_messages", 0)), class_="num", data_v="lag_messages"),
                el("td", f"{float(peer.get('lag_seconds', 0.0)):.3f}s", class_="num", data_v="lag_seconds_text"),
                el("td", commafy(peer.get("unacked_batches", 0)), class_="num", data_v="unacked_batches"),
                data_row=f"peer:{peer.get('address', '')}:{peer.get('sync_state', '')}"))
        head = el("tr", el("th", "Peer"), el("th", "Node ID", class_="num"), el("th", "State"),
                  el("th", "Lag (messages)", class_="num", title="sent and not acknowledged; if down: "
                     "accepted since it went down"),
                  el("th", "Lag (seconds)", class_="num", title="age of the oldest unacknowledged batch; "
                     "if down: how long it has been down"),
                  el("th", "Unacked batches", class_="num"))
        parts.append(_grid(el("thead", head), el("tbody", *rows)) if rows else _notice("No peers."))
    origins = rep.get("origins") or []
    if origins:
        parts.append(el("h3", "Origins linked here"))
        parts.append(_grid(
            el("thead", el("tr", el("th", "Origin node ID"), el("th", "Name"),
                           el("th", "Last heard", class_="num", title="age of its last batch or heartbeat: a link "
                              "silent for --replication-timeout is dropped"),
                           el("th", "Batches", class_="num"))),
            el("tbody", *[el("tr", el("td", str(o.get("origin_node_id", ""))), el("td", str(o.get("name", ""))),
                             el("td", f"{float(o.get('last_heard_seconds', 0.0)):.1f}s ago", class_="num",
                                data_v="last_heard_text"),
                             el("td", commafy(o.get("batches", 0)), class_="num"),
                             data_row=f"origin:{o.get('origin_node_id', '')}") for o in origins])))
    adoption = rep.get("adoption") or {}
    notes: list[Any] = []
    if rep.get("store_error"):
        notes.append(el("li", el("span", "cannot store replicas", class_="badge danger"), " ",
                        str(rep["store_error"])))
    for f in adoption.get("failing") or []:
        notes.append(el("li", el("span", f"adopting node {f.get('origin_node_id')} failing", class_="badge danger"),
                        f" {f.get('error')}: {f.get('tries')} tries, {commafy(f.get('adopted_so_far', 0))} "
                        "messages republished so far; retried until it succeeds", data_row=f"failing:{f.get('origin_node_id')}"))
    for sb in adoption.get("standing_by") or []:
        notes.append(el("li", el("span", f"standing by for node {sb.get('for_node_id')}", class_="badge info"),
                        f" node {sb.get('origin_node_id')} is down; node {sb.get('for_node_id')} (a lower "
                        "--node-id that holds its shadow) adopts it"))
    for ab in adoption.get("adopted_by_peer") or []:
        notes.append(el("li", el("span", f"node {ab.get('origin_node_id')} adopted by node {ab.get('peer_node_id')}",
                                 class_="badge info"), " its shadow here was dropped ", _ts(ab.get("at"))))
    if notes:
        parts.append(el("ul", *notes, class_="replication-notes"))
    shadows = rep.get("shadows") or []
    if shadows:
        parts.append(el("h3", "Shadows kept here"))
        parts.append(_grid(
            el("thead", el("tr", el("th", "Origin node ID"), el("th", "Unfinished messages", class_="num"),
                           el("th", "Topics", class_="num"), el("th", "Log bytes", class_="num"))),
            el("tbody", *[el("tr", el("td", str(sh.get("origin_node_id", ""))),
                             el("td", commafy(sh.get("unfinished_messages", 0)), class_="num",
                                data_v="unfinished_messages"),
                             el("td", commafy(sh.get("topics", 0)), class_="num", data_v="topics"),
                             el("td", commafy(sh.get("log_bytes", 0)), class_="num", data_v="log_bytes"),
                             data_row=f"shadow:{sh.get('origin_node_id', '')}") for sh in shadows])))
    adopted = rep.get("adopted") or []
    if adopted:
        parts.append(el("h3", "Adopted origins"))
        parts.append(_grid(
            el("thead", el("tr", el("th", "Origin node ID"), el("th", "Epoch"), el("th", "When"),
                           el("th", "Messages", class_="num"), el("th", "Refused", class_="num"))),
            el("tbody", *[el("tr", el("td", str(ad.get("origin_node_id", ""))),
                             el("td", str(ad.get("epoch", "")), class_="mono"), el("td", _ts(ad.get("at"))),
                             el("td", commafy(ad.get("messages", 0)), class_="num"),
                             el("td", commafy(ad.get("refused", 0)), class_="num"),
                             data_row=f"adopted:{ad.get('origin_node_id', '')}:{ad.get('epoch', '')}")
                          for ad in adopted])))
    return el("section", *parts, class_="replication")


# --- lookup ---------------------------------------------------------------------------------


def lookup_page(ctx: PageContext, inactive: dict[str, list[str]], message: str) -> Page:
    parts: list[Any] = [el("header", el("h1", "Lookup"), class_="page-head"), _warning(message)]
    if ctx.lookupds:
        parts.append(el("section", el("h2", "nsqlookupd hosts"),
                        el("ul", *[el("li", a, class_="mono") for a in ctx.lookupds], class_="plain")))
        if inactive:
            items = []
            for topic in sorted(inactive):
                chans = [el("li",
                            _button("\u2718", "delete", "link red", f"Delete channel {topic}/{c}?",
                                    topic=topic, channel=c, label=f"delete channel {topic}/{c}")
                            if ctx.is_admin else "",
                            el("a", c, href=ctx.url(f"/topics/{q(topic)}/{q(c)}")),
                            data_row=f"channel:{topic}/{c}")
                         for c in inactive[topic]]
                items.append(el("li",
                                _button("\u2718", "delete", "link red", f"Delete topic {topic}?", topic=topic,
                                        label=f"delete topic {topic}")
                                if ctx.is_admin else "",
                                el("a", topic, href=ctx.url(f"/topics/{q(topic)}")),
                                el("ul", *chans) if chans else "",
                                data_row=f"topic:{topic}"))
            parts.append(el("section", el("h2", "Inactive topics"),
                            el("p", "Topics and channels known to nsqlookupd that no nsqd in the cluster "
                                    "produces.", class_="hint"),
                            el("ul", *items, class_="tree")))
        else:
            parts.append(el("section", el("h2", "Inactive topics"), _notice("No inactive topics.")))
    else:
        parts.append(_notice("No nsqlookupd.", "nsqadmin was started with --nsqd-http-address, so there is no "
                             "lookup data to show; topics and channels created here are created on every "
                             "configured nsqd."))
    if ctx.is_admin:
        parts.append(el(
            "section",
            el("h2", "Create topic / channel"),
            el("form",
               el("p", "Set up a stream hierarchy before services are deployed. If the channel name is empty, "
                       "just the topic is created.", class_="hint"),
               el("label", "Topic", el("input", type="text", name="topic", placeholder="Topic name", required=True,
                                       pattern=r"[.a-zA-Z0-9_\-]+(#ephemeral)?", maxlength="64")),
               el("label", "Channel", el("input", type="text", name="channel", placeholder="Channel name (optional)",
                                         pattern=r"[.a-zA-Z0-9_\-]+(#ephemeral)?", maxlength="64")),
               el("button", "Create", type="submit", class_="btn primary"),
               id="create-form", class_="create"),
        ))
    return Page("Lookup", "lookup", join(parts),
                api=ctx.url("/api/topics?inactive=true") if ctx.lookupds else "", nav="lookup")


# --- counter --------------------------------------------------------------------------------


def counter_page(ctx: PageContext, total: int, message: str, partial: dict[str, Any] | None = None,
                 missing: Sequence[dict[str, Any]] = ()) -> Page:
    note = Markup("")
    if partial:
        note = el("div", _partial_badge(partial), " the sum includes the last counts seen from ",
                  join([join(["; " if i else "",
                              el("a", m.get("node", ""), href=ctx.url(f"/nodes/{q(m.get('node', ''))}")),
                              " (", m.get("status", ""), ", last seen ", _ts(m.get("last_seen")), ")"])
                        for i, m in enumerate(missing)]), class_="hint partial-note", id="counter-partial")
    content = join([
        el("header", el("h1", "Messages processed"), class_="page-head"),
        _warning(message),
        el("div", el("div", commafy(total), id="counter", class_="counter", data_total=str(total)),
           el("div", "messages delivered across every topic and channel of the cluster ",
              el("span", "\u2013", id="counter-rate", class_="rate"), class_="hint"),
           note,
           class_="counter-box"),
        el("section", el("h2", "Cluster message rate"), _spark("total/rate", "message rate of the whole cluster",
                                                               wide=True),
           el("p", "", class_="spark-caption hint")),
    ])
    return Page("Counter", "counter", content, api=ctx.url("/api/counter"), history=ctx.url("/api/history"),
                nav="counter")


_NOT_FOUND = {
    "TOPIC_NOT_FOUND": ("Topic not found", "No nsqd and no nsqlookupd knows this topic: it was deleted, or never "
                                           "created (a topic exists once something is published to it or it is "
                                           "created on the Lookup page)."),
    "CHANNEL_NOT_FOUND": ("Channel not found", "The topic exists but no nsqd and no nsqlookupd knows this channel: "
                                               "it was deleted, or no consumer subscribed to it yet."),
    "NODE_NOT_FOUND": ("Node not found", "nsqadmin does not know this nsqd: it is not listed by nsqlookupd (or "
                                         "configured), or it left long enough ago to be forgotten."),
}


def not_found_page(ctx: PageContext, title: str, text: str, status: int, nav: str = "") -> Page:
    """An API error as a page: for a missing topic, channel or node, what that means and where to go."""
    known = _NOT_FOUND.get(text)
    if known is None:
        return error_page(ctx, title, text, status, nav=nav)
    heading, why = known
    what = title.split(" ", 1)[-1] if " " in title else title
    back = {"topics": ("Topics", "/topics"), "nodes": ("Nodes", "/nodes")}.get(nav, ("Topics", "/topics"))
    content = join([el("header", el("h1", heading), class_="page-head"),
                    el("div", el("strong", what), ": ", why, " ", el("code", text, class_="muted"),
                       class_="alert error", role="alert"),
                    el("p", "See ", el("a", back[0], href=ctx.url(back[1])), " or ",
                       el("a", "Lookup", href=ctx.url("/lookup")), ".", class_="hint")])
    return Page(f"{heading}: {what}", "error", content, status=status, nav=nav)


def error_page(ctx: PageContext, title: str, text: str, status: int, nav: str = "", api: str = "") -> Page:
    """What went wrong; with ``api`` the script keeps polling it and reloads the page once it answers."""
    content = join([el("header", el("h1", title), class_="page-head"),
                    el("div", text, class_="alert error", role="alert"),
                    el("p", "This page reloads by itself once the cluster answers again.", class_="hint")
                    if api else ""])
    return Page(title, "error", content, api=api, status=status, nav=nav)
