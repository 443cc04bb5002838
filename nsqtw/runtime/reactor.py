"""The only place nsqtw reaches for the global reactor (lazily, never at import time)."""

from __future__ import annotations

from typing import Any

__all__ = ["resolve_reactor"]


def resolve_reactor(reactor: Any | None = None) -> Any:
    """The given reactor, or the global one, imported now."""
    if reactor is None:
        from twisted.internet import reactor as global_reactor
        reactor = global_reactor
    return reactor
