"""
Where queued messages live: one interface, three kinds of store.

Every topic and channel keeps a bounded :class:`~nsqtw.backend.memory.MemoryQueue`
and an overflow backend: the disk queue (byte-compatible with go-diskqueue) for
ordinary names, the :class:`~nsqtw.backend.dummy.DummyQueue` for ``#ephemeral``
ones, which stores nothing.  All of them speak :class:`IBackendQueue` in runs of
wire-ready frames (see :mod:`nsqtw.backend.runs`), so the broker never knows
which one it talks to.
"""

from __future__ import annotations

from zope.interface import Attribute, Interface

__all__ = ["IBackendQueue"]


class IBackendQueue(Interface):
    """A FIFO-ish store of message frames (NSQ's ``BackendQueue``)."""

    durable = Attribute("True if what this queue holds survives a restart.")

    def put(run):  # type: ignore[no-untyped-def]
        """
        Store as much of ``run`` as fits, in order.

        Returns the part not stored, or None when all of it was.  A queue
        that stores everything (disk, dummy) always returns None.
        """

    def read(n, max_bytes=0):  # type: ignore[no-untyped-def]
        """Remove and return up to ``n`` messages as a list of runs; with ``max_bytes``,
        stop once about that many bytes are taken (always at least one message)."""

    def depth():  # type: ignore[no-untyped-def]
        """Messages held."""

    def empty():  # type: ignore[no-untyped-def]
        """Drop everything held."""

    def delete():  # type: ignore[no-untyped-def]
        """Drop everything and release any files; the queue is not used again."""

    def close():  # type: ignore[no-untyped-def]
        """Make what is held durable (if the queue is) and release resources."""
