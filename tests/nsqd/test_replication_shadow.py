"""Consumer state on the replication link (issue 26, step 2), sans-IO and on disk: the origin
gathers FINs and REQs per channel into one batch every ~100 ms; the peer's shadow keeps each
message until every channel that got it finished it, follows topic and channel creations and
deletions in order, keeps REQ due times, survives a restart (the log replayed) and compacts
its log to what is unfinished."""

from __future__ import annotations

import struct

from nsqtw.nsqd.core.replication import ReplicationOrigin, ShadowState
from nsqtw.nsqd.replication import ShadowFiles, shadow_path
from nsqtw.protocol import replication as wire


def frame(n: int, body: bytes = b"body") -> bytes:
    """A stored message frame whose ID is ``n`` (16 ASCII digits)."""
    mid = b"%016d" % n
    return struct.pack(">iiqH", len(body) + 30, 2, 1_000_000_000 + n, 1) + mid + body


def ids(s) -> list[bytes]:
    """The IDs of every unfinished message of a shadow."""
    return sorted(m.frame[18:34] for m in s.unfinished())


def one(s, n: int):
    """The unfinished message ``n`` of a shadow."""
    return {m.frame[18:34]: m for m in s.unfinished()}[mid(n)]


def mid(n: int) -> bytes:
    return b"%016d" % n


def msg(topic: str, *ns: int, due: int = 0) -> wire.Entry:
    return wire.message_entry(topic, due, b"".join(frame(n) for n in ns))


def op(kind: int, topic: str, channel: str = "") -> wire.Entry:
    return (kind, topic, channel, 0, b"")


def fin(topic: str, channel: str, *ns: int) -> wire.Entry:
    return (wire.FIN, topic, channel, 0, wire.fin_data([mid(n) for n in ns]))


def test_a_message_is_dropped_once_every_channel_finished_it():
    s = ShadowState()
    s.apply([op(wire.TOPIC_NEW, "t"), op(wire.CHANNEL_NEW, "t", "a"), op(wire.CHANNEL_NEW, "t", "b"),
             msg("t", 1, 2, 3)])
    s.apply([fin("t", "a", 1, 2)])
    assert ids(s) == [mid(1), mid(2), mid(3)]  # b still has them
    s.apply([fin("t", "b", 1), fin("t", "x", 2)])  # an unknown channel's FIN changes nothing
    assert ids(s) == [mid(2), mid(3)]
    s.apply([op(wire.CHANNEL_DEL, "t", "b")])  # b gone: 2 was finished by a, the only one left
    assert ids(s) == [mid(3)]
    s.apply([op(wire.TOPIC_DEL, "t")])
    assert ids(s) == [] and s.live_bytes == 0


def test_messages_before_any_channel_go_to_the_channels_created_next():
    s = ShadowState()
    s.apply([msg("t", 1)])
    assert one(s, 1).pending is None
    s.apply([op(wire.CHANNEL_NEW, "t", "a"), op(wire.CHANNEL_NEW, "t", "b")])  # one batch: both get it
    assert one(s, 1).pending == {"a", "b"}
    s.apply([op(wire.CHANNEL_NEW, "t", "c")])  # later: it does not
    assert one(s, 1).pending == {"a", "b"}
    s.apply([msg("t", 2)])
    assert one(s, 2).pending == {"a", "b", "c"}


def test_req_keeps_the_new_due_time_and_deferred_publishes_keep_theirs():
    s = ShadowState()
    s.apply([op(wire.CHANNEL_NEW, "t", "a"), msg("t", 1), msg("t", 2, due=5_000)])
    s.apply([(wire.REQ, "t", "a", 0, wire.req_data([(mid(1), 9_000)]))])
    assert one(s, 1).due == 9_000 and one(s, 2).due == 5_000


def test_snapshot_rebuilds_the_same_state():
    s = ShadowState()
    s.apply([op(wire.CHANNEL_NEW, "t", "a"), op(wire.CHANNEL_NEW, "t", "b"), msg("t", 1, 2),
             msg("u", 3, due=7), fin("t", "a", 1)])
    again = ShadowState()
    again.apply(s.snapshot())
    assert again.topics == s.topics
    assert {k: (m.topic, m.due, m.frame, m.pending) for k, m in ((m.frame[18:34], m) for m in again.unfinished())} == \
        {k: (m.topic, m.due, m.frame, m.pending) for k, m in ((m.frame[18:34], m) for m in s.unfinished())}


