#!/usr/bin/env python
"""
Broker throughput benchmark: publish and consume at once, print the figures.

One process publishes N messages of S bytes in MPUB batches of B over one
connection (a window of pipelined batches), another consumes with RDY R and
FINs every message (one write of FINs per read).  Both clients are raw
sockets with minimal per-message work, so the figures measure the broker.

    python bench/bench_broker.py                       # spawns an nsqtw nsqd
    python bench/bench_broker.py --nsqd-tcp-address 127.0.0.1:4150 --nsqd-pid 1234
    python bench/bench_broker.py --mode hold -n 1000000   # RSS with a million queued

Prints publish msgs/s, consume msgs/s, end-to-end latency p50/p99 (broker
publish timestamp to consumer receipt) and the broker's peak RSS (VmHWM).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
from itertools import repeat

_I32 = struct.Struct(">i")
_FRAME = struct.Struct(">ii")
_TS = struct.Struct(">q")


def _connect(addr: tuple[str, int]) -> socket.socket:
    s = socket.create_connection(addr)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    s.sendall(b"  V2")
    return s


def _read_responses(s: socket.socket, buf: bytearray, want: int) -> None:
    """Read until ``want`` response frames arrived (heartbeats answered with NOP)."""
    got = 0
    while got < want:
        while len(buf) >= 8 and got < want:
            size, ftype = _FRAME.unpack_from(buf, 0)
            if len(buf) < 4 + size:
                break
            data = bytes(buf[8:4 + size])
            del buf[:4 + size]
            if ftype == 1:
                raise RuntimeError(f"error from broker: {data!r}")
            if data == b"_heartbeat_":
                s.sendall(b"NOP\n")
                continue
            got += 1
        if got >= want:
            break
        chunk = s.recv(1 << 20)
        if not chunk:
            raise RuntimeError("broker closed the connection")
        buf += chunk


def publisher(addr, topic: str, n: int, size: int, batch: int, window: int, out) -> None:
    s = _connect(addr)
    body = b"x" * size
    msgs = [body] * batch
    payload = _I32.pack(batch) + b"".join(_I32.pack(len(m)) + m for m in msgs)
    cmd = b"MPUB " + topic.encode() + b"\n" + _I32.pack(len(payload)) + payload
    last = n % batch
    batches = n // batch
    buf = bytearray()
    start = time.perf_counter()
    inflight = 0
    sent = 0
    while sent < batches:
        k = min(window - inflight, batches - sent)
        if k > 0:
            s.sendall(cmd * k)
            sent += k
            inflight += k
        _read_responses(s, buf, 1)
        inflight -= 1
    if last:
        payload = _I32.pack(last) + b"".join(_I32.pack(size) + body for _ in range(last))
        s.sendall(b"MPUB " + topic.encode() + b"\n" + _I32.pack(len(payload)) + payload)
        inflight += 1
    _read_responses(s, buf, inflight)
    elapsed = time.perf_counter() - start
    s.close()
    out.put(("pub", n, elapsed))


def consumer(addr, topic: str, channel: str, n: int, rdy: int, ready_evt, out, size: int = 0) -> None:
    s = _connect(addr)
    stride = 34 + size if size else 0
    head8 = _FRAME.pack(30 + size, 2) if size else b""
    s.sendall(b"SUB " + topic.encode() + b" " + channel.encode() + b"\n")
    buf = bytearray()
    _read_responses(s, buf, 1)
    s.sendall(b"RDY %d\n" % rdy)
    ready_evt.set()
    received = 0
    first = None
    lat = []
    sample_every = 97
    recv = s.recv
    unpack = _FRAME.unpack_from
    ts_unpack = _TS.unpack_from
    data = bytes(buf)
    pos = 0
    getitem = bytes.__getitem__
    while received < n:
        chunk = recv(4 << 20)
        if not chunk:
            raise RuntimeError("broker closed the connection")
        if first is None:
            first = time.perf_counter()
        data = data[pos:] + chunk if pos < len(data) else chunk
        pos = 0
        end = len(data)
        fins = []
        now_ns = time.time_ns()
        # fast path: a run of message frames of the expected size, handled by C builtins
        if stride and end - pos >= stride and data[pos:pos + 8] == head8:
            k = (end - pos) // stride
            stop = pos + k * stride
            heads = set(map(getitem, repeat(data), map(slice, range(pos, stop, stride), range(pos + 8, stop, stride))))
            if heads == {head8}:
                ids = list(map(getitem, repeat(data), map(slice, range(pos + 18, stop, stride),
                                                           range(pos + 34, stop, stride))))
                fins.extend(ids)
                for j in range((sample_every - received % sample_every) % sample_every, k, sample_every):
                    lat.append(now_ns - ts_unpack(data, pos + j * stride + 8)[0])
                received += k
                pos = stop
        while end - pos >= 8:
            size, ftype = unpack(data, pos)
            stop = pos + 4 + size
            if stop > end:
                break
            if ftype == 2:
                fins.append(data[pos + 18:pos + 34])
                received += 1
                if received % sample_every == 0:
                    lat.append(now_ns - ts_unpack(data, pos + 8)[0])
            elif data[pos + 8:stop] == b"_heartbeat_":
                s.sendall(b"NOP\n")
            elif ftype == 1:
                raise RuntimeError(f"error from broker: {data[pos + 8:stop]!r}")
            pos = stop
        if fins:
            s.sendall(b"FIN " + b"\nFIN ".join(fins) + b"\n")
    elapsed = time.perf_counter() - first
    s.close()
    out.put(("sub", received, elapsed, lat))


def _peak_rss(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _rss(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def spawn_broker(extra: list) -> tuple[subprocess.Popen, tuple[str, int], str]:
    data = tempfile.mkdtemp(prefix="nsqtw-bench-")
    cmd = [sys.executable, "-m", os.environ.get("NSQTW_BENCH_BROKER", "nsqtw.cli"), "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
           "--https-address=", f"--data-path={data}", "--log-level=warn"] + extra
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, env=env, text=True)
    addr = None
    assert proc.stderr is not None
    for line in proc.stderr:
        if "TCP: listening on" in line:
            host, port = line.rsplit(" ", 1)[1].strip().rsplit(":", 1)
            addr = (host, int(port))
            break
    if addr is None:
        raise RuntimeError("broker did not start")
    return proc, addr, data


def http_post(addr: tuple[str, int], path: str) -> None:
    import http.client
    c = http.client.HTTPConnection(*addr)
    c.request("POST", path)
    c.getresponse().read()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nsqd-tcp-address", default="")
    p.add_argument("--nsqd-pid", type=int, default=0, help="broker pid, for its peak RSS")
    p.add_argument("-n", "--count", type=int, default=500_000)
    p.add_argument("-s", "--size", type=int, default=200)
    p.add_argument("-b", "--batch", type=int, default=200)
    p.add_argument("-r", "--rdy", type=int, default=2500)
    p.add_argument("-w", "--window", type=int, default=8, help="MPUB batches in flight")
    p.add_argument("--topic", default="")
    p.add_argument("--mode", choices=["both", "pub", "hold", "backlog"], default="both",
                   help="both: publish and consume at once; pub: publish only; hold: RSS with N "
                        "queued in memory; backlog: publish N to a channel (overflowing to disk "
                        "with the default --mem-queue-size), then drain it")
    p.add_argument("--broker-arg", action="append", default=[], help="extra flag for a spawned broker")
    p.add_argument("--json", action="store_true", help="print the figures as JSON too")
    args = p.parse_args()

    proc = None
    if args.nsqd_tcp_address:
        host, port = args.nsqd_tcp_address.rsplit(":", 1)
        addr = (host, int(port))
        pid = args.nsqd_pid
    else:
        extra = list(args.broker_arg)
        if args.mode == "hold":
            extra.append(f"--mem-queue-size={args.count + 1}")
        proc, addr, _ = spawn_broker(extra)
        pid = proc.pid
    topic = args.topic or f"bench{int(time.time() * 1000) % 1000000}"
    out: mp.Queue = mp.Queue()
    ready = mp.Event()
    results = {}
    try:
        if args.mode == "backlog":
            c = _connect(addr)
            c.sendall(b"SUB " + topic.encode() + b" bench\n")
            _read_responses(c, bytearray(), 1)
            c.close()
            pub = mp.Process(target=publisher, args=(addr, topic, args.count, args.size, args.batch, args.window, out))
            pub.start()
            _, n, pub_elapsed = out.get()
            pub.join()
            rss_full = _rss(pid) if pid else None
            sub = mp.Process(target=consumer, args=(addr, topic, "bench", args.count, args.rdy, ready, out, args.size))
            sub.start()
            _, got, drain_elapsed, _lat = out.get()
            sub.join()
            results = {"mode": "backlog", "messages": n, "size": args.size,
                       "publish_msgs_per_s": round(n / pub_elapsed),
                       "drain_msgs_per_s": round(got / drain_elapsed),
                       "rss_with_backlog_mb": rss_full and round(rss_full / 1e6, 1),
                       "peak_rss_mb": pid and round((_peak_rss(pid) or 0) / 1e6, 1)}
        elif args.mode == "hold":
            # a channel first, so the messages wait on it as they would for a slow consumer
            c = _connect(addr)
            c.sendall(b"SUB " + topic.encode() + b" hold\n")
            _read_responses(c, bytearray(), 1)
            base = _rss(pid) if pid else None
            pub = mp.Process(target=publisher, args=(addr, topic, args.count, args.size, args.batch, args.window, out))
            pub.start()
            kind, n, elapsed = out.get()
            pub.join()
            time.sleep(1.5)  # steady state: let the broker's once-a-second heap trim run
            rss = _rss(pid) if pid else None
            results = {"mode": "hold", "messages": n, "size": args.size, "publish_msgs_per_s": round(n / elapsed),
                       "rss_before_mb": base and round(base / 1e6, 1), "rss_holding_mb": rss and round(rss / 1e6, 1),
                       "peak_rss_mb": pid and round((_peak_rss(pid) or 0) / 1e6, 1)}
            c.close()
        else:
            sub = None
            if args.mode == "both":
                sub = mp.Process(target=consumer, args=(addr, topic, "bench", args.count, args.rdy, ready, out, args.size))
                sub.start()
                ready.wait(10)
            pub = mp.Process(target=publisher, args=(addr, topic, args.count, args.size, args.batch, args.window, out))
            pub.start()
            for _ in range(2 if sub else 1):
                item = out.get()
                results[item[0]] = item[1:]
            pub.join()
            if sub:
                sub.join()
            figures = {"messages": args.count, "size": args.size, "batch": args.batch, "rdy": args.rdy}
            n, elapsed = results["pub"]
            figures["publish_msgs_per_s"] = round(n / elapsed)
            if "sub" in results:
                n, elapsed, lat = results["sub"]
                figures["consume_msgs_per_s"] = round(n / elapsed)
                lat.sort()
                if lat:
                    figures["e2e_p50_ms"] = round(lat[len(lat) // 2] / 1e6, 2)
                    figures["e2e_p99_ms"] = round(lat[min(len(lat) - 1, int(len(lat) * 0.99))] / 1e6, 2)
            if pid:
                figures["broker_peak_rss_mb"] = round((_peak_rss(pid) or 0) / 1e6, 1)
            results = figures
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    for k, v in results.items():
        print(f"{k:24s} {v}")
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
