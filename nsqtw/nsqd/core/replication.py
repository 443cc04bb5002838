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

import struct
from array import array
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from functools import lru_cache
from operator import itemgetter
from typing import Any, Protocol

from ...protocol import replication as wire
from ...backend.runs import run_of_frame
from ...errors import FinFailed
from .broker import Broker
from .channel import Channel
from .client import ClientState
from .topic import Topic
from ...protocol.names import is_ephemeral

__all__ = ["AdoptionPolicy", "AdoptAfterTimeout", "adopt", "ReplicatedBroker", "ReplicatedChannel", "ShadowState", "ShadowMessage", "PublishRefused", "PeerState", "ReplicationOrigin", "OriginLink", "ShadowReceiver",
           "IN_SYNC", "CATCHING_UP", "CONNECTING", "OUT_OF_SYNC", "outstanding", "iter_chunks",
           "topology_entries", "MAX_LAG_MESSAGES", "SNAPSHOT_BATCH_BYTES", "SNAPSHOT_WINDOW"]

IN_SYNC = "in_sync"
CATCHING_UP = "catching_up"
CONNECTING = "connecting"
OUT_OF_SYNC = "out_of_sync"

#: a peer more messages behind than this (sent, not acknowledged) has fallen behind: its link is
#: dropped and it catches up from a snapshot when it links again
MAX_LAG_MESSAGES = 1_000_000
#: a catch-up snapshot goes out in batches of about this many bytes
SNAPSHOT_BATCH_BYTES = 4 * 1024 * 1024
#: snapshot batches a catching-up peer may hold unacknowledged: the next goes out as it
#: acknowledges one (the snapshot of a large backlog is neither encoded nor buffered whole,
#: and only what is on its way counts as the peer's lag)
SNAPSHOT_WINDOW = 4

#: a live batch this small (up to three entries: PUBs) is joined into one frame and sent with
#: one ``send``; a larger one goes as parts, gathered by the kernel (``sendmsg``)
SMALL_BATCH_BYTES = 16 * 1024
#: sequence numbers kept for one snapshot's batches: the live batches recorded while it goes
#: out are numbered after them (they follow it on that peer's link)
SNAPSHOT_SEQS = 1 << 32


class PublishRefused(Exception):
    """Fewer peers are in sync than ``--replication-min-acks`` (with degraded=refuse), or the
    peers dropped out while a publish waited for them."""


class PeerState:
    """What the origin knows of one peer."""

    __slots__ = ("address", "state", "node_id", "base", "acked", "unacked", "since", "reason",
                 "catchup_seq", "lag_messages", "catch_ups", "catchup")

    def __init__(self, address: str) -> None:
        self.address = address
        self.state = CONNECTING
        self.node_id: int | None = None
        #: the last batch sent before this peer came in sync: it never saw those
        self.base = 0
        self.acked = 0
        #: (sequence, sent at, messages) of every batch it has not acknowledged yet
        self.unacked: deque[tuple[int, float, int]] = deque()
        #: catching up: in sync once it acknowledged this batch (the snapshot's last)
        self.catchup_seq = 0
        #: the snapshot still going out to it (None: all sent, or none)
        self.catchup: _CatchUp | None = None
        #: messages sent to it and not acknowledged yet
        self.lag_messages = 0
        #: snapshots sent to it
        self.catch_ups = 0
        #: when it entered its current state
        self.since = 0.0
        self.reason = ""


class _CatchUp:
    """A snapshot going out to one peer: its batches not sent yet (made as they go), the
    sequence of the next, and the live batches recorded meanwhile, which follow it."""

    __slots__ = ("batches", "ahead", "start", "seq", "queued")

    def __init__(self, batches: Iterator[list[wire.Entry]], start: int) -> None:
        self.batches = batches
        #: the next batch to send (made one ahead: the last is known as the last when it goes)
        self.ahead = next(batches, None)
        self.start = start
        self.seq = start
        #: (frame, sequence, messages) of each live batch waiting behind the snapshot
        self.queued: list[tuple[bytes, int, int]] = []


