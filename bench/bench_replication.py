#!/usr/bin/env python
"""
What replication costs a publisher: Go's bench tools against a replicated pair of nsqtw nsqd
(``--replica-peer``, ``--replication-min-acks=1``, ``--node-id`` 1 and 2, an authenticated link:
``--replication-secret-file``, so the handshake and the sealed frames are in the figures), the
same nsqd unreplicated, and Go's nsqd.

    python bench/bench_replication.py                 # 5 s per workload
    RUNFOR=10s python bench/bench_replication.py
    ROUNDS=3 python bench/bench_replication.py        # medians of 3 rounds (the figures to report)
    REPLICATION_SECURITY=insecure python bench/bench_replication.py   # the pair without its secret

Workloads as NSQ's own bench tools run them: ``pub_mem`` (Go's bench_writer, MPUB batches of 200,
200-byte bodies, --mem-queue-size=10000000) and ``pub_one`` (Go's bench_pub, one PUB per round
trip).  Prints msg/s and the ratio replicated / unreplicated (printed, not asserted).  Needs NSQ
1.3.0's nsqd and its bench tools (``bench_writer``, ``bench_pub``) built from NSQ's sources, in
the directory ``GO_NSQ`` names.
Beside them two floors, pairs that make the same hops as nsqtw's pair and do no other work, against
unreplicated nsqtw: ``bench/replication_floor.py`` (a Python relay and peer on raw epoll: what no
Python implementation of a peer-acknowledged publish can beat on this machine) and the same
program in C, ``bench/replication_floor.c`` (built with ``cc`` when there is one: what is left is
the machine's, system calls, loopback TCP and waking three processes).  Both relays poll for
50 µs before they sleep, as nsqd's reactor does (``FLOOR_SPIN_US`` to change it).

Then NSQ's recommended workaround for the lack of replication: two Go nsqd written by a
dual-publishing client, which sends every PUB (pub_one) or MPUB of 200 (pub_mem) to both and
waits for both OKs before the next.  Go's bench tools cannot publish twice, so the dual publisher
is a small asyncio client here (plain protocol V2, one connection per core to each nsqd, as the Go
tools open one per core); the same client publishing once to the replicated nsqtw pair's origin
is the comparison (and to one Go nsqd, the client's own ceiling).  Prints msg/s and the ratio
replicated pair / workaround (the issue: the pair should publish faster)::

    python bench/bench_replication.py --workaround-only     # just that second table
"""

from __future__ import annotations

import os
import asyncio
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GO = Path(os.environ.get("GO_NSQ", ROOT.parent / "shared" / "anchors" / "go-nsq-1.3.0"))
RUNFOR = os.environ.get("RUNFOR", "5s")
ROUNDS = int(os.environ.get("ROUNDS", "1"))
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
    with tempfile.TemporaryFile("w+") as log:  # its log, read if it cannot start (the child keeps its own handle)
        proc = subprocess.Popen([*cmd, f"--tcp-address=127.0.0.1:{tcp}", f"--http-address=127.0.0.1:{free_port()}",
                                 f"--data-path={data}", f"--mem-queue-size={memq}", *flags],
                                stdout=subprocess.DEVNULL, stderr=log, env=env)
        for _ in range(3000):
            if accepting(tcp):
                break
            if proc.poll() is not None:  # refused to start (its FATAL line says why)
                log.seek(0)
                raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {log.read().strip()[-2000:]}")
            time.sleep(0.01)
    return proc, tcp


def write_secret(work: str) -> str:
    """The pair's --replication-secret-file (32 random bytes, hex, mode 600) in ``work``."""
    path = f"{work}/secret"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(os.urandom(32).hex() + "\n")
    return path


def start_pair(work: str, memq: int, procs: list[subprocess.Popen], origin_cmd: list[str] | None = None) -> int:
    """A replicated pair of nsqtw nsqd (the peer first, then the origin naming it, run as
    ``origin_cmd`` when given; node ids 2 and 1, a secret file in ``work``), their processes
    added to ``procs``; returns the origin's TCP port once the link is up."""
    rport = free_port()
    os.mkdir(f"{work}/peer")
    os.mkdir(f"{work}/origin")
    # REPLICATION_SECURITY=insecure: the same pair without the link's authentication (its cost)
    secret = ("--replication-insecure" if os.environ.get("REPLICATION_SECURITY") == "insecure"
              else f"--replication-secret-file={write_secret(work)}")
    peer, _ = start(NSQTW, f"{work}/peer", memq, "--node-id=2", f"--replication-address=127.0.0.1:{rport}", secret)
    procs.append(peer)
    origin, tcp = start(origin_cmd or NSQTW, f"{work}/origin", memq, "--node-id=1",
                        f"--replica-peer=127.0.0.1:{rport}", secret)
    procs.append(origin)
    time.sleep(1.5)  # the link comes up
    return tcp


