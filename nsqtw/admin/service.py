"""
nsqadmin's service tree: the HTTP listener, the ``/stats`` history poller and the action notifier.

:class:`AdminService` is the one composition root used by ``twistd nsqadmin``,
embedding (:func:`nsqtw.embed.start_nsqadmin`) and tests.  It owns the
current options (``PUT /config`` swaps them), the outgoing HTTP client (treq
over an ``Agent`` with nsqadmin's connect timeout and TLS settings; it can be
injected), the :class:`~nsqtw.admin.cluster.ClusterInfo` and the
:class:`~nsqtw.admin.history.History` the pages draw graphs from.
"""

from __future__ import annotations

import json
import os
import socket
from typing import Any, cast

from twisted.application.service import MultiService, Service
from twisted.internet import defer, task, threads
from twisted.logger import Logger
from twisted.python.failure import Failure
from typing import Any as HTTPRequest  # an IRequest (zope interfaces do not type-check without a mypy plugin)

from .. import NSQ_VERSION, __version__
from .app import AdminHTTPAPI
from .cluster import ClusterInfo, UpstreamError, Upstream, join_host_port, warning_message
from .history import History
from .nodes import NodeBook
from .options import AdminOptions, split_upstream
from ..options import OptionError, option_fields
from ..runtime.listen import ListeningService

__all__ = ["AdminService", "build_admin", "make_http_client", "HistoryPoller"]

log = Logger(namespace="nsqtw.admin")


def _read(path: str, flag: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise OptionError(f"failed to read --{flag} {path} - {e.strerror or e}") from None


def tls_policy(options: AdminOptions) -> Any:
    """The ``IPolicyForHTTPS`` for https upstreams and notification endpoints (``--http-client-tls-*``)."""
    from OpenSSL import SSL
    from twisted.internet import ssl
    from twisted.web.client import BrowserLikePolicyForHTTPS
    from twisted.web.iweb import IPolicyForHTTPS
    from zope.interface import implementer

    client_cert = None
    if options.http_client_tls_cert:
        pem = _read(options.http_client_tls_cert, "http-client-tls-cert") + b"\n" + _read(
            options.http_client_tls_key, "http-client-tls-key")
        try:
            client_cert = ssl.PrivateCertificate.loadPEM(pem)
        except Exception as e:
            raise OptionError(f"failed to LoadX509KeyPair {options.http_client_tls_cert}, "
                              f"{options.http_client_tls_key} - {e}") from None
    trust_root = None
    if options.http_client_tls_root_ca_file:
        try:
            trust_root = ssl.Certificate.loadPEM(_read(options.http_client_tls_root_ca_file,
                                                       "http-client-tls-root-ca-file"))
        except OptionError:
            raise
        except Exception as e:
            raise OptionError(f"failed to AppendCertsFromPEM {options.http_client_tls_root_ca_file} - {e}") from None

    if options.http_client_tls_insecure_skip_verify:
        # cryptography objects: pyOpenSSL deprecates passing its own X509 and PKey
        context_options = (ssl.CertificateOptions(privateKey=client_cert.privateKey.original.to_cryptography_key(),
                                                  certificate=client_cert.original.to_cryptography(), verify=False)
                           if client_cert is not None else ssl.CertificateOptions(verify=False))

        @implementer(IPolicyForHTTPS)
        class _Insecure:
            def creatorForNetloc(self, hostname: bytes, port: int) -> Any:
                return _InsecureCreator(context_options.getContext(), hostname.decode("idna"))

        from twisted.internet.interfaces import IOpenSSLClientConnectionCreator

        @implementer(IOpenSSLClientConnectionCreator)
        class _InsecureCreator:
            def __init__(self, ctx: Any, hostname: str) -> None:
                self.ctx = ctx
                self.hostname = hostname

            def clientConnectionForTLS(self, tls_protocol: Any) -> Any:
                conn = SSL.Connection(self.ctx, None)
                conn.set_app_data(tls_protocol)
                conn.set_tlsext_host_name(self.hostname.encode("idna"))
                return conn

        return _Insecure()

    if trust_root is None and client_cert is None:
        return BrowserLikePolicyForHTTPS()

    @implementer(IPolicyForHTTPS)
    class _Verified:
        def creatorForNetloc(self, hostname: bytes, port: int) -> Any:
            return ssl.optionsForClientTLS(hostname.decode("idna"), trustRoot=trust_root,
                                           clientCertificate=client_cert)

    return _Verified()


def make_http_client(reactor: Any, options: AdminOptions) -> Any:
    """treq over an ``Agent`` with nsqadmin's connect timeout and TLS policy (no keep-alive)."""
    from treq.client import HTTPClient
    from twisted.web.client import Agent, HTTPConnectionPool, _HTTP11ClientFactory

    class _QuietFactory(_HTTP11ClientFactory):
        noisy = False  # no "Starting factory" log line for every poll of every nsqd

    pool = HTTPConnectionPool(reactor, persistent=False)
    pool._factory = _QuietFactory
    endpoints = _UpstreamEndpoints(reactor, tls_policy(options), options.http_client_connect_timeout)
    agent = Agent.usingEndpointFactory(reactor, endpoints, pool=pool)
    return HTTPClient(cast(Any, agent))  # an Agent is an IAgent


class _UpstreamEndpoints:
    """The Agent's endpoints: an upstream given as an IP address (``127.0.0.1:4151``, the usual
    case) is connected to directly; only a host name goes through the reactor's resolver, which
    looks names up in the reactor's thread pool (so an embedded nsqadmin polling loopback
    upstreams starts no thread in its host)."""

    def __init__(self, reactor: Any, policy: Any, timeout: float) -> None:
        self.reactor = reactor
        self.policy = policy
        self.timeout = timeout

    def endpointForURI(self, uri: Any) -> Any:  # noqa: N802 - Twisted's IAgentEndpointFactory
        from twisted.internet.abstract import isIPAddress, isIPv6Address
        from twisted.internet.endpoints import (HostnameEndpoint, TCP4ClientEndpoint, TCP6ClientEndpoint,
                                                wrapClientTLS)

        host = uri.host.decode("ascii").strip("[]")
        endpoint: Any
        if isIPAddress(host):
            endpoint = TCP4ClientEndpoint(self.reactor, host, uri.port, timeout=self.timeout)
        elif isIPv6Address(host):
            endpoint = TCP6ClientEndpoint(self.reactor, host, uri.port, timeout=self.timeout)
        else:
            endpoint = HostnameEndpoint(self.reactor, uri.host, uri.port, timeout=self.timeout)
        if uri.scheme == b"https":
            endpoint = wrapClientTLS(self.policy.creatorForNetloc(uri.host, uri.port), endpoint)
        return endpoint


def check_resolvable(options: AdminOptions) -> None:
    """nsqadmin refuses to start when an upstream address does not resolve."""
    for flag, addresses in (("lookupd-http-address", options.lookupd_http_addresses),
                            ("nsqd-http-address", options.nsqd_http_addresses)):
        for address in addresses:
            _, hostport = split_upstream(address, flag)
            host, _, port = hostport.rpartition(":")
            try:
                socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)
            except (OSError, ValueError) as e:
                raise OptionError(f"failed to resolve --{flag} ({address}) - {e}") from None


