"""
Server-to-client framing of TCP protocol V2.

Every frame is::

    [ 4-byte BE size = 4 + len(data) ][ 4-byte BE frame type ][ data ]

with types RESPONSE (0), ERROR (1) and MESSAGE (2).  Clients decode frames
with :class:`FrameDecoder`; the broker writes them with :func:`encode_frame`
(or, on its hot path, keeps message frames pre-encoded).
"""

from __future__ import annotations

import struct

__all__ = [
    "MAGIC_V1",
    "MAGIC_V2",
    "FRAME_RESPONSE",
    "FRAME_ERROR",
    "FRAME_MESSAGE",
    "OK",
    "CLOSE_WAIT",
    "HEARTBEAT",
    "encode_frame",
    "FrameDecoder",
    "FrameTooBig",
]

MAGIC_V1 = b"  V1"
MAGIC_V2 = b"  V2"

FRAME_RESPONSE = 0
FRAME_ERROR = 1
FRAME_MESSAGE = 2

OK = b"OK"
CLOSE_WAIT = b"CLOSE_WAIT"
HEARTBEAT = b"_heartbeat_"

_HEADER = struct.Struct(">ii")
_pack_header = _HEADER.pack
_unpack_header = _HEADER.unpack_from


def encode_frame(frame_type: int, data: bytes) -> bytes:
    """One complete frame."""
    return _pack_header(len(data) + 4, frame_type) + data


#: Frames the broker sends often, encoded once.
OK_FRAME = encode_frame(FRAME_RESPONSE, OK)
CLOSE_WAIT_FRAME = encode_frame(FRAME_RESPONSE, CLOSE_WAIT)
HEARTBEAT_FRAME = encode_frame(FRAME_RESPONSE, HEARTBEAT)


class FrameTooBig(Exception):
    """A frame announced a size beyond the reader's limit."""


class FrameDecoder:
    """
    Split a byte stream into ``(frame_type, data)`` pairs.

    Buffers across reads and parses each buffer with an offset, so a large
    read of many small frames costs no re-slicing of the tail per frame.
    """

    __slots__ = ("_buf", "max_size")

    def __init__(self, max_size: int = 0) -> None:
        self._buf = b""
        self.max_size = max_size

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        buf = self._buf + data if self._buf else data
        out: list[tuple[int, bytes]] = []
        pos = 0
        end = len(buf)
        max_size = self.max_size
        while end - pos >= 8:
            size, ftype = _unpack_header(buf, pos)
            if size < 4 or (max_size and size > max_size):
                self._buf = b""
                if size >= 4 and buf[pos:pos + 4] == b"HTTP":
                    raise FrameTooBig("unexpected HTTP response, a nsqd TCP endpoint is required")
                raise FrameTooBig(f"frame size {size} out of range")
            stop = pos + 4 + size
            if stop > end:
                break
            out.append((ftype, buf[pos + 8:stop]))
            pos = stop
        self._buf = buf[pos:] if pos < end else b""
        return out

    def pending(self) -> int:
        return len(self._buf)