def test_origin_sends_fins_and_reqs_per_channel_in_one_batch():
    o = ReplicationOrigin(["p"], 1, False)
    o.linked("p", 2, 0.0)
    for n in (1, 2, 3):
        o.fin("t", "a", mid(n))
    o.req("t", "b", mid(4), 123)
    assert not o.pending
    assert o.move_consumer_state() is True
    assert o.move_consumer_state() is False  # nothing new
    parts, peers = o.take_batch(0.0)
    frame_bytes = b"".join(parts)
    [(kind, body)] = wire.LinkDecoder().feed(frame_bytes)
    _, entries = wire.decode_batch(body)
    assert [(k, t, c) for k, t, c, _, _ in entries] == [(wire.REQ, "t", "b"), (wire.FIN, "t", "a")]
    assert entries[1][4] == mid(1) + mid(3)  # one range: 1 to 3
    assert list(wire.fin_ids(entries[1][4])) == [mid(1), mid(2), mid(3)]


def test_fin_ranges_merge_consecutive_ids_in_any_order():
    ids = [b"%016x" % n for n in (7, 3, 4, 5, 9, 4)]
    data = wire.fin_data(ids)
    assert data == b"%016x%016x%016x%016x%016x%016x" % (3, 5, 7, 7, 9, 9)
    assert list(wire.fin_ids(data)) == [b"%016x" % n for n in (3, 4, 5, 7, 9)]


def test_a_published_batch_is_one_run_until_its_messages_part():
    s = ShadowState()
    s.apply([op(wire.CHANNEL_NEW, "t", "a"), op(wire.CHANNEL_NEW, "t", "b"), msg("t", 1, 2, 3, 4)])
    assert len(s.runs) == 1 and not s.messages and s.count() == 4  # no object per message
    s.apply([fin("t", "a", 2), (wire.REQ, "t", "b", 0, wire.req_data([(mid(3), 99)]))])
    assert set(s.messages) == {mid(2), mid(3)} and s.runs[0].left == 2 and s.count() == 4
    assert s.messages[mid(2)].pending == {"b"}
    assert s.messages[mid(3)].due == 99 and s.messages[mid(3)].frame == frame(3)
    s.apply([fin("t", "b", 2)])
    assert mid(2) not in ids(s)
    s.apply([op(wire.CHANNEL_DEL, "t", "a"), fin("t", "b", 1, 3, 4)])
    assert not ids(s) and s.live_bytes == 0 and not s.runs
    # a run whose only channel finishes it leaves without an object per message
    s.apply([op(wire.CHANNEL_NEW, "v", "only"), msg("v", 10, 11, 12)])
    s.apply([fin("v", "only", 10, 11, 12)])
    assert not s.runs and not s.messages and s.live_bytes == 0
    # frames of different sizes are a run too
    s.apply([wire.message_entry("u", 0, frame(5, b"x") + frame(6, b"yyyy"))])
    assert [m.frame for m in s.unfinished()] == [frame(5, b"x"), frame(6, b"yyyy")]


def test_a_runs_ids_are_read_only_when_a_message_is_looked_up():
    """An MPUB of equal bodies is held with its first and last IDs only (a peer whose messages
    nobody consumes yet pays nothing per message); the first FIN reads the others."""
    s = ShadowState()
    s.apply([op(wire.CHANNEL_NEW, "t", "a"), msg("t", 1, 2, 3, 4)])
    run = s.runs[0]
    assert run._ids is None and (run.first, run.last) == (mid(1), mid(4)) and s.max_id == mid(4)
    assert s.count() == 4
    s.apply([fin("t", "a", 3)])
    assert run._ids == [mid(1), mid(2), mid(3), mid(4)] and ids(s) == [mid(1), mid(2), mid(4)]
    assert one(s, 4).frame == frame(4)


