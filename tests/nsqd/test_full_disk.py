"""A disk that refuses writes loses nothing acknowledged (issue 13), at unit level.

An injected backend stands in for the disk queue: it stores runs in memory
and raises BackendError while ``disk.full`` (or after ``disk.room`` more
messages, to store a run in part, as a disk queue whose run spans a file roll
does).  Every path that puts an acknowledged message back is covered: timeout,
client disconnect, deferred coming due, a new channel copying the topic's
backlog, REQ (refused with E_REQ_FAILED, the message stays in flight), and
a clean shutdown (counted and reported as lost, never silently).
"""

from __future__ import annotations

from collections import deque
from typing import Any


from nsqtw.backend.runs import Run, run_frames, run_of_frames
from nsqtw.errors import BackendError
from nsqtw.nsqd.core.broker import Broker
from nsqtw.protocol.frames import FRAME_ERROR

from nsqd_harness import Harness, cmd, dpub, stats_of


class FakeDisk:
    """What every queue shares: whether the disk accepts writes."""

    def __init__(self) -> None:
        self.full = False
        self.room: int | None = None  # messages accepted before it fills up
        self.queues: dict = {}


class FailingQueue:
    """A durable queue held in memory that fails like a full disk on demand."""

    accepts_all = True

    def __init__(self, disk: FakeDisk) -> None:
        self.disk = disk
        self.frames: deque[bytes] = deque()
        self.put_count = 0
        self.deferred_sink = None

    def put(self, run: Run) -> None:
        frames = run_frames(run)
        if self.disk.room is not None:
            take = min(self.disk.room, len(frames))
            self.frames.extend(frames[:take])
            self.put_count += take
            self.disk.room -= take
            if take < len(frames):
                raise BackendError("DISKQUEUE(fake) write failed - No space left on device")
            return None
        if self.disk.full:
            raise BackendError("DISKQUEUE(fake) write failed - No space left on device")
        self.frames.extend(frames)
        self.put_count += len(frames)
        return None

    def read(self, n: int, max_bytes: int = 0) -> list[Run]:
        out = []
        while self.frames and len(out) < n:
            out.append(self.frames.popleft())
        return [run_of_frames(out)] if out else []

    def depth(self) -> int:
        return len(self.frames)

    def empty(self) -> None:
        self.frames.clear()

    def delete(self) -> None:
        self.frames.clear()

    def close(self) -> None:
        pass


def harness(**opts: Any) -> tuple[Harness, FakeDisk]:
    opts.setdefault("mem_queue_size", 0)
    h = Harness(**opts)
    disk = FakeDisk()

    def factory(name: str, ephemeral: bool) -> FailingQueue:
        q = FailingQueue(disk)
        disk.queues[name] = q
        return q

    h.broker = Broker(h.options, h.now, backend_factory=factory, rng=h.rng)
    return h, disk


def bodies(msgs: list) -> list[bytes]:
    return sorted(m.body for m in msgs)


def held(h: Harness, topic: str = "t", channel: str = "c") -> int:
    doc = stats_of(h)
    for t in doc["topics"]:
        for c in t["channels"]:
            if t["topic_name"] == topic and c["channel_name"] == channel:
                return c.get("held_count", 0)
    raise AssertionError("no such channel")


def drain(h: Harness, n: int) -> list[bytes]:
    """Consume and FIN every message of t:c with a fresh consumer; their bodies."""
    w = h.consumer("t", "c", rdy=n + 10)
    msgs = w.messages()
    for m in msgs:
        w.send(cmd("FIN", m.id.decode()))
    w.frames()
    w.disconnect()
    return bodies(msgs)


def sent(n: int) -> list[bytes]:
    return sorted(b"m%03d" % i for i in range(n))


