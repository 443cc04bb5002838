"""
The NSQ message layout, shared by MESSAGE frames and diskqueue records::

    [ 8-byte BE int64 timestamp ns ][ 2-byte BE uint16 attempts ][ 16-byte ASCII hex id ][ body ... ]

The broker keeps every queued message as a complete MESSAGE *frame* (the
8-byte frame header followed by the layout above) whose attempts field
already holds the value of its next delivery, so delivering it is a write.
The disk keeps NSQ's record (no frame header, attempts = deliveries so far);
:func:`frame_to_record` and :func:`record_to_frame` convert at that boundary.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

__all__ = [
    "Message",
    "decode_message",
    "encode_message",
    "frame_to_record",
    "record_to_frame",
    "MIN_MESSAGE_LENGTH",
    "FRAME_HEADER_LENGTH",
    "ID_SLICE",
    "ID_LENGTH",
]

ID_LENGTH = 16
MIN_MESSAGE_LENGTH = 8 + 2 + ID_LENGTH  # 26
FRAME_HEADER_LENGTH = 8

# offsets inside a MESSAGE frame (frame header included)
TS_OFFSET = 8
ATTEMPTS_OFFSET = 16
ID_OFFSET = 18
BODY_OFFSET = 34
ID_SLICE = slice(ID_OFFSET, BODY_OFFSET)

_TS_ATTEMPTS = struct.Struct(">qH")
_ATTEMPTS = struct.Struct(">H")
_I32 = struct.Struct(">i")
_FRAME_PREFIX = struct.Struct(">iiqH")


class Message(NamedTuple):
    """A decoded message, for clients and tools (the broker never builds these)."""

    id: bytes
    timestamp: int
    attempts: int
    body: bytes


def decode_message(data: bytes) -> Message:
    """Decode a MESSAGE frame's data (or a disk record); fewer than 26 bytes is an error."""
    if len(data) < MIN_MESSAGE_LENGTH:
        raise ValueError(f"invalid message buffer size ({len(data)})")
    ts, attempts = _TS_ATTEMPTS.unpack_from(data, 0)
    return Message(bytes(data[10:26]), ts, attempts, bytes(data[26:]))


def encode_message(message_id: bytes, timestamp: int, attempts: int, body: bytes) -> bytes:
    """The 26-byte header plus body (a disk record, or a frame's data)."""
    return _TS_ATTEMPTS.pack(timestamp, attempts & 0xFFFF) + message_id + body


def encode_message_frame(message_id: bytes, timestamp: int, attempts: int, body: bytes) -> bytes:
    """A complete MESSAGE frame for a message."""
    return _FRAME_PREFIX.pack(30 + len(body), 2, timestamp, attempts & 0xFFFF) + message_id + body


def frame_to_record(frame: bytes) -> bytes:
    """A queued frame as NSQ's disk record: attempts = deliveries so far."""
    attempts = (_ATTEMPTS.unpack_from(frame, ATTEMPTS_OFFSET)[0] - 1) & 0xFFFF
    return frame[TS_OFFSET:ATTEMPTS_OFFSET] + _ATTEMPTS.pack(attempts) + frame[ID_OFFSET:]


def record_to_frame(record: bytes) -> bytes:
    """A disk record as a queued frame: attempts = the next delivery's."""
    attempts = (_ATTEMPTS.unpack_from(record, 8)[0] + 1) & 0xFFFF
    return _I32.pack(len(record) + 4) + b"\x00\x00\x00\x02" + record[:8] + _ATTEMPTS.pack(attempts) + record[10:]


def requeue_frame(frame: bytes) -> bytes:
    """A delivered frame made ready for its next delivery (attempts + 1)."""
    attempts = (_ATTEMPTS.unpack_from(frame, ATTEMPTS_OFFSET)[0] + 1) & 0xFFFF
    return frame[:ATTEMPTS_OFFSET] + _ATTEMPTS.pack(attempts) + frame[ID_OFFSET:]

