#!/usr/bin/env python
"""
Many idle connections with heartbeats: what one nsqd process costs per connection.

Starts nsqd (``python -m nsqtw.cli``) as a subprocess, then one client
process (this one, a ``selectors`` loop) opens N V2 connections; each sends
IDENTIFY with a short ``heartbeat_interval``, SUBs to one channel with RDY 1
and answers every ``_heartbeat_`` with NOP.  Then, measured on the broker
process from ``/proc``:

* RSS before the connections, with all of them, and per connection;
* CPU while idle with heartbeats flowing (percent of one core);
* heartbeats received per connection during the idle window;
* every connection still works: N messages are published (one MPUB over a
  separate connection) and each connection must receive exactly one (RDY 1
  and no FIN until all have arrived), then FINs it.

    python bench/bench_connections.py                     # 1000 connections, 1 s heartbeats, 5 s idle
    python bench/bench_connections.py -c 200 --idle 2 --json
    python bench/bench_connections.py -c 300 --wave 0          # all connects at once (a reconnect storm)

The fd limit of this process is raised (``resource.setrlimit``) as far as the
hard limit allows; nsqd inherits it.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import resource
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_FRAME = struct.Struct(">ii")
_I32 = struct.Struct(">i")


def raise_fd_limit(needed: int) -> tuple[int, int]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(max(soft, needed), hard) if hard != resource.RLIM_INFINITY else max(soft, needed)
    if want > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def spawn_nsqd(data_path: str, extra: list[str]) -> tuple[subprocess.Popen, int, int, str]:
    log_path = os.path.join(data_path, "nsqd.log")
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    log = open(log_path, "wb")
    proc = subprocess.Popen([sys.executable, "-m", "nsqtw.cli", "--tcp-address=127.0.0.1:0",
                             "--http-address=127.0.0.1:0", f"--data-path={data_path}"] + extra,
                            stdout=subprocess.DEVNULL, stderr=log, env=env, cwd=data_path)
    deadline = time.monotonic() + 30
    tcp = http = 0
    while time.monotonic() < deadline and not (tcp and http):
        with open(log_path, errors="replace") as f:
            for line in f:
                if "TCP: listening on" in line:
                    tcp = int(line.rsplit(":", 1)[1])
                elif "HTTP: listening on" in line:
                    http = int(line.rsplit(":", 1)[1])
        if proc.poll() is not None:
            raise RuntimeError(f"nsqd exited: {open(log_path, errors='replace').read()[-2000:]}")
        time.sleep(0.05)
    if not tcp:
        proc.kill()
        raise RuntimeError("nsqd did not start")
    return proc, tcp, http, log_path


class Conn:
    """One client connection's state in the selector loop."""

    __slots__ = ("sock", "buf", "out", "oks", "heartbeats", "messages", "errors", "closed", "index", "started",
                 "connected")

    def __init__(self, sock: socket.socket, index: int) -> None:
        self.sock = sock
        self.index = index
        self.buf = bytearray()
        self.out = bytearray()
        self.oks = 0
        self.heartbeats = 0
        self.messages: list[tuple[bytes, bytes]] = []
        self.errors: list[bytes] = []
        self.closed = False
        self.started = 0.0
        #: seconds from connect() to the socket being writable (None until then)
        self.connected: float | None = None


