"""Drain and planned maintenance, sans-IO and on task.Clock: the drain's steps (deliver, hold,
hand off, drained), the peers' maintenance windows holding adoption back, the new link
frames (HANDOFF, HANDED, MAINT) sealed, and a HELLO that older nodes still read."""

from __future__ import annotations

from typing import Any

from twisted.internet import task

from nsqtw.nsqd.core.drain import (
    DONE, DRAINED, DRAINING, HANDING_OFF, HANDOFF, HOLD, HOLDING, NOTHING, RELEASE, SERVING, Drain,
)
from nsqtw.nsqd.core.replication import AdoptAfterTimeout, OriginLink, ShadowReceiver, ShadowState
from nsqtw.nsqd.core.replication.maintenance import MaintenanceWindows
from nsqtw.nsqd.replication import AdoptionService, ShadowFiles
from nsqtw.protocol import replication as wire

SECRET = b"s" * 32


def test_a_drain_without_a_peer_is_done_when_nothing_is_queued_or_in_flight():
    clock = task.Clock()
    d = Drain()
    assert d.step(clock.seconds(), queued=5, in_flight=0, peer=None) == NOTHING and d.state == SERVING
    assert d.start(clock.seconds()) and not d.start(clock.seconds()) and d.active
    assert d.step(clock.seconds(), queued=5, in_flight=2, peer=None) == NOTHING and d.state == DRAINING
    clock.advance(3)
    assert d.step(clock.seconds(), queued=0, in_flight=1, peer=None) == NOTHING
    assert d.step(clock.seconds(), queued=0, in_flight=0, peer=None) == DONE and d.state == DRAINED
    doc = d.progress(clock.seconds() + 10, queued=0, in_flight=0)
    assert doc["state"] == DRAINED and doc["elapsed_seconds"] == 3 and doc["handed_off"] == 0
    # a message back (an in-flight one timed out elsewhere, an adoption): draining again
    assert d.step(clock.seconds(), queued=1, in_flight=0, peer=None) == NOTHING and d.state == DRAINING
    assert d.cancel() and d.state == SERVING and not d.active


def test_with_a_peer_in_sync_it_holds_delivery_waits_for_in_flight_then_hands_off():
    clock = task.Clock()
    d = Drain(inflight_wait=2.0)
    d.start(clock.seconds())
    assert d.step(clock.seconds(), queued=10, in_flight=3, peer="p:1") == HOLD and d.state == HOLDING
    clock.advance(1)
    assert d.step(clock.seconds(), queued=10, in_flight=1, peer="p:1") == NOTHING
    clock.advance(1)  # the in-flight wait is over: the one left may be delivered twice
    assert d.step(clock.seconds(), queued=10, in_flight=1, peer="p:1") == HANDOFF and d.state == HANDING_OFF
    assert not d.cancel()  # the peer's answer decides first
    assert d.step(clock.seconds(), queued=10, in_flight=1, peer="p:1") == NOTHING
    d.handed(True, 11)
    assert d.state == DRAINING and d.handed_off == 11
    assert d.step(clock.seconds(), queued=0, in_flight=0, peer="p:1") == DONE
    assert d.progress(clock.seconds(), queued=0, in_flight=0)["peer"] == "p:1"


def test_no_in_flight_hands_off_at_once_and_a_lost_peer_releases_delivery():
    clock = task.Clock()
    d = Drain()
    d.start(clock.seconds())
    assert d.step(clock.seconds(), queued=4, in_flight=2, peer="p:1") == HOLD
    assert d.step(clock.seconds(), queued=4, in_flight=2, peer=None) == RELEASE and d.state == DRAINING
    assert d.step(clock.seconds(), queued=4, in_flight=0, peer="p:1") == HOLD
    assert d.step(clock.seconds(), queued=4, in_flight=0, peer="p:1") == HANDOFF


