"""
Process memory and garbage-collector figures under nsqd's ``memory`` keys.

Go reports its runtime's heap; nsqtw reports the Python process it is:
``heap_objects`` is the interpreter's allocated block count,
``heap_in_use_bytes`` the resident set, ``heap_idle_bytes`` and
``heap_released_bytes`` the file-backed and swapped parts, the GC pause
percentiles come from timing the collector with ``gc.callbacks`` (in the
daemons only: see :func:`install_gc_timing`; embedded they are 0), and
``next_gc_bytes`` is how many allocations remain before the next young
collection.  The names stay NSQ's so dashboards and statsd graphs keep working.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from collections import deque

__all__ = ["mem_stats", "rss_bytes", "MEM_KEYS", "release_free_memory", "tune_allocator",
           "install_gc_timing"]

MEM_KEYS = (
    "heap_objects", "heap_idle_bytes", "heap_in_use_bytes", "heap_released_bytes",
    "gc_pause_usec_100", "gc_pause_usec_99", "gc_pause_usec_95", "next_gc_bytes", "gc_total_runs",
)

_pauses: deque[int] = deque(maxlen=256)
_gc_started: float | None = None


def _gc_callback(phase: str, info: dict[str, int]) -> None:
    global _gc_started
    if phase == "start":
        _gc_started = time.perf_counter()
    elif _gc_started is not None:
        _pauses.append(int((time.perf_counter() - _gc_started) * 1e9))
        _gc_started = None


def install_gc_timing() -> None:
    """Time the collector's pauses for ``gc_pause_usec_*`` (a ``gc.callbacks`` entry).

    Process-wide state: only a daemon of nsqtw's own installs it (:mod:`nsqtw.runtime.process`); an
    embedded broker's ``/stats`` reports its pause percentiles as 0."""
    if _gc_callback not in gc.callbacks:
        gc.callbacks.append(_gc_callback)

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int:
    """Resident set size of this process."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:  # pragma: no cover - not Linux
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _status() -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                key, _, value = line.partition(b":")
                if key in (b"RssAnon", b"RssFile", b"VmSwap"):
                    out[key.decode()] = int(value.split()[0]) * 1024
    except OSError:  # pragma: no cover
        pass
    return out


def _percentile(perc: float, values: list) -> int:
    if not values:
        return 0
    idx = int(len(values) * perc / 100.0 + 0.5) - 1
    idx = max(0, min(len(values) - 1, idx))
    return values[idx]


def mem_stats() -> dict[str, int]:
    status = _status()
    pauses = sorted(_pauses)
    threshold = gc.get_threshold()[0]
    count0 = gc.get_count()[0]
    return {
        "heap_objects": sys.getallocatedblocks(),
        "heap_idle_bytes": status.get("RssFile", 0),
        "heap_in_use_bytes": status.get("RssAnon", rss_bytes()),
        "heap_released_bytes": status.get("VmSwap", 0),
        "gc_pause_usec_100": _percentile(100.0, pauses) // 1000,
        "gc_pause_usec_99": _percentile(99.0, pauses) // 1000,
        "gc_pause_usec_95": _percentile(95.0, pauses) // 1000,
        "next_gc_bytes": max(0, threshold - count0),
        "gc_total_runs": sum(s.get("collections", 0) for s in gc.get_stats()),
    }


_libc: object = None


def _load_libc() -> object:
    global _libc
    if _libc is None:
        try:
            import ctypes
            try:  # glibc is loaded already: dlopen finds it at once (find_library runs ldconfig)
                lib = ctypes.CDLL("libc.so.6")
            except OSError:
                import ctypes.util
                lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            lib.malloc_trim.argtypes = [ctypes.c_size_t]
            lib.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
            _libc = lib
        except (OSError, AttributeError):
            _libc = False
    return _libc


def tune_allocator() -> bool:
    """Standalone daemons: keep large temporary buffers out of the heap (glibc ``mallopt``).

    glibc raises its mmap threshold each time a large block is freed, so the
    broker's read buffers end up in the heap between long-lived message blobs
    and leave holes.  Pinning the threshold at 128 KiB sends every read
    buffer (nsqd reads 256 KiB at a time) to mmap and keeps the heap dense.
    Not done for embedded brokers: it is a process-wide setting.
    """
    lib = _load_libc()
    if not lib:
        return False
    return bool(lib.mallopt(-3, 128 * 1024))  # type: ignore[attr-defined]  # M_MMAP_THRESHOLD


def release_free_memory() -> bool:
    """Give freed heap pages back to the OS (glibc ``malloc_trim``); False where unavailable.

    Queued messages are long-lived blobs interleaved with short-lived read
    buffers; the holes those leave are free but stay resident.  Trimming once
    a second costs about a millisecond on a 300 MB heap and keeps the
    resident size close to what the queues really hold.
    """
    lib = _load_libc()
    if not lib:
        return False
    lib.malloc_trim(0)  # type: ignore[attr-defined]  # ctypes resolves C functions by name at run time
    return True
