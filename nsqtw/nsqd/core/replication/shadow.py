"""
A peer's shadow of one origin (sans-IO): every message the origin has not finished, as the
origin's batches left it (:class:`ShadowState`), and the snapshots an origin sends a peer that
catches up (:func:`outstanding`, :func:`iter_chunks`).
"""

from __future__ import annotations

import json
import struct
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator
from functools import lru_cache
from operator import itemgetter
from typing import Any

from ....protocol import replication as wire
from ....protocol.names import is_ephemeral
from ..broker import Broker
from ..policy import REASONS

__all__ = ["ShadowState", "ShadowMessage", "ShadowRun", "outstanding", "iter_chunks", "topology_entries",
           "SNAPSHOT_BATCH_BYTES"]

#: a catch-up snapshot goes out in batches of about this many bytes
SNAPSHOT_BATCH_BYTES = 4 * 1024 * 1024


class ShadowMessage:
    """One message of an origin held by a peer: what adoption would republish.  ``raw`` is
    its frame as held: bytes, or a view of the peer's shadow log (mapped, so the frame stays
    on disk and in the page cache, not in the process's own memory); :attr:`frame` is it as
    bytes."""

    __slots__ = ("topic", "due", "raw", "pending", "open")

    def __init__(self, topic: str, due: int, frame: bytes | memoryview, pending: frozenset[str] | None) -> None:
        self.topic = topic
        self.due = due
        self.raw = frame
        #: channels that have not finished it; None while the topic has no channel (the
        #: channels created next get it, as the origin's topic hands its backlog to them)
        self.pending = pending
        self.open = pending is None

    @property
    def frame(self) -> bytes:
        raw = self.raw
        return raw if type(raw) is bytes else bytes(raw)


class ShadowRun:
    """The messages of one published batch (an MSG item of two or more frames), held as
    received: the shadow's index maps each of their IDs to this one object, and a message gets
    an object of its own (:class:`ShadowMessage`) only when it is finished, requeued or
    changed on its own.  Its ``pending`` and ``open`` apply to every message still here.

    Only the first and last IDs are read when the run arrives; the others are read from the
    frames the first time one is looked up (a FIN, a REQ, a snapshot), so a peer whose
    messages are not consumed yet pays nothing per message for its index.

    A *gathered* run (:meth:`ShadowState.add_frame`) holds single publishes of one topic that
    came one after the other: its ``data`` is the mapped window of the peer's log they are in
    (frames with records' heads between them), ``starts`` where each frame is in it, and its
    IDs are kept as they come (16 bytes each, no object per message)."""

    __slots__ = ("topic", "due", "data", "pending", "open", "first", "last", "_ids", "starts",
                 "stride", "gone", "left", "gathered")

    def __init__(self, topic: str, due: int, data: bytes | memoryview, pending: frozenset[str] | None,
                 first: bytes, last: bytes, starts: Any, stride: int = 0,
                 ids: list[bytes] | None = None) -> None:
        self.topic = topic
        self.due = due
        self.data = data
        self.pending = pending
        self.open = pending is None
        #: the first and last IDs (as the origin minted them: increasing)
        self.first = first
        self.last = last
        #: where each frame starts, and the frames' common length (0: not all alike)
        self.starts = starts
        self.stride = stride
        self._ids = ids
        #: IDs no longer here (finished, or given an object of their own), and how many are left
        self.gone: set[bytes] = set()
        self.left = len(starts)
        #: ``data`` is a window of the log, not the frames alone (see the class's docstring)
        self.gathered = False

    @property
    def ids(self) -> list[bytes]:
        """Every ID of the run, increasing (read from the frames once, when first needed)."""
        ids = self._ids
        if ids is None:
            data = self.data
            if self.stride:
                ids = list(map(_first, _id_struct(self.stride).iter_unpack(data)))
            else:
                ids = [bytes(data[p + 18:p + 34]) for p in self.starts]
            if ids != sorted(ids):  # not an origin's batch: keep IDs and frames paired, sorted
                order = sorted(range(len(ids)), key=ids.__getitem__)
                starts = self.starts
                ids = [ids[i] for i in order]
                self.starts = [starts[i] for i in order]
                self.stride = 0
            self._ids = ids
        return ids

    def has(self, mid: bytes) -> bool:
        if mid > self.last or mid < self.first or mid in self.gone:
            return False
        ids = self.ids
        i = bisect_left(ids, mid)
        return i < len(ids) and ids[i] == mid

    def frame(self, mid: bytes) -> bytes | memoryview:
        """``mid``'s frame as held (a slice of the run's data: bytes or a view)."""
        i = bisect_left(self.ids, mid)
        stride = self.stride
        if stride:
            start = i * stride
            return self.data[start:start + stride]
        start = self.starts[i]
        data = self.data
        return data[start:start + 4 + int.from_bytes(data[start:start + 4], "big")]

    def remaining(self) -> list[bytes]:
        gone = self.gone
        return [mid for mid in self.ids if mid not in gone] if gone else list(self.ids)

    def each(self) -> Iterator[tuple[bytes, Any]]:
        """``(ID, frame as held)`` of every message still here, in ID order (no lookup each)."""
        ids = self.ids  # first: reading them may put the starts in ID order
        data = self.data
        gone = self.gone
        stride = self.stride
        starts = self.starts
        for i, mid in enumerate(ids):
            if gone and mid in gone:
                continue
            start = i * stride if stride else starts[i]
            yield mid, data[start:start + (stride or 4 + int.from_bytes(data[start:start + 4], "big"))]

    def pieces(self, limit: int) -> Iterator[bytes]:
        """The frames still here, in ID order, joined into pieces of about ``limit`` bytes."""
        piece: list[Any] = []
        size = 0
        for _, frame in self.each():
            piece.append(frame)
            size += len(frame)
            if size >= limit:
                yield b"".join(piece)
                piece = []
                size = 0
        if piece:
            yield b"".join(piece)

    def solo(self, mid: bytes) -> ShadowMessage:
        m = ShadowMessage(self.topic, self.due, self.frame(mid), self.pending)
        m.open = self.open
        return m