class Clients:
    def __init__(self, port: int, n: int, heartbeat_ms: int, topic: str, batch: int = 100) -> None:
        self.port = port
        self.n = n
        self.sel = selectors.DefaultSelector()
        self.conns: list[Conn] = []
        body = json.dumps({"heartbeat_interval": heartbeat_ms, "client_id": "bench",
                           "user_agent": "bench_connections/1.0"}).encode()
        self.hello = b"  V2IDENTIFY\n" + _I32.pack(len(body)) + body + f"SUB {topic} c\nRDY 1\n".encode()
        self.batch = batch

    def open_all(self, timeout: float = 60.0, wave: int = 0) -> float:
        """Open every connection: all at once (``wave=0``, non-blocking connects, as a burst of
        clients would), or ``wave`` at a time, each wave subscribed before the next."""
        start = time.monotonic()
        for i in range(self.n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.setblocking(False)
            err = s.connect_ex(("127.0.0.1", self.port))
            if err not in (0, errno.EINPROGRESS):
                raise OSError(err, os.strerror(err))
            c = Conn(s, i)
            c.started = time.monotonic()
            c.out += self.hello
            self.conns.append(c)
            self.sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE, c)
            if wave and (i + 1) % wave == 0:
                batch = self.conns[-wave:]
                self.run_until(lambda batch=batch: all(c.oks >= 2 or c.closed for c in batch), timeout)
            elif i % self.batch == self.batch - 1:
                self.pump(0)
        self.run_until(lambda: all(c.oks >= 2 or c.closed for c in self.conns), timeout)
        return time.monotonic() - start

    def pump(self, timeout: float) -> None:
        for key, mask in self.sel.select(timeout):
            c: Conn = key.data
            if mask & selectors.EVENT_READ:
                try:
                    data = c.sock.recv(65536)
                except (BlockingIOError, InterruptedError):
                    data = None
                except OSError:
                    data = b""
                if data == b"":
                    self._close(c)
                    continue
                if data:
                    c.buf += data
                    self._frames(c)
            if mask & selectors.EVENT_WRITE and c.connected is None and not c.closed:
                err = c.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    c.errors.append(f"connect: {os.strerror(err)}".encode())
                    self._close(c)
                    continue
                c.connected = time.monotonic() - c.started
            if mask & selectors.EVENT_WRITE and c.out and not c.closed:
                try:
                    sent = c.sock.send(c.out)
                    del c.out[:sent]
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:
                    self._close(c)
                    continue
            if not c.closed:
                want = selectors.EVENT_READ | (selectors.EVENT_WRITE if c.out else 0)
                if key.events != want:
                    self.sel.modify(c.sock, want, c)

    def _frames(self, c: Conn) -> None:
        buf = c.buf
        while len(buf) >= 8:
            size, ftype = _FRAME.unpack_from(buf, 0)
            if len(buf) < 4 + size:
                break
            data = bytes(buf[8:4 + size])
            del buf[:4 + size]
            if ftype == 0:
                if data == b"_heartbeat_":
                    c.heartbeats += 1
                    c.out += b"NOP\n"
                else:
                    c.oks += 1
            elif ftype == 1:
                c.errors.append(data)
            elif ftype == 2:
                c.messages.append((data[10:26], data[26:]))
        if c.out and not c.closed:
            self.sel.modify(c.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, c)

    def _close(self, c: Conn) -> None:
        if not c.closed:
            c.closed = True
            self.sel.unregister(c.sock)
            c.sock.close()

    def run_until(self, predicate: Any, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not predicate():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.pump(min(left, 0.05))
        return True

    def run_for(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.pump(min(deadline - time.monotonic(), 0.05))

    def fin_all(self) -> None:
        for c in self.conns:
            for mid, _ in c.messages:
                c.out += b"FIN " + mid + b"\n"
            if c.out and not c.closed:
                self.sel.modify(c.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, c)

    def close_all(self) -> None:
        for c in self.conns:
            self._close(c)
        self.sel.close()


def publish(port: int, topic: str, bodies: list[bytes]) -> None:
    """One MPUB over its own connection (batches of 1000), waiting for each OK."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(b"  V2")
    for i in range(0, len(bodies), 1000):
        part = bodies[i:i + 1000]
        payload = _I32.pack(len(part)) + b"".join(_I32.pack(len(b)) + b for b in part)
        s.sendall(f"MPUB {topic}\n".encode() + _I32.pack(len(payload)) + payload)
        got = b""
        while len(got) < 10:
            chunk = s.recv(10 - len(got))
            if not chunk:
                raise RuntimeError("broker closed the publishing connection")
            got += chunk
        if got[8:10] != b"OK":
            raise RuntimeError(f"MPUB refused: {got!r}")
    s.close()


def channel_stats(http_port: int, topic: str) -> dict[str, Any]:
    from urllib.request import urlopen
    with urlopen(f"http://127.0.0.1:{http_port}/stats?format=json&topic={topic}", timeout=30) as r:
        doc = json.loads(r.read())
    return doc["topics"][0]["channels"][0]


def run(connections: int, heartbeat_ms: int, idle: float, extra: list[str] | None = None,
        wave: int = 25, connect_timeout: float = 60.0) -> dict[str, Any]:
    limits = raise_fd_limit(2 * connections + 256)
    tmp = tempfile.mkdtemp(prefix="nsqtw-bench-conns-")
    proc, tcp, http, log_path = spawn_nsqd(tmp, extra or [])
    topic = "bench_conns"
    clients = None
    try:
        time.sleep(0.3)  # let the interpreter settle before the baseline
        rss_base = rss_kib(proc.pid)
        clients = Clients(tcp, connections, heartbeat_ms, topic)
        connect_s = clients.open_all(connect_timeout, wave)
        subscribed = sum(1 for c in clients.conns if c.oks >= 2 and not c.closed)
        connect_times = sorted(c.connected for c in clients.conns if c.connected is not None)
        clients.run_for(0.5)
        rss_conn = rss_kib(proc.pid)
        hb_before = sum(c.heartbeats for c in clients.conns)
        cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
        clients.run_for(idle)
        cpu1, t1 = cpu_seconds(proc.pid), time.monotonic()
        hb_idle = sum(c.heartbeats for c in clients.conns) - hb_before
        rss_idle = rss_kib(proc.pid)
        ready = [c for c in clients.conns if c.oks >= 2 and not c.closed]
        bodies = [b"msg-%06d" % i for i in range(len(ready))]
        d0 = time.monotonic()
        publish(tcp, topic, bodies)
        delivered = clients.run_until(lambda: all(len(c.messages) >= 1 or c.closed for c in ready), 60)
        deliver_s = time.monotonic() - d0
        clients.run_for(0.3)  # any extra (wrong) delivery would show up here
        counts = [len(c.messages) for c in ready]
        got_bodies = sorted(b for c in clients.conns for _, b in c.messages)
        clients.fin_all()
        clients.run_until(lambda: channel_stats(http, topic)["in_flight_count"] == 0, 30)
        stats = channel_stats(http, topic)
        errors = [e.decode("utf-8", "replace") for c in clients.conns for e in c.errors]
        closed = sum(1 for c in clients.conns if c.closed)
        return {
            "connections": connections,
            "heartbeat_ms": heartbeat_ms,
            "fd_limit": list(limits),
            "connect_wave": wave or "burst",
            "connect_seconds": round(connect_s, 3),
            "connect_latency_ms": {
                "p50": round(1000 * connect_times[len(connect_times) // 2], 1) if connect_times else None,
                "p99": round(1000 * connect_times[int(len(connect_times) * 0.99)], 1) if connect_times else None,
                "max": round(1000 * connect_times[-1], 1) if connect_times else None,
                "over_900ms": sum(1 for t in connect_times if t > 0.9)},
            "subscribed": subscribed,
            "rss_kib_baseline": rss_base,
            "rss_kib_connected": rss_conn,
            "rss_kib_after_idle": rss_idle,
            "rss_kib_per_connection": round((rss_idle - rss_base) / connections, 2),
            "idle_seconds": round(t1 - t0, 2),
            "cpu_percent_idle": round(100 * (cpu1 - cpu0) / (t1 - t0), 2),
            "heartbeats_in_idle": hb_idle,
            "heartbeats_per_connection_per_second": round(hb_idle / connections / (t1 - t0), 3),
            "all_delivered": delivered and counts.count(1) == connections == len(ready),
            "deliver_seconds": round(deliver_s, 3),
            "max_messages_on_one_connection": max(counts, default=0),
            "bodies_ok": got_bodies == sorted(bodies),
            "channel_finish_in_flight": stats["in_flight_count"],
            "channel_depth": stats["depth"],
            "errors": errors[:5],
            "closed_by_broker": closed,
        }
    finally:
        if clients is not None:
            clients.close_all()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-c", "--connections", type=int, default=1000)
    p.add_argument("--heartbeat-ms", type=int, default=1000, help="IDENTIFY heartbeat_interval (>= 1000)")
    p.add_argument("--idle", type=float, default=5.0, help="seconds idle with heartbeats while measuring CPU")
    p.add_argument("--wave", type=int, default=25,
                   help="connect this many at a time, each wave subscribed before the next (0: all at once)")
    p.add_argument("--connect-timeout", type=float, default=60.0)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("nsqd_flags", nargs="*", help="extra nsqd flags (after --)")
    args = p.parse_args(argv)
    fig = run(args.connections, args.heartbeat_ms, args.idle, args.nsqd_flags, args.wave, args.connect_timeout)
    if args.json:
        print(json.dumps(fig, sort_keys=True))
    else:
        for k, v in fig.items():
            print(f"{k:40s} {v}")
    return 0 if fig["all_delivered"] and fig["subscribed"] == fig["connections"] else 1


if __name__ == "__main__":
    sys.exit(main())
