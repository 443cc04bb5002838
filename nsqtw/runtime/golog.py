"""Logs as Go's NSQ daemons and tools write them (``[nsqd] 2024/01/02 15:04:05.000000 INFO: ...``)."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO
from collections.abc import Callable, Mapping

__all__ = ["GoLogObserver", "begin_logging", "go_log_line", "direct_observer"]

#: the observer :func:`begin_logging` installed (a daemon's own process), for lines written
#: without a Twisted log event (:meth:`GoLogObserver.write_line`); None anywhere else
_direct: GoLogObserver | None = None


#: nsqtw's NSQ log levels (``--log-level``): 1 debug .. 5 fatal
_LEVEL_NAMES = {1: "DEBUG", 2: "INFO", 3: "WARNING", 4: "ERROR", 5: "FATAL"}


def go_log_line(prefix: str, level: int, text: str, when: float | None = None) -> str:
    """One line as Go's ``log.New(w, prefix, Ldate|Ltime|Lmicroseconds)`` plus ``lg`` writes it."""
    t = time.time() if when is None else when
    micro = int((t - int(t)) * 1_000_000)
    stamp = time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(t))
    return f"{prefix}{stamp}.{micro:06d} {_LEVEL_NAMES.get(level, 'INFO')}: {text}\n"


class GoLogObserver:
    """A Twisted log observer writing Go-style lines; Twisted's own chatter is dropped.

    Events from ``nsqtw`` namespaces are shown from ``level`` up; anything
    else only when it is a warning or worse (so "Starting factory" and
    "Main loop terminated" never reach a script that parses our stderr).
    """

    def __init__(self, stream: TextIO, prefix: str, level: int = 2,
                 namespaces: tuple[str, ...] = ("nsqtw",),
                 drop: Callable[[dict[str, Any]], bool] | None = None,
                 prefixes: Mapping[str, str] | None = None, others_from: int = 3) -> None:
        """``prefixes`` maps namespaces to their own prefixes (the longest match wins), so one
        process running several daemons names each one's lines (``[nsqlookupd] ``, ``[nsqd] ``);
        ``prefix`` is for every other event. Events from outside ``namespaces`` (Twisted's own:
        factories starting, ports closing, HTTP access lines) are shown from ``others_from`` up."""
        self.stream = stream
        self.prefix = prefix
        self.level = level
        self.namespaces = namespaces
        self.drop = drop
        self.others_from = others_from
        self.prefixes = sorted((prefixes or {}).items(), key=lambda item: -len(item[0]))

    def prefix_for(self, namespace: str) -> str:
        for name, prefix in self.prefixes:
            if namespace == name or namespace.startswith(name + "."):
                return prefix
        return self.prefix

    @staticmethod
    def nsq_level(event: dict[str, Any]) -> int:
        from twisted.logger import LogLevel

        lvl = event.get("log_level")
        if event.get("log_failure") is not None and lvl is None:
            return 4
        return {LogLevel.debug: 1, LogLevel.info: 2, LogLevel.warn: 3, LogLevel.error: 4,
                LogLevel.critical: 5}.get(lvl, 2)

    def write_line(self, namespace: str, level: int, text: str) -> None:
        """Write one line as :meth:`__call__` would for an event of ``namespace`` at ``level``
        whose text is ``text`` (no ``drop`` hook: for lines it never drops, such as access lines),
        without building and formatting a Twisted log event."""
        if level < self.level or (not namespace.startswith(self.namespaces) and level < self.others_from):
            return
        try:
            self.stream.write(go_log_line(self.prefix_for(namespace), level, text))
            self.stream.flush()
        except (OSError, ValueError):  # a closed stderr must not kill the app
            pass

    def __call__(self, event: dict[str, Any]) -> None:
        from twisted.logger import formatEvent

        level = self.nsq_level(event)
        namespace = str(event.get("log_namespace") or "")
        ours = namespace.startswith(self.namespaces)
        if level < self.level or (not ours and level < self.others_from):
            return
        if self.drop is not None and self.drop(event):
            return
        text = formatEvent(event)
        failure = event.get("log_failure")
        if failure is not None:
            try:
                text += "\n" + failure.getTraceback().rstrip()
            except Exception:  # pragma: no cover - a broken failure must not kill logging
                text += f"\n{failure!r}"
        try:
            self.stream.write(go_log_line(self.prefix_for(namespace), level, text, event.get("log_time")))
            self.stream.flush()
        except (OSError, ValueError):  # a closed stderr must not kill the app
            pass


def begin_logging(prefix: str, level: int = 2, stream: TextIO | None = None,
                  drop: Callable[[dict[str, Any]], bool] | None = None) -> GoLogObserver:
    """Send Twisted's global log to stderr, Go-style (only ``main()`` does this)."""
    from twisted.logger import globalLogBeginner

    global _direct
    observer = GoLogObserver(stream or sys.stderr, prefix, level, drop=drop)
    _direct = observer
    # an ILogObserver by shape (called with each event); no zope declaration: start-up time counts
    observers: list[Any] = [observer]
    globalLogBeginner.beginLoggingTo(observers, redirectStandardIO=False,
                                     discardBuffer=True)
    return observer


def direct_observer() -> GoLogObserver | None:
    """The observer a daemon's ``main()`` began logging to (:func:`begin_logging`), or None (an
    embedded daemon, whose lines go through Twisted's log as the application set it up)."""
    return _direct
