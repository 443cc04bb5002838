"""
A channel: one consumer group's copy of a topic's stream.

Messages arrive from the topic as runs (see :mod:`nsqtw.backend.runs`), wait
in the memory queue (or the overflow backend), and are handed to ready
clients, each up to its free RDY window (``rdy - in_flight``), split evenly
among the ready clients and starting from a rotating position so no client is
favoured.  Delivered messages stay in flight until FIN, REQ, a timeout found
by the queue scan, or their client leaving (which requeues them at once).

Per-message work on delivery and FIN is done by ``map``/``zip``/``dict``
methods over whole batches; nothing here allocates an object per message
beyond the frame copy kept for a possible redelivery.
"""

from __future__ import annotations

import heapq
from itertools import count, repeat
from operator import attrgetter
from typing import TYPE_CHECKING, Any
from collections.abc import Sequence

from twisted.logger import Logger

from ...backend.memory import MemoryQueue
from ...backend.runs import Run, frames_and_ids, run_bytes, run_frames, run_ids, run_of_frame, run_of_frames
from ...errors import BackendError, FinFailed, QueueFull, ReqFailed, SubFailed, TouchFailed
from ...protocol.message import requeue_frame
from ...protocol.names import is_ephemeral
from .client import EPOCH_SPAN, STATE_SUBSCRIBED, ClientState, Epoch
from .deadletters import DeadLetters
from .policy import REASON_AGE, REASON_ATTEMPTS, REASON_OVERFLOW, ChannelPolicy, TokenBucket
from .quantile import Quantile

if TYPE_CHECKING:
    from ...backend import IBackendQueue
    from .broker import Broker
    from .topic import Topic

__all__ = ["Channel"]

log = Logger(namespace="nsqtw.nsqd")

_seq = count()

#: bytes delivered to one client before its output is written and its transport may push back
DELIVERY_BYTES = 1 << 20
_get_msgs = attrgetter("msgs")
_get_client = attrgetter("client")
_dict_pop = dict.pop
_getitem = bytes.__getitem__
_TS = __import__("struct").Struct(">q").unpack_from
_ATTEMPTS = __import__("struct").Struct(">H")


def _id_text(mid: bytes) -> str:
    return mid.decode("latin-1")


