"""The speed paths: immediate sends, reads into one buffer, the spinning reactor, the flat PUB
and MPUB paths, the lazily built HTTP API and lookup peers.  Each behaves exactly as the slower
path it replaces; these tests pin that down (figures belong to bench/ and perf-vs-go)."""

from __future__ import annotations

import socket
import struct
from typing import Any

import pytest_twisted
import treq

from nsqtw.nsqd.core.broker import Broker
from nsqtw.nsqd.core.guid import GUIDFactory
from nsqtw.nsqd.core.v2 import CLOSE, KEEP, Outcome, V2Session
from nsqtw.options import NsqdOptions

NOW = 1.7e9


# --- the spinning reactor -----------------------------------------------------------------------

class _SocketReader:
    """A reader the reactor polls: each read's bytes (up to 100) go to ``on_read``."""

    def __init__(self, sock: socket.socket, on_read: Any) -> None:
        self.sock = sock
        self.on_read = on_read

    def fileno(self) -> int:
        return self.sock.fileno()

    def doRead(self) -> None:
        self.on_read(self.sock.recv(100))

    def logPrefix(self) -> str:
        return "reader"

    def connectionLost(self, reason: Any) -> None:
        pass


def test_spinning_reactor_dispatches_reads_and_never_outlasts_its_timeout() -> None:
    from nsqtw.runtime.spinreactor import SpinningEPollReactor

    r = SpinningEPollReactor(spin_seconds=30.0)  # a spin that, unbounded, would hang this test
    a, b = socket.socketpair()
    try:
        seen: list[int] = []
        reader = _SocketReader(a, lambda data: seen.append(len(data)))
        r.addReader(reader)
        b.send(b"hello")
        r.doPoll(1.0)
        assert seen == [5]
        assert r._active  # activity: the next poll may spin
        r.doPoll(0.01)  # spins at most the timeout, then returns with nothing
        assert seen == [5] and not r._active
        assert (r._hits, r._misses) == (0, 1)  # a spin that gave up (the policy counts them)
        b.send(b"!")
        r.doPoll(None)
        assert seen == [5, 1]
        r.removeReader(reader)
    finally:
        a.close()
        b.close()
        r._poller.close()


def test_a_yielding_spin_gives_the_cpu_away_between_polls_and_still_dispatches(monkeypatch: Any) -> None:
    import nsqtw.runtime.spinreactor as spinreactor

    yields: list[int] = []
    monkeypatch.setattr(spinreactor, "_sched_yield", lambda: yields.append(1))
    monkeypatch.delenv("NSQTW_SPIN_US", raising=False)
    monkeypatch.setenv("NSQTW_SPIN_ADAPT", "1")
    r = spinreactor.SpinningEPollReactor()
    r.spin_at_least(0.005, yielding=True)
    a, b = socket.socketpair()
    try:
        seen: list[bytes] = []
        r.addReader(_SocketReader(a, seen.append))
        b.send(b"x")
        r.doPoll(1.0)  # an event at once: nothing to give way to
        assert seen == [b"x"] and yields == []
        r.doPoll(0.002)  # a spin that finds nothing: it polled and yielded until the timeout
        assert seen == [b"x"] and len(yields) > 1 and (r._hits, r._misses) == (0, 1)
        r._active = True
        b.send(b"y")
        r.doPoll(1.0)  # the event is there at the spin's first poll
        assert seen == [b"x", b"y"]
        r.removeReader(r.getReaders()[0])
    finally:
        a.close()
        b.close()
        r._poller.close()


def test_spin_is_configurable_and_off_with_zero(monkeypatch: Any) -> None:
    from nsqtw.runtime.spinreactor import DEFAULT_SPIN_US, SpinningEPollReactor

    monkeypatch.setenv("NSQTW_SPIN_US", "0")
    r = SpinningEPollReactor()
    assert r.spin_seconds == 0
    r._poller.close()
    monkeypatch.setenv("NSQTW_SPIN_US", "junk")
    r = SpinningEPollReactor()
    assert r.spin_seconds == DEFAULT_SPIN_US / 1e6
    r._poller.close()


