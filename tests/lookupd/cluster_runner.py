"""
Run one nsqtw daemon in a process of its own, for the multi-process cluster test.

    python cluster_runner.py nsqd <nsqd flags>
    python cluster_runner.py nsqlookupd <nsqlookupd flags>

It builds the service tree exactly as ``twistd nsqd`` / ``twistd nsqlookupd``
would (the tap's ``Options`` and ``makeService``), gives nsqd its lookupd peers
if the tree has none yet, logs to stdout and prints ``READY tcp=<port>
http=<port>`` once both listeners are bound.  SIGTERM stops it cleanly.
"""

from __future__ import annotations

import sys
from typing import Any


def main(argv: list[str]) -> None:
    from twisted.internet import reactor
    from twisted.logger import globalLogBeginner, textFileLogObserver

    globalLogBeginner.beginLoggingTo([textFileLogObserver(sys.stdout)], redirectStandardIO=False)
    prog, flags = argv[0], argv[1:]
    if prog == "nsqd":
        from nsqtw.nsqd import tap
    elif prog == "nsqlookupd":
        from nsqtw.lookupd import tap  # type: ignore[no-redef]  # one of the taps by name
    else:
        raise SystemExit(f"unknown daemon {prog!r}")
    options = tap.Options()
    options.parseOptions(flags)
    service: Any = tap.makeService(options)
    if prog == "nsqd":
        from nsqtw.nsqd.lookup_peers import LookupPeersService

        if LookupPeersService.name not in service.namedServices:
            LookupPeersService(service).setServiceParent(service)

    def ready(_: Any) -> None:
        sys.stdout.write(f"READY tcp={service.tcp_port} http={service.http_port}\n")
        sys.stdout.flush()

    def start() -> None:
        service.startService()
        service.ready().addCallback(ready)

    reactor.callWhenRunning(start)
    reactor.addSystemEventTrigger("before", "shutdown", service.stopService)
    reactor.run()


if __name__ == "__main__":
    main(sys.argv[1:])
