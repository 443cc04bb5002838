"""
IDENTIFY: the client's JSON body, read with Go's ``encoding/json`` rules, and
the server's negotiated answer.

Go matches JSON keys to struct fields case-insensitively, ignores unknown
keys, leaves a field alone for ``null``, and refuses a value of the wrong
type (a float for an int, a string for a bool) with an unmarshal error, which
nsqd reports as ``E_BAD_BODY IDENTIFY failed to decode JSON body``.  Unlike Go,
``client_id``, ``hostname`` and ``user_agent`` are kept to 256 UTF-8 bytes
(:data:`MAX_STORED_TEXT`; longer values are accepted and cut).
"""

from __future__ import annotations

import json
import re
from typing import Any

import attr

__all__ = ["IdentifyRequest", "parse_identify", "IdentifyDecodeError", "MAX_STORED_TEXT", "cap_text"]

_INT32 = (-(1 << 31), (1 << 31) - 1)
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_INT64 = (-(1 << 63), (1 << 63) - 1)


class IdentifyDecodeError(ValueError):
    pass


@attr.s(frozen=True, slots=True, auto_attribs=True)
class IdentifyRequest:
    """The fields of nsqd's ``identifyDataV2`` (zero values when absent)."""

    client_id: str | None = None
    hostname: str | None = None
    heartbeat_interval: int = 0
    output_buffer_size: int = 0
    output_buffer_timeout: int = 0
    feature_negotiation: bool = False
    tls_v1: bool = False
    deflate: bool = False
    deflate_level: int = 0
    snappy: bool = False
    sample_rate: int = 0
    user_agent: str | None = None
    msg_timeout: int = 0


#: nsqtw keeps at most this many UTF-8 bytes of ``client_id``, ``hostname`` and
#: ``user_agent`` (Go's nsqd keeps them whole, so a 4 MB user_agent is copied into every
#: /stats answer); longer values are accepted and cut at a character boundary
MAX_STORED_TEXT = 256
CAPPED_FIELDS = frozenset(("client_id", "hostname", "user_agent"))


def cap_text(value: str, limit: int = MAX_STORED_TEXT) -> str:
    data = value.encode("utf-8")
    if len(data) <= limit:
        return value
    return data[:limit].decode("utf-8", "ignore")


_FIELDS: dict[str, Any] = {
    "client_id": str,
    "hostname": str,
    "heartbeat_interval": _INT64,
    "output_buffer_size": _INT64,
    "output_buffer_timeout": _INT64,
    "feature_negotiation": bool,
    "tls_v1": bool,
    "deflate": bool,
    "deflate_level": _INT64,
    "snappy": bool,
    "sample_rate": _INT32,
    "user_agent": str,
    "msg_timeout": _INT64,
}


def parse_identify(body: bytes) -> IdentifyRequest:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:  # Go: "exceeded max depth"
        raise IdentifyDecodeError(str(e)) from None
    if data is None:
        return IdentifyRequest()
    if not isinstance(data, dict):
        raise IdentifyDecodeError("cannot unmarshal into identifyDataV2")
    values: dict[str, Any] = {}
    for key, value in data.items():
        name = key.lower()
        kind = _FIELDS.get(name)
        if kind is None:
            if key in _FIELDS:
                kind = _FIELDS[key]
                name = key
            else:
                continue
        if value is None:
            continue
        if kind is str:
            if not isinstance(value, str):
                raise IdentifyDecodeError(f"cannot unmarshal {type(value).__name__} into field {name}")
            value = _LONE_SURROGATE.sub("\ufffd", value)  # as Go's decoder does
            if len(value) > MAX_STORED_TEXT // 4 and name in CAPPED_FIELDS:
                value = cap_text(value)
        elif kind is bool:
            if not isinstance(value, bool):
                raise IdentifyDecodeError(f"cannot unmarshal {type(value).__name__} into field {name}")
        else:
            if isinstance(value, bool) or not isinstance(value, int):
                raise IdentifyDecodeError(f"cannot unmarshal {value!r} into field {name}")
            lo, hi = kind
            if not lo <= value <= hi:
                raise IdentifyDecodeError(f"cannot unmarshal {value} into field {name}: overflow")
        values[name] = value
    return IdentifyRequest(**values)
