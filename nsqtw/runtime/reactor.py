"""The only place nsqtw reaches for the global reactor (lazily, never at import time)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.internet.interfaces import IReactorTCP, IReactorTime

__all__ = ["resolve_reactor", "ListeningReactor", "Clock", "TreqClient"]

#: what a ``reactor=`` that listens or connects takes: a Twisted reactor (Twisted's global one
#: when None); every reactor Twisted ships provides IReactorTCP and IReactorTime
ListeningReactor = IReactorTCP | None
#: what a ``clock=`` (or a client's ``reactor=``, which needs time and is given a
#: ``task.Clock`` in unit tests) takes: an IReactorTime
Clock = IReactorTime | None

if TYPE_CHECKING:
    from treq.client import HTTPClient
    from treq.testing import StubTreq

    #: an HTTP client: treq's, or ``treq.testing.StubTreq`` in tests
    TreqClient = HTTPClient | StubTreq | None
else:
    # the same for introspection (typing.get_type_hints) without importing treq at start-up
    TreqClient = object | None


def resolve_reactor(reactor: Any | None = None) -> Any:
    """The given reactor, or the global one, imported now."""
    if reactor is None:
        from twisted.internet import reactor as global_reactor
        reactor = global_reactor
    return reactor
