"""
Drop-in ``nsqd`` / ``nsqlookupd`` / ``nsqadmin`` commands: Go's flags in, a running daemon out.

Scripts and test harnesses that start NSQ's binaries can start these instead:

* Go's ``flag`` syntax in every form (``-flag=value``, ``--flag=value``,
  ``-flag value``, ``--flag value``, bare and ``=true``/``=false`` booleans,
  repeated flags) and ``--config`` TOML, flags winning over the file;
* every flag NSQ 1.3.0 defines is accepted; one for a feature nsqtw lacks
  is refused at start with a message naming it, never silently ignored
  (deprecated no-op flags such as ``--worker-id`` are accepted with a
  warning, as Go accepts them); unknown flags fail with Go's ``flag
  provided but not defined`` and exit code 2, a bad value with exit code 1;
* ``--version`` prints ``nsqd v1.3.0 (built w/nsqtw-0.1.0)`` on stdout (Go's shape: one
  token after ``built w/``);
* logs on stderr in Go's layout (``[nsqd] 2024/05/01 10:00:00.123456 INFO:
  TCP: listening on 127.0.0.1:4150``), naming the real bound addresses when
  given port 0 (also ``HTTP:`` and, with a TLS certificate, ``HTTPS:``);
* the working directory as nsqd's data path when none is given;
* ``--lookupd-tcp-address`` registers with nsqlookupd;
* a clean exit (0) on SIGTERM and SIGINT, and SO_REUSEADDR on every
  listening socket (Twisted sets it), so the same ports can be bound again
  right after a crash.

``python -m nsqtw.cli [nsqd|nsqlookupd|nsqadmin] [flags]`` runs one (nsqd when
no name is given); ``python -m nsqtw.tools.nsqd`` and friends do the same.

Internal: applications import the public face (``nsqtw.embed``, ``nsqtw.client``, ``nsqtw.testing``, ``nsqtw.options``, ``nsqtw.errors``).
"""

from __future__ import annotations

import signal
import sys
from typing import Any
from collections.abc import Callable

from . import version_line as _version_line
from .options import OptionError

__all__ = ["nsqd_main", "nsqlookupd_main", "nsqadmin_main", "run_daemon", "main", "DAEMONS"]

#: flags Go still accepts but that do nothing (name -> kind)
_DEPRECATED: dict[str, dict[str, str]] = {
    "nsqd": {"worker-id": "bool"},
}


def version_line(prog: str) -> str:
    return _version_line(prog)


