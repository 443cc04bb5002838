"""
The broker: every topic and channel of one nsqd, and the one place work is
settled after an event.

Protocol glue, timers and the HTTP API change state through the broker and
then call :meth:`Broker.settle`, which moves waiting topic backlogs to their
channels, delivers to every channel that may now have work (``dirty``), and
writes each client's accumulated output once.  A read that FINs 500 messages
therefore costs one delivery pass and one write, not 500.

The broker imports no reactor: time arrives as ``now`` arguments, randomness
from an injected ``random.Random``, and storage from a backend factory.
"""

from __future__ import annotations

import operator
import random
import struct
from itertools import accumulate, chain, count, repeat
from typing import TYPE_CHECKING, Any
from collections.abc import Callable, Sequence

from twisted.logger import Logger

from ...backend.dummy import DummyQueue
from ...backend.runs import Run, run_of_frame, run_of_frames
from ...errors import BackendError, BrokerError, ChannelNotFound, Exiting, TopicNotFound
from ...options import NsqdOptions
from ...protocol.names import is_ephemeral
from .backlog import HeldBacklog
from .channel import Channel
from .client import ClientState
from .deadletters import DeadSink
from .guid import GUIDFactory
from .policy import ChannelPolicy, default_policy
from .topic import Topic


class Draining(BrokerError):
    """The node drains (``POST /drain``): it refuses publishes (``E_PUB_FAILED``, HTTP 503
    ``DRAINING``) while it delivers or hands off what it holds."""

    def __init__(self, text: str = "draining") -> None:
        super().__init__(text)


if TYPE_CHECKING:
    from ...backend import IBackendQueue

log = Logger(namespace="nsqtw.nsqd")

__all__ = ["Broker", "Event", "Draining"]

_SIZE = struct.Struct(">i").pack
_MID = struct.Struct(">iqH").pack  # frame type, timestamp, attempts
_HEAD = struct.Struct(">iiqH").pack  # size, then _MID's fields
_add = operator.add
_ONE = range(0, 1)


class Event:
    """Names of the changes listeners hear about (lookupd registration, metadata)."""

    TOPIC_CREATED = "topic_created"
    TOPIC_DELETED = "topic_deleted"
    CHANNEL_CREATED = "channel_created"
    CHANNEL_DELETED = "channel_deleted"
    PAUSED = "paused"
    EMPTIED = "emptied"
    #: a channel's policy was set (see :mod:`.policy`)
    POLICY = "policy"


BackendFactory = Callable[[str, bool], Any]
Listener = Callable[[str, str, str | None], None]


class _RefusingQueue(DummyQueue):
    """Overflow target when no durable backend is configured: stores nothing, refuses."""

    accepts_all = False

    def put(self, run: Run) -> Run:
        return run


def memory_only_backends(name: str, ephemeral: bool) -> Any:
    """Ephemeral queues drop their overflow; others refuse it (nothing acknowledged is lost)."""
    return DummyQueue() if ephemeral else _RefusingQueue()


