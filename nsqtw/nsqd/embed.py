"""
Running nsqd (and nsqlookupd) inside an application's or a test's reactor.

::

    from nsqtw.embed import start_nsqd

    nsqd = await start_nsqd()                 # 127.0.0.1, ports chosen by the OS
    print(nsqd.tcp_address, nsqd.http_address)
    ...
    await nsqd.stop()                         # listeners closed, temp data removed

Options are NSQ's, by attribute name (``mem_queue_size=100``,
``msg_timeout=5.0``) or as an :class:`~nsqtw.options.NsqdOptions`; either way
the fields left at NSQ's default get the embedding defaults
(:data:`~nsqtw.embed.EMBEDDED_NSQD_DEFAULTS`).  Unless a ``data_path`` is given, a temporary
directory is used (never fsynced) and deleted on stop, so an embedded broker
leaves nothing behind.

Starting one changes nothing in the host's process: no collector, allocator or
``gc.callbacks`` setting, no trim loop, no thread (that is the daemons' process
policy, :mod:`nsqtw.runtime.process`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import TYPE_CHECKING, Any, cast
from collections.abc import Callable

import attr
from twisted.internet import defer

from ..options import NsqdOptions, with_embedding_defaults
from ..runtime.reactor import ListeningReactor, resolve_reactor

if TYPE_CHECKING:
    from .core.broker import Broker
    from .service import NsqdService

__all__ = ["start_nsqd", "NsqdHandle", "MessagesLost", "EMBEDDED_NSQD_DEFAULTS",
           "embedded_nsqd_options"]


@attr.s(eq=False)
class NsqdHandle:
    """A running embedded nsqd: its addresses, :meth:`stats` and :meth:`stop`.

    Made by :func:`start_nsqd`, not by hand.  The daemon's internals stay behind underscored
    names (``_service``, ``_broker``), for nsqtw's own white-box tests; they may change without
    notice."""

    _service: NsqdService = attr.ib()
    _tempdir: str | None = attr.ib(default=None)
    _unregister: Callable[[], None] | None = attr.ib(default=None)

    @property
    def _broker(self) -> Broker:
        return self._service.broker

    @property
    def options(self) -> NsqdOptions:
        """The options it runs with (the embedding defaults and the temporary ``data_path`` filled in)."""
        return self._service.options

    # the ports below are bound: a handle is made once its service listens

    @property
    def tcp_port(self) -> int:
        """The bound TCP port (protocol V2)."""
        return cast(int, self._service.tcp_port)

    @property
    def http_port(self) -> int | None:
        """The bound HTTP port, or None when HTTP is off (``http_address=""``)."""
        return self._service.http_port

    @property
    def https_port(self) -> int | None:
        """The bound HTTPS port, or None when HTTPS is off (the embedding default)."""
        return self._service.https_port

    @property
    def host(self) -> str:
        """The host the TCP listener is bound to (``127.0.0.1`` by default)."""
        return self._service.tcp_listener.bound_host

    @property
    def tcp_address(self) -> str:
        """``"host:port"`` of protocol V2, for producers and consumers (``Producer(handle.tcp_address)``)."""
        return f"{self.host}:{self.tcp_port}"

    @property
    def http_address(self) -> str | None:
        """``"host:port"`` of the HTTP API (``/pub``, ``/stats``...), or None when HTTP is off."""
        if self.http_port is None:
            return None
        http: Any = self._service.http_listener
        return f"{http.bound_host}:{self.http_port}"

    @property
    def replication_address(self) -> str | None:
        """``"host:port"`` of the bound ``--replication-address`` (what other nodes list in
        ``replica_peers``), or None when this node keeps no shadows."""
        listener = self._service.replication_listener
        if listener is None or listener.bound_port is None:
            return None
        return f"{listener.bound_host}:{listener.bound_port}"

    def stats(self, topic: str | None = None, channel: str | None = None) -> dict[str, Any]:
        """The ``/stats?format=json`` document (optionally of one topic or channel), computed in-process."""
        from .stats.snapshot import broker_stats

        return broker_stats(self._broker, self._service.now(), topic=topic or "", channel=channel or "")

    def stop(self) -> defer.Deferred[None]:
        """Stop the broker; fires once every listener and connection is closed."""
        if self._unregister is not None:
            self._unregister()
            self._unregister = None
        d = defer.maybeDeferred(self._service.stopService)

        def cleanup(result: Any) -> Any:
            if self._tempdir:
                shutil.rmtree(self._tempdir, ignore_errors=True)
            return result

        def lost(result: Any) -> Any:
            n = getattr(self._service, "lost_at_shutdown", 0)
            if n:  # the disk refused them (full): never a silent success
                raise MessagesLost(f"{n} messages could not be written to disk at shutdown and are lost")
            return result

        return d.addBoth(cleanup).addCallback(lost)


class MessagesLost(Exception):
    """A clean stop could not write everything it held to disk (see README: when the disk fills)."""


def scratch_dir() -> str:
    """A fresh directory for a throwaway broker: on tmpfs (``/dev/shm``) when there is one."""
    shm = "/dev/shm"
    base = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None
    return tempfile.mkdtemp(prefix="nsqtw-", dir=base)


#: what an embedded nsqd uses for every field left at NSQ's default (keyword arguments or
#: ``options=``): loopback only, ports chosen by the OS, no HTTPS; ``data_path`` left empty
#: means a temporary directory, removed on stop
EMBEDDED_NSQD_DEFAULTS: dict[str, Any] = {
    "tcp_address": "127.0.0.1:0",
    "http_address": "127.0.0.1:0",
    "https_address": "",
    "broadcast_address": "127.0.0.1",
}


def embedded_nsqd_options(options: NsqdOptions | None = None, **kwargs: object) -> NsqdOptions:
    """The options :func:`start_nsqd` runs with (before the temporary ``data_path``)."""
    return with_embedding_defaults(NsqdOptions, EMBEDDED_NSQD_DEFAULTS, options, kwargs)


def start_nsqd(reactor: ListeningReactor = None, options: NsqdOptions | None = None, *,
               inprocess_name: str | None = None, **kwargs: object) -> defer.Deferred[NsqdHandle]:
    """Start an nsqd in the running reactor; fires with an :class:`NsqdHandle`.

    Options are NSQ's, as keyword arguments or ``options=`` (keyword arguments win); either
    way every field left at NSQ's default gets the embedding default
    (:data:`~nsqtw.embed.EMBEDDED_NSQD_DEFAULTS`: 127.0.0.1, port 0, no HTTPS, broadcast 127.0.0.1), and
    an empty ``data_path`` a temporary directory removed on stop.  A throwaway directory
    needs no durability: its disk work runs inline, without fsync and without a thread.

    The start changes nothing in the host's process (no collector setting, no allocator
    setting, no thread, no trim loop) and builds everything it serves, the HTTP API included,
    before the Deferred fires.

    With ``inprocess_name``, clients in the same reactor also reach it at
    ``"inprocess:<name>"`` (no socket; see :mod:`nsqtw.client.inprocess`).
    """
    from .service import build_nsqd

    reactor = resolve_reactor(reactor)
    tempdir = None
    options = embedded_nsqd_options(options, **kwargs)  # a bad option raises here, as NsqdOptions does
    if not options.data_path:
        tempdir = scratch_dir()
        options = options.replace(data_path=tempdir)
    try:
        # a throwaway data directory: no fsync thread, no fsync (it is deleted on stop)
        service = build_nsqd(options, reactor, throwaway=tempdir is not None)
        service.startService()
    except Exception:
        if tempdir:
            shutil.rmtree(tempdir, ignore_errors=True)
        return defer.fail()
    handle = NsqdHandle(service, tempdir)
    d: defer.Deferred[Any] = service.ready()

    def failed(f: Any) -> Any:
        d2 = handle.stop()
        d2.addBoth(lambda _: f)
        return d2

    def started(_: Any) -> NsqdHandle:
        if inprocess_name is not None:
            from ..client.inprocess import register
            handle._unregister = register(handle, inprocess_name)
        return handle

    return d.addCallbacks(started, failed)


