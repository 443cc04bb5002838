"""
The ``/stats`` document in the Prometheus text exposition format (0.0.4), for ``GET /metrics``.

NSQ's most asked-for metrics feature (nsqio/nsq#732): instead of running an
exporter that scrapes ``/stats``, nsqd answers Prometheus itself.
:func:`render_metrics` turns one ``/stats`` dict into ``# HELP``/``# TYPE``
blocks, one per metric family, with ``topic``, ``channel`` and client labels
(plus any constant labels, e.g. ``node``).  nsqd's counters (message, requeue,
timeout, finish, publish counts, GC runs) are ``counter``s named ``*_total``;
everything else is a ``gauge``.  End-to-end latency percentiles are gauges in
seconds with a ``quantile`` label: nsqd computes them over a sliding window
(``--e2e-processing-latency-window-time``), so their sample count is not
monotonic and a Prometheus ``summary`` would lie about ``_count``.
"""

from __future__ import annotations

import math
from typing import Any
from collections.abc import Iterable, Mapping

from ...options import parse_duration

__all__ = ["render_metrics", "CONTENT_TYPE"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Labels = tuple[tuple[str, str], ...]


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    v = float(value)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v.is_integer() and abs(v) < 1e15:
        return str(int(v))
    return repr(v)


def _quantile(q: float) -> str:
    text = repr(float(q))
    return text[:-2] if text.endswith(".0") else text


class _Families:
    """Samples grouped by metric family, in first-seen order (the format wants them contiguous)."""

    def __init__(self, const: Labels) -> None:
        self.const = const
        self.meta: dict[str, tuple[str, str]] = {}
        self.samples: dict[str, list[str]] = {}

    def add(self, name: str, kind: str, help_text: str, labels: Iterable[tuple[str, str]], value: Any) -> None:
        if name not in self.meta:
            self.meta[name] = (kind, help_text)
            self.samples[name] = []
        pairs = list(self.const) + list(labels)
        if pairs:
            body = ",".join(f'{k}="{_escape_label(str(v))}"' for k, v in pairs)
            self.samples[name].append(f"{name}{{{body}}} {_number(value)}")
        else:
            self.samples[name].append(f"{name} {_number(value)}")

    def render(self) -> bytes:
        out: list[str] = []
        for name, (kind, help_text) in self.meta.items():
            out.append(f"# HELP {name} {_escape_help(help_text)}")
            out.append(f"# TYPE {name} {kind}")
            out.extend(self.samples[name])
        return ("\n".join(out) + "\n").encode() if out else b""


_TOPIC = (
    ("nsq_topic_depth", "gauge", "depth", "Messages queued at the topic (memory + disk), not yet copied to channels."),
    ("nsq_topic_backend_depth", "gauge", "backend_depth", "Messages of the topic queue on disk."),
    ("nsq_topic_messages_total", "counter", "message_count", "Messages published to the topic since nsqd started."),
    ("nsq_topic_message_bytes_total", "counter", "message_bytes", "Body bytes published to the topic since nsqd started."),
    ("nsq_topic_paused", "gauge", "paused", "1 if the topic is paused."),
)

_CHANNEL = (
    ("nsq_channel_depth", "gauge", "depth", "Messages queued in the channel (memory + disk), excluding in-flight and deferred."),
    ("nsq_channel_backend_depth", "gauge", "backend_depth", "Messages of the channel queue on disk."),
    ("nsq_channel_in_flight", "gauge", "in_flight_count", "Messages sent to clients and not yet finished, requeued or timed out."),
    ("nsq_channel_deferred", "gauge", "deferred_count", "Deferred (DPUB or REQ with delay) messages waiting in the channel."),
    ("nsq_channel_messages_total", "counter", "message_count", "Messages put to the channel since nsqd started."),
    ("nsq_channel_requeued_total", "counter", "requeue_count", "Explicit REQs in the channel since nsqd started."),
    ("nsq_channel_timed_out_total", "counter", "timeout_count", "In-flight timeouts in the channel since nsqd started."),
    ("nsq_channel_clients", "gauge", "client_count", "Consumers subscribed to the channel."),
    ("nsq_channel_paused", "gauge", "paused", "1 if the channel is paused."),
)

_CLIENT = (
    ("nsq_client_ready", "gauge", "ready_count", "The client's RDY count."),
    ("nsq_client_in_flight", "gauge", "in_flight_count", "Messages in flight to the client."),
    ("nsq_client_messages_total", "counter", "message_count", "Messages sent to the client."),
    ("nsq_client_finished_total", "counter", "finish_count", "Messages the client finished (FIN)."),
    ("nsq_client_requeued_total", "counter", "requeue_count", "Messages the client requeued (REQ)."),
    ("nsq_client_connect_time_seconds", "gauge", "connect_ts", "When the client connected (unix seconds)."),
)

_MEM_GAUGES = (
    ("nsq_mem_heap_objects", "heap_objects", "Allocated objects of the nsqd process."),
    ("nsq_mem_heap_idle_bytes", "heap_idle_bytes", "nsqd's heap_idle_bytes (nsqtw: file-backed resident memory)."),
    ("nsq_mem_heap_in_use_bytes", "heap_in_use_bytes", "nsqd's heap_in_use_bytes (nsqtw: anonymous resident memory)."),
    ("nsq_mem_heap_released_bytes", "heap_released_bytes", "nsqd's heap_released_bytes (nsqtw: swapped memory)."),
    ("nsq_mem_next_gc_bytes", "next_gc_bytes", "nsqd's next_gc_bytes (nsqtw: allocations left before the next young collection)."),
)


def _e2e(fam: _Families, prefix: str, what: str, labels: Labels, e2e: Mapping[str, Any] | None) -> None:
    if not e2e or not e2e.get("percentiles"):
        return
    for item in e2e["percentiles"]:
        fam.add(f"{prefix}_e2e_processing_latency_seconds", "gauge",
                f"End-to-end processing latency percentiles of the {what} over nsqd's sliding window, in seconds.",
                labels + (("quantile", _quantile(item["quantile"])),), float(item["value"]) / 1e9)
    fam.add(f"{prefix}_e2e_processing_latency_samples", "gauge",
            f"Latency samples in the {what}'s current percentile window.", labels, e2e.get("count", 0))


def _policy(fam: _Families, cl: Labels, c: Mapping[str, Any]) -> None:
    """A channel's policy (0: a setting is off) and what it did (see nsqtw.nsqd.core.policy)."""
    fam.add("nsq_channel_dead_messages", "gauge", "Dead letters kept by the channel (messages its policy "
            "stopped delivering: past max_attempts, or older than max_age, or over max_depth).", cl, c["dead_count"])
    fam.add("nsq_channel_expired_total", "counter", "Messages not delivered because they were older than the "
            "channel's max_age.", cl, c.get("expired_count", 0))
    fam.add("nsq_channel_dropped_total", "counter", "Messages the channel's policy dropped without keeping a "
            "dead letter.", cl, c.get("dropped_count", 0))
    policy = c.get("policy") or {}
    fam.add("nsq_channel_policy_max_attempts", "gauge", "The channel's max_attempts (0: off).", cl,
            policy.get("max_attempts") or 0)
    age = policy.get("max_age")
    fam.add("nsq_channel_policy_max_age_seconds", "gauge", "The channel's max_age in seconds (0: off).", cl,
            parse_duration(age) if age else 0)
    fam.add("nsq_channel_policy_max_depth", "gauge", "The channel's max_depth (0: off).", cl,
            policy.get("max_depth") or 0)
    fam.add("nsq_channel_policy_max_rate", "gauge", "The channel's max_rate in messages a second (0: off).", cl,
            policy.get("max_rate") or 0)


def render_metrics(stats_doc: Mapping[str, Any], *, labels: Mapping[str, str] | None = None) -> bytes:
    """The Prometheus text page for one ``/stats`` document; ``labels`` are added to every sample."""
    fam = _Families(tuple((k, str(v)) for k, v in (labels or {}).items()))
    version = stats_doc.get("version", "")
    fam.add("nsq_info", "gauge", "Always 1; the nsqd version in a label.", (("version", version),), 1)
    fam.add("nsq_healthy", "gauge", "1 if nsqd reports health OK.", (), stats_doc.get("health") == "OK")
    fam.add("nsq_start_time_seconds", "gauge", "When nsqd started (unix seconds).", (), stats_doc.get("start_time", 0))
    topics = stats_doc.get("topics") or []
    fam.add("nsq_topics", "gauge", "Topics on this nsqd.", (), len(topics))
    for t in topics:
        tl: Labels = (("topic", t["topic_name"]),)
        for name, kind, key, help_text in _TOPIC:
            fam.add(name, kind, help_text, tl, t[key])
        fam.add("nsq_topic_channels", "gauge", "Channels of the topic.", tl, len(t.get("channels") or []))
        _e2e(fam, "nsq_topic", "topic (merged across its channels)", tl, t.get("e2e_processing_latency"))
    for t in topics:
        for c in t.get("channels") or []:
            cl: Labels = (("topic", t["topic_name"]), ("channel", c["channel_name"]))
            for name, kind, key, help_text in _CHANNEL:
                fam.add(name, kind, help_text, cl, c[key])
            fam.add("nsq_channel_held", "gauge", "Messages held in memory because the disk refused "
                    "them (written out when it accepts writes again).", cl, c.get("held_count", 0))
            fam.add("nsq_channel_timeout_extended_total", "counter", "In-flight timeouts extended instead of "
                    "requeued because held memory was at --max-held-bytes.", cl, c.get("timeout_extended_count", 0))
            _e2e(fam, "nsq_channel", "channel", cl, c.get("e2e_processing_latency"))
            if "dead_count" in c:
                _policy(fam, cl, c)
    for t in topics:
        for c in t.get("channels") or []:
            for client in c.get("clients") or []:
                kl: Labels = (("topic", t["topic_name"]), ("channel", c["channel_name"])) + _client_labels(client)
                for name, kind, key, help_text in _CLIENT:
                    fam.add(name, kind, help_text, kl, client[key])
    for client in stats_doc.get("producers") or []:
        for pub in client.get("pub_counts") or []:
            fam.add("nsq_producer_published_total", "counter",
                    "Messages a connected producer published to a topic (nsqd reports one topic per producer).",
                    (("topic", pub["topic"]),) + _client_labels(client), pub["count"])
    held = stats_doc.get("held")
    if held:
        fam.add("nsq_held_messages", "gauge", "Messages held in memory because the disk refused them.", (),
                held["count"])
        fam.add("nsq_held_bytes", "gauge", "Bytes of the messages held in memory because the disk refused them.",
                (), held["bytes"])
        fam.add("nsq_held_max_bytes", "gauge", "--max-held-bytes: the most bytes held before timeouts are "
                "extended instead.", (), held["max_bytes"])
        fam.add("nsq_held_timeouts_extended_total", "counter", "In-flight timeouts extended because held "
                "memory was at --max-held-bytes.", (), held["timeout_extended_count"])
    _replication(fam, stats_doc.get("replication"))
    _drain(fam, stats_doc.get("drain"))
    mem = stats_doc.get("memory")
    if mem:
        for name, key, help_text in _MEM_GAUGES:
            fam.add(name, "gauge", help_text, (), mem[key])
        for key, q in (("gc_pause_usec_95", "0.95"), ("gc_pause_usec_99", "0.99"), ("gc_pause_usec_100", "1")):
            fam.add("nsq_mem_gc_pause_seconds", "gauge", "Percentiles of recent garbage-collector pauses, in seconds.",
                    (("quantile", q),), mem[key] / 1e6)
        fam.add("nsq_mem_gc_runs_total", "counter", "Garbage-collector runs since nsqd started.", (),
                mem["gc_total_runs"])
    return fam.render()


def _client_labels(client: Mapping[str, Any]) -> Labels:
    return (("client_id", str(client.get("client_id", ""))), ("hostname", str(client.get("hostname", ""))),
            ("remote_address", str(client.get("remote_address", ""))),
            ("user_agent", str(client.get("user_agent", ""))))


#: the states of a drain, as /metrics gives them (nsq_drain_state{state=...} is 1 for the current one)
DRAIN_STATES = ("serving", "draining", "holding", "handing_off", "drained")


def _drain(fam: _Families, drain: Mapping[str, Any] | None) -> None:
    """nsqtw's drain (``GET /drain``): its state, what is left and what was handed off."""
    if not drain:
        return
    fam.add("nsq_drain_draining", "gauge", "1 while the node drains or is drained (publishes refused).", (),
            drain.get("state", "serving") != "serving")
    for state in DRAIN_STATES:
        fam.add("nsq_drain_state", "gauge", "1 for the drain's current state.", (("state", state),),
                drain.get("state") == state)
    fam.add("nsq_drain_queued_messages", "gauge", "Messages still queued (deferred included) on a draining node.",
            (), drain.get("queued", 0))
    fam.add("nsq_drain_in_flight_messages", "gauge", "Messages still in flight on a draining node.", (),
            drain.get("in_flight", 0))
    fam.add("nsq_drain_handed_off_messages_total", "counter", "Messages a replica peer adopted from this node's "
            "drain.", (), drain.get("handed_off", 0))


def _replication(fam: _Families, rep: Mapping[str, Any] | None) -> None:
    """nsqtw's replication (only on a node with ``--replica-peer`` or ``--replication-address``):
    per peer its sync state and lag, per adopted origin what was adopted."""
    if not rep:
        return
    if "peers" in rep:
        fam.add("nsq_replication_min_acks", "gauge", "--replication-min-acks: peers that must store a "
                "message before its publisher gets OK.", (), rep.get("min_acks", 0))
        fam.add("nsq_replication_peers_in_sync", "gauge", "Peers in sync now.", (), rep.get("peers_in_sync", 0))
        fam.add("nsq_replication_degraded", "gauge", "1 while fewer peers are in sync than --replication-min-acks.",
                (), rep.get("status", "ok") != "ok")
        fam.add("nsq_replication_replicated_messages_total", "counter", "Messages sent to the peers in sync.",
                (), rep.get("replicated_messages", 0))
        fam.add("nsq_replication_refused_publishes_total", "counter", "Publishes refused because too few "
                "peers were in sync.", (), rep.get("refused_publishes", 0))
    for p in rep.get("peers") or []:
        pl: Labels = (("peer", str(p.get("address", ""))),)
        sync = p.get("sync_state", "")
        fam.add("nsq_replication_peer_in_sync", "gauge", "1 if the peer is in sync (counts toward "
                "--replication-min-acks).", pl, sync == "in_sync")
        fam.add("nsq_replication_peer_catching_up", "gauge", "1 if the peer is catching up.", pl,
                sync == "catching_up")
        fam.add("nsq_replication_peer_down", "gauge", "1 if the peer is down (connecting, refused, stalled).",
                pl, sync == "down")
        fam.add("nsq_replication_peer_lag_messages", "gauge", "Messages the peer has not acknowledged (if "
                "down: messages accepted since it went down).", pl, p.get("lag_messages", 0))
        fam.add("nsq_replication_peer_lag_seconds", "gauge", "Age of the oldest message the peer has not "
                "acknowledged (if down: seconds since it went down).", pl, p.get("lag_seconds", 0.0))
    for sh in rep.get("shadows") or []:
        ol: Labels = (("origin_node_id", str(sh.get("origin_node_id", ""))),)
        fam.add("nsq_replication_shadow_messages", "gauge", "Unfinished messages held for an origin "
                "(what adopting it would republish).", ol, sh.get("unfinished_messages", 0))
        fam.add("nsq_replication_shadow_log_bytes", "gauge", "Size of an origin's shadow log.", ol,
                sh.get("log_bytes", 0))
    for o in rep.get("origins") or []:
        ol = (("origin_node_id", str(o.get("origin_node_id", ""))),)
        fam.add("nsq_replication_origin_last_heard_seconds", "gauge", "Seconds since a linked origin's last "
                "batch or heartbeat (a link silent for --replication-timeout is dropped).", ol,
                o.get("last_heard_seconds", 0.0))
    adoption = rep.get("adoption") or {}
    for f in adoption.get("failing") or []:
        ol = (("origin_node_id", str(f.get("origin_node_id", ""))),)
        fam.add("nsq_replication_adoption_failing", "gauge", "1 while adopting an origin fails (a full disk); "
                "it is tried again until it succeeds.", ol, 1)
        fam.add("nsq_replication_adoption_failed_tries", "gauge", "Failed tries of the adoption now failing.",
                ol, f.get("tries", 0))
    for sb in adoption.get("standing_by") or []:
        ol = (("origin_node_id", str(sb.get("origin_node_id", ""))),)
        fam.add("nsq_replication_adoption_standing_by", "gauge", "1 while this node stands by for a peer "
                "with a lower --node-id that adopts the origin.", ol, 1)
    maintenance = rep.get("maintenance")
    if "epoch" in rep:  # an origin: its own window (0 when none)
        fam.add("nsq_replication_maintenance_seconds", "gauge", "Seconds left of the maintenance window this "
                "node asked its peers for (they do not adopt it meanwhile); 0: none.", (),
                (maintenance or {}).get("remaining_seconds", 0.0))
    for w in rep.get("maintenance_windows") or []:
        ol = (("origin_node_id", str(w.get("origin_node_id", ""))),)
        fam.add("nsq_replication_origin_maintenance_seconds", "gauge", "Seconds left of an origin's maintenance "
                "window: it is not adopted here meanwhile.", ol, w.get("remaining_seconds", 0.0))
    if "store_error" in rep:
        fam.add("nsq_replication_store_failing", "gauge", "1 while this node cannot store its origins' "
                "batches (a full disk).", (), bool(rep.get("store_error")))
    totals: dict[str, list[int]] = {}
    for ad in rep.get("adopted") or []:
        key = str(ad.get("origin_node_id", ""))
        t = totals.setdefault(key, [0, 0, 0])
        t[0] += int(ad.get("messages", 0))
        t[1] += 1
        t[2] = max(t[2], int(ad.get("epoch", 0)))
    for origin, (messages, count, epoch) in totals.items():
        ol = (("origin_node_id", origin),)
        fam.add("nsq_replication_adopted_messages_total", "counter", "Messages of an origin adopted "
                "(republished here) after it went down.", ol, messages)
        fam.add("nsq_replication_adoptions_total", "counter", "Times an origin was adopted here.", ol, count)
        fam.add("nsq_replication_last_adopted_epoch_seconds", "gauge", "When an origin was last adopted "
                "(its adopted epoch, unix seconds).", ol, epoch / 1e9)
