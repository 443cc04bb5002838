"""
nsqtw's replication link codec (sans-IO): an nsqtw-only protocol, never spoken to NSQ clients.

An origin nsqd connects to each ``--replica-peer``'s ``--replication-address`` and sends
:data:`MAGIC`; then both sides send frames::

    [u32 size][u8 type][body: size - 1 bytes]

``HELLO``  u16 version, u16 node id, 16-byte instance token, u64 epoch, 16-byte adopted ID,
           16-byte nonce, 32-byte proof, utf-8 name.  An origin sends its epoch (a number
           kept in its data path, renewed when an adoption of its backlog was reported to it),
           16 zero bytes and no proof (zeros); a peer answers with the highest message ID of
           that origin's epoch it adopted (16 zero bytes: it did not adopt that epoch) and,
           when it has a shared secret, its proof (:func:`proof`) of both nonces
``AUTH``   the origin's proof of both nonces (empty without a secret): the handshake's last
           frame; a peer takes no batch before it
``BATCH``  u64 sequence, u32 count, then count items, in the order they happened:
           ``[u8 kind][u16 length][topic][u16 length][channel][i64 due][u32 length][data]``

           * ``MSG``: published messages; ``due`` in ns since the epoch (0: deliver now),
             ``data`` the message frames exactly as nsqd stores them (size, type,
             timestamp, attempts, ID, body)
           * ``TOPIC_NEW``, ``TOPIC_DEL``, ``CHANNEL_NEW``, ``CHANNEL_DEL``: no data
           * ``FIN``: ``data`` what a channel finished as ranges of IDs: 32 bytes each, the
             first and the last ID of a run of consecutive IDs (the IDs of one origin are
             increasing 64-bit integers in 16 hex digits, so a consumer finishing in publish
             order sends one range per batch of messages)
           * ``REQ``: ``data`` 24 bytes each: an ID a channel requeued and its new due
             time (i64 ns since the epoch)
           * ``PAUSE``, ``UNPAUSE``, ``EMPTY``: of a channel, or of the topic when ``channel``
             is empty; in order with the creations and deletions
           * ``SNAP_BEGIN`` (``data`` the origin's u64 epoch) ... ``SNAP_END`` (``data`` the
             highest ID in the snapshot, or nothing): a catch-up snapshot of everything the
             origin has not finished; the peer replaces its shadow of the origin with it once
             ``SNAP_END`` is stored (a snapshot cut short leaves the old shadow in place)
           * ``SNAP_MSG``: messages held by exactly one channel (``channel``), or by the topic's
             own queue (``channel`` empty: the channels there are when it moves get it)
``ACK``    u64 sequence: every batch up to it is stored in the peer's shadow log
``BEAT``   u64 counter: sent by either end of a link that sent nothing else for a second
``HOLDS``  (peer to origin) the origins whose shadow this peer holds: ``[u16 node id][u8 state]``
           each (:data:`HELD`, or :data:`ADOPTED` once it adopted that origin and its own
           peers stored what it adopted)
``ERROR``  utf-8 text; the sender closes the link after it
``HANDOFF`` (origin to peer) u64 counter, u64 epoch: a draining origin asks the peer to adopt
           its shadow now (everything before it on the link is stored first)
``HANDED`` (peer to origin) u64 counter (the HANDOFF's), u8 status (0: adopted, 1: refused),
           16-byte highest ID adopted, u32 messages adopted, utf-8 reason (when refused)
``MAINT``  (origin to peer) u64 counter, u64 milliseconds: do not adopt this origin for that
           long, counted on the peer's own clock (0: the window is over)

The three last are sent only to a node whose HELLO carries :data:`FEATURE_HANDOFF` in its
feature byte: a NUL and one byte after the HELLO's name (a node without them would read both as
part of the name, which it only logs).

With a shared secret, every frame after the handshake is sealed: 16 bytes between the frame's
type and its body, a keyed BLAKE2b (:func:`seal_tag`, keyed by :func:`session_key` of the
secret and both nonces) of its type, its sequence (a BATCH's or ACK's, a BEAT's counter) and
its length.  A receiver refuses a frame whose tag is wrong or whose sequence does not grow, so
nobody without the secret can open a link, inject a batch or an acknowledgement into one, or
replay one (the bodies' bytes are protected against a party on the path by TLS, not by the tag).

:class:`LinkDecoder` turns received bytes into ``(type, body)`` pairs and refuses a peer
that speaks anything else (:class:`LinkError`).  The shadow log (a peer's per-origin file,
:func:`shadow_record` / :func:`read_shadow_records`) stores each batch body as received.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
from collections.abc import Iterator, Sequence
from typing import TypeVar, cast

__all__ = [
    "MAGIC", "VERSION", "HELLO", "BATCH", "ACK", "ERROR", "AUTH", "BEAT", "HOLDS", "HELD", "ADOPTED",
    "MAX_FRAME", "HANDSHAKE_FRAME", "TAG_SIZE", "new_nonce", "proof", "session_key", "seal_tag", "Sealer",
    "encode_auth", "encode_holds", "decode_holds",
    "MSG", "TOPIC_NEW", "TOPIC_DEL", "CHANNEL_NEW", "CHANNEL_DEL", "FIN", "REQ",
    "PAUSE", "UNPAUSE", "EMPTY", "SNAP_BEGIN", "SNAP_END", "SNAP_MSG", "POLICY", "DEAD", "NO_ID", "epoch_data", "fin_data", "fin_ids",
    "LinkError", "LinkDecoder", "Hello", "Entry", "message_entry", "req_data", "split_req",
    "encode_frame", "encode_hello", "decode_hello", "encode_batch", "encode_batch_parts", "decode_batch",
    "encode_ack", "decode_ack", "encode_error", "encode_beat",
    "shadow_record", "shadow_record_head", "read_shadow_records", "shadow_records_at", "shadow_records_placed",
    "shadow_pad",
    "SHADOW_PAD", "split_frames",
    "HANDOFF", "HANDED", "MAINT", "FEATURE_HANDOFF", "FEATURES", "HANDED_OK", "HANDED_REFUSED",
    "encode_handoff", "decode_handoff", "encode_handed", "decode_handed", "Handed",
    "encode_maintenance", "decode_maintenance",
]

MAGIC = b"  NSQTWR1"
VERSION = 4

HELLO = 1
BATCH = 2
ACK = 3
ERROR = 4
AUTH = 5
BEAT = 6
HOLDS = 7
HANDOFF = 8
HANDED = 9
MAINT = 10
_TYPES = frozenset((HELLO, BATCH, ACK, ERROR, AUTH, BEAT, HOLDS, HANDOFF, HANDED, MAINT))

#: a HELLO's feature bits: the node speaks HANDOFF, HANDED and MAINT
FEATURE_HANDOFF = 1
#: what this node's HELLO says it speaks
FEATURES = FEATURE_HANDOFF

#: a HANDED's status
HANDED_OK = 0
HANDED_REFUSED = 1

#: the states of a HOLDS item
HELD = 0
ADOPTED = 1

# the kinds of BATCH items
MSG = 0
TOPIC_NEW = 1
TOPIC_DEL = 2
CHANNEL_NEW = 3
CHANNEL_DEL = 4
FIN = 5
REQ = 6
PAUSE = 7
UNPAUSE = 8
EMPTY = 9
SNAP_BEGIN = 10
SNAP_END = 11
SNAP_MSG = 12
#: a channel's policy (nsqtw.nsqd.core.policy): ``data`` its stored record as JSON, empty for none
POLICY = 13
#: messages that died on a channel (its policy gave up on them): ``data`` their frames
DEAD = 14
_KINDS = frozenset(range(MSG, DEAD + 1))

#: the adopted ID of a HELLO that reports no adoption
NO_ID = bytes(16)

#: the largest frame a link accepts by default: a batch is cut at about 4 MiB by the sender
#: (:data:`~nsqtw.nsqd.core.replication.SNAPSHOT_BATCH_BYTES`), plus one publish of up to
#: ``--max-body-size`` that may end it; a peer sets its own limit from its options
MAX_FRAME = 16 * 1024 * 1024
#: the largest frame before the handshake is done (a HELLO, an AUTH, an ERROR)
HANDSHAKE_FRAME = 4096
#: bytes of a sealed frame's tag
TAG_SIZE = 16

_HEAD = struct.Struct(">IB")
_HELLO = struct.Struct(">HH16sQ16s16s32s")
_NO_PROOF = bytes(32)
_SEQ = struct.Struct(">Q")
_BATCH_HEAD = struct.Struct(">QI")
#: a BATCH frame's head and the batch's (sequence, item count)
_HEAD_SEQ_ONE = struct.Struct(">IBQI")
_U16 = struct.Struct(">H")
_ENTRY_MID = struct.Struct(">qI")
_KIND_LEN = struct.Struct(">BH")
_REQ = struct.Struct(">16sq")
_U32 = struct.Struct(">I")
#: a whole ACK frame (size, type, sequence): packed in one step, once per batch
_ACK_FRAME = struct.Struct(">IBQ")


class LinkError(ValueError):
    """The peer does not speak this protocol (or sent a malformed frame)."""


class Hello:
    """Who is at the other end of a link."""

    __slots__ = ("version", "node_id", "instance", "name", "epoch", "adopted", "nonce", "proof", "features")

    def __init__(self, version: int, node_id: int, instance: bytes, name: str,
                 epoch: int = 0, adopted: bytes = NO_ID, nonce: bytes = bytes(16),
                 proof: bytes = _NO_PROOF, features: int = 0) -> None:
        self.version = version
        self.node_id = node_id
        self.instance = instance
        self.name = name
        self.epoch = epoch
        #: (a peer's answer) the highest ID of the origin's epoch it adopted; NO_ID: none
        self.adopted = adopted
        #: the sender's fresh random bytes for this link
        self.nonce = nonce
        #: (a peer's answer) its proof of the secret (zeros: it has none)
        self.proof = proof
        #: what the sender speaks beyond the version's frames (:data:`FEATURE_HANDOFF`)
        self.features = features

    @property
    def proves(self) -> bool:
        """It carries a proof (its sender has a secret)."""
        return self.proof != _NO_PROOF


def new_nonce() -> bytes:
    return os.urandom(16)


def proof(secret: bytes, role: bytes, origin_nonce: bytes, peer_nonce: bytes, origin_id: int, peer_id: int) -> bytes:
    """HMAC-SHA256 of both nonces and node ids, by ``role`` (``b"origin"`` or ``b"peer"``): what
    one end sends to show the other it holds the shared secret (each side's proof differs, and
    both nonces are fresh per link, so neither can be replayed)."""
    msg = b"nsqtw-replication " + role + origin_nonce + peer_nonce + struct.pack(">HH", origin_id, peer_id)
    return hmac.digest(secret, msg, "sha256")


def session_key(secret: bytes, origin_nonce: bytes, peer_nonce: bytes) -> bytes:
    """The key a link's frames are sealed with (:func:`seal_tag`): of the secret and this
    link's nonces, so a tag made on one link is worth nothing on another."""
    return hmac.digest(secret, b"nsqtw-replication key" + origin_nonce + peer_nonce, "sha256")


