#!/usr/bin/env python
"""
Where a replicated origin's time goes per PUB, section by section, under Go's ``bench_pub``.

Starts a replicated pair as ``bench/bench_replication.py`` does (node ids 1 and 2, a link
authenticated with a secret file; or, with ``--unreplicated``, one nsqd), the origin in this script's ``--as-origin`` mode: nsqtw's ``nsqd`` with the four
places a PUB's work happens wrapped in ``perf_counter`` accumulators (a client's read, the
replication link's read, the end-of-turn batch flush, and ``epoll``'s poll itself).  After a
second of ``bench_pub`` the counts are reset, after four more they are written out, and the
time of each section per PUB is printed beside the process's CPU time per PUB.  The wrappers
cost about half a microsecond a call: compare runs of this script with each other, not with
``bench_replication.py``.

    python bench/origin_sections.py                 # replicated (spin off: NSQTW_SPIN_US=0)
    python bench/origin_sections.py --unreplicated  # the same nsqd without a peer
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from time import perf_counter
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = ("client_read", "link_read", "turn_flush", "poll")


def as_origin(argv: list[str]) -> int:
    """nsqd, its PUB path's sections timed; SIGUSR2 resets the counts, SIGUSR1 writes them."""
    sys.path.insert(0, str(ROOT))
    import nsqtw.nsqd.replication as replication
    import nsqtw.nsqd.tcp as tcp
    import nsqtw.runtime.spinreactor as spinreactor
    import nsqtw.runtime.turn as turn
    from nsqtw.cli import nsqd_main

    spent = dict.fromkeys(SECTIONS, 0.0)
    calls = dict.fromkeys(SECTIONS, 0)

    def timed(fn: Any, key: str) -> Any:
        def wrapper(*args: Any) -> Any:
            t = perf_counter()
            try:
                return fn(*args)
            finally:
                spent[key] += perf_counter() - t
                calls[key] += 1
        return wrapper

    tcp.NsqdProtocol.dataReceived = timed(tcp.NsqdProtocol.dataReceived, "client_read")  # type: ignore[method-assign]  # measuring
    replication._PeerLink.dataReceived = timed(replication._PeerLink.dataReceived, "link_read")  # type: ignore[method-assign]  # measuring
    turn.TurnBatcher.run = timed(turn.TurnBatcher.run, "turn_flush")  # type: ignore[method-assign]  # measuring
    parts = spinreactor.epoll_parts

    def timed_parts(reactor: Any) -> Any:
        poll, selectables, dispatch = parts(reactor)
        return timed(poll, "poll"), selectables, dispatch

    spinreactor.epoll_parts = timed_parts  # type: ignore[assignment]  # measuring
    start = [perf_counter(), time.process_time()]

    def reset(*_: Any) -> None:
        for key in SECTIONS:
            spent[key], calls[key] = 0.0, 0
        start[:] = [perf_counter(), time.process_time()]

    def write(*_: Any) -> None:
        with open(os.environ["NSQTW_SECTIONS_OUT"], "w") as f:
            f.write(f"wall {perf_counter() - start[0]} {time.process_time() - start[1]}\n")
            for key in SECTIONS:
                f.write(f"{key} {spent[key]} {calls[key]}\n")

    signal.signal(signal.SIGUSR2, reset)
    signal.signal(signal.SIGUSR1, write)
    return nsqd_main(argv)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--as-origin"]:
        return as_origin(argv[1:])
    replicated = "--unreplicated" not in argv
    spec = importlib.util.spec_from_file_location("bench_replication", ROOT / "bench" / "bench_replication.py")
    assert spec is not None and spec.loader is not None
    br = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(br)
    os.environ.setdefault("NSQTW_SPIN_US", "0")
    work = tempfile.mkdtemp(prefix="nsqtw-sections-")
    out = f"{work}/sections"
    os.environ["NSQTW_SECTIONS_OUT"] = out
    procs: list[subprocess.Popen[Any]] = []
    origin_cmd = [sys.executable, str(Path(__file__).resolve()), "--as-origin"]
    try:
        if replicated:
            port = br.start_pair(work, 10_000, procs, origin_cmd)
        else:
            os.mkdir(f"{work}/origin")
            single, port = br.start(origin_cmd, f"{work}/origin", 10_000, "--node-id=1")
            procs.append(single)
        origin = procs[-1]
        bench = subprocess.Popen([str(br.GO / "bench_pub"), f"--nsqd-tcp-address=127.0.0.1:{port}",
                                  "--runfor=6s", "--size=200"], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
        time.sleep(1)
        origin.send_signal(signal.SIGUSR2)
        time.sleep(4)
        origin.send_signal(signal.SIGUSR1)
        said = bench.communicate()[0]
        for _ in range(100):
            if os.path.exists(out):
                break
            time.sleep(0.05)
        rows = {}
        with open(out) as f:
            for line in f:
                key, a, b = line.split()
                rows[key] = (float(a), float(b))
    finally:
        for p in procs:
            p.kill()
            p.wait()
    wall, cpu = rows.pop("wall")
    pubs = rows["client_read"][1] or 1
    rate = [w for w in said.split() if w.endswith("ops/s")]
    print(f"{'replicated' if replicated else 'unreplicated'}: bench_pub {rate[-1] if rate else '?'}; "
          f"origin per PUB: {wall / pubs * 1e6:.1f} µs of wall time, {cpu / pubs * 1e6:.1f} µs of CPU")
    for key, (secs, n) in rows.items():
        print(f"  {key:12s} {secs / pubs * 1e6:6.1f} µs per PUB  ({n / pubs:.2f} calls per PUB, "
              f"{secs / max(n, 1) * 1e6:.1f} µs each)")
    rest = wall - sum(secs for secs, _ in rows.values())
    print(f"  {'the loop':12s} {rest / pubs * 1e6:6.1f} µs per PUB  (mainLoop, dispatch, the rest)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