class ReplicationOrigin:
    """The origin's side: records, batches, acknowledgements and the publish barrier."""

    def __init__(self, peers: list[str], min_acks: int, accept_degraded: bool,
                 max_lag: int = MAX_LAG_MESSAGES) -> None:
        self.peers = {address: PeerState(address) for address in peers}
        self.max_lag = max_lag
        self.min_acks = min_acks
        self.accept_degraded = accept_degraded
        self.pending: list[wire.Entry] = []
        #: FINs and REQs per (topic, channel) since the last consumer-state batch
        self.fins: dict[tuple[str, str], list[bytes]] = {}
        self.reqs: dict[tuple[str, str], list[tuple[bytes, int]]] = {}
        self.pending_count = 0
        #: bytes of the messages recorded since the last batch
        self.pending_bytes = 0
        self.next_seq = 1
        self.last_sent = 0
        #: (target sequence, token) of every publish answer held for its acknowledgements
        self.waiting: list[tuple[int, Any]] = []
        self.replicated_messages = 0
        self.refused_publishes = 0

    # --- what the broker and the glue tell it ----------------------------------------

    def record(self, topic: str, due_ns: int, frames: bytes, count: int) -> None:
        """A publish was stored locally: ``count`` message frames for ``topic``."""
        self.pending.append((wire.MSG, topic, "", due_ns, frames))
        self.pending_count += count
        self.pending_bytes += len(frames)

    def op(self, kind: int, topic: str, channel: str = "") -> None:
        """A topic or channel was created or deleted: in order with the publishes."""
        self.pending.append((kind, topic, channel, 0, b""))

    def fin(self, topic: str, channel: str, mid: bytes) -> None:
        """A channel finished a message: sent with the next consumer-state batch."""
        key = (topic, channel)
        fins = self.fins.get(key)
        if fins is None:
            self.fins[key] = [mid]
        else:
            fins.append(mid)

    def req(self, topic: str, channel: str, mid: bytes, due_ns: int) -> None:
        """A channel requeued a message, due again at ``due_ns``."""
        self.reqs.setdefault((topic, channel), []).append((mid, due_ns))

    def move_consumer_state(self) -> bool:
        """Queue the FINs and REQs gathered since the last call (every ~100 ms) as one item per
        channel; True if there was any (send a batch)."""
        if not self.fins and not self.reqs:
            return False
        pending = self.pending
        for (topic, channel), items in self.reqs.items():
            pending.append((wire.REQ, topic, channel, 0, wire.req_data(items)))
        for (topic, channel), ids in self.fins.items():
            pending.append((wire.FIN, topic, channel, 0, wire.fin_data(ids)))
        self.fins = {}
        self.reqs = {}
        return True

    def take_batch(self, now: float) -> tuple[list[bytes], list[PeerState]] | None:
        """The next batch frame, as parts to send without joining them (``sendmsg``), and the
        peers to send it to (every peer in sync), or None.  A small batch (a few publishes) is
        one part: joined once, sent with one ``send``."""
        pending = self.pending
        if not pending:
            return None
        seq = self.next_seq
        self.next_seq += 1
        self.last_sent = seq
        targets = [p for p in self.peers.values() if p.state == IN_SYNC or p.state == CATCHING_UP]
        # no peer linked: nothing is encoded (degraded=accept, or publishes being refused)
        if not targets:
            frame = []
        elif len(pending) <= 3 and self.pending_bytes <= SMALL_BATCH_BYTES:
            frame = [wire.encode_batch(seq, pending)]
        else:
            frame = wire.encode_batch_parts(seq, pending)
        count = self.pending_count
        if targets:
            self.replicated_messages += count
        self.pending = []
        self.pending_count = self.pending_bytes = 0
        behind_snapshot = False
        for p in targets:
            p.lag_messages += count
            if p.catchup is not None:  # its snapshot is still going out: this waits behind it
                p.catchup.queued.append((frame[0] if len(frame) == 1 else b"".join(frame), seq, count))
                behind_snapshot = True
            else:
                p.unacked.append((seq, now, count))
        if behind_snapshot:
            targets = [p for p in targets if p.catchup is None]
        return frame, targets

    def connecting(self, address: str, now: float) -> None:
        peer = self.peers[address]
        peer.state = CONNECTING
        peer.since = now

    def linked(self, address: str, node_id: int, now: float, snapshot: Iterable[wire.Entry] | None = None,
               batch_bytes: int = SNAPSHOT_BATCH_BYTES) -> list[bytes]:
        """The peer answered HELLO: it is catching up.  Returns the batch frames to send it
        first: the first of ``snapshot``'s (everything outstanding, see :func:`outstanding`;
        whatever was recorded before must have been sent with :meth:`take_batch` already).
        The snapshot goes out :data:`SNAPSHOT_WINDOW` batches at a time, made as they go: the
        next ones come from :meth:`catch_up` as the peer acknowledges these.  The live batches
        recorded meanwhile follow the snapshot's last, and the peer counts toward
        ``--replication-min-acks`` once it acknowledged that last.  Without a snapshot it is
        in sync at once and counts for the batches sent from now on only."""
        peer = self.peers[address]
        peer.state = CATCHING_UP if snapshot is not None else IN_SYNC
        peer.node_id = node_id
        peer.base = self.last_sent
        peer.acked = self.last_sent
        peer.unacked.clear()
        peer.lag_messages = 0
        peer.since = now
        peer.reason = ""
        peer.catchup = None
        if snapshot is None:
            return []
        peer.catch_ups += 1
        start = self.next_seq
        self.next_seq += SNAPSHOT_SEQS
        peer.catchup = _CatchUp(iter_chunks(snapshot, batch_bytes), start)
        peer.catchup_seq = self.next_seq  # not reached before the snapshot's last batch is known
        return self.catch_up(address, now)

    def restream(self, address: str, now: float, snapshot: Iterable[wire.Entry],
                 batch_bytes: int = SNAPSHOT_BATCH_BYTES) -> list[bytes]:
        """A new snapshot of everything outstanding for a peer that is linked (after an
        adoption: what was adopted reaches the peers this way, a window at a time, never as
        one batch of the whole adopted backlog).  A peer in sync stays in sync (its
        acknowledgements keep counting; the live batches recorded meanwhile wait behind the
        snapshot, whose last batch it stored once :meth:`stored_through`); a peer catching up
        starts over with this one.  The first batch frames to send it (none: not linked)."""
        peer = self.peers[address]
        if peer.state == CATCHING_UP:
            return self.linked(address, peer.node_id or 0, now, snapshot, batch_bytes)
        if peer.state != IN_SYNC:
            return []
        if peer.catchup is not None:  # superseded: the new snapshot holds what those carried
            peer.lag_messages -= sum(count for _, _, count in peer.catchup.queued)
        peer.catch_ups += 1
        start = self.next_seq
        self.next_seq += SNAPSHOT_SEQS
        peer.catchup = _CatchUp(iter_chunks(snapshot, batch_bytes), start)
        peer.catchup_seq = self.next_seq
        return self.catch_up(address, now)

    def stored_through(self, address: str) -> bool:
        """The peer is in sync and stored the last snapshot sent to it (or was sent none)."""
        peer = self.peers[address]
        return peer.state == IN_SYNC and peer.catchup is None and peer.acked >= peer.catchup_seq

    def catch_up(self, address: str, now: float) -> list[bytes]:
        """The next batch frames of the snapshot going out to a catching-up peer, as many as
        keep :data:`SNAPSHOT_WINDOW` of them unacknowledged; after its last, the live batches
        that waited behind it.  Nothing when it has no snapshot going out."""
        peer = self.peers[address]
        c = peer.catchup
        if c is None or (peer.state != CATCHING_UP and peer.state != IN_SYNC):
            return []
        frames: list[bytes] = []
        while c.ahead is not None and c.seq - max(peer.acked + 1, c.start) < SNAPSHOT_WINDOW:
            entries = c.ahead
            c.ahead = next(c.batches, None)
            seq = c.seq
            c.seq += 1
            count = sum(1 for e in entries if e[0] == wire.SNAP_MSG)
            frames.append(wire.encode_batch(seq, entries))
            peer.unacked.append((seq, now, count))
            peer.lag_messages += count
            if c.ahead is None:  # that was the snapshot's last batch: the live ones follow
                peer.catchup_seq = seq
                peer.catchup = None
                for frame, live_seq, live_count in c.queued:
                    frames.append(frame)
                    peer.unacked.append((live_seq, now, live_count))
        return frames

    def unlinked(self, address: str, now: float, reason: str) -> tuple[list[Any], list[Any]]:
        """The link is gone (closed, refused, stalled): the peer is out of sync; returns the
        held answers to release and to refuse now that it no longer counts."""
        peer = self.peers[address]
        if peer.state != OUT_OF_SYNC:
            peer.since = now
        peer.state = OUT_OF_SYNC
        peer.reason = reason
        peer.catchup = None
        peer.unacked.clear()
        peer.lag_messages = 0
        return self._settle()

    def acked(self, address: str, seq: int, now: float = 0.0) -> list[Any]:
        """The peer stored every batch up to ``seq``: the held answers now released (a peer
        catching up is in sync once it stored the snapshot's last batch)."""
        peer = self.peers[address]
        if (peer.state != IN_SYNC and peer.state != CATCHING_UP) or seq <= peer.acked:
            return []
        peer.acked = seq
        unacked = peer.unacked
        while unacked and unacked[0][0] <= seq:
            peer.lag_messages -= unacked.popleft()[2]
        if peer.state == CATCHING_UP:
            if seq < peer.catchup_seq:
                return []
            # it holds everything outstanding (the snapshot) and every batch since
            peer.state = IN_SYNC
            peer.base = 0
            peer.since = now
        return self._settle()[0]

    def overdue(self, now: float, timeout: float) -> list[str]:
        """Peers whose oldest batch (or HELLO) went unanswered for ``timeout``: stalled links."""
        out = []
        for p in self.peers.values():
            if p.state != IN_SYNC and p.state != CATCHING_UP:
                if p.state == CONNECTING and now - p.since >= timeout:
                    out.append(p.address)
            elif p.unacked and now - p.unacked[0][1] >= timeout:
                out.append(p.address)
        return out

    def behind(self) -> list[str]:
        """Peers more than ``max_lag`` messages behind: fallen behind (drop their link; they
        catch up from a snapshot when they link again)."""
        return [p.address for p in self.peers.values()
                if (p.state == IN_SYNC or p.state == CATCHING_UP) and p.lag_messages > self.max_lag]

    # --- the barrier ---------------------------------------------------------------

    def in_sync(self) -> int:
        n = 0
        for p in self.peers.values():  # a loop, not sum() over a generator: once per publish
            if p.state == IN_SYNC:
                n += 1
        return n

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
        n = self.in_sync()
        required = self.min_acks if n >= self.min_acks else n if self.accept_degraded else None
        if required is None:
            self.refused_publishes += 1
            raise PublishRefused(self.refusal())
        if self.pending:
            # the commonest case: this turn's publishes, not sent yet, so not acknowledged
            if required == 0:
                return True
            self.waiting.append((self.next_seq, token))
            return False
        target = self.last_sent
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
        waiting = self.waiting
        if not waiting:
            return [], []
        # what each peer in sync holds: the batches after its base up to what it acknowledged
        spans = [(p.base, p.acked) for p in self.peers.values() if p.state == IN_SYNC]
        n = len(spans)
        required = self.min_acks if n >= self.min_acks else n if self.accept_degraded else None
        if required is None:
            failed = [token for _, token in waiting]
            self.waiting = []
            return [], failed
        if required == 0:
            self.waiting = []
            return [token for _, token in waiting], []
        if n == 1:  # one peer's acknowledgement is needed (and is all there is)
            base, acked = spans[0]
            if len(waiting) == 1:  # one publish round trip at a time: the commonest case
                target, token = waiting[0]
                if base < target <= acked:
                    self.waiting = []
                    return [token], []
                return [], []
            released = [token for target, token in waiting if base < target <= acked]
            if len(released) == len(waiting):
                self.waiting = []
            elif released:
                self.waiting = [w for w in waiting if not base < w[0] <= acked]
            return released, []
        released = []
        rest = []
        for target, token in waiting:
            if sum(1 for base, acked in spans if base < target <= acked) >= required:
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

    def peer_stats(self, now: float) -> list[dict[str, Any]]:
        """Per peer: ``address``, ``state`` (``in_sync``, ``catching_up``, ``connecting``,
        ``out_of_sync``), ``lag_messages`` (sent, not yet acknowledged), ``lag_seconds`` (age
        of the oldest unacknowledged batch, 0 when none), ``unacked_batches``,
        ``seconds_in_state``, ``catch_ups`` (snapshots sent), and ``node_id`` and ``reason``
        when known.  The one source of every per-peer figure (/stats, metrics, views)."""
        out = []
        for p in self.peers.values():
            entry: dict[str, Any] = {"address": p.address, "state": p.state,
                                     "lag_messages": p.lag_messages,
                                     "lag_seconds": round(max(0.0, now - p.unacked[0][1]), 3) if p.unacked else 0.0,
                                     "unacked_batches": len(p.unacked),
                                     "seconds_in_state": round(max(0.0, now - p.since), 3),
                                     "catch_ups": p.catch_ups}
            if p.node_id is not None:
                entry["node_id"] = p.node_id
            if p.reason:
                entry["reason"] = p.reason
            out.append(entry)
        return out

    def stats(self, now: float) -> dict[str, Any]:
        peers = self.peer_stats(now)
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


