#!/usr/bin/env python
"""
The replication proof (issues 26 and 44): losing a whole nsqd node loses no acknowledged
message, whether it dies, hangs, is cut off, or its peer's disk is full.

Each cycle starts two nsqd processes (nsqtw's drop-in command) sharing a secret file written
in the cycle's directory (``--replication-secret-file``, ``--replication-timeout=2s``): B
(``--node-id=2``), a peer with a ``--replication-address`` and ``--adopt-after=1s``, and A
(``--node-id=1``), the origin, with ``--replica-peer`` naming B.  A publisher (plain protocol
V2 written here, or with ``--client`` a stock client library in its own process: nsqtw's
Producer, pynsq's Writer, see ``bench/proof_publisher.py``; go-nsq's Producer, see
``bench/proof_publisher_go/``) publishes PUB and MPUB batches to A and records each body whose
``OK`` came back, while a consumer on A's channel works through them slowly (FIN each).  After
a random number of batches A meets the fault in the middle of a publish.  A consumer on B's
same channel then drains what B delivers once it adopted A.  Every acknowledged body must have
been delivered, by A's consumer before the fault or by B after it; duplicates are counted and
printed.  The faults (``--fault``, several separated by commas):

``kill``
    SIGKILL, and A's data directory is deleted (the kernel closes the link).
``pause``
    SIGSTOP, never resumed (a hung host, a paused VM: the link stays open and silent); A is
    killed once B's messages are drained.  B must adopt within ``--adopt-after`` +
    ``--replication-timeout`` + 1 s of the stop (``late`` counts the cycles that did not).
``partition``
    A reaches B through a proxy (``bench/blackhole.py``).  Publish, blackhole the proxy
    (nothing passes either way, no socket is closed) for longer than ``--replication-timeout``
    (B may adopt A meanwhile: duplicates, never loss), heal, wait until A's /stats shows B
    ``in_sync`` again, publish more, then SIGKILL and delete A: B must adopt again, in time.
``disk``
    B's data directory is a 16 MiB tmpfs (needs root) with ``--mem-queue-size=0``, filled
    just before A is killed: B's adoption fails on the full disk (its /stats lists it in
    ``replication.adoption.failing``); after 3 s the space is freed and B must finish the
    adoption and deliver everything.

::

    python bench/replication_proof.py                    # 20 kill cycles, replicated: exit 1 on any loss
    python bench/replication_proof.py --fault=pause --cycles=5
    python bench/replication_proof.py --fault=kill,pause,partition,disk --cycles=5   # (disk: as root)
    python bench/replication_proof.py --no-replication   # kill without replication: loses
    python bench/replication_proof.py --client=pynsq     # published by pynsq's Writer (kill, pause)
    python bench/replication_proof.py --client=go-nsq    # published by go-nsq's Producer (kill, pause)
    python bench/replication_proof.py --keep             # keep the nodes' logs (kept anyway after a failure)

It prints each cycle's figures, then per fault: acknowledged, lost, duplicated.  It exits 1
when a message was lost, an adoption was late or missing, or a cycle could not finish; the
nodes' logs (``origin.log``, ``peer.log`` per cycle) are then kept and their directory printed.

``--client=go-nsq`` needs Go (``go``) and go-nsq's module: ``go build`` fetches it through the
Go module proxy, or, offline, ``NSQTW_GO_NSQ_SRC`` and ``NSQTW_GO_SNAPPY_SRC`` name checkouts
of github.com/nsqio/go-nsq and github.com/golang/snappy; ``NSQTW_GO_PUBLISHER`` names a
publisher built before (``go build`` in ``bench/proof_publisher_go``).

Without replication B is a plain nsqd that never had A's messages: what A's consumer had not
finished is lost with A's disk, which shows the check can fail.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import importlib.util
import json
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _beside(name: str) -> Any:
    """A module of bench/ (this file is run as a script and loaded by the tests by its path)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


