"""
The disk queue: go-diskqueue v1.1.0's files, byte for byte, behind :class:`IBackendQueue`.

Files (in ``--data-path``; a channel's queue is named ``<topic>:<channel>``)::

    <name>.diskqueue.000000.dat     [4-byte BE length N][N-byte record] ...
    <name>.diskqueue.meta.dat       "%d\\n%d,%d\\n%d,%d\\n" % (depth, readFileNum, readPos,
                                                             writeFileNum, writePos)
    <name>.diskqueue.NNNNNN.dat.bad a quarantined corrupt file
    <name>.diskqueue.deferred.dat   nsqtw only: deferral hints (:mod:`.deferred_store`)

A record is NSQ's message serialization (timestamp, attempts = deliveries so
far, id, body); queued frames are converted at this boundary, so Go's nsqd
and nsqtw read each other's queues.  The rules are go-diskqueue's: a write
that would push a non-empty file past ``max_bytes_per_file`` rolls to the
next file first; a file is deleted once read to its end; a record length
outside ``[26, max_msg_size + 26]`` on read is corruption, which renames the
read file to ``.bad`` and continues with the next one (moving writes to a
new file when it was also the write file); at the tail a non-zero depth is
reset; on open, a metadata ``writePos`` behind the write file's real size
(an unclean stop) moves writes to a new file and the reader salvages what
is past.  Beyond Go: the salvaged records are counted into the depth, files
written after a roll whose metadata never reached the disk are found again,
and a queue whose metadata is missing but whose data files exist is
recovered instead of overwritten.

Threads and durability -- the contract the broker relies on:

* ``put(run)`` validates the whole run, then ``pwrite()``s it (one call per
  file touched) before returning: when it returns the messages are in the
  OS page cache and survive the broker's own crash (``kill -9``), though not
  a power loss.  Nothing is buffered in Python: the batching unit is the
  run (an MPUB, or a channel's whole shutdown flush, is one write), not the
  reactor turn, because a write error must reach the publisher before its
  OK.  A failure raises :class:`~nsqtw.errors.BackendError` (the caller
  answers ``E_PUB_FAILED``; a run that spanned a roll may have been stored
  in part).
* fsync and metadata writes never run on the reactor thread.  They go to the
  :class:`SyncWorker`, a single thread per broker that runs every job in
  submission order (fsync, metadata rewrite, deletion of read files, closing
  of rolled file descriptors).  Syncs are grouped: a queue asks for one at
  the end of the reactor turn (``callLater(0)``), has at most one in flight,
  and a sync covers every write made before it was submitted.
* When a sync happens follows go-diskqueue: after ``sync_every`` operations
  (writes plus consumed reads), ``sync_timeout`` after activity, on roll,
  after a read file is deleted or corruption was handled, and on close.
  Metadata is written after the fsync of the data it describes, so it never
  claims data that is not on disk.
* ``flush_and_sync()`` returns a Deferred that fires once an fsync covering
  every message put before the call has completed (it errbacks if that
  fsync fails); ``when_synced()`` waits the same way without forcing an
  early sync.  What an OK means, per setting:

  - ``--sync-every=1``: nsqd fsyncs after every write.  The broker answers
    OK only when ``SyncWorker.flush_and_sync_all()`` (every queue with
    unsynced writes) or ``flush_and_sync()`` of each disk queue the publish
    wrote to has fired; concurrent publishes share one fsync per turn.  A message
    that went to a memory queue is, as in Go, not on disk at all.
  - ``--sync-every=N > 1``: OK once ``put()`` returned (page cache).  An
    fsync follows within N operations or ``--sync-timeout``; a power loss
    can lose what was written since the last one.

For unit tests, ``SyncWorker(clock=None, threaded=False)`` runs every job
inline at once, so the whole queue is synchronous and deterministic; with a
``task.Clock`` the end-of-turn and timeout syncs wait for ``clock.advance``.
Time comes from the worker's clock (the reactor, or the test's ``task.Clock``);
a worker made with neither reads the wall clock (``time.time()``) for the
deferral hints' timestamps.
"""

