"""
``nsq_stat``: poll ``/stats`` of every nsqd with a topic and print a channel's rates and depths (NSQ's ``apps/nsq_stat``).

::

    nsq_stat --topic=events --channel=archive --lookupd-http-address=127.0.0.1:4161 --interval=1s --count=10

    -----rate------+----------------depth----------------+--------------metadata---------------
    ingress  egress |   total     mem    disk inflt   def |     req     t-o         msgs clients
          5       5 |       0       0       0     0     0 |       0       0           20       1

The nsqd are found through ``--lookupd-http-address`` (``/lookup?topic=``,
each producer's ``broadcast_address:http_port``) or are the
``--nsqd-http-address`` list (those whose ``/stats`` show the topic; nsqtw
asks each at the address given, where Go asks ``/info`` for the broadcast
address first).  Each report sums the channel over all of them: ``ingress``
is messages per second into the channel, ``egress`` messages per second out
(finished, as depth did not grow), over ``--interval``.  The first poll is
the baseline; ``--count N`` prints N reports and exits 0; the header is
reprinted every 25 lines.  A poll that fails everywhere is fatal, as in Go.
"""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO
from urllib.parse import quote

import attr
from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from ..options import DURATION, INT, STR, STRLIST, OptionError, opt
from ..protocol.channels import ChannelCounts
from ._app import App, check_http_addresses, require_sources
from ._runtime import run_app

__all__ = ["StatOptions", "NsqStat", "ChannelTotals", "format_header", "format_line", "main"]

log = Logger(namespace="nsqtw.tools.nsq_stat")

_ACCEPT = b"application/vnd.nsq; version=1.0"
HEADER_EVERY = 25


@attr.s(frozen=True, slots=True)
class StatOptions:
    """nsq_stat's flags (Go's names and defaults; ``--count`` 0 means until stopped)."""

    topic: str = opt("", flag="topic", kind=STR, help="NSQ topic")
    channel: str = opt("", flag="channel", kind=STR, help="NSQ channel")
    interval: float = opt(2.0, flag="interval", kind=DURATION, help="duration of time between polling/printing output")
    http_client_connect_timeout: float = opt(2.0, flag="http-client-connect-timeout", kind=DURATION,
                                             help="timeout for HTTP connect")
    http_client_request_timeout: float = opt(5.0, flag="http-client-request-timeout", kind=DURATION,
                                             help="timeout for HTTP request")
    count: int = opt(0, flag="count", kind=INT, help="number of reports")
    nsqd_http_addresses: list[str] = opt(flag="nsqd-http-address", kind=STRLIST, factory=list,
                                         help="nsqd HTTP address (may be given multiple times)")
    lookupd_http_addresses: list[str] = opt(flag="lookupd-http-address", kind=STRLIST, factory=list,
                                            help="lookupd HTTP address (may be given multiple times)")

    def __attrs_post_init__(self) -> None:
        if not self.topic or not self.channel:
            raise OptionError("--topic and --channel are required")
        if self.interval <= 0:
            raise OptionError("--interval should be positive")
        if self.http_client_connect_timeout <= 0:
            raise OptionError("--http-client-connect-timeout should be positive")
        if self.http_client_request_timeout <= 0:
            raise OptionError("--http-client-request-timeout should be positive")
        if self.count < 0:
            raise OptionError("--count should be positive")
        require_sources(self.nsqd_http_addresses, self.lookupd_http_addresses, "nsqd-http-address")
        check_http_addresses("nsqd-http-address", self.nsqd_http_addresses)
        check_http_addresses("lookupd-http-address", self.lookupd_http_addresses)


#: one channel summed over its nsqd (the shared :class:`~nsqtw.protocol.channels.ChannelCounts`)
ChannelTotals = ChannelCounts


def format_header() -> str:
    return ("------rate------+----------------depth----------------+--------------metadata---------------\n"
            f"{'ingress':>7} {'egress':>7} | {'total':>7} {'mem':>7} {'disk':>7} {'inflt':>5} {'def':>5} | "
            f"{'req':>7} {'t-o':>7} {'msgs':>12} {'clients':>7}\n")


def format_line(c: ChannelTotals, o: ChannelTotals, interval: float) -> str:
    ingress = int((c.message_count - o.message_count) / interval)
    egress = int((c.message_count - o.message_count - (c.depth - o.depth)) / interval)
    return (f"{ingress:7d} {egress:7d} | {c.depth:7d} {c.memory_depth:7d} {c.backend_depth:7d} "
            f"{c.in_flight_count:5d} {c.deferred_count:5d} | {c.requeue_count:7d} {c.timeout_count:7d} "
            f"{c.message_count:12d} {c.client_count:7d}\n")


class StatError(Exception):
    pass


