"""A client that shuts down its sending side inside a command's body gets nsqd's fatal error
frame, then the connection closes (nsqd's ``protocol_v2.go``: ``failed to read ...``); a cut
inside a command line, or between commands, closes without a frame.  Checked over real sockets
against nsqtw, and against Go's nsqd 1.3.0 when its binary is beside the project."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

from nsqtw.testing import connect_raw

GO_NSQD = Path(__file__).resolve().parents[3] / "shared" / "anchors" / "go-nsq-1.3.0" / "nsqd"


def _size(n: int) -> bytes:
    return struct.pack(">i", n)


def _mpub(bodies: list[bytes], announced: int | None = None) -> bytes:
    payload = b"".join(_size(len(b)) + b for b in bodies)
    count = len(bodies) if announced is None else announced
    return b"MPUB t\n" + _size(4 + len(payload) + 104 * (count - len(bodies))) + _size(count) + payload


CASES = [
    ("pub-body", b"PUB t\n" + _size(10) + b"abc", b"E_BAD_MESSAGE PUB failed to read message body"),
    ("pub-size", b"PUB t\n" + b"\x00\x00", b"E_BAD_MESSAGE PUB failed to read message body size"),
    ("pub-no-size", b"PUB t\n", b"E_BAD_MESSAGE PUB failed to read message body size"),
    ("mpub-third-missing", _mpub([b"a" * 100, b"b" * 100], announced=3),
     b"E_BAD_MESSAGE MPUB failed to read message(2) body size"),
    ("mpub-body-cut", _mpub([b"a" * 100, b"b" * 100], announced=3) + _size(100) + b"cc",
     b"E_BAD_MESSAGE MPUB failed to read message body"),
    ("mpub-first-size-cut", b"MPUB t\n" + _size(400) + _size(3) + b"\x00",
     b"E_BAD_MESSAGE MPUB failed to read message(0) body size"),
    ("mpub-count", b"MPUB t\n" + _size(400) + b"\x00", b"E_BAD_BODY MPUB failed to read message count"),
    ("mpub-size", b"MPUB t\n" + b"\x00", b"E_BAD_BODY MPUB failed to read body size"),
    ("dpub-body", b"DPUB t 1000\n" + _size(10) + b"abc", b"E_BAD_MESSAGE DPUB failed to read message body"),
    ("dpub-size", b"DPUB t 1000\n", b"E_BAD_MESSAGE DPUB failed to read message body size"),
    ("identify-body", b"IDENTIFY\n" + _size(40) + b'{"client_id":', b"E_BAD_BODY IDENTIFY failed to read body"),
    ("identify-size", b"IDENTIFY\n\x00", b"E_BAD_BODY IDENTIFY failed to read body size"),
    ("auth-body", b"AUTH\n" + _size(10) + b"sec", b"E_BAD_BODY AUTH failed to read body"),
    ("auth-size", b"AUTH\n", b"E_BAD_BODY AUTH failed to read body size"),
]


async def _half_close(port: int, data: bytes) -> list[Any]:
    client = await connect_raw(port)
    client.send(data)
    client.transport.loseWriteConnection()
    await client.closed  # the broker closes after its answer
    return client.pending()


@pytest.mark.parametrize("name,data,expected", CASES, ids=[c[0] for c in CASES])
@pytest_twisted.ensureDeferred
async def test_stream_cut_inside_a_body_gets_nsqds_error_then_close(nsqd: Any, name: str, data: bytes,
                                                                     expected: bytes) -> None:
    frames = await _half_close(nsqd.tcp_port, data)
    assert frames == [(1, expected)]
    topic = nsqd._service.broker.topics.get("t")
    assert topic is None or topic.depth() == 0  # an MPUB cut short queues nothing


@pytest_twisted.ensureDeferred
async def test_stream_cut_inside_a_command_line_closes_without_a_frame(nsqd: Any) -> None:
    assert await _half_close(nsqd.tcp_port, b"PUB t") == []


@pytest_twisted.ensureDeferred
async def test_complete_commands_before_the_half_close_are_answered(nsqd: Any) -> None:
    frames = await _half_close(nsqd.tcp_port, b"PUB t\n" + _size(3) + b"abc" + _mpub([b"x", b"y"]))
    assert frames == [(0, b"OK"), (0, b"OK")]
    assert nsqd._service.broker.topics["t"].depth() == 3


# --- the same bytes to Go's nsqd ---------------------------------------------------------------

def _go_answers(port: int, data: bytes) -> list[Any]:
    from nsqtw.testing.raw import decode_frames

    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        s.sendall(b"  V2" + data)
        s.shutdown(socket.SHUT_WR)
        got = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
        return decode_frames(got)
    finally:
        s.close()


@pytest.fixture(scope="module")
def go_nsqd() -> Any:
    if not os.access(GO_NSQD, os.X_OK):
        pytest.skip(f"Go's nsqd 1.3.0 is not at {GO_NSQD} (a build of NSQ 1.3.0's nsqd, for the comparison)")
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with tempfile.TemporaryDirectory() as data:
        proc = subprocess.Popen([str(GO_NSQD), f"--tcp-address=127.0.0.1:{port}", "--http-address=127.0.0.1:0",
                                 f"--data-path={data}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(500):
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.01)
            yield port
        finally:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("name,data,expected", CASES, ids=[c[0] for c in CASES])
def test_go_nsqd_answers_the_same(go_nsqd: int, name: str, data: bytes, expected: bytes) -> None:
    assert _go_answers(go_nsqd, data) == [(1, expected)]