class HistoryPoller(Service):
    """Samples every nsqd's ``/stats`` into the history every ``--history-interval`` (injected clock)."""

    name = "history"  # type: ignore[assignment]  # Twisted's Service declares name = None (unannotated)

    def __init__(self, node: AdminService, interval: float) -> None:
        self.node = node
        self.interval = interval
        self._loop: task.LoopingCall | None = None
        self._running_poll: defer.Deferred | None = None

    def startService(self) -> None:
        super().startService()
        self._loop = task.LoopingCall(self._tick)
        self._loop.clock = self.node.clock
        self._loop.start(self.interval, now=True)

    def _tick(self) -> defer.Deferred | None:
        if self._running_poll is not None:
            return None
        return self.poll_once()

    def poll_once(self) -> defer.Deferred:
        """One sample now; fires when it is recorded (failures are logged, never raised)."""
        d = defer.ensureDeferred(self._poll())
        self._running_poll = d

        def done(result: Any) -> None:
            if self._running_poll is d:
                self._running_poll = None
            if isinstance(result, Failure) and not result.check(defer.CancelledError):
                log.failure("history poll failed", result)
            return None

        d.addBoth(done)
        return d

    async def _poll(self) -> None:
        ci = self.node.cluster
        now = self.node.clock.seconds()
        try:
            producers, errors = await ci.producers(patient=True)  # a poll waits for every node
        except UpstreamError as e:
            # nothing answered: a gap in every series, never the last values frozen as current
            self._report(f"UPSTREAM_ERROR: {e}")
            self.node.history.record(now, [], self.node.history.message,
                                     failed=[s.address for s in ci.book.nodes.values()])
            return
        try:
            topics, _, errs, failed = await ci.nsqd_stats_failed(producers, "", "", False, patient=True)
        except UpstreamError as e:
            self._report(f"UPSTREAM_ERROR: {e}")
            self.node.history.record(now, [], self.node.history.message,
                                     failed=[p.http_address for p in producers])
            return
        message = warning_message(list(errors) + list(errs))
        self._report(message)
        ci.book.forget()
        # only nodes asked and silent make gaps: one that left nsqlookupd (gone) is not asked any more,
        # and its topics' totals go on over the nodes that remain, marked partial in the charts
        gone = [st.address for st in ci.book.failing() if st.status == "gone"]
        self.node.history.record(now, topics, message, failed=failed, gone=gone)
        self.node.recorded()

    def _report(self, message: str) -> None:
        """Log a poll problem when it starts or changes, not every interval."""
        history = self.node.history
        if message and message != history.message:
            log.warn("history poll: {message}", message=message)
        elif not message and history.message:
            log.info("history poll: every upstream answers again")
        history.message = message

    def stopService(self) -> Any:
        super().stopService()
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None
        running, self._running_poll = self._running_poll, None
        if running is not None:
            running.cancel()
        return None


