"""
``to_nsq``: publish stdin, split on a one-byte delimiter, to a topic (NSQ's ``apps/to_nsq``).

::

    tail -f app.log | to_nsq --topic=logs --nsqd-tcp-address=127.0.0.1:4150 --rate=100

Each record goes to *every* ``--nsqd-tcp-address`` (one producer each), one
record at a time as Go does (the next is published once all producers said
OK).  Empty records are skipped; a last record without a delimiter is still
published at end of input.  ``--rate N`` throttles to N messages a second: a
token bucket on the injected clock that starts with one token and holds at
most a second's worth, as Go's ticker-fed balance does.  A failed publish is
fatal (exit 1); end of input exits 0 once everything is published.  On
SIGINT/SIGTERM the publish in flight is finished and what was read but not
yet published is dropped, as in Go.
"""

from __future__ import annotations

import os
import sys
from collections import deque
from typing import Any

import attr
from twisted.internet import defer, protocol
from twisted.logger import Logger
from twisted.python.failure import Failure

from ..options import INT, STR, STRLIST, OptionError, opt
from ..protocol.names import is_valid_name
from ._app import App
from ._runtime import client_config, run_app

__all__ = ["ToNsqOptions", "ToNsq", "main"]

log = Logger(namespace="nsqtw.tools.to_nsq")

#: stop reading stdin while this many records wait to be published; read again below the low mark
HIGH_WATER = 10000
LOW_WATER = 1000


@attr.s(frozen=True, slots=True)
class ToNsqOptions:
    """to_nsq's flags (Go's names and defaults)."""

    topic: str = opt("", flag="topic", kind=STR, help="NSQ topic to publish to")
    delimiter: str = opt("\n", flag="delimiter", kind=STR, help="character to split input from stdin")
    nsqd_tcp_addresses: list[str] = opt(flag="nsqd-tcp-address", kind=STRLIST, factory=list,
                                        help="destination nsqd TCP address (may be given multiple times)")
    producer_opts: list[str] = opt(flag="producer-opt", kind=STRLIST, factory=list,
                                   help="option to passthrough to nsq.Producer (may be given multiple times, "
                                        "http://godoc.org/github.com/nsqio/go-nsq#Config)")
    rate: int = opt(0, flag="rate", kind=INT, help="Throttle messages to n/second. 0 to disable")

    def __attrs_post_init__(self) -> None:
        if not self.topic:
            raise OptionError("--topic required")
        if not is_valid_name(self.topic):
            raise OptionError(f"--topic {self.topic!r} is not a valid topic name")
        if len(os.fsencode(self.delimiter)) != 1:
            raise OptionError("--delimiter must be a single byte")
        if not self.nsqd_tcp_addresses:
            raise OptionError("--nsqd-tcp-address required")


class TokenBucket:
    """``rate`` tokens a second on ``clock``, at most ``rate`` banked, starting with one."""

    def __init__(self, rate: int, clock: Any) -> None:
        self.rate = float(rate)
        self.clock = clock
        self.tokens = 1.0
        self.last = clock.seconds()

    def _refill(self) -> None:
        now = self.clock.seconds()
        self.tokens = min(self.rate, self.tokens + (now - self.last) * self.rate)
        self.last = now

    def take(self) -> float:
        """Take a token: 0.0 if one was there, else the seconds until there is one (none taken)."""
        self._refill()
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