def test_a_batch_of_equal_frames_whose_ids_do_not_increase_is_still_found():
    """Not what an origin sends (its IDs increase), but a FIN still finds each message: the
    IDs are sorted with their frames (a message a FIN cannot find stays: a duplicate at
    adoption, never a loss)."""
    s = ShadowState()
    s.apply([op(wire.CHANNEL_NEW, "t", "a"), msg("t", 1, 3, 2, 4)])
    assert len(s.runs) == 1
    s.apply([fin("t", "a", 2)])
    assert ids(s) == [mid(1), mid(3), mid(4)]
    assert [m.frame for m in s.unfinished()] == [frame(1), frame(3), frame(4)]
    s.apply([fin("t", "a", 1, 3, 4)])
    assert not ids(s) and not s.runs and s.live_bytes == 0
    # increasing IDs in a run that starts before the last run ends: one object per message
    s.apply([msg("t", 10, 20), msg("t", 15, 30)])
    assert len(s.runs) == 1 and set(s.messages) == {mid(15), mid(30)}


def test_unfinished_messages_come_in_id_order_with_their_frames():
    """Reading every unfinished message (adoption, onward replication) walks each run once,
    in ID order, each ID with its own frame, also when the run's IDs were never read before
    and do not increase."""
    s = ShadowState()
    s.apply([msg("t", 1, 3, 2, 4), msg("t", 7), msg("t", 8)])
    s.apply([msg("t", 9), msg("t", 10, 11)])
    got = [(bytes(raw[18:34]), bytes(raw)) for _, _, _, raw in s.each_unfinished()]
    assert got == [(mid(n), frame(n)) for n in (1, 2, 3, 4, 7, 8, 9, 10, 11)]


def test_shadow_files_replay_and_compact(tmp_path):
    files = ShadowFiles(str(tmp_path), fsync=False, compact_min=2000)
    files.store(1, wire.batch_body(1, [op(wire.CHANNEL_NEW, "t", "a"), msg("t", *range(100))]))
    files.store(1, wire.batch_body(2, [fin("t", "a", *range(99))]))
    assert 1 not in files.states  # stored (and acknowledgeable) first, applied after
    files.apply()
    assert files.compactions == 1  # the log held 100 messages, one is unfinished
    assert files.states[1].count() == 1
    assert files.sizes[1] < 200  # the log's records (the file is extended a window at a time)
    files.store(1, wire.batch_body(3, [msg("t", 100)]))
    files.apply()
    files.close()
    # a restarted peer replays the log: same unfinished messages
    again = ShadowFiles(str(tmp_path), fsync=False)
    again.load()
    assert ids(again.states[1]) == [mid(99), mid(100)]
    assert one(again.states[1], 99).pending == {"a"}
    assert shadow_path(str(tmp_path), 1).endswith("nsqtw-shadow.1.log")


def test_a_snapshot_in_several_batches_is_not_compacted_away_halfway(tmp_path):
    """A catch-up snapshot arrives in many batches: the log is not compacted while it is
    being received (a compaction then wrote the old state and dropped the snapshot's first
    batches from the log, so a restart replayed only part of it)."""
    files = ShadowFiles(str(tmp_path), fsync=False, compact_min=2000)
    files.store(1, wire.batch_body(1, [op(wire.CHANNEL_NEW, "t", "a"), msg("t", 1)]))
    files.apply()
    parts = [[(wire.SNAP_BEGIN, "", "", 0, wire.epoch_data(9)), op(wire.TOPIC_NEW, "t"),
              op(wire.CHANNEL_NEW, "t", "a")]]
    parts += [[(wire.SNAP_MSG, "t", "a", 0, b"".join(frame(n) for n in range(k, k + 10)))]
              for k in range(100, 300, 10)]
    parts += [[(wire.SNAP_END, "", "", 0, mid(299))]]
    for seq, entries in enumerate(parts, 2):
        files.store(1, wire.batch_body(seq, entries))
        files.apply()
    assert files.states[1].count() == 200 and files.states[1].epoch == 9
    files.close()
    again = ShadowFiles(str(tmp_path), fsync=False)
    again.load()
    assert ids(again.states[1]) == [mid(n) for n in range(100, 300)]