Blackhole = _beside("blackhole").Blackhole
_I32 = struct.Struct(">i")
_FRAME = struct.Struct(">ii")
TOPIC = b"proof"
#: the publishers: plain protocol V2 written here, or a client library in its own process
CLIENTS = ("raw", "nsqtw", "pynsq", "go-nsq")
CHANNEL = b"c"
#: the faults: SIGKILL, SIGSTOP (a hung host), a silent partition healed then SIGKILL, SIGKILL
#: while the peer's disk is full
FAULTS = ("kill", "pause", "partition", "disk")
#: --replication-timeout and --adopt-after of every cycle's pair (seconds)
TIMEOUT = 2.0
ADOPT_AFTER = 1.0
#: issue 44: an origin killed, hung or lost after a healed partition is adopted within this
ADOPT_BOUND = ADOPT_AFTER + TIMEOUT + 1.0
#: the disk fault: the size of the peer's tmpfs, and how long it stays full after the kill
TMPFS_SIZE = "16m"
DISK_FULL_FOR = 3.0


class Unavailable(Exception):
    """A fault that cannot run here (the disk fault without root); why."""


class Nsqd:
    """nsqtw's nsqd as a child process; what it logs after its start lines goes to ``log`` (a
    file path) when given."""

    def __init__(self, data: str, *flags: str, log: str | None = None) -> None:
        level = "info" if log else "warn"
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        # both ports chosen by the kernel and read from the start lines (a port picked here and
        # released could be taken by an outgoing connection before nsqd binds it)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nsqtw.cli", "--tcp-address=127.0.0.1:0",
             "--http-address=127.0.0.1:0", "--https-address=", f"--data-path={data}",
             f"--log-level={level}", *flags],
            stderr=subprocess.PIPE, env=env, text=True)
        self.port = self.http = self.replication_port = 0
        assert self.proc.stderr is not None
        said: list[str] = []
        for line in self.proc.stderr:
            if "TCP: listening on" in line:
                self.port = int(line.rsplit(":", 1)[1])
            elif "REPLICATION: listening on" in line:  # before HTTP's: the listeners start in that order
                self.replication_port = int(line.rsplit(":", 1)[1])
            elif "HTTP: listening on" in line:
                self.http = int(line.rsplit(":", 1)[1])
            else:
                said.append(line)
            if self.port and self.http:
                break
        if not (self.port and self.http):
            self.proc.kill()
            raise RuntimeError("nsqd did not start: " + "".join(said[-20:]))
        self.log = log
        self._logged = threading.Thread(target=self._drain_log, args=(said,), daemon=True)
        self._logged.start()

    def _drain_log(self, said: list[str]) -> None:
        assert self.proc.stderr is not None
        if self.log is None:
            for _ in self.proc.stderr:
                pass
            return
        with open(self.log, "a") as f:
            f.writelines(said)
            for line in self.proc.stderr:
                f.write(line)
                f.flush()

    def stats(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/stats?format=json", timeout=5) as r:
            doc: dict = json.loads(r.read())
            return doc

    def replication(self) -> dict:
        doc: dict = self.stats().get("replication") or {}
        return doc

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._logged.join(5)

    def pause(self) -> None:
        """SIGSTOP: a hung host (its sockets stay open, nothing is sent or read)."""
        self.proc.send_signal(signal.SIGSTOP)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(30)
        self._logged.join(5)
        return code


def connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"  V2")
    return s


def read_frame(s: socket.socket, buf: bytearray) -> tuple[int, bytes] | None:
    while True:
        if len(buf) >= 8:
            size, ftype = _FRAME.unpack_from(buf, 0)
            if len(buf) >= 4 + size:
                data = bytes(buf[8:4 + size])
                del buf[:4 + size]
                if ftype == 0 and data == b"_heartbeat_":
                    s.sendall(b"NOP\n")
                    continue
                return ftype, data
        chunk = s.recv(65536)
        if not chunk:
            return None
        buf += chunk


