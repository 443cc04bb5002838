"""DiskQueue against go-diskqueue v1.1.0's byte format: data files, metadata, rolling, deletion."""

from __future__ import annotations

import os

import pytest

from zope.interface.verify import verifyObject

from nsqtw.backend import IBackendQueue
from nsqtw.backend.disk import format_queue_metadata, read_queue_metadata
from nsqtw.backend.runs import run_frames
from nsqtw.errors import BackendError, Exiting

from dq_helpers import decoded, entry, frame, open_queue, read_all, record, run_of


def files(path):
    return sorted(os.listdir(path))


def test_provides_interface(tmp_path):
    """DiskQueue provides IBackendQueue."""
    q = open_queue(tmp_path)
    assert verifyObject(IBackendQueue, q)


def test_written_bytes_match_the_specification(tmp_path):
    """Three puts give [4-byte BE length][record] entries with attempts decremented, and Go's metadata text."""
    q = open_queue(tmp_path, "orders")
    q.put(run_of([frame(1, attempts=0)]))
    q.put(run_of([frame(2, b"x" * 300, attempts=2), frame(3, b"", attempts=0)]))
    q.close()
    want = entry(record(1, attempts=0)) + entry(record(2, b"x" * 300, attempts=2)) + entry(record(3, b"", attempts=0))
    assert (tmp_path / "orders.diskqueue.000000.dat").read_bytes() == want
    assert (tmp_path / "orders.diskqueue.meta.dat").read_bytes() == b"3\n0,0\n0,%d\n" % len(want)
    assert files(tmp_path) == ["orders.diskqueue.000000.dat", "orders.diskqueue.meta.dat"]


def test_frame_attempts_become_deliveries_so_far(tmp_path):
    """A never-delivered message (next delivery 1) is stored with attempts 0, as Go writes it."""
    q = open_queue(tmp_path)
    f = frame(7)  # record attempts 0 -> frame attempts 1
    assert f[16:18] == b"\x00\x01"
    q.put(run_of([f]))
    data = (tmp_path / "t.diskqueue.000000.dat").read_bytes()
    assert data[4 + 8:4 + 10] == b"\x00\x00"


def test_reads_hand_built_files(tmp_path):
    """Files written from the spec by hand are read back in order, as frames with attempts + 1."""
    recs = [record(i, b"body-%d" % i, attempts=i % 3) for i in range(10)]
    f0 = b"".join(entry(r) for r in recs[:6])
    f1 = b"".join(entry(r) for r in recs[6:])
    (tmp_path / "h.diskqueue.000000.dat").write_bytes(f0)
    (tmp_path / "h.diskqueue.000001.dat").write_bytes(f1)
    (tmp_path / "h.diskqueue.meta.dat").write_bytes(b"10\n0,0\n1,%d\n" % len(f1))
    q = open_queue(tmp_path, "h")
    assert q.depth() == 10
    frames = read_all(q, batch=4)
    assert [(m[0], m[1], m[2]) for m in decoded(frames)] == [
        (b"%016x" % i, i % 3, b"body-%d" % i) for i in range(10)]
    assert frames[0][16:18] == b"\x00\x01"
    assert q.depth() == 0


def test_metadata_text_helpers():
    """The .meta.dat text is exactly "%d\\n%d,%d\\n%d,%d\\n" and parses back."""
    assert format_queue_metadata(12, 0, 1048, 1, 2096) == b"12\n0,1048\n1,2096\n"
    assert read_queue_metadata(b"12\n0,1048\n1,2096\n") == (12, 0, 1048, 1, 2096)
    assert read_queue_metadata(b"-3\n4,5\n6,7") == (-3, 4, 5, 6, 7)
    with pytest.raises(ValueError):
        read_queue_metadata(b"garbage")


def test_metadata_written_atomically_without_leftovers(tmp_path):
    """A sync leaves exactly the metadata file (the tmp file was renamed over it)."""
    q = open_queue(tmp_path, sync_every=1)
    q.put(run_of([frame(1)]))
    assert (tmp_path / "t.diskqueue.meta.dat").read_bytes() == b"1\n0,0\n0,%d\n" % (4 + 26 + 5)
    assert not [f for f in files(tmp_path) if f.endswith(".tmp")]


def test_close_of_unused_queue_writes_nothing(tmp_path):
    """Go's Close() persists metadata even for a queue that never stored anything; nsqtw's
    skips what would say nothing new (a stop of 10,000 idle topics would otherwise rewrite
    20,000 files).  Go's nsqd treats the missing file as a new queue, as nsqtw does."""
    q = open_queue(tmp_path, "idle")
    q.close()
    assert not (tmp_path / "idle.diskqueue.meta.dat").exists()
    with pytest.raises(Exiting):
        q.put(run_of([frame(1)]))
    again = open_queue(tmp_path, "idle")
    assert again.positions() == (0, 0, 0, 0, 0)


