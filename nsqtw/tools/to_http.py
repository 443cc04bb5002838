"""
``nsq_to_http``: forward each message over HTTP (NSQ's ``apps/nsq_to_http``).

::

    nsq_to_http --topic=events --lookupd-http-address=127.0.0.1:4161 \\
        --post=http://hooks.internal/ingest --post=http://hooks2.internal/ingest -n 20

``--post URL`` sends the body (``--content-type``, default
``application/octet-stream``); ``--get URL`` must hold exactly one ``%s``,
replaced by the URL-escaped body (Go's ``url.QueryEscape``).  Both are
repeatable, one kind at a time.  A POST answered outside 2xx, a GET answered
other than 200, a timeout or a connection error is a failure: the message is
REQueued with go-nsq's delay and the consumer backs off.  ``-n`` handlers run
at once; ``--sample`` forwards that fraction of messages and FINs the rest.

``--mode``: ``round-robin`` takes the addresses in turn.  ``hostpool`` (the
default) and ``epsilon-greedy`` both use :class:`HostPool`, go-hostpool's
standard pool: addresses in turn, skipping one that failed until its retry
time (30 s, doubling up to 15 min), every address again when all are down.
Go's epsilon-greedy additionally weights hosts by measured latency; nsqtw
maps it to the same healthy-first pool.  An unknown mode is refused (Go
would silently post to every address).
"""

from __future__ import annotations

import random
import sys
import time
from typing import Any
from urllib.parse import quote_plus

import attr
from twisted.internet import defer, task
from twisted.logger import Logger

from .. import NSQ_VERSION
from ..options import DURATION, FLOAT, INT, STR, STRLIST, OptionError, opt
from ..protocol.names import is_valid_name
from ._app import ConsumerApp, require_sources
from ._runtime import client_config, run_app

__all__ = ["ToHttpOptions", "ToHttp", "HostPool", "TimerMetrics", "parse_headers", "main"]

log = Logger(namespace="nsqtw.tools.nsq_to_http")

DEFAULT_CONTENT_TYPE = "application/octet-stream"
MODES = ("hostpool", "round-robin", "epsilon-greedy")


#: seconds between two new connections to one host: ``-n`` handlers starting at once must not
#: open ``-n`` connections in the same instant, or a server with a small listen backlog (Python's
#: ``http.server`` has 5) drops the overflow after the client already sent its request, and those
#: requests hang until the timeout; paced, each connection is accepted before the next is opened,
#: and the pool then reuses them
CONNECT_SPACING = 0.002


class PacedEndpointFactory:
    """Twisted's standard client endpoints (TCP, TLS for https), with new connections to one
    host:port opened one at a time, ``CONNECT_SPACING`` apart."""

    def __init__(self, reactor: Any, connect_timeout: float, spacing: float = CONNECT_SPACING) -> None:
        from twisted.web.client import BrowserLikePolicyForHTTPS

        self.reactor = reactor
        self.connect_timeout = connect_timeout
        self.spacing = spacing
        self.tls_policy = BrowserLikePolicyForHTTPS()
        self._next: dict[tuple[bytes, int], float] = {}

    def endpointForURI(self, uri: Any) -> Any:
        from twisted.internet.endpoints import HostnameEndpoint, wrapClientTLS

        host = uri.host.decode("ascii") if isinstance(uri.host, bytes) else uri.host
        endpoint: Any = HostnameEndpoint(self.reactor, host, uri.port, timeout=self.connect_timeout)
        if uri.scheme == b"https":
            endpoint = wrapClientTLS(self.tls_policy.creatorForNetloc(uri.host, uri.port), endpoint)
        return _PacedEndpoint(self, (uri.host, uri.port), endpoint)

    def delay(self, key: tuple[bytes, int]) -> float:
        """How long a new connection to ``key`` waits (and book its slot)."""
        now = self.reactor.seconds()
        at = max(now, self._next.get(key, 0.0))
        self._next[key] = at + self.spacing
        return at - now


#: new connections to one host:port (across every nsq_to_http in this process) that may be open
#: without having heard from the server yet: below the 5 of the smallest common listen backlog
#: (Python's ``http.server``), so a burst never overflows it however slowly the server accepts
UNANSWERED_PER_HOST = 4

_unanswered: dict[tuple[bytes, int], defer.DeferredSemaphore] = {}


