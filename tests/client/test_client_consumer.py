"""Consumer units on StringTransport and task.Clock: SUB/RDY, auto FIN/REQ, backoff on the wire,
give-up, manual responses, concurrency, graceful and hard stop, reconnects and lookupd polling."""

from __future__ import annotations

import json

import pytest
from twisted.internet import defer, task
from twisted.internet.error import ConnectionDone, ConnectionLost
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from treq.testing import StubTreq

from client_support import ScriptedRandom, WireConnector, error, message_frame, msg_id, response
from nsqtw.client import Config, Consumer, Stopped
from nsqtw.client.consumer import HARD_STOP_TIMEOUT
from nsqtw.client.errors import AlreadyConnected, ConfigError
from nsqtw.errors import SubFailed

ADDR = "127.0.0.1:4150"


def results(d):
    out = []
    d.addBoth(out.append)
    return out


def make(handler, picks=None, floats=None, consumer_kwargs=None, **cfg):
    clock = task.Clock()
    connector = WireConnector()
    cfg.setdefault("max_in_flight", 1)
    c = Consumer("t", "ch", handler, Config(**cfg), reactor=clock, connector=connector,
                 rng=ScriptedRandom(picks, floats), **(consumer_kwargs or {}))
    return c, clock, connector


def subscribe(c, connector, addr=ADDR, **answer):
    r = results(c.connect_to_nsqd(addr))
    wire = connector.handshake(addr, **answer)
    lines = wire.lines()
    wire.feed(response(b"OK"))
    return wire, lines, r


def test_names_are_validated():
    """Invalid topic or channel names are refused up front (go-nsq NewConsumer)."""
    with pytest.raises(ConfigError):
        Consumer("bad topic", "ch", lambda m: None, reactor=task.Clock())
    with pytest.raises(ConfigError):
        Consumer("t", "c" * 65, lambda m: None, reactor=task.Clock())


def test_connect_sends_sub_then_rdy_and_fires_on_sub_ok():
    """SUB and the first RDY are pipelined; the Deferred fires once nsqd answers the SUB."""
    c, clock, connector = make(lambda m: None, max_in_flight=7)
    r = results(c.connect_to_nsqd(ADDR))
    wire = connector.handshake(ADDR)
    assert wire.lines() == [b"SUB t ch", b"RDY 7"]
    assert r == []
    wire.feed(response(b"OK"))
    assert r[0] is c.connections[ADDR]
    assert isinstance(results(c.connect_to_nsqd(ADDR))[0].value, AlreadyConnected)


def test_sub_failure_is_the_typed_error():
    """E_SUB_FAILED fails connect_to_nsqd with SubFailed."""
    c, clock, connector = make(lambda m: None)
    r = results(c.connect_to_nsqd(ADDR))
    wire = connector.handshake(ADDR)
    wire.feed(error(b"E_SUB_FAILED SUB failed to deleted topic/channel"))
    assert isinstance(r[0].value, SubFailed)


def test_rdy_truncated_to_the_announced_max_rdy_count():
    """IDENTIFY's max_rdy_count caps RDY."""
    c, clock, connector = make(lambda m: None, max_in_flight=100)
    wire, lines, _ = subscribe(c, connector, max_rdy_count=3)
    assert lines == [b"SUB t ch", b"RDY 3"]


def test_success_fins_and_rdy_is_not_resent_per_message():
    """Each handled message gets FIN; RDY is a window, so no RDY follows the messages."""
    seen = []
    c, clock, connector = make(lambda m: seen.append(m.body), max_in_flight=5)
    wire, _, _ = subscribe(c, connector)
    wire.feed(*[message_frame(msg_id(i), b"m%d" % i) for i in range(5)])
    assert seen == [b"m0", b"m1", b"m2", b"m3", b"m4"]
    assert wire.lines() == [b"FIN %s" % msg_id(i) for i in range(5)]
    assert c.stats().messages_finished == 5 and c.stats().messages_received == 5


