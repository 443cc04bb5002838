"""
TCP protocol V1 (nsqd -> nsqlookupd), both ends, without I/O.

The wire, as nsqlookupd 1.3.0 speaks it::

    client: "  V1"                                   (4-byte magic, once)
    client: "IDENTIFY\\n" [4-byte BE size][JSON]      (nsqd's PeerInfo)
    client: "REGISTER <topic> [<channel>]\\n"
    client: "UNREGISTER <topic> [<channel>]\\n"
    client: "PING\\n"
    server: [4-byte BE size][data]                   (no frame type, ever)

A line is cut at ``\\n``, trimmed of white space as Go's ``strings.TrimSpace``
does, and split on single spaces.  Answers are ``OK``, the IDENTIFY JSON, or an
error text ``"<CODE> <description>"`` in the same size-prefixed form.  Every
error is fatal: the text is sent, then the connection is closed.  A bad magic
gets ``E_BAD_PROTOCOL`` the same way.  When the connection goes, the peer
leaves every registration it had.

:class:`LookupSession` is the server side for one connection; the helpers at
the bottom (:func:`identify_command`, :func:`register_command`, ...,
:class:`ResponseDecoder`) are the client side nsqd uses.
"""

from __future__ import annotations

import json
import struct
from typing import Any, Protocol

from twisted.logger import Logger

from ... import NSQ_VERSION
from ...errors import BadBody, BadChannel, BadProtocol, BadTopic, Invalid, NSQError
from ...protocol.frames import MAGIC_V1
from ...protocol.names import is_valid_channel_name, is_valid_topic_name
from ...protocol.text import b2s
from ...protocol.gojson import go_json
from .peers import PeerInfo, peer_from_identify
from .registry import RegistrationDB

__all__ = [
    "LookupSession",
    "ServerInfo",
    "response",
    "go_trim_space",
    "identify_command",
    "register_command",
    "unregister_command",
    "PING_COMMAND",
    "ResponseDecoder",
    "ResponseTooBig",
]

log = Logger(namespace="nsqtw.lookupd")

#: bounds on what a peer can make nsqlookupd buffer (nsqd's lines and IDENTIFY are tiny)
MAX_LINE = 16 * 1024
MAX_IDENTIFY_BODY = 1024 * 1024

_SIZE = struct.Struct(">i")
_OK = b"OK"

#: characters Go's unicode.IsSpace accepts; Python's isspace() adds \x1c-\x1f
_NOT_GO_SPACE = frozenset("\x1c\x1d\x1e\x1f")


class ServerInfo(Protocol):
    """What an IDENTIFY answer reports about this nsqlookupd."""

    @property
    def tcp_port(self) -> int | None: ...

    @property
    def http_port(self) -> int | None: ...

    @property
    def broadcast_address(self) -> str: ...

    @property
    def hostname(self) -> str: ...


def response(data: bytes) -> bytes:
    """nsqlookupd's ``SendResponse``: ``[4-byte BE size][data]``."""
    return _SIZE.pack(len(data)) + data


def go_trim_space(text: str) -> str:
    """Go's ``strings.TrimSpace``."""
    start, end = 0, len(text)
    while start < end and text[start].isspace() and text[start] not in _NOT_GO_SPACE:
        start += 1
    while end > start and text[end - 1].isspace() and text[end - 1] not in _NOT_GO_SPACE:
        end -= 1
    return text[start:end]


class _Wait(Exception):
    """More bytes are needed."""


