"""Replicated publish, sans-IO: the link codec, the origin's batches, acknowledgements and
barrier, both ends of a link, and the broker that records what it stores (no sockets; the
times are plain numbers, the broker's clock a task.Clock)."""

from __future__ import annotations

import pytest
from twisted.internet import task

from nsqtw.nsqd.core.broker import Broker
from nsqtw.nsqd.core.replication.broker import StoreHooks
from nsqtw.nsqd.core.replication import (
    OriginLink, PublishRefused, ReplicatedBroker, ReplicationOrigin, ShadowReceiver,
)
from nsqtw.options import NsqdOptions, OptionError
from nsqtw.protocol import replication as wire


def test_codec_round_trip_and_split_reads():
    entries = [(wire.MSG, "t", "", 0, b"\x00\x00\x00\x03abc"), (wire.REQ, "u#x", "c", 0, wire.req_data([(b"i" * 16, 5)])),
               (wire.CHANNEL_NEW, "t", "ch", 0, b"")]
    data = wire.MAGIC + wire.encode_hello(7, b"i" * 16, "node") + wire.encode_batch(5, entries) + wire.encode_ack(5)
    dec = wire.LinkDecoder(expect_magic=True)
    frames = []
    for i in range(len(data)):  # one byte at a time
        frames += dec.feed(data[i:i + 1])
    assert [k for k, _ in frames] == [wire.HELLO, wire.BATCH, wire.ACK]
    hello = wire.decode_hello(frames[0][1])
    assert (hello.node_id, hello.instance, hello.name) == (7, b"i" * 16, "node")
    assert wire.decode_batch(frames[1][1]) == (5, entries)
    assert wire.decode_ack(frames[2][1]) == 5
    assert list(wire.split_frames(b"\x00\x00\x00\x01a\x00\x00\x00\x02bc")) == [b"\x00\x00\x00\x01a", b"\x00\x00\x00\x02bc"]


def test_codec_refuses_other_protocols():
    with pytest.raises(wire.LinkError):
        wire.LinkDecoder(expect_magic=True).feed(b"  V2")
    with pytest.raises(wire.LinkError):
        wire.LinkDecoder().feed(b"\x00\x00\x00\x1e\x00\x00\x00\x01E_BAD_PROTOCOL")  # an nsqd's error frame
    with pytest.raises(wire.LinkError):
        wire.decode_batch(wire.batch_body(1, [wire.message_entry("t", 0, b"abc")])[:-1])
    assert wire.split_req(wire.req_data([(b"i" * 16, 5)])) == [(b"i" * 16, 5)]


def test_shadow_log_ends_at_a_torn_record():
    rec = wire.shadow_record(wire.batch_body(1, [wire.message_entry("t", 0, b"x")]))
    rec2 = wire.shadow_record(wire.batch_body(2, [wire.message_entry("t", 0, b"y")]))
    assert [s for s, _ in wire.read_shadow_records(rec + rec2[:-1])] == [1]


def origin(peers=("a", "b"), min_acks=1, accept=False):
    o = ReplicationOrigin(list(peers), min_acks, accept)
    return o


def test_batches_and_acks_release_the_barrier():
    o = origin()
    o.linked("a", 2, 0.0)
    o.record("t", 0, b"m1", 1)
    o.record("t", 0, b"m2", 1)
    assert o.barrier("tok") is False
    parts, peers = o.take_batch(1.0)
    frame = b"".join(parts)
    assert [p.address for p in peers] == ["a"]
    assert frame.startswith(wire.encode_frame(wire.BATCH, b"")[:0])
    assert o.take_batch(1.0) is None  # nothing new: no batch
    assert o.acked("a", 1) == ["tok"]
    assert o.barrier("again") is True  # everything acknowledged already
    assert o.replicated_messages == 2


def test_min_acks_two_waits_for_both():
    o = origin(min_acks=2)
    o.linked("a", 2, 0.0)
    o.linked("b", 3, 0.0)
    o.record("t", 0, b"m", 1)
    assert o.barrier("tok") is False
    o.take_batch(0.0)
    assert o.acked("a", 1) == []
    assert o.acked("b", 1) == ["tok"]


