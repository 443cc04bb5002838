"""Producer and connection units on StringTransport and task.Clock: FIFO matching, error typing,
lazy connect, reconnect, heartbeats and dead-server detection."""

from __future__ import annotations

import pytest
from twisted.internet import task
from twisted.internet.error import ConnectionDone, ConnectionLost
from twisted.python.failure import Failure

from client_support import WireConnector, error, response
from nsqtw.client import Config, NotConnected, Producer, Stopped
from nsqtw.client.connection import NSQConnection
from nsqtw.errors import BadTopic, FinFailed, NSQError, PubFailed


def producer(**cfg):
    clock = task.Clock()
    connector = WireConnector()
    p = Producer("127.0.0.1:4150", Config(**cfg), reactor=clock, connector=connector)
    return p, clock, connector


def results(d):
    out = []
    d.addBoth(out.append)
    return out


def test_nothing_is_dialed_before_the_first_command():
    """go-nsq connects lazily: a new Producer has no connection."""
    p, clock, connector = producer()
    assert connector.dials == [] and not p.connected


def test_commands_wait_for_the_handshake_then_pipeline_and_match_fifo():
    """Three publishes before IDENTIFY's answer are written together after it; answers match in order."""
    p, clock, connector = producer()
    r1 = results(p.publish("t", b"one"))
    r2 = results(p.multi_publish("t", [b"a", b"b"]))
    r3 = results(p.deferred_publish("t", 1.5, b"later"))
    assert connector.dials == ["127.0.0.1:4150"]
    wire = connector.handshake("127.0.0.1:4150")
    sent = wire.written()
    assert sent.startswith(b"PUB t\n\x00\x00\x00\x03one")
    assert b"MPUB t\n\x00\x00\x00\x0e\x00\x00\x00\x02\x00\x00\x00\x01a\x00\x00\x00\x01b" in sent
    assert sent.endswith(b"DPUB t 1500\n\x00\x00\x00\x05later")
    assert (r1, r2, r3) == ([], [], [])
    wire.feed(response(b"OK"))
    assert r1 == [None] and r2 == [] and r3 == []
    wire.feed(response(b"OK"), response(b"OK"))
    assert r2 == [None] and r3 == [None]


def test_error_frame_fails_its_command_with_the_typed_error_and_closes():
    """E_BAD_TOPIC answers the oldest command as BadTopic (code kept); later ones fail NotConnected."""
    p, clock, connector = producer()
    wire = None
    r1 = results(p.publish("ok", b"1"))
    wire = connector.handshake("127.0.0.1:4150")
    r2 = results(p.publish("bad!", b"2"))
    r3 = results(p.publish("ok", b"3"))
    wire.feed(response(b"OK"), error(b'E_BAD_TOPIC PUB topic name "bad!" is not valid'))
    assert r1 == [None]
    err = r2[0].value
    assert isinstance(err, BadTopic) and isinstance(err, NSQError) and err.code == b"E_BAD_TOPIC"
    assert 'topic name "bad!"' in str(err)
    assert wire.transport.disconnecting  # nsqd closes after a fatal error; so do we
    wire.proto.connectionLost(Failure(ConnectionDone()))
    assert isinstance(r3[0].value, NotConnected)
    assert not p.connected


def test_next_publish_after_a_lost_connection_dials_again():
    """After a drop the Producer reconnects on the next command (no automatic retry)."""
    p, clock, connector = producer()
    results(p.publish("t", b"1"))
    wire = connector.handshake("127.0.0.1:4150")
    wire.feed(response(b"OK"))
    lost = results(p.publish("t", b"2"))
    wire.proto.connectionLost(Failure(ConnectionLost()))
    assert isinstance(lost[0].value, NotConnected)
    r = results(p.publish("t", b"3"))
    assert len(connector.dials) == 2
    wire2 = connector.handshake("127.0.0.1:4150")
    assert wire2.written() == b"PUB t\n\x00\x00\x00\x013"
    wire2.feed(response(b"OK"))
    assert r == [None]


def test_retry_from_an_errback_dials_a_new_connection():
    """Publishing again inside the failure callback does not reuse the dying connection."""
    p, clock, connector = producer()
    retried = []

    def retry(f):
        retried.append(p.publish("t", b"again"))
        return None

    results(p.publish("t", b"1"))
    wire = connector.handshake("127.0.0.1:4150")
    p.publish("x!", b"bad").addErrback(retry)
    wire.feed(response(b"OK"), error(b"E_BAD_TOPIC bad"))
    wire.proto.connectionLost(Failure(ConnectionDone()))
    assert len(connector.dials) == 2 and retried


