"""
Peek: what is queued, in flight and deferred in a channel (or a topic's own queue), without
changing any of it.  Go's NSQ has no such view (its issue #848); the HTTP API serves it as
``GET /channel/peek`` and ``GET /topic/peek`` when ``--peek-enabled``.

Everything here only reads: no counter, order, timeout, attempt, disk position or metadata
moves, so a consumer receives exactly what it would have received without the peek.  Queued
messages are listed in delivery order (memory queue, then disk), in-flight ones by delivery
time, deferred ones by due time; ``attempts`` is how many times a message has been delivered
(an in-flight message's count includes the delivery it is in).
"""

from __future__ import annotations

import base64
import struct
from typing import TYPE_CHECKING, Any
from collections.abc import Sequence

if TYPE_CHECKING:
    from .channel import Channel
    from .topic import Topic

__all__ = ["STATES", "MAX_N", "DEFAULT_N", "peek_channel", "peek_topic", "oldest_timestamp"]

#: the states a peek can ask for, in the order ``all`` lists them (``dead``: messages the
#: channel's policy gave up on, see :mod:`.deadletters`)
STATES = ("queued", "in_flight", "deferred", "dead")
DEFAULT_N = 20
MAX_N = 1000

_HEAD = struct.Struct(">ii q H 16s")  # size, frame type, timestamp, attempts, ID


def _message(frame: bytes, body_size: int, state: str, delivered: int, deliver_at: float | None,
             client_id: str | None, max_body: int) -> dict[str, Any]:
    """One message as the peek lists it; ``delivered`` is subtracted from the frame's
    attempts (queued and deferred frames carry the count of their next delivery)."""
    _, _, ts, attempts, mid = _HEAD.unpack_from(frame, 0)
    body = frame[34:34 + max_body]
    return {
        "id": mid.decode("latin-1"),
        "timestamp": ts,
        "attempts": max(attempts - delivered, 0),
        "state": state,
        "deliver_at": int(deliver_at * 1e9) if deliver_at is not None else None,
        "client_id": client_id,
        "body_size": body_size,
        "body": base64.b64encode(body).decode("ascii"),
    }


def oldest_timestamp(mem: Any, backend: Any) -> int | None:
    """The publish time (ns) of the oldest queued message: the older of the memory queue's head and
    the disk queue's head (``oldest_message_ts`` in ``/stats``); None when nothing is queued.  Reads
    one frame from memory and at most one record head from disk, changing nothing."""
    stamps = []
    frames = mem.peek(1) if mem.depth() else []
    if frames:
        stamps.append(_HEAD.unpack_from(frames[0], 0)[2])
    peek = getattr(backend, "peek", None)
    if peek is not None and backend.depth():
        records = peek(1, 0)
        if records:
            stamps.append(_HEAD.unpack_from(records[0][0], 0)[2])
    return min(stamps) if stamps else None


def _queued(mem: Any, backend: Any, n: int, max_body: int,
            deferred_on_disk: list[tuple[float, bytes, int]]) -> tuple[list[dict[str, Any]], bool]:
    """Up to ``n`` queued messages (memory, then disk) and whether more are queued.  Records
    on disk that are still deferred (written there at a clean stop) go to ``deferred_on_disk``."""
    frames = mem.peek(n + 1)
    out = [_message(f, len(f) - 34, "queued", 1, None, None, max_body) for f in frames[:n]]
    if len(frames) > n:
        return out, True
    peek = getattr(backend, "peek", None)
    if peek is None or not backend.depth():
        return out, False
    room = n - len(out)
    records = peek(room + 1, max_body)
    more = False
    for head, body_size, due in records:
        if due is not None:
            deferred_on_disk.append((due, head, body_size))
        elif len(out) < n:
            out.append(_message(head, body_size, "queued", 1, None, None, max_body))
        else:
            more = True
    if len(records) > room and deferred_on_disk:
        more = True  # deferred records took places in this read: more may be queued behind
    return out, more


def _listing(parts: Sequence[tuple[str, list[dict[str, Any]], bool]], states: Sequence[str],
             n: int) -> tuple[list[dict[str, Any]], bool]:
    messages: list[dict[str, Any]] = []
    truncated = False
    for state, items, more in parts:
        if state not in states:
            continue
        room = n - len(messages)
        if len(items) > room:
            truncated = True
        elif more:
            truncated = True
        messages.extend(items[:max(room, 0)])
    return messages, truncated


