"""nsqtw.protocol.channels: one channel summed over nsqd (clusterinfo ChannelStats.Add)."""

from __future__ import annotations

from nsqtw.protocol.channels import ChannelCounts


def test_sums_channels_of_several_nsqd() -> None:
    total = ChannelCounts()
    total.add_nsqd({"depth": 7, "backend_depth": 2, "in_flight_count": 1, "deferred_count": 2,
                    "requeue_count": 3, "timeout_count": 4, "message_count": 10, "client_count": 2})
    total.add_nsqd({"depth": 3, "backend_depth": 0, "message_count": 5, "clients": [{}, {}, {}]})
    assert total == ChannelCounts(depth=10, memory_depth=8, backend_depth=2, in_flight_count=1,
                                  deferred_count=2, requeue_count=3, timeout_count=4,
                                  message_count=15, client_count=5)


def test_from_nsqd_then_add_is_add_nsqd() -> None:
    doc = {"depth": 4, "backend_depth": 1, "client_count": 1}
    a = ChannelCounts()
    a.add(ChannelCounts.from_nsqd(doc))
    b = ChannelCounts()
    b.add_nsqd(doc)
    assert a == b == ChannelCounts(depth=4, memory_depth=3, backend_depth=1, client_count=1)


def test_an_odd_counter_is_zero_not_an_error():
    """One nsqd answering null or a string for a counter (or an older one without client_count)
    must not break nsq_stat or an nsqadmin page: that counter is 0, the clients listed count."""
    from nsqtw.protocol.channels import ChannelCounts

    c = ChannelCounts.from_nsqd({"depth": None, "backend_depth": "3", "in_flight_count": True,
                                 "message_count": 7, "clients": [{}, {}]})
    assert (c.depth, c.backend_depth, c.in_flight_count, c.message_count, c.client_count) == (0, 0, 0, 7, 2)
