"""Helpers for the tool tests: waiting on the reactor, parsing a tool's flags, collecting messages."""

from __future__ import annotations

import io
from typing import Any
from collections.abc import Callable

from twisted.internet import defer, task

from nsqtw.runtime.flags import options_from_argv


def reactor() -> Any:
    from twisted.internet import reactor as r
    return r


async def wait_for(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    """Poll a condition on the reactor (5 ms steps) until it holds or the timeout passes."""
    r = reactor()
    deadline = r.seconds() + timeout
    while not predicate():
        if r.seconds() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await task.deferLater(r, 0.005, lambda: None)


async def within(d: defer.Deferred, timeout: float = 10.0) -> Any:
    """Await ``d`` but fail after ``timeout`` seconds of real time."""
    d.addTimeout(timeout, reactor())
    return await d


def tool_options(cls: type, *argv: str) -> Any:
    return options_from_argv(cls, list(argv), config_flag=False)


class Out(io.BytesIO):
    """A stdout stand-in whose lines can be read while the tool runs."""

    def lines(self) -> list[bytes]:
        return self.getvalue().splitlines()


async def drain(nsqd: Any, topic: str, channel: str, n: int, timeout: float = 10.0) -> list[bytes]:
    """Consume ``n`` bodies of ``topic``/``channel`` from an embedded nsqd (TCP) and stop."""
    from nsqtw.client import Config, Consumer

    got: list[bytes] = []
    c = Consumer(topic, channel, lambda m: got.append(m.body), Config(max_in_flight=max(1, n)))
    await c.connect_to_nsqd(nsqd.tcp_address)
    try:
        await wait_for(lambda: len(got) >= n, timeout, f"{n} messages on {topic}/{channel} (got {len(got)})")
    finally:
        await c.stop()
    return got
