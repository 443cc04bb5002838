"""A channel's disk queue keeps what it read until the message is released (issue 24).

A record read from a channel's queue is in flight (or requeued in memory, deferred, held):
the metadata's read position must not pass it until its message is FINed or written to the
queue again, so a ``kill -9`` (here: reopening the directory without closing the queue,
which is what a restart after SIGKILL sees) delivers it again instead of losing it.
"""

from __future__ import annotations

import os

from twisted.internet import task

from nsqtw.backend.disk import DiskQueue, SyncWorker, read_queue_metadata

from dq_helpers import frame, mid, read_all, run_of


def meta(path) -> tuple[int, int, int, int, int]:
    return read_queue_metadata(open(os.path.join(path, "t:c.diskqueue.meta.dat"), "rb").read())


def crash_and_reopen(path, **kw) -> DiskQueue:
    """What a restart after SIGKILL finds: the files as the last sync left them."""
    return DiskQueue("t:c", str(path), worker=SyncWorker(None, threaded=False), pinning=True, **kw)


def test_read_records_stay_until_released(tmp_path):
    clock = task.Clock()
    q = DiskQueue("t:c", str(tmp_path), worker=SyncWorker(None, clock=clock, threaded=False), pinning=True,
                  sync_every=1)
    q.put(run_of([frame(i) for i in range(5)]))
    clock.advance(0)
    assert len(read_all(q)) == 5  # all five in flight
    clock.advance(0)
    assert q.depth() == 0 and q.pinned_count == 5
    assert meta(tmp_path)[:3] == (5, 0, 0)  # the metadata still starts at the first record
    q.release([mid(0), mid(1)])  # FIN of the first two
    q.release([mid(3)])          # FIN out of order: the position waits for mid(2)
    clock.advance(q.sync_timeout)  # a FIN is no disk operation: the next timed sync says it
    depth, rf, rp, _, _ = meta(tmp_path)
    assert (depth, rf) == (3, 0) and rp == 2 * (4 + 26 + len(b"msg-0"))
    again = crash_and_reopen(tmp_path)
    got = [f[18:34] for f in read_all(again)]
    assert got == [mid(2), mid(3), mid(4)]  # mid(3) twice overall (allowed), none lost


def test_without_pinning_a_read_record_is_gone_after_a_crash(tmp_path):
    """The behaviour the pin replaces (and a topic's queue keeps: its reads go to channels)."""
    q = DiskQueue("t:c", str(tmp_path), worker=SyncWorker(None, threaded=False), sync_every=1)
    q.put(run_of([frame(i) for i in range(3)]))
    read_all(q)
    q.flush_and_sync()
    assert read_all(crash_and_reopen(tmp_path)) == []


def test_a_written_back_message_releases_its_old_record(tmp_path):
    clock = task.Clock()
    q = DiskQueue("t:c", str(tmp_path), worker=SyncWorker(None, clock=clock, threaded=False), pinning=True,
                  sync_every=1)
    q.put(run_of([frame(i) for i in range(3)]))
    frames = read_all(q)
    q.put(run_of([frames[0]]))  # a timeout or REQ 0 writes mid(0) back to the tail
    assert q.pinned_count == 2
    q.release([mid(1), mid(2)])
    clock.advance(q.sync_timeout)
    assert meta(tmp_path)[0] == 1  # only the written-back copy is left to read
    assert [f[18:34] for f in read_all(crash_and_reopen(tmp_path))] == [mid(0)]


def test_files_are_deleted_only_once_every_record_in_them_is_released(tmp_path):
    clock = task.Clock()
    size = 4 + 26 + len(b"msg-0")
    q = DiskQueue("t:c", str(tmp_path), worker=SyncWorker(None, clock=clock, threaded=False), pinning=True,
                  sync_every=1, max_bytes_per_file=2 * size)
    q.put(run_of([frame(i) for i in range(6)]))  # files 0, 1, 2 of two records each
    clock.advance(0)
    assert len(read_all(q)) == 6
    clock.advance(0)
    names = lambda: sorted(n for n in os.listdir(tmp_path) if n.endswith(".dat") and "meta" not in n)  # noqa: E731
    assert len(names()) == 3  # every record is still in flight: nothing deleted
    q.release([mid(0), mid(1), mid(2)])
    clock.advance(q.sync_timeout)  # a FIN is no disk operation: the next sync moves on
    assert names() == ["t:c.diskqueue.000001.dat", "t:c.diskqueue.000002.dat"]
    assert meta(tmp_path)[1:3] == (1, size)
    q.release([mid(3), mid(4), mid(5)])
    clock.advance(q.sync_timeout)
    assert names() == ["t:c.diskqueue.000002.dat"]  # the write file stays
    assert meta(tmp_path)[:3] == (0, 2, 2 * size)


