"""
Small files nsqtw writes beside a data directory's queues: whole (a temporary file, then a
rename over the old one) or appended, each fsynced when asked.
"""

from __future__ import annotations

import os

__all__ = ["write_atomically", "append"]


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_atomically(path: str, data: bytes, fsync: bool = True) -> None:
    """Replace ``path`` by ``data``: written beside it, fsynced when ``fsync``, then renamed over
    it, so a crash leaves the old file or the new one, never a part."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        _write_all(fd, data)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def append(path: str, data: bytes, fsync: bool = True) -> None:
    """Append ``data`` to ``path`` (created if needed), fsynced when ``fsync``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    try:
        _write_all(fd, data)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
