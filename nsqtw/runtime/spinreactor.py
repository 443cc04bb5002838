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
Go-style log lines do not show) and is a measurable share of a round trip.

Spinning does not always pay.  When the machine has idle CPUs the peer that
the broker answers runs on another one, and the spin saves a cross-CPU
wake-up per round trip.  When the CPUs are busy the kernel runs the woken
peer on the broker's CPU and a broker that sleeps right after answering
lets it run at once, while a spinning one holds the CPU the peer needs.  So
while request/answer traffic lasts (over 2,000 a second), :class:`SpinPolicy`
measures the work done per second in windows of 0.2 s, now and then tries the other
way for one window, and keeps it if it did 5 % more than the
recent windows; probes that lose come less and less often (at most every
3.2 s).  The work is what the service running on the reactor says it is
(:class:`~nsqtw.runtime.turn.IReactorWorkMeter`: nsqd counts the messages
published to it, delivered to and finished by its clients, and stored for its
origins), else the events
handled: a replication peer that sleeps between batches handles more,
smaller ones, so its events per second rise when it does not spin while the
messages do not.  A window in which most spins found nothing before they gave up
also ends the spinning, whatever its rate: the next event could not come within
the spin, which only took CPU others needed.  A replication peer's next batch comes
once its origin has answered a publisher and read the next PUB, often later than
the default 50 µs, so nsqd asks for up to 200 µs there
(``spin_at_least``; not when ``NSQTW_SPIN_US`` is set), a spin that yields the CPU
between its polls (``sched_yield``): while the peer waits, the publisher and the origin
may need its CPU, and a plain spin would hold it from them.  Below that rate (a trickle, or idle) it does not spin at all: a spin after
each of a few events a second only burns CPU.

