"""A twistd ``usage.Options`` that parses Go-style NSQ flags into an nsqtw options object."""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

from twisted.python import usage

from .. import version_line
from ..options import OptionError
from .flags import HelpRequested, VersionRequested, options_from_argv, usage_text

__all__ = ["GoFlagOptions", "exit_1_on_loss", "build_or_exit", "twistd_config", "serve_under_twistd",
           "summary_line", "DAEMON_PREFIXES"]

_T = TypeVar("_T")

#: the daemon each log namespace belongs to, for the lines of a process that runs several
DAEMON_PREFIXES = {"nsqtw.nsqd": "[nsqd] ", "nsqtw.diskqueue": "[nsqd] ", "nsqtw.stats": "[nsqd] ",
                   "nsqtw.lookupd": "[nsqlookupd] ", "nsqtw.admin": "[nsqadmin] "}


def twistd_config(options: Any) -> Any:
    """twistd's own options (``--nodaemon``, ``--logfile``, ...) when ``options`` were parsed by
    twistd as a plugin's sub-command, else None (a test or an application calling makeService)."""
    parent = getattr(options, "parent", None)
    if parent is None or not hasattr(parent, "get") or "nodaemon" not in parent:
        return None
    return parent


def _fatal(prog: str, text: str, config: Any) -> str:
    """Write the drop-in command's FATAL line where the person who started twistd reads it."""
    from .golog import go_log_line

    line = go_log_line(f"[{prog}] ", 5, text)
    # twistd has redirected sys.stderr into its log by now: write to the real one
    stream = sys.__stderr__ if sys.__stderr__ is not None else sys.stderr
    try:
        stream.write(line)
        stream.flush()
    except (OSError, ValueError):  # pragma: no cover - a closed stderr
        pass
    return line


def build_or_exit(prog: str, build: Callable[[], _T], options: Any = None) -> _T:
    """Build a daemon's service tree for twistd; a configuration it refuses (a TLS file that is
    missing, an address it cannot use) ends twistd with the drop-in command's one FATAL line
    and status 1, never a traceback.

    Given the plugin's ``options`` and run by twistd, the tree is also set up to start as the
    drop-in commands start (:func:`serve_under_twistd`)."""
    from .golog import go_log_line

    try:
        service = build()
    except (OptionError, TypeError, ValueError) as e:
        sys.stderr.write(go_log_line(f"[{prog}] ", 5, f"failed to instantiate {prog} - {e}"))
        sys.stderr.flush()
        raise SystemExit(1) from None
    config = twistd_config(options)
    if config is not None:
        serve_under_twistd(prog, service, getattr(options, "config", None), config)
    return service


def summary_line(service: Any) -> str:
    """What a started daemon (or the all-in-one) serves where, in one line:
    ``serving nsqd tcp://127.0.0.1:4150 http://127.0.0.1:4151; nsqlookupd ...; nsqadmin ...``."""
    from .listen import format_address

    parts = []
    daemons = [(name, getattr(service, attr, None)) for name, attr in
               (("nsqlookupd", "lookupd"), ("nsqd", "nsqd"), ("nsqadmin", "admin"))]
    if not any(d is not None for _, d in daemons):  # a single daemon
        name = {"nsqtw.lookupd": "nsqlookupd", "nsqtw.admin": "nsqadmin"}.get(
            getattr(service, "log_namespace", ""), "nsqd")
        daemons = [(name, service)]
    for name, daemon in daemons:
        if daemon is None:
            continue
        urls = []
        for scheme, attr in (("tcp", "tcp_listener"), ("http", "http_listener"), ("https", "https_listener")):
            listener = getattr(daemon, attr, None)
            port = getattr(listener, "port", None)
            if port is not None:
                urls.append(f"{scheme}://{format_address(port)}")
        parts.append(" ".join([name, *urls]))
    text = "serving " + "; ".join(parts)
    nsqd = getattr(service, "nsqd", service)
    data_path = getattr(nsqd, "data_path", None)
    if data_path and getattr(nsqd, "tcp_listener", None) is not None:
        text += f"; data in {os.path.abspath(data_path)}"
    return text


