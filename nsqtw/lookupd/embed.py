"""
Running nsqlookupd inside an application's or a test's reactor.

::

    from nsqtw.lookupd.embed import start_nsqlookupd

    lookupd = await start_nsqlookupd()        # 127.0.0.1, ports chosen by the OS
    nsqd = await start_nsqd(lookupd_tcp_addresses=[lookupd.tcp_address])
    ...
    await lookupd.stop()

Options are nsqlookupd's, by attribute name (``tombstone_lifetime=5.0``) or as
a :class:`~nsqtw.lookupd.options.LookupdOptions`.  The embedded default
broadcast address is ``127.0.0.1`` (not the hostname), so an nsqd on the same
machine can always reach the HTTP API it is told about in IDENTIFY.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import attr
from twisted.internet import defer

from .options import LookupdOptions
from ..options import with_embedding_defaults
from ..runtime.reactor import Clock, ListeningReactor, resolve_reactor

if TYPE_CHECKING:
    from .core.registry import RegistrationDB
    from .service import LookupdService

__all__ = ["start_nsqlookupd", "LookupdHandle", "EMBEDDED_LOOKUPD_DEFAULTS"]


@attr.s(eq=False)
class LookupdHandle:
    """A running embedded nsqlookupd; its addresses stay readable after stop (to restart on them)."""

    _service: LookupdService = attr.ib()
    tcp_port: int = attr.ib(default=0)
    http_port: int = attr.ib(default=0)
    host: str = attr.ib(default="")
    http_host: str = attr.ib(default="")

    @classmethod
    def of(cls, service: LookupdService) -> LookupdHandle:
        """The handle of a service that already listens (used by :func:`start_nsqlookupd`)."""
        # the ports are bound: a handle is made once its service listens
        return cls(service, cast(int, service.tcp_port), cast(int, service.http_port),
                   service.tcp_listener.bound_host, service.http_listener.bound_host)

    @property
    def _db(self) -> RegistrationDB:
        return self._service.db

    @property
    def options(self) -> LookupdOptions:
        """The options the nsqlookupd runs with (the embedding defaults applied)."""
        return self._service.options

    @property
    def tcp_address(self) -> str:
        """``host:port`` of the TCP listener, for nsqd's ``--lookupd-tcp-address``."""
        return f"{self.host}:{self.tcp_port}"

    @property
    def http_address(self) -> str:
        """``host:port`` of the HTTP API, for consumers' and nsqadmin's ``--lookupd-http-address``."""
        return f"{self.http_host}:{self.http_port}"

    def stop(self) -> defer.Deferred[None]:
        """Stop; fires once every connection is closed and both listeners are gone."""
        if not self._service.running:
            return defer.succeed(None)
        return defer.maybeDeferred(self._service.stopService)


#: what an embedded nsqlookupd uses for every field left at NSQ's default (keyword arguments or
#: ``options=``): loopback only, ports chosen by the OS, broadcast 127.0.0.1
EMBEDDED_LOOKUPD_DEFAULTS: dict[str, Any] = {
    "tcp_address": "127.0.0.1:0",
    "http_address": "127.0.0.1:0",
    "broadcast_address": "127.0.0.1",
}


def start_nsqlookupd(reactor: ListeningReactor = None, options: LookupdOptions | None = None, *,
                     clock: Clock = None, **kwargs: object) -> defer.Deferred[LookupdHandle]:
    """Start an nsqlookupd in the running reactor; fires with a :class:`LookupdHandle`.

    Every field left at NSQ's default (keyword arguments or ``options=``; keyword arguments
    win) gets the embedding default (:data:`~nsqtw.embed.EMBEDDED_LOOKUPD_DEFAULTS`).  The start changes
    nothing in the host's process (no collector or allocator setting, no thread).

    ``clock`` (an IReactorTime, e.g. ``task.Clock``) replaces the reactor as the
    time source for activity and tombstones, so tests can age producers."""
    from .service import build_lookupd

    reactor = resolve_reactor(reactor)
    options = with_embedding_defaults(LookupdOptions, EMBEDDED_LOOKUPD_DEFAULTS, options, kwargs)  # a bad option raises here
    try:
        service = build_lookupd(options, reactor, clock=clock)
        service.startService()
    except Exception:
        return defer.fail()
    d: defer.Deferred[Any] = service.ready()

    def failed(f: Any) -> Any:
        d2 = defer.maybeDeferred(service.stopService)
        d2.addBoth(lambda _: f)
        return d2

    return d.addCallbacks(lambda _: LookupdHandle.of(service), failed)
