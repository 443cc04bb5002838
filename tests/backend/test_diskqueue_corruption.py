"""DiskQueue's recovery rules: bad lengths, truncation, missing files, stale metadata, tail corruption."""

from __future__ import annotations

import os
import struct

from dq_helpers import decoded, entry, frame, open_queue, read_all, record, run_of


def ids(frames):
    return [int(m[0], 16) for m in decoded(frames)]


def write_queue(path, name, files, meta):
    for num, data in files.items():
        (path / f"{name}.diskqueue.{num:06d}.dat").write_bytes(data)
    if meta is not None:
        (path / f"{name}.diskqueue.meta.dat").write_bytes(b"%d\n%d,%d\n%d,%d\n" % meta)


def entries(rng):
    return b"".join(entry(record(i)) for i in rng)


def test_bad_length_quarantines_read_file_and_continues(tmp_path):
    """An invalid length renames the read file to .bad and reading goes on with the next file."""
    f0 = entries(range(0, 3)) + struct.pack(">i", 5) + b"junkjunk" + entries(range(50, 52))
    f1 = entries(range(3, 6))
    write_queue(tmp_path, "c", {0: f0, 1: f1}, (8, 0, 0, 1, len(f1)))
    q = open_queue(tmp_path, "c")
    assert ids(read_all(q)) == [0, 1, 2, 3, 4, 5]
    assert (tmp_path / "c.diskqueue.000000.dat.bad").exists()
    assert q.depth() == 0
    assert q.positions()[0] == 0  # depth reset at the tail ("positive depth ... data loss")


def test_oversized_length_is_corruption(tmp_path):
    """A length above max-msg-size + 26 on read is corruption, like one below 26."""
    f0 = entries(range(2)) + struct.pack(">i", 127) + record(9, b"x" * 101)
    f1 = entries(range(2, 3))
    write_queue(tmp_path, "c", {0: f0, 1: f1}, (4, 0, 0, 1, len(f1)))
    q = open_queue(tmp_path, "c", max_msg_size=100)
    assert ids(read_all(q)) == [0, 1, 2]
    assert (tmp_path / "c.diskqueue.000000.dat.bad").exists()


def test_corrupt_write_file_moves_writes_to_new_file(tmp_path):
    """Corruption in the file that is also the write file moves writing to a new file."""
    f0 = entries(range(2)) + struct.pack(">i", 3) + b"zzz"
    write_queue(tmp_path, "c", {0: f0}, (3, 0, 0, 0, len(f0)))
    q = open_queue(tmp_path, "c")
    assert ids(read_all(q)) == [0, 1]
    assert q.positions() == (0, 1, 0, 1, 0)
    q.put(run_of([frame(7)]))
    assert ids(read_all(q)) == [7]
    assert (tmp_path / "c.diskqueue.000000.dat.bad").exists()
    assert (tmp_path / "c.diskqueue.000001.dat").exists()


def test_truncated_completed_file(tmp_path):
    """A partial record at the end of a completed file is quarantined; the next file is read."""
    f0 = entries(range(3)) + entry(record(3))[:-4]
    f1 = entries(range(4, 6))
    write_queue(tmp_path, "c", {0: f0, 1: f1}, (6, 0, 0, 1, len(f1)))
    q = open_queue(tmp_path, "c")
    assert ids(read_all(q)) == [0, 1, 2, 4, 5]
    assert (tmp_path / "c.diskqueue.000000.dat.bad").exists()


def test_write_file_shorter_than_metadata(tmp_path):
    """Metadata claiming more than the write file holds: what exists is read, writes go to a new file."""
    f0 = entries(range(3))
    write_queue(tmp_path, "c", {0: f0}, (5, 0, 0, 0, len(f0) + 80))
    q = open_queue(tmp_path, "c")
    assert q.positions()[3:] == (1, 0)
    assert ids(read_all(q)) == [0, 1, 2]
    assert q.depth() == 0 and q.positions()[0] == 0
    q.put(run_of([frame(9)]))
    assert ids(read_all(q)) == [9]


def test_missing_read_file_is_skipped(tmp_path):
    """A read file that does not exist is skipped; reading continues with the next one."""
    f1 = entries(range(10, 13))
    write_queue(tmp_path, "c", {1: f1}, (6, 0, 40, 1, len(f1)))
    q = open_queue(tmp_path, "c")
    assert ids(read_all(q)) == [10, 11, 12]
    assert q.depth() == 0


