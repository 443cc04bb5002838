#!/usr/bin/env python
"""
Sizing figures for the production guide: what a node costs idle, per connection, per topic, per
queued message (in memory and on disk) and in CPU per 10,000 messages a second.

Every figure is measured on a daemon of its own, started as the drop-in command
(``python -m nsqtw.cli nsqd|nsqlookupd|nsqadmin``, this checkout) on loopback port 0, its ports
read from its start lines; memory is the process's resident set (``VmRSS`` in ``/proc/<pid>/status``)
once it settled (the daemons give freed heap back once a second), CPU its user + system time
(``/proc/<pid>/stat``):

* **idle**: nsqd, nsqlookupd and nsqadmin just started (each HTTP API asked once, so its web
  stack is loaded), and both nodes of an idle replicated pair;
* **per connection**: ``--connections`` consumers (IDENTIFY, SUB to one channel, RDY 1), the
  RSS they add divided by their number;
* **per topic**: ``--topics`` topics with one channel each (``POST /topic/create``, ``/channel/create``);
* **per queued message in memory**: ``--messages`` messages of ``--body-size`` bytes published
  (MPUB) to a topic with one channel and no consumer, ``--mem-queue-size`` above them;
* **per queued message on disk**: the same with ``--mem-queue-size=0``: the RSS added and the
  bytes added to ``--data-path``;
* **CPU per 10k msg/s**: a publisher at ``--rate`` messages a second (single PUBs, sent every
  millisecond; then MPUBs of 100 every 10 ms) and a consumer finishing each message (RDY 2500),
  for ``--seconds``; nsqd's CPU time over the window divided by the window, scaled to 10,000
  messages a second.

    python bench/bench_sizing.py                # the table the production guide quotes
    python bench/bench_sizing.py --json
    python bench/bench_sizing.py --connections 200 --topics 500 --messages 20000 --seconds 3

The machine is often shared: the CPU row moves with its load more than the memory rows do.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import resource
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_I32 = struct.Struct(">i")
_FRAME = struct.Struct(">ii")
FRAME_RESPONSE, FRAME_ERROR, FRAME_MESSAGE = 0, 1, 2


# --- /proc ---------------------------------------------------------------------------------------


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def settled_rss_kib(pid: int, wait: float = 1.5, samples: int = 5) -> int:
    """RSS once the daemon's once-a-second trim had its turn: the median of a few samples."""
    time.sleep(wait)
    seen = []
    for _ in range(samples):
        seen.append(rss_kib(pid))
        time.sleep(0.2)
    return sorted(seen)[len(seen) // 2]


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def dir_bytes(path: str) -> int:
    """Bytes of the files in a data path (their sizes), nsqtw's 1 MiB stop reserve left out."""
    total = 0
    for name in os.listdir(path):
        p = os.path.join(path, name)
        if name != "nsqd.reserve" and os.path.isfile(p) and not name.endswith(".log"):
            total += os.path.getsize(p)
    return total


# --- daemons -------------------------------------------------------------------------------------


class Daemon:
    """One drop-in daemon in a process of its own, its listeners on port 0."""

    def __init__(self, name: str, args: list[str], workdir: str) -> None:
        self.name = name
        self.log_path = os.path.join(workdir, f"{name}-{time.monotonic_ns()}.log")
        env = dict(os.environ)
        env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "nsqtw.cli", name, *args], stdout=subprocess.DEVNULL,
                                     stderr=self._log, env=env, cwd=workdir)
        self.ports: dict[str, int] = {}

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_listening(self, labels: tuple[str, ...], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(self.log_path, errors="replace") as f:
                for line in f:
                    for label in labels:
                        if f" {label}: listening on " in line:
                            self.ports[label] = int(line.rsplit(":", 1)[1])
            if all(label in self.ports for label in labels):
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.proc.returncode}: {self.log()[-2000:]}")
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} did not start: {self.log()[-2000:]}")

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def http(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.ports["HTTP"], timeout=30)
        try:
            conn.request(method, path, body=body)
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


@contextmanager
def daemon(name: str, args: list[str], workdir: str, labels: tuple[str, ...] = ("TCP", "HTTP")) -> Iterator[Daemon]:
    d = Daemon(name, args, workdir)
    try:
        d.wait_listening(labels)
        d.http("GET", "/ping")  # the HTTP stack loaded, as on a node that serves its API
        yield d
    finally:
        d.stop()


def nsqd_args(data_path: str, *extra: str) -> list[str]:
    return ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", "--https-address=",
            "--broadcast-address=127.0.0.1", f"--data-path={data_path}", *extra]


# --- protocol V2, just enough ------------------------------------------------------------------