def test_spin_policy_keeps_the_way_that_handles_more_events() -> None:
    from nsqtw.runtime.spinreactor import SpinPolicy

    p = SpinPolicy(0.0)
    w = SpinPolicy.WINDOW
    t = 0.0
    choices = []

    def run(spin_rate: float, still_rate: float) -> None:
        nonlocal t
        t += w
        choices.append(p.spin)
        rate = spin_rate if p.spin else still_rate
        p.window(t, int(rate * w))

    for _ in range(40):  # spinning handles more: the probes of not spinning lose, less and less often
        run(40000, 20000)
    assert choices.count(False) <= 6 and choices[-4:] == [True] * 4
    for _ in range(40):  # now not spinning handles more: the next probe switches, and it stays
        run(20000, 40000)
    assert choices[-20:].count(True) <= 4 and choices[-1] is False
    for _ in range(20):  # a trickle: no spin at all (it would only burn CPU), no probes
        run(100, 50)
    assert choices[-18:] == [False] * 18
    for _ in range(40):  # traffic again, where spinning pays: measured, probed, and kept
        run(40000, 20000)
    assert choices[-4:] == [True] * 4


def test_spin_policy_stops_spinning_where_most_spins_find_nothing() -> None:
    """A replication peer: its next event comes later than a spin lasts, so spinning wins no
    events (the rates are equal) and most spins give up; it stops at the first such window,
    and the probes that try spinning again come less and less often."""
    from nsqtw.runtime.spinreactor import SpinPolicy

    p = SpinPolicy(0.0)
    w = SpinPolicy.WINDOW
    t = 0.0
    choices = []

    def run(rate: float, hit_share: float) -> None:
        nonlocal t
        t += w
        choices.append(p.spin)
        events = int(rate * w)
        spins = events if p.spin else 0
        p.window(t, events, int(spins * hit_share), spins - int(spins * hit_share))

    for _ in range(60):  # even a little faster while spinning, but 3 spins in 4 miss
        run(5000 if not p.spin else 5400, 0.25)
    assert choices[:2] == [True, False]  # the first window says it (its rate is no baseline, its misses are)
    assert choices[-40:].count(True) <= 3
    for _ in range(60):  # where spins find their event (a publisher answered at once): kept
        run(40000 if p.spin else 20000, 0.9)
    assert choices[-4:] == [True] * 4
    for _ in range(20):  # a few spins say nothing (below MIN_SPINS): the rate decides
        t += w
        choices.append(p.spin)
        p.window(t, int(30000 * w), 0, SpinPolicy.MIN_SPINS - 1)
    assert choices[-1] is True


def test_spin_policy_is_off_without_spin_or_when_disabled(monkeypatch: Any) -> None:
    from nsqtw.runtime.spinreactor import SpinningEPollReactor

    for kw, env in (({"spin_seconds": 0.0}, "1"), ({"spin_seconds": 5e-5}, "0"), ({"adapt": False}, "1")):
        monkeypatch.setenv("NSQTW_SPIN_ADAPT", env)
        r = SpinningEPollReactor(**kw)
        assert r._policy is None and r._spin_now
        r._poller.close()
    monkeypatch.setenv("NSQTW_SPIN_ADAPT", "1")
    r = SpinningEPollReactor(spin_seconds=5e-5)
    assert r._policy is not None
    r._poller.close()


