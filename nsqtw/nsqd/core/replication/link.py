"""
Both ends of one replication link (sans-IO): :class:`OriginLink` is the origin's end (HELLO,
then ACKs back); :class:`ShadowReceiver` is the peer's end: it checks the origin is another
node, hands each batch to the origin's shadow (through an injected ``store``) and acknowledges
it.  Bytes in, bytes out; nothing here imports a reactor.
"""

from __future__ import annotations

from collections.abc import Callable

from ....protocol import replication as wire

__all__ = ["OriginLink", "ShadowReceiver"]


class OriginLink:
    """The origin's end of one link: send MAGIC and HELLO, read the peer's HELLO, then ACKs."""

    def __init__(self, node_id: int, instance: bytes, name: str, epoch: int = 0) -> None:
        self.node_id = node_id
        self.instance = instance
        self._decoder = wire.LinkDecoder()
        self.hello: wire.Hello | None = None
        self._greeting = wire.MAGIC + wire.encode_hello(node_id, instance, name, epoch)

    def start(self) -> bytes:
        return self._greeting

    def ack(self, data: bytes) -> int | None:
        """The sequence ``data`` acknowledges when it is exactly one ACK after the HELLO (the
        commonest read of a link), else None: then :meth:`feed` it."""
        return self._decoder.ack(data) if self.hello is not None else None

    def feed(self, data: bytes) -> tuple[wire.Hello | None, list[int]]:
        """The peer's HELLO if it came in this read, and the ACKed sequences; raises
        :class:`~nsqtw.protocol.replication.LinkError` for a peer speaking something else,
        refusing us (ERROR), or being this very node."""
        hello = None
        if self.hello is not None:
            seq = self._decoder.ack(data)
            if seq is not None:
                return None, [seq]
        acks: list[int] = []
        for kind, body in self._decoder.feed(data):
            if kind == wire.ERROR:
                raise wire.LinkError("peer refused: " + body.decode(errors="replace"))
            if self.hello is None:
                if kind != wire.HELLO:
                    raise wire.LinkError("peer did not answer HELLO")
                hello = self.hello = wire.decode_hello(body)
                if hello.instance == self.instance:
                    raise wire.LinkError("the peer is this node itself")
                if hello.node_id == self.node_id:
                    raise wire.LinkError(f"the peer has the same --node-id ({hello.node_id}); "
                                         "replicated nodes need distinct --node-id values")
            elif kind == wire.ACK:
                acks.append(wire.decode_ack(body))
            else:
                raise wire.LinkError(f"unexpected frame type {kind}")
        return hello, acks


class ShadowReceiver:
    """The peer's end of one link: the origin's HELLO, then batches to store and acknowledge.

    ``store(origin_node_id, batch_body)`` keeps one batch in that origin's shadow (raising
    ``OSError`` when the disk refuses it); ``adopted(origin_node_id, epoch)`` is the highest
    message ID this node adopted of that origin's epoch (:data:`~wire.NO_ID`: none), the
    answer its HELLO carries."""

    def __init__(self, node_id: int, instance: bytes, name: str,
                 store: Callable[[int, bytes | memoryview], None],
                 adopted: Callable[[int, int], bytes] = lambda origin, epoch: wire.NO_ID) -> None:
        self.adopted = adopted
        self.node_id = node_id
        self.instance = instance
        self.name = name
        self.store = store
        self.origin: wire.Hello | None = None
        self.closed = False
        self.batches = 0
        self.last_seq = 0
        self._decoder = wire.LinkDecoder(expect_magic=True)

    def feed(self, data: bytes) -> bytes:
        """Bytes to answer; :attr:`closed` once the link must close (after the answer)."""
        if self.closed:
            return b""
        origin = self.origin
        if origin is not None and len(data) > 13:
            view = self._decoder.one(data, wire.BATCH)
            if view is not None and len(view) >= 8:  # one whole batch: store it, ACK it
                try:
                    self.store(origin.node_id, view)
                except OSError as e:
                    return self._refuse(f"E_STORE_FAILED {e}")
                except wire.LinkError as e:
                    return self._refuse(f"E_BAD_PROTOCOL {e}")
                self.batches += 1
                self.last_seq = seq = int.from_bytes(view[:8], "big")
                return wire.encode_ack(seq)
        out = []
        try:
            frames = self._decoder.feed(data)
        except wire.LinkError as e:
            return self._refuse(f"E_BAD_PROTOCOL {e}")
        acked = 0
        for kind, body in frames:
            if self.origin is None:
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
                self.origin = hello
                out.append(wire.encode_hello(self.node_id, self.instance, self.name, 0,
                                             self.adopted(hello.node_id, hello.epoch)))
            elif kind == wire.BATCH:
                if len(body) < 8:
                    return b"".join(out) + self._refuse("E_BAD_PROTOCOL malformed BATCH")
                seq = int.from_bytes(body[:8], "big")
                try:
                    self.store(self.origin.node_id, body)
                except OSError as e:
                    return b"".join(out) + self._refuse(f"E_STORE_FAILED {e}")
                except wire.LinkError as e:
                    return b"".join(out) + self._refuse(f"E_BAD_PROTOCOL {e}")
                self.batches += 1
                self.last_seq = acked = seq
            else:
                return b"".join(out) + self._refuse(f"E_BAD_PROTOCOL unexpected frame type {kind}")
        if acked:
            out.append(wire.encode_ack(acked))  # one ACK covers every batch of this read
        return b"".join(out)

    def _refuse(self, text: str) -> bytes:
        self.closed = True
        return wire.encode_error(text)
