#!/usr/bin/env python
"""
The replication proof (issue 26): losing a whole nsqd node loses no acknowledged message.

Each cycle starts two nsqd processes (nsqtw's drop-in command): B, a peer with a
``--replication-address`` and ``--adopt-after=1s``, and A, the origin, with
``--replica-peer`` naming B.  A publisher (plain protocol V2 written here, or with
``--client`` a stock client library in its own process: nsqtw's Producer, pynsq's Writer, see
``bench/proof_publisher.py``; go-nsq's Producer, see ``bench/proof_publisher_go/``)
publishes PUB and MPUB batches to A and records each body whose ``OK`` came back, while a
consumer on A's channel works through them slowly (FIN each).  After a random number of
batches A gets SIGKILL in the middle of a publish and its data directory is deleted.  A
consumer on B's same channel then drains what B delivers once it adopted A.  Every
acknowledged body must have been delivered, by A's consumer before the crash or by B after
it; duplicates are counted and printed.

    python bench/replication_proof.py                    # 20 cycles, replicated: exit 1 on any loss
    python bench/replication_proof.py --no-replication   # the same without replication: loses
    python bench/replication_proof.py --client=pynsq     # published by pynsq's Writer
    python bench/replication_proof.py --client=go-nsq    # published by go-nsq's Producer

``--client=go-nsq`` needs Go (``go``) and go-nsq's module: ``go build`` fetches it through the
Go module proxy, or, offline, ``NSQTW_GO_NSQ_SRC`` and ``NSQTW_GO_SNAPPY_SRC`` name checkouts
of github.com/nsqio/go-nsq and github.com/golang/snappy; ``NSQTW_GO_PUBLISHER`` names a
publisher built before (``go build`` in ``bench/proof_publisher_go``).

Without replication B is a plain nsqd that never had A's messages: what A's consumer had not
finished is lost with A's disk, which shows the check can fail.
"""

from __future__ import annotations

