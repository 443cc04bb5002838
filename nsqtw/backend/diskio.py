"""
The disk queue's data files: writing records (:class:`RecordWriter`) and reading them back
(:class:`RecordReader`), go-diskqueue's format byte for byte.  A record is NSQ's message
serialization; a queued frame becomes a record on the way in (its type field becomes the
record length, its attempts the deliveries so far) and a frame again on the way out.

Both are mixins of :class:`~nsqtw.backend.disk.DiskQueue`, which owns the queue's state
(positions, file descriptors, the sync policy); :class:`QueueFiles` declares the part of it
they use.
"""

from __future__ import annotations

import os
from collections import deque
import struct
from functools import partial
from itertools import chain, islice, repeat
from typing import TYPE_CHECKING, Any
from collections.abc import Callable, Sequence

from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from ..errors import BackendError, Exiting
from ..protocol.message import ID_SLICE
from .runs import Run, run_of_frames
from .sync import _job_close, _job_unlink

if TYPE_CHECKING:
    from .sync import SyncWorker

__all__ = ["QueueFiles", "RecordReader", "RecordWriter", "READ_CHUNK"]

log = Logger(namespace="nsqtw.diskqueue")

_I32 = struct.Struct(">i")
_U16 = struct.Struct(">H")
_bytes_get = bytes.__getitem__
_FRAME_HEAD = struct.Struct(">ii")
_unpack_i32 = _I32.unpack_from
_unpack_u16 = _U16.unpack_from
_pack_u16_into = _U16.pack_into
_pack_i32_into = _I32.pack_into
_pack_frame_head = _FRAME_HEAD.pack

#: bytes read from a data file at a time
READ_CHUNK = 256 * 1024


class QueueFiles:
    """What the record reader and writer use of their queue (set by DiskQueue.__init__)."""

    # slots (DiskQueue adds its own): every topic and channel holds a disk queue, idle or
    # not, and an instance dict of 34 names would be 1 KB apiece, one more object and 70
    # more references for every full garbage collection to walk
    __slots__ = (
        "name", "worker", "min_record", "max_record", "max_bytes_per_file", "deferred_sink", "error",
        "_depth", "read_file_num", "read_pos", "write_file_num", "write_pos",
        "_wfd", "_rfd", "_rbuf", "_rbuf_at", "_read_end", "_count", "_need_sync", "_put_seq", "_closed",
        "_hints", "_hints_dirty", "pinning", "_pin_q", "_pinned", "_del_from", "may_repeat",
    )

    may_repeat: bool

    name: str
    worker: SyncWorker
    min_record: int
    max_record: int
    max_bytes_per_file: int
    deferred_sink: Callable[[float, bytes], None] | None
    error: BaseException | None
    _depth: int
    read_file_num: int
    read_pos: int
    write_file_num: int
    write_pos: int
    _wfd: int | None
    _rfd: int | None
    _rbuf: bytes
    _rbuf_at: int
    _read_end: int | None
    _count: int
    _need_sync: bool
    _put_seq: int
    _closed: bool
    _hints: dict[bytes, float]
    _hints_dirty: bool
    #: keep read records on disk until their message is released (see DiskQueue.release)
    pinning: bool
    #: the records read since the oldest one still pinned, as one :class:`PinRun` per stretch
    #: a read took from one file, oldest first
    _pin_q: deque[PinRun] | None
    #: ids of the records read and not yet released, each to the run it was read in
    _pinned: dict[bytes, PinRun] | None
    #: the oldest data file not yet deleted
    _del_from: int

    def file_name(self, num: int) -> str:
        raise NotImplementedError

    def _after_ops(self) -> None:
        raise NotImplementedError

    def _release_run(self, run: Run) -> None:
        raise NotImplementedError

    def _log_job_failure(self, f: Failure, what: str) -> None:
        raise NotImplementedError


