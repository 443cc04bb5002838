"""nsqd.dat rewrites are coalesced: at most one in flight, later changes folded into the next."""

from __future__ import annotations

from typing import Any
from collections.abc import Callable

from twisted.internet.defer import Deferred

from nsqtw.backend.metadata import MetadataWriter, load_metadata, metadata_snapshot, write_snapshot
from nsqtw.nsqd.core.broker import Broker
from nsqtw.options import NsqdOptions


class ManualWorker:
    """A sync worker whose jobs run only when the test says so."""

    def __init__(self) -> None:
        self.jobs: list[tuple] = []

    def submit(self, fn: Callable[[], Any]) -> Deferred:
        d: Deferred = Deferred()
        self.jobs.append((fn, d))
        return d

    def run_one(self) -> None:
        fn, d = self.jobs.pop(0)
        try:
            fn()
        except Exception as e:
            d.errback(e)
        else:
            d.callback(None)


def test_many_changes_while_a_rewrite_is_in_flight_cost_one_more_rewrite(tmp_path):
    broker = Broker(NsqdOptions(), 0.0)
    worker = ManualWorker()
    written = []

    def write(snap: Any) -> None:
        written.append([t[0] for t in snap])
        write_snapshot(str(tmp_path), snap)

    w = MetadataWriter(lambda: metadata_snapshot(broker), write, worker.submit)
    broker.get_topic("t0")
    first = w.request()
    assert w.in_flight and len(worker.jobs) == 1
    waits = []
    for i in range(1, 1000):
        broker.get_topic(f"t{i}").get_channel("c", 0.0)
        waits.append(w.request())
    assert len(worker.jobs) == 1  # never more than one rewrite in flight
    worker.run_one()
    assert first.called and not any(d.called for d in waits)
    assert len(worker.jobs) == 1  # the 999 changes folded into one rewrite
    worker.run_one()
    assert all(d.called for d in waits)
    assert w.writes == 2 and not worker.jobs and not w.in_flight
    assert written[0] == ["t0"] and len(written[1]) == 1000
    md = load_metadata(str(tmp_path))
    assert len(md.topics) == 1000 and md.topics[999].channels[0].name == "c"


def test_a_failed_rewrite_reaches_its_waiters_and_the_next_one_still_runs(tmp_path):
    worker = ManualWorker()
    calls = []

    def write(snap: Any) -> None:
        calls.append(snap)
        if len(calls) == 1:
            raise OSError(30, "Read-only file system")

    w = MetadataWriter(lambda: len(calls), write, worker.submit)
    d1 = w.request()
    d2 = w.request()
    errors = []
    d1.addErrback(errors.append)
    worker.run_one()
    assert len(errors) == 1 and errors[0].check(OSError)
    worker.run_one()
    assert d2.called and calls == [0, 1]


def test_snapshot_encoding_is_byte_identical_to_go_shape_encoding():
    from nsqtw.backend.metadata import encode_metadata, encode_snapshot, metadata_from_broker

    broker = Broker(NsqdOptions(), 0.0)
    assert encode_snapshot(metadata_snapshot(broker)) == encode_metadata(metadata_from_broker(broker))
    a = broker.get_topic("a")
    a.get_channel("c1", 0.0).pause()
    a.get_channel("c2#ephemeral", 0.0)
    broker.get_topic("b#ephemeral").get_channel("x", 0.0)
    broker.get_topic("only.topic_-1").pause()
    snap = metadata_snapshot(broker)
    assert encode_snapshot(snap) == encode_metadata(metadata_from_broker(broker))
    assert b'"channels":null' in encode_snapshot(snap) and b"ephemeral" not in encode_snapshot(snap)


def test_rewrites_are_spaced_by_their_own_duration_on_the_injected_clock(tmp_path):
    from twisted.internet import task

    from nsqtw.backend.metadata import GAP_FACTOR

    clock = task.Clock()
    worker = ManualWorker()
    w = MetadataWriter(lambda: None, lambda snap: None, worker.submit, clock=clock)
    w.request()
    clock.advance(0.1)  # the rewrite takes 100 ms
    worker.run_one()
    w.request()
    assert not worker.jobs  # waits GAP_FACTOR x 100 ms
    clock.advance(0.1 * GAP_FACTOR - 0.01)
    assert not worker.jobs
    w.request()  # folded into the same waiting rewrite
    clock.advance(0.02)
    assert len(worker.jobs) == 1
    worker.run_one()
    assert w.writes == 2
    stop = w.request(urgent=True)  # shutdown does not wait
    assert len(worker.jobs) == 1
    worker.run_one()
    assert stop.called


