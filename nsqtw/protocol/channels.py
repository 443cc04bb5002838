"""One channel's counters summed over the nsqd that carry it (nsqd's ``clusterinfo.ChannelStats.Add``):
what ``nsq_stat`` prints and nsqadmin's channel pages total."""

from __future__ import annotations

from typing import Any

import attr

__all__ = ["ChannelCounts"]


def _int(doc: dict[str, Any], key: str) -> int:
    value = doc.get(key)
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


@attr.s(slots=True)
class ChannelCounts:
    """The summable numbers of one channel: on one nsqd (:meth:`from_nsqd`) or, after
    :meth:`add`, over several."""

    depth: int = attr.ib(default=0)
    memory_depth: int = attr.ib(default=0)
    backend_depth: int = attr.ib(default=0)
    in_flight_count: int = attr.ib(default=0)
    deferred_count: int = attr.ib(default=0)
    requeue_count: int = attr.ib(default=0)
    timeout_count: int = attr.ib(default=0)
    message_count: int = attr.ib(default=0)
    client_count: int = attr.ib(default=0)

    @classmethod
    def from_nsqd(cls, ch: dict[str, Any]) -> ChannelCounts:
        """One channel of an nsqd ``/stats`` document (memory depth is depth minus backend depth;
        without ``client_count``, the clients listed are counted; a missing or non-numeric
        counter is 0, so one odd node does not break a whole page)."""
        depth = _int(ch, "depth")
        backend = _int(ch, "backend_depth")
        clients = ch.get("clients")
        count = _int(ch, "client_count") if "client_count" in ch else (
            len(clients) if isinstance(clients, list) else 0)
        return cls(
            depth=depth, memory_depth=depth - backend, backend_depth=backend,
            in_flight_count=_int(ch, "in_flight_count"),
            deferred_count=_int(ch, "deferred_count"),
            requeue_count=_int(ch, "requeue_count"),
            timeout_count=_int(ch, "timeout_count"),
            message_count=_int(ch, "message_count"),
            client_count=count,
        )

    def add(self, other: ChannelCounts) -> None:
        """Sum ``other`` in."""
        self.depth += other.depth
        self.memory_depth += other.memory_depth
        self.backend_depth += other.backend_depth
        self.in_flight_count += other.in_flight_count
        self.deferred_count += other.deferred_count
        self.requeue_count += other.requeue_count
        self.timeout_count += other.timeout_count
        self.message_count += other.message_count
        self.client_count += other.client_count

    def add_nsqd(self, ch: dict[str, Any]) -> None:
        """Sum in one channel of an nsqd ``/stats`` document."""
        self.add(ChannelCounts.from_nsqd(ch))
