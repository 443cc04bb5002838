"""
The origin's side of replicated publish (sans-IO): what it records, the numbered batches it sends
to every peer in sync, the peers' acknowledgements, and the publish barrier.

An nsqd started with ``--replica-peer`` records every message it accepts (its stored frames,
IDs and timestamps included) in :class:`ReplicationOrigin`; at the end of each reactor turn the
records go out as one numbered batch to every peer in sync (the group commit of the fsync,
applied to the network).  A publisher's answer is held (:meth:`ReplicationOrigin.barrier`)
until ``--replication-min-acks`` peers acknowledged a batch covering it, as ``--sync-every=1``
holds it until the fsync.  When fewer peers are in sync than required, a publish is refused
(``E_PUB_FAILED``) unless ``--replication-degraded=accept``: then it waits for the peers
there are, or for none.  Nothing here imports a reactor; times are passed in.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

from ....protocol import replication as wire
from .shadow import SNAPSHOT_BATCH_BYTES, iter_chunks

__all__ = ["PublishRefused", "PeerState", "ReplicationOrigin", "PeerLag", "peer_stats",
           "IN_SYNC", "CATCHING_UP", "CONNECTING", "OUT_OF_SYNC", "MAX_LAG_MESSAGES", "SNAPSHOT_WINDOW",
           "SMALL_BATCH_BYTES", "SNAPSHOT_SEQS"]

IN_SYNC = "in_sync"
CATCHING_UP = "catching_up"
CONNECTING = "connecting"
OUT_OF_SYNC = "out_of_sync"

#: a peer more messages behind than this (sent, not acknowledged) has fallen behind: its link is
#: dropped and it catches up from a snapshot when it links again
MAX_LAG_MESSAGES = 1_000_000
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

    def policy(self, topic: str, channel: str, record: bytes) -> None:
        """A channel's policy was set (``record``: its JSON, empty for none): in order with the
        publishes."""
        self.pending.append((wire.POLICY, topic, channel, 0, record))

    def dead(self, topic: str, channel: str, frames: list[bytes], why: int) -> None:
        """Messages died on a channel (kept there as dead letters; ``why`` the index of their
        reason): their frames go along, so a peer that adopts this node keeps them as dead
        letters too."""
        self.pending.append((wire.DEAD, topic, channel, why, b"".join(frames)))

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
