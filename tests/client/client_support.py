"""Test doubles for the client tests: fake RDY connections, scripted randomness,
StringTransport-connected connections and frame builders."""

from __future__ import annotations

import json
import random
from typing import Any

from twisted.internet import defer, task
from twisted.internet.testing import StringTransport

from nsqtw.protocol.frames import FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE, FrameDecoder, encode_frame
from nsqtw.protocol.message import encode_message

IDENTIFY_ANSWER = {
    "max_rdy_count": 2500, "version": "1.3.0", "max_msg_timeout": 900000, "msg_timeout": 60000,
    "tls_v1": False, "deflate": False, "deflate_level": 6, "max_deflate_level": 6, "snappy": False,
    "sample_rate": 0, "auth_required": False, "output_buffer_size": 16384, "output_buffer_timeout": 250,
}


def response(data: bytes) -> bytes:
    return encode_frame(FRAME_RESPONSE, data)


def error(data: bytes) -> bytes:
    return encode_frame(FRAME_ERROR, data)


def identify_answer(**changes: Any) -> bytes:
    body = dict(IDENTIFY_ANSWER, **changes)
    return response(json.dumps(body).encode())


def message_frame(mid: bytes, body: bytes, attempts: int = 1, ts: int = 1_700_000_000_000_000_000) -> bytes:
    return encode_frame(FRAME_MESSAGE, encode_message(mid, ts, attempts, body))


def msg_id(n: int) -> bytes:
    return b"%016x" % n


class ScriptedRandom(random.Random):
    """``randrange`` returns scripted indexes (then 0); ``random`` a scripted float (then 0.5)."""

    def __init__(self, picks: list[int] | None = None, floats: list[float] | None = None) -> None:
        super().__init__(0)
        self.picks = list(picks or [])
        self.floats = list(floats or [])

    def randrange(self, n: int, *args: Any, **kwargs: Any) -> int:  # type: ignore[override]  # scripted picks, any signature
        pick = self.picks.pop(0) if self.picks else 0
        assert 0 <= pick < n, f"scripted pick {pick} out of range {n}"
        return pick

    def random(self) -> float:
        return self.floats.pop(0) if self.floats else 0.5


class FakeConn:
    """What RdyController reads and writes on a connection; records every RDY written."""

    def __init__(self, address: str, clock: task.Clock, max_rdy_count: int = 2500) -> None:
        self.address = address
        self.rdy = 0
        self.max_rdy_count = max_rdy_count
        self.last_rdy_time = 0.0
        self.last_msg_time = clock.seconds()
        self.in_flight = 0
        self.closing = False
        self.written: list[int] = []

    def is_closing(self) -> bool:
        return self.closing

    def write_rdy(self, count: int) -> None:
        self.written.append(count)


class Wire:
    """A connection under test on a StringTransport: read what it wrote, feed it frames."""

    def __init__(self, proto: Any) -> None:
        self.proto = proto
        self.transport = StringTransport()
        self._seen = 0

    def written(self) -> bytes:
        """Bytes written since the last call."""
        data = self.transport.value()
        out = data[self._seen:]
        self._seen = len(data)
        return out

    def lines(self) -> list[bytes]:
        """Command lines written since the last call (bodies are kept after their line)."""
        data = self.written()
        return [line for line in data.split(b"\n") if line]

    def feed(self, *frames: bytes) -> None:
        self.proto.dataReceived(b"".join(frames))


class WireConnector:
    """A connector that attaches each dialed protocol to a StringTransport."""

    def __init__(self) -> None:
        self.wires: dict[str, Wire] = {}
        self.dials: list[str] = []
        self.refuse: set = set()

    def __call__(self, address: Any, proto: Any) -> defer.Deferred:
        key = proto.address
        self.dials.append(key)
        if key in self.refuse:
            from twisted.internet.error import ConnectionRefusedError
            return defer.fail(ConnectionRefusedError("refused"))
        wire = Wire(proto)
        self.wires[key] = wire
        proto.makeConnection(wire.transport)
        return defer.succeed(proto)

    def handshake(self, key: str, **answer: Any) -> Wire:
        """Answer IDENTIFY on ``key``'s connection; returns its wire with the handshake read."""
        wire = self.wires[key]
        first = wire.written()
        assert first.startswith(b"  V2IDENTIFY\n"), first[:20]
        wire.feed(identify_answer(**answer))
        return wire


def decode_written(data: bytes) -> list[tuple[int, bytes]]:
    return FrameDecoder().feed(data)
