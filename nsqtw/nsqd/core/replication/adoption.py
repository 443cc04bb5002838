"""
Adoption (sans-IO): when a peer takes over an origin's shadow (:class:`AdoptionPolicy`) and how
its unfinished messages are republished into the peer's own broker (:func:`adopt`).
"""

from __future__ import annotations

import json
from typing import Protocol

from ....errors import BrokerError
from ....protocol import replication as wire
from ..broker import Broker
from ..policy import REASONS, ChannelPolicy
from .shadow import ShadowState

__all__ = ["AdoptionPolicy", "AdoptAfterTimeout", "AdoptionArbiter", "PeerRule", "adopt", "choose", "ADOPT",
           "STAND_BY", "FORGET", "WAIT"]


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


def adopt(broker: Broker, state: ShadowState, now: float, done: set[bytes] | None = None) -> tuple[int, int]:
    """Republish every unfinished message of an origin's shadow into ``broker`` through its
    store path (:meth:`~nsqtw.nsqd.core.broker.Broker.store_frame`): to each channel that had
    not finished it (created if needed), or to its topic when it had no channel yet; the frame
    is the origin's (ID, timestamp, attempts kept), a message due later (DPUB, delayed REQ) is
    deferred to its due time.  Returns ``(adopted, refused)`` (refused: the queues would not
    take it, e.g. a full disk and full memory queue).

    ``done``, when given, holds the IDs of messages adopted by an earlier try of the same
    adoption: they are skipped, and the IDs adopted now are added to it (an adoption that a
    full disk cut short is tried again for what is left, without republishing the rest)."""
    adopted = refused = 0
    for topic_name, due_ns, pending, raw in state.each_unfinished():
        frame = bytes(raw)  # of its own (the shadow may hold a view of its log)
        mid = frame[18:34]
        if done is not None and mid in done:
            continue
        try:
            broker.store_frame(topic_name, None if pending is None else sorted(pending), frame, due_ns / 1e9, now)
        except Exception:
            refused += 1
            continue
        adopted += 1
        if done is not None:
            done.add(mid)
    for (topic_name, channel_name), record in sorted(state.policies.items()):  # its channels' policies
        try:
            policy = ChannelPolicy.from_record(json.loads(record))
            broker.get_topic(topic_name, now).get_channel(channel_name, now)
            broker.set_policy(topic_name, channel_name, policy, now)
        except (ValueError, TypeError, BrokerError):
            continue
    for (topic_name, channel_name), letters in sorted(state.dead.items()):  # and their dead letters
        try:
            ch = broker.get_topic(topic_name, now).get_channel(channel_name, now)
        except BrokerError:
            continue
        for code in sorted({why for _, why in letters.values()}):
            reason = REASONS[code] if 0 <= code < len(REASONS) else REASONS[0]
            ch.keep_dead([f for f, why in letters.values() if why == code], reason, now)
    for topic_name, channel_name in sorted(state.paused):  # paused on the origin: paused here
        t = broker.topics.get(topic_name)
        if t is None:
            continue
        if not channel_name:
            t.pause()
        elif (c := t.channels.get(channel_name)) is not None:
            c.pause()
    return adopted, refused


#: what :func:`choose` decides for an origin that is due
ADOPT = "adopt"
STAND_BY = "stand_by"
FORGET = "forget"
#: an arbiter that has not decided yet (its answer is on its way): ask again at the next check
WAIT = "wait"


class AdoptionArbiter(Protocol):
    """Who adopts an origin that is due (its links down for ``--adopt-after``): asked at each
    check while the origin stays due, it answers at once, ``(ADOPT | STAND_BY | FORGET | WAIT,
    the peer's node id or None)``; an arbiter that must ask elsewhere (etcd) answers ``WAIT``
    until it knows.  :class:`PeerRule` (the peers' own rule, :func:`choose`) when none is
    given."""

    def decide(self, origin: int, epoch: int, holders: list[tuple[int, int]], now: float) -> tuple[str, int | None]:
        """What this node does about ``origin``'s ``epoch`` now; ``holders`` as :func:`choose`
        takes them."""

    def adopted(self, origin: int, epoch: int) -> None:
        """This node adopted ``origin``'s ``epoch`` and its own peers stored what it adopted."""

    def status(self) -> list[dict[str, object]]:
        """What the arbiter waits for, per origin (for /stats): empty when nothing."""


class PeerRule:
    """The peers' own rule (:func:`choose` on what the links say, HOLDS frames): the lowest
    node id holding the shadow adopts."""

    def __init__(self, node_id: int) -> None:
        self.node_id = node_id

    def decide(self, origin: int, epoch: int, holders: list[tuple[int, int]], now: float) -> tuple[str, int | None]:
        return choose(self.node_id, holders)

    def adopted(self, origin: int, epoch: int) -> None:
        pass

    def status(self) -> list[dict[str, object]]:
        return []


def choose(node_id: int, holders: list[tuple[int, int]]) -> tuple[str, int | None]:
    """Who adopts an origin that is due, among the survivors that hold its shadow: this node
    (``node_id``) and its live peers ``holders`` (``(node id, HELD or ADOPTED)`` of each that
    said it holds the origin's shadow).

    * a peer says it adopted the origin (and its peers stored what it adopted): ``FORGET``
      this node's shadow, naming that peer;
    * a peer with a lower node id holds the shadow too: ``STAND_BY`` for it (it adopts; this
      node adopts after all if that peer is lost before it says it is done);
    * else ``ADOPT``.

    Every survivor runs the same rule on what its own links tell it, so exactly one adopts
    while they can see each other; survivors that cannot (a partition between them) may both
    adopt: duplicates, never loss."""
    done = [n for n, state in holders if state == wire.ADOPTED]
    if done:
        return FORGET, min(done)
    lower = [n for n, state in holders if state == wire.HELD and n < node_id]
    if lower:
        return STAND_BY, min(lower)
    return ADOPT, None