def mpub(bodies: list[bytes]) -> bytes:
    payload = _I32.pack(len(bodies)) + b"".join(_I32.pack(len(b)) + b for b in bodies)
    return b"MPUB " + TOPIC + b"\n" + _I32.pack(len(payload)) + payload


def pub(body: bytes) -> bytes:
    return b"PUB " + TOPIC + b"\n" + _I32.pack(len(body)) + body


class SlowConsumer(threading.Thread):
    """A consumer of A's channel that FINs each message after a short pause, until A dies."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.got: list[bytes] = []
        self.ready = threading.Event()

    def run(self) -> None:
        try:
            s = connect(self.port)
            s.sendall(b"SUB " + TOPIC + b" " + CHANNEL + b"\nRDY 1\n")
            buf = bytearray()
            if read_frame(s, buf) != (0, b"OK"):
                return
            self.ready.set()
            while True:
                frame = read_frame(s, buf)
                if frame is None:
                    return
                ftype, data = frame
                if ftype != 2:
                    continue
                time.sleep(0.003)
                self.got.append(data[26:])
                s.sendall(b"FIN " + data[10:26] + b"\n")
        except OSError:
            return
        finally:
            self.ready.set()


def publish_until_killed(origin: Nsqd, acked: set[bytes], seq: list[int], batches: int,
                         stop: Callable[[], None] | None = None) -> None:
    """PUB and MPUB batches; after ``batches`` acknowledged ones, send one more and stop A with
    ``stop`` (default: SIGKILL; that last batch may or may not be acknowledged: it is never
    counted), or with ``stop=NO_STOP`` just return."""
    done = 0
    deadline = time.monotonic() + 30
    while done <= batches:
        s = connect(origin.port)
        buf = bytearray()
        try:
            while True:
                if done == batches and stop is NO_STOP:
                    return
                n = 1 if seq[0] % 3 == 0 else 5
                bodies = [b"m%09d" % (seq[0] + i) for i in range(n)]
                seq[0] += n
                s.sendall(pub(bodies[0]) if n == 1 else mpub(bodies))
                if done == batches:
                    (stop or origin.kill)()
                    return
                frame = read_frame(s, buf)
                if frame == (0, b"OK"):
                    acked.update(bodies)
                    done += 1
                    deadline = time.monotonic() + 30
                    continue
                # E_PUB_FAILED: the peer is not in sync yet (the link is coming up); retry
                if time.monotonic() > deadline:
                    raise RuntimeError(f"publishes refused for 30 s: {frame!r}")
                time.sleep(0.05)
                break
        finally:
            s.close()


def NO_STOP() -> None:
    """``publish_until_killed(..., stop=NO_STOP)``: publish the batches and leave A running."""


GO_SOURCE = ROOT / "bench" / "proof_publisher_go"
#: where go-nsq and snappy come from offline: module path -> environment variable naming a checkout
GO_REPLACE = {"github.com/nsqio/go-nsq": "NSQTW_GO_NSQ_SRC", "github.com/golang/snappy": "NSQTW_GO_SNAPPY_SRC"}


def go_publisher() -> tuple[str | None, str]:
    """go-nsq's publisher (``bench/proof_publisher_go``), built once per source and setting:
    ``(path, "")``, or ``(None, why not)`` when Go or go-nsq's module is not to be had here."""
    built = os.environ.get("NSQTW_GO_PUBLISHER")
    if built:
        if os.access(built, os.X_OK):
            return built, ""
        return None, f"NSQTW_GO_PUBLISHER={built} is not an executable"
    go = shutil.which("go")
    if go is None:
        return None, "Go is not installed (go is not on PATH), so go-nsq's publisher cannot be built"
    replace = {mod: os.environ[var] for mod, var in GO_REPLACE.items() if os.environ.get(var)}
    key = hashlib.sha256(repr(sorted(replace.items())).encode())
    for name in sorted(os.listdir(GO_SOURCE)):
        key.update(name.encode() + (GO_SOURCE / name).read_bytes())
    out = Path(tempfile.gettempdir()) / f"nsqtw-proofpublisher-{key.hexdigest()[:16]}"
    binary = out / "proofpublisher"
    if binary.exists():
        return str(binary), ""
    with tempfile.TemporaryDirectory(prefix="nsqtw-go-build-") as work:
        for name in os.listdir(GO_SOURCE):
            shutil.copy(GO_SOURCE / name, work)
        steps = [[go, "mod", "edit", f"-replace={mod}={path}"] for mod, path in replace.items()]
        steps += [[go, "mod", "tidy"], [go, "build", "-o", "proofpublisher", "."]]
        for step in steps:
            try:
                done = subprocess.run(step, cwd=work, capture_output=True, text=True, timeout=300)
            except subprocess.TimeoutExpired:
                return None, f"{' '.join(step[1:])} took over 300 s"
            if done.returncode:
                said = (done.stderr.strip().splitlines() or ["(nothing said)"])[-1]
                return None, (f"go-nsq's publisher did not build ({' '.join(step[1:3])}: {said}); set "
                              "NSQTW_GO_NSQ_SRC and NSQTW_GO_SNAPPY_SRC to checkouts of go-nsq and "
                              "snappy when no Go module proxy can be reached")
        out.mkdir(exist_ok=True)
        shutil.move(os.path.join(work, "proofpublisher"), binary)
    return str(binary), ""


