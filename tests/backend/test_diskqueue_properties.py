"""Property: any interleaving of puts, reads and restarts reads back exactly what was put, in order."""

from __future__ import annotations

import shutil
import tempfile
from collections import deque
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from nsqtw.backend.runs import run_frames

from dq_helpers import frame, open_queue, run_of

ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.lists(st.binary(max_size=120), min_size=1, max_size=8)),
        st.tuples(st.just("read"), st.integers(min_value=1, max_value=10)),
        st.tuples(st.just("reopen"), st.none()),
    ),
    max_size=40,
)


def _no_fsync(fn):
    """fsync is not what these properties check; skipping it keeps them fast on slow disks."""
    import functools

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        with mock.patch("os.fsync", lambda fd: None):
            return fn(*a, **kw)
    return wrapper


@settings(max_examples=150, deadline=None)
@given(ops=ops, max_bytes=st.integers(min_value=40, max_value=600), sync_every=st.integers(1, 5))
@_no_fsync
def test_round_trip_across_rolls_and_restarts(ops, max_bytes, sync_every):
    """The queue behaves as a FIFO of frames, whatever the file size, sync setting and restarts."""
    path = tempfile.mkdtemp()
    try:
        kw = dict(max_bytes_per_file=max_bytes, max_msg_size=200, sync_every=sync_every)
        q = open_queue(path, **kw)
        model: deque = deque()
        seq = 0
        for op, arg in ops:
            if op == "put":
                frames = []
                for body in arg:
                    frames.append(frame(seq, body, attempts=seq % 4))
                    seq += 1
                q.put(run_of(frames))
                model.extend(frames)
            elif op == "read":
                got = [f for r in q.read(arg) for f in run_frames(r)]
                want = [model.popleft() for _ in range(min(arg, len(model)))]
                assert got == want
            else:
                q.close()
                q = open_queue(path, **kw)
            assert q.depth() == len(model)
        rest = [f for r in q.read(10 ** 6) for f in run_frames(r)]
        assert rest == list(model)
        q.close()
    finally:
        shutil.rmtree(path)


def _crash(q) -> None:
    """kill -9: descriptors vanish, nothing is synced or persisted (the page cache survives)."""
    import os
    q._close_read_file()
    if q._wfd is not None:
        os.close(q._wfd)
        q._wfd = None


@settings(max_examples=150, deadline=None)
@given(ops=ops, max_bytes=st.integers(min_value=40, max_value=600), sync_every=st.integers(1, 7))
@_no_fsync
def test_crash_loses_nothing_written(ops, max_bytes, sync_every):
    """After a crash at any point, every unread message comes back, in order (earlier ones may repeat)."""
    path = tempfile.mkdtemp()
    try:
        kw = dict(max_bytes_per_file=max_bytes, max_msg_size=200, sync_every=sync_every)
        q = open_queue(path, **kw)
        model: deque = deque()
        put_all = []
        seq = 0
        for op, arg in ops:
            if op == "put":
                frames = [frame(seq + k, body) for k, body in enumerate(arg)]
                seq += len(arg)
                q.put(run_of(frames))
                model.extend(frames)
                put_all.extend(frames)
            elif op == "read":
                for r in q.read(arg):
                    for _ in run_frames(r):
                        model.popleft()
            else:
                _crash(q)
                q = open_queue(path, **kw)
                got = [f for r in q.read(10 ** 6) for f in run_frames(r)]
                if model:
                    assert got[len(got) - len(model):] == list(model)
                assert set(got) <= set(put_all)
                # a restart may replay messages already read: the model becomes what came back
                model = deque(got)
                q.close()
                q = open_queue(path, **kw)
                for f in model:
                    q.put(run_of([f]))
        _crash(q)
        q = open_queue(path, **kw)
        got = [f for r in q.read(10 ** 6) for f in run_frames(r)]
        if model:
            assert got[len(got) - len(model):] == list(model)
        assert set(got) <= set(put_all)
        q.close()
    finally:
        shutil.rmtree(path)
