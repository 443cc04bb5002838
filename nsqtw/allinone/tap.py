"""
``twistd nsqtw``: nsqlookupd, nsqd and nsqadmin in one process.

Takes every nsqd flag, plus ``--lookupd-tcp-listen`` (default
``0.0.0.0:4160``), ``--lookupd-http-listen`` (``0.0.0.0:4161``) and
``--admin-http-address`` (``0.0.0.0:4171``) and ``--admin-history-path`` (nsqadmin's
``--history-path``) for the other two parts; an empty
``--lookupd-tcp-listen`` leaves nsqlookupd out, an empty ``--admin-http-address``
nsqadmin.  nsqd registers with the local nsqlookupd (and any
``--lookupd-tcp-address`` given), and nsqadmin reads the cluster through it.
"""

from __future__ import annotations

import sys

from twisted.application.service import IService
from twisted.python import usage

from ..options import NsqdOptions
from ..runtime.tap import GoFlagOptions, build_or_exit, exit_1_on_loss

__all__ = ["Options", "makeService", "split_extra_flags", "EXTRA_FLAGS"]

EXTRA_FLAGS: dict[str, tuple[str, str, str]] = {
    "lookupd-tcp-listen": ("lookupd_tcp_address", "0.0.0.0:4160", "address nsqlookupd listens on for nsqd (TCP)"),
    "lookupd-http-listen": ("lookupd_http_address", "0.0.0.0:4161", "address nsqlookupd listens on for HTTP"),
    "admin-http-address": ("admin_http_address", "0.0.0.0:4171", "address nsqadmin listens on for HTTP"),
    "admin-history-path": ("admin_history_path", "", "[nsqtw] a directory where nsqadmin keeps its history "
                           "(nsqadmin's --history-path), so a restart keeps the charts; empty: memory only"),
}


def split_extra_flags(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """Take the all-in-one flags (any Go syntax) out of argv; the rest are nsqd's."""
    values = {key: default for key, default, _ in EXTRA_FLAGS.values()}
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name = arg.lstrip("-")
        if arg.startswith("-") and name.split("=", 1)[0] in EXTRA_FLAGS:
            flag, eq, value = name.partition("=")
            if not eq:
                if i + 1 >= len(argv):
                    raise usage.UsageError(f"flag needs an argument: -{flag}")
                value = argv[i + 1]
                i += 1
            values[EXTRA_FLAGS[flag][0]] = value
        else:
            rest.append(arg)
        i += 1
    return values, rest


class Options(GoFlagOptions):
    options_class = NsqdOptions
    prog = "nsqtw"

    def __init__(self) -> None:
        super().__init__()
        self.addresses: dict[str, str] = {}

    def parseOptions(self, options: list[str] | None = None) -> None:
        argv = sys.argv[1:] if options is None else list(options)
        self.addresses, rest = split_extra_flags(argv)
        super().parseOptions(rest)

    def getUsage(self, width: int | None = None) -> str:
        extra = "".join(f"  -{flag} string\n    \t{help_text} (default \"{default}\")\n"
                        for flag, (_, default, help_text) in sorted(EXTRA_FLAGS.items()))
        return super().getUsage(width) + "\nall-in-one:\n" + extra


def makeService(options: Options) -> IService:
    from ..runtime.reactor import resolve_reactor
    from .service import build_allinone
    from ..runtime.process import apply_daemon_policy
    reactor = resolve_reactor()
    service = build_or_exit("nsqtw", lambda: build_allinone(options.config, reactor, **options.addresses), options)
    exit_1_on_loss(reactor, lambda: service.nsqd.lost_at_shutdown)
    apply_daemon_policy(service, reactor)  # a process of nsqtw's own; before twistd starts the tree
    return service
