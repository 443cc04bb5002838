"""
A channel's dead letters: messages its policy gave up on (see :mod:`.policy`), kept in order.

A dead message is out of the channel's queue for good: it is not delivered again until it is
*redriven* (put back with fresh attempts) or *emptied*.  Each is kept as its frame (attempts
as its next delivery would carry them, so a peek shows how many deliveries it had), when it
died and why.  A message ID is kept once: after a crash a disk queue may hand back a message
that had already died, and it dies again without a second copy.

Where the channel is durable, every change also goes to a :class:`DeadSink` (the file of
:mod:`nsqtw.backend.deadletters`) before the message's queue record is released, so dead
letters survive a restart and a ``kill -9``.  This module is sans-IO: the sink does the I/O.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol
from collections.abc import Iterable, Iterator

import attrs

__all__ = ["DeadLetter", "DeadLetters", "DeadSink"]


@attrs.frozen
class DeadLetter:
    """One dead message."""

    #: the message frame (size, frame type, timestamp, attempts of its next delivery, ID, body)
    frame: bytes
    #: when it died (seconds, the broker's clock)
    died_at: float
    #: why: ``max_attempts``, ``max_age`` or ``max_depth``
    reason: str

    @property
    def id(self) -> bytes:
        return self.frame[18:34]


class DeadSink(Protocol):
    """Where a durable channel's dead letters are written (the I/O side)."""

    def load(self) -> list[DeadLetter]:
        """Every dead letter stored, oldest first."""

    def append(self, letters: list[DeadLetter]) -> None:
        """Store more (durably before it returns, when the node syncs every message)."""

    def rewrite(self, letters: list[DeadLetter]) -> None:
        """Replace what is stored by ``letters`` (after a redrive or an empty)."""

    def delete(self) -> None:
        """The channel was deleted: remove what is stored."""


class DeadLetters:
    """The dead letters of one channel, oldest first."""

    __slots__ = ("_items", "_ids", "sink")

    def __init__(self, sink: DeadSink | None = None) -> None:
        self._items: deque[DeadLetter] = deque()
        self._ids: set[bytes] = set()
        self.sink = sink
        if sink is not None:
            for letter in sink.load():
                self._keep(letter)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, mid: object) -> bool:
        """True when the message ID ``mid`` is dead here."""
        return mid in self._ids

    def __iter__(self) -> Iterator[DeadLetter]:
        return iter(self._items)

    def _keep(self, letter: DeadLetter) -> bool:
        mid = letter.id
        if mid in self._ids:
            return False
        self._ids.add(mid)
        self._items.append(letter)
        return True

    def add(self, frames: Iterable[bytes], died_at: float, reason: str) -> int:
        """Keep ``frames`` as dead; returns how many were new (an ID already dead is kept once)."""
        new = [letter for letter in (DeadLetter(f, died_at, reason) for f in frames) if self._keep(letter)]
        if new and self.sink is not None:
            self.sink.append(new)
        return len(new)

    def take(self, n: int | None = None) -> list[DeadLetter]:
        """Remove and return the ``n`` oldest (all when None)."""
        items = self._items
        count = len(items) if n is None else min(n, len(items))
        out = [items.popleft() for _ in range(count)]
        for letter in out:
            self._ids.discard(letter.id)
        if out and self.sink is not None:
            self.sink.rewrite(list(items))
        return out

    def first(self, n: int) -> list[DeadLetter]:
        """The ``n`` oldest, changing nothing (for a peek)."""
        out: list[DeadLetter] = []
        for letter in self._items:
            if len(out) >= n:
                break
            out.append(letter)
        return out

    def delete(self) -> None:
        self._items.clear()
        self._ids.clear()
        if self.sink is not None:
            self.sink.delete()
