"""
Client-to-server commands of TCP protocol V2, encoded (pure; go-nsq's ``command.go``).

``NAME[ param]*\\n`` and, for IDENTIFY, AUTH, PUB, DPUB and MPUB, a 4-byte
big-endian size and the body.  Bodies may be ``bytes`` or ``str`` (UTF-8).
Topic names are not checked here: nsqd answers a bad one with ``E_BAD_TOPIC``,
and a client must not refuse what some nsqd accepts.
"""

from __future__ import annotations

import json
import struct
from typing import Any
from collections.abc import Iterable

__all__ = [
    "Body",
    "identify",
    "auth",
    "sub",
    "rdy",
    "fin",
    "req",
    "touch",
    "cls",
    "nop",
    "pub",
    "mpub",
    "dpub",
    "to_bytes",
    "ms",
]

Body = bytes | bytearray | memoryview | str

_I32 = struct.Struct(">i").pack

NOP = b"NOP\n"
CLS = b"CLS\n"


def to_bytes(body: Body) -> bytes:
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode("utf-8")
    if isinstance(body, (bytearray, memoryview)):
        return bytes(body)
    raise TypeError(f"a message body is bytes or str, not {type(body).__name__}")


def _name(name: str) -> bytes:
    return name.encode("utf-8") if isinstance(name, str) else bytes(name)


def ms(seconds: float) -> int:
    """Seconds as the integer milliseconds the wire carries (never negative)."""
    return max(0, int(round(seconds * 1000)))


def identify(fields: dict[str, Any]) -> bytes:
    body = json.dumps(fields, separators=(",", ":")).encode("utf-8")
    return b"IDENTIFY\n" + _I32(len(body)) + body


def auth(secret: Body) -> bytes:
    data = to_bytes(secret)
    return b"AUTH\n" + _I32(len(data)) + data


def sub(topic: str, channel: str) -> bytes:
    return b"SUB " + _name(topic) + b" " + _name(channel) + b"\n"


def rdy(count: int) -> bytes:
    return b"RDY %d\n" % count


def fin(message_id: bytes) -> bytes:
    return b"FIN " + message_id + b"\n"


def req(message_id: bytes, delay: float) -> bytes:
    """``REQ <id> <ms>``; ``delay`` is seconds."""
    return b"REQ " + message_id + b" %d\n" % ms(delay)


def touch(message_id: bytes) -> bytes:
    return b"TOUCH " + message_id + b"\n"


def cls() -> bytes:
    return CLS


def nop() -> bytes:
    return NOP


def pub(topic: str, body: Body) -> bytes:
    data = to_bytes(body)
    return b"PUB " + _name(topic) + b"\n" + _I32(len(data)) + data


def dpub(topic: str, delay: float, body: Body) -> bytes:
    """``DPUB <topic> <ms>``; ``delay`` is seconds."""
    data = to_bytes(body)
    return b"DPUB " + _name(topic) + b" %d\n" % ms(delay) + _I32(len(data)) + data


def mpub(topic: str, bodies: Iterable[Body]) -> bytes:
    parts: list[bytes] = []
    count = 0
    for body in bodies:
        data = to_bytes(body)
        parts.append(_I32(len(data)))
        parts.append(data)
        count += 1
    payload = _I32(count) + b"".join(parts)
    return b"MPUB " + _name(topic) + b"\n" + _I32(len(payload)) + payload