class RecordWriter(QueueFiles):
    """Appending runs of frames to the write file as records, rolling files as go-diskqueue does."""

    __slots__ = ()

    def _encode(self, run: Run) -> tuple[memoryview, list[tuple[int, int]]]:
        """The run's frames as diskqueue entries, in a private copy: (buffer, [(start, end)])."""
        blob, offs, end = run
        start = offs[0]
        ba = bytearray(blob[start:end]) if (start or end != len(blob)) else bytearray(blob)
        lo, hi = self.min_record, self.max_record
        spans: list[tuple[int, int]] = []
        total = len(ba)
        for o in offs:
            o -= start
            size = _unpack_i32(ba, o)[0]  # 4 (type) + record
            n = size - 4
            if n < lo or n > hi or o + 4 + size > total:
                raise BackendError(
                    f"invalid message write size ({n}) minMsgSize={lo} maxMsgSize={hi}")
            _pack_i32_into(ba, o + 4, n)  # the type field becomes the record length
            a = o + 16
            _pack_u16_into(ba, a, (_unpack_u16(ba, a)[0] - 1) & 0xFFFF)  # deliveries so far
            spans.append((o + 4, o + 4 + size))
        return memoryview(ba), spans

    def _encode_uniform(self, run: Run) -> bytes | None:
        """A run of same-size frames with equal attempts (a fresh MPUB) as one contiguous
        block of entries, built by C builtins; None when the run is not like that."""
        blob, offs, end = run
        if not isinstance(offs, range) or len(offs) < 2:
            return None
        stride = offs.step
        start, stop = offs.start, end
        size = _unpack_i32(blob, start)[0]
        n = size - 4
        if stride != size + 4 or stop - start != stride * len(offs) or n < self.min_record or n > self.max_record:
            return None
        # which of the first 18 bytes (size, type, timestamp, attempts) are the same in every
        # frame: each byte position, taken with a stride of one frame, is one repeated byte
        count = len(offs)
        same = [col.count(col[0]) == count for col in map(
            _bytes_get, repeat(blob), map(slice, range(start, start + 18), repeat(stop), repeat(stride)))]
        if not all(same[:8]) or not all(same[16:18]):
            return None
        att = _U16.pack((_unpack_u16(blob, start + 16)[0] - 1) & 0xFFFF)
        if all(same[8:16]):
            # a fresh MPUB: one timestamp, so every record starts with the same 14 bytes
            prefix = _I32.pack(n) + blob[start + 8:start + 16] + att
            return b"".join(chain.from_iterable(zip(repeat(prefix), map(
                _bytes_get, repeat(blob), map(slice, range(start + 18, stop, stride),
                                              range(start + stride, stop + stride, stride))))))
        return b"".join(chain.from_iterable(zip(
            repeat(_I32.pack(n)),
            map(_bytes_get, repeat(blob), map(slice, range(start + 8, stop, stride), range(start + 16, stop, stride))),
            repeat(att),
            map(_bytes_get, repeat(blob), map(slice, range(start + 18, stop, stride), range(start + stride, stop + stride, stride))),
        )))

    def put(self, run: Run) -> Run | None:
        """Store the whole run (rolling as needed); returns None.  Raises BackendError."""
        if self._closed:
            raise Exiting()
        blob, offs, end = run
        if len(offs) == 1:  # a PUB: no private copy needed
            o = offs[0]
            size = _unpack_i32(blob, o)[0]
            n = size - 4
            if n < self.min_record or n > self.max_record or o + 4 + size > len(blob):
                raise BackendError(f"invalid message write size ({n}) "
                                   f"minMsgSize={self.min_record} maxMsgSize={self.max_record}")
            att = (_unpack_u16(blob, o + 16)[0] - 1) & 0xFFFF
            record = b"".join((_I32.pack(n), blob[o + 8:o + 16], _U16.pack(att), blob[o + 18:o + 4 + size]))
            if self.write_pos > 0 and self.write_pos + size > self.max_bytes_per_file:
                self._roll()
            self._write(record, 1)
            if self._pinned:
                self._release_run(run)
            self._after_ops()
            return None
        if len(offs) > 1 and (self.write_pos == 0 or self.write_pos + (end - offs[0]) <= self.max_bytes_per_file):
            data = self._encode_uniform(run)
            if data is not None and self.write_pos + len(data) <= self.max_bytes_per_file:
                # no record of the run would roll: one write, as the general path would do
                self._write(data, len(offs))
                if self._pinned:
                    self._release_run(run)
                self._after_ops()
                return None
        mv, spans = self._encode(run)
        maxb = self.max_bytes_per_file
        wp = self.write_pos
        g_start = 0
        i = 0
        for a, b in spans:
            size = b - a
            if wp > 0 and wp + size > maxb:
                if i > g_start:
                    self._write(_join(mv, spans[g_start:i]), i - g_start)
                self._roll()
                wp = 0
                g_start = i
            wp += size
            i += 1
        if i > g_start:
            self._write(_join(mv, spans[g_start:i]), i - g_start)
        if self._pinned:
            self._release_run(run)
        self._after_ops()
        return None

    def put_deferred(self, items: Sequence[tuple[float, bytes]]) -> None:
        """Store deferred frames as ordinary records, remembering when each is due.

        Go's nsqd reading these files delivers them as backlog (its own
        behaviour); nsqtw's reader hands those still deferred to
        ``deferred_sink`` with their remaining delay.
        """
        if not items:
            return
        for at, frame in items:
            self._hints[bytes(frame[ID_SLICE])] = at
        self._hints_dirty = True
        self.put(run_of_frames([bytes(f) for _, f in items]))

    def _write(self, data: Any, k: int) -> None:
        """pwrite ``k`` entries at the write position (one system call unless it is short)."""
        fd = self._wfd
        if fd is None:
            fn = self.file_name(self.write_file_num)
            try:
                fd = os.open(fn, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            except OSError as e:
                self.error = e
                raise BackendError(f"DISKQUEUE({self.name}) cannot open {fn} - {e.strerror}") from e
            self._wfd = fd
        pos = self.write_pos
        try:
            n = os.pwrite(fd, data, pos)
            pos += n
            if n < len(data):
                view = memoryview(data)[n:]
                while view:
                    n = os.pwrite(fd, view, pos)
                    pos += n
                    view = view[n:]
        except OSError as e:
            self.error = e
            raise BackendError(f"DISKQUEUE({self.name}) write failed - {e.strerror}") from e
        self.write_pos = pos
        self._depth += k
        self._count += k
        self._put_seq += k
        self.worker._unsynced[id(self)] = self  # type: ignore[assignment]  # always a DiskQueue (a mixin of it)

    def _roll(self) -> None:
        """Close the full write file (fsync off-thread) and continue in the next one."""
        fd, self._wfd = self._wfd, None
        self.write_file_num += 1
        self.write_pos = 0
        if fd is not None:
            self.worker.submit(partial(_job_close, fd, True)).addErrback(self._log_job_failure, "sync on roll")
        self._need_sync = True


class PinRun:
    """The records one read took from one data file, pinned until released: their ids and
    positions in read order, and how many of them are still pinned (``left``)."""

    __slots__ = ("file", "ids", "positions", "left")

    def __init__(self, file: int, ids: list[bytes], positions: list[int]) -> None:
        self.file = file
        self.ids = ids
        self.positions = positions
        self.left = len(ids)


class RecordReader(QueueFiles):
    """Reading records back as runs of frames; corruption handling as go-diskqueue's."""

    __slots__ = ()

    def read(self, n: int, max_bytes: int = 0) -> list[Run]:
        """Remove and return up to ``n`` messages (and, with ``max_bytes``, about that many
        bytes: at least one message), oldest first, as (at most) one run."""
        if self._closed or n <= 0:
            return []
        out = bytearray()
        offs: list[int] = []
        diverted: list[tuple[float, bytes]] = []
        hints = self._hints
        sink = self.deferred_sink
        now = self.worker.seconds() if hints else 0.0
        lo, hi = self.min_record, self.max_record
        pinning = self.pinning
        if pinning and self._pin_q is None:
            self._pin_q = deque()
            self._pinned = {}
        got = 0
        first = -1
        uniform = True
        while got < n and not (max_bytes and got and len(out) >= max_bytes):
            rf = self.read_file_num
            wf = self.write_file_num
            if rf >= wf and self.read_pos >= self.write_pos:
                break
            if self._rfd is None:
                try:
                    self._rfd = os.open(self.file_name(rf), os.O_RDONLY | os.O_CLOEXEC)
                except OSError as e:
                    self._handle_read_error(e)
                    continue
                self._rbuf = b""
                self._read_end = None
            if rf < wf:
                end = self._read_end
                if end is None:
                    end = self._read_end = os.fstat(self._rfd).st_size
                if self.read_pos >= end:
                    self._finish_read_file()
                    continue
            else:
                end = self.write_pos
            fd = self._rfd
            buf = self._rbuf
            mbuf = memoryview(buf)
            base = self._rbuf_at
            pos = self.read_pos
            err: str | None = None
            if pinning:
                pin_ids: list[bytes] = []
                pin_pos: list[int] = []
                add_id = pin_ids.append
                add_pos = pin_pos.append
            while got < n and pos < end and not (max_bytes and got and len(out) >= max_bytes):
                i = pos - base
                if i < 0 or i + 4 > len(buf):
                    buf = os.pread(fd, READ_CHUNK, pos)
                    mbuf = memoryview(buf)
                    base, i = pos, 0
                    if len(buf) < 4:
                        err = "EOF"
                        break
                size = _unpack_i32(buf, i)[0]
                if size < lo or size > hi:
                    err = f"invalid message read size ({size})"
                    break
                j = i + 4 + size
                if j > len(buf):
                    buf = os.pread(fd, max(READ_CHUNK, 4 + size), pos)
                    mbuf = memoryview(buf)
                    base, i = pos, 0
                    j = 4 + size
                    if len(buf) < j:
                        err = "unexpected EOF"
                        break
                if pinning:
                    add_id(buf[i + 14:i + 30])
                    add_pos(pos)
                if hints:
                    at = hints.pop(buf[i + 14:i + 30], None)
                    if at is not None:
                        self._hints_dirty = True
                        if sink is not None and at > now:
                            diverted.append((at, self._frame_of(buf, i, size)))
                            pos += 4 + size
                            self._depth -= 1
                            self._count += 1
                            continue
                fs = len(out)
                if size != first:
                    if first < 0:
                        first = size
                    else:
                        uniform = False
                out += _pack_frame_head(size + 4, 2)
                out += mbuf[i + 4:j]
                a = fs + 16
                _pack_u16_into(out, a, (_unpack_u16(out, a)[0] + 1) & 0xFFFF)
                offs.append(fs)
                got += 1
                pos += 4 + size
                self._depth -= 1
                self._count += 1
            self._rbuf = buf
            self._rbuf_at = base
            self.read_pos = pos
            if pinning and pin_ids:
                self._pin(PinRun(rf, pin_ids, pin_pos))
            if err is not None:
                self._handle_read_error(err)
                continue
            if rf < wf and pos >= end:
                self._finish_read_file()
        if self.read_file_num == self.write_file_num and self.read_pos >= self.write_pos:
            self.may_repeat = False  # read to the end: nothing from before the open is left
        if self._rfd is not None and self.read_pos - self._rbuf_at >= len(self._rbuf):
            self._rbuf = b""  # nothing buffered ahead: do not hold the chunk
        self._check_tail_corruption()
        self._after_ops()
        if diverted and sink is not None:
            for at, frame in diverted:
                sink(at, frame)
        if not offs:
            return []
        return [_run_of(bytes(out), offs, uniform)]

    def deferred_on_disk(self) -> int:
        """How many records on disk are still deferred (stored at a clean stop; the reader hands them
        back as deferred when it reaches them)."""
        return len(self._hints)

    def peek(self, n: int, max_body: int) -> list[tuple[bytes, int, float | None]]:
        """The next ``n`` records as they would be delivered, changing nothing: positions,
        buffers, depth, hints and metadata stay as they are.  Each is ``(head, body_size,
        due)``: ``head`` is the frame (attempts as delivered) with at most ``max_body`` bytes
        of its body, ``due`` the time a deferred record is still waiting for (else None).

        Reads only what ``n`` needs (a record's first ``30 + max_body`` bytes; larger records
        are skipped over by their size), so its cost is bounded by ``n``, not by the backlog.
        A record that looks corrupt ends the peek (the reader will quarantine it)."""
        out: list[tuple[bytes, int, float | None]] = []
        if self._closed or n <= 0:
            return out
        rf, pos = self.read_file_num, self.read_pos
        while len(out) < n and (rf < self.write_file_num or (rf == self.write_file_num and pos < self.write_pos)):
            try:
                fd = os.open(self.file_name(rf), os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return out
            try:
                end = self.write_pos if rf == self.write_file_num else os.fstat(fd).st_size
                for record in self._scan(fd, pos, end, max_body):
                    if record is None:
                        return out  # a corrupt or short record ends it
                    out.append(record)
                    if len(out) >= n:
                        return out
            finally:
                os.close(fd)
            rf, pos = rf + 1, 0
        return out

    def snapshot_records(self) -> Any:
        """Every record held now, as :meth:`peek` gives them (whole bodies), read lazily:
        an iterator over ``(frame, body_size, due)``.  The files are opened when this is
        called, so the records are the ones held at that moment, however far the reader
        goes (or whichever files it deletes) while the iterator is consumed; what is read
        from them is bounded by one read chunk at a time, not by the backlog.  (A catch-up
        snapshot of a large backlog on disk, see ``nsqtw.nsqd.core.replication``.)  When
        no more files can be opened, the rest is read at once instead."""
        spans: list[tuple[int, int, int]] = []  # (fd, start, end), in order
        eager: list[tuple[bytes, int, float | None]] = []
        if self._closed:
            return iter(eager)
        rf, pos = self.read_file_num, self.read_pos
        try:
            while rf < self.write_file_num or (rf == self.write_file_num and pos < self.write_pos):
                try:
                    fd = os.open(self.file_name(rf), os.O_RDONLY | os.O_CLOEXEC)
                except OSError:  # gone (nothing left there), or too many files open
                    break
                end = self.write_pos if rf == self.write_file_num else os.fstat(fd).st_size
                spans.append((fd, pos, end))
                rf, pos = rf + 1, 0
            if rf < self.write_file_num or (rf == self.write_file_num and pos < self.write_pos):
                # could not keep the rest open: read it now (positions as they are)
                keep = self.read_file_num, self.read_pos
                self.read_file_num, self.read_pos = rf, pos
                try:
                    eager = self.peek(1 << 62, 1 << 31)
                finally:
                    self.read_file_num, self.read_pos = keep
        except BaseException:
            for fd, _, _ in spans:
                os.close(fd)
            raise
        return self._snapshot_records(spans, eager)

    def _snapshot_records(self, spans: list[tuple[int, int, int]],
                          eager: list[tuple[bytes, int, float | None]]) -> Any:
        try:
            for i, (fd, start, end) in enumerate(spans):
                try:
                    for record in self._scan(fd, start, end, 1 << 31):
                        if record is None:
                            break  # a corrupt record: the reader will skip the rest of that file
                        yield record
                finally:
                    os.close(fd)
                    spans[i] = (-1, 0, 0)
            yield from eager
        finally:
            for fd, _, _ in spans:
                if fd >= 0:
                    os.close(fd)

    def _scan(self, fd: int, pos: int, end: int, max_body: int) -> Any:
        """The records of one open file from ``pos`` to ``end`` (see :meth:`peek`); a record
        that looks corrupt or is cut short ends it with a None."""
        lo, hi = self.min_record, self.max_record
        hints = self._hints
        buf = b""
        base = pos
        while pos < end:
            i = pos - base
            if i + 4 > len(buf):
                buf, base, i = os.pread(fd, READ_CHUNK, pos), pos, 0
                if len(buf) < 4:
                    yield None
                    return
            size = _unpack_i32(buf, i)[0]
            if size < lo or size > hi:
                yield None
                return
            want = min(size, 26 + max_body)
            if i + 4 + want > len(buf):
                buf, base, i = os.pread(fd, max(READ_CHUNK, 4 + want), pos), pos, 0
                if len(buf) < 4 + want:
                    yield None
                    return
            head = bytearray(_pack_frame_head(size + 4, 2))
            head += buf[i + 4:i + 4 + want]
            _pack_u16_into(head, 16, (_unpack_u16(head, 16)[0] + 1) & 0xFFFF)
            due = hints.get(bytes(head[18:34])) if hints else None
            yield bytes(head), size - 26, due
            pos += 4 + size

    @staticmethod
    def _frame_of(buf: bytes, i: int, size: int) -> bytes:
        frame = bytearray(_pack_frame_head(size + 4, 2))
        frame += buf[i + 4:i + 4 + size]
        _pack_u16_into(frame, 16, (_unpack_u16(frame, 16)[0] + 1) & 0xFFFF)
        return bytes(frame)

    def _close_read_file(self) -> None:
        fd, self._rfd = self._rfd, None
        self._rbuf = b""
        self._rbuf_at = 0
        self._read_end = None
        if fd is not None:
            os.close(fd)

    def _finish_read_file(self) -> None:
        """A completed file was read to its end: delete it (unless records of it are still
        pinned: then once they are released), move on, sync soon."""
        self._close_read_file()
        done = self.read_file_num
        self.read_file_num += 1
        self.read_pos = 0
        self._need_sync = True
        if self._pin_q:
            self._advance_pins()
            if self._pin_q:
                return  # deleted after the metadata moves past it (_submit_deletions)
        paths = [self.file_name(n) for n in range(min(self._del_from, done), done + 1)]
        self._del_from = self.read_file_num
        self.worker.submit(partial(_job_unlink, paths)).addErrback(self._log_job_failure, "remove")

    def _pin(self, run: PinRun) -> None:
        """Pin the records of one read (C loops: one dict update for the whole run)."""
        pinned = self._pinned
        q = self._pin_q
        assert pinned is not None and q is not None  # made together by read()
        before = len(pinned)
        pinned.update(dict.fromkeys(run.ids, run))
        q.append(run)
        if len(pinned) != before + len(run.ids):
            # an id read again while still pinned (a record written twice, or twice in this run):
            # its newest record is the one that counts; recount the runs it was taken from
            for r in q:
                r.left = len({m for m in r.ids if pinned.get(m) is r})

    def _advance_pins(self) -> None:
        """Drop fully released runs from the front of the pin queue (the committed position)."""
        q = self._pin_q
        if q is None:
            return
        while q and q[0].left <= 0:
            q.popleft()

    def _committed(self) -> tuple[int, int, int]:
        """``(depth, file, position)`` as the metadata must say them: from the oldest record
        still pinned (or the read position when none is), so a restart reads it again."""
        q = self._pin_q
        if q:
            self._advance_pins()
            if q:
                head = q[0]
                pinned = self._pinned
                assert pinned is not None
                k = 0
                ids = head.ids
                while pinned.get(ids[k]) is not head:  # left > 0: one of them is still pinned
                    k += 1
                since = len(ids) - k + sum(len(r.ids) for r in islice(q, 1, None))
                return self._depth + since, head.file, head.positions[k]
        return self._depth, self.read_file_num, self.read_pos

    def _submit_deletions(self, commit_file: int) -> None:
        """Delete the data files the metadata just submitted no longer needs (after it: a crash
        in between leaves a file behind, never metadata naming a deleted one)."""
        if commit_file > self._del_from:
            paths = [self.file_name(n) for n in range(self._del_from, commit_file)]
            self._del_from = commit_file
            self.worker.submit(partial(_job_unlink, paths)).addErrback(self._log_job_failure, "remove")

    def _clear_pins(self) -> None:
        if self._pin_q is not None:
            self._pin_q = None
            self._pinned = None

    def _handle_read_error(self, err: Any) -> None:
        """go-diskqueue's handleReadError: quarantine the read file, go on with the next."""
        bad = self.file_name(self.read_file_num)
        log.error("DISKQUEUE({name}) reading at {pos} of {fn} - {err}",
                  name=self.name, pos=self.read_pos, fn=bad, err=err)
        self._close_read_file()
        if self.read_file_num == self.write_file_num:
            self._hand_off_write_fd(sync=False)
            self.write_file_num += 1
            self.write_pos = 0
        log.warn("DISKQUEUE({name}) jump to next file and saving bad file as {fn}.bad",
                 name=self.name, fn=bad)
        try:
            os.rename(bad, bad + ".bad")
        except OSError as e:
            log.error("DISKQUEUE({name}) failed to rename bad diskqueue file {fn} to {fn}.bad - {err}",
                      name=self.name, fn=bad, err=e)
        self.read_file_num += 1
        self.read_pos = 0
        self._need_sync = True
        self._check_tail_corruption()

    def _check_tail_corruption(self) -> None:
        rf, wf = self.read_file_num, self.write_file_num
        if rf < wf or self.read_pos < self.write_pos:
            return
        if self._depth != 0:
            if self._depth < 0:
                log.error("DISKQUEUE({name}) negative depth at tail ({d}), metadata corruption, "
                          "resetting 0...", name=self.name, d=self._depth)
            else:
                log.error("DISKQUEUE({name}) positive depth at tail ({d}), data loss, resetting 0...",
                          name=self.name, d=self._depth)
            self._depth = 0
            self._need_sync = True
        if rf != wf or self.read_pos != self.write_pos:
            if rf > wf:
                log.error("DISKQUEUE({name}) readFileNum > writeFileNum ({r} > {w}), corruption, "
                          "skipping to next writeFileNum and resetting 0...", name=self.name, r=rf, w=wf)
            if self.read_pos > self.write_pos:
                log.error("DISKQUEUE({name}) readPos > writePos ({r} > {w}), corruption, "
                          "skipping to next writeFileNum and resetting 0...",
                          name=self.name, r=self.read_pos, w=self.write_pos)
            self._skip_to_next_rw_file()
            self._need_sync = True

    def _hand_off_write_fd(self, sync: bool) -> None:
        fd, self._wfd = self._wfd, None
        if fd is not None:
            self.worker.submit(partial(_job_close, fd, sync)).addErrback(self._log_job_failure, "close")

    def _skip_to_next_rw_file(self, extra: Sequence[str] = ()) -> Deferred[Any]:
        """Delete every data file from the read file to the write file; start afresh after them."""
        self._close_read_file()
        self._hand_off_write_fd(sync=False)
        paths = [self.file_name(i) for i in range(min(self._del_from, self.read_file_num), self.write_file_num + 1)]
        paths.extend(extra)
        d = self.worker.submit(partial(_job_unlink, paths))
        self._clear_pins()
        self.write_file_num += 1
        self.write_pos = 0
        self._del_from = self.write_file_num
        self.read_file_num = self.write_file_num
        self.read_pos = 0
        self._depth = 0
        return d


def _join(mv: memoryview, spans: list[tuple[int, int]]) -> Any:
    if len(spans) == 1:
        a, b = spans[0]
        return mv[a:b]
    return b"".join([mv[a:b] for a, b in spans])


def _run_of(blob: bytes, offs: list[int], uniform: bool) -> Run:
    """A run over ``blob`` (a range of offsets when every frame has the same size)."""
    n = len(offs)
    if n == 1:
        return (blob, range(0, 1), len(blob))
    if uniform:
        return (blob, range(0, len(blob), offs[1]), len(blob))
    return (blob, offs, len(blob))