# --- the broker that records what it stores -------------------------------------------



class ReplicatedChannel(Channel):
    """A :class:`Channel` that tells the broker's ``replicate_fin``/``replicate_req`` what its
    consumers finished and requeued (ephemeral channels tell nothing)."""

    __slots__ = ("_in_many",)

    def __init__(self, topic: Topic, name: str, broker: Broker, backend: Any, now: float) -> None:
        super().__init__(topic, name, broker, backend, now)
        self._in_many = False

    def finish(self, client: ClientState, mid: bytes, now: float) -> None:
        super().finish(client, mid, now)
        if not self._in_many and not self.ephemeral:
            self.broker.replicate_fin(self.topic.name, self.name, mid)  # type: ignore[attr-defined]  # its broker is a ReplicatedBroker

    def finish_many(self, client: ClientState, ids: list[bytes], now: float) -> list[FinFailed]:
        inflight = self.inflight
        owned = [mid for mid in ids if (ep := inflight.get(mid)) is not None and ep.client is client]
        self._in_many = True
        try:
            errors = super().finish_many(client, ids, now)
        finally:
            self._in_many = False
        if not self.ephemeral:
            fin = self.broker.replicate_fin  # type: ignore[attr-defined]  # its broker is a ReplicatedBroker
            name = self.topic.name
            for mid in owned:
                fin(name, self.name, mid)
        return errors

    def requeue(self, client: ClientState, mid: bytes, delay: float, now: float) -> None:
        super().requeue(client, mid, delay, now)
        if not self.ephemeral:
            self.broker.replicate_req(self.topic.name, self.name, mid,  # type: ignore[attr-defined]  # its broker is a ReplicatedBroker
                                      int((now + delay) * 1e9) if delay > 0 else 0)


def _ignore(*args: Any) -> None:
    pass


class ReplicatedBroker(Broker):
    """A :class:`Broker` that hands every accepted publish (its stored frames) to
    ``replicate(topic, due_ns, frames, count)``, and its channels' FINs and REQs to
    ``replicate_fin``/``replicate_req``; used only when ``--replica-peer`` is given, so an
    unreplicated nsqd runs the plain broker's and channel's paths unchanged.  Ephemeral
    topics and channels are not replicated (their messages may be dropped anyway)."""

    channel_class = ReplicatedChannel
    replicate: Callable[[str, int, bytes, int], None] = _ignore
    replicate_fin: Callable[[str, str, bytes], None] = _ignore
    replicate_req: Callable[[str, str, bytes, int], None] = _ignore

    def _put(self, topic: Topic, run: Any, nbytes: int) -> None:
        super()._put(topic, run, nbytes)
        if not topic.ephemeral:
            blob, offsets, length = run
            self.replicate(topic.name, 0, blob if len(blob) == length else blob[:length], len(offsets))

    def _put_deferred(self, topic: Topic, frame: bytes, nbytes: int, due: float) -> None:
        super()._put_deferred(topic, frame, nbytes, due)
        if not topic.ephemeral:
            self.replicate(topic.name, int(due * 1e9), frame, 1)


