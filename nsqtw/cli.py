"""
Drop-in ``nsqd`` / ``nsqlookupd`` commands: Go's flags in, a running daemon out.

Scripts and test harnesses that start NSQ's binaries can start these instead:
the same flag syntax (``-flag=value``, ``--flag value``, repeated flags,
``--config``), ``--version`` printing ``nsqd v1.3.0 (...)``, the startup log
lines on stderr naming the real bound addresses (``TCP: listening on
127.0.0.1:4150``), the working directory as data path when none is given,
and a clean exit on SIGTERM and SIGINT.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any, Callable, List, Optional

from . import NSQ_VERSION, __version__
from .options import OptionError

__all__ = ["nsqd_main", "nsqlookupd_main", "run_daemon"]


def _stderr(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def run_daemon(prog: str, argv: List[str], options_class: Any, build: Callable[[Any, Any], Any],
               prefix: str, defaults: Optional[dict] = None) -> int:
    """Parse Go-style flags, start the service tree, run the reactor until a signal."""
    from .tap.flags import HelpRequested, VersionRequested, options_from_argv, usage_text

    try:
        options = options_from_argv(options_class, argv, **(defaults or {}))
    except HelpRequested:
        sys.stderr.write(usage_text(options_class, prog))
        return 0
    except VersionRequested:
        sys.stdout.write(f"{prog} v{NSQ_VERSION} (built w/nsqtw {__version__})\n")
        return 0
    except (OptionError, TypeError, ValueError) as e:
        _stderr(f"{prefix}FATAL: {e}")
        return 1

    from twisted.internet import reactor
    from twisted.logger import FilteringLogObserver, LogLevel, LogLevelFilterPredicate, globalLogBeginner, textFileLogObserver

    from .service.listen import format_address

    level = {1: LogLevel.debug, 2: LogLevel.info, 3: LogLevel.warn, 4: LogLevel.error, 5: LogLevel.critical}
    predicate = LogLevelFilterPredicate(defaultLogLevel=level.get(getattr(options, "log_level", 2), LogLevel.info))
    globalLogBeginner.beginLoggingTo(
        [FilteringLogObserver(textFileLogObserver(sys.stderr, timeFormat=None), [predicate])],
        redirectStandardIO=False)

    try:
        service = build(options, reactor)
    except Exception as e:
        _stderr(f"{prefix}FATAL: failed to instantiate {prog} - {e}")
        return 1
    status = {"code": 0}

    def started(_: Any) -> None:
        for label, listener in (("TCP", getattr(service, "tcp_listener", None)),
                                ("HTTP", getattr(service, "http_listener", None)),
                                ("HTTPS", getattr(service, "https_listener", None))):
            if listener is not None and listener.port is not None:
                _stderr(f"{prefix}{label}: listening on {format_address(listener.port)}")

    def failed(f: Any) -> None:
        err = getattr(f.value, "subFailure", f)
        _stderr(f"{prefix}FATAL: {err.getErrorMessage() if hasattr(err, 'getErrorMessage') else err}")
        status["code"] = 1
        reactor.stop()

    def stop(*_: Any) -> None:
        reactor.callFromThread(reactor.stop)

    def start() -> None:
        try:
            service.startService()
        except Exception as e:
            _stderr(f"{prefix}FATAL: {e}")
            status["code"] = 1
            reactor.stop()
            return
        service.ready().addCallbacks(started, failed)

    reactor.addSystemEventTrigger("before", "shutdown", lambda: service.stopService() if service.running else None)
    reactor.callWhenRunning(start)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    reactor.run(installSignalHandlers=False)
    return status["code"]


def nsqd_main(argv: Optional[List[str]] = None) -> int:
    from .options import NsqdOptions
    from .service.nsqd import build_nsqd

    args = sys.argv[1:] if argv is None else argv
    return run_daemon("nsqd", args, NsqdOptions, build_nsqd, "[nsqd] ")


def nsqlookupd_main(argv: Optional[List[str]] = None) -> int:
    from .lookupd.options import LookupdOptions  # type: ignore[import-not-found]
    from .service.lookupd import build_lookupd  # type: ignore[import-not-found]

    args = sys.argv[1:] if argv is None else argv
    return run_daemon("nsqlookupd", args, LookupdOptions, build_lookupd, "[nsqlookupd] ")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(nsqd_main())