def test_spinning_reactor_judges_by_the_work_it_is_told_not_by_events() -> None:
    """A replication peer that sleeps between batches handles more, smaller ones: more events
    for the same messages.  Told what its work is, the reactor's policy gets that count per
    window, not the poll events (and events again once told None)."""
    from nsqtw.runtime.spinreactor import SpinningEPollReactor
    from nsqtw.runtime.turn import IReactorWorkMeter

    r = SpinningEPollReactor(spin_seconds=5e-5, adapt=True)
    assert IReactorWorkMeter.providedBy(r)
    windows: list[int] = []

    class Policy:
        WINDOW = 0.2

        def window(self, now: float, events: int, hits: int = 0, misses: int = 0) -> bool:
            windows.append(events)
            return True

    r._policy = Policy()  # type: ignore[assignment]  # records what the policy is given
    a, b = socket.socketpair()
    work = [1000]

    def stored(data: bytes) -> None:
        work[0] += 7  # each read stores seven messages

    def poll_once() -> None:
        b.send(b"x")
        r._window_end = 0.0  # this poll ends the window
        r.doPoll(1.0)

    try:
        r.addReader(_SocketReader(a, stored))
        poll_once()
        assert windows == [1]  # by events
        r.measure_work(lambda: work[0])
        poll_once()
        poll_once()
        assert windows == [1, 7, 7]  # by the work done since it was told, per window
        work[0] = 0  # a count that went down (a topic deleted): no negative work
        poll_once()
        assert windows[-1] == 0
        r.measure_work(None)
        poll_once()
        assert windows[-1] == 1
        r.removeReader(r.getReaders()[0])
    finally:
        a.close()
        b.close()
        r._poller.close()


def test_spin_at_least_lengthens_only_a_spin_nobody_chose(monkeypatch: Any) -> None:
    from nsqtw.runtime.spinreactor import DEFAULT_SPIN_US, SpinningEPollReactor

    monkeypatch.delenv("NSQTW_SPIN_US", raising=False)
    monkeypatch.setenv("NSQTW_SPIN_ADAPT", "1")
    r = SpinningEPollReactor()
    assert not r.spin_yields
    r.spin_at_least(2e-4, yielding=True)
    assert r.spin_seconds == 2e-4 and r.spin_yields
    r.spin_at_least(1e-4)  # never shorter
    assert r.spin_seconds == 2e-4 and r.spin_yields
    r._poller.close()
    monkeypatch.setenv("NSQTW_SPIN_US", str(DEFAULT_SPIN_US))  # the operator chose it
    r = SpinningEPollReactor()
    r.spin_at_least(2e-4, yielding=True)
    assert r.spin_seconds == DEFAULT_SPIN_US / 1e6 and not r.spin_yields
    r._poller.close()
    monkeypatch.setenv("NSQTW_SPIN_US", "0")  # spinning off stays off
    r = SpinningEPollReactor()
    r.spin_at_least(2e-4)
    assert r.spin_seconds == 0
    r._poller.close()
    monkeypatch.delenv("NSQTW_SPIN_US")
    monkeypatch.setenv("NSQTW_SPIN_ADAPT", "0")  # no policy to stop a longer spin: unchanged
    r = SpinningEPollReactor()
    r.spin_at_least(2e-4)
    assert r.spin_seconds == DEFAULT_SPIN_US / 1e6
    r._poller.close()


# --- the flat PUB and MPUB paths ------------------------------------------------------------------

def test_new_id_follows_new_ids_sequence() -> None:
    a, b = GUIDFactory(7), GUIDFactory(7)
    ns = int(NOW * 1e9)
    singles = [a.new_id(ns) for _ in range(5000)]  # crosses a 4096 sequence rollover
    batch = b.new_ids(5000, ns)
    assert singles == batch
    assert len(set(singles)) == 5000