def _unanswered_slots(key: tuple[bytes, int]) -> defer.DeferredSemaphore:
    sem = _unanswered.get(key)
    if sem is None:
        sem = _unanswered[key] = defer.DeferredSemaphore(UNANSWERED_PER_HOST)
    return sem


class _PacedEndpoint:
    """Opens a connection once fewer than ``UNANSWERED_PER_HOST`` new connections to the same
    host are still waiting for the server's first bytes, and ``CONNECT_SPACING`` after the last
    one. The slot is given back when the server's first bytes arrive (it accepted the
    connection and answered), or when the connection fails or closes."""

    def __init__(self, factory: PacedEndpointFactory, key: tuple[bytes, int], endpoint: Any) -> None:
        self.factory = factory
        self.key = key
        self.endpoint = endpoint

    def connect(self, protocol_factory: Any) -> defer.Deferred:
        slots = _unanswered_slots(self.key)

        def paced(_: Any) -> defer.Deferred:
            wait = self.factory.delay(self.key)
            if wait <= 0:
                return self.endpoint.connect(protocol_factory)
            return task.deferLater(self.factory.reactor, wait, self.endpoint.connect, protocol_factory)

        def connected(proto: Any) -> Any:
            _release_on_first_answer(proto, slots)
            return proto

        def failed(f: Any) -> Any:
            slots.release()
            return f

        d = slots.acquire()
        d.addCallback(paced)
        d.addCallbacks(connected, failed)
        return d


def _release_on_first_answer(proto: Any, slots: defer.DeferredSemaphore) -> None:
    released = False

    def release() -> None:
        nonlocal released
        if not released:
            released = True
            slots.release()

    def data_received(data: bytes) -> None:
        release()
        del proto.dataReceived  # the class's own from now on
        proto.dataReceived(data)

    lost = proto.connectionLost

    def connection_lost(reason: Any) -> None:
        release()
        lost(reason)

    proto.dataReceived = data_received
    proto.connectionLost = connection_lost


def parse_headers(values: list[str]) -> dict[str, str]:
    """``--header "Key: value"`` (Go splits on the first colon and trims both sides)."""
    out: dict[str, str] = {}
    for text in values:
        key, sep, value = text.partition(":")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise OptionError("--header value format should be 'key=value'")
        out[key] = value
    return out


@attr.s(frozen=True, slots=True)
class ToHttpOptions:
    """nsq_to_http's flags (Go's names and defaults)."""

    topic: str = opt("", flag="topic", kind=STR, help="nsq topic")
    channel: str = opt("nsq_to_http", flag="channel", kind=STR, help="nsq channel")
    max_in_flight: int = opt(200, flag="max-in-flight", kind=INT, help="max number of messages to allow in flight")
    num_publishers: int = opt(100, flag="n", kind=INT, help="number of concurrent publishers")
    mode: str = opt("hostpool", flag="mode", kind=STR,
                    help="the upstream request mode options: round-robin, hostpool (default), epsilon-greedy")
    sample: float = opt(1.0, flag="sample", kind=FLOAT, help="% of messages to publish (float b/w 0 -> 1)")
    http_client_connect_timeout: float = opt(2.0, flag="http-client-connect-timeout", kind=DURATION,
                                             help="timeout for HTTP connect")
    http_client_request_timeout: float = opt(20.0, flag="http-client-request-timeout", kind=DURATION,
                                             help="timeout for HTTP request")
    status_every: int = opt(250, flag="status-every", kind=INT,
                            help="the # of requests between logging status (per handler), 0 disables")
    content_type: str = opt(DEFAULT_CONTENT_TYPE, flag="content-type", kind=STR,
                            help="the Content-Type used for POST requests")
    post: list[str] = opt(flag="post", kind=STRLIST, factory=list,
                          help="HTTP address to make a POST request to.  data will be in the body "
                               "(may be given multiple times)")
    headers: list[str] = opt(flag="header", kind=STRLIST, factory=list,
                             help="Custom header for HTTP requests (may be given multiple times)")
    get: list[str] = opt(flag="get", kind=STRLIST, factory=list,
                         help="HTTP address to make a GET request to. '%s' will be printf replaced with data "
                              "(may be given multiple times)")
    nsqd_tcp_addresses: list[str] = opt(flag="nsqd-tcp-address", kind=STRLIST, factory=list,
                                        help="nsqd TCP address (may be given multiple times)")
    lookupd_http_addresses: list[str] = opt(flag="lookupd-http-address", kind=STRLIST, factory=list,
                                            help="lookupd HTTP address (may be given multiple times)")
    consumer_opts: list[str] = opt(flag="consumer-opt", kind=STRLIST, factory=list,
                                   help="option to passthrough to nsq.Consumer (may be given multiple times, "
                                        "http://godoc.org/github.com/nsqio/go-nsq#Config)")

    def __attrs_post_init__(self) -> None:
        parse_headers(self.headers)
        if not self.topic or not self.channel:
            raise OptionError("--topic and --channel are required")
        if not is_valid_name(self.topic):
            raise OptionError("--topic is invalid")
        if not is_valid_name(self.channel):
            raise OptionError("--channel is invalid")
        if self.content_type != DEFAULT_CONTENT_TYPE:
            if not self.post:
                raise OptionError("--content-type only used with --post")
            if not self.content_type:
                raise OptionError("--content-type requires a value when used")
        require_sources(self.nsqd_tcp_addresses, self.lookupd_http_addresses)
        if not self.get and not self.post:
            raise OptionError("--get or --post required")
        if self.get and self.post:
            raise OptionError("use --get or --post not both")
        for url in self.get:
            if url.count("%s") != 1:
                raise OptionError("invalid GET address - must be a printf string")
        if self.mode not in MODES:
            raise OptionError(f"invalid --mode {self.mode!r} (round-robin, hostpool or epsilon-greedy)")
        if not 0.0 <= self.sample_rate <= 1.0:
            raise OptionError("ERROR: --sample must be between 0.0 and 1.0")
        if self.num_publishers < 1:
            raise OptionError("-n must be > 0")
        if self.max_in_flight < 1:
            raise OptionError("--max-in-flight must be > 0")

    @property
    def sample_rate(self) -> float:
        return float(self.sample)

    @property
    def addresses(self) -> list[str]:
        return list(self.post or self.get)