def read_frame(sock: socket.socket) -> tuple[int, bytes]:
    head = _recv_exact(sock, 8)
    size, kind = _FRAME.unpack(head)
    return kind, _recv_exact(sock, size - 4)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise RuntimeError("the broker closed the connection")
        buf += chunk
    return bytes(buf)


def identify(body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    return b"IDENTIFY\n" + _I32.pack(len(data)) + data


def mpub(topic: str, bodies: list[bytes]) -> bytes:
    payload = _I32.pack(len(bodies)) + b"".join(_I32.pack(len(b)) + b for b in bodies)
    return f"MPUB {topic}\n".encode() + _I32.pack(len(payload)) + payload


def pub(topic: str, body: bytes) -> bytes:
    return f"PUB {topic}\n".encode() + _I32.pack(len(body)) + body


def publish(port: int, topic: str, count: int, body: bytes, batch: int = 1000) -> None:
    """``count`` copies of ``body`` in MPUBs of ``batch``, each OK awaited."""
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    try:
        s.sendall(b"  V2")
        sent = 0
        while sent < count:
            n = min(batch, count - sent)
            s.sendall(mpub(topic, [body] * n))
            kind, data = read_frame(s)
            if kind != FRAME_RESPONSE or data != b"OK":
                raise RuntimeError(f"MPUB refused: {data!r}")
            sent += n
    finally:
        s.close()


def create_channel(d: Daemon, topic: str, channel: str = "c") -> None:
    for path in (f"/topic/create?topic={topic}", f"/channel/create?topic={topic}&channel={channel}"):
        status, body = d.http("POST", path)
        if status != 200:
            raise RuntimeError(f"{path} answered {status} {body!r}")


def channel_depth(d: Daemon, topic: str) -> int:
    _, body = d.http("GET", f"/stats?format=json&topic={topic}")
    doc = json.loads(body)
    channels = doc["topics"][0]["channels"] if doc.get("topics") else []
    return int(channels[0]["depth"]) if channels else 0


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


# --- the measurements ----------------------------------------------------------------------------


def measure_idle(work: str) -> dict[str, float]:
    out: dict[str, float] = {}
    data = tempfile.mkdtemp(dir=work)
    with daemon("nsqd", nsqd_args(data), work) as d:
        out["idle_nsqd_mib"] = settled_rss_kib(d.pid) / 1024
    with daemon("nsqlookupd", ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                               "--broadcast-address=127.0.0.1"], work) as lk:
        out["idle_nsqlookupd_mib"] = settled_rss_kib(lk.pid) / 1024
        with daemon("nsqadmin", ["--http-address=127.0.0.1:0",
                                 f"--lookupd-http-address=127.0.0.1:{lk.ports['HTTP']}"], work, labels=("HTTP",)) as ad:
            out["idle_nsqadmin_mib"] = settled_rss_kib(ad.pid) / 1024
    peer_data, origin_data = tempfile.mkdtemp(dir=work), tempfile.mkdtemp(dir=work)
    with daemon("nsqd", nsqd_args(peer_data, "--node-id=2", "--replication-address=127.0.0.1:0",
                                  "--replication-insecure"), work, labels=("TCP", "REPLICATION", "HTTP")) as peer:
        with daemon("nsqd", nsqd_args(origin_data, "--node-id=1",
                                      f"--replica-peer=127.0.0.1:{peer.ports['REPLICATION']}",
                                      "--replication-insecure"), work) as origin:
            def in_sync() -> bool:
                rep = json.loads(origin.http("GET", "/stats?format=json")[1]).get("replication") or {}
                return rep.get("peers_in_sync", 0) >= 1

            wait_for(in_sync, 30, "the replicated pair to link")
            out["idle_replicated_origin_mib"] = settled_rss_kib(origin.pid) / 1024
            out["idle_replicated_peer_mib"] = rss_kib(peer.pid) / 1024
    return out


def measure_connections(work: str, n: int) -> dict[str, float]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = n + 256
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
    data = tempfile.mkdtemp(dir=work)
    with daemon("nsqd", nsqd_args(data), work) as d:
        create_channel(d, "sizing")
        before = settled_rss_kib(d.pid)
        socks = []
        try:
            hello = (b"  V2" + identify({"client_id": "sizing", "hostname": "sizing", "feature_negotiation": True})
                     + b"SUB sizing c\nRDY 1\n")
            for _ in range(n):
                s = socket.create_connection(("127.0.0.1", d.ports["TCP"]), timeout=60)
                s.sendall(hello)
                socks.append(s)
            for s in socks:
                for _ in range(2):  # IDENTIFY's answer, SUB's OK
                    kind, body = read_frame(s)
                    if kind == FRAME_ERROR:
                        raise RuntimeError(f"refused: {body!r}")
            after = settled_rss_kib(d.pid)
        finally:
            for s in socks:
                s.close()
    return {"per_connection_kib": (after - before) / n}


