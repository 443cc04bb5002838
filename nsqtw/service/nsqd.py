"""
nsqd's service tree: the one composition root used by twistd, the CLIs and embedding.

:class:`NsqdService` is a ``MultiService`` whose children listen on the TCP,
HTTP and HTTPS addresses, run the queue scan on a ``LoopingCall``, and (when
configured) keep the disk queues synced, talk to nsqlookupd and export stats.
It owns the :class:`~nsqtw.nsqd.broker.Broker` and is the "node" the HTTP API
and TCP glue ask for the time, the current options and to settle work.
"""

from __future__ import annotations

import random
from typing import Any, Callable, List, Optional

import attr
from twisted.application.service import MultiService, Service
from twisted.internet import defer, task
from twisted.logger import Logger

from ..nsqd.broker import Broker, Event
from ..nsqd.scan import ChannelSampler, scan_channels
from ..nsqd.v2 import Features
from ..options import TLS_REQUIRED, NsqdOptions
from ..tcp.nsqd import NsqdFactory
from .listen import ListeningService, format_address

__all__ = ["NsqdService", "build_nsqd"]

log = Logger(namespace="nsqtw.nsqd")


class _LoopService(Service):
    """A LoopingCall on the injected clock that runs while the service runs; a failing
    step is logged and the loop goes on."""

    def __init__(self, clock: Any, interval: float, step: Callable[[], Any], name: str) -> None:
        self.clock = clock
        self.interval = interval
        self.step = step
        self.setName(name)
        self._loop: Optional[task.LoopingCall] = None

    def _safe_step(self) -> None:
        try:
            self.step()
        except Exception:
            log.failure("{name} step failed", name=self.name)

    def startService(self) -> None:
        super().startService()
        self._loop = task.LoopingCall(self._safe_step)
        self._loop.clock = self.clock
        self._loop.start(self.interval, now=False)

    def stopService(self) -> Any:
        super().stopService()
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None
        return None


class NsqdService(MultiService):
    """One nsqd: broker, listeners and timers."""

    def __init__(self, options: NsqdOptions, reactor: Any, *, rng: Optional[random.Random] = None) -> None:
        super().__init__()
        self.options = options
        self.reactor = reactor
        self.rng = rng or random.Random()
        self.broker = Broker(options, reactor.seconds(), backend_factory=self._backend_factory(),
                             rng=self.rng)
        self.features = Features(tls=False, snappy=False, deflate=False)
        self.tcp_factory = NsqdFactory(self.broker, reactor, features=self.features,
                                       settle=self.settle)
        self._settle_call: Any = None
        self._sampler = ChannelSampler(self.broker.channels, options.queue_scan_refresh_interval)
        self.broker.listeners.append(self._on_event)
        self.tcp_listener = ListeningService(reactor, options.tcp_address, self.tcp_factory, "TCP", "tcp-address")
        self.tcp_listener.setServiceParent(self)
        self.http_listener: Optional[ListeningService] = None
        self.https_listener: Optional[ListeningService] = None
        if options.http_address:
            from twisted.web.server import Site
            from ..http.nsqd_api import NsqdHTTPAPI
            api = NsqdHTTPAPI(self, tls_only_http=options.tls_required == TLS_REQUIRED)
            site = Site(api.resource())
            site.noisy = False
            site.displayTracebacks = False
            self.http_listener = ListeningService(reactor, options.http_address, site, "HTTP", "http-address")
            self.http_listener.setServiceParent(self)
        _LoopService(reactor, options.queue_scan_interval, self.scan_once, "queue-scan").setServiceParent(self)

    # --- what the glue asks of the node ------------------------------------------

    def now(self) -> float:
        return self.reactor.seconds()

    def settle(self) -> None:
        """Deliver and write everything that became possible; keep pumping big backlogs."""
        broker = self.broker
        broker.settle(self.reactor.seconds())
        if broker.busy() and self._settle_call is None:
            self._settle_call = self.reactor.callLater(0, self._settle_again)

    def _settle_again(self) -> None:
        self._settle_call = None
        self.settle()

    def scan_once(self) -> None:
        now = self.reactor.seconds()
        opts = self.options
        scan_channels(self._sampler.channels(now), now, self.rng,
                      opts.queue_scan_selection_count, opts.queue_scan_dirty_percent)
        self.settle()

    def _on_event(self, event: str, topic: str, channel: Optional[str]) -> None:
        if event in (Event.CHANNEL_CREATED, Event.CHANNEL_DELETED, Event.TOPIC_DELETED):
            self._sampler.stale = True

    def persist_metadata(self) -> None:
        """Write nsqd.dat now (pause and unpause are persisted at once, as nsqd does)."""

    def set_options(self, **changes: Any) -> None:
        self.options = attr.evolve(self.options, **changes)
        self.broker.options = self.options

    def set_lookupd_addresses(self, addresses: List[str]) -> None:
        self.set_options(lookupd_tcp_addresses=list(addresses))

    def _backend_factory(self) -> Any:
        from ..nsqd.broker import memory_only_backends
        return memory_only_backends

    # --- addresses ------------------------------------------------------------

    @property
    def tcp_port(self) -> Optional[int]:
        return self.tcp_listener.bound_port

    @property
    def http_port(self) -> Optional[int]:
        return self.http_listener.bound_port if self.http_listener else None

    @property
    def https_port(self) -> Optional[int]:
        return self.https_listener.bound_port if self.https_listener else None

    def ready(self) -> defer.Deferred:
        """Fires (with this service) once every listener is bound."""
        waits = [s.ready for s in (self.tcp_listener, self.http_listener, self.https_listener) if s is not None]
        d = defer.gatherResults(waits, consumeErrors=True)
        d.addCallback(lambda _: self)
        return d

    # --- lifecycle --------------------------------------------------------------

    def stopService(self) -> defer.Deferred:
        """nsqd's Exit: stop listening, close every client, then stop the rest."""
        self.broker.close()
        for proto in list(self.tcp_factory.protocols):
            proto.transport.loseConnection()
        if self._settle_call is not None and self._settle_call.active():
            self._settle_call.cancel()
        self._settle_call = None
        return defer.maybeDeferred(super().stopService)


def build_nsqd(options: NsqdOptions, reactor: Any) -> NsqdService:
    return NsqdService(options, reactor)
