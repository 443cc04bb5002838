"""
Shared tools of the hardening suite: a socket-free V2 connection that settles
only when told (so that reads can be cut anywhere and compared), checks that
bytes are well-formed frames, a watch on Twisted's log for unhandled errors,
an ``until`` that awaits a condition (polled on the reactor, bounded by a
timeout), and helpers to run ``nsqd`` as a subprocess and sample its memory
and CPU from ``/proc``.
"""

from __future__ import annotations

import gc
import os
import random
import re
import signal
import struct
import subprocess
import sys
import tempfile
import time
from typing import Any
from collections.abc import Callable

from twisted.internet import defer, task
from twisted.internet.protocol import Protocol
from twisted.logger import LogLevel, globalLogPublisher

from nsqtw.errors import BY_CODE
from nsqtw.nsqd.core.broker import Broker, memory_only_backends
from nsqtw.nsqd.core.v2 import KEEP, Features, V2Session
from nsqtw.options import NsqdOptions
from nsqtw.protocol.frames import FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE, FrameDecoder
from nsqtw.nsqd.stats.snapshot import broker_stats

Frame = tuple[int, bytes]

#: a fixed wall-clock start (seconds): message IDs and timestamps are deterministic from it
T0 = 1_795_302_682.0
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: the error codes nsqd may send (every E_* class nsqtw.errors knows)
KNOWN_CODES = frozenset(BY_CODE)
FATAL_CODES = frozenset(code for code, cls in BY_CODE.items() if cls.fatal)
RESPONSES = (b"OK", b"CLOSE_WAIT", b"_heartbeat_")


def cmd(*parts: Any) -> bytes:
    return b" ".join(p if isinstance(p, bytes) else str(p).encode() for p in parts) + b"\n"


def i32(n: int) -> bytes:
    return struct.pack(">i", n)


def body_cmd(*parts: Any, body: bytes) -> bytes:
    return cmd(*parts) + i32(len(body)) + body


# --- frames ---------------------------------------------------------------------------


def wellformed(data: bytes) -> list[Frame]:
    """Split ``data`` into frames and check each: a known type, a known error code or a
    known response, nothing left over.  Returns the frames."""
    dec = FrameDecoder()
    frames = dec.feed(bytes(data))
    assert dec.pending() == 0, f"{dec.pending()} bytes of a partial frame at the end of {bytes(data)[-40:]!r}"
    for ftype, payload in frames:
        assert ftype in (FRAME_RESPONSE, FRAME_ERROR, FRAME_MESSAGE), (ftype, payload[:60])
        if ftype == FRAME_ERROR:
            code = payload.split(b" ", 1)[0]
            assert code in KNOWN_CODES, payload[:120]
        elif ftype == FRAME_RESPONSE:
            assert payload in RESPONSES or payload.startswith(b"{"), payload[:120]
        else:
            assert len(payload) >= 26, payload
    return frames


def errors_of(frames: list[Frame]) -> list[bytes]:
    return [p for t, p in frames if t == FRAME_ERROR]


# --- a socket-free V2 connection ---------------------------------------------------------


def small_options(**kw: Any) -> NsqdOptions:
    """Limits small enough that random inputs reach them."""
    kw.setdefault("node_id", 7)
    kw.setdefault("max_msg_size", 64)
    kw.setdefault("max_body_size", 512)
    kw.setdefault("max_rdy_count", 50)
    kw.setdefault("max_req_timeout", 10.0)
    kw.setdefault("mem_queue_size", 1000)
    return NsqdOptions(**kw)


class SansIOConn:
    """A V2 connection on its own broker, fed by hand; the broker settles only on :meth:`settle`
    (the glue settles after each read; here the property is about the decoder, so it waits)."""

    def __init__(self, options: NsqdOptions, *, authorizer: Any = None, auth_result: Any = None,
                 features: Features = Features()) -> None:
        self.now = T0
        self.broker = Broker(options, self.now, backend_factory=memory_only_backends, rng=random.Random(1))
        self.client = self.broker.new_client("127.0.0.1:40001", self.now)
        self.out = bytearray()
        self.client.writer = self.out.extend
        self.session = V2Session(self.broker, self.client, features=features, authorizer=authorizer)
        self.auth_result = auth_result
        self.open = True
        self.results: list[Any] = []

    def feed(self, data: bytes) -> bool:
        """One read; what the glue does besides settling (answer a suspended AUTH at once)."""
        if not self.open:
            return False
        out = self.session.feed(data, self.now)
        keep = out.close == KEEP
        self.out.extend(out.answer)
        self.results.append(keep)
        while keep and out.auth is not None:
            self.session.resume(self.auth_result)
            out = self.session.feed(b"", self.now)
            keep = out.close == KEEP
            self.out.extend(out.answer)
            self.results.append(keep)
        if not keep:
            self.open = False
            self.broker.flush()
            self.broker.client_gone(self.client, self.now)
        return keep

    def settle(self) -> None:
        self.broker.settle(self.now)
        while self.broker.busy():
            self.broker.settle(self.now)

    def take(self) -> bytes:
        self.broker.flush()
        data = bytes(self.out)
        self.out.clear()
        return data

    def stats(self) -> dict[str, Any]:
        st = broker_stats(self.broker, self.now, include_clients=True, include_mem=False)
        st.pop("start_time", None)
        return st


