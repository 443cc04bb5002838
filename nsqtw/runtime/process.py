"""
Process policy: the tuning a process of nsqtw's own applies, and nothing else ever does.

The drop-in commands (``nsqd``, ``nsqlookupd``, ``nsqadmin``: :mod:`nsqtw.cli`) and the twistd
plugins (``twistd nsqd``, ``nsqlookupd``, ``nsqadmin``, ``nsqtw``: :mod:`nsqtw.nsqd.tap` and the others) own their
process, so each applies :func:`apply_daemon_policy` once, to the service tree it built, before
that tree starts (before any listener opens):

* glibc's mmap threshold pinned at 128 KiB (:func:`~nsqtw.runtime.memory.tune_allocator`), so
  read buffers never leave holes between long-lived message blobs in the heap;
* a memory-trim loop (:class:`MemoryTrimService`, ``malloc_trim(0)`` once a second) added to
  the daemon's tree;
* the collector's pause timing (``gc.callbacks``) that ``/stats`` reports as
  ``gc_pause_usec_*``;
* warm-up threads: the HTTP stack's slow imports may run in a short thread after the first
  accept, so the TCP port answers at once;
* the garbage collector: the young generations collected, every object alive now (modules,
  classes, functions) frozen out of its reach (``gc.freeze``), and full collections ten times
  rarer.  This runs before any listener opens, so no connection object is ever frozen (a
  frozen connection would never be collected after it closes).

Library code (``start_nsqd``, ``start_nsqlookupd``, ``start_nsqadmin``, the pytest fixtures,
``build_nsqd`` and the other service trees) never calls this: an application embedding nsqtw
keeps its allocator, its collector, its ``gc.callbacks`` and its threads as they were.
"""

from __future__ import annotations

import gc
from typing import Any

from twisted.application.service import IServiceCollection
from twisted.logger import Logger

from .loop import LoopService

__all__ = ["apply_daemon_policy", "freeze_start_up_objects", "MemoryTrimService", "FULL_COLLECTION_EVERY",
           "TRIM_INTERVAL"]

log = Logger(namespace="nsqtw")

#: middle-generation collections between two full ones in a daemon of nsqtw's own (CPython: 10)
FULL_COLLECTION_EVERY = 100

#: seconds between two ``malloc_trim(0)`` in a daemon of nsqtw's own
TRIM_INTERVAL = 1.0


class MemoryTrimService(LoopService):
    """Give freed heap pages back to the OS once a second (glibc ``malloc_trim``), on ``clock``.

    Queued messages are long-lived blobs interleaved with short-lived read buffers; the holes
    those leave are free but stay resident.  A daemon's policy adds this to its tree; an
    embedded broker never runs it (a trim walks the host's whole heap on the host's reactor)."""

    def __init__(self, clock: Any, interval: float = TRIM_INTERVAL) -> None:
        from .memory import release_free_memory
        super().__init__(clock, interval, release_free_memory, "memory-trim")


def freeze_start_up_objects() -> None:
    """Move every object alive now out of the collector's reach and make full collections rare.

    Without it each full collection walks the start-up objects (modules, classes, functions)
    again, a pause in which no client is answered: a command sent just then goes unread, and a
    daemon killed during that pause resets its clients' connections (RST: unread data) instead
    of closing them.  Only the young generations are collected first: what start-up leaves as
    garbage sits there (a full collection right after the imports found nothing here and costs
    11-18 ms of start-up).  Full collections: once per 100 middle ones instead of 10; their pause
    grows with every live topic, channel and connection, while what the hot paths allocate is
    mostly bytes the collector never tracks."""
    gc.collect(1)
    gc.freeze()
    gen0, gen1, _ = gc.get_threshold()
    gc.set_threshold(gen0, gen1, FULL_COLLECTION_EVERY)


def apply_daemon_policy(service: Any, reactor: Any) -> None:
    """The one process-policy step of a daemon of nsqtw's own (see the module's docstring).

    ``service`` is the daemon's root service tree, built and not started: the memory-trim loop
    is added to it (on ``reactor``'s clock), then the collector is frozen, so call this last
    before the tree starts.  Refuses a running tree (its listeners may have accepted already)."""
    if getattr(service, "running", False):
        raise RuntimeError("apply_daemon_policy: the service tree is running already (apply it before start)")
    try:
        from .memory import install_gc_timing, tune_allocator
        tune_allocator()  # keep read buffers out of the heap
        install_gc_timing()  # /stats' gc_pause_usec_* figures
        from .listen import enable_warm_up_threads
        enable_warm_up_threads()  # slow imports may run in a thread after the first accept
    except Exception:  # pragma: no cover - never a reason not to start
        log.failure("process policy: tuning failed (the daemon starts untuned)")
    if IServiceCollection.providedBy(service) and not any(isinstance(s, MemoryTrimService) for s in service):
        MemoryTrimService(reactor).setServiceParent(service)
    freeze_start_up_objects()  # last: every import of the tree done, no listener open yet
