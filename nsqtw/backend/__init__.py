"""
Where queued messages live: one interface, three kinds of store.

Every topic and channel keeps a bounded :class:`~nsqtw.backend.memory.MemoryQueue`
and an overflow backend: the disk queue (byte-compatible with go-diskqueue) for
ordinary names, the :class:`~nsqtw.backend.dummy.DummyQueue` for ``#ephemeral``
ones, which stores nothing.  All of them speak :class:`IBackendQueue` in runs of
wire-ready frames (see :mod:`nsqtw.backend.runs`), so the broker never knows
which one it talks to.

Internal: applications import the public face (``nsqtw.embed``, ``nsqtw.client``, ``nsqtw.testing``, ``nsqtw.options``, ``nsqtw.errors``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zope.interface import Attribute, Interface

if TYPE_CHECKING:
    from .runs import Run

__all__ = ["IBackendQueue"]


class IBackendQueue(Interface):
    """A FIFO-ish store of message frames (NSQ's ``BackendQueue``): exactly what the broker uses.

    A queue may offer more, which the broker looks for by name: the disk queue's
    ``deferred_sink``, ``has_deferred_hints`` and ``put_deferred`` (deferred messages kept
    across a restart; the sink is set only on a queue that has hints),
    ``put_count`` (how much of a failed ``put`` was stored), ``peek`` and ``snapshot_records``
    (every record held, read lazily from the files as they were when it was called).
    """

    accepts_all = Attribute(
        "True if ``put`` stores every run (disk, dummy); False if it may hand part of it back"
        " (a queue with no disk behind it), so publishers must check for room first.")

    def put(run: Run) -> Run | None:
        """
        Store as much of ``run`` as fits, in order.

        Returns the part not stored, or None when all of it was.  A queue
        that stores everything (disk, dummy) always returns None.
        """

    def read(n: int, max_bytes: int = 0) -> list[Run]:
        """Remove and return up to ``n`` messages as a list of runs; with ``max_bytes``,
        stop once about that many bytes are taken (always at least one message)."""

    def depth() -> int:
        """Messages held."""

    def empty() -> Any:
        """Drop everything held (the disk queue answers a Deferred that fires when its files are gone)."""

    def delete() -> Any:
        """Drop everything and release any files; the queue is not used again (a Deferred, or None)."""

    def close() -> Any:
        """Make what is held durable (if the queue is) and release resources; a Deferred
        that fires when that is done, or None when there is nothing to wait for."""
