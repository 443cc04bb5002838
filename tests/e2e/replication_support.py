"""What the replication end-to-end tests share: waiting on the real reactor for a condition,
a free loopback port (for a node that must be named before it listens), message ids as FIN
takes them, a secret file, and the faults: a node in a child process (to freeze or kill) and a
proxy that turns into a silent partition."""

from __future__ import annotations

import os
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from collections import Counter

from twisted.internet import defer, reactor
from twisted.internet.protocol import ClientFactory, Factory, ProcessProtocol, Protocol

from nsqtw.testing import body_command, command, connect_raw, mpub_command


async def sleep(seconds: float) -> None:
    d: defer.Deferred[None] = defer.Deferred()
    reactor.callLater(seconds, d.callback, None)  # type: ignore[attr-defined]  # the global reactor provides IReactorTime
    await d


async def until(predicate: Callable[[], object], seconds: float = 8.0) -> None:
    """Poll ``predicate`` every 20 ms until it is true; fail after ``seconds``."""
    for _ in range(int(seconds / 0.02)):
        if predicate():
            return
        await sleep(0.02)
    raise AssertionError("condition not reached")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def text_id(mid: bytes | str) -> str:
    return mid.decode() if isinstance(mid, bytes) else mid


# --- faults: a node in a child process (SIGSTOP, SIGKILL), a link through a blackhole ---------

ROOT = Path(__file__).resolve().parent.parent.parent


def secret_file(directory: Path, secret: bytes = b"a secret shared by the test's nodes") -> str:
    path = directory / "replication.secret"
    path.write_bytes(secret)
    path.chmod(0o600)
    return str(path)


class ChildNsqd(ProcessProtocol):
    """nsqtw's drop-in ``nsqd`` in a child process, started on the test's reactor (which keeps
    running the in-process nodes meanwhile): its ports read from its start lines."""

    def __init__(self) -> None:
        self.tcp_port = self.http_port = 0
        self.lines: list[str] = []
        self._buf = b""
        self.started: defer.Deferred[ChildNsqd] = defer.Deferred()
        self.ended: defer.Deferred[None] = defer.Deferred()

    @classmethod
    async def start(cls, data_path: str, *flags: str) -> ChildNsqd:
        child = cls()
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        argv = [sys.executable, "-m", "nsqtw.cli", "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                "--https-address=", f"--data-path={data_path}", *flags]
        reactor.spawnProcess(child, sys.executable, argv, env=env)  # type: ignore[attr-defined]  # the global reactor provides IReactorProcess
        return await child.started

    def errReceived(self, data: bytes) -> None:
        self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        for raw in lines:
            line = raw.decode(errors="replace")
            self.lines.append(line)
            if "TCP: listening on" in line:
                self.tcp_port = int(line.rsplit(":", 1)[1])
            elif "HTTP: listening on" in line:
                self.http_port = int(line.rsplit(":", 1)[1])
            if self.tcp_port and self.http_port and not self.started.called:
                self.started.callback(self)

    def processEnded(self, reason: object) -> None:
        if not self.started.called:
            self.started.errback(RuntimeError("nsqd did not start:\n" + "\n".join(self.lines[-20:])))
        self.ended.callback(None)

    def signal(self, sig: int) -> None:
        if self.transport is not None and self.transport.pid is not None:
            os.kill(self.transport.pid, sig)

    async def kill(self) -> None:
        if not self.ended.called:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGKILL)
            await self.ended


class _Pipe(Protocol):
    def __init__(self, proxy: BlackholeProxy) -> None:
        self.proxy = proxy
        self.other: _Pipe | None = None
        self.pending: list[bytes] = []

    def connectionMade(self) -> None:
        self.proxy.pipes.add(self)

    def dataReceived(self, data: bytes) -> None:
        if self.proxy.blackhole:
            return  # silently dropped: nothing arrives, nothing is closed
        if self.other is None or self.other.transport is None:
            self.pending.append(data)
        else:
            self.other.transport.write(data)

    def connectionLost(self, reason: object = None) -> None:
        self.proxy.pipes.discard(self)
        if self.other is not None and self.other.transport is not None and not self.proxy.blackhole:
            self.other.transport.loseConnection()


