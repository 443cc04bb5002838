"""Delivery semantics of nsqd 1.3.0 without sockets: frames, attempts, IDs, RDY window, timeouts, requeues,
deferred messages and the queue scan, multicast, pause, ephemeral lifecycle, queue limits and e2e latency
(nsqd/channel.go, topic.go, nsqd.go queueScanLoop, guid.go)."""

from __future__ import annotations

import random
import struct

import pytest

from nsqtw.nsqd.core.broker import memory_only_backends
from nsqtw.nsqd.core.guid import TWEPOCH
from nsqtw.nsqd.core.scan import scan_channels
from nsqtw.options import NsqdOptions
from nsqtw.protocol.frames import FRAME_MESSAGE

from nsqd_harness import NODE_ID, T0, Harness, cmd, dpub, mpub, pub, stats_of


def sub(h: Harness, channel: str = "c", rdy: int = 0, topic: str = "t", **ident):
    w = h.consumer(topic, channel, **ident)
    if rdy:
        w.send(cmd("RDY", rdy))
    return w


def fin_all(w, msgs) -> None:
    w.send(b"".join(cmd("FIN", m.id.decode()) for m in msgs))


def decode_id(mid: bytes):
    value = int(mid, 16)
    return value >> 22, (value >> 12) & 0x3FF, value & 0xFFF


# --- message frames, attempts and IDs -----------------------------------------------------------


def test_message_frame_layout():
    """A MESSAGE frame is [size][2][ts ns int64][attempts uint16][16-byte hex ID][body], big-endian."""
    h = Harness()
    w = sub(h, rdy=1)
    h.publish("t", b"hello world")
    raw = bytes(w.raw)
    size, ftype, ts, attempts = struct.unpack(">iiqH", raw[:18])
    mid, body = raw[18:34], raw[34:]
    assert size == len(raw) - 4 == 4 + 8 + 2 + 16 + 11
    assert ftype == FRAME_MESSAGE
    assert abs(ts - T0 * 1e9) < 1e6
    assert attempts == 1
    assert len(mid) == 16 and all(c in b"0123456789abcdef" for c in mid)
    assert body == b"hello world"


def test_message_id_is_snowflake_with_node_id():
    """IDs are 16 lowercase hex digits of ((ts>>20 - twepoch) << 22 | node_id << 12 | seq)."""
    h = Harness()
    w = sub(h, rdy=10)
    h.publish("t", b"a", b"b")
    ids = [m.id for m in w.messages()]
    for mid in ids:
        ts_part, node, seq = decode_id(mid)
        assert node == NODE_ID
        assert ts_part + TWEPOCH == int(T0 * 1e9) >> 20
    assert int(ids[0], 16) < int(ids[1], 16)


@pytest.mark.parametrize("node_id", [0, 1, 512, 1023])
def test_node_id_bits(node_id):
    """--node-id lands in bits 12-21 of every ID."""
    h = Harness(node_id=node_id)
    w = sub(h, rdy=1)
    h.publish("t", b"x")
    assert decode_id(w.messages()[0].id)[1] == node_id


def test_default_node_id_is_crc32_of_md5_of_hostname():
    """Without --node-id, nsqd uses crc32(md5(hostname)) % 1024 (apps/nsqd/options.go)."""
    import hashlib
    import socket
    import zlib
    expected = zlib.crc32(hashlib.md5(socket.gethostname().encode()).digest()) % 1024
    assert NsqdOptions().node_id == expected


def test_ids_unique_and_increasing_across_a_big_mpub():
    """An MPUB of more messages than one pseudo-millisecond's 4096 sequence numbers still mints unique,
    increasing IDs."""
    h = Harness()
    w = sub(h, rdy=2500)
    p = h.producer()
    p.send(mpub("t", [b"%d" % i for i in range(5000)]))
    p.ok()
    seen = []
    while len(seen) < 5000:
        msgs = w.messages()
        assert msgs
        seen.extend(msgs)
        fin_all(w, msgs)
    ids = [int(m.id, 16) for m in seen]
    assert len(set(ids)) == 5000 and ids == sorted(ids)
    assert all(decode_id(m.id)[1] == NODE_ID for m in seen)


def test_attempts_count_every_delivery():
    """Attempts is 1 on first delivery and grows by one per redelivery (REQ, deferred REQ, timeout)."""
    h = Harness()
    w = sub(h, rdy=1, msg_timeout=1000)
    h.publish("t", b"x")
    m = w.messages()[0]
    assert m.attempts == 1
    w.send(cmd("REQ", m.id.decode(), 0))
    m = w.messages()[0]
    assert m.attempts == 2
    w.send(cmd("REQ", m.id.decode(), 1000))
    w.nothing()
    h.advance(1.1)
    h.scan()
    m = w.messages()[0]
    assert m.attempts == 3
    h.advance(1.2)
    h.scan()
    m2 = w.messages()[0]
    assert (m2.id, m2.attempts, m2.body) == (m.id, 4, b"x")


