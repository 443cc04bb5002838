"""
The all-in-one: nsqlookupd, nsqd registered to it, and nsqadmin, in one reactor.

A new user gets a working single-process cluster with one command (``make
run``); each part is the same service tree the separate daemons use, so the
addresses, APIs and files are exactly those of a multi-process cluster.
"""

from __future__ import annotations

from typing import Any

from twisted.application.service import MultiService
from twisted.internet import defer

from ..options import NsqdOptions, OptionError, split_host_port

__all__ = ["AllInOneService", "build_allinone", "local_address"]


def local_address(address: str, flag: str) -> str:
    """An address others can connect to: ``0.0.0.0:4161`` becomes ``127.0.0.1:4161``."""
    host, port = split_host_port(address, flag)
    if host in ("", "0.0.0.0", "*"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class AllInOneService(MultiService):
    """nsqlookupd + nsqd + nsqadmin; ``lookupd``, ``nsqd`` and ``admin`` are the parts (or None)."""

    def __init__(self, nsqd_options: NsqdOptions, reactor: Any, *, lookupd_tcp_address: str,
                 lookupd_http_address: str, admin_http_address: str, admin_history_path: str = "") -> None:
        super().__init__()
        self.lookupd: Any | None = None
        self.admin: Any | None = None
        lookupd_tcp = ""
        lookupd_http = ""
        if lookupd_tcp_address:
            from ..lookupd.options import LookupdOptions
            from ..lookupd.service import build_lookupd
            if not lookupd_http_address:
                raise OptionError("--lookupd-http-listen must be <addr>:<port> (nsqlookupd needs its "
                                  "HTTP API; an empty --lookupd-tcp-listen leaves nsqlookupd out)")
            try:
                lookupd_options = LookupdOptions(
                    tcp_address=lookupd_tcp_address, http_address=lookupd_http_address,
                    broadcast_address=nsqd_options.broadcast_address)
            except OptionError as e:  # name the all-in-one's flags, not nsqlookupd's own
                raise OptionError(str(e).replace("--tcp-address", "--lookupd-tcp-listen")
                                  .replace("--http-address", "--lookupd-http-listen")) from None
            self.lookupd = build_lookupd(lookupd_options, reactor)
            self.lookupd.setServiceParent(self)
            lookupd_tcp = local_address(lookupd_tcp_address, "lookupd-tcp-address")
            if lookupd_http_address:
                lookupd_http = local_address(lookupd_http_address, "lookupd-http-address")
        peers: list[str] = list(nsqd_options.lookupd_tcp_addresses)
        if lookupd_tcp and lookupd_tcp not in peers:
            peers.insert(0, lookupd_tcp)
        from ..nsqd.service import build_nsqd
        self.nsqd = build_nsqd(nsqd_options.replace(lookupd_tcp_addresses=peers), reactor)
        self.nsqd.setServiceParent(self)
        if admin_http_address:
            from ..admin.options import AdminOptions
            from ..admin.service import build_admin
            if lookupd_http:
                admin_options = AdminOptions(http_address=admin_http_address, history_path=admin_history_path,
                                             lookupd_http_addresses=[lookupd_http])
            elif nsqd_options.http_address:
                admin_options = AdminOptions(http_address=admin_http_address, history_path=admin_history_path,
                                             nsqd_http_addresses=[
                                                 local_address(nsqd_options.http_address, "http-address")])
            else:
                raise OptionError("--admin-http-address needs nsqlookupd's or nsqd's HTTP API")
            self.admin = build_admin(admin_options, reactor)
            self.admin.setServiceParent(self)

    def startService(self) -> None:
        super().startService()
        if self.lookupd is not None:
            # with port 0 the real ports are known only now: point nsqd and nsqadmin at them (once
            # nsqd is built too: with --etcd-endpoints it is made after its node id is claimed)
            both = defer.gatherResults([self.lookupd.ready(), self.nsqd.ready()], consumeErrors=True)
            both.addCallback(self._lookupd_bound)
            both.addErrback(lambda f: None)  # a part that failed to start says so itself

    def _lookupd_bound(self, _: Any) -> None:
        lookupd = self.lookupd
        assert lookupd is not None  # called only when there is one (startService)
        tcp = f"127.0.0.1:{lookupd.tcp_port}"
        peers = [a for a in self.nsqd.options.lookupd_tcp_addresses if not a.endswith(":0")]
        if tcp not in peers:
            self.nsqd.set_lookupd_addresses([tcp] + peers)
        if self.admin is not None and lookupd.http_port is not None:
            current = list(self.admin.options.lookupd_http_addresses)
            if any(a.endswith(":0") for a in current):
                self.admin.set_options(lookupd_http_addresses=[f"127.0.0.1:{lookupd.http_port}"])

    def ready(self) -> defer.Deferred:
        parts = [p for p in (self.lookupd, self.nsqd, self.admin) if p is not None]
        return defer.gatherResults([p.ready() for p in parts], consumeErrors=True).addCallback(lambda _: self)


def build_allinone(nsqd_options: NsqdOptions, reactor: Any, **addresses: str) -> AllInOneService:
    return AllInOneService(nsqd_options, reactor, **addresses)