_TAG_INPUT = struct.Struct(">BQI")


def seal_tag(key: bytes, kind: int, seq: int, length: int) -> bytes:
    """A sealed frame's tag: a keyed BLAKE2b of its type, sequence and body length."""
    return hashlib.blake2b(_TAG_INPUT.pack(kind, seq, length), key=key, digest_size=TAG_SIZE).digest()


class Sealer:
    """One end of a sealed link: tags the frames it sends (:meth:`head`) and checks those it
    receives (:meth:`check`), each direction's sequences growing."""

    __slots__ = ("_mac", "last_in", "beats")

    def __init__(self, key: bytes) -> None:
        self._mac = hashlib.blake2b(key=key, digest_size=TAG_SIZE)
        #: the highest sequence received per type (a frame must grow it)
        self.last_in: dict[int, int] = {}
        #: BEATs sent (their counter)
        self.beats = 0

    def tag(self, kind: int, seq: int, length: int) -> bytes:
        mac = self._mac.copy()
        mac.update(_TAG_INPUT.pack(kind, seq, length))
        return mac.digest()

    def head(self, kind: int, seq: int, length: int) -> bytes:
        """A sealed frame's head (size, type, tag) for a body of ``length`` bytes."""
        return _HEAD.pack(length + 1 + TAG_SIZE, kind) + self.tag(kind, seq, length)

    def seal(self, frame: bytes | memoryview) -> list[bytes | memoryview]:
        """A plain frame (:func:`encode_batch`, :func:`encode_ack`...) as the parts of the same
        frame sealed: a new head, then the body uncopied."""
        view = memoryview(frame)
        kind = view[4]
        body = view[_HEAD.size:]
        seq = _SEQ.unpack_from(body)[0] if kind != HOLDS and len(body) >= 8 else 0
        return [self.head(kind, seq, len(body)), body]

    def check(self, kind: int, tagged: bytes | memoryview) -> bytes | memoryview:
        """The body of a received sealed frame (``tagged``: its tag, then its body); raises
        :class:`LinkError` when the tag is wrong or its sequence does not grow."""
        n = len(tagged) - TAG_SIZE
        if n < 0:
            raise LinkError("sealed frame too short")
        seq = _SEQ.unpack_from(tagged, TAG_SIZE)[0] if kind != HOLDS and n >= 8 else 0
        mac = self._mac.copy()
        mac.update(_TAG_INPUT.pack(kind, seq, n))
        if not hmac.compare_digest(mac.digest(), tagged[:TAG_SIZE]):
            raise LinkError(f"bad seal on a frame of type {kind}")
        body = tagged[TAG_SIZE:]
        if kind != HOLDS and kind != ERROR:
            if seq <= self.last_in.get(kind, -1):
                raise LinkError(f"replayed frame of type {kind} (sequence {seq})")
            self.last_in[kind] = seq
        return body


