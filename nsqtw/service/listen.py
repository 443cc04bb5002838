"""Listening on an address given NSQ-style (``host:port`` or a unix socket path)."""

from __future__ import annotations

import socket
from typing import Any, Optional

from twisted.application.service import Service
from twisted.internet import defer
from twisted.internet.endpoints import serverFromString
from twisted.internet.interfaces import IListeningPort
from twisted.logger import Logger
from twisted.python.failure import Failure

from ..options import split_host_port

__all__ = ["ListeningService", "endpoint_description", "format_address", "format_peer", "split_host_port"]

log = Logger(namespace="nsqtw")


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


def format_peer(addr: Any) -> str:
    """A remote address as Go's ``net.Addr.String()`` writes it (``ip:port``, ``[v6]:port``)."""
    host = getattr(addr, "host", None)
    port = getattr(addr, "port", None)
    if host is None:
        return str(getattr(addr, "name", "") or "unix")
    if ":" in host:
        return f"[{host}]:{port}"
    return f"{host}:{port}"


def format_address(port: Any) -> str:
    """The bound address of a listening port, as nsqd logs it."""
    return format_peer(port.getHost())


class ListeningService(Service):
    """Listen on ``address`` while running; ``port`` is the bound port, ``ready`` fires with it."""

    def __init__(self, reactor: Any, address: str, factory: Any, label: str, flag: str,
                 endpoint: Any = None) -> None:
        self.reactor = reactor
        self.address = address
        self.factory = factory
        self.label = label
        self.flag = flag
        self.endpoint = endpoint
        self.port: Optional[IListeningPort] = None
        self.ready: defer.Deferred = defer.Deferred()

    def startService(self) -> None:
        super().startService()
        endpoint = self.endpoint or serverFromString(self.reactor, endpoint_description(self.address, self.flag))
        d = endpoint.listen(self.factory)

        def listening(port: IListeningPort) -> IListeningPort:
            self.port = port
            log.info("{label}: listening on {address}", label=self.label, address=format_address(port))
            return port

        def failed(f: Any) -> Any:
            log.error("{label}: listen ({address}) failed - {err}", label=self.label,
                      address=self.address, err=f.getErrorMessage())
            return f

        d.addCallbacks(listening, failed)
        result: list = []
        d.addBoth(lambda r: result.append(r) or r)
        if result and isinstance(result[0], Failure):
            # TCP and unix endpoints fail at once: make startService fail, so twistd, the
            # drop-in commands and start_nsqd all refuse to run half bound
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
    def bound_port(self) -> Optional[int]:
        if self.port is None:
            return None
        return getattr(self.port.getHost(), "port", None)