class BlackholeProxy(Factory):
    """A TCP proxy on a loopback port to ``target``; :attr:`blackhole` set, it forwards nothing
    either way and closes nothing (a silent partition: no FIN, no RST), until cleared."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.blackhole = False
        self.pipes: set[_Pipe] = set()
        self.port: Any = None

    async def listen(self) -> int:
        from twisted.internet.endpoints import TCP4ServerEndpoint
        self.port = await TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(self)
        return int(self.port.getHost().port)

    def buildProtocol(self, addr: object) -> Protocol:
        inbound = _Pipe(self)
        outbound = _Pipe(self)
        inbound.other, outbound.other = outbound, inbound

        class Connect(ClientFactory):
            def buildProtocol(self, addr: object) -> Protocol:
                return outbound

            def clientConnectionFailed(self, connector: object, reason: object) -> None:
                if inbound.transport is not None:
                    inbound.transport.loseConnection()

        def connected() -> None:
            for data in inbound.pending:
                outbound.transport.write(data)
            inbound.pending.clear()

        real = outbound.connectionMade

        def made() -> None:
            real()
            connected()

        outbound.connectionMade = made  # type: ignore[method-assign]  # flush what came before the connect
        reactor.connectTCP("127.0.0.1", self.target_port, Connect())  # type: ignore[attr-defined]  # IReactorTCP
        return inbound

    async def close(self) -> None:
        for p in list(self.pipes):
            if p.transport is not None:
                p.transport.abortConnection()
        if self.port is not None:
            await self.port.stopListening()


# --- counting as Jepsen does: what was acknowledged, what was delivered -----------------


async def publish(port: int, topic: str, prefix: bytes, n: int) -> list[bytes]:
    """``n`` bodies as PUBs and MPUBs of 5; the bodies whose OK came back (a refused publish,
    E_PUB_FAILED or E_MPUB_FAILED, closes the connection as in NSQ: the next goes on a new one)."""
    conn = [await connect_raw(port)]
    acknowledged: list[bytes] = []

    async def sent(data: bytes) -> bool:
        conn[0].send(data)
        try:
            return await conn[0].response() == b"OK"
        except AssertionError as e:  # an error frame
            assert "PUB_FAILED" in str(e), e
            await conn[0].close()
            conn[0] = await connect_raw(port)
            return False

    try:
        i = 0
        while i < n:
            if i % 10 < 5:
                body = prefix + b"%d" % i
                if await sent(body_command("PUB", topic, body=body)):
                    acknowledged.append(body)
                i += 1
            else:
                bodies = [prefix + b"%d" % j for j in range(i, min(i + 5, n))]
                if await sent(mpub_command(topic, bodies)):
                    acknowledged.extend(bodies)
                i += len(bodies)
    finally:
        await conn[0].close()
    return acknowledged


async def drain(port: int, topic: str, channel: str, want: set[bytes], seconds: float = 10.0) -> list[bytes]:
    """Every body a stock consumer of ``topic``/``channel`` gets (FIN each) until ``want`` is
    all in, or nothing more comes."""
    c = await connect_raw(port)
    got: list[bytes] = []
    try:
        c.send(command("SUB", topic, channel))
        assert await c.response() == b"OK"
        c.send(command("RDY", 100))
        waited = 0.0
        while not want <= set(got) and waited < seconds:
            try:
                m = await c.message(timeout=0.5)
            except Exception:
                waited += 0.5
                continue
            got.append(m.body)
            c.send(command("FIN", text_id(m.id)))
    finally:
        await c.close()
    return got


def count(acknowledged: list[bytes], delivered: list[bytes]) -> tuple[int, int]:
    """(lost, duplicated) of the acknowledged bodies among those delivered."""
    seen = Counter(delivered)
    lost = sum(1 for b in acknowledged if not seen[b])
    return lost, sum(n - 1 for n in seen.values() if n > 1)


def data_dir(tmp_path: Path, name: str) -> str:
    path = tmp_path / name
    path.mkdir(exist_ok=True)
    return str(path)