def test_failure_requeues_with_go_nsq_delay_and_backs_off_on_the_wire():
    """A raising handler: RDY 0, then REQ <id> default×attempts ms; 2 s later RDY 1; success: RDY back."""
    def handler(m):
        if m.body == b"bad":
            raise RuntimeError("nope")

    c, clock, connector = make(handler, max_in_flight=4, default_requeue_delay=2, max_requeue_delay=7)
    wire, _, _ = subscribe(c, connector)
    wire.feed(message_frame(msg_id(1), b"bad", attempts=3))
    assert wire.lines() == [b"RDY 0", b"REQ %s 6000" % msg_id(1)]
    assert c.in_backoff() and c.stats().messages_requeued == 1
    clock.advance(2)
    assert wire.lines() == [b"RDY 1"]
    wire.feed(message_frame(msg_id(2), b"good"))
    assert wire.lines() == [b"RDY 4", b"FIN %s" % msg_id(2)]
    assert not c.in_backoff()
    wire.feed(message_frame(msg_id(3), b"bad", attempts=5))
    assert wire.lines()[-1] == b"REQ %s 7000" % msg_id(3)  # 2 s × 5 capped by max_requeue_delay


def test_deferred_and_coroutine_handlers():
    """A handler's Deferred decides FIN/REQ when it fires; coroutines work too."""
    pending = {}

    def handler(m):
        d = defer.Deferred()
        pending[m.body] = d
        return d

    c, clock, connector = make(handler, max_in_flight=2, consumer_kwargs={"concurrency": 2})
    wire, _, _ = subscribe(c, connector)
    wire.feed(message_frame(msg_id(1), b"a"), message_frame(msg_id(2), b"b"))
    assert wire.lines() == []
    pending[b"b"].errback(RuntimeError("x"))
    assert wire.lines()[-1].startswith(b"REQ %s " % msg_id(2))
    pending[b"a"].callback(None)
    assert wire.lines() == [b"FIN %s" % msg_id(1)]

    async def coro(m):
        await defer.succeed(None)

    c2, clock2, connector2 = make(coro)
    wire2, _, _ = subscribe(c2, connector2)
    wire2.feed(message_frame(msg_id(7), b"x"))
    assert wire2.lines() == [b"FIN %s" % msg_id(7)]


def test_give_up_after_max_attempts():
    """attempts > max_attempts: the give-up hook gets the message, it is FINed, the handler is not called."""
    handled, given_up = [], []
    c, clock, connector = make(handled.append, max_attempts=3, consumer_kwargs={"give_up": given_up.append})
    wire, _, _ = subscribe(c, connector)
    wire.feed(message_frame(msg_id(1), b"x", attempts=3))
    wire.feed(message_frame(msg_id(2), b"y", attempts=4))
    assert [m.body for m in handled] == [b"x"] and [m.body for m in given_up] == [b"y"]
    assert wire.lines() == [b"FIN %s" % msg_id(1), b"FIN %s" % msg_id(2)]


def test_give_up_hook_from_the_handlers_log_failed_message():
    """Like go-nsq's FailedMessageLogger, a handler object's log_failed_message is the hook."""
    class Handler:
        failed = []

        def __call__(self, m):
            raise AssertionError("not called")

        def log_failed_message(self, m):
            self.failed.append(m.id)

    h = Handler()
    c, clock, connector = make(h, max_attempts=1)
    wire, _, _ = subscribe(c, connector)
    wire.feed(message_frame(msg_id(5), b"x", attempts=2))
    assert h.failed == [msg_id(5)]


def test_manual_responses_touch_and_requeue_without_backoff():
    """disable_auto_response: nothing is sent on return; touch, requeue(delay, backoff=False) later."""
    held = []

    def handler(m):
        m.disable_auto_response()
        held.append(m)

    c, clock, connector = make(handler, max_in_flight=2)
    wire, _, _ = subscribe(c, connector)
    wire.feed(message_frame(msg_id(1), b"a"), message_frame(msg_id(2), b"b"))
    assert wire.lines() == []
    held[0].touch()
    held[0].requeue(5.0, backoff=False)
    held[0].finish()  # ignored: already answered
    held[1].finish()
    assert wire.lines() == [b"TOUCH %s" % msg_id(1), b"REQ %s 5000" % msg_id(1), b"FIN %s" % msg_id(2)]
    assert not c.in_backoff()


