#!/usr/bin/env python
"""
Fixture benchmark: what a test pays for a real broker, in-process versus a spawned process.

Each figure is start-to-ready plus teardown, per broker, over N rounds
(median, p90, max, in milliseconds):

* ``pytest fixture nsqd``: :func:`nsqtw.testing.pytest_plugin.start_nsqd_fixture`
  (127.0.0.1:0, data in a fresh tmpfs directory) then ``stop()`` (listeners
  closed, data directory removed): exactly what ``nsqtw_nsqd`` does;
* ``pytest fixture nsqlookupd`` and ``pytest fixture cluster (lookupd + 2 nsqd)``
  (until both nsqd are registered);
* ``embed.start_nsqd`` (its default temporary directory on disk) for comparison;
* ``spawn nsqtw nsqd``: ``python -m nsqtw.tools.nsqd`` as a process, until its
  TCP port accepts, then SIGTERM and wait;
* ``spawn Go nsqd``: the same with Go's ``nsqd`` if one is on PATH (and is Go's).

    python bench/bench_fixture.py            # 200 in-process rounds, 10 spawns
    python bench/bench_fixture.py -n 1000 --spawn 20 --json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any
from collections.abc import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def summary(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    return {"n": len(s), "median_ms": round(s[len(s) // 2] * 1e3, 3), "p90_ms": round(s[int(len(s) * 0.9)] * 1e3, 3),
            "max_ms": round(s[-1] * 1e3, 3)}


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_accepting(port: int, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"broker exited {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.002)
    raise RuntimeError("broker did not accept in time")


def spawn_round(argv: list[str], data: str) -> float:
    port, http = free_port(), free_port()
    t = time.perf_counter()
    proc = subprocess.Popen(argv + [f"--tcp-address=127.0.0.1:{port}", f"--http-address=127.0.0.1:{http}",
                                    f"--data-path={data}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, PYTHONPATH=ROOT))
    try:
        wait_accepting(port, proc)
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return time.perf_counter() - t


def go_nsqd() -> str | None:
    path = shutil.which("nsqd")
    if not path:
        return None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, timeout=10).stdout.decode()
    except (OSError, subprocess.SubprocessError):
        return None
    return path if "nsqtw" not in out and "go" in out else None


def in_process(rounds: int) -> dict[str, dict[str, float]]:
    from twisted.internet import defer, reactor

    from nsqtw.embed import start_nsqd
    from nsqtw.testing.pytest_plugin import start_cluster_fixture, start_lookupd_fixture, start_nsqd_fixture

    results: dict[str, dict[str, float]] = {}

    async def measure(name: str, start: Callable[[], Any], n: int) -> None:
        handle = await start()  # warm up imports and code paths
        await handle.stop()
        samples = []
        for _ in range(n):
            t = time.perf_counter()
            handle = await start()
            await handle.stop()
            samples.append(time.perf_counter() - t)
        results[name] = summary(samples)

    async def main() -> None:
        await measure("pytest fixture nsqd", start_nsqd_fixture, rounds)
        await measure("pytest fixture nsqlookupd", start_lookupd_fixture, rounds)
        await measure("pytest fixture cluster (lookupd + 2 nsqd)", lambda: start_cluster_fixture(2),
                      max(10, rounds // 10))
        await measure("embed.start_nsqd (temp dir on disk)", start_nsqd, max(10, rounds // 4))

    failure: list[Any] = []

    def go() -> None:
        d = defer.ensureDeferred(main())
        d.addErrback(failure.append)
        d.addBoth(lambda _: reactor.stop())

    reactor.callWhenRunning(go)
    reactor.run()
    if failure:
        failure[0].raiseException()
    return results


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", type=int, default=200, help="in-process rounds (default 200)")
    p.add_argument("--spawn", type=int, default=10, help="process rounds (default 10)")
    p.add_argument("--json", action="store_true", help="print JSON")
    args = p.parse_args()

    results = in_process(args.n)
    data = tempfile.mkdtemp(prefix="nsqtw-bench-")
    try:
        if args.spawn:
            argv = [sys.executable, "-m", "nsqtw.tools.nsqd"]
            results["spawn nsqtw nsqd (python -m nsqtw.tools.nsqd)"] = summary(
                [spawn_round(argv, data) for _ in range(args.spawn)])
            go = go_nsqd()
            if go:
                results["spawn Go nsqd"] = summary([spawn_round([go], data) for _ in range(args.spawn)])
            else:
                results["spawn Go nsqd"] = {"skipped": "no Go nsqd on PATH"}  # type: ignore[dict-item]  # a note where numbers go
    finally:
        shutil.rmtree(data, ignore_errors=True)

    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for name, r in results.items():
            if "skipped" in r:
                print(f"{name:50s} skipped: {r['skipped']}")
            else:
                print(f"{name:50s} median {r['median_ms']:8.3f} ms  p90 {r['p90_ms']:8.3f} ms  "
                      f"max {r['max_ms']:8.3f} ms  (n={r['n']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
