"""Builders for diskqueue tests: frames and records from the specification, a job-recording worker."""

from __future__ import annotations

import struct
from typing import Any
from collections.abc import Callable

from nsqtw.backend.disk import DiskQueue, SyncWorker
from nsqtw.backend.runs import Run, run_frames
from nsqtw.protocol.message import decode_message

TS0 = 1_700_000_000_000_000_000


def mid(i: int) -> bytes:
    return b"%016x" % i


def record(i: int, body: bytes | None = None, attempts: int = 0, ts: int | None = None) -> bytes:
    """NSQ's message serialization, written out from the spec: ts(8) attempts(2) id(16) body."""
    if body is None:
        body = b"msg-%d" % i
    return struct.pack(">qH", TS0 + i if ts is None else ts, attempts) + mid(i) + body


def entry(rec: bytes) -> bytes:
    """One diskqueue entry: 4-byte big-endian length, then the record."""
    return struct.pack(">i", len(rec)) + rec


def frame_of_record(rec: bytes) -> bytes:
    """The queued MESSAGE frame for a record: attempts = the next delivery's."""
    ts, att = struct.unpack_from(">qH", rec)
    return struct.pack(">iiqH", len(rec) + 4, 2, ts, att + 1) + rec[10:]


def frame(i: int, body: bytes | None = None, attempts: int = 0, ts: int | None = None) -> bytes:
    return frame_of_record(record(i, body, attempts, ts))


def run_of(frames: list[bytes]) -> Run:
    """A run with explicit offsets (does not depend on the run helpers under test)."""
    offs = []
    at = 0
    for f in frames:
        offs.append(at)
        at += len(f)
    return (b"".join(frames), offs, at)


def read_all(q: DiskQueue, batch: int = 1000) -> list[bytes]:
    out: list[bytes] = []
    while True:
        runs = q.read(batch)
        if not runs:
            return out
        for r in runs:
            out.extend(run_frames(r))


def decoded(frames: list[bytes]) -> list[tuple[bytes, int, bytes, int]]:
    """(id, attempts as stored on disk, body, timestamp) per frame."""
    out = []
    for f in frames:
        assert struct.unpack_from(">ii", f) == (len(f) - 4, 2)
        m = decode_message(f[8:])
        out.append((m.id, m.attempts - 1, m.body, m.timestamp))
    return out


class RecordingWorker(SyncWorker):
    """An inline worker that logs each job's name (``_job_sync``, ``_job_close``, ``_job_unlink``)."""

    def __init__(self, clock: Any = None) -> None:
        super().__init__(None, clock=clock, threaded=False)
        self.log: list[str] = []

    def submit(self, fn: Callable[[], Any]):  # type: ignore[override]  # a fake that records job names
        self.log.append(getattr(getattr(fn, "func", fn), "__name__", "?"))
        return super().submit(fn)

    def syncs(self) -> int:
        return self.log.count("_job_sync")


def open_queue(path: Any, name: str = "t", worker: SyncWorker | None = None, **kw: Any) -> DiskQueue:
    kw.setdefault("max_bytes_per_file", 1024 * 1024)
    kw.setdefault("max_msg_size", 1024 * 1024)
    kw.setdefault("sync_every", 2500)
    kw.setdefault("sync_timeout", 2.0)
    return DiskQueue(name, str(path), worker=worker or RecordingWorker(), **kw)