def test_a_peer_copies_nothing_of_a_batch_before_its_ack(tmp_path):
    """A whole BATCH read is checked and appended as a view of the read (no copy); what the
    shadow keeps is a view of its log, mapped (not a copy in memory, and not the read's
    buffer kept alive)."""
    import mmap
    body = wire.batch_body(7, [op(wire.CHANNEL_NEW, "t", "a"), msg("t", *range(50))])
    read = wire.encode_frame(wire.BATCH, body)
    view = wire.LinkDecoder().one(read, wire.BATCH)
    assert isinstance(view, memoryview) and view.obj is read and view == body
    seq, entries = wire.decode_batch(view)
    assert seq == 7 and all(isinstance(e[4], memoryview) and e[4].obj is read for e in entries)
    assert wire.decode_batch(body) == (7, [(k, t, c, d, bytes(x)) for k, t, c, d, x in entries])
    files = ShadowFiles(str(tmp_path), fsync=False)
    files.store(1, view)
    rec = wire.shadow_record(body)
    on_disk = (tmp_path / "nsqtw-shadow.1.log").read_bytes()
    assert on_disk[:len(rec)] == rec and not on_disk[len(rec):].strip(b"\0")  # stored first
    files.apply()
    runs = files.states[1].runs
    data = runs[0].data
    assert len(runs) == 1 and isinstance(data, memoryview) and isinstance(data.obj, mmap.mmap)
    assert data == b"".join(frame(n) for n in range(50))
    assert ids(files.states[1]) == [mid(n) for n in range(50)]
    files.close()


def test_adopt_after_timeout_policy():
    from nsqtw.nsqd.core.replication import AdoptAfterTimeout

    p = AdoptAfterTimeout(10.0)
    p.origin_down(1, 0.0)
    p.origin_down(2, 5.0)
    assert p.due(9.9) == []
    assert p.due(10.0) == [1] and p.due(11.0) == []  # once per time it went down
    p.origin_up(2, 12.0)  # came back in time
    assert p.due(100.0) == []


def test_adopt_puts_each_message_on_the_channels_that_had_not_finished_it():
    from twisted.internet import task

    from nsqtw.nsqd.core.broker import Broker
    from nsqtw.nsqd.core.replication import adopt
    from nsqtw.options import NsqdOptions

    clock = task.Clock()
    clock.advance(100)
    s = ShadowState()
    s.apply([op(wire.CHANNEL_NEW, "t", "a"), op(wire.CHANNEL_NEW, "t", "b"), msg("t", 1, 2),
             msg("t", 3, due=int(130 * 1e9)), msg("u", 4), fin("t", "a", 1)])
    b = Broker(NsqdOptions(), clock.seconds())
    assert adopt(b, s, clock.seconds()) == (4, 0)
    a, bb = b.topics["t"].channels["a"], b.topics["t"].channels["b"]
    assert a.depth() == 1 and bb.depth() == 2  # 1 was finished on a
    assert [d for d, _, f in a.deferred] == [130.0] and [d for d, _, f in bb.deferred] == [130.0]
    assert b.topics["u"].mem.depth() == 1 and not b.topics["u"].channels  # waits for its first channel
    assert {("t", "a"), ("t", "b"), ("u", None)} <= set(b.registrations())


def test_shadow_append_finishes_a_short_write(tmp_path, monkeypatch):
    """os.writev may write less than asked (a signal, a nearly full disk): the rest of the
    record follows, byte for byte, and the log reads back whole."""
    import os as _os

    from nsqtw.nsqd import replication as service_module

    real = _os.pwritev
    calls = []

    def short(fd, parts, offset):
        data = b"".join(bytes(p) for p in parts)
        calls.append(len(data))
        return real(fd, [data[:7]], offset)  # at most 7 bytes per call

    files = ShadowFiles(str(tmp_path), fsync=False)
    body = wire.batch_body(1, [op(wire.CHANNEL_NEW, "t", "a"), msg("t", 1, 2, 3)])
    monkeypatch.setattr(service_module.os, "pwritev", short)
    files.store(1, body)
    monkeypatch.setattr(service_module.os, "pwritev", real)
    assert len(calls) > 1  # it took several calls
    files.close()
    with open(shadow_path(str(tmp_path), 1), "rb") as f:
        assert f.read().rstrip(b"\0") == wire.shadow_record(body)
    assert files.sizes[1] == len(wire.shadow_record(body))
    again = ShadowFiles(str(tmp_path), fsync=False)
    again.load()
    assert ids(again.states[1]) == [mid(1), mid(2), mid(3)]