def peek_channel(channel: Channel, states: Sequence[str], n: int, max_body: int,
                 now: float) -> dict[str, Any]:
    """The peek answer for one channel (``states`` a subset of :data:`STATES`)."""
    on_disk: list[tuple[float, bytes, int]] = []
    parts: list[tuple[str, list[dict[str, Any]], bool]] = []
    if "queued" in states:
        queued, more = _queued(channel.mem, channel.backend, n, max_body, on_disk)
        parts.append(("queued", queued, more))
    if "in_flight" in states:
        inflight = channel.inflight
        held = [(ep.started, mid, ep) for mid, ep in inflight.items() if mid in ep.msgs]
        held.sort(key=lambda item: item[0])  # stable: delivery order within an epoch
        items = []
        for _, mid, ep in held[:n]:
            frame = ep.msgs[mid]
            items.append(_message(frame, len(frame) - 34, "in_flight", 0, None,
                                  ep.client.client_id, max_body))
        parts.append(("in_flight", items, len(held) > n))
    on_disk_count = getattr(channel.backend, "deferred_on_disk", lambda: 0)()
    if "deferred" in states and on_disk_count > len(on_disk):
        # deferred messages restored from disk after a restart wait among the queued records, maybe
        # beyond what the queued listing read: find them all (only while some are there)
        backend: Any = channel.backend  # a disk queue: deferred_on_disk() says it can peek
        records = backend.peek(backend.depth(), max_body)
        on_disk[:] = [(due, head, size) for head, size, due in records if due is not None]
    if "deferred" in states:
        due = sorted(channel.deferred)[:n + 1]
        items = [_message(frame, len(frame) - 34, "deferred", 1, at, None, max_body)
                 for at, _, frame in due[:n]]
        more = len(due) > n
        if on_disk:
            items.extend(_message(head, size, "deferred", 1, at, None, max_body) for at, head, size in on_disk)
            items.sort(key=lambda m: m["deliver_at"])
            more = more or len(items) > n
            items = items[:n]
        parts.append(("deferred", items, more))
    dead = channel.dead
    if "dead" in states and dead is not None:
        items = []
        for letter in dead.first(n + 1):
            item = _message(letter.frame, len(letter.frame) - 34, "dead", 1, None, None, max_body)
            item["died_at"] = int(letter.died_at * 1e9)
            item["reason"] = letter.reason
            items.append(item)
        parts.append(("dead", items[:n], len(items) > n))
    messages, truncated = _listing(parts, states, n)
    return {
        "topic": channel.topic.name,
        "channel": channel.name,
        "depth": channel.depth(),
        "in_flight_count": len(channel.inflight),
        "deferred_count": len(channel.deferred) + on_disk_count,
        **({"dead_count": len(dead)} if dead is not None else {}),
        "messages": messages,
        "truncated": truncated,
    }


def peek_topic(topic: Topic, n: int, max_body: int, now: float) -> dict[str, Any]:
    """The peek answer for a topic's own queue (what waits before it has channels, or while
    it is paused): queued, then deferred."""
    on_disk: list[tuple[float, bytes, int]] = []
    queued, more = _queued(topic.mem, topic.backend, n, max_body, on_disk)
    waiting = sorted(topic.deferred, key=lambda item: item[0])
    deferred = [_message(frame, len(frame) - 34, "deferred", 1, at, None, max_body) for at, frame in waiting[:n]]
    deferred.extend(_message(head, size, "deferred", 1, at, None, max_body) for at, head, size in on_disk)
    deferred.sort(key=lambda m: m["deliver_at"])
    parts = [("queued", queued, more), ("deferred", deferred[:n], len(deferred) > n)]
    messages, truncated = _listing(parts, ("queued", "deferred"), n)
    return {
        "topic": topic.name,
        "channel": None,
        "depth": topic.mem.depth() + topic.backend.depth(),
        "in_flight_count": 0,
        "deferred_count": len(topic.deferred),
        "messages": messages,
        "truncated": truncated,
    }
