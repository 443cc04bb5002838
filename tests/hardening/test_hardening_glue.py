"""
The TCP glue under abuse, on a StringTransport and a task.Clock: the magic
timeout (complete silence and a partial magic), the read deadline against a
client that dribbles a command byte by byte, what happens around a fatal
error, and the limits that must hold before a body is buffered.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from twisted.internet import task
from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport

from nsqtw.nsqd.core.auth import Authorization, AuthState
from nsqtw.nsqd.core.broker import Broker, memory_only_backends
from nsqtw.nsqd.core.v2 import MAX_LINE
from nsqtw.options import NsqdOptions
from nsqtw.protocol.frames import FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE, MAGIC_V2, FrameDecoder
from nsqtw.protocol.message import decode_message
from nsqtw.nsqd.tcp import NsqdFactory

from hardening_support import T0, SansIOConn, body_cmd, cmd, errors_of, i32, small_options, wellformed

HB = (FRAME_RESPONSE, b"_heartbeat_")


class Node:
    """A broker behind the real NsqdFactory, on a fake clock."""

    def __init__(self, **opts: Any) -> None:
        opts.setdefault("node_id", 3)
        self.clock = task.Clock()
        self.clock.advance(T0)
        self.options = NsqdOptions(**opts)
        self.broker = Broker(self.options, self.clock.seconds(), backend_factory=memory_only_backends)
        self.factory = NsqdFactory(self.broker, self.clock)
        self.port = 51000

    def connect(self, magic: bool = True) -> Conn:
        self.port += 1
        return Conn(self, self.port, magic)


class Conn:
    def __init__(self, node: Node, port: int, magic: bool) -> None:
        self.node = node
        addr = IPv4Address("TCP", "127.0.0.1", port)
        self.proto = node.factory.buildProtocol(addr)
        self.tr = StringTransport(peerAddress=addr)
        self.proto.makeConnection(self.tr)
        self.dec = FrameDecoder()
        if magic:
            self.send(MAGIC_V2)

    def send(self, data: bytes) -> None:
        """One read, in a reactor turn of its own (the turn's end settles deliveries)."""
        self.proto.dataReceived(data)
        self.node.clock.advance(0)

    def frames(self) -> list[tuple[int, bytes]]:
        data = self.tr.value()
        self.tr.clear()
        return self.dec.feed(data)

    @property
    def closed(self) -> bool:
        return self.tr.disconnecting or self.tr.disconnected

    def lose(self) -> None:
        self.proto.connectionLost(None)


# --- the magic ------------------------------------------------------------------------------


@pytest.mark.parametrize("sent", [b"", b" ", b"  V"])
def test_silent_or_partial_magic_is_dropped_after_the_timeout(sent):
    """No magic, or only part of it: the connection is aborted at magic_timeout, not before, no frame."""
    n = Node(magic_timeout=3.0)
    c = n.connect(magic=False)
    if sent:
        c.send(sent)
    n.clock.advance(2.9)
    assert not c.closed
    n.clock.advance(0.2)
    assert c.closed and c.frames() == []


def test_magic_dribbled_in_time_is_accepted():
    """The magic arriving one byte at a time within the timeout is fine (reads may be cut anywhere)."""
    n = Node(magic_timeout=3.0)
    c = n.connect(magic=False)
    for b in MAGIC_V2:
        n.clock.advance(0.5)
        c.send(bytes([b]))
    c.send(cmd("NOP") + body_cmd("PUB", "t", body=b"x"))
    n.clock.advance(10)
    assert not c.closed and c.frames() == [(FRAME_RESPONSE, b"OK")]


# --- read deadline --------------------------------------------------------------------------


def test_silent_client_is_dropped_after_two_heartbeats():
    """After IDENTIFY heartbeat_interval=1000, 2 s without a byte from the client closes it."""
    n = Node()
    c = n.connect()
    c.send(body_cmd("IDENTIFY", body=b'{"heartbeat_interval":1000}'))
    n.clock.advance(1.9)
    assert not c.closed
    n.clock.advance(0.2)
    assert c.closed


def test_dribbled_command_does_not_keep_the_connection_forever():
    """A command that never completes, one byte every 1.5 s, is cut off by the 2 s read deadline."""
    n = Node()
    c = n.connect()
    c.send(body_cmd("IDENTIFY", body=b'{"heartbeat_interval":1000}'))
    for b in b"PUB topic-that-never-ends-" * 4:
        n.clock.advance(1.5)
        if c.closed:
            break
        c.send(bytes([b]))
    assert c.closed


# --- fatal errors ----------------------------------------------------------------------------


def test_no_delivery_after_a_fatal_error():
    """RDY 3 then a fatal command in the same read: only the error frame, and nothing goes in flight."""
    n = Node()
    n.broker.publish("t", [b"a", b"b", b"c"], n.clock.seconds())
    c = n.connect()
    c.send(cmd("SUB", "t", "c"))
    assert c.frames() == [(FRAME_RESPONSE, b"OK")]
    c.send(cmd("RDY", 3) + cmd("FROB"))
    frames = c.frames()
    assert c.closed
    assert frames == [(FRAME_ERROR, b"E_INVALID invalid command FROB")]
    c.lose()
    other = n.connect()
    other.send(cmd("SUB", "t", "c") + cmd("RDY", 3))
    got = [decode_message(p) for t, p in other.frames() if t == FRAME_MESSAGE]
    assert sorted(m.body for m in got) == [b"a", b"b", b"c"]
    assert [m.attempts for m in got] == [1, 1, 1]


def test_error_closes_after_answers_already_due():
    """Commands before a fatal one in the same read are answered in order, then the error, then the close."""
    n = Node()
    c = n.connect()
    c.send(body_cmd("PUB", "t", body=b"1") + cmd("NOP") + body_cmd("PUB", "t", body=b"2") + b"PUB t\n" + i32(-1)
           + body_cmd("PUB", "t", body=b"never"))
    assert c.frames() == [(FRAME_RESPONSE, b"OK"), (FRAME_RESPONSE, b"OK"),
                          (FRAME_ERROR, b"E_BAD_MESSAGE PUB invalid message body size -1")]
    assert c.closed and n.broker.find_topic("t").message_count == 2


# --- sizes refused before the body ------------------------------------------------------------


LIMITS = dict(max_msg_size=1000, max_body_size=5000)


@pytest.mark.parametrize("header,expected", [
    (b"PUB t\n" + i32(1001), b"E_BAD_MESSAGE PUB message too big 1001 > 1000"),
    (b"DPUB t 0\n" + i32(1001), b"E_BAD_MESSAGE DPUB message too big 1001 > 1000"),
    (b"MPUB t\n" + i32(5001), b"E_BAD_BODY MPUB body too big 5001 > 5000"),
    (b"MPUB t\n" + i32(4000) + i32(3) + i32(1001), b"E_BAD_MESSAGE MPUB message too big 1001 > 1000"),
    (b"MPUB t\n" + i32(4000) + i32(1000), b"E_BAD_BODY MPUB invalid message count 1000"),
    (b"IDENTIFY\n" + i32(5001), b"E_BAD_BODY IDENTIFY body too big 5001 > 5000"),
    (b"AUTH\n" + i32(5001), b"E_BAD_BODY AUTH body too big 5001 > 5000"),
    (b"PUB t\n" + i32(2 ** 31 - 1), b"E_BAD_MESSAGE PUB message too big 2147483647 > 1000"),
    (b"MPUB t\n" + i32(-2 ** 31), b"E_BAD_BODY MPUB invalid body size -2147483648"),
])
def test_oversized_body_refused_from_its_size_alone(header, expected):
    """A body size over its limit is answered as soon as the size field is in: no body byte was sent."""
    n = Node(**LIMITS)
    c = n.connect()
    c.send(header)
    assert c.frames() == [(FRAME_ERROR, expected)] and c.closed


def test_line_limit_is_16_kib_without_newline():
    """16383 bytes without a newline wait for more; the 16384th closes the connection, no frame."""
    n = Node()
    c = n.connect()
    c.send(b"P" * (MAX_LINE - 1))
    assert not c.closed
    c.send(b"P")
    assert c.closed and c.frames() == []


def test_longest_line_is_accepted_and_parsed():
    """A 16383-byte line plus its newline fits nsqd's buffer and is parsed (here: an unknown command)."""
    n = Node()
    c = n.connect()
    c.send(b"P" * (MAX_LINE - 1) + b"\n")
    frames = c.frames()
    assert len(frames) == 1 and frames[0][1].startswith(b"E_INVALID invalid command PPP")


def test_line_limit_holds_in_the_middle_of_a_read():
    """After valid commands, a 64 KiB read with no newline closes at once: the broker keeps at most 16 KiB."""
    n = Node()
    c = n.connect()
    c.send(cmd("NOP") + body_cmd("PUB", "t", body=b"x") + b"Q" * 65536)
    assert c.frames() == [(FRAME_RESPONSE, b"OK")] and c.closed
    assert len(c.proto.session._buf) <= MAX_LINE


def test_auth_flood_while_suspended_is_bounded():
    """While AUTH waits for the auth server, a client flooding bytes is closed past one body and one line."""
    anything = re.compile("")
    conn = SansIOConn(small_options(max_body_size=4096), authorizer=object(),
                      auth_result=AuthState(b"s", "", "", [Authorization(anything, (anything,), ("publish",))],
                                            T0 + 60))
    conn.auth_result = None  # the auth server does not answer
    session = conn.session
    out = session.feed(MAGIC_V2 + body_cmd("AUTH", body=b"secret"), conn.now)
    assert out.close == 0 and out.auth == b"secret"
    kept = True
    total = 0
    while kept and total < 1 << 20:
        out = session.feed(b"NOP\n" * 256, conn.now)
        assert out.auth is None  # asked once
        kept = out.close == 0
        total += 1024
    assert not kept and total <= 4096 + MAX_LINE + 1024


# --- CPU per byte: no quadratic parsing --------------------------------------------------------


def _feed_cost(data: bytes, piece: int, opts: NsqdOptions) -> float:
    conn = SansIOConn(opts)
    start = time.process_time()  # this process's CPU: other work on the machine does not count
    conn.feed(MAGIC_V2)
    for i in range(0, len(data), piece):
        assert conn.feed(data[i:i + piece])
    elapsed = time.process_time() - start
    assert wellformed(conn.take())[-1] == (FRAME_RESPONSE, b"OK")
    return elapsed


def test_big_pub_dribbled_costs_linear_time():
    """A 1 MiB PUB arriving in 1460-byte reads costs about what one read costs (chunks are joined once)."""
    opts = NsqdOptions(node_id=3)
    data = body_cmd("PUB", "t", body=b"z" * (1 << 20))
    whole = _feed_cost(data, len(data), opts)
    dribbled = _feed_cost(data, 1460, opts)
    assert dribbled < max(20 * whole, 0.05), (whole, dribbled)


def test_big_mpub_dribbled_costs_linear_time():
    """A 5 MB MPUB of 1000-byte messages arriving in 1460-byte reads costs at most 20x one read."""
    opts = NsqdOptions(node_id=3, mem_queue_size=100_000)
    bodies = [b"y" * 1000] * 5000
    payload = i32(len(bodies)) + b"".join(i32(len(b)) + b for b in bodies)
    data = body_cmd("MPUB", "t", body=payload)
    whole = _feed_cost(data, len(data), opts)
    dribbled = _feed_cost(data, 1460, opts)
    assert dribbled < max(20 * whole, 0.05), (whole, dribbled)


# --- numbers longer than Python's int() accepts ---------------------------------------------------

HUGE = b"9" * 5000  # Python refuses int() of more than 4300 digits (sys.int_info.default_max_str_digits)


@pytest.mark.parametrize("stream,expected,fatal", [
    (cmd("SUB", "t", "c") + b"RDY " + HUGE + b"\n", b"E_INVALID RDY count", True),
    # REQ clamps any timeout (Go's overflowed uint64 included), so only the unknown ID fails
    (cmd("SUB", "t", "c") + b"REQ 0000000000000000 " + HUGE + b"\n", b"E_REQ_FAILED", False),
    (b"DPUB t " + HUGE + b"\n", b"E_INVALID DPUB", True),
], ids=["RDY", "REQ", "DPUB"])
def test_number_over_4300_digits_is_e_invalid(stream, expected, fatal):
    """A count or timeout of 5000 digits is answered as nsqd answers it (its number just
    overflows), never an exception out of the session."""
    conn = SansIOConn(small_options())
    keep = conn.feed(MAGIC_V2 + stream)
    frames = wellformed(conn.take())
    assert keep is (not fatal) and frames[-1][0] == FRAME_ERROR and frames[-1][1].startswith(expected)


def test_mpub_cannot_buffer_more_than_max_body_size():
    """An MPUB whose messages run past --max-body-size (and past its own announced size) is refused."""
    opts = NsqdOptions(node_id=3, mem_queue_size=10 ** 6)
    conn = SansIOConn(opts)
    conn.feed(MAGIC_V2 + b"MPUB t\n" + i32(100) + i32(5000))
    message = i32(65536) + b"x" * 65536
    for _ in range(200):  # 13 MB
        if not conn.feed(message):
            break
        held = len(conn.session._buf) + sum(map(len, conn.session._chunks))
        assert held <= opts.max_body_size + MAX_LINE + 8, held
    assert not conn.open
    assert errors_of(wellformed(conn.take()))[0].startswith(b"E_BAD_BODY")
