#!/usr/bin/env python
"""
A replicated PUB's round trip in one process: what Python and the system calls cost, without
the wake-ups between processes.

An origin and its peer (``start_nsqd``, node ids 1 and 2, a link authenticated with a secret
file) and a raw client sending one PUB per round trip (200-byte
bodies, the next PUB when the ``OK`` is in), all on one reactor (nsqtw's, not spinning: in one
process every event is ready when polled).  Prints the time per round trip and the thread's CPU
time per round trip; ``solo`` runs the same client against one unreplicated nsqd.  The daemons'
collector policy is applied after the start (as ``nsqd`` does), so the figure is the daemon's.

    python bench/bench_replication_inprocess.py             # replicated, 30,000 round trips
    python bench/bench_replication_inprocess.py solo        # one unreplicated nsqd
    N=100000 python bench/bench_replication_inprocess.py

Stop 39 used it to compare trees (alternate them, several runs each: the machine is noisy):
53.4 µs per replicated round trip before, 42.9 after; unreplicated 10.9.
"""

from __future__ import annotations

import os
import shutil
import struct
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("NSQTW_SPIN_US", "0")
sys.path.insert(0, ".")

from nsqtw.runtime.spinreactor import install  # noqa: E402

install()

from twisted.internet import defer, protocol, reactor  # noqa: E402
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol  # noqa: E402

from nsqtw.embed import start_nsqd  # noqa: E402
from nsqtw.runtime.process import freeze_start_up_objects  # noqa: E402

N = int(os.environ.get("N", "30000"))
WARM_UP = 2000
BODY = b"x" * 200
PUB = b"PUB test\n" + struct.pack(">I", len(BODY)) + BODY
OK = b"\x00\x00\x00\x06\x00\x00\x00\x00OK"


class RoundTrips(protocol.Protocol):
    """Sends a PUB, waits for its OK, sends the next; times N of them after a warm-up."""

    transport: Any

    def __init__(self) -> None:
        self.n = 0
        self.buf = b""
        self.started = (0.0, 0.0)
        self.done: defer.Deferred[tuple[float, float]] = defer.Deferred()

    def connectionMade(self) -> None:
        self.transport.setTcpNoDelay(True)
        self.transport.write(b"  V2" + PUB)

    def dataReceived(self, data: bytes) -> None:
        self.buf += data
        while self.buf.startswith(OK):
            self.buf = self.buf[len(OK):]
            self.n += 1
            if self.n == WARM_UP:
                self.started = (time.perf_counter(), time.thread_time())
            elif self.n == WARM_UP + N:
                wall, cpu = self.started
                self.done.callback((time.perf_counter() - wall, time.thread_time() - cpu))
                return
            self.transport.socket.send(PUB)  # at once, as the broker's own answers go


async def sleep(seconds: float) -> None:
    d: defer.Deferred[None] = defer.Deferred()
    reactor.callLater(seconds, d.callback, None)  # type: ignore[attr-defined]  # the installed reactor
    await d


async def main(mode: str) -> None:
    peer = None
    secret_dir = ""
    if mode == "solo":
        origin = await start_nsqd(node_id=1, mem_queue_size=10_000_000)
    else:
        # an authenticated link, as deployed: its handshake and sealed frames are in the figure
        secret_dir = tempfile.mkdtemp(prefix="nsqtw-bench-secret-")
        secret = os.path.join(secret_dir, "secret")
        fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(os.urandom(32).hex() + "\n")
        peer = await start_nsqd(replication_secret_file=secret, node_id=2, replication_address="127.0.0.1:0",
                                mem_queue_size=10_000_000)
        origin = await start_nsqd(replication_secret_file=secret, node_id=1, mem_queue_size=10_000_000,
                                  replica_peers=[f"127.0.0.1:{peer._service.replication_port}"])
        while origin._service.replication.origin.in_sync() < 1:
            await sleep(0.01)
    freeze_start_up_objects()  # the daemons' collector policy (nsqd applies it at its start)
    client = await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", origin.tcp_port), RoundTrips())
    wall, cpu = await client.done
    print(f"{mode}: {wall / N * 1e6:.2f} µs per round trip, {cpu / N * 1e6:.2f} µs of CPU ({N} round trips)")
    client.transport.loseConnection()
    await origin.stop()
    if peer is not None:
        await peer.stop()
    if secret_dir:
        shutil.rmtree(secret_dir, ignore_errors=True)


def run() -> None:
    d = defer.ensureDeferred(main(sys.argv[1] if len(sys.argv) > 1 else "repl"))
    d.addErrback(lambda f: f.printTraceback())
    d.addBoth(lambda _: reactor.stop())  # type: ignore[attr-defined]  # the installed reactor


if __name__ == "__main__":
    reactor.callWhenRunning(run)  # type: ignore[attr-defined]  # the installed reactor
    reactor.run()  # type: ignore[attr-defined]  # the installed reactor
