"""
nsqlookupd's service tree: the one composition root used by twistd, the CLI and embedding.

:class:`LookupdService` is a ``MultiService`` holding the RegistrationDB and
two listeners: TCP protocol V1 for nsqd and the HTTP API.  It is also the
"node" the TCP glue and the HTTP API ask for the time, the options and the
bound ports that IDENTIFY answers report.  All state is in memory, as in
nsqlookupd; stopping closes every nsqd connection first, so each nsqd notices
and re-registers with whatever nsqlookupd it reaches next.
"""

from __future__ import annotations

import socket
from typing import Any

from twisted.application.service import MultiService
from twisted.internet import defer
from twisted.logger import Logger

from .. import version_line
from .options import LookupdOptions
from .core.registry import RegistrationDB
from .tcp import LookupdFactory
from ..runtime.listen import ListeningService

__all__ = ["LookupdService", "build_lookupd"]

log = Logger(namespace="nsqtw.lookupd")


class LookupdService(MultiService):
    """One nsqlookupd: registrations, the TCP listener and the HTTP listener."""

    #: where its listeners log "TCP: listening on ..." (the daemon a line belongs to)
    log_namespace = "nsqtw.lookupd"

    def __init__(self, options: LookupdOptions, reactor: Any, *, clock: Any = None) -> None:
        super().__init__()
        from ..runtime.responses import GoAccessLog, go_site
        from .http import LookupdHTTPAPI

        self.options = options
        self.reactor = reactor
        #: the time source for last_update, tombstones and the activity filters (tests pass a Clock)
        self.clock = clock if clock is not None else reactor
        self.db = RegistrationDB()
        self.hostname = socket.gethostname()
        self.tcp_factory = LookupdFactory(self.db, self, self.clock)
        self.tcp_listener = ListeningService(reactor, options.tcp_address, self.tcp_factory, "TCP",
                                             "tcp-address")
        self.tcp_listener.setServiceParent(self)
        # Go's nsqlookupd logs every HTTP answer at INFO (http_api.Log)
        site = go_site(LookupdHTTPAPI(self).resource(), reactor, GoAccessLog("nsqtw.lookupd.http"))
        self.http_listener = ListeningService(reactor, options.http_address, site, "HTTP", "http-address")
        self.http_listener.setServiceParent(self)

    # --- what the glue and the API ask of the node ------------------------------------

    def now(self) -> float:
        return float(self.clock.seconds())

    @property
    def broadcast_address(self) -> str:
        return self.options.broadcast_address

    @property
    def tcp_port(self) -> int | None:
        return self.tcp_listener.bound_port

    @property
    def http_port(self) -> int | None:
        return self.http_listener.bound_port

    def ready(self) -> defer.Deferred:
        """Fires (with this service) once both listeners are bound."""
        d = defer.gatherResults([self.tcp_listener.ready, self.http_listener.ready], consumeErrors=True)
        d.addCallback(lambda _: self)
        return d

    # --- lifecycle ------------------------------------------------------------------------

    def startService(self) -> None:
        log.info("{version}", version=version_line("nsqlookupd"))
        super().startService()

    def stopService(self) -> defer.Deferred:
        """nsqlookupd's Exit: close every nsqd connection, then stop listening."""
        closing = self.tcp_factory.close_all()
        stopping = defer.maybeDeferred(super().stopService)
        return defer.gatherResults([closing, stopping], consumeErrors=True)


def build_lookupd(options: LookupdOptions, reactor: Any, *, clock: Any = None) -> LookupdService:
    return LookupdService(options, reactor, clock=clock)
