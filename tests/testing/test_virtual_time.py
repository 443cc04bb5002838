"""nsqtw_clock: the fixtures' timers on a task.Clock, sockets real; nothing here sleeps."""

from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet import defer, reactor

from nsqtw.client import Config, Consumer
from nsqtw.testing.clock import VIRTUAL_EPOCH, VirtualTimeReactor, virtual_clock
from nsqtw.testing.pytest_plugin import start_nsqd_fixture


class Inbox:
    """A consumer's handler that keeps every message and answers none (the test decides)."""

    def __init__(self) -> None:
        self.messages: list = []
        self._waiting: list[tuple[int, defer.Deferred]] = []

    def __call__(self, msg) -> None:
        msg.disable_auto_response()
        self.messages.append(msg)
        for pair in list(self._waiting):
            if len(self.messages) >= pair[0]:
                self._waiting.remove(pair)
                pair[1].callback(list(self.messages))

    def wait(self, n: int, timeout: float = 5.0) -> defer.Deferred:
        if len(self.messages) >= n:
            return defer.succeed(list(self.messages))
        d: defer.Deferred = defer.Deferred()
        self._waiting.append((n, d))
        return d.addTimeout(timeout, reactor)

    def answer_the_rest(self) -> None:
        """FIN what was never answered (a stale copy's FIN fails harmlessly), so the consumer
        stops at once instead of waiting for messages in flight."""
        for m in self.messages:
            if not m.has_responded():
                m.finish()


async def subscribe(nsqd, topic: str, channel: str, inbox: Inbox) -> Consumer:
    # nsqd's longest heartbeat interval: a jump of the clock past two intervals drops a consumer
    consumer = Consumer(topic, channel, inbox, Config(max_in_flight=10, heartbeat_interval=60))
    await consumer.connect_to_nsqd(nsqd.tcp_address)
    return consumer


@pytest_twisted.ensureDeferred
async def test_advance_past_msg_timeout_redelivers_an_unfinished_message(nsqtw_clock, nsqtw_nsqd):
    assert nsqtw_nsqd.virtual_time and nsqtw_nsqd._service.now() == VIRTUAL_EPOCH
    inbox = Inbox()
    consumer = await subscribe(nsqtw_nsqd, "orders", "billing", inbox)
    try:
        await nsqtw_nsqd.publish("orders", b"order 1")
        [first] = await inbox.wait(1)
        assert first.attempts == 1
        nsqtw_clock.advance(59)  # within --msg-timeout (60s): still in flight
        assert len(inbox.messages) == 1 and nsqtw_nsqd.handled("timed_out") == []
        nsqtw_clock.advance(2)
        [_, second] = await inbox.wait(2)
        assert (second.id, second.body, second.attempts) == (first.id, b"order 1", 2)
        assert [h.kind for h in nsqtw_nsqd.handled(topic="orders")] == ["delivered", "timed_out", "delivered"]
        second.finish()
    finally:
        inbox.answer_the_rest()
        await consumer.stop()


@pytest_twisted.ensureDeferred
async def test_an_hour_long_dpub_is_delivered_after_advance_3600(nsqtw_clock, nsqtw_nsqd):
    inbox = Inbox()
    consumer = await subscribe(nsqtw_nsqd, "later", "ch", inbox)
    try:
        await nsqtw_nsqd.deferred_publish("later", 3600, b"in an hour")
        await nsqtw_nsqd.advance(3599)  # in steps the consumer answers heartbeats between
        assert nsqtw_nsqd.depth("later", "ch") == 0 and inbox.messages == []
        nsqtw_clock.advance(1)
        [msg] = await inbox.wait(1)
        assert msg.body == b"in an hour"
        [delivered] = nsqtw_nsqd.handled("delivered")
        assert delivered.time == VIRTUAL_EPOCH + 3600
        msg.finish()
    finally:
        inbox.answer_the_rest()
        await consumer.stop()


@pytest_twisted.ensureDeferred
async def test_requeue_delay_waits_for_the_clock(nsqtw_clock, nsqtw_nsqd):
    inbox = Inbox()
    consumer = await subscribe(nsqtw_nsqd, "t", "ch", inbox)
    try:
        await nsqtw_nsqd.publish("t", b"again")
        [msg] = await inbox.wait(1)
        msg.requeue(30, backoff=False)
        await nsqtw_nsqd.wait_until(lambda: nsqtw_nsqd.handled("requeued"))
        nsqtw_clock.advance(29.9)
        assert len(inbox.messages) == 1
        nsqtw_clock.advance(0.2)
        [_, again] = await inbox.wait(2)
        assert again.attempts == 2
        again.finish()
    finally:
        inbox.answer_the_rest()
        await consumer.stop()


async def scenario() -> list[tuple]:
    """Publish, time out, defer and requeue on a broker of its own; what was delivered, in order."""
    clock = virtual_clock()
    nsqd = await start_nsqd_fixture(reactor=VirtualTimeReactor(clock, reactor))
    inbox = Inbox()
    consumer = await subscribe(nsqd, "s", "ch", inbox)
    try:
        await nsqd.multi_publish("s", [b"a", b"b", b"c"])
        await nsqd.deferred_publish("s", 10, b"d")
        await inbox.wait(3)
        inbox.messages[1].finish()
        # the FIN must reach nsqd before the clock moves: time waits, the network does not
        await nsqd.wait_until(lambda: nsqd.handled("finished"))
        clock.advance(61)  # a and c time out; d came due at +10
        await inbox.wait(6)
        for m in inbox.messages[3:]:
            m.finish()
        await nsqd.wait_until(lambda: len(nsqd.handled("finished")) == 4)
        return [(h.kind, h.id, h.body, h.attempts, h.time) for h in nsqd.traffic.handled]
    finally:
        inbox.answer_the_rest()
        await consumer.stop()
        await nsqd.stop()