def test_close_after_a_sync_with_nothing_new_rewrites_nothing(tmp_path):
    q = open_queue(tmp_path, "q")
    q.put(run_of([frame(1)]))
    q.flush_and_sync()
    meta = tmp_path / "q.diskqueue.meta.dat"
    before = meta.stat().st_mtime_ns
    os.utime(meta, ns=(before - 10**9, before - 10**9))
    q.close()
    assert meta.stat().st_mtime_ns == before - 10**9  # not rewritten
    assert open_queue(tmp_path, "q").positions() == (1, 0, 0, 0, 4 + 26 + len(b"msg-1"))


def test_channel_queue_name(tmp_path):
    """A channel's queue is named <topic>:<channel>."""
    q = open_queue(tmp_path, "orders:billing")
    q.put(run_of([frame(1)]))
    q.close()
    assert files(tmp_path) == ["orders:billing.diskqueue.000000.dat", "orders:billing.diskqueue.meta.dat"]


def test_roll_before_exceeding_max_bytes(tmp_path):
    """A write that would push a non-empty file past max-bytes-per-file starts the next file."""
    rec_len = 4 + 26 + 10  # entry size for a 10-byte body
    q = open_queue(tmp_path, max_bytes_per_file=3 * rec_len + 5)
    q.put(run_of([frame(i, b"%010d" % i) for i in range(7)]))
    q.close()
    sizes = [os.path.getsize(tmp_path / f"t.diskqueue.{n:06d}.dat") for n in range(3)]
    assert sizes == [3 * rec_len, 3 * rec_len, rec_len]
    assert (tmp_path / "t.diskqueue.meta.dat").read_bytes() == b"7\n0,0\n2,%d\n" % rec_len


def test_exact_fit_does_not_roll(tmp_path):
    """Filling a file to exactly max-bytes-per-file stays in that file (roll only when exceeding)."""
    rec_len = 4 + 26 + 10
    q = open_queue(tmp_path, max_bytes_per_file=2 * rec_len)
    q.put(run_of([frame(1, b"a" * 10), frame(2, b"b" * 10)]))
    assert q.positions()[3:] == (0, 2 * rec_len)
    q.put(run_of([frame(3, b"c" * 10)]))
    assert q.positions()[3:] == (1, rec_len)


def test_oversized_record_gets_its_own_file(tmp_path):
    """A record bigger than max-bytes-per-file is written alone (writePos 0 never rolls)."""
    q = open_queue(tmp_path, max_bytes_per_file=100)
    q.put(run_of([frame(1, b"s"), frame(2, b"L" * 500), frame(3, b"s")]))
    q.close()
    assert os.path.getsize(tmp_path / "t.diskqueue.000001.dat") == 4 + 26 + 500
    assert [m[2] for m in decoded(read_all(open_queue(tmp_path)))] == [b"s", b"L" * 500, b"s"]


def test_write_size_bounds(tmp_path):
    """A body over max-msg-size is refused before anything of the run is written."""
    q = open_queue(tmp_path, max_msg_size=100)
    q.put(run_of([frame(1, b"x" * 100)]))  # record 126 = max_msg_size + 26: allowed
    with pytest.raises(BackendError):
        q.put(run_of([frame(2, b"ok"), frame(3, b"x" * 101)]))
    assert q.depth() == 1
    assert [m[2] for m in decoded(read_all(q))] == [b"x" * 100]


def test_fully_read_file_is_deleted(tmp_path):
    """Reading past the end of a completed file deletes it and records the new read file."""
    rec_len = 4 + 26 + 10
    q = open_queue(tmp_path, max_bytes_per_file=2 * rec_len)
    q.put(run_of([frame(i, b"%010d" % i) for i in range(5)]))
    assert files(tmp_path)[:3] == ["t.diskqueue.000000.dat", "t.diskqueue.000001.dat", "t.diskqueue.000002.dat"]
    got = read_all(q, batch=1)
    assert len(got) == 5
    q.close()
    assert files(tmp_path) == ["t.diskqueue.000002.dat", "t.diskqueue.meta.dat"]
    assert (tmp_path / "t.diskqueue.meta.dat").read_bytes() == b"0\n2,%d\n2,%d\n" % (rec_len, rec_len)


