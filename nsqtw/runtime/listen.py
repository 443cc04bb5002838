"""Listening on an address given NSQ-style (``host:port`` or a unix socket path)."""

from __future__ import annotations

import socket
from typing import Any
from collections.abc import Callable

from twisted.application.service import Service
from twisted.internet import defer
from twisted.internet.interfaces import IListeningPort
from twisted.logger import Logger
from twisted.python.failure import Failure

from ..options import split_host_port
from .address import format_peer

__all__ = ["ListeningService", "ListenError", "LazyFactory", "enable_warm_up_threads",
           "endpoint_description", "format_address", "format_peer", "split_host_port"]



def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace(":", "\\:").replace("=", "\\=")


def endpoint_description(address: str, flag: str = "address") -> str:
    """``"127.0.0.1:4150"`` -> a Twisted server endpoint string (unix paths too)."""
    if ":" not in address and "/" in address:
        return f"unix:address={_escape(address)}:backlog={socket.SOMAXCONN}"
    host, port = split_host_port(address, flag)
    if host in ("", "*"):
        host = "0.0.0.0"
    # a burst of connects must not overflow the accept queue (Twisted's default backlog is 50;
    # Go listens with SOMAXCONN)
    return f"tcp:port={port}:interface={_escape(host)}:backlog={socket.SOMAXCONN}"


def format_address(port: Any) -> str:
    """The bound address of a listening port, as nsqd logs it."""
    return format_peer(port.getHost())


#: standalone daemons import slow modules in a warm-up thread; embedded brokers never do, since an
#: application's (or pytest's) import hooks need not be thread-safe: CPython 3.11's ``ast`` keeps
#: its recursion depth per interpreter, and pytest rewriting two modules at once in two threads
#: fails with "AST constructor recursion depth mismatch"; and a thread importing after start
#: holds the GIL while the host's reactor should run
_WARM_UP_THREADS = False


def enable_warm_up_threads() -> None:
    """Part of the daemons' process policy (:func:`nsqtw.runtime.process.apply_daemon_policy`)."""
    global _WARM_UP_THREADS
    _WARM_UP_THREADS = True


class LazyFactory:
    """A server factory a daemon builds after start-up: the port is bound (and logged) at
    start, while what serves it (say the HTTP API, whose web framework takes 60-100 ms to
    import) is built when the first connection arrives, or as soon as ``warm`` (the slow
    imports) has run.

    In a daemon of nsqtw's own (warm-up threads enabled by its process policy) ``warm`` runs in
    a short-lived thread started with the listener: the imports proceed while the reactor waits
    for its first connections (it holds the GIL only between their reads), so a client of the
    TCP port is answered at once instead of after the HTTP imports; without ``warm`` the factory
    is built in the reactor turn after start-up.  Anywhere else (an embedded broker) it is
    built when the listener starts, so the cost falls inside the start (``start_nsqd``), never
    on the host's reactor after it."""

    def __init__(self, build: Callable[[], Any], prefix: str = "Site",
                 warm: Callable[[], Any] | None = None) -> None:
        self._build: Callable[[], Any] | None = build
        self._prefix = prefix
        self._warm = warm
        self._factory: Any = None
        self.noisy = False

    def build(self) -> Any:
        if self._factory is None and self._build is not None:
            build, self._build = self._build, None
            self._factory = build()
        return self._factory

    def doStart(self) -> None:
        pass

    def warm_up(self, reactor: Any) -> None:
        """Build it now (embedded), or start building it off the start-up path (a daemon; see
        the class docstring)."""
        warm, self._warm = self._warm, None
        if not _WARM_UP_THREADS:
            self.build()
            return
        if warm is None or not hasattr(reactor, "callFromThread"):
            reactor.callLater(0, self.build)
            return
        import threading

        def run() -> None:
            try:
                warm()
            except BaseException:  # pragma: no cover - the build in the reactor reports it
                pass
            reactor.callFromThread(self.build)

        threading.Thread(target=run, name="nsqtw-warm-up", daemon=True).start()

    def doStop(self) -> None:
        if self._factory is not None:
            self._factory.doStop()

    def buildProtocol(self, addr: Any) -> Any:
        factory = self._factory
        if factory is None:
            factory = self.build()
            factory.doStart()
        return factory.buildProtocol(addr)

    def logPrefix(self) -> str:
        return self._prefix  # what twisted.web's Site calls itself in "... starting on <port>"


