"""
Running nsqd, nsqlookupd and nsqadmin inside an application's or a test's reactor (public API).

::

    from nsqtw.embed import start_nsqd

    nsqd = await start_nsqd()                 # 127.0.0.1, ports chosen by the OS
    print(nsqd.tcp_address, nsqd.http_address)
    ...
    await nsqd.stop()                         # listeners closed, temp data removed

Each ``start_*`` returns a Deferred that fires with a handle once the daemon listens; a handle
exposes its addresses, ``stats()`` (nsqd) and ``stop()``.  Options are NSQ's, by attribute name or as
an options object (:class:`~nsqtw.options.NsqdOptions`, :class:`LookupdOptions`,
:class:`AdminOptions`); the fields left at NSQ's default get the embedding defaults.  Starting one
changes nothing in the host's process (no collector, allocator or signal setting, no thread).

The implementations live in each daemon's package (``nsqtw.nsqd.embed``, ``nsqtw.lookupd.embed``,
``nsqtw.admin.embed``); import them from here.
"""

from __future__ import annotations

from .admin.embed import EMBEDDED_ADMIN_DEFAULTS, AdminHandle, start_nsqadmin
from .admin.options import AdminOptions
from .lookupd.embed import EMBEDDED_LOOKUPD_DEFAULTS, LookupdHandle, start_nsqlookupd
from .lookupd.options import LookupdOptions
from .nsqd.embed import EMBEDDED_NSQD_DEFAULTS, MessagesLost, NsqdHandle, embedded_nsqd_options, start_nsqd
from .options import NsqdOptions

__all__ = [
    "start_nsqd",
    "NsqdHandle",
    "MessagesLost",
    "NsqdOptions",
    "EMBEDDED_NSQD_DEFAULTS",
    "embedded_nsqd_options",
    "start_nsqlookupd",
    "LookupdHandle",
    "LookupdOptions",
    "EMBEDDED_LOOKUPD_DEFAULTS",
    "start_nsqadmin",
    "AdminHandle",
    "AdminOptions",
    "EMBEDDED_ADMIN_DEFAULTS",
]