# --- the peer's shadow of one origin --------------------------------------------------


class ShadowMessage:
    """One message of an origin held by a peer: what adoption would republish.  ``raw`` is
    its frame as held: bytes, or a view of the peer's shadow log (mapped, so the frame stays
    on disk and in the page cache, not in the process's own memory); :attr:`frame` is it as
    bytes."""

    __slots__ = ("topic", "due", "raw", "pending", "open")

    def __init__(self, topic: str, due: int, frame: bytes | memoryview, pending: frozenset[str] | None) -> None:
        self.topic = topic
        self.due = due
        self.raw = frame
        #: channels that have not finished it; None while the topic has no channel (the
        #: channels created next get it, as the origin's topic hands its backlog to them)
        self.pending = pending
        self.open = pending is None

    @property
    def frame(self) -> bytes:
        raw = self.raw
        return raw if type(raw) is bytes else bytes(raw)


class ShadowRun:
    """The messages of one published batch (an MSG item of two or more frames), held as
    received: the shadow's index maps each of their IDs to this one object, and a message gets
    an object of its own (:class:`ShadowMessage`) only when it is finished, requeued or
    changed on its own.  Its ``pending`` and ``open`` apply to every message still here.

    Only the first and last IDs are read when the run arrives; the others are read from the
    frames the first time one is looked up (a FIN, a REQ, a snapshot), so a peer whose
    messages are not consumed yet pays nothing per message for its index.

    A *gathered* run (:meth:`ShadowState.add_frame`) holds single publishes of one topic that
    came one after the other: its ``data`` is the mapped window of the peer's log they are in
    (frames with records' heads between them), ``starts`` where each frame is in it, and its
    IDs are kept as they come (16 bytes each, no object per message)."""

    __slots__ = ("topic", "due", "data", "pending", "open", "first", "last", "_ids", "starts",
                 "stride", "gone", "left", "gathered")

    def __init__(self, topic: str, due: int, data: bytes | memoryview, pending: frozenset[str] | None,
                 first: bytes, last: bytes, starts: Any, stride: int = 0,
                 ids: list[bytes] | None = None) -> None:
        self.topic = topic
        self.due = due
        self.data = data
        self.pending = pending
        self.open = pending is None
        #: the first and last IDs (as the origin minted them: increasing)
        self.first = first
        self.last = last
        #: where each frame starts, and the frames' common length (0: not all alike)
        self.starts = starts
        self.stride = stride
        self._ids = ids
        #: IDs no longer here (finished, or given an object of their own), and how many are left
        self.gone: set[bytes] = set()
        self.left = len(starts)
        #: ``data`` is a window of the log, not the frames alone (see the class's docstring)
        self.gathered = False

    @property
    def ids(self) -> list[bytes]:
        """Every ID of the run, increasing (read from the frames once, when first needed)."""
        ids = self._ids
        if ids is None:
            data = self.data
            if self.stride:
                ids = list(map(_first, _id_struct(self.stride).iter_unpack(data)))
            else:
                ids = [bytes(data[p + 18:p + 34]) for p in self.starts]
            if ids != sorted(ids):  # not an origin's batch: keep IDs and frames paired, sorted
                order = sorted(range(len(ids)), key=ids.__getitem__)
                starts = self.starts
                ids = [ids[i] for i in order]
                self.starts = [starts[i] for i in order]
                self.stride = 0
            self._ids = ids
        return ids

    def has(self, mid: bytes) -> bool:
        if mid > self.last or mid < self.first or mid in self.gone:
            return False
        ids = self.ids
        i = bisect_left(ids, mid)
        return i < len(ids) and ids[i] == mid

    def frame(self, mid: bytes) -> bytes | memoryview:
        """``mid``'s frame as held (a slice of the run's data: bytes or a view)."""
        i = bisect_left(self.ids, mid)
        stride = self.stride
        if stride:
            start = i * stride
            return self.data[start:start + stride]
        start = self.starts[i]
        data = self.data
        return data[start:start + 4 + int.from_bytes(data[start:start + 4], "big")]

    def remaining(self) -> list[bytes]:
        gone = self.gone
        return [mid for mid in self.ids if mid not in gone] if gone else list(self.ids)

    def each(self) -> Iterator[tuple[bytes, Any]]:
        """``(ID, frame as held)`` of every message still here, in ID order (no lookup each)."""
        ids = self.ids  # first: reading them may put the starts in ID order
        data = self.data
        gone = self.gone
        stride = self.stride
        starts = self.starts
        for i, mid in enumerate(ids):
            if gone and mid in gone:
                continue
            start = i * stride if stride else starts[i]
            yield mid, data[start:start + (stride or 4 + int.from_bytes(data[start:start + 4], "big"))]

    def pieces(self, limit: int) -> Iterator[bytes]:
        """The frames still here, in ID order, joined into pieces of about ``limit`` bytes."""
        piece: list[Any] = []
        size = 0
        for _, frame in self.each():
            piece.append(frame)
            size += len(frame)
            if size >= limit:
                yield b"".join(piece)
                piece = []
                size = 0
        if piece:
            yield b"".join(piece)

    def solo(self, mid: bytes) -> ShadowMessage:
        m = ShadowMessage(self.topic, self.due, self.frame(mid), self.pending)
        m.open = self.open
        return m


_first = itemgetter(0)
#: the first four bytes of a buffer as a big-endian length (a frame's size)
_U32_AT = struct.Struct(">I").unpack_from


@lru_cache(maxsize=64)
def _id_struct(stride: int) -> struct.Struct:
    """Reads the ID of each frame of a run of frames ``stride`` bytes long."""
    return struct.Struct(f"18x16s{stride - 34}x")


def _index_frames(data: bytes | memoryview) -> tuple[list[bytes] | None, Any, int]:
    """Where an MSG item's frames start: ``(None, starts, stride)`` for a batch of one body
    size (an MPUB of equal bodies, the common case: checked without a loop in Python, IDs
    read later, see :attr:`ShadowRun.ids`), else ``(ids, starts, 0)`` (IDs as bytes)."""
    end = len(data)
    if end >= 4:
        head = bytes(data[:4])
        stride = int.from_bytes(head, "big") + 4
        n, rest = divmod(end, stride)
        if stride >= 34 and rest == 0 and n > 1 and all(
                data[i::stride] == head[i:i + 1] * n for i in range(4)):
            return None, range(0, end, stride), stride
    ids: list[bytes] = []
    offsets: list[int] = []
    pos = 0
    while pos < end:
        stop = pos + 4 + int.from_bytes(data[pos:pos + 4], "big")
        if stop > end or stop - pos < 34:
            raise wire.LinkError("truncated message frame")
        ids.append(bytes(data[pos + 18:pos + 34]))
        offsets.append(pos)
        pos = stop
    return ids, array("Q", offsets), 0


