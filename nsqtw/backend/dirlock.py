"""
The exclusive lock on ``--data-path`` (NSQ's ``internal/dirlock``).

Two brokers writing the same diskqueue files would corrupt each other, so
nsqd takes a non-blocking ``flock(LOCK_EX)`` on the directory itself and
refuses to start when another process holds it.  The lock lives as long as
the directory's file descriptor, so a crashed broker never leaves a stale
lock behind (unlike a pid file).  Go's nsqd takes the same lock, so nsqtw and
nsqd also keep each other out of one directory.
"""

from __future__ import annotations

import fcntl
import os

__all__ = ["DirLock", "DataPathLocked"]


class DataPathLocked(OSError):
    """Another process (nsqd or nsqtw) holds the data path."""


class DirLock:
    """``lock()`` at startup, ``unlock()`` at the very end of a clean shutdown."""

    __slots__ = ("path", "_fd")

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    @property
    def locked(self) -> bool:
        return self._fd is not None

    def lock(self) -> None:
        """Take the lock or raise :class:`DataPathLocked` (a missing directory raises OSError)."""
        if self._fd is not None:
            return
        try:
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_CLOEXEC)
        except OSError as e:
            # Go's words: "failed to lock data-path: open /x: no such file or directory"
            text = e.strerror or str(e)
            err = type(e)(f"failed to lock data-path: open {self.path}: {text[:1].lower() + text[1:]}")
            err.errno = e.errno
            raise err from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            err = DataPathLocked(
                f"failed to lock data-path: cannot flock directory {self.path} - "
                f"{e.strerror} (possibly in use by another instance of nsqd)")
            err.errno = e.errno
            raise err from None
        self._fd = fd

    def unlock(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __enter__(self) -> DirLock:
        self.lock()
        return self

    def __exit__(self, *exc: object) -> None:
        self.unlock()
