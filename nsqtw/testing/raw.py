"""
A raw TCP protocol V2 connection for tests, and command encoders.

* :class:`RawV2Client` speaks TCP protocol V2 byte by byte over a real
  connection and lets a test await the next frame (for protocol tests and
  for checking any nsqd, nsqtw's or Go's).
* :func:`command` / :func:`body_command` encode commands.
* :func:`decode_frames` splits captured bytes (a ``StringTransport`` value) into frames.
"""

from __future__ import annotations

import json
import struct
from collections import deque
from typing import Any

from twisted.internet import defer, protocol
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.python.failure import Failure

from ..protocol.frames import FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE, MAGIC_V2, FrameDecoder
from ..protocol.message import Message, decode_message
from ..runtime.reactor import Clock, ListeningReactor, resolve_reactor

__all__ = [
    "mpub_command",
    "RawV2Client",
    "connect_raw",
    "command",
    "body_command",
    "identify_command",
    "decode_frames",
    "FRAME_RESPONSE",
    "FRAME_ERROR",
    "FRAME_MESSAGE",
]


def command(*parts: bytes | str | int) -> bytes:
    """``command("SUB", "t", "c")`` -> ``b"SUB t c\\n"``."""
    return b" ".join(p if isinstance(p, bytes) else str(p).encode() for p in parts) + b"\n"


def body_command(name: str, *params: bytes | str | int, body: bytes) -> bytes:
    """A command with a body: ``NAME params``, a newline, then the 4-byte size and ``body`` (PUB, MPUB, DPUB,
    IDENTIFY, AUTH)."""
    return command(name, *params) + struct.pack(">i", len(body)) + body


def identify_command(**fields: Any) -> bytes:
    """IDENTIFY with ``fields`` as its JSON body (``identify_command(client_id="w1",
    feature_negotiation=True)``)."""
    return body_command("IDENTIFY", body=json.dumps(fields).encode())


def mpub_command(topic: str, bodies: list[bytes]) -> bytes:
    """MPUB of ``bodies`` to ``topic``, framed as protocol V2 frames it."""
    payload = struct.pack(">i", len(bodies)) + b"".join(struct.pack(">i", len(b)) + b for b in bodies)
    return body_command("MPUB", topic, body=payload)


def decode_frames(data: bytes) -> list[tuple[int, bytes]]:
    """The whole frames in ``data`` as ``(frame type, body)`` pairs (a partial frame at the end is left
    out)."""
    return FrameDecoder().feed(data)


class RawV2Client(protocol.Protocol):
    """A bare V2 connection: write bytes, await frames."""

    #: the reactor's TCP transport (producer/consumer and TLS methods beyond ITransport), or a test's fake
    transport: Any

    def __init__(self, send_magic: bool = True) -> None:
        self._decoder = FrameDecoder()
        self._frames: deque[tuple[int, bytes]] = deque()
        self._waiters: deque[defer.Deferred] = deque()
        #: fires (with None) once the connection is closed
        self.closed: defer.Deferred = defer.Deferred()
        #: whether the connection is open
        self.connected_ = False
        #: whether ``connectionMade`` sends the magic ``  V2`` (False: send your own first bytes)
        self.send_magic = send_magic
        #: every byte received so far, frames already taken included
        self.received = b""

    def connectionMade(self) -> None:
        """Twisted: connected; sends the magic ``  V2`` unless ``send_magic`` is false."""
        self.connected_ = True
        if self.send_magic:
            self.transport.write(MAGIC_V2)

    def dataReceived(self, data: bytes) -> None:
        """Twisted: bytes in; each whole frame goes to the oldest waiter, or is kept for the next."""
        self.received += data
        for frame in self._decoder.feed(data):
            if self._waiters:
                self._waiters.popleft().callback(frame)
            else:
                self._frames.append(frame)

    def connectionLost(self, reason: Failure | None = None) -> None:
        """Twisted: closed; every waiter fails with ``ConnectionError`` and :attr:`closed` fires."""
        self.connected_ = False
        while self._waiters:
            self._waiters.popleft().errback(ConnectionError("connection closed"))
        if not self.closed.called:
            self.closed.callback(None)

    def send(self, data: bytes) -> None:
        """Write raw bytes (build them with :func:`command`, :func:`body_command`...)."""
        self.transport.write(data)

    def next_frame(self, timeout: float = 5.0, clock: Clock = None) -> defer.Deferred[tuple[int, bytes]]:
        """Fires with the next ``(frame_type, data)``; fails if the connection closes first."""
        if self._frames:
            return defer.succeed(self._frames.popleft())
        if not self.connected_:
            return defer.fail(ConnectionError("connection closed"))
        d: defer.Deferred[tuple[int, bytes]] = defer.Deferred()
        self._waiters.append(d)
        d.addTimeout(timeout, resolve_reactor(clock))
        return d

    async def frame(self, timeout: float = 5.0) -> tuple[int, bytes]:
        """The next frame that is not a heartbeat."""
        while True:
            ftype, data = await self.next_frame(timeout)
            if ftype == FRAME_RESPONSE and data == b"_heartbeat_":
                continue
            return ftype, data

    async def response(self, timeout: float = 5.0) -> bytes:
        """The next frame, which must be a response (``OK``, ``_heartbeat_``, a JSON IDENTIFY answer):
        its body."""
        ftype, data = await self.frame(timeout)
        if ftype != FRAME_RESPONSE:
            raise AssertionError(f"expected a response frame, got type {ftype}: {data!r}")
        return data

    async def error(self, timeout: float = 5.0) -> bytes:
        """The next frame, which must be an error: its body (``E_BAD_TOPIC ...``)."""
        ftype, data = await self.frame(timeout)
        if ftype != FRAME_ERROR:
            raise AssertionError(f"expected an error frame, got type {ftype}: {data!r}")
        return data

    async def message(self, timeout: float = 5.0) -> Message:
        """The next frame, which must be a message: decoded (``id``, ``attempts``, ``timestamp``,
        ``body``)."""
        ftype, data = await self.frame(timeout)
        if ftype != FRAME_MESSAGE:
            raise AssertionError(f"expected a message frame, got type {ftype}: {data!r}")
        return decode_message(data)

    def pending(self) -> list[tuple[int, bytes]]:
        """Frames received and not yet awaited."""
        out = list(self._frames)
        self._frames.clear()
        return out

    def close(self) -> defer.Deferred:
        """Close the connection; fires once it is closed."""
        if self.connected_:
            self.transport.loseConnection()
        return self.closed


def connect_raw(port: int, host: str = "127.0.0.1", reactor: ListeningReactor = None,
                send_magic: bool = True) -> defer.Deferred[RawV2Client]:
    """Connect a :class:`RawV2Client` (magic sent) to an nsqd."""
    return connectProtocol(TCP4ClientEndpoint(resolve_reactor(reactor), host, port), RawV2Client(send_magic))