def test_concurrency_limits_handlers_running_at_once():
    """concurrency=2: the third message waits until one of the first two is done."""
    pending = []

    def handler(m):
        d = defer.Deferred()
        pending.append((m.body, d))
        return d

    c, clock, connector = make(handler, max_in_flight=5, consumer_kwargs={"concurrency": 2})
    wire, _, _ = subscribe(c, connector)
    wire.feed(*[message_frame(msg_id(i), b"%d" % i) for i in range(4)])
    assert [b for b, _ in pending] == [b"0", b"1"]
    pending[0][1].callback(None)
    assert [b for b, _ in pending] == [b"0", b"1", b"2"]


def test_graceful_stop_waits_for_in_flight_messages():
    """stop(): CLS; after CLOSE_WAIT the connection closes only once its messages are answered."""
    pending = []

    def handler(m):
        d = defer.Deferred()
        pending.append(d)
        return d

    c, clock, connector = make(handler, max_in_flight=2)
    wire, _, _ = subscribe(c, connector)
    wire.feed(message_frame(msg_id(1), b"a"))
    stopped = results(c.stop())
    assert wire.lines() == [b"CLS"]
    wire.feed(response(b"CLOSE_WAIT"))
    assert not wire.transport.disconnecting and stopped == []
    pending[0].callback(None)
    assert wire.lines() == [b"FIN %s" % msg_id(1)] and wire.transport.disconnecting
    wire.proto.connectionLost(Failure(ConnectionDone()))
    assert stopped == [None] and c.stats().connections == 0
    assert isinstance(results(c.connect_to_nsqd(ADDR))[0].value, Stopped)


def test_hard_stop_after_thirty_seconds():
    """A handler that never finishes: the stop completes anyway after 30 s, connections aborted."""
    c, clock, connector = make(lambda m: defer.Deferred())
    wire, _, _ = subscribe(c, connector)
    wire.feed(message_frame(msg_id(1), b"a"))
    stopped = results(c.stop())
    wire.feed(response(b"CLOSE_WAIT"))
    clock.advance(HARD_STOP_TIMEOUT - 0.1)
    assert stopped == []
    clock.advance(0.1)
    assert stopped == [None] and wire.transport.disconnected
    wire.proto.connectionLost(Failure(ConnectionLost()))
    assert clock.getDelayedCalls() == []


def test_stop_without_connections_is_immediate():
    """Nothing connected: stop() fires at once and leaves no timers."""
    c, clock, connector = make(lambda m: None)
    assert results(c.stop()) == [None]
    assert clock.getDelayedCalls() == []


def test_direct_connection_reconnects_every_poll_interval_while_configured():
    """A dropped nsqd connection is re-dialed after lookupd_poll_interval, again after each failure."""
    c, clock, connector = make(lambda m: None, lookupd_poll_interval=3)
    wire, _, _ = subscribe(c, connector)
    connector.refuse.add(ADDR)
    wire.proto.connectionLost(Failure(ConnectionLost()))
    assert c.stats().connections == 0 and connector.dials == [ADDR]
    clock.advance(3)
    assert connector.dials == [ADDR, ADDR]
    clock.advance(3)
    assert len(connector.dials) == 3
    connector.refuse.clear()
    clock.advance(3)
    wire2 = connector.handshake(ADDR)
    assert wire2.lines() == [b"SUB t ch", b"RDY 1"]
    wire2.feed(response(b"OK"))
    assert c.stats().connections == 1
    c.disconnect_from_nsqd(ADDR)
    wire2.proto.connectionLost(Failure(ConnectionDone()))
    clock.advance(10)
    assert len(connector.dials) == 4  # removed addresses are not re-dialed


def test_heartbeats_answered_on_consumer_connections():
    """_heartbeat_ gets NOP on a subscribed connection too."""
    c, clock, connector = make(lambda m: None)
    wire, _, _ = subscribe(c, connector)
    wire.feed(response(b"_heartbeat_"))
    assert wire.lines() == [b"NOP"]