def test_copies_in_channels_share_id_and_timestamp():
    """Topic → channel multicast: every channel gets the message with the same ID and timestamp."""
    h = Harness()
    ws = [sub(h, channel=name, rdy=5) for name in ("a", "b", "c")]
    h.publish("t", b"x", b"y")
    got = [w.messages() for w in ws]
    assert all([m.body for m in msgs] == [b"x", b"y"] for msgs in got)
    for i in range(2):
        assert len({(msgs[i].id, msgs[i].timestamp) for msgs in got}) == 1
    assert [h.channel("t", n).message_count for n in "abc"] == [2, 2, 2]


# --- topic backlog --------------------------------------------------------------------------


def test_topic_without_channel_keeps_messages_until_one_appears():
    """Messages published before any channel exists wait at the topic and all go to the first channel."""
    h = Harness()
    h.publish("t", *[b"%d" % i for i in range(5)])
    assert h.topic("t").depth() == 5
    w = sub(h, rdy=10)
    assert [m.body for m in w.messages()] == [b"%d" % i for i in range(5)]
    assert h.topic("t").depth() == 0
    later = sub(h, channel="late", rdy=10)
    later.nothing()
    h.publish("t", b"new")
    assert [m.body for m in later.messages()] == [b"new"]


def test_topic_backlog_larger_than_pump_batch():
    """A topic backlog of more than one pump step reaches the channel completely."""
    h = Harness(mem_queue_size=20000)
    p = h.producer()
    for i in range(3):
        p.send(mpub("t", [b"%d-%d" % (i, j) for j in range(5000)]))
        p.ok()
    assert h.topic("t").depth() == 15000
    h.broker.get_topic("t").get_channel("c", h.now)
    h.settle()
    assert h.channel("t", "c").depth() == 15000 and h.topic("t").depth() == 0


def test_deferred_publish_waits_at_topic_without_channel():
    """A DPUB to a topic without channels counts in the topic depth until a channel appears."""
    h = Harness()
    p = h.producer()
    p.send(dpub("t", 5000, b"later"))
    p.ok()
    assert h.topic("t").depth() == 1
    w = sub(h, rdy=1)
    w.nothing()
    ch = h.channel("t", "c")
    assert len(ch.deferred) == 1 and ch.message_count == 1


@pytest.mark.xfail(reason="nsqtw stores a topic-held deferred message with an absolute due time fixed at "
                          "publish; nsqd's topic messagePump calls channel.PutMessageDeferred(msg, "
                          "msg.deferred), so the delay starts when the message reaches the channel "
                          "(topic.go messagePump, channel.go StartDeferredTimeout)",
                   strict=True)
def test_deferred_delay_restarts_at_the_topic_to_channel_hop():
    """A DPUB held at a channel-less topic is deferred for its full delay from the moment a channel appears."""
    h = Harness()
    p = h.producer()
    p.send(dpub("t", 5000, b"later"))
    p.ok()
    h.advance(10)
    w = sub(h, rdy=1)
    h.advance(1)
    h.scan()
    w.nothing()
    h.advance(4.5)
    h.scan()
    assert [m.body for m in w.messages()] == [b"later"]


# --- RDY window and distribution -------------------------------------------------------------


def test_rdy_is_a_window_not_a_countdown():
    """nsqd delivers while in_flight < RDY, and never decrements RDY itself."""
    h = Harness()
    w = sub(h, rdy=3)
    h.publish("t", *[b"%d" % i for i in range(10)])
    msgs = w.messages()
    assert len(msgs) == 3 and w.client.rdy == 3 and w.client.in_flight == 3
    fin_all(w, msgs[:1])
    more = w.messages()
    assert len(more) == 1 and w.client.in_flight == 3 and w.client.rdy == 3
    fin_all(w, msgs[1:] + more)
    assert len(w.messages()) == 3
    assert h.channel("t", "c").depth() == 3


def test_rdy_zero_pauses_and_raising_resumes():
    """RDY 0 stops delivery; raising RDY delivers what waited."""
    h = Harness()
    w = sub(h, rdy=0)
    h.publish("t", b"a", b"b", b"c")
    w.nothing()
    w.send(cmd("RDY", 2))
    assert len(w.messages()) == 2
    w.send(cmd("RDY", 0))
    w.send(cmd("RDY", 5))
    assert len(w.messages()) == 1


