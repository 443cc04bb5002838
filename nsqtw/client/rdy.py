"""
A consumer's RDY management and backoff state machine, exactly as go-nsq's ``consumer.go``.

nsqd treats RDY as a window (it delivers while ``in_flight < RDY``), so RDY
is sent only when a connection's value changes, never per message.  The
rules, with go-nsq's names:

* ``per_conn_max_in_flight``: ``min(max(1, max_in_flight / conns), max_in_flight)``.
* ``update_rdy(conn, n)``: cap ``n`` at the connection's ``max_rdy_count``,
  cancel its pending retry, truncate to what ``max_in_flight`` still allows;
  if nothing is allowed and the connection sits at 0, retry in 5 s.
* ``redistribute`` (every ``rdy_redistribute_interval``): when there are more
  connections than ``max_in_flight``, or in backoff with several connections,
  idle connections give their RDY back and the free units go, one each, to
  random connections.
* Backoff: a failure raises the level, a success lowers it; at level > 0
  every connection gets RDY 0 for ``strategy(level)`` (capped by
  ``max_backoff_duration``), then one random connection gets RDY 1 to test
  the waters.  Signals arriving during that sleep are ignored.

This module imports no reactor: the clock (``callLater``/``seconds``) and the
random source are passed in, so tests drive it with ``task.Clock``.
"""

from __future__ import annotations

import random
from typing import Any
from collections.abc import Callable

from twisted.logger import Logger

from .config import Config
from .errors import Closing, OverMaxInFlight

__all__ = ["RdyController", "RESUME", "BACKOFF", "CONTINUE", "RDY_RETRY_DELAY"]

log = Logger(namespace="nsqtw.client")

RESUME = "resume"      # a message finished
BACKOFF = "backoff"    # a message failed (REQ with backoff)
CONTINUE = "continue"  # REQ without backoff

#: go-nsq retries a RDY update refused for max_in_flight after 5 s
RDY_RETRY_DELAY = 5.0


