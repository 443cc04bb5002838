"""The replication link's handshake, seals, limits and heartbeats, sans-IO and on the glue with
``StringTransport`` and ``task.Clock``: nobody without the shared secret opens a link, injects,
replays or wipes anything; a silent or half-open link is dropped on time; a newer link from an
origin replaces its older ones."""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet import task
from twisted.internet.testing import StringTransport

from nsqtw.nsqd.core.replication import OriginLink, ShadowReceiver
from nsqtw.nsqd.core.replication.adoption import ADOPT, FORGET, STAND_BY, choose
from nsqtw.nsqd.replication import MAX_UNAUTHENTICATED, ShadowFactory, ShadowFiles
from nsqtw.protocol import replication as wire

SECRET = b"s" * 32


def batch(seq: int, body: bytes = b"x") -> bytes:
    return wire.encode_batch(seq, [wire.message_entry("payments", 0, body)])


def pair(origin_secret: bytes | None = SECRET, peer_secret: bytes | None = SECRET,
         stored: list[Any] | None = None) -> tuple[OriginLink, ShadowReceiver]:
    store = (lambda o, b: stored.append((o, bytes(b)))) if stored is not None else (lambda o, b: None)
    return (OriginLink(1, b"o" * 16, "origin", secret=origin_secret),
            ShadowReceiver(2, b"p" * 16, "peer", store, secret=peer_secret))


def test_with_the_secret_both_ends_prove_it_and_every_frame_after_is_sealed():
    stored: list[Any] = []
    link, recv = pair(stored=stored)
    ev = link.feed(recv.feed(link.start()))
    assert ev.hello is not None and ev.hello.proves and link.sealer is not None
    assert recv.origin is None  # the origin has not proved itself yet
    assert recv.feed(ev.out) == b"" and recv.origin is not None and recv.sealer is not None
    sealed = b"".join(link.seal(batch(1)))
    assert len(sealed) == len(batch(1)) + wire.TAG_SIZE
    ack = recv.feed(sealed)
    assert stored == [(1, batch(1)[5:])]
    assert link.ack(ack) == 1  # the sealed ACK, checked on the short way
    # two batches in one read, a BEAT between them: one ACK
    two = b"".join([*link.seal(batch(2)), *link.beat(), *link.seal(batch(3))])
    assert link.feed(recv.feed(two)).acks == [3]
    assert recv.feed(b"".join(link.beat())) == b""  # a BEAT is taken and not answered
    # what the peer tells the origin it holds arrives, sealed
    assert link.feed(recv.holds({7: wire.HELD, 9: wire.ADOPTED})).holds == {7: wire.HELD, 9: wire.ADOPTED}


def test_an_outsider_without_the_secret_is_refused_before_anything_is_stored():
    stored: list[Any] = []
    outsider, recv = pair(origin_secret=None, stored=stored)
    # it claims the real origin's id; the peer answers HELLO with its proof, then wants the AUTH
    with pytest.raises(wire.LinkError, match="has a --replication-secret-file and this node has none"):
        outsider.feed(recv.feed(outsider.start()))
    answer = recv.feed(wire.encode_auth(b"") + batch(1))
    assert b"E_AUTH_FAILED" in answer and recv.closed and recv.origin is None and stored == []
    # a batch instead of the AUTH
    _, recv = pair(stored=stored)
    recv.feed(OriginLink(1, b"o" * 16, "x", secret=SECRET).start())
    assert b"E_BAD_PROTOCOL expected AUTH" in recv.feed(batch(1)) and recv.origin is None and stored == []
    # a made-up proof
    _, recv = pair(stored=stored)
    recv.feed(OriginLink(1, b"o" * 16, "x", secret=SECRET).start())
    assert b"E_AUTH_FAILED the origin could not prove" in recv.feed(wire.encode_auth(b"\0" * 32))
    assert stored == []


def test_a_different_secret_fails_both_ways_and_a_secured_origin_refuses_an_insecure_peer():
    link, recv = pair(origin_secret=b"a" * 32, peer_secret=b"b" * 32)
    with pytest.raises(wire.LinkError, match="could not prove the shared secret"):
        link.feed(recv.feed(link.start()))
    link, recv = pair(origin_secret=SECRET, peer_secret=None)
    with pytest.raises(wire.LinkError, match="has no --replication-secret-file"):
        link.feed(recv.feed(link.start()))
    link, recv = pair(origin_secret=None, peer_secret=None)  # --replication-insecure on both: plain frames
    recv.feed(link.feed(recv.feed(link.start())).out)
    assert recv.origin is not None and recv.feed(batch(1)) == wire.encode_ack(1)