#: one BATCH item: (kind, topic, channel, due in ns since the epoch or 0, data)
Entry = tuple[int, str, str, int, bytes]


def message_entry(topic: str, due: int, frames: bytes) -> Entry:
    return (MSG, topic, "", due, frames)


def req_data(items: Sequence[tuple[bytes, int]]) -> bytes:
    return b"".join(_REQ.pack(mid, due) for mid, due in items)


_HEX16 = b"%016x".__mod__


def fin_data(ids: Sequence[bytes]) -> bytes:
    """FIN ``data`` for a channel's finished IDs: sorted, consecutive ones as one range."""
    try:
        nums = sorted(set(int(m, 16) for m in ids))
    except ValueError:  # not hex (not an nsqd's ID): each ID a range of its own
        return b"".join(m + m for m in ids)
    out = []
    lo = hi = nums[0] if nums else 0
    for n in nums[1:]:
        if n == hi + 1:
            hi = n
            continue
        out.append(_HEX16(lo) + _HEX16(hi))
        lo = hi = n
    if nums:
        out.append(_HEX16(lo) + _HEX16(hi))
    return b"".join(out)


def fin_ids(data: bytes) -> Iterator[bytes]:
    """Every ID of FIN ``data`` (its ranges expanded)."""
    for i in range(0, len(data) - 31, 32):
        lo = data[i:i + 16]
        hi = data[i + 16:i + 32]
        if lo == hi:
            yield lo
            continue
        try:
            a, b = int(lo, 16), int(hi, 16)
        except ValueError:
            raise LinkError("malformed FIN range") from None
        if b < a or b - a > 1 << 24:
            raise LinkError("malformed FIN range")
        yield from map(_HEX16, range(a, b + 1))


