"""
Both ends of one replication link (sans-IO): :class:`OriginLink` is the origin's end,
:class:`ShadowReceiver` the peer's.  Bytes in, bytes out; nothing here imports a reactor.

The handshake, with a shared secret (``--replication-secret-file``)::

    origin -> peer   MAGIC, HELLO (its id, epoch, a fresh nonce)
    peer -> origin   HELLO (its id, what it adopted of that epoch, its nonce, its proof)
    origin -> peer   AUTH (the origin's proof)

Each proof is an HMAC-SHA256 of both nonces and both ids (:func:`~wire.proof`): the origin
stores nothing on a peer that cannot prove the secret, and the peer takes no batch, counts no
link (for adoption) and replaces no older link before the origin proved it.  From then on every
frame is sealed (:class:`~wire.Sealer`).  Without a secret (``--replication-insecure``) the
proofs are empty and frames are not sealed; a link between a node with a secret and one
without is refused, saying which.

After the handshake: the origin sends BATCHes (the peer stores each and ACKs), the peer sends
HOLDS (the shadows it holds, see :mod:`.adoption`); a draining origin sends HANDOFF (the peer
adopts it now and answers HANDED) and one going down for maintenance MAINT (the peer does not
adopt it for that long), to a peer whose HELLO says it speaks them; either end sends a BEAT when it sent
nothing else for a while: a link silent for ``--replication-timeout`` is dead, whatever TCP
says (a frozen process, a silent partition, a host gone without a FIN).
"""

from __future__ import annotations

from collections.abc import Callable

from ....protocol import replication as wire

__all__ = ["OriginLink", "ShadowReceiver", "LinkEvents"]

#: the largest frame an origin takes from a peer (HELLO, ACK, HOLDS, BEAT, ERROR)
ORIGIN_MAX_FRAME = 64 * 1024

_ACK_PLAIN = 5 + 8
_ACK_SEALED = 5 + wire.TAG_SIZE + 8


class LinkEvents:
    """What one read of an origin's link brought: the peer's HELLO (once), the sequences it
    acknowledged, its HOLDS (the last of the read), and the bytes to send it back (the AUTH)."""

    __slots__ = ("hello", "acks", "holds", "out", "handed")

    def __init__(self) -> None:
        self.hello: wire.Hello | None = None
        self.acks: list[int] = []
        self.holds: dict[int, int] | None = None
        self.out = b""
        #: the peer's answers to this node's HANDOFFs
        self.handed: list[wire.Handed] = []


