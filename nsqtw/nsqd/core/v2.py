"""
TCP protocol V2, server side, without I/O.

:class:`V2Session` takes the bytes one connection sent, parses every complete
command in them with a moving offset (no re-slicing of the tail), runs each
against the broker, and returns what the read did as one :class:`Outcome`
(the answers to write, and what the glue in :mod:`nsqtw.nsqd.tcp` must do
next: restart heartbeats, wait for an fsync, go on next turn, ask the auth
server, upgrade the stream, close), as h2 returns events.  A run of back-to-back
``FIN <id>\\n`` lines (a consumer acknowledging a batch) is recognised by one
regular expression and finished as a batch, even when the run was cut across
two reads.

Errors follow nsqd exactly: every ``E_*`` text, fatal ones close the
connection after their error frame, and the non-fatal ones (``E_FIN_FAILED``,
``E_REQ_FAILED``, ``E_TOUCH_FAILED``) leave the commands after them in the
same read to run.
"""

from __future__ import annotations

import json
import re
import struct
from itertools import repeat
from typing import Any, NamedTuple
from collections.abc import Sequence

import attr

from ... import NSQ_VERSION
from ...errors import (
    AuthDisabled, AuthFailed, AuthFirst, Unauthorized, BadBody, BadChannel, BadMessage, BadProtocol, BadTopic, BrokerError, DPubFailed,
    Exiting, IdentifyFailed, Invalid, MPubFailed, NSQError, PubFailed, SubFailed,
)
from ...options import TLS_NOT_REQUIRED
from ...protocol.frames import (
    CLOSE_WAIT_FRAME, FRAME_ERROR, FRAME_RESPONSE, MAGIC_V2, OK_FRAME, encode_frame,
)
from ...protocol.identify import IdentifyDecodeError, parse_identify
from ...protocol.names import is_valid_name
from ...protocol.text import b2s, go_quote
from .broker import Broker
from .client import STATE_CLOSING, STATE_INIT, STATE_SUBSCRIBED, ClientState

__all__ = ["V2Session", "Features", "Outcome", "Upgrade", "KEEP", "CLOSE", "CLOSE_HELD", "MAX_LINE"]

#: nsqd reads lines through a 16 KiB bufio.Reader; a longer line is a read error (close, no frame)
MAX_LINE = 16 * 1024

_FIN_RUN = re.compile(rb"(?:FIN [^\n\r ]{16}\n)+")
_DIGITS = re.compile(rb"[0-9]*\Z")
_I32 = struct.Struct(">i").unpack_from
_bget = bytes.__getitem__

#: names already validated (raw bytes -> str): a publisher names the same few topics again
#: and again; bounded, cleared when full
_VALID_NAMES: dict[bytes, str] = {}

_BODY_COMMANDS = frozenset((b"PUB", b"MPUB", b"DPUB", b"IDENTIFY", b"AUTH"))


@attr.s(frozen=True, slots=True, auto_attribs=True)
class Features:
    """What this broker can negotiate on IDENTIFY."""

    tls: bool = False
    snappy: bool = False
    deflate: bool = False


@attr.s(slots=True, auto_attribs=True)
class Upgrade:
    """Stream upgrades IDENTIFY negotiated, performed by the glue in this order."""

    tls: bool = False
    snappy: bool = False
    deflate: bool = False
    deflate_level: int = 6


#: :attr:`Outcome.close`: keep the connection open
KEEP = 0
#: close it once the answer is written
CLOSE = 1
#: read nothing more, and close once the answers held for an fsync are written (``synced``)
CLOSE_HELD = 2


class Outcome(NamedTuple):
    """What one call into a :class:`V2Session` did, for the glue to act on, field by field in
    this order (the session's whole answer: the glue reads nothing else of it)."""

    #: bytes to write to the client, before any delivery the broker frames afterwards
    answer: bytes = b""
    #: at least one whole command was read (nsqd's read deadline restarts)
    progressed: bool = False
    #: (re)start the heartbeat and read-deadline timers with the client's interval: the protocol
    #: magic arrived (the magic timeout ends), or IDENTIFY changed the interval
    heartbeats: bool = False
    #: a command left work for the next reactor turn: call ``feed(b"", now)`` then
    more: bool = False
    #: nonzero: answers are held until everything published so far is fsynced (or stored by the
    #: replication peers); then call ``synced(sync)`` or ``sync_failed(sync, reason)``
    sync: int = 0
    #: a command waits for the auth server: ask it with this secret, then ``resume(result)`` and
    #: ``feed(b"", now)``
    auth: bytes | None = None
    #: stream upgrades IDENTIFY negotiated, to perform now; then ``take_remainder()``
    upgrade: Upgrade | None = None
    #: :data:`KEEP`, :data:`CLOSE` or :data:`CLOSE_HELD`
    close: int = KEEP


#: the outcomes of the commonest reads, built once
_NOTHING = Outcome()
_PROGRESSED = Outcome(b"", True)
_OK_DONE = Outcome(OK_FRAME, True)


