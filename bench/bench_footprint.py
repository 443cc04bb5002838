#!/usr/bin/env python
"""
An idle fleet's footprint, beside Go's NSQ 1.3.0 where its binaries are found, in one run.

Four figures, each printed with Go's beside it (or why Go's is missing):

* **idle RSS** of nsqd and of nsqlookupd (``VmRSS`` from ``/proc``), started as the drop-in
  commands, after one ``GET /ping`` (so nsqd's HTTP API is built) and a short settle;
* **client CPU holding N idle consumers**: one process of nsqtw's client holds N consumers
  (spread over T topics, each topic on every one of the nsqd), each discovering its nsqd through
  nsqlookupd with go-nsq's default heartbeats and lookupd polls; its CPU (user + system, percent
  of one core) over a window.
  There is no Go consumer program here (go-nsq is a library); the line says so;
* **nsqlookupd CPU under /lookup polling**: the same request rate of ``GET /lookup?topic=...``
  (keep-alive connections, T topics registered by one nsqd) against nsqtw's and Go's nsqlookupd,
  CPU of each over the same window;
* **nsqadmin /api/nodes latency** with N nsqd registered (median and 90th percentile of
  sequential requests after a warm-up); Go's nsqadmin is not among the anchors, the line says so.

Before the numbers: nsqtw's version of each daemon is started as ``python -m nsqtw.cli`` with this
interpreter, so the ``nsqtw`` package it imports is the one in the current directory if there is
one (run it from the project's root to measure the tree you are in).

    python bench/bench_footprint.py                         # a few minutes: 100 consumers, 5 nodes
    FOOTPRINT_CONSUMERS=530 FOOTPRINT_TOPICS=50 FOOTPRINT_NODES=20 python bench/bench_footprint.py
    python bench/bench_footprint.py rss lookupd             # some sections only (rss client lookupd admin)

Knobs (environment): ``FOOTPRINT_CONSUMERS`` (100), ``FOOTPRINT_TOPICS`` (10),
``FOOTPRINT_WINDOW`` (seconds of CPU measured, 60: the client's default poll interval),
``FOOTPRINT_POLL`` (the consumers' lookupd poll interval, 60 s as go-nsq's),
``FOOTPRINT_HEARTBEAT`` (30 s as go-nsq's), ``FOOTPRINT_LOOKUP_RATE`` (/lookup requests a
second, 200), ``FOOTPRINT_NODES`` (nsqd holding the consumers' topics, and behind nsqadmin, 5),
``FOOTPRINT_ADMIN_REQUESTS`` (50),
``GO_NSQ`` (the directory of Go's binaries; default ``../shared/anchors/go-nsq-1.3.0`` beside
the project, when present), ``NSQTW_PYTHON`` (the interpreter running nsqtw; default this one).
The machine may be shared: compare the two columns of one run, not runs with each other.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = os.environ.get("NSQTW_PYTHON", sys.executable)
GO = Path(os.environ.get("GO_NSQ", ROOT.parent / "shared" / "anchors" / "go-nsq-1.3.0"))
CONSUMERS = int(os.environ.get("FOOTPRINT_CONSUMERS", "100"))
TOPICS = int(os.environ.get("FOOTPRINT_TOPICS", "10"))
WINDOW = float(os.environ.get("FOOTPRINT_WINDOW", "60"))
POLL = float(os.environ.get("FOOTPRINT_POLL", "60"))
HEARTBEAT = float(os.environ.get("FOOTPRINT_HEARTBEAT", "30"))
LOOKUP_RATE = float(os.environ.get("FOOTPRINT_LOOKUP_RATE", "200"))
NODES = int(os.environ.get("FOOTPRINT_NODES", "5"))
ADMIN_REQUESTS = int(os.environ.get("FOOTPRINT_ADMIN_REQUESTS", "50"))
TICKS = os.sysconf("SC_CLK_TCK")
LISTENING = re.compile(r"(TCP|HTTP|HTTPS): listening on (\S+)")


class Daemon:
    """A daemon subprocess started on port 0; ``addresses`` from its "listening on" lines."""

    def __init__(self, argv: list[str], wanted: tuple[str, ...] = ("TCP", "HTTP")) -> None:
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
        self.addresses: dict[str, str] = {}
        lines = []
        assert self.proc.stderr is not None
        while not set(wanted) <= set(self.addresses):
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError(f"{argv[0]} exited:\n{''.join(lines)}")
            lines.append(line)
            found = LISTENING.search(line)
            if found:
                self.addresses[found.group(1)] = found.group(2)
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for _ in self.proc.stderr:
            pass

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def status(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(rf"{field}:\s+(\d+)", f.read()).group(1))  # type: ignore[union-attr]  # present on Linux


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def cpu_percent(pid: int, window: float) -> float:
    c0, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(window)
    return 100.0 * (cpu_seconds(pid) - c0) / (time.monotonic() - t0)


def get(address: str, path: str, method: str = "GET") -> bytes:
    request = urllib.request.Request(f"http://{address}{path}", method=method)
    with urllib.request.urlopen(request, timeout=30) as answer:
        return answer.read()


def create(address: str, topic: str) -> None:
    get(address, f"/topic/create?topic={topic}", "POST")
    get(address, f"/channel/create?topic={topic}&channel=c", "POST")


def producers(address: str, topic: str) -> list:
    try:
        doc = json.loads(get(address, f"/lookup?topic={topic}"))
    except urllib.error.HTTPError:  # 404 TOPIC_NOT_FOUND until it registers
        return []
    return list((doc.get("data", doc) or {}).get("producers") or [])


def have_go(name: str) -> bool:
    return (GO / name).is_file() and os.access(GO / name, os.X_OK)


def nsqd_argv(kind: str, data: str, lookupd_tcp: str | None = None) -> list[str]:
    flags = ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", f"--data-path={data}",
             "--broadcast-address=127.0.0.1"]
    if lookupd_tcp:
        flags.append(f"--lookupd-tcp-address={lookupd_tcp}")
    if kind == "go":
        return [str(GO / "nsqd"), *flags]
    return [PY, "-m", "nsqtw.cli", "nsqd", *flags, "--https-address="]


def lookupd_argv(kind: str) -> list[str]:
    flags = ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", "--broadcast-address=127.0.0.1"]
    if kind == "go":
        return [str(GO / "nsqlookupd"), *flags]
    return [PY, "-m", "nsqtw.cli", "nsqlookupd", *flags]


def row(what: str, ours: str, go: str) -> None:
    print(f"{what:<44} {ours:>16} {go:>22}", flush=True)


# --- idle RSS -----------------------------------------------------------------------------------

def idle_rss(kind: str, name: str) -> tuple[int, int]:
    with tempfile.TemporaryDirectory() as data:
        d = Daemon(nsqd_argv(kind, data) if name == "nsqd" else lookupd_argv(kind))
        try:
            get(d.addresses["HTTP"], "/ping")
            time.sleep(2.0)
            return status(d.pid, "VmRSS"), status(d.pid, "RssAnon")
        finally:
            d.stop()


def section_rss() -> None:
    for name in ("nsqd", "nsqlookupd"):
        rss, anon = idle_rss("tw", name)
        go = "no Go binary"
        if have_go(name):
            grss, ganon = idle_rss("go", name)
            go = f"{grss / 1024:.1f} MB ({ganon / 1024:.1f} anon)"
        row(f"idle {name} RSS", f"{rss / 1024:.1f} MB ({anon / 1024:.1f} anon)", go)


# --- client CPU holding idle consumers ------------------------------------------------------------

HOLDER = r"""
import sys
from twisted.internet import reactor
from nsqtw.client import Config, Consumer
lookupd, n, topics, poll, heartbeat = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
nodes = int(sys.argv[6])
consumers = []
def start():
    for i in range(n):
        c = Consumer(f"idle{i % topics}", "c", lambda m: None,
                     Config(lookupd_poll_interval=poll, heartbeat_interval=heartbeat, max_in_flight=1))
        c.connect_to_nsqlookupd(lookupd)
        consumers.append(c)
    def check():
        ready = sum(1 for c in consumers if len(c.connections) == nodes)
        if ready == n:
            print("READY", flush=True)
        else:
            reactor.callLater(0.2, check)
    check()
