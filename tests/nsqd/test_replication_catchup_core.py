"""Catch-up (issue 26, step 4) and the consumer-state items added with it, sans-IO: a peer that
links gets a snapshot of everything outstanding (built from the origin's broker by
``outstanding``), counts toward --replication-min-acks only once it stored it, and its shadow
swaps the snapshot in whole (one cut short leaves the old shadow); pause/unpause/empty travel
in order; a peer too far behind is dropped; the HELLO carries the origin's epoch and the
peer's adopted-ID answer."""

from __future__ import annotations

import struct

import pytest
from twisted.internet import task

from nsqtw.nsqd.core.broker import Broker
from nsqtw.nsqd.core.replication import (
    CATCHING_UP, IN_SYNC, SNAPSHOT_WINDOW, OriginLink, PublishRefused, ReplicationOrigin, ShadowReceiver, ShadowState, adopt,
    outstanding,
)
from nsqtw.options import NsqdOptions
from nsqtw.protocol import replication as wire


def frame(n: int, body: bytes = b"body") -> bytes:
    return struct.pack(">iiqH", len(body) + 30, 2, 1_000_000_000 + n, 1) + b"%016d" % n + body


def ids(s) -> list[bytes]:
    """The IDs of every unfinished message of a shadow."""
    return sorted(m.frame[18:34] for m in s.unfinished())


def one(s, n: int):
    """The unfinished message ``n`` of a shadow."""
    return {m.frame[18:34]: m for m in s.unfinished()}[mid(n)]


def mid(n: int) -> bytes:
    return b"%016d" % n


def op(kind: int, topic: str, channel: str = "") -> wire.Entry:
    return (kind, topic, channel, 0, b"")


def msg(topic: str, *ns: int) -> wire.Entry:
    return wire.message_entry(topic, 0, b"".join(frame(n) for n in ns))


def snap(*items: wire.Entry, epoch: int = 7, top: bytes = wire.NO_ID) -> list[wire.Entry]:
    return [(wire.SNAP_BEGIN, "", "", 0, wire.epoch_data(epoch)), *items, (wire.SNAP_END, "", "", 0, top)]


def test_a_catching_up_peer_counts_only_once_it_stored_the_snapshot():
    o = ReplicationOrigin(["a"], 1, False)
    frames = o.linked("a", 2, 0.0, snap(op(wire.TOPIC_NEW, "t"), (wire.SNAP_MSG, "t", "c", 0, frame(1))),
                      batch_bytes=1)  # one item per batch: several snapshot batches
    assert len(frames) == 4
    assert o.peers["a"].state == CATCHING_UP
    assert o.peer_stats(1.0)[0]["state"] == "catching_up" and o.peer_stats(1.0)[0]["lag_messages"] == 1
    with pytest.raises(PublishRefused):  # not counted while catching up
        o.barrier("refused")
    o.record("t", 0, frame(2), 1)
    live, peers = o.take_batch(1.0)  # the live stream goes to it behind the snapshot
    assert [p.address for p in peers] == ["a"]
    seqs = [wire.decode_batch(wire.LinkDecoder().feed(f)[0][1])[0] for f in frames]
    assert o.acked("a", seqs[1], 2.0) == [] and o.peers["a"].state == CATCHING_UP
    o.acked("a", seqs[-1], 3.0)
    assert o.peers["a"].state == IN_SYNC
    assert o.peer_stats(3.0)[0]["lag_messages"] == 1  # the live batch is still unacknowledged
    assert o.barrier("held") is False  # what was recorded before is covered by the next ACK
    live_seq = wire.decode_batch(wire.LinkDecoder().feed(b"".join(live))[0][1])[0]
    assert live_seq > seqs[-1]
    assert o.acked("a", live_seq, 4.0) == ["held"]
    st = o.peer_stats(4.0)[0]
    assert (st["state"], st["lag_messages"], st["lag_seconds"], st["catch_ups"]) == ("in_sync", 0, 0.0, 1)