def test_disconnect_while_full_holds_then_writes_out():
    h, disk = harness()
    c = h.consumer("t", "c", rdy=20)
    h.publish("t", *[b"m%03d" % i for i in range(20)])
    assert len(c.messages()) == 20
    disk.full = True
    c.disconnect()  # 20 in flight go back: the disk refuses them all
    assert held(h) == 20
    assert h.broker.health_status().startswith("NOK - 20 messages held in memory")
    assert stats_of(h)["health"].startswith("NOK")
    from nsqtw.nsqd.stats.prometheus import render_metrics
    page = render_metrics(stats_of(h)).decode()
    assert 'nsq_channel_held{topic="t",channel="c"} 20' in page and "nsq_healthy 0" in page
    assert h.broker.backlog.retry() == 20  # still full: nothing changes
    assert held(h) == 20
    disk.full = False
    assert h.broker.backlog.retry() == 0
    assert held(h) == 0 and h.broker.health_status() == "OK"
    assert disk.queues["t:c"].depth() == 20  # written out to the disk queue
    assert drain(h, 20) == sent(20)


def test_timeouts_while_full_are_held_and_delivered():
    h, disk = harness(msg_timeout=10.0)
    c = h.consumer("t", "c", rdy=10)
    h.publish("t", *[b"m%03d" % i for i in range(10)])
    assert len(c.messages()) == 10
    c.send(cmd("RDY", 0))
    disk.full = True
    h.advance(11)
    h.scan()
    assert held(h) == 10
    assert h.channel("t", "c").timeout_count == 10
    disk.full = False
    h.broker.backlog.retry()
    c.disconnect()
    assert drain(h, 10) == sent(10)


def test_held_messages_are_delivered_even_while_the_disk_stays_full():
    h, disk = harness(msg_timeout=10.0)
    c = h.consumer("t", "c", rdy=5)
    h.publish("t", *[b"m%03d" % i for i in range(5)])
    first = c.messages()
    disk.full = True
    h.advance(11)
    h.scan()  # requeued to memory and, the consumer being ready, delivered again
    again = c.messages()
    assert bodies(again) == bodies(first) and all(m.attempts == 2 for m in again)
    for m in again:
        c.send(cmd("FIN", m.id.decode()))
    assert held(h) == 0 and h.broker.health_status() == "OK"


def test_deferred_coming_due_while_full_is_held():
    h, disk = harness()
    c = h.consumer("t", "c", rdy=0)
    p = h.producer()
    for i in range(3):
        p.send(dpub("t", 5000, b"m%03d" % i))
        p.ok()
    disk.full = True
    h.advance(6)
    h.broker.find_channel("t", "c").process_deferred(h.now)
    assert held(h) == 3
    c.disconnect()
    disk.full = False
    h.broker.backlog.retry()
    assert drain(h, 3) == sent(3)


def test_new_channel_copying_the_topic_backlog_while_full():
    h, disk = harness()
    h.publish("t", *[b"m%03d" % i for i in range(8)])  # no channel yet: topic's disk queue
    assert h.topic("t").depth() == 8
    disk.full = True
    w = h.consumer("t", "c", rdy=0)  # creates t:c, the topic's backlog moves to it
    assert h.topic("t").depth() == 0
    assert held(h, "t", "c") == 8
    w.disconnect()
    disk.full = False
    assert h.broker.backlog.retry() == 0
    assert drain(h, 8) == sent(8)


def test_run_stored_in_part_is_neither_lost_nor_duplicated():
    h, disk = harness()
    c = h.consumer("t", "c", rdy=10)
    h.publish("t", *[b"m%03d" % i for i in range(10)])
    c.messages()
    disk.room = 4  # the next write stores 4 messages, then the disk is full
    c.disconnect()
    assert disk.queues["t:c"].depth() == 4
    assert held(h) == 6
    disk.room = None
    h.broker.backlog.retry()
    assert held(h) == 0
    assert drain(h, 10) == sent(10)


def test_req_the_disk_cannot_take_is_refused_and_stays_in_flight():
    h, disk = harness()
    c = h.consumer("t", "c", rdy=2)
    h.publish("t", b"m000", b"m001")
    a, b = c.messages()
    disk.full = True
    assert c.send(cmd("REQ", a.id.decode(), 0))  # not fatal: the connection stays
    ftype, data = c.one()
    assert ftype == FRAME_ERROR
    assert data.startswith(b"E_REQ_FAILED REQ " + a.id + b" failed DISKQUEUE(fake) write failed")
    ch = h.channel("t", "c")
    assert a.id in ch.inflight and len(ch.inflight) == 2 and ch.requeue_count == 0
    assert held(h) == 0
    c.send(cmd("REQ", b.id.decode(), 1000))  # a deferred REQ needs no disk
    c.nothing()
    assert b.id not in ch.inflight and len(ch.deferred) == 1
    c.send(cmd("FIN", a.id.decode()))  # still ours
    c.nothing()
    assert not ch.inflight


