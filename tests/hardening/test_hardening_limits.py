"""
Limits that must hold on a live broker, over real loopback sockets: what is
refused before it is buffered (a line over 16 KiB, a body announced over its
limit, an HTTP body over ``--max-msg-size``/``--max-body-size``), clients that
stop reading (a publisher whose answers pile up, a consumer whose messages
pile up), connections that never send the magic, and one client's ability to
stall every other (a deflate bomb, one huge MPUB, hostile JSON).

Memory is measured where it can be: the broker process's RSS (nsqd run as a
subprocess via ``python -m nsqtw.cli``) or, in process, the bytes a request
or a transport holds.
"""

from __future__ import annotations

import json
import select
import socket
import struct
import threading
import time
import zlib
from typing import Any

import pytest
import pytest_twisted
import treq
from twisted.internet import task, threads

from nsqtw.embed import start_nsqd
from nsqtw.nsqd import tcp as nsqd_tcp
from nsqtw.protocol.frames import FRAME_ERROR, MAGIC_V2
from nsqtw.testing import connect_raw

from hardening_support import (
    LogWatch, NsqdProcess, body_cmd, closed_within, cmd, connect_bytes, i32, rss_kib, transport_buffered, until,
    wellformed,
)

pytestmark = pytest.mark.e2e


def _server_protocol(nsqd: Any, before: set) -> Any:
    new = nsqd._service.tcp_factory.protocols - before
    return next(iter(new)) if new else None


async def _connect_observed(nsqd: Any) -> Any:
    """A BytesClient and the broker's protocol for it, whose reads are counted (``.bytes_read``)."""
    before = set(nsqd._service.tcp_factory.protocols)
    client = await connect_bytes(nsqd.tcp_port)
    await until(lambda: _server_protocol(nsqd, before) is not None, 5, what="the server side")
    proto = _server_protocol(nsqd, before)
    proto.bytes_read = 0
    original = proto.dataReceived

    def counting(data: bytes) -> None:
        proto.bytes_read += len(data)
        original(data)

    proto.dataReceived = counting
    return client, proto


async def _ok_round_trip(port: int, timeout: float = 5.0) -> float:
    """Seconds for a fresh connection to get OK for a PUB (the 'other client')."""
    from twisted.internet import reactor
    start = reactor.seconds()
    client = await connect_raw(port)
    try:
        client.send(body_cmd("PUB", "other", body=b"hello"))
        assert await client.response(timeout) == b"OK"
    finally:
        await client.close()
    return reactor.seconds() - start


# --- TCP: refused before buffered ----------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_line_over_16k_closes_without_reading_on():
    """1 MiB with no newline in one write: closed with no frame; the broker read at most one read
    (nsqtw.nsqd.tcp.READ_SIZE) past the 16 KiB line limit and holds nothing of it."""
    nsqd = await start_nsqd()
    try:
        client, proto = await _connect_observed(nsqd)
        client.send(MAGIC_V2 + b"L" * (1 << 20))
        assert await closed_within(client, 5.0)
        assert client.received == b""
        read_size = getattr(nsqd_tcp, "READ_SIZE", 65536)
        assert proto.bytes_read <= 16 * 1024 + read_size + 4, proto.bytes_read
        assert len(proto.session._buf) <= 16 * 1024
    finally:
        await nsqd.stop()


@pytest.mark.parametrize("header,code", [
    (b"PUB t\n" + i32(1024 * 1024 + 1), b"E_BAD_MESSAGE"),
    (b"DPUB t 1\n" + i32(1024 * 1024 + 1), b"E_BAD_MESSAGE"),
    (b"MPUB t\n" + i32(5 * 1024 * 1024 + 1), b"E_BAD_BODY"),
    (b"MPUB t\n" + i32(1000) + i32(2) + i32(1024 * 1024 + 1), b"E_BAD_MESSAGE"),
    (b"IDENTIFY\n" + i32(5 * 1024 * 1024 + 1), b"E_BAD_BODY"),
    (b"AUTH\n" + i32(5 * 1024 * 1024 + 1), b"E_BAD_BODY"),
])
@pytest_twisted.ensureDeferred
async def test_oversized_body_answered_at_once_with_default_limits(header, code):
    """With nsqd's default limits, a body announced over its limit gets its error with no body byte sent."""
    nsqd = await start_nsqd()
    try:
        client = await connect_raw(nsqd.tcp_port)
        client.send(header)
        err = await client.error(timeout=3.0)
        assert err.startswith(code)
        await client.closed
    finally:
        await nsqd.stop()


