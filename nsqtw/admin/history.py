"""
nsqadmin's own short memory of the cluster, so graphs need no graphite.

:class:`History` keeps the last ``size`` samples of every topic and channel
(depth, in-flight, message count; per node and summed) taken from the merged
``/stats`` of all nsqd.  Rates are message-count deltas per second computed
node by node, so a node that misses a poll or restarts (its counters fall)
never shows up as a spike.  Nothing here does I/O; the admin service's poller
feeds it.
"""

from __future__ import annotations

from collections import deque
from typing import Any
from collections.abc import Iterable, Sequence

import attr

from .cluster import TopicStats

__all__ = ["History", "Sample", "HISTORY_FORMAT", "last_value", "current_value", "rising", "growing", "GROWING_POLLS"]

# per node: (depth, in_flight_count, message_count)
_Counts = tuple[int, int, int]


@attr.s(slots=True)
class ChannelSample:
    depth: int = attr.ib(default=0)
    in_flight_count: int = attr.ib(default=0)
    message_count: int = attr.ib(default=0)
    client_count: int = attr.ib(default=0)
    timeout_count: int = attr.ib(default=0)
    paused: bool = attr.ib(default=False)
    nodes: dict[str, _Counts] = attr.ib(factory=dict)


@attr.s(slots=True)
class TopicSample:
    depth: int = attr.ib(default=0)
    #: what its channels hold (the backlog consumers have not taken yet)
    backlog: int = attr.ib(default=0)
    message_count: int = attr.ib(default=0)
    paused: bool = attr.ib(default=False)
    nodes: dict[str, _Counts] = attr.ib(factory=dict)
    channels: dict[str, ChannelSample] = attr.ib(factory=dict)


# per (topic, channel or "", node): memory depth, backend depth, message count, in flight, deferred,
# requeued, timed out, clients (counters as nsqd reports them; rates are computed from them)
_Row = tuple[int, int, int, int, int, int, int, int]
_MEM, _DISK, _MSG, _INFLIGHT, _DEFERRED, _REQUEUE, _TIMEOUT, _CLIENTS = range(8)


@attr.s(slots=True)
class Sample:
    t: float = attr.ib()
    topics: dict[str, TopicSample] = attr.ib(factory=dict)
    #: the nodes that did not answer this poll
    failed: frozenset[str] = attr.ib(default=frozenset())
    #: the nodes that left nsqlookupd (killed, or stopped) and are not forgotten yet: not asked, so
    #: every sum this sample gives is partial
    gone: frozenset[str] = attr.ib(default=frozenset())
    rows: dict[tuple[str, str, str], _Row] = attr.ib(factory=dict)
    #: per (topic, channel, node): quantile -> end-to-end latency (ns), when nsqd reports percentiles
    e2e: dict[tuple[str, str, str], dict[float, float]] = attr.ib(factory=dict)


#: the format of :meth:`History.to_doc` (``--history-path``)
HISTORY_FORMAT = 1


def _sample_doc(s: Sample) -> dict[str, Any]:
    return {
        "t": s.t, "failed": sorted(s.failed), "gone": sorted(s.gone),
        "rows": [[*k, *r] for k, r in s.rows.items()],
        "e2e": [[*k, [[q, v] for q, v in d.items()]] for k, d in s.e2e.items()],
        "topics": {name: attr.asdict(t) for name, t in s.topics.items()},
    }


def _row(values: Sequence[Any]) -> _Row:
    a, b, c, d, e, f, g, h = (int(x) for x in values)
    return a, b, c, d, e, f, g, h