def publish_with_client(origin: Nsqd, client: str, acked: set[bytes], seq: list[int], batches: int,
                        stop: Callable[[], None] | None = None, hangs: bool = False) -> None:
    """The same with a stock client library (``bench/proof_publisher.py``, or go-nsq's publisher
    for ``go-nsq``) in its own process: after ``batches`` acknowledged batches stop A with
    ``stop`` (default: SIGKILL) while the client has more in flight; every line it printed
    (before or after the stop) is a batch whose ``OK`` came from A.  ``hangs``: A is stopped
    without closing its sockets (SIGSTOP), so the client is killed a second after."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if client == "go-nsq":
        binary, why = go_publisher()
        if binary is None:
            raise RuntimeError(why)
        command = [binary]
    else:
        command = [sys.executable, str(ROOT / "bench" / "proof_publisher.py"), client]
    with tempfile.TemporaryFile("w+") as said:  # its log (a pipe nobody reads could fill and stall it)
        publisher = subprocess.Popen(
            [*command, f"127.0.0.1:{origin.port}", str(seq[0])],
            stdout=subprocess.PIPE, stderr=said, env=env, text=True)
        assert publisher.stdout is not None
        watchdog = threading.Timer(60, publisher.kill)  # a publisher that hangs fails the cycle below
        watchdog.start()
        done = 0
        try:
            for line in publisher.stdout:
                bodies = line.encode().split()
                acked.update(bodies)
                seq[0] = max(seq[0], int(bodies[-1][1:]) + 1)
                done += 1
                if done == batches:
                    (stop or origin.kill)()
                    if hangs:
                        watchdog.cancel()
                        watchdog = threading.Timer(1, publisher.kill)
                        watchdog.start()
            code = publisher.wait(10)
        finally:
            watchdog.cancel()
            if publisher.poll() is None:
                publisher.kill()
        if (code != 0 and not (hangs and done >= batches)) or done < batches:
            said.seek(0)
            raise RuntimeError(f"the {client} publisher exited {code} after {done} batches: " + said.read()[-2000:])


def wait_adopted(peer: Nsqd, before: int = 0, since: float | None = None, timeout: float = 30.0) -> float:
    """Wait until the peer lists more than ``before`` adoptions in /stats; the seconds from
    ``since`` (a ``time.time()``, default now) to the adoption by the peer's own clock (its
    ``at``, the same host's clock: the proof's polling adds nothing), or -1.0 when there was
    none within ``timeout``."""
    start = time.time() if since is None else since
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        adopted = peer.replication().get("adopted") or []
        if len(adopted) > before:
            return round(float(adopted[-1]["at"]) - start, 2)
        time.sleep(0.1)
    return -1.0


def peer_state(origin: Nsqd) -> str:
    """The state of the origin's one peer in its /stats (``in_sync``, ``connecting``, ...)."""
    peers = origin.replication().get("peers") or [{}]
    return str(peers[0].get("state", "none"))