def measure_topics(work: str, n: int) -> dict[str, float]:
    data = tempfile.mkdtemp(dir=work)
    with daemon("nsqd", nsqd_args(data), work) as d:
        conn = http.client.HTTPConnection("127.0.0.1", d.ports["HTTP"], timeout=30)
        create_channel(d, "warm")
        before = settled_rss_kib(d.pid)
        for i in range(n):
            for path in (f"/topic/create?topic=sizing-{i}", f"/channel/create?topic=sizing-{i}&channel=c"):
                conn.request("POST", path)
                r = conn.getresponse()
                r.read()
                if r.status != 200:
                    raise RuntimeError(f"{path} answered {r.status}")
        conn.close()
        after = settled_rss_kib(d.pid)
    return {"per_topic_kib": (after - before) / n}


def measure_queued(work: str, n: int, body_size: int) -> dict[str, float]:
    out: dict[str, float] = {}
    body = b"x" * body_size
    for where, mem_queue in (("memory", n + 1000), ("disk", 0)):
        data = tempfile.mkdtemp(dir=work)
        with daemon("nsqd", nsqd_args(data, f"--mem-queue-size={mem_queue}"), work) as d:
            create_channel(d, "sizing")
            publish(d.ports["TCP"], "sizing", 1000, body)  # code paths and buffers warmed
            wait_for(lambda d=d: channel_depth(d, "sizing") == 1000, 60, "the warm-up messages")
            before, disk_before = settled_rss_kib(d.pid), dir_bytes(data)
            publish(d.ports["TCP"], "sizing", n, body)
            wait_for(lambda d=d: channel_depth(d, "sizing") == n + 1000, 120, "the messages to reach the channel")
            after = settled_rss_kib(d.pid)
            out[f"per_message_{where}_rss_bytes"] = (after - before) * 1024 / n
            if where == "disk":
                wait_for(lambda data=data, disk_before=disk_before: dir_bytes(data) - disk_before >= n * body_size,
                         60, "the disk queue files")
                out["per_message_disk_bytes"] = (dir_bytes(data) - disk_before) / n
    return out


class _Traffic:
    """A publisher at a fixed rate and a consumer that FINs every message, in one selector loop."""

    def __init__(self, port: int, topic: str, rate: int, batch: int, body: bytes) -> None:
        self.topic, self.rate, self.batch, self.body = topic, rate, batch, body
        self.sel = selectors.DefaultSelector()
        self.pub_sock = socket.create_connection(("127.0.0.1", port))
        self.pub_sock.sendall(b"  V2")
        self.sub_sock = socket.create_connection(("127.0.0.1", port))
        self.sub_sock.sendall(b"  V2" + identify({"client_id": "sizing", "hostname": "sizing",
                                                  "feature_negotiation": True})
                              + f"SUB {topic} c\nRDY 2500\n".encode())
        for s in (self.pub_sock, self.sub_sock):
            s.setblocking(False)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sel.register(s, selectors.EVENT_READ)
        self.bufs = {self.pub_sock: bytearray(), self.sub_sock: bytearray()}
        self.published = self.oks = self.received = 0

    def _frames(self, s: socket.socket) -> Iterator[tuple[int, bytes]]:
        buf = self.bufs[s]
        pos = 0
        while len(buf) - pos >= 8:
            size, kind = _FRAME.unpack_from(buf, pos)
            if len(buf) - pos < 4 + size:
                break
            yield kind, bytes(buf[pos + 8:pos + 4 + size])
            pos += 4 + size
        del buf[:pos]

    def run(self, seconds: float) -> None:
        tick = 0.01 if self.batch > 1 else 0.001  # single PUBs spread out: 10 a millisecond at 10k/s
        per_tick = self.rate * tick
        owed = 0.0
        start = time.monotonic()
        next_tick = start
        while time.monotonic() - start < seconds:
            now = time.monotonic()
            if now >= next_tick:
                owed += per_tick
                out = []
                while owed >= 1:
                    k = min(self.batch, int(owed)) if self.batch > 1 else 1
                    out.append(mpub(self.topic, [self.body] * k) if self.batch > 1 else pub(self.topic, self.body))
                    owed -= k
                    self.published += k
                if out:
                    self.pub_sock.setblocking(True)
                    self.pub_sock.sendall(b"".join(out))
                    self.pub_sock.setblocking(False)
                next_tick += tick
            for key, _ in self.sel.select(max(0.0, next_tick - time.monotonic())):
                s = key.fileobj
                assert isinstance(s, socket.socket)
                try:
                    data = s.recv(1 << 20)
                except BlockingIOError:
                    continue
                if not data:
                    raise RuntimeError("the broker closed a connection")
                self.bufs[s] += data
                fins = []
                for kind, frame in self._frames(s):
                    if kind == FRAME_ERROR:
                        raise RuntimeError(f"error frame: {frame!r}")
                    if kind == FRAME_MESSAGE:
                        self.received += 1
                        fins.append(b"FIN " + frame[10:26] + b"\n")
                    elif frame == b"_heartbeat_":
                        fins.append(b"NOP\n")
                    elif s is self.pub_sock:
                        self.oks += 1
                if fins:
                    self.sub_sock.setblocking(True)
                    self.sub_sock.sendall(b"".join(fins))
                    self.sub_sock.setblocking(False)

    def close(self) -> None:
        self.sel.close()
        self.pub_sock.close()
        self.sub_sock.close()


