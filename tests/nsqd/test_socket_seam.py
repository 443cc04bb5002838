"""One socket seam and one turn batcher (issue 23).

The eager write and reused-buffer read attach only to a plain, unwrapped
``tcp.Server`` (behind TLS or any ``WrappingFactory`` the wrapper sees every
byte); end-of-turn work runs once per turn, the same on Twisted's own epoll
reactor and on nsqtw's spin reactor; the spin reactor isolates each event as
Twisted's does; and any split of a publisher's stream gives the same bytes and
the same ``/stats`` as one read, with the fast I/O on and off.
"""

from __future__ import annotations

import json
import socket
import ssl
import struct
from typing import Any

import pytest
import pytest_twisted
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.internet import endpoints, reactor, threads
from twisted.internet import ssl as tssl
from twisted.internet.epollreactor import EPollReactor
from twisted.protocols import policies

from nsqtw.nsqd.core.broker import Broker, memory_only_backends
from nsqtw.options import NsqdOptions
from nsqtw.protocol.frames import MAGIC_V2, FrameDecoder
from nsqtw.runtime.spinreactor import SpinningEPollReactor
from nsqtw.nsqd.stats.snapshot import broker_stats
from nsqtw.runtime import seam
from nsqtw.nsqd.tcp import NsqdFactory
from nsqtw.runtime.turn import IReactorTurnHooks, TurnBatcher

T0 = 1.7e9
OK = struct.pack(">ii", 6, 0) + b"OK"


def pub(topic: str, body: bytes) -> bytes:
    return b"PUB " + topic.encode() + b"\n" + struct.pack(">i", len(body)) + body


def mpub(topic: str, bodies: list[bytes]) -> bytes:
    payload = struct.pack(">i", len(bodies)) + b"".join(struct.pack(">i", len(b)) + b for b in bodies)
    return b"MPUB " + topic.encode() + b"\n" + struct.pack(">i", len(payload)) + payload


def _talk(port: int, data: bytes, *, expect: int, tls: dict[str, str] | None = None) -> bytes:
    """A blocking client (run in a thread): send, read ``expect`` bytes (or until EOF)."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock: Any = raw
    if tls is not None:
        ctx = ssl.create_default_context(cafile=tls["ca"])
        ctx.check_hostname = False
        sock = ctx.wrap_socket(raw)
    try:
        sock.sendall(data)
        got = b""
        while len(got) < expect:
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += chunk
        return got
    finally:
        sock.close()


# --- where the seam attaches -----------------------------------------------------------------

@pytest_twisted.ensureDeferred
async def test_behind_tls_endpoint_the_client_reads_ok_over_tls(tmp_path: Any) -> None:
    """NsqdFactory behind Twisted's TLS server endpoint: the OK goes through TLS (it went
    out in plaintext on the raw socket, and the client failed with WRONG_VERSION_NUMBER)."""
    from nsqtw.testing.certs import make_certificates

    paths = make_certificates(str(tmp_path))
    factory = NsqdFactory(Broker(NsqdOptions(), T0), reactor)
    ctx = tssl.DefaultOpenSSLContextFactory(paths["server_key"], paths["server"])
    port = await endpoints.SSL4ServerEndpoint(reactor, 0, ctx, interface="127.0.0.1").listen(factory)
    try:
        got = await threads.deferToThread(_talk, port.getHost().port, MAGIC_V2 + pub("t", b"hello"),
                                          expect=len(OK), tls=paths)
        assert got == OK
        assert all(p._seam is None for p in factory.protocols)
        assert factory.broker.topics["t"].message_count == 1
    finally:
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_behind_a_wrapping_factory_the_wrapper_sees_every_byte() -> None:
    """A policies.WrappingFactory (throttling, traffic logging, PROXY protocol) between the
    port and NsqdFactory: every byte the broker writes passes through the wrapper's write."""
    seen: list[bytes] = []

    class Recording(policies.ProtocolWrapper):
        def write(self, data: bytes) -> None:
            seen.append(data)
            super().write(data)

    class RecordingFactory(policies.WrappingFactory):
        protocol = Recording

    inner = NsqdFactory(Broker(NsqdOptions(), T0), reactor)
    port = reactor.listenTCP(0, RecordingFactory(inner), interface="127.0.0.1")
    try:
        stream = MAGIC_V2 + pub("t", b"a") + pub("t", b"b") + b"NOP\n" + b"FROB\n"
        got = await threads.deferToThread(_talk, port.getHost().port, stream, expect=1 << 20)
        assert got.startswith(OK + OK)
        assert b"".join(seen) == got  # nothing reached the socket around the wrapper
        assert b"E_INVALID invalid command FROB" in got
    finally:
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_the_seam_attaches_to_a_plain_tcp_server_and_has_one_switch() -> None:
    for fast_io, attached in ((True, True), (False, False)):
        factory = NsqdFactory(Broker(NsqdOptions(), T0), reactor, fast_io=fast_io)
        port = reactor.listenTCP(0, factory, interface="127.0.0.1")
        raw = socket.create_connection(("127.0.0.1", port.getHost().port))
        try:
            while not factory.protocols:
                await _one_turn()
            (proto,) = factory.protocols
            assert (proto._seam is not None) == attached
            raw.sendall(MAGIC_V2 + pub("t", b"x"))
            got = await threads.deferToThread(raw.recv, 100)
            assert got == OK
        finally:
            raw.close()
            await port.stopListening()
    assert seam.attach(object(), None, lambda data: None) is None  # not a tcp.Server


