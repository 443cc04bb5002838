"""
Running nsqd (and nsqlookupd) inside an application's or a test's reactor.

::

    from nsqtw.embed import start_nsqd

    nsqd = await start_nsqd()                 # 127.0.0.1, ports chosen by the OS
    print(nsqd.tcp_address, nsqd.http_address)
    ...
    await nsqd.stop()                         # listeners closed, temp data removed

Options are NSQ's, by attribute name (``mem_queue_size=100``,
``msg_timeout=5.0``) or as an :class:`~nsqtw.options.NsqdOptions`.  Unless a
``data_path`` is given, a temporary directory is used and deleted on stop, so
an embedded broker leaves nothing behind.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import TYPE_CHECKING, Any, cast

import attr
from twisted.internet import defer

from .options import NsqdOptions
from .reactor import resolve_reactor

if TYPE_CHECKING:
    from .service.nsqd import NsqdService

__all__ = ["start_nsqd", "NsqdHandle", "MessagesLost", "start_nsqlookupd", "LookupdHandle"]


@attr.s(eq=False)
class NsqdHandle:
    """A running embedded nsqd."""

    service: NsqdService = attr.ib()
    _tempdir: str | None = attr.ib(default=None)
    _unregister: Any = attr.ib(default=None)

    @property
    def broker(self) -> Any:
        return self.service.broker

    @property
    def options(self) -> NsqdOptions:
        return self.service.options

    # the ports below are bound: a handle is made once its service listens

    @property
    def tcp_port(self) -> int:
        return cast(int, self.service.tcp_port)

    @property
    def http_port(self) -> int | None:
        return self.service.http_port

    @property
    def https_port(self) -> int | None:
        return self.service.https_port

    @property
    def host(self) -> str:
        return self.service.tcp_listener.bound_host

    @property
    def tcp_address(self) -> str:
        return f"{self.host}:{self.tcp_port}"

    @property
    def http_address(self) -> str | None:
        if self.http_port is None:
            return None
        http: Any = self.service.http_listener
        return f"{http.bound_host}:{self.http_port}"

    def stop(self) -> defer.Deferred[Any]:
        """Stop the broker; fires once every listener and connection is closed."""
        if self._unregister is not None:
            self._unregister()
            self._unregister = None
        d = defer.maybeDeferred(self.service.stopService)

        def cleanup(result: Any) -> Any:
            if self._tempdir:
                shutil.rmtree(self._tempdir, ignore_errors=True)
            return result

        def lost(result: Any) -> Any:
            n = getattr(self.service, "lost_at_shutdown", 0)
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


def start_nsqd(reactor: Any = None, options: NsqdOptions | None = None, *,
               inprocess_name: str | None = None, **kwargs: Any) -> defer.Deferred[Any]:
    """Start an nsqd in the running reactor; fires with an :class:`NsqdHandle`.

    With ``inprocess_name``, clients in the same reactor also reach it at
    ``"inprocess:<name>"`` (no socket; see :mod:`nsqtw.client.inprocess`).
    """
    from .service.nsqd import build_nsqd

    reactor = resolve_reactor(reactor)
    tempdir = None
    if options is None:
        kwargs.setdefault("tcp_address", "127.0.0.1:0")
        kwargs.setdefault("http_address", "127.0.0.1:0")
        kwargs.setdefault("https_address", "")
        kwargs.setdefault("broadcast_address", "127.0.0.1")
        if not kwargs.get("data_path"):
            tempdir = kwargs["data_path"] = scratch_dir()
        options = NsqdOptions(**kwargs)
    elif kwargs:
        options = options.replace(**kwargs)
    try:
        # a throwaway data directory needs no fsync thread (and lives on tmpfs when there is one)
        service = build_nsqd(options, reactor, sync_thread=tempdir is None)
        service.startService()
    except Exception:
        if tempdir:
            shutil.rmtree(tempdir, ignore_errors=True)
        return defer.fail()
    handle = NsqdHandle(service, tempdir)
    d = service.ready()

    def failed(f: Any) -> Any:
        d2 = handle.stop()
        d2.addBoth(lambda _: f)
        return d2

    def started(_: Any) -> NsqdHandle:
        if inprocess_name is not None:
            from .client.inprocess import register
            handle._unregister = register(handle, inprocess_name)
        return handle

    d.addCallbacks(started, failed)
    return d


from .embed_lookupd import LookupdHandle, start_nsqlookupd  # noqa: E402  (re-exported)