class RdyController:
    """RDY counts and backoff for the connections of one consumer.

    Connections are any objects with ``address``, ``rdy``, ``max_rdy_count``,
    ``last_rdy_time``, ``last_msg_time``, ``in_flight``, ``is_closing()`` and
    ``write_rdy(n)`` (:class:`~nsqtw.client.connection.NSQConnection` has them).
    """

    def __init__(self, config: Config, clock: Any, rng: random.Random | None = None) -> None:
        self.config = config
        self.clock = clock
        self.rng = rng or random.Random()
        self.max_in_flight = config.max_in_flight
        self.conns: dict[str, Any] = {}
        self.total_rdy = 0
        self.backoff_counter = 0
        #: > 0 while sleeping in a backoff timeout (go-nsq ``backoffDuration``)
        self.backoff_duration = 0.0
        self.need_redistribute = False
        self.stopping = False
        #: how many backoff sleeps started, and how many times backoff was left (tests, stats)
        self.backoffs = 0
        self.recoveries = 0
        self._retry: dict[str, Any] = {}
        self._resume_call: Any = None

    # --- queries ---------------------------------------------------------------------

    def in_backoff(self) -> bool:
        return self.backoff_counter > 0

    def in_backoff_timeout(self) -> bool:
        return self.backoff_duration > 0

    def per_conn_max_in_flight(self) -> int:
        b = self.max_in_flight
        n = len(self.conns)
        if b <= 0:
            return 0
        if n == 0:
            return b
        return int(min(max(1.0, b / n), float(b)))

    def is_starved(self) -> bool:
        """A connection has nearly filled its RDY window (in flight ≥ 85% of RDY)."""
        for conn in self.conns.values():
            threshold = int(conn.rdy * 0.85)
            if conn.in_flight >= threshold and conn.in_flight > 0 and not conn.is_closing():
                return True
        return False

    # --- connections ------------------------------------------------------------------

    def add(self, conn: Any) -> None:
        """A new subscribed connection: shrink the others' share, then size it."""
        self.conns[conn.address] = conn
        for other in list(self.conns.values()):
            if other is not conn:
                self.maybe_update_rdy(other)
        self.maybe_update_rdy(conn)

    def remove(self, conn: Any) -> None:
        """go-nsq ``onConnClose``: give back its RDY, maybe trigger redistribution."""
        if conn.address not in self.conns or self.conns[conn.address] is not conn:
            return
        rdy = conn.rdy
        self.total_rdy -= rdy
        call = self._retry.pop(conn.address, None)
        had_retry = call is not None
        if call is not None and call.active():
            call.cancel()
        del self.conns[conn.address]
        left = len(self.conns)
        if (had_retry or rdy > 0) and (left == self.max_in_flight or self.in_backoff()):
            # leaving the (normal) redistribution cases with RDY to move elsewhere
            self.need_redistribute = True

    def change_max_in_flight(self, max_in_flight: int) -> None:
        """go-nsq ``ChangeMaxInFlight`` (0 pauses the flow)."""
        if max_in_flight == self.max_in_flight:
            return
        self.max_in_flight = max_in_flight
        for conn in list(self.conns.values()):
            self.maybe_update_rdy(conn)

    # --- RDY updates -------------------------------------------------------------------

    def maybe_update_rdy(self, conn: Any) -> None:
        if self.in_backoff() or self.in_backoff_timeout():
            return
        count = self.per_conn_max_in_flight()
        try:
            self.update_rdy(conn, count)
        except (OverMaxInFlight, Closing) as e:
            log.debug("({addr}) error sending RDY {n}: {e}", addr=conn.address, n=count, e=e)

    def update_rdy(self, conn: Any, count: int) -> None:
        """Raises :class:`~nsqtw.client.errors.Closing` or :class:`~nsqtw.client.errors.OverMaxInFlight` as go-nsq returns them."""
        if conn.is_closing():
            raise Closing("closing")
        if count > conn.max_rdy_count:
            count = conn.max_rdy_count
        call = self._retry.pop(conn.address, None)
        if call is not None and call.active():
            call.cancel()
        rdy = conn.rdy
        max_possible = self.max_in_flight - self.total_rdy + rdy
        if 0 < max_possible < count:
            count = max_possible
        if max_possible <= 0 and count > 0:
            if rdy == 0:
                # wanted out of RDY 0 but may not: retry later rather than starve forever
                # (any other successful update of this connection cancels the retry)
                self._retry[conn.address] = self.clock.callLater(
                    RDY_RETRY_DELAY, self._retry_update, conn, count)
            raise OverMaxInFlight("over configure max-inflight")
        self.send_rdy(conn, count)

    def _retry_update(self, conn: Any, count: int) -> None:
        self._retry.pop(conn.address, None)
        if self.conns.get(conn.address) is not conn:
            return
        try:
            self.update_rdy(conn, count)
        except (OverMaxInFlight, Closing):
            pass

    def send_rdy(self, conn: Any, count: int) -> None:
        """Record the new value; write ``RDY n`` only when it changes."""
        last = conn.rdy
        if count == 0 and last == 0:
            return
        self.total_rdy += count - last
        conn.rdy = count
        if count > 0:
            conn.last_rdy_time = self.clock.seconds()
        if count == last:
            return
        conn.write_rdy(count)

    # --- redistribution -------------------------------------------------------------------

    def redistribute(self) -> None:
        """One tick of go-nsq's ``rdyLoop``."""
        if self.in_backoff_timeout():
            return
        conns = list(self.conns.values())
        if not conns:
            return
        mif = self.max_in_flight
        if len(conns) > mif:
            self.need_redistribute = True
        if self.in_backoff() and len(conns) > 1:
            self.need_redistribute = True
        if not self.need_redistribute:
            return
        self.need_redistribute = False
        now = self.clock.seconds()
        possible: list[Any] = []
        for conn in conns:
            if conn.rdy > 0:
                if now - conn.last_msg_time > self.config.low_rdy_idle_timeout:
                    log.debug("({addr}) idle connection, giving up RDY", addr=conn.address)
                    self._quiet_update(conn, 0)
                elif now - conn.last_rdy_time > self.config.low_rdy_timeout:
                    log.debug("({addr}) RDY timeout, giving up RDY", addr=conn.address)
                    self._quiet_update(conn, 0)
            possible.append(conn)
        available = mif - self.total_rdy
        if self.in_backoff():
            available = 1 - self.total_rdy
        while possible and available > 0:
            available -= 1
            conn = possible.pop(self.rng.randrange(len(possible)))
            log.debug("({addr}) redistributing RDY", addr=conn.address)
            self._quiet_update(conn, 1)

    def _quiet_update(self, conn: Any, count: int) -> None:
        try:
            self.update_rdy(conn, count)
        except (OverMaxInFlight, Closing):
            pass

    # --- backoff -----------------------------------------------------------------------------

    def signal(self, kind: str) -> None:
        """go-nsq ``startStopContinueBackoff``: RESUME, BACKOFF or CONTINUE."""
        if self.in_backoff_timeout():
            return  # one result per backoff window counts
        updated = False
        counter = self.backoff_counter
        if kind == RESUME:
            if counter > 0:
                counter -= 1
                updated = True
        elif kind == BACKOFF:
            nxt = self.config.backoff_duration(counter + 1, self.rng)
            if nxt <= self.config.max_backoff_duration:
                counter += 1
                updated = True
        self.backoff_counter = counter
        if counter == 0 and updated:
            self.recoveries += 1
            count = self.per_conn_max_in_flight()
            log.warn("exiting backoff, returning all to RDY {n}", n=count)
            for conn in list(self.conns.values()):
                self._quiet_update(conn, count)
        elif counter > 0:
            duration = min(self.config.backoff_duration(counter, self.rng), self.config.max_backoff_duration)
            log.warn("backing off for {d:.3f}s (backoff level {backoff_level}), setting all to RDY 0",
                     d=duration, backoff_level=counter)
            for conn in list(self.conns.values()):
                self._quiet_update(conn, 0)
            self._backoff(duration)

    def _backoff(self, duration: float) -> None:
        self.backoffs += 1
        self.backoff_duration = duration
        if self._resume_call is not None and self._resume_call.active():
            self._resume_call.cancel()
        self._resume_call = self.clock.callLater(duration, self._resume)

    def _resume(self) -> None:
        self._resume_call = None
        if self.stopping:
            self.backoff_duration = 0.0
            return
        conns = list(self.conns.values())
        if not conns:
            log.warn("no connection available to resume; backing off for 1s")
            self._backoff(1.0)
            return
        choice = conns[self.rng.randrange(len(conns))]
        log.warn("({addr}) backoff timeout expired, sending RDY 1", addr=choice.address)
        try:
            # while in backoff only ever let one message at a time through
            self.update_rdy(choice, 1)
        except (OverMaxInFlight, Closing) as e:
            log.warn("({addr}) error resuming RDY 1 - {e}; backing off for 1s", addr=choice.address, e=e)
            self._backoff(1.0)
            return
        self.backoff_duration = 0.0

    # --- lifecycle ------------------------------------------------------------------------------

    def stop(self) -> None:
        """Cancel every timer (the resume, the RDY retries)."""
        self.stopping = True
        for call in list(self._retry.values()):
            if call.active():
                call.cancel()
        self._retry.clear()
        if self._resume_call is not None and self._resume_call.active():
            self._resume_call.cancel()
        self._resume_call = None
        self.backoff_duration = 0.0


Signal = Callable[[str], None]