def test_the_log_spans_windows_and_replays_whole(tmp_path):
    """Records never span two mapped windows (the rest of a window is a padding record); a
    record larger than a window gets one of its own; all of them replay."""
    files = ShadowFiles(str(tmp_path), fsync=False, window=4096)
    files.store(1, wire.batch_body(1, [op(wire.CHANNEL_NEW, "t", "a")]))
    n = 2
    for k in range(60):  # about 700 bytes each: several per window
        files.store(1, wire.batch_body(n, [msg("t", *range(k * 10, k * 10 + 10))]))
        n += 1
    big = wire.batch_body(n, [msg("t", *range(1000, 1200))])  # more than a window
    assert len(big) > 4096
    files.store(1, big)
    files.store(1, wire.batch_body(n + 1, [msg("t", 5000)]))
    files.apply()
    want = [mid(i) for i in [*range(600), *range(1000, 1200), 5000]]
    assert ids(files.states[1]) == want
    assert (tmp_path / "nsqtw-shadow.1.log").stat().st_size > files.sizes[1]  # padded windows
    files.close()
    again = ShadowFiles(str(tmp_path), fsync=False, window=4096)
    again.load()
    assert ids(again.states[1]) == want
    again.store(1, wire.batch_body(n + 2, [msg("t", 6000)]))  # appended after the last record
    again.close()
    third = ShadowFiles(str(tmp_path), fsync=False)
    third.load()
    assert ids(third.states[1]) == [*want, mid(6000)]