def test_is_starved_and_stats():
    """is_starved once in-flight reaches 85% of RDY; stats count received/finished/requeued/connections."""
    c, clock, connector = make(lambda m: defer.Deferred(), max_in_flight=2, consumer_kwargs={"concurrency": 2})
    wire, _, _ = subscribe(c, connector)
    assert not c.is_starved()
    wire.feed(message_frame(msg_id(1), b"a"), message_frame(msg_id(2), b"b"))
    assert c.is_starved()
    s = c.stats()
    assert (s.messages_received, s.messages_finished, s.messages_requeued, s.connections) == (2, 0, 0, 1)


def test_rdy_redistribution_runs_on_the_clock():
    """With more nsqd than max_in_flight, the redistribute loop moves RDY off an idle connection."""
    c, clock, connector = make(lambda m: None, picks=[1], max_in_flight=1, rdy_redistribute_interval=5,
                               low_rdy_idle_timeout=10)
    wa, la, _ = subscribe(c, connector, "127.0.0.1:1")
    wb, lb, _ = subscribe(c, connector, "127.0.0.1:2")
    assert (la, lb) == ([b"SUB t ch", b"RDY 1"], [b"SUB t ch"])
    clock.advance(15)
    assert wa.lines() == [b"RDY 0"] and wb.lines() == [b"RDY 1"]


# --- lookupd ---------------------------------------------------------------------------------------


class FakeLookupd(Resource):
    isLeaf = True

    def __init__(self):
        super().__init__()
        self.requests = []
        self.body = b"{}"
        self.code = 200
        self.v1 = True

    def render_GET(self, request):
        self.requests.append((request.uri, request.requestHeaders.getRawHeaders(b"accept"),
                              request.requestHeaders.getRawHeaders(b"authorization")))
        request.setResponseCode(self.code)
        if self.v1:
            request.setHeader(b"X-NSQ-Content-Type", b"nsq; version=1.0")
        return self.body


def lookup_body(*ports, wrapped=False):
    producers = [{"remote_address": "127.0.0.1:5", "hostname": "h", "broadcast_address": "127.0.0.1",
                  "tcp_port": p, "http_port": p + 1, "version": "1.3.0"} for p in ports]
    doc = {"channels": ["ch"], "producers": producers}
    if wrapped:
        doc = {"status_code": 200, "status_txt": "OK", "data": doc}
    return json.dumps(doc).encode()


def lookupd_consumer(fake, **cfg):
    stub = StubTreq(fake)
    c, clock, connector = make(lambda m: None, consumer_kwargs={"http_client": stub}, **cfg)
    return c, clock, connector, stub


def test_lookupd_poll_connects_to_every_producer_with_the_v1_accept_header():
    """First query at once with Accept: application/vnd.nsq; version=1.0; producers are dialed."""
    fake = FakeLookupd()
    fake.body = lookup_body(4150, 4250)
    c, clock, connector, stub = lookupd_consumer(fake)
    r = results(c.connect_to_nsqlookupd("127.0.0.1:4161"))
    stub.flush()
    assert r == [None]
    uri, accept, auth = fake.requests[0]
    assert uri == b"/lookup?topic=t" and accept == [b"application/vnd.nsq; version=1.0"] and auth is None
    assert connector.dials == ["127.0.0.1:4150", "127.0.0.1:4250"]


def test_lookupd_pre_1_0_wrapper_is_understood():
    """{"status_code", "status_txt", "data"} answers (no V1 header) work too."""
    fake = FakeLookupd()
    fake.v1 = False
    fake.body = lookup_body(4350, wrapped=True)
    c, clock, connector, stub = lookupd_consumer(fake)
    c.connect_to_nsqlookupd("http://127.0.0.1:4161/")
    stub.flush()
    assert connector.dials == ["127.0.0.1:4350"]


@pytest.mark.parametrize("code,body", [(200, b"<html>garbage"), (500, b'{"message":"INTERNAL_ERROR"}'),
                                       (200, b'{"producers": 5}'), (200, b"[]")])
