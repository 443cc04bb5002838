"""The ``#ephemeral`` overflow backend: accepts everything, keeps nothing."""

from __future__ import annotations


from zope.interface import implementer

from . import IBackendQueue
from .runs import Run

__all__ = ["DummyQueue"]


@implementer(IBackendQueue)
class DummyQueue:
    """NSQ's ``dummyBackendQueue``: overflow of ephemeral queues is discarded."""

    __slots__ = ("dropped",)

    accepts_all = True
    #: keeps nothing: never a disk a publish must wait for (see nsqtw.nsqd.core.backlog)
    durable = False

    def __init__(self) -> None:
        self.dropped = 0

    def put(self, run: Run) -> Run | None:
        self.dropped += len(run[1])
        return None

    def read(self, n: int, max_bytes: int = 0) -> list[Run]:
        return []

    def depth(self) -> int:
        return 0

    def empty(self) -> None:
        pass

    def delete(self) -> None:
        pass

    def close(self) -> None:
        pass