def test_lowering_rdy_below_in_flight_delivers_nothing_until_below():
    """With in_flight >= RDY nothing is delivered until enough is finished."""
    h = Harness()
    w = sub(h, rdy=5)
    h.publish("t", *[b"%d" % i for i in range(10)])
    msgs = w.messages()
    assert len(msgs) == 5
    w.send(cmd("RDY", 2))
    fin_all(w, msgs[:3])
    w.nothing()
    assert w.client.in_flight == 2
    fin_all(w, msgs[3:4])
    assert len(w.messages()) == 1


def test_distribution_among_ready_clients():
    """Messages are shared among every ready client of a channel; each is delivered to exactly one."""
    h = Harness()
    ws = [sub(h, rdy=10) for _ in range(3)]
    h.publish("t", *[b"%d" % i for i in range(30)])
    got = [w.messages() for w in ws]
    assert [len(g) for g in got] == [10, 10, 10]
    bodies = sorted(m.body for g in got for m in g)
    assert bodies == sorted(b"%d" % i for i in range(30))


def test_distribution_when_messages_are_scarce():
    """Fewer messages than total RDY: every message once, spread over more than one client."""
    h = Harness()
    ws = [sub(h, rdy=100) for _ in range(3)]
    p = h.producer()
    p.send(mpub("t", [b"%d" % i for i in range(9)]))
    got = [w.messages() for w in ws]
    assert sum(len(g) for g in got) == 9
    assert sum(1 for g in got if g) >= 2
    assert len({m.id for g in got for m in g}) == 9


def test_busy_client_does_not_block_others():
    """A client at its RDY limit does not stop delivery to another ready client."""
    h = Harness()
    a = sub(h, rdy=1)
    b = sub(h, rdy=100)
    h.publish("t", *[b"%d" % i for i in range(20)])
    assert len(a.messages()) == 1
    assert len(b.messages()) == 19


# --- timeouts, REQ, TOUCH and the queue scan ------------------------------------------------------


def test_in_flight_timeout_requeues_with_timeout_count():
    """An unanswered message is requeued by the queue scan after msg_timeout: timeout_count, attempts+1."""
    h = Harness(msg_timeout=10.0)
    w = sub(h, rdy=1)
    h.publish("t", b"x")
    first = w.messages()[0]
    h.advance(9.8)
    h.scan()
    w.nothing()
    h.advance(0.4)
    h.scan()
    again = w.messages()
    assert [(m.id, m.attempts) for m in again] == [(first.id, 2)]
    ch = h.channel("t", "c")
    assert (ch.timeout_count, ch.requeue_count) == (1, 0)
    assert w.client.in_flight == 1 and w.client.message_count == 2


def test_per_client_msg_timeout():
    """IDENTIFY msg_timeout sets this client's in-flight timeout."""
    h = Harness()
    w = sub(h, rdy=1, msg_timeout=2000)
    h.publish("t", b"x")
    w.messages()
    h.advance(1.9)
    h.scan()
    w.nothing()
    h.advance(0.3)
    h.scan()
    assert [m.attempts for m in w.messages()] == [2]


def test_timeout_redelivers_to_another_client():
    """A timed-out message goes back to the channel queue and to whichever client is ready."""
    h = Harness(msg_timeout=5.0)
    a = sub(h, rdy=1)
    h.publish("t", b"x")
    m = a.messages()[0]
    b = sub(h, rdy=1)
    h.advance(5.2)
    h.scan()
    got = a.messages() + b.messages()
    assert [(g.id, g.attempts) for g in got] == [(m.id, 2)]
    assert a.client.in_flight + b.client.in_flight == 1


def test_req_zero_requeues_at_once():
    """REQ 0 puts the message straight back (no scan needed): requeue_count on channel and client."""
    h = Harness()
    w = sub(h, rdy=1)
    h.publish("t", b"x")
    m = w.messages()[0]
    w.send(cmd("REQ", m.id.decode(), 0))
    again = w.messages()
    assert [(g.id, g.attempts) for g in again] == [(m.id, 2)]
    ch = h.channel("t", "c")
    assert (ch.requeue_count, ch.timeout_count, len(ch.deferred)) == (1, 0, 0)
    assert w.client.requeue_count == 1


def test_req_with_delay_is_deferred_until_the_scan():
    """REQ with a delay defers the message (deferred_count) until the queue scan finds it due."""
    h = Harness()
    w = sub(h, rdy=1)
    h.publish("t", b"x")
    m = w.messages()[0]
    w.send(cmd("REQ", m.id.decode(), 3000))
    w.nothing()
    st = stats_of(h)["topics"][0]["channels"][0]
    assert (st["deferred_count"], st["in_flight_count"], st["depth"], st["requeue_count"]) == (1, 0, 0, 1)
    h.advance(2.9)
    h.scan()
    w.nothing()
    h.advance(0.2)
    h.scan()
    assert [(g.id, g.attempts) for g in w.messages()] == [(m.id, 2)]
    assert stats_of(h)["topics"][0]["channels"][0]["deferred_count"] == 0


