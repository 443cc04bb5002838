"""
The standalone daemons' reactor: Twisted's epoll reactor that polls briefly before it sleeps.

On a request/answer workload (one ``PUB``, wait for ``OK``, the next ``PUB``)
most of a round trip is not work but waking up: the broker answers, blocks
in ``epoll_wait``, and the kernel must schedule it again when the next
command arrives, which on a virtual machine costs tens of microseconds per
wake-up.  Go's runtime hides this by letting idle threads spin for new work
before they park; this reactor does the same on its one thread: after an
iteration that handled I/O, it polls without blocking for up to
``spin_seconds`` (50 µs by default) before it blocks.  An idle broker never
spins (the first empty poll after quiet sleeps as usual), timed calls are
never delayed (the spin never outlasts the reactor's timeout), and every
event goes through ``EPollReactor``'s own ``_doReadOrWrite`` (errors and
disconnections handled as there), called directly rather than inside
``twisted.python.log.callWithLogger``: that wrapper only sets the legacy log
context (the ``system`` prefix of old-style ``log.msg`` lines, which nsqtw's
Go-style log lines do not show) and cost about a tenth of each round trip.

``nsqd``, ``nsqlookupd`` and ``nsqadmin`` (the drop-in commands) install it;
``twistd --reactor=nsqtw`` selects it under twistd; ``NSQTW_SPIN_US=0``
turns the spinning off (plain ``EPollReactor`` behaviour).  Embedding
applications keep whatever reactor they run.
"""

from __future__ import annotations

import os
import sys
from time import perf_counter
from typing import Any

from twisted.internet.epollreactor import EPollReactor

__all__ = ["SpinningEPollReactor", "install", "install_if_unset", "DEFAULT_SPIN_US"]

#: microseconds to keep polling after activity before blocking
DEFAULT_SPIN_US = 50


def _spin_from_env() -> float:
    raw = os.environ.get("NSQTW_SPIN_US", "")
    try:
        us = int(raw) if raw else DEFAULT_SPIN_US
    except ValueError:
        us = DEFAULT_SPIN_US
    return max(0, us) / 1e6


class SpinningEPollReactor(EPollReactor):
    """``EPollReactor`` that spins (non-blocking polls) for a moment after activity."""

    def __init__(self, spin_seconds: float | None = None) -> None:
        self.spin_seconds = _spin_from_env() if spin_seconds is None else spin_seconds
        self._active = False
        super().__init__()

    def doPoll(self, timeout: float | None) -> None:
        poll = self._poller.poll
        maxevents = len(self._selectables)
        try:
            spin = self.spin_seconds
            if self._active and spin and timeout != 0:
                limit = spin if timeout is None or timeout > spin else timeout
                end = perf_counter() + limit
                events = poll(0, maxevents)
                while not events and perf_counter() < end:
                    events = poll(0, maxevents)
                if not events:
                    if timeout is None:
                        events = poll(-1, maxevents)
                    elif timeout > limit:
                        events = poll(timeout - limit, maxevents)
            else:
                events = poll(-1 if timeout is None else timeout, maxevents)
        except InterruptedError:
            return
        self._active = bool(events)
        selectables = self._selectables
        drdw = self._doReadOrWrite
        for fd, event in events:
            selectable = selectables.get(fd)
            if selectable is not None:
                drdw(selectable, fd, event)

    doIteration = doPoll


def install(spin_seconds: float | None = None) -> SpinningEPollReactor:
    """Install it as the global reactor (before anything imports ``twisted.internet.reactor``)."""
    from twisted.internet.main import installReactor

    reactor = SpinningEPollReactor(spin_seconds)
    installReactor(reactor)
    return reactor


def install_if_unset() -> Any:
    """Install it unless a reactor is installed already (then leave that one alone)."""
    if "twisted.internet.reactor" in sys.modules:
        return sys.modules["twisted.internet.reactor"]
    return install()