def _seq(frame_: bytes) -> int:
    return wire.decode_batch(wire.LinkDecoder().feed(frame_)[0][1])[0]


def test_a_snapshot_larger_than_max_lag_goes_out_a_window_at_a_time_and_the_peer_catches_up():
    """A backlog of more messages than ``max_lag``: the snapshot is made and sent
    SNAPSHOT_WINDOW batches at a time as the peer acknowledges them, only those count as its
    lag (it is never dropped as fallen behind), and the live batches recorded meanwhile
    follow the snapshot's last batch on its link."""
    o = ReplicationOrigin(["a"], 1, False, max_lag=5)
    made = []

    def snapshot():
        yield (wire.SNAP_BEGIN, "", "", 0, wire.epoch_data(7))
        yield op(wire.TOPIC_NEW, "t")
        for n in range(1, 41):
            made.append(n)
            yield (wire.SNAP_MSG, "t", "", 0, frame(n))
        yield (wire.SNAP_END, "", "", 0, wire.NO_ID)

    frames = o.linked("a", 2, 0.0, snapshot(), batch_bytes=1)
    assert len(frames) == SNAPSHOT_WINDOW
    assert len(made) < 40  # the rest of it is not made yet
    assert o.behind() == [] and o.peer_stats(0.0)[0]["lag_messages"] <= SNAPSHOT_WINDOW
    o.record("t", 0, frame(99), 1)
    live, peers = o.take_batch(0.5)
    assert peers == []  # it waits behind the snapshot
    sent = list(frames)
    while True:
        assert o.peers["a"].state == CATCHING_UP
        assert o.behind() == []
        o.acked("a", _seq(sent[-1]), 1.0)
        more = o.catch_up("a", 1.0)
        if not more:
            break
        assert len(more) <= SNAPSHOT_WINDOW + 1
        sent.extend(more)
    seqs = [_seq(f) for f in sent]
    assert seqs == sorted(seqs)  # the snapshot's batches, then the live one, in order
    assert sent[-1] == b"".join(live)
    assert o.peers["a"].state == IN_SYNC
    got = [f for data in (e[4] for f in sent for e in wire.decode_batch(wire.LinkDecoder().feed(f)[0][1])[1]
                          if e[0] in (wire.SNAP_MSG, wire.MSG))
           for f in wire.split_frames(data)]
    assert [f[18:34] for f in got] == [frame(n)[18:34] for n in [*range(1, 41), 99]]


def test_a_restream_keeps_a_peer_in_sync_and_the_live_batches_behind_it():
    """After an adoption, a peer in sync gets a new snapshot: it still counts for what it
    acknowledged, the live batches recorded meanwhile follow the snapshot's last batch, and
    it has stored the snapshot once it acknowledged that last one."""
    o = ReplicationOrigin(["a"], 1, False)
    o.linked("a", 2, 0.0)
    o.record("t", 0, frame(1), 1)
    first, _ = o.take_batch(0.0)
    o.acked("a", _seq(b"".join(first)), 0.0)
    assert o.stored_through("a")

    def snapshot():
        yield (wire.SNAP_BEGIN, "", "", 0, wire.epoch_data(7))
        for n in range(2, 30):
            yield (wire.SNAP_MSG, "t", "c", 0, frame(n))
        yield (wire.SNAP_END, "", "", 0, wire.NO_ID)

    sent = o.restream("a", 1.0, snapshot(), batch_bytes=1)
    assert len(sent) == SNAPSHOT_WINDOW and o.peers["a"].state == IN_SYNC
    assert not o.stored_through("a")
    o.record("t", 0, frame(99), 1)
    assert o.barrier("held") is False
    live, peers = o.take_batch(1.0)
    assert peers == []  # behind the snapshot
    while True:
        released = o.acked("a", _seq(sent[-1]), 2.0)
        more = o.catch_up("a", 2.0)
        if not more:
            break
        sent.extend(more)
    assert sent[-1] == b"".join(live) and released == ["held"]
    assert o.stored_through("a") and o.peers["a"].state == IN_SYNC


