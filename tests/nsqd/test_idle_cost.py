"""What an idle topic and an idle channel cost (issue 13: under 10 KB and 15 KB)."""

from __future__ import annotations

import gc
import tracemalloc

from nsqtw.backend.disk import SyncWorker, disk_backends
from nsqtw.nsqd.core.broker import Broker
from nsqtw.options import NsqdOptions

N = 300


def test_idle_topic_and_channel_stay_small(tmp_path):
    opts = NsqdOptions(data_path=str(tmp_path), e2e_processing_latency_percentiles=[0.99, 0.5])
    broker = Broker(opts, 0.0, backend_factory=disk_backends(opts, SyncWorker(None, threaded=False)))
    broker.get_topic("warm").get_channel("c", 0.0)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for i in range(N):
            broker.get_topic(f"t{i}")
        gc.collect()
        topics = tracemalloc.get_traced_memory()[0]
        for i in range(N):
            broker.topics[f"t{i}"].get_channel("c", 0.0)
        gc.collect()
        channels = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    per_topic = (topics - base) / N
    per_channel = (channels - topics) / N
    assert per_topic < 10_000, per_topic
    assert per_channel < 15_000, per_channel
    # a channel with e2e percentiles shares the broker's random source (a Random is 2.5 KB)
    assert broker.topics["t0"].channels["c"].e2e._rng is broker.rng


def test_idle_topic_and_channel_give_the_collector_few_objects(tmp_path):
    """Every full garbage collection walks every tracked object, so one that lands while many
    topics exist costs in proportion to what each holds: a topic with one channel (disk queues,
    no clients, nothing deferred) is at most 7 tracked objects (it was 19: instance dicts of
    the disk queues, a deque inside each memory queue, a sidecar object, a waiter list and a
    bound method per disk queue, an empty deferred list per topic and channel)."""
    opts = NsqdOptions(data_path=str(tmp_path))
    broker = Broker(opts, 0.0, backend_factory=disk_backends(opts, SyncWorker(None, threaded=False)))
    broker.get_topic("warm").get_channel("c", 0.0)
    gc.collect()
    before = len(gc.get_objects())
    for i in range(N):
        broker.get_topic(f"t{i}").get_channel("c", 0.0)
    gc.collect()
    per_pair = (len(gc.get_objects()) - before) / N
    assert per_pair <= 7.1, per_pair
    topic = broker.topics["t0"]
    assert not hasattr(topic.backend, "__dict__") and not hasattr(topic.mem, "__dict__")
