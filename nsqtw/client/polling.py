"""
Shared lookupd polling: the consumers of one process that poll the same nsqlookupd addresses for
the same topic at the same interval share one periodic query.

go-nsq polls once per consumer; a process holding hundreds of consumers over a few dozen topics
then asks each lookupd the same question many times a minute.  Here each consumer still asks at
once when it connects to a lookupd and when one of its connections closes (go-nsq's recheck), and
the periodic poll is made by a :class:`PollGroup`: one loop per (clock, topic, lookupd addresses,
interval, authorization, HTTP client), whose answer goes to every member, each applying its own
discovery filter and connecting to what it lacks.  The group lives while it has members.
"""

from __future__ import annotations

import weakref
from typing import Any

from twisted.internet import task
from twisted.logger import Logger

__all__ = ["PollGroup", "join_poll_group"]

log = Logger(namespace="nsqtw.client")

#: clock -> group key -> group (a clock that is gone takes its groups with it)
_GROUPS: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], PollGroup]] = weakref.WeakKeyDictionary()


class PollGroup:
    """The consumers sharing one periodic lookupd query (see the module's docstring)."""

    def __init__(self, clock: Any, key: tuple[Any, ...], interval: float) -> None:
        self.clock = clock
        self.key = key
        self.interval = interval
        self.members: list[Any] = []
        self.loop = task.LoopingCall(self.poll)
        self.loop.clock = clock

    def join(self, consumer: Any) -> None:
        if consumer not in self.members:
            self.members.append(consumer)
        if not self.loop.running:
            self.loop.start(self.interval, now=False)

    def leave(self, consumer: Any) -> None:
        if consumer in self.members:
            self.members.remove(consumer)
        if not self.members:
            if self.loop.running:
                self.loop.stop()
            groups = _GROUPS.get(self.clock)
            if groups is not None and groups.get(self.key) is self:
                del groups[self.key]
                if not groups:
                    _GROUPS.pop(self.clock, None)

    def poll(self) -> None:
        """One query for the whole group, made by a member that is not querying already."""
        members = [c for c in self.members if not c.stopping]
        for leader in members:
            if leader._querying is None:
                leader._query_lookupd([c for c in members if c is not leader])
                return
        # every member is querying already: each of those answers reaches its own consumer


def join_poll_group(consumer: Any, key: tuple[Any, ...]) -> PollGroup:
    """Put ``consumer`` in the group for ``key`` on its clock (made if needed) and return it."""
    clock = consumer.reactor
    groups = _GROUPS.setdefault(clock, {})
    group = groups.get(key)
    if group is None:
        group = groups[key] = PollGroup(clock, key, consumer.config.lookupd_poll_interval)
    group.join(consumer)
    return group