def test_dial_failure_fails_queued_commands_not_connected():
    """A refused dial fails every queued command with NotConnected."""
    p, clock, connector = producer()
    connector.refuse.add("127.0.0.1:4150")
    r = results(p.publish("t", b"x"))
    assert isinstance(r[0].value, NotConnected) and "refused" in str(r[0].value)


def test_stop_waits_for_answers_then_refuses_new_commands():
    """stop(): pending answers still arrive; new commands fail with Stopped; the connection closes."""
    p, clock, connector = producer()
    r1 = results(p.publish("t", b"1"))
    wire = connector.handshake("127.0.0.1:4150")
    stopped = results(p.stop())
    assert isinstance(results(p.publish("t", b"2"))[0].value, Stopped)
    assert stopped == [] and not wire.transport.disconnecting
    wire.feed(response(b"OK"))
    assert r1 == [None] and wire.transport.disconnecting
    wire.proto.connectionLost(Failure(ConnectionDone()))
    assert stopped == [None]
    assert results(p.stop()) == [None]


def test_stop_gives_up_waiting_after_the_timeout():
    """An nsqd that never answers: stop() aborts after its timeout and the command fails."""
    p, clock, connector = producer(heartbeat_interval=-1)
    r1 = results(p.publish("t", b"1"))
    wire = connector.handshake("127.0.0.1:4150")
    stopped = results(p.stop(timeout=2))
    clock.advance(1.9)
    assert not wire.transport.disconnecting
    clock.advance(0.1)
    assert wire.transport.disconnected
    wire.proto.connectionLost(Failure(ConnectionLost()))
    assert stopped == [None] and isinstance(r1[0].value, NotConnected)


def test_unexpected_response_closes_the_connection():
    """A response with no command waiting is a protocol violation (go-nsq closes)."""
    p, clock, connector = producer()
    results(p.publish("t", b"1"))
    wire = connector.handshake("127.0.0.1:4150")
    wire.feed(response(b"OK"), response(b"OK"))
    assert wire.transport.disconnected


def test_ping_writes_nop():
    """ping() dials if needed and writes NOP."""
    p, clock, connector = producer()
    r = results(p.ping())
    wire = connector.handshake("127.0.0.1:4150")
    assert r == [None] and wire.written() == b"NOP\n"


# --- the connection itself ----------------------------------------------------------------------


def test_heartbeat_is_answered_with_nop():
    """_heartbeat_ gets NOP at once and is not matched to a pending command."""
    p, clock, connector = producer()
    r = results(p.publish("t", b"1"))
    wire = connector.handshake("127.0.0.1:4150")
    wire.written()
    wire.feed(response(b"_heartbeat_"))
    assert wire.written() == b"NOP\n" and r == []
    wire.feed(response(b"OK"))
    assert r == [None]


def test_server_declared_dead_after_two_silent_heartbeat_intervals():
    """Nothing read for 2 × heartbeat_interval closes the connection; pending commands fail."""
    p, clock, connector = producer(heartbeat_interval=5.0)
    r = results(p.publish("t", b"1"))
    wire = connector.handshake("127.0.0.1:4150")
    clock.advance(9)
    wire.feed(response(b"_heartbeat_"))  # traffic resets the deadline
    clock.advance(9.9)
    assert not wire.transport.disconnecting and not wire.proto.closing
    clock.advance(0.2)
    assert wire.transport.disconnected
    wire.proto.connectionLost(Failure(ConnectionLost()))
    assert isinstance(r[0].value, NotConnected)


def test_handshake_times_out_after_read_timeout():
    """No IDENTIFY answer within read_timeout: the dial fails."""
    p, clock, connector = producer(read_timeout=2.0, heartbeat_interval=1.0)
    r = results(p.publish("t", b"1"))
    clock.advance(2.01)
    wire = connector.wires["127.0.0.1:4150"]
    assert wire.transport.disconnected
    wire.proto.connectionLost(Failure(ConnectionLost()))
    assert isinstance(r[0].value, NotConnected) and "i/o timeout" in str(r[0].value)


def test_non_fatal_errors_do_not_answer_pending_commands():
    """E_FIN_FAILED belongs to a FIN (no response expected): pending commands stay pending."""
    clock = task.Clock()
    seen = []

    class Delegate:
        def on_error(self, conn, err):
            seen.append(err)

        def __getattr__(self, name):
            return lambda *a, **k: None

    conn = NSQConnection(Config(), "127.0.0.1:4150", Delegate(), clock)
    connector = WireConnector()
    connector("127.0.0.1:4150", conn)
    wire = connector.handshake("127.0.0.1:4150")
    r = results(conn.command(b"SUB t c\n"))
    wire.feed(error(b"E_FIN_FAILED FIN 0123456789abcdef failed ID not in flight"))
    assert r == [] and isinstance(seen[0], FinFailed) and not conn.closing
    wire.feed(response(b"OK"))
    assert r == [b"OK"]