def test_a_peer_that_keeps_refusing_is_tried_max_handoffs_times_then_the_node_delivers():
    clock = task.Clock()
    d = Drain(max_handoffs=2, retry_after=5.0)
    d.start(clock.seconds())
    for _ in range(2):
        assert d.step(clock.seconds(), queued=4, in_flight=0, peer="p:1") == HOLD
        assert d.step(clock.seconds(), queued=4, in_flight=0, peer="p:1") == HANDOFF
        d.handed(False, reason="disk full", now=clock.seconds())
        assert d.handoff_error == "disk full" and d.refused == {"p:1"}
        clock.advance(4.9)  # not again before retry_after
        assert d.step(clock.seconds(), queued=4, in_flight=0, peer="p:1") == NOTHING
        clock.advance(0.1)
    assert d.step(clock.seconds(), queued=4, in_flight=0, peer="p:1") == NOTHING and d.state == DRAINING
    assert d.progress(clock.seconds(), queued=4, in_flight=0)["handoff_error"] == "disk full"


def adoption_on_clock(tmp_path: Any) -> tuple[task.Clock, AdoptionService, MaintenanceWindows, list[int]]:
    """An AdoptionService on task.Clock holding shadows of origins 7 and 8; what it adopts."""
    clock = task.Clock()
    files = ShadowFiles(str(tmp_path), fsync=False)
    files.states[7] = ShadowState()
    files.states[8] = ShadowState()
    adopted: list[int] = []

    def adopt(origin: int, state: Any, done: set[bytes]) -> tuple[int, int, None]:
        adopted.append(origin)
        return 0, 0, None

    service = AdoptionService(files, AdoptAfterTimeout(1.0), clock, adopt, interval=0.25)
    service.maintenance = windows = MaintenanceWindows()
    return clock, service, windows, adopted


def test_a_maintenance_window_keeps_an_origin_from_adoption_until_its_time_is_up(tmp_path):
    clock, service, windows, adopted = adoption_on_clock(tmp_path)
    service.origin_up(7)
    service.origin_up(8)
    windows.set(7, 30.0, clock.seconds())  # asked over the link while the origin was up
    service.startService()
    service.origin_down(7)  # then both go down
    service.origin_down(8)
    clock.pump([0.25] * 8)
    assert adopted == [8]  # the other origin: after --adopt-after, as ever
    clock.pump([0.25] * 108)  # 29 s in
    assert adopted == [8] and 7 in service.pending
    assert windows.remaining(clock.seconds()) == {7: 1.0}
    clock.pump([0.25] * 4)  # the window is over: adopted at once (down far longer than --adopt-after)
    assert adopted == [8, 7] and not windows.until
    service.stopService()


def test_an_origin_back_from_maintenance_ends_its_window_and_a_new_outage_counts_again(tmp_path):
    clock, service, windows, adopted = adoption_on_clock(tmp_path)
    service.origin_up(7)
    windows.set(7, 600.0, clock.seconds())
    service.origin_up(7)  # a second link while it is still up does not end the window
    assert windows.active(7, clock.seconds())
    service.startService()
    service.origin_down(7)
    service.origin_down(7)
    clock.pump([0.25] * 20)
    assert adopted == [8]  # 8 had no link at the start: adopted after --adopt-after
    service.origin_up(7)  # it is back
    assert not windows.until and 7 not in service.pending
    service.origin_down(7)
    clock.pump([0.25] * 5)
    assert adopted == [8, 7]
    windows.set(9, 60.0, clock.seconds())  # a window of 0 ends one at once
    windows.set(9, 0.0, clock.seconds())
    assert not windows.active(9, clock.seconds())
    service.stopService()


def test_a_window_restored_after_the_peer_restarts_still_holds(tmp_path):
    clock, service, windows, adopted = adoption_on_clock(tmp_path)
    clock.advance(100)
    windows.restore(7, 160.0)
    windows.restore(8, 90.0)  # over already
    service.startService()  # both shadows from before the start: down
    clock.pump([0.25] * 120)
    assert adopted == [8]
    clock.pump([0.25] * 121)
    assert adopted == [8, 7]
    service.stopService()


def linked(secret: bytes | None = SECRET) -> tuple[OriginLink, ShadowReceiver, list[Any]]:
    stored: list[Any] = []
    link = OriginLink(1, b"o" * 16, "origin", epoch=42, secret=secret)
    recv = ShadowReceiver(2, b"p" * 16, "peer", lambda o, b: stored.append((o, bytes(b))), secret=secret)
    ev = link.feed(recv.feed(link.start()))
    recv.feed(ev.out)
    assert recv.origin is not None and recv.origin.features & wire.FEATURE_HANDOFF
    return link, recv, stored


