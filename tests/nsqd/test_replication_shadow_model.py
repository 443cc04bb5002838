"""Property test of the peer's shadow (``ShadowState``): a snapshot of any state rebuilds the
same unfinished messages (topic, due time, channels still to finish each), and the rebuilt
state then follows the same FINs, REQs and channel changes as the original.  Snapshots keep a
batch of messages whole where they can (one run, not an object per message), so this checks
that path against the message-by-message one."""

from __future__ import annotations

import struct

from hypothesis import example, given, settings, strategies as st

from nsqtw.nsqd.core.replication import ShadowState
from nsqtw.protocol import replication as wire

TOPICS = ["t", "u"]
CHANNELS = ["a", "b", "c"]


def frame(n: int, size: int) -> bytes:
    body = b"x" * size
    return struct.pack(">iiqH", len(body) + 30, 2, 1_000_000_000 + n, 1) + b"%016d" % n + body


def mid(n: int) -> bytes:
    return b"%016d" % n


op = st.one_of(
    st.tuples(st.just("msg"), st.sampled_from(TOPICS), st.integers(1, 6), st.booleans(), st.sampled_from([0, 5])),
    st.tuples(st.just("fin"), st.sampled_from(TOPICS), st.sampled_from(CHANNELS), st.lists(st.integers(0, 60), max_size=8)),
    st.tuples(st.just("req"), st.sampled_from(TOPICS), st.sampled_from(CHANNELS), st.integers(0, 60), st.integers(1, 9)),
    st.tuples(st.just("chnew"), st.sampled_from(TOPICS), st.sampled_from(CHANNELS)),
    st.tuples(st.just("chdel"), st.sampled_from(TOPICS), st.sampled_from(CHANNELS)),
    st.tuples(st.just("empty"), st.sampled_from(TOPICS), st.sampled_from(["", *CHANNELS])),
)


class Maker:
    """Turns ops into BATCH items, numbering messages as an origin mints IDs (increasing)."""

    def __init__(self) -> None:
        self.next = 1

    def entries(self, ops) -> list[wire.Entry]:
        out: list[wire.Entry] = []
        for o in ops:
            kind = o[0]
            if kind == "msg":
                _, topic, n, uniform, due = o
                frames = [frame(self.next + i, 10 if uniform else 10 + i) for i in range(n)]
                self.next += n
                out.append(wire.message_entry(topic, due, b"".join(frames)))
            elif kind == "fin":
                _, topic, ch, ns = o
                out.append((wire.FIN, topic, ch, 0, wire.fin_data([mid(n) for n in sorted(set(ns))])))
            elif kind == "req":
                _, topic, ch, n, due = o
                out.append((wire.REQ, topic, ch, 0, wire.req_data([(mid(n), due)])))
            elif kind == "chnew":
                out.append((wire.CHANNEL_NEW, o[1], o[2], 0, b""))
            elif kind == "chdel":
                out.append((wire.CHANNEL_DEL, o[1], o[2], 0, b""))
            else:
                out.append((wire.EMPTY, o[1], o[2], 0, b""))
        return out


def view(s: ShadowState) -> dict[bytes, tuple[str, int, frozenset[str] | None, bytes]]:
    return {bytes(raw[18:34]): (topic, due, pending, bytes(raw)) for topic, due, pending, raw in s.each_unfinished()}


def rebuilt(s: ShadowState, as_views: bool) -> ShadowState:
    entries = s.snapshot()
    if as_views:  # as a peer holds messages: views of its log (everything else as bytes)
        entries = [(k, t, c, d, memoryview(bytes(x)) if k == wire.SNAP_MSG else x)  # type: ignore[misc]  # a view where Entry says bytes, as a peer passes them
                   for k, t, c, d, x in entries]
    out = ShadowState()
    out.apply(entries)
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(op, max_size=25), st.lists(op, max_size=15), st.booleans())
def test_a_snapshot_rebuilds_the_same_shadow_which_then_follows_the_same_changes(first, then, as_views):
    maker = Maker()
    s = ShadowState()
    for entries in (maker.entries(first[:10]), maker.entries(first[10:])):
        s.apply(entries)
    before = view(s)
    again = rebuilt(s, as_views)
    assert view(again) == before
    assert again.count() == s.count() == len(before)
    assert {m.frame[18:34] for m in s.unfinished()} == set(before)  # the per-message view agrees
    more = maker.entries(then)
    s.apply(more)
    again.apply(more)
    assert view(again) == view(s)
    third = rebuilt(again, not as_views)  # and once more, from the rebuilt one
    assert view(third) == view(s)