class HostPool:
    """go-hostpool's standard pool: in turn, skipping failed hosts until their retry time."""

    INITIAL_RETRY = 30.0
    MAX_RETRY = 900.0

    @attr.s(slots=True)
    class _Host:
        name: str = attr.ib()
        dead: bool = attr.ib(default=False)
        retry_delay: float = attr.ib(default=0.0)
        next_retry: float = attr.ib(default=0.0)

    def __init__(self, hosts: list[str], clock: Any) -> None:
        self.hosts = [self._Host(h) for h in hosts]
        self._by_name = {h.name: h for h in self.hosts}
        self.clock = clock
        self._next = 0

    def get(self) -> str:
        now = self.clock.seconds()
        n = len(self.hosts)
        for i in range(n):
            host = self.hosts[(self._next + i) % n]
            if not host.dead:
                self._next = (self._next + i + 1) % n
                return host.name
            if host.next_retry <= now:
                # a dead host's turn to be tried again; back off further if it fails
                host.retry_delay = min(host.retry_delay * 2, self.MAX_RETRY)
                host.next_retry = now + host.retry_delay
                self._next = (self._next + i + 1) % n
                return host.name
        for host in self.hosts:  # all down: start over
            host.dead = False
        return self.get()

    def mark(self, name: str, failed: bool) -> None:
        host = self._by_name[name]
        if not failed:
            host.dead = False
        elif not host.dead:
            host.dead = True
            host.retry_delay = self.INITIAL_RETRY
            host.next_retry = self.clock.seconds() + host.retry_delay

    def healthy(self) -> list[str]:
        return [h.name for h in self.hosts if not h.dead]


class TimerMetrics:
    """bitly/timer_metrics: every ``every`` requests, log the 95th/99th percentile and average."""

    def __init__(self, every: int, prefix: str) -> None:
        self.every = every
        self.prefix = prefix
        self.durations: list[float] = []
        self.count = 0

    def status(self, started: float) -> None:
        if self.every <= 0:
            return
        self.durations.append(time.monotonic() - started)
        self.count += 1
        if len(self.durations) >= self.every:
            d = sorted(self.durations)
            self.durations = []
            p = lambda q: d[min(len(d) - 1, int(len(d) * q))] * 1000  # noqa: E731
            log.info("{prefix} finished {n} requests - 99th: {p99:.2f}ms - 95th: {p95:.2f}ms - avg: {avg:.2f}ms",
                     prefix=self.prefix, n=len(d), p99=p(0.99), p95=p(0.95), avg=sum(d) / len(d) * 1000)


class HTTPError(Exception):
    """An answer that counts as a failure."""


