"""The one place the disk code fsyncs, and a throwaway broker's way to skip it.

A broker whose data directory is deleted when it stops (an embedded broker or a test fixture on
a temporary directory) needs none of its writes to survive a power loss, so its
:class:`~nsqtw.backend.sync.SyncWorker` runs every job through :func:`without_fsync`: the writes,
renames and unlinks happen, the fsyncs do not.  That keeps such a broker's disk work off the
reactor's critical path without a thread, even where ``/dev/shm`` is missing and the directory
is on a real disk.  The setting is per thread, so a durable broker's worker thread in the same
process still fsyncs everything."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["fsync", "without_fsync"]

_T = TypeVar("_T")
_local = threading.local()


def fsync(fd: int) -> None:
    """``os.fsync(fd)``, unless this thread runs a throwaway broker's job (see the module)."""
    if not getattr(_local, "skip", False):
        os.fsync(fd)


def without_fsync(fn: Callable[..., _T], *args: Any) -> _T:
    """Run ``fn(*args)`` on this thread with :func:`fsync` doing nothing."""
    was = getattr(_local, "skip", False)
    _local.skip = True
    try:
        return fn(*args)
    finally:
        _local.skip = was