_first = itemgetter(0)
#: the first four bytes of a buffer as a big-endian length (a frame's size)
_U32_AT = struct.Struct(">I").unpack_from


@lru_cache(maxsize=64)
def _id_struct(stride: int) -> struct.Struct:
    """Reads the ID of each frame of a run of frames ``stride`` bytes long."""
    return struct.Struct(f"18x16s{stride - 34}x")


def _index_frames(data: bytes | memoryview) -> tuple[list[bytes] | None, Any, int]:
    """Where an MSG item's frames start: ``(None, starts, stride)`` for a batch of one body
    size (an MPUB of equal bodies, the common case: checked without a loop in Python, IDs
    read later, see :attr:`ShadowRun.ids`), else ``(ids, starts, 0)`` (IDs as bytes)."""
    end = len(data)
    if end >= 4:
        head = bytes(data[:4])
        stride = int.from_bytes(head, "big") + 4
        n, rest = divmod(end, stride)
        if stride >= 34 and rest == 0 and n > 1 and all(
                data[i::stride] == head[i:i + 1] * n for i in range(4)):
            return None, range(0, end, stride), stride
    ids: list[bytes] = []
    offsets: list[int] = []
    pos = 0
    while pos < end:
        stop = pos + 4 + int.from_bytes(data[pos:pos + 4], "big")
        if stop > end or stop - pos < 34:
            raise wire.LinkError("truncated message frame")
        ids.append(bytes(data[pos + 18:pos + 34]))
        offsets.append(pos)
        pos = stop
    return ids, array("Q", offsets), 0