def measure_cpu(work: str, rate: int, seconds: float, body_size: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for label, batch in (("pub", 1), ("mpub100", 100)):
        data = tempfile.mkdtemp(dir=work)
        with daemon("nsqd", nsqd_args(data), work) as d:
            create_channel(d, "sizing")
            traffic = _Traffic(d.ports["TCP"], "sizing", rate, batch, b"x" * body_size)
            try:
                traffic.run(1.0)  # warm-up
                cpu0, received0, t0 = cpu_seconds(d.pid), traffic.received, time.monotonic()
                traffic.run(seconds)
                cpu1, received1, t1 = cpu_seconds(d.pid), traffic.received, time.monotonic()
            finally:
                traffic.close()
        achieved = (received1 - received0) / (t1 - t0)
        cores = (cpu1 - cpu0) / (t1 - t0)
        out[f"cpu_{label}_rate"] = achieved
        out[f"cpu_{label}_percent_per_10k"] = 100 * cores * 10_000 / achieved if achieved else float("nan")
    return out


# --- the table -----------------------------------------------------------------------------------


def table(r: dict[str, float], args: argparse.Namespace) -> str:
    rows = [
        ("idle nsqd", f"{r['idle_nsqd_mib']:.1f} MiB RSS"),
        ("idle nsqlookupd", f"{r['idle_nsqlookupd_mib']:.1f} MiB RSS"),
        ("idle nsqadmin", f"{r['idle_nsqadmin_mib']:.1f} MiB RSS"),
        ("idle nsqd of a replicated pair", f"{r['idle_replicated_origin_mib']:.1f} MiB RSS (its peer: "
                                           f"{r['idle_replicated_peer_mib']:.1f} MiB)"),
        ("per consumer connection", f"{r['per_connection_kib']:.1f} KiB"),
        ("per topic with one channel", f"{r['per_topic_kib']:.1f} KiB"),
        (f"per queued message in memory ({args.body_size}-byte body)",
         f"{r['per_message_memory_rss_bytes']:.0f} bytes RSS"),
        (f"per queued message on disk ({args.body_size}-byte body)",
         f"{r['per_message_disk_bytes']:.0f} bytes of disk, {r['per_message_disk_rss_bytes']:.0f} bytes RSS"),
        ("CPU per 10k msg/s, single PUBs", f"{r['cpu_pub_percent_per_10k']:.0f}% of one core "
                                           f"(at {r['cpu_pub_rate']:,.0f} msg/s)"),
        ("CPU per 10k msg/s, MPUBs of 100", f"{r['cpu_mpub100_percent_per_10k']:.0f}% of one core "
                                            f"(at {r['cpu_mpub100_rate']:,.0f} msg/s)"),
    ]
    w0 = max(len(a) for a, _ in rows + [("what", "")])
    w1 = max(len(b) for _, b in rows + [("", "cost")])
    rule = "=" * w0 + "  " + "=" * w1
    lines = [rule, "what".ljust(w0) + "  " + "cost", rule]
    lines += [a.ljust(w0) + "  " + b for a, b in rows]
    lines.append(rule)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--connections", type=int, default=1000)
    p.add_argument("--topics", type=int, default=2000)
    p.add_argument("--messages", type=int, default=100_000)
    p.add_argument("--body-size", type=int, default=200)
    p.add_argument("--rate", type=int, default=10_000, help="messages a second for the CPU row")
    p.add_argument("--seconds", type=float, default=10.0, help="the CPU row's measured window")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    work = tempfile.mkdtemp(prefix="nsqtw-sizing-")
    try:
        results: dict[str, float] = {}
        results.update(measure_idle(work))
        results.update(measure_connections(work, args.connections))
        results.update(measure_topics(work, args.topics))
        results.update(measure_queued(work, args.messages, args.body_size))
        results.update(measure_cpu(work, args.rate, args.seconds, args.body_size))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps({k: round(v, 3) for k, v in results.items()}, indent=2))
    else:
        print(table(results, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