@pytest_twisted.ensureDeferred
async def test_magic_timeout_end_to_end():
    """magic_timeout=0.3 s: a silent connection and one that sent half the magic are both dropped."""
    nsqd = await start_nsqd(magic_timeout=0.3)
    try:
        silent = await connect_bytes(nsqd.tcp_port)
        partial = await connect_bytes(nsqd.tcp_port)
        partial.send(b"  ")
        good = await connect_raw(nsqd.tcp_port)
        assert await closed_within(silent, 5.0) and await closed_within(partial, 5.0)
        assert silent.received == partial.received == b""
        good.send(body_cmd("PUB", "t", body=b"x"))
        assert await good.response() == b"OK"  # a client that sent the magic stays
        await good.close()
        assert not nsqd._service.tcp_factory.protocols or all(p.session._magic for p in nsqd._service.tcp_factory.protocols)
    finally:
        await nsqd.stop()


# --- HTTP bodies -----------------------------------------------------------------------------------


def _record_requests(nsqd: Any) -> list[Any]:
    """Wrap the HTTP site's request factory to keep every request (to look at what it buffered)."""
    site = nsqd._service.http_listener.factory.build()  # the HTTP site is built lazily (LazyFactory)
    seen: list[Any] = []
    base = site.requestFactory

    def factory(*a: Any, **kw: Any) -> Any:
        req = base(*a, **kw)
        seen.append(req)
        return req

    site.requestFactory = factory
    return seen


def _buffered(req: Any) -> int:
    content = getattr(req, "content", None)
    if content is None or getattr(content, "closed", False):
        return 0
    pos = content.tell()
    content.seek(0, 2)
    size = content.tell()
    content.seek(pos)
    return size


async def _http_exchange(port: int, head: bytes, chunks: list[bytes], seen: list[Any], watch: list[int]) -> bytes:
    client = await connect_bytes(port)
    from twisted.internet import reactor
    client.send(head)
    watch.append(0)
    for chunk in chunks:
        if not client.connected_ or client.received:
            break  # answered (or closed) before the whole body was sent
        client.send(chunk)
        await task.deferLater(reactor, 0, lambda: None)
        watch.append(max((_buffered(r) for r in seen), default=0))
    await until(lambda: b"\r\n\r\n" in client.received and client.received.split(b"\r\n\r\n", 1)[1].endswith(b"}"),
                10, what="the HTTP answer")
    await client.close()
    return client.received


@pytest.mark.parametrize("path,limit,text", [("/pub?topic=t", 1024 * 1024, b"MSG_TOO_BIG"),
                                            ("/mpub?topic=t", 5 * 1024 * 1024, b"BODY_TOO_BIG")])
@pytest.mark.parametrize("chunked", [False, True])
@pytest_twisted.ensureDeferred
async def test_http_oversized_body_is_discarded_as_it_arrives(path, limit, text, chunked):
    """A body over the limit (Content-Length or chunked) is never held: the request buffers nothing past
    the limit while 3x the limit streams in, and the answer is 413 with nsqd's text."""
    nsqd = await start_nsqd()
    try:
        seen = _record_requests(nsqd)
        total = 3 * limit
        piece = b"x" * 65536
        n = total // len(piece)
        if chunked:
            head = b"POST %s HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" % path.encode()
            chunks = [b"%x\r\n" % len(piece) + piece + b"\r\n" for _ in range(n)] + [b"0\r\n\r\n"]
        else:
            head = b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (path.encode(), n * len(piece))
            chunks = [piece] * n
        watch: list[int] = []
        answer = await _http_exchange(nsqd.http_port, head, chunks, seen, watch)
        assert answer.startswith(b"HTTP/1.1 413 ")
        assert answer.endswith(b'{"message":"%s"}' % text)
        assert max(watch) <= limit, max(watch)
        assert "t" not in nsqd._broker.topics
    finally:
        await nsqd.stop()