@pytest_twisted.ensureDeferred
async def test_the_same_test_delivers_the_same_messages_in_the_same_order():
    first = await scenario()
    assert first == await scenario()
    delivered = [(body, attempts) for kind, _, body, attempts, _ in first if kind == "delivered"]
    # the memory queue is FIFO; timed-out messages go to its tail in the order they were sent,
    # after what came due earlier in the same scan
    assert delivered[:3] == [(b"a", 1), (b"b", 1), (b"c", 1)]
    print(delivered)
    assert sorted(delivered[3:]) == [(b"a", 2), (b"c", 2), (b"d", 1)]


@pytest_twisted.ensureDeferred
async def test_fixture_advance_keeps_consumers_with_default_heartbeats_connected(nsqtw_clock, nsqtw_nsqd):
    """A raw jump past two heartbeat intervals drops a consumer (as a frozen client would be);
    ``await nsqtw_nsqd.advance(s)`` steps and lets it answer heartbeats, so it stays."""
    inbox = Inbox()
    consumer = Consumer("t", "ch", inbox, Config())  # heartbeat_interval 30 s
    await consumer.connect_to_nsqd(nsqtw_nsqd.tcp_address)
    [mine] = nsqtw_nsqd._broker.clients
    try:
        await nsqtw_nsqd.advance(300)
        assert nsqtw_nsqd._service.now() == VIRTUAL_EPOCH + 300
        assert list(nsqtw_nsqd._broker.clients) == [mine]  # still connected
        await nsqtw_nsqd.publish("t", b"still here")
        [msg] = await inbox.wait(1)
        assert msg.body == b"still here"
        msg.finish()
        nsqtw_clock.advance(61)  # one jump past the read deadline (2 x 30 s): nsqd drops it
        await nsqtw_nsqd.wait_until(lambda: mine not in nsqtw_nsqd._broker.clients)
    finally:
        inbox.answer_the_rest()
        await consumer.stop()


@pytest_twisted.ensureDeferred
async def test_advance_without_the_clock_says_so(nsqtw_nsqd):
    with pytest.raises(TypeError, match="request the nsqtw_clock fixture"):
        nsqtw_nsqd.advance(1)


@pytest_twisted.ensureDeferred
async def test_lookupd_and_its_nsqd_age_on_the_clock(nsqtw_clock, nsqtw_cluster):
    lookupd = nsqtw_cluster.lookupd
    assert lookupd.handle._service.now() == VIRTUAL_EPOCH
    await nsqtw_cluster.nsqds[0].publish("t", b"x")
    await lookupd.wait_for_producers(1, topic="t")
    db, opts = lookupd._db, lookupd.handle._service.options

    def active(now: float) -> int:
        return len(db.topic_producers("t", opts.inactive_producer_timeout, opts.tombstone_lifetime, now))

    assert active(nsqtw_clock.seconds()) == 1
    # no time passed for the registration: only the clock says how old it is
    assert active(nsqtw_clock.seconds() + opts.inactive_producer_timeout + 1) == 0


@pytest_twisted.ensureDeferred
async def test_a_client_handed_nsqtw_reactor_waits_for_the_clock_to_reconnect(nsqtw_clock, nsqtw_reactor,
                                                                             nsqtw_nsqd):
    inbox = Inbox()
    consumer = Consumer("t", "ch", inbox, Config(heartbeat_interval=60), reactor=nsqtw_reactor)
    await consumer.connect_to_nsqd(nsqtw_nsqd.tcp_address)  # its sockets are real
    try:
        assert consumer.reactor.seconds() == VIRTUAL_EPOCH
        nsqtw_nsqd.faults.drop_connections()
        await nsqtw_nsqd.wait_until(lambda: not nsqtw_nsqd._broker.clients)
        # its reconnect waits lookupd_poll_interval (60 s) on the clock, not on the wall
        delayed = nsqtw_clock.getDelayedCalls()
        assert any(c.getTime() == VIRTUAL_EPOCH + 60 for c in delayed)
        assert not nsqtw_nsqd._broker.clients
        nsqtw_clock.advance(60)
        await nsqtw_nsqd.wait_until(lambda: nsqtw_nsqd._broker.clients)
        await nsqtw_nsqd.publish("t", b"after the reconnect")
        [msg] = await inbox.wait(1)
        assert msg.body == b"after the reconnect"
    finally:
        inbox.answer_the_rest()
        await consumer.stop()


def test_the_virtual_time_reactor_takes_time_from_the_clock_and_the_rest_from_the_reactor():
    from twisted.internet.interfaces import IReactorTCP, IReactorTime

    from nsqtw.testing.clock import virtual_clock

    clock = virtual_clock()
    vr = VirtualTimeReactor(clock, reactor)
    assert IReactorTime.providedBy(vr) and IReactorTCP.providedBy(vr)
    assert vr.seconds() == VIRTUAL_EPOCH and vr.listenTCP == reactor.listenTCP
    fired = []
    timer = vr.callLater(5, fired.append, "timer")
    assert vr.getDelayedCalls() == [timer] and timer not in reactor.getDelayedCalls()
    soon = vr.callLater(0, fired.append, "soon")  # end of turn: the real reactor's
    assert soon in reactor.getDelayedCalls() and soon not in clock.getDelayedCalls()
    soon.cancel()
    clock.advance(5)
    assert fired == ["timer"]