class OriginLink:
    """The origin's end of one link: MAGIC and HELLO out, the peer's HELLO (and proof) in,
    AUTH out, then ACKs, HOLDS and BEATs in."""

    def __init__(self, node_id: int, instance: bytes, name: str, epoch: int = 0,
                 secret: bytes | None = None) -> None:
        self.node_id = node_id
        self.instance = instance
        self.secret = secret
        self._decoder = wire.LinkDecoder(max_frame=ORIGIN_MAX_FRAME)
        self.hello: wire.Hello | None = None
        self._nonce = wire.new_nonce()
        self._greeting = wire.MAGIC + wire.encode_hello(node_id, instance, name, epoch, nonce=self._nonce)
        #: seals this link's frames once the handshake is done (None: no secret)
        self.sealer: wire.Sealer | None = None
        self._ack_size = _ACK_PLAIN
        #: the last counter of the HANDOFFs and MAINTs sent (each must grow on a sealed link)
        self._counter = 0

    def start(self) -> bytes:
        return self._greeting

    @property
    def speaks_handoff(self) -> bool:
        """The peer (after its HELLO) speaks HANDOFF, HANDED and MAINT."""
        return self.hello is not None and bool(self.hello.features & wire.FEATURE_HANDOFF)

    def handoff(self, epoch: int) -> tuple[int, list[bytes | memoryview]]:
        """A HANDOFF to send (the peer must :attr:`speaks_handoff`): its counter, which the
        peer's HANDED repeats, and its parts."""
        self._counter += 1
        return self._counter, self.seal(wire.encode_handoff(self._counter, epoch))

    def maintenance(self, seconds: float) -> list[bytes | memoryview]:
        """A MAINT to send: do not adopt this node for ``seconds`` (0: the window is over)."""
        self._counter += 1
        return self.seal(wire.encode_maintenance(self._counter, int(seconds * 1000)))

    def ack(self, data: bytes) -> int | None:
        """The sequence ``data`` acknowledges when it is exactly one ACK after the handshake
        (the commonest read of a link), else None: then :meth:`feed` it."""
        if self.hello is None:
            return None
        if self.sealer is None:
            return self._decoder.ack(data)
        if self._decoder.ack(data, _ACK_SEALED) is None:
            return None
        body = self.sealer.check(wire.ACK, memoryview(data)[5:])
        return int.from_bytes(body, "big")

    def seal(self, frame: bytes) -> list[bytes | memoryview]:
        """``frame`` (a batch, as :class:`ReplicationOrigin` makes it for every peer) as this
        link sends it: sealed when the link has a secret."""
        return [frame] if self.sealer is None else self.sealer.seal(frame)

    def seal_parts(self, parts: list[bytes]) -> list[bytes | memoryview]:
        """:meth:`seal` of a frame given as parts (its head first, as ``encode_batch_parts``)."""
        if self.sealer is None:
            return list(parts)
        body_len = sum(map(len, parts)) - 5
        seq = int.from_bytes(parts[1][:8], "big")
        return [self.sealer.head(wire.BATCH, seq, body_len), *parts[1:]]

    def beat(self) -> list[bytes | memoryview]:
        """A BEAT to send on an idle link."""
        if self.sealer is None:
            return [wire.encode_beat(0)]
        self.sealer.beats += 1
        return self.sealer.seal(wire.encode_beat(self.sealer.beats))

    def feed(self, data: bytes) -> LinkEvents:
        """What ``data`` brought; raises :class:`~nsqtw.protocol.replication.LinkError` for a
        peer speaking something else, refusing us (ERROR), failing to prove the secret (or
        having one when this node has none), or being this very node."""
        ev = LinkEvents()
        if self.hello is not None:
            seq = self.ack(data)
            if seq is not None:
                ev.acks.append(seq)
                return ev
        for kind, body in self._decoder.feed(data):
            if kind == wire.ERROR:
                raise wire.LinkError("peer refused: " + body.decode(errors="replace"))
            if self.hello is None:
                if kind != wire.HELLO:
                    raise wire.LinkError("peer did not answer HELLO")
                ev.hello = self.hello = hello = wire.decode_hello(body)
                ev.out = self._authenticate(hello)
                continue
            if self.sealer is not None:
                body = bytes(self.sealer.check(kind, body))
            if kind == wire.ACK:
                ev.acks.append(wire.decode_ack(body))
            elif kind == wire.HOLDS:
                ev.holds = wire.decode_holds(body)
            elif kind == wire.HANDED:
                ev.handed.append(wire.decode_handed(body))
            elif kind != wire.BEAT:
                raise wire.LinkError(f"unexpected frame type {kind}")
        return ev

    def _authenticate(self, hello: wire.Hello) -> bytes:
        if hello.instance == self.instance:
            raise wire.LinkError("the peer is this node itself")
        if hello.node_id == self.node_id:
            raise wire.LinkError(f"the peer has the same --node-id ({hello.node_id}); "
                                 "replicated nodes need distinct --node-id values")
        if self.secret is None:
            if hello.proves:
                raise wire.LinkError("the peer has a --replication-secret-file and this node has none")
            return wire.encode_auth(b"")
        if not hello.proves:
            raise wire.LinkError("the peer has no --replication-secret-file (it runs --replication-insecure)")
        want = wire.proof(self.secret, b"peer", self._nonce, hello.nonce, self.node_id, hello.node_id)
        if want != hello.proof:
            raise wire.LinkError("the peer could not prove the shared secret (a different "
                                 "--replication-secret-file?)")
        self.sealer = wire.Sealer(wire.session_key(self.secret, self._nonce, hello.nonce))
        return wire.encode_auth(wire.proof(self.secret, b"origin", self._nonce, hello.nonce,
                                           self.node_id, hello.node_id))