def test_clean_shutdown_on_a_full_disk_counts_what_it_loses(tmp_path):
    from twisted.internet import task

    from nsqtw.options import NsqdOptions
    from nsqtw.nsqd.service import NsqdService

    disk = FakeDisk()
    opts = NsqdOptions(data_path=str(tmp_path), mem_queue_size=100, tcp_address="127.0.0.1:0",
                       http_address="")
    svc = NsqdService(opts, task.Clock(), backend_factory=lambda name, eph: FailingQueue(disk),
                      sync_thread=False)
    svc.broker.publish("t", [b"a", b"b", b"c"], 0.0)
    svc.broker.get_topic("t").get_channel("c", 0.0)
    svc.broker.settle(0.0)
    disk.full = True
    svc._flush_queues()
    assert svc.lost_at_shutdown == 3


def test_retry_runs_on_the_service_clock(tmp_path):
    from twisted.internet.testing import MemoryReactorClock

    from nsqtw.options import NsqdOptions
    from nsqtw.nsqd.service import HELD_RETRY_INTERVAL, NsqdService

    disk = FakeDisk()
    clock = MemoryReactorClock()
    opts = NsqdOptions(data_path=str(tmp_path), mem_queue_size=0, tcp_address="127.0.0.1:0",
                       http_address="")
    svc = NsqdService(opts, clock, backend_factory=lambda name, eph: FailingQueue(disk),
                      sync_thread=False)
    svc.startService()
    try:
        broker = svc.broker
        ch = broker.get_topic("t").get_channel("c", 0.0)
        disk.full = True
        broker.backlog.hold(ch, run_of_frames([b"x" * 40]), BackendError("full"))
        assert broker.backlog.count() == 1
        clock.advance(HELD_RETRY_INTERVAL)
        assert broker.backlog.count() == 1
        disk.full = False
        clock.advance(HELD_RETRY_INTERVAL)
        assert broker.backlog.count() == 0 and ch.backend.depth() == 1
    finally:
        svc.stopService()


# --- issue 24: refusing publishes while held, the held-memory cap ------------------------


def hold_n(h: Harness, disk: FakeDisk, n: int, **consumer: Any) -> Any:
    """``n`` acknowledged messages in flight, the disk fills, their timeouts expire: held."""
    c = h.consumer("t", "c", rdy=n, **consumer)
    h.publish("t", *[b"m%03d" % i for i in range(n)])
    assert len(c.messages()) == n
    c.send(cmd("RDY", 0))
    disk.full = True
    h.advance(h.options.msg_timeout + 1)
    h.scan()
    return c


def test_new_publishes_are_refused_while_messages_are_held():
    from nsqd_harness import mpub, pub

    h, disk = harness(msg_timeout=10.0)
    c = hold_n(h, disk, 5)
    assert held(h) == 5
    disk.full = False  # space came back, but the held messages must get it first
    p = h.producer()
    p.send(pub("t", b"new"))
    assert p.error().startswith(b"E_PUB_FAILED PUB failed disk full: 5 acknowledged messages are held")
    p = h.producer()  # a failed publish is fatal to its connection, as in nsqd
    p.send(mpub("t", [b"a", b"b"]))
    assert p.error().startswith(b"E_MPUB_FAILED MPUB failed disk full: 5")
    p = h.producer()
    p.send(dpub("t", 1000, b"later"))
    assert p.error().startswith(b"E_DPUB_FAILED DPUB failed disk full: 5")
    assert disk.queues["t:c"].depth() == 0  # nothing new took the space
    assert h.broker.backlog.retry() == 0  # the held ones are written back first
    assert disk.queues["t:c"].depth() == 5
    p = h.producer()
    p.send(pub("t", b"new"))
    p.ok()
    c.disconnect()
    assert drain(h, 6) == sorted(sent(5) + [b"new"])