def test_refused_when_too_few_in_sync_and_held_answers_fail_when_a_peer_drops():
    o = origin()
    o.record("t", 0, b"m", 1)
    with pytest.raises(PublishRefused, match="0 of 2 peers in sync"):
        o.barrier("tok")
    o.linked("a", 2, 0.0)
    o.record("t", 0, b"m", 1)
    assert o.barrier("held") is False
    o.take_batch(0.0)
    assert o.unlinked("a", 1.0, "gone") == ([], ["held"])
    assert o.refused_publishes == 1


def test_degraded_accept_waits_for_the_peers_there_are():
    o = origin(min_acks=2, accept=True)
    assert o.barrier("now") is True  # no peer in sync: accepted at once
    o.linked("a", 2, 0.0)
    o.record("t", 0, b"m", 1)
    assert o.barrier("tok") is False
    o.take_batch(0.0)
    assert o.acked("a", 1) == ["tok"]
    assert o.stats(0.0)["status"] == "degraded-accepting"


def test_a_peer_linked_later_does_not_count_for_batches_it_never_saw():
    o = origin(peers=("a", "b"), min_acks=1)
    o.linked("a", 2, 0.0)
    o.record("t", 0, b"m", 1)
    assert o.barrier("tok") is False
    o.take_batch(0.0)
    o.linked("b", 3, 0.0)  # came in after batch 1 was sent
    assert o.unlinked("a", 0.0, "gone") == ([], [])  # b in sync: the held answer still waits...
    assert o.waiting  # ...for a batch b can never acknowledge: it times out with the link
    assert o.overdue(10.0, 5.0) == []


def test_stalled_links_and_unanswered_hello_are_overdue():
    o = origin()
    o.connecting("a", 0.0)
    o.linked("b", 3, 0.0)
    o.record("t", 0, b"m", 1)
    o.take_batch(1.0)
    assert o.overdue(4.9, 5.0) == []
    assert o.overdue(5.0, 5.0) == ["a"]
    assert o.overdue(6.0, 5.0) == ["a", "b"]


def handshake(recv: ShadowReceiver, link: OriginLink | None = None) -> OriginLink:
    """HELLO, HELLO, AUTH between an origin's end and a peer's."""
    link = link or OriginLink(1, b"o" * 16, "origin")
    ev = link.feed(recv.feed(link.start()))
    assert ev.hello is not None and ev.out
    assert recv.feed(ev.out) == b"" and recv.origin is not None
    return link


def test_link_ends_check_who_is_at_the_other_end():
    stored = []
    recv = ShadowReceiver(2, b"p" * 16, "peer", lambda origin, rec: stored.append((origin, rec)))
    link = OriginLink(1, b"o" * 16, "origin")
    ev = link.feed(recv.feed(link.start()))
    assert ev.hello is not None and ev.hello.node_id == 2 and ev.acks == []
    assert recv.origin is None  # not linked before the AUTH
    recv.feed(ev.out)
    assert recv.origin is not None and recv.origin.node_id == 1
    out = recv.feed(wire.encode_batch(1, [wire.message_entry("t", 0, b"x")]) + wire.encode_batch(2, [wire.message_entry("t", 0, b"y")]))
    assert link.feed(out).acks == [2]  # one ACK for both batches of the read
    assert [o for o, _ in stored] == [1, 1]
    # same node id, the node itself, a V2 client, a full disk
    same = ShadowReceiver(1, b"p" * 16, "peer", lambda o, r: None)
    assert b"E_SAME_NODE_ID" in same.feed(link.start()) and same.closed
    me = ShadowReceiver(9, b"o" * 16, "peer", lambda o, r: None)
    assert b"E_SAME_NODE" in me.feed(link.start()) and me.closed
    v2 = ShadowReceiver(2, b"p" * 16, "peer", lambda o, r: None)
    assert b"E_BAD_PROTOCOL" in v2.feed(b"  V2PUB t\n") and v2.closed

    def full(o, r):
        raise OSError(28, "No space left on device")
    disk = ShadowReceiver(2, b"p" * 16, "peer", full)
    handshake(disk)
    assert b"E_STORE_FAILED" in disk.feed(wire.encode_batch(1, [wire.message_entry("t", 0, b"x")])) and disk.closed
    with pytest.raises(wire.LinkError, match="E_STORE_FAILED"):
        OriginLink(1, b"o" * 16, "origin").feed(wire.encode_hello(2, b"p" * 16, "peer")
                                                 + wire.encode_error("E_STORE_FAILED full"))
    with pytest.raises(wire.LinkError, match="same --node-id"):
        OriginLink(2, b"o" * 16, "origin").feed(wire.encode_hello(2, b"p" * 16, "peer"))