def base10(data: bytes) -> int | None:
    """nsqd's ``ByteToBase10``: ASCII digits only, ``""`` is 0, anything else fails; the value
    wraps at 2**64 as Go's uint64 does (so a 16 KiB number is just a large one)."""
    if _DIGITS.match(data) is None:
        return None
    if len(data) <= 19:
        return int(data) if data else 0
    n = 0
    for i in range(0, len(data), 18):
        chunk = data[i:i + 18]
        n = (n * 10 ** len(chunk) + int(chunk)) & 0xFFFFFFFFFFFFFFFF
    return n


#: unpackers of k back-to-back ``FIN <id>\n`` lines' IDs (k a power of two up to 256)
_FIN_STRUCTS = [struct.Struct("4x16sx" * (1 << i)) for i in range(9)]


def _fin_ids(buf: bytes, pos: int, stop: int) -> list[bytes]:
    """The IDs of the FIN lines ``buf[pos:stop]`` (already matched by ``_FIN_RUN``: 21 bytes
    each), cut by ``struct`` in C."""
    n = (stop - pos) // 21
    ids: list[bytes] = []
    i = 8
    while n:
        while (1 << i) > n:
            i -= 1
        ids.extend(_FIN_STRUCTS[i].unpack_from(buf, pos))
        pos += 21 << i
        n -= 1 << i
    return ids


def _uniform(buf: bytes, p: int, stop: int, stride: int, num: int) -> bool:
    """True if the 4-byte size fields at ``p, p + stride, ...`` (``num`` of them) are equal."""
    for k in range(4):
        column = buf[p + k:stop:stride]
        if column.count(column[0]) != num:
            return False
    return True


#: unpackers of uniform MPUB bodies, by (size, count); a batch of more messages is sliced instead
#: (bounds what a client's odd batch shapes can make the cache hold)
_STRUCTS: dict[tuple[int, int], struct.Struct] = {}
_STRUCT_MAX = 1000


def _bodies_struct(size: int, num: int) -> struct.Struct:
    """``num`` messages of ``size`` bytes, each after its 4-byte size: unpacks to the bodies."""
    key = (size, num)
    st = _STRUCTS.get(key)
    if st is None:
        if len(_STRUCTS) >= 64:
            _STRUCTS.clear()
        st = _STRUCTS[key] = struct.Struct(">" + f"4x{size}s" * num)
    return st


def _cut_mpub_message(data: bytes, p: int, i: int) -> NSQError:
    """nsqd's error for an MPUB whose stream ended inside message ``i`` or a later one
    (``data[p:]`` holds what arrived of message ``i`` onwards)."""
    end = len(data)
    while True:
        if p + 4 > end:
            return BadMessage(f"MPUB failed to read message({i}) body size")
        size = _I32(data, p)[0]
        if size <= 0 or p + 4 + size > end:
            return BadMessage("MPUB failed to read message body")
        p += 4 + size
        i += 1


class _Suspend(Exception):
    """The command needs an answer from outside (the auth server) before it can run."""

    def __init__(self, request: tuple[str, bytes]) -> None:
        self.request = request


class _Wait(Exception):
    """More bytes are needed before this command can run; ``keep`` is where the bytes still
    needed start (None: the command's own start, to parse it again)."""

    def __init__(self, need: int = 0, keep: int | None = None) -> None:
        self.need = need
        self.keep = keep


class _Yield(_Wait):
    """A big command has done its share of this reactor turn; it goes on in the next one."""


#: most MPUB messages walked or queued per reactor turn: a 5 MiB MPUB of a million one-byte
#: messages is legal, and must not stall every other client while it is taken in (what a
#: refusal between two turns leaves stored: see _MpubWalk)
MPUB_TURN = 20000


