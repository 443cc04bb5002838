"""What the replication end-to-end tests share: waiting on the real reactor for a condition,
a free loopback port (for a node that must be named before it listens), and message ids as
FIN takes them."""

from __future__ import annotations

import socket
from collections.abc import Callable

from twisted.internet import defer, reactor


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
