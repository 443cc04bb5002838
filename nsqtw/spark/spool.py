"""
The Spark source's durable spool: numbered, fsynced message records that make offsets replayable.

Layout of a spool directory (one per streaming query, beside its checkpoint)::

    meta.json                      {"topic", "channel", "spool": <uuid>} written once
    committed                      the first sequence number Spark has not committed
    segment-<first seq>.log        records [u32 length][u32 crc32][nsqd message record]
    lock                           flock'ed by the one process using the spool (its pid inside)

Messages are numbered 0, 1, 2... in arrival order; an offset is such a number.
:meth:`Spool.append` writes a batch, fsyncs it (and the directory when it
starts a segment) and only then makes the new end visible and returns, so the
caller may FIN the messages.  :meth:`Spool.commit` records the committed
position and deletes whole segments below it.  :meth:`Spool.open` rebuilds
the index from the files and cuts a torn or corrupt tail (a crash mid-write).
No Spark, no Twisted: a plain thread-safe class.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import struct
import threading
import time
import uuid
import zlib
from array import array
from typing import IO
from collections.abc import Iterator, Sequence

from ..protocol.message import Message, decode_message, encode_message

__all__ = ["Spool", "SpoolError", "DataLossError", "read_range"]

log = logging.getLogger("nsqtw.spark.spool")

_HEAD = struct.Struct(">II")
SEGMENT_PREFIX = "segment-"
SEGMENT_SUFFIX = ".log"


class SpoolError(Exception):
    """The spool directory cannot be used (another topic, locked by another process)."""


class DataLossError(SpoolError):
    """Spark asked for spooled messages that are no longer there."""


def _segment_name(first: int) -> str:
    return f"{SEGMENT_PREFIX}{first:020d}{SEGMENT_SUFFIX}"


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(path) or ".")


def _scan(path: str) -> tuple[array, int]:
    """Byte offsets of the valid records of a segment, and where the valid part ends."""
    offsets = array("Q")
    with open(path, "rb") as f:
        data = f.read()
    pos = 0
    end = len(data)
    while pos + 8 <= end:
        length, crc = _HEAD.unpack_from(data, pos)
        stop = pos + 8 + length
        if length < 26 or stop > end or zlib.crc32(data[pos + 8:stop]) != crc:
            break
        offsets.append(pos)
        pos = stop
    return offsets, pos


def read_range(path: str, start: int, stop: int) -> Iterator[Message]:
    """The records between two byte offsets of a segment (executors call this)."""
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(stop - start)
    pos = 0
    while pos < len(data):
        length, _crc = _HEAD.unpack_from(data, pos)
        yield decode_message(data[pos + 8:pos + 8 + length])
        pos += 8 + length


class _Segment:
    __slots__ = ("first", "path", "offsets", "size")

    def __init__(self, first: int, path: str, offsets: array, size: int) -> None:
        self.first = first
        self.path = path
        self.offsets = offsets
        self.size = size

    @property
    def end(self) -> int:
        return self.first + len(self.offsets)

    def byte_range(self, lo: int, hi: int) -> tuple[int, int]:
        """Byte offsets of records [lo, hi) (sequence numbers inside this segment)."""
        a = self.offsets[lo - self.first]
        b = self.offsets[hi - self.first] if hi < self.end else self.size
        return a, b


class Spool:
    """Append-fsync-publish message log with commit and recovery."""

    def __init__(self, directory: str, topic: str, channel: str, *, segment_bytes: int = 64 * 1024 * 1024,
                 lock_timeout: float = 30.0) -> None:
        self.directory = directory
        self.topic = topic
        self.channel = channel
        self.segment_bytes = segment_bytes
        self._lock = threading.RLock()
        self._segments: list[_Segment] = []
        self._active: IO[bytes] | None = None
        self._lockfile: IO[bytes] | None = None
        self.spool_id = ""
        self.committed = 0
        self._next = 0
        self.truncated_bytes = 0
        self._open(lock_timeout)

    # --- opening and recovery ---------------------------------------------------------

    def _open(self, lock_timeout: float) -> None:
        os.makedirs(self.directory, exist_ok=True)
        self._lockfile = open(os.path.join(self.directory, "lock"), "ab")
        deadline = time.monotonic() + lock_timeout
        while True:
            try:
                fcntl.flock(self._lockfile.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._lockfile.truncate(0)
                self._lockfile.write(b"%d\n" % os.getpid())
                self._lockfile.flush()
                break
            except OSError:
                if time.monotonic() > deadline:
                    self._lockfile.close()
                    raise SpoolError(f"spool {self.directory} is in use by another process") from None
                time.sleep(0.1)
        meta_path = os.path.join(self.directory, "meta.json")
        if os.path.exists(meta_path):
            with open(meta_path, "rb") as f:
                meta = json.load(f)
            if (meta.get("topic"), meta.get("channel")) != (self.topic, self.channel):
                self.close()
                raise SpoolError(f"spool {self.directory} belongs to {meta.get('topic')}/{meta.get('channel')}, "
                                 f"not {self.topic}/{self.channel}")
            self.spool_id = meta["spool"]
        else:
            self.spool_id = uuid.uuid4().hex
            _write_atomic(meta_path, json.dumps({"topic": self.topic, "channel": self.channel,
                                                 "spool": self.spool_id}).encode())
        committed_path = os.path.join(self.directory, "committed")
        if os.path.exists(committed_path):
            with open(committed_path, "rb") as f:
                self.committed = int(f.read().strip() or 0)
        names = sorted(n for n in os.listdir(self.directory)
                       if n.startswith(SEGMENT_PREFIX) and n.endswith(SEGMENT_SUFFIX))
        for name in names:
            first = int(name[len(SEGMENT_PREFIX):-len(SEGMENT_SUFFIX)])
            path = os.path.join(self.directory, name)
            offsets, valid = _scan(path)
            size = os.path.getsize(path)
            if valid < size:
                log.warning("spool %s: cutting %d bytes of torn or corrupt records", path, size - valid)
                self.truncated_bytes += size - valid
                with open(path, "r+b") as f:
                    f.truncate(valid)
                    f.flush()
                    os.fsync(f.fileno())
            if self._segments and first < self._segments[-1].end:
                raise SpoolError(f"spool {self.directory}: overlapping segments at {name}")
            self._segments.append(_Segment(first, path, offsets, valid))
        self._next = max(self.committed, self._segments[-1].end if self._segments else 0)
        self._delete_below(self.committed)

    # --- the consumer's side ---------------------------------------------------------------

    def append(self, messages: Sequence[Message]) -> tuple[int, int]:
        """Write, fsync, then publish; returns the sequence range [first, end) now durable."""
        if not messages:
            return self._next, self._next
        with self._lock:
            seg = self._writable()
            assert self._active is not None
            first = self._next
            pos = seg.size
            new_offsets = array("Q")
            chunks = []
            for m in messages:
                payload = encode_message(m.id, m.timestamp, m.attempts, m.body)
                new_offsets.append(pos)
                chunks.append(_HEAD.pack(len(payload), zlib.crc32(payload)))
                chunks.append(payload)
                pos += 8 + len(payload)
            self._active.write(b"".join(chunks))
            self._active.flush()
            os.fsync(self._active.fileno())
            seg.offsets.extend(new_offsets)
            seg.size = pos
            self._next = seg.end
            return first, self._next

    def _writable(self) -> _Segment:
        seg = self._segments[-1] if self._segments else None
        if seg is None or seg.end != self._next or seg.size >= self.segment_bytes or self._active is None:
            if seg is not None and seg.end == self._next and seg.size < self.segment_bytes:
                self._active = open(seg.path, "ab")
                return seg
            return self._rotate()
        return seg

    def _rotate(self) -> _Segment:
        if self._active is not None:
            self._active.close()
        path = os.path.join(self.directory, _segment_name(self._next))
        self._active = open(path, "ab")
        _fsync_dir(self.directory)
        seg = _Segment(self._next, path, array("Q"), 0)
        self._segments.append(seg)
        return seg

    # --- Spark's side -------------------------------------------------------------------

    @property
    def end(self) -> int:
        """One past the last durable message."""
        with self._lock:
            return self._next

    @property
    def first(self) -> int:
        """The lowest uncommitted sequence number still readable (or the end)."""
        return self.available(self.committed)

    def available(self, start: int) -> int:
        """The first readable sequence number at or after ``start``."""
        with self._lock:
            for seg in self._segments:
                if seg.end > start and seg.end > seg.first:
                    return max(start, seg.first)
            return max(start, self._next)

    def ranges(self, start: int, end: int) -> list[tuple[str, int, int, int, int]]:
        """(path, byte start, byte stop, seq start, seq end) pieces covering [start, end)."""
        out = []
        with self._lock:
            for seg in self._segments:
                lo, hi = max(start, seg.first), min(end, seg.end)
                if lo < hi:
                    a, b = seg.byte_range(lo, hi)
                    out.append((seg.path, a, b, lo, hi))
        return out

    def missing(self, start: int, end: int) -> int:
        """How many of [start, end) are not in the spool (deleted, lost or never written)."""
        have = sum(hi - lo for _p, _a, _b, lo, hi in self.ranges(start, end))
        return (end - start) - have

    def read(self, start: int, end: int) -> Iterator[tuple[int, Message]]:
        for path, a, b, lo, _hi in self.ranges(start, end):
            for i, m in enumerate(read_range(path, a, b)):
                yield lo + i, m

    def advance_to(self, seq: int) -> None:
        """Number new messages from ``seq`` on (the checkpoint is ahead of a lost spool)."""
        with self._lock:
            if seq > self._next:
                log.warning("spool %s: checkpoint at %d is ahead of the spool (%d); continuing from %d",
                            self.directory, seq, self._next, seq)
                self._next = seq
                if self._active is not None:
                    self._active.close()
                    self._active = None

    def commit(self, end: int) -> None:
        """Everything below ``end`` is processed: record it, drop whole segments below it."""
        with self._lock:
            if end <= self.committed:
                return
            self.committed = end
            _write_atomic(os.path.join(self.directory, "committed"), str(end).encode())
            last = self._segments[-1] if self._segments else None
            if last is not None and last.end <= end and last.end > last.first and self._active is not None:
                self._active.close()  # the active segment is all committed: start afresh
                self._active = None
            self._delete_below(end)

    def _delete_below(self, end: int) -> None:
        keep = []
        for seg in self._segments:
            is_tail = seg is self._segments[-1]
            if seg.end <= end and not (is_tail and self._active is not None):
                try:
                    os.unlink(seg.path)
                except FileNotFoundError:
                    pass
            else:
                keep.append(seg)
        if len(keep) != len(self._segments):
            self._segments = keep
            _fsync_dir(self.directory)

    def close(self) -> None:
        with self._lock:
            if self._active is not None:
                self._active.close()
                self._active = None
            if self._lockfile is not None:
                try:
                    fcntl.flock(self._lockfile.fileno(), fcntl.LOCK_UN)
                finally:
                    self._lockfile.close()
                    self._lockfile = None