class ShadowState:
    """An origin's topics, channels and unfinished messages, rebuilt from its BATCH items in
    order: a message is dropped once every channel that got it finished it (or was deleted or
    emptied).  A catch-up snapshot (``SNAP_BEGIN`` ... ``SNAP_END``) is built aside and replaces
    the state once it is whole; ``epoch`` is the origin's epoch it came with, ``max_id`` the
    highest message ID this shadow ever held (what an adoption reports back to the origin)."""

    def __init__(self) -> None:
        self.topics: dict[str, set[str]] = {}
        #: unfinished messages with an object of their own, by ID
        self.messages: dict[bytes, ShadowMessage] = {}
        #: unfinished messages still in the batch they came in, indexed by ID range: the runs
        #: in increasing ID order and their first IDs
        self.runs: list[ShadowRun] = []
        self._firsts: list[bytes] = []
        #: paused topics (channel "") and channels
        self.paused: set[tuple[str, str]] = set()
        self.live_bytes = 0
        self.epoch = 0
        self.max_id = wire.NO_ID
        self._staged: ShadowState | None = None
        #: the last pending-channel set of each topic's messages (shared while it is the same)
        self._pending: dict[str, frozenset[str]] = {}
        #: what channels created in the batch being applied opened (see _apply)
        self._opened: list[ShadowMessage | ShadowRun] = []
        #: snapshots that replaced the state so far
        self.snapshots = 0
        #: the gathered run single publishes are added to (see add_frame), and the last single
        #: publish held on its own: (its ID, the window it is in, where, its object)
        self._gathering: ShadowRun | None = None
        self._last_single: tuple[bytes, Any, int, ShadowMessage] | None = None

    @property
    def catching_up(self) -> bool:
        """A snapshot is being received (the state is still the one from before it)."""
        return self._staged is not None

    def apply(self, entries: list[wire.Entry]) -> None:
        if len(entries) == 1 and self._staged is None:  # a live batch of one item (a PUB's)
            kind = entries[0][0]
            if kind != wire.SNAP_BEGIN and kind != wire.SNAP_END:
                self._apply(entries)
                return
        target = self._staged if self._staged is not None else self
        seg: list[wire.Entry] = []
        for entry in entries:
            kind = entry[0]
            if kind == wire.SNAP_BEGIN:
                target._apply(seg)
                seg = []
                target = self._staged = ShadowState()
                if len(entry[4]) == 8:
                    target.epoch = int.from_bytes(entry[4], "big")
            elif kind == wire.SNAP_END:
                target._apply(seg)
                seg = []
                staged = self._staged
                if staged is not None:
                    if len(entry[4]) == 16 and entry[4] > staged.max_id:
                        staged.max_id = entry[4]
                    self._replace(staged)
                target = self
            else:
                seg.append(entry)
        target._apply(seg)

    def _replace(self, staged: ShadowState) -> None:
        self.topics = staged.topics
        self.messages = staged.messages
        self.runs = staged.runs
        self._firsts = staged._firsts
        self.paused = staged.paused
        self.live_bytes = staged.live_bytes
        self.epoch = staged.epoch
        if staged.max_id > self.max_id:
            self.max_id = staged.max_id
        self._staged = None
        self._gathering = staged._gathering
        self._last_single = staged._last_single
        self.snapshots += 1

    def _pending_of(self, topic: str) -> frozenset[str] | None:
        """The channels that must finish a message published to ``topic`` now (None: it has no
        channel yet; the topic is known from now on).  One frozenset is shared by every message
        of a topic while its channels stay the same (a frozenset is 216 bytes: one per PUB was a
        third of a shadowed PUB's memory), compared with the channels rather than made for each
        message and then compared."""
        channels = self.topics.get(topic)
        if channels is None:
            channels = self.topics[topic] = set()
        if not channels:
            return None
        pending = self._pending.get(topic)
        if pending is None or pending != channels:
            pending = self._pending[topic] = frozenset(channels)
        return pending

    def add_frame(self, topic: str, due: int, window: Any, at: int, end: int) -> None:
        """One message frame for ``topic``, ``window[at:end]`` (``window``: the mapped window
        of the peer's log it was appended to): what :meth:`apply` of an MSG item of that one
        frame does, for a live batch of one PUB.  A publish of the same topic, due time and
        channels as the one before it, in the same window, joins it in a gathered run (see
        :class:`ShadowRun`): a peer shadowing a stream of PUBs keeps 16 bytes of ID and a start
        per message, not an object and a view."""
        if self._staged is not None:
            self._staged.add_frame(topic, due, window, at, end)
            return
        pending = self._pending_of(topic)
        mid = bytes(window[at + 18:at + 34])
        self.live_bytes += end - at
        if mid > self.max_id:
            self.max_id = mid
        runs = self.runs
        g = self._gathering
        if g is not None:
            ids = g._ids
            assert ids is not None  # a gathered run keeps its IDs
            # (and only while most of it is unfinished: a run whose consumers keep up would
            # otherwise hold the IDs of every message it ever had until it is compacted)
            if runs and runs[-1] is g and g.data is window and g.left * 2 > len(ids):
                if mid > g.last and g.topic == topic and g.due == due and g.pending == pending \
                        and g.open == (pending is None):
                    ids.append(mid)
                    g.starts.append(at)
                    g.last = mid
                    g.left += 1
                    return
            else:  # it takes no more (what it holds is let go as it is finished)
                self._gathering = None
        last = self._last_single
        if last is not None and last[1] is window and last[0] < mid:
            prev_id, _, prev_at, prev = last
            if (self.messages.get(prev_id) is prev and prev.topic == topic and prev.due == due
                    and prev.pending == pending and prev.open == (pending is None)
                    and (not runs or prev_id > runs[-1].last)):
                # the one before it is alike: both go into a new gathered run
                del self.messages[prev_id]
                g = ShadowRun(topic, due, window, pending, prev_id, mid, array("Q", (prev_at, at)), 0,
                              [prev_id, mid])
                g.gathered = True
                runs.append(g)
                self._firsts.append(prev_id)
                self._gathering = g
                self._last_single = None
                return
        m = self.messages[mid] = ShadowMessage(topic, due, window[at:end], pending)
        self._last_single = (mid, window, at, m)

    def _apply(self, entries: list[wire.Entry]) -> None:
        self._opened = opened = []
        for kind, topic, channel, due, data in entries:
            if kind == wire.MSG:
                pending = self._pending_of(topic)
                end = len(data)
                if end >= 34 and _U32_AT(data)[0] + 4 == end:  # one frame (a PUB): no index
                    mid = bytes(data[18:34])
                    self.messages[mid] = ShadowMessage(topic, due, data, pending)
                    if mid > self.max_id:
                        self.max_id = mid
                    self.live_bytes += end
                    continue
                ids, starts, stride = _index_frames(data)
                if ids is None:
                    first, last = bytes(data[18:34]), bytes(data[len(data) - stride + 18:len(data) - stride + 34])
                elif not ids:
                    continue
                else:
                    first, last = ids[0], ids[-1]
                runs = self.runs
                if ids is not None and len(ids) == 1:
                    self.messages[first] = ShadowMessage(topic, due, data, pending)
                elif (not runs or first > runs[-1].last) and first < last and (ids is None or ids == sorted(ids)):
                    runs.append(ShadowRun(topic, due, data, pending, first, last, starts, stride, ids))
                    self._firsts.append(first)
                else:  # not after the last run, or not increasing (not an origin's publish): one by one
                    ids = ids if ids is not None else [bytes(data[p + 18:p + 34]) for p in starts]
                    for i, mid in enumerate(ids):
                        stop = starts[i + 1] if i + 1 < len(ids) else len(data)
                        self.messages[mid] = ShadowMessage(topic, due, data[starts[i]:stop], pending)
                top = max(last, first)
                if top > self.max_id:  # the IDs of one origin increase: the last is the highest
                    self.max_id = top
                self.live_bytes += len(data)
            elif kind == wire.FIN:
                messages = self.messages
                for mid in wire.fin_ids(data):
                    held = messages.get(mid)
                    if held is None:
                        run = self._run_of(mid)
                        if run is None or run.pending is None or channel not in run.pending:
                            continue
                        if len(run.pending) == 1:  # its last channel: gone, no object made
                            self.live_bytes -= len(run.frame(mid))
                            self._leave(run, mid)
                            continue
                        held = self._solo(run, mid)
                    if held.pending is not None and channel in held.pending:
                        held.pending = held.pending - {channel}
                        if not held.pending:
                            self._drop(mid, held)
            elif kind == wire.REQ:
                for mid, when in wire.split_req(data):
                    held = self.messages.get(mid)
                    if held is None:
                        run = self._run_of(mid)
                        if run is None:
                            continue
                        held = self._solo(run, mid)
                    held.due = when
            elif kind == wire.SNAP_MSG:
                self._snap_msg(topic, channel, due, data)
            elif kind == wire.TOPIC_NEW:
                self.topics.setdefault(topic, set())
            elif kind == wire.CHANNEL_NEW:
                channels = self.topics.setdefault(topic, set())
                if channel not in channels:
                    channels.add(channel)
                    for m in self._of_topic(topic):
                        if m.pending is None or m.open:
                            m.pending = (m.pending or frozenset()) | {channel}
                            if not m.open:
                                m.open = True
                            opened.append(m)
            elif kind == wire.CHANNEL_DEL or (kind == wire.EMPTY and channel):
                self._solid(topic)
                if kind == wire.CHANNEL_DEL:
                    self.topics.get(topic, set()).discard(channel)
                    self.paused.discard((topic, channel))
                for mid, m in list(self._items_of_topic(topic)):
                    if m.pending is not None and channel in m.pending:
                        m.pending = m.pending - {channel}
                        if not m.pending:
                            self._drop(mid, m)
            elif kind == wire.EMPTY:  # the topic's own queue: what no channel got yet
                self._solid(topic)
                for mid, m in list(self._items_of_topic(topic)):
                    if m.pending is None:
                        self._drop(mid, m)
            elif kind == wire.PAUSE:
                self.paused.add((topic, channel))
            elif kind == wire.UNPAUSE:
                self.paused.discard((topic, channel))
            elif kind == wire.TOPIC_DEL:
                self.topics.pop(topic, None)
                self.paused = {p for p in self.paused if p[0] != topic}
                self._solid(topic)
                for mid, m in list(self._items_of_topic(topic)):
                    self._drop(mid, m)
        for m in opened:  # channels created in one batch all get the backlog; later ones do not
            m.open = False
        self._opened = []

    def _snap_msg(self, topic: str, channel: str, due: int, data: bytes) -> None:
        """Messages a snapshot says one channel (or the topic's queue, ``channel`` empty) holds.

        An item of several messages, in increasing ID order and all newer than anything held,
        is kept as it came (one :class:`ShadowRun`, no object per message); the same messages
        on another channel (an item exactly like that run, untouched) add the channel to it.
        Anything else is kept message by message."""
        if len(data) >= 68 and self._snap_run(topic, channel, due, data):
            return
        messages = self.messages
        top = self.max_id
        for frame in wire.split_frames(data):
            mid = bytes(frame[18:34])
            if mid > top:
                top = mid
            held = messages.get(mid)
            if held is None and (run := self._run_of(mid)) is not None:
                held = self._solo(run, mid)
            if held is None:
                m = ShadowMessage(topic, due, frame, frozenset((channel,)) if channel else None)
                m.open = False
                messages[mid] = m
                self.live_bytes += len(frame)
            elif channel and held.pending is not None:
                held.pending = held.pending | {channel}
                if due < held.due:  # deferred on one channel, due now on another: the earlier
                    held.due = due
        self.max_id = top

    def _snap_run(self, topic: str, channel: str, due: int, data: bytes) -> bool:
        """:meth:`_snap_msg`'s item kept whole (True), or not (False: message by message)."""
        ids, starts, stride = _index_frames(data)
        n = len(starts)
        if n < 2:
            return False
        order = ids if ids is not None else list(map(_first, _id_struct(stride).iter_unpack(data)))
        first, last = order[0], order[-1]
        if first >= last or order != sorted(order):
            return False
        runs = self.runs
        if first > self.max_id:
            run = ShadowRun(topic, due, data, frozenset((channel,)) if channel else None, first, last,
                            starts, stride)  # IDs read again when first needed, not kept now
            run.open = False
            runs.append(run)
            self._firsts.append(first)
            self.live_bytes += len(data)
            self.max_id = last
            return True
        i = bisect_right(self._firsts, first) - 1
        if channel and i >= 0:
            run = runs[i]
            if (run.first == first and run.last == last and run.left == n and not run.gone
                    and not run.gathered and run.topic == topic and run.due == due and run.pending is not None
                    and len(run.data) == len(data)):
                run.pending = run.pending | {channel}
                return True
        return False

    def unfinished_topics(self) -> set[str]:
        """The topics of every unfinished message."""
        return {m.topic for m in self.messages.values()} | {run.topic for run in self.runs}

    def each_unfinished(self) -> Iterator[tuple[str, int, frozenset[str] | None, bytes | memoryview]]:
        """``(topic, due, pending channels, frame as held)`` of every unfinished message, in
        publish order, changing nothing (no object per message is made)."""
        held = sorted(self.messages.items())
        i = 0
        for run in list(self.runs):
            for mid, frame in run.each():
                while i < len(held) and held[i][0] < mid:
                    m = held[i][1]
                    yield m.topic, m.due, m.pending, m.raw
                    i += 1
                yield run.topic, run.due, run.pending, frame
        for _, m in held[i:]:
            yield m.topic, m.due, m.pending, m.raw

    def count(self) -> int:
        """How many messages are unfinished."""
        return len(self.messages) + sum(run.left for run in self.runs)

    def _run_of(self, mid: bytes) -> ShadowRun | None:
        """The run still holding ``mid``, found by ID range (None: no run holds it)."""
        i = bisect_right(self._firsts, mid) - 1
        if i < 0:
            return None
        run = self.runs[i]
        return run if run.has(mid) else None

    def _leave(self, run: ShadowRun, mid: bytes) -> None:
        run.gone.add(mid)
        run.left -= 1
        if not run.left:
            i = bisect_left(self._firsts, run.first)
            del self.runs[i]
            del self._firsts[i]

    def _solo(self, run: ShadowRun, mid: bytes) -> ShadowMessage:
        m = self.messages[mid] = run.solo(mid)
        if m.open and m.pending is not None:  # opened by a channel of this batch: closed with it
            self._opened.append(m)
        self._leave(run, mid)
        return m

    def _of_topic(self, topic: str) -> list[ShadowMessage | ShadowRun]:
        """Each message object of ``topic`` (a run once, however many of its messages are left)."""
        out: list[ShadowMessage | ShadowRun] = [m for m in self.messages.values() if m.topic == topic]
        out.extend(run for run in self.runs if run.topic == topic)
        return out

    def _items_of_topic(self, topic: str) -> list[tuple[bytes, ShadowMessage]]:
        return [(mid, m) for mid, m in self.messages.items() if m.topic == topic]

    def _solid(self, topic: str | None) -> None:
        """Give every message of ``topic`` (None: of every topic) still in a run its own object."""
        for run in [r for r in self.runs if topic is None or r.topic == topic]:
            for mid in run.remaining():
                self._solo(run, mid)

    def _drop(self, mid: bytes, m: ShadowMessage) -> None:
        del self.messages[mid]
        self.live_bytes -= len(m.raw)

    def unfinished(self) -> list[ShadowMessage]:
        """Every message some channel has not finished, in publish order (the IDs of one
        origin increase)."""
        self._solid(None)
        return [m for _, m in sorted(self.messages.items())]

    def snapshot(self) -> list[wire.Entry]:
        """BATCH items that rebuild this state from nothing (a compacted shadow log)."""
        out: list[wire.Entry] = [(wire.SNAP_BEGIN, "", "", 0, wire.epoch_data(self.epoch))]
        out.extend(topology_entries((t, sorted(chs)) for t, chs in self.topics.items()))
        out.extend((wire.PAUSE, t, c, 0, b"") for t, c in sorted(self.paused))
        # frames as held (views of the log are joined where they are sent); a run untouched
        # goes whole, once per channel (rebuilt as one run, see _snap_msg), in ID order
        held = sorted(self.messages.items())
        i = 0

        def add(topic: str, due: int, pending: frozenset[str] | None, data: Any) -> None:
            if pending is None:
                out.append((wire.SNAP_MSG, topic, "", due, data))
            else:
                out.extend((wire.SNAP_MSG, topic, ch, due, data) for ch in sorted(pending))

        for run in self.runs:
            while i < len(held) and held[i][0] < run.first:
                m = held[i][1]
                add(m.topic, m.due, m.pending, m.raw)
                i += 1
            if run.gathered or run.gone:  # its frames, in pieces of at most a snapshot item
                for piece in run.pieces(SNAPSHOT_BATCH_BYTES // 2):
                    add(run.topic, run.due, run.pending, piece)
            else:
                add(run.topic, run.due, run.pending, run.data)
        for _, m in held[i:]:
            add(m.topic, m.due, m.pending, m.raw)
        out.append((wire.SNAP_END, "", "", 0, self.max_id))
        return out


def topology_entries(topics: Any) -> list[wire.Entry]:
    out: list[wire.Entry] = []
    for topic, channels in topics:
        out.append((wire.TOPIC_NEW, topic, "", 0, b""))
        out.extend((wire.CHANNEL_NEW, topic, ch, 0, b"") for ch in channels)
    return out


def outstanding(broker: Broker, epoch: int, entry_bytes: int = SNAPSHOT_BATCH_BYTES // 2) -> Iterator[wire.Entry]:
    """A catch-up snapshot of an origin's broker: every durable topic and channel, which are
    paused, and every message not finished on each channel (queued in memory or on disk, in
    flight, deferred with its due time) or waiting in a topic's own queue, framed by
    ``SNAP_BEGIN``/``SNAP_END``.  Reads only; changes no position, counter or state.

    Taken when called, made as it is consumed: what is in memory is captured at once (lists
    of the frames held, no copies), what is on disk is read from the queue files as they were
    when called (``snapshot_records``), a read chunk at a time, so the snapshot of a large
    backlog is never in memory whole.  The messages of one queue go in entries of at most
    about ``entry_bytes`` each, so that it goes out in batches a peer takes (below
    :data:`~wire.MAX_FRAME`), not one entry per queue."""
    head: list[wire.Entry] = [(wire.SNAP_BEGIN, "", "", 0, wire.epoch_data(epoch))]
    #: (topic, channel, due in ns or None: each record's own, frames or records)
    parts: list[tuple[str, str, int | None, Iterable[Any]]] = []

    def queued(topic: str, channel: str, mem: Any, backend: Any) -> None:
        parts.append((topic, channel, 0, mem.peek(mem.depth())))
        records = getattr(backend, "snapshot_records", None)
        if records is not None and backend.depth():
            parts.append((topic, channel, None, records()))

    for t in list(broker.topics.values()):
        if t.ephemeral:
            continue
        names = [c for c in t.channels if not is_ephemeral(c)]
        head.extend(topology_entries([(t.name, names)]))
        if t.paused:
            head.append((wire.PAUSE, t.name, "", 0, b""))
        queued(t.name, "", t.mem, t.backend)
        parts.extend((t.name, "", int(at * 1e9), (frame,)) for at, frame in t.deferred)
        for name in names:
            ch = t.channels[name]
            if ch.paused:
                head.append((wire.PAUSE, t.name, name, 0, b""))
            parts.append((t.name, name, 0, [f for mid, ep in ch.inflight.items()
                                             if (f := ep.msgs.get(mid)) is not None]))
            queued(t.name, name, ch.mem, ch.backend)
            parts.extend((t.name, name, int(at * 1e9), (frame,)) for at, _, frame in ch.deferred)
    return _snapshot_entries(head, parts, entry_bytes)


def _snapshot_entries(head: list[wire.Entry], parts: list[tuple[str, str, int | None, Iterable[Any]]],
                      entry_bytes: int) -> Iterator[wire.Entry]:
    """:func:`outstanding`'s entries, made from what it captured."""
    yield from head
    top = wire.NO_ID
    for topic, channel, due, items in parts:
        frames: list[bytes] = []
        size = 0
        if due is None:  # disk records: (frame, body size, deferred until or None)
            for frame, _, until in items:
                mid = frame[18:34]
                if mid > top:
                    top = mid
                if until is not None:
                    yield (wire.SNAP_MSG, topic, channel, int(until * 1e9), frame)
                    continue
                frames.append(frame)
                size += len(frame)
                if size >= entry_bytes:
                    yield (wire.SNAP_MSG, topic, channel, 0, b"".join(frames))
                    frames = []
                    size = 0
            due = 0
        else:
            for frame in items:
                mid = frame[18:34]
                if mid > top:
                    top = mid
                frames.append(frame)
                size += len(frame)
                if size >= entry_bytes:
                    yield (wire.SNAP_MSG, topic, channel, due, b"".join(frames))
                    frames = []
                    size = 0
        if frames:
            yield (wire.SNAP_MSG, topic, channel, due, b"".join(frames))
    yield (wire.SNAP_END, "", "", 0, top)


def iter_chunks(entries: Iterable[wire.Entry], limit: int) -> Iterator[list[wire.Entry]]:
    """``entries`` cut into batches of about ``limit`` bytes of data each, as they are
    needed (at least one batch, maybe empty)."""
    cur: list[wire.Entry] = []
    size = 0
    made = False
    for e in entries:
        cur.append(e)
        size += len(e[4]) + 40
        if size >= limit:
            yield cur
            made = True
            cur = []
            size = 0
    if cur or not made:
        yield cur


# --- adoption ---------------------------------------------------------------------------


class AdoptionPolicy(Protocol):
    """Decides when a peer adopts an origin's shadow: the one place that decision is made
    (today :class:`AdoptAfterTimeout`; a lease held in etcd could be another)."""

    def origin_up(self, origin: int, now: float) -> None:
        """A link from ``origin`` is up (it lives)."""

    def origin_down(self, origin: int, now: float) -> None:
        """The last link from ``origin`` is gone (or this node started with its shadow)."""

    def due(self, now: float) -> list[int]:
        """Origins to adopt now (each returned once per time it went down)."""


class AdoptAfterTimeout:
    """Adopt an origin whose links have all been down for ``--adopt-after``."""

    def __init__(self, adopt_after: float) -> None:
        self.adopt_after = adopt_after
        self.down_since: dict[int, float] = {}

    def origin_up(self, origin: int, now: float) -> None:
        self.down_since.pop(origin, None)

    def origin_down(self, origin: int, now: float) -> None:
        self.down_since.setdefault(origin, now)

    def due(self, now: float) -> list[int]:
        out = [o for o, since in self.down_since.items() if now - since >= self.adopt_after]
        for o in out:
            del self.down_since[o]
        return out


def adopt(broker: Broker, state: ShadowState, now: float) -> tuple[int, int]:
    """Republish every unfinished message of an origin's shadow into ``broker``: to each
    channel that had not finished it (created if needed), or to its topic when it had no
    channel yet; the frame is the origin's (ID, timestamp, attempts kept), a message due
    later (DPUB, delayed REQ) is deferred to its due time.  Returns ``(adopted, refused)``
    (refused: the queues would not take it, e.g. a full disk and full memory queue)."""
    adopted = refused = 0
    for topic_name, due_ns, pending, raw in state.each_unfinished():
        due = due_ns / 1e9
        frame = bytes(raw)  # of its own (the shadow may hold a view of its log)
        try:
            topic = broker.get_topic(topic_name, now)
            if pending is None:
                if due > now:
                    topic.put_deferred(frame, len(frame) - 34, due)
                else:
                    topic.put(run_of_frame(frame), len(frame) - 34)
            else:
                for name in sorted(pending):
                    ch = topic.get_channel(name, now)
                    if due > now:
                        ch.put_deferred(frame, due)
                    else:
                        ch.accept(run_of_frame(frame))
                        broker.dirty.add(ch)
            adopted += 1
        except Exception:
            refused += 1
    for topic_name, channel_name in sorted(state.paused):  # paused on the origin: paused here
        t = broker.topics.get(topic_name)
        if t is None:
            continue
        if not channel_name:
            t.pause()
        elif (c := t.channels.get(channel_name)) is not None:
            c.pause()
    return adopted, refused



# --- what /stats, /metrics and nsqadmin show per peer --------------------------------------


class PeerLag:
    """How far a peer that is down is behind, in messages and seconds (kept by the glue beside
    the :class:`ReplicationOrigin`, read by :func:`peer_stats`; a linked peer's lag is the
    origin's own count of what it sent and the peer did not acknowledge yet).

    :meth:`sent` is told how many messages each batch carried; :meth:`down` and :meth:`up`
    when a peer leaves and enters sync, so that a peer that is down lags by what was accepted
    since."""

    def __init__(self, now: float) -> None:
        #: every message accepted (replicated or not) since the start
        self.accepted = 0
        #: address -> (when it went down, messages accepted then); a peer never in sync since
        #: the start counts from the start
        self.left: dict[str, tuple[float, int]] = {}
        self.start = now

    def sent(self, count: int) -> None:
        self.accepted += count

    def down(self, address: str, now: float) -> None:
        self.left.setdefault(address, (now, self.accepted))

    def up(self, address: str) -> None:
        self.left.pop(address, None)


def peer_stats(origin: ReplicationOrigin, lag: PeerLag, now: float) -> list[dict[str, Any]]:
    """Per peer, what an operator asks: the link's figures (:meth:`ReplicationOrigin.peer_stats`)
    and ``sync_state`` (``in_sync``, ``catching_up`` or ``down``); for a peer that is down,
    ``lag_messages`` is what this node accepted since it went down and ``lag_seconds`` how long
    it has been down.  Read-only."""
    out = origin.peer_stats(now)
    for entry, p in zip(out, origin.peers.values(), strict=True):
        sync = "in_sync" if p.state == IN_SYNC else "catching_up" if p.state == "catching_up" else "down"
        entry["sync_state"] = sync
        if sync == "down":
            since, accepted = lag.left.get(p.address, (lag.start, 0))
            entry["lag_messages"] = lag.accepted - accepted
            entry["lag_seconds"] = round(max(0.0, now - since), 3)
    return out