def test_a_peer_too_far_behind_is_dropped():
    o = ReplicationOrigin(["a", "b"], 1, True, max_lag=3)
    o.linked("a", 2, 0.0)
    o.linked("b", 3, 0.0)
    for n in range(4):
        o.record("t", 0, frame(n), 1)
        o.take_batch(0.0)
        o.acked("b", o.last_sent)
    assert o.behind() == ["a"]


def test_shadow_swaps_in_a_whole_snapshot_and_keeps_the_old_one_if_cut_short():
    s = ShadowState()
    s.apply([op(wire.CHANNEL_NEW, "t", "c"), msg("t", 1, 2)])
    # a snapshot cut short (the origin died while sending it): the old shadow still answers
    s.apply(snap(op(wire.CHANNEL_NEW, "t", "c"), (wire.SNAP_MSG, "t", "c", 0, frame(3)))[:-1])
    assert s.catching_up and set(ids(s)) == {mid(1), mid(2)}
    # a whole one replaces it: 1 and 2 were finished meanwhile, 3 and 4 are outstanding
    s.apply(snap(op(wire.CHANNEL_NEW, "t", "c"), op(wire.CHANNEL_NEW, "t", "d"),
                 (wire.SNAP_MSG, "t", "c", 0, frame(3) + frame(4)), (wire.SNAP_MSG, "t", "d", 0, frame(4)),
                 (wire.SNAP_MSG, "t", "d", 5, frame(5)), (wire.SNAP_MSG, "t", "", 0, frame(6)),
                 op(wire.PAUSE, "t", "d"), epoch=9))
    assert not s.catching_up and s.epoch == 9 and s.snapshots == 1
    assert {k: v.pending for k, v in ((m.frame[18:34], m) for m in s.unfinished())} == {
        mid(3): {"c"}, mid(4): {"c", "d"}, mid(5): {"d"}, mid(6): None}
    assert one(s, 5).due == 5 and s.paused == {("t", "d")}
    assert s.max_id == mid(6)
    # the live stream after it applies as always
    s.apply([(wire.FIN, "t", "c", 0, wire.fin_data([mid(3), mid(4)]))])
    assert set(ids(s)) == {mid(4), mid(5), mid(6)}
    # and the compacted form rebuilds the same state
    again = ShadowState()
    again.apply(s.snapshot())
    assert {k: v.pending for k, v in ((m.frame[18:34], m) for m in again.unfinished())} == {k: v.pending for k, v in ((m.frame[18:34], m) for m in s.unfinished())}
    assert (again.paused, again.epoch, again.max_id) == (s.paused, 9, mid(6))


def test_pause_unpause_and_empty_follow_in_order():
    s = ShadowState()
    s.apply([op(wire.TOPIC_NEW, "t"), msg("t", 1), op(wire.CHANNEL_NEW, "u", "c"), op(wire.CHANNEL_NEW, "u", "d"),
             msg("u", 2, 3), op(wire.PAUSE, "t"), op(wire.PAUSE, "u", "c"), op(wire.UNPAUSE, "t")])
    assert s.paused == {("u", "c")}
    s.apply([op(wire.EMPTY, "t")])  # the topic's own queue (1 had no channel)
    assert mid(1) not in ids(s)
    s.apply([op(wire.EMPTY, "u", "c")])  # c is empty; d still holds 2 and 3
    assert {k: v.pending for k, v in ((m.frame[18:34], m) for m in s.unfinished())} == {mid(2): {"d"}, mid(3): {"d"}}
    s.apply([op(wire.EMPTY, "u", "d")])
    assert not ids(s)
    s.apply([op(wire.CHANNEL_DEL, "u", "c")])
    assert s.paused == set()


