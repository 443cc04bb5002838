"""
The ``/stats`` document, field for field as nsqd 1.3.0 writes it.

:func:`broker_stats` returns plain dicts whose key order is Go's struct order,
so ``json.dumps`` of them is byte-compatible with nsqd's answer (up to values).
:func:`render_text` prints the ``format=text`` page the way nsqd's
``printStats`` does.  Nothing here touches a reactor; times come in as ``now``.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from ... import NSQ_VERSION, version_line
from ..core.broker import Broker
from ..core.channel import Channel
from ..core.client import ClientState
from ..core.peek import oldest_timestamp
from ..core.quantile import merge_quantiles
from ..core.topic import Topic
from ...protocol.gojson import go_json
from ...runtime.memory import mem_stats

__all__ = ["broker_stats", "held_stats", "client_stats", "render_text", "go_json", "nanoseconds_to_human", "go_duration_text"]


def client_stats(client: ClientState, topic_filter: str = "") -> dict[str, Any]:
    """nsqd's ``ClientV2Stats`` for one connection."""
    out: dict[str, Any] = {
        "client_id": client.client_id,
        "hostname": client.hostname,
        "version": "V2",
        "remote_address": client.remote_address,
        "state": client.state,
        "ready_count": client.rdy,
        "in_flight_count": client.in_flight,
        "message_count": client.message_count,
        "finish_count": client.finish_count,
        "requeue_count": client.requeue_count,
        "connect_ts": int(client.connect_ts),
        "sample_rate": client.sample_rate,
        "deflate": client.deflate,
        "snappy": client.snappy,
        "user_agent": client.user_agent,
    }
    auth = client.auth
    if auth is not None:
        out["authed"] = True
        if auth.identity:
            out["auth_identity"] = auth.identity
        if auth.identity_url:
            out["auth_identity_url"] = auth.identity_url
    # nsqd's loop breaks after the first entry, so at most one pub count is reported
    for topic, count in client.pub_counts.items():
        if topic_filter and topic != topic_filter:
            continue
        out["pub_counts"] = [{"topic": topic, "count": count}]
        break
    out["tls"] = client.tls
    version, cipher, _ = client.tls_details() if client.tls else ("", "", "")
    out["tls_cipher_suite"] = cipher
    out["tls_version"] = version
    out["tls_negotiated_protocol"] = ""
    out["tls_negotiated_protocol_is_mutual"] = False
    return out


def _channel_stats(ch: Channel, include_clients: bool, topic_filter: str, now: float,
                   include_oldest: bool = False, include_policies: bool = False) -> dict[str, Any]:
    out = {
        "channel_name": ch.name,
        "depth": ch.depth(),
        "backend_depth": ch.backend.depth(),
        "in_flight_count": len(ch.inflight),
        "deferred_count": len(ch.deferred),
        "message_count": ch.message_count,
        "requeue_count": ch.requeue_count,
        "timeout_count": ch.timeout_count,
        "client_count": len(ch.clients),
        "clients": ([client_stats(c, topic_filter) for c in ch.clients.values()]
                    if include_clients else None),
        "paused": ch.paused,
        "e2e_processing_latency": ch.e2e_result(now),
    }
    # nsqtw only, and only while it is not zero (so the document keeps Go's shape otherwise):
    # messages held in memory because the disk refused them (see nsqtw.nsqd.core.backlog)
    held = ch.broker.backlog.held_count(ch)
    if held:
        out["held_count"] = held
    # nsqtw only, only when asked (``include_oldest_message_ts=true``, which nsqadmin sends) and only
    # while something is queued: when the oldest queued message was published (unix seconds; the
    # memory queue's head or the disk queue's, whichever is older).  Never by default, so the
    # document stays Go's byte for byte.
    if include_oldest and out["depth"]:
        oldest = oldest_timestamp(ch.mem, ch.backend)
        if oldest is not None:
            out["oldest_message_ts"] = oldest // 1_000_000_000
    # timeouts extended instead of requeued while held memory was at --max-held-bytes
    if ch.timeout_extended_count:
        out["timeout_extended_count"] = ch.timeout_extended_count
    # nsqtw only, only when asked (``include_policies=true``: nsqadmin and /metrics ask): the
    # channel's policy (null settings are off) and what it did (see nsqtw.nsqd.core.policy)
    if include_policies:
        policy = ch.policy
        out["policy"] = policy.to_json() if policy is not None else None
        out["dead_count"] = len(ch.dead) if ch.dead is not None else 0
        out["expired_count"] = ch.expired_count
        out["dropped_count"] = ch.dropped_count
    return out


def held_stats(broker: Broker) -> dict[str, int]:
    """nsqtw's held-for-the-disk figures (see nsqtw.nsqd.core.backlog): messages and bytes held,
    the cap (``--max-held-bytes``) and timeouts extended at the cap since the start."""
    backlog = broker.backlog
    return {
        "count": backlog.count(),
        "bytes": backlog.held_bytes(),
        "max_bytes": backlog.limit,
        "timeout_extended_count": backlog.extended,
    }


def _topic_stats(topic: Topic, channels: list[dict[str, Any]], broker: Broker, now: float) -> dict[str, Any]:
    percentiles = broker.options.e2e_processing_latency_percentiles
    streams = [ch.e2e for ch in topic.channels.values() if ch.e2e is not None]
    e2e = merge_quantiles(streams, percentiles, now) if percentiles else {"count": 0, "percentiles": None}
    return {
        "topic_name": topic.name,
        "channels": channels,
        "depth": topic.depth(),
        "backend_depth": topic.backend.depth(),
        "message_count": topic.message_count,
        "message_bytes": topic.message_bytes,
        "paused": topic.paused,
        "e2e_processing_latency": e2e,
    }