class Broker:
    """All topics and channels of one nsqd."""

    #: the class of the channels it makes (a subclass may make its own)
    channel_class = Channel

    def __init__(self, options: NsqdOptions, now: float, *,
                 backend_factory: BackendFactory | None = None,
                 rng: random.Random | None = None) -> None:
        self.options = options
        self.rng = rng or random.Random()
        self.guid = GUIDFactory(options.node_id)
        self.start_time = now
        self.topics: dict[str, Topic] = {}
        self.clients: dict[int, ClientState] = {}
        self.dirty: set[Channel] = set()
        self.pumping: set[Topic] = set()
        self.outbox: list[ClientState] = []
        self.listeners: list[Listener] = []
        self.backend_factory: BackendFactory = backend_factory or memory_only_backends
        self.health = "OK"
        #: messages the disk refused, held in memory until it accepts writes again
        self.backlog = HeldBacklog(options.max_held_bytes)
        self.exiting = False
        self.loading = False
        #: no message is handed to a consumer while True (queues fill, publishes go on): a
        #: replicated origin restarting with a backlog waits for its peers to say whether one
        #: of them adopted it
        self.delivery_held = False
        #: publishes are refused while True (the node drains: see nsqtw.nsqd.core.drain)
        self.draining = False
        self._client_ids = count(1)
        self._channel_list: list[Channel] | None = None
        #: channels whose delivery rate (``max_rate``) held messages back: the queue scan
        #: delivers to them again (see :meth:`wake_throttled`)
        self.throttled: set[Channel] = set()
        #: where durable channels keep dead letters: ``(queue name, ephemeral, existing only)``
        #: to a sink, or None for memory only (the service gives one when it has a data path)
        self.dead_sinks: Callable[[str, bool, bool], DeadSink | None] | None = None
        #: the clock, for what happens outside a call that carries ``now`` (a dropped message's
        #: time of death); the service gives its reactor's
        self.clock: Callable[[], float] = lambda: self.start_time
        #: the nsqd-wide policy of new channels (``--max-attempts`` and the like)
        self.default_policy = default_policy(options)

    # --- settling -------------------------------------------------------------

    def settle(self, now: float) -> None:
        """Pump topic backlogs, deliver to dirty channels, write every pending output once."""
        if self.pumping:
            for topic in list(self.pumping):
                if not topic.pump():
                    self.pumping.discard(topic)
        dirty = self.dirty
        while dirty and not self.delivery_held:
            ch = dirty.pop()
            ch.deliver(now)
        self.flush()

    def flush(self) -> None:
        """Write each client's pending output (clients appended meanwhile are reached too)."""
        outbox = self.outbox
        if outbox:
            for client in outbox:
                client.flush()
            outbox.clear()

    def wake_throttled(self) -> None:
        """Channels whose delivery rate held messages back get a delivery pass (the queue scan
        asks, every ``QueueScanInterval``)."""
        if self.throttled:
            self.dirty |= self.throttled
            self.throttled.clear()

    def time(self) -> float:
        return self.clock()

    def open_dead_sink(self, ch: Channel, existing: bool = False) -> DeadSink | None:
        """The sink of ``ch``'s dead letters (None: kept in memory only; with ``existing``, None
        too when none was stored before)."""
        sinks = self.dead_sinks
        if sinks is None:
            return None
        return sinks(f"{ch.topic.name}:{ch.name}", ch.ephemeral or ch.topic.ephemeral, existing)

    def publish_dead(self, topic_name: str, bodies: list[bytes], now: float) -> None:
        """Dead messages' bodies go to a channel's ``dead_letter_topic`` too; a refusal is logged
        (the dead letters stay in their channel either way)."""
        try:
            self.publish(topic_name, bodies, now)
        except BrokerError as e:
            log.warn("dead letters not published to {topic}: {e}", topic=topic_name, e=e)

    def set_policy(self, topic_name: str, channel_name: str, policy: ChannelPolicy, now: float) -> Channel:
        """``POST /channel/config``: enforce ``policy`` on an existing channel."""
        ch = self.find_channel(topic_name, channel_name)
        ch.set_policy(policy, now)
        self._notify(Event.POLICY, topic_name, channel_name)
        return ch

    def resume_pumps(self) -> None:
        """Nothing is held any more: topics whose backlog waited meanwhile move it on (a
        topic's pump stops while messages are held, see :meth:`Topic.pump`)."""
        for topic in self.topics.values():
            if topic.flowing() and not topic.exiting and (
                    topic.mem.depth() or topic.backend.depth() or topic.deferred):
                self.pumping.add(topic)

    def busy(self) -> bool:
        """True while a topic backlog still has messages to move (settle again soon)."""
        return bool(self.pumping)

    def health_status(self) -> str:
        """What ``/ping`` and ``/stats`` report: unhealthy while messages the disk refused
        are held in memory, else the result of the last publish (nsqd's health)."""
        return self.backlog.health() or self.health

    # --- clients --------------------------------------------------------------

    def new_client(self, remote_address: str, now: float) -> ClientState:
        client = ClientState(
            next(self._client_ids), remote_address, now, self.outbox,
            heartbeat_interval=self.options.heartbeat_interval,
            msg_timeout=self.options.msg_timeout,
            output_buffer_timeout=self.options.output_buffer_timeout,
        )
        self.clients[client.id] = client
        return client

    def client_gone(self, client: ClientState, now: float) -> None:
        self.clients.pop(client.id, None)
        ch = client.channel
        if ch is not None:
            ch.remove_client(client, now)
        client.out.clear()

    # --- topics and channels ----------------------------------------------------

    def get_topic(self, name: str, now: float = 0.0) -> Topic:
        topic = self.topics.get(name)
        if topic is not None:
            return topic
        if self.exiting:
            raise Exiting()
        backend = self.backend_factory(name, name.endswith("#ephemeral"))
        topic = Topic(name, self, backend)
        if getattr(backend, "has_deferred_hints", False):  # a sink only where one is needed
            backend.deferred_sink = topic.restore_deferred
        self.topics[name] = topic
        self._notify(Event.TOPIC_CREATED, name, None)
        return topic

    def _new_channel(self, topic: Topic, name: str, now: float) -> Channel:
        if topic.exiting or self.exiting:
            raise Exiting()
        backend = self.backend_factory(f"{topic.name}:{name}", name.endswith("#ephemeral"))
        ch = self.channel_class(topic, name, self, backend, now)
        if getattr(backend, "has_deferred_hints", False):  # a sink only where one is needed
            backend.deferred_sink = ch.restore_deferred
        topic.channels[name] = ch
        if self.dead_sinks is not None:
            ch.load_dead()
        if self.default_policy is not None:
            ch.set_policy(self.default_policy, now)
        if self._channel_list is not None:
            self._channel_list.append(ch)
        self._notify(Event.CHANNEL_CREATED, topic.name, name)
        if topic.mem.depth() or topic.backend.depth() or topic.deferred:
            self.pumping.add(topic)
        return ch

    def find_topic(self, name: str) -> Topic:
        topic = self.topics.get(name)
        if topic is None:
            raise TopicNotFound(name)
        return topic

    def find_channel(self, topic_name: str, channel_name: str) -> Channel:
        topic = self.find_topic(topic_name)
        ch = topic.channels.get(channel_name)
        if ch is None:
            raise ChannelNotFound(channel_name)
        return ch

    def delete_topic(self, name: str) -> None:
        topic = self.find_topic(name)
        topic.exiting = True
        self._notify(Event.TOPIC_DELETED, name, None)
        for ch_name in list(topic.channels):
            self._delete_channel(topic, ch_name, notify=False)
        topic.empty()
        topic.backend.delete()
        self.topics.pop(name, None)
        self.pumping.discard(topic)

    def delete_channel(self, topic_name: str, channel_name: str) -> None:
        topic = self.find_topic(topic_name)
        if channel_name not in topic.channels:
            raise ChannelNotFound(channel_name)
        self._delete_channel(topic, channel_name, notify=True)
        if topic.ephemeral and not topic.channels and not topic.exiting:
            self.delete_topic(topic_name)

    def _delete_channel(self, topic: Topic, name: str, notify: bool) -> None:
        ch = topic.channels[name]
        ch.exiting = True
        if notify:
            self._notify(Event.CHANNEL_DELETED, topic.name, name)
        ch.close_clients()
        ch.empty()
        ch.backend.delete()
        if ch.dead is not None:
            ch.dead.delete()
        topic.channels.pop(name, None)
        if topic.bounded:
            topic.refresh_bounds()
        self._channel_list = None
        self.dirty.discard(ch)
        self.throttled.discard(ch)
        self.backlog.forget(ch)

    def channels(self) -> list[Channel]:
        """Every channel of every topic: one list kept while channels are only added (a new
        channel is appended), rebuilt after a deletion; callers must not change it. The queue
        scan asks for it after every creation, so building it anew each time made creating
        the N-th channel cost O(N)."""
        chans = self._channel_list
        if chans is None:
            chans = self._channel_list = [ch for t in self.topics.values() for ch in t.channels.values()]
        return chans

    # --- what nsqlookupd peers use (service/lookup_peers.PeerBroker) ---------------

    def registrations(self) -> list[tuple[str, str | None]]:
        """nsqd's REGISTER replay: ``(topic, None)`` for a live topic without live channels,
        ``(topic, channel)`` for each live channel."""
        out: list[tuple[str, str | None]] = []
        for topic in list(self.topics.values()):
            if topic.exiting:
                continue
            channels = [name for name, ch in topic.channels.items() if not ch.exiting]
            if channels:
                out.extend((topic.name, name) for name in channels)
            else:
                out.append((topic.name, None))
        return out

    def has_topic(self, name: str) -> bool:
        return name in self.topics

    def hold_topic(self, name: str) -> Topic | None:
        """Keep a new topic's messages at the topic while nsqlookupd is asked which channels
        to pre-create (None: no such topic)."""
        topic = self.topics.get(name)
        if topic is not None:
            topic.hold()
        return topic

    def precreate_channels(self, topic: Topic, channels: list[str], now: float) -> None:
        """The channels nsqlookupd knows for a held topic, ephemeral ones left out (no
        ephemeral channel without a consumer); nothing if the topic went meanwhile."""
        if self.topics.get(topic.name) is not topic or topic.exiting:
            return
        for name in channels:
            if not is_ephemeral(name):
                topic.get_channel(name, now)

    def release_topic(self, topic: Topic) -> None:
        topic.release()

    def set_paused(self, topic_name: str, channel_name: str | None, paused: bool) -> None:
        topic = self.find_topic(topic_name)
        target: Any = topic
        if channel_name is not None:
            target = topic.channels.get(channel_name)
            if target is None:
                raise ChannelNotFound(channel_name)
        if paused:
            target.pause()
        else:
            target.unpause()
        self._notify(Event.PAUSED, topic_name, channel_name)

    def empty(self, topic_name: str, channel_name: str | None = None) -> None:
        """Empty a topic's own queue or a channel (``/topic/empty``, ``/channel/empty``)."""
        target: Any = self.find_topic(topic_name) if channel_name is None \
            else self.find_channel(topic_name, channel_name)
        target.empty()
        self._notify(Event.EMPTIED, topic_name, channel_name)

    def _notify(self, event: str, topic: str, channel: str | None) -> None:
        for listener in list(self.listeners):
            listener(event, topic, channel)

    # --- publishing -------------------------------------------------------------

    def make_run(self, bodies: Sequence[bytes], now: float, uniform: int | None = None) -> tuple[Run, int]:
        """Frames for freshly published bodies (attempts 1, new IDs) as one run, and their
        byte total; ``uniform`` is the common body size when the caller already knows it."""
        n = len(bodies)
        ts = int(now * 1e9)
        mid = _MID(2, ts, 1)
        if n == 1:
            body = bodies[0]
            return run_of_frame(b"".join((_SIZE(len(body) + 30), mid, self.guid.new_id(ts), body))), len(body)
        sizes: list[int] = []
        if uniform is None:
            sizes = list(map(len, bodies))
            if sizes.count(sizes[0]) == n:
                uniform = sizes[0]
        if uniform is not None:
            # each message's frame head, timestamp, attempts and ID come as one bytes object
            heads = self.guid.new_ids(n, ts, _SIZE(uniform + 30) + mid)
            blob = b"".join(chain.from_iterable(zip(heads, bodies, strict=False)))
            return (blob, range(0, len(blob), uniform + 34), len(blob)), uniform * n
        ids = self.guid.new_ids(n, ts)
        heads = list(map(_SIZE, map(_add, sizes, repeat(30))))
        blob = b"".join(chain.from_iterable(zip(heads, repeat(mid), ids, bodies)))
        offs = list(accumulate(map(_add, sizes, repeat(34)), initial=0))
        offs.pop()
        return (blob, offs, len(blob)), sum(sizes)

    def publish(self, topic_name: str, bodies: Sequence[bytes], now: float, uniform: int | None = None) -> Topic:
        """Queue bodies on a topic (created if needed); all or nothing."""
        if self.draining:
            raise Draining()
        topic = self.get_topic(topic_name, now)
        topic.check_room(len(bodies))  # before IDs and frames are made for a refused batch
        run, nbytes = self.make_run(bodies, now, uniform)
        self._put(topic, run, nbytes)
        return topic

    def _put(self, topic: Topic, run: Run, nbytes: int) -> None:
        """Store a fresh run; a refusing disk turns /ping to NOK until a write succeeds again."""
        try:
            topic.put(run, nbytes)
        except BackendError as e:
            self.health = f"NOK - {e}"
            raise
        if self.health != "OK":
            self.health = "OK"

    def publish_one(self, topic_name: str, body: bytes, now: float) -> Topic:
        """:meth:`publish` of one body (a PUB): the same checks and effects; its frame is
        made in one step."""
        if self.draining:
            raise Draining()
        topic = self.topics.get(topic_name)
        if topic is None:
            topic = self.get_topic(topic_name, now)
        ts = int(now * 1e9)
        frame = b"".join((_HEAD(len(body) + 30, 2, ts, 1), self.guid.new_id(ts), body))
        self._put(topic, (frame, _ONE, len(frame)), len(body))
        return topic

    def publish_deferred(self, topic_name: str, body: bytes, delay: float, now: float) -> Topic:
        if self.draining:
            raise Draining()
        topic = self.get_topic(topic_name, now)
        if topic.exiting:
            raise Exiting()
        if self.backlog.channels:
            # a deferred message comes due into a queue that would need the disk: refused
            # while messages are held for it, as any new publish (see nsqtw.nsqd.core.backlog)
            why = self.backlog.refusal([ch.backend for ch in topic.channels.values()] or [topic.backend])
            if why is not None:
                self.health = f"NOK - {why}"
                raise BackendError(why)
        if topic.bounded:
            topic.check_bounds(1)
        run, nbytes = self.make_run([body], now)
        self._put_deferred(topic, run[0], nbytes, now + delay)
        return topic

    def _put_deferred(self, topic: Topic, frame: bytes, nbytes: int, due: float) -> None:
        try:
            topic.put_deferred(frame, nbytes, due)
        except BackendError as e:
            self.health = f"NOK - {e}"
            raise

    def store_frame(self, topic_name: str, channels: Sequence[str] | None, frame: bytes, due: float,
                    now: float) -> None:
        """Store one message made elsewhere (an adopted origin's: its ID, timestamp and
        attempts kept): into its topic's queue (``channels`` None), or into each named channel
        (created if needed); deferred to ``due`` when that is later than ``now``.  A refusing
        disk raises :class:`BackendError` and turns /ping to NOK, as a publish does."""
        topic = self.get_topic(topic_name, now)
        nbytes = len(frame) - 34
        try:
            if channels is None:
                if due > now:
                    topic.put_deferred(frame, nbytes, due)
                else:
                    topic.put(run_of_frame(frame), nbytes)
                return
            for name in channels:
                ch = topic.get_channel(name, now)
                if due > now:
                    ch.put_deferred(frame, due)
                else:
                    ch.accept(run_of_frame(frame))
                    self.dirty.add(ch)
        except BackendError as e:
            self.health = f"NOK - {e}"
            raise

    # --- shutdown -----------------------------------------------------------------

    def close(self) -> None:
        """Stop accepting work and close every client connection."""
        self.exiting = True
        for client in list(self.clients.values()):
            client.close()

    def flush_to_backends(self, close_backend: Callable[[IBackendQueue], None]) -> int:
        """nsqd's Topic/Channel exit without deletion: write every channel's and topic's memory
        queue, in-flight and deferred messages to its backend, then hand the backend to
        ``close_backend``; returns how many messages the backends refused (a full disk)."""
        store = self.backlog.store_all
        lost = 0
        for topic in list(self.topics.values()):
            for ch in list(topic.channels.values()):
                backend = ch.backend
                try:
                    for run in ch.mem.drain():
                        lost += store(backend, run)
                    inflight = ch.in_flight_frames()
                    if inflight:
                        lost += store(backend, run_of_frames(inflight))
                    deferred = ch.deferred_items()
                    if deferred and hasattr(backend, "put_deferred"):
                        try:
                            backend.put_deferred(deferred)
                        except BackendError as e:
                            self.backlog.error = str(e)
                            lost += len(deferred)
                except Exception:
                    log.failure("failed to flush channel {t}:{c} to disk", t=topic.name, c=ch.name)
                ch.exiting = True
                ch.inflight.clear()
                ch.deferred = ()
                close_backend(backend)
            backend = topic.backend
            try:
                for run in topic.mem.drain():
                    lost += store(backend, run)
                if topic.deferred and hasattr(backend, "put_deferred"):
                    try:
                        backend.put_deferred(sorted(topic.deferred, key=lambda item: item[0]))
                    except BackendError as e:
                        self.backlog.error = str(e)
                        lost += len(topic.deferred)
            except Exception:
                log.failure("failed to flush topic {t} to disk", t=topic.name)
            topic.exiting = True
            topic.deferred = ()
            close_backend(backend)
        return lost