def test_req_delay_is_clamped_to_max_req_timeout():
    """A REQ delay above --max-req-timeout is clamped to it, not refused."""
    h = Harness(max_req_timeout=60.0)
    w = sub(h, rdy=1)
    h.publish("t", b"x")
    m = w.messages()[0]
    w.send(cmd("REQ", m.id.decode(), 99999999))
    w.nothing()
    assert w.alive
    h.advance(59.8)
    h.scan()
    w.nothing()
    h.advance(0.4)
    h.scan()
    assert [g.id for g in w.messages()] == [m.id]


def test_touch_extends_the_timeout():
    """TOUCH restarts the client's msg_timeout from now."""
    h = Harness()
    w = sub(h, rdy=1, msg_timeout=10000)
    h.publish("t", b"x")
    m = w.messages()[0]
    h.advance(8)
    w.send(cmd("TOUCH", m.id.decode()))
    w.nothing()
    h.advance(4)  # 12 s after delivery, 4 after the touch
    h.scan()
    w.nothing()
    h.advance(6.3)  # 10.3 s after the touch
    h.scan()
    assert [g.attempts for g in w.messages()] == [2]
    assert h.channel("t", "c").timeout_count == 1


def test_touch_is_capped_by_max_msg_timeout_from_delivery():
    """TOUCH cannot keep a message in flight past delivery + --max-msg-timeout."""
    h = Harness(msg_timeout=10.0, max_msg_timeout=20.0)
    w = sub(h, rdy=1)
    h.publish("t", b"x")
    m = w.messages()[0]
    h.advance(8)
    w.send(cmd("TOUCH", m.id.decode()))
    h.advance(8)  # t = 16
    w.send(cmd("TOUCH", m.id.decode()))  # would be 26, capped at 20
    h.advance(3.8)
    h.scan()
    w.nothing()
    h.advance(0.4)  # t = 20.2
    h.scan()
    assert [g.attempts for g in w.messages()] == [2]


def test_touch_cap_is_never_earlier_than_the_messages_own_delivery_plus_max_msg_timeout():
    """Two messages share a delivery epoch (40 ms apart); a TOUCH of the later one is capped at
    its own delivery + --max-msg-timeout (Go's deadline), never at the epoch's start: it may
    time out a few ms late, never early (it used to be requeued up to 50 ms too soon)."""
    h = Harness(msg_timeout=10.0, max_msg_timeout=20.0)
    w = sub(h, rdy=2)
    h.publish("t", b"a")
    h.advance(0.04)
    h.publish("t", b"b")  # same epoch as "a", delivered 40 ms later
    first, second = w.messages()
    h.advance(14.96)  # t = 15
    w.send(cmd("TOUCH", second.id.decode()))  # now + 10 = 25: capped at delivery + 20 = 20.04
    w.send(cmd("FIN", first.id.decode()))
    h.advance(5.02)  # t = 20.02: before Go's deadline
    h.scan()
    w.nothing()
    h.advance(0.1)  # t = 20.12: past it (and past the at most 50 ms nsqtw may add)
    h.scan()
    assert [(g.id, g.attempts) for g in w.messages()] == [(second.id, 2)]


def test_dpub_matures_via_the_scan():
    """DPUB puts the message in every channel's deferred queue; the scan delivers it once due, attempts 1."""
    h = Harness()
    a = sub(h, channel="a", rdy=1)
    b = sub(h, channel="b", rdy=1)
    p = h.producer()
    p.send(dpub("t", 2000, b"later"))
    p.ok()
    for name in "ab":
        st = stats_of(h, channel=name)["topics"][0]["channels"][0]
        assert (st["deferred_count"], st["depth"], st["message_count"]) == (1, 0, 1)
    h.advance(1.9)
    h.scan()
    a.nothing()
    h.advance(0.2)
    h.scan()
    ma, mb = a.messages(), b.messages()
    assert [m.body for m in ma] == [b"later"] and [m.attempts for m in ma] == [1]
    assert [m.id for m in mb] == [m.id for m in ma]


def test_scan_repeats_while_more_than_25_percent_dirty():
    """The queue scan goes again at once while more than QueueScanDirtyPercent of the sample had expiries."""
    h = Harness(msg_timeout=1.0)
    for i in range(40):
        w = sub(h, topic=f"t{i}", rdy=1)
        h.publish(f"t{i}", b"x")
        w.messages()
    h.advance(1.2)
    rounds = scan_channels(h.broker.channels(), h.now, random.Random(7), 20, 0.25)
    assert rounds >= 2
    assert sum(ch.timeout_count for ch in h.broker.channels()) == 40 or rounds >= 3
    rounds = scan_channels(h.broker.channels(), h.now, random.Random(7), 20, 0.25)
    assert rounds == 1  # nothing left in flight that is due


