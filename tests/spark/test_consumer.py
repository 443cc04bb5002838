"""The blocking V2 consumer the Spark source uses, against a real nsqtw nsqd in a child process."""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def broker():
    from live_nsqd import LiveNsqd
    n = LiveNsqd()
    yield n
    n.stop()


def _poll_until(consumer, predicate, timeout: float = 10.0) -> list:
    got = []
    deadline = time.monotonic() + timeout
    while not predicate(got):
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        got.extend(consumer.poll(0.2))
    return got


def test_receives_fins_and_answers_heartbeats(broker) -> None:
    """Messages arrive byte for byte; FIN empties the channel; 1 s heartbeats keep one connection alive."""
    from nsqtw.spark.consumer import BlockingConsumer

    bodies = [b"a", b"b\nc", bytes([255, 0, 1])] + [b"m%d" % i for i in range(50)]
    broker.mpub("ct", bodies)
    c = BlockingConsumer("ct", "ch", nsqd_tcp_addresses=[broker.tcp_address], max_in_flight=10,
                         heartbeat_interval=1.0)
    try:
        received = []

        def fin_all(batch):
            for conn, m in batch[len(received):]:
                received.append(m.body)
                c.finish(conn, m.id)
            return len(received) >= len(bodies)

        _poll_until(c, fin_all)
        assert sorted(received) == sorted(bodies)
        _poll_until(c, lambda _: c.heartbeats >= 2)
        assert c.connects == 1 and not c.errors
        ch = broker.stats("ct")["topics"][0]["channels"][0]
        assert ch["depth"] == 0 and ch["in_flight_count"] == 0 and ch["clients"][0]["finish_count"] == len(bodies)
        assert ch["clients"][0]["user_agent"].startswith("nsqtw-spark/")
    finally:
        c.close()


def test_pause_sends_rdy_zero(broker) -> None:
    """pause(True) closes the RDY window (backpressure); pause(False) opens it again."""
    from nsqtw.spark.consumer import BlockingConsumer

    c = BlockingConsumer("pt", "ch", nsqd_tcp_addresses=[broker.tcp_address], max_in_flight=5)
    try:
        c.poll(0.1)
        c.pause(True)
        broker.mpub("pt", [b"x"] * 3)
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            assert c.poll(0.1) == []
        assert broker.stats("pt")["topics"][0]["channels"][0]["clients"][0]["ready_count"] == 0
        c.pause(False)
        got = _poll_until(c, lambda g: len(g) >= 3)
        c.finish_many(got)
        assert len(got) == 3
    finally:
        c.close()


def test_unreachable_nsqd_is_retried_not_fatal() -> None:
    """A refused connection is recorded and retried later; poll returns nothing meanwhile."""
    import socket

    from nsqtw.spark.consumer import BlockingConsumer

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    c = BlockingConsumer("t", "c", nsqd_tcp_addresses=[f"127.0.0.1:{port}"])
    assert c.poll(0.05) == [] and c.errors and not c.conns
    c.close()
