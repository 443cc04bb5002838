"""
Replicated publish, sans-IO: the origin's bookkeeping and both ends of a replication link.

An nsqd started with ``--replica-peer`` records every message it accepts (its stored frames,
IDs and timestamps included) in :class:`ReplicationOrigin`; at the end of each reactor turn the
records go out as one numbered batch to every peer in sync (the group commit of the fsync,
applied to the network).  A publisher's answer is held (:meth:`ReplicationOrigin.barrier`)
until ``--replication-min-acks`` peers acknowledged a batch covering it, as ``--sync-every=1``
holds it until the fsync.  When fewer peers are in sync than required, a publish is refused
(``E_PUB_FAILED``) unless ``--replication-degraded=accept``: then it waits for the peers
there are, or for none.

:class:`OriginLink` is the origin's end of one link (HELLO, then ACKs back);
:class:`ShadowReceiver` is the peer's end: it checks the origin is another node, appends each
batch to that origin's shadow log (through an injected ``append``) and acknowledges it.
Nothing here imports a reactor; times are passed in.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from ...protocol import replication as wire
from .broker import Broker
from .topic import Topic

__all__ = ["ReplicatedBroker", "PublishRefused", "PeerState", "ReplicationOrigin", "OriginLink", "ShadowReceiver",
           "IN_SYNC", "CONNECTING", "OUT_OF_SYNC"]

IN_SYNC = "in_sync"
CONNECTING = "connecting"
OUT_OF_SYNC = "out_of_sync"


class PublishRefused(Exception):
    """Fewer peers are in sync than ``--replication-min-acks`` (with degraded=refuse), or the
    peers dropped out while a publish waited for them."""


class PeerState:
    """What the origin knows of one peer."""

    __slots__ = ("address", "state", "node_id", "base", "acked", "unacked", "since", "reason")

    def __init__(self, address: str) -> None:
        self.address = address
        self.state = CONNECTING
        self.node_id: int | None = None
        #: the last batch sent before this peer came in sync: it never saw those
        self.base = 0
        self.acked = 0
        #: (sequence, sent at) of every batch it has not acknowledged yet
        self.unacked: deque[tuple[int, float]] = deque()
        #: when it entered its current state
        self.since = 0.0
        self.reason = ""


class ReplicationOrigin:
    """The origin's side: records, batches, acknowledgements and the publish barrier."""

    def __init__(self, peers: list[str], min_acks: int, accept_degraded: bool) -> None:
        self.peers = {address: PeerState(address) for address in peers}
        self.min_acks = min_acks
        self.accept_degraded = accept_degraded
        self.pending: list[wire.Entry] = []
        self.pending_count = 0
        self.next_seq = 1
        self.last_sent = 0
        #: (target sequence, token) of every publish answer held for its acknowledgements
        self.waiting: list[tuple[int, Any]] = []
        self.replicated_messages = 0
        self.refused_publishes = 0

    # --- what the broker and the glue tell it ----------------------------------------

    def record(self, topic: str, due_ns: int, frames: bytes, count: int) -> None:
        """A publish was stored locally: ``count`` message frames for ``topic``."""
        self.pending.append((topic, due_ns, frames))
        self.pending_count += count

    def take_batch(self, now: float) -> tuple[bytes, list[PeerState]] | None:
        """The next batch frame and the peers to send it to (every peer in sync), or None."""
        if not self.pending:
            return None
        seq = self.next_seq
        self.next_seq += 1
        self.last_sent = seq
        frame = wire.encode_batch(seq, self.pending)
        self.replicated_messages += self.pending_count
        self.pending = []
        self.pending_count = 0
        targets = [p for p in self.peers.values() if p.state == IN_SYNC]
        for p in targets:
            p.unacked.append((seq, now))
        return frame, targets

    def connecting(self, address: str, now: float) -> None:
        peer = self.peers[address]
        peer.state = CONNECTING
        peer.since = now

    def linked(self, address: str, node_id: int, now: float) -> None:
        """The peer answered HELLO: it receives every batch from the next one on."""
        peer = self.peers[address]
        peer.state = IN_SYNC
        peer.node_id = node_id
        peer.base = self.last_sent
        peer.acked = self.last_sent
        peer.unacked.clear()
        peer.since = now
        peer.reason = ""

    def unlinked(self, address: str, now: float, reason: str) -> tuple[list[Any], list[Any]]:
        """The link is gone (closed, refused, stalled): the peer is out of sync; returns the
        held answers to release and to refuse now that it no longer counts."""
        peer = self.peers[address]
        if peer.state != OUT_OF_SYNC:
            peer.since = now
        peer.state = OUT_OF_SYNC
        peer.reason = reason
        peer.unacked.clear()
        return self._settle()

    def acked(self, address: str, seq: int) -> list[Any]:
        """The peer stored every batch up to ``seq``: the held answers now released."""
        peer = self.peers[address]
        if peer.state != IN_SYNC or seq <= peer.acked:
            return []
        peer.acked = seq
        unacked = peer.unacked
        while unacked and unacked[0][0] <= seq:
            unacked.popleft()
        return self._settle()[0]

    def overdue(self, now: float, timeout: float) -> list[str]:
        """Peers whose oldest batch (or HELLO) went unanswered for ``timeout``: stalled links."""
        out = []
        for p in self.peers.values():
            if p.state == IN_SYNC and p.unacked and now - p.unacked[0][1] >= timeout:
                out.append(p.address)
            elif p.state == CONNECTING and now - p.since >= timeout:
                out.append(p.address)
        return out

    # --- the barrier ---------------------------------------------------------------

    def in_sync(self) -> int:
        return sum(1 for p in self.peers.values() if p.state == IN_SYNC)

    def required(self) -> int | None:
        """Acknowledgements a publish needs now; None when it must be refused."""
        n = self.in_sync()
        if n >= self.min_acks:
            return self.min_acks
        return n if self.accept_degraded else None

    @property
    def degraded(self) -> bool:
        return self.in_sync() < self.min_acks

    def barrier(self, token: Any) -> bool:
        """Hold an answer until everything recorded so far is acknowledged: True if it may go
        out now, False if ``token`` comes back from :meth:`acked` or :meth:`unlinked` later;
        raises :class:`PublishRefused` when too few peers are in sync."""
        required = self.required()
        if required is None:
            self.refused_publishes += 1
            raise PublishRefused(self.refusal())
        target = self.next_seq if self.pending else self.last_sent
        if target == 0 or required == 0 or self._count(target) >= required:
            return True
        self.waiting.append((target, token))
        return False

    def refusal(self) -> str:
        return (f"replication: {self.in_sync()} of {len(self.peers)} peers in sync, "
                f"--replication-min-acks={self.min_acks}")

    def _count(self, target: int) -> int:
        return sum(1 for p in self.peers.values()
                   if p.state == IN_SYNC and p.base < target <= p.acked)

    def _settle(self) -> tuple[list[Any], list[Any]]:
        if not self.waiting:
            return [], []
        required = self.required()
        if required is None:
            failed = [token for _, token in self.waiting]
            self.waiting = []
            return [], failed
        released = []
        rest = []
        for target, token in self.waiting:
            if required == 0 or self._count(target) >= required:
                released.append(token)
            else:
                rest.append((target, token))
        self.waiting = rest
        return released, []

    def fail_all(self) -> list[Any]:
        """Shutdown: every held answer is refused."""
        failed = [token for _, token in self.waiting]
        self.waiting = []
        return failed

    def stats(self, now: float) -> dict[str, Any]:
        peers = []
        for p in self.peers.values():
            entry: dict[str, Any] = {"address": p.address, "state": p.state,
                                     "unacked_batches": len(p.unacked),
                                     "seconds_in_state": round(max(0.0, now - p.since), 3)}
            if p.node_id is not None:
                entry["node_id"] = p.node_id
            if p.unacked:
                entry["lag_seconds"] = round(max(0.0, now - p.unacked[0][1]), 3)
            if p.reason:
                entry["reason"] = p.reason
            peers.append(entry)
        in_sync = self.in_sync()
        if in_sync >= self.min_acks:
            status = "ok"
        else:
            status = "degraded-accepting" if self.accept_degraded else "degraded-refusing"
        return {"min_acks": self.min_acks,
                "degraded_mode": "accept" if self.accept_degraded else "refuse",
                "status": status, "peers_in_sync": in_sync,
                "replicated_messages": self.replicated_messages,
                "refused_publishes": self.refused_publishes, "peers": peers}


