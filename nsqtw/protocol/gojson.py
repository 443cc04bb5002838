"""JSON as Go's ``encoding/json`` writes it (nsqd's and nsqlookupd's HTTP answers, the stats export)."""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["go_json"]


def _normalise(value: Any) -> Any:
    if isinstance(value, float):
        return int(value) if value.is_integer() else value
    if isinstance(value, dict):
        return {k: _normalise(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_normalise(v) for v in value]
    return value


_LONE_SURROGATE = re.compile("[\ud800-\udc7f\udd00-\udfff]")
_GO_ESCAPES = (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
               ("\u2028", "\\u2028"), ("\u2029", "\\u2029"))


def go_json(value: Any) -> bytes:
    """JSON as Go's encoder writes it: compact, integral floats without ``.0``, and
    ``<``, ``>``, ``&``, U+2028 and U+2029 escaped (they only occur inside strings)."""
    text = json.dumps(_normalise(value), separators=(",", ":"), ensure_ascii=False)
    for char, escaped in _GO_ESCAPES:
        if char in text:
            text = text.replace(char, escaped)
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate from a client: Go writes U+FFFD
        return _LONE_SURROGATE.sub("\ufffd", text).encode("utf-8", "surrogateescape")
