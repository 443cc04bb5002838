"""``twistd nsqadmin``: NSQ's nsqadmin flags in, the nsqadmin service tree out."""

from __future__ import annotations

from twisted.application.service import IService

from .options import AdminOptions
from ..runtime.tap import GoFlagOptions, build_or_exit

__all__ = ["Options", "makeService"]


class Options(GoFlagOptions):
    options_class = AdminOptions
    prog = "nsqadmin"


def makeService(options: Options) -> IService:
    from ..runtime.reactor import resolve_reactor
    from .service import build_admin
    from ..runtime.process import apply_daemon_policy
    reactor = resolve_reactor()
    service = build_or_exit("nsqadmin", lambda: build_admin(options.config, reactor), options)
    apply_daemon_policy(service, reactor)  # a process of nsqtw's own; before twistd starts the tree
    return service