def _sample_of(doc: dict[str, Any]) -> Sample:
    def counts(nodes: dict[str, Any]) -> dict[str, _Counts]:
        return {n: (int(c[0]), int(c[1]), int(c[2])) for n, c in nodes.items()}
    topics = {}
    for name, t in doc["topics"].items():
        channels = {cn: ChannelSample(**{**c, "nodes": counts(c["nodes"])}) for cn, c in t["channels"].items()}
        topics[name] = TopicSample(**{**t, "nodes": counts(t["nodes"]), "channels": channels})
    return Sample(
        float(doc["t"]), topics=topics, failed=frozenset(doc["failed"]), gone=frozenset(doc["gone"]),
        rows={(r[0], r[1], r[2]): _row(r[3:11]) for r in doc["rows"]},
        e2e={(e[0], e[1], e[2]): {float(q): float(v) for q, v in e[3]} for e in doc["e2e"]},
    )


def last_value(series: Sequence[Any] | None) -> Any:
    """The newest non-null point of a series."""
    for v in reversed(series or ()):
        if v is not None:
            return v
    return None


def current_value(series: Sequence[Any] | None) -> tuple[Any, Any]:
    """(the newest point, or None when the newest poll had none; the last non-null point before it).

    A table cell shows the first; when it is None and the second is not, the
    second is shown greyed and labelled as the last value seen, never as current."""
    if not series:
        return None, None
    if series[-1] is not None:
        return series[-1], None
    return None, last_value(series)


def rising(series: Sequence[Any] | None) -> bool:
    """Whether the last two points exist and the newer is higher (e.g. timeouts still happening)."""
    if not series or len(series) < 2 or series[-1] is None or series[-2] is None:
        return False
    return bool(series[-1] > series[-2])


#: a channel's backlog is "growing" when its depth rose at each of this many polls in a row
GROWING_POLLS = 3


def growing(series: Sequence[Any] | None, polls: int = GROWING_POLLS) -> bool:
    """Whether the last ``polls + 1`` points exist and each is higher than the one before (a backlog
    its consumers do not keep up with)."""
    tail = list(series or ())[-(polls + 1):]
    if len(tail) < polls + 1 or any(v is None for v in tail):
        return False
    return all(b > a for a, b in zip(tail, tail[1:], strict=False))


def _rate(prev: dict[str, _Counts] | None, cur: dict[str, _Counts] | None, dt: float) -> float | None:
    """Messages per second summed over the nodes present in both samples."""
    if prev is None or cur is None or dt <= 0:
        return None
    total = 0.0
    seen = False
    for node, counts in cur.items():
        before = prev.get(node)
        if before is None:
            continue
        seen = True
        delta = counts[2] - before[2]
        if delta > 0:
            total += delta / dt
    return round(total, 3) if seen else None


#: how many thinned samples cover ``retention`` (the charts' longest range)
COARSE_POINTS = 720


