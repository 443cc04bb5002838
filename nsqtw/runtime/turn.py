"""
End-of-turn work, the same on every reactor.

A read that makes messages deliverable, or a disk write that wants a sync,
asks for its follow-up work with :meth:`TurnBatcher.soon`; the work runs once,
after every event of the reactor's current turn has been handled, however
many reads asked for it.  So a poll that brings 50 FINs and 10 MPUBs parses
and answers them all first, then delivers to each consumer with one write.

The batcher needs nothing but ``IReactorTime``: one ``callLater(0)`` per
turn that has work (a reactor runs its due calls before it polls again, so
such a call runs after the current poll's events, and never waits).  A
reactor that knows when a poll's events are being dispatched may say so by
providing :class:`IReactorTurnHooks` (nsqtw's spin reactor does); the batcher
then lets the reactor run the work right after the dispatch instead of
scheduling a call.  The behaviour is the same either way: only the
bookkeeping differs.
"""

from __future__ import annotations

from typing import Any
from collections.abc import Callable

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from zope.interface import Attribute, Interface

__all__ = ["IReactorTurnHooks", "IReactorWorkMeter", "TurnBatcher"]

log = Logger(namespace="nsqtw")


class IReactorTurnHooks(Interface):
    """A reactor that can run a call right after the events of the poll it is dispatching."""

    dispatching = Attribute("True while the events of one poll are being handled.")

    def call_after_dispatch(fn: Callable[[], None]) -> None:
        """While :attr:`dispatching`: call ``fn`` once, after this poll's events have all
        been handled (also when one of them failed)."""


class IReactorWorkMeter(Interface):
    """A reactor that tunes itself by measuring (nsqtw's spin reactor), told by the service it
    runs what the work is and how long a wait for it may be worth spinning through."""

    def measure_work(fn: Callable[[], int] | None) -> None:
        """Judge the tuning by ``fn()``, a count that grows with the work done (messages
        handled, say) rather than by poll events (a replication peer that sleeps between
        batches handles more, smaller batches: more events for the same messages).
        ``None``: by events again."""

    def spin_at_least(seconds: float, yielding: bool = False) -> None:
        """Spin up to ``seconds`` (unless the operator set the length): the service knows
        that its next event often comes this much later than the default spin lasts.
        ``yielding``: between its polls the spin gives the CPU to any other process ready to
        run on it (a long spin that mostly waits for processes which may need this CPU)."""


class TurnBatcher:
    """Runs each piece of work asked for in a reactor turn once, at the end of that turn."""

    __slots__ = ("_clock", "_pending", "_call", "_hooks", "_armed", "_ran")

    def __init__(self, clock: IReactorTime) -> None:
        self._clock = clock
        #: work asked for, in the order first asked (a dict: each callable once)
        self._pending: dict[Callable[[], Any], None] = {}
        self._call: Any = None
        self._armed = False
        self._hooks: Any = IReactorTurnHooks(clock, None)
        self._ran = self.run

    def soon(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` at the end of this reactor turn (once, however often it is asked for)."""
        self._pending[fn] = None
        if self._armed:
            return
        self._armed = True
        hooks = self._hooks
        if hooks is not None and hooks.dispatching:
            hooks.call_after_dispatch(self._ran)  # right after this poll's events
        else:
            self._call = self._clock.callLater(0, self._called)

    def _called(self) -> None:
        self._call = None
        self.run()

    def run(self) -> None:
        """Run every piece of work asked for so far, including work asked for meanwhile."""
        if not self._armed:
            return
        call, self._call = self._call, None
        if call is not None and call.active():
            call.cancel()
        pending = self._pending
        try:
            while pending:
                fn = next(iter(pending))
                del pending[fn]
                try:
                    fn()
                except Exception:
                    log.failure("end-of-turn work {fn!r} failed", fn=fn)
        finally:
            self._armed = False

    def close(self) -> None:
        """Run what is pending now (nothing stays registered with the reactor)."""
        self.run()