def wait_in_sync(origin: Nsqd, timeout: float = 30.0) -> float:
    """Seconds until the origin's /stats shows its peer ``in_sync`` (RuntimeError after ``timeout``)."""
    start = time.monotonic()
    while time.monotonic() < start + timeout:
        if peer_state(origin) == "in_sync":
            return round(time.monotonic() - start, 2)
        time.sleep(0.1)
    raise RuntimeError(f"the pair was not back in sync {timeout:.0f} s after the partition healed: "
                       f"the origin's peers {origin.replication().get('peers')}")


def partition(origin: Nsqd, peer: Nsqd, proxy: Any, seconds: float) -> dict[str, float]:
    """Blackhole the link for ``seconds`` (nothing passes, nothing is closed), heal it, wait until
    the pair is in sync again.  Whether the origin saw its peer out of sync meanwhile, whether
    the peer adopted the origin meanwhile (allowed: it then delivers what the origin also
    delivers, duplicates), and how long the pair took to be in sync again."""
    adopted = len(peer.replication().get("adopted") or [])
    proxy.cut()
    end = time.monotonic() + seconds
    detected = 0
    while time.monotonic() < end:
        if peer_state(origin) != "in_sync":
            detected = 1
        time.sleep(0.1)
    adopted_meanwhile = len(peer.replication().get("adopted") or []) - adopted
    proxy.heal()
    return {"partition_seconds": round(seconds, 2), "partition_seen_by_origin": detected,
            "adopted_during_partition": adopted_meanwhile, "resync_seconds": wait_in_sync(origin)}


def wait_failing(peer: Nsqd, timeout: float = 20.0) -> int:
    """1 once the peer's /stats lists a failing adoption (``replication.adoption.failing``), 0
    if none within ``timeout``."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if (peer.replication().get("adoption") or {}).get("failing"):
            return 1
        time.sleep(0.1)
    return 0


# --- the disk fault: the peer's data path on a small tmpfs (root only) -------------------------


def mount_tmpfs(path: str, size: str = TMPFS_SIZE) -> str | None:
    """Mount a tmpfs of ``size`` on ``path``: None, or why it cannot be done here."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "mounting a small tmpfs (the disk fault) needs root"
    if shutil.which("mount") is None:
        return "no mount command here"
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path],
                          capture_output=True, text=True)
    if done.returncode:
        return f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}"
    return None


def unmount(path: str) -> None:
    subprocess.run(["umount", "-l", path], capture_output=True)


def disk_fault_unavailable() -> str | None:
    """None when the disk fault can run here, else why not (for a skip)."""
    with tempfile.TemporaryDirectory(prefix="nsqtw-tmpfs-probe-") as path:
        why = mount_tmpfs(path, "1m")
        if why is None:
            unmount(path)
        return why


def fill(path: str) -> str:
    """Write a file in ``path`` until its filesystem is full; the file's name."""
    name = os.path.join(path, "filler")
    with open(name, "wb", buffering=0) as f:
        for chunk in (b"\0" * 65536, b"\0"):  # the last bytes one at a time
            try:
                while True:
                    f.write(chunk)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
    return name


def drain(port: int, idle: float = 1.5) -> list[bytes]:
    s = connect(port)
    s.sendall(b"SUB " + TOPIC + b" " + CHANNEL + b"\nRDY 2500\n")
    buf = bytearray()
    assert read_frame(s, buf) == (0, b"OK")
    got: list[bytes] = []
    s.settimeout(idle)
    while True:
        try:
            frame = read_frame(s, buf)
        except TimeoutError:
            break
        if frame is None:
            break
        ftype, data = frame
        if ftype == 2:
            got.append(data[26:])
            s.sendall(b"FIN " + data[10:26] + b"\n")
    s.close()
    return got


