"""
Crash safety: nsqd run as a real process with --mem-queue-size=0 --sync-every=1 is killed
with SIGKILL at random moments while a client publishes and records every OK; after each
kill it restarts on the same data path; at the end everything is drained.  Every message
that was acknowledged must be delivered (duplicates are allowed, and counted).
"""

from __future__ import annotations

import os
import random
import signal
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_I32 = struct.Struct(">i")
_FRAME = struct.Struct(">ii")


class Broker:
    """nsqd as a child process (nsqtw's drop-in command)."""

    def __init__(self, data: str, *flags: str) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nsqtw.cli", "--tcp-address=127.0.0.1:0", "--http-address=",
             "--https-address=", f"--data-path={data}", "--log-level=warn", *flags],
            stderr=subprocess.PIPE, env=env, text=True)
        self.port = 0
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            if "TCP: listening on" in line:
                self.port = int(line.rsplit(":", 1)[1])
                break
        assert self.port, "broker did not start"

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(30)


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"  V2")
    return s


def _frames(s: socket.socket, buf: bytearray) -> tuple[int, bytes] | None:
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


def _mpub(topic: bytes, bodies: list[bytes]) -> bytes:
    payload = _I32.pack(len(bodies)) + b"".join(_I32.pack(len(b)) + b for b in bodies)
    return b"MPUB " + topic + b"\n" + _I32.pack(len(payload)) + payload


def publish_until_killed(broker: Broker, acked: set[bytes], seq: list[int], kill_after: int) -> None:
    """Publish batches of 5 until ``kill_after`` batches were OK'd, then SIGKILL mid-stream."""
    s = _connect(broker.port)
    buf = bytearray()
    done = 0
    try:
        while True:
            bodies = [b"m%08d" % (seq[0] + i) for i in range(5)]
            seq[0] += 5
            s.sendall(_mpub(b"crash", bodies))
            if done == kill_after:
                broker.kill()  # the batch just sent may or may not be acknowledged: never counted
                return
            frame = _frames(s, buf)
            assert frame is not None and frame == (0, b"OK"), frame
            acked.update(bodies)
            done += 1
    finally:
        s.close()


def drain(port: int, expected: int, channel: bytes = b"drain") -> list[bytes]:
    s = _connect(port)
    s.sendall(b"SUB crash " + channel + b"\nRDY 500\n")
    buf = bytearray()
    assert _frames(s, buf) == (0, b"OK")
    got: list[bytes] = []
    s.settimeout(5)
    while True:
        try:
            frame = _frames(s, buf)
        except TimeoutError:
            break  # nothing more arrives
        if frame is None:
            break
        ftype, data = frame
        assert ftype == 2, data
        got.append(data[26:])
        s.sendall(b"FIN " + data[10:26] + b"\n")
        if len(got) >= expected and not buf:
            s.settimeout(0.5)
    s.close()
    return got


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("flags,kills", [
    (("--mem-queue-size=0", "--sync-every=1"), 24),  # OK after fsync
    (("--mem-queue-size=0",), 20),                   # OK after write(): survives a process kill too
])
def test_sigkill_loses_no_acknowledged_message(tmp_path, record_property, flags, kills):
    """Repeated SIGKILLs mid-publish with --mem-queue-size=0: nothing acknowledged is lost."""
    rng = random.Random(20261122)
    data = str(tmp_path)
    acked: set[bytes] = set()
    seq = [0]
    for _ in range(kills):
        broker = Broker(data, *flags)
        publish_until_killed(broker, acked, seq, kill_after=rng.randint(0, 40))
    broker = Broker(data, *flags)
    try:
        got = drain(broker.port, len(acked))
    finally:
        assert broker.stop() == 0
    received = set(got)
    duplicates = len(got) - len(received)
    record_property("acknowledged", len(acked))
    record_property("delivered", len(got))
    record_property("duplicates", duplicates)
    print(f"\n{kills} kills: {len(acked)} acknowledged, {len(got)} delivered, {duplicates} duplicates, "
          f"{len(received - acked)} unacknowledged-but-stored")
    missing = acked - received
    assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {sorted(missing)[:5]}"
    assert len(acked) > 0


