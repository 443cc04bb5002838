"""
A socket-free harness for nsqd's V2 protocol: a :class:`Broker` on an explicit
memory-only backend, connections made of ``ClientState`` + ``V2Session`` whose
output is captured and decoded into frames, and a fake clock (``now``) the
tests move by hand.

It mimics what :mod:`nsqtw.nsqd.tcp` does per read (feed, settle, write once,
and on a fatal error close and tell the broker the client is gone), so the
assertions here hold for the real glue too.
"""

from __future__ import annotations

import json
import random
import struct
from typing import Any

from nsqtw.nsqd.core.broker import Broker, memory_only_backends
from nsqtw.nsqd.core.client import ClientState
from nsqtw.nsqd.core.scan import scan_channels
from nsqtw.nsqd.core.v2 import KEEP, Features, V2Session
from nsqtw.options import NsqdOptions
from nsqtw.protocol.frames import (
    FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE, MAGIC_V2, FrameDecoder,
)
from nsqtw.protocol.message import Message, decode_message

Frame = tuple[int, bytes]

#: an arbitrary fixed wall-clock start (seconds), so timestamps are realistic
T0 = 1_795_302_682.0
NODE_ID = 713


def cmd(*parts: Any) -> bytes:
    """``cmd("SUB", "t", "c")`` -> ``b"SUB t c\\n"``."""
    return b" ".join(p if isinstance(p, bytes) else str(p).encode() for p in parts) + b"\n"


def size(n: int) -> bytes:
    return struct.pack(">i", n)


def body_cmd(*parts: Any, body: bytes) -> bytes:
    return cmd(*parts) + size(len(body)) + body


def pub(topic: str, body: bytes) -> bytes:
    return body_cmd("PUB", topic, body=body)


def dpub(topic: str, ms: int, body: bytes) -> bytes:
    return body_cmd("DPUB", topic, ms, body=body)


def mpub_payload(bodies: list[bytes]) -> bytes:
    return size(len(bodies)) + b"".join(size(len(b)) + b for b in bodies)


def mpub(topic: str, bodies: list[bytes]) -> bytes:
    return body_cmd("MPUB", topic, body=mpub_payload(bodies))


def identify(**fields: Any) -> bytes:
    return body_cmd("IDENTIFY", body=json.dumps(fields).encode())


class Wire:
    """One V2 connection driven without sockets."""

    def __init__(self, h: Harness, remote: str, magic: bool) -> None:
        self.h = h
        self.client: ClientState = h.broker.new_client(remote, h.now)
        self.raw = bytearray()
        self.client.writer = self.raw.extend
        self.server_closed = False
        self.client.closer = self._closed_by_broker
        self.session = V2Session(h.broker, self.client, features=h.features)
        self._decoder = FrameDecoder()
        self._frames: list[Frame] = []
        self.alive = True
        if magic:
            self.send(MAGIC_V2)

    def _closed_by_broker(self) -> None:
        self.server_closed = True
        self.alive = False

    def send(self, data: bytes) -> bool:
        """Feed one read; False once the server closed the connection."""
        assert self.alive, "connection already closed"
        out = self.session.feed(data, self.h.now)
        keep = out.close == KEEP
        self.raw.extend(out.answer)  # the glue writes a read's answers, then settles
        self.h.settle()
        if not keep:
            self.alive = False
            self.h.broker.client_gone(self.client, self.h.now)
            self.h.settle()
        return keep

    def send_in_pieces(self, data: bytes, piece: int) -> bool:
        keep = True
        for i in range(0, len(data), piece):
            keep = self.send(data[i:i + piece])
            if not keep:
                break
        return keep

    def disconnect(self) -> None:
        """The client goes away (what connectionLost does)."""
        self.alive = False
        self.h.broker.client_gone(self.client, self.h.now)
        self.h.settle()

    # --- output -------------------------------------------------------------

    def frames(self) -> list[Frame]:
        """Every frame written since the last call."""
        if self.raw:
            data = bytes(self.raw)
            self.raw.clear()
            self._frames.extend(self._decoder.feed(data))
        out, self._frames = self._frames, []
        return out

    def responses(self) -> list[bytes]:
        return [d for t, d in self.frames() if t == FRAME_RESPONSE]

    def one(self) -> Frame:
        fs = self.frames()
        assert len(fs) == 1, f"expected exactly one frame, got {fs!r}"
        return fs[0]

    def ok(self) -> None:
        assert self.one() == (FRAME_RESPONSE, b"OK")

    def error(self) -> bytes:
        ftype, data = self.one()
        assert ftype == FRAME_ERROR, (ftype, data)
        return data

    def messages(self) -> list[Message]:
        fs = self.frames()
        assert all(t == FRAME_MESSAGE for t, _ in fs), fs
        return [decode_message(d) for _, d in fs]

    def nothing(self) -> None:
        assert self.frames() == []


class Harness:
    """A broker, its clock and its connections."""

    def __init__(self, *, seed: int = 1, features: Features = Features(), **opts: Any) -> None:
        opts.setdefault("node_id", NODE_ID)
        self.options = NsqdOptions(**opts)
        self.now = T0
        self.rng = random.Random(seed)
        self.features = features
        self.broker = Broker(self.options, self.now, backend_factory=memory_only_backends, rng=self.rng)
        self._port = 40000

    def settle(self) -> None:
        self.broker.settle(self.now)
        while self.broker.busy():
            self.broker.settle(self.now)

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def scan(self) -> int:
        """One queue-scan tick over every channel, then settle."""
        rounds = scan_channels(self.broker.channels(), self.now, self.rng,
                               self.options.queue_scan_selection_count,
                               self.options.queue_scan_dirty_percent)
        self.settle()
        return rounds

    def connect(self, magic: bool = True, remote: str | None = None) -> Wire:
        self._port += 1
        return Wire(self, remote or f"127.0.0.1:{self._port}", magic)

    def producer(self) -> Wire:
        return self.connect()

    def consumer(self, topic: str, channel: str, rdy: int | None = None, **ident: Any) -> Wire:
        w = self.connect()
        if ident:
            w.send(identify(**ident))
            w.frames()
        w.send(cmd("SUB", topic, channel))
        w.ok()
        if rdy is not None:
            w.send(cmd("RDY", rdy))
        return w

    def publish(self, topic: str, *bodies: bytes) -> None:
        p = self.producer()
        for b in bodies:
            p.send(pub(topic, b))
            p.ok()
        p.disconnect()

    def channel(self, topic: str, channel: str) -> Any:
        return self.broker.find_channel(topic, channel)

    def topic(self, topic: str) -> Any:
        return self.broker.find_topic(topic)


def stats_of(h: Harness, **kw: Any) -> dict[str, Any]:
    from nsqtw.nsqd.stats.snapshot import broker_stats
    return broker_stats(h.broker, h.now, **kw)