@pytest_twisted.ensureDeferred
async def test_http_content_length_over_limit_answered_before_the_body():
    """Content-Length: 100 MB on /pub gets 413 MSG_TOO_BIG without sending any of the body."""
    nsqd = await start_nsqd()
    try:
        client = await connect_bytes(nsqd.http_port)
        client.send(b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 104857600\r\n\r\n")
        await until(lambda: b"413" in client.received, 2, what="a 413")
        await client.close()
    finally:
        await nsqd.stop()


def _send_body(s: socket.socket, head: bytes, pieces: Any) -> tuple[bytes, int]:
    """Send ``head`` then the body pieces until the server answers or closes; (answer, body bytes sent)."""
    s.sendall(head)
    sent = 0
    for piece in pieces:
        readable, _, _ = select.select([s], [], [], 0)
        if readable:
            break  # an answer (or a close) already: stop sending
        try:
            s.sendall(piece)
        except (BrokenPipeError, ConnectionResetError):
            break
        sent += len(piece)
    answer = b""
    s.settimeout(30)
    try:
        while b"}" not in answer:
            data = s.recv(4096)
            if not data:
                break
            answer += data
    except ConnectionResetError:
        pass
    return answer, sent


def _http_flood_rss(proc: NsqdProcess, megabytes: int) -> dict[str, Any]:
    """Offer ``megabytes`` over the limit, Content-Length and chunked; RSS before and after (blocking)."""
    out: dict[str, Any] = {"rss_before_kib": rss_kib(proc.pid)}
    piece = b"x" * (1 << 20)
    for mode in ("length", "chunked"):
        s = socket.create_connection(("127.0.0.1", proc.http_port))
        if mode == "length":
            head = b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (megabytes << 20)
            pieces: Any = (piece for _ in range(megabytes))
        else:
            head = b"POST /mpub?topic=t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            pieces = [b"%x\r\n" % len(piece) + piece + b"\r\n" for _ in range(megabytes)] + [b"0\r\n\r\n"]
        answer, sent = _send_body(s, head, pieces)
        out[f"answer_{mode}"] = answer.split(b"\r\n", 1)[0].decode()
        out[f"body_mib_sent_{mode}"] = round(sent / (1 << 20), 1)
        out[f"rss_after_{mode}_kib"] = rss_kib(proc.pid)
        s.close()
    return out


@pytest_twisted.ensureDeferred
async def test_http_oversized_bodies_do_not_grow_broker_rss():
    """nsqd as a process: 200 MB offered over the limit (Content-Length: refused from the header; chunked:
    discarded as it arrives) leave its RSS where it was."""
    proc = await threads.deferToThread(NsqdProcess().start)
    try:
        fig = await threads.deferToThread(_http_flood_rss, proc, 200)
        print("HTTP_FLOOD", json.dumps(fig))
        assert fig["answer_length"].startswith("HTTP/1.1 413") and fig["answer_chunked"].startswith("HTTP/1.1 413")
        assert fig["rss_after_length_kib"] - fig["rss_before_kib"] < 20 * 1024
        assert fig["rss_after_chunked_kib"] - fig["rss_before_kib"] < 20 * 1024
    finally:
        await threads.deferToThread(proc.stop)


@pytest_twisted.ensureDeferred
async def test_http_defer_with_5000_digits_is_invalid_defer():
    """POST /pub?defer=999...9 (5000 digits) answers 400 INVALID_DEFER and logs no failure."""
    with LogWatch() as watch:
        nsqd = await start_nsqd()
        try:
            r = await treq.post(f"http://{nsqd.http_address}/pub?topic=t&defer=" + "9" * 5000, data=b"x",
                                persistent=False)
            body = await r.content()
        finally:
            await nsqd.stop()
    assert (r.code, body) == (400, b'{"message":"INVALID_DEFER"}')
    assert not watch.bad, watch.describe()


@pytest_twisted.ensureDeferred
async def test_http_content_length_with_5000_digits_is_a_clean_400():
    """Content-Length: 999...9 (5000 digits) gets a 400 (or a close) with nothing logged as unhandled."""
    with LogWatch() as watch:
        nsqd = await start_nsqd()
        try:
            client = await connect_bytes(nsqd.http_port)
            client.send(b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\nx")
            assert await closed_within(client, 5.0)
        finally:
            await nsqd.stop()
    assert not watch.bad, watch.describe()[:1]


# --- clients that stop reading -----------------------------------------------------------------------


def _flood_without_reading(proc: NsqdProcess, seconds: float, flood: bool = True) -> dict[str, Any]:
    """A publisher that never reads its OKs, and another client timing PUB round trips (blocking);
    with ``flood=False`` the publisher sends nothing (the round trips of an idle nsqd)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", proc.tcp_port))
    s.setblocking(False)
    s.send(MAGIC_V2)
    batch = body_cmd("PUB", "flood", body=b"x" * 100) * 200
    other = socket.create_connection(("127.0.0.1", proc.tcp_port))
    other.settimeout(5)
    other.sendall(MAGIC_V2)
    t0 = time.monotonic()
    sent = 0
    samples: list[list[float]] = []
    round_trips: list[float] = []
    next_sample = t0
    next_probe = t0 + 0.1
    pending = b""
    while time.monotonic() - t0 < seconds:
        _, writable, _ = select.select([], [s], [], 0.02)
        if writable and flood:
            pending = pending or batch
            try:
                n = s.send(pending)
                sent += n
                pending = pending[n:]
            except BlockingIOError:
                pass
        now = time.monotonic()
        if now >= next_sample:
            samples.append([round(now - t0, 2), sent, rss_kib(proc.pid)])
            next_sample = now + 0.25
        if now >= next_probe:
            start = time.monotonic()
            other.sendall(body_cmd("PUB", "other", body=b"ping"))
            got = b""
            while len(got) < 10:
                got += other.recv(10 - len(got))
            assert got == struct.pack(">ii", 6, 0) + b"OK", got
            round_trips.append(time.monotonic() - start)
            next_probe = time.monotonic() + 0.1
    s.close()
    other.close()
    round_trips.sort()
    return {"samples": samples, "sent_bytes": sent, "probes": len(round_trips),
            "probe_p99_ms": round(round_trips[int(len(round_trips) * 0.99)] * 1000, 2),
            "probe_max_ms": round(round_trips[-1] * 1000, 2)}


@pytest_twisted.ensureDeferred
async def test_publisher_that_never_reads_cannot_grow_memory():
    """nsqd as a process: a client PUBs for 4 s without reading a single OK; the broker stops reading it
    (backpressure), its RSS plateaus, what the client could push is bounded, and another client's PUBs
    are answered quickly all along."""
    proc = await threads.deferToThread(NsqdProcess("--mem-queue-size=100").start)
    try:
        fig = await threads.deferToThread(_flood_without_reading, proc, 4.0)
        samples = fig.pop("samples")
        fig["rss_kib_at_1s"] = next(r for t, s, r in samples if t >= 1.0)
        fig["rss_kib_max_after_1s"] = max(r for t, s, r in samples if t >= 1.0)
        fig["sent_at_2s"] = next(s for t, s, r in samples if t >= 2.0)
        print("NONREADING_PUBLISHER", json.dumps(fig))
        assert fig["sent_bytes"] == fig["sent_at_2s"] or fig["sent_bytes"] < 64 << 20  # it stalled
        assert fig["sent_bytes"] < 256 << 20
        assert fig["rss_kib_max_after_1s"] - fig["rss_kib_at_1s"] < 16 * 1024
        assert fig["probes"] > 0  # the other client was answered (how fast: the slow test below)
    finally:
        await threads.deferToThread(proc.stop)


@pytest.mark.slow
@pytest_twisted.ensureDeferred
async def test_publisher_that_never_reads_does_not_slow_other_clients():
    """While a client PUBs without reading, another client's PUB round trips go on (their
    latency, idle and flooded, is printed: a time bar would fail on a loaded machine)."""
    proc = await threads.deferToThread(NsqdProcess("--mem-queue-size=100").start)
    try:
        idle = await threads.deferToThread(_flood_without_reading, proc, 2.0, False)
        flooded = await threads.deferToThread(_flood_without_reading, proc, 4.0)
        idle.pop("samples"), flooded.pop("samples")
        print("NONREADING_PUBLISHER_PROBES", json.dumps({"idle": idle, "flooded": flooded}))
        assert idle["probes"] >= 5 and flooded["probes"] >= 10
    finally:
        await threads.deferToThread(proc.stop)


@pytest_twisted.ensureDeferred
async def test_consumer_that_never_reads_is_bounded():
    """RDY 50 of 32 KiB messages, msg_timeout 0.3 s, heartbeat 1 s; the consumer stops reading (and
    tries to send NOPs): until the read deadline closes it, the broker never holds more than one RDY
    window for it."""
    nsqd = await start_nsqd(msg_timeout=0.3, mem_queue_size=1000)
    nop = None
    try:
        size = 32 * 1024
        window = 50 * (size + 34)
        nsqd._broker.publish("slow", [b"m" * size] * 200, nsqd._service.now())
        client, proto = await _connect_observed(nsqd)
        client.transport.getHandle().setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.send(MAGIC_V2 + body_cmd("IDENTIFY", body=b'{"heartbeat_interval":1000}')
                    + cmd("SUB", "slow", "c") + cmd("RDY", 50))
        await until(lambda: len(client.received) >= 20, 5, what="the SUB answer")
        client.transport.pauseProducing()  # stop reading, keep writing
        nop = task.LoopingCall(lambda: client.send(cmd("NOP")) if client.connected_ else None)
        nop.start(0.2)
        from nsqtw.nsqd.stats.snapshot import broker_stats

        def timeouts() -> int:
            st = broker_stats(nsqd._broker, nsqd._service.now(), topic="slow", channel="c")
            return st["topics"][0]["channels"][0]["timeout_count"]

        peak = {"held": 0}

        def watch() -> bool:
            if proto.transport.connected:
                peak["held"] = max(peak["held"], transport_buffered(proto.transport))
            return timeouts() >= 400 or not proto.transport.connected

        await until(watch, 30, what="400 timeouts")
        print("NONREADING_CONSUMER", json.dumps({"peak_held_bytes": peak["held"], "timeouts": timeouts(),
                                                 "window_bytes": window,
                                                 "closed": not proto.transport.connected}))
        assert peak["held"] <= window + (1 << 20)
    finally:
        if nop is not None and nop.running:
            nop.stop()
        await nsqd.stop()


@pytest_twisted.ensureDeferred
async def test_consumer_first_window_is_bounded_by_its_buffer_not_rdy():
    """RDY 500 of 64 KiB messages (a 32 MiB window) to a consumer that never reads: what the broker holds
    for it stays within a few MiB (Go: its pump blocks on the socket), not the whole RDY window."""
    from twisted.internet import reactor
    nsqd = await start_nsqd(mem_queue_size=1000)
    try:
        size = 64 * 1024
        nsqd._broker.publish("wide", [b"w" * size] * 500, nsqd._service.now())
        client, proto = await _connect_observed(nsqd)
        client.transport.getHandle().setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.transport.pauseProducing()  # never reads anything
        client.send(MAGIC_V2 + cmd("SUB", "wide", "c") + cmd("RDY", 500))
        peak = {"held": 0}

        def watch() -> bool:
            if proto.transport.connected:
                peak["held"] = max(peak["held"], transport_buffered(proto.transport))
            return proto.client is not None and proto.client.rdy == 500

        await until(watch, 5, what="RDY 500")
        for _ in range(20):  # a few reactor turns of deliveries
            await task.deferLater(reactor, 0.01, lambda: None)
            watch()
        print("FIRST_WINDOW", json.dumps({"peak_held_bytes": peak["held"], "window_bytes": 500 * (size + 34)}))
        assert peak["held"] <= 4 << 20
    finally:
        await nsqd.stop()


# --- one client stalling every other -----------------------------------------------------------------


class ThreadProbe:
    """Another client, in its own thread on a blocking socket (so that its timing is the broker's, not
    this reactor's): a PUB every 20 ms, each round trip recorded, until stopped."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.rtts: list[float] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=60)
            s.sendall(MAGIC_V2)
            pub = body_cmd("PUB", "other", body=b"ping")
            while not self.stop.is_set():
                start = time.monotonic()
                s.sendall(pub)
                got = b""
                while len(got) < 10:
                    chunk = s.recv(10 - len(got))
                    if not chunk:
                        raise ConnectionError("closed")
                    got += chunk
                self.rtts.append(time.monotonic() - start)
                self.stop.wait(0.02)
            s.close()
        except BaseException as e:  # reported by finish()
            self.error = e

    def finish(self) -> list[float]:
        self.stop.set()
        self.thread.join(60)
        if self.error is not None:
            raise self.error
        return self.rtts


@pytest_twisted.ensureDeferred
async def test_deflate_bomb_does_not_stall_other_clients():
    """A deflate client sends 32 MiB of NOPs compressed to ~33 KiB (then a PUB); another client's PUB
    round trips stay under 1 s all along (F4: 4.6 s before the decoder was bounded per turn), or
    under a third of the bomb's parse when a loaded machine makes that longer than 3 s."""
    from twisted.internet import reactor
    nsqd = await start_nsqd()
    try:
        bomber = await connect_bytes(nsqd.tcp_port)
        bomber.send(MAGIC_V2 + body_cmd("IDENTIFY", body=b'{"feature_negotiation":true,"deflate":true}'))
        await until(lambda: len(bomber.received) > 30, 5, what="the IDENTIFY answer")
        c = zlib.compressobj(9, zlib.DEFLATED, -15)
        bomb = c.compress(b"NOP\n" * (8 << 20) + body_cmd("PUB", "bomb-done", body=b"x")) + c.flush(zlib.Z_SYNC_FLUSH)
        probe = ThreadProbe(nsqd.tcp_port)
        await until(lambda: len(probe.rtts) >= 3, 5, what="the probe's first answers")
        start = reactor.seconds()
        bomber.send(bomb)
        await until(lambda: "bomb-done" in nsqd._broker.topics, 120, what="the bomb to be parsed")
        took = reactor.seconds() - start
        rtts = await threads.deferToThread(probe.finish)
        print("DEFLATE_BOMB", json.dumps({"compressed_bytes": len(bomb), "probe_max_s": round(max(rtts), 3),
                                          "bomb_s": round(took, 3), "probes": len(rtts)}))
        assert max(rtts) < _stall_bound(took)
        await bomber.close()
    finally:
        await nsqd.stop()


@pytest_twisted.ensureDeferred
async def test_huge_mpub_does_not_stall_other_clients():
    """While one client MPUBs 1,048,575 one-byte messages, another client's PUB round trips stay under 1 s
    (or a third of the MPUB on a loaded machine, see _stall_bound)."""
    from twisted.internet import reactor
    nsqd = await start_nsqd()
    try:
        n = (5 * 1024 * 1024 - 4) // 5
        payload = i32(n) + (i32(1) + b"x") * n
        big = await connect_raw(nsqd.tcp_port)
        probe = ThreadProbe(nsqd.tcp_port)
        await until(lambda: len(probe.rtts) >= 3, 5, what="the probe's first answers")
        start = reactor.seconds()
        big.send(body_cmd("MPUB", "many", body=payload))
        assert await big.response(timeout=120) == b"OK"
        took = reactor.seconds() - start
        rtts = await threads.deferToThread(probe.finish)
        print("HUGE_MPUB", json.dumps({"messages": n, "mpub_s": round(took, 3), "probe_max_s": round(max(rtts), 3),
                                       "probes": len(rtts)}))
        assert max(rtts) < _stall_bound(took)
        await big.close()
    finally:
        await nsqd.stop()


def _stall_bound(attack_s: float) -> float:
    """How long another client may wait for one answer while an attack is processed: 1 s, or a
    third of the attack when a loaded machine makes it last longer than 3 s. A broker stalled
    for the whole attack fails either way; a busy machine's slowness alone does not."""
    return max(1.0, attack_s / 3)


# --- hostile JSON over the wire ------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_deeply_nested_identify_is_answered_not_crashed():
    """IDENTIFY with [[[[... 100k deep: E_BAD_BODY, and nothing logged as an unhandled error."""
    with LogWatch() as watch:
        nsqd = await start_nsqd()
        try:
            client = await connect_raw(nsqd.tcp_port)
            client.send(body_cmd("IDENTIFY", body=b"[" * 100_000))
            await client.closed
            frames = wellformed(client.received)
        finally:
            await nsqd.stop()
    assert not watch.bad, watch.describe()[:1]
    assert frames == [(FRAME_ERROR, b"E_BAD_BODY IDENTIFY failed to decode JSON body")]


@pytest_twisted.ensureDeferred
async def test_config_put_deeply_nested_json_is_invalid_value():
    """PUT /config/nsqlookupd_tcp_addresses with [[[[... 100k deep: 400 INVALID_VALUE, nothing logged."""
    with LogWatch() as watch:
        nsqd = await start_nsqd()
        try:
            r = await treq.put(f"http://{nsqd.http_address}/config/nsqlookupd_tcp_addresses", data=b"[" * 100_000,
                               persistent=False)
            body = await r.content()
        finally:
            await nsqd.stop()
    assert (r.code, body) == (400, b'{"message":"INVALID_VALUE"}')
    assert not watch.bad, watch.describe()[:1]


@pytest_twisted.ensureDeferred
async def test_identify_lone_surrogate_does_not_break_http_stats():
    """A client with client_id "\\ud800" connected: GET /stats?format=json still answers 200 valid JSON."""
    nsqd = await start_nsqd()
    try:
        client = await connect_raw(nsqd.tcp_port)
        client.send(body_cmd("IDENTIFY", body=b'{"client_id":"\\ud800"}') + cmd("SUB", "t", "c"))
        assert await client.response() == b"OK" and await client.response() == b"OK"
        r = await treq.get(f"http://{nsqd.http_address}/stats?format=json", persistent=False)
        body = await r.content()
        await client.close()
        assert r.code == 200, (r.code, body[:200])
        json.loads(body)
    finally:
        await nsqd.stop()


@pytest_twisted.ensureDeferred
async def test_lookupd_lone_surrogate_does_not_break_lookup():
    """A peer registering with hostname "\\ud800": GET /lookup?topic=t still answers 200 valid JSON."""
    from nsqtw.embed import start_nsqlookupd
    from nsqtw.lookupd.core.v1 import register_command
    from nsqtw.protocol.frames import MAGIC_V1
    lookupd = await start_nsqlookupd()
    try:
        client = await connect_bytes(lookupd.tcp_port)
        body = (b'{"broadcast_address":"n1","hostname":"\\ud800","tcp_port":4150,"http_port":4151,'
                b'"version":"1.3.0"}')
        client.send(MAGIC_V1 + b"IDENTIFY\n" + i32(len(body)) + body + register_command("t"))
        await until(lambda: client.received.endswith(b"OK") and client.received.count(b"OK") >= 1, 5,
                    what="REGISTER's OK")
        r = await treq.get(f"http://127.0.0.1:{lookupd.http_port}/lookup?topic=t", persistent=False)
        data = await r.content()
        await client.close()
        assert r.code == 200, (r.code, data[:200])
        json.loads(data)
    finally:
        await lookupd.stop()


@pytest.mark.parametrize("path,text", [("/pub?topic=t", b"MSG_TOO_BIG"), ("/stats", b"BODY_TOO_BIG")])
@pytest_twisted.ensureDeferred
async def test_http_chunked_body_over_the_limit_is_answered_and_closed_at_once(path, text):
    """A chunked body that passes the limit gets its 413 as soon as it does, and the connection
    closes: the rest of the body (here it would never end) is not waited for (issue 24)."""
    nsqd = await start_nsqd(max_msg_size=1024, max_body_size=4096)
    try:
        client = await connect_bytes(nsqd.http_port)
        client.send(b"POST %s HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" % path.encode())
        piece = b"x" * 1000
        for _ in range(6):  # 6,000 bytes, past both limits; no final chunk is ever sent
            client.send(b"%x\r\n" % len(piece) + piece + b"\r\n")
        await until(lambda: b"}" in client.received, 5, what="a 413")
        assert client.received.startswith(b"HTTP/1.1 413 ")
        assert client.received.endswith(b'{"message":"%s"}' % text)
        assert await closed_within(client, 5.0)
    finally:
        await nsqd.stop()


@pytest.mark.parametrize("head", [
    b"GET /ping?" + b"a" * 1024 * 1024 + b" HTTP/1.1\r\n\r\n",
    b"GET /ping HTTP/1.1\r\nX-Big: " + b"a" * 1024 * 1024 + b"\r\n\r\n",
])
@pytest_twisted.ensureDeferred
async def test_http_one_megabyte_request_line_or_header_gets_a_400(head):
    nsqd = await start_nsqd()
    try:
        client = await connect_bytes(nsqd.http_port)
        client.send(head)
        assert await closed_within(client, 5.0)
        assert client.received.startswith(b"HTTP/1.1 400 "), client.received[:80]
    finally:
        await nsqd.stop()
