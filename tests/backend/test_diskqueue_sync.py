"""DiskQueue's fsync schedule (go-diskqueue's rules), group commit, and the durability Deferreds."""

from __future__ import annotations

import errno
import os
import threading
from typing import Any
from collections.abc import Callable

import pytest_twisted
from twisted.internet import task
from twisted.internet.defer import Deferred

from nsqtw.backend.disk import DiskQueue, SyncWorker
from nsqtw.errors import BackendError

from dq_helpers import RecordingWorker, frame, open_queue, read_all, run_of


class ManualWorker(SyncWorker):
    """Jobs wait until the test runs them, so 'in flight' can be observed."""

    def __init__(self) -> None:
        super().__init__(None, threaded=False)
        self.queue: list[tuple[Callable[[], Any], Deferred]] = []

    def submit(self, fn):  # type: ignore[override]  # a fake that queues instead of running
        d: Deferred = Deferred()
        self.queue.append((fn, d))
        return d

    def run_next(self) -> str:
        fn, d = self.queue.pop(0)
        d.callback(fn())
        return fn.func.__name__

    def run_all(self) -> list[str]:
        names = []
        while self.queue:
            names.append(self.run_next())
        return names


def test_sync_every_counts_writes(tmp_path):
    """With sync-every=3 the third write triggers the fsync, not the first two."""
    q = open_queue(tmp_path, sync_every=3)
    q.put(run_of([frame(1)]))
    q.put(run_of([frame(2)]))
    assert q.worker.syncs() == 0
    q.put(run_of([frame(3)]))
    assert q.worker.syncs() == 1
    assert (tmp_path / "t.diskqueue.meta.dat").read_bytes().startswith(b"3\n")


def test_sync_every_counts_consumed_reads(tmp_path):
    """Reads count toward sync-every as writes do (go-diskqueue's count++ on both)."""
    q = open_queue(tmp_path, sync_every=3)
    q.put(run_of([frame(1), frame(2)]))
    assert q.worker.syncs() == 0
    q.read(1)
    assert q.worker.syncs() == 1
    assert (tmp_path / "t.diskqueue.meta.dat").read_bytes() == b"1\n0,35\n0,70\n"


def test_empty_resets_the_count(tmp_path):
    """Empty() resets the sync counter."""
    q = open_queue(tmp_path, sync_every=3)
    q.put(run_of([frame(1), frame(2)]))
    q.empty()
    q.put(run_of([frame(3), frame(4)]))
    assert q.worker.syncs() == 0