import argparse
import hashlib
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_I32 = struct.Struct(">i")
_FRAME = struct.Struct(">ii")
TOPIC = b"proof"
#: the publishers: plain protocol V2 written here, or a client library in its own process
CLIENTS = ("raw", "nsqtw", "pynsq", "go-nsq")
CHANNEL = b"c"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Nsqd:
    """nsqtw's nsqd as a child process."""

    def __init__(self, data: str, *flags: str) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        # both ports chosen by the kernel and read from the start lines (a port picked here and
        # released could be taken by an outgoing connection before nsqd binds it)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nsqtw.cli", "--tcp-address=127.0.0.1:0",
             "--http-address=127.0.0.1:0", "--https-address=", f"--data-path={data}",
             "--log-level=warn", *flags],
            stderr=subprocess.PIPE, env=env, text=True)
        self.port = self.http = 0
        assert self.proc.stderr is not None
        said: list[str] = []
        for line in self.proc.stderr:
            if "TCP: listening on" in line:
                self.port = int(line.rsplit(":", 1)[1])
            elif "HTTP: listening on" in line:
                self.http = int(line.rsplit(":", 1)[1])
            else:
                said.append(line)
            if self.port and self.http:
                break
        if not (self.port and self.http):
            raise RuntimeError("nsqd did not start: " + "".join(said[-20:]))
        threading.Thread(target=self._drain_log, daemon=True).start()

    def _drain_log(self) -> None:
        assert self.proc.stderr is not None
        for _ in self.proc.stderr:
            pass

    def stats(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/stats?format=json", timeout=5) as r:
            doc: dict = json.loads(r.read())
            return doc

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(30)


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


def publish_until_killed(origin: Nsqd, acked: set[bytes], seq: list[int], batches: int) -> None:
    """PUB and MPUB batches; after ``batches`` acknowledged ones, send one more and SIGKILL A
    (that last batch may or may not be acknowledged: it is never counted)."""
    done = 0
    deadline = time.monotonic() + 30
    while done <= batches:
        s = connect(origin.port)
        buf = bytearray()
        try:
            while True:
                n = 1 if seq[0] % 3 == 0 else 5
                bodies = [b"m%09d" % (seq[0] + i) for i in range(n)]
                seq[0] += n
                s.sendall(pub(bodies[0]) if n == 1 else mpub(bodies))
                if done == batches:
                    origin.kill()
                    return
                frame = read_frame(s, buf)
                if frame == (0, b"OK"):
                    acked.update(bodies)
                    done += 1
                    continue
                # E_PUB_FAILED: the peer is not in sync yet (the link is coming up); retry
                if time.monotonic() > deadline:
                    raise RuntimeError(f"publishes refused for 30 s: {frame!r}")
                time.sleep(0.05)
                break
        finally:
            s.close()


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


def publish_with_client(origin: Nsqd, client: str, acked: set[bytes], seq: list[int], batches: int) -> None:
    """The same with a stock client library (``bench/proof_publisher.py``, or go-nsq's publisher
    for ``go-nsq``) in its own process: after ``batches`` acknowledged batches SIGKILL A while
    the client has more in flight; every line it printed (before or after the kill) is a batch
    whose ``OK`` came from A."""
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
                    origin.kill()
            code = publisher.wait(10)
        finally:
            watchdog.cancel()
            if publisher.poll() is None:
                publisher.kill()
        if code != 0 or done < batches:
            said.seek(0)
            raise RuntimeError(f"the {client} publisher exited {code} after {done} batches: " + said.read()[-2000:])


def wait_adopted(peer: Nsqd, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if peer.stats().get("replication", {}).get("adopted"):
            return
        time.sleep(0.1)
    raise RuntimeError("the peer did not adopt the origin")


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


def cycle(workdir: str, rng: random.Random, replicated: bool, seq: list[int], client: str = "raw") -> dict[str, int]:
    a_data = tempfile.mkdtemp(prefix="origin-", dir=workdir)
    b_data = tempfile.mkdtemp(prefix="peer-", dir=workdir)
    rport = free_port()
    peer_flags = [f"--replication-address=127.0.0.1:{rport}", "--adopt-after=1s"] if replicated else []
    peer = Nsqd(b_data, "--node-id=2", *peer_flags)
    try:
        origin_flags = [f"--replica-peer=127.0.0.1:{rport}"] if replicated else []
        origin = Nsqd(a_data, "--node-id=1", *origin_flags)
        consumer = SlowConsumer(origin.port)
        consumer.start()
        consumer.ready.wait(10)
        acked: set[bytes] = set()
        try:
            if client == "raw":
                publish_until_killed(origin, acked, seq, rng.randint(20, 200))
            else:
                publish_with_client(origin, client, acked, seq, rng.randint(20, 200))
        finally:
            if origin.proc.poll() is None:
                origin.kill()
        shutil.rmtree(a_data)  # the whole node is gone: process and disk
        consumer.join(10)
        if replicated:
            wait_adopted(peer)
        after = drain(peer.port)
    finally:
        peer.stop()
        shutil.rmtree(b_data, ignore_errors=True)
    delivered = consumer.got + after
    unique = set(delivered)
    return {"acknowledged": len(acked), "delivered_by_origin": len(consumer.got),
            "delivered_by_survivor": len(after), "duplicates": len(delivered) - len(unique),
            "lost": len(acked - unique)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cycles", type=int, default=20)
    ap.add_argument("--no-replication", action="store_true", help="the same run without replication")
    ap.add_argument("--seed", type=int, default=20261126)
    ap.add_argument("--client", choices=CLIENTS, default="raw",
                    help="the publisher: raw protocol V2 (default), nsqtw's Producer, pynsq's Writer "
                    "or go-nsq's Producer")
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    seq = [0]
    totals: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="nsqtw-replication-proof-") as workdir:
        for i in range(args.cycles):
            row = cycle(workdir, rng, not args.no_replication, seq, args.client)
            for k, v in row.items():
                totals[k] = totals.get(k, 0) + v
            print(f"cycle {i + 1:2d}: " + ", ".join(f"{k} {v}" for k, v in row.items()), flush=True)
    mode = ("without replication" if args.no_replication else "replicated pair") + f", {args.client} publisher"
    print(f"{mode}, {args.cycles} cycles: " + ", ".join(f"{k} {v}" for k, v in totals.items()), flush=True)
    return 1 if totals.get("lost") else 0


if __name__ == "__main__":
    sys.exit(main())