def _dpub(topic: bytes, ms: int, body: bytes) -> bytes:
    return b"DPUB " + topic + b" %d\n" % ms + _I32.pack(len(body)) + body


class _Consumer:
    """SUB crash/c: FINs what it gets, but REQs each message whose number ends in 0 or 5 once
    (REQ 0 or REQ with ``req_ms``), and remembers what it received (a FIN is sent at once)."""

    def __init__(self, port: int, req_ms: int) -> None:
        self.s = _connect(port)
        self.buf = bytearray()
        self.req_ms = req_ms
        self.s.sendall(b"SUB crash c\nRDY 50\n")
        assert _frames(self.s, self.buf) == (0, b"OK")
        self.s.settimeout(0.02)

    def poll(self, got: set[bytes], requeued: set[bytes]) -> None:
        while True:
            try:
                frame = _frames(self.s, self.buf)
            except (TimeoutError, BlockingIOError):
                return
            if frame is None:
                return
            ftype, data = frame
            if ftype == 1 and data.startswith((b"E_FIN_FAILED", b"E_REQ_FAILED")):
                continue  # a copy delivered again after a timeout, FINed twice: not fatal
            assert ftype == 2, data
            body, mid = data[26:], data[10:26]
            if body[-1:] in (b"0", b"5") and body not in requeued:
                requeued.add(body)
                self.s.sendall(b"REQ " + mid + b" %d\n" % self.req_ms)
            else:
                got.add(body)
                self.s.sendall(b"FIN " + mid + b"\n")


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("req_ms", [0, 300])
def test_sigkill_with_requeues_in_flight_and_dpub_loses_nothing(tmp_path, record_property, req_ms):
    """``--mem-queue-size=0 --sync-every=1``, a consumer that REQs every fifth message once
    (REQ 0 or with a delay) while MPUBs and DPUBs go on, SIGKILL after a random stretch, 8
    times: every acknowledged message is delivered, whatever state it was in at the kill
    (queued, in flight, requeued, deferred by REQ or by DPUB)."""
    flags = ("--mem-queue-size=0", "--sync-every=1", "--msg-timeout=5s")
    rng = random.Random(24 + req_ms)
    data = str(tmp_path)
    acked: set[bytes] = set()
    got: set[bytes] = set()
    requeued: set[bytes] = set()
    seq = 0
    for _ in range(8):
        broker = Broker(data, *flags)
        pub = _connect(broker.port)
        pbuf = bytearray()
        cons = _Consumer(broker.port, req_ms)
        for _ in range(rng.randint(5, 30)):
            bodies = [b"m%08d" % (seq + i) for i in range(5)]
            deferred = b"d%08d" % (seq + 5)
            seq += 10
            pub.sendall(_mpub(b"crash", bodies) + _dpub(b"crash", 200, deferred))
            assert _frames(pub, pbuf) == (0, b"OK")
            acked.update(bodies)
            assert _frames(pub, pbuf) == (0, b"OK")
            acked.add(deferred)
            cons.poll(got, requeued)
        broker.kill()  # whatever is queued, in flight, requeued or deferred now
        pub.close()
        cons.s.close()
    broker = Broker(data, *flags)
    try:
        drained = drain(broker.port, len(acked - got), b"c")  # waits 5 s for the deferred ones
    finally:
        assert broker.stop() == 0
    delivered = got | set(drained)
    record_property("acknowledged", len(acked))
    record_property("requeued", len(requeued))
    print(f"\nREQ {req_ms}: {len(acked)} acknowledged, {len(requeued)} requeued, {len(got)} finished before "
          f"the kills, {len(drained)} drained after")
    missing = acked - delivered
    assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {sorted(missing)[:5]}"
    assert requeued and len(acked) > 100