class Channel:
    """NSQ's Channel: queues, in-flight and deferred state, and delivery."""

    __slots__ = (
        "topic", "name", "ephemeral", "broker", "mem", "backend", "inflight", "deferred",
        "clients", "paused", "exiting", "message_count", "requeue_count", "timeout_count",
        "timeout_extended_count", "e2e", "_rr", "policy", "dead", "bucket", "expired_count",
        "dropped_count", "__weakref__",
    )

    def __init__(self, topic: Topic, name: str, broker: Broker, backend: IBackendQueue, now: float) -> None:
        self.topic = topic
        self.name = name
        self.ephemeral = is_ephemeral(name)
        self.broker = broker
        self.mem = MemoryQueue(broker.options.mem_queue_size)
        self.backend = backend
        self.inflight: dict[bytes, Epoch] = {}
        #: a heap of (due, seq, frame); the shared empty tuple while nothing is deferred (an idle
        #: channel allocates no list: one object fewer for every full garbage collection)
        self.deferred: list[tuple[float, int, bytes]] | tuple[()] = ()
        self.clients: dict[int, ClientState] = {}
        self.paused = False
        self.exiting = False
        self.message_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        #: timeouts extended instead of requeued, held memory being at --max-held-bytes
        self.timeout_extended_count = 0
        opts = broker.options
        self.e2e: Quantile | None = (
            Quantile(opts.e2e_processing_latency_window_time, opts.e2e_processing_latency_percentiles, now,
                     rng=broker.rng)  # the broker's: a Random of its own is 2.5 KB per channel
            if opts.e2e_processing_latency_percentiles else None)
        self._rr = 0
        #: the channel's policy while any of it is on (None: NSQ's behaviour, and no cost)
        self.policy: ChannelPolicy | None = None
        #: dead letters, once the channel has had any (see :mod:`.deadletters`)
        self.dead: DeadLetters | None = None
        #: the delivery rate's bucket while ``max_rate`` is set
        self.bucket: TokenBucket | None = None
        #: messages not delivered because they were older than ``max_age`` (since the start)
        self.expired_count = 0
        #: messages dropped by the policy without a dead letter kept (since the start)
        self.dropped_count = 0

    # --- queueing -----------------------------------------------------------

    def depth(self) -> int:
        return self.mem.depth() + self.backend.depth()

    def put(self, run: Run) -> None:
        """A run from the topic (counted in ``message_count`` once stored)."""
        rest = self.mem.put(run)
        if rest is not None:
            rest = self.backend.put(rest)
            if rest is not None:
                raise QueueFull(f"channel {self.topic.name}:{self.name} is full")
        if self.clients:
            self.broker.dirty.add(self)
        self.message_count += len(run[1])
        if self.policy is not None and self.policy.max_depth:
            self._bound()

    def _heap(self) -> list[tuple[float, int, bytes]]:
        d = self.deferred
        if isinstance(d, list):
            return d
        heap: list[tuple[float, int, bytes]] = []
        self.deferred = heap
        return heap

    def put_deferred(self, frame: bytes, deliver_at: float) -> None:
        self.message_count += 1
        if not self._defer_durably(frame, deliver_at):
            heapq.heappush(self._heap(), (deliver_at, next(_seq), frame))

    def restore_deferred(self, deliver_at: float, frame: bytes) -> None:
        """A deferred message read back from this channel's disk, still due later (already
        counted once; with --sync-every=1 its record stays on disk until it is FINed)."""
        heapq.heappush(self._heap(), (deliver_at, next(_seq), frame))

    def take_deferred(self, deliver_at: float, frame: bytes) -> None:
        """A deferred message the topic read back from its disk (already counted once)."""
        if not self._defer_durably(frame, deliver_at):
            heapq.heappush(self._heap(), (deliver_at, next(_seq), frame))

    def _defer_durably(self, frame: bytes, deliver_at: float) -> bool:
        """With ``--sync-every=1`` a deferred message is written to the channel's disk queue at
        once, with its deferral hint, instead of living in memory until a clean stop: the
        reader hands it to the deferred heap when it reaches the record (its record then
        stays on disk until it is FINed), so a ``kill -9`` cannot lose it.  False when it
        stays in memory only (other --sync-every values, ephemeral channels, a refusing disk)."""
        backend: Any = self.backend  # a DiskQueue (durable): it has put_deferred and a sink
        if self.broker.options.sync_every != 1 or not getattr(backend, "durable", False):
            return False
        try:
            backend.put_deferred([(deliver_at, frame)])
        except BackendError:
            return False
        if backend.deferred_sink is None:
            backend.deferred_sink = self.restore_deferred
        if self.clients:
            self.broker.dirty.add(self)
        return True

    def _put_back(self, frames: list[bytes]) -> None:
        """Requeued or timed-out messages go to the tail, as NSQ's ``c.put``; they are
        never refused (a full memory queue without disk keeps them anyway)."""
        if frames:
            self._store_back(run_of_frames(frames))

    def accept(self, run: Run) -> None:
        """A run the broker already acknowledged (a topic's backlog moved on): never refused;
        what the disk refuses is held in memory (see :mod:`.backlog`)."""
        self.message_count += len(run[1])
        self._store_back(run)

    def _store_back(self, run: Run) -> None:
        rest = self.mem.put(run)
        if rest is not None:
            self.broker.backlog.put_back(self, rest)
        if self.clients:
            self.broker.dirty.add(self)
        if self.policy is not None and self.policy.max_depth:
            self._bound()

    # --- policy (see :mod:`.policy`) ------------------------------------------

    def set_policy(self, policy: ChannelPolicy, now: float) -> None:
        """Enforce ``policy`` from now on (the default policy turns everything off)."""
        self.policy = policy if policy != ChannelPolicy() else None
        bucket = self.bucket
        if not policy.max_rate:
            self.bucket = None
        elif bucket is None or bucket.rate != policy.max_rate:
            self.bucket = TokenBucket(policy.max_rate, now)
        if policy.keeps_dead and self.dead is None:
            self.dead = DeadLetters(self.broker.open_dead_sink(self))
        self.topic.refresh_bounds()
        if self.clients:
            self.broker.dirty.add(self)
        if policy.max_depth:
            self._bound()

    def load_dead(self) -> None:
        """Dead letters a previous run left on disk (called once, at the channel's creation)."""
        sink = self.broker.open_dead_sink(self, existing=True)
        if sink is not None:
            dead = DeadLetters(sink)
            if len(dead):
                self.dead = dead

    def _police(self, runs: list[Run], now: float) -> tuple[list[Run], int]:
        """``runs`` without the messages the policy forbids delivering (past ``max_attempts``,
        older than ``max_age``), which die; and how many are left."""
        policy = self.policy
        assert policy is not None
        max_attempts = policy.max_attempts or 0xFFFF
        oldest = int((now - policy.max_age) * 1e9) if policy.max_age else None
        dead = self.dead if self.dead else None
        out: list[Run] = []
        kept = 0
        too_many: list[bytes] = []
        too_old: list[bytes] = []
        already: list[bytes] = []
        for run in runs:
            frames = run_frames(run)
            good = []
            for f in frames:
                if dead is not None and f[18:34] in dead:
                    # dead already: a copy a disk queue read again after a crash (its record was
                    # released when it died, but the read position had not reached the disk)
                    already.append(f[18:34])
                elif _ATTEMPTS.unpack_from(f, 16)[0] > max_attempts:
                    too_many.append(f)
                elif oldest is not None and _TS(f, 8)[0] < oldest:
                    too_old.append(f)
                else:
                    good.append(f)
            if len(good) == len(frames):
                out.append(run)
            elif good:
                out.append(run_of_frames(good))
            kept += len(good)
        if already:
            release = getattr(self.backend, "release", None)
            if release is not None:
                release(already)
        if too_many:
            self._kill(too_many, REASON_ATTEMPTS, now)
        if too_old:
            self._kill(too_old, REASON_AGE, now)
        return out, kept

    def _police_requeued(self, frames: list[bytes], now: float) -> list[bytes]:
        """Requeued frames (attempts of their next delivery) without those past ``max_attempts``,
        which die."""
        assert self.policy is not None
        limit = self.policy.max_attempts
        unpack = _ATTEMPTS.unpack_from
        over = [f for f in frames if unpack(f, 16)[0] > limit]
        if not over:
            return frames
        self._kill(over, REASON_ATTEMPTS, now)
        return [f for f in frames if unpack(f, 16)[0] <= limit]

    def _bound(self) -> None:
        """``max_depth`` with ``drop-oldest``: the oldest queued messages beyond it die (or are
        dropped).  The disk queue's head goes first: what waits on disk is older than what
        memory took since (it only spills there when memory is full, and a restart reads every
        message back from it)."""
        policy = self.policy
        assert policy is not None
        excess = self.depth() - policy.max_depth
        if excess <= 0 or policy.refuses:
            return
        runs: list[Run] = []
        got = 0
        if self.backend.depth():
            runs = self.backend.read(excess)
            got = sum(len(r[1]) for r in runs)
        if got < excess:
            runs.extend(self.mem.read(excess - got))
        frames = [f for run in runs for f in run_frames(run)]
        if frames:
            self._kill(frames, REASON_OVERFLOW, self.broker.time())

    def _kill(self, frames: list[bytes], reason: str, now: float) -> None:
        """``frames`` (as their next delivery would carry them) leave the queue for good: kept
        as dead letters (and published to the dead-letter topic) when the policy keeps them,
        else dropped; counted either way.  A disk queue's records of them are released only once
        the dead letters are stored: if that fails they are read again after a restart."""
        policy = self.policy
        n = len(frames)
        if reason == REASON_AGE:
            self.expired_count += n
        stored = True
        if policy is not None and policy.keeps_dead:
            dead = self.dead
            if dead is None:
                dead = self.dead = DeadLetters(self.broker.open_dead_sink(self))
            try:
                dead.add(frames, now, reason)
                self._died(frames, reason)
            except OSError as e:
                stored = False
                log.error("dead letters of {t}:{c} kept in memory only, the disk refused them: {e}",
                          t=self.topic.name, c=self.name, e=e)
            if policy.dead_letter_topic:
                self.broker.publish_dead(policy.dead_letter_topic, [f[34:] for f in frames], now)
        else:
            self.dropped_count += n
            self._dropped(run_ids(frames))
        if stored:
            release = getattr(self.backend, "release", None)
            if release is not None:
                release(run_ids(frames))

    def _died(self, frames: list[bytes], reason: str) -> None:
        """Messages kept as dead letters (a replicated channel tells its peers)."""

    def _dropped(self, ids: list[bytes]) -> None:
        """Messages the policy dropped without a dead letter (a replicated channel tells its
        peers, as for a FIN)."""

    def redrive(self, n: int | None, now: float) -> int:
        """Put up to ``n`` (all when None) of the oldest dead letters back in the queue with fresh
        attempts; returns how many.  They are queued before they leave the dead letters (a crash
        in between may keep a copy of each in both, never in neither)."""
        dead = self.dead
        if dead is None or not len(dead):
            return 0
        letters = dead.first(len(dead) if n is None else n)
        if not letters:
            return 0
        fresh = _ATTEMPTS.pack(1)
        frames = [letter.frame[:16] + fresh + letter.frame[18:] for letter in letters]
        self._store_back(run_of_frames(frames))
        dead.take(len(letters))
        return len(letters)

    def keep_dead(self, frames: list[bytes], reason: str, now: float) -> None:
        """Dead letters adopted from a replicated origin (kept here as they were there)."""
        dead = self.dead
        if dead is None:
            dead = self.dead = DeadLetters(self.broker.open_dead_sink(self))
        dead.add(frames, now, reason)

    def empty_dead(self) -> int:
        """Drop every dead letter; returns how many."""
        dead = self.dead
        if dead is None:
            return 0
        return len(dead.take())

    # --- clients ------------------------------------------------------------

    def add_client(self, client: ClientState) -> None:
        if self.exiting:
            raise SubFailed("SUB failed exiting")
        limit = self.broker.options.max_channel_consumers
        if limit and len(self.clients) >= limit:
            raise SubFailed(
                f"SUB failed consumers for {self.topic.name}:{self.name} exceeds limit of {limit}")
        self.clients[client.id] = client

    def remove_client(self, client: ClientState, now: float) -> None:
        """A client left: requeue what it held, and drop an ephemeral channel it was last on."""
        if self.clients.pop(client.id, None) is None:
            return
        self._requeue_epochs(client.all_epochs(), timeout=True, now=now)
        client.in_flight = 0
        if self.ephemeral and not self.clients and not self.exiting:
            self.broker.delete_channel(self.topic.name, self.name)

    # --- delivery (hot path) ---------------------------------------------------

    def deliver(self, now: float) -> None:
        """Hand queued messages to ready clients, up to each one's free RDY window."""
        if self.paused or self.exiting:
            return
        ready = [c for c in self.clients.values()
                 if c.state == STATE_SUBSCRIBED and c.in_flight < c.rdy and not c.blocked]
        if not ready:
            return
        avail = self.mem.depth() + self.backend.depth()
        if not avail:
            return
        police = False
        budget = 0
        if self.policy is not None:  # see :mod:`.policy`; off: NSQ's path, unchanged
            police = bool(self.policy.max_attempts or self.policy.max_age or self.dead)
            if self.bucket is not None:
                budget = self.bucket.available(now)
                if budget <= 0:
                    self.broker.throttled.add(self)
                    return
                if budget < avail:
                    avail = budget
        start_avail = avail
        n_ready = len(ready)
        if n_ready > 1:
            start = self._rr % n_ready
            self._rr += 1
            ready = ready[start:] + ready[:start]
        for client in ready:
            share = -(-avail // n_ready)
            n_ready -= 1
            want = client.rdy - client.in_flight
            if share < want:
                want = share
            # at most DELIVERY_BYTES at a time: after each such batch the client's output is
            # written, so a client that does not read is paused (blocked) by its own transport
            # before its whole RDY window of large messages piles up in memory
            while want > 0 and not client.blocked:
                runs = self.mem.read(want, DELIVERY_BYTES)
                got = sum(len(r[1]) for r in runs) if len(runs) != 1 else len(runs[0][1])
                if got < want and self.backend.depth():
                    repeat = getattr(self.backend, "may_repeat", False)  # after a crash
                    more = self.backend.read(want - got, DELIVERY_BYTES)
                    if more and repeat:
                        more = self._without_copies_in_flight(more)
                    runs.extend(more)
                    got += sum(len(r[1]) for r in more)
                if not got:
                    break
                if police:
                    runs, kept = self._police(runs, now)
                    if not kept:
                        continue  # all of these died: read on (the queue shrank)
                    got = kept
                self._send(client, runs, now)
                avail -= got
                want -= got
                if want <= 0 or avail <= 0:
                    break
                client.flush()
            if avail <= 0:
                break
        if budget:
            assert self.bucket is not None
            self.bucket.spend(start_avail - avail)
            if avail <= 0 and budget <= start_avail:
                self.broker.throttled.add(self)  # the rate held some back: the scan comes back

    def _without_copies_in_flight(self, runs: list[Run]) -> list[Run]:
        """Drop records whose message is already in flight: after a crash the disk queue reads
        again what was in flight (see DiskQueue.release), and a message requeued then may be
        there twice.  One copy in flight is enough (its FIN, REQ or timeout settles both);
        two would make the second FIN fail."""
        inflight = self.inflight
        out: list[Run] = []
        for run in runs:
            frames, ids = frames_and_ids(run)
            if inflight.keys().isdisjoint(ids) and len(set(ids)) == len(ids):
                out.append(run)
                continue
            seen: set[bytes] = set()
            keep = []
            for frame, mid in zip(frames, ids, strict=False):
                if mid not in inflight and mid not in seen:
                    seen.add(mid)
                    keep.append(frame)
            if keep:
                out.append(run_of_frames(keep))
        return out

    def _send(self, client: ClientState, runs: list[Run], now: float) -> None:
        inflight = self.inflight
        ep = client.epoch(now)
        msgs = ep.msgs
        sample = client.sample_rate
        total = 0
        for run in runs:
            if sample:
                frames = self._sample(run_frames(run), sample)
                if not frames:
                    continue
                data = b"".join(frames)
                ids = run_ids(frames)
            else:
                frames, ids = frames_and_ids(run)
                data = run_bytes(run)
            msgs.update(zip(ids, frames, strict=False))
            inflight.update(dict.fromkeys(ids, ep))
            client.send(data)
            total += len(frames)
        client.in_flight += total
        client.message_count += total

    def _sample(self, frames: list[bytes], rate: int) -> list[bytes]:
        """NSQ's sample_rate: keep a message if ``randint(0, 99) <= rate``; the rest are dropped."""
        rnd = self.broker.rng.randrange
        return [f for f in frames if rnd(100) <= rate]

    # --- responses ------------------------------------------------------------

    def finish(self, client: ClientState, mid: bytes, now: float) -> None:
        ep = self.inflight.pop(mid, None)
        if ep is None:
            raise FinFailed(f"FIN {_id_text(mid)} failed ID not in flight")
        if ep.client is not client:
            self.inflight[mid] = ep
            raise FinFailed(f"FIN {_id_text(mid)} failed client does not own message")
        frame = ep.msgs.pop(mid)
        if not ep.msgs:
            ep.msgs = {}
        release = getattr(self.backend, "release", None)
        if release is not None:  # a disk queue keeps the record until now (see DiskQueue.release)
            release((mid,))
        client.in_flight -= 1
        client.finish_count += 1
        if self.e2e is not None:
            self.e2e.insert(int(now * 1e9) - _TS(frame, 8)[0], now)
        self.broker.dirty.add(self)

    def finish_many(self, client: ClientState, ids: list[bytes], now: float) -> list[FinFailed]:
        """FIN a batch; the common case (all in flight and owned) runs in C builtins."""
        eps = list(map(self.inflight.pop, ids, repeat(None)))
        if None in eps or set(map(_get_client, eps)) != {client}:
            return self._finish_slow(client, ids, eps, now)
        frames = list(map(_dict_pop, map(_get_msgs, eps), ids))
        for ep in set(eps):
            if not ep.msgs:  # type: ignore[union-attr]  # None in eps was ruled out above
                ep.msgs = {}  # type: ignore[union-attr]  # as above
        release = getattr(self.backend, "release", None)
        if release is not None:  # a disk queue keeps the records until now (DiskQueue.release)
            release(ids)
        n = len(ids)
        client.in_flight -= n
        client.finish_count += n
        if self.e2e is not None:
            now_ns = int(now * 1e9)
            insert = self.e2e.insert
            for f in frames:
                insert(now_ns - _TS(f, 8)[0], now)
        self.broker.dirty.add(self)
        return []

    def _finish_slow(self, client: ClientState, ids: list[bytes], eps: list[Epoch | None],
                     now: float) -> list[FinFailed]:
        # put back what the batch pop took, then go one by one in order
        inflight = self.inflight
        for mid, ep in zip(ids, eps, strict=False):
            if ep is not None:
                inflight[mid] = ep
        errors = []
        for mid in ids:
            try:
                self.finish(client, mid, now)
            except FinFailed as e:
                errors.append(e)
        return errors

    def requeue(self, client: ClientState, mid: bytes, delay: float, now: float) -> None:
        if self.exiting:
            raise ReqFailed(f"REQ {_id_text(mid)} failed exiting")
        ep = self.inflight.get(mid)
        if ep is None:
            raise ReqFailed(f"REQ {_id_text(mid)} failed ID not in flight")
        if ep.client is not client:
            raise ReqFailed(f"REQ {_id_text(mid)} failed client does not own message")
        frame = requeue_frame(ep.msgs[mid])
        policy = self.policy
        if policy is not None and policy.max_attempts and _ATTEMPTS.unpack_from(frame, 16)[0] > policy.max_attempts:
            self._kill([frame], REASON_ATTEMPTS, now)  # no more deliveries: dead, not requeued
        elif delay > 0:
            heapq.heappush(self._heap(), (now + delay, next(_seq), frame))
            defer_pinned = getattr(self.backend, "defer_pinned", None)
            if defer_pinned is not None:  # read again after a crash, it waits as long
                defer_pinned(mid, now + delay)
        else:
            run = run_of_frame(frame)
            if self.mem.put(run) is not None:
                try:  # the disk cannot take it: refuse the REQ, the message stays in flight
                    self.broker.backlog.put_back(self, run, hold=False)
                except BackendError as e:
                    raise ReqFailed(f"REQ {_id_text(mid)} failed {e}") from None
        del self.inflight[mid]
        del ep.msgs[mid]
        if not ep.msgs:
            ep.msgs = {}
        client.in_flight -= 1
        client.requeue_count += 1
        self.requeue_count += 1
        self.broker.dirty.add(self)

    def touch(self, client: ClientState, mid: bytes, now: float) -> None:
        ep = self.inflight.get(mid)
        if ep is None:
            raise TouchFailed(f"TOUCH {_id_text(mid)} failed ID not in flight")
        if ep.client is not client:
            raise TouchFailed(f"TOUCH {_id_text(mid)} failed client does not own message")
        frame = ep.msgs.pop(mid)
        if not ep.msgs:
            ep.msgs = {}
        # Go caps at delivery + max_msg_timeout; this message was delivered within EPOCH_SPAN of
        # its epoch's start (a touched epoch keeps that start), so the cap is never early
        deadline = min(now + client.msg_timeout, ep.started + EPOCH_SPAN + self.broker.options.max_msg_timeout)
        new = client.touch_epoch(ep.started, deadline)
        new.msgs[mid] = frame
        self.inflight[mid] = new

    # --- timeouts (the queue scan) ---------------------------------------------

    def process_in_flight(self, now: float) -> bool:
        """Requeue every message whose deadline has passed; True if any did (NSQ's 'dirty')."""
        if self.exiting:
            return False
        dirty = False
        backlog = self.broker.backlog
        for client in list(self.clients.values()):
            expired = client.expired_epochs(now)
            if expired:
                if backlog.channels and backlog.at_cap():
                    self._extend_epochs(client, expired, now)
                    continue
                dirty = True
                self._requeue_epochs(expired, timeout=True, now=now)
        return dirty

    def _extend_epochs(self, client: ClientState, epochs: Sequence[Epoch], now: float) -> None:
        """Held memory is at its cap (see :mod:`.backlog`): the expired messages stay in flight
        with a new deadline instead of being held; their client may still FIN them."""
        inflight = self.inflight
        deadline = now + client.msg_timeout
        n = 0
        for ep in epochs:
            new = client.touch_epoch(ep.started, deadline)
            msgs = {mid: frame for mid, frame in ep.msgs.items() if inflight.get(mid) is ep}
            ep.msgs = {}
            if msgs:
                new.msgs = msgs
                inflight.update(dict.fromkeys(msgs, new))
                n += len(msgs)
        self.timeout_extended_count += n
        self.broker.backlog.extended += n

    def process_deferred(self, now: float) -> bool:
        if self.exiting:
            return False
        heap = self.deferred
        if not heap or heap[0][0] > now or not isinstance(heap, list):
            return False
        room = -1  # no limit
        backlog = self.broker.backlog
        if backlog.channels and backlog.at_cap():
            # held memory is at its cap: only what memory takes comes due, the rest waits
            room = self.mem.room()
            if room <= 0:
                return False
        frames = []
        while heap and heap[0][0] <= now and room:
            frames.append(heapq.heappop(heap)[2])
            room -= 1
        if not heap:
            self.deferred = ()  # nothing left deferred: let the list go
        self._put_back(frames)
        return True

    def _requeue_epochs(self, epochs: Sequence[Epoch], timeout: bool, now: float | None = None) -> None:
        inflight = self.inflight
        frames: list[bytes] = []
        for ep in epochs:
            client = ep.client
            n = 0
            for mid, frame in ep.msgs.items():
                if inflight.get(mid) is ep:
                    del inflight[mid]
                    frames.append(requeue_frame(frame))
                    n += 1
            ep.msgs = {}
            client.in_flight -= n
            if timeout:
                self.timeout_count += n
        if frames and not self.exiting:
            if now is not None and self.policy is not None and self.policy.max_attempts:
                frames = self._police_requeued(frames, now)
            self._put_back(frames)

    # --- lifecycle ----------------------------------------------------------

    def pause(self) -> None:
        self.paused = True

    def unpause(self) -> None:
        self.paused = False
        self.broker.dirty.add(self)

    def empty(self) -> None:
        """Drop everything queued, in flight and deferred (NSQ's Channel.Empty)."""
        for client in self.clients.values():
            client.reset_in_flight()
        self.inflight.clear()
        self.deferred = ()
        self.mem.empty()
        self.backend.empty()

    def requeue_all_in_flight(self) -> None:
        """A stop: every in-flight message goes back to the queue (to disk, or held if the
        disk refuses it), as when its client leaves."""
        for client in list(self.clients.values()):
            self._requeue_epochs(client.all_epochs(), timeout=False)
            client.in_flight = 0

    def in_flight_frames(self) -> list[bytes]:
        """Every in-flight frame, made ready for its next delivery (for clean shutdown)."""
        out = []
        for mid, ep in self.inflight.items():
            frame = ep.msgs.get(mid)
            if frame is not None:
                out.append(requeue_frame(frame))
        return out

    def deferred_items(self) -> list[tuple[float, bytes]]:
        return [(at, frame) for at, _, frame in sorted(self.deferred)]

    def close_clients(self) -> None:
        for client in list(self.clients.values()):
            client.close()

    def e2e_result(self, now: float) -> dict[str, object]:
        if self.e2e is None:
            return {"count": 0, "percentiles": None}
        return self.e2e.result(now)

    def __repr__(self) -> str:
        return f"<Channel {self.topic.name}:{self.name}>"