class LookupSession:
    """The V1 state machine for one nsqd connection (sans-IO)."""

    def __init__(self, db: RegistrationDB, remote_address: str, server: ServerInfo) -> None:
        self.db = db
        self.remote_address = remote_address
        self.server = server
        self.peer: PeerInfo | None = None
        self.closed = False
        self._magic = False
        self._buf = b""

    def feed(self, data: bytes, now: float) -> tuple[bytes, bool]:
        """Run every complete command in ``data``; (bytes to send, keep the connection)."""
        if self.closed:
            return b"", False
        buf = self._buf + data if self._buf else data
        pos = 0
        out: list[bytes] = []
        if not self._magic:
            if len(buf) < 4:
                self._buf = buf
                return b"", True
            if buf[:4] != MAGIC_V1:
                log.error("client({peer}) bad protocol magic {magic!r}", peer=self.remote_address,
                          magic=b2s(buf[:4]))
                self._close()
                return response(BadProtocol().wire()), False
            self._magic = True
            pos = 4
        while not self.closed:
            nl = buf.find(b"\n", pos)
            if nl < 0:
                if len(buf) - pos >= MAX_LINE:
                    # a line nsqd never sends: stop buffering it (Go would read on)
                    log.error("client({peer}) sent a line over {n} bytes", peer=self.remote_address, n=MAX_LINE)
                    self._close()
                    return b"", False
                break
            try:
                answer, used = self._command(buf, pos, nl, now)
            except _Wait:
                break
            except NSQError as err:
                log.error("[{peer}] - {err}", peer=self.remote_address, err=b2s(err.wire()))
                out.append(response(err.wire()))
                self._close()
                break
            pos = used
            out.append(response(answer))
        self._buf = buf[pos:] if not self.closed else b""
        return b"".join(out), not self.closed

    def connection_lost(self) -> None:
        """The connection is gone: the peer leaves every registration it had."""
        self._close()

    def _close(self) -> None:
        self.closed = True
        self._buf = b""
        peer, self.peer = self.peer, None
        if peer is not None:
            for key in self.db.remove_peer(peer.id):
                log.info("DB: client({peer}) UNREGISTER category:{category} key:{key} subkey:{subkey}",
                         peer=peer.id, category=key.category, key=key.key, subkey=key.subkey)

    # --- commands ----------------------------------------------------------------

    def _command(self, buf: bytes, start: int, nl: int, now: float) -> tuple[bytes, int]:
        """Run the command on ``buf[start:nl]``; (answer, offset after what it used)."""
        line = go_trim_space(b2s(buf[start:nl]))
        params = line.split(" ")
        name = params[0]
        end = nl + 1
        if name == "PING":
            return self._ping(now), end
        if name == "IDENTIFY":
            return self._identify(buf, end, now)
        if name == "REGISTER":
            return self._register(params[1:]), end
        if name == "UNREGISTER":
            return self._unregister(params[1:]), end
        raise Invalid(f"invalid command {name}")

    def _ping(self, now: float) -> bytes:
        if self.peer is not None:
            # a PING may come before IDENTIFY; only an identified peer is kept alive
            self.peer.last_update = now
        return _OK

    def _identify(self, buf: bytes, pos: int, now: float) -> tuple[bytes, int]:
        if self.peer is not None:
            raise Invalid("cannot IDENTIFY again")
        if len(buf) < pos + 4:
            raise _Wait()
        (size,) = _SIZE.unpack_from(buf, pos)
        if size < 0:
            raise BadBody("IDENTIFY failed to read body size")
        if size > MAX_IDENTIFY_BODY:
            # nsqd's IDENTIFY is a few hundred bytes; Go's nsqlookupd would wait for all of it
            raise BadBody(f"IDENTIFY body too big {size} > {MAX_IDENTIFY_BODY}")
        end = pos + 4 + size
        if len(buf) < end:
            raise _Wait()
        peer = peer_from_identify(buf[pos + 4:end], self.remote_address, now)
        log.info("CLIENT({peer}): IDENTIFY Address:{address} TCP:{tcp} HTTP:{http} Version:{version}",
                 peer=peer.id, address=peer.broadcast_address, tcp=peer.tcp_port,
                 http=peer.http_port, version=peer.version)
        self.peer = peer
        if self.db.identify(peer):
            log.info("DB: client({peer}) REGISTER category:client key: subkey:", peer=peer.id)
        return self._identify_answer(), end

    def _identify_answer(self) -> bytes:
        server = self.server
        # Go marshals a map: keys come out sorted
        return go_json({
            "broadcast_address": server.broadcast_address,
            "hostname": server.hostname,
            "http_port": server.http_port or 0,
            "tcp_port": server.tcp_port or 0,
            "version": NSQ_VERSION,
        })

    def _topic_channel(self, command: str, params: list[str]) -> tuple[PeerInfo, str, str]:
        peer = self.peer
        if peer is None:
            raise Invalid("client must IDENTIFY")
        if not params:
            raise Invalid(f"{command} insufficient number of params")
        topic = params[0]
        channel = params[1] if len(params) >= 2 else ""
        if not is_valid_topic_name(topic):
            raise BadTopic(f"{command} topic name '{topic}' is not valid")
        if channel and not is_valid_channel_name(channel):
            raise BadChannel(f"{command} channel name '{channel}' is not valid")
        return peer, topic, channel

    def _register(self, params: list[str]) -> bytes:
        peer, topic, channel = self._topic_channel("REGISTER", params)
        for key in self.db.register(peer, topic, channel):
            log.info("DB: client({peer}) REGISTER category:{category} key:{key} subkey:{subkey}",
                     peer=peer.id, category=key.category, key=key.key, subkey=key.subkey)
        return _OK

    def _unregister(self, params: list[str]) -> bytes:
        peer, topic, channel = self._topic_channel("UNREGISTER", params)
        for key in self.db.unregister(peer, topic, channel):
            log.info("DB: client({peer}) UNREGISTER category:{category} key:{key} subkey:{subkey}",
                     peer=peer.id, category=key.category, key=key.key, subkey=key.subkey)
        return _OK


# --- the client side (nsqd) ------------------------------------------------------------

PING_COMMAND = b"PING\n"


def identify_command(fields: dict[str, Any]) -> bytes:
    """``IDENTIFY\\n[size][JSON]`` with the keys sorted, as go-nsq marshals a map."""
    body = json.dumps({k: fields[k] for k in sorted(fields)}, separators=(",", ":")).encode()
    return b"IDENTIFY\n" + _SIZE.pack(len(body)) + body


def register_command(topic: str, channel: str = "") -> bytes:
    return ("REGISTER " + topic + (" " + channel if channel else "") + "\n").encode()


def unregister_command(topic: str, channel: str = "") -> bytes:
    return ("UNREGISTER " + topic + (" " + channel if channel else "") + "\n").encode()


class ResponseTooBig(Exception):
    """nsqlookupd announced a response beyond the reader's limit (``--max-body-size``)."""


class ResponseDecoder:
    """Splits the bytes nsqlookupd sends into size-prefixed responses."""

    def __init__(self, max_size: int) -> None:
        self.max_size = max_size
        self._buf = b""

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._buf + data if self._buf else data
        pos = 0
        out = []
        while len(buf) - pos >= 4:
            (size,) = _SIZE.unpack_from(buf, pos)
            if size < 0 or size > self.max_size:
                raise ResponseTooBig(f"response body size ({size}) is greater than limit ({self.max_size})")
            if len(buf) - pos - 4 < size:
                break
            out.append(buf[pos + 4:pos + 4 + size])
            pos += 4 + size
        self._buf = buf[pos:]
        return out