def test_outstanding_is_everything_each_channel_has_not_finished():
    clock = task.Clock()
    clock.advance(100)
    b = Broker(NsqdOptions(), clock.seconds())
    t = b.get_topic("t", clock.seconds())
    a = t.get_channel("a", clock.seconds())
    t.get_channel("b", clock.seconds())
    t.get_channel("e#ephemeral", clock.seconds())
    b.get_topic("x#ephemeral", clock.seconds())
    b.publish("t", [b"1", b"2", b"3"], clock.seconds())
    b.publish_deferred("t", b"later", 30.0, clock.seconds())
    b.publish("x#ephemeral", [b"gone"], clock.seconds())
    b.set_paused("t", "b", True)
    b.settle(clock.seconds())
    entries = list(outstanding(b, 42))
    assert entries[0] == (wire.SNAP_BEGIN, "", "", 0, wire.epoch_data(42)) and entries[-1][0] == wire.SNAP_END
    assert all("#ephemeral" not in e[1] and "#ephemeral" not in e[2] for e in entries)
    s = ShadowState()
    s.apply(entries)
    assert s.epoch == 42 and s.paused == {("t", "b")}
    assert s.count() == 4
    later = [m for m in s.unfinished() if m.due]
    assert len(later) == 1 and later[0].due == int(130 * 1e9) and later[0].pending == {"a", "b"}
    assert all(m.pending == {"a", "b"} for m in s.unfinished())
    assert s.max_id == max(ids(s))
    # the snapshot only reads: the broker's queues are as they were
    assert a.depth() == 3 and b.topics["t"].channels["b"].depth() == 3


def test_outstanding_splits_a_large_queue_into_entries_of_bounded_size():
    """One channel's backlog goes in several entries of about ``entry_bytes`` (a queue of
    hundreds of MiB in one entry would make a BATCH over MAX_FRAME, which a peer refuses)."""
    clock = task.Clock()
    b = Broker(NsqdOptions(), clock.seconds())
    b.get_topic("t", clock.seconds()).get_channel("c", clock.seconds())
    b.publish("t", [b"%03d" % n + b"x" * 97 for n in range(100)], clock.seconds())
    b.settle(clock.seconds())
    entries = list(outstanding(b, 1, entry_bytes=1000))
    parts = [e for e in entries if e[0] == wire.SNAP_MSG]
    assert len(parts) > 10 and all(len(e[4]) < 1000 + 200 for e in parts)
    s = ShadowState()
    s.apply(entries)
    assert s.count() == 100
    assert sorted(m.frame[34:37] for m in s.unfinished()) == [b"%03d" % n for n in range(100)]


def test_adopt_pauses_what_was_paused_on_the_origin():
    clock = task.Clock()
    s = ShadowState()
    s.apply([op(wire.CHANNEL_NEW, "t", "c"), msg("t", 1), op(wire.PAUSE, "t", "c")])
    b = Broker(NsqdOptions(), clock.seconds())
    assert adopt(b, s, clock.seconds()) == (1, 0)
    assert b.topics["t"].channels["c"].paused and not b.topics["t"].paused


def test_hello_carries_the_epoch_and_the_adopted_answer():
    link = OriginLink(1, b"o" * 16, "origin", epoch=1234)
    asked = []

    def adopted(origin: int, epoch: int) -> bytes:
        asked.append((origin, epoch))
        return mid(99)

    recv = ShadowReceiver(2, b"p" * 16, "peer", lambda o, b: None, adopted)
    answer = recv.feed(link.start())
    assert asked == [(1, 1234)]
    hello = link.feed(answer).hello
    assert hello is not None and hello.adopted == mid(99)
    # a peer that adopted nothing answers NO_ID
    plain = ShadowReceiver(2, b"p" * 16, "peer", lambda o, b: None)
    hello2 = OriginLink(1, b"o" * 16, "origin", 5).feed(plain.feed(OriginLink(1, b"o" * 16, "origin", 5).start())).hello
    assert hello2 is not None and hello2.adopted == wire.NO_ID
    # a version 1 HELLO is refused by name
    v1 = wire.encode_frame(wire.HELLO, struct.pack(">HH16s", 1, 1, b"o" * 16) + b"old")
    assert b"unsupported replication protocol version 1" in ShadowReceiver(2, b"p" * 16, "p", lambda o, b: None).feed(wire.MAGIC + v1)