def test_new_id_interleaved_with_new_ids_matches_new_ids_alone() -> None:
    """new_id's cached head follows batches minted in between, clock steps and rollovers."""
    a, b = GUIDFactory(5), GUIDFactory(5)
    ns = int(NOW * 1e9)
    got: list[bytes] = []
    want: list[bytes] = []
    for step, count in enumerate((1, 3, 4090, 1, 7, 1, 5000, 1)):
        t = ns + (step // 3) * (1 << 20)  # the pseudo-millisecond moves on now and then
        if step % 2 == 0:
            got.extend(a.new_id(t) for _ in range(count))
        else:
            got.extend(a.new_ids(count, t))
        want.extend(b.new_ids(count, t))
    assert got == want
    assert len(set(got)) == len(got)


def test_new_ids_with_prefix_puts_the_prefix_before_each_id() -> None:
    a, b = GUIDFactory(3), GUIDFactory(3)
    ns = int(NOW * 1e9)
    for count in (1, 200, 4500):
        assert a.new_ids(count, ns, b"HEAD") == [b"HEAD" + i for i in b.new_ids(count, ns)]


def _session(**opts: Any) -> Any:
    broker = Broker(NsqdOptions(**opts), NOW)
    client = broker.new_client("127.0.0.1:1", NOW)
    session = V2Session(broker, client)
    session.feed(b"  V2", NOW)
    return broker, client, session


def _frames(broker: Broker, topic: str) -> list[bytes]:
    from nsqtw.backend.runs import run_frames

    return [f for run in broker.topics[topic].mem.drain() for f in run_frames(run)]


def test_pub_frames_match_what_mpub_of_one_would_queue() -> None:
    b1, c1, s1 = _session()
    a1 = s1.feed(b"PUB t\n" + struct.pack(">i", 3) + b"abc", NOW)
    b2, c2, s2 = _session()
    a2 = s2.feed(b"MPUB t\n" + struct.pack(">ii", 11, 1) + struct.pack(">i", 3) + b"abc", NOW)
    (f1,), (f2,) = _frames(b1, "t"), _frames(b2, "t")
    assert f1 == f2  # same size, type, timestamp, attempts, first ID of the node, body
    assert a1.answer == a2.answer == struct.pack(">ii", 6, 0) + b"OK"
    assert a1.close == a2.close == KEEP and a1.progressed and a2.progressed
    assert b1.topics["t"].message_count == 1 and c1.pub_counts == {"t": 1}


def test_uniform_mpub_queues_every_body_in_order() -> None:
    broker, client, session = _session()
    bodies = [b"%05d" % i for i in range(300)]
    payload = b"".join(struct.pack(">i", 5) + body for body in bodies)
    session.feed(b"MPUB t\n" + struct.pack(">ii", 4 + len(payload), 300) + payload, NOW)
    frames = _frames(broker, "t")
    assert [f[34:] for f in frames] == bodies
    assert len({f[18:34] for f in frames}) == 300
    assert all(struct.unpack(">i", f[:4])[0] == 35 and len(f) == 39 for f in frames)


def test_mpub_whose_sizes_differ_in_one_byte_is_walked_and_checked() -> None:
    broker, client, session = _session()
    bodies = [b"aaaa", b"bbbb", b"ccccc"]  # the last size differs only in its low byte
    payload = b"".join(struct.pack(">i", len(x)) + x for x in bodies)
    session.feed(b"MPUB t\n" + struct.pack(">ii", 4 + len(payload), 3) + payload, NOW)
    assert [f[34:] for f in _frames(broker, "t")] == bodies


def test_uniform_mpub_read_in_parts_is_cut_in_runs_not_walked_one_by_one(monkeypatch: Any) -> None:
    """An MPUB of equal bodies that arrives in several reads: the messages already here are
    checked and cut as one run per read (C builtins), and every body is queued in order."""
    from nsqtw.nsqd.core import v2

    runs: list[int] = []
    real = v2._uniform

    def spy(buf: bytes, p: int, stop: int, stride: int, num: int) -> bool:
        runs.append(num)
        return real(buf, p, stop, stride, num)

    monkeypatch.setattr(v2, "_uniform", spy)
    broker, client, session = _session()
    bodies = [b"%05d" % i for i in range(300)]
    payload = b"".join(struct.pack(">i", 5) + body for body in bodies)
    data = b"MPUB t\n" + struct.pack(">ii", 4 + len(payload), 300) + payload
    answers = [session.feed(data[a:b], NOW).answer for a, b in ((0, 1000), (1000, 2001), (2001, len(data)))]
    assert answers == [b"", b"", struct.pack(">ii", 6, 0) + b"OK"]
    assert [f[34:] for f in _frames(broker, "t")] == bodies
    assert len(runs) <= 6 and sum(n for n in runs if n > 1) >= 290  # a few runs, not 300 steps


def test_mpub_read_in_parts_with_a_different_size_inside_is_walked_and_checked() -> None:
    broker, client, session = _session()
    bodies = [b"aaaa"] * 50 + [b"bbbbb"] + [b"cccc"] * 50 + [b""]  # the last one is invalid
    payload = b"".join(struct.pack(">i", len(x)) + x for x in bodies)
    data = b"MPUB t\n" + struct.pack(">ii", 4 + len(payload), len(bodies)) + payload
    out = session.feed(data[:333], NOW)
    assert out.answer == b"" and out.close == KEEP and not out.progressed
    out = session.feed(data[333:], NOW)
    assert b"E_BAD_MESSAGE MPUB invalid message(101) body size 0" in out.answer and out.close == CLOSE
    assert broker.topics["t"].message_count == 0  # all or nothing

    broker, client, session = _session()
    bodies = bodies[:-1]
    payload = b"".join(struct.pack(">i", len(x)) + x for x in bodies)
    data = b"MPUB t\n" + struct.pack(">ii", 4 + len(payload), len(bodies)) + payload
    for a in range(0, len(data), 97):
        session.feed(data[a:a + 97], NOW)
    assert [f[34:] for f in _frames(broker, "t")] == bodies


def test_a_held_pub_takes_the_flat_path_and_its_ok_still_waits(monkeypatch: Any) -> None:
    """With sync_publish (--sync-every=1, replication) the next PUB to the same topic takes
    feed's first branch too, and its OK is held as the loop holds it: out only once synced."""
    broker = Broker(NsqdOptions(), NOW)
    session = V2Session(broker, broker.new_client("127.0.0.1:1", NOW), sync_publish=True)
    session.feed(b"  V2", NOW)
    pub = b"PUB t\n" + struct.pack(">i", 1) + b"x"
    out = session.feed(pub, NOW)  # the loop's way: held
    assert (out.answer, out.close, out.progressed) == (b"", KEEP, True)
    first = out.sync
    walked: list[int] = []
    monkeypatch.setattr(session, "_feed", lambda data, now: walked.append(1) or True)
    out = session.feed(pub, NOW)  # feed's first branch: held too
    assert (out.answer, out.close, out.progressed) == (b"", KEEP, True)
    assert walked == [] and broker.topics["t"].message_count == 2
    second = out.sync
    assert first and second == first + 1
    assert session.synced(first) == Outcome(b"\x00\x00\x00\x06\x00\x00\x00\x00OK") and session.holding
    released = session.synced(second)
    assert released.answer.endswith(b"OK") and released.close == KEEP and not session.holding


def test_pub_with_an_invalid_topic_name_still_fails_after_a_valid_one_was_cached() -> None:
    broker, client, session = _session()
    session.feed(b"PUB good\n" + struct.pack(">i", 1) + b"x", NOW)
    out = session.feed(b"PUB bad!\n" + struct.pack(">i", 1) + b"x", NOW)
    assert b"E_BAD_TOPIC PUB topic name \"bad!\" is not valid" in out.answer and out.close == CLOSE


# --- lazily built parts -----------------------------------------------------------------------------

@pytest_twisted.ensureDeferred
async def test_http_api_answers_though_built_after_start(nsqd: Any) -> None:
    from nsqtw.runtime.listen import LazyFactory

    factory = nsqd._service.http_listener.factory
    assert isinstance(factory, LazyFactory)
    resp = await treq.get(f"http://127.0.0.1:{nsqd.http_port}/ping")
    assert resp.code == 200 and await resp.text() == "OK"
    assert factory.build() is factory.build()  # built once


@pytest_twisted.ensureDeferred
async def test_lookup_peers_are_built_when_an_address_is_configured(nsqd: Any) -> None:
    assert nsqd._service.lookup_peers is None  # none configured: nothing built, nothing imported
    resp = await treq.put(f"http://127.0.0.1:{nsqd.http_port}/config/nsqlookupd_tcp_addresses",
                          data=b'["127.0.0.1:1"]')
    assert resp.code == 200
    peers = nsqd._service.lookup_peers
    assert peers is not None and peers.running and list(peers.peers) == ["127.0.0.1:1"]
    resp = await treq.put(f"http://127.0.0.1:{nsqd.http_port}/config/nsqlookupd_tcp_addresses", data=b"[]")
    assert resp.code == 200 and peers.peers == {}


def test_frames_and_ids_match_the_sliced_frames_and_ids_for_every_run_shape() -> None:
    from nsqtw.backend.runs import frames_and_ids, run_frames, run_ids, run_of_frames, split_run

    broker = Broker(NsqdOptions(), NOW)
    for n in (1, 2, 3, 100, 255, 256, 257, 700, 2500):
        run, _ = broker.make_run([b"%06d" % i + b"b" * 50 for i in range(n)], NOW)
        cases = [run]
        if n > 3:
            head, rest = split_run(run, n // 3)
            cases += [head, rest]
        for r in cases:
            frames, ids = frames_and_ids(r)
            assert list(frames) == run_frames(r)
            assert list(ids) == run_ids(run_frames(r))
    mixed = run_of_frames([f for f in run_frames(broker.make_run([b"a", b"bb", b"ccc"], NOW)[0])])
    frames, ids = frames_and_ids(mixed)
    assert frames == run_frames(mixed) and ids == run_ids(frames)


def test_fin_ids_are_cut_as_the_regular_expression_finds_them() -> None:
    import os
    import re

    from nsqtw.nsqd.core.v2 import _FIN_RUN, _fin_ids

    for n in (1, 2, 7, 100, 256, 300, 1000):
        ids = [os.urandom(8).hex().encode() for _ in range(n)]
        buf = b"RDY 1\n" + b"".join(b"FIN " + i + b"\n" for i in ids) + b"NOP\n"
        m = _FIN_RUN.match(buf, 6)
        assert m is not None
        assert _fin_ids(buf, 6, m.end()) == ids == re.findall(rb"FIN ([^\n\r ]{16})\n", buf)


def test_a_huge_mpub_is_checked_whole_then_stored_a_turn_at_a_time_and_may_be_cut_by_a_refusal() -> None:
    """An MPUB of more than ``MPUB_TURN`` messages: every message is validated, and the topic's
    room checked for all of them, before the first is stored; then a turn's share is stored per
    turn, so a refusal in between (here: another publisher filled the queue) leaves the shares
    already stored, as Go's nsqd keeps the messages its PutMessages stored before one failed."""
    from nsqtw.nsqd.core.broker import memory_only_backends
    from nsqtw.nsqd.core.v2 import MPUB_TURN

    broker = Broker(NsqdOptions(mem_queue_size=2 * MPUB_TURN + 100), NOW, backend_factory=memory_only_backends)
    session = V2Session(broker, broker.new_client("127.0.0.1:1", NOW))
    other = V2Session(broker, broker.new_client("127.0.0.1:2", NOW))
    session.feed(b"  V2", NOW)
    other.feed(b"  V2", NOW)
    num = 2 * MPUB_TURN
    payload = (struct.pack(">i", 1) + b"x") * num
    out = session.feed(b"MPUB t\n" + struct.pack(">ii", 4 + len(payload), num) + payload, NOW)
    while out.more and broker.topics["t"].message_count < MPUB_TURN:
        assert out.answer == b"" and out.close == KEEP
        out = session.feed(b"", NOW)
    assert broker.topics["t"].message_count == MPUB_TURN  # the first share is stored
    fill = 200
    assert other.feed(b"MPUB t\n" + struct.pack(">ii", 4 + 5 * fill, fill) + (struct.pack(">i", 1) + b"y") * fill,
                      NOW).answer.endswith(b"OK")
    out = session.feed(b"", NOW)
    assert b"E_MPUB_FAILED" in out.answer and out.close == CLOSE
    assert broker.topics["t"].message_count == MPUB_TURN + fill  # the first share stays stored


def test_an_invalid_message_anywhere_in_a_huge_mpub_stores_nothing() -> None:
    from nsqtw.nsqd.core.v2 import MPUB_TURN

    broker, client, session = _session()
    num = 2 * MPUB_TURN + 1
    payload = (struct.pack(">i", 1) + b"x") * (num - 1) + struct.pack(">i", 0)
    out = session.feed(b"MPUB t\n" + struct.pack(">ii", 4 + len(payload), num) + payload, NOW)
    while out.more:
        out = session.feed(b"", NOW)
    assert b"E_BAD_MESSAGE MPUB invalid message" in out.answer and out.close == CLOSE
    assert broker.topics["t"].message_count == 0