@pytest_twisted.ensureDeferred
async def test_nothing_is_sent_after_abort_connection() -> None:
    """An answer written in the same turn as ``abortConnection()`` never reaches the socket."""
    factory = NsqdFactory(Broker(NsqdOptions(), T0), reactor)
    port = reactor.listenTCP(0, factory, interface="127.0.0.1")
    raw = socket.create_connection(("127.0.0.1", port.getHost().port), timeout=10)
    try:
        raw.sendall(MAGIC_V2 + pub("t", b"x"))
        assert await threads.deferToThread(raw.recv, 100) == OK
        (proto,) = factory.protocols
        assert proto._seam is not None
        proto.transport.abortConnection()
        proto.client.writer(b"AFTER-ABORT")  # what a delivery in the same turn would do

        def rest() -> bytes:
            data = b""
            try:
                while chunk := raw.recv(100):
                    data += chunk
            except ConnectionResetError:
                pass
            return data

        assert b"AFTER-ABORT" not in await threads.deferToThread(rest)
    finally:
        raw.close()
        await port.stopListening()


async def _one_turn() -> None:
    from twisted.internet import task

    await task.deferLater(reactor, 0.001, lambda: None)


# --- the turn batcher, on every reactor ----------------------------------------------------------

class _Reader:
    def __init__(self, sock: socket.socket, name: str, log: list[str], on_read: Any = None,
                 lost: Any = None) -> None:
        self.sock, self.name, self.log, self.on_read, self.lost = sock, name, log, on_read, lost

    def fileno(self) -> int:
        return self.sock.fileno()

    def doRead(self) -> Any:
        self.sock.recv(100)
        self.log.append(f"read {self.name}")
        if self.on_read is not None:
            return self.on_read()
        return None

    def logPrefix(self) -> str:
        return self.name

    def connectionLost(self, reason: Any) -> None:
        if self.lost is not None:
            self.lost()


@pytest.mark.parametrize("reactor_class", [EPollReactor, SpinningEPollReactor],
                         ids=["twisted-epoll", "nsqtw-spin"])
def test_end_of_turn_work_runs_once_after_every_read_of_the_turn(reactor_class: Any) -> None:
    """Two reads in one poll each ask for the settle: it runs once, after both, on Twisted's
    own reactor (a callLater(0)) exactly as on the spin reactor (its declared hook)."""
    r = reactor_class()
    log: list[str] = []
    batcher = TurnBatcher(r)
    assert IReactorTurnHooks.providedBy(r) == (reactor_class is SpinningEPollReactor)

    def settle() -> None:
        log.append("settle")

    pairs = [socket.socketpair() for _ in range(2)]
    readers = [_Reader(a, f"r{i}", log, on_read=lambda: batcher.soon(settle)) for i, (a, _) in enumerate(pairs)]
    try:
        for rd in readers:
            r.addReader(rd)
        for _, b in pairs:
            b.send(b"x")
        for _ in range(3):  # one turn is a poll and the calls due after it
            r.doIteration(1.0 if not log else 0)
            r.runUntilCurrent()
        assert sorted(log[:2]) == ["read r0", "read r1"]
        assert log[2:] == ["settle"]
        for rd in readers:
            r.removeReader(rd)
    finally:
        for a, b in pairs:
            a.close()
            b.close()
        r._poller.close()