def test_one_batch_or_one_ack_per_read_takes_the_short_way_with_the_same_answers(monkeypatch):
    """A peer's commonest read is one whole BATCH, an origin's one ACK: each is taken without
    the general frame walk (LinkDecoder.feed is not called), and stores, answers and refusals
    are those of the walk: a batch cut in parts, a short batch, a frame of another kind."""
    stored = []
    recv = ShadowReceiver(2, b"p" * 16, "peer", lambda origin, rec: stored.append((origin, rec)))
    link = handshake(recv)
    walks = []
    real = wire.LinkDecoder.feed

    def counted(self, data, *rest):
        walks.append(len(data))
        return real(self, data, *rest)

    monkeypatch.setattr(wire.LinkDecoder, "feed", counted)
    batch = wire.encode_batch(7, [wire.message_entry("t", 0, b"x")])
    ack = recv.feed(batch)
    assert ack == wire.encode_ack(7) and stored == [(1, batch[5:])]
    assert link.ack(ack) == 7
    assert walks == []  # neither end walked its frames
    ack = recv.feed(batch[:9]) + recv.feed(batch[9:])  # in parts: the walk, same answer
    assert ack == wire.encode_ack(7) and len(stored) == 2 and walks
    assert link.feed(ack[:3]).acks == [] and link.feed(ack[3:]).acks == [7]
    short = wire.encode_frame(wire.BATCH, b"1234")  # under a sequence number: refused
    assert b"E_BAD_PROTOCOL malformed BATCH" in recv.feed(short) and recv.closed
    other = ShadowReceiver(2, b"p" * 16, "peer", lambda o, r: None)
    handshake(other)
    assert b"E_BAD_PROTOCOL unexpected frame type" in other.feed(wire.encode_ack(3))


def test_replicated_broker_records_stored_frames_but_not_ephemeral_topics():
    clock = task.Clock()
    clock.advance(1000)
    opts = NsqdOptions(replication_insecure=True, node_id=1, replica_peers=["127.0.0.1:9"])
    got: list[tuple] = []
    fins: list[tuple] = []
    b = ReplicatedBroker(opts, clock.seconds(), hooks=StoreHooks(record=lambda *a: got.append(a),
                                                                  fin=lambda *a: fins.append(a), req=lambda *a: None))
    b.publish_one("t", b"one", clock.seconds())
    b.publish("t", [b"a", b"bb", b"c"], clock.seconds())
    b.publish_deferred("t", b"later", 5.0, clock.seconds())
    b.publish("x#ephemeral", [b"gone"], clock.seconds())
    assert [(t, d, n) for t, d, _, n in got] == [("t", 0, 1), ("t", 0, 3), ("t", int(1005 * 1e9), 1)]
    assert [f[34:] for f in wire.split_frames(got[1][2])] == [b"a", b"bb", b"c"]
    plain = Broker(NsqdOptions(node_id=1), clock.seconds())
    assert "hooks" not in dir(plain)


def test_an_adopted_message_goes_through_the_brokers_store_path_and_is_not_recorded():
    """Adoption stores through Broker.store_frame: a full disk there turns /ping NOK as a
    publish does, and a replicated broker does not record it as a live publish (adoption sends
    it to the peers as a snapshot)."""
    clock = task.Clock()
    clock.advance(1000)
    got: list[tuple] = []
    b = ReplicatedBroker(NsqdOptions(replication_insecure=True, node_id=1, replica_peers=["127.0.0.1:9"]), clock.seconds(),
                         hooks=StoreHooks(record=lambda *a: got.append(a), fin=lambda *a: None, req=lambda *a: None))
    other = Broker(NsqdOptions(node_id=2), clock.seconds())
    run, _ = other.make_run([b"adopted"], clock.seconds())
    frame = run[0]
    b.store_frame("t", ["c"], frame, 0.0, clock.seconds())
    b.store_frame("t", None, frame, clock.seconds() + 60, clock.seconds())
    assert got == []
    assert b.topics["t"].channels["c"].depth() == 1


