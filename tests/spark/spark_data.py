"""Builders of export lines (the exact nsqtw.nsqd.stats.export format) for the Spark tests."""

from __future__ import annotations

from typing import Any

from nsqtw.nsqd.stats.export import snapshot_line


def e2e(pairs: dict[float, float] | None) -> dict[str, Any]:
    if not pairs:
        return {"count": 0, "percentiles": None}
    return {"count": 10, "percentiles": [{"quantile": q, "value": v} for q, v in pairs.items()]}


def channel(name: str, *, msgs: int, depth: int = 0, in_flight: int = 0, deferred: int = 0, req: int = 0,
            tmo: int = 0, clients: int = 0, pct: dict[float, float] | None = None) -> dict[str, Any]:
    return {"channel_name": name, "depth": depth, "backend_depth": 0, "in_flight_count": in_flight,
            "deferred_count": deferred, "message_count": msgs, "requeue_count": req, "timeout_count": tmo,
            "client_count": clients, "clients": [], "paused": False, "e2e_processing_latency": e2e(pct)}


def topic(name: str, *, msgs: int, nbytes: int = 0, depth: int = 0, channels: list[dict[str, Any]] = (),
          pct: dict[float, float] | None = None) -> dict[str, Any]:
    return {"topic_name": name, "channels": list(channels), "depth": depth, "backend_depth": 0,
            "message_count": msgs, "message_bytes": nbytes, "paused": False, "e2e_processing_latency": e2e(pct)}


def line(ts: float, node: str, port: int, start_time: int, topics: list[dict[str, Any]]) -> bytes:
    doc = {"version": "1.3.0", "health": "OK", "start_time": start_time, "topics": topics,
           "memory": {"heap_objects": 1}, "producers": None}
    ident = {"broadcast_address": node, "hostname": node + ".local", "tcp_port": port - 1, "http_port": port}
    return snapshot_line(ts, ident, doc)