def test_publishes_that_need_no_disk_are_still_taken_while_held():
    from nsqd_harness import pub

    h, disk = harness(msg_timeout=10.0, mem_queue_size=0)
    hold_n(h, disk, 3)
    from nsqtw.backend.dummy import DummyQueue

    ch = h.broker.get_topic("eph#ephemeral").get_channel("x#ephemeral", h.now)
    ch.backend = DummyQueue()  # what the disk factory gives an ephemeral channel
    p = h.producer()
    p.send(pub("eph#ephemeral", b"fine"))  # an ephemeral queue is no disk
    p.ok()


def test_at_the_cap_timeouts_are_extended_and_memory_stays_flat():
    # each message is held as its frame, 4 bytes of body and 34 of head: a cap of 5 frames
    h, disk = harness(msg_timeout=10.0, max_held_bytes=5 * 38)
    c = h.consumer("t", "c", rdy=12)
    h.publish("t", *[b"m%03d" % i for i in range(12)])
    first = c.messages()
    assert len(first) == 12
    c.send(cmd("RDY", 0))
    disk.full = True
    # a REQ 0 the disk cannot take stays in flight; timeouts then hold what fits
    ch = h.channel("t", "c")
    backlog = h.broker.backlog
    h.advance(11)
    h.scan()  # all 12 expire together: the first hold may pass the cap once, never grow after
    n_held = held(h)
    assert n_held == 12 and backlog.at_cap()
    # a second consumer's messages time out while at the cap: they stay in flight
    c.disconnect()  # nothing more of c's was in flight
    c2 = h.consumer("t", "c", rdy=4)
    got = c2.messages()
    assert len(got) == 4 and held(h) == 8
    c2.send(cmd("RDY", 0))
    for _ in range(5):
        h.advance(11)
        h.scan()
        assert held(h) == 8  # flat: nothing timed out was added
    assert len(ch.inflight) == 4
    assert ch.timeout_extended_count == 20 and backlog.extended == 20
    doc = stats_of(h)
    assert doc["held"] == {"count": 8, "bytes": 8 * 38, "max_bytes": 5 * 38, "timeout_extended_count": 20}
    assert doc["topics"][0]["channels"][0]["timeout_extended_count"] == 20
    from nsqtw.nsqd.stats.prometheus import render_metrics
    page = render_metrics(doc).decode()
    assert "nsq_held_bytes 304" in page and "nsq_held_max_bytes 190" in page
    assert 'nsq_channel_timeout_extended_total{topic="t",channel="c"} 20' in page
    for m in got:  # still theirs to finish
        c2.send(cmd("FIN", m.id.decode()))
    c2.nothing()
    assert not ch.inflight
    disk.full = False
    assert backlog.retry() == 0
    c2.disconnect()
    assert sorted(drain(h, 8) + bodies(got)) == sent(12)


def test_deferred_messages_wait_at_the_cap():
    h, disk = harness(msg_timeout=10.0, max_held_bytes=38)
    c = hold_n(h, disk, 2)
    assert h.broker.backlog.at_cap()
    ch = h.channel("t", "c")
    ch.put_deferred(run_of_frames([b"x" * 34])[0], h.now + 1)
    h.advance(2)
    assert ch.process_deferred(h.now) is False and len(ch.deferred) == 1  # waits, not held
    assert held(h) == 2
    disk.full = False
    h.broker.backlog.retry()
    assert ch.process_deferred(h.now) is True and not ch.deferred
    c.disconnect()


def test_topic_backlog_waits_on_its_disk_while_messages_are_held():
    h, disk = harness(msg_timeout=10.0)
    h.broker.publish("u", [b"u1", b"u2"], h.now)  # a backlog on the topic's disk queue
    hold_n(h, disk, 3)
    disk.full = False
    assert h.topic("u").depth() == 2
    w = h.consumer("u", "uc", rdy=0)
    assert h.topic("u").depth() == 2  # not copied to the new channel while held
    h.broker.backlog.retry()
    h.broker.resume_pumps()
    h.settle()
    assert h.topic("u").depth() == 0 and h.channel("u", "uc").depth() == 2
    w.disconnect()