def test_a_record_cut_short_by_a_crash_is_overwritten_by_the_next(tmp_path):
    """A crash mid-record leaves part of it: the replay stops there, and the next record is
    written over it (before, records appended after a torn one were never replayed)."""
    files = ShadowFiles(str(tmp_path), fsync=False)
    files.store(1, wire.batch_body(1, [op(wire.CHANNEL_NEW, "t", "a"), msg("t", 1)]))
    files.close()
    path = shadow_path(str(tmp_path), 1)
    torn = wire.shadow_record(wire.batch_body(2, [msg("t", *range(2, 40))]))
    with open(path, "r+b") as f:
        f.seek(files.sizes[1])
        f.write(torn[:len(torn) // 2])  # half of a record
    again = ShadowFiles(str(tmp_path), fsync=False)
    again.load()
    assert ids(again.states[1]) == [mid(1)]
    again.store(1, wire.batch_body(3, [msg("t", 50)]))
    again.close()
    third = ShadowFiles(str(tmp_path), fsync=False)
    third.load()
    assert ids(third.states[1]) == [mid(1), mid(50)]


def test_a_compaction_keeps_the_batches_stored_with_the_one_that_triggered_it(tmp_path):
    """Two batches of one read are stored, then applied: the compaction the first makes due
    waits until both are applied (it writes the state: a batch stored but not applied yet
    was lost from the log)."""
    files = ShadowFiles(str(tmp_path), fsync=False, compact_min=2000)
    files.store(1, wire.batch_body(1, [op(wire.CHANNEL_NEW, "t", "a"), msg("t", *range(100))]))
    files.apply()
    files.store(1, wire.batch_body(2, [fin("t", "a", *range(100))]))  # makes a compaction due...
    files.store(1, wire.batch_body(3, [msg("t", 500)]))  # ...and came in the same read
    files.apply()
    assert files.compactions == 1 and ids(files.states[1]) == [mid(500)]
    files.close()
    again = ShadowFiles(str(tmp_path), fsync=False)
    again.load()
    assert ids(again.states[1]) == [mid(500)]


def _stored_with_memory(tmp_path, batches: list[bytes]) -> tuple[ShadowFiles, int]:
    """A shadow (of a topic with channel "a") that stored and applied ``batches`` one by one,
    and how many bytes of Python objects that added (tracemalloc)."""
    import tracemalloc

    files = ShadowFiles(str(tmp_path), fsync=False)
    files.store(1, wire.batch_body(1, [op(wire.CHANNEL_NEW, "t", "a")]))
    files.apply()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for b in batches:
            files.store(1, b)
            files.apply()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    return files, grown


def test_the_shadow_keeps_message_bodies_in_its_log_not_in_memory(tmp_path):
    """What a peer's own memory holds grows with the number of unfinished messages, not with
    their bodies: 20 MB of MPUBs stored and applied add well under 1 MB of Python objects."""
    body = b"x" * 1000
    frames_of = [wire.batch_body(2 + k, [wire.message_entry("t", 0, b"".join(
        frame(i, body) for i in range(k * 200, k * 200 + 200)))]) for k in range(100)]
    files, grown = _stored_with_memory(tmp_path, frames_of)
    assert files.states[1].count() == 20000
    assert sum(map(len, frames_of)) > 20_000_000
    assert grown < 1_000_000, grown
    assert one(files.states[1], 12345).frame == frame(12345, body)
    files.close()


def test_a_record_that_cannot_be_read_is_skipped_and_the_log_goes_on(tmp_path):
    """A record in the middle of the log whose body cannot be read (its length is intact) is
    skipped with a warning; the records after it replay."""
    files = ShadowFiles(str(tmp_path), fsync=False)
    files.store(1, wire.batch_body(1, [op(wire.CHANNEL_NEW, "t", "a"), msg("t", 1)]))
    files._append(1, wire.shadow_record_head(b"\xff" * 40), b"\xff" * 40)  # not a batch
    bad_frames = wire.batch_body(3, [wire.message_entry("t", 0, frame(2)[:20])])  # a frame cut short
    files._append(1, wire.shadow_record_head(bad_frames), bad_frames)
    files.store(1, wire.batch_body(4, [msg("t", 7)]))
    files.close()
    again = ShadowFiles(str(tmp_path), fsync=False)
    again.load()
    assert ids(again.states[1]) == [mid(1), mid(7)]
    again.store(1, wire.batch_body(5, [msg("t", 8)]))  # appended after the last record read
    again.close()
    third = ShadowFiles(str(tmp_path), fsync=False)
    third.load()
    assert ids(third.states[1]) == [mid(1), mid(7), mid(8)]


def test_a_shadowed_single_pub_costs_its_index_not_its_body(tmp_path):
    """One PUB per batch (the commonest publish): consecutive PUBs of a topic are gathered into
    one run over the log window they are in, which keeps an ID and a start per message:
    under 100 bytes each for 200-byte bodies (656 before stop 38: a copy of the frame and a
    set of channels per message; 357 in stop 38: an object and a view of the log each)."""
    n = 5000
    batches = [wire.batch_body(2 + i, [wire.message_entry("t", 0, frame(i, b"x" * 200))]) for i in range(n)]
    files, grown = _stored_with_memory(tmp_path, batches)
    state = files.states[1]
    assert state.count() == n
    assert len(state.runs) == 1 and state.runs[0].gathered and not state.messages
    assert grown / n < 100, grown / n
    assert one(state, 1234).frame == frame(1234, b"x" * 200)
    files.close()


def test_a_gathered_run_whose_consumers_keep_up_stops_growing():
    """Single PUBs finished soon after they came (a consumer keeping up): the shadow does not
    keep the IDs of every message it ever gathered, only of about what is unfinished (a run
    mostly finished takes no more messages; once all are finished it goes)."""
    s = ShadowState()
    s.apply([op(wire.CHANNEL_NEW, "t", "a")])
    window = memoryview(bytearray(1 << 20))
    buf = window.obj
    at = 0
    for n in range(3000):
        f = frame(n)
        buf[at:at + len(f)] = f
        s.add_frame("t", 0, window, at, at + len(f))
        at += len(f) + 20
        if n >= 10:
            s.apply([fin("t", "a", n - 10)])  # ten in flight at any time
    assert s.count() == 10
    assert sum(len(r.ids) for r in s.runs) + len(s.messages) <= 40
    assert s._gathering is None or s._gathering in s.runs
    assert [bytes(raw[18:34]) for _, _, _, raw in s.each_unfinished()] == [mid(n) for n in range(2990, 3000)]


def test_a_restarted_peer_gathers_the_single_pubs_it_replays(tmp_path):
    """Replaying its log, a peer gathers single PUBs as it does live: the same unfinished
    messages and frames, without an object per message; it appends after them as before."""
    files = ShadowFiles(str(tmp_path), fsync=False)
    files.store(1, wire.batch_body(1, [op(wire.CHANNEL_NEW, "t", "a")]))
    for n in range(500):
        files.store(1, wire.batch_body(2 + n, [msg("t", n)]))
    files.store(1, wire.batch_body(600, [fin("t", "a", 7)]))
    files.apply()
    files.close()
    again = ShadowFiles(str(tmp_path), fsync=False)
    again.load()
    state = again.states[1]
    want = [mid(n) for n in range(500) if n != 7]
    assert ids(state) == want
    state = again.states[1]  # (ids() gave every message an object of its own: load again)
    again.close()
    third = ShadowFiles(str(tmp_path), fsync=False)
    third.load()
    state = third.states[1]
    assert len(state.messages) <= 2 and sum(r.left for r in state.runs if r.gathered) >= 497
    assert one(state, 499).frame == frame(499) and one(state, 499).pending == {"a"}
    third.store(1, wire.batch_body(601, [msg("t", 500)]))
    third.apply()
    third.close()
    fourth = ShadowFiles(str(tmp_path), fsync=False)
    fourth.load()
    assert ids(fourth.states[1]) == [*want, mid(500)]


def test_gathered_single_pubs_finish_compact_and_replay(tmp_path):
    """Single PUBs gathered into runs (a new run in each log window; a DPUB between them, due
    later, keeps an object of its own and the run goes on after it) are finished one by one,
    compacted into batches and replayed as the same unfinished messages with the same
    channels and due times."""
    files = ShadowFiles(str(tmp_path), fsync=False, compact_min=20_000, window=8192)
    files.store(1, wire.batch_body(1, [op(wire.CHANNEL_NEW, "t", "a"), op(wire.CHANNEL_NEW, "t", "b")]))
    files.apply()
    seq = 2
    for n in range(300):
        files.store(1, wire.batch_body(seq, [msg("t", n, due=7 if n % 50 == 49 else 0)]))
        files.apply()
        seq += 1
    state = files.states[1]
    gathered = [r for r in state.runs if r.gathered]
    assert len(gathered) >= 3 and len({id(r.data) for r in gathered}) == len(gathered)  # a run per window
    assert sorted(state.messages) == [mid(n) for n in range(49, 300, 50)]  # the DPUBs
    assert sum(r.left for r in gathered) == 300 - 6
    assert one(state, 49).due == 7 and one(state, 48).due == 0
    files.store(1, wire.batch_body(seq, [fin("t", "a", *range(0, 300, 2)), fin("t", "b", *range(0, 250))]))
    files.apply()
    want = {mid(n): ({"a"} if n % 2 else set()) | ({"b"} if n >= 250 else set()) for n in range(300)}
    want = {k: v for k, v in want.items() if v}
    assert {m.frame[18:34]: m.pending for m in files.states[1].unfinished()} == want
    files.store(1, wire.batch_body(seq + 1, [fin("t", "a", *range(1, 241, 2))]))  # the log is now 4x the live bytes
    files.apply()
    assert files.compactions >= 1
    files.close()
    again = ShadowFiles(str(tmp_path), fsync=False)
    again.load()
    want = {k: v for k, v in want.items() if k >= mid(241) or "b" in v}
    assert {m.frame[18:34]: m.pending for m in again.states[1].unfinished()} == want
    assert one(again.states[1], 299).due == 7 and one(again.states[1], 298).due == 0