class V2Session:
    """The V2 protocol state machine for one connection (sans-IO)."""

    def __init__(self, broker: Broker, client: ClientState, *, features: Features = Features(),
                 authorizer: Any = None, sync_publish: bool = False) -> None:
        self.broker = broker
        self.client = client
        self.features = features
        self.authorizer = authorizer
        #: --sync-every=1: a publish is answered only once the fsync covering it is done
        self.sync_publish = sync_publish
        self._held: list[tuple[int, bytes]] | None = None
        #: an MPUB whose messages are still arriving (see _MpubWalk)
        self._walk: _MpubWalk | None = None
        #: commands completed so far (the glue's read deadline counts from the last one)
        self.commands = 0
        #: a command yielded the rest of its work to the next reactor turn
        self.busy = False
        #: ("auth" | "requery", secret) while waiting for the auth server; see resume()
        self.suspended: tuple[str, bytes] | None = None
        #: the secret to ask the auth server about, until an outcome has said so
        self._ask: bytes | None = None
        #: the heartbeat timers are to be (re)started (magic, IDENTIFY), until an outcome has said so
        self._heartbeats = False
        #: something beyond the answer may be for the glue to do (set with busy, _want_sync, _ask,
        #: upgrade and _heartbeats): feed's outcome is then built field by field
        self._notify = False
        self._auth_result: Any = None
        self._want_sync = False
        self._next_gen = 1
        self._last_gen = 0
        self.closed = False
        self.upgrade: Upgrade | None = None
        self._buf = b""
        self._chunks: list[bytes] = []
        self._wanted = 0
        self._magic = False
        #: this read's answers (returned by feed)
        self._out: list[bytes] = []
        #: the topic of this connection's last PUB, as sent and as validated (feed's first
        #: branch); never set while PUBs need authorization
        self._pub_raw: bytes | None = None
        self._fast_pub = authorizer is None
        self._pub_name = ""
        opts = broker.options
        self._max_msg_size = opts.max_msg_size
        self._max_body_size = opts.max_body_size
        self._tls_required = opts.tls_required != TLS_NOT_REQUIRED
        self._line = {
            b"RDY": self._rdy,
            b"FIN": self._fin,
            b"REQ": self._req,
            b"TOUCH": self._touch,
            b"SUB": self._sub,
            b"CLS": self._cls,
            b"NOP": self._nop,
        }
        self._body = {
            b"PUB": self._pub,
            b"MPUB": self._mpub,
            b"DPUB": self._dpub,
            b"IDENTIFY": self._identify,
            b"AUTH": self._auth,
        }

    # --- the read loop -----------------------------------------------------------

    def feed(self, data: bytes, now: float) -> Outcome:
        """Handle bytes from the client: what the glue must do, answers first (see
        :class:`Outcome`).  Deliveries are not answers: the broker frames them when it settles.

        The first branch is the commonest read of all, one whole ``PUB`` to the topic of this
        connection's last PUB while nothing is pending (no partial command, no MPUB walk, no
        upgrade): the same checks, effects and answer as the loop below, fewer steps.  With
        ``sync_publish`` (``--sync-every=1``, replication) its ``OK`` is held as the loop holds
        it, until :meth:`synced`."""
        if data[:4] == b"PUB " and self._pub_raw is not None and not self._buf and not self._wanted \
                and self._walk is None and self.upgrade is None and not self.closed:
            nl = data.find(b"\n", 4)
            if 0 < nl and nl + 5 <= len(data) and data[4:nl] == self._pub_raw:
                size: int = _I32(data, nl + 1)[0]
                if nl + 5 + size == len(data) and 0 < size <= self._max_msg_size:
                    try:
                        self._publish_one(self._pub_name, data[nl + 5:], now)
                    except NSQError as e:
                        self._respond(encode_frame(FRAME_ERROR, e.wire()))
                        return self._outcome(self._fail(), self.commands)
                    self.commands += 1
                    if self.sync_publish:
                        self._published()
                        self._respond(OK_FRAME)  # held for the fsync or the peers
                        return Outcome(b"", True, sync=self._sync_request())
                    return _OK_DONE
        done_before = self.commands
        keep = self._feed(data, now)
        if keep and not self._notify:  # nothing to do but write the answer (the commonest case)
            out = self._out
            if not out:
                return _PROGRESSED if self.commands != done_before else _NOTHING
            answer = out[0] if len(out) == 1 else b"".join(out)
            out.clear()
            return Outcome(answer, self.commands != done_before)
        return self._outcome(keep, done_before)

    def _outcome(self, keep: bool, done_before: int) -> Outcome:
        """This read's :class:`Outcome`: its answers, and what the session's state asks of the glue."""
        out = self._out
        if not out:
            answer = b""
        else:
            answer = out[0] if len(out) == 1 else b"".join(out)
            out.clear()
        progressed = self.commands != done_before
        self._notify = False
        if keep and not self._heartbeats and not self.busy and not self._want_sync \
                and self._ask is None and self.upgrade is None:
            return Outcome(answer, progressed)
        heartbeats, self._heartbeats = self._heartbeats, False
        ask, self._ask = self._ask, None
        return Outcome(answer, progressed, heartbeats, self.busy, self._sync_request(), ask,
                       self.upgrade, KEEP if keep else self._closing())

    def _closing(self) -> int:
        return CLOSE_HELD if self._held is not None else CLOSE

    def _feed(self, data: bytes, now: float) -> bool:
        if self.closed:
            return False
        if self.suspended is not None:
            self._buf += data
            if len(self._buf) > self._max_body_size + MAX_LINE:
                self.closed = True  # flooding while its AUTH is being checked
                return False
            return True
        self.busy = False
        if self._wanted:
            # a large body is arriving: collect chunks, join once it is all here
            self._chunks.append(data)
            if len(data) < self._wanted:
                self._wanted -= len(data)
                return True
            self._wanted = 0
            data = b"".join(self._chunks)
            self._chunks = []
        buf = self._buf + data if self._buf else data
        self._buf = b""
        pos = 0
        end = len(buf)
        if not self._magic:
            if end < 4:
                self._buf = buf
                return True
            if buf[:4] != MAGIC_V2:
                self._out.append(encode_frame(FRAME_ERROR, BadProtocol.code))
                self.closed = True
                return False
            self._magic = True
            self._heartbeats = self._notify = True
            pos = 4
        client = self.client
        line_handlers = self._line
        body_handlers = self._body
        walk = self._walk
        if walk is not None:
            try:
                pos = walk.resume(buf, pos, end, now)
                self._walk = None
                self.commands += 1
            except _Wait as w:
                self._buf = buf[w.keep:]
                self._waiting(w)
                return True
            except NSQError as e:
                self._walk = None
                self._respond(encode_frame(FRAME_ERROR, e.wire()))
                return self._fail()
        while pos < end:
            cmd_pos = pos
            nl = buf.find(b"\n", pos)
            if nl < 0:
                if end - pos >= MAX_LINE:
                    # nsqd: "failed to read command" - the connection closes, no error frame
                    self.closed = True
                    return False
                self._buf = buf[pos:]
                return True
            try:
                if buf[pos] == 70 and nl - pos == 20 and client.state >= STATE_SUBSCRIBED and \
                        not (self._tls_required and not client.tls):
                    m = _FIN_RUN.match(buf, pos)
                    if m is not None:
                        stop = m.end()
                        ids = _fin_ids(buf, pos, stop)
                        pos = stop
                        for err in client.channel.finish_many(client, ids, now):
                            self._respond(encode_frame(FRAME_ERROR, err.wire()))
                        self.commands += len(ids)
                        continue
                if nl - pos >= MAX_LINE:  # the 16 KiB read buffer must hold the line and its \n
                    self.closed = True
                    return False
                line = buf[pos:nl]
                if line[-1:] == b"\r":
                    line = line[:-1]
                params = line.split(b" ")
                name = params[0]
                if self._tls_required and not client.tls and name != b"IDENTIFY":
                    raise Invalid(f"cannot {b2s(name)} in current state (TLS required)")
                handler = line_handlers.get(name)
                if handler is not None:
                    pos = nl + 1
                    self.commands += 1
                    handler(params, now)
                    continue
                bhandler = body_handlers.get(name)
                if bhandler is None:
                    raise Invalid(f"invalid command {b2s(name)}")
                try:
                    pos = bhandler(params, buf, nl + 1, end, now)
                    self.commands += 1
                except _Wait as w:
                    self._buf = buf[pos if w.keep is None else w.keep:]
                    self._waiting(w)
                    return True
                if self.upgrade is not None:
                    # bytes after a negotiated upgrade belong to the new stream layer
                    self._buf = buf[pos:]
                    return True
            except NSQError as e:
                self._respond(encode_frame(FRAME_ERROR, e.wire()))
                if e.fatal:
                    return self._fail()
            except _Suspend as sus:
                self._buf = buf[cmd_pos:]
                self.suspended = sus.request
                self._ask = sus.request[1]
                self._notify = True
                return True
        return True

    def eof(self) -> Outcome:
        """The client shut its sending side (a half-close, or EOF): as nsqd, answer a command
        whose size or body it cut short with nsqd's fatal error (queued like any answer), and
        read nothing more.  A cut inside a command line, or between commands, gets no answer.
        The outcome closes the connection (once the answers held for an fsync are out)."""
        if not self.closed:
            self.closed = True
            if self.suspended is None and self._magic:
                self._cut_short()
        return self._outcome(False, self.commands)

    def _cut_short(self) -> None:
        """eof's answer to a command the client cut short, queued."""
        data = b"".join(self._chunks) if self._wanted else self._buf
        self._chunks = []
        self._wanted = 0
        self._buf = b""
        walk, self._walk = self._walk, None
        err: NSQError | None = None
        if walk is not None:
            err = _cut_mpub_message(data, 0, len(walk.bodies))
        else:
            nl = data.find(b"\n")
            if nl < 0:
                return  # nsqd: "failed to read command" at EOF closes without a frame
            line = data[:nl]
            if line[-1:] == b"\r":
                line = line[:-1]
            name = line.split(b" ")[0]
            rest = len(data) - nl - 1
            if name in (b"PUB", b"DPUB"):
                cmd = b2s(name)
                err = BadMessage(f"{cmd} failed to read message body size" if rest < 4
                                 else f"{cmd} failed to read message body")
            elif name in (b"IDENTIFY", b"AUTH"):
                cmd = b2s(name)
                err = BadBody(f"{cmd} failed to read body size" if rest < 4 else f"{cmd} failed to read body")
            elif name == b"MPUB":
                if rest < 4:
                    err = BadBody("MPUB failed to read body size")
                elif rest < 8:
                    err = BadBody("MPUB failed to read message count")
                else:
                    err = _cut_mpub_message(data, nl + 9, 0)
        if err is not None:
            self._respond(encode_frame(FRAME_ERROR, err.wire()))

    def _waiting(self, w: _Wait) -> None:
        if isinstance(w, _Yield):
            self.busy = self._notify = True  # the glue calls feed(b"") again in the next reactor turn
        elif w.need > 65536:
            # a large body is arriving: collect its chunks and join them once
            self._wanted = w.need
            self._chunks = [self._buf]
            self._buf = b""

    def _fail(self) -> bool:
        """A fatal error: nothing more is read, and nothing more is delivered to this client
        while its connection closes (its in-flight messages go back at once)."""
        self.closed = True
        self._walk = None
        self.client.rdy = 0
        return False

    def resume(self, result: Any) -> None:
        """The auth server answered (an AuthState, or an exception): the suspended command
        runs again on the next ``feed`` (call ``feed(b"", now)``)."""
        self._auth_result = result if result is not None else RuntimeError("no answer")
        self.suspended = None

    def take_remainder(self) -> bytes:
        """Bytes received after an upgrade point (to be re-fed through the new layer)."""
        rest, self._buf = self._buf, b""
        self.upgrade = None
        return rest

    # --- answers held for an fsync (--sync-every=1) ---------------------------------------

    def _respond(self, frame: bytes) -> None:
        """Queue a response, behind any answer still waiting for its fsync (order is kept)."""
        held = self._held
        if held is None:
            self._out.append(frame)
        else:
            held.append((self._next_gen if self._want_sync else self._last_gen, frame))

    def _published(self) -> None:
        if self.sync_publish:
            self._want_sync = self._notify = True
            if self._held is None:
                self._held = []

    def _sync_request(self) -> int:
        """The generation of answers to release once everything published so far is fsynced
        (0: nothing new to wait for)."""
        if not self._want_sync:
            return 0
        gen = self._next_gen
        self._next_gen += 1
        self._last_gen = gen
        self._want_sync = False
        return gen

    def synced(self, gen: int) -> Outcome:
        """The fsync for ``gen`` is done: the answers it held, to write (and the close they
        were holding back, if the connection is closing)."""
        held = self._held
        if held is None:
            answer = b""
        elif len(held) == 1 and held[0][0] <= gen:  # one publish held (one PUB per round trip)
            self._held = None
            answer = held[0][1]
        else:
            ready = [frame for g, frame in held if g <= gen]
            rest = [(g, frame) for g, frame in held if g > gen]
            self._held = rest or None
            answer = b"".join(ready)
        if not self.closed:
            return Outcome(answer) if answer else _NOTHING
        return Outcome(answer, close=self._closing())

    def sync_failed(self, gen: int, reason: str) -> Outcome:
        """The fsync failed: the publishes it covered are refused and the connection closes."""
        self._held = None
        self.closed = True
        return Outcome(encode_frame(FRAME_ERROR, PubFailed(f"PUB failed {reason}").wire()), close=CLOSE)

    @property
    def holding(self) -> bool:
        return self._held is not None

    # --- helpers ----------------------------------------------------------------

    def _size(self, buf: bytes, start: int, end: int) -> int:
        if start + 4 > end:
            raise _Wait()
        return _I32(buf, start)[0]  # type: ignore[no-any-return]  # struct's unpacks are typed tuple[Any, ...]

    def _need(self, stop: int, end: int) -> None:
        if stop > end:
            raise _Wait(stop - end)

    def _take_auth_result(self) -> Any:
        result, self._auth_result = self._auth_result, None
        return result

    def _check_auth(self, cmd: str, topic: str, channel: str, now: float) -> None:
        """nsqd's CheckAuth: authorized first, re-asked when the TTL ran out, then matched."""
        if self.authorizer is None:
            return
        client = self.client
        state = client.auth
        if state is None:
            raise AuthFirst(f"AUTH required before {cmd}")
        if state.expired(now):
            result = self._take_auth_result()
            if result is None:
                raise _Suspend(("requery", state.secret))
            if isinstance(result, BaseException):
                raise AuthFailed("AUTH failed")
            client.auth = state = result
        if not state.is_allowed(topic, channel):
            raise Unauthorized(f"AUTH failed for {cmd} on {go_quote(topic)} {go_quote(channel)}")

    def _topic_name(self, raw: bytes, cmd: str, code: type = BadTopic, prefix: str = "") -> str:
        name = _VALID_NAMES.get(raw)
        if name is not None:
            return name
        name = b2s(raw)
        if not is_valid_name(name):
            raise code(f"{prefix}{cmd} topic name {go_quote(name)} is not valid")
        if len(_VALID_NAMES) >= 4096:
            _VALID_NAMES.clear()
        _VALID_NAMES[raw] = name
        return name

    def _message_id(self, raw: bytes) -> bytes:
        if len(raw) != 16:
            raise Invalid("invalid message ID")
        return raw

    # --- commands without a body ------------------------------------------------------

    def _nop(self, params: list[bytes], now: float) -> None:
        pass

    def _rdy(self, params: list[bytes], now: float) -> None:
        client = self.client
        state = client.state
        if state == STATE_CLOSING:
            return
        if state != STATE_SUBSCRIBED:
            raise Invalid("cannot RDY in current state")
        count = 1
        if len(params) > 1:
            parsed = base10(params[1])
            if parsed is None:
                raise Invalid(f"RDY could not parse count {b2s(params[1])}")
            count = parsed
        max_rdy = self.broker.options.max_rdy_count
        if count > max_rdy:
            raise Invalid(f"RDY count {count} out of range 0-{max_rdy}")
        if count != client.rdy:
            client.rdy = count
            self.broker.dirty.add(client.channel)

    def _fin(self, params: list[bytes], now: float) -> None:
        client = self.client
        if client.state not in (STATE_SUBSCRIBED, STATE_CLOSING):
            raise Invalid("cannot FIN in current state")
        if len(params) < 2:
            raise Invalid("FIN insufficient number of params")
        client.channel.finish(client, self._message_id(params[1]), now)

    def _req(self, params: list[bytes], now: float) -> None:
        client = self.client
        if client.state not in (STATE_SUBSCRIBED, STATE_CLOSING):
            raise Invalid("cannot REQ in current state")
        if len(params) < 3:
            raise Invalid("REQ insufficient number of params")
        mid = self._message_id(params[1])
        ms = base10(params[2])
        if ms is None:
            raise Invalid(f"REQ could not parse timeout {b2s(params[2])}")
        delay = min(ms / 1000.0, self.broker.options.max_req_timeout)
        client.channel.requeue(client, mid, delay, now)

    def _touch(self, params: list[bytes], now: float) -> None:
        client = self.client
        if client.state not in (STATE_SUBSCRIBED, STATE_CLOSING):
            raise Invalid("cannot TOUCH in current state")
        if len(params) < 2:
            raise Invalid("TOUCH insufficient number of params")
        client.channel.touch(client, self._message_id(params[1]), now)

    def _cls(self, params: list[bytes], now: float) -> None:
        client = self.client
        if client.state != STATE_SUBSCRIBED:
            raise Invalid("cannot CLS in current state")
        client.rdy = 0
        client.state = STATE_CLOSING
        self._respond(CLOSE_WAIT_FRAME)

    def _sub(self, params: list[bytes], now: float) -> None:
        client = self.client
        if client.state != STATE_INIT:
            raise Invalid("cannot SUB in current state")
        if client.heartbeat_interval <= 0:
            raise Invalid("cannot SUB with heartbeats disabled")
        if len(params) < 3:
            raise Invalid("SUB insufficient number of parameters")
        topic_name = self._topic_name(params[1], "SUB")
        channel_name = b2s(params[2])
        if not is_valid_name(channel_name):
            raise BadChannel(f"SUB channel name {go_quote(channel_name)} is not valid")
        self._check_auth("SUB", topic_name, channel_name, now)
        try:
            topic = self.broker.get_topic(topic_name, now)
            channel = topic.get_channel(channel_name, now)
            channel.add_client(client)
        except Exiting:
            raise SubFailed("SUB failed to deleted topic/channel") from None
        client.state = STATE_SUBSCRIBED
        client.channel = channel
        self._respond(OK_FRAME)

    # --- commands with a body --------------------------------------------------------
    # each takes (params, buf, start, end, now) where start is the offset just past the
    # command line, and returns the offset past its body (or raises _Wait)

    def _pub(self, params: list[bytes], buf: bytes, start: int, end: int, now: float) -> int:
        # the most common command of all (one message per round trip): kept flat
        if len(params) < 2:
            raise Invalid("PUB insufficient number of parameters")
        topic_name = _VALID_NAMES.get(params[1]) or self._topic_name(params[1], "PUB")
        if start + 4 > end:
            raise _Wait()
        size: int = _I32(buf, start)[0]
        if size <= 0:
            raise BadMessage(f"PUB invalid message body size {size}")
        if size > self._max_msg_size:
            raise BadMessage(f"PUB message too big {size} > {self._max_msg_size}")
        stop = start + 4 + size
        if stop > end:
            raise _Wait(stop - end)
        if self.authorizer is not None:
            self._check_auth("PUB", topic_name, "", now)
        self._publish_one(topic_name, buf[start + 4:stop], now)
        if self._fast_pub:
            self._pub_raw = params[1]  # the next read may take feed's first branch
            self._pub_name = topic_name
        self._published()
        self._respond(OK_FRAME)
        return stop

    def _publish_one(self, topic_name: str, body: bytes, now: float) -> None:
        """A PUB's store and count (both of feed's ways to a PUB come here)."""
        try:
            self.broker.publish_one(topic_name, body, now)
        except BrokerError as e:
            raise PubFailed(f"PUB failed {e}") from None
        counts = self.client.pub_counts
        counts[topic_name] = counts.get(topic_name, 0) + 1

    def _dpub(self, params: list[bytes], buf: bytes, start: int, end: int, now: float) -> int:
        if len(params) < 3:
            raise Invalid("DPUB insufficient number of parameters")
        topic_name = self._topic_name(params[1], "DPUB")
        ms = base10(params[2])
        if ms is None:
            raise Invalid(f"DPUB could not parse timeout {b2s(params[2])}")
        max_ms = int(self.broker.options.max_req_timeout * 1000)
        if ms > max_ms:
            raise Invalid(f"DPUB timeout {ms} out of range 0-{max_ms}")
        size = self._size(buf, start, end)
        if size <= 0:
            raise BadMessage(f"DPUB invalid message body size {size}")
        if size > self._max_msg_size:
            raise BadMessage(f"DPUB message too big {size} > {self._max_msg_size}")
        stop = start + 4 + size
        self._need(stop, end)
        self._check_auth("DPUB", topic_name, "", now)
        try:
            body = buf[start + 4:stop]
            if ms:
                self.broker.publish_deferred(topic_name, body, ms / 1000.0, now)
            else:
                self.broker.publish(topic_name, [body], now)
        except BrokerError as e:
            raise DPubFailed(f"DPUB failed {e}") from None
        self.client.published(topic_name, 1)
        self._published()
        self._respond(OK_FRAME)
        return stop

    def _mpub(self, params: list[bytes], buf: bytes, start: int, end: int, now: float) -> int:
        if len(params) < 2:
            raise Invalid("MPUB insufficient number of parameters")
        topic_name = self._topic_name(params[1], "MPUB", prefix="E_BAD_TOPIC ")
        self._check_auth("MPUB", topic_name, "", now)
        try:
            self.broker.get_topic(topic_name, now)
        except BrokerError as e:
            raise MPubFailed(f"MPUB failed {e}") from None
        body_size = self._size(buf, start, end)
        if body_size <= 0:
            raise BadBody(f"MPUB invalid body size {body_size}")
        if body_size > self._max_body_size:
            raise BadBody(f"MPUB body too big {body_size} > {self._max_body_size}")
        p = start + 4
        num = self._size(buf, p, end)
        max_messages = (self._max_body_size - 4) // 5
        if num <= 0 or num > max_messages:
            raise BadBody(f"MPUB invalid message count {num}")
        p += 4
        if p + 4 <= end and num <= MPUB_TURN:
            # the common case, every message the same size and all here: C builtins do it all
            first = _I32(buf, p)[0]
            if 0 < first <= self._max_msg_size:
                stride = first + 4
                stop = p + num * stride
                # every size field equal to the first: each of its 4 bytes, taken with a stride
                # of one message, is one repeated byte
                if stop <= end and stop - p <= body_size - 4 and \
                        _uniform(buf, p, stop, stride, num):
                    if num <= _STRUCT_MAX:
                        bodies: Sequence[bytes] = _bodies_struct(first, num).unpack_from(buf, p)
                    else:
                        bodies = list(map(_bget, repeat(buf), map(slice, range(p + 4, stop, stride),
                                                                  range(stride + p, stop + stride, stride))))
                    return self._mpub_done(topic_name, bodies, now, stop, first)
        # otherwise walk the messages one by one, as nsqd does; the walk keeps the messages read
        # so far, so an MPUB arriving in many small reads is not re-parsed from its start
        walk = _MpubWalk(self, topic_name, num, body_size - 4)
        try:
            return walk.resume(buf, p, end, now)
        except _Wait:
            self._walk = walk
            raise

    def _mpub_done(self, topic_name: str, bodies: Sequence[bytes], now: float, stop: int,
                   uniform: int | None) -> int:
        try:
            self.broker.publish(topic_name, bodies, now, uniform)
        except BrokerError as e:
            raise MPubFailed(f"MPUB failed {e}") from None
        self.client.published(topic_name, len(bodies))
        self._published()
        self._respond(OK_FRAME)
        return stop

    def _identify(self, params: list[bytes], buf: bytes, start: int, end: int, now: float) -> int:
        client = self.client
        if client.state != STATE_INIT:
            raise Invalid("cannot IDENTIFY in current state")
        size = self._size(buf, start, end)
        if size > self._max_body_size:
            raise BadBody(f"IDENTIFY body too big {size} > {self._max_body_size}")
        if size <= 0:
            raise BadBody(f"IDENTIFY invalid body size {size}")
        stop = start + 4 + size
        self._need(stop, end)
        try:
            req = parse_identify(buf[start + 4:stop])
        except IdentifyDecodeError:
            raise BadBody("IDENTIFY failed to decode JSON body") from None
        self._apply_identify(req)
        self._heartbeats = self._notify = True  # at the interval it may have changed
        if not req.feature_negotiation:
            self._respond(OK_FRAME)
            return stop
        opts = self.broker.options
        features = self.features
        tls = features.tls and req.tls_v1
        deflate = features.deflate and opts.deflate and req.deflate
        level = 6
        if deflate and req.deflate_level > 0:
            level = req.deflate_level
        level = min(level, opts.max_deflate_level)
        snappy = features.snappy and opts.snappy and req.snappy
        if deflate and snappy:
            raise IdentifyFailed("cannot enable both deflate and snappy compression")
        answer = {
            "max_rdy_count": opts.max_rdy_count,
            "version": NSQ_VERSION,
            "max_msg_timeout": int(opts.max_msg_timeout * 1000),
            "msg_timeout": int(round(client.msg_timeout * 1000)),
            "tls_v1": tls,
            "deflate": deflate,
            "deflate_level": level,
            "max_deflate_level": opts.max_deflate_level,
            "snappy": snappy,
            "sample_rate": client.sample_rate,
            "auth_required": self.authorizer is not None,
            "output_buffer_size": client.output_buffer_size,
            "output_buffer_timeout": int(round(client.output_buffer_timeout * 1000)),
        }
        self._respond(encode_frame(FRAME_RESPONSE, json.dumps(answer, separators=(",", ":")).encode()))
        if tls or snappy or deflate:
            self.upgrade = Upgrade(tls, snappy, deflate, level)
            self._notify = True
        return stop

    def _apply_identify(self, req: Any) -> None:
        client = self.client
        opts = self.broker.options
        client.client_id = req.client_id if req.client_id is not None else ""
        client.hostname = req.hostname if req.hostname is not None else ""
        client.user_agent = req.user_agent if req.user_agent is not None else ""
        hb = req.heartbeat_interval
        if hb == -1:
            client.heartbeat_interval = 0
        elif hb == 0:
            pass
        elif 1000 <= hb <= int(opts.max_heartbeat_interval * 1000):
            client.heartbeat_interval = hb / 1000.0
        else:
            raise BadBody(f"IDENTIFY heartbeat interval ({hb}) is invalid")
        timeout = req.output_buffer_timeout
        if timeout == -1:
            client.output_buffer_timeout = 0
        elif timeout == 0:
            pass
        elif int(opts.min_output_buffer_timeout * 1000) <= timeout <= int(opts.max_output_buffer_timeout * 1000):
            client.output_buffer_timeout = timeout / 1000.0
        else:
            raise BadBody(f"IDENTIFY output buffer timeout ({timeout}) is invalid")
        size = req.output_buffer_size
        if size == -1:
            client.output_buffer_size = 1
            client.output_buffer_timeout = 0
        elif size == 0:
            pass
        elif 64 <= size <= opts.max_output_buffer_size:
            client.output_buffer_size = size
        else:
            raise BadBody(f"IDENTIFY output buffer size ({size}) is invalid")
        rate = req.sample_rate
        if rate < 0 or rate > 99:
            raise BadBody(f"IDENTIFY sample rate ({rate}) is invalid")
        client.sample_rate = rate
        mt = req.msg_timeout
        if mt == 0:
            pass
        elif 1000 <= mt <= int(opts.max_msg_timeout * 1000):
            client.msg_timeout = mt / 1000.0
        else:
            raise BadBody(f"IDENTIFY msg timeout ({mt}) is invalid")
        client.identified = True

    def _auth(self, params: list[bytes], buf: bytes, start: int, end: int, now: float) -> int:
        client = self.client
        if client.state != STATE_INIT:
            raise Invalid("cannot AUTH in current state")
        if len(params) != 1:
            raise Invalid("AUTH invalid number of parameters")
        size = self._size(buf, start, end)
        if size > self._max_body_size:
            raise BadBody(f"AUTH body too big {size} > {self._max_body_size}")
        if size <= 0:
            raise BadBody(f"AUTH invalid body size {size}")
        stop = start + 4 + size
        self._need(stop, end)
        if client.auth is not None:
            raise Invalid("AUTH already set")
        if self.authorizer is None:
            raise AuthDisabled("AUTH disabled")
        result = self._take_auth_result()
        if result is None:
            raise _Suspend(("auth", buf[start + 4:stop]))
        if isinstance(result, BaseException):
            raise AuthFailed("AUTH failed")
        if not result.authorizations:
            raise Unauthorized("AUTH no authorizations found")
        client.auth = result
        self._respond(encode_frame(FRAME_RESPONSE, result.answer()))
        return stop


