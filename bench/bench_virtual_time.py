#!/usr/bin/env python
"""
Virtual time against real time: a suite of N tests that each leave a message unfinished and
wait for nsqd to time it out and deliver it again.

* ``virtual``: ``nsqtw_clock``; the default ``--msg-timeout`` (60 s) passes with
  ``nsqtw_clock.advance(61)``;
* ``real``: the same test on real time with ``msg_timeout=1.0`` (the suite would take an
  hour per test at the default), waiting for the redelivery.

Each suite is one ``pytest`` run in a child process; the figure is its wall time, collection
and start-up included.

    python bench/bench_virtual_time.py          # 100 tests each
    python bench/bench_virtual_time.py -n 20
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

TEST = '''
import pytest
import pytest_twisted
from twisted.internet import defer

from nsqtw.client import Config, Consumer

VIRTUAL = {virtual}


@pytest.mark.parametrize("i", range({n}))
@pytest.mark.nsqtw_options(msg_timeout=60.0 if VIRTUAL else 1.0)
@pytest_twisted.ensureDeferred
async def test_redelivered({clock}nsqtw_nsqd, i):
    got = []
    again = defer.Deferred()

    def handler(msg):
        got.append(msg)
        if msg.attempts == 1:
            msg.disable_auto_response()
        else:
            again.callback(None)

    consumer = Consumer("t", "ch", handler, Config(heartbeat_interval=60 if VIRTUAL else 30))
    await consumer.connect_to_nsqd(nsqtw_nsqd.tcp_address)
    await nsqtw_nsqd.publish("t", b"x")
    await nsqtw_nsqd.wait_until(lambda: got)
    if VIRTUAL:
        nsqtw_clock.advance(61)
    await again
    got[0].finish()
    await consumer.stop()
'''


def run(n: int, virtual: bool) -> float:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "test_suite.py")
        with open(path, "w") as f:
            # the clock is a fixture the test asks for (the nsqd fixture then runs on it)
            f.write(TEST.format(virtual=virtual, n=n, clock="nsqtw_clock, " if virtual else ""))
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", path],
                              capture_output=True, text=True, cwd=d)
        elapsed = time.perf_counter() - t0
        if proc.returncode != 0 or f"{n} passed" not in proc.stdout:
            sys.exit(f"the {'virtual' if virtual else 'real'}-time suite failed:\n{proc.stdout}{proc.stderr}")
        return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=100, help="tests per suite (default 100)")
    args = ap.parse_args()
    virtual = run(args.n, True)
    real = run(args.n, False)
    print(f"{args.n} tests, a redelivery after --msg-timeout each")
    print(f"  virtual time (nsqtw_clock, msg_timeout 60 s): {virtual:7.2f} s  ({virtual / args.n * 1000:.1f} ms a test)")
    print(f"  real time (msg_timeout 1 s):                  {real:7.2f} s  ({real / args.n * 1000:.1f} ms a test)")


if __name__ == "__main__":
    main()