class OriginLink:
    """The origin's end of one link: send MAGIC and HELLO, read the peer's HELLO, then ACKs."""

    def __init__(self, node_id: int, instance: bytes, name: str) -> None:
        self.node_id = node_id
        self.instance = instance
        self._decoder = wire.LinkDecoder()
        self.hello: wire.Hello | None = None
        self._greeting = wire.MAGIC + wire.encode_hello(node_id, instance, name)

    def start(self) -> bytes:
        return self._greeting

    def feed(self, data: bytes) -> tuple[wire.Hello | None, list[int]]:
        """The peer's HELLO if it came in this read, and the ACKed sequences; raises
        :class:`~nsqtw.protocol.replication.LinkError` for a peer speaking something else,
        refusing us (ERROR), or being this very node."""
        hello = None
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

    ``append(origin_node_id, record)`` writes one shadow log record (raising ``OSError``
    when the disk refuses it)."""

    def __init__(self, node_id: int, instance: bytes, name: str,
                 append: Callable[[int, bytes], None]) -> None:
        self.node_id = node_id
        self.instance = instance
        self.name = name
        self.append = append
        self.origin: wire.Hello | None = None
        self.closed = False
        self.batches = 0
        self.last_seq = 0
        self._decoder = wire.LinkDecoder(expect_magic=True)

    def feed(self, data: bytes) -> bytes:
        """Bytes to answer; :attr:`closed` once the link must close (after the answer)."""
        if self.closed:
            return b""
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
                out.append(wire.encode_hello(self.node_id, self.instance, self.name))
            elif kind == wire.BATCH:
                if len(body) < 8:
                    return b"".join(out) + self._refuse("E_BAD_PROTOCOL malformed BATCH")
                seq = int.from_bytes(body[:8], "big")
                try:
                    self.append(self.origin.node_id, wire.shadow_record(body))
                except OSError as e:
                    return b"".join(out) + self._refuse(f"E_STORE_FAILED {e}")
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


# --- the broker that records what it stores -------------------------------------------



class ReplicatedBroker(Broker):
    """A :class:`Broker` that hands every accepted publish (its stored frames) to
    ``replicate(topic, due_ns, frames, count)``; used only when ``--replica-peer`` is given,
    so an unreplicated nsqd runs the plain broker's publish path unchanged.  Ephemeral
    topics are not replicated (their messages may be dropped anyway)."""

    replicate: Callable[[str, int, bytes, int], None] | None = None

    def _put(self, topic: Topic, run: Any, nbytes: int) -> None:
        super()._put(topic, run, nbytes)
        replicate = self.replicate
        if replicate is not None and not topic.ephemeral:
            blob, offsets, length = run
            replicate(topic.name, 0, blob if len(blob) == length else blob[:length], len(offsets))

    def _put_deferred(self, topic: Topic, frame: bytes, nbytes: int, due: float) -> None:
        super()._put_deferred(topic, frame, nbytes, due)
        replicate = self.replicate
        if replicate is not None and not topic.ephemeral:
            replicate(topic.name, int(due * 1e9), frame, 1)
