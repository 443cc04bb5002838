"""Small text helpers that make error messages read exactly as Go prints them."""

from __future__ import annotations

__all__ = ["go_quote", "b2s"]

_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t",
            "\v": "\\v", "\\": "\\\\", '"': '\\"'}


def b2s(data: bytes) -> str:
    """Bytes from the wire as text that encodes back to the same bytes."""
    return data.decode("utf-8", "surrogateescape")


def go_quote(text: str) -> str:
    """Go's ``%q`` / ``strconv.Quote``."""
    out = ['"']
    for ch in text:
        o = ord(ch)
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif 0xDC80 <= o <= 0xDCFF:  # an undecodable byte kept by surrogateescape
            out.append(f"\\x{o - 0xDC00:02x}")
        elif o < 0x20 or o == 0x7F:
            out.append(f"\\x{o:02x}")
        elif ch.isprintable() or ch == " ":
            out.append(ch)
        elif o < 0x10000:
            out.append(f"\\u{o:04x}")
        else:
            out.append(f"\\U{o:08x}")
    out.append('"')
    return "".join(out)
