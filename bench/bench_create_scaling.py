#!/usr/bin/env python
"""
Creating many topics and channels: does each one cost the same, and does a bystander notice?

Starts nsqd (``python -m nsqtw.cli``) as a subprocess, then:

* a *bystander* (its own process) publishes to topic ``bystander`` over one V2
  connection (PUB, wait for OK, ``--rate`` per second) and consumes it over
  another (SUB, RDY 100, FIN), recording each PUB's round trip and each
  message's publish-to-delivery latency;
* the *creator* (this process) creates ``--topics`` topics with one channel
  each over HTTP (``POST /topic/create`` then ``POST /channel/create``, one
  keep-alive connection; ``--via sub``: a SUB on a new connection per pair, kept
  open), timing every block of 1,000.

Before the timed blocks, ``--warmup`` pairs (200) are created and not counted:
the first requests pay one-off costs (code paths run for the first time, the
allocator's first arenas, idle virtual CPUs waking up) that are not what
creation costs as topics accumulate.

Printed (never asserted): seconds per 1,000 creations and how flat they are
(slowest block / fastest block), the bystander's p50 / p99 / max latencies
overall and per block, nsqd's RSS before, after every block and at the end,
with the growth per topic+channel pair.

    python bench/bench_create_scaling.py                  # 10,000 topics, one channel each
    python bench/bench_create_scaling.py --topics 3000 --json
    python bench/bench_create_scaling.py --via sub       # each pair by SUB on its own connection
    python bench/bench_create_scaling.py --rounds 3      # three fresh runs, each block's median

Issue 13's targets: time per 1,000 flat within 20 %, bystander p99 under
50 ms, an idle topic under 10 KB and an idle channel under 15 KB.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import shutil
import socket
import statistics
import struct
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_connections import raise_fd_limit, rss_kib, spawn_nsqd  # noqa: E402

_I32 = struct.Struct(">i")
_TS = struct.Struct(">d")


def _read_frame(sock: socket.socket, buf: bytearray) -> tuple[int, bytes]:
    while True:
        if len(buf) >= 8:
            size = _I32.unpack_from(buf, 0)[0]
            if len(buf) >= 4 + size:
                ftype = _I32.unpack_from(buf, 4)[0]
                data = bytes(buf[8:4 + size])
                del buf[:4 + size]
                return ftype, data
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("nsqd closed the connection")
        buf.extend(chunk)


def bystander(port: int, rate: float, stop: Any, out: Any) -> None:
    """Publish and consume topic ``bystander`` until ``stop`` is set; send the samples to ``out``."""
    pub = socket.create_connection(("127.0.0.1", port))
    pub.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    con = socket.create_connection(("127.0.0.1", port))
    con.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    pub.sendall(b"  V2")
    con.sendall(b"  V2SUB bystander c\nRDY 100\n")
    pbuf, cbuf = bytearray(), bytearray()
    assert _read_frame(con, cbuf) == (0, b"OK")
    con.settimeout(0.0005)
    rtts: list[tuple[float, float]] = []
    e2e: list[tuple[float, float]] = []
    interval = 1.0 / rate
    next_at = time.monotonic()
    while not stop.is_set():
        now = time.monotonic()
        if now >= next_at:
            body = _TS.pack(now)
            pub.sendall(b"PUB bystander\n" + _I32.pack(len(body)) + body)
            ftype, data = _read_frame(pub, pbuf)
            done = time.monotonic()
            assert data == b"OK", data
            rtts.append((now, done - now))
            next_at += interval
            if next_at < done:
                next_at = done
        try:
            while True:
                ftype, data = _read_frame(con, cbuf)
                if ftype == 2:
                    sent = _TS.unpack_from(data, 26)[0]
                    e2e.append((sent, time.monotonic() - sent))
                    con.sendall(b"FIN " + data[10:26] + b"\n")
                elif data == b"_heartbeat_":
                    con.sendall(b"NOP\n")
        except (TimeoutError, BlockingIOError):
            pass
    out.send((rtts, e2e))


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def cpu_seconds(pid: int) -> float:
    """The process's user + system CPU time (Linux /proc): what creating costs nsqd itself,
    unlike wall time not stretched by whatever else the machine runs."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def run(args: argparse.Namespace) -> dict[str, Any]:
    data = tempfile.mkdtemp(prefix="nsqtw-bench-create-", dir=args.dir)
    proc, tcp, http_port, _ = spawn_nsqd(data, args.nsqd_arg or [])
    stop = multiprocessing.Event()
    recv, send = multiprocessing.Pipe(duplex=False)
    by = multiprocessing.Process(target=bystander, args=(tcp, args.rate, stop, send), daemon=True)
    try:
        by.start()
        time.sleep(1.0)  # the bystander's baseline
        conn = http.client.HTTPConnection("127.0.0.1", http_port)
        for i in range(args.warmup):  # not timed: first-use costs on both sides, idle CPUs waking
            for path in (f"/topic/create?topic=w{i:05d}", f"/channel/create?topic=w{i:05d}&channel=c"):
                conn.request("POST", path)
                conn.getresponse().read()
        subs: list[socket.socket] = []
        rss = [("start", rss_kib(proc.pid))]
        blocks: list[tuple[float, float]] = []
        cpu: list[float] = []
        t0 = time.monotonic()
        block_start = t0
        cpu_start = cpu_seconds(proc.pid)
        own: list[float] = []
        own_start = time.process_time()
        for i in range(args.topics):
            if args.via == "sub":  # a new connection per pair, kept open (its channel stays used)
                s = socket.create_connection(("127.0.0.1", tcp))
                s.sendall(b"  V2SUB t%05d c\n" % i)
                assert _read_frame(s, bytearray()) == (0, b"OK")
                subs.append(s)
            else:
                for path in (f"/topic/create?topic=t{i:05d}", f"/channel/create?topic=t{i:05d}&channel=c"):
                    conn.request("POST", path)
                    resp = conn.getresponse()
                    resp.read()
                    if resp.status != 200:
                        raise RuntimeError(f"{path}: {resp.status}")
            if (i + 1) % args.block == 0 or i + 1 == args.topics:
                now = time.monotonic()
                blocks.append((block_start, now))
                cpu_now = cpu_seconds(proc.pid)
                cpu.append(cpu_now - cpu_start)
                cpu_start = cpu_now
                own_now = time.process_time()
                own.append(own_now - own_start)
                own_start = own_now
                rss.append((f"{i + 1}", rss_kib(proc.pid)))
                block_start = now
        conn.close()
        time.sleep(1.0)  # the bystander after the creation
        rss.append(("end", rss_kib(proc.pid)))
        for s in subs:
            s.close()
        stop.set()
        rtts, e2e = recv.recv()
        by.join(10)
    finally:
        stop.set()
        proc.terminate()
        try:
            proc.wait(30)
        except Exception:
            proc.kill()
        shutil.rmtree(data, ignore_errors=True)

    per_block = []
    for (a, b), c, mine in zip(blocks, cpu, own, strict=True):
        lat = [v for t, v in e2e if a <= t < b]
        rtt = [v for t, v in rtts if a <= t < b]
        per_block.append({"seconds": b - a, "cpu_seconds": c, "creator_cpu_seconds": mine, "e2e_p99_ms": pct(lat, 0.99) * 1e3,
                          "pub_p99_ms": pct(rtt, 0.99) * 1e3, "samples": len(lat)})
    during = [v for t, v in e2e if blocks and blocks[0][0] <= t < blocks[-1][1]]
    during_rtt = [v for t, v in rtts if blocks and blocks[0][0] <= t < blocks[-1][1]]
    before = [v for t, v in e2e if blocks and t < blocks[0][0]]
    full = [pb["seconds"] for pb in per_block][: args.topics // args.block]
    full_cpu = [pb["cpu_seconds"] for pb in per_block][: args.topics // args.block]
    return {
        "topics": args.topics,
        "block": args.block,
        "blocks": per_block,
        "flatness": (max(full) / min(full)) if full else float("nan"),
        "cpu_flatness": (max(full_cpu) / min(full_cpu)) if full_cpu and min(full_cpu) > 0 else float("nan"),
        "cpu_first_last": (full_cpu[-1] / full_cpu[0]) if full_cpu and full_cpu[0] > 0 else float("nan"),
        "bystander_before_p99_ms": pct(before, 0.99) * 1e3,
        "bystander_e2e_p50_ms": pct(during, 0.5) * 1e3,
        "bystander_e2e_p99_ms": pct(during, 0.99) * 1e3,
        "bystander_e2e_max_ms": max(during) * 1e3 if during else float("nan"),
        "bystander_pub_p99_ms": pct(during_rtt, 0.99) * 1e3,
        "bystander_messages": len(e2e),
        "rss_kib": rss,
        "rss_per_pair_kib": (rss[-2][1] - rss[0][1]) / args.topics,
    }


def median_of(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One result whose every block figure and summary is the median over the rounds."""
    med = statistics.median
    n_blocks = min(len(r["blocks"]) for r in rounds)
    blocks = [{key: med(r["blocks"][i][key] for r in rounds) for key in rounds[0]["blocks"][0]}
              for i in range(n_blocks)]
    full = [b["seconds"] for b in blocks][: rounds[0]["topics"] // rounds[0]["block"]]
    full_cpu = [b["cpu_seconds"] for b in blocks][: len(full)]
    out = {key: med(r[key] for r in rounds) for key in rounds[0]
           if isinstance(rounds[0][key], float)}
    out.update({
        "topics": rounds[0]["topics"], "block": rounds[0]["block"], "blocks": blocks,
        "flatness": max(full) / min(full) if full else float("nan"),
        "cpu_flatness": max(full_cpu) / min(full_cpu) if full_cpu and min(full_cpu) > 0 else float("nan"),
        "cpu_first_last": full_cpu[-1] / full_cpu[0] if full_cpu and full_cpu[0] > 0 else float("nan"),
        "bystander_messages": sum(r["bystander_messages"] for r in rounds),
        "rss_kib": [(label, med(r["rss_kib"][i][1] for r in rounds))
                    for i, (label, _) in enumerate(rounds[0]["rss_kib"])],
    })
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--topics", type=int, default=10000)
    ap.add_argument("--block", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=200,
                    help="topics+channels created (over HTTP) before the timed blocks, not counted")
    ap.add_argument("--rate", type=float, default=200.0, help="bystander publishes per second")
    ap.add_argument("--via", choices=("http", "sub"), default="http",
                    help="create each pair over HTTP (one keep-alive connection) or by SUB on a new "
                         "TCP connection kept open (RSS then includes the connections)")
    ap.add_argument("--dir", default=None, help="where the data directory goes (default: $TMPDIR)")
    ap.add_argument("--nsqd-arg", action="append", help="extra nsqd flag (repeatable)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat the whole run (a fresh nsqd each time) and report each block's median:"
                         " the machine is shared and noisy, so figures to report use 3")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.via == "sub":
        raise_fd_limit(args.topics + 200)
    rounds = [run(args) for _ in range(max(1, args.rounds))]
    res = rounds[0] if len(rounds) == 1 else median_of(rounds)
    if args.json:
        print(json.dumps(res if len(rounds) == 1 else {**res, "rounds": rounds}, indent=2))
        return
    how = "HTTP, one connection" if args.via == "http" else "SUB, one connection each"
    if len(rounds) > 1:
        for k, r in enumerate(rounds):
            print(f"round {k + 1}: blocks " + " ".join(f"{b['seconds']:.2f}" for b in r["blocks"])
                  + f" s; flatness {r['flatness']:.2f} wall, {r['cpu_flatness']:.2f} nsqd CPU;"
                  f" bystander p99 {r['bystander_e2e_p99_ms']:.1f} ms, max {r['bystander_e2e_max_ms']:.1f} ms")
        print(f"median of {len(rounds)} rounds, block by block:")
    print(f"created {res['topics']} topics with one channel each ({how})")
    for i, b in enumerate(res["blocks"]):
        print(f"  block {i + 1:3d}: {b['seconds']:6.2f} s per {res['block']} (nsqd CPU {b['cpu_seconds']:5.2f} s, creator {b['creator_cpu_seconds']:4.2f} s)"
              f"   bystander e2e p99 "
              f"{b['e2e_p99_ms']:7.1f} ms  PUB p99 {b['pub_p99_ms']:7.1f} ms  ({b['samples']} msgs)")
    print(f"flatness (slowest / fastest block): {res['flatness']:.2f} wall time, "
          f"{res['cpu_flatness']:.2f} nsqd CPU time (last / first block: {res['cpu_first_last']:.2f})")
    print(f"bystander before creation: e2e p99 {res['bystander_before_p99_ms']:.1f} ms")
    print(f"bystander during creation: e2e p50 {res['bystander_e2e_p50_ms']:.1f} ms, "
          f"p99 {res['bystander_e2e_p99_ms']:.1f} ms, max {res['bystander_e2e_max_ms']:.1f} ms; "
          f"PUB p99 {res['bystander_pub_p99_ms']:.1f} ms")
    print("nsqd RSS (KiB): " + ", ".join(f"{k}={v}" for k, v in res["rss_kib"]))
    print(f"RSS growth per topic+channel pair: {res['rss_per_pair_kib']:.1f} KiB")


if __name__ == "__main__":
    main()