class ToNsq(App):
    """The running to_nsq: feed it bytes (:meth:`data_received`), then :meth:`end_of_input`."""

    def __init__(self, options: ToNsqOptions, reactor: Any = None, *, clock: Any = None) -> None:
        super().__init__(reactor)
        from ..client import Producer

        self.options = options
        self.clock = clock if clock is not None else self.reactor
        self.delimiter = os.fsencode(options.delimiter)
        config = client_config("to_nsq", options.producer_opts)
        self.producers: dict[str, Any] = {}
        for addr in options.nsqd_tcp_addresses:
            self.producers.setdefault(addr, Producer(addr, config, reactor=self.reactor))
        self.bucket = TokenBucket(options.rate, self.clock) if options.rate >= 1 else None
        self.published = 0
        self.transport: Any = None  # stdin's, paused while too much waits
        self._partial = b""
        self._records: deque[bytes] = deque()
        self._eof = False
        self._busy = False
        self._wait_call: Any = None
        self._paused = False

    def start(self) -> defer.Deferred:
        if self.bucket is not None:
            log.info("Throttling messages rate to max:{rate}/second", rate=self.options.rate)
        return defer.succeed(None)

    # --- input --------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._eof or self._stopping is not None:
            return
        parts = (self._partial + data).split(self.delimiter)
        self._partial = parts.pop()
        self._records.extend(p for p in parts if p)
        if len(self._records) >= HIGH_WATER and self.transport is not None and not self._paused:
            self._paused = True
            self.transport.pauseProducing()
        self._pump()

    def end_of_input(self) -> None:
        if self._eof:
            return
        self._eof = True
        if self._partial:
            self._records.append(self._partial)
            self._partial = b""
        self._pump()

    # --- publishing ---------------------------------------------------------------------------

    def _pump(self) -> None:
        if self._busy or self._wait_call is not None or self._stopping is not None:
            return
        if not self._records:
            if self._eof:
                self.stop()
            return
        if self.bucket is not None:
            wait = self.bucket.take()
            if wait > 0:
                self._wait_call = self.clock.callLater(wait, self._waited)
                return
        record = self._records.popleft()
        if self._paused and len(self._records) < LOW_WATER:
            self._paused = False
            self.transport.resumeProducing()
        self._busy = True
        d = defer.gatherResults([p.publish(self.options.topic, record) for p in self.producers.values()],
                                consumeErrors=True)
        d.addCallbacks(self._published, self._failed)

    def _waited(self) -> None:
        self._wait_call = None
        self._pump()

    def _published(self, _: Any) -> None:
        self._busy = False
        self.published += 1
        if self._stopping is not None:
            self._drained()
            return
        self._pump()

    def _failed(self, f: Failure) -> None:
        self._busy = False
        if f.check(defer.FirstError):
            f = f.value.subFailure
        log.error("{err}", err=f.getErrorMessage())
        self.finish(1)
        self.stop()

    # --- stopping -------------------------------------------------------------------------

    _drain_waiter: defer.Deferred | None = None

    def _drained(self) -> None:
        if self._drain_waiter is not None:
            d, self._drain_waiter = self._drain_waiter, None
            d.callback(None)

    def _stop(self) -> Any:
        if self._wait_call is not None and self._wait_call.active():
            self._wait_call.cancel()
        self._wait_call = None
        dropped = len(self._records)
        self._records.clear()
        if dropped and not self._eof:
            log.info("stopping: {n} records read but not published", n=dropped)
        if self.transport is not None:
            try:
                self.transport.loseConnection()
            except Exception:
                pass
        self._eof = True
        waiting: defer.Deferred = defer.succeed(None)
        if self._busy:
            self._drain_waiter = waiting = defer.Deferred()

        def stop_producers(_: Any) -> defer.Deferred:
            return defer.DeferredList([p.stop() for p in self.producers.values()], consumeErrors=True)

        return waiting.addCallback(stop_producers)


class _Stdin(protocol.Protocol):
    """stdin's bytes into the app; end of input ends it."""

    def __init__(self, app: ToNsq) -> None:
        self.app = app

    def connectionMade(self) -> None:
        self.app.transport = self.transport

    def dataReceived(self, data: bytes) -> None:
        self.app.data_received(data)

    def connectionLost(self, reason: Failure | None = None) -> None:
        self.app.end_of_input()


def main(argv: list[str] | None = None) -> int:
    """The ``to_nsq`` command."""

    def make(options: ToNsqOptions, reactor: Any) -> ToNsq:
        from twisted.internet.stdio import StandardIO

        app = ToNsq(options, reactor)
        original_start = app.start

        def start() -> defer.Deferred:
            d = original_start()
            StandardIO(_Stdin(app), reactor=reactor)
            return d

        app.start = start  # type: ignore[method-assign]  # this app also reads stdin once started
        return app

    return run_app("to_nsq", argv, ToNsqOptions, make)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
