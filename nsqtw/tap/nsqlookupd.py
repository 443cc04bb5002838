"""``twistd nsqlookupd``: NSQ's nsqlookupd flags in, the nsqlookupd service tree out."""

from __future__ import annotations

from twisted.application.service import IService

from ..lookupd.options import LookupdOptions
from ._base import GoFlagOptions, build_or_exit

__all__ = ["Options", "makeService"]


class Options(GoFlagOptions):
    options_class = LookupdOptions
    prog = "nsqlookupd"


def makeService(options: Options) -> IService:
    from ..reactor import resolve_reactor
    from ..service.lookupd import build_lookupd
    return build_or_exit("nsqlookupd", lambda: build_lookupd(options.config, resolve_reactor()), options)
