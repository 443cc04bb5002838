"""
A node's drain (``POST /drain``, or a stop with ``--drain-timeout``), around the sans-IO
:class:`~nsqtw.nsqd.core.drain.Drain`: publishes refused at once, the topics unregistered from
nsqlookupd, the backlog delivered to the consumers connected, or handed to a replica peer in
sync (which adopts it), progress in ``GET /drain``.

Every change of state is told to :attr:`DrainService.listeners` (``(state, progress)``), the
hook through which a coordinator can record it elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.application.service import Service
from twisted.internet import defer, task
from twisted.logger import Logger

from .core.drain import DONE, DRAINED, HANDOFF, HOLD, RELEASE, SERVING, Drain

__all__ = ["DrainService", "TICK", "backlog"]

log = Logger(namespace="nsqtw.nsqd")

#: seconds between the drain's steps
TICK = 0.1


def backlog(broker: Any) -> tuple[int, int]:
    """``(queued, in flight)`` of the broker's durable topics and channels: queued counts
    what waits in a topic's own queue or a channel's, deferred messages included (ephemeral
    ones are not kept by a stop, and no peer holds them)."""
    queued = in_flight = 0
    for topic in broker.topics.values():
        if topic.ephemeral:
            continue
        queued += topic.depth()
        for ch in topic.channels.values():
            if ch.ephemeral:
                continue
            queued += ch.depth() + len(ch.deferred)
            in_flight += len(ch.inflight)
    return queued, in_flight


class DrainService(Service):
    """The drain of one nsqd (a child of its :class:`~nsqtw.nsqd.service.NsqdService`).

    ``node`` gives the broker, the replication service (None: not replicated), the lookup
    peers (None: no nsqlookupd) and ``settle``."""

    name = "drain"  # type: ignore[assignment]  # Twisted's Service declares name = None (unannotated)

    def __init__(self, node: Any, reactor: Any) -> None:
        self.node = node
        self.reactor = reactor
        self.drain = Drain()
        #: called with ``(state, progress)`` at every change of the drain's state
        self.listeners: list[Callable[[str, dict[str, Any]], None]] = []
        self._loop: task.LoopingCall | None = None
        self._held = False
        self._waiters: list[defer.Deferred[None]] = []
        self._handing: defer.Deferred[Any] | None = None
        #: ends a stop's drain before its --drain-timeout (see :meth:`cut_short`)
        self._cut: Callable[[], None] | None = None

    @property
    def draining(self) -> bool:
        """Publishes are refused (draining or drained)."""
        return self.drain.active

    def progress(self) -> dict[str, Any]:
        """``GET /drain``'s answer."""
        queued, in_flight = backlog(self.node.broker)
        return self.drain.progress(self.reactor.seconds(), queued=queued, in_flight=in_flight)

    def _tell(self) -> None:
        doc = self.progress()
        for listener in list(self.listeners):
            try:
                listener(doc["state"], doc)
            except Exception:
                log.failure("a drain listener failed")

    def start(self) -> dict[str, Any]:
        """Start draining (nothing if the node already drains); the progress."""
        now = self.reactor.seconds()
        if self.drain.start(now):
            self.node.broker.draining = True
            lookup = self.node.lookup_peers
            if lookup is not None:
                lookup.withdraw()
            queued, in_flight = backlog(self.node.broker)
            log.info("DRAIN: refusing publishes, topics unregistered from nsqlookupd; {q} messages queued, "
                     "{f} in flight", q=queued, f=in_flight)
            self._tell()
            if self.running:
                self._start_loop()
        return self.progress()

    def cancel(self) -> dict[str, Any]:
        """Serve again: publishes accepted, topics registered again (a hand-off under way
        finishes first: then cancel again)."""
        if self.drain.cancel():
            self._stop_loop()
            self._release()
            self.node.broker.draining = False
            lookup = self.node.lookup_peers
            if lookup is not None:
                lookup.restore()
            log.info("DRAIN: cancelled; accepting publishes again")
            self._tell()
        return self.progress()

    def drained(self) -> defer.Deferred[None]:
        """Fires once the node is drained (at once when it is)."""
        if self.drain.state == DRAINED:
            return defer.succeed(None)
        d: defer.Deferred[None] = defer.Deferred()
        self._waiters.append(d)
        return d

    def drain_for_stop(self, timeout: float) -> defer.Deferred[None]:
        """A stop with ``--drain-timeout``: drain, and fire once drained or ``timeout`` seconds
        passed (what is left then stays in the data path, as at any stop)."""
        self.start()
        self.step()
        d = self.drained()
        if d.called:
            return d
        out: defer.Deferred[None] = defer.Deferred()

        def done(_: Any) -> None:
            self._cut = None
            if call.active():
                call.cancel()
            if not out.called:
                out.callback(None)

        def late() -> None:
            self._cut = None
            doc = self.progress()
            log.warn("DRAIN: stopping before the drain is done (--drain-timeout passed, or asked again) with "
                     "{q} messages queued and {f} in flight (they stay in the data path)", q=doc["queued"],
                     f=doc["in_flight"])
            if d in self._waiters:
                self._waiters.remove(d)
            if not out.called:
                out.callback(None)

        def cut() -> None:
            if call.active():
                call.cancel()
                late()

        call = self.reactor.callLater(timeout, late)
        self._cut = cut
        d.addCallback(done)
        return out

    def cut_short(self) -> bool:
        """A stop that drains (``--drain-timeout``) stops now (a second SIGTERM); False when no
        such stop waits."""
        cut, self._cut = self._cut, None
        if cut is None:
            return False
        cut()
        return True

    # --- steps ------------------------------------------------------------------

    def _start_loop(self) -> None:
        if self._loop is None:
            self._loop = task.LoopingCall(self.step)
            self._loop.clock = self.reactor
            self._loop.start(TICK, now=False)

    def _stop_loop(self) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None

    def _release(self) -> None:
        if self._held:
            self._held = False
            self.node.broker.delivery_held = False
            self.node.settle()

    def step(self) -> None:
        """One step of the drain (every :data:`TICK` while it runs)."""
        drain = self.drain
        if drain.state == SERVING:
            return
        replication = self.node.replication
        peer = None
        if replication is not None:  # a peer that has not refused this drain, else any
            peer = replication.handoff_peer(drain.refused) or replication.handoff_peer()
        queued, in_flight = backlog(self.node.broker)
        was = drain.state
        action = drain.step(self.reactor.seconds(), queued=queued, in_flight=in_flight, peer=peer)
        if action == HOLD:
            if not self.node.broker.delivery_held:
                self._held = True
                self.node.broker.delivery_held = True
            log.info("DRAIN: peer {peer} is in sync: holding delivery, waiting for {f} messages in flight, "
                     "then handing {q} queued messages to it", peer=peer, f=in_flight, q=queued)
        elif action == RELEASE:
            self._release()
        elif action == HANDOFF:
            assert replication is not None and peer is not None
            self._handing = d = replication.hand_off(peer)
            d.addCallback(self._handed)
        elif action == DONE:
            self._release()
            log.info("DRAIN: drained ({n} messages handed off)", n=drain.handed_off)
            waiters, self._waiters = self._waiters, []
            for w in waiters:
                w.callback(None)
        if drain.state != was:
            self._tell()

    def _handed(self, handed: Any) -> None:
        self._handing = None
        self.drain.handed(handed.ok, handed.count, handed.reason, self.reactor.seconds())
        if not handed.ok:
            log.warn("DRAIN: hand-off to {peer} failed: {why}; delivering meanwhile", peer=self.drain.peer,
                     why=handed.reason)
        self._release()
        self._tell()
        self.step()

    def startService(self) -> None:
        super().startService()
        if self.drain.active:
            self._start_loop()

    def stopService(self) -> None:
        super().stopService()
        self._stop_loop()