def test_scan_stops_at_exactly_25_percent():
    """Exactly 25% dirty is not more than QueueScanDirtyPercent: one round."""
    h = Harness(msg_timeout=1.0)
    for i in range(20):
        w = sub(h, topic=f"t{i}", rdy=1)
        if i < 5:
            h.publish(f"t{i}", b"x")
            w.messages()
    h.advance(1.2)
    assert scan_channels(h.broker.channels(), h.now, random.Random(3), 20, 0.25) == 1
    h2 = Harness(msg_timeout=1.0)
    for i in range(20):
        w = sub(h2, topic=f"t{i}", rdy=1)
        if i < 6:
            h2.publish(f"t{i}", b"x")
            w.messages()
    h2.advance(1.2)
    assert scan_channels(h2.broker.channels(), h2.now, random.Random(3), 20, 0.25) == 2


def test_scan_samples_selection_count_channels():
    """With more channels than --queue-scan-selection-count, one round looks at only that many."""
    h = Harness(msg_timeout=1.0)
    for i in range(30):
        w = sub(h, topic=f"t{i}", rdy=1)
        h.publish(f"t{i}", b"x")
        w.messages()
    h.advance(1.2)
    scan_channels(h.broker.channels(), h.now, random.Random(11), 5, 1.0)  # dirty_percent 1.0: one round
    assert sum(ch.timeout_count for ch in h.broker.channels()) == 5


# --- disconnects ----------------------------------------------------------------------------------


@pytest.mark.xfail(reason="nsqtw requeues a disconnected client's in-flight messages at once (counted as "
                          "timeouts); nsqd's Channel.RemoveClient leaves them in flight until msg_timeout, when "
                          "processInFlightQueue requeues them (channel.go RemoveClient/processInFlightQueue)",
                   strict=True)
def test_disconnect_leaves_messages_in_flight_until_timeout():
    """A consumer that disconnects holding messages: they stay in flight until its msg_timeout passes."""
    h = Harness(msg_timeout=30.0)
    a = sub(h, rdy=2)
    h.publish("t", b"x", b"y")
    assert len(a.messages()) == 2
    a.disconnect()
    b = sub(h, rdy=5)
    b.nothing()
    ch = h.channel("t", "c")
    assert len(ch.inflight) == 2 and ch.timeout_count == 0
    h.advance(30.2)
    h.scan()
    assert len(b.messages()) == 2
    assert ch.timeout_count == 2


def test_disconnect_messages_are_redelivered_eventually():
    """Messages held by a consumer that disconnects are redelivered to another consumer (attempts 2)."""
    h = Harness(msg_timeout=30.0)
    a = sub(h, rdy=2)
    h.publish("t", b"x", b"y")
    held = a.messages()
    a.disconnect()
    b = sub(h, rdy=5, msg_timeout=120000)
    got = b.messages()  # nsqtw: at once; nsqd: only after the timeout
    h.advance(30.2)
    h.scan()
    got += b.messages()
    assert sorted(m.id for m in got) == sorted(m.id for m in held)
    assert all(m.attempts == 2 for m in got)


# --- pause -------------------------------------------------------------------------------------


def test_topic_pause_holds_messages_at_the_topic():
    """A paused topic keeps new messages in its own queue; unpausing passes them on."""
    h = Harness()
    w = sub(h, rdy=10)
    h.broker.set_paused("t", None, True)
    h.publish("t", b"a", b"b")
    w.nothing()
    assert h.topic("t").depth() == 2 and h.channel("t", "c").depth() == 0
    assert stats_of(h)["topics"][0]["paused"] is True
    h.broker.set_paused("t", None, False)
    h.settle()
    assert [m.body for m in w.messages()] == [b"a", b"b"]
    assert h.topic("t").depth() == 0


def test_channel_pause_queues_in_channel_but_delivers_nothing():
    """A paused channel still receives its copy (depth grows) but no client gets it until unpaused;
    other channels are unaffected."""
    h = Harness()
    w = sub(h, rdy=10)
    other = sub(h, channel="other", rdy=10)
    h.broker.set_paused("t", "c", True)
    h.publish("t", b"a")
    w.nothing()
    assert [m.body for m in other.messages()] == [b"a"]
    assert h.channel("t", "c").depth() == 1
    assert stats_of(h, channel="c")["topics"][0]["channels"][0]["paused"] is True
    h.broker.set_paused("t", "c", False)
    h.settle()
    assert [m.body for m in w.messages()] == [b"a"]