def test_handoff_and_maintenance_go_sealed_in_order_after_the_batches_and_handed_comes_back():
    for secret in (SECRET, None):
        link, recv, stored = linked(secret)
        assert link.speaks_handoff
        batch = wire.encode_batch(1, [wire.message_entry("t", 0, b"x")])
        counter, parts = link.handoff(42)
        out = recv.feed(b"".join([*link.seal(batch), *parts, *link.maintenance(90.5)]))
        assert stored and recv.requests == [("handoff", counter, 42), ("maintenance", 0, 90500)]
        ev = link.feed(out + recv.handed(counter, True, b"0" * 16, 7))
        assert ev.acks == [1] and len(ev.handed) == 1
        h = ev.handed[0]
        assert (h.counter, h.ok, h.adopted, h.count) == (counter, True, b"0" * 16, 7)
        again, parts = link.handoff(42)
        recv.feed(b"".join(parts))
        refused = link.feed(recv.handed(again, False, reason="no shadow")).handed[0]
        assert not refused.ok and refused.reason == "no shadow" and refused.counter == again


def test_a_replayed_handoff_on_a_sealed_link_is_refused():
    link, recv, _ = linked()
    _, parts = link.handoff(42)
    frame = b"".join(parts)
    recv.feed(frame)
    assert b"E_BAD_PROTOCOL replayed frame" in recv.feed(frame) and recv.closed


def test_the_hello_feature_byte_is_read_as_part_of_the_name_by_an_older_node():
    frame = wire.encode_hello(3, b"i" * 16, "node-a", 5)
    hello = wire.decode_hello(frame[5:])
    assert hello.name == "node-a" and hello.features == wire.FEATURES and hello.version == wire.VERSION
    # an older node's HELLO: no trailer, no features (HANDOFF and MAINT are never sent to it)
    old = wire.encode_hello(3, b"i" * 16, "node-b", 5, features=0)
    assert wire.decode_hello(old[5:]).features == 0 and wire.decode_hello(old[5:]).name == "node-b"
    # what an older node reads as the name: valid utf-8 it only logs
    assert frame[5 + 2 + 2 + 16 + 8 + 16 + 16 + 32:].decode() == "node-a\x00\x01"
    assert wire.decode_handoff(wire.encode_handoff(4, 42)[5:]) == (4, 42)
    assert wire.decode_maintenance(wire.encode_maintenance(5, 1500)[5:]) == (5, 1500)


class _Topic:
    ephemeral = False
    channels: dict[str, Any] = {}

    def __init__(self, depth: int) -> None:
        self.queued = depth

    def depth(self) -> int:
        return self.queued


class _Node:
    """What DrainService needs of its nsqd: a broker (topics, draining, delivery_held), no
    replication, no nsqlookupd."""

    def __init__(self, topic: _Topic) -> None:
        self.broker = type("B", (), {"topics": {"t": topic}, "draining": False, "delivery_held": False})()
        self.replication = None
        self.lookup_peers = None
        self.settled = 0

    def settle(self) -> None:
        self.settled += 1


def test_a_stop_drains_until_drained_or_its_timeout_and_a_second_signal_cuts_it_short():
    from nsqtw.nsqd.drain import DrainService

    clock = task.Clock()
    topic = _Topic(3)
    node = _Node(topic)
    service = DrainService(node, clock)
    states: list[str] = []
    service.listeners.append(lambda state, doc: states.append(state))
    service.startService()
    stopped = service.drain_for_stop(30.0)
    assert node.broker.draining and not stopped.called and states == ["draining"]
    clock.pump([0.1] * 50)
    assert not stopped.called
    topic.queued = 0  # the consumers took it all
    clock.advance(0.1)
    assert stopped.called and states == ["draining", "drained"]
    assert not service.cut_short()
    service.stopService()
    # the timeout: what is left stays
    clock = task.Clock()
    node = _Node(_Topic(3))
    service = DrainService(node, clock)
    service.startService()
    stopped = service.drain_for_stop(5.0)
    clock.pump([0.1] * 49)
    assert not stopped.called
    clock.pump([0.1] * 2)
    assert stopped.called and service.drain.state == DRAINING
    service.stopService()
    # a second SIGTERM (the CLI calls cut_short)
    clock = task.Clock()
    service = DrainService(_Node(_Topic(3)), clock)
    service.startService()
    stopped = service.drain_for_stop(30.0)
    assert service.cut_short() and stopped.called
    service.stopService()
