"""``DiskQueue.snapshot_records``: every record held when it is called, read lazily from the
files as they were then (the catch-up snapshot of a replicated nsqd's disk backlog), however far
the reader goes and whatever files it deletes meanwhile."""

from __future__ import annotations

import os

from nsqtw.backend.disk import DiskQueue, SyncWorker

from dq_helpers import frame, read_all, run_of


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_snapshot_records_are_those_held_when_called_across_files(tmp_path):
    q = DiskQueue("t:c", str(tmp_path), worker=SyncWorker(None, threaded=False), max_bytes_per_file=400)
    for i in range(30):
        assert q.put(run_of([frame(i)])) is None
    assert q.write_file_num >= 2  # several files
    before = open_fds()
    records = q.snapshot_records()
    assert open_fds() > before  # the files are held open from the call...
    # ...so reading everything (which deletes the files read through) and writing more
    # changes nothing the snapshot gives
    assert len(read_all(q)) == 30
    for i in range(30, 35):
        q.put(run_of([frame(i)]))
    got = list(records)
    assert [f for f, _, _ in got] == [frame(i) for i in range(30)]
    assert all(due is None for _, _, due in got)
    assert open_fds() == before + 1  # only the queue's own write file is left open
    q.close()


def test_snapshot_records_start_at_the_read_position_and_close_their_files_when_dropped(tmp_path):
    q = DiskQueue("t:c", str(tmp_path), worker=SyncWorker(None, threaded=False), max_bytes_per_file=400)
    for i in range(20):
        q.put(run_of([frame(i)]))
    assert len(q.read(5)[0][1]) == 5  # five read (in memory or in flight now)
    before = open_fds()
    records = q.snapshot_records()
    first = next(records)
    assert first[0] == frame(5)
    records.close()  # dropped halfway: its files are closed
    assert open_fds() == before
    assert [f for f, _, _ in q.snapshot_records()] == [frame(i) for i in range(5, 20)]
    q.close()