# --- ephemeral lifecycle and limits ------------------------------------------------------------


def test_ephemeral_channel_deleted_with_its_last_client():
    """An #ephemeral channel disappears when its last client leaves; a normal one stays."""
    h = Harness()
    a = sub(h, channel="e#ephemeral", rdy=1)
    b = sub(h, channel="e#ephemeral", rdy=1)
    n = sub(h, channel="normal", rdy=1)
    a.disconnect()
    assert "e#ephemeral" in h.topic("t").channels
    b.disconnect()
    n.disconnect()
    assert set(h.topic("t").channels) == {"normal"}


def test_ephemeral_topic_deleted_with_its_last_channel():
    """An #ephemeral topic disappears when its last (ephemeral) channel is deleted."""
    h = Harness()
    w = sub(h, topic="t#ephemeral", channel="c#ephemeral", rdy=1)
    w.disconnect()
    assert "t#ephemeral" not in h.broker.topics


def test_ephemeral_overflow_is_dropped():
    """Beyond --mem-queue-size an #ephemeral queue discards messages and still answers OK."""
    h = Harness(mem_queue_size=5)
    sub(h, channel="c#ephemeral")
    p = h.producer()
    for i in range(12):
        p.send(pub("t", b"%d" % i))
    assert p.responses() == [b"OK"] * 12
    assert h.channel("t", "c#ephemeral").depth() == 5
    h2 = Harness(mem_queue_size=5)
    p = h2.producer()
    for i in range(12):
        p.send(pub("x#ephemeral", b"%d" % i))
    assert p.responses() == [b"OK"] * 12
    assert h2.topic("x#ephemeral").depth() == 5


def test_mem_queue_overflow_refused_without_disk():
    """With no disk backend a full non-ephemeral topic refuses PUB with a fatal E_PUB_FAILED; nothing is lost."""
    h = Harness(mem_queue_size=5)
    p = h.producer()
    for i in range(5):
        p.send(pub("t", b"%d" % i))
        p.ok()
    assert p.send(pub("t", b"6")) is False
    err = p.error()
    assert err.startswith(b"E_PUB_FAILED PUB failed ")
    assert h.topic("t").depth() == 5 and h.topic("t").message_count == 5


def test_mem_queue_overflow_mpub_is_all_or_nothing():
    """An MPUB that does not fit is refused whole with E_MPUB_FAILED."""
    h = Harness(mem_queue_size=5)
    p = h.producer()
    p.send(mpub("t", [b"a", b"b", b"c"]))
    p.ok()
    assert p.send(mpub("t", [b"d", b"e", b"f"])) is False
    assert p.error().startswith(b"E_MPUB_FAILED MPUB failed ")
    assert h.topic("t").depth() == 3


def test_mem_queue_overflow_in_a_channel_refused():
    """A channel without consumers that is full refuses further publishes to its topic."""
    h = Harness(mem_queue_size=3)
    sub(h)  # RDY 0: nothing leaves the channel
    p = h.producer()
    for i in range(3):
        p.send(pub("t", b"%d" % i))
        p.ok()
    assert p.send(pub("t", b"x")) is False
    assert p.error().startswith(b"E_PUB_FAILED ")
    assert h.channel("t", "c").depth() == 3


def test_mem_queue_size_zero_without_disk():
    """--mem-queue-size=0 with no disk backend: a non-ephemeral topic can hold nothing, so PUB is refused
    (nsqd would write everything to disk); an #ephemeral topic accepts and drops."""
    h = Harness(mem_queue_size=0)
    p = h.producer()
    assert p.send(pub("t", b"x")) is False
    assert p.error().startswith(b"E_PUB_FAILED PUB failed ")
    assert h.topic("t").depth() == 0
    p = h.producer()
    p.send(pub("e#ephemeral", b"x"))
    p.ok()
    assert h.topic("e#ephemeral").depth() == 0


def test_memory_only_backend_factory_is_explicit():
    """These tests run on nsqtw.nsqd.core.broker.memory_only_backends, whatever the default becomes."""
    h = Harness()
    assert h.broker.backend_factory is memory_only_backends


# --- sample rate ------------------------------------------------------------------------------


def test_sample_rate_drops_the_rest():
    """sample_rate N delivers about (N+1)% of messages; the others are dropped for that client, not requeued."""
    h = Harness(seed=5)
    w = sub(h, rdy=2500, sample_rate=9)
    p = h.producer()
    p.send(mpub("t", [b"%d" % i for i in range(2000)]))
    got = w.messages()
    assert 120 <= len(got) <= 290  # expected 10% of 2000
    ch = h.channel("t", "c")
    assert ch.depth() == 0 and len(ch.inflight) == len(got) == w.client.in_flight


