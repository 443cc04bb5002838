"""
The client side of one TCP protocol V2 connection, without I/O.

:class:`ClientCore` owns the bytes: it writes the magic and IDENTIFY, walks
the feature negotiation that follows IDENTIFY's JSON answer (TLS, then
snappy or deflate, each confirmed by an ``OK``; then AUTH when nsqd says
``auth_required``), and afterwards splits the (decompressed) stream into
frames.  ``ClientCore.receive`` returns ``(kind, data)`` pairs: the three
frame types of the protocol (0 response, 1 error, 2 message) and the
handshake events below, which the Twisted glue in
:mod:`nsqtw.client.connection` acts on.

The compression codecs are shared with nsqd (:mod:`nsqtw.protocol.compression`).
"""

from __future__ import annotations

import json
import struct
from typing import Any

from ..errors import from_wire
from ..protocol.compression import CodecError, DeflateCodec, SnappyCodec
from ..protocol.frames import (
    FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE, HEARTBEAT, MAGIC_V2, OK, FrameDecoder, FrameTooBig,
)
from . import commands
from .config import Config
from .errors import AuthRequired, ClientError, IdentifyError, ProtocolError

__all__ = [
    "ClientCore",
    "DeflateCodec",
    "SnappyCodec",
    "EV_WRITE",
    "EV_START_TLS",
    "EV_READY",
    "EV_FAILED",
    "HTTP_SIZE",
]

#: handshake events (frames keep their protocol numbers 0, 1, 2)
EV_WRITE = -1       # data: bytes to write now (already encoded)
EV_START_TLS = -2   # data: None; the glue starts TLS before anything else is written
EV_READY = -3       # data: (identify_response or None, auth_response or None)
EV_FAILED = -4      # data: the exception; the glue closes the connection

#: the 4 bytes ``HTTP`` read as a frame size: an HTTP server answered on the TCP port
HTTP_SIZE = 1213486160

_HEADER = struct.Struct(">ii")

_IDENTIFY = 0
_UPGRADE_OK = 1
_AUTH = 2
_READY = 3
_CLOSED = 4

Event = tuple[int, Any]


