"""The deferral sidecar: delays survive restart and overflow while the data files stay Go's format."""

from __future__ import annotations

import os
import struct

import pytest
from twisted.internet import task

from nsqtw.backend.deferred_store import DeferredStore, HintError, decode_hints, encode_hints

from dq_helpers import RecordingWorker, decoded, frame, mid, open_queue, read_all, run_of

T0 = 1_000_000.0


def clocked(tmp_path, now=T0, **kw):
    clock = task.Clock()
    clock.advance(now)
    q = open_queue(tmp_path, "t:c", worker=RecordingWorker(clock=clock), **kw)
    return q, clock


def test_hint_file_round_trip():
    """Hints encode to the documented layout and decode back."""
    hints = [(T0 + 1.5, mid(1)), (T0 + 3600, mid(2))]
    data = encode_hints(hints)
    assert data[:8] == b"NSQTWDQD" and struct.unpack_from(">II", data, 8) == (1, 2)
    assert len(data) == 16 + 2 * 24 + 4
    assert decode_hints(data) == hints


def test_damaged_hint_file_is_ignored(tmp_path):
    """A damaged sidecar loses only the delays: load() warns and returns nothing."""
    data = bytearray(encode_hints([(T0, mid(1))]))
    data[20] ^= 0xFF
    with pytest.raises(HintError):
        decode_hints(bytes(data))
    store = DeferredStore(str(tmp_path / "x.diskqueue.deferred.dat"))
    (tmp_path / "x.diskqueue.deferred.dat").write_bytes(bytes(data))
    warnings = []
    assert store.load(warn=warnings.append) == []
    assert warnings and "checksum" in warnings[0]


def test_save_prunes_expired_and_removes_when_empty(tmp_path):
    """Hints already due are not saved; saving none removes the file."""
    store = DeferredStore.for_queue(str(tmp_path), "t:c")
    assert store.save([(T0 - 1, mid(1)), (T0 + 5, mid(2))], now=T0) == 1
    assert store.load() == [(T0 + 5, mid(2))]
    assert store.save([(T0 - 1, mid(1))], now=T0) == 0
    assert not os.path.exists(store.path)
    assert store.load() == []


def test_pending_deferred_record_goes_to_the_sink(tmp_path):
    """A record whose hint is still in the future is handed to the sink with its delivery time."""
    q, clock = clocked(tmp_path)
    sunk = []
    q.deferred_sink = lambda at, f: sunk.append((at, f))
    q.put(run_of([frame(1), frame(2)]))
    q.put_deferred([(T0 + 100, frame(3, attempts=2)), (T0 + 0.5, frame(4))])
    q.put(run_of([frame(5)]))
    clock.advance(1)  # the hint of message 4 is now due
    got = read_all(q)
    assert [int(m[0], 16) for m in decoded(got)] == [1, 2, 4, 5]
    assert sunk == [(T0 + 100, frame(3, attempts=2))]
    assert q.pending_hints == {}
    assert q.depth() == 0


def test_without_sink_deferred_records_are_ordinary(tmp_path):
    """With no sink the deferred records are delivered in order, as Go's nsqd would."""
    q, _ = clocked(tmp_path)
    q.put_deferred([(T0 + 100, frame(1))])
    q.put(run_of([frame(2)]))
    assert [int(m[0], 16) for m in decoded(read_all(q))] == [1, 2]


def test_data_file_keeps_go_format(tmp_path):
    """Deferred messages are ordinary [length][record] entries in the data file (attempts as Go stores them)."""
    q, _ = clocked(tmp_path)
    q.put_deferred([(T0 + 100, frame(1, b"later", attempts=0))])
    q.close()
    data = (tmp_path / "t:c.diskqueue.000000.dat").read_bytes()
    (n,) = struct.unpack_from(">i", data)
    assert n == len(data) - 4 == 26 + 5
    assert data[4 + 8:4 + 10] == b"\x00\x00" and data[4 + 10:4 + 26] == mid(1) and data.endswith(b"later")
    assert (tmp_path / "t:c.diskqueue.meta.dat").read_bytes() == b"1\n0,0\n0,35\n"


def test_delay_survives_restart(tmp_path):
    """Closed with a pending deferral, reopened: the message is diverted with its original due time."""
    q, _ = clocked(tmp_path)
    q.put(run_of([frame(1)]))
    q.put_deferred([(T0 + 3600, frame(2))])
    q.close()
    assert os.path.exists(tmp_path / "t:c.diskqueue.deferred.dat")
    q2, _ = clocked(tmp_path, now=T0 + 60)
    assert q2.pending_hints == {mid(2): T0 + 3600}
    sunk = []
    q2.deferred_sink = lambda at, f: sunk.append(at)
    assert [int(m[0], 16) for m in decoded(read_all(q2))] == [1]
    assert sunk == [T0 + 3600]
    q2.close()
    assert not os.path.exists(tmp_path / "t:c.diskqueue.deferred.dat")


def test_expired_delay_after_restart_is_delivered(tmp_path):
    """If the due time passed while stopped, the message is delivered as ordinary backlog."""
    q, _ = clocked(tmp_path)
    q.put_deferred([(T0 + 10, frame(1))])
    q.close()
    q2, _ = clocked(tmp_path, now=T0 + 11)
    sunk = []
    q2.deferred_sink = lambda at, f: sunk.append(at)
    assert [int(m[0], 16) for m in decoded(read_all(q2))] == [1]
    assert sunk == []


def test_hints_persisted_with_syncs(tmp_path):
    """A sync after put_deferred writes the sidecar too (a crash after it keeps the delay)."""
    q, clock = clocked(tmp_path, sync_every=1)
    q.put_deferred([(T0 + 50, frame(1))])
    clock.advance(0)
    assert DeferredStore.for_queue(str(tmp_path), "t:c").load() == [(T0 + 50, mid(1))]


def test_empty_removes_the_sidecar(tmp_path):
    """Empty() forgets the hints and removes the file."""
    q, clock = clocked(tmp_path, sync_every=1)
    q.put_deferred([(T0 + 50, frame(1))])
    clock.advance(0)
    q.empty()
    assert q.pending_hints == {}
    assert os.listdir(tmp_path) == []