_C_FLOOR: list[str | None] = []


def c_floor() -> str | None:
    """bench/replication_floor.c, built once into a temporary directory (None: no C compiler)."""
    if not _C_FLOOR:
        cc = shutil.which(os.environ.get("CC", "cc"))
        path = None
        if cc:
            path = os.path.join(tempfile.mkdtemp(prefix="nsqtw-floor-"), "floor")
            built = subprocess.run([cc, "-O2", "-o", path, str(ROOT / "bench" / "replication_floor.c")])
            path = path if built.returncode == 0 else None
        _C_FLOOR.append(path)
    return _C_FLOOR[0]


def start_floor(work: str, procs: list[subprocess.Popen], lang: str = "py") -> int | None:
    """A floor's relay and peer (a pair that does nothing but the hops): bench/replication_floor.py
    (``lang`` "py") or its C twin ("c"); returns the relay's TCP port (None: the C one cannot be built)."""
    rport, tcp = free_port(), free_port()
    env = dict(os.environ, FLOOR_SPIN_US=os.environ.get("FLOOR_SPIN_US", "50"))
    if lang == "c":
        exe = c_floor()
        if exe is None:
            return None
        peer, relay = [exe, "peer", str(rport), f"{work}/shadow"], [exe, "relay", str(tcp), str(rport)]
    else:
        floor = [sys.executable, str(ROOT / "bench" / "replication_floor.py")]
        peer = [*floor, "peer", "--port", str(rport), "--file", f"{work}/shadow"]
        relay = [*floor, "relay", "--port", str(tcp), "--peer", f"127.0.0.1:{rport}"]
    procs.append(subprocess.Popen(peer, env=env))
    while not accepting(rport):
        time.sleep(0.01)
    procs.append(subprocess.Popen(relay, env=env))
    while not accepting(tcp):
        time.sleep(0.01)
    return tcp


def rate(cmd: list[str]) -> float:
    done = subprocess.run(cmd, capture_output=True, text=True)
    out = done.stdout + done.stderr
    found = re.findall(r" - ([0-9.]+)ops/s", out)
    return float(found[-1]) if found else 0.0


def measure(kind: str, workload: str) -> float:
    work = tempfile.mkdtemp(prefix="nsqtw-bench-repl-")
    procs: list[subprocess.Popen] = []
    try:
        memq = 10_000_000 if workload == "pub_mem" else 10_000
        if kind in ("floor", "cfloor"):
            port = start_floor(work, procs, "c" if kind == "cfloor" else "py")
            if port is None:
                return 0.0
            tcp = port
        elif kind == "go":
            p, tcp = start([str(GO / "nsqd")], work, memq)
            procs.append(p)
        elif kind == "replicated":
            tcp = start_pair(work, memq, procs)
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


# --- NSQ's workaround: a client publishing every message to two nsqd -------------------------