def _listen(reactor: Any, address: str, factory: Any, flag: str) -> defer.Deferred:
    """Listen as the endpoint strings of :func:`endpoint_description` would, without importing
    the endpoints machinery (it pulls in TLS and much more, and start-up time counts)."""
    try:
        if ":" not in address and "/" in address:
            port = reactor.listenUNIX(address, factory, backlog=socket.SOMAXCONN)
        else:
            host, num = split_host_port(address, flag)
            if host in ("", "*"):
                host = "0.0.0.0"
            port = reactor.listenTCP(num, factory, backlog=socket.SOMAXCONN, interface=host)
    except Exception:
        return defer.fail()
    if isinstance(factory, LazyFactory):
        factory.doStart()
        try:
            factory.warm_up(reactor)  # embedded: builds it now, inside the start
        except Exception:
            failure = Failure()
            port.stopListening()
            return defer.fail(failure)
    return defer.succeed(port)


class ListenError(Exception):
    """A listener could not bind; its text is nsqd's (``listen (<addr>) failed - listen tcp
    <addr>: bind: address already in use``)."""

    def __init__(self, address: str, cause: BaseException) -> None:
        self.address = address
        self.cause = cause
        super().__init__(f"listen ({address}) failed - {_go_listen_error(address, cause)}")


def _go_listen_error(address: str, cause: BaseException) -> str:
    """Go's ``net.OpError`` text for a failed listen."""
    err = getattr(cause, "socketError", None) or cause
    text = getattr(err, "strerror", None) or str(err)
    text = text[:1].lower() + text[1:] if text else text
    if ":" not in address and "/" in address:
        return f"listen unix {address}: bind: {text}"
    return f"listen tcp {address}: bind: {text}"


class ListeningService(Service):
    """Listen on ``address`` while running; ``port`` is the bound port, ``ready`` fires with it.

    ``factory`` may be a :class:`LazyFactory`."""

    def __init__(self, reactor: Any, address: str, factory: Any, label: str, flag: str,
                 endpoint: Any = None) -> None:
        self.reactor = reactor
        self.address = address
        self.factory = factory
        self.label = label
        self.flag = flag
        self.endpoint = endpoint
        self.port: IListeningPort | None = None
        self.ready: defer.Deferred = defer.Deferred()

    def startService(self) -> None:
        super().startService()
        if self.endpoint is not None:
            factory = self.factory.build() if isinstance(self.factory, LazyFactory) else self.factory
            d = self.endpoint.listen(factory)
        else:
            d = _listen(self.reactor, self.address, self.factory, self.flag)

        def listening(port: IListeningPort) -> IListeningPort:
            self.port = port
            # in the namespace of the daemon it belongs to, so a process running several of them
            # says whose port it is (``[nsqlookupd] ... TCP: listening on ...``)
            daemon_log = Logger(namespace=getattr(self.parent, "log_namespace", "nsqtw"))
            daemon_log.info("{label}: listening on {address}", label=self.label, address=format_address(port))
            return port

        def failed(f: Any) -> Any:
            # nsqd's words: "listen (127.0.0.1:4150) failed - listen tcp 127.0.0.1:4150: bind: ..."
            return Failure(ListenError(self.address, f.value))

        d.addCallbacks(listening, failed)
        result: list[Any] = []

        def keep(r: Any) -> Any:
            result.append(r)
            return r

        d.addBoth(keep)
        if result and isinstance(result[0], Failure):
            # TCP and unix endpoints fail at once: make startService fail, so twistd, the
            # drop-in commands and start_nsqd all refuse to run half bound; the failure is
            # reported once, by whoever started the service (no "Unhandled error in Deferred")
            d.addErrback(lambda f: None)
            self.ready.errback(result[0])
            self.ready.addErrback(lambda f: None)
            result[0].raiseException()
        d.chainDeferred(self.ready)

    def stopService(self) -> Any:
        super().stopService()
        port, self.port = self.port, None
        if port is not None:
            return port.stopListening()
        return None

    @property
    def bound_port(self) -> int | None:
        if self.port is None:
            return None
        return getattr(self.port.getHost(), "port", None)

    @property
    def bound_host(self) -> str:
        """The host the port is bound to (the listener must be listening)."""
        port: Any = self.port
        host: str = port.getHost().host
        return host
