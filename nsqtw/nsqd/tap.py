"""``twistd nsqd``: NSQ's nsqd flags in, the nsqd service tree out."""

from __future__ import annotations


from twisted.application.service import IService

from ..options import NsqdOptions
from ..runtime.tap import GoFlagOptions, build_or_exit, exit_1_on_loss

__all__ = ["Options", "makeService"]


class Options(GoFlagOptions):
    options_class = NsqdOptions
    prog = "nsqd"


def makeService(options: Options) -> IService:
    from ..runtime.reactor import resolve_reactor
    from .service import build_nsqd
    from ..runtime.process import apply_daemon_policy
    reactor = resolve_reactor()
    service = build_or_exit("nsqd", lambda: build_nsqd(options.config, reactor), options)
    exit_1_on_loss(reactor, lambda: service.lost_at_shutdown)
    apply_daemon_policy(service, reactor)  # a process of nsqtw's own; before twistd starts the tree
    return service