# --- Twisted's log ------------------------------------------------------------------------


class LogWatch:
    """Collects every critical event and every logged failure (unhandled errors in
    protocols and Deferreds end up there)."""

    def __init__(self) -> None:
        self.bad: list[dict[str, Any]] = []
        self.count = 0

    def __call__(self, event: dict[str, Any]) -> None:
        self.count += 1
        if event.get("log_failure") is not None or event.get("log_level") == LogLevel.critical \
                or event.get("isError"):
            self.bad.append(event)

    def __enter__(self) -> LogWatch:
        globalLogPublisher.addObserver(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        gc.collect()  # unhandled errors in Deferreds are logged when collected
        globalLogPublisher.removeObserver(self)

    def describe(self) -> list[str]:
        from twisted.logger import formatEvent
        out = []
        for e in self.bad:
            f = e.get("log_failure") or e.get("failure")
            text = formatEvent(e)[:300]
            if f is not None:
                text += " | " + f.getTraceback()[-1500:]
            out.append(text)
        return out


# --- waiting for real events ----------------------------------------------------------------


async def until(predicate: Callable[[], bool], timeout: float = 10.0, step: float = 0.01,
                what: str = "condition") -> None:
    """Await ``predicate()`` becoming true, checked on the reactor every ``step`` s."""
    from twisted.internet import reactor
    deadline = reactor.seconds() + timeout
    while not predicate():
        if reactor.seconds() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await task.deferLater(reactor, step, lambda: None)


async def closed_within(client: Any, timeout: float) -> bool:
    """True if the RawV2Client's connection closes within ``timeout`` seconds."""
    from twisted.internet import reactor
    waiter: defer.Deferred = defer.Deferred()

    def fire(value: bool) -> None:
        if not waiter.called:
            waiter.callback(value)

    client.closed.addBoth(lambda r: (fire(True), r)[1])
    call = reactor.callLater(timeout, fire, False)
    result = await waiter
    if call.active():
        call.cancel()
    return result


class BytesClient(Protocol):
    """A raw TCP client that only records what it gets (no decoding: a fuzzed stream may turn
    compressed, and the checks decode afterwards)."""

    def __init__(self) -> None:
        self.received = b""
        self.closed: defer.Deferred = defer.Deferred()
        self.connected_ = False

    def connectionMade(self) -> None:
        self.connected_ = True

    def dataReceived(self, data: bytes) -> None:
        self.received += data

    def connectionLost(self, reason: Any = None) -> None:
        self.connected_ = False
        if not self.closed.called:
            self.closed.callback(None)

    def send(self, data: bytes) -> None:
        self.transport.write(data)

    def close(self) -> defer.Deferred:
        if self.connected_:
            self.transport.loseConnection()
        return self.closed


def connect_bytes(port: int, host: str = "127.0.0.1") -> defer.Deferred:
    from twisted.internet import reactor
    from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
    return connectProtocol(TCP4ClientEndpoint(reactor, host, port), BytesClient())


def transport_buffered(transport: Any) -> int:
    """Bytes a Twisted TCP transport holds that the peer has not taken yet."""
    data = getattr(transport, "dataBuffer", b"")
    offset = getattr(transport, "offset", 0)
    return len(data) - offset + getattr(transport, "_tempDataLen", 0)


# --- processes --------------------------------------------------------------------------------


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


_LISTEN = re.compile(r"(TCP|HTTP|HTTPS): listening on (\S+)")


class NsqdProcess:
    """``python -m nsqtw.cli`` (nsqd) on loopback ports chosen by the OS, stderr to a file."""

    def __init__(self, *flags: str, data_path: str | None = None) -> None:
        self.tmp = tempfile.mkdtemp(prefix="nsqtw-hardening-")
        self.data_path = data_path or self.tmp
        self.log_path = os.path.join(self.tmp, "nsqd.log")
        self.flags = list(flags)
        self.proc: subprocess.Popen | None = None
        self.addresses: dict[str, tuple[str, int]] = {}

    def start(self, timeout: float = 20.0) -> NsqdProcess:
        """Start and wait (blocking: call from a thread or a script) for the listening lines."""
        args = [sys.executable, "-m", "nsqtw.cli", "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                f"--data-path={self.data_path}"] + self.flags
        env = dict(os.environ)
        env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=self._log, cwd=self.tmp, env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(self.log_path, errors="replace") as f:
                text = f.read()
            for kind, addr in _LISTEN.findall(text):
                host, _, port = addr.rpartition(":")
                self.addresses[kind] = (host, int(port))
            if "TCP" in self.addresses and "HTTP" in self.addresses:
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"nsqd exited {self.proc.returncode}: {text[-2000:]}")
            time.sleep(0.05)
        raise RuntimeError("nsqd did not start in time: " + open(self.log_path, errors="replace").read()[-2000:])

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def tcp_port(self) -> int:
        return self.addresses["TCP"][1]

    @property
    def http_port(self) -> int:
        return self.addresses["HTTP"][1]

    def log_text(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self) -> int:
        import shutil
        rc = -1
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                rc = self.proc.wait(5)
        elif self.proc is not None:
            rc = self.proc.returncode
        try:
            self._log.close()
        except Exception:
            pass
        shutil.rmtree(self.tmp, ignore_errors=True)
        return rc