def broker_stats(broker: Broker, now: float, *, topic: str = "", channel: str = "",
                 include_clients: bool = True, include_mem: bool = True,
                 include_oldest: bool = False, include_policies: bool = False) -> dict[str, Any]:
    """The ``/stats?format=json`` document; ``include_oldest`` adds nsqtw's ``oldest_message_ts``
    to each channel that holds messages (Go's document leaves it out)."""
    topics: list[dict[str, Any]] | None
    if topic:
        selected = [broker.topics[topic]] if topic in broker.topics else None
    else:
        selected = sorted(broker.topics.values(), key=lambda t: t.name)
    if selected is None:
        topics = None
    else:
        topics = []
        for t in selected:
            if channel:
                if channel not in t.channels:
                    continue
                chans = [t.channels[channel]]
            else:
                chans = sorted(t.channels.values(), key=lambda c: c.name)
            topics.append(_topic_stats(
                t, [_channel_stats(c, include_clients, topic, now, include_oldest, include_policies) for c in chans], broker, now))
    doc: dict[str, Any] = {
        "version": NSQ_VERSION,
        "health": broker.health_status(),
        "start_time": int(broker.start_time),
        "topics": topics,
    }
    # nsqtw only, and only while something is held or was extended (Go's shape otherwise)
    if broker.backlog.channels or broker.backlog.extended:
        doc["held"] = held_stats(broker)
    if include_mem:
        doc["memory"] = mem_stats()
    if include_clients and selected is not None:
        producers = [client_stats(c, topic) for c in broker.clients.values() if c.pub_counts]
        doc["producers"] = producers or None
    else:
        doc["producers"] = None
    return doc


def nanoseconds_to_human(v: float) -> str:
    """NSQ's ``stringy.NanoSecondToHuman``."""
    if v > 1e9:
        return f"{v / 1e9:0.1f}s"
    if v > 1e6:
        return f"{v / 1e6:0.1f}ms"
    if v > 1e3:
        return f"{v / 1e3:0.1f}us"
    return f"{v:0.1f}ns"


def go_duration_text(seconds: float, truncate: bool = False) -> str:
    """A duration as Go prints ``time.Duration`` (``2.610752112s``, ``1h2m3s``)."""
    from ...options import format_duration
    if truncate:
        seconds = float(int(seconds))
    return format_duration(seconds)


def _e2e_text(result: dict[str, Any]) -> str:
    items = result.get("percentiles") or []
    return ", ".join(nanoseconds_to_human(item["value"]) for item in items)


def _client_line(c: dict[str, Any], now: float) -> str:
    duration = go_duration_text(max(0, int(now) - c["connect_ts"]), truncate=True)
    port = c["remote_address"].rsplit(":", 1)[-1] if ":" in c["remote_address"] else ""
    ident = f"{c['hostname']}:{port} {c['user_agent']}"
    if c.get("pub_counts"):
        total = sum(p["count"] for p in c["pub_counts"])
        topics = ",".join(f"{p['topic']}={p['count']}" for p in c["pub_counts"])
        return f"[{c['version']} {ident:<21}] msgs: {total:<8d} topics: {topics} connected: {duration}"
    return (f"[{c['version']} {ident:<21}] state: {c['state']} inflt: {c['in_flight_count']:<4d} "
            f"rdy: {c['ready_count']:<4d} fin: {c['finish_count']:<8d} re-q: {c['requeue_count']:<8d} "
            f"msgs: {c['message_count']:<8d} connected: {duration}")


def render_text(doc: dict[str, Any], now: float, start_time: float) -> str:
    """nsqd's ``printStats``."""
    lines: list[str] = []
    w = lines.append
    w(version_line("nsqd") + "\n")
    started = datetime.fromtimestamp(int(start_time), tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    w(f"start_time {started}\n")
    w(f"uptime {go_duration_text(max(0.0, now - start_time))}\n")
    w(f"\nHealth: {doc['health']}\n")
    mem = doc.get("memory")
    if mem is not None:
        w("\nMemory:\n")
        for key, value in mem.items():
            w(f"   {key:<25s}\t{value}\n")
    topics = doc.get("topics") or []
    if not topics:
        w("\nTopics: None\n")
    else:
        w("\nTopics:")
    for t in topics:
        prefix = "*P " if t["paused"] else "   "
        w(f"\n{prefix}[{t['topic_name']:<15s}] depth: {t['depth']:<5d} be-depth: {t['backend_depth']:<5d} "
          f"msgs: {t['message_count']:<8d} e2e%: {_e2e_text(t['e2e_processing_latency'])}\n")
        for c in t["channels"]:
            cprefix = "   *P " if c["paused"] else "      "
            w(f"{cprefix}[{c['channel_name']:<25s}] depth: {c['depth']:<5d} be-depth: {c['backend_depth']:<5d} "
              f"inflt: {c['in_flight_count']:<4d} def: {c['deferred_count']:<4d} re-q: {c['requeue_count']:<5d} "
              f"timeout: {c['timeout_count']:<5d} msgs: {c['message_count']:<8d} "
              f"e2e%: {_e2e_text(c['e2e_processing_latency'])}\n")
            for client in c["clients"] or []:
                w(f"        {_client_line(client, now)}\n")
    producers = doc.get("producers") or []
    if not producers:
        w("\nProducers: None\n")
    else:
        w("\nProducers:\n")
        for client in producers:
            w(f"   {_client_line(client, now)}\n")
    return "".join(lines)