def test_a_raising_connection_lost_leaves_the_polls_other_events_and_the_hook_handled() -> None:
    """Under the spin reactor, an exception out of one connection's connectionLost is logged
    and the other events of the poll and the end-of-turn work are still handled (as on
    Twisted's epoll reactor)."""
    from twisted.logger import globalLogPublisher

    r = SpinningEPollReactor(spin_seconds=0.0)
    log: list[str] = []
    logged: list[Any] = []
    batcher = TurnBatcher(r)

    def settle() -> None:
        log.append("settle")

    def fail() -> None:
        raise RuntimeError("boom in connectionLost")

    def lost_read() -> Any:
        from twisted.internet.main import CONNECTION_LOST

        batcher.soon(settle)
        return CONNECTION_LOST

    pairs = [socket.socketpair() for _ in range(3)]
    readers = [_Reader(pairs[0][0], "bad", log, on_read=lost_read, lost=fail)]
    readers += [_Reader(a, f"r{i}", log, on_read=lambda: batcher.soon(settle))
                for i, (a, _) in enumerate(pairs[1:], 1)]
    globalLogPublisher.addObserver(logged.append)
    try:
        for rd in readers:
            r.addReader(rd)
        for _, b in pairs:
            b.send(b"x")
        r.doIteration(1.0)
        assert sorted(log[:-1]) == ["read bad", "read r1", "read r2"]
        assert log[-1] == "settle"
        assert any("boom" in str(e.get("log_failure", "")) for e in logged)
    finally:
        globalLogPublisher.removeObserver(logged.append)
        for rd in readers[1:]:
            r.removeReader(rd)
        for a, b in pairs:
            a.close()
            b.close()
        r._poller.close()


# --- any split equals one read, over a real socket, fast I/O on and off ---------------------------

class _FixedTime:
    """The broker's clock for this property: real calls on a private reactor, a fixed time
    (so message IDs and timestamps are the same in every run)."""

    def __init__(self, r: Any) -> None:
        self.r = r

    def seconds(self) -> float:
        return T0

    def callLater(self, delay: float, fn: Any, *a: Any, **kw: Any) -> Any:
        return self.r.callLater(delay, fn, *a, **kw)

    def getDelayedCalls(self) -> Any:
        return self.r.getDelayedCalls()


def _run(r: Any, until: Any = None, quiet: int = 3) -> None:
    """Turn the private reactor until ``until()`` holds or ``quiet`` turns passed without events."""
    for turn in range(2000):
        r.runUntilCurrent()
        r.doIteration(0.002)
        r.runUntilCurrent()
        if until is not None and until():
            return
        if until is None and turn + 1 >= quiet:
            return


def _recv_all(sock: socket.socket) -> bytes:
    sock.setblocking(False)
    data = b""
    while True:
        try:
            chunk = sock.recv(1 << 20)
        except BlockingIOError:
            return data
        if not chunk:
            return data
        data += chunk


def _without_ports(doc: Any) -> Any:
    """A /stats document without what names the client's port (a new one each run)."""
    if isinstance(doc, dict):
        return {k: _without_ports(v) for k, v in doc.items()
                if k not in ("remote_address", "client_id", "hostname")}
    if isinstance(doc, list):
        return [_without_ports(v) for v in doc]
    return doc


