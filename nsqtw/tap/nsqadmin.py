"""``twistd nsqadmin``: NSQ's nsqadmin flags in, the nsqadmin service tree out."""

from __future__ import annotations

from twisted.application.service import IService

from ..admin.options import AdminOptions
from ._base import GoFlagOptions, build_or_exit

__all__ = ["Options", "makeService"]


class Options(GoFlagOptions):
    options_class = AdminOptions
    prog = "nsqadmin"


def makeService(options: Options) -> IService:
    from ..reactor import resolve_reactor
    from ..service.admin import build_admin
    return build_or_exit("nsqadmin", lambda: build_admin(options.config, resolve_reactor()), options)
