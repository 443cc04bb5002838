"""A twistd ``usage.Options`` that parses Go-style NSQ flags into an nsqtw options object."""

from __future__ import annotations

import sys
from typing import Any

from twisted.python import usage

from .. import version_line
from ..options import OptionError
from .flags import HelpRequested, VersionRequested, options_from_argv, usage_text

__all__ = ["GoFlagOptions"]


class GoFlagOptions(usage.Options):
    """Options for one daemon; ``self.config`` holds the validated options object."""

    options_class: Any = None
    prog = "nsqd"

    def __init__(self) -> None:
        super().__init__()
        self.config: Any = None

    def parseOptions(self, options: list[str] | None = None) -> None:
        argv = sys.argv[1:] if options is None else list(options)
        try:
            self.config = options_from_argv(self.options_class, argv)
        except HelpRequested:
            sys.stdout.write(self.getUsage())
            sys.exit(0)
        except VersionRequested:
            sys.stdout.write(version_line(self.prog) + "\n")
            sys.exit(0)
        except OptionError as e:
            raise usage.UsageError(str(e)) from None
        except (TypeError, ValueError) as e:
            raise usage.UsageError(str(e)) from None

    def getUsage(self, width: int | None = None) -> str:
        return usage_text(self.options_class, self.prog)

    def __str__(self) -> str:
        return self.getUsage()
