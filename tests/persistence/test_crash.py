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


def drain(port: int, expected: int) -> list[bytes]:
    s = _connect(port)
    s.sendall(b"SUB crash drain\nRDY 500\n")
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