class History:
    """A ring of cluster samples; series come out aligned with ``timestamps``.

    The newest ``size`` samples are kept as taken (tables and sparklines use
    those); older ones are thinned to at most one per ``retention /
    COARSE_POINTS`` seconds and dropped after ``retention`` (the charts use
    both), so memory stays bounded whatever the retention."""

    def __init__(self, size: int, interval: float, retention: float = 0.0) -> None:
        self.size = size
        self.interval = interval
        self.retention = max(retention, size * interval)
        self.coarse_step = max(interval, self.retention / COARSE_POINTS)
        self.samples: deque[Sample] = deque(maxlen=size)
        self.coarse: deque[Sample] = deque()
        self.message = ""

    def _keep(self, sample: Sample) -> None:
        """Add ``sample``; the one that falls off the full-resolution ring is thinned into ``coarse``."""
        if len(self.samples) == self.samples.maxlen:
            old = self.samples[0]
            if not self.coarse or old.t - self.coarse[-1].t >= self.coarse_step:
                self.coarse.append(old)
        self.samples.append(sample)
        horizon = sample.t - self.retention
        while self.coarse and self.coarse[0].t < horizon:
            self.coarse.popleft()

    def record(self, t: float, topics: Iterable[TopicStats], message: str = "",
               failed: Iterable[str] = (), gone: Iterable[str] = ()) -> Sample:
        """Add one poll's per-node topic rows (as :func:`~nsqtw.admin.cluster.aggregate_stats` gives);
        ``failed``: the nodes that did not answer (their topics get gaps, not their last values);
        ``gone``: the nodes that left nsqlookupd (charts mark their samples as partial)."""
        sample = Sample(t, failed=frozenset(failed), gone=frozenset(gone) - frozenset(failed))
        for ts in topics:
            sample.rows[(ts.topic_name, "", ts.node)] = (ts.memory_depth, ts.backend_depth, ts.message_count,
                                                         0, 0, 0, 0, 0)
            for cs in ts.channels or []:
                sample.rows[(ts.topic_name, cs.channel_name, ts.node)] = (
                    cs.memory_depth, cs.backend_depth, cs.message_count, cs.in_flight_count, cs.deferred_count,
                    cs.requeue_count, cs.timeout_count, cs.client_count)
                e2e = cs.e2e_processing_latency
                if e2e is not None and e2e.percentiles:
                    sample.e2e[(ts.topic_name, cs.channel_name, ts.node)] = {
                        float(p.get("quantile", 0.0)): float(p.get("value", p.get("average", 0.0)))
                        for p in e2e.percentiles}
            topic = sample.topics.get(ts.topic_name)
            if topic is None:
                topic = sample.topics[ts.topic_name] = TopicSample()
            topic.depth += ts.depth
            topic.message_count += ts.message_count
            topic.paused = topic.paused or ts.paused
            topic.nodes[ts.node] = (ts.depth, 0, ts.message_count)
            for cs in ts.channels or []:
                ch = topic.channels.get(cs.channel_name)
                if ch is None:
                    ch = topic.channels[cs.channel_name] = ChannelSample()
                ch.depth += cs.depth
                ch.in_flight_count += cs.in_flight_count
                ch.message_count += cs.message_count
                ch.client_count += cs.client_count
                ch.timeout_count += cs.timeout_count
                topic.backlog += cs.depth
                ch.paused = ch.paused or cs.paused
                ch.nodes[ts.node] = (cs.depth, cs.in_flight_count, cs.message_count)
        self._keep(sample)
        self.message = message
        return sample

    # --- on disk (``--history-path``) ---------------------------------------------

    def snapshot(self) -> tuple[list[Sample], list[Sample]]:
        """The samples as they are now (cheap; the samples themselves never change once recorded)."""
        return list(self.coarse), list(self.samples)

    def to_doc(self, snapshot: tuple[list[Sample], list[Sample]] | None = None) -> dict[str, Any]:
        coarse, samples = snapshot if snapshot is not None else self.snapshot()
        return {"format": HISTORY_FORMAT, "interval": self.interval,
                "coarse": [_sample_doc(x) for x in coarse], "samples": [_sample_doc(x) for x in samples]}

    def load_doc(self, doc: dict[str, Any], now: float) -> int:
        """Take the samples of a saved history (what :meth:`to_doc` wrote) that ``retention`` still
        covers at ``now``; returns how many.  A document of another format raises ValueError."""
        if not isinstance(doc, dict) or doc.get("format") != HISTORY_FORMAT:
            raise ValueError(f"not an nsqadmin history of format {HISTORY_FORMAT}")
        horizon = now - self.retention
        loaded = [_sample_of(x) for x in list(doc.get("coarse") or []) + list(doc.get("samples") or [])]
        loaded = sorted((x for x in loaded if horizon <= x.t <= now), key=lambda x: x.t)
        self.samples.clear()
        self.coarse.clear()
        for sample in loaded:
            self._keep(sample)
        return len(loaded)

    # --- series ------------------------------------------------------------------

    def timestamps(self) -> list[int]:
        return [int(s.t) for s in self.samples]

    def _series(self, pick: Any) -> dict[str, list[Any]]:
        """depth / message_count / in_flight_count / rate series of whatever ``pick`` selects."""
        depth: list[Any] = []
        count: list[Any] = []
        inflight: list[Any] = []
        rate: list[Any] = []
        prev_nodes: dict[str, _Counts] | None = None
        prev_t = 0.0
        for s in self.samples:
            found = pick(s)
            if found is None:
                depth.append(None)
                count.append(None)
                inflight.append(None)
                rate.append(None)
                prev_nodes = None
                continue
            d, m, f, nodes = found
            depth.append(d)
            count.append(m)
            inflight.append(f)
            rate.append(_rate(prev_nodes, nodes, s.t - prev_t))
            prev_nodes, prev_t = nodes, s.t
        return {"depth": depth, "in_flight_count": inflight, "message_count": count, "rate": rate}

    @staticmethod
    def _node_pick(nodes_of: Any, node: str) -> Any:
        def pick(s: Sample) -> Any:
            nodes = nodes_of(s)
            if nodes is None or node not in nodes:
                return None
            d, f, m = nodes[node]
            return d, m, f, {node: nodes[node]}
        return pick

    def _envelope(self) -> dict[str, Any]:
        return {"interval": self.interval, "timestamps": self.timestamps()}

    def _gaps(self, nodes: set[str] | None) -> list[bool]:
        """Per sample: whether a node of the scope (``nodes``; None: any node) did not answer, so its
        sums are partial (sparklines break there instead of dipping)."""
        if nodes is None:
            return [bool(s.failed) for s in self.samples]
        return [bool(s.failed & nodes) for s in self.samples]

    def _topic_nodes(self, name: str) -> set[str]:
        return {n for s in self.samples if name in s.topics for n in s.topics[name].nodes}

    def overview(self) -> dict[str, Any]:
        """Every topic's totals, and the whole cluster's message count (``/api/history``)."""
        out = self._envelope()
        names = sorted({name for s in self.samples for name in s.topics})
        topics: dict[str, Any] = {}
        newest = self.samples[-1] if self.samples else None
        for name in names:
            def pick(s: Sample, name: str = name) -> Any:
                t = s.topics.get(name)
                if t is None:
                    return None
                return t.depth, t.message_count, 0, t.nodes
            series: dict[str, Any] = self._series(pick)
            del series["in_flight_count"]
            series["backlog"] = [None if s.topics.get(name) is None else s.topics[name].backlog
                                 for s in self.samples]
            current = newest.topics.get(name) if newest else None
            series["channel_count"] = len(current.channels) if current else None
            series["paused"] = bool(current.paused) if current else False
            series["gaps"] = self._gaps(self._topic_nodes(name))
            topics[name] = series
        out["topics"] = topics

        def total(s: Sample) -> Any:
            nodes = {f"{tn}:{cn}:{node}": counts
                     for tn, t in s.topics.items() for cn, c in t.channels.items()
                     for node, counts in c.nodes.items()}
            return 0, sum(c[2] for c in nodes.values()), 0, nodes
        series = self._series(total) if self.samples else {"message_count": [], "rate": []}
        out["total"] = {"message_count": series["message_count"], "rate": series["rate"], "gaps": self._gaps(None)}
        out["message"] = self.message
        return out

    def topic(self, name: str) -> dict[str, Any]:
        """One topic: its totals, each node's, and each channel's (``/api/history/:topic``)."""
        out = self._envelope()

        def topic_pick(s: Sample) -> Any:
            t = s.topics.get(name)
            return None if t is None else (t.depth, t.message_count, 0, t.nodes)
        series = self._series(topic_pick)
        del series["in_flight_count"]
        series["gaps"] = self._gaps(self._topic_nodes(name))
        out["topic"] = series
        node_names = sorted({n for s in self.samples if name in s.topics for n in s.topics[name].nodes})
        nodes = {}
        for node in node_names:
            ns = self._series(self._node_pick(
                lambda s: s.topics[name].nodes if name in s.topics else None, node))
            del ns["in_flight_count"]
            nodes[node] = ns
        out["nodes"] = nodes
        channel_names = sorted({c for s in self.samples if name in s.topics for c in s.topics[name].channels})
        channels = {}
        for cname in channel_names:
            def ch_pick(s: Sample, cname: str = cname) -> Any:
                t = s.topics.get(name)
                c = t.channels.get(cname) if t else None
                return None if c is None else (c.depth, c.message_count, c.in_flight_count, c.nodes)
            channels[cname] = self._series(ch_pick)
            channels[cname]["gaps"] = self._gaps({n for s in self.samples if name in s.topics
                                                  and cname in s.topics[name].channels
                                                  for n in s.topics[name].channels[cname].nodes})
            channels[cname]["timeout_count"] = [
                None if s.topics.get(name) is None or s.topics[name].channels.get(cname) is None
                else s.topics[name].channels[cname].timeout_count for s in self.samples]
        out["channels"] = channels
        out["message"] = self.message
        return out

    def channel(self, topic: str, channel: str) -> dict[str, Any]:
        """One channel: its totals and each node's (``/api/history/:topic/:channel``)."""
        out = self._envelope()

        def find(s: Sample) -> ChannelSample | None:
            t = s.topics.get(topic)
            return t.channels.get(channel) if t else None

        def pick(s: Sample) -> Any:
            c = find(s)
            return None if c is None else (c.depth, c.message_count, c.in_flight_count, c.nodes)
        out["channel"] = self._series(pick)
        node_names = sorted({n for s in self.samples for n in ((find(s) or ChannelSample()).nodes)})
        out["channel"]["gaps"] = self._gaps(set(node_names))
        out["nodes"] = {
            node: self._series(self._node_pick(lambda s: (getattr(find(s), "nodes", None)), node))
            for node in node_names
        }
        out["message"] = self.message
        return out

    # --- charts -------------------------------------------------------------------------

    def window(self, since: float | None = None) -> list[Sample]:
        """Thinned older samples then the full-resolution ones, from ``since`` on."""
        out = list(self.coarse) + list(self.samples)
        if since is not None:
            out = [s for s in out if s.t >= since]
        return out

    def charts(self, topic: str | None = None, channel: str | None = None, node: str | None = None,
               since: float | None = None) -> dict[str, Any]:
        """The chart series of a topic, a channel (``topic`` and ``channel``) or a node (``node``).

        ``memory_depth``/``backend_depth``, ``in_flight_count``, ``deferred_count`` and ``clients`` are
        sums; ``publish_rate``, ``finish_rate`` (as the Spark job computes it: messages put to the channel
        minus the growth of what it holds), ``requeue_rate`` and ``timeout_rate`` are per second between
        consecutive samples; ``e2e:<quantile>`` (channels) the nodes' average.  A sample in which a node of
        the scope did not answer is a gap (None), never a zero or a partial sum; one in which a node of the
        scope had left nsqlookupd (killed or stopped, not yet forgotten) is drawn from the nodes that remain
        and flagged in ``partial``.  Samples from before the scope first appears are neither (``created``
        says when it did).  A topic's depth is everything it holds: its own queue and its channels'."""
        samples = self.window(since)

        def depth_key(k: tuple[str, str, str]) -> bool:
            if node is not None:
                return k[2] == node
            if channel is None:
                return k[0] == topic
            return k[0] == topic and k[1] == channel

        def pub_key(k: tuple[str, str, str]) -> bool:
            if node is not None:
                return k[2] == node and k[1] == ""
            return k[0] == topic and k[1] == (channel or "")

        def chan_key(k: tuple[str, str, str]) -> bool:
            if node is not None:
                return k[2] == node and k[1] != ""
            if channel is not None:
                return k[0] == topic and k[1] == channel
            return k[0] == topic and k[1] != ""

        # the scope's nodes and its creation as the whole history knows them, not only the range
        # drawn: a node silent for longer than the range still holds the scope (its polls are gaps)
        known = self.window() if since is not None else samples
        nodes = {k[2] for s in known for k in s.rows if depth_key(k) or chan_key(k)}
        first = next((s.t for s in known if s.t < (since or 0.0) and any(depth_key(k) or chan_key(k) for k in s.rows)),
                     None)
        names = ("memory_depth", "backend_depth", "publish_rate", "finish_rate", "in_flight_count",
                 "deferred_count", "requeue_rate", "timeout_rate", "clients")
        series: dict[str, list[Any]] = {n: [] for n in names}
        quantiles = sorted({q for s in samples for k, v in s.e2e.items() if chan_key(k) for q in v})
        for q in quantiles:
            series[f"e2e:{q:g}"] = []
        gaps: list[bool] = []
        partial: list[bool] = []
        prev: Sample | None = None
        created: int | None = int(first) if first is not None else None
        for s in samples:
            present = any(depth_key(k) or chan_key(k) for k in s.rows)
            if created is None and present:
                created = int(s.t)
            # before it existed there is nothing to miss: blank, not shaded
            gap = created is not None and (bool(nodes & s.failed) or not present)
            gaps.append(gap)
            partial.append(not gap and present and bool(nodes & s.gone))
            if gap or not present:
                for values in series.values():
                    values.append(None)
                prev = None
                continue
            drows = [r for k, r in s.rows.items() if depth_key(k)]
            crows = [r for k, r in s.rows.items() if chan_key(k)]
            series["memory_depth"].append(sum(r[_MEM] for r in drows))
            series["backend_depth"].append(sum(r[_DISK] for r in drows))
            series["in_flight_count"].append(sum(r[_INFLIGHT] for r in crows))
            series["deferred_count"].append(sum(r[_DEFERRED] for r in crows))
            series["clients"].append(sum(r[_CLIENTS] for r in crows))
            dt = s.t - prev.t if prev is not None else 0.0
            for name, keyf, delta in (
                    ("publish_rate", pub_key, lambda a, b: b[_MSG] - a[_MSG]),
                    ("finish_rate", chan_key, lambda a, b: (b[_MSG] - a[_MSG]) - (
                        (b[_MEM] + b[_DISK] + b[_INFLIGHT] + b[_DEFERRED])
                        - (a[_MEM] + a[_DISK] + a[_INFLIGHT] + a[_DEFERRED]))),
                    ("requeue_rate", chan_key, lambda a, b: b[_REQUEUE] - a[_REQUEUE]),
                    ("timeout_rate", chan_key, lambda a, b: b[_TIMEOUT] - a[_TIMEOUT])):
                series[name].append(_chart_rate(prev, s, keyf, delta, dt))
            for q in quantiles:
                vals = [v[q] for k, v in s.e2e.items() if chan_key(k) and q in v]
                series[f"e2e:{q:g}"].append(round(sum(vals) / len(vals), 1) if vals else None)
            prev = s
        return {"interval": self.interval, "retention": self.retention, "timestamps": [int(s.t) for s in samples],
                "series": series, "gaps": gaps, "partial": partial, "created": created,
                "gone": sorted({n for s in samples for n in s.gone & nodes}), "message": self.message}


def _chart_rate(prev: Sample | None, cur: Sample, keyf: Any, delta: Any, dt: float) -> float | None:
    """Per-second sum over the rows in both samples; a counter that fell (a restart) counts as nothing."""
    if prev is None or dt <= 0:
        return None
    total = 0.0
    seen = False
    for k, row in cur.rows.items():
        if not keyf(k):
            continue
        before = prev.rows.get(k)
        if before is None or row[_MSG] < before[_MSG]:
            continue
        seen = True
        total += max(0, delta(before, row)) / dt
    return round(total, 3) if seen else None