class NsqStat(App):
    """The running nsq_stat; ``reports`` counts the lines printed after the baseline."""

    def __init__(self, options: StatOptions, reactor: Any = None, *, clock: Any = None,
                 out: TextIO | None = None, http_client: Any = None) -> None:
        super().__init__(reactor)
        self.options = options
        self.clock = clock if clock is not None else self.reactor
        self.out: TextIO = out if out is not None else sys.stdout
        self._http_client = http_client
        self.iteration = 0
        self.reports = 0
        self.previous: ChannelTotals | None = None
        self._call: Any = None
        self._poll: defer.Deferred | None = None

    def _http(self) -> Any:
        if self._http_client is None:
            from treq.client import HTTPClient
            from twisted.web.client import Agent, HTTPConnectionPool
            pool = HTTPConnectionPool(self.reactor, persistent=False)
            agent = Agent(self.reactor, connectTimeout=self.options.http_client_connect_timeout, pool=pool)
            self._http_client = HTTPClient(agent)
        return self._http_client

    def get_json(self, url: str) -> defer.Deferred:
        import treq

        d = self._http().get(url, headers={b"Accept": [_ACCEPT]})
        d.addTimeout(self.options.http_client_request_timeout, self.clock)

        def got(response: Any) -> defer.Deferred:
            def parse(body: bytes) -> Any:
                if response.code != 200:
                    raise StatError(f"{url}: got response {response.code} {body[:200]!r}")
                doc = json.loads(body)
                if isinstance(doc, dict) and "status_code" in doc and "data" in doc:
                    doc = doc["data"]  # the pre-1.0 wrapper
                return doc
            return treq.content(response).addCallback(parse)

        return d.addCallback(got)

    # --- clusterinfo ------------------------------------------------------------------------

    async def producers(self) -> list[str]:
        """HTTP addresses of the nsqd holding the topic."""
        topic = quote(self.options.topic, safe="")
        errors: list[str] = []
        found: list[str] = []
        if self.options.lookupd_http_addresses:
            addrs = self.options.lookupd_http_addresses
            results = await defer.DeferredList(
                [self.get_json(f"http://{a}/lookup?topic={topic}") for a in addrs], consumeErrors=True)
            for ok, doc in results:
                if not ok:
                    errors.append(doc.getErrorMessage())
                    continue
                for p in (doc or {}).get("producers") or []:
                    host, port = p.get("broadcast_address"), p.get("http_port")
                    if host and port:
                        addr = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
                        if addr not in found:
                            found.append(addr)
        else:
            addrs = self.options.nsqd_http_addresses
            results = await defer.DeferredList(
                [self.get_json(f"http://{a}/stats?format=json&topic={topic}&include_clients=false") for a in addrs],
                consumeErrors=True)
            for addr, (ok, doc) in zip(addrs, results, strict=True):
                if not ok:
                    errors.append(doc.getErrorMessage())
                    continue
                if any(t.get("topic_name") == self.options.topic for t in (doc or {}).get("topics") or []):
                    found.append(addr)
        if errors and len(errors) == len(addrs):
            raise StatError(f"failed to get topic producers - failed to query any: {'; '.join(errors)}")
        for e in errors:
            log.warn("{e}", e=e)
        return found

    async def channel_totals(self, producers: list[str]) -> ChannelTotals:
        topic = quote(self.options.topic, safe="")
        channel = quote(self.options.channel, safe="")
        results = await defer.DeferredList(
            [self.get_json(f"http://{a}/stats?format=json&topic={topic}&channel={channel}&include_clients=false")
             for a in producers], consumeErrors=True)
        totals = ChannelTotals()
        seen = False
        errors = []
        for ok, doc in results:
            if not ok:
                errors.append(doc.getErrorMessage())
                continue
            for t in (doc or {}).get("topics") or []:
                if t.get("topic_name") != self.options.topic:
                    continue
                for ch in t.get("channels") or []:
                    if ch.get("channel_name") == self.options.channel:
                        totals.add_nsqd(ch)
                        seen = True
        if producers and len(errors) == len(producers):
            raise StatError(f"failed to get nsqd stats - failed to query any nsqd: {'; '.join(errors)}")
        if not seen:
            raise StatError(f"failed to find channel({self.options.channel}) in stats metadata "
                            f"for topic({self.options.topic})")
        return totals

    # --- the loop ---------------------------------------------------------------------------------

    def start(self) -> defer.Deferred:
        self._schedule(0)
        return defer.succeed(None)

    def _schedule(self, delay: float) -> None:
        self._call = self.clock.callLater(delay, self._tick)

    def _tick(self) -> None:
        self._call = None
        self._poll = defer.ensureDeferred(self.poll_once())
        self._poll.addCallbacks(self._polled, self._failed)

    async def poll_once(self) -> None:
        producers = await self.producers()
        current = await self.channel_totals(producers)
        if self.iteration % HEADER_EVERY == 0:
            self.out.write(format_header())
        if self.previous is not None:
            self.out.write(format_line(current, self.previous, self.options.interval))
            self.reports += 1
        self.out.flush()
        self.previous = current

    def _polled(self, _: Any) -> None:
        self._poll = None
        self.iteration += 1
        if self.options.count and self.reports >= self.options.count:
            self.finish(0)
            return
        if not self.finished and self._stopping is None:
            self._schedule(self.options.interval)

    def _failed(self, f: Failure) -> None:
        self._poll = None
        if self._stopping is not None and f.check(defer.CancelledError):
            return
        log.critical("ERROR: {err}", err=f.getErrorMessage())
        self.finish(1)

    def _stop(self) -> Any:
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None
        if self._poll is not None:
            self._poll.cancel()
        return None


def main(argv: list[str] | None = None) -> int:
    """The ``nsq_stat`` command."""
    return run_app("nsq_stat", argv, StatOptions, lambda options, reactor: NsqStat(options, reactor))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