def _serve(stream: bytes, cuts: list[int], fast_io: bool) -> tuple[bytes, bytes, str]:
    r = EPollReactor()
    broker = Broker(NsqdOptions(node_id=7, mem_queue_size=1000), T0, backend_factory=memory_only_backends)
    factory = NsqdFactory(broker, _FixedTime(r), fast_io=fast_io)
    port = r.listenTCP(0, factory, interface="127.0.0.1")
    addr = ("127.0.0.1", port.getHost().port)
    cons = socket.create_connection(addr)
    prod = socket.create_connection(addr)
    try:
        cons.sendall(MAGIC_V2 + b"SUB t c\nRDY 1000\n")
        _run(r, until=lambda: broker.topics.get("t") is not None and broker.topics["t"].channels)
        _run(r)
        pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
        for piece in pieces:
            if piece:
                prod.sendall(piece)
                _run(r)  # most pieces arrive as reads of their own
        assert all((p._seam is not None) == fast_io for p in factory.protocols)
        # the publisher half-closes: nsqd answers what it read, then closes; its EOF says
        # every read was handled
        prod.shutdown(socket.SHUT_WR)
        prod.setblocking(False)
        answers = bytearray()
        eof = [False]

        def closed() -> bool:
            try:
                while chunk := prod.recv(1 << 20):
                    answers.extend(chunk)
                eof[0] = True
            except BlockingIOError:
                pass
            except ConnectionResetError:
                eof[0] = True
            return eof[0]

        _run(r, until=closed)
        assert eof[0]
        _run(r, quiet=5)  # Twisted's own writes go out in the next turns
        deliveries = _recv_all(cons)
        stats = broker_stats(broker, T0)
        stats.pop("memory", None)  # the process's, not the broker's
        return bytes(answers), deliveries, json.dumps(_without_ports(stats), sort_keys=True, default=str)
    finally:
        prod.close()
        cons.close()
        port.stopListening()
        _run(r)
        r._poller.close()


_bodies = st.binary(min_size=1, max_size=40)
_command = st.one_of(
    _bodies.map(lambda b: pub("t", b)),
    _bodies.map(lambda b: pub("other", b)),
    st.lists(_bodies, min_size=1, max_size=5).map(lambda bs: mpub("t", bs)),
    st.just(b"NOP\n"),
    _bodies.map(lambda b: b"DPUB t 5000\n" + struct.pack(">i", len(b)) + b),
)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(commands=st.lists(_command, min_size=1, max_size=12),
       data=st.data(), bad_end=st.booleans())
def test_any_split_of_a_publishers_stream_equals_one_read(commands: list[bytes], data: Any,
                                                         bad_end: bool) -> None:
    stream = MAGIC_V2 + b"".join(commands) + (b"FROB\n" if bad_end else b"")
    cuts = sorted(set(data.draw(st.lists(st.integers(1, len(stream) - 1), max_size=8))))
    whole = _serve(stream, [], True)
    published = [c for c in commands if c != b"NOP\n"]
    bad = struct.pack(">ii", 34, 1) + b"E_INVALID invalid command FROB"
    assert whole[0] == OK * len(published) + (bad if bad_end else b"")
    to_t = sum(1 if c.startswith(b"PUB t\n") else struct.unpack(">i", c[11:15])[0]
               for c in published if c.startswith((b"PUB t\n", b"MPUB t\n")))
    frames = FrameDecoder().feed(whole[1])
    assert frames[0] == (0, b"OK") and len(frames) - 1 == to_t  # SUB's OK, then every message to t
    # each command a read of its own: a PUB then takes feed's first branch
    bounds = [len(MAGIC_V2)]
    for c in commands:
        bounds.append(bounds[-1] + len(c))
    bounds = bounds[:-1] if not bad_end else bounds
    for fast_io in (True, False):
        assert _serve(stream, cuts, fast_io) == whole
        assert _serve(stream, bounds, fast_io) == whole
    assert _serve(stream, [], False) == whole



def test_twisteds_private_attributes_are_read_in_nsqtw_seam_only() -> None:
    """The transport's buffers and socket, the reactor's poller and twistd's exit signal are
    read in one guarded module; no other module imports a private Twisted module either."""
    import re
    from pathlib import Path

    root = Path(seam.__file__).resolve().parent
    private = re.compile(r"\._(tempData\w*|aborting|writeDisconnected|poller|selectables|doReadOrWrite"
                         r"|exitSignal|dataReceived)\b|\bdataBuffer\b|twisted\.\w+\._\w+|\.socket\.(send|recv)"
                         r"|\b_(path|respondToBadRequestAndDisconnect|makeContext|tlsConnection)\b")
    found = [f"{path.relative_to(root)}:{i}" for path in root.rglob("*.py") if path.name != "seam.py"
             for i, line in enumerate(path.read_text().splitlines(), 1) if private.search(line)]
    assert found == []


