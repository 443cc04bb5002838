"""
What every NSQ app shares: Go-style logs (from :mod:`nsqtw.runtime.golog`), the reactor main, signals.

Each app is an object with ``start()`` (a Deferred: connected, or failed
with the reason the app cannot run), ``stop()`` (graceful: what is in flight
is finished) and ``done`` (fires with the exit code once the app is over, by
itself or after ``stop``).  Tests drive that object in pytest-twisted's
reactor; :func:`run_app` runs the reactor for the apps, and only their ``main()``
functions call it (the daemons' ``main()`` is :mod:`nsqtw.cli`, which runs its own).

Logs go to stderr in the layout of Go's ``log`` package with NSQ's ``lg``
levels (``[nsq_to_file] 2024/05/01 10:00:00.123456 INFO: ...``), so scripts
that grep nsqd's output keep working.
"""

from __future__ import annotations

import signal
import sys
from typing import Any, TextIO
from collections.abc import Callable, Iterable

from .. import NSQ_VERSION, __version__, version_line
from ..options import OptionError
from ..runtime.golog import GoLogObserver, begin_logging, go_log_line
from ..runtime.reactor import resolve_reactor

__all__ = [
    "GoLogObserver",
    "begin_logging",
    "go_log_line",
    "run_app",
    "parse_app_options",
    "client_config",
    "user_agent",
    "ExitCode",
]

class ExitCode:
    OK = 0
    FATAL = 1
    USAGE = 2


def user_agent(prog: str) -> str:
    """``<app>/<version> go-nsq/<version>`` in Go; nsqtw names itself instead of go-nsq."""
    return f"{prog}/{NSQ_VERSION} nsqtw/{__version__}"


def client_config(prog: str, opts: Iterable[str], max_in_flight: int | None = None) -> Any:
    """A client Config from ``--consumer-opt``/``--producer-opt`` values, as the apps build it
    (go-nsq's ``ConfigFlag``); the user agent and max-in-flight are set after, as in Go."""
    from ..client.config import Config
    from ..client.errors import ConfigError

    cfg = Config()
    try:
        for text in opts:
            cfg.set_flag(text)
        cfg.user_agent = user_agent(prog)
        if max_in_flight is not None:
            cfg.max_in_flight = max_in_flight
        cfg.validate()
    except ConfigError as e:
        raise OptionError(str(e)) from None
    return cfg


def parse_app_options(options_class: Any, argv: list[str], prog: str,
                      stdout: TextIO | None = None, stderr: TextIO | None = None) -> tuple[Any, int | None]:
    """Go's ``flag.Parse`` for an app: ``(options, None)`` or ``(None, exit code)``."""
    from ..runtime.flags import FlagSyntaxError, HelpRequested, VersionRequested, options_from_argv, usage_text

    out = stdout or sys.stdout
    err = stderr or sys.stderr
    try:
        return options_from_argv(options_class, argv, config_flag=False), None
    except HelpRequested:
        err.write(usage_text(options_class, prog, config_flag=False))
        return None, ExitCode.OK
    except VersionRequested:
        out.write(version_line(prog) + "\n")
        return None, ExitCode.OK
    except FlagSyntaxError as e:
        err.write(f"{e}\n")
        err.write(usage_text(options_class, prog, config_flag=False))
        return None, ExitCode.USAGE
    except (OptionError, TypeError, ValueError) as e:
        err.write(go_log_line(f"[{prog}] ", 5, str(e)))
        return None, ExitCode.FATAL


def run_app(prog: str, argv: list[str] | None, options_class: Any,
            make_app: Callable[[Any, Any], Any], *, hup: bool = False) -> int:
    """Parse, log, run the reactor until the app is done; SIGINT/SIGTERM stop it gracefully
    (a second signal stops at once), SIGHUP calls ``app.hup()`` when ``hup``."""
    args = sys.argv[1:] if argv is None else list(argv)
    options, code = parse_app_options(options_class, args, prog)
    if options is None:
        return int(code or 0)

    reactor = resolve_reactor()

    prefix = getattr(options, "log_prefix", f"[{prog}] ")
    begin_logging(prefix, getattr(options, "log_level", 2))
    fatal = _fatal_logger(prefix)
    try:
        app = make_app(options, reactor)
    except (OptionError, ValueError) as e:
        fatal(str(e))
        return ExitCode.FATAL
    status = {"code": ExitCode.OK, "signals": 0}

    def finished(result: Any) -> None:
        if isinstance(result, int):
            status["code"] = result
        elif result is not None and hasattr(result, "getErrorMessage"):
            fatal(result.getErrorMessage())
            status["code"] = ExitCode.FATAL
        if reactor.running:
            reactor.stop()

    def start() -> None:
        from twisted.internet import defer

        d = defer.maybeDeferred(app.start)

        def cannot_start(f: Any) -> None:
            fatal(f.getErrorMessage())
            status["code"] = ExitCode.FATAL
            stopping = defer.maybeDeferred(app.stop)
            stopping.addBoth(lambda _: reactor.stop() if reactor.running else None)

        d.addErrback(cannot_start)
        app.done.addBoth(finished)

    def on_signal(signum: int, frame: Any) -> None:
        status["signals"] += 1
        if status["signals"] > 1:
            reactor.callFromThread(lambda: reactor.stop() if reactor.running else None)
            return
        reactor.callFromThread(app.stop)

    reactor.callWhenRunning(start)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    if hup and hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, lambda s, f: reactor.callFromThread(app.hup))
    reactor.run(installSignalHandlers=False)
    return int(status["code"])


def _fatal_logger(prefix: str) -> Callable[[str], None]:
    def fatal(text: str) -> None:
        sys.stderr.write(go_log_line(prefix, 5, text))
        sys.stderr.flush()
    return fatal
