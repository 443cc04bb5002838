"""
The app object every tool is (start / stop / done), and the checks the consumer apps share.

Go's consumer apps all take ``--nsqd-tcp-address`` or ``--lookupd-http-address``
(exactly one kind, each repeatable) and ``--consumer-opt``; they start one
go-nsq ``Consumer`` per topic and stop them all on SIGINT/SIGTERM.
:class:`ConsumerApp` is that part, on :class:`nsqtw.client.Consumer`.
"""

from __future__ import annotations

from typing import Any
from collections.abc import Callable, Sequence

from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from ..options import OptionError
from ..runtime.reactor import resolve_reactor

__all__ = ["App", "ConsumerApp", "require_sources", "check_http_addresses"]

log = Logger(namespace="nsqtw.tools")


def require_sources(nsqd: Sequence[str], lookupd: Sequence[str], nsqd_flag: str = "nsqd-tcp-address") -> None:
    """Go: exactly one of ``--nsqd-tcp-address`` / ``--lookupd-http-address``."""
    if not nsqd and not lookupd:
        raise OptionError(f"--{nsqd_flag} or --lookupd-http-address required")
    if nsqd and lookupd:
        raise OptionError(f"use --{nsqd_flag} or --lookupd-http-address not both")


def check_http_addresses(flag: str, addresses: Sequence[str]) -> None:
    """nsq_stat: ``host:port`` only, no scheme."""
    for a in addresses:
        if a.startswith("http"):
            raise OptionError(f"--{flag} error - address should not contain scheme")


class App:
    """start() / stop() / done: the shape :func:`~nsqtw.tools._runtime.run_app` drives."""

    def __init__(self, reactor: Any = None) -> None:
        self.reactor = resolve_reactor(reactor)
        self._result: Any = None
        self._finished = False
        self._waiters: list[defer.Deferred] = []
        self._stopping: defer.Deferred | None = None

    @property
    def done(self) -> defer.Deferred:
        """Fires with the exit code once the app is over (a fresh Deferred per call)."""
        if self._finished:
            return defer.succeed(self._result)
        d: defer.Deferred = defer.Deferred()
        self._waiters.append(d)
        return d

    @property
    def finished(self) -> bool:
        return self._finished

    def finish(self, code: int = 0) -> None:
        if self._finished:
            return
        self._finished = True
        self._result = code
        waiters, self._waiters = self._waiters, []
        for d in waiters:
            d.callback(code)

    def start(self) -> defer.Deferred:
        raise NotImplementedError

    def stop(self) -> defer.Deferred:
        """Graceful stop (idempotent); fires once finished, with the exit code."""
        if self._stopping is None:
            d = defer.maybeDeferred(self._stop)

            def over(result: Any) -> Any:
                if isinstance(result, Failure):
                    log.failure("error while stopping", result)
                    self.finish(1)
                else:
                    self.finish(0 if not self._finished else self._result)
                return self._result

            self._stopping = d.addBoth(over)
        d2: defer.Deferred[Any] = defer.Deferred()

        def relay(r: Any) -> Any:
            d2.callback(self._result)
            return r

        self._stopping.addBoth(relay)
        return d2

    def _stop(self) -> Any:
        return None

    def hup(self) -> None:
        """SIGHUP (only nsq_to_file does something with it)."""


class ConsumerApp(App):
    """Consumers for several topics of one channel, on nsqd or through lookupd."""

    def __init__(self, reactor: Any = None) -> None:
        super().__init__(reactor)
        self.consumers: list[Any] = []

    def connect(self, consumer: Any, nsqd: Sequence[str], lookupd: Sequence[str]) -> defer.Deferred:
        """go-nsq's ConnectToNSQDs then ConnectToNSQLookupds; a failed nsqd dial is fatal."""
        self.consumers.append(consumer)
        waits = []
        for addr in nsqd:
            waits.append(consumer.connect_to_nsqd(addr))
        for addr in lookupd:
            waits.append(consumer.connect_to_nsqlookupd(addr))
        d = defer.gatherResults(waits, consumeErrors=True)

        def unwrap(f: Failure) -> Failure:
            if f.check(defer.FirstError):
                return f.value.subFailure
            return f

        return d.addErrback(unwrap)

    def stop_consumers(self) -> defer.Deferred:
        return defer.DeferredList([c.stop() for c in self.consumers], consumeErrors=True)


def each(fn: Callable[[Any], Any], items: Sequence[Any]) -> defer.Deferred:
    return defer.gatherResults([defer.maybeDeferred(fn, x) for x in items], consumeErrors=True)