reactor.callWhenRunning(start)
reactor.run()
"""


def section_client() -> None:
    with tempfile.TemporaryDirectory() as data:
        lookupd = Daemon(lookupd_argv("tw"))
        nodes: list[Daemon] = []
        holder = None
        try:
            for n in range(NODES):  # every topic on every node, as in a fleet
                path = os.path.join(data, str(n))
                os.mkdir(path)
                nodes.append(Daemon(nsqd_argv("tw", path, lookupd.addresses["TCP"])))
                for t in range(TOPICS):
                    create(nodes[-1].addresses["HTTP"], f"idle{t}")
            deadline = time.monotonic() + 30
            while len(producers(lookupd.addresses["HTTP"], f"idle{TOPICS - 1}")) < NODES:
                if time.monotonic() > deadline:
                    raise RuntimeError("not every nsqd registered its topics")
                time.sleep(0.1)
            holder = subprocess.Popen([PY, "-c", HOLDER, lookupd.addresses["HTTP"], str(CONSUMERS), str(TOPICS),
                                       str(POLL), str(HEARTBEAT), str(NODES)], stdout=subprocess.PIPE, text=True,
                                      start_new_session=True)
            assert holder.stdout is not None
            if holder.stdout.readline().strip() != "READY":
                raise RuntimeError("the consumers' process did not connect them all")
            time.sleep(2.0)
            cpu = cpu_percent(holder.pid, WINDOW)
            row(f"client CPU, {CONSUMERS} idle consumers x {NODES} nsqd ({WINDOW:.0f} s)",
                f"{cpu:.2f} %", "no Go consumer here")
        finally:
            if holder is not None:
                holder.kill()
                holder.wait()
            for node in nodes:
                node.stop()
            lookupd.stop()


# --- nsqlookupd CPU under /lookup polling -------------------------------------------------------------

def lookup_load(address: str, rate: float, seconds: float, connections: int = 8) -> int:
    """``rate`` GET /lookup a second for ``seconds``, over keep-alive connections; requests done."""
    done = [0]
    host, port = address.rsplit(":", 1)
    per_thread = rate / connections
    stop_at = time.monotonic() + seconds

    def run(k: int) -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        i, next_at = k, time.monotonic()
        while time.monotonic() < stop_at:
            conn.request("GET", f"/lookup?topic=idle{i % TOPICS}")
            conn.getresponse().read()
            done[0] += 1
            i += connections
            next_at += 1.0 / per_thread
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        conn.close()

    threads = [threading.Thread(target=run, args=(k,)) for k in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return done[0]


def lookupd_cpu(kind: str) -> tuple[float, int]:
    with tempfile.TemporaryDirectory() as data:
        lookupd = Daemon(lookupd_argv(kind))
        nsqd = Daemon(nsqd_argv("go" if have_go("nsqd") else "tw", data, lookupd.addresses["TCP"]))
        try:
            for t in range(TOPICS):
                create(nsqd.addresses["HTTP"], f"idle{t}")
            deadline = time.monotonic() + 30
            while not producers(lookupd.addresses["HTTP"], f"idle{TOPICS - 1}"):
                if time.monotonic() > deadline:
                    raise RuntimeError("nsqlookupd never learnt the topics")
                time.sleep(0.1)
            window = min(WINDOW, 30.0)
            result: dict[str, float] = {}
            sampler = threading.Thread(target=lambda: result.update(cpu=cpu_percent(lookupd.pid, window)))
            sampler.start()
            done = lookup_load(lookupd.addresses["HTTP"], LOOKUP_RATE, window)
            sampler.join()
            return result["cpu"], done
        finally:
            nsqd.stop()
            lookupd.stop()


def section_lookupd() -> None:
    cpu, done = lookupd_cpu("tw")
    go = "no Go binary"
    if have_go("nsqlookupd"):
        gcpu, gdone = lookupd_cpu("go")
        go = f"{gcpu:.2f} % ({gdone} req)  ratio {cpu / gcpu:.2f}" if gcpu > 0 else f"0 % ({gdone} req)"
    row(f"nsqlookupd CPU, {LOOKUP_RATE:.0f} /lookup a second", f"{cpu:.2f} % ({done} req)", go)


# --- nsqadmin /api/nodes ------------------------------------------------------------------------

def section_admin() -> None:
    with tempfile.TemporaryDirectory() as data:
        lookupd = Daemon(lookupd_argv("tw"))
        nodes: list[Daemon] = []
        admin = None
        try:
            for n in range(NODES):
                path = os.path.join(data, str(n))
                os.mkdir(path)
                nodes.append(Daemon(nsqd_argv("tw", path, lookupd.addresses["TCP"])))
                get(nodes[-1].addresses["HTTP"], f"/topic/create?topic=t{n}", "POST")
            deadline = time.monotonic() + 30
            while len(json.loads(get(lookupd.addresses["HTTP"], "/nodes"))["producers"]) < NODES:
                if time.monotonic() > deadline:
                    raise RuntimeError("not every nsqd registered")
                time.sleep(0.1)
            admin = Daemon([PY, "-m", "nsqtw.cli", "nsqadmin", "--http-address=127.0.0.1:0",
                            f"--lookupd-http-address={lookupd.addresses['HTTP']}"], wanted=("HTTP",))
            for _ in range(5):
                get(admin.addresses["HTTP"], "/api/nodes")
            times = []
            for _ in range(ADMIN_REQUESTS):
                t0 = time.perf_counter()
                body = get(admin.addresses["HTTP"], "/api/nodes")
                times.append((time.perf_counter() - t0) * 1000)
            count = len(json.loads(body).get("nodes", []))
            times.sort()
            row(f"nsqadmin /api/nodes, {NODES} nodes ({count} listed)",
                f"{statistics.median(times):.1f} ms (p90 {times[int(len(times) * 0.9)]:.1f})",
                "no Go nsqadmin here")
        finally:
            if admin is not None:
                admin.stop()
            for node in nodes:
                node.stop()
            lookupd.stop()


SECTIONS = {"rss": section_rss, "client": section_client, "lookupd": section_lookupd, "admin": section_admin}


def main(argv: list[str]) -> int:
    chosen = argv or list(SECTIONS)
    unknown = [s for s in chosen if s not in SECTIONS]
    if unknown:
        print(f"unknown section(s) {unknown}; choose from {list(SECTIONS)}", file=sys.stderr)
        return 2
    print(f"nsqtw: {PY}; Go's NSQ: {GO if GO.is_dir() else 'not found (' + str(GO) + ')'}")
    row("", "nsqtw", "Go 1.3.0")
    for name in chosen:
        SECTIONS[name]()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
