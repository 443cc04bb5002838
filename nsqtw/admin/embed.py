"""
Running nsqadmin inside an application's or a test's reactor.

::

    from nsqtw.nsqd.embed import start_nsqd
    from nsqtw.admin.embed import start_nsqadmin

    nsqd = await start_nsqd()
    admin = await start_nsqadmin(nsqd_http_addresses=[nsqd.http_address])
    print(admin.url)                          # http://127.0.0.1:<port>/
    ...
    await admin.stop()

Options are nsqadmin's, by attribute name (``lookupd_http_addresses=[...]``,
``admin_users=["alice"]``, ``base_path="/admin"``) or as an
:class:`~nsqtw.admin.options.AdminOptions`.  The embedded default listens on
127.0.0.1 with a port chosen by the OS.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import attr
from twisted.internet import defer

from .options import AdminOptions
from ..options import with_embedding_defaults
from ..runtime.reactor import ListeningReactor, TreqClient, resolve_reactor

if TYPE_CHECKING:
    from .history import History
    from .service import AdminService

__all__ = ["start_nsqadmin", "AdminHandle", "EMBEDDED_ADMIN_DEFAULTS"]


@attr.s(eq=False)
class AdminHandle:
    """A running embedded nsqadmin."""

    _service: AdminService = attr.ib()

    @property
    def options(self) -> AdminOptions:
        """The options the nsqadmin runs with (the embedding defaults applied)."""
        return self._service.options

    @property
    def http_port(self) -> int:
        """The port the UI listens on (the one the OS chose for port 0)."""
        return cast(int, self._service.http_port)  # bound: a handle is made once its service listens

    @property
    def host(self) -> str:
        """The host the UI listens on."""
        return self._service.http_listener.bound_host

    @property
    def http_address(self) -> str:
        """``host:port`` of the UI."""
        return f"{self.host}:{self.http_port}"

    @property
    def url(self) -> str:
        """The UI's root URL, base path included, with a trailing slash."""
        base = self.options.base.rstrip("/")
        return f"http://{self.http_address}{base}/"

    @property
    def _history(self) -> History:
        return self._service.history

    def poll(self) -> defer.Deferred[None]:
        """Take one /stats sample for the graphs now (tests use this instead of waiting)."""
        return self._service.poller.poll_once()

    def stop(self) -> defer.Deferred[None]:
        """Stop listening and polling; fires once the listener is closed."""
        if not self._service.running:
            return defer.succeed(None)
        return defer.maybeDeferred(self._service.stopService)


#: what an embedded nsqadmin uses when its HTTP address is left at NSQ's default (keyword
#: arguments or ``options=``): loopback only, a port chosen by the OS
EMBEDDED_ADMIN_DEFAULTS: dict[str, Any] = {"http_address": "127.0.0.1:0"}


def start_nsqadmin(reactor: ListeningReactor = None, options: AdminOptions | None = None, *,
                   http_client: TreqClient = None, **kwargs: object) -> defer.Deferred[AdminHandle]:
    """Start an nsqadmin in the running reactor; fires with an :class:`AdminHandle`.

    An HTTP address left at NSQ's default (keyword arguments or ``options=``; keyword
    arguments win) becomes ``127.0.0.1:0``.  The start changes nothing in the host's process
    (no collector or allocator setting, no thread).

    ``http_client`` replaces the treq client used for nsqd, nsqlookupd and
    notifications (e.g. a ``treq.testing.StubTreq``)."""
    from .service import build_admin

    reactor = resolve_reactor(reactor)
    options = with_embedding_defaults(AdminOptions, EMBEDDED_ADMIN_DEFAULTS, options, kwargs)  # a bad option raises here
    try:
        service = build_admin(options, reactor, http_client=http_client)
        service.startService()  # type: ignore[no-untyped-call]  # Twisted's MultiService is unannotated
    except Exception:
        return defer.fail()
    handle = AdminHandle(service)
    d: defer.Deferred[Any] = service.ready()

    def failed(f: Any) -> Any:
        d2 = handle.stop()
        d2.addBoth(lambda _: f)
        return d2

    return d.addCallbacks(lambda _: handle, failed)