class ShadowReceiver:
    """The peer's end of one link: the origin's HELLO and AUTH, then batches to store and
    acknowledge.

    ``store(origin_node_id, batch_body)`` keeps one batch in that origin's shadow (raising
    ``OSError`` when the disk refuses it); ``adopted(origin_node_id, epoch)`` is the highest
    message ID this node adopted of that origin's epoch (:data:`~wire.NO_ID`: none), the
    answer its HELLO carries; ``allowed(origin_node_id)`` says whether this node takes links
    from that node id at all.  :attr:`origin` is set once the origin proved itself (the link
    counts from then on)."""

    def __init__(self, node_id: int, instance: bytes, name: str,
                 store: Callable[[int, bytes | memoryview], None],
                 adopted: Callable[[int, int], bytes] = lambda origin, epoch: wire.NO_ID, *,
                 secret: bytes | None = None, allowed: Callable[[int], bool] = lambda origin: True,
                 max_frame: int = wire.MAX_FRAME) -> None:
        self.adopted = adopted
        self.node_id = node_id
        self.instance = instance
        self.name = name
        self.store = store
        self.secret = secret
        self.allowed = allowed
        self.max_frame = max_frame
        #: the origin, once it proved itself
        self.origin: wire.Hello | None = None
        self._hello: wire.Hello | None = None
        self._nonce = wire.new_nonce()
        self.sealer: wire.Sealer | None = None
        self.closed = False
        self.batches = 0
        self.last_seq = 0
        self._decoder = wire.LinkDecoder(expect_magic=True, max_frame=wire.HANDSHAKE_FRAME)
        #: what the origin asked since the glue last looked, in order, after the batches
        #: before it were stored: ``("handoff", counter, epoch)`` or ``("maintenance", 0,
        #: milliseconds)``
        self.requests: list[tuple[str, int, int]] = []

    @property
    def buffered(self) -> int:
        return self._decoder.buffered

    def feed(self, data: bytes) -> bytes:
        """Bytes to answer; :attr:`closed` once the link must close (after the answer)."""
        if self.closed:
            return b""
        origin = self.origin
        if origin is not None and len(data) > 13:
            view = self._decoder.one(data, wire.BATCH)
            if view is not None and len(view) >= 8:  # one whole batch: store it, ACK it
                try:
                    if self.sealer is not None:
                        view = self.sealer.check(wire.BATCH, view)  # type: ignore[assignment]  # a view of a view
                    self.store(origin.node_id, view)
                except OSError as e:
                    return self._refuse(f"E_STORE_FAILED {e}")
                except wire.LinkError as e:
                    return self._refuse(f"E_BAD_PROTOCOL {e}")
                self.batches += 1
                self.last_seq = seq = int.from_bytes(view[:8], "big")
                return self._ack(seq)
        out: list[bytes] = []
        try:
            while self.origin is None:  # the handshake, a frame at a time (its limit is lower)
                frames = self._decoder.feed(data, 1)
                data = b""
                if not frames:
                    return b"".join(out)
                out.append(self._handshake(*frames[0]))
                if self.closed:
                    return b"".join(out)
            frames = self._decoder.feed(data)
        except wire.LinkError as e:
            return b"".join(out) + self._refuse(f"E_BAD_PROTOCOL {e}")
        acked = 0
        origin = self.origin
        for kind, body in frames:
            if self.sealer is not None:
                try:
                    body = self.sealer.check(kind, body)  # type: ignore[assignment]  # a view of it: stored uncopied
                except wire.LinkError as e:
                    return b"".join(out) + self._refuse(f"E_BAD_PROTOCOL {e}")
            if kind == wire.BATCH:
                if len(body) < 8:
                    return b"".join(out) + self._refuse("E_BAD_PROTOCOL malformed BATCH")
                seq = int.from_bytes(body[:8], "big")
                try:
                    self.store(origin.node_id, body)
                except OSError as e:
                    return b"".join(out) + self._refuse(f"E_STORE_FAILED {e}")
                except wire.LinkError as e:
                    return b"".join(out) + self._refuse(f"E_BAD_PROTOCOL {e}")
                self.batches += 1
                self.last_seq = acked = seq
            elif kind == wire.HANDOFF or kind == wire.MAINT:
                try:
                    if kind == wire.HANDOFF:
                        self.requests.append(("handoff", *wire.decode_handoff(body)))
                    else:
                        self.requests.append(("maintenance", 0, wire.decode_maintenance(body)[1]))
                except wire.LinkError as e:
                    return b"".join(out) + self._refuse(f"E_BAD_PROTOCOL {e}")
            elif kind != wire.BEAT:
                return b"".join(out) + self._refuse(f"E_BAD_PROTOCOL unexpected frame type {kind}")
        if acked:
            out.append(self._ack(acked))  # one ACK covers every batch of this read
        return b"".join(out)

    def _handshake(self, kind: int, body: bytes) -> bytes:
        hello = self._hello
        if hello is None:
            if kind != wire.HELLO:
                return self._refuse("E_BAD_PROTOCOL expected HELLO")
            try:
                hello = wire.decode_hello(body)
            except wire.LinkError as e:
                return self._refuse(f"E_BAD_PROTOCOL {e}")
            if hello.instance == self.instance:
                return self._refuse("E_SAME_NODE this is the node itself")
            if hello.node_id == self.node_id:
                return self._refuse(f"E_SAME_NODE_ID both nodes have --node-id={self.node_id}")
            if not self.allowed(hello.node_id):
                return self._refuse(f"E_UNKNOWN_NODE node {hello.node_id} is not one this node replicates for")
            self._hello = hello
            proof = (wire.proof(self.secret, b"peer", hello.nonce, self._nonce, hello.node_id, self.node_id)
                     if self.secret is not None else bytes(32))
            return wire.encode_hello(self.node_id, self.instance, self.name, 0,
                                     self.adopted(hello.node_id, hello.epoch), self._nonce, proof)
        if kind != wire.AUTH:
            return self._refuse("E_BAD_PROTOCOL expected AUTH")
        if self.secret is None:
            if body:
                return self._refuse("E_AUTH_FAILED this node has no --replication-secret-file "
                                    "(it runs --replication-insecure)")
        else:
            if not body:
                return self._refuse("E_AUTH_FAILED this node requires the shared secret "
                                    "(--replication-secret-file)")
            want = wire.proof(self.secret, b"origin", hello.nonce, self._nonce, hello.node_id, self.node_id)
            if body != want:
                return self._refuse("E_AUTH_FAILED the origin could not prove the shared secret")
            self.sealer = wire.Sealer(wire.session_key(self.secret, hello.nonce, self._nonce))
        self.origin = hello
        self._decoder.max_frame = self.max_frame
        return b""

    def _ack(self, seq: int) -> bytes:
        if self.sealer is None:
            return wire.encode_ack(seq)
        return self.sealer.head(wire.ACK, seq, 8) + seq.to_bytes(8, "big")

    def beat(self) -> bytes:
        """A BEAT to send on an idle link (after the handshake)."""
        if self.sealer is None:
            return wire.encode_beat(0)
        self.sealer.beats += 1
        return b"".join(self.sealer.seal(wire.encode_beat(self.sealer.beats)))

    def handed(self, counter: int, ok: bool, adopted: bytes = wire.NO_ID, count: int = 0, reason: str = "") -> bytes:
        """A HANDED to send: the answer to the origin's HANDOFF ``counter``."""
        frame = wire.encode_handed(counter, ok, adopted, count, reason)
        return frame if self.sealer is None else b"".join(self.sealer.seal(frame))

    def holds(self, holds: dict[int, int]) -> bytes:
        """A HOLDS frame to send (after the handshake)."""
        frame = wire.encode_holds(holds)
        return frame if self.sealer is None else b"".join(self.sealer.seal(frame))

    def _refuse(self, text: str) -> bytes:
        self.closed = True
        return wire.encode_error(text)