class ShadowState:
    """An origin's topics, channels and unfinished messages, rebuilt from its BATCH items in
    order: a message is dropped once every channel that got it finished it (or was deleted or
    emptied).  A catch-up snapshot (``SNAP_BEGIN`` ... ``SNAP_END``) is built aside and replaces
    the state once it is whole; ``epoch`` is the origin's epoch it came with, ``max_id`` the
    highest message ID this shadow ever held (what an adoption reports back to the origin)."""

    def __init__(self) -> None:
        self.topics: dict[str, set[str]] = {}
        #: unfinished messages with an object of their own, by ID
        self.messages: dict[bytes, ShadowMessage] = {}
        #: unfinished messages still in the batch they came in, indexed by ID range: the runs
        #: in increasing ID order and their first IDs
        self.runs: list[ShadowRun] = []
        self._firsts: list[bytes] = []
        #: paused topics (channel "") and channels
        self.paused: set[tuple[str, str]] = set()
        self.live_bytes = 0
        self.epoch = 0
        self.max_id = wire.NO_ID
        self._staged: ShadowState | None = None
        #: the last pending-channel set of each topic's messages (shared while it is the same)
        self._pending: dict[str, frozenset[str]] = {}
        #: what channels created in the batch being applied opened (see _apply)
        self._opened: list[ShadowMessage | ShadowRun] = []
        #: snapshots that replaced the state so far
        self.snapshots = 0
        #: the gathered run single publishes are added to (see add_frame), and the last single
        #: publish held on its own: (its ID, the window it is in, where, its object)
        self._gathering: ShadowRun | None = None
        self._last_single: tuple[bytes, Any, int, ShadowMessage] | None = None
        #: channels' policies (their records as JSON), see nsqtw.nsqd.core.policy
        self.policies: dict[tuple[str, str], bytes] = {}
        #: channels' dead letters: message ID -> (frame, why it died: its DEAD item's ``due``,
        #: an index of nsqtw.nsqd.core.policy.REASONS), oldest first
        self.dead: dict[tuple[str, str], dict[bytes, tuple[bytes, int]]] = {}

    @property
    def catching_up(self) -> bool:
        """A snapshot is being received (the state is still the one from before it)."""
        return self._staged is not None

    def apply(self, entries: list[wire.Entry]) -> None:
        if len(entries) == 1 and self._staged is None:  # a live batch of one item (a PUB's)
            kind = entries[0][0]
            if kind != wire.SNAP_BEGIN and kind != wire.SNAP_END:
                self._apply(entries)
                return
        target = self._staged if self._staged is not None else self
        seg: list[wire.Entry] = []
        for entry in entries:
            kind = entry[0]
            if kind == wire.SNAP_BEGIN:
                target._apply(seg)
                seg = []
                target = self._staged = ShadowState()
                if len(entry[4]) == 8:
                    target.epoch = int.from_bytes(entry[4], "big")
            elif kind == wire.SNAP_END:
                target._apply(seg)
                seg = []
                staged = self._staged
                if staged is not None:
                    if len(entry[4]) == 16 and entry[4] > staged.max_id:
                        staged.max_id = entry[4]
                    self._replace(staged)
                target = self
            else:
                seg.append(entry)
        target._apply(seg)

    def _replace(self, staged: ShadowState) -> None:
        self.topics = staged.topics
        self.messages = staged.messages
        self.runs = staged.runs
        self._firsts = staged._firsts
        self.paused = staged.paused
        self.live_bytes = staged.live_bytes
        self.epoch = staged.epoch
        if staged.max_id > self.max_id:
            self.max_id = staged.max_id
        self._staged = None
        self._gathering = staged._gathering
        self._last_single = staged._last_single
        self.policies = staged.policies
        self.dead = staged.dead
        self.snapshots += 1

    def _pending_of(self, topic: str) -> frozenset[str] | None:
        """The channels that must finish a message published to ``topic`` now (None: it has no
        channel yet; the topic is known from now on).  One frozenset is shared by every message
        of a topic while its channels stay the same (a frozenset is 216 bytes: one per PUB was a
        third of a shadowed PUB's memory), compared with the channels rather than made for each
        message and then compared."""
        channels = self.topics.get(topic)
        if channels is None:
            channels = self.topics[topic] = set()
        if not channels:
            return None
        pending = self._pending.get(topic)
        if pending is None or pending != channels:
            pending = self._pending[topic] = frozenset(channels)
        return pending

    def add_frame(self, topic: str, due: int, window: Any, at: int, end: int) -> None:
        """One message frame for ``topic``, ``window[at:end]`` (``window``: the mapped window
        of the peer's log it was appended to): what :meth:`apply` of an MSG item of that one
        frame does, for a live batch of one PUB.  A publish of the same topic, due time and
        channels as the one before it, in the same window, joins it in a gathered run (see
        :class:`ShadowRun`): a peer shadowing a stream of PUBs keeps 16 bytes of ID and a start
        per message, not an object and a view."""
        if self._staged is not None:
            self._staged.add_frame(topic, due, window, at, end)
            return
        pending = self._pending_of(topic)
        mid = bytes(window[at + 18:at + 34])
        self.live_bytes += end - at
        if mid > self.max_id:
            self.max_id = mid
        runs = self.runs
        g = self._gathering
        if g is not None:
            ids = g._ids
            assert ids is not None  # a gathered run keeps its IDs
            # (and only while most of it is unfinished: a run whose consumers keep up would
            # otherwise hold the IDs of every message it ever had until it is compacted)
            if runs and runs[-1] is g and g.data is window and g.left * 2 > len(ids):
                if mid > g.last and g.topic == topic and g.due == due and g.pending == pending \
                        and g.open == (pending is None):
                    ids.append(mid)
                    g.starts.append(at)
                    g.last = mid
                    g.left += 1
                    return
            else:  # it takes no more (what it holds is let go as it is finished)
                self._gathering = None
        last = self._last_single
        if last is not None and last[1] is window and last[0] < mid:
            prev_id, _, prev_at, prev = last
            if (self.messages.get(prev_id) is prev and prev.topic == topic and prev.due == due
                    and prev.pending == pending and prev.open == (pending is None)
                    and (not runs or prev_id > runs[-1].last)):
                # the one before it is alike: both go into a new gathered run
                del self.messages[prev_id]
                g = ShadowRun(topic, due, window, pending, prev_id, mid, array("Q", (prev_at, at)), 0,
                              [prev_id, mid])
                g.gathered = True
                runs.append(g)
                self._firsts.append(prev_id)
                self._gathering = g
                self._last_single = None
                return
        m = self.messages[mid] = ShadowMessage(topic, due, window[at:end], pending)
        self._last_single = (mid, window, at, m)

    def _apply(self, entries: list[wire.Entry]) -> None:
        self._opened = opened = []
        for kind, topic, channel, due, data in entries:
            if kind == wire.MSG:
                pending = self._pending_of(topic)
                end = len(data)
                if end >= 34 and _U32_AT(data)[0] + 4 == end:  # one frame (a PUB): no index
                    mid = bytes(data[18:34])
                    self.messages[mid] = ShadowMessage(topic, due, data, pending)
                    if mid > self.max_id:
                        self.max_id = mid
                    self.live_bytes += end
                    continue
                ids, starts, stride = _index_frames(data)
                if ids is None:
                    first, last = bytes(data[18:34]), bytes(data[len(data) - stride + 18:len(data) - stride + 34])
                elif not ids:
                    continue
                else:
                    first, last = ids[0], ids[-1]
                runs = self.runs
                if ids is not None and len(ids) == 1:
                    self.messages[first] = ShadowMessage(topic, due, data, pending)
                elif (not runs or first > runs[-1].last) and first < last and (ids is None or ids == sorted(ids)):
                    runs.append(ShadowRun(topic, due, data, pending, first, last, starts, stride, ids))
                    self._firsts.append(first)
                else:  # not after the last run, or not increasing (not an origin's publish): one by one
                    ids = ids if ids is not None else [bytes(data[p + 18:p + 34]) for p in starts]
                    for i, mid in enumerate(ids):
                        stop = starts[i + 1] if i + 1 < len(ids) else len(data)
                        self.messages[mid] = ShadowMessage(topic, due, data[starts[i]:stop], pending)
                top = max(last, first)
                if top > self.max_id:  # the IDs of one origin increase: the last is the highest
                    self.max_id = top
                self.live_bytes += len(data)
            elif kind == wire.FIN:
                self._finish(topic, channel, wire.fin_ids(data))
            elif kind == wire.DEAD:
                frames = _split_frames(data)
                kept = self.dead.setdefault((topic, channel), {})
                for f in frames:
                    kept[f[18:34]] = (f, due)
                self._finish(topic, channel, [f[18:34] for f in frames], keep_dead=True)
            elif kind == wire.POLICY:
                if data:
                    self.policies[(topic, channel)] = bytes(data)
                else:
                    self.policies.pop((topic, channel), None)
            elif kind == wire.REQ:
                for mid, when in wire.split_req(data):
                    held = self.messages.get(mid)
                    if held is None:
                        run = self._run_of(mid)
                        if run is None:
                            continue
                        held = self._solo(run, mid)
                    held.due = when
            elif kind == wire.SNAP_MSG:
                self._snap_msg(topic, channel, due, data)
            elif kind == wire.TOPIC_NEW:
                self.topics.setdefault(topic, set())
            elif kind == wire.CHANNEL_NEW:
                channels = self.topics.setdefault(topic, set())
                if channel not in channels:
                    channels.add(channel)
                    for m in self._of_topic(topic):
                        if m.pending is None or m.open:
                            m.pending = (m.pending or frozenset()) | {channel}
                            if not m.open:
                                m.open = True
                            opened.append(m)
            elif kind == wire.CHANNEL_DEL or (kind == wire.EMPTY and channel):
                self._solid(topic)
                if kind == wire.CHANNEL_DEL:
                    self.topics.get(topic, set()).discard(channel)
                    self.paused.discard((topic, channel))
                    self.policies.pop((topic, channel), None)
                    self.dead.pop((topic, channel), None)
                for mid, m in list(self._items_of_topic(topic)):
                    if m.pending is not None and channel in m.pending:
                        m.pending = m.pending - {channel}
                        if not m.pending:
                            self._drop(mid, m)
            elif kind == wire.EMPTY:  # the topic's own queue: what no channel got yet
                self._solid(topic)
                for mid, m in list(self._items_of_topic(topic)):
                    if m.pending is None:
                        self._drop(mid, m)
            elif kind == wire.PAUSE:
                self.paused.add((topic, channel))
            elif kind == wire.UNPAUSE:
                self.paused.discard((topic, channel))
            elif kind == wire.TOPIC_DEL:
                self.topics.pop(topic, None)
                self.paused = {p for p in self.paused if p[0] != topic}
                self.policies = {k: v for k, v in self.policies.items() if k[0] != topic}
                self.dead = {k: v for k, v in self.dead.items() if k[0] != topic}
                self._solid(topic)
                for mid, m in list(self._items_of_topic(topic)):
                    self._drop(mid, m)
        for m in opened:  # channels created in one batch all get the backlog; later ones do not
            m.open = False
        self._opened = []

    def _finish(self, topic: str, channel: str, ids: Any, keep_dead: bool = False) -> None:
        """``channel`` is done with ``ids`` (finished, or dead and kept aside): a message no
        channel still owes is dropped.  A FIN also ends a dead letter of that ID (emptied, or
        redriven and then finished)."""
        dead = None if keep_dead else self.dead.get((topic, channel))
        messages = self.messages
        for mid in ids:
            if dead is not None:
                dead.pop(mid, None)
            held = messages.get(mid)
            if held is None:
                run = self._run_of(mid)
                if run is None or run.pending is None or channel not in run.pending:
                    continue
                if len(run.pending) == 1:  # its last channel: gone, no object made
                    self.live_bytes -= len(run.frame(mid))
                    self._leave(run, mid)
                    continue
                held = self._solo(run, mid)
            if held.pending is not None and channel in held.pending:
                held.pending = held.pending - {channel}
                if not held.pending:
                    self._drop(mid, held)

    def _snap_msg(self, topic: str, channel: str, due: int, data: bytes) -> None:
        """Messages a snapshot says one channel (or the topic's queue, ``channel`` empty) holds.

        An item of several messages, in increasing ID order and all newer than anything held,
        is kept as it came (one :class:`ShadowRun`, no object per message); the same messages
        on another channel (an item exactly like that run, untouched) add the channel to it.
        Anything else is kept message by message."""
        if len(data) >= 68 and self._snap_run(topic, channel, due, data):
            return
        messages = self.messages
        top = self.max_id
        for frame in wire.split_frames(data):
            mid = bytes(frame[18:34])
            if mid > top:
                top = mid
            held = messages.get(mid)
            if held is None and (run := self._run_of(mid)) is not None:
                held = self._solo(run, mid)
            if held is None:
                m = ShadowMessage(topic, due, frame, frozenset((channel,)) if channel else None)
                m.open = False
                messages[mid] = m
                self.live_bytes += len(frame)
            elif channel and held.pending is not None:
                held.pending = held.pending | {channel}
                if due < held.due:  # deferred on one channel, due now on another: the earlier
                    held.due = due
        self.max_id = top

    def _snap_run(self, topic: str, channel: str, due: int, data: bytes) -> bool:
        """:meth:`_snap_msg`'s item kept whole (True), or not (False: message by message)."""
        ids, starts, stride = _index_frames(data)
        n = len(starts)
        if n < 2:
            return False
        order = ids if ids is not None else list(map(_first, _id_struct(stride).iter_unpack(data)))
        first, last = order[0], order[-1]
        if first >= last or order != sorted(order):
            return False
        runs = self.runs
        if first > self.max_id:
            run = ShadowRun(topic, due, data, frozenset((channel,)) if channel else None, first, last,
                            starts, stride)  # IDs read again when first needed, not kept now
            run.open = False
            runs.append(run)
            self._firsts.append(first)
            self.live_bytes += len(data)
            self.max_id = last
            return True
        i = bisect_right(self._firsts, first) - 1
        if channel and i >= 0:
            run = runs[i]
            if (run.first == first and run.last == last and run.left == n and not run.gone
                    and not run.gathered and run.topic == topic and run.due == due and run.pending is not None
                    and len(run.data) == len(data)):
                run.pending = run.pending | {channel}
                return True
        return False

    def unfinished_topics(self) -> set[str]:
        """The topics of every unfinished message."""
        return {m.topic for m in self.messages.values()} | {run.topic for run in self.runs}

    def each_unfinished(self) -> Iterator[tuple[str, int, frozenset[str] | None, bytes | memoryview]]:
        """``(topic, due, pending channels, frame as held)`` of every unfinished message, in
        publish order, changing nothing (no object per message is made)."""
        held = sorted(self.messages.items())
        i = 0
        for run in list(self.runs):
            for mid, frame in run.each():
                while i < len(held) and held[i][0] < mid:
                    m = held[i][1]
                    yield m.topic, m.due, m.pending, m.raw
                    i += 1
                yield run.topic, run.due, run.pending, frame
        for _, m in held[i:]:
            yield m.topic, m.due, m.pending, m.raw

    def count(self) -> int:
        """How many messages are unfinished."""
        return len(self.messages) + sum(run.left for run in self.runs)

    def _run_of(self, mid: bytes) -> ShadowRun | None:
        """The run still holding ``mid``, found by ID range (None: no run holds it)."""
        i = bisect_right(self._firsts, mid) - 1
        if i < 0:
            return None
        run = self.runs[i]
        return run if run.has(mid) else None

    def _leave(self, run: ShadowRun, mid: bytes) -> None:
        run.gone.add(mid)
        run.left -= 1
        if not run.left:
            i = bisect_left(self._firsts, run.first)
            del self.runs[i]
            del self._firsts[i]

    def _solo(self, run: ShadowRun, mid: bytes) -> ShadowMessage:
        m = self.messages[mid] = run.solo(mid)
        if m.open and m.pending is not None:  # opened by a channel of this batch: closed with it
            self._opened.append(m)
        self._leave(run, mid)
        return m

    def _of_topic(self, topic: str) -> list[ShadowMessage | ShadowRun]:
        """Each message object of ``topic`` (a run once, however many of its messages are left)."""
        out: list[ShadowMessage | ShadowRun] = [m for m in self.messages.values() if m.topic == topic]
        out.extend(run for run in self.runs if run.topic == topic)
        return out

    def _items_of_topic(self, topic: str) -> list[tuple[bytes, ShadowMessage]]:
        return [(mid, m) for mid, m in self.messages.items() if m.topic == topic]

    def _solid(self, topic: str | None) -> None:
        """Give every message of ``topic`` (None: of every topic) still in a run its own object."""
        for run in [r for r in self.runs if topic is None or r.topic == topic]:
            for mid in run.remaining():
                self._solo(run, mid)

    def _drop(self, mid: bytes, m: ShadowMessage) -> None:
        del self.messages[mid]
        self.live_bytes -= len(m.raw)

    def unfinished(self) -> list[ShadowMessage]:
        """Every message some channel has not finished, in publish order (the IDs of one
        origin increase)."""
        self._solid(None)
        return [m for _, m in sorted(self.messages.items())]

    def snapshot(self) -> list[wire.Entry]:
        """BATCH items that rebuild this state from nothing (a compacted shadow log)."""
        out: list[wire.Entry] = [(wire.SNAP_BEGIN, "", "", 0, wire.epoch_data(self.epoch))]
        out.extend(topology_entries((t, sorted(chs)) for t, chs in self.topics.items()))
        out.extend((wire.PAUSE, t, c, 0, b"") for t, c in sorted(self.paused))
        out.extend((wire.POLICY, t, c, 0, record) for (t, c), record in sorted(self.policies.items()))
        for (t, c), letters in sorted(self.dead.items()):
            for code in sorted({why for _, why in letters.values()}):
                out.append((wire.DEAD, t, c, code, b"".join(f for f, why in letters.values() if why == code)))
        # frames as held (views of the log are joined where they are sent); a run untouched
        # goes whole, once per channel (rebuilt as one run, see _snap_msg), in ID order
        held = sorted(self.messages.items())
        i = 0

        def add(topic: str, due: int, pending: frozenset[str] | None, data: Any) -> None:
            if pending is None:
                out.append((wire.SNAP_MSG, topic, "", due, data))
            else:
                out.extend((wire.SNAP_MSG, topic, ch, due, data) for ch in sorted(pending))

        for run in self.runs:
            while i < len(held) and held[i][0] < run.first:
                m = held[i][1]
                add(m.topic, m.due, m.pending, m.raw)
                i += 1
            if run.gathered or run.gone:  # its frames, in pieces of at most a snapshot item
                for piece in run.pieces(SNAPSHOT_BATCH_BYTES // 2):
                    add(run.topic, run.due, run.pending, piece)
            else:
                add(run.topic, run.due, run.pending, run.data)
        for _, m in held[i:]:
            add(m.topic, m.due, m.pending, m.raw)
        out.append((wire.SNAP_END, "", "", 0, self.max_id))
        return out


def _split_frames(data: bytes | memoryview) -> list[bytes]:
    """The message frames joined in ``data`` (each led by its size)."""
    out = []
    pos = 0
    end = len(data)
    while pos + 4 <= end:
        stop = pos + 4 + _U32_AT(data, pos)[0]
        if stop > end or stop - pos < 34:
            break
        out.append(bytes(data[pos:stop]))
        pos = stop
    return out


def policy_record(policy: Any) -> bytes:
    """A channel policy as a POLICY item carries it."""
    return json.dumps(policy.to_record(), sort_keys=True).encode()


def topology_entries(topics: Any) -> list[wire.Entry]:
    out: list[wire.Entry] = []
    for topic, channels in topics:
        out.append((wire.TOPIC_NEW, topic, "", 0, b""))
        out.extend((wire.CHANNEL_NEW, topic, ch, 0, b"") for ch in channels)
    return out


def outstanding(broker: Broker, epoch: int, entry_bytes: int = SNAPSHOT_BATCH_BYTES // 2) -> Iterator[wire.Entry]:
    """A catch-up snapshot of an origin's broker: every durable topic and channel, which are
    paused, and every message not finished on each channel (queued in memory or on disk, in
    flight, deferred with its due time) or waiting in a topic's own queue, framed by
    ``SNAP_BEGIN``/``SNAP_END``.  Reads only; changes no position, counter or state.

    Taken when called, made as it is consumed: what is in memory is captured at once (lists
    of the frames held, no copies), what is on disk is read from the queue files as they were
    when called (``snapshot_records``), a read chunk at a time, so the snapshot of a large
    backlog is never in memory whole.  The messages of one queue go in entries of at most
    about ``entry_bytes`` each, so that it goes out in batches a peer takes (below
    :data:`~wire.MAX_FRAME`), not one entry per queue."""
    head: list[wire.Entry] = [(wire.SNAP_BEGIN, "", "", 0, wire.epoch_data(epoch))]
    #: (topic, channel, due in ns or None: each record's own, frames or records)
    parts: list[tuple[str, str, int | None, Iterable[Any]]] = []

    def queued(topic: str, channel: str, mem: Any, backend: Any) -> None:
        parts.append((topic, channel, 0, mem.peek(mem.depth())))
        records = getattr(backend, "snapshot_records", None)
        if records is not None and backend.depth():
            parts.append((topic, channel, None, records()))

    for t in list(broker.topics.values()):
        if t.ephemeral:
            continue
        names = [c for c in t.channels if not is_ephemeral(c)]
        head.extend(topology_entries([(t.name, names)]))
        if t.paused:
            head.append((wire.PAUSE, t.name, "", 0, b""))
        queued(t.name, "", t.mem, t.backend)
        parts.extend((t.name, "", int(at * 1e9), (frame,)) for at, frame in t.deferred)
        for name in names:
            ch = t.channels[name]
            if ch.paused:
                head.append((wire.PAUSE, t.name, name, 0, b""))
            if ch.policy is not None:
                head.append((wire.POLICY, t.name, name, 0, policy_record(ch.policy)))
            if ch.dead is not None:
                for code, reason in enumerate(REASONS):
                    frames = [letter.frame for letter in ch.dead if letter.reason == reason]
                    if frames:
                        head.append((wire.DEAD, t.name, name, code, b"".join(frames)))
            parts.append((t.name, name, 0, [f for mid, ep in ch.inflight.items()
                                             if (f := ep.msgs.get(mid)) is not None]))
            queued(t.name, name, ch.mem, ch.backend)
            parts.extend((t.name, name, int(at * 1e9), (frame,)) for at, _, frame in ch.deferred)
    return _snapshot_entries(head, parts, entry_bytes)


def _snapshot_entries(head: list[wire.Entry], parts: list[tuple[str, str, int | None, Iterable[Any]]],
                      entry_bytes: int) -> Iterator[wire.Entry]:
    """:func:`outstanding`'s entries, made from what it captured."""
    yield from head
    top = wire.NO_ID
    for topic, channel, due, items in parts:
        frames: list[bytes] = []
        size = 0
        if due is None:  # disk records: (frame, body size, deferred until or None)
            for frame, _, until in items:
                mid = frame[18:34]
                if mid > top:
                    top = mid
                if until is not None:
                    yield (wire.SNAP_MSG, topic, channel, int(until * 1e9), frame)
                    continue
                frames.append(frame)
                size += len(frame)
                if size >= entry_bytes:
                    yield (wire.SNAP_MSG, topic, channel, 0, b"".join(frames))
                    frames = []
                    size = 0
            due = 0
        else:
            for frame in items:
                mid = frame[18:34]
                if mid > top:
                    top = mid
                frames.append(frame)
                size += len(frame)
                if size >= entry_bytes:
                    yield (wire.SNAP_MSG, topic, channel, due, b"".join(frames))
                    frames = []
                    size = 0
        if frames:
            yield (wire.SNAP_MSG, topic, channel, due, b"".join(frames))
    yield (wire.SNAP_END, "", "", 0, top)


def iter_chunks(entries: Iterable[wire.Entry], limit: int) -> Iterator[list[wire.Entry]]:
    """``entries`` cut into batches of about ``limit`` bytes of data each, as they are
    needed (at least one batch, maybe empty)."""
    cur: list[wire.Entry] = []
    size = 0
    made = False
    for e in entries:
        cur.append(e)
        size += len(e[4]) + 40
        if size >= limit:
            yield cur
            made = True
            cur = []
            size = 0
    if cur or not made:
        yield cur