def test_sync_timeout_only_after_activity():
    """The timeout sync happens sync-timeout after activity, and never on an idle queue."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        clock = task.Clock()
        w = RecordingWorker(clock=clock)
        q = open_queue(d, worker=w, sync_every=1000, sync_timeout=2.0)
        clock.advance(10)
        assert w.syncs() == 0
        q.put(run_of([frame(1)]))
        clock.advance(1.9)
        assert w.syncs() == 0
        clock.advance(0.1)
        assert w.syncs() == 1
        clock.advance(60)
        assert w.syncs() == 1
        assert not clock.getDelayedCalls()


def test_group_commit_one_sync_per_turn(tmp_path):
    """sync-every=1: many writes in one reactor turn share one fsync, submitted at the end of the turn."""
    clock = task.Clock()
    w = RecordingWorker(clock=clock)
    q = open_queue(tmp_path, worker=w, sync_every=1)
    for i in range(50):
        q.put(run_of([frame(i)]))
    assert w.syncs() == 0
    clock.advance(0)
    assert w.syncs() == 1
    assert (tmp_path / "t.diskqueue.meta.dat").read_bytes().startswith(b"50\n")


def test_roll_syncs_old_file_and_metadata(tmp_path):
    """Rolling fsyncs and closes the old file and persists the metadata."""
    q = open_queue(tmp_path, max_bytes_per_file=60)
    q.put(run_of([frame(1), frame(2)]))
    assert q.worker.log[:2] == ["_job_close", "_job_sync"]
    assert (tmp_path / "t.diskqueue.meta.dat").read_bytes() == b"2\n0,0\n1,35\n"


def test_deleting_read_file_syncs(tmp_path):
    """Finishing a completed read file deletes it and then persists the metadata."""
    q = open_queue(tmp_path, max_bytes_per_file=40)
    q.put(run_of([frame(1), frame(2)]))
    q.worker.log.clear()
    q.read(1)
    assert q.worker.log == ["_job_unlink", "_job_sync"]
    assert (tmp_path / "t.diskqueue.meta.dat").read_bytes() == b"1\n1,0\n1,35\n"


def test_flush_and_sync_covers_earlier_writes_only():
    """A Deferred fires only after an fsync submitted after its write; one sync in flight at a time."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        w = ManualWorker()
        q = DiskQueue("t", d, worker=w, sync_every=1000)
        q.put(run_of([frame(1)]))
        d1 = q.flush_and_sync()
        assert [j[0].func.__name__ for j in w.queue] == ["_job_sync"]
        q.put(run_of([frame(2)]))
        d2 = q.flush_and_sync()
        q.put(run_of([frame(3)]))
        d3 = q.flush_and_sync()
        assert len(w.queue) == 1  # the second sync waits for the first
        fired: list[int] = []
        d1.addCallback(lambda _: fired.append(1))
        d2.addCallback(lambda _: fired.append(2))
        d3.addCallback(lambda _: fired.append(3))
        w.run_next()
        assert fired == [1]
        assert len(w.queue) == 1  # one grouped sync for writes 2 and 3
        w.run_next()
        assert fired == [1, 2, 3]
        assert q.flush_and_sync().called


def test_when_synced_waits_for_the_schedule(tmp_path):
    """when_synced() does not force a sync; it fires with the timeout sync."""
    clock = task.Clock()
    w = RecordingWorker(clock=clock)
    q = open_queue(tmp_path, worker=w, sync_every=1000, sync_timeout=2.0)
    q.put(run_of([frame(1)]))
    d = q.when_synced()
    clock.advance(0)
    assert not d.called
    clock.advance(2.0)
    assert d.called and w.syncs() == 1


