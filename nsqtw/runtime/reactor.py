"""The only place nsqtw reaches for the global reactor (lazily, never at import time)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Union

if TYPE_CHECKING:
    from treq.client import HTTPClient
    from treq.testing import StubTreq
    from twisted.internet.interfaces import IReactorTCP, IReactorTime

__all__ = ["resolve_reactor", "ListeningReactor", "Clock", "TreqClient"]

#: what a ``reactor=`` that listens or connects takes: a Twisted reactor (Twisted's global one
#: when None); every reactor Twisted ships provides IReactorTCP and IReactorTime
ListeningReactor = Union["IReactorTCP", None]
#: what a ``clock=`` (or a client's ``reactor=``, which needs time and is given a
#: ``task.Clock`` in unit tests) takes: an IReactorTime
Clock = Union["IReactorTime", None]
#: an HTTP client: treq's, or ``treq.testing.StubTreq`` in tests
TreqClient = Union["HTTPClient", "StubTreq", None]


def resolve_reactor(reactor: Any | None = None) -> Any:
    """The given reactor, or the global one, imported now."""
    if reactor is None:
        from twisted.internet import reactor as global_reactor
        reactor = global_reactor
    return reactor
