"""nsqd.dat rewrites are coalesced: at most one in flight, later changes folded into the next."""

from __future__ import annotations

from typing import Any, Callable, List

from twisted.internet.defer import Deferred

from nsqtw.backend.metadata import MetadataWriter, load_metadata, metadata_snapshot, write_snapshot
from nsqtw.nsqd.broker import Broker
from nsqtw.options import NsqdOptions


class ManualWorker:
    """A sync worker whose jobs run only when the test says so."""

    def __init__(self) -> None:
        self.jobs: List[tuple] = []

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