def test_fsync_failure_errbacks_waiters(tmp_path, monkeypatch):
    """A failing fsync makes the waiting Deferred fail with BackendError (the broker answers E_PUB_FAILED)."""
    q = open_queue(tmp_path, sync_every=1000)
    q.put(run_of([frame(1)]))

    def broken(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", broken)
    failures: list[Any] = []
    q.flush_and_sync().addErrback(failures.append)
    assert failures and failures[0].check(BackendError)
    assert q.error is not None
    monkeypatch.undo()
    ok: list[Any] = []
    q.flush_and_sync().addCallback(ok.append)
    assert ok == [None] and q.error is None


def test_failed_sync_fails_waiters_that_came_while_it_was_in_flight(tmp_path):
    """A waiter added while a sync is in flight must not hang when that sync fails (a full disk):
    nothing else would start a sync for it, so it fails too and its publisher can retry."""
    w = ManualWorker()
    q = DiskQueue("t", str(tmp_path), worker=w, sync_every=1000)
    q.put(run_of([frame(1)]))
    d1 = q.flush_and_sync()
    q.put(run_of([frame(2)]))
    d2 = q.flush_and_sync()
    assert len(w.queue) == 1
    failures: list[Any] = []
    d1.addErrback(failures.append)
    d2.addErrback(failures.append)
    _, job = w.queue.pop(0)
    job.errback(OSError(errno.ENOSPC, "No space left on device"))
    assert len(failures) == 2 and all(f.check(BackendError) for f in failures)
    ok: list[Any] = []
    q.flush_and_sync().addCallback(ok.append)  # a later sync is tried again
    w.run_all()
    assert ok == [None]


def test_data_fsynced_before_metadata(tmp_path, monkeypatch):
    """The data file is fsynced while the metadata still has its old content (never ahead of the data)."""
    q = open_queue(tmp_path, sync_every=1)
    q.put(run_of([frame(1)]))
    seen: list[bytes] = []
    real = os.fsync

    def spy(fd):
        if os.fstat(fd).st_size == 70:  # the data file after the second write
            seen.append((tmp_path / "t.diskqueue.meta.dat").read_bytes())
        return real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    q.put(run_of([frame(2)]))
    assert seen == [b"1\n0,0\n0,35\n"]
    assert (tmp_path / "t.diskqueue.meta.dat").read_bytes() == b"2\n0,0\n0,70\n"


def test_close_syncs(tmp_path):
    """close() runs a final sync and its Deferred fires once it is done."""
    q = open_queue(tmp_path, sync_every=1000)
    q.put(run_of([frame(1)]))
    assert q.worker.syncs() == 0
    d = q.close()
    assert d.called and q.worker.syncs() == 1


@pytest_twisted.ensureDeferred
async def test_threaded_worker_runs_fsync_off_the_reactor_thread(tmp_path, monkeypatch):
    """With the real reactor, fsync runs on the worker thread and the Deferred fires in the reactor."""
    from twisted.internet import reactor

    threads: list[int] = []
    real = os.fsync

    def spy(fd):
        threads.append(threading.get_ident())
        return real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    w = SyncWorker(reactor)
    w.startService()
    try:
        q = DiskQueue("t", str(tmp_path), worker=w, sync_every=1)
        for i in range(20):
            q.put(run_of([frame(i)]))
        await q.flush_and_sync()
        assert threads and threading.get_ident() not in threads
        assert (tmp_path / "t.diskqueue.meta.dat").read_bytes().startswith(b"20\n")
        assert len(read_all(q)) == 20
        await q.close()
        assert (tmp_path / "t.diskqueue.meta.dat").read_bytes().startswith(b"0\n")
    finally:
        w.stopService()


def test_stop_service_runs_queued_jobs(tmp_path):
    """Stopping the worker completes every job already submitted (the final syncs of closing queues)."""
    from twisted.internet import reactor

    w = SyncWorker(reactor)
    w.startService()
    q = DiskQueue("t", str(tmp_path), worker=w, sync_every=1000)
    q.put(run_of([frame(1)]))
    q.close()
    w.stopService()
    assert (tmp_path / "t.diskqueue.meta.dat").read_bytes() == b"1\n0,0\n0,35\n"


def test_flush_and_sync_all_covers_every_queue(tmp_path):
    """The worker-wide barrier waits for every queue with unsynced writes, and only those."""
    clock = task.Clock()
    w = RecordingWorker(clock=clock)
    a = open_queue(tmp_path, "a", worker=w, sync_every=1000)
    b = open_queue(tmp_path, "b", worker=w, sync_every=1000)
    open_queue(tmp_path, "idle", worker=w)
    assert w.flush_and_sync_all().called  # nothing written yet
    a.put(run_of([frame(1)]))
    b.put(run_of([frame(2)]))
    d = w.flush_and_sync_all()
    assert not d.called
    clock.advance(0)
    assert d.called and w.syncs() == 2
    assert w.flush_and_sync_all().called


def test_flush_and_sync_all_fails_with_backend_error(tmp_path, monkeypatch):
    """A failing fsync fails the worker-wide barrier with BackendError (not a FirstError wrapper)."""
    w = RecordingWorker()
    q = open_queue(tmp_path, "a", worker=w, sync_every=1000)
    q.put(run_of([frame(1)]))

    def broken(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken)
    failures: list[Any] = []
    w.flush_and_sync_all().addErrback(failures.append)
    assert failures and failures[0].check(BackendError)
