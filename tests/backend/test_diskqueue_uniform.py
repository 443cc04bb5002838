"""The uniform-run fast path of DiskQueue.put writes exactly the bytes the general path writes."""

from __future__ import annotations

import os

from nsqtw.backend.disk import DiskQueue, SyncWorker
from nsqtw.backend.runs import run_frames, run_of_frames
from nsqtw.protocol.message import encode_message_frame, requeue_frame


def _frames(n: int, size: int, attempts: int = 1):
    return [encode_message_frame(b"%016x" % i, 1_700_000_000_000_000_000 + i, attempts, bytes([65 + i % 26]) * size)
            for i in range(n)]


class _GeneralOnly(DiskQueue):
    """A DiskQueue whose uniform-run encoder always declines (the general encoder runs)."""

    __slots__ = ()

    def _encode_uniform(self, run):  # type: ignore[no-untyped-def,override]  # a test double
        return None


def _written(tmp_path, name: str, run, general: bool) -> bytes:
    q = (_GeneralOnly if general else DiskQueue)(name, str(tmp_path), worker=SyncWorker(None, threaded=False))
    q.put(run)
    q.close()
    with open(os.path.join(str(tmp_path), f"{name}.diskqueue.000000.dat"), "rb") as f:
        return f.read()


def test_fresh_uniform_run_bytes_match_the_general_path(tmp_path):
    """A fresh MPUB-shaped run (range offsets, attempts 1) is written byte for byte as per record."""
    run = run_of_frames(_frames(50, 200))
    assert isinstance(run[1], range)
    assert _written(tmp_path, "fast", run, False) == _written(tmp_path, "slow", run, True)


def test_redelivered_uniform_run_keeps_its_attempts(tmp_path):
    """Frames already delivered twice are stored with attempts 2 (deliveries so far)."""
    frames = [requeue_frame(requeue_frame(f)) for f in _frames(10, 40)]
    run = run_of_frames(frames)
    data = _written(tmp_path, "fast", run, False)
    assert data == _written(tmp_path, "slow", run, True)
    assert data[4 + 8:4 + 10] == b"\x00\x02"


def test_mixed_attempts_fall_back_to_the_general_path(tmp_path):
    """Different attempts in one run: the general path handles it, bytes identical either way."""
    frames = _frames(6, 30)
    frames[3] = requeue_frame(frames[3])
    run = run_of_frames(frames)
    q = DiskQueue("probe", str(tmp_path), worker=SyncWorker(None, threaded=False))
    assert q._encode_uniform(run) is None
    q.close()
    assert _written(tmp_path, "a", run, False) == _written(tmp_path, "b", run, True)
    assert len(run_frames(run)) == 6


def test_one_timestamp_run_bytes_match_the_general_path(tmp_path):
    """A fresh MPUB shares one timestamp: the one-prefix encoding writes the same bytes."""
    frames = [encode_message_frame(b"%016x" % i, 1_700_000_000_000_000_000, 1, bytes([65 + i % 26]) * 120)
              for i in range(300)]
    run = run_of_frames(frames)
    data = _written(tmp_path, "fast", run, False)
    assert data == _written(tmp_path, "slow", run, True)
    assert len(data) == 300 * (4 + 26 + 120)