def _seconds(text: str) -> float:
    m = re.fullmatch(r"([0-9.]+)(ms|s|m)?", text)
    if m is None:
        raise SystemExit(f"RUNFOR: not a duration: {text!r}")
    return float(m.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0, None: 1.0}[m.group(2)]


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Read frames until the OK of the last publish (a heartbeat is answered with NOP)."""
    while True:
        head = await reader.readexactly(8)
        size = int.from_bytes(head[:4], "big")
        kind = int.from_bytes(head[4:8], "big")
        data = await reader.readexactly(size - 4)
        if kind == 0 and data == b"_heartbeat_":
            writer.write(b"NOP\n")
            continue
        if kind != 0 or data != b"OK":
            raise RuntimeError(f"publish refused: {data[:200]!r}")
        return


async def _publisher(ports: list[int], command: bytes, count: int, deadline: float, done: list[int]) -> None:
    conns = [await asyncio.open_connection("127.0.0.1", port) for port in ports]
    for _, w in conns:
        w.write(b"  V2")
    loop = asyncio.get_running_loop()
    while loop.time() < deadline:
        for _, w in conns:  # to every nsqd at once, then wait for every OK
            w.write(command)
        for r, w in conns:
            await _answer(r, w)
        done[0] += count
    for _, w in conns:
        w.close()


async def _dual_publish(ports: list[int], workload: str, seconds: float) -> float:
    body = b"x" * 200
    if workload == "pub_mem":
        count = 200
        payload = len(body).to_bytes(4, "big") + body
        parts = count.to_bytes(4, "big") + payload * count
        command = b"MPUB bench\n" + len(parts).to_bytes(4, "big") + parts
    else:
        count = 1
        command = b"PUB bench\n" + len(body).to_bytes(4, "big") + body
    done = [0]
    loop = asyncio.get_running_loop()
    start = loop.time()
    await asyncio.gather(*[_publisher(ports, command, count, start + seconds, done)
                           for _ in range(os.cpu_count() or 1)])
    return done[0] / (loop.time() - start)


def measure_client(kind: str, workload: str) -> float:
    """The asyncio publisher's msg/s: ``workaround`` (two Go nsqd, every message to both),
    ``replicated`` (the nsqtw pair's origin, once) or ``go`` (one Go nsqd, once)."""
    work = tempfile.mkdtemp(prefix="nsqtw-bench-dual-")
    procs = []
    try:
        memq = 10_000_000 if workload == "pub_mem" else 10_000
        if kind == "workaround":
            ports = []
            for name in ("a", "b"):
                os.mkdir(f"{work}/{name}")
                p, tcp = start([str(GO / "nsqd")], f"{work}/{name}", memq)
                procs.append(p)
                ports.append(tcp)
        elif kind == "replicated":
            ports = [start_pair(work, memq, procs)]
        elif kind in ("floor", "cfloor"):
            port = start_floor(work, procs, "c" if kind == "cfloor" else "py")
            if port is None:
                return 0.0
            ports = [port]
        else:
            p, tcp = start([str(GO / "nsqd")], work, memq)
            procs.append(p)
            ports = [tcp]
        return asyncio.run(_dual_publish(ports, workload, _seconds(RUNFOR)))
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(work, ignore_errors=True)


def rounds(fn: Callable[[str, str], float], kinds: tuple[str, ...], workload: str) -> list[float]:
    """Each kind's median over ``ROUNDS`` rounds (the kinds in turn, the order reversed every
    other round, as perf-vs-go does)."""
    got: dict[str, list[float]] = {k: [] for k in kinds}
    for i in range(ROUNDS):
        for k in (kinds if i % 2 == 0 else kinds[::-1]):
            got[k].append(fn(k, workload))
    return [statistics.median(got[k]) for k in kinds]


def main() -> int:
    for tool in ("nsqd", "bench_writer", "bench_pub"):
        if not (GO / tool).exists():
            print(f"missing {GO / tool}")
            return 2
    if "--workaround-only" not in sys.argv[1:]:
        print("Go's bench tools (msg/s; the C floor 0 when there is no C compiler):")
        print(f"{'workload':9s} {'replicated':>11s} {'nsqtw':>11s} {'Go nsqd':>11s} {'floor':>11s} {'C floor':>11s}"
              "  replicated/nsqtw  floor/nsqtw  C floor/nsqtw")
        for workload in ("pub_mem", "pub_one"):
            r, u, g, f, c = rounds(measure, ("replicated", "nsqtw", "go", "floor", "cfloor"), workload)
            print(f"{workload:9s} {r:>11,.0f} {u:>11,.0f} {g:>11,.0f} {f:>11,.0f} {c:>11,.0f}"
                  f"  {r / u if u else 0:16.2f}  {f / u if u else 0:11.2f}  {c / u if u else 0:13.2f}", flush=True)
        print()
    print(f"NSQ's workaround: one asyncio publisher, {os.cpu_count()} connection(s) per nsqd (msg/s):")
    print(f"{'workload':9s} {'nsqtw pair':>11s} {'2 Go dual':>11s} {'1 Go once':>11s} {'floor pair':>11s}"
          f" {'C floor':>11s}  pair/workaround  floor/workaround  C floor/workaround")
    for workload in ("pub_mem", "pub_one"):
        r, w, g, f, c = rounds(measure_client, ("replicated", "workaround", "go", "floor", "cfloor"), workload)
        print(f"{workload:9s} {r:>11,.0f} {w:>11,.0f} {g:>11,.0f} {f:>11,.0f} {c:>11,.0f}"
              f"  {r / w if w else 0:15.2f}  {f / w if w else 0:16.2f}  {c / w if w else 0:18.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
