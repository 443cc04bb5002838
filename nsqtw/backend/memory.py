"""The bounded in-memory queue (``--mem-queue-size`` messages)."""

from __future__ import annotations

from bisect import bisect_right
from collections import deque

from zope.interface import implementer

from . import IBackendQueue
from .runs import Run, run_frames, split_run

__all__ = ["MemoryQueue"]


@implementer(IBackendQueue)
class MemoryQueue(deque[Run]):  # a deque of runs itself: see below
    """Holds up to ``capacity`` messages as runs; what does not fit is handed back.

    It is the deque of its runs itself (not an object holding one): every topic and
    channel has one, idle or not, and each object fewer per topic and channel is one
    fewer for every full garbage collection to walk.  Compared and hashed by
    identity, as any queue object; true when it holds runs.
    """

    __slots__ = ("capacity", "_count")

    accepts_all = False  # what does not fit is handed back
    durable = False
    __hash__ = object.__hash__  # type: ignore[assignment]  # by identity, not as a (mutable) sequence

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self._count = 0

    def __eq__(self, other: object) -> bool:
        return self is other

    def __ne__(self, other: object) -> bool:
        return self is not other

    def __repr__(self) -> str:
        return f"<MemoryQueue {self._count}/{self.capacity}>"

    def put(self, run: Run) -> Run | None:
        room = self.capacity - self._count
        n = len(run[1])
        if n <= room:
            self.append(run)
            self._count += n
            return None
        if room <= 0:
            return run
        head, rest = split_run(run, room)
        self.append(head)
        self._count += room
        return rest

    def force_put(self, run: Run) -> None:
        """Append ignoring capacity: a message the broker already held (a requeue, a timeout)
        is never refused, because refusing it would lose it."""
        self.append(run)
        self._count += len(run[1])

    def read(self, n: int, max_bytes: int = 0) -> list[Run]:
        """Up to ``n`` messages (with ``max_bytes``, about that many bytes; at least one)."""
        out: list[Run] = []
        runs = self
        taken = 0
        size = 0
        while runs and taken < n:
            run = runs[0]
            offs = run[1]
            k = len(offs)
            want = n - taken
            if max_bytes:
                room = max_bytes - size
                if room <= 0 and taken:
                    break
                run_bytes = run[2] - offs[0]
                if run_bytes > room:
                    # as many whole messages as fit (at least one)
                    fit = bisect_right(offs, offs[0] + max(room, 0)) - 1 if not isinstance(offs, range) \
                        else max(room, 0) // (offs.step or 1)
                    want = min(want, max(1, fit))
            if k <= want:
                out.append(runs.popleft())
                taken += k
                size += run[2] - offs[0]
            else:
                head, rest = split_run(run, want)
                runs[0] = rest
                out.append(head)
                taken += want
                size += head[2] - offs[0]
                if max_bytes:
                    break
        self._count -= taken
        return out

    def peek(self, n: int) -> list[bytes]:
        """The first ``n`` frames, oldest first, changing nothing."""
        out: list[bytes] = []
        for run in self:
            want = n - len(out)
            if want <= 0:
                break
            if len(run[1]) > want:
                run = split_run(run, want)[0]
            out.extend(run_frames(run))
        return out

    def depth(self) -> int:
        return self._count

    def room(self) -> int:
        return self.capacity - self._count

    def empty(self) -> None:
        self.clear()
        self._count = 0

    def delete(self) -> None:
        self.empty()

    def close(self) -> None:
        pass

    def drain(self) -> list[Run]:
        """Everything held, oldest first, leaving the queue empty."""
        out = list(self)
        self.empty()
        return out