class ToHttp(ConsumerApp):
    """The running nsq_to_http; ``sent`` counts successful requests per address."""

    def __init__(self, options: ToHttpOptions, reactor: Any = None, *, clock: Any = None,
                 http_client: Any = None, rng: random.Random | None = None) -> None:
        super().__init__(reactor)
        self.options = options
        self.clock = clock if clock is not None else self.reactor
        self.rng = rng or random.Random()
        self.config = client_config("nsq_to_http", options.consumer_opts, options.max_in_flight)
        self.headers = parse_headers(options.headers)
        self.addresses = options.addresses
        self.method = "POST" if options.post else "GET"
        self.pool = HostPool(self.addresses, self.clock)
        self.sample = options.sample_rate
        self.user_agent = f"nsq_to_http v{NSQ_VERSION}"
        self._counter = 0
        self._http_client = http_client
        self.sent: dict[str, int] = {a: 0 for a in self.addresses}
        self.failed = 0
        self.skipped = 0
        every = options.status_every
        self.metrics = TimerMetrics(every, "[aggregate]:")
        self.per_address = {a: TimerMetrics(every if len(self.addresses) > 1 else 0, f"[{a}]:")
                            for a in self.addresses}

    def _http(self) -> Any:
        if self._http_client is None:
            from treq.client import HTTPClient
            from twisted.web.client import Agent, HTTPConnectionPool
            pool = HTTPConnectionPool(self.reactor, persistent=True)
            pool.maxPersistentPerHost = self.options.num_publishers
            endpoints = PacedEndpointFactory(self.reactor, self.options.http_client_connect_timeout)
            agent = Agent.usingEndpointFactory(self.reactor, endpoints, pool=pool)
            self._http_client = HTTPClient(agent)
            self._pool = pool
        return self._http_client

    def start(self) -> defer.Deferred:
        from ..client import Consumer

        consumer = Consumer(self.options.topic, self.options.channel, self.handle, self.config,
                            concurrency=self.options.num_publishers, reactor=self.reactor)
        return self.connect(consumer, self.options.nsqd_tcp_addresses, self.options.lookupd_http_addresses)

    # --- handling -------------------------------------------------------------------------------

    def choose(self) -> str:
        if self.options.mode == "round-robin":
            self._counter += 1
            return self.addresses[self._counter % len(self.addresses)]
        return self.pool.get()

    def handle(self, msg: Any) -> defer.Deferred | None:
        if self.sample < 1.0 and self.rng.random() > self.sample:
            self.skipped += 1
            return None
        started = time.monotonic()
        addr = self.choose()
        d = self.publish(addr, msg.body)

        def ok(_: Any) -> None:
            if self.options.mode != "round-robin":
                self.pool.mark(addr, False)
            self.sent[addr] += 1
            self.per_address[addr].status(started)
            self.metrics.status(started)

        def failed(f: Any) -> Any:
            if self.options.mode != "round-robin":
                self.pool.mark(addr, True)
            self.failed += 1
            return f

        return d.addCallbacks(ok, failed)

    def publish(self, addr: str, body: bytes) -> defer.Deferred:
        import treq

        client = self._http()
        headers: dict[bytes, list[bytes]] = {b"User-Agent": [self.user_agent.encode()]}
        for key, value in self.headers.items():
            headers[key.encode()] = [value.encode()]
        if self.method == "POST":
            headers[b"Content-Type"] = [self.options.content_type.encode()]
            d = client.post(addr, data=body, headers=headers)
            good: tuple[int, int] = (200, 300)
        else:
            d = client.get(addr.replace("%s", quote_plus(body, safe=""), 1), headers=headers)
            good = (200, 201)

        def got(response: Any) -> defer.Deferred:
            def check(_: bytes) -> None:
                if not good[0] <= response.code < good[1]:
                    raise HTTPError(f"got status code {response.code}")
            return treq.content(response).addCallback(check)

        d.addCallback(got)
        d.addTimeout(self.options.http_client_request_timeout, self.clock)
        return d

    def _stop(self) -> Any:
        d = self.stop_consumers()

        def close_pool(_: Any) -> Any:
            pool = getattr(self, "_pool", None)
            return pool.closeCachedConnections() if pool is not None else None

        return d.addCallback(close_pool)


def main(argv: list[str] | None = None) -> int:
    """The ``nsq_to_http`` command."""
    return run_app("nsq_to_http", argv, ToHttpOptions, lambda options, reactor: ToHttp(options, reactor))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