def test_current_write_file_survives_reading_to_the_end(tmp_path):
    """Catching up with the writer keeps the write file; later writes are read from it."""
    q = open_queue(tmp_path)
    q.put(run_of([frame(1)]))
    assert len(read_all(q)) == 1
    assert q.depth() == 0
    q.put(run_of([frame(2)]))
    assert [m[0] for m in decoded(read_all(q))] == [b"%016x" % 2]
    assert "t.diskqueue.000000.dat" in files(tmp_path)


def test_reader_follows_writer_across_roll(tmp_path):
    """A reader that caught up in file 0 moves on (and deletes it) after the writer rolled."""
    rec_len = 4 + 26 + 10
    q = open_queue(tmp_path, max_bytes_per_file=2 * rec_len)
    q.put(run_of([frame(1, b"a" * 10), frame(2, b"b" * 10)]))
    assert len(q.read(10)[0][1]) == 2
    q.put(run_of([frame(3, b"c" * 10)]))  # rolls to file 1
    assert [m[2] for m in decoded(read_all(q))] == [b"c" * 10]
    assert "t.diskqueue.000000.dat" not in files(tmp_path)
    assert not [f for f in files(tmp_path) if f.endswith(".bad")]


def test_read_n_limits_and_keeps_order(tmp_path):
    """read(n) returns at most n messages, in order, across calls and files."""
    q = open_queue(tmp_path, max_bytes_per_file=200)
    q.put(run_of([frame(i) for i in range(20)]))
    seen = []
    while q.depth():
        runs = q.read(3)
        assert 1 <= sum(len(r[1]) for r in runs) <= 3
        for r in runs:
            seen.extend(run_frames(r))
    assert [m[0] for m in decoded(seen)] == [b"%016x" % i for i in range(20)]


def test_read_order_exact(tmp_path):
    """Mixed sizes come back byte-identical (frames as put) and in order."""
    q = open_queue(tmp_path, max_bytes_per_file=300)
    frames = [frame(i, b"z" * (i * 7 % 50)) for i in range(40)]
    for k in range(0, 40, 5):
        q.put(run_of(frames[k:k + 5]))
    assert q.depth() == 40
    out = []
    for n in (1, 2, 3, 7, 100):
        for r in q.read(n):
            out.extend(run_frames(r))
    assert out == frames


def test_reopen_continues_where_it_stopped(tmp_path):
    """Close then reopen: reading resumes at the read position and writing appends."""
    q = open_queue(tmp_path, max_bytes_per_file=250)
    q.put(run_of([frame(i) for i in range(10)]))
    assert sum(len(r[1]) for r in q.read(4)) == 4
    q.close()
    q = open_queue(tmp_path, max_bytes_per_file=250)
    assert q.depth() == 6
    q.put(run_of([frame(i) for i in range(10, 12)]))
    ids = [m[0] for m in decoded(read_all(q))]
    assert ids == [b"%016x" % i for i in range(4, 12)]


def test_empty_deletes_files_and_restarts_in_next_file(tmp_path):
    """Empty() removes data files readFileNum..writeFileNum and the metadata; writeFileNum+1, positions 0."""
    q = open_queue(tmp_path, max_bytes_per_file=200)
    q.put(run_of([frame(i) for i in range(12)]))
    q.close()
    q = open_queue(tmp_path, max_bytes_per_file=200)
    wf = q.positions()[3]
    q.empty()
    assert files(tmp_path) == []
    assert q.positions() == (0, wf + 1, 0, wf + 1, 0)
    assert q.depth() == 0 and q.read(10) == []
    q.put(run_of([frame(99)]))
    assert [m[0] for m in decoded(read_all(q))] == [b"%016x" % 99]
    q.close()
    assert (tmp_path / "t.diskqueue.meta.dat").read_bytes() == b"0\n%d,%d\n%d,%d\n" % (wf + 1, 36, wf + 1, 36)


def test_delete_leaves_no_file(tmp_path):
    """delete() (Go's Empty then Delete) leaves nothing of the queue and refuses further puts."""
    q = open_queue(tmp_path, sync_every=1)
    q.put(run_of([frame(1)]))
    q.put_deferred([(1e12, frame(2))])
    q.delete()
    assert files(tmp_path) == []
    with pytest.raises(Exiting):
        q.put(run_of([frame(3)]))
    assert q.read(1) == []


def test_rolled_files_are_closed(tmp_path):
    """Rolling hands the old descriptor to the worker (fsync + close); no descriptors leak."""
    before = len(os.listdir("/proc/self/fd"))
    q = open_queue(tmp_path, max_bytes_per_file=100)
    for i in range(30):
        q.put(run_of([frame(i, b"p" * 20)]))
    read_all(q)
    q.close()
    assert len(os.listdir("/proc/self/fd")) == before
    assert q.worker.log.count("_job_close") >= 10
