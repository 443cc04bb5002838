"""
The stream compressions TCP protocol V2 can negotiate, as stateful codecs (no I/O).

* raw DEFLATE: ``zlib`` with ``wbits=-15`` (no zlib header), a sync flush after
  every write, as Go's ``flate`` writer does on each flush;
* snappy's framing format (stream identifier chunk ``sNaPpY``, then compressed
  or uncompressed chunks with a masked CRC-32C), encoded by ``cramjam``.  We
  chose cramjam because it is maintained, ships wheels for every platform
  (no libsnappy to install), and python-snappy itself now delegates to it;
  its framed encoder computes the CRCs Go's snappy reader verifies.  Chunks
  arriving split across reads are reassembled here before decoding.

Both sides of the wire use these: nsqd's glue in :mod:`nsqtw.nsqd.tcp` and the
client library.
"""

from __future__ import annotations

import zlib
from typing import Any

__all__ = ["DeflateCodec", "SnappyCodec", "CodecError", "SNAPPY_STREAM_ID"]

SNAPPY_STREAM_ID = b"\xff\x06\x00\x00sNaPpY"
#: the framing format's largest data chunk: 65536 bytes of data plus the 4-byte checksum
MAX_SNAPPY_CHUNK = 65536 + 4
#: most bytes one deflate decode call returns
MAX_DECODED = 1 << 20


class CodecError(ValueError):
    """The peer sent bytes the negotiated compression cannot decode."""


class DeflateCodec:
    """Raw DEFLATE both ways; every write ends with a sync flush."""

    __slots__ = ("level", "_c", "_d")

    def __init__(self, level: int = 6) -> None:
        self.level = level
        self._c = zlib.compressobj(level, zlib.DEFLATED, -15)
        self._d = zlib.decompressobj(-15)

    def encode(self, data: bytes) -> bytes:
        return self._c.compress(data) + self._c.flush(zlib.Z_SYNC_FLUSH)

    def decode(self, data: bytes) -> bytes:
        """At most ``MAX_DECODED`` bytes per call (a deflate bomb expands 1000:1); what is left
        stays in the decompressor until the next call (``pending`` says whether there is)."""
        d = self._d
        try:
            if d.unconsumed_tail:
                data = d.unconsumed_tail + data
            return d.decompress(data, MAX_DECODED)
        except zlib.error as e:
            raise CodecError(f"deflate: {e}") from None

    @property
    def pending(self) -> bool:
        return bool(self._d.unconsumed_tail)


class SnappyCodec:
    """Snappy's framing format both ways."""

    __slots__ = ("_snappy", "_sent_ident", "_buf")

    pending = False

    def __init__(self) -> None:
        import cramjam  # only when snappy is negotiated
        self._snappy: Any = cramjam.snappy
        self._sent_ident = False
        self._buf = b""

    def encode(self, data: bytes) -> bytes:
        if not data:
            return b""
        out = bytes(self._snappy.compress(data))
        if self._sent_ident and out.startswith(SNAPPY_STREAM_ID):
            out = out[len(SNAPPY_STREAM_ID):]  # the format allows repeats; one is enough
        self._sent_ident = True
        return out

    def decode(self, data: bytes) -> bytes:
        buf = self._buf + data if self._buf else data
        pos = 0
        end = len(buf)
        out: list[bytes] = []
        raw = self._snappy.decompress_raw
        while end - pos >= 4:
            ctype = buf[pos]
            length = buf[pos + 1] | (buf[pos + 2] << 8) | (buf[pos + 3] << 16)
            if length > MAX_SNAPPY_CHUNK and ctype < 0x80:
                raise CodecError(f"snappy: chunk of {length} bytes is over the format's limit")
            stop = pos + 4 + length
            if stop > end:
                break
            chunk = buf[pos + 4:stop]
            pos = stop
            if ctype == 0x00:
                if length < 4:
                    raise CodecError("snappy: corrupt input")
                try:
                    out.append(bytes(raw(chunk[4:])))
                except Exception as e:
                    raise CodecError(f"snappy: {e}") from None
            elif ctype == 0x01:
                if length < 4:
                    raise CodecError("snappy: corrupt input")
                out.append(chunk[4:])
            elif ctype == 0xFF:
                if chunk != b"sNaPpY":
                    raise CodecError("snappy: corrupt input")
            elif ctype <= 0x7F:
                raise CodecError(f"snappy: unsupported chunk type {ctype:#x}")
            # 0x80-0xfe are skippable (0xfe is padding)
        self._buf = buf[pos:]
        return b"".join(out)