def serve_under_twistd(prog: str, service: Any, daemon_options: Any, config: Any) -> None:
    """Make ``twistd <plugin>`` start, log and refuse as the drop-in commands do.

    * Logs: unless ``--logger`` or ``--syslog`` chose otherwise, twistd's log (stdout under
      ``-n``, ``--logfile``, or twistd.log) gets NSQ's lines (``[nsqd] 2024/05/01 10:00:00.123456
      INFO: ...``, each daemon of the all-in-one under its own name) from ``--log-level`` up
      (``info`` by default), and none of Twisted's chatter below warnings (factories starting,
      ports closing, HTTP access lines, nsqadmin's own polling among them);
      ``--log-level=debug`` shows it all (the lookupd heartbeats, Twisted's lines, HTTP access
      lines where a server writes them).
    * A start it refuses (a port in use, a data path it cannot lock or write, ...) is one FATAL
      line on stderr and status 1, as with the drop-in commands, never a traceback; when twistd
      daemonizes, the line goes to the log and twistd's parent reports the error.
    * Once every listener is bound: one line saying what is served where.
    """
    from twisted.logger import Logger

    from .reactor import resolve_reactor

    reactor = resolve_reactor()
    log = Logger(namespace="nsqtw")
    level = int(getattr(daemon_options, "log_level", 2) or 2)
    prefix = str(getattr(daemon_options, "log_prefix", f"[{prog}] "))
    daemonized = not config.get("nodaemon")

    if not (config.get("logger") or config.get("syslog")):
        observer = _twistd_log_observer(config, prefix, level, prog)
        parent_setter = service.setServiceParent

        def set_service_parent(parent: Any) -> Any:
            # twistd asks the application for an ILogObserver component before making its own
            # (the way a .tac file chooses its log); a plugin reaches the application only here
            from twisted.logger import ILogObserver
            from twisted.python.components import Componentized

            if isinstance(parent, Componentized) and parent.getComponent(ILogObserver, None) is None:
                parent.setComponent(ILogObserver, observer)
            return parent_setter(parent)

        service.setServiceParent = set_service_parent

    def refuse(text: str) -> None:
        if daemonized:
            log.critical("{text}", text=text)
        else:
            _fatal(prog, text, config)

    start = service.startService

    def start_service() -> None:
        for namespace, text in _startup_lines(prog, daemon_options):
            Logger(namespace=namespace).info("{text}", text=text)
        try:
            start()
        except Exception as e:
            text = f"failed to instantiate {prog} - {e}"
            refuse(text)
            # twistd stops the whole tree at shutdown; only what did start may be stopped (a
            # nsqd that never started must not write its metadata)
            service.stopService = partial(_stop_started, service)
            if daemonized:
                _daemon_refused(text, config)
            # as the drop-in command: stop what did start once the reactor runs, then exit 1
            _exit_1_after_shutdown(reactor)
            reactor.callWhenRunning(reactor.stop)
            return
        service.ready().addCallbacks(lambda _: log.info("{summary}", summary=summary_line(service)), late)

    def late(failure: Any) -> None:
        err = getattr(failure.value, "subFailure", failure)
        refuse(f"failed to instantiate {prog} - {err.getErrorMessage()}")
        _exit_1_after_shutdown(reactor)
        if reactor.running:
            reactor.stop()
        else:
            reactor.callWhenRunning(reactor.stop)

    service.startService = start_service


def _startup_lines(prog: str, daemon_options: Any) -> list[tuple[str, str]]:
    """What the drop-in commands (and Go's daemons) log first: nsqd's version and ID, nsqadmin's
    version (nsqlookupd's service logs its own)."""
    if prog in ("nsqd", "nsqtw"):
        return [("nsqtw.nsqd", version_line("nsqd")),
                ("nsqtw.nsqd", f"ID: {getattr(daemon_options, 'node_id', '')}")]
    if prog == "nsqadmin":
        return [("nsqtw.admin", version_line("nsqadmin"))]
    return []


def _stop_started(service: Any) -> Any:
    """Stop the parts of a tree whose start failed half way that did start."""
    from twisted.internet import defer

    if not service.running:
        return None
    if getattr(service, "nsqd", None) is None:  # one daemon (not the all-in-one): its own stop knows what started
        return type(service).stopService(service)
    service.running = 0
    stops = [defer.maybeDeferred(child.stopService) for child in reversed(list(service)) if child.running]
    return defer.DeferredList(stops)


