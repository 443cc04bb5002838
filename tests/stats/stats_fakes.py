"""Fakes for the exporter tests: a node with a real Broker on a task.Clock, no sockets."""

from __future__ import annotations

from typing import Any

import attr
from twisted.internet import defer, task

from nsqtw.nsqd.core.broker import Broker
from nsqtw.options import NsqdOptions


class FakeNode:
    """What exporters ask of an NsqdService: broker, options, reactor, bound ports."""

    def __init__(self, clock: task.Clock, options: NsqdOptions, tcp_port: int = 4150,
                 http_port: int | None = 4151) -> None:
        self.options = options
        self.reactor = clock
        self.broker = Broker(options, clock.seconds())
        self.tcp_port = tcp_port
        self.http_port = http_port

    def now(self) -> float:
        return self.reactor.seconds()


def make_node(clock: task.Clock, **changes: Any) -> FakeNode:
    base = NsqdOptions(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0", https_address="",
                       broadcast_address="node1.example", data_path="")
    return FakeNode(clock, attr.evolve(base, **changes))


def run_inline(f: Any, *args: Any) -> defer.Deferred:
    """A ``run_in_thread`` that runs in the caller's thread (deterministic tests)."""
    return defer.maybeDeferred(f, *args)