# --- empty and delete --------------------------------------------------------------------------


def test_channel_empty_drops_queued_in_flight_and_deferred():
    """Emptying a channel drops its queue, in-flight and deferred messages, and resets clients' in-flight."""
    h = Harness()
    w = sub(h, rdy=1)
    h.publish("t", b"a", b"b")
    m = w.messages()[0]
    p = h.producer()
    p.send(dpub("t", 5000, b"c"))
    ch = h.channel("t", "c")
    assert (ch.depth(), len(ch.inflight), len(ch.deferred)) == (1, 1, 1)
    ch.empty()
    h.settle()
    assert (ch.depth(), len(ch.inflight), len(ch.deferred), w.client.in_flight) == (0, 0, 0, 0)
    w.send(cmd("FIN", m.id.decode()))
    assert w.error().endswith(b"failed ID not in flight")


def test_topic_empty_leaves_channels_alone():
    """Emptying a topic drops only its own backlog."""
    h = Harness()
    sub(h)
    h.publish("t", b"a")
    h.broker.set_paused("t", None, True)
    h.publish("t", b"b")
    h.topic("t").empty()
    assert h.topic("t").depth() == 0 and h.channel("t", "c").depth() == 1


def test_delete_topic_closes_its_consumers():
    """Deleting a topic closes the connections subscribed to its channels."""
    h = Harness()
    w = sub(h, rdy=1)
    other = sub(h, topic="u", rdy=1)
    h.broker.delete_topic("t")
    h.settle()
    assert w.server_closed and not other.server_closed
    assert "t" not in h.broker.topics


# --- e2e processing latency -----------------------------------------------------------------------


def test_e2e_latency_percentiles():
    """With --e2e-processing-latency-percentile, FIN records now - timestamp in ns; count and the
    [{"quantile","value"}] shape appear in channel and topic stats."""
    h = Harness(e2e_processing_latency_percentiles=[0.99, 0.5])
    w = sub(h, rdy=10)
    h.publish("t", b"a", b"b")
    msgs = w.messages()
    h.advance(0.25)
    fin_all(w, msgs)
    st = stats_of(h)["topics"][0]
    for e2e in (st["channels"][0]["e2e_processing_latency"], st["e2e_processing_latency"]):
        assert list(e2e) == ["count", "percentiles"]
        assert e2e["count"] == 2
        assert [list(p) for p in e2e["percentiles"]] == [["quantile", "value"]] * 2
        assert [p["quantile"] for p in e2e["percentiles"]] == [0.99, 0.5]
        for p in e2e["percentiles"]:
            assert isinstance(p["value"], int)
            assert 0.24e9 <= p["value"] <= 0.26e9


def test_e2e_latency_merges_channels_per_topic():
    """The topic's e2e count is the sum over its channels."""
    h = Harness(e2e_processing_latency_percentiles=[1.0])
    a = sub(h, channel="a", rdy=10)
    b = sub(h, channel="b", rdy=10)
    h.publish("t", b"x", b"y", b"z")
    h.advance(0.1)
    fin_all(a, a.messages())
    fin_all(b, b.messages()[:1])
    st = stats_of(h)["topics"][0]
    assert [c["e2e_processing_latency"]["count"] for c in st["channels"]] == [3, 1]
    assert st["e2e_processing_latency"]["count"] == 4


def test_e2e_latency_disabled_shape():
    """Without percentiles configured, e2e_processing_latency is {"count":0,"percentiles":null}."""
    h = Harness()
    w = sub(h, rdy=1)
    h.publish("t", b"x")
    fin_all(w, w.messages())
    st = stats_of(h)["topics"][0]
    assert st["e2e_processing_latency"] == {"count": 0, "percentiles": None}
    assert st["channels"][0]["e2e_processing_latency"] == {"count": 0, "percentiles": None}


def test_e2e_latency_configured_but_empty():
    """Configured percentiles with no FIN yet report count 0 and value 0 per quantile."""
    h = Harness(e2e_processing_latency_percentiles=[0.5])
    sub(h)
    e2e = stats_of(h)["topics"][0]["channels"][0]["e2e_processing_latency"]
    assert e2e == {"count": 0, "percentiles": [{"quantile": 0.5, "value": 0}]}


# --- client counters ---------------------------------------------------------------------------


def test_client_counters_in_stats():
    """ready_count, in_flight_count, message_count, finish_count, requeue_count and state match the session."""
    h = Harness()
    w = sub(h, rdy=4)
    h.publish("t", b"a", b"b", b"c")
    msgs = w.messages()
    w.send(cmd("FIN", msgs[0].id.decode()) + cmd("REQ", msgs[1].id.decode(), 0))
    w.messages()
    c = stats_of(h)["topics"][0]["channels"][0]["clients"][0]
    assert (c["state"], c["ready_count"], c["in_flight_count"], c["message_count"], c["finish_count"],
            c["requeue_count"]) == (3, 4, 2, 4, 1, 1)