def split_req(data: bytes) -> list[tuple[bytes, int]]:
    return [(bytes(m), int(d)) for m, d in _REQ.iter_unpack(data)]


def encode_frame(kind: int, body: bytes) -> bytes:
    return _HEAD.pack(len(body) + 1, kind) + body


def epoch_data(epoch: int) -> bytes:
    return _SEQ.pack(epoch)


def encode_hello(node_id: int, instance: bytes, name: str, epoch: int = 0, adopted: bytes = NO_ID,
                 nonce: bytes = bytes(16), proof: bytes = _NO_PROOF, features: int = FEATURES) -> bytes:
    trailer = b"\0" + bytes((features,)) if features else b""
    return encode_frame(HELLO, _HELLO.pack(VERSION, node_id, instance, epoch, adopted, nonce, proof)
                        + name.encode().replace(b"\0", b"")[:1024] + trailer)


def decode_hello(body: bytes | memoryview) -> Hello:
    if len(body) >= 2 and _U16.unpack_from(body)[0] != VERSION:
        raise LinkError(f"unsupported replication protocol version {_U16.unpack_from(body)[0]} "
                        f"(this node speaks {VERSION}: run the same nsqtw release on both)")
    if len(body) < _HELLO.size:
        raise LinkError("short HELLO")
    version, node_id, instance, epoch, adopted, nonce, proof_ = _HELLO.unpack_from(body)
    raw, _, trailer = bytes(body[_HELLO.size:]).partition(b"\0")
    try:
        name = raw.decode()
    except UnicodeDecodeError:
        raise LinkError("HELLO name is not utf-8") from None
    return Hello(version, node_id, instance, name, epoch, adopted, nonce, proof_, trailer[0] if trailer else 0)


