#!/usr/bin/env python
"""
What replication costs a publisher: Go's bench tools against a replicated pair of nsqtw nsqd
(``--replica-peer``, ``--replication-min-acks=1``), the same nsqd unreplicated, and Go's nsqd.

    python bench/bench_replication.py                 # 5 s per workload
    RUNFOR=10s python bench/bench_replication.py

Workloads as ../shared/bench/perf-vs-go's: ``pub_mem`` (Go's bench_writer, MPUB batches of 200,
200-byte bodies, --mem-queue-size=10000000) and ``pub_one`` (Go's bench_pub, one PUB per round
trip).  Prints msg/s and the ratio replicated / unreplicated (the issue's target: at least 0.5;
printed, not asserted).  Needs ../shared/anchors/go-nsq-1.3.0 (GO_NSQ to override).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GO = Path(os.environ.get("GO_NSQ", ROOT.parent / "shared" / "anchors" / "go-nsq-1.3.0"))
RUNFOR = os.environ.get("RUNFOR", "5s")
NSQTW = [sys.executable, "-m", "nsqtw.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def accepting(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


def start(cmd: list[str], data: str, memq: int, *flags: str) -> tuple[subprocess.Popen, int]:
    tcp = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([*cmd, f"--tcp-address=127.0.0.1:{tcp}", f"--http-address=127.0.0.1:{free_port()}",
                             f"--data-path={data}", f"--mem-queue-size={memq}", *flags],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    for _ in range(3000):
        if accepting(tcp):
            break
        time.sleep(0.01)
    return proc, tcp


def rate(cmd: list[str]) -> float:
    done = subprocess.run(cmd, capture_output=True, text=True)
    out = done.stdout + done.stderr
    found = re.findall(r" - ([0-9.]+)ops/s", out)
    return float(found[-1]) if found else 0.0


def measure(kind: str, workload: str) -> float:
    work = tempfile.mkdtemp(prefix="nsqtw-bench-repl-")
    procs = []
    try:
        memq = 10_000_000 if workload == "pub_mem" else 10_000
        if kind == "go":
            p, tcp = start([str(GO / "nsqd")], work, memq)
            procs.append(p)
        elif kind == "replicated":
            rport = free_port()
            os.mkdir(f"{work}/peer")
            os.mkdir(f"{work}/origin")
            peer, _ = start(NSQTW, f"{work}/peer", memq, "--node-id=2", f"--replication-address=127.0.0.1:{rport}")
            procs.append(peer)
            p, tcp = start(NSQTW, f"{work}/origin", memq, "--node-id=1", f"--replica-peer=127.0.0.1:{rport}")
            procs.append(p)
            time.sleep(1.5)  # the link comes up
        else:
            p, tcp = start(NSQTW, work, memq, "--node-id=1")
            procs.append(p)
        addr = f"--nsqd-tcp-address=127.0.0.1:{tcp}"
        if workload == "pub_mem":
            return rate([str(GO / "bench_writer"), addr, f"--runfor={RUNFOR}", "--size=200", "--batch-size=200"])
        return rate([str(GO / "bench_pub"), addr, f"--runfor={RUNFOR}", "--size=200"])
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    for tool in ("nsqd", "bench_writer", "bench_pub"):
        if not (GO / tool).exists():
            print(f"missing {GO / tool}")
            return 2
    print(f"{'workload':9s} {'replicated':>11s} {'nsqtw':>11s} {'Go nsqd':>11s}  replicated/nsqtw")
    for workload in ("pub_mem", "pub_one"):
        r = measure("replicated", workload)
        u = measure("nsqtw", workload)
        g = measure("go", workload)
        print(f"{workload:9s} {r:>11,.0f} {u:>11,.0f} {g:>11,.0f}  {r / u if u else 0:.2f}  (msg/s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
