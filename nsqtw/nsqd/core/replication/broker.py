"""
The broker of a replicated nsqd (sans-IO): a :class:`~nsqtw.nsqd.core.broker.Broker` built with
:class:`StoreHooks`, to which it hands what it stores and what its channels finish and requeue.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from ....errors import FinFailed
from ....options import NsqdOptions
from ..broker import BackendFactory, Broker
from ..channel import Channel
from ..client import ClientState
from ..policy import REASONS, ChannelPolicy
from ..topic import Topic
from .shadow import policy_record

__all__ = ["ReplicatedBroker", "ReplicatedChannel", "StoreHooks"]


@attrs.frozen
class StoreHooks:
    """What a :class:`ReplicatedBroker` tells replication, given to it at construction."""

    #: a publish was stored: ``(topic, due in ns or 0, its stored frames, how many)``
    record: Callable[[str, int, bytes, int], None]
    #: a channel finished a message: ``(topic, channel, message ID)``
    fin: Callable[[str, str, bytes], None]
    #: a channel requeued a message: ``(topic, channel, message ID, due in ns or 0)``
    req: Callable[[str, str, bytes, int], None]
    #: a channel's policy was set: ``(topic, channel, its record as JSON or b"" for none)``
    policy: Callable[[str, str, bytes], None] = lambda topic, channel, record: None
    #: messages died on a channel and are kept there as dead letters: ``(topic, channel, frames,
    #: the index of their reason in nsqtw.nsqd.core.policy.REASONS)``
    dead: Callable[[str, str, list[bytes], int], None] = lambda topic, channel, frames, why: None


class ReplicatedChannel(Channel):
    """A :class:`Channel` that tells its broker's :class:`StoreHooks` what its consumers
    finished and requeued (ephemeral channels tell nothing)."""

    __slots__ = ("_in_many", "_hooks")

    def __init__(self, topic: Topic, name: str, broker: Broker, backend: Any, now: float) -> None:
        super().__init__(topic, name, broker, backend, now)
        self._in_many = False
        assert isinstance(broker, ReplicatedBroker)
        self._hooks = broker.hooks

    def finish(self, client: ClientState, mid: bytes, now: float) -> None:
        super().finish(client, mid, now)
        if not self._in_many and not self.ephemeral:
            self._hooks.fin(self.topic.name, self.name, mid)

    def finish_many(self, client: ClientState, ids: list[bytes], now: float) -> list[FinFailed]:
        inflight = self.inflight
        owned = [mid for mid in ids if (ep := inflight.get(mid)) is not None and ep.client is client]
        self._in_many = True
        try:
            errors = super().finish_many(client, ids, now)
        finally:
            self._in_many = False
        if not self.ephemeral:
            fin = self._hooks.fin
            name = self.topic.name
            for mid in owned:
                fin(name, self.name, mid)
        return errors

    def requeue(self, client: ClientState, mid: bytes, delay: float, now: float) -> None:
        dead = len(self.dead) if self.dead is not None else 0
        super().requeue(client, mid, delay, now)
        if not self.ephemeral and (self.dead is None or len(self.dead) == dead):  # not died instead
            self._hooks.req(self.topic.name, self.name, mid, int((now + delay) * 1e9) if delay > 0 else 0)

    def _died(self, frames: list[bytes], reason: str) -> None:
        if not self.ephemeral:
            self._hooks.dead(self.topic.name, self.name, frames, REASONS.index(reason))

    def _dropped(self, ids: list[bytes]) -> None:
        if not self.ephemeral:
            fin = self._hooks.fin
            for mid in ids:
                fin(self.topic.name, self.name, mid)

    def empty_dead(self) -> int:
        ids = [letter.id for letter in self.dead] if self.dead is not None else []
        n = super().empty_dead()
        self._dropped(ids)
        return n


class ReplicatedBroker(Broker):
    """A :class:`Broker` that hands every accepted publish (its stored frames) to
    ``hooks.record``, and its channels' FINs and REQs to ``hooks.fin``/``hooks.req``; used only
    when ``--replica-peer`` is given, so an unreplicated nsqd runs the plain broker's and
    channel's paths unchanged.  Ephemeral topics and channels are not replicated (their
    messages may be dropped anyway).  What :meth:`Broker.store_frame` stores (an adopted
    message) is not recorded: adoption sends it to the peers as a snapshot."""

    channel_class = ReplicatedChannel

    def __init__(self, options: NsqdOptions, now: float, *, hooks: StoreHooks,
                 backend_factory: BackendFactory | None = None, rng: Any = None) -> None:
        super().__init__(options, now, backend_factory=backend_factory, rng=rng)
        self.hooks = hooks
        self._record = hooks.record

    def _put(self, topic: Topic, run: Any, nbytes: int) -> None:
        super()._put(topic, run, nbytes)
        if not topic.ephemeral:
            blob, offsets, length = run
            self._record(topic.name, 0, blob if len(blob) == length else blob[:length], len(offsets))

    def set_policy(self, topic_name: str, channel_name: str, policy: ChannelPolicy, now: float) -> Channel:
        ch = super().set_policy(topic_name, channel_name, policy, now)
        if not ch.ephemeral and not ch.topic.ephemeral:
            self.hooks.policy(topic_name, channel_name, policy_record(policy) if ch.policy is not None else b"")
        return ch

    def _put_deferred(self, topic: Topic, frame: bytes, nbytes: int, due: float) -> None:
        super()._put_deferred(topic, frame, nbytes, due)
        if not topic.ephemeral:
            self._record(topic.name, int(due * 1e9), frame, 1)