def encode_auth(proof_: bytes) -> bytes:
    return encode_frame(AUTH, proof_)


def encode_beat(counter: int) -> bytes:
    return encode_frame(BEAT, _SEQ.pack(counter))


_HOLD = struct.Struct(">HB")


def encode_holds(holds: dict[int, int]) -> bytes:
    return encode_frame(HOLDS, b"".join(_HOLD.pack(o, st) for o, st in sorted(holds.items())))


def decode_holds(body: bytes | memoryview) -> dict[int, int]:
    if len(body) % _HOLD.size:
        raise LinkError("malformed HOLDS")
    return {o: st for o, st in _HOLD.iter_unpack(body)}


_HANDOFF = struct.Struct(">QQ")
_HANDED = struct.Struct(">QB16sI")


def encode_handoff(counter: int, epoch: int) -> bytes:
    return encode_frame(HANDOFF, _HANDOFF.pack(counter, epoch))


def decode_handoff(body: bytes | memoryview) -> tuple[int, int]:
    """``(counter, epoch)`` of a HANDOFF."""
    if len(body) != _HANDOFF.size:
        raise LinkError("malformed HANDOFF")
    counter, epoch = _HANDOFF.unpack(body)
    return int(counter), int(epoch)


class Handed:
    """A peer's answer to a HANDOFF."""

    __slots__ = ("counter", "ok", "adopted", "count", "reason")

    def __init__(self, counter: int, ok: bool, adopted: bytes, count: int, reason: str = "") -> None:
        self.counter = counter
        self.ok = ok
        #: the highest message ID the peer adopted (NO_ID: none)
        self.adopted = adopted
        #: messages it adopted
        self.count = count
        self.reason = reason


def encode_handed(counter: int, ok: bool, adopted: bytes = NO_ID, count: int = 0, reason: str = "") -> bytes:
    return encode_frame(HANDED, _HANDED.pack(counter, HANDED_OK if ok else HANDED_REFUSED, adopted, count)
                        + reason.encode()[:1024])


def decode_handed(body: bytes | memoryview) -> Handed:
    if len(body) < _HANDED.size:
        raise LinkError("malformed HANDED")
    counter, status, adopted, count = _HANDED.unpack_from(body)
    if status not in (HANDED_OK, HANDED_REFUSED):
        raise LinkError(f"malformed HANDED (status {status})")
    return Handed(counter, status == HANDED_OK, bytes(adopted), count,
                  bytes(body[_HANDED.size:]).decode(errors="replace"))


