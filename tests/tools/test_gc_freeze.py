"""The drop-in daemons move their start-up objects out of the collector's reach once started.

A full collection over the ~230,000 objects imports leave behind pauses the reactor for
15-20 ms; a command sent then goes unanswered, and a daemon killed in that pause resets its
clients (unread data) instead of closing them. Embedded brokers leave the collector alone.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import gc, sys
from nsqtw.service import listen
if sys.argv[1] == "own":
    listen.enable_warm_up_threads()
factory = listen.LazyFactory(lambda: object())
before = gc.get_freeze_count()
factory.build()
print(before, gc.get_freeze_count(), gc.get_threshold()[2])
"""


def _freeze_counts(mode: str) -> tuple[int, int, int]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], cwd=str(ROOT), capture_output=True, text=True,
                         timeout=60, check=True)
    before, after, full_every = out.stdout.split()
    return int(before), int(after), int(full_every)


def test_a_daemon_of_its_own_freezes_its_start_up_objects():
    before, after, full_every = _freeze_counts("own")
    assert before == 0
    assert after > 10_000  # every module, class and function imported so far
    assert full_every == 100  # full collections ten times rarer than CPython's default


def test_an_embedded_broker_leaves_the_collector_alone():
    assert _freeze_counts("embedded") == (0, 0, 10)
