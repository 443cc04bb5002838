"""A twistd ``usage.Options`` that parses Go-style NSQ flags into an nsqtw options object."""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from twisted.python import usage

from .. import version_line
from ..options import OptionError
from .flags import HelpRequested, VersionRequested, options_from_argv, usage_text

__all__ = ["GoFlagOptions", "exit_1_on_loss", "build_or_exit"]

_T = TypeVar("_T")


def build_or_exit(prog: str, build: Callable[[], _T]) -> _T:
    """Build a daemon's service tree for twistd; a configuration it refuses (a TLS file that is
    missing, an address it cannot use) ends twistd with the drop-in command's one FATAL line
    and status 1, never a traceback."""
    from .golog import go_log_line

    try:
        return build()
    except (OptionError, TypeError, ValueError) as e:
        sys.stderr.write(go_log_line(f"[{prog}] ", 5, f"failed to instantiate {prog} - {e}"))
        sys.stderr.flush()
        raise SystemExit(1) from None


def exit_1_on_loss(reactor: Any, lost: Callable[[], int]) -> None:
    """Make twistd exit with status 1 when a clean stop could not write what it held to disk.

    twistd itself exits 0 once its reactor has stopped, whatever the services' ``stopService``
    said; a shutdown that lost messages (a full disk) must never look like a success to a
    supervisor. After the reactor's shutdown (so after every service stopped and the loss was
    logged as critical), a loss installs an exit hook that runs once twistd has removed its
    pidfile and returned: it flushes standard output and error and ends the process with 1.
    twistd ends a process stopped by a signal with that same signal (SIGTERM: -15); a loss
    overrides that too, since "stopped by SIGTERM" reads as a normal stop."""

    def check() -> None:
        if not lost():
            return
        from .seam import clear_exit_signal
        clear_exit_signal(reactor)

        def exit_1() -> None:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):
                    pass
            os._exit(1)

        atexit.register(exit_1)

    reactor.addSystemEventTrigger("after", "shutdown", check)


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