def test_a_deferred_requeue_keeps_its_delay_across_a_crash(tmp_path):
    clock = task.Clock()
    clock.advance(1000)
    q = DiskQueue("t:c", str(tmp_path), worker=SyncWorker(None, clock=clock, threaded=False), pinning=True,
                  sync_every=1)
    q.put(run_of([frame(0), frame(1)]))
    clock.advance(0)
    read_all(q)
    q.defer_pinned(mid(0), 1060.0)  # REQ mid(0) 60000
    q.release([mid(1)])
    clock.advance(q.sync_timeout)
    later: list[tuple[float, bytes]] = []
    again = DiskQueue("t:c", str(tmp_path), worker=SyncWorker(None, clock=clock, threaded=False), pinning=True)
    assert again.has_deferred_hints
    again.deferred_sink = lambda at, f: later.append((at, f[18:34]))
    # mid(0) is not delivered early; mid(1), behind it, comes again (a duplicate is allowed)
    assert [f[18:34] for f in read_all(again)] == [mid(1)]
    assert later == [(1060.0, mid(0))]


def test_empty_forgets_the_pins(tmp_path):
    q = DiskQueue("t:c", str(tmp_path), worker=SyncWorker(None, threaded=False), pinning=True, sync_every=1)
    q.put(run_of([frame(i) for i in range(3)]))
    read_all(q)
    q.empty()
    assert q.pinned_count == 0
    q.put(run_of([frame(9)]))
    q.flush_and_sync()
    assert [f[18:34] for f in read_all(crash_and_reopen(tmp_path))] == [mid(9)]


def test_an_id_read_twice_while_pinned_is_released_by_one_fin(tmp_path):
    """Pins are kept per read (one run of records), not per record: an id that is on disk twice
    and read twice (here in one read, then once more in a later one) is released by its one FIN,
    and the metadata moves past every copy."""
    clock = task.Clock()
    q = DiskQueue("t:c", str(tmp_path), worker=SyncWorker(None, clock=clock, threaded=False), pinning=True,
                  sync_every=1)
    q.put(run_of([frame(0), frame(1), frame(0)]))
    assert [f[18:34] for f in read_all(q)] == [mid(0), mid(1), mid(0)]
    q.put(run_of([frame(2), frame(1)]))
    assert [f[18:34] for f in read_all(q)] == [mid(2), mid(1)]
    assert q.pinned_count == 3
    q.release([mid(0)])
    q.release([mid(2), mid(1)])
    assert q.pinned_count == 0
    clock.advance(q.sync_timeout)
    assert meta(tmp_path)[0] == 0
    assert read_all(crash_and_reopen(tmp_path)) == []


def test_fins_across_reads_move_the_position_to_the_oldest_unfinished(tmp_path):
    """FINs in any order over several reads: the metadata points at the oldest record still in
    flight, and a crash redelivers exactly the unfinished ones."""
    clock = task.Clock()
    q = DiskQueue("t:c", str(tmp_path), worker=SyncWorker(None, clock=clock, threaded=False), pinning=True,
                  sync_every=1)
    for i in range(0, 12, 4):
        q.put(run_of([frame(j) for j in range(i, i + 4)]))
    assert len(read_all(q, batch=5)) == 12  # three reads: 5, 5 and 2 records
    q.release([mid(i) for i in (7, 0, 1, 2, 3, 4, 9, 11)])
    clock.advance(q.sync_timeout)
    assert meta(tmp_path)[0] == 7  # mid 5, 6, 8, 10 in flight: from mid 5 on is read again
    assert [f[18:34] for f in read_all(crash_and_reopen(tmp_path))] == \
        [mid(5), mid(6), mid(7), mid(8), mid(9), mid(10), mid(11)]