def encode_maintenance(counter: int, milliseconds: int) -> bytes:
    return encode_frame(MAINT, _HANDOFF.pack(counter, max(0, milliseconds)))


def decode_maintenance(body: bytes | memoryview) -> tuple[int, int]:
    """``(counter, milliseconds)`` of a MAINT."""
    if len(body) != _HANDOFF.size:
        raise LinkError("malformed MAINT")
    counter, ms = _HANDOFF.unpack(body)
    return int(counter), int(ms)


#: (kind, topic, channel) -> the entry head's bytes before its due time (a replicated
#: publish encodes its topic's once, not per batch); cleared when it grows past
#: _NAMES_MAX (names made up by a client cannot grow it without bound)
_NAMES: dict[tuple[int, str, str], bytes] = {}
_NAMES_MAX = 4096


def _names(kind: int, topic: str, channel: str) -> bytes:
    key = (kind, topic, channel)
    head = _NAMES.get(key)
    if head is None:
        if len(_NAMES) >= _NAMES_MAX:
            _NAMES.clear()
        name = topic.encode()
        ch = channel.encode()
        head = _NAMES[key] = _KIND_LEN.pack(kind, len(name)) + name + _U16.pack(len(ch)) + ch
    return head


def _batch_parts(seq: int, entries: Sequence[Entry]) -> list[bytes]:
    """The batch's bytes in parts: two per entry (its head, then its data uncopied)."""
    parts = [_BATCH_HEAD.pack(seq, len(entries))]
    append = parts.append
    names = _NAMES
    mid = _ENTRY_MID.pack
    for kind, topic, channel, due, data in entries:
        head = names.get((kind, topic, channel))
        if head is None:
            head = _names(kind, topic, channel)
        append(head + mid(due, len(data)))
        append(data)
    return parts


def batch_body(seq: int, entries: Sequence[Entry]) -> bytes:
    return b"".join(_batch_parts(seq, entries))


def encode_batch(seq: int, entries: Sequence[Entry]) -> bytes:
    """A BATCH frame, joined once (the messages' bytes are copied one time, not twice)."""
    if len(entries) == 1:  # a live batch of one publish: the commonest
        kind, topic, channel, due, data = entries[0]
        head = _NAMES.get((kind, topic, channel))
        if head is None:
            head = _names(kind, topic, channel)
        size = len(data)
        return b"".join((_HEAD_SEQ_ONE.pack(_BATCH_HEAD.size + len(head) + _ENTRY_MID.size + size + 1, BATCH,
                                            seq, 1), head, _ENTRY_MID.pack(due, size), data))
    parts = _batch_parts(seq, entries)
    parts.insert(0, _HEAD.pack(sum(map(len, parts)) + 1, BATCH))
    return b"".join(parts)


def encode_batch_parts(seq: int, entries: Sequence[Entry]) -> list[bytes]:
    """:func:`encode_batch`'s bytes as parts, to be sent without joining them (``sendmsg``)."""
    parts = _batch_parts(seq, entries)
    parts.insert(0, _HEAD.pack(sum(map(len, parts)) + 1, BATCH))
    return parts


#: a BATCH body as bytes, or as a view of the frame it came in (a peer's read: see
#: :meth:`LinkDecoder.one`); :func:`decode_batch`'s items are slices of the same type
_Body = TypeVar("_Body", bytes, memoryview)


