"""The streaming source's spool: fsync-then-publish appends, commit, recovery of a torn tail, locking."""

from __future__ import annotations

import os

import pytest

from nsqtw.protocol.message import Message
from nsqtw.spark.spool import DataLossError, Spool, SpoolError  # noqa: F401


def _msgs(start: int, n: int) -> list:
    return [Message(b"%016x" % i, 1_700_000_000_000_000_000 + i, 1, b"body-%d" % i) for i in range(start, start + n)]


def _bodies(spool: Spool, a: int, b: int) -> list:
    return [m.body for _seq, m in spool.read(a, b)]


def test_append_read_ranges(tmp_path) -> None:
    """Appends number messages 0.. in order; any range reads back exactly, across segments."""
    s = Spool(str(tmp_path), "t", "c", segment_bytes=100)
    assert s.append(_msgs(0, 3)) == (0, 3)
    assert s.append(_msgs(3, 4)) == (3, 7)
    assert s.end == 7 and s.first == 0
    assert _bodies(s, 2, 6) == [b"body-2", b"body-3", b"body-4", b"body-5"]
    assert len({p for p, *_ in s.ranges(0, 7)}) >= 2  # rotated past 100 bytes
    got = [(seq, m.id, m.timestamp, m.attempts) for seq, m in s.read(0, 7)]
    assert got[5] == (5, b"%016x" % 5, 1_700_000_000_000_000_005, 1)
    s.close()


def test_commit_deletes_whole_segments_and_survives_reopen(tmp_path) -> None:
    """commit(end) persists; segments fully below it go; reopening resumes numbering after the end."""
    s = Spool(str(tmp_path), "t", "c", segment_bytes=100)
    s.append(_msgs(0, 10))
    s.append(_msgs(10, 10))
    files_before = len([n for n in os.listdir(tmp_path) if n.startswith("segment-")])
    s.commit(15)
    files_after = len([n for n in os.listdir(tmp_path) if n.startswith("segment-")])
    assert files_after < files_before
    assert _bodies(s, 15, 20) == [b"body-%d" % i for i in range(15, 20)]
    s.commit(20)  # everything committed: the active segment is closed and deleted
    assert not [n for n in os.listdir(tmp_path) if n.startswith("segment-")]
    s.close()
    s2 = Spool(str(tmp_path), "t", "c")
    assert (s2.committed, s2.end, s2.first) == (20, 20, 20)
    assert s2.append(_msgs(20, 2)) == (20, 22)
    s2.close()


def test_recovery_cuts_torn_and_corrupt_tail(tmp_path) -> None:
    """A crash mid-write leaves a torn record: reopening cuts it and keeps every complete one."""
    s = Spool(str(tmp_path), "t", "c")
    s.append(_msgs(0, 5))
    s.close()
    seg = [tmp_path / n for n in os.listdir(tmp_path) if n.startswith("segment-")][0]
    good = seg.read_bytes()
    seg.write_bytes(good + good[:20])  # half a record
    s = Spool(str(tmp_path), "t", "c")
    assert s.end == 5 and s.truncated_bytes == 20 and seg.read_bytes() == good
    assert s.append(_msgs(5, 1)) == (5, 6)
    s.close()
    data = bytearray(seg.read_bytes())
    data[-3] ^= 0xFF  # flip a bit in the last body: crc mismatch
    seg.write_bytes(bytes(data))
    s = Spool(str(tmp_path), "t", "c")
    assert s.end == 5 and _bodies(s, 0, 5)[-1] == b"body-4"
    s.close()


def test_missing_and_advance(tmp_path) -> None:
    """Ranges not in the spool are reported missing; advance_to renumbers after a lost spool."""
    s = Spool(str(tmp_path), "t", "c")
    s.append(_msgs(0, 4))
    assert s.missing(0, 4) == 0 and s.missing(2, 9) == 5
    s.advance_to(100)
    assert s.append(_msgs(0, 2)) == (100, 102)
    assert s.missing(0, 102) == 96 and _bodies(s, 0, 102) == [b"body-0", b"body-1", b"body-2", b"body-3",
                                                              b"body-0", b"body-1"]
    s.close()


def test_one_user_and_one_topic_per_spool(tmp_path) -> None:
    """A spool is locked by its process and bound to its topic/channel."""
    s = Spool(str(tmp_path), "t", "c")
    with pytest.raises(SpoolError, match="in use"):
        Spool(str(tmp_path), "t", "c", lock_timeout=0.2)
    s.close()
    with pytest.raises(SpoolError, match="belongs to t/c"):
        Spool(str(tmp_path), "other", "c")
    Spool(str(tmp_path), "t", "c").close()