from __future__ import annotations

import os
import re
import struct
from functools import partial
from itertools import chain, repeat
from typing import Any
from collections.abc import Callable, Sequence

from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from ..errors import BackendError, Exiting
from ..protocol.message import ID_SLICE, MIN_MESSAGE_LENGTH
from . import IBackendQueue
from .deferred_store import DeferredStore
from .diskformat import _DATA_RE_TMPL, DirListing, format_queue_metadata, read_queue_metadata
from .runs import Run, run_of_frames
from .sync import SyncWorker, _inline_worker, _job_close, _job_sync, _job_unlink

__all__ = ["DiskQueue", "SyncWorker", "disk_backends", "read_queue_metadata", "format_queue_metadata"]

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

# --- the queue -------------------------------------------------------------------------------

@implementer(IBackendQueue)
class DiskQueue:
    """go-diskqueue for one topic or channel (see the module docstring)."""

    accepts_all = True

    def __init__(self, name: str, data_path: str, *,
                 max_bytes_per_file: int = 100 * 1024 * 1024,
                 max_msg_size: int = 1024 * 1024,
                 sync_every: int = 2500,
                 sync_timeout: float = 2.0,
                 worker: SyncWorker | None = None,
                 deferred_sink: Callable[[float, bytes], None] | None = None,
                 min_msg_size: int = MIN_MESSAGE_LENGTH,
                 listing: DirListing | None = None) -> None:
        self.name = name
        #: where a queue without metadata looks for data files (None: list the directory)
        self.listing = listing
        self.data_path = data_path
        self.max_bytes_per_file = max_bytes_per_file
        self.min_record = min_msg_size
        #: go-diskqueue's maxMsgSize: nsqd passes --max-msg-size + 26
        self.max_record = max_msg_size + MIN_MESSAGE_LENGTH
        self.sync_every = max(1, sync_every)
        self.sync_timeout = sync_timeout
        self.worker = worker if worker is not None else _inline_worker()
        #: called with (deliver_at, frame) for a record whose deferral hint is still pending
        self.deferred_sink = deferred_sink
        self.error: BaseException | None = None

        self._depth = 0
        self.read_file_num = 0
        self.read_pos = 0
        self.write_file_num = 0
        self.write_pos = 0

        self._wfd: int | None = None
        self._rfd: int | None = None
        self._rbuf = b""
        self._rbuf_at = 0
        self._read_end: int | None = None

        self._count = 0
        self._need_sync = False
        self._syncing = False
        self._timer: Any = None
        self._put_seq = 0
        self._synced_seq = 0
        self._waiters: list[tuple[int, Deferred[Any], bool]] = []
        self._closed = False

        self._meta_path = os.path.join(data_path, f"{name}.diskqueue.meta.dat")
        self._file_tmpl = os.path.join(data_path, f"{name}.diskqueue.%06d.dat")
        self._hint_store = DeferredStore.for_queue(data_path, name)
        self._hints: dict[bytes, float] = {}
        self._hints_dirty = False

        self._open()

    # --- names and introspection ---------------------------------------------------------

    def file_name(self, num: int) -> str:
        return self._file_tmpl % num

    @property
    def metadata_file_name(self) -> str:
        return self._meta_path

    def positions(self) -> tuple[int, int, int, int, int]:
        """``(depth, readFileNum, readPos, writeFileNum, writePos)`` as the metadata would say."""
        return self._depth, self.read_file_num, self.read_pos, self.write_file_num, self.write_pos

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def put_count(self) -> int:
        """Messages written since the queue was opened (tells how much of a failed ``put``
        was stored, see :mod:`nsqtw.nsqd.backlog`)."""
        return self._put_seq

    @property
    def pending_hints(self) -> dict[bytes, float]:
        return dict(self._hints)

    def __repr__(self) -> str:
        return f"<DiskQueue {self.name} {self.positions()}>"

    # --- opening (retrieveMetaData) ------------------------------------------------------

    def _open(self) -> None:
        try:
            with open(self._meta_path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            raw = None
        except OSError as e:
            log.error("DISKQUEUE({name}) failed to retrieveMetaData - {err}", name=self.name, err=e)
            raw = None
        state = None
        if raw is not None:
            try:
                state = read_queue_metadata(raw)
            except ValueError as e:
                log.error("DISKQUEUE({name}) failed to retrieveMetaData - {err}", name=self.name, err=e)
        if state is None:
            self._recover_without_metadata()
        else:
            self._depth, self.read_file_num, self.read_pos, self.write_file_num, self.write_pos = state
            self._salvage_past_write_pos()
        now = self.worker.seconds()
        for at, mid in self._hint_store.load():
            if at > now:
                self._hints[mid] = at
        self._check_tail_corruption()
        if self._need_sync:
            self.worker.wake(self)  # record the recovery before anything else happens

    def _existing_data_files(self) -> list[int]:
        if self.listing is not None:
            # the factory's one listing of the data path (a directory of N queues listed for
            # each new queue made creating N queues cost O(N^2)); files still there only
            return [n for n in self.listing.data_files(self.name) if os.path.exists(self.file_name(n))]
        pat = re.compile(_DATA_RE_TMPL % re.escape(self.name))
        nums = []
        try:
            names = os.listdir(self.data_path)
        except OSError:
            return []
        for fn in names:
            m = pat.match(fn)
            if m:
                nums.append(int(m.group(1)))
        return sorted(nums)

    def _recover_without_metadata(self) -> None:
        nums = self._existing_data_files()
        if not nums:
            return  # a new queue
        total = 0
        for n in nums:
            total += self._count_records(self.file_name(n), 0)[0]
        log.warn("DISKQUEUE({name}) no metadata but data files {first}..{last}; "
                 "recovering {total} messages", name=self.name, first=nums[0], last=nums[-1], total=total)
        self._depth = total
        self.read_file_num, self.read_pos = nums[0], 0
        self.write_file_num, self.write_pos = nums[-1] + 1, 0
        self._need_sync = True

    def _salvage_past_write_pos(self) -> None:
        """go-diskqueue's stale-metadata rule, extended to files written after a lost roll."""
        extra = 0
        while True:
            fn = self.file_name(self.write_file_num)
            try:
                size = os.stat(fn).st_size
            except FileNotFoundError:
                if self.write_pos > 0:
                    log.warn("DISKQUEUE({name}) {fn} missing at writePos {pos}, skipping to new file",
                             name=self.name, fn=fn, pos=self.write_pos)
                    self.write_file_num += 1
                    self.write_pos = 0
                    self._need_sync = True
                    continue
                break
            if size == self.write_pos:
                if size > 0 and os.path.exists(self.file_name(self.write_file_num + 1)):
                    # rolled, then stopped before the metadata said so
                    self.write_file_num += 1
                    self.write_pos = 0
                    self._need_sync = True
                    continue
                break
            if size > self.write_pos:
                n, _ = self._count_records(fn, self.write_pos)
                extra += n
                log.warn("DISKQUEUE({name}) {fn} metadata writePos {pos} < file size of {size}, "
                         "skipping to new file ({n} messages salvaged)",
                         name=self.name, fn=fn, pos=self.write_pos, size=size, n=n)
            else:
                log.warn("DISKQUEUE({name}) {fn} metadata writePos {pos} > file size of {size}, "
                         "skipping to new file", name=self.name, fn=fn, pos=self.write_pos, size=size)
            self.write_file_num += 1
            self.write_pos = 0
            self._need_sync = True
        self._depth += extra

    def _count_records(self, path: str, start: int) -> tuple[int, int]:
        """Valid records from ``start`` to the first bad or partial one: (count, end)."""
        count = 0
        pos = start
        lo, hi = self.min_record, self.max_record
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return 0, start
        try:
            buf = b""
            at = start
            while True:
                i = pos - at
                if i + 4 > len(buf):
                    buf = os.pread(fd, READ_CHUNK, pos)
                    at, i = pos, 0
                    if len(buf) < 4:
                        break
                size = _unpack_i32(buf, i)[0]
                if size < lo or size > hi:
                    break
                if i + 4 + size > len(buf):
                    buf = os.pread(fd, max(READ_CHUNK, 4 + size), pos)
                    at = pos
                    if len(buf) < 4 + size:
                        break
                pos += 4 + size
                count += 1
        finally:
            os.close(fd)
        return count, pos

    # --- writing ---------------------------------------------------------------------------

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
        if len(offs) > 1 and (self.write_pos == 0 or self.write_pos + (end - offs[0]) <= self.max_bytes_per_file):
            data = self._encode_uniform(run)
            if data is not None and self.write_pos + len(data) <= self.max_bytes_per_file:
                # no record of the run would roll: one write, as the general path would do
                self._write(data, len(offs))
                self._after_ops()
                return None
        if len(offs) == 1:  # a PUB: no private copy needed
            o = offs[0]
            size = _unpack_i32(blob, o)[0]
            n = size - 4
            if n < self.min_record or n > self.max_record or o + 4 + size > len(blob):
                raise BackendError(f"invalid message write size ({n}) "
                                   f"minMsgSize={self.min_record} maxMsgSize={self.max_record}")
            att = (_unpack_u16(blob, o + 16)[0] - 1) & 0xFFFF
            data = _I32.pack(n) + blob[o + 8:o + 16] + _U16.pack(att) + blob[o + 18:o + 4 + size]
            if self.write_pos > 0 and self.write_pos + size > self.max_bytes_per_file:
                self._roll()
            self._write(data, 1)
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
        self.worker._unsynced[id(self)] = self

    def _roll(self) -> None:
        """Close the full write file (fsync off-thread) and continue in the next one."""
        fd, self._wfd = self._wfd, None
        self.write_file_num += 1
        self.write_pos = 0
        if fd is not None:
            self.worker.submit(partial(_job_close, fd, True)).addErrback(self._log_job_failure, "sync on roll")
        self._need_sync = True

    # --- reading ---------------------------------------------------------------------------

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
            if err is not None:
                self._handle_read_error(err)
                continue
            if rf < wf and pos >= end:
                self._finish_read_file()
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
        lo, hi = self.min_record, self.max_record
        hints = self._hints
        rf, pos = self.read_file_num, self.read_pos
        while len(out) < n and (rf < self.write_file_num or (rf == self.write_file_num and pos < self.write_pos)):
            try:
                fd = os.open(self.file_name(rf), os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return out
            try:
                end = self.write_pos if rf == self.write_file_num else os.fstat(fd).st_size
                buf = b""
                base = pos
                while len(out) < n and pos < end:
                    i = pos - base
                    if i + 4 > len(buf):
                        buf, base, i = os.pread(fd, READ_CHUNK, pos), pos, 0
                        if len(buf) < 4:
                            return out
                    size = _unpack_i32(buf, i)[0]
                    if size < lo or size > hi:
                        return out
                    want = min(size, 26 + max_body)
                    if i + 4 + want > len(buf):
                        buf, base, i = os.pread(fd, max(READ_CHUNK, 4 + want), pos), pos, 0
                        if len(buf) < 4 + want:
                            return out
                    head = bytearray(_pack_frame_head(size + 4, 2))
                    head += buf[i + 4:i + 4 + want]
                    _pack_u16_into(head, 16, (_unpack_u16(head, 16)[0] + 1) & 0xFFFF)
                    due = hints.get(bytes(head[18:34])) if hints else None
                    out.append((bytes(head), size - 26, due))
                    pos += 4 + size
            finally:
                os.close(fd)
            rf, pos = rf + 1, 0
        return out

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
        """A completed file was read to its end: delete it, move on, sync soon."""
        self._close_read_file()
        old = self.file_name(self.read_file_num)
        self.read_file_num += 1
        self.read_pos = 0
        self.worker.submit(partial(_job_unlink, [old])).addErrback(self._log_job_failure, "remove")
        self._need_sync = True

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
        paths = [self.file_name(i) for i in range(self.read_file_num, self.write_file_num + 1)]
        paths.extend(extra)
        d = self.worker.submit(partial(_job_unlink, paths))
        self.write_file_num += 1
        self.write_pos = 0
        self.read_file_num = self.write_file_num
        self.read_pos = 0
        self._depth = 0
        return d

    # --- depth, empty, delete, close -------------------------------------------------------

    def depth(self) -> int:
        """Messages not yet read (never 0 while unread records remain, whatever the counter)."""
        if self.read_file_num < self.write_file_num or self.read_pos < self.write_pos:
            d = self._depth
            return d if d > 0 else 1
        return 0

    def empty(self) -> Deferred[Any]:
        """Go's Empty(): delete the data files and the metadata, restart in a new file."""
        if self._closed:
            return succeed(None)
        log.info("DISKQUEUE({name}): emptying", name=self.name)
        self._hints.clear()
        self._hints_dirty = False
        d = self._skip_to_next_rw_file(extra=(self._meta_path, self._hint_store.path))
        self._count = 0
        self._need_sync = False
        self._cancel_timer()
        self._synced_seq = self._put_seq
        self.worker._unsynced.pop(id(self), None)
        self._fire_waiters(self._put_seq, None)
        return d

    def delete(self) -> Deferred[Any]:
        """Go's Empty() then Delete(): no file of this queue is left; the queue is done."""
        if self._closed:
            return succeed(None)
        d = self.empty()
        self._closed = True
        self._cancel_timer()
        return d

    def close(self) -> Deferred[Any]:
        """Go's Close(): a final fsync and metadata write; fires when they are on disk."""
        if self._closed:
            return succeed(None)
        log.info("DISKQUEUE({name}): closing", name=self.name)
        self._closed = True
        self._cancel_timer()
        self._close_read_file()
        fd, self._wfd = self._wfd, None
        seq = self._put_seq
        d = self.worker.submit(partial(_job_sync, fd, self._meta_path, self._meta_bytes(),
                                       self._hints_snapshot(force=True), close_fd=True))
        d.addCallbacks(self._sync_done, self._sync_failed, callbackArgs=(seq, False), errbackArgs=(seq,))
        return d

    # --- syncing ---------------------------------------------------------------------------

    def flush_and_sync(self) -> Deferred[Any]:
        """Fires once an fsync covering every message put so far has completed (forces one soon)."""
        return self._wait(force=True)

    def when_synced(self) -> Deferred[Any]:
        """Like :meth:`flush_and_sync`, but waits for the regular schedule."""
        return self._wait(force=False)

    def _wait(self, force: bool) -> Deferred[Any]:
        target = self._put_seq
        if self._synced_seq >= target:
            return succeed(None)
        d: Deferred[Any] = Deferred()
        self._waiters.append((target, d, force))
        if self._closed:
            return d  # the final sync in flight will fire it
        if force:
            self._need_sync = True
            self.worker.wake(self)
        else:
            self._arm_timer()
        return d

    def _meta_bytes(self) -> bytes:
        return format_queue_metadata(self._depth, self.read_file_num, self.read_pos,
                                     self.write_file_num, self.write_pos)

    def _hints_snapshot(self, force: bool = False) -> tuple[DeferredStore, list[tuple[float, bytes]], float] | None:
        if not (self._hints_dirty or force):
            return None
        self._hints_dirty = False
        return (self._hint_store, [(at, mid) for mid, at in self._hints.items()], self.worker.seconds())

    def _after_ops(self) -> None:
        if self._count >= self.sync_every:
            self._need_sync = True
        if self._need_sync:
            self.worker.wake(self)
        elif self._count > 0:
            self._arm_timer()

    def _arm_timer(self) -> None:
        if self._timer is None and self.sync_timeout > 0:
            self._timer = self.worker.call_later(self.sync_timeout, self._on_timer)

    def _cancel_timer(self) -> None:
        t, self._timer = self._timer, None
        if t is not None and t.active():
            t.cancel()

    def _on_timer(self) -> None:
        self._timer = None
        if self._closed:
            return
        if self._count > 0 or self._waiters:
            self._need_sync = True
            self._end_turn()

    def _end_turn(self) -> None:
        if self._closed:
            return
        if self._need_sync or any(force for _, _, force in self._waiters):
            self._start_sync()

    def _start_sync(self) -> None:
        if self._syncing:
            return  # the completion of the one in flight starts the next
        self._need_sync = False
        self._count = 0
        self._cancel_timer()
        seq = self._put_seq
        self._syncing = True
        d = self.worker.submit(partial(_job_sync, self._wfd, self._meta_path, self._meta_bytes(),
                                       self._hints_snapshot()))
        d.addCallbacks(self._sync_done, self._sync_failed, callbackArgs=(seq, True), errbackArgs=(seq,))

    def _sync_done(self, _: Any, seq: int, regular: bool) -> None:
        if regular:
            self._syncing = False
        if seq > self._synced_seq:
            self._synced_seq = seq
        if self._synced_seq >= self._put_seq:
            self.worker._unsynced.pop(id(self), None)
        self.error = None
        self._fire_waiters(seq, None)
        if self._closed or not regular:
            return
        if self._need_sync or any(force for _, _, force in self._waiters):
            self.worker.wake(self)
        elif self._waiters or self._count > 0:
            self._arm_timer()

    def _sync_failed(self, f: Failure, seq: int) -> None:
        self._syncing = False
        self.error = f.value
        log.failure("DISKQUEUE({name}) failed to sync", f, name=self.name)
        self._need_sync = True  # retried on the next operation
        # every waiter fails, also those whose writes came after this sync was submitted:
        # nothing would start another sync for them (a full disk fails it again anyway), and
        # a publisher told E_PUB_FAILED may retry, while one left waiting hangs
        self._fire_waiters(self._put_seq, f)

    def _fire_waiters(self, seq: int, f: Failure | None) -> None:
        if not self._waiters:
            return
        keep: list[tuple[int, Deferred[Any], bool]] = []
        ready: list[tuple[int, Deferred[Any], bool]] = []
        for w in self._waiters:
            (ready if w[0] <= seq else keep).append(w)
        self._waiters = keep
        for _, d, _force in ready:
            if f is None:
                d.callback(None)
            else:
                d.errback(BackendError(f"DISKQUEUE({self.name}) fsync failed - {f.value}"))

    def _log_job_failure(self, f: Failure, what: str) -> None:
        self.error = f.value
        log.failure("DISKQUEUE({name}) {what} failed", f, name=self.name, what=what)


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


def disk_backends(options: Any, worker: SyncWorker, data_path: str | None = None) -> Callable[[str, bool], Any]:
    """The broker's backend factory: a DiskQueue per durable name, a DummyQueue per ephemeral one."""
    from .dummy import DummyQueue

    path = data_path if data_path is not None else (options.data_path or os.getcwd())
    listing = DirListing(path)

    def factory(name: str, ephemeral: bool) -> Any:
        if ephemeral:
            return DummyQueue()
        return DiskQueue(name, path,
                         max_bytes_per_file=options.max_bytes_per_file,
                         max_msg_size=options.max_msg_size,
                         sync_every=options.sync_every,
                         sync_timeout=options.sync_timeout,
                         worker=worker,
                         listing=listing)

    return factory
