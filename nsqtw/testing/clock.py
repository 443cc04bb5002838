"""
Virtual time for a real broker: timers on a ``task.Clock``, sockets on the real reactor.

::

    from twisted.internet import reactor, task
    from nsqtw.testing.clock import VirtualTimeReactor

    clock = task.Clock()
    vreactor = VirtualTimeReactor(clock, reactor)
    nsqd = await start_nsqd(vreactor)      # listens on the real reactor ...
    clock.advance(61)                      # ... and times messages out on the clock

nsqtw injects one reactor everywhere (``IReactorTime`` for its timers, the rest for
listening and connecting), so virtual time needs no option of its own: this adapter
answers ``seconds``, ``callLater`` and ``getDelayedCalls`` from the clock and passes
every other attribute to the real reactor.

A ``callLater(0, ...)`` (or a negative delay) is not a timer but "at the end of this
turn" (see :mod:`nsqtw.runtime.turn`): it goes to the real reactor, so a publish is
delivered, an answer written and a connection read as usual without anyone advancing
the clock.  Every positive delay waits for ``clock.advance()``.
"""

from __future__ import annotations

from typing import Any
from collections.abc import Callable

from twisted.internet import task
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from zope.interface import directlyProvides, implementer, providedBy

__all__ = ["VirtualTimeReactor", "VIRTUAL_EPOCH", "virtual_clock"]

#: where a fixture's clock starts (2023-11-14T22:13:20Z): a fixed instant, so message
#: timestamps and IDs are the same on every run
VIRTUAL_EPOCH = 1_700_000_000.0


def virtual_clock(start: float = VIRTUAL_EPOCH) -> task.Clock:
    """A ``task.Clock`` set to ``start`` (the fixtures' clock)."""
    clock = task.Clock()
    clock.advance(start)
    return clock


@implementer(IReactorTime)
class VirtualTimeReactor:
    """A reactor whose time is ``clock`` and whose I/O (and end-of-turn calls) is ``reactor``.

    It provides every interface ``reactor`` provides, so it can be handed to anything in
    nsqtw that takes a reactor (:func:`nsqtw.embed.start_nsqd`, a client's ``reactor=``)."""

    def __init__(self, clock: task.Clock, reactor: Any) -> None:
        self.clock = clock
        self.reactor = reactor
        directlyProvides(self, *providedBy(reactor))

    # IReactorTime: the clock's

    def seconds(self) -> float:
        return self.clock.seconds()

    def callLater(self, delay: float, callable: Callable[..., Any], *args: Any, **kw: Any) -> IDelayedCall:
        if delay <= 0:  # "this turn's end", not a timer: the real reactor runs it
            call: IDelayedCall = self.reactor.callLater(0, callable, *args, **kw)
            return call
        return self.clock.callLater(delay, callable, *args, **kw)

    def getDelayedCalls(self) -> list[IDelayedCall]:
        return list(self.clock.getDelayedCalls())

    # everything else: the real reactor's

    def __getattr__(self, name: str) -> Any:
        return getattr(self.reactor, name)

    def __repr__(self) -> str:
        return f"<VirtualTimeReactor t={self.clock.seconds():.3f} io={self.reactor!r}>"