def test_options_refuse_bad_replication_settings():
    with pytest.raises(OptionError, match="names this node itself"):
        NsqdOptions(node_id=1, replication_insecure=True, replication_address="0.0.0.0:4153", replica_peers=["localhost:4153"])
    with pytest.raises(OptionError, match="--replication-min-acks must be \\[1,1\\]"):
        NsqdOptions(node_id=1, replication_insecure=True, replica_peers=["10.0.0.2:4153"], replication_min_acks=2)
    with pytest.raises(OptionError, match="--replication-degraded must be refuse or accept"):
        NsqdOptions(replication_degraded="maybe")
    with pytest.raises(OptionError, match="same peer twice"):
        NsqdOptions(node_id=1, replication_insecure=True, replica_peers=["10.0.0.2:4153", "10.0.0.2:4153"])
    NsqdOptions(node_id=1, replication_insecure=True, replication_address="127.0.0.1:4153", replica_peers=["127.0.0.1:4154"])  # a pair on one host


def test_replication_is_refused_at_start_without_a_node_id_or_a_secret():
    """Misconfiguration is found at start, in one line naming the flag: the default --node-id
    (a hash of the host name, the same for two nodes on one host), no secret and no explicit
    --replication-insecure, both at once, a bad allow-list."""
    with pytest.raises(OptionError, match="need an explicit --node-id"):
        NsqdOptions(replication_insecure=True, replica_peers=["10.0.0.2:4153"])
    with pytest.raises(OptionError, match="need an explicit --node-id"):
        NsqdOptions(replication_insecure=True, replication_address="127.0.0.1:4153")
    with pytest.raises(OptionError, match="replication needs --replication-secret-file"):
        NsqdOptions(node_id=3, replica_peers=["10.0.0.2:4153"])
    with pytest.raises(OptionError, match="exclude each other"):
        NsqdOptions(node_id=3, replica_peers=["10.0.0.2:4153"], replication_insecure=True,
                    replication_secret_file="/etc/secret")
    with pytest.raises(OptionError, match="--replication-allow-node must be"):
        NsqdOptions(node_id=3, replication_address="127.0.0.1:4153", replication_insecure=True,
                    replication_allow=["x"])
    assert NsqdOptions().node_id == NsqdOptions(node_id=int(NsqdOptions().node_id)).node_id  # unreplicated: as NSQ
    NsqdOptions(node_id=3, replica_peers=["10.0.0.2:4153"], replication_secret_file="/etc/secret")


def test_a_batch_of_one_item_is_encoded_as_any_batch_is():
    """The one-item batch (a PUB's, the commonest) is joined in one step: the same bytes as
    the parts of the general encoding, and it decodes to the same item; so is the ACK."""
    frame_ = b"\x00\x00\x00\x22" + b"\x00" * 8 + b"\x00\x01" + b"%016d" % 5 + b"body"
    for entry in [(wire.MSG, "t", "", 0, frame_), (wire.MSG, "tópico", "", 123_456, frame_ * 3),
                  (wire.FIN, "t", "ch", 0, wire.fin_data([b"%016d" % 5]))]:
        one = wire.encode_batch(9, [entry])
        assert one == b"".join(wire.encode_batch_parts(9, [entry]))
        [(kind, body)] = wire.LinkDecoder().feed(one)
        assert kind == wire.BATCH and wire.decode_batch(body) == (9, [entry])
    assert wire.encode_ack(77) == wire.encode_frame(wire.ACK, (77).to_bytes(8, "big"))
    assert wire.LinkDecoder().ack(wire.encode_ack(77)) == 77


def test_an_unreplicated_nsqd_does_not_import_replication():
    """Replication costs an nsqd that does not use it nothing, its start-up imports included."""
    import subprocess
    import sys

    code = ("import sys; from nsqtw.nsqd.service import NsqdService; from nsqtw.cli import main; "
            "print(sorted(m for m in sys.modules if 'replication' in m))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