def test_factory_queue_without_metadata_recovers_files_from_the_one_listing(tmp_path):
    """The factory lists the data path once (not once per new queue); a queue whose metadata
    is missing still finds its data files there, and skips files gone since."""
    import os

    from dq_helpers import entry, record

    from nsqtw.backend.disk import SyncWorker, disk_backends

    for name in ("lost", "gone"):
        with open(tmp_path / f"{name}.diskqueue.000003.dat", "wb") as f:
            f.write(b"".join(entry(record(i)) for i in range(5)))
    factory = disk_backends(NsqdOptions(data_path=str(tmp_path)), SyncWorker(None, threaded=False))
    fresh = factory("fresh", False)  # lists the directory
    assert fresh.depth() == 0
    os.unlink(tmp_path / "gone.diskqueue.000003.dat")
    calls = []
    real = os.listdir
    os.listdir = lambda *a: calls.append(a) or real(*a)
    try:
        lost = factory("lost", False)
        gone = factory("gone", False)
        others = [factory(f"n{i}", False) for i in range(20)]
    finally:
        os.listdir = real
    assert calls == []
    assert lost.depth() == 5 and gone.depth() == 0 and all(q.depth() == 0 for q in others)


# --- the snapshot is kept per topic -------------------------------------------------------

def _encoded_by_walk(broker: Broker) -> bytes:
    from nsqtw.backend.metadata import encode_snapshot
    return encode_snapshot(metadata_snapshot(broker))


def test_topic_fragments_say_what_a_full_walk_says_through_every_kind_of_change():
    from nsqtw.backend.metadata import TopicFragments, decode_metadata, encode_fragments
    broker = Broker(NsqdOptions(), 0.0)
    frags = TopicFragments(broker.topics)
    broker.listeners.append(lambda event, topic, channel: frags.touch(topic))

    def same() -> None:
        got = encode_fragments(frags())
        assert got == _encoded_by_walk(broker)
        decode_metadata(got)  # and nsqd.dat stays readable

    same()  # no topics: "topics":null
    for i in range(5):
        t = broker.get_topic(f"t{i}")
        broker._new_channel(t, "c", 0.0)
    same()
    broker._new_channel(broker.topics["t2"], "d", 0.0)
    broker._new_channel(broker.topics["t2"], "e#ephemeral", 0.0)
    broker.get_topic("gone#ephemeral")
    broker.set_paused("t3", None, True)
    broker.set_paused("t1", "c", True)
    same()
    broker.delete_channel("t2", "d")
    broker.delete_topic("t0")
    same()
    broker.set_paused("t3", None, False)
    same()


def test_a_snapshot_redoes_only_the_topics_that_changed():
    """What makes a rewrite's reactor share independent of the number of topics: an untouched
    topic's cached text is reused, not rebuilt from the broker."""
    from nsqtw.backend.metadata import TopicFragments, encode_fragments
    broker = Broker(NsqdOptions(), 0.0)
    frags = TopicFragments(broker.topics)
    for i in range(3):
        broker.get_topic(f"t{i}")
    first = encode_fragments(frags())
    broker._new_channel(broker.topics["t1"], "quiet", 0.0)  # no listener told it: not touched
    assert encode_fragments(frags()) == first
    frags.touch("t1")
    assert b'"quiet"' in encode_fragments(frags())
    assert encode_fragments(frags()) == _encoded_by_walk(broker)
    broker._new_channel(broker.topics["t2"], "late", 0.0)
    frags.touch()  # everything (the shutdown rewrite)
    assert encode_fragments(frags()) == _encoded_by_walk(broker)


def test_the_channel_list_grows_in_place_and_is_rebuilt_after_a_deletion():
    """The queue scan asks for every channel after each creation: appending keeps that O(1)."""
    broker = Broker(NsqdOptions(), 0.0)
    t = broker.get_topic("t")
    a = broker._new_channel(t, "a", 0.0)
    chans = broker.channels()
    assert chans == [a]
    b = broker._new_channel(broker.get_topic("u"), "b", 0.0)
    assert broker.channels() is chans and chans == [a, b]
    broker.delete_channel("t", "a")
    assert broker.channels() == [b]
    broker.delete_topic("u")
    assert broker.channels() == []


def test_a_full_disk_is_logged_as_an_error_the_node_lives_through_not_a_fatal_traceback(tmp_path):
    """Go's nsqd logs ``ERROR: failed to persist metadata - <err>`` and goes on; so does nsqtw
    (a critical event would be printed FATAL, with a traceback, by a node that is not dying)."""
    from twisted.logger import LogLevel, globalLogPublisher

    events: list[dict] = []
    globalLogPublisher.addObserver(events.append)
    try:
        worker = ManualWorker()

        def write(snap: Any) -> None:
            raise OSError(28, "No space left on device")

        w = MetadataWriter(lambda: None, write, worker.submit)
        w.request().addErrback(lambda f: None)
        worker.run_one()
    finally:
        globalLogPublisher.removeObserver(events.append)
    [e] = [e for e in events if "persist metadata" in e.get("log_format", "")]
    assert e["log_level"] == LogLevel.error and "No space left" in e["err"]