class ClientCore:
    """One connection's protocol state: handshake, codecs and frame splitting."""

    def __init__(self, config: Config, *, max_rdy_count: int = 2500) -> None:
        self.config = config
        self.state = _IDENTIFY
        #: nsqd's IDENTIFY answer (``None`` from an nsqd without feature negotiation)
        self.identify_response: dict[str, Any] | None = None
        self.auth_response: dict[str, Any] | None = None
        #: go-nsq assumes 2500 until IDENTIFY says otherwise
        self.max_rdy_count = max_rdy_count
        #: the effective msg_timeout in seconds (nsqd's answer), if it said
        self.msg_timeout: float | None = None
        self.tls = False
        self.compression = ""
        self._steps: list[str] = []
        self._step = ""
        self._hbuf = b""
        self._in: Any = None
        self._out: Any = None
        self._frames = FrameDecoder(config.max_msg_size)

    @property
    def ready(self) -> bool:
        return self.state == _READY

    def start(self) -> bytes:
        """The first bytes on the wire: the magic and IDENTIFY."""
        return MAGIC_V2 + commands.identify(self.config.identify_body())

    def encode(self, data: bytes) -> bytes:
        """Bytes as they must go on the wire (compressed once negotiated)."""
        out = self._out
        return out.encode(data) if out is not None else data

    def close(self) -> None:
        self.state = _CLOSED

    # --- reading ------------------------------------------------------------------

    def receive(self, data: bytes) -> list[Event]:
        if self.state == _CLOSED:
            return []
        try:
            if self._in is not None:
                data = self._in.decode(data)
            if self.state == _READY:
                return self._frames.feed(data)
            self._hbuf += data
            return self._handshake()
        except FrameTooBig as e:
            self.state = _CLOSED
            return [(EV_FAILED, ProtocolError(str(e)))]
        except ClientError as e:
            self.state = _CLOSED
            return [(EV_FAILED, e)]
        except CodecError as e:
            self.state = _CLOSED
            return [(EV_FAILED, ProtocolError(str(e)))]
        except Exception as e:  # a codec library's own error on corrupt input
            self.state = _CLOSED
            return [(EV_FAILED, ProtocolError(f"{type(e).__name__}: {e}"))]

    def _next_frame(self) -> tuple[int, bytes] | None:
        buf = self._hbuf
        if len(buf) < 8:
            return None
        size, ftype = _HEADER.unpack_from(buf, 0)
        if size == HTTP_SIZE:
            raise ProtocolError("unexpected HTTP response, a nsqd TCP endpoint is required")
        if size < 4:
            raise ProtocolError(f"response msg size is invalid: {size}")
        max_size = self.config.max_msg_size
        if max_size and size > max_size:
            raise ProtocolError(f"response msg size {size} exceeds configured maximum ({max_size})")
        if len(buf) < 4 + size:
            return None
        self._hbuf = buf[4 + size:]
        return ftype, buf[8:4 + size]

    def _handshake(self) -> list[Event]:
        events: list[Event] = []
        while self.state not in (_READY, _CLOSED):
            frame = self._next_frame()
            if frame is None:
                break
            ftype, data = frame
            if ftype == FRAME_RESPONSE and data == HEARTBEAT:
                events.append((FRAME_RESPONSE, data))  # the glue answers NOP
                continue
            if self.state == _IDENTIFY:
                events.extend(self._on_identify(ftype, data))
            elif self.state == _UPGRADE_OK:
                events.extend(self._on_upgrade_ok(ftype, data))
            elif self.state == _AUTH:
                events.extend(self._on_auth(ftype, data))
            if events and events[-1][0] == EV_START_TLS:
                break
        if self.state == _READY:
            rest, self._hbuf = self._hbuf, b""
            if rest:
                events.extend(self._frames.feed(rest))
        return events

    def _fail(self, error: Exception) -> list[Event]:
        self.state = _CLOSED
        return [(EV_FAILED, error)]

    def _on_identify(self, ftype: int, data: bytes) -> list[Event]:
        if ftype == FRAME_ERROR:
            err = IdentifyError(data.decode("utf-8", "replace"))
            err.__cause__ = from_wire(data)
            return self._fail(err)
        if ftype != FRAME_RESPONSE:
            return self._fail(IdentifyError(f"unexpected frame type {ftype}"))
        if not data.startswith(b"{"):
            # an nsqd without feature negotiation answers OK: nothing to negotiate
            return self._advance()
        try:
            resp = json.loads(data)
            if not isinstance(resp, dict):
                raise ValueError("not an object")
        except ValueError as e:
            return self._fail(IdentifyError(f"bad IDENTIFY response: {e}"))
        self.identify_response = resp
        mrc = resp.get("max_rdy_count")
        if isinstance(mrc, int) and not isinstance(mrc, bool):
            self.max_rdy_count = mrc
        mt = resp.get("msg_timeout")
        if isinstance(mt, (int, float)) and not isinstance(mt, bool):
            self.msg_timeout = mt / 1000.0
        steps = []
        if resp.get("tls_v1"):
            steps.append("tls")
        if resp.get("deflate"):
            steps.append("deflate")
        elif resp.get("snappy"):
            steps.append("snappy")
        if resp.get("auth_required"):
            steps.append("auth")
        self._steps = steps
        return self._advance()

    def _advance(self) -> list[Event]:
        """Run the next negotiation step, or declare the connection ready."""
        if not self._steps:
            self.state = _READY
            return [(EV_READY, (self.identify_response, self.auth_response))]
        step = self._step = self._steps.pop(0)
        if step == "tls":
            self.state = _UPGRADE_OK
            self.tls = True
            return [(EV_START_TLS, None)]
        if step in ("deflate", "snappy"):
            codec: Any
            if step == "deflate":
                codec = DeflateCodec(self.config.deflate_level)
            else:
                try:
                    codec = SnappyCodec()
                except ImportError:
                    return self._fail(IdentifyError("snappy negotiated but cramjam is not installed"))
            self._in = self._out = codec
            self.compression = step
            self.state = _UPGRADE_OK
            # what followed the JSON answer in the same read is already compressed
            raw, self._hbuf = self._hbuf, b""
            if raw:
                self._hbuf = codec.decode(raw)
            return []
        # auth
        secret = self.config.auth_secret
        if not secret:
            return self._fail(AuthRequired())
        self.state = _AUTH
        return [(EV_WRITE, self.encode(commands.auth(secret)))]

    def _on_upgrade_ok(self, ftype: int, data: bytes) -> list[Event]:
        if ftype != FRAME_RESPONSE or data != OK:
            what = {"tls": "TLS", "deflate": "Deflate", "snappy": "Snappy"}.get(self._step, self._step)
            return self._fail(IdentifyError(f"invalid response from {what} upgrade"))
        return self._advance()

    def _on_auth(self, ftype: int, data: bytes) -> list[Event]:
        if ftype == FRAME_ERROR:
            return self._fail(from_wire(data))
        try:
            resp = json.loads(data)
            if not isinstance(resp, dict):
                raise ValueError("not an object")
        except ValueError as e:
            return self._fail(ProtocolError(f"bad AUTH response: {e}"))
        self.auth_response = resp
        return self._advance()


FRAMES = (FRAME_RESPONSE, FRAME_ERROR, FRAME_MESSAGE)