def run_daemon(prog: str, argv: list[str], options_class: Any, build: Callable[[Any, Any], Any],
               prefix: str, defaults: dict | None = None,
               after_build: Callable[[Any], None] | None = None,
               startup_lines: Callable[[Any], list[str]] | None = None, lean: bool = False) -> int:
    """Parse Go-style flags, start the service tree, run the reactor until a signal.

    ``lean``: before anything of Twisted is imported, leave out what the daemon does not use
    (:func:`nsqtw.runtime.lean.apply_lean_imports`: no TLS stack when its options ask for no
    TLS); ``build`` should then import the service tree itself, when called."""
    from .runtime.flags import FlagSyntaxError, HelpRequested, VersionRequested, options_from_argv, usage_text
    from .runtime.golog import go_log_line

    def fatal(text: str, at: str = prefix) -> None:
        sys.stderr.write(go_log_line(at, 5, text))
        sys.stderr.flush()

    def warn(text: str) -> None:
        sys.stderr.write(go_log_line(prefix, 3, text.removeprefix("WARNING: ")))

    try:
        options = options_from_argv(options_class, argv, ignored=_DEPRECATED.get(prog), warn=warn,
                                    **(defaults or {}))
    except HelpRequested:
        sys.stderr.write(usage_text(options_class, prog))
        return 0
    except VersionRequested:
        sys.stdout.write(version_line(prog) + "\n")
        sys.stdout.flush()
        return 0
    except FlagSyntaxError as e:
        sys.stderr.write(f"{e}\n")
        sys.stderr.write(usage_text(options_class, prog))
        return 2
    except (OptionError, TypeError, ValueError) as e:
        fatal(f"failed to instantiate {prog} - {e}")
        return 1

    if lean:  # first: nothing of Twisted imported yet
        from .runtime.lean import apply_lean_imports
        apply_lean_imports(options)
    from .runtime.reactor import resolve_reactor
    from .runtime.spinreactor import install_if_unset
    install_if_unset()  # the epoll reactor that polls briefly before sleeping (NSQTW_SPIN_US)
    reactor = resolve_reactor()

    from .runtime.listen import format_address
    from .runtime.golog import begin_logging

    log_prefix = getattr(options, "log_prefix", prefix)
    announced: set[str] = set()

    def note_listening(event: dict[str, Any]) -> bool:
        # ListeningService logs "<LABEL>: listening on <addr>"; remember which were shown
        if event.get("log_format") == "{label}: listening on {address}":
            announced.add(str(event.get("label")))
        return False

    begin_logging(log_prefix, getattr(options, "log_level", 2), drop=note_listening)
    info = lambda text: sys.stderr.write(go_log_line(log_prefix, 2, text))  # noqa: E731

    try:
        service = build(options, reactor)
        if after_build is not None:
            after_build(service)
    except Exception as e:
        fatal(f"failed to instantiate {prog} - {e}", log_prefix)
        return 1
    # a process of nsqtw's own: allocator, trim loop, collector, warm-up thread; before any listener
    from .runtime.process import apply_daemon_policy
    apply_daemon_policy(service, reactor)
    status = {"code": 0, "signals": 0}

    def started(_: Any) -> None:
        for label, attr_name in (("TCP", "tcp_listener"), ("HTTP", "http_listener"), ("HTTPS", "https_listener")):
            listener = getattr(service, attr_name, None)
            port = getattr(listener, "port", None) if listener is not None else None
            if port is not None and label not in announced:
                info(f"{label}: listening on {format_address(port)}")
                announced.add(label)
        sys.stderr.flush()

    def failed(f: Any) -> None:
        err = getattr(f.value, "subFailure", f)
        fatal(err.getErrorMessage() if hasattr(err, "getErrorMessage") else str(err), log_prefix)
        status["code"] = 1
        if reactor.running:
            reactor.stop()

    def on_signal(signum: int, frame: Any) -> None:
        status["signals"] += 1
        drain = getattr(service, "drain", None)
        if status["signals"] > 1 and drain is not None:  # a stop drains (--drain-timeout): stop now
            reactor.callFromThread(drain.cut_short)
            return
        reactor.callFromThread(lambda: reactor.stop() if reactor.running else None)

    def start() -> None:
        for line in (startup_lines(options) if startup_lines else []):
            info(line)
        try:
            service.startService()
        except Exception as e:
            fatal(f"failed to instantiate {prog} - {e}", log_prefix)
            status["code"] = 1
            reactor.stop()
            return
        service.ready().addCallbacks(started, failed)

    reactor.addSystemEventTrigger("before", "shutdown", lambda: service.stopService() if service.running else None)
    reactor.callWhenRunning(start)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    reactor.run(installSignalHandlers=False)
    lost = getattr(service, "lost_at_shutdown", 0)
    if lost:  # a clean stop on a full disk: never a silent success
        fatal(f"{lost} messages could not be written to disk at shutdown and are lost", log_prefix)
        status["code"] = 1
    return status["code"]


def nsqd_main(argv: list[str] | None = None) -> int:
    """The ``nsqd`` command."""
    from .options import NsqdOptions

    def build_nsqd(options: Any, reactor: Any) -> Any:  # imported once the lean imports are in place
        from .nsqd.service import build_nsqd
        return build_nsqd(options, reactor)

    args = sys.argv[1:] if argv is None else argv
    return run_daemon("nsqd", args, NsqdOptions, build_nsqd, "[nsqd] ",
                      startup_lines=lambda o: [version_line("nsqd"), f"ID: {o.node_id}"], lean=True)


def nsqlookupd_main(argv: list[str] | None = None) -> int:
    """The ``nsqlookupd`` command."""
    from .lookupd.options import LookupdOptions

    def build_lookupd(options: Any, reactor: Any) -> Any:  # imported once the lean imports are in place
        from .lookupd.service import build_lookupd
        return build_lookupd(options, reactor)

    args = sys.argv[1:] if argv is None else argv
    return run_daemon("nsqlookupd", args, LookupdOptions, build_lookupd, "[nsqlookupd] ", lean=True)


def nsqadmin_main(argv: list[str] | None = None) -> int:
    """The ``nsqadmin`` command."""
    from .admin.options import AdminOptions
    from .admin.service import build_admin

    args = sys.argv[1:] if argv is None else argv
    return run_daemon("nsqadmin", args, AdminOptions, build_admin, "[nsqadmin] ",
                      startup_lines=lambda o: [version_line("nsqadmin")])


DAEMONS = {"nsqd": nsqd_main, "nsqlookupd": nsqlookupd_main, "nsqadmin": nsqadmin_main}


def main(argv: list[str] | None = None) -> int:
    """``python -m nsqtw.cli [nsqd|nsqlookupd|nsqadmin] [flags]`` (nsqd by default)."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args and args[0] in DAEMONS:
        return DAEMONS[args[0]](args[1:])
    return nsqd_main(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
