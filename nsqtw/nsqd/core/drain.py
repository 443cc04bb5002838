"""
A node's drain (sans-IO): what it does next, step by step, from what its queues hold and
whether a replica peer can take them.

A draining node refuses publishes and keeps delivering; when a peer is in sync it stops
handing out new messages (:data:`HOLD`), gives the ones in flight a moment to be finished
(``inflight_wait``), then hands the rest to the peer (:data:`HANDOFF`), which adopts them.
Without a peer (or once the peer took everything), it is drained when nothing is queued,
deferred or in flight.  The glue (:mod:`nsqtw.nsqd.drain`) counts, acts and reports;
nothing here reads a clock: ``now`` is passed in.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Drain", "SERVING", "DRAINING", "HOLDING", "HANDING_OFF", "DRAINED",
           "NOTHING", "HOLD", "RELEASE", "HANDOFF", "DONE", "INFLIGHT_WAIT", "MAX_HANDOFFS", "RETRY_AFTER"]

#: the states, as ``GET /drain`` says them
SERVING = "serving"
DRAINING = "draining"
HOLDING = "holding"
HANDING_OFF = "handing_off"
DRAINED = "drained"

#: what :meth:`Drain.step` asks the glue to do
NOTHING = "nothing"
HOLD = "hold"
RELEASE = "release"
HANDOFF = "handoff"
DONE = "done"

#: seconds a node waits, delivery held, for its messages in flight to be finished before it
#: hands its backlog to a peer (those still in flight then may be delivered twice)
INFLIGHT_WAIT = 2.0
#: hand-offs tried in one drain (a peer that keeps refusing: the node delivers what is left)
MAX_HANDOFFS = 3
#: seconds between a refused hand-off and the next try
RETRY_AFTER = 5.0


class Drain:
    """One node's drain, from :meth:`start` to :data:`DRAINED` (or :meth:`cancel`)."""

    def __init__(self, inflight_wait: float = INFLIGHT_WAIT, max_handoffs: int = MAX_HANDOFFS,
                 retry_after: float = RETRY_AFTER) -> None:
        self.inflight_wait = inflight_wait
        self.max_handoffs = max_handoffs
        self.retry_after = retry_after
        self.state = SERVING
        #: when the drain started, and when it ended (drained)
        self.started: float | None = None
        self.finished: float | None = None
        #: the peer taking (or that took) the backlog
        self.peer: str | None = None
        #: messages the peers adopted, over every hand-off of this drain
        self.handed_off = 0
        self.handoffs = 0
        #: why the last hand-off failed ("" : none did)
        self.handoff_error = ""
        #: peers that refused a hand-off in this drain (the next is asked of another)
        self.refused: set[str] = set()
        self._held_since = 0.0
        self._retry_at = 0.0

    @property
    def active(self) -> bool:
        """Publishes are refused (draining or drained)."""
        return self.state != SERVING

    def start(self, now: float) -> bool:
        """Start draining; False if the node already drains (or drained)."""
        if self.state != SERVING:
            return False
        self.state = DRAINING
        self.started = now
        self.finished = None
        self.peer = None
        self.handed_off = self.handoffs = 0
        self.handoff_error = ""
        self.refused = set()
        self._retry_at = 0.0
        return True

    def cancel(self) -> bool:
        """Serve again (publishes accepted); False if the node was not draining, or is handing
        its backlog off right now (the peer's answer decides)."""
        if self.state in (SERVING, HANDING_OFF):
            return False
        self.state = SERVING
        self.finished = None
        return True

    def step(self, now: float, *, queued: int, in_flight: int, peer: str | None) -> str:
        """What to do now, given the messages still ``queued`` (deferred ones included) and
        ``in_flight`` here, and a peer in sync able to take them (None: none)."""
        state = self.state
        if state == DRAINING:
            if not queued and not in_flight:
                self.state = DRAINED
                self.finished = now
                return DONE
            if peer is not None and self.handoffs < self.max_handoffs and now >= self._retry_at:
                self.state = HOLDING
                self.peer = peer
                self._held_since = now
                return HOLD
            return NOTHING
        if state == HOLDING:
            if peer is None:  # the peer went out of sync: deliver meanwhile
                self.state = DRAINING
                return RELEASE
            self.peer = peer
            if not in_flight or now - self._held_since >= self.inflight_wait:
                self.state = HANDING_OFF
                self.handoffs += 1
                return HANDOFF
            return NOTHING
        if state == DRAINED and (queued or in_flight):
            self.state = DRAINING  # messages came back (a timed-out in-flight one, an adoption)
            self.finished = None
            return self.step(now, queued=queued, in_flight=in_flight, peer=peer)
        return NOTHING

    def handed(self, ok: bool, count: int = 0, reason: str = "", now: float = 0.0) -> None:
        """The peer's answer to the hand-off: it adopted ``count`` messages, or refused (or was
        lost) for ``reason`` (the next try comes ``retry_after`` after ``now``, preferably to
        another peer: see :attr:`refused`); either way the node goes on draining (delivery
        released), and is drained at the next step if nothing is left."""
        if self.state != HANDING_OFF:
            return
        self.state = DRAINING
        if ok:
            self.handed_off += count
            self.handoff_error = ""
        else:
            self.handoff_error = reason or "refused"
            self._retry_at = now + self.retry_after
            if self.peer is not None:
                self.refused.add(self.peer)

    def progress(self, now: float, *, queued: int, in_flight: int) -> dict[str, Any]:
        """``GET /drain``'s answer."""
        doc: dict[str, Any] = {"state": self.state, "queued": queued, "in_flight": in_flight,
                               "handed_off": self.handed_off, "peer": self.peer}
        if self.started is not None and self.state != SERVING:
            doc["started"] = self.started
            doc["elapsed_seconds"] = round((self.finished if self.finished is not None else now) - self.started, 3)
        if self.handoff_error:
            doc["handoff_error"] = self.handoff_error
        return doc