class AdminService(MultiService):
    """One nsqadmin: the web UI and API, the history poller and the notifier."""

    #: where its listener logs "HTTP: listening on ..." (the daemon a line belongs to)
    log_namespace = "nsqtw.admin"

    def __init__(self, options: AdminOptions, reactor: Any, *, http_client: Any = None,
                 hostname: str | None = None) -> None:
        super().__init__()
        self.options = options
        self.reactor = reactor
        self.clock = reactor
        self.hostname = hostname or socket.gethostname()
        self.http_client = http_client if http_client is not None else make_http_client(reactor, options)
        self.upstream = Upstream(self.http_client, reactor, options.http_client_request_timeout,
                                 f"nsqadmin/{NSQ_VERSION} (nsqtw {__version__})")
        self.history = History(options.history_size, options.history_interval, options.history_retention)
        # a node that went away is still shown for as long as the charts reach back
        self.cluster = ClusterInfo(self.upstream, self._addresses, reactor,
                                   NodeBook(reactor, retention=self.history.retention))
        self._notifications: set[defer.Deferred] = set()
        for name in ("statsd_prefix", "statsd_counter_format", "statsd_gauge_format", "statsd_interval"):
            field = {f.name: f for f in option_fields(AdminOptions)}[name]
            if getattr(options, name) != field.default:
                log.info("--{flag} is accepted but only matters for graphite; nsqtw's graphs come from its own "
                         "/stats history", flag=field.metadata["flag"])

        from twisted.web.server import Site
        self.api = AdminHTTPAPI(self)
        site = Site(self.api.resource())
        site.noisy = False
        site.displayTracebacks = False
        self.http_listener = ListeningService(reactor, options.http_address, site, "HTTP", "http-address")
        self.http_listener.setServiceParent(self)
        self.poller = HistoryPoller(self, options.history_interval)
        self.poller.setServiceParent(self)
        #: --history-path: the file the history is kept in across restarts ("" when not kept)
        self.history_file = ""
        self._saving: defer.Deferred | None = None
        self._unsaved = 0
        #: save after this many new samples (about every 30 s)
        self.save_every = max(1, round(30.0 / options.history_interval))
        if options.history_path:
            self.history_file = os.path.join(options.history_path, HISTORY_FILE)
            self._load_history()

    # --- the history on disk (--history-path) --------------------------------------------

    def _load_history(self) -> None:
        path = self.options.history_path
        if not os.path.isdir(path):
            raise OptionError(f"--history-path {path}: not a directory")
        if not os.access(path, os.W_OK):
            raise OptionError(f"--history-path {path}: not writable")
        try:
            with open(self.history_file, encoding="utf-8") as f:
                doc = json.load(f)
        except FileNotFoundError:
            return
        except (OSError, ValueError) as e:
            log.warn("--history-path: could not read {file} ({error}); starting with an empty history",
                     file=self.history_file, error=e)
            return
        try:
            n = self.history.load_doc(doc, float(self.clock.seconds()))
        except (ValueError, KeyError, TypeError, IndexError) as e:
            log.warn("--history-path: {file} is not a history nsqadmin can read ({error}); starting empty",
                     file=self.history_file, error=e)
            return
        log.info("history: {n} samples read from {file}", n=n, file=self.history_file)

    def recorded(self) -> None:
        """A sample was recorded: save every ``save_every`` of them."""
        self._unsaved += 1
        if self.history_file and self._unsaved >= self.save_every:
            self.save_history()

    def save_history(self) -> defer.Deferred:
        """Write the history to ``--history-path`` in a thread (the reactor only takes the snapshot);
        one write at a time.  Fires when written (errors are logged, never raised)."""
        if not self.history_file:
            return defer.succeed(None)
        if self._saving is not None:
            return self._saving
        self._unsaved = 0
        snapshot = self.history.snapshot()
        d = threads.deferToThreadPool(self.reactor, self.reactor.getThreadPool(), _write_history,
                                      self.history_file, self.history, snapshot)

        def done(result: Any) -> None:
            self._saving = None
            if isinstance(result, Failure):
                log.warn("--history-path: could not write {file} ({error})", file=self.history_file,
                         error=result.getErrorMessage())
        d.addBoth(done)
        self._saving = d
        return d

    def _addresses(self) -> tuple[list[str], list[str]]:
        return list(self.options.lookupd_http_addresses), list(self.options.nsqd_http_addresses)

    def set_options(self, **changes: Any) -> None:
        """Swap in changed options (``PUT /config/:opt``); invalid combinations raise OptionError."""
        self.options = self.options.replace(**changes)

    # --- notifications ------------------------------------------------------------------

    def notification(self, action: str, topic: str, channel: str, node: str, request: HTTPRequest) -> dict[str, Any]:
        """nsqadmin's ``AdminAction`` for one request (``channel``, ``node`` and ``user`` omitted when empty)."""
        secure = request.isSecure() or (request.getHeader(b"X-Scheme") or b"").lower() == b"https"
        host = (request.getHeader(b"Host") or b"").decode("latin-1")
        client = request.getClientAddress()
        remote = (join_host_port(client.host, client.port) if getattr(client, "host", None) is not None
                  else str(getattr(client, "name", "") or ""))
        user = (request.getUser() or b"").decode("utf-8", "replace")
        doc: dict[str, Any] = {"action": action, "topic": topic}
        if channel:
            doc["channel"] = channel
        if node:
            doc["node"] = node
        doc["timestamp"] = int(self.clock.seconds())
        if user:
            doc["user"] = user
        doc["remote_ip"] = remote
        doc["user_agent"] = (request.getHeader(b"User-Agent") or b"").decode("utf-8", "replace")
        doc["url"] = f"{'https' if secure else 'http'}://{host}{request.uri.decode('latin-1')}"
        doc["via"] = self.hostname
        return doc

    def notify(self, action: str, topic: str, channel: str, node: str, request: HTTPRequest) -> None:
        """POST the action to ``--notification-http-endpoint`` in the background."""
        endpoint = self.options.notification_http_endpoint
        if not endpoint:
            return
        body = json.dumps(self.notification(action, topic, channel, node, request), separators=(",", ":")).encode()

        async def post() -> None:
            log.info("POSTing notification to {endpoint}", endpoint=endpoint)
            response = await self.http_client.post(endpoint, data=body,
                                                   headers={b"Content-Type": [b"application/json"]})
            await response.content()
            if response.code >= 300:
                log.warn("notification POST to {endpoint} got {code}", endpoint=endpoint, code=response.code)

        d = defer.ensureDeferred(post())
        d.addTimeout(self.options.http_client_request_timeout, self.clock)
        self._notifications.add(d)

        def done(result: Any) -> None:
            self._notifications.discard(d)
            if isinstance(result, Failure) and not result.check(defer.CancelledError):
                log.error("failed to POST notification - {err}", err=result.getErrorMessage())

        d.addBoth(done)

    # --- addresses and lifecycle ------------------------------------------------------------

    @property
    def http_port(self) -> int | None:
        return self.http_listener.bound_port

    def ready(self) -> defer.Deferred:
        """Fires (with this service) once the HTTP listener is bound."""
        d = defer.gatherResults([self.http_listener.ready], consumeErrors=True)
        d.addCallback(lambda _: self)
        return d

    def stopService(self) -> defer.Deferred:
        for d in list(self._notifications):
            d.cancel()
        d = defer.maybeDeferred(super().stopService)
        if self.history_file:
            # the newest samples too: a restart goes on where this one stopped
            async def last_save(_: Any) -> None:
                if self._saving is not None:
                    await self._saving
                await self.save_history()
            d.addCallback(lambda r: defer.ensureDeferred(last_save(r)))
        return d


#: the file under ``--history-path``
HISTORY_FILE = "nsqadmin.history.json"


def _write_history(path: str, history: History, snapshot: Any) -> None:
    """(In a thread.) The history as JSON, replacing ``path`` in one rename."""
    data = json.dumps(history.to_doc(snapshot), separators=(",", ":"))
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(data)
    os.replace(tmp, path)


def build_admin(options: AdminOptions, reactor: Any, **kwargs: Any) -> AdminService:
    """The nsqadmin service tree (addresses must resolve, TLS files must load)."""
    check_resolvable(options)
    return AdminService(options, reactor, **kwargs)
