"""
The disk queue: go-diskqueue v1.1.0's files, byte for byte, behind :class:`IBackendQueue`.

This module is the queue's policy (opening and recovery, depth, emptying and deletion, when to
sync); the records are written and read in :mod:`.diskio`, the metadata text and the data
path's listing are :mod:`.diskformat`, and the blocking work runs on :mod:`.sync`'s worker.

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
from functools import partial
from itertools import repeat
from typing import Any
from collections.abc import Callable

from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from ..errors import BackendError
from ..protocol.message import MIN_MESSAGE_LENGTH
from . import IBackendQueue
from .deferred_store import DeferredStore
from .diskformat import _DATA_RE_TMPL, DirListing, format_queue_metadata, read_queue_metadata
from .diskio import READ_CHUNK, RecordReader, RecordWriter, _unpack_i32
from .runs import run_frames, run_ids
from .sync import SyncWorker, _inline_worker, _job_sync

__all__ = ["DiskQueue", "SyncWorker", "disk_backends", "read_queue_metadata", "format_queue_metadata"]

log = Logger(namespace="nsqtw.diskqueue")


# --- the queue -------------------------------------------------------------------------------

@implementer(IBackendQueue)
class DiskQueue(RecordWriter, RecordReader):
    """go-diskqueue for one topic or channel (see the module docstring)."""

    # slots: a topic and a channel each hold one, idle or not; an instance dict of 34 names
    # would be 1 KB apiece and 70 references for every full garbage collection to walk
    __slots__ = (  # with QueueFiles' own
        "listing", "data_path", "sync_every", "sync_timeout",
        "_syncing", "_timer", "_synced_seq", "_waiters", "_meta_path", "_file_tmpl", "_released",
    )

    accepts_all = True
    durable = True

    def __init__(self, name: str, data_path: str, *,
                 max_bytes_per_file: int = 100 * 1024 * 1024,
                 max_msg_size: int = 1024 * 1024,
                 sync_every: int = 2500,
                 sync_timeout: float = 2.0,
                 worker: SyncWorker | None = None,
                 deferred_sink: Callable[[float, bytes], None] | None = None,
                 min_msg_size: int = MIN_MESSAGE_LENGTH,
                 listing: DirListing | None = None,
                 pinning: bool = False) -> None:
        self.name = name
        #: a channel's queue: a record read stays on disk until its message is released
        self.pinning = pinning
        self._released = False
        self._pin_q = None
        self._pinned = None
        self._del_from = 0
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
        #: sync waiters; an empty tuple until the first one (an idle queue allocates nothing)
        self._waiters: list[tuple[int, Deferred[Any], bool]] | tuple[()] = ()
        self._closed = False

        self._meta_path = os.path.join(data_path, f"{name}.diskqueue.meta.dat")
        self._file_tmpl = os.path.join(data_path, f"{name}.diskqueue.%06d.dat")
        self._hints: dict[bytes, float] = {}
        self._hints_dirty = False

        self._open()
        #: what this queue holds from before the open may repeat a message (a crash re-reads
        #: what was in flight, beside copies written back later): true until it was all read
        self.may_repeat = self.pinning and (self.read_file_num < self.write_file_num or self.read_pos < self.write_pos)
        if self._del_from < self.read_file_num and not self._pin_q:
            self._del_from = self.read_file_num

    # --- names and introspection ---------------------------------------------------------

    def file_name(self, num: int) -> str:
        return self._file_tmpl % num

    @property
    def has_deferred_hints(self) -> bool:
        """True if records read back may still be deferred (hints loaded from the sidecar):
        only then does the queue need a ``deferred_sink``."""
        return bool(self._hints)

    def _hint_store(self) -> DeferredStore:
        """The deferral-hint sidecar (made when needed: a path, no state)."""
        return DeferredStore.for_queue(self.data_path, self.name)

    def positions(self) -> tuple[int, int, int, int, int]:
        """``(depth, readFileNum, readPos, writeFileNum, writePos)`` as the metadata would say."""
        return self._depth, self.read_file_num, self.read_pos, self.write_file_num, self.write_pos

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def put_count(self) -> int:
        """Messages written since the queue was opened (tells how much of a failed ``put``
        was stored, see :mod:`nsqtw.nsqd.core.backlog`)."""
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
        for at, mid in self._hint_store().load():
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
        d = self._skip_to_next_rw_file(extra=(self._meta_path, self._hint_store().path))  # clears pins
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
        if not (self._count or self._need_sync or self._released or self._hints_dirty or self._waiters
                or self._put_seq != self._synced_seq or self._pin_q):
            # nothing happened since the last sync wrote the metadata (or, for a queue never
            # written, there is nothing to say): a stop costs what must be written, so 10,000
            # idle topics stop in a moment instead of 20,000 metadata rewrites
            self._hand_off_write_fd(sync=False)
            return succeed(None)
        fd, self._wfd = self._wfd, None
        seq = self._put_seq
        meta, commit_file = self._meta_and_commit()
        d = self.worker.submit(partial(_job_sync, fd, self._meta_path, meta,
                                       self._hints_snapshot(force=True), close_fd=True))
        d.addCallbacks(self._sync_done, self._sync_failed, callbackArgs=(seq, False), errbackArgs=(seq,))
        self._submit_deletions(commit_file)
        return d

    # --- records kept until released (a channel's in-flight messages) -------------------

    def release(self, ids: Any) -> None:
        """The messages ``ids`` were finished (FIN): the records they were read from need not
        be read again after a crash.  The metadata's read position only ever passes records
        whose messages were released, by FIN or by being written to this queue again (a
        requeue, a timeout, a clean stop's flush: :meth:`put` releases those itself), so a
        ``kill -9`` loses nothing that was read from the disk and is still in flight,
        requeued in memory, deferred or held; it may deliver some of those twice."""
        pinned = self._pinned
        if not pinned:
            return
        runs = list(map(pinned.pop, ids, repeat(None)))  # C loops: the FIN batch's ids at once
        if not runs:
            return
        first = runs[0]
        q = self._pin_q
        if first is not None and runs.count(first) == len(runs):
            first.left -= len(runs)  # the usual batch: every id from one read
            moved = q is not None and bool(q) and q[0] is first
        else:
            for run in runs:
                if run is not None:
                    run.left -= 1
            moved = q is not None and bool(q) and q[0] in runs
        if moved:  # the oldest read's records: the committed position may move
            self._advance_pins()
            # the metadata moves on with the next sync (at the latest --sync-timeout from now:
            # no sync of its own, a FIN is no disk operation); read files go after it
            self._released = True
            self._arm_timer()

    def _release_run(self, run: Any) -> None:
        self.release(run_ids(run_frames(run)))

    def defer_pinned(self, mid: bytes, deliver_at: float) -> None:
        """A message read from this queue and still pinned was requeued with a delay: if a
        crash makes the queue read its record again, it waits until ``deliver_at`` (the
        deferral hint is saved with the next sync)."""
        if self._pinned and mid in self._pinned:
            self._hints[mid] = deliver_at
            self._hints_dirty = True
            self._arm_timer()

    @property
    def pinned_count(self) -> int:
        """Messages read and not yet released."""
        return len(self._pinned) if self._pinned else 0

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
        waiters = self._waiters
        if not isinstance(waiters, list):
            waiters = self._waiters = []
        waiters.append((target, d, force))
        if self._closed:
            return d  # the final sync in flight will fire it
        if force:
            self._need_sync = True
            self.worker.wake(self)
        else:
            self._arm_timer()
        return d

    def _meta_and_commit(self) -> tuple[bytes, int]:
        """The metadata to write (its read position the committed one) and the committed file."""
        depth, rf, rp = self._committed()
        return format_queue_metadata(depth, rf, rp, self.write_file_num, self.write_pos), rf

    def _hints_snapshot(self, force: bool = False) -> tuple[DeferredStore, list[tuple[float, bytes]], float] | None:
        if not (self._hints_dirty or force):
            return None
        self._hints_dirty = False
        return (self._hint_store(), [(at, mid) for mid, at in self._hints.items()], self.worker.seconds())

    def _after_ops(self) -> None:
        if self._count >= self.sync_every:
            self._need_sync = True
        if self._need_sync:
            self.worker.wake(self)
        elif self._count > 0 and self._timer is None:
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
        if self._count > 0 or self._waiters or self._released:
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
        self._released = False
        self._count = 0
        self._cancel_timer()
        seq = self._put_seq
        self._syncing = True
        meta, commit_file = self._meta_and_commit()
        d = self.worker.submit(partial(_job_sync, self._wfd, self._meta_path, meta,
                                       self._hints_snapshot()))
        d.addCallbacks(self._sync_done, self._sync_failed, callbackArgs=(seq, True), errbackArgs=(seq,))
        self._submit_deletions(commit_file)

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
        self._waiters = keep or ()
        for _, d, _force in ready:
            if f is None:
                d.callback(None)
            else:
                d.errback(BackendError(f"DISKQUEUE({self.name}) fsync failed - {f.value}"))

    def _log_job_failure(self, f: Failure, what: str) -> None:
        self.error = f.value
        log.failure("DISKQUEUE({name}) {what} failed", f, name=self.name, what=what)


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
                         listing=listing,
                         pinning=":" in name)  # a channel's: its reads are in flight

    return factory