def test_stale_metadata_after_crash(tmp_path):
    """writePos behind the real file size: writes skip to a new file, the reader salvages what is past."""
    f0 = entries(range(6))
    stale_wp = len(entries(range(4)))
    write_queue(tmp_path, "c", {0: f0}, (3, 0, len(entries(range(1))), 0, stale_wp))
    q = open_queue(tmp_path, "c")
    assert q.positions()[3:] == (1, 0)
    assert q.depth() == 5  # 3 from the metadata + 2 salvaged
    q.put(run_of([frame(100)]))
    assert ids(read_all(q)) == [1, 2, 3, 4, 5, 100]
    assert not (tmp_path / "c.diskqueue.000000.dat").exists()


def test_written_by_crashed_queue_is_recovered(tmp_path):
    """Writes reach the page cache at once: a queue dropped without close is readable after reopening."""
    q = open_queue(tmp_path, "c", sync_every=1000)
    q.put(run_of([frame(i) for i in range(3)]))
    q.worker.log.clear()
    del q  # no close: the metadata on disk (if any) is stale or missing
    q2 = open_queue(tmp_path, "c")
    assert ids(read_all(q2)) == [0, 1, 2]


def test_roll_without_metadata_update_is_recovered(tmp_path):
    """Files written after a roll whose metadata never reached the disk are found on open."""
    f0 = entries(range(3))
    f1 = entries(range(3, 5))
    write_queue(tmp_path, "c", {0: f0, 1: f1}, (3, 0, 0, 0, len(f0)))
    q = open_queue(tmp_path, "c")
    assert q.positions()[3:] == (2, 0)
    assert q.depth() == 5
    assert ids(read_all(q)) == [0, 1, 2, 3, 4]


def test_missing_metadata_with_data_files(tmp_path):
    """Data files without metadata are recovered (Go would overwrite them), counted into the depth."""
    write_queue(tmp_path, "c", {4: entries(range(2)), 5: entries(range(2, 5))}, None)
    q = open_queue(tmp_path, "c")
    assert q.positions() == (5, 4, 0, 6, 0)
    q.put(run_of([frame(50)]))
    assert ids(read_all(q)) == [0, 1, 2, 3, 4, 50]


def test_unparsable_metadata_is_treated_as_missing(tmp_path):
    """A garbled .meta.dat is logged and the data files are recovered, not overwritten."""
    write_queue(tmp_path, "c", {0: entries(range(2))}, None)
    (tmp_path / "c.diskqueue.meta.dat").write_bytes(b"not metadata")
    q = open_queue(tmp_path, "c")
    assert ids(read_all(q)) == [0, 1]


def test_positive_depth_at_tail_is_reset(tmp_path):
    """Depth != 0 with read == write position is reset to 0 (checkTailCorruption) and persisted."""
    write_queue(tmp_path, "c", {0: entries(range(2))}, (7, 0, 70, 0, 70))
    q = open_queue(tmp_path, "c")
    assert q.depth() == 0
    assert q.positions() == (0, 0, 70, 0, 70)
    q.close()
    assert (tmp_path / "c.diskqueue.meta.dat").read_bytes() == b"0\n0,70\n0,70\n"


def test_read_beyond_write_is_reset_to_next_file(tmp_path):
    """readFileNum > writeFileNum is corruption: skip to a fresh file after both."""
    write_queue(tmp_path, "c", {}, (0, 3, 0, 2, 0))
    q = open_queue(tmp_path, "c")
    assert q.positions() == (0, 3, 0, 3, 0)
    q.put(run_of([frame(1)]))
    assert ids(read_all(q)) == [1]


def test_depth_counter_below_real_count_still_reads_everything(tmp_path):
    """A too-small depth counter (stale metadata) never hides unread records from the reader."""
    f0 = entries(range(5))
    write_queue(tmp_path, "c", {0: f0, 1: b""}, (1, 0, 0, 1, 0))
    q = open_queue(tmp_path, "c")
    assert q.depth() >= 1
    assert ids(read_all(q, batch=1)) == [0, 1, 2, 3, 4]
    assert q.depth() == 0
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".bad")]