def test_every_private_attribute_the_seam_reads_is_in_this_twisted() -> None:
    """A Twisted that renamed one turns its use off quietly (slower or later, never broken):
    this is where it shows."""
    assert seam.missing() == []


def test_without_twisteds_bad_request_answer_the_seam_writes_the_same_400(monkeypatch: Any) -> None:
    from twisted.internet.testing import StringTransport
    from twisted.web.http import HTTPChannel

    def answered(channel_class: type) -> bytes:
        channel = channel_class()
        transport = StringTransport()
        channel.makeConnection(transport)
        seam.bad_request(channel)
        assert transport.disconnecting
        return transport.value()

    with_twisteds = answered(HTTPChannel)
    monkeypatch.delattr(HTTPChannel, "_respondToBadRequestAndDisconnect")
    assert seam.missing() == ["HTTPChannel._respondToBadRequestAndDisconnect"]
    assert answered(HTTPChannel) == with_twisteds == b"HTTP/1.1 400 Bad Request\r\n\r\n"


def test_without_the_channels_request_path_a_body_is_bounded_by_the_largest_limit(monkeypatch: Any) -> None:
    """``/pub``'s early 413 needs the path before the body; on a Twisted that keeps it elsewhere
    the body is still refused from its length, by the largest limit of any path."""
    from twisted.internet.testing import StringTransport
    from twisted.web.resource import Resource
    from twisted.web.server import Site
    from nsqtw.runtime.responses import GuardedHTTPChannel, LimitedRequest

    asked: list[bytes | None] = []

    def body_limit(path: bytes | None) -> tuple[int, str]:
        asked.append(path)
        return (10, "MSG_TOO_BIG") if path == b"/pub" else (100, "BODY_TOO_BIG")

    def post(length: int) -> bytes:
        channel = GuardedHTTPChannel()
        channel.requestFactory = LimitedRequest
        channel.site = site = Site(Resource())
        site.body_limit = body_limit  # type: ignore[attr-defined]  # nsqtw.runtime.responses.limited_site sets it so
        transport = StringTransport()
        channel.makeConnection(transport)
        channel.dataReceived(b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % length)
        return transport.value()

    assert b"413" in post(11) and b"MSG_TOO_BIG" in post(11)
    assert asked[-1] == b"/pub"
    monkeypatch.setattr(seam, "request_path", lambda channel: None)  # as on such a Twisted
    assert seam.missing() == ["HTTPChannel._path"]
    assert post(11) == b""  # not known to be /pub: not refused from its headers
    assert asked[-1] is None
    assert b"413" in post(101) and b"BODY_TOO_BIG" in post(101)


@pytest_twisted.ensureDeferred
async def test_writev_sends_the_parts_in_order_also_when_the_socket_takes_only_some() -> None:
    """The seam's gathered write (the replication link's batches): what one ``sendmsg`` does
    not take goes through ``writeSequence`` in order, and the peer reads the parts joined."""
    from twisted.internet.protocol import Factory, Protocol

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    parts = [b"head", b"a" * 300_000, b"", b"mid", b"b" * 100_001, b"tail"]
    expected = b"".join(parts) * 2

    class Sender(Protocol):
        pass

    endpoint = endpoints.TCP4ClientEndpoint(reactor, "127.0.0.1", listener.getsockname()[1])
    accept = threads.deferToThread(listener.accept)
    proto = await endpoint.connect(Factory.forProtocol(Sender))
    conn, _ = await accept
    try:
        proto.transport.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        attached = seam.attach_client(proto.transport, lambda data: None)
        assert attached is not None
        attached.writev(parts)  # the socket takes a part of it: the rest is buffered by Twisted
        assert proto.transport.dataBuffer or proto.transport._tempDataLen
        attached.writev(parts)  # behind the buffered rest, never ahead of it

        def read_all() -> bytes:
            conn.settimeout(30)
            got = bytearray()
            while len(got) < len(expected):
                chunk = conn.recv(1 << 20)
                if not chunk:
                    break
                got += chunk
            return bytes(got)

        assert await threads.deferToThread(read_all) == expected
    finally:
        proto.transport.loseConnection()
        conn.close()
        listener.close()
