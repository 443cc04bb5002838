"""What the stats exporters need of the nsqd they report on (the NsqdService provides it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..core.broker import Broker
    from ...options import NsqdOptions

__all__ = ["StatsNode"]


class StatsNode(Protocol):
    """The broker to snapshot, the options (intervals, broadcast address and ports), the bound
    ports and the reactor the exporters' timers and sockets run on."""

    broker: Broker
    options: NsqdOptions
    reactor: Any

    @property
    def tcp_port(self) -> int | None: ...

    @property
    def http_port(self) -> int | None: ...