def test_pub_failed_is_typed():
    """E_PUB_FAILED maps to PubFailed."""
    p, clock, connector = producer()
    r = results(p.publish("t", b"1"))
    wire = connector.handshake("127.0.0.1:4150")
    wire.feed(error(b"E_PUB_FAILED PUB failed exiting"))
    assert isinstance(r[0].value, PubFailed)


def test_bad_address_is_refused_early():
    """An address without a port is a ConfigError at construction."""
    with pytest.raises(ValueError):
        Producer("localhost", reactor=task.Clock())


def test_write_stalled_longer_than_write_timeout_closes():
    """The transport pausing us (its buffer full) for write_timeout is go-nsq's write deadline."""
    p, clock, connector = producer(write_timeout=0.5)
    r = results(p.publish("t", b"1"))
    wire = connector.handshake("127.0.0.1:4150")
    wire.proto.pauseProducing()
    clock.advance(0.4)
    wire.proto.resumeProducing()  # drained in time: nothing happens
    clock.advance(1)
    assert not wire.transport.disconnected
    wire.proto.pauseProducing()
    clock.advance(0.5)
    assert wire.transport.disconnected
    wire.proto.connectionLost(Failure(ConnectionLost()))
    assert isinstance(r[0].value, NotConnected)


# --- the HTTP publisher against Go nsqd's recorded answers --------------------------------------------


def _recorded(fixtures_dir, name):
    raw = (fixtures_dir / "go-nsqd-1.3.0-http" / name).read_bytes().replace(b"\r\n", b"\n")
    head, _, body = raw.partition(b"\n\n")
    lines = head.split(b"\n")
    code = int(lines[0].split()[1])
    headers = [tuple(h.split(b": ", 1)) for h in lines[1:] if b": " in h]
    return code, headers, body


class Replay:
    """Answers every request with one recorded Go nsqd exchange; records the requests."""

    def __init__(self, code, headers, body):
        self.code, self.headers, self.body = code, headers, body
        self.requests = []

    def render(self, request):
        self.requests.append((request.method, request.uri, request.content.read()))
        request.setResponseCode(self.code)
        for k, v in self.headers:
            if k.lower() not in (b"content-length", b"date"):
                request.setHeader(k, v)
        return self.body


def _http(fixtures_dir, name):
    from treq.testing import StubTreq
    from nsqtw.client import HTTPProducer
    from twisted.web.resource import Resource
    replay = Replay(*_recorded(fixtures_dir, name))
    resource = Resource()
    resource.isLeaf = True
    resource.render = replay.render
    return HTTPProducer("127.0.0.1:4151", http_client=StubTreq(resource), reactor=task.Clock()), replay


@pytest.mark.parametrize("name,status,text", [("pub-bad-topic.txt", 400, "INVALID_TOPIC"),
                                              ("pub-empty.txt", 400, "MSG_EMPTY")])
def test_http_errors_from_go_nsqd_are_typed(fixtures_dir, name, status, text):
    """Go nsqd's recorded error answers become HTTPAPIError(status, TEXT)."""
    from nsqtw.errors import HTTPAPIError
    h, replay = _http(fixtures_dir, name)
    r = results(h.publish("bad!name", b"x"))
    assert isinstance(r[0].value, HTTPAPIError) and (r[0].value.status, r[0].value.text) == (status, text)


def test_http_requests_are_what_nsqd_expects(fixtures_dir):
    """/pub?topic=&defer=ms with the raw body; /mpub binary is [count]([size][body])*; ping is GET /ping."""
    h, replay = _http(fixtures_dir, "ping.txt")
    assert results(h.ping()) == [None]
    assert results(h.deferred_publish("t", 1.5, b"body")) == [None]
    assert results(h.multi_publish("t", [b"a", b"bc"])) == [None]
    assert results(h.multi_publish("t", [b"a", b"bc"], binary=False)) == [None]
    assert replay.requests == [
        (b"GET", b"/ping", b""),
        (b"POST", b"/pub?topic=t&defer=1500", b"body"),
        (b"POST", b"/mpub?topic=t&binary=true", b"\x00\x00\x00\x02\x00\x00\x00\x01a\x00\x00\x00\x02bc"),
        (b"POST", b"/mpub?topic=t", b"a\nbc"),
    ]
    assert isinstance(results(h.multi_publish("t", [b"a\nb"], binary=False))[0].value, ValueError)
