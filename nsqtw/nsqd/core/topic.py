"""
A topic: the publish side of a stream, multicast to every channel.

While a topic has channels and is not paused, a published run is handed to
each channel at once (the same bytes, shared).  Without channels, or while
paused, messages wait in the topic's own queue (memory, then overflow) and
deferred ones in a list with their absolute due time; :meth:`Topic.pump`
moves them on when a channel appears or the topic is unpaused.  This is NSQ's
``messagePump`` without the goroutine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...backend.memory import MemoryQueue
from ...backend.runs import Run, run_count
from ...errors import BackendError, Exiting, QueueFull
from ...protocol.names import is_ephemeral
from .channel import Channel

if TYPE_CHECKING:
    from ...backend import IBackendQueue
    from .broker import Broker

__all__ = ["Topic"]

#: messages moved from a topic's backlog to its channels per pump step
PUMP_BATCH = 10000


class Topic:
    """NSQ's Topic."""

    __slots__ = (
        "name", "ephemeral", "broker", "channels", "mem", "backend", "deferred", "paused",
        "exiting", "message_count", "message_bytes", "holds", "bounded", "__weakref__",
    )

    def __init__(self, name: str, broker: Broker, backend: IBackendQueue) -> None:
        self.name = name
        self.ephemeral = is_ephemeral(name)
        self.broker = broker
        self.channels: dict[str, Channel] = {}
        self.mem = MemoryQueue(broker.options.mem_queue_size)
        self.backend = backend
        #: (due, frame) held while no channel takes them; the shared empty tuple while there
        #: are none (an idle topic allocates no list)
        self.deferred: list[tuple[float, bytes]] | tuple[()] = ()
        self.paused = False
        self.exiting = False
        self.message_count = 0
        self.message_bytes = 0
        self.holds = 0
        #: channels whose policy refuses publishes while they are full (``overflow=refuse``)
        self.bounded: tuple[Channel, ...] = ()

    def depth(self) -> int:
        return self.mem.depth() + self.backend.depth() + len(self.deferred)

    def flowing(self) -> bool:
        return bool(self.channels) and not self.paused and not self.holds

    def hold(self) -> None:
        """Keep messages at the topic until :meth:`release` (nsqd starts a new topic's
        pump only after pre-creating the channels nsqlookupd knows, so none miss messages)."""
        self.holds += 1

    def release(self) -> None:
        if self.holds:
            self.holds -= 1
        if not self.holds and self.channels:
            self.broker.pumping.add(self)

    # --- publishing ---------------------------------------------------------

    def _direct(self) -> bool:
        """A publish goes straight to the channels (none waits at the topic, none held)."""
        return bool(self.channels) and not self.paused and not self.holds \
            and not self.mem.depth() and not self.backend.depth()

    def _refuse_while_holding(self, n: int, direct: bool) -> None:
        """While messages are held for the disk, refuse a new publish that would need a disk
        queue (see :mod:`.backlog`): the space the disk frees goes to the held ones first."""
        if direct:
            backends = [ch.backend for ch in self.channels.values() if ch.mem.room() < n]
        elif self.mem.room() < n:
            backends = [self.backend]
        else:
            return
        why = self.broker.backlog.refusal(backends)
        if why is not None:
            raise BackendError(why)

    def check_room(self, n: int, direct: bool | None = None) -> bool:
        """Refuse, before anything is stored, a publish of ``n`` messages some queue cannot
        hold; returns the route it takes (True: straight to the channels)."""
        if self.exiting:
            raise Exiting()
        if direct is None:
            direct = self._direct()
        if self.broker.backlog.channels:
            self._refuse_while_holding(n, direct)
        if self.bounded:
            self.check_bounds(n)
        if direct:
            for ch in self.channels.values():
                if not getattr(ch.backend, "accepts_all", True) and ch.mem.room() < n:
                    raise QueueFull(f"channel {self.name}:{ch.name} is full")
        elif not getattr(self.backend, "accepts_all", True) and self.mem.room() < n:
            raise QueueFull(f"topic {self.name} is full")
        return direct

    def check_bounds(self, n: int) -> None:
        """Refuse ``n`` more messages while a channel whose policy says ``overflow=refuse`` is at
        its ``max_depth`` (see :mod:`.policy`)."""
        for ch in self.bounded:
            policy = ch.policy
            if policy is not None and ch.depth() + n > policy.max_depth:
                raise QueueFull(f"channel {self.name}:{ch.name} is at its max_depth of {policy.max_depth}")

    def refresh_bounds(self) -> None:
        """A channel's policy changed, or a channel went: which ones refuse when full."""
        self.bounded = tuple(ch for ch in self.channels.values()
                             if ch.policy is not None and ch.policy.refuses and not ch.exiting)

    def put(self, run: Run, nbytes: int) -> None:
        """The one way a publish is stored: :meth:`check_room` (all or nothing), then to every
        channel while flowing, else to the topic's own queue; counted in ``message_count`` only
        for what was stored, as nsqd counts (a refused write, say a full disk, is not a
        message of the topic)."""
        if self.check_room(run_count(run)):
            self._put_channels(run, nbytes)
        else:
            self._put_queued(run, nbytes)

    def _put_channels(self, run: Run, nbytes: int) -> None:
        stored = False
        try:
            for ch in self.channels.values():
                ch.put(run)
                stored = True
        finally:
            if stored:
                self.message_count += len(run[1])
                self.message_bytes += nbytes

    def _put_queued(self, run: Run, nbytes: int) -> None:
        n = len(run[1])
        rest = self.mem.put(run)
        if rest is not None:
            try:
                left = self.backend.put(rest)
            except Exception:
                self._count(n - len(rest[1]), n, nbytes)  # the head that went to memory stays
                raise
            if left is not None:
                self._count(n - len(left[1]), n, nbytes)
                raise QueueFull(f"topic {self.name} is full")
        self.message_count += n
        self.message_bytes += nbytes
        if self.flowing():
            self.broker.pumping.add(self)

    def _count(self, stored: int, n: int, nbytes: int) -> None:
        if stored > 0:
            self.message_count += stored
            self.message_bytes += nbytes * stored // n

    def put_deferred(self, frame: bytes, nbytes: int, deliver_at: float) -> None:
        if self.flowing():
            for ch in self.channels.values():
                ch.put_deferred(frame, deliver_at)
        elif self.broker.options.sync_every == 1 and getattr(self.backend, "durable", False):
            # --sync-every=1: on the topic's disk at once, with its deferral hint (see
            # Channel._defer_durably); a refused write fails the DPUB
            backend: Any = self.backend  # a DiskQueue (durable): it has put_deferred and a sink
            backend.put_deferred([(deliver_at, frame)])
            if backend.deferred_sink is None:
                backend.deferred_sink = self.restore_deferred
            if self.channels:
                self.broker.pumping.add(self)
        else:
            self._hold_deferred(deliver_at, frame)
        self.message_count += 1
        self.message_bytes += nbytes

    def _hold_deferred(self, deliver_at: float, frame: bytes) -> None:
        d = self.deferred
        if isinstance(d, list):
            d.append((deliver_at, frame))
        else:
            self.deferred = [(deliver_at, frame)]

    def restore_deferred(self, deliver_at: float, frame: bytes) -> None:
        """A deferred message read back from disk, still due later: wait for it again."""
        if self.flowing():
            for ch in self.channels.values():
                ch.take_deferred(deliver_at, frame)
        else:
            self._hold_deferred(deliver_at, frame)

    def pump(self, limit: int = PUMP_BATCH) -> bool:
        """Move up to ``limit`` waiting messages to the channels; True if more remain."""
        if not self.flowing() or self.exiting:
            return False
        if self.broker.backlog.channels:
            # messages are held for the disk: what waits here is safe where it is, and the
            # channels' disk queues take the held ones first (resume_pumps restarts this)
            return False
        channels = list(self.channels.values())
        if self.deferred:
            for at, frame in self.deferred:
                for ch in channels:
                    ch.put_deferred(frame, at)
            self.deferred = ()
        moved = 0
        for run in self.mem.read(limit):
            moved += run_count(run)
            for ch in channels:
                ch.accept(run)
        if moved < limit and self.backend.depth():
            for run in self.backend.read(limit - moved):
                moved += run_count(run)
                for ch in channels:
                    ch.accept(run)
        return bool(self.mem.depth() or self.backend.depth())

    # --- channels -----------------------------------------------------------

    def get_channel(self, name: str, now: float) -> Channel:
        ch = self.channels.get(name)
        if ch is None:
            ch = self.broker._new_channel(self, name, now)
        return ch

    def pause(self) -> None:
        self.paused = True

    def unpause(self) -> None:
        self.paused = False
        if self.channels:
            self.broker.pumping.add(self)

    def empty(self) -> None:
        """Drop the topic's own backlog; channels keep theirs (NSQ's Topic.Empty)."""
        self.mem.empty()
        self.backend.empty()
        self.deferred = ()

    def __repr__(self) -> str:
        return f"<Topic {self.name}>"