def decode_batch(body: _Body, positions: list[int] | None = None) -> tuple[int, list[tuple[int, str, str, int, _Body]]]:
    """The sequence and items of a BATCH body, checked whole.  A memoryview body gives items
    whose data are views of it, copied nowhere (a peer checks and appends a batch before it
    acknowledges it).  ``positions``, when given, gets where each item's data starts in
    ``body`` (to find the same data in another copy of it: the peer's log)."""
    try:
        seq, count = _BATCH_HEAD.unpack_from(body)
        pos = _BATCH_HEAD.size
        out: list[tuple[int, str, str, int, _Body]] = []
        for _ in range(count):
            kind, n = _KIND_LEN.unpack_from(body, pos)
            if kind not in _KINDS:
                raise LinkError(f"unknown BATCH item kind {kind}")
            pos += 3
            topic = str(body[pos:pos + n], "utf-8")
            pos += n
            (n,) = _U16.unpack_from(body, pos)
            pos += 2
            channel = str(body[pos:pos + n], "utf-8")
            pos += n
            due, size = _ENTRY_MID.unpack_from(body, pos)
            pos += _ENTRY_MID.size
            if pos + size > len(body):
                raise LinkError("truncated BATCH entry")
            if positions is not None:
                positions.append(pos)
            out.append((kind, topic, channel, due, body[pos:pos + size]))
            pos += size
    except (struct.error, UnicodeDecodeError):
        raise LinkError("malformed BATCH") from None
    if pos != len(body):
        raise LinkError("trailing bytes after BATCH entries")
    return seq, out


def encode_ack(seq: int) -> bytes:
    return _ACK_FRAME.pack(_SEQ.size + 1, ACK, seq)


#: the first five bytes of every ACK frame, and its whole size (the origin reads one ACK
#: per batch: :meth:`LinkDecoder.ack` takes it without the general frame walk)
ACK_HEAD = _HEAD.pack(_SEQ.size + 1, ACK)
ACK_FRAME_SIZE = _HEAD.size + _SEQ.size


def decode_ack(body: bytes) -> int:
    if len(body) != _SEQ.size:
        raise LinkError("malformed ACK")
    return int(_SEQ.unpack(body)[0])


def encode_error(text: str) -> bytes:
    return encode_frame(ERROR, text.encode())


def split_frames(frames: bytes) -> Iterator[bytes]:
    """Each stored message frame of an entry (size-prefixed, as nsqd stores them)."""
    pos = 0
    end = len(frames)
    while pos + 4 <= end:
        (size,) = _U32.unpack_from(frames, pos)
        yield frames[pos:pos + 4 + size]
        pos += 4 + size
    if pos != end:
        raise LinkError("truncated message frame")


class LinkDecoder:
    """Bytes in, ``(type, body)`` frames out; optionally expecting :data:`MAGIC` first.

    A frame larger than :attr:`max_frame` is refused as soon as its head is read.  Bytes of a
    frame not complete yet are gathered in one growing buffer (appended to, never copied
    whole at every read), and cut once per read that completes frames."""

    __slots__ = ("_buf", "_want_magic", "max_frame")

    def __init__(self, expect_magic: bool = False, max_frame: int = MAX_FRAME) -> None:
        self._buf = bytearray()
        self._want_magic = expect_magic
        self.max_frame = max_frame

    @property
    def buffered(self) -> int:
        """Bytes received and not yet part of a whole frame."""
        return len(self._buf)

    def feed(self, data: bytes, max_frames: int = 1 << 62) -> list[tuple[int, bytes]]:
        """The whole frames received so far (at most ``max_frames``: the rest stays buffered,
        for a link whose limit changes after a frame: the handshake's last)."""
        buf = self._buf
        if buf:
            buf += data
            data = buf  # type: ignore[assignment]  # a bytearray, read through the same calls
        if self._want_magic:
            if len(data) < len(MAGIC):
                if not MAGIC.startswith(bytes(data)):
                    raise LinkError("bad magic")
                if not buf:
                    buf += data
                return []
            if data[:len(MAGIC)] != MAGIC:
                raise LinkError("bad magic")
            self._want_magic = False
            data = data[len(MAGIC):]
            buf.clear()
        out: list[tuple[int, bytes]] = []
        pos = 0
        end = len(data)
        limit = self.max_frame
        while end - pos >= _HEAD.size:
            size, kind = _HEAD.unpack_from(data, pos)
            if size < 1 or size > limit or kind not in _TYPES:
                raise LinkError(f"not a replication frame (size {size}, type {kind})"
                                if size <= limit or kind not in _TYPES else
                                f"frame of {size} bytes is over this link's limit of {limit}")
            stop = pos + 4 + size
            if stop > end:
                break
            out.append((kind, bytes(memoryview(data)[pos + 5:stop])))  # one copy (not two) out of a buffer
            pos = stop
            if len(out) == max_frames:
                break
        if data is buf:
            del buf[:pos]
        elif pos < end:
            buf += data[pos:]
        return out

    def one(self, data: bytes, kind: int) -> memoryview | None:
        """The body of ``data`` when it is exactly one whole frame of ``kind`` and nothing is
        buffered (a peer's commonest read: one BATCH), else None: then :meth:`feed` it.  The
        body is a view of ``data``, not a copy."""
        if self._buf or self._want_magic or len(data) <= _HEAD.size or data[4] != kind:
            return None
        size = _U32.unpack_from(data)[0]
        if size + 4 != len(data) or size > self.max_frame:
            return None
        return memoryview(data)[_HEAD.size:]

    def ack(self, data: bytes, size: int = _HEAD.size + _SEQ.size) -> int | None:
        """The sequence of ``data`` when it is exactly one ACK frame of ``size`` bytes (a sealed
        one is :data:`TAG_SIZE` longer) and nothing is buffered (the commonest read of an
        origin's link), else None: then :meth:`feed` it."""
        if self._buf or self._want_magic or len(data) != size or data[4] != ACK:
            return None
        return int.from_bytes(data[size - 8:], "big")