def test_on_a_sealed_link_an_injected_forged_or_replayed_frame_is_refused():
    stored: list[Any] = []
    link, recv = pair(stored=stored)
    recv.feed(link.feed(recv.feed(link.start())).out)
    assert b"E_BAD_PROTOCOL" in recv.feed(batch(1)) and recv.closed  # unsealed: injected
    assert stored == []
    link, recv = pair(stored=stored)
    recv.feed(link.feed(recv.feed(link.start())).out)
    sealed = b"".join(link.seal(batch(5, b"good")))
    assert recv.feed(sealed) and stored[-1][1].endswith(b"good")
    assert b"replayed frame" in recv.feed(sealed) and recv.closed  # the same frame again
    other, recv2 = pair(stored=stored)
    recv2.feed(other.feed(recv2.feed(other.start())).out)
    assert b"bad seal" in recv2.feed(sealed)  # a frame of another link: another key
    assert len(stored) == 1


def test_a_huge_frame_is_refused_on_its_head_and_a_slow_one_is_not_copied_at_every_read():
    _, recv = pair()
    huge = wire.MAGIC + (256 * 1024 * 1024).to_bytes(4, "big") + bytes([wire.HELLO])
    assert b"over this link's limit of 4096" in recv.feed(huge) and recv.closed
    dec = wire.LinkDecoder(max_frame=8 * 1024 * 1024)
    frame = wire.encode_frame(wire.BATCH, bytes(4 * 1024 * 1024))
    dec.feed(frame[:1000])
    buf = dec._buf  # the one buffer the frame's bytes gather in
    for i in range(1000, len(frame) - 4096, 4096):
        assert dec.feed(frame[i:i + 4096]) == []
        assert dec._buf is buf  # appended to, not rebuilt
    rest = frame[1000 + ((len(frame) - 4096 - 1000 + 4095) // 4096) * 4096:]
    [(kind, body)] = dec.feed(rest)
    assert kind == wire.BATCH and len(body) == 4 * 1024 * 1024 and dec.buffered == 0
    with pytest.raises(wire.LinkError, match="over this link's limit"):
        wire.LinkDecoder(max_frame=1024).feed((2048).to_bytes(4, "big") + bytes([wire.BATCH]))


def test_the_survivor_with_the_lowest_id_holding_the_shadow_adopts():
    assert choose(2, []) == (ADOPT, None)
    assert choose(2, [(3, wire.HELD)]) == (ADOPT, None)  # the lowest holder is this node
    assert choose(3, [(2, wire.HELD)]) == (STAND_BY, 2)
    assert choose(3, [(2, wire.ADOPTED)]) == (FORGET, 2)
    assert choose(1, [(2, wire.ADOPTED), (4, wire.HELD)]) == (FORGET, 2)


# --- the peer's glue on a clock ---------------------------------------------------------


class _Adoption:
    def __init__(self) -> None:
        self.up: list[int] = []
        self.down: list[int] = []
        self.holding: dict[int, int] = {}

    def origin_up(self, origin: int) -> None:
        self.up.append(origin)

    def origin_down(self, origin: int) -> None:
        self.down.append(origin)


def _factory(tmp_path: Any, clock: task.Clock) -> tuple[ShadowFactory, _Adoption]:
    factory = ShadowFactory(2, b"p" * 16, "peer", ShadowFiles(str(tmp_path), fsync=False), reactor=clock,
                            timeout=3.0, secret=SECRET)
    adoption = _Adoption()
    factory.adoption = adoption  # type: ignore[assignment]  # a stand-in with the calls the factory makes
    factory.doStart()
    return factory, adoption


def run(clock: task.Clock, seconds: float, step: float = 0.25) -> None:
    """Advance the clock as a reactor that is not busy would: a tick at a time."""
    for _ in range(round(seconds / step)):
        clock.advance(step)


def _connect(factory: ShadowFactory) -> tuple[Any, StringTransport]:
    proto = factory.buildProtocol(None)
    assert proto is not None
    t = StringTransport()
    proto.makeConnection(t)
    return proto, t


def test_a_link_silent_for_the_timeout_is_dropped_and_an_idle_one_gets_beats(tmp_path):
    clock = task.Clock()
    factory, adoption = _factory(tmp_path, clock)
    proto, t = _connect(factory)
    link = OriginLink(1, b"o" * 16, "origin", secret=SECRET)
    proto.dataReceived(link.start())
    ev = link.feed(t.value())
    t.clear()
    proto.dataReceived(ev.out)
    assert adoption.up == [1]
    assert link.feed(t.value()).holds == {1: wire.HELD}  # told what this node holds (its own shadow)
    t.clear()
    for _ in range(4):  # the origin beats: the link lives on
        run(clock, 0.75)
        proto.dataReceived(b"".join(link.beat()))
    assert not t.disconnecting
    assert t.value()  # and this end beat back while it had nothing else to send
    link.feed(t.value())  # sealed BEATs the origin takes
    run(clock, 2.75)  # then nothing arrives (a frozen origin, a silent partition)...
    assert not t.disconnecting
    run(clock, 0.25)  # ...for --replication-timeout: dropped within a tick
    assert t.disconnecting
    factory.doStop()


def test_a_handshake_not_finished_in_time_is_dropped_and_unauthenticated_ones_are_capped(tmp_path):
    clock = task.Clock()
    factory, _ = _factory(tmp_path, clock)
    protos = [_connect(factory) for _ in range(MAX_UNAUTHENTICATED)]
    assert factory.buildProtocol(None) is None and factory.turned_away == 1
    protos[0][0].dataReceived(wire.MAGIC[:4])  # a slow-loris
    run(clock, 3.25)
    assert all(t.disconnecting for _, t in protos)
    factory.doStop()


def test_a_new_authenticated_link_from_an_origin_replaces_its_older_ones(tmp_path):
    clock = task.Clock()
    factory, adoption = _factory(tmp_path, clock)
    links = []
    for _ in range(2):
        proto, t = _connect(factory)
        link = OriginLink(1, b"o" * 16, "origin", secret=SECRET)
        proto.dataReceived(link.start())
        proto.dataReceived(link.feed(t.value()).out)
        links.append((proto, t))
    assert adoption.up == [1, 1]
    assert links[0][1].disconnecting and not links[1][1].disconnecting
    # an outsider claiming the same id without the secret replaces nothing
    proto, t = _connect(factory)
    proto.dataReceived(OriginLink(1, b"o" * 16, "fake").start())
    proto.dataReceived(wire.encode_auth(b""))
    assert t.disconnecting and not links[1][1].disconnecting and adoption.up == [1, 1]
    factory.doStop()


def test_a_peer_with_an_allow_list_refuses_other_node_ids_before_anything_else():
    recv = ShadowReceiver(2, b"p" * 16, "peer", lambda o, b: None, secret=SECRET, allowed=lambda origin: origin == 7)
    answer = recv.feed(OriginLink(1, b"o" * 16, "origin", secret=SECRET).start())
    assert b"E_UNKNOWN_NODE node 1" in answer and recv.closed
    allowed = ShadowReceiver(2, b"p" * 16, "peer", lambda o, b: None, secret=SECRET, allowed=lambda origin: origin == 7)
    link = OriginLink(7, b"o" * 16, "origin", secret=SECRET)
    allowed.feed(link.feed(allowed.feed(link.start())).out)
    assert allowed.origin is not None and allowed.origin.node_id == 7


def test_a_tick_that_comes_late_judges_no_link_silent(tmp_path):
    """A node busy for longer than the timeout (a long adoption) did not read what its origins
    sent meanwhile: that is no silence of theirs; silence after it is."""
    clock = task.Clock()
    factory, _ = _factory(tmp_path, clock)
    proto, t = _connect(factory)
    link = OriginLink(1, b"o" * 16, "origin", secret=SECRET)
    proto.dataReceived(link.start())
    proto.dataReceived(link.feed(t.value()).out)
    clock.advance(10.0)  # one late tick
    assert not t.disconnecting
    run(clock, 3.25)
    assert t.disconnecting
    factory.doStop()