def _daemon_refused(text: str, config: Any) -> None:
    """A daemonized twistd cannot start: tell twistd's waiting parent (it prints "An error has
    occurred: ..." and exits 1), remove the pidfile and end at once; threads that did start
    (nsqd's disk thread) would otherwise keep a process that serves nothing alive."""
    # the pidfile first: the parent returns as soon as it reads the message
    pidfile = config.get("pidfile")
    try:
        if pidfile:
            with open(pidfile) as f:
                if f.read().strip() == str(os.getpid()):
                    os.remove(pidfile)
    except OSError:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    pipe = config.get("statusPipe")
    if pipe is not None:
        try:
            os.write(pipe, b"1 " + text.encode("utf-8", "replace")[:98])
            os.close(pipe)
        except OSError:
            pass
    os._exit(1)


def _exit_1_after_shutdown(reactor: Any) -> None:
    def exit_1() -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(1)

    reactor.addSystemEventTrigger("after", "shutdown", lambda: atexit.register(exit_1))


def _twistd_log_observer(config: Any, prefix: str, level: int, prog: str) -> Any:
    """NSQ's log lines into the file twistd would have logged to (as twistd chooses it)."""
    from .golog import GoLogObserver

    logfile = config.get("logfile") or ""
    stream: Any
    if logfile == "-" or (config.get("nodaemon") and not logfile):
        stream = sys.stdout
    else:
        from twisted.python.logfile import LogFile

        stream = _TextToBytes(LogFile.fromFullPath(logfile or "twistd.log"))
    prefixes = DAEMON_PREFIXES if prog == "nsqtw" else None
    # --log-level=debug shows everything, Twisted's own lines (HTTP access lines) included
    observer = GoLogObserver(stream, "[nsqtw] " if prog == "nsqtw" else prefix, level, prefixes=prefixes,
                             others_from=1 if level <= 1 else 3)
    from twisted.logger import ILogObserver
    from zope.interface import directlyProvides

    directlyProvides(observer, ILogObserver)  # else twistd would wrap it as a legacy observer
    return observer


class _TextToBytes:
    """twistd's rotating LogFile takes bytes; the observer writes text."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    def write(self, text: str) -> None:
        self.raw.write(text.encode("utf-8", "replace"))

    def flush(self) -> None:
        self.raw.flush()


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


#: the pidfile twistd writes when none is named
_TWISTD_DEFAULT_PIDFILE = "twistd.pid"


class GoFlagOptions(usage.Options):
    """Options for one daemon; ``self.config`` holds the validated options object."""

    options_class: Any = None
    prog = "nsqd"

    def __init__(self) -> None:
        super().__init__()
        self.config: Any = None

    def parseOptions(self, options: list[str] | None = None) -> None:
        """Parse NSQ's flags; a flag refused raises ``usage.UsageError``, except under twistd,
        where it ends the process as the drop-in command would: an unknown flag or a missing
        value prints Go's message and the usage and exits 2, a bad value is one FATAL line
        (``failed to instantiate nsqd - --node-id must be [0,1024)``) and status 1."""
        from .flags import FlagSyntaxError

        argv = sys.argv[1:] if options is None else list(options)
        twistd = twistd_config(self)
        under_twistd = twistd is not None
        if under_twistd and twistd.get("nodaemon") and twistd.get("pidfile") == _TWISTD_DEFAULT_PIDFILE:
            # in the foreground (a terminal, a supervisor) no pidfile unless one is named, as NSQ's
            # daemons: else a second `twistd -n ...` from the same directory refuses to start
            twistd["pidfile"] = ""
        try:
            self.config = options_from_argv(self.options_class, argv)
        except HelpRequested:
            sys.stdout.write(self.getUsage())
            sys.exit(0)
        except VersionRequested:
            sys.stdout.write(version_line(self.prog) + "\n")
            sys.exit(0)
        except FlagSyntaxError as e:
            if under_twistd:
                sys.stderr.write(f"{e}\n{self.getUsage()}")
                sys.exit(2)
            raise usage.UsageError(str(e)) from None
        except (OptionError, TypeError, ValueError) as e:
            if under_twistd:
                _fatal(self.prog, f"failed to instantiate {self.prog} - {e}", None)
                sys.exit(1)
            raise usage.UsageError(str(e)) from None

    def getUsage(self, width: int | None = None) -> str:
        return usage_text(self.options_class, self.prog)

    def __str__(self) -> str:
        return self.getUsage()