# --- the shadow log: a peer's per-origin file of batches ------------------------------


def shadow_record(batch: bytes) -> bytes:
    """One shadow log record: a received BATCH body, length-prefixed."""
    return _U32.pack(len(batch)) + batch


def shadow_record_head(batch: bytes | memoryview) -> bytes:
    """The prefix of :func:`shadow_record`, to write before the body without joining them."""
    return _U32.pack(len(batch))


#: a shadow log record's length with this bit set is padding: that many bytes (the bit
#: cleared) follow and are skipped (the log's writer starts a record at the next mapped window
#: rather than across two); a length of 0 is the end of the log (the rest is not written yet)
SHADOW_PAD = 0x80000000


def shadow_pad(n: int) -> bytes:
    """The head of a padding record of ``n`` bytes after it (they are left as they are)."""
    return _U32.pack(SHADOW_PAD | n)


def read_shadow_records(data: bytes | memoryview) -> Iterator[tuple[int, list[Entry]]]:
    """Each whole batch of a shadow log (a record cut short by a crash, or a length of 0,
    ends the log; padding records are skipped).  A memoryview gives items whose data are
    views of it."""
    for _, seq, entries in shadow_records_at(data):
        yield seq, entries


def shadow_records_at(data: bytes | memoryview) -> Iterator[tuple[int, int, list[Entry]]]:
    """:func:`read_shadow_records` with where each record ends: ``(end, seq, items)``.  A
    record whose body cannot be read is skipped (by its length): the writer pre-extends the
    file, so a record cut short by a crash is followed by zeros (the end) rather than by the
    end of the file."""
    for end, seq, entries, _ in shadow_records_placed(data):
        yield end, seq, entries


def shadow_records_placed(data: bytes | memoryview) -> Iterator[tuple[int, int, list[Entry], list[int]]]:
    """:func:`shadow_records_at` with where each item's data starts in ``data``:
    ``(end, seq, items, starts)`` (a peer replaying its log finds its messages there)."""
    pos = 0
    end = len(data)
    while pos + 4 <= end:
        (size,) = _U32.unpack_from(data, pos)
        if size & SHADOW_PAD:
            pos += 4 + (size & ~SHADOW_PAD)
            continue
        if size == 0 or pos + 4 + size > end:
            return
        starts: list[int] = []
        try:
            if isinstance(data, memoryview):
                seq, views = decode_batch(data[pos + 4:pos + 4 + size], starts)
                entries = cast(list[Entry], views)  # items of a view are read-only views, used as bytes are
            else:
                seq, entries = decode_batch(data[pos + 4:pos + 4 + size], starts)
        except LinkError:
            pos += 4 + size
            continue
        body = pos + 4
        pos += 4 + size
        yield pos, seq, entries, [body + p for p in starts]
