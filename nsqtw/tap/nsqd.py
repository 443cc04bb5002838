"""``twistd nsqd``: NSQ's nsqd flags in, the nsqd service tree out."""

from __future__ import annotations


from twisted.application.service import IService

from ..options import NsqdOptions
from ._base import GoFlagOptions, build_or_exit, exit_1_on_loss

__all__ = ["Options", "makeService"]


class Options(GoFlagOptions):
    options_class = NsqdOptions
    prog = "nsqd"


def makeService(options: Options) -> IService:
    from ..reactor import resolve_reactor
    from ..service.nsqd import build_nsqd
    from ..stats.memory import tune_allocator
    tune_allocator()
    from ..service.listen import enable_warm_up_threads
    enable_warm_up_threads()
    reactor = resolve_reactor()
    service = build_or_exit("nsqd", lambda: build_nsqd(options.config, reactor), options)
    exit_1_on_loss(reactor, lambda: service.lost_at_shutdown)
    return service
