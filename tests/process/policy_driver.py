"""Runs one drop-in daemon (``cli <name> flags...``) or twistd plugin (``twistd <plugin> flags...``)
as its real entry point, recording what the process policy had done when each listener opened.

Every ``tcp.Port.startListening`` records the collector's freeze count and full-collection
threshold, whether the pause timing is in ``gc.callbacks`` and how many memory-trim services
exist; the first one schedules a clean stop (the daemon's own shutdown). At exit the records,
plus the same figures then and whether the trim loop started, are written as JSON to the
file named by ``POLICY_PROBE_OUT``."""

from __future__ import annotations

import atexit
import gc
import json
import os
import sys

from twisted.internet import tcp

import nsqtw.runtime.process

OUT = os.environ["POLICY_PROBE_OUT"]
record: dict = {"listens": [], "trim_created": 0, "trim_started": 0}


def figures() -> dict:
    return {"freeze": gc.get_freeze_count(), "full_every": gc.get_threshold()[2],
            "timing": any(getattr(cb, "__module__", "") == "nsqtw.runtime.memory" for cb in gc.callbacks),
            "trim_created": record["trim_created"]}


_listen = tcp.Port.startListening


def startListening(self):  # noqa: N802 - Twisted's name
    record["listens"].append(figures())
    if len(record["listens"]) == 1:
        from twisted.internet import reactor
        reactor.callLater(0, reactor.stop)
    return _listen(self)


tcp.Port.startListening = startListening

_init = nsqtw.runtime.process.MemoryTrimService.__init__
_start = nsqtw.runtime.process.MemoryTrimService.startService


def trim_init(self, *a, **kw):
    record["trim_created"] += 1
    _init(self, *a, **kw)


def trim_start(self):
    record["trim_started"] += 1
    _start(self)


nsqtw.runtime.process.MemoryTrimService.__init__ = trim_init
nsqtw.runtime.process.MemoryTrimService.startService = trim_start


@atexit.register
def write() -> None:
    record["at_exit"] = figures()
    with open(OUT, "w") as f:
        json.dump(record, f)


kind, rest = sys.argv[1], sys.argv[2:]
if kind == "cli":
    from nsqtw.cli import main
    sys.exit(main(rest))
else:
    sys.argv = ["twistd", "--nodaemon", "--pidfile=", *rest]
    from twisted.scripts.twistd import run
    run()
