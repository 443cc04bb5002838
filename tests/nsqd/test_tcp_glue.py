"""The Twisted glue (nsqtw.nsqd.tcp.NsqdProtocol) on a StringTransport and a task.Clock: magic, heartbeats,
the 2x heartbeat read deadline, closes, and one write per read (nsqd/protocol_v2.go IOLoop/messagePump)."""

from __future__ import annotations

from typing import Any


from twisted.internet import task
from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport

from nsqtw.nsqd.core.broker import Broker, memory_only_backends
from nsqtw.options import NsqdOptions
from nsqtw.protocol.frames import FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE, MAGIC_V2, FrameDecoder
from nsqtw.nsqd.tcp import NsqdFactory

from nsqd_harness import T0, cmd, identify, pub

HB = (FRAME_RESPONSE, b"_heartbeat_")


class CountingTransport(StringTransport):
    """A StringTransport that counts write calls."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.writes = 0

    def write(self, data: bytes) -> None:
        self.writes += 1
        super().write(data)


class Node:
    """A broker behind an NsqdFactory on a fake clock."""

    def __init__(self, **opts: Any) -> None:
        opts.setdefault("node_id", 1)
        self.clock = task.Clock()
        self.clock.advance(T0)  # message IDs need a wall-clock time after NSQ's 2010 epoch
        self.options = NsqdOptions(**opts)
        self.broker = Broker(self.options, self.clock.seconds(), backend_factory=memory_only_backends)
        self.factory = NsqdFactory(self.broker, self.clock)
        self._port = 50000

    def connect(self, magic: bool = True) -> Conn:
        self._port += 1
        return Conn(self, self._port, magic)


class Conn:
    def __init__(self, node: Node, port: int, magic: bool) -> None:
        self.node = node
        self.proto = node.factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", port))
        self.tr = CountingTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", port))
        self.proto.makeConnection(self.tr)
        self._dec = FrameDecoder()
        if magic:
            self.send(MAGIC_V2)

    def send(self, data: bytes) -> None:
        """One read, in a reactor turn of its own (the turn's end settles deliveries)."""
        self.proto.dataReceived(data)
        self.node.clock.advance(0)

    def frames(self) -> list[tuple[int, bytes]]:
        data = self.tr.value()
        self.tr.clear()
        return self._dec.feed(data)

    @property
    def closed(self) -> bool:
        return self.tr.disconnecting

    def lose(self) -> None:
        self.proto.connectionLost(None)


def test_bad_magic_framed_error_and_close():
    """A wrong magic gets a framed E_BAD_PROTOCOL and the connection is closed."""
    n = Node()
    c = n.connect(magic=False)
    c.send(b"GET / HTTP/1.1\r\n")
    assert c.frames() == [(FRAME_ERROR, b"E_BAD_PROTOCOL")]
    assert c.closed


def test_magic_timeout_aborts_silent_connection():
    """A connection that never sends the magic is aborted after the magic timeout, without a frame."""
    n = Node(magic_timeout=5.0)
    c = n.connect(magic=False)
    n.clock.advance(4.9)
    assert not c.closed
    n.clock.advance(0.2)
    assert c.closed and c.tr.disconnected
    assert c.frames() == []


def test_magic_cancels_the_magic_timeout():
    """Once the magic arrived the magic timeout no longer applies."""
    n = Node(magic_timeout=5.0)
    c = n.connect(magic=False)
    n.clock.advance(2)
    c.send(MAGIC_V2)
    c.send(identify(heartbeat_interval=-1))
    n.clock.advance(100)
    assert not c.closed


def test_default_heartbeat_every_30s_whatever_the_traffic():
    """Heartbeats are sent every ClientTimeout/2 = 30 s on a fixed ticker, traffic or not."""
    n = Node()
    c = n.connect()
    n.clock.advance(29.9)
    assert c.frames() == []
    n.clock.advance(0.1)
    assert c.frames() == [HB]
    n.clock.advance(20)
    c.send(cmd("NOP"))  # traffic does not move the ticker
    n.clock.advance(10)
    assert c.frames() == [HB]


def test_two_missed_heartbeats_close_the_connection():
    """60 s (2 x 30 s) without any command from the client closes it, with no error frame."""
    n = Node()
    c = n.connect()
    n.clock.advance(50)
    c.send(cmd("NOP"))
    n.clock.advance(109.9 - 50)
    assert not c.closed
    n.clock.advance(0.2)
    assert c.closed
    assert [f for f in c.frames() if f != HB] == []


def test_identify_heartbeat_interval_sets_ticker_and_deadline():
    """IDENTIFY heartbeat_interval N: heartbeats every N ms, and 2N ms of silence closes the connection."""
    n = Node()
    c = n.connect()
    c.send(identify(heartbeat_interval=1000))
    assert c.frames() == [(FRAME_RESPONSE, b"OK")]
    for _ in range(5):
        n.clock.advance(1.0)
        c.send(cmd("NOP"))
    assert c.frames() == [HB] * 5
    assert not c.closed
    n.clock.advance(1.9)
    assert not c.closed
    n.clock.advance(0.2)
    assert c.closed


def test_heartbeats_disabled():
    """heartbeat_interval -1: no heartbeats and no read deadline."""
    n = Node()
    c = n.connect()
    c.send(identify(heartbeat_interval=-1))
    c.frames()
    n.clock.advance(3600)
    assert c.frames() == [] and not c.closed


def test_sub_refused_with_heartbeats_disabled_closes():
    """SUB after disabling heartbeats: the error frame, then the connection closes."""
    n = Node()
    c = n.connect()
    c.send(identify(heartbeat_interval=-1) + cmd("SUB", "t", "c"))
    assert c.frames() == [(FRAME_RESPONSE, b"OK"), (FRAME_ERROR, b"E_INVALID cannot SUB with heartbeats disabled")]
    assert c.closed


def test_fatal_error_writes_frame_then_closes():
    """A fatal error is written before the connection is closed."""
    n = Node()
    c = n.connect()
    c.send(b"BOGUS\n")
    assert c.frames() == [(FRAME_ERROR, b"E_INVALID invalid command BOGUS")]
    assert c.closed


def test_over_long_line_closes_without_frame():
    """A command line over 16 KiB closes the connection without an error frame."""
    n = Node()
    c = n.connect()
    c.send(b"X" * 20000)
    assert c.closed and c.frames() == []


def test_non_fatal_error_keeps_connection():
    """E_FIN_FAILED leaves the transport open."""
    n = Node()
    c = n.connect()
    c.send(cmd("SUB", "t", "c") + cmd("FIN", "0123456789abcdef"))
    assert c.frames()[-1][0] == FRAME_ERROR
    assert not c.closed


def test_one_write_per_read_for_pipelined_commands():
    """Answers to all commands of one read go out in a single transport write."""
    n = Node()
    c = n.connect()
    before = c.tr.writes
    c.send(b"".join(pub("t", b"%d" % i) for i in range(200)))
    assert c.tr.writes - before == 1
    assert c.frames() == [(FRAME_RESPONSE, b"OK")] * 200


def test_delivery_in_the_publishers_read():
    """A PUB reaches a ready consumer during the publisher's dataReceived, in one write to the consumer."""
    n = Node()
    cons = n.connect()
    cons.send(cmd("SUB", "t", "c") + cmd("RDY", 100))
    cons.frames()
    prod = n.connect()
    before = cons.tr.writes
    prod.send(b"".join(pub("t", b"%d" % i) for i in range(50)))
    frames = cons.frames()
    assert [t for t, _ in frames] == [FRAME_MESSAGE] * 50
    assert cons.tr.writes - before == 1


def test_connection_lost_removes_client():
    """connectionLost unsubscribes the client from its channel and forgets it."""
    n = Node()
    c = n.connect()
    c.send(cmd("SUB", "t", "c"))
    ch = n.broker.find_channel("t", "c")
    assert len(ch.clients) == 1
    c.lose()
    assert len(ch.clients) == 0 and c.proto.client.id not in n.broker.clients
    n.clock.advance(1000)  # no timers left behind
    assert n.clock.getDelayedCalls() == [] or all(not d.active() for d in n.clock.getDelayedCalls())


def test_heartbeats_reach_consumers_with_messages_in_flight():
    """A subscribed consumer keeps getting heartbeats while holding messages."""
    n = Node()
    c = n.connect()
    c.send(identify(heartbeat_interval=1000) + cmd("SUB", "t", "c") + cmd("RDY", 1))
    p = n.connect()
    p.send(pub("t", b"x"))
    frames = c.frames()
    assert frames[-1][0] == FRAME_MESSAGE
    n.clock.advance(1.0)
    c.send(cmd("NOP"))
    assert c.frames() == [HB]


def test_identify_restarts_the_heartbeat_ticker():
    """IDENTIFY replaces the 30 s ticker with one of the new interval, counted from the IDENTIFY."""
    n = Node()
    c = n.connect()
    n.clock.advance(20)
    c.send(identify(heartbeat_interval=5000))
    c.frames()
    n.clock.advance(4.9)
    assert c.frames() == []
    n.clock.advance(0.1)
    assert c.frames() == [HB]
    n.clock.advance(4.9)
    c.send(cmd("NOP"))  # within 2 intervals of the IDENTIFY: the read deadline is not hit
    n.clock.advance(0.1)
    assert c.frames() == [HB] and not c.closed


def test_read_deadline_counts_from_the_previous_command():
    """Bytes that never complete a command do not keep the connection alive past 2 intervals."""
    n = Node()
    c = n.connect()
    c.send(identify(heartbeat_interval=1000))
    c.frames()
    for b in b"NOP NOP NOP":
        n.clock.advance(0.5)
        if c.closed:
            break
        c.send(bytes([b]))
    assert c.closed


# --- one whole PUB per read (the short path): the same answers and effects as the long one -----

def test_pub_per_read_answers_counts_and_stores_each_message():
    """A producer's PUB-per-round-trip: every read is one PUB; each is answered OK in its own
    write, stored in order, counted for the topic and the client, and resets the read deadline."""
    n = Node()
    c = n.connect()
    c.send(pub("t", b"first"))  # the first PUB of a connection takes the long path
    assert c.proto.session._pub_raw == b"t"  # the next ones take feed's first branch
    for i in range(5):
        n.clock.advance(1)
        before = c.tr.writes
        c.send(pub("t", b"m%d" % i))
        assert c.tr.writes - before == 1 and c.proto._last_read == n.clock.seconds()
    assert c.frames() == [(FRAME_RESPONSE, b"OK")] * 6
    topic = n.broker.topics["t"]
    assert topic.message_count == 6 and c.proto.client.pub_counts == {"t": 6}
    assert c.proto.session.commands == 6
    assert [f[34:] for f in n.broker.topics["t"].mem.peek(6)] == [b"first"] + [b"m%d" % i for i in range(5)]


def test_pub_per_read_hands_every_other_read_to_the_long_path():
    """Another topic, a bad one, a cut PUB, two PUBs in a read, a body too big: each is read
    and answered as the long path answers it."""
    n = Node(max_msg_size=10)
    c = n.connect()
    c.send(pub("t", b"a"))
    c.send(pub("u", b"b"))  # another topic
    whole = pub("t", b"c")
    c.send(whole[:9])  # a PUB cut across reads
    c.send(whole[9:])
    c.send(pub("t", b"d") + pub("t", b"e"))
    c.send(b"PUB t \n" + whole[6:])  # a trailing space: not the cached name as sent
    assert c.frames() == [(FRAME_RESPONSE, b"OK")] * 6
    assert n.broker.topics["t"].message_count == 5 and n.broker.topics["u"].message_count == 1
    c.send(pub("t", b"x" * 11))
    assert c.frames() == [(FRAME_ERROR, b"E_BAD_MESSAGE PUB message too big 11 > 10")]
    assert c.closed


def test_pub_per_read_reaches_a_ready_consumer_in_the_same_read():
    n = Node()
    cons = n.connect()
    cons.send(cmd("SUB", "t", "c") + cmd("RDY", 10))
    cons.frames()
    prod = n.connect()
    for i in range(3):
        prod.send(pub("t", b"%d" % i))
    assert [body[26:] for _, body in cons.frames()] == [b"0", b"1", b"2"]


def test_pub_per_read_refused_by_a_full_queue_fails_and_closes():
    """A topic whose memory queue is full and which has no disk: E_PUB_FAILED, the connection
    closes, and the refused message is not counted (as on the long path)."""
    n = Node(mem_queue_size=2)
    c = n.connect()
    c.send(pub("t", b"1"))
    c.send(pub("t", b"2"))
    c.send(pub("t", b"3"))
    assert c.frames() == [(FRAME_RESPONSE, b"OK")] * 2 + [(FRAME_ERROR, b"E_PUB_FAILED PUB failed topic t is full")]
    assert c.closed
    assert n.broker.topics["t"].message_count == 2 and c.proto.client.pub_counts == {"t": 2}


# --- a publisher's answer first; deliveries settled once per reactor turn -----------------------

class LoggingTransport(CountingTransport):
    """Counts writes and records, in one list shared by several transports, who wrote when."""

    def __init__(self, name: str, log: list[str], *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.name = name
        self.log = log
        #: called at each write, its answers kept in ``probed``
        self.probe: Any = None
        self.probed: list[Any] = []

    def write(self, data: bytes) -> None:
        self.log.append(self.name)
        if self.probe is not None:
            self.probed.append(self.probe())
        super().write(data)


def _logged(node: Node, name: str, log: list[str]) -> Conn:
    c = node.connect(magic=False)
    c.tr.unregisterProducer()
    c.tr = LoggingTransport(name, log, peerAddress=c.tr.getPeer())
    c.proto.makeConnection(c.tr)
    c.send(MAGIC_V2)
    return c


def test_a_publishers_ok_is_written_before_the_deliveries_it_made_possible():
    """The publisher waits on its OK; the consumer's messages are framed and written after it."""
    n = Node()
    log: list[str] = []
    cons = _logged(n, "consumer", log)
    cons.send(cmd("SUB", "t", "c") + cmd("RDY", 100))
    cons.frames()
    prod = _logged(n, "producer", log)
    channel = n.broker.topics["t"].channels["c"]
    prod.tr.probe = lambda: len(channel.inflight)
    for data in (b"".join(pub("t", b"%d" % i) for i in range(3)), pub("t", b"one")):  # long and short path
        del log[:]
        prod.send(data)
        assert log == ["producer", "consumer"]
    assert prod.tr.probed[-2:] == [0, 3]  # when each OK was written, its messages were not yet delivered
    assert [body[26:] for _, body in cons.frames()] == [b"0", b"1", b"2", b"one"]


def test_settling_delivers_once_at_the_end_of_the_turn():
    """Reads only parse and answer; what every read of a reactor turn made deliverable is
    delivered once the turn's reads are done, in one write per consumer (any reactor: the
    turn batcher's one callLater(0))."""
    n = Node()
    cons = n.connect()
    cons.send(cmd("SUB", "t", "c") + cmd("RDY", 100))
    cons.frames()
    p1, p2 = n.connect(), n.connect()
    before = cons.tr.writes
    p1.proto.dataReceived(pub("t", b"a"))  # two reads of one turn
    p2.proto.dataReceived(b"".join(pub("t", b"b%d" % i) for i in range(2)))
    assert p1.frames() == [(FRAME_RESPONSE, b"OK")]  # answered at once
    assert p2.frames() == [(FRAME_RESPONSE, b"OK")] * 2
    assert cons.frames() == [] and cons.tr.writes == before  # nothing delivered yet
    n.clock.advance(0)  # the turn ends
    assert [body[26:] for _, body in cons.frames()] == [b"a", b"b0", b"b1"]
    assert cons.tr.writes - before == 1
    n.clock.advance(0)  # nothing wanted: nothing written
    assert cons.tr.writes - before == 1


def test_the_glue_acts_on_the_sessions_outcome_and_reads_nothing_else_of_it():
    """``NsqdProtocol`` learns what to do after a read from the :class:`Outcome` that ``feed``
    (and ``eof``, ``synced``, ``sync_failed``) return: it calls the session's methods, and reads
    none of its attributes (public or private)."""
    import ast
    import inspect

    from nsqtw.nsqd import tcp

    calls = {"feed", "eof", "synced", "sync_failed", "resume", "take_remainder"}
    tree = ast.parse(inspect.getsource(tcp))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def is_session(node: ast.expr) -> bool:
        return (isinstance(node, ast.Name) and node.id == "session") or (
            isinstance(node, ast.Attribute) and node.attr == "session" and isinstance(node.value, ast.Name)
            and node.value.id == "self")

    reads = sorted({f"{node.attr}:{node.lineno}" for node in ast.walk(tree)
                    if isinstance(node, ast.Attribute) and is_session(node.value)
                    and not (node.attr in calls and isinstance(parents[node], ast.Call)
                             and parents[node].func is node)})
    assert reads == []


def test_an_outcome_restarts_heartbeats_on_magic_and_on_identify():
    from nsqtw.nsqd.core.v2 import Outcome, V2Session

    node = Node()
    session = V2Session(node.broker, node.broker.new_client("127.0.0.1:1", T0))
    assert session.feed(MAGIC_V2[:2], T0) == Outcome()
    first = session.feed(MAGIC_V2[2:] + b"NOP\n", T0)
    assert first.heartbeats and first.progressed
    assert not session.feed(b"NOP\n", T0).heartbeats  # said once
    assert session.feed(identify(heartbeat_interval=5000), T0).heartbeats
