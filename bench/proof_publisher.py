#!/usr/bin/env python
"""
A stock client publishing for the replication proof (``bench/replication_proof.py --client``).

    python bench/proof_publisher.py nsqtw 127.0.0.1:4150 0    # nsqtw's Producer (Twisted)
    python bench/proof_publisher.py pynsq 127.0.0.1:4150 0    # pynsq's Writer (Tornado)

Publishes the proof's batches (a PUB of one body, or an MPUB of five: ``m%09d`` numbered from
the third argument) to topic ``proof`` with ``LANES`` batches in flight on the client's one
connection, and prints each batch's bodies on one line of standard output once its ``OK`` is
in: what is printed is exactly what nsqd acknowledged.  A refused publish (``E_PUB_FAILED``
while the replication link comes up closes the connection, as in Go's nsqd) is tried again
with new bodies after 50 ms; once nsqd cannot be reached at all (the proof killed it) the
publisher exits 0.  Nothing here is raw protocol: the client library does all of it.
"""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Callable
from typing import Any

TOPIC = "proof"
LANES = 4
RETRY = 0.05
PATIENCE = 30.0  # seconds without an acknowledged publish before giving up (exit 2)


class Batches:
    """The numbered batches and what came of them."""

    def __init__(self, start: int, address: str) -> None:
        self.seq = start
        host, port = address.rsplit(":", 1)
        self.target = (host, int(port))
        self.last_ok = time.monotonic()

    def next(self) -> list[bytes]:
        n = 1 if self.seq % 3 == 0 else 5
        bodies = [b"m%09d" % (self.seq + i) for i in range(n)]
        self.seq += n
        return bodies

    def acked(self, bodies: list[bytes]) -> None:
        sys.stdout.write(b" ".join(bodies).decode() + "\n")
        sys.stdout.flush()
        self.last_ok = time.monotonic()

    def gone(self) -> bool:
        """True once nsqd refuses connections (it was killed); a refused publish is not that."""
        try:
            socket.create_connection(self.target, timeout=2).close()
        except OSError:
            return True
        if time.monotonic() - self.last_ok > PATIENCE:
            sys.stderr.write(f"publishes refused for {PATIENCE:.0f} s\n")
            sys.exit(2)
        return False


def run_nsqtw(address: str, start: int) -> None:
    from twisted.internet import defer, task

    from nsqtw.client import Producer

    async def main(reactor: Any) -> None:
        batches = Batches(start, address)
        producer = Producer(address, reactor=reactor)

        async def lane() -> None:
            while True:
                bodies = batches.next()
                try:
                    if len(bodies) == 1:
                        await producer.publish(TOPIC, bodies[0])
                    else:
                        await producer.multi_publish(TOPIC, bodies)
                except Exception:
                    if batches.gone():
                        return
                    await task.deferLater(reactor, RETRY, lambda: None)
                    continue
                batches.acked(bodies)

        await defer.gatherResults([defer.ensureDeferred(lane()) for _ in range(LANES)])
        await producer.stop(timeout=1)

    task.react(lambda reactor: defer.ensureDeferred(main(reactor)))


def run_pynsq(address: str, start: int) -> None:
    import nsq
    import tornado.ioloop

    loop = tornado.ioloop.IOLoop.current()
    batches = Batches(start, address)
    writer = nsq.Writer([address], reconnect_interval=RETRY)
    running = [0]

    def send() -> None:
        bodies = batches.next()
        done: Callable[[Any, Any], None] = lambda conn, data: answered(bodies, data)  # noqa: E731
        if len(bodies) == 1:
            writer.pub(TOPIC, bodies[0], callback=done)
        else:
            writer.mpub(TOPIC, bodies, callback=done)

    def answered(bodies: list[bytes], data: Any) -> None:
        if not isinstance(data, nsq.Error):
            batches.acked(bodies)
            send()
        elif batches.gone():
            running[0] -= 1
            if not running[0]:
                loop.stop()
        else:
            loop.call_later(RETRY, send)

    def begin() -> None:
        if not any(conn.connected() for conn in writer.conns.values()):
            if batches.gone():
                loop.stop()
            else:
                loop.call_later(0.01, begin)
            return
        running[0] = LANES
        for _ in range(LANES):
            send()

    loop.call_later(0.01, begin)
    loop.start()


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] not in ("nsqtw", "pynsq"):
        sys.stderr.write("usage: proof_publisher.py nsqtw|pynsq HOST:PORT FIRST_NUMBER\n")
        return 2
    client, address, start = argv[0], argv[1], int(argv[2])
    (run_nsqtw if client == "nsqtw" else run_pynsq)(address, start)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