def write_secret(path: str) -> str:
    """A --replication-secret-file for one cycle's pair (32 random bytes, hex, mode 600)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(os.urandom(32).hex() + "\n")
    return path


def cycle(workdir: str, rng: random.Random, replicated: bool, seq: list[int], client: str = "raw",
          fault: str = "kill") -> dict[str, Any]:
    """One cycle of ``fault`` (see the module's docstring) in a new directory under ``workdir``,
    which keeps the nodes' logs (``origin.log``, ``peer.log``); the figures."""
    if fault not in FAULTS:
        raise ValueError(f"fault must be one of {', '.join(FAULTS)}, not {fault!r}")
    if fault != "kill" and not replicated:
        raise ValueError("only the kill fault runs without replication")
    if client != "raw" and fault in ("partition", "disk"):
        raise ValueError(f"the {fault} fault publishes with the raw publisher only")
    here = tempfile.mkdtemp(prefix=f"{fault}-", dir=workdir)
    a_data, b_data = os.path.join(here, "origin"), os.path.join(here, "peer")
    os.mkdir(a_data)
    os.mkdir(b_data)
    secret = write_secret(os.path.join(here, "secret"))
    common = [f"--replication-secret-file={secret}", f"--replication-timeout={TIMEOUT}s"]
    # the peer's replication port chosen by the kernel too, read from its start lines
    peer_flags = ["--replication-address=127.0.0.1:0", f"--adopt-after={ADOPT_AFTER}s", *common] if replicated else []
    mounted = False
    if fault == "disk":
        why = mount_tmpfs(b_data)
        if why is not None:
            raise Unavailable(why)
        mounted = True
        peer_flags.append("--mem-queue-size=0")  # what is adopted goes to the (full) disk
    row: dict[str, Any] = {"logs": here}
    origin: Nsqd | None = None
    proxy: Any = None
    filler = ""
    stopped = [0.0]
    try:
        peer = Nsqd(b_data, "--node-id=2", *peer_flags, log=os.path.join(here, "peer.log"))
        try:
            rport = target = peer.replication_port
            if fault == "partition":
                proxy = Blackhole(("127.0.0.1", rport))
                target = proxy.port
            origin_flags = [f"--replica-peer=127.0.0.1:{target}", *common] if replicated else []
            origin = Nsqd(a_data, "--node-id=1", *origin_flags, log=os.path.join(here, "origin.log"))
            a = origin

            def stop() -> None:
                nonlocal filler
                if fault == "disk":
                    filler = fill(b_data)
                stopped[0] = time.time()
                a.pause() if fault == "pause" else a.kill()

            consumer = SlowConsumer(origin.port)
            consumer.start()
            consumer.ready.wait(10)
            acked: set[bytes] = set()
            batches = rng.randint(20, 200)
            adopted_before = 0
            if fault == "partition":
                first = rng.randint(10, batches - 10)
                publish_until_killed(origin, acked, seq, first, NO_STOP)
                row.update(partition(origin, peer, proxy, rng.uniform(TIMEOUT + 0.5, TIMEOUT + ADOPT_AFTER + 2)))
                adopted_before = len(peer.replication().get("adopted") or [])
                publish_until_killed(origin, acked, seq, batches - first, stop)
            elif client == "raw":
                publish_until_killed(origin, acked, seq, batches, stop)
            else:
                publish_with_client(origin, client, acked, seq, batches, stop, hangs=fault == "pause")
            if fault != "pause":  # the whole node is gone: process and disk
                shutil.rmtree(a_data)
                consumer.join(10)
            if fault == "disk":
                row["adoption_failing_seen"] = wait_failing(peer)
                time.sleep(DISK_FULL_FOR)
                os.remove(filler)
            if replicated:
                took = wait_adopted(peer, adopted_before, stopped[0])
                row["adopt_seconds"] = took
                if fault != "disk":
                    row["late"] = int(took < 0 or took > ADOPT_BOUND)
            after = drain(peer.port)
            if fault == "pause":  # the hung host is gone for good
                origin.kill()
                shutil.rmtree(a_data)
                consumer.join(10)
        finally:
            if origin is not None and origin.proc.poll() is None:
                origin.kill()
            if proxy is not None:
                proxy.close()
            if filler and os.path.exists(filler):
                os.remove(filler)
            peer.stop()
    finally:
        if mounted:
            unmount(b_data)
        shutil.rmtree(a_data, ignore_errors=True)
        shutil.rmtree(b_data, ignore_errors=True)
    delivered = consumer.got + after
    unique = set(delivered)
    row.update({"acknowledged": len(acked), "delivered_by_origin": len(consumer.got),
                "delivered_by_survivor": len(after), "duplicates": len(delivered) - len(unique),
                "lost": len(acked - unique)})
    return row


def show(row: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in row.items() if k != "logs")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cycles", type=int, default=20, help="cycles per fault")
    ap.add_argument("--fault", default="kill",
                    help=f"the fault, or several separated by commas: {', '.join(FAULTS)} (default kill)")
    ap.add_argument("--no-replication", action="store_true", help="the same run without replication (kill only)")
    ap.add_argument("--seed", type=int, default=20261126)
    ap.add_argument("--client", choices=CLIENTS, default="raw",
                    help="the publisher: raw protocol V2 (default), nsqtw's Producer, pynsq's Writer "
                    "or go-nsq's Producer (kill and pause only)")
    ap.add_argument("--keep", action="store_true", help="keep the nodes' logs (kept anyway after a loss)")
    args = ap.parse_args(argv)
    faults = [f.strip() for f in args.fault.split(",") if f.strip()]
    for f in faults:
        if f not in FAULTS:
            ap.error(f"--fault: {f!r} is not one of {', '.join(FAULTS)}")
        if f != "kill" and args.no_replication:
            ap.error("--no-replication runs the kill fault only")
        if f in ("partition", "disk") and args.client != "raw":
            ap.error(f"--fault={f} publishes with --client=raw only")
    rng = random.Random(args.seed)
    seq = [0]
    workdir = tempfile.mkdtemp(prefix="nsqtw-replication-proof-")
    failed = False
    summary: list[str] = []
    for fault in faults:
        totals: dict[str, Any] = {}
        skipped = ""
        for i in range(args.cycles):
            try:
                row = cycle(workdir, rng, not args.no_replication, seq, args.client, fault)
            except Unavailable as e:
                skipped = str(e)
                break
            except Exception as e:  # a cycle that could not finish says why and where its logs are
                failed = True
                print(f"{fault} cycle {i + 1:2d}: FAILED: {e!r} (logs in {workdir})", flush=True)
                continue
            for k, v in row.items():
                if isinstance(v, float):
                    totals["max_" + k] = max(totals.get("max_" + k, v), v)
                elif isinstance(v, int):
                    totals[k] = totals.get(k, 0) + v
            bad = row["lost"] or row.get("late") or row.get("adopt_seconds", 0) < 0
            failed = failed or bool(bad)
            print(f"{fault} cycle {i + 1:2d}: {show(row)}" + (f" (logs in {row['logs']})" if bad else ""), flush=True)
        if skipped:
            summary.append(f"{fault}: skipped ({skipped})")
        else:
            summary.append(f"{fault}: acknowledged {totals.get('acknowledged', 0)}, lost {totals.get('lost', 0)}, "
                           f"duplicated {totals.get('duplicates', 0)} ({show(totals)})")
    mode = ("without replication" if args.no_replication else "replicated pair") + f", {args.client} publisher"
    print(f"{mode}, {args.cycles} cycles per fault:", flush=True)
    for line in summary:
        print("  " + line, flush=True)
    if failed or args.keep:
        print(f"the nodes' logs: {workdir}", flush=True)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
