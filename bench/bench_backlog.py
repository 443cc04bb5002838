#!/usr/bin/env python
"""
A replicated pair with a large backlog: what catching a peer up, shadowing and adopting it cost.

    python bench/bench_backlog.py                 # 1,000,000 messages of 200 bytes
    N=300000 python bench/bench_backlog.py

Two runs, each with two nsqtw nsqd (``--mem-queue-size=10000``, so the backlog is on disk):

* **catch-up**: the origin gets the backlog first (``--replication-degraded=accept``, no peer
  yet), then the peer starts: seconds until the origin reports it ``in_sync``, the origin's
  peak resident memory, the peer's anonymous and file-backed (its mapped shadow log) memory.
* **failover**: the peer runs first and stays in sync while the backlog is published; then the
  origin is killed (SIGKILL) and the peer adopts (``--adopt-after=2s``): the peer's memory
  before, the seconds until its channel holds the whole backlog, its peak memory.

Prints figures; asserts nothing (see docs/guide/replication.rst, stop 38).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

NSQTW = [sys.executable, "-m", "nsqtw.cli"]
N = int(os.environ.get("N", "1000000"))
PER = 500


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(data: str, *flags: str) -> tuple[subprocess.Popen[bytes], int, int]:
    tcp, http = free_port(), free_port()
    os.makedirs(data, exist_ok=True)
    p = subprocess.Popen([*NSQTW, f"--tcp-address=127.0.0.1:{tcp}", f"--http-address=127.0.0.1:{http}",
                          f"--data-path={data}", "--mem-queue-size=10000", *flags],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    for _ in range(500):
        try:
            socket.create_connection(("127.0.0.1", http), 0.2).close()
            return p, tcp, http
        except OSError:
            time.sleep(0.02)
    raise SystemExit("nsqd did not start")


def get(http: int, path: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{http}{path}", timeout=5) as r:
        doc = json.loads(r.read())
    return doc.get("data", doc) if isinstance(doc, dict) else doc


def post(http: int, path: str) -> None:
    urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{http}{path}", method="POST"), timeout=5).read()


def publish(tcp: int, n: int) -> None:
    s = socket.create_connection(("127.0.0.1", tcp))
    s.sendall(b"  V2")
    for k in range(n // PER):
        body = b"%08d" % k + b"x" * 192
        s.sendall(b"MPUB bl\n" + struct.pack(">ii", 4 + PER * (4 + len(body)), PER)
                  + (struct.pack(">i", len(body)) + body) * PER)
        buf = b""
        while len(buf) < 4 or len(buf) < 4 + struct.unpack(">i", buf[:4])[0]:
            buf += s.recv(65536)
        if buf[8:10] != b"OK":
            raise SystemExit(f"MPUB answered {buf[8:]!r}")
    s.close()


def memory(p: subprocess.Popen[bytes]) -> dict[str, int]:
    """VmHWM, RssAnon and RssFile of an nsqd, in MB."""
    out = {}
    with open(f"/proc/{p.pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) // 1024
    return out


def until(predicate, seconds: float = 300.0) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        if predicate():
            return time.monotonic() - t0
        time.sleep(0.1)
    return float("nan")


def peer_state(http: int) -> str:
    return get(http, "/stats?format=json")["replication"]["peers"][0]["state"]


def depth(http: int) -> int:
    for t in get(http, "/stats?format=json&topic=bl")["topics"] or []:
        if t["topic_name"] == "bl" and t["channels"]:
            return int(t["channels"][0]["depth"])
    return 0


def catch_up(work: str) -> None:
    rport = free_port()
    origin, tcp, http = start(f"{work}/o", "--node-id=1", f"--replica-peer=127.0.0.1:{rport}",
                              "--replication-degraded=accept")
    peer = None
    try:
        post(http, "/topic/create?topic=bl")
        post(http, "/channel/create?topic=bl&channel=c")
        publish(tcp, N)
        peer, _, _ = start(f"{work}/p", "--node-id=2", f"--replication-address=127.0.0.1:{rport}")
        took = until(lambda: peer_state(http) == "in_sync")
        print(f"catch-up   {N:,} messages: peer in sync after {took:.1f} s; origin peak {memory(origin)['VmHWM']} MB; "
              f"peer {memory(peer)}")
    finally:
        for p in (origin, peer):
            if p is not None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def failover(work: str) -> None:
    rport = free_port()
    peer, _, phttp = start(f"{work}/fp", "--node-id=2", f"--replication-address=127.0.0.1:{rport}",
                           "--adopt-after=2s")
    origin, tcp, http = start(f"{work}/fo", "--node-id=1", f"--replica-peer=127.0.0.1:{rport}")
    try:
        until(lambda: peer_state(http) == "in_sync", 30)
        post(http, "/topic/create?topic=bl")
        post(http, "/channel/create?topic=bl&channel=c")
        publish(tcp, N)
        before = memory(peer)
        os.killpg(origin.pid, signal.SIGKILL)
        origin.wait()
        took = until(lambda: depth(phttp) == N)
        print(f"failover   {N:,} messages: peer before the kill {before}; all adopted after {took:.1f} s "
              f"(--adopt-after=2s); peer then {memory(peer)}")
    finally:
        for p in (origin, peer):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="nsqtw-backlog-") as work:
        catch_up(work)
        failover(work)


if __name__ == "__main__":
    main()