def test_lookupd_garbage_is_tolerated_and_polling_goes_on(code, body):
    """A failing or garbled lookupd is retried (3 tries), logged, and polled again later."""
    fake = FakeLookupd()
    fake.code, fake.body = code, body
    c, clock, connector, stub = lookupd_consumer(fake, lookupd_poll_interval=10)
    r = results(c.connect_to_nsqlookupd("127.0.0.1:4161"))
    stub.flush()
    assert r == [None] and len(fake.requests) == 3 and connector.dials == []
    fake.code, fake.body = 200, lookup_body(4150)
    clock.advance(0.5 * 0.3 * 10)  # jitter (rng 0.5 × 0.3 × interval) starts the poll loop
    clock.advance(10)
    stub.flush()
    assert connector.dials == ["127.0.0.1:4150"]


def test_lookupd_polls_after_jitter_then_every_interval_and_on_close():
    """Polls: at once, at jitter+interval, +interval...; a closed connection triggers a poll right away."""
    fake = FakeLookupd()
    fake.body = lookup_body(4150)
    c, clock, connector, stub = lookupd_consumer(fake, lookupd_poll_interval=20, lookupd_poll_jitter=0.5)
    c.connect_to_nsqlookupd("127.0.0.1:4161")
    stub.flush()
    assert len(fake.requests) == 1
    wire = connector.handshake(ADDR)
    wire.feed(response(b"OK"))
    clock.advance(0.5 * 0.5 * 20)  # the jitter: the poll loop starts
    clock.advance(19.9)
    stub.flush()
    assert len(fake.requests) == 1
    clock.advance(0.1)
    stub.flush()
    assert len(fake.requests) == 2 and connector.dials == [ADDR]  # already connected: not re-dialed
    wire.proto.connectionLost(Failure(ConnectionLost()))
    clock.advance(0)
    stub.flush()
    assert len(fake.requests) == 3 and connector.dials == [ADDR, ADDR]
    results(c.stop())


def test_lookupd_bearer_authorization_with_auth_secret():
    """auth_secret with skip_lookupd_authorization=true sends 'Authorization: Bearer <secret>'."""
    fake = FakeLookupd()
    c, clock, connector, stub = lookupd_consumer(fake, auth_secret="tok")
    c.connect_to_nsqlookupd("127.0.0.1:4161")
    stub.flush()
    assert fake.requests[0][2] == [b"Bearer tok"]


def test_lookupd_discovery_filter():
    """A discovery filter chooses among the producers lookupd lists."""
    fake = FakeLookupd()
    fake.body = lookup_body(1, 2, 3)
    stub = StubTreq(fake)
    c, clock, connector = make(lambda m: None, consumer_kwargs={
        "http_client": stub, "discovery_filter": lambda addrs: [a for a in addrs if a.endswith(":2")]})
    c.connect_to_nsqlookupd("127.0.0.1:4161")
    stub.flush()
    assert connector.dials == ["127.0.0.1:2"]


def test_lookupd_unreachable_is_tolerated():
    """A lookupd that refuses connections is logged; the consumer keeps going."""
    class Refusing:
        def get(self, url, headers=None):
            from twisted.internet.error import ConnectionRefusedError
            return defer.fail(ConnectionRefusedError())

    c, clock, connector = make(lambda m: None, consumer_kwargs={"http_client": Refusing()})
    assert results(c.connect_to_nsqlookupd("127.0.0.1:4161")) == [None]
    assert results(c.stop()) == [None]
    assert clock.getDelayedCalls() == []


def test_lookupd_query_times_out_on_the_clock():
    """A lookupd that never answers is given up after lookupd_poll_timeout."""
    class Silent:
        calls = 0

        def get(self, url, headers=None):
            Silent.calls += 1
            return defer.Deferred()

    c, clock, connector = make(lambda m: None, lookupd_poll_timeout=2,
                               consumer_kwargs={"http_client": Silent()})
    r = results(c.connect_to_nsqlookupd("127.0.0.1:4161"))
    clock.advance(2)
    clock.advance(2)
    assert r == []
    clock.advance(2)
    assert r == [None] and Silent.calls == 3


