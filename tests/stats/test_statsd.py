"""statsd output: NSQ's names, counter deltas, gauges, packing and the spread over interval - 1s."""

from __future__ import annotations

from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer, task
from twisted.internet.protocol import DatagramProtocol

from nsqtw.nsqd.stats.statsd import (StatsdService, mem_lines, pack_datagrams, spread_delays, statsd_lines,
                                statsd_prefix)

from stats_fakes import make_node


def _topic(name: str, msgs: int, nbytes: int, depth: int, channels: list[dict], pct=None) -> dict:
    return {"topic_name": name, "channels": channels, "depth": depth, "backend_depth": depth // 2,
            "message_count": msgs, "message_bytes": nbytes, "paused": False,
            "e2e_processing_latency": {"count": 1 if pct else 0, "percentiles": pct}}


def _channel(name: str, msgs: int, req: int, tmo: int, pct=None) -> dict:
    return {"channel_name": name, "depth": 3, "backend_depth": 1, "in_flight_count": 2, "deferred_count": 1,
            "message_count": msgs, "requeue_count": req, "timeout_count": tmo, "client_count": 4,
            "clients": None, "paused": False,
            "e2e_processing_latency": {"count": 1 if pct else 0, "percentiles": pct}}


def test_prefix_host_key_and_trailing_dot() -> None:
    """%s becomes broadcast_address_port with . and : as _; a dot is appended; empty stays empty."""
    assert statsd_prefix("nsq.%s", "10.1.2.3", 4151) == "nsq.10_1_2_3_4151."
    assert statsd_prefix("stats.%s.", "h", 1) == "stats.h_1."
    assert statsd_prefix("", "h", 1) == ""


def test_lines_names_types_and_deltas() -> None:
    """Counters are deltas from the previous push (whole count the first time), gauges are values."""
    pct = [{"quantile": 0.99, "value": 1234.9}, {"quantile": 1.0, "value": 5000}]
    first = {"topics": [_topic("t", 10, 100, 7, [_channel("c", 10, 1, 2, pct)], pct)]}
    lines = statsd_lines(first, None, "p.")
    assert lines == [
        b"p.topic.t.message_count:10|c\n",
        b"p.topic.t.message_bytes:100|c\n",
        b"p.topic.t.depth:7|g\n",
        b"p.topic.t.backend_depth:3|g\n",
        b"p.topic.t.e2e_processing_latency_99:1234|g\n",
        b"p.topic.t.e2e_processing_latency_100:5000|g\n",
        b"p.topic.t.channel.c.message_count:10|c\n",
        b"p.topic.t.channel.c.depth:3|g\n",
        b"p.topic.t.channel.c.backend_depth:1|g\n",
        b"p.topic.t.channel.c.in_flight_count:2|g\n",
        b"p.topic.t.channel.c.deferred_count:1|g\n",
        b"p.topic.t.channel.c.requeue_count:1|c\n",
        b"p.topic.t.channel.c.timeout_count:2|c\n",
        b"p.topic.t.channel.c.clients:4|g\n",
        b"p.topic.t.channel.c.e2e_processing_latency_99:1234|g\n",
        b"p.topic.t.channel.c.e2e_processing_latency_100:5000|g\n",
    ]
    second = {"topics": [_topic("t", 25, 160, 0, [_channel("c", 24, 1, 5), _channel("new", 3, 0, 0)]),
                         _topic("u", 2, 2, 0, [])]}
    lines2 = statsd_lines(second, first, "p.")
    assert b"p.topic.t.message_count:15|c\n" in lines2
    assert b"p.topic.t.message_bytes:60|c\n" in lines2
    assert b"p.topic.t.channel.c.message_count:14|c\n" in lines2
    assert b"p.topic.t.channel.c.requeue_count:0|c\n" in lines2
    assert b"p.topic.t.channel.c.timeout_count:3|c\n" in lines2
    assert b"p.topic.t.channel.new.message_count:3|c\n" in lines2
    assert b"p.topic.u.message_count:2|c\n" in lines2
    assert not any(b"e2e" in x for x in lines2)


def test_exclude_ephemeral() -> None:
    """--statsd-exclude-ephemeral drops #ephemeral topics and channels."""
    doc = {"topics": [_topic("a#ephemeral", 1, 1, 0, [_channel("c", 1, 0, 0)]),
                      _topic("b", 1, 1, 0, [_channel("x#ephemeral", 1, 0, 0), _channel("y", 1, 0, 0)])]}
    kept = b"".join(statsd_lines(doc, None, "", exclude_ephemeral=True))
    assert b"a#ephemeral" not in kept and b"x#ephemeral" not in kept and b"topic.b.channel.y.depth" in kept
    assert b"a#ephemeral" in b"".join(statsd_lines(doc, None, ""))


def test_mem_lines() -> None:
    """mem.* gauges plus mem.gc_runs as a delta counter."""
    mem = dict(heap_objects=1, heap_idle_bytes=2, heap_in_use_bytes=3, heap_released_bytes=4,
               gc_pause_usec_100=5, gc_pause_usec_99=6, gc_pause_usec_95=7, next_gc_bytes=8, gc_total_runs=30)
    out = mem_lines(mem, {"gc_total_runs": 26}, "n.")
    assert out[0] == b"n.mem.heap_objects:1|g\n"
    assert b"n.mem.next_gc_bytes:8|g\n" in out
    assert out[-1] == b"n.mem.gc_runs:4|c\n"
    assert mem_lines(mem, None, "")[-1] == b"mem.gc_runs:30|c\n"