``nsqd``, ``nsqlookupd`` and ``nsqadmin`` (the drop-in commands) install it;
``twistd --reactor=nsqtw`` selects it under twistd; ``NSQTW_SPIN_US=0``
turns the spinning off (plain ``EPollReactor`` behaviour) and
``NSQTW_SPIN_ADAPT=0`` makes it spin after every activity, without the
policy.  Embedding applications keep whatever reactor they run.
"""

from __future__ import annotations

import os
import sys
from time import perf_counter
from typing import Any
from collections.abc import Callable

from twisted.internet.epollreactor import EPollReactor
from twisted.logger import Logger
from zope.interface import implementer

from .seam import epoll_parts
from .turn import IReactorTurnHooks, IReactorWorkMeter

__all__ = ["SpinningEPollReactor", "SpinPolicy", "install", "install_if_unset", "DEFAULT_SPIN_US"]

_log = Logger(namespace="nsqtw.runtime.reactor")

#: gives the CPU to another process ready to run on it, if any (Linux, as epoll)
_sched_yield: Callable[[], None] | None = getattr(os, "sched_yield", None)

#: microseconds to keep polling after activity before blocking
DEFAULT_SPIN_US = 50


def _spin_from_env() -> float:
    """``NSQTW_SPIN_US`` in seconds (the default when unset or not a number)."""
    raw = os.environ.get("NSQTW_SPIN_US", "")
    try:
        us = int(raw) if raw else DEFAULT_SPIN_US
    except ValueError:
        us = DEFAULT_SPIN_US
    return max(0, us) / 1e6


class SpinPolicy:
    """Whether to spin, chosen by measuring (see the module's docstring).

    :meth:`window` is called with the events handled since the last call,
    once at least ``WINDOW`` seconds have passed; it returns the choice for
    the next window.
    """

    #: seconds per measured window
    WINDOW = 0.2
    #: events per second below which nothing is learned (no request/answer traffic to speak of)
    MIN_RATE = 2000.0
    #: most windows between two probes of the way not taken
    MAX_GAP = 16
    #: a probe must beat the current way's rate by this factor to be kept (noise is not a win)
    MARGIN = 1.05
    #: spins in a window before their hits and misses say anything
    MIN_SPINS = 20

    __slots__ = ("spin", "start", "_rate", "_warm", "_probing", "_gap", "_countdown")

    def __init__(self, start: float = 0.0) -> None:
        self.spin = True
        self.start = start
        #: events per second of the current way: the mean of its recent windows
        self._rate = 0.0
        #: the last window had traffic (the first one with traffic may have begun idle, so
        #: it is no baseline)
        self._warm = False
        self._probing = False
        self._gap = 1
        #: windows with traffic before the next probe
        self._countdown = 1

    def window(self, now: float, events: int, hits: int = 0, misses: int = 0) -> bool:
        """``hits`` and ``misses``: the window's spins that found an event, and those that
        gave up and slept."""
        rate = events / (now - self.start) if now > self.start else 0.0
        self.start = now
        # most spins found nothing: the next event comes later than a spin lasts here
        wasted = self.spin and misses > hits and hits + misses >= self.MIN_SPINS
        if self._probing:
            self._probing = False
            if rate > self._rate * self.MARGIN and not wasted:
                self._gap = 1  # the other way is better now: keep it, and check back soon
                self._rate = rate
            else:
                self.spin = not self.spin
                self._gap = min(self._gap * 4, self.MAX_GAP)
            self._countdown = self._gap
            return self.spin
        if rate < self.MIN_RATE:
            # a trickle (or idle): a spin after each event only burns CPU (measured at 100
            # msg/s: a point more CPU, no lower latency), so it stays off until traffic that
            # can pay for it is measured with and without it
            self.spin = False
            self._warm = False
            self._rate = 0.0
            self._gap = 1
            self._countdown = 1
            return self.spin
        if not self._warm:
            self._warm = True  # the first window with traffic may have begun idle: no baseline
            self._rate = 0.0
            if not wasted:
                return self.spin
        if wasted:
            # as a lost probe of not spinning: stop, and try again later and later
            self.spin = False
            self._rate = rate
            self._gap = min(self._gap * 4, self.MAX_GAP)
            self._countdown = self._gap
            return self.spin
        self._rate = (self._rate + rate) / 2 if self._rate else rate
        self._countdown -= 1
        if self._countdown <= 0:
            self._probing = True
            self.spin = not self.spin
        return self.spin


@implementer(IReactorTurnHooks, IReactorWorkMeter)
class SpinningEPollReactor(EPollReactor):
    """``EPollReactor`` that spins (non-blocking polls) for a moment after activity.

    Each event is handled in isolation, as ``EPollReactor`` handles it: an
    exception escaping one connection's handlers (its ``connectionLost``, say)
    is logged and the poll's other events are still handled.  It declares
    :class:`~nsqtw.runtime.turn.IReactorTurnHooks`: hooks run after each poll's events
    (also when one failed), which lets :class:`~nsqtw.runtime.turn.TurnBatcher` run its
    end-of-turn work without scheduling a call; the work and its timing are
    the same on every reactor."""

    def __init__(self, spin_seconds: float | None = None, adapt: bool | None = None) -> None:
        self.spin_seconds = _spin_from_env() if spin_seconds is None else spin_seconds
        #: the length was chosen (NSQTW_SPIN_US or the argument): spin_at_least keeps it
        self.spin_chosen = spin_seconds is not None or bool(os.environ.get("NSQTW_SPIN_US"))
        if adapt is None:
            adapt = os.environ.get("NSQTW_SPIN_ADAPT", "1") != "0"
        self._active = False
        #: a spin that yields the CPU between its polls (see spin_at_least)
        self.spin_yields = False
        #: spin in this window (always, without a policy)
        self._spin_now = True
        self._policy = SpinPolicy(perf_counter()) if adapt and self.spin_seconds else None
        self._window_end = 0.0 if self._policy is None else self._policy.start + SpinPolicy.WINDOW
        self._events = 0
        #: this window's spins that found an event, and those that gave up
        self._hits = self._misses = 0
        #: True while the events of one poll are being handled (IReactorTurnHooks)
        self.dispatching = False
        self._after_dispatch: list[Callable[[], None]] = []
        #: the work count the policy judges by (None: the events handled), and its last value
        self._work: Callable[[], int] | None = None
        self._work_seen = 0
        super().__init__()
        #: what doPoll uses of EPollReactor's internals, read once (see nsqtw.runtime.seam)
        self._parts = epoll_parts(self)

    def call_after_dispatch(self, fn: Callable[[], None]) -> None:
        """IReactorTurnHooks: call ``fn`` once, after the events of the poll being handled."""
        self._after_dispatch.append(fn)

    def measure_work(self, fn: Callable[[], int] | None) -> None:
        """IReactorWorkMeter: judge spinning by the work ``fn()`` counts, not by events."""
        self._work = fn
        self._work_seen = fn() if fn is not None else 0

    def spin_at_least(self, seconds: float, yielding: bool = False) -> None:
        """IReactorWorkMeter: a longer spin, unless the length was chosen (or spinning is
        off: no policy); ``yielding``: one that gives the CPU to any other process ready to
        run on it between its polls (``sched_yield``)."""
        if not self.spin_chosen and self._policy is not None and seconds > self.spin_seconds:
            self.spin_seconds = seconds
            self.spin_yields = yielding and _sched_yield is not None

    def doPoll(self, timeout: float | None) -> None:
        poll, selectables, drdw = self._parts
        maxevents = len(selectables)
        try:
            spin = self.spin_seconds if self._spin_now else 0
            if self._active and spin and timeout != 0:
                limit = spin if timeout is None or timeout > spin else timeout
                end = perf_counter() + limit
                events = poll(0, maxevents)
                give_way = _sched_yield if self.spin_yields else None
                if give_way is not None:
                    while not events and perf_counter() < end:
                        give_way()
                        events = poll(0, maxevents)
                else:
                    while not events and perf_counter() < end:
                        events = poll(0, maxevents)
                if events:
                    self._hits += 1
                else:
                    self._misses += 1
                    if timeout is None:
                        events = poll(-1, maxevents)
                    elif timeout > limit:
                        events = poll(timeout - limit, maxevents)
            else:
                events = poll(-1 if timeout is None else timeout, maxevents)
        except InterruptedError:
            return
        if not events:
            self._active = False
            return
        self._active = True
        self.dispatching = True
        try:
            for fd, event in events:
                selectable = selectables.get(fd)
                if selectable is not None:
                    try:
                        drdw(selectable, fd, event)
                    except BaseException:  # as EPollReactor (callWithLogger): log it, go on
                        _log.failure("while handling an event of {selectable!r}", selectable=selectable)
        finally:
            self.dispatching = False
            hooks = self._after_dispatch
            if hooks:
                self._after_dispatch = []
                for fn in hooks:
                    try:
                        fn()
                    except Exception:
                        _log.failure("after the events of a poll")
        policy = self._policy
        if policy is not None:
            self._events += len(events)
            now = perf_counter()
            if now >= self._window_end:
                work = self._events
                if self._work is not None:
                    seen = self._work()
                    work, self._work_seen = max(0, seen - self._work_seen), seen
                self._spin_now = policy.window(now, work, self._hits, self._misses)
                self._events = self._hits = self._misses = 0
                self._window_end = now + policy.WINDOW

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