def test_answers_to_one_read_leave_in_one_write():
    """FINs for every message of one read (and the RDY changes among them) go out as one write."""
    from twisted.internet.testing import StringTransport

    class CountingTransport(StringTransport):
        writes = 0

        def write(self, data):
            CountingTransport.writes += 1
            super().write(data)

    c, clock, connector = make(lambda m: None, max_in_flight=50)
    wire, _, _ = subscribe(c, connector)
    counting = CountingTransport()
    counting.protocol = wire.proto
    wire.proto.transport = counting
    wire.proto.dataReceived(b"".join(message_frame(msg_id(i), b"x") for i in range(40)))
    assert CountingTransport.writes == 1
    assert counting.value().count(b"FIN ") == 40


def test_disconnect_rules_for_lookupd():
    """The last lookupd cannot be removed (go-nsq); unknown ones are NotConnected."""
    from nsqtw.client import NotConnected
    fake = FakeLookupd()
    c, clock, connector, stub = lookupd_consumer(fake)
    c.connect_to_nsqlookupd("127.0.0.1:4161")
    stub.flush()
    assert results(c.connect_to_nsqlookupd("127.0.0.1:4161")) == [None]  # already known
    with pytest.raises(ConfigError):
        c.disconnect_from_nsqlookupd("127.0.0.1:4161")
    with pytest.raises(NotConnected):
        c.disconnect_from_nsqlookupd("127.0.0.1:9999")
    c.connect_to_nsqlookupd("127.0.0.1:4162")
    c.disconnect_from_nsqlookupd("127.0.0.1:4161")
    assert c.lookupd_urls == ["http://127.0.0.1:4162/lookup?topic=t"]
    results(c.stop())


def test_consumers_of_one_topic_share_the_periodic_lookupd_poll():
    """Three consumers of one topic on one clock and lookupd: each asks at once when it connects,
    then one query per interval serves all three (each dials what it lacks), a consumer of another
    topic polls on its own, and the shared poll goes on for the others when one stops, and stops
    with the last."""
    fake = FakeLookupd()
    fake.body = lookup_body(4150)
    stub = StubTreq(fake)
    clock = task.Clock()
    cfg = dict(max_in_flight=1, lookupd_poll_interval=10, lookupd_poll_jitter=0.5)
    made = []
    for topic in ("t", "t", "t", "other"):
        connector = WireConnector()
        c = Consumer(topic, "ch", lambda m: None, Config(**cfg), reactor=clock, connector=connector,
                     rng=ScriptedRandom(None, None), http_client=stub)
        c.connect_to_nsqlookupd("127.0.0.1:4161")
        made.append((c, connector))
    stub.flush()
    assert len(fake.requests) == 4
    assert all(connector.dials == [ADDR] for _, connector in made)
    for _, connector in made:
        connector.handshake(ADDR).feed(response(b"OK"))
    fake.body = lookup_body(4150, 4250)  # a second producer appears
    clock.advance(0.5 * 0.5 * 10)  # the jitter: the consumers join their poll groups
    clock.advance(10)
    stub.flush()
    topics = [uri for uri, _, _ in fake.requests[4:]]
    assert sorted(topics) == [b"/lookup?topic=other", b"/lookup?topic=t"]  # one poll per topic, not per consumer
    assert all(connector.dials == [ADDR, "127.0.0.1:4250"] for _, connector in made)
    results(made[0][0].stop())
    clock.advance(10)
    stub.flush()
    assert sorted(uri for uri, _, _ in fake.requests[6:]) == [b"/lookup?topic=other", b"/lookup?topic=t"]
    for c, _ in made[1:]:
        results(c.stop())
    clock.advance(HARD_STOP_TIMEOUT + 10)
    stub.flush()
    assert len(fake.requests) == 8  # no group left polling
    assert not any(call.func.__qualname__.startswith("LoopingCall") for call in clock.getDelayedCalls()
                   if hasattr(call, "func"))