def test_pack_datagrams_whole_lines() -> None:
    """Lines are packed up to the size, never split; an oversized line travels alone."""
    lines = [b"a" * 9 + b"\n"] * 5  # 10 bytes each
    assert pack_datagrams(lines, 25) == [b"a" * 9 + b"\n" + b"a" * 9 + b"\n"] * 2 + [b"a" * 9 + b"\n"]
    assert pack_datagrams(lines, 30) == [(b"a" * 9 + b"\n") * 3, (b"a" * 9 + b"\n") * 2]
    big = b"b" * 40 + b"\n"
    assert pack_datagrams([b"x\n", big, b"y\n"], 20) == [b"x\n", big, b"y\n"]
    assert pack_datagrams([], 10) == []


def test_spread_delays() -> None:
    """n datagrams spread evenly over interval - 1s, the first at once."""
    assert spread_delays(4, 9.0) == [0.0, 2.0, 4.0, 6.0]
    assert spread_delays(3, 1.0) == [0.0, 0.0, 0.0]
    assert spread_delays(0, 60.0) == []


class _Receiver(DatagramProtocol):
    def __init__(self) -> None:
        self.datagrams: list[bytes] = []
        self.waiters: list[Any] = []

    def datagramReceived(self, data: bytes, addr: Any) -> None:
        self.datagrams.append(data)
        for n, d in list(self.waiters):
            if len(self.datagrams) >= n:
                self.waiters.remove((n, d))
                d.callback(None)

    def wait_for(self, n: int) -> defer.Deferred:
        from twisted.internet import reactor
        d: defer.Deferred = defer.Deferred()
        if len(self.datagrams) >= n:
            d.callback(None)
        else:
            self.waiters.append((n, d))
        return d.addTimeout(5, reactor)


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_service_sends_spread_datagrams_over_udp() -> None:
    """A push on the injected clock sends NSQ lines in <= packet-size datagrams across interval-1s."""
    from twisted.internet import reactor

    receiver = _Receiver()
    port = reactor.listenUDP(0, receiver, interface="127.0.0.1")
    clock = task.Clock()
    clock.advance(1_700_000_000)
    node = make_node(clock)
    for i in range(8):
        node.broker.get_topic(f"topic{i}", clock.seconds()).get_channel("ch", clock.seconds())
    node.broker.publish("topic0", [b"x" * 10] * 5, clock.seconds())
    svc = StatsdService(node, address=f"127.0.0.1:{port.getHost().port}", prefix="nsq.%s",
                        interval=10.0, packet_size=200, mem_stats=True, clock=clock, reactor=reactor)
    svc.startService()
    try:
        clock.advance(9.999)
        assert svc.pushes == 0
        clock.advance(0.001)
        n = svc.last_push_datagrams
        assert n >= 5 and svc.datagrams_sent == 1
        await receiver.wait_for(1)
        step = 9.0 / n
        clock.advance(step * (n - 1) - 0.001)
        assert svc.datagrams_sent == n - 1
        clock.advance(0.002)
        assert svc.datagrams_sent == n
        await receiver.wait_for(n)
        assert len(receiver.datagrams) == n
        assert all(len(d) <= 200 and d.endswith(b"\n") for d in receiver.datagrams)
        lines = b"".join(receiver.datagrams).splitlines()
        key = b"nsq.node1_example_4151."
        assert key + b"topic.topic0.message_count:5|c" in lines
        assert key + b"topic.topic0.message_bytes:50|c" in lines
        assert key + b"topic.topic0.channel.ch.depth:5|g" in lines
        assert key + b"topic.topic7.channel.ch.clients:0|g" in lines
        assert any(x.startswith(key + b"mem.gc_runs:") for x in lines)
        # the next push, one interval after the first: counters are deltas
        node.broker.publish("topic0", [b"y"] * 2, clock.seconds())
        receiver.datagrams.clear()
        clock.advance(10 - (step * (n - 1) + 0.001))
        assert svc.pushes == 2
        n2 = svc.last_push_datagrams
        clock.advance(9)
        await receiver.wait_for(n2)
        lines = b"".join(receiver.datagrams).splitlines()
        assert key + b"topic.topic0.message_count:2|c" in lines
        assert key + b"topic.topic0.message_bytes:2|c" in lines
        assert key + b"topic.topic1.message_count:0|c" in lines
    finally:
        await svc.stopService()
        await port.stopListening()


def test_no_mem_stats_and_stop_cancels_pending(clock) -> None:
    """--statsd-mem-stats=false sends no mem.*; stopping cancels datagrams not yet sent."""
    from twisted.internet import reactor

    node = make_node(clock)
    for i in range(30):
        node.broker.get_topic(f"t{i}", clock.seconds())
    svc = StatsdService(node, address="127.0.0.1:9", mem_stats=False, interval=60.0, packet_size=100,
                        clock=clock, reactor=reactor)
    assert not any(b"mem." in line for line in svc.collect(clock.seconds()))
    svc.startService()
    clock.advance(60)
    assert svc.last_push_datagrams > 2 and svc.datagrams_sent == 1
    svc.stopService()
    clock.advance(60)
    assert svc.datagrams_sent == 1 and not clock.getDelayedCalls()