def test_a_snapshot_of_batches_rebuilds_them_as_batches_not_one_object_per_message():
    """A catch-up snapshot or a compacted log of MPUBs on two channels rebuilds as one run per
    MPUB (both channels pending on it), not an object per message; a channel's FIN then
    leaves the other channel's messages as they are."""
    maker = Maker()
    s = ShadowState()
    s.apply(maker.entries([("chnew", "t", "a"), ("chnew", "t", "b")]))
    s.apply(maker.entries([("msg", "t", 6, True, 0), ("msg", "t", 5, False, 0)]))
    again = rebuilt(s, True)
    assert len(again.runs) == 2 and not again.messages
    assert [r.pending for r in again.runs] == [frozenset({"a", "b"})] * 2
    assert view(again) == view(s)
    fin = maker.entries([("fin", "t", "a", [1, 2, 3])])
    s.apply(fin)
    again.apply(fin)
    assert view(again) == view(s) and again.count() == 11


class Window:
    """A stand-in for a mapped window of a peer's log: frames at increasing offsets with a
    record's head between them, one view of it for every frame added (as the log gives)."""

    def __init__(self) -> None:
        self.buf = bytearray(64 * 1024)
        self.view = memoryview(self.buf)
        self.end = 0

    def put(self, data: bytes) -> tuple[int, int]:
        at = self.end + 29  # a record's and a batch item's heads
        self.buf[at:at + len(data)] = data
        self.end = at + len(data)
        return at, self.end


pub = st.tuples(st.just("pub"), st.sampled_from(TOPICS), st.sampled_from([0, 0, 0, 5]))
new_window = st.tuples(st.just("window"))
channel_new = st.tuples(st.just("chnew"), st.sampled_from(TOPICS), st.sampled_from(CHANNELS))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(op, pub, pub, pub, channel_new, new_window), max_size=50), st.booleans())
# a channel created after a gathered run's messages: the next PUB has more channels to finish
@example([("chnew", "t", "a"), ("pub", "t", 0), ("pub", "t", 0), ("chnew", "t", "b"), ("pub", "t", 0)], False)
# a PUB held alone, finished by one of its channels: the next PUB has more to finish
@example([("chnew", "t", "a"), ("chnew", "t", "b"), ("pub", "t", 0), ("fin", "t", "a", [1]), ("pub", "t", 0)], True)
def test_single_publishes_gathered_into_runs_hold_what_one_object_per_message_holds(ops, as_views):
    """Single PUBs handed over as frames in a log window (``add_frame``: consecutive ones of a
    topic gather into one run) give the same shadow as the same publishes applied as MSG items
    (an object per message), through FINs, REQs, channel changes and snapshots."""
    maker = Maker()
    gathered = ShadowState()
    plain = ShadowState()
    window = Window()
    for o in ops:
        if o[0] == "pub":
            f = frame(maker.next, 10)
            maker.next += 1
            at, end = window.put(f)
            gathered.add_frame(o[1], o[2], window.view, at, end)
            plain.apply([wire.message_entry(o[1], o[2], f)])
        elif o[0] == "window":
            window = Window()
        else:
            entries = maker.entries([o])
            gathered.apply(entries)
            plain.apply(entries)
        assert gathered.live_bytes == plain.live_bytes
    assert view(gathered) == view(plain)
    assert gathered.count() == plain.count() and gathered.max_id == plain.max_id
    again = rebuilt(gathered, as_views)
    assert view(again) == view(plain)
    assert {m.frame[18:34] for m in gathered.unfinished()} == set(view(plain))