def test_refused_mpub_stores_nothing_while_topic_backlog_is_pumped():
    """An MPUB refused for lack of room stores none of its messages, even while a topic backlog drains."""
    h = Harness(mem_queue_size=20000)
    p = h.producer()
    p.send(mpub("t", [b"old"] * 15000))
    p.ok()
    h.broker.get_topic("t").get_channel("c", h.now)
    h.broker.settle(h.now)  # one pump step: 10000 moved, 5000 still at the topic
    ch = h.channel("t", "c")
    ch.empty()
    before = (h.topic("t").message_count, h.topic("t").depth() + ch.depth())
    p.send(mpub("t", [b"new"] * 16000))
    frames = p.frames()
    if frames == [(0, b"OK")]:
        return  # accepted whole: also all-or-nothing
    assert frames[0][1].startswith(b"E_MPUB_FAILED")
    h.settle()
    assert (h.topic("t").message_count, h.topic("t").depth() + ch.depth()) == before


# --- requeues into a full channel (memory-only backend) -----------------------------------------------

FULL_REASON = ("with memory_only_backends a message coming back to a full channel (REQ 0, an in-flight timeout, "
               "a deferred message maturing, a consumer leaving) hits the refusing overflow queue: Channel.put "
               "raises QueueFull after the message left the in-flight/deferred tables, so an acknowledged message "
               "is lost (and the exception escapes the session/scan). nsqd's Channel.put never refuses a message "
               "it already holds (it spills to the backend: channel.go put/RequeueMessage/processInFlightQueue)")


def _full_channel(h: Harness):
    """A consumer with RDY 1 holding one message while the channel's memory queue (3) is full."""
    w = sub(h, rdy=1)
    h.publish("t", b"a", b"b", b"c", b"d")
    held = w.messages()
    assert [m.body for m in held] == [b"a"] and h.channel("t", "c").depth() == 3
    return w, held[0]


def _drain(h: Harness, w, limit: int = 10):
    """FIN everything the consumer gets, scanning as time passes; return the bodies seen."""
    seen = []
    for _ in range(limit):
        msgs = w.messages()
        if not msgs:
            h.advance(1.0)
            h.scan()
            msgs = w.messages()
            if not msgs:
                break
        seen += [m.body for m in msgs]
        fin_all(w, msgs)
    return seen


def test_req_into_a_full_channel_loses_nothing():
    """REQ 0 of a held message while the channel is full: no error, and the message comes back later."""
    h = Harness(mem_queue_size=3)
    w, held = _full_channel(h)
    assert w.send(cmd("REQ", held.id.decode(), 0)) is True
    # no error; the freed RDY slot takes the next queued message at once, as nsqd's pump would
    nxt = w.messages()
    assert [m.body for m in nxt] == [b"b"]
    fin_all(w, nxt)
    assert sorted(_drain(h, w) + [b"b"]) == [b"a", b"b", b"c", b"d"]


def test_timeout_into_a_full_channel_loses_nothing():
    """An in-flight timeout while the channel is full: the message is requeued, not dropped."""
    h = Harness(mem_queue_size=3, msg_timeout=5.0)
    w, held = _full_channel(h)
    h.advance(5.5)
    h.scan()
    ch = h.channel("t", "c")
    assert ch.timeout_count == 1 and ch.depth() + len(ch.inflight) == 4
    assert sorted(_drain(h, w)) == [b"a", b"b", b"c", b"d"]


def test_deferred_req_maturing_into_a_full_channel_loses_nothing():
    """A deferred REQ that matures while the channel is full is kept."""
    h = Harness(mem_queue_size=3)
    w, held = _full_channel(h)
    w.send(cmd("REQ", held.id.decode(), 1000))
    h.publish("t", b"e")  # the slot the REQ freed is taken again
    h.advance(1.5)
    h.scan()
    ch = h.channel("t", "c")
    assert ch.depth() + len(ch.inflight) + len(ch.deferred) == 5
    assert sorted(_drain(h, w)) == [b"a", b"b", b"c", b"d", b"e"]


def test_consumer_leaving_a_full_channel_loses_nothing():
    """A consumer that disconnects holding a message while the channel is full: the message survives."""
    h = Harness(mem_queue_size=3, msg_timeout=5.0)
    w, held = _full_channel(h)
    w.disconnect()
    h.advance(5.5)
    h.scan()
    other = sub(h, rdy=10)
    assert sorted(_drain(h, other)) == [b"a", b"b", b"c", b"d"]