class _MpubWalk:
    """An MPUB's messages read one by one, across as many reads (and turns) as they take.

    Only the bytes of the message not yet complete are kept between reads;
    the walk may not run past the body size the MPUB announced, which bounds
    what a client can make nsqd buffer to ``--max-body-size``.  At most
    ``MPUB_TURN`` messages are walked, then queued, per reactor turn; the OK
    comes after the last.

    What is stored: every message is validated, and the topic's room checked
    for all of them, before the first is queued, so an invalid message or a
    full queue stores nothing.  An MPUB of up to ``MPUB_TURN`` messages is then
    stored at once (all or nothing).  A bigger one is stored a turn's share at
    a time, and a refusal between two shares (the queue filled by other
    publishers meanwhile, the topic deleted) answers ``E_MPUB_FAILED`` and
    closes, leaving the shares already stored: as Go's nsqd, whose
    ``PutMessages`` keeps the messages it stored before one failed.
    """

    __slots__ = ("session", "topic", "num", "room", "bodies", "queued")

    def __init__(self, session: V2Session, topic: str, num: int, room: int) -> None:
        self.session = session
        self.topic = topic
        self.num = num
        self.room = room
        self.bodies: list[bytes] = []
        self.queued = 0

    def resume(self, buf: bytes, p: int, end: int, now: float) -> int:
        session = self.session
        max_msg = session._max_msg_size
        bodies = self.bodies
        append = bodies.append
        num = self.num
        budget = MPUB_TURN
        while len(bodies) < num:
            if not budget:
                raise _Yield(keep=p)
            if p + 4 > end:
                raise _Wait(p + 4 - end, keep=p)
            size = _I32(buf, p)[0]
            i = len(bodies)
            if size <= 0:
                raise BadMessage(f"MPUB invalid message({i}) body size {size}")
            if size > max_msg:
                raise BadMessage(f"MPUB message too big {size} > {max_msg}")
            stride = 4 + size
            if stride > self.room:
                raise BadBody(f"MPUB message({i}) body size {size} overruns the announced body size")
            # the messages of this size that are all here already (an MPUB of equal bodies read in
            # parts): checked and cut by C builtins, not one by one
            k = min((end - p) // stride, num - i, budget, self.room // stride)
            if k > 1 and _uniform(buf, p, p + k * stride, stride, k):
                stop = p + k * stride
                bodies.extend(map(_bget, repeat(buf), map(slice, range(p + 4, stop, stride),
                                                          range(stride + p, stop + stride, stride))))
                self.room -= k * stride
                budget -= k
                p = stop
                continue
            budget -= 1
            if p + stride > end:
                raise _Wait(p + stride - end, keep=p)
            append(buf[p + 4:p + 4 + size])
            self.room -= 4 + size
            p += 4 + size
        if num <= MPUB_TURN:
            return session._mpub_done(self.topic, bodies, now, p, None)
        # a huge MPUB: everything is valid; queue it a turn's share at a time
        broker = session.broker
        try:
            if not self.queued:
                broker.get_topic(self.topic, now).check_room(num)
            if self.queued < num:
                if budget < MPUB_TURN:
                    raise _Yield(keep=p)
                chunk = bodies[self.queued:self.queued + MPUB_TURN]
                broker.publish(self.topic, chunk, now)
                self.queued += len(chunk)
                if self.queued < num:
                    raise _Yield(keep=p)
        except BrokerError as e:
            raise MPubFailed(f"MPUB failed {e}") from None
        session.client.published(self.topic, num)
        session._published()
        session._respond(OK_FRAME)
        return p
