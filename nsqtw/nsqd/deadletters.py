"""
The file a durable channel's dead letters are kept in (nsqtw only).

One file per channel in ``--data-path``, named ``<topic>:<channel>#dead.nsqtw`` (``#`` cannot
start an NSQ name's suffix other than ``#ephemeral``, so no channel's own queue files can be
mistaken for it, and Go's nsqd, which reads only ``nsqd.dat`` and the queues it names, ignores
it).  Records are appended: ``>I`` frame length, ``>d`` when it died, ``>B`` why, the frame.
A redrive or an empty rewrites the file (written beside it, then renamed over it).  A torn
last record (a crash mid-append) is ignored when the file is read.

Dead letters are rare (a message dies once), so the writes are done at once, on the caller's
thread: with ``fsync`` (``--sync-every=1``) each append is synced before it returns, which is
what lets the channel release the message's queue record right after.
"""

from __future__ import annotations

import os
import struct

from ..runtime.files import append, write_atomically
from .core.deadletters import DeadLetter
from .core.policy import REASON_ATTEMPTS, REASONS

__all__ = ["DeadLetterFile", "DeadLetterFiles", "dead_letter_path"]

_HEAD = struct.Struct(">IdB")
_REASONS = REASONS
SUFFIX = "#dead.nsqtw"


def dead_letter_path(data_path: str, name: str) -> str:
    """The file of the queue ``name`` (``topic:channel``)."""
    return os.path.join(data_path, name + SUFFIX)


def _encode(letters: list[DeadLetter]) -> bytes:
    parts = []
    for letter in letters:
        code = _REASONS.index(letter.reason) if letter.reason in _REASONS else 0
        parts.append(_HEAD.pack(len(letter.frame), letter.died_at, code))
        parts.append(letter.frame)
    return b"".join(parts)


class DeadLetterFile:
    """A :class:`~nsqtw.nsqd.core.deadletters.DeadSink` on one file."""

    def __init__(self, path: str, fsync: bool) -> None:
        self.path = path
        self.fsync = fsync

    def load(self) -> list[DeadLetter]:
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return []
        out = []
        pos = 0
        size = _HEAD.size
        while pos + size <= len(data):
            n, died_at, code = _HEAD.unpack_from(data, pos)
            end = pos + size + n
            if n < 34 or end > len(data):
                break  # a torn or corrupt tail: what came before stands
            reason = _REASONS[code] if code < len(_REASONS) else REASON_ATTEMPTS
            out.append(DeadLetter(bytes(data[pos + size:end]), died_at, reason))
            pos = end
        return out

    def append(self, letters: list[DeadLetter]) -> None:
        append(self.path, _encode(letters), self.fsync)

    def rewrite(self, letters: list[DeadLetter]) -> None:
        if not letters:
            self.delete()
            return
        write_atomically(self.path, _encode(letters), self.fsync)

    def delete(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def exists(self) -> bool:
        return os.path.exists(self.path)


class DeadLetterFiles:
    """The broker's ``dead_sinks``: a :class:`DeadLetterFile` in ``data_path`` for each durable
    channel (an ephemeral one keeps its dead letters in memory only)."""

    def __init__(self, data_path: str, fsync: bool) -> None:
        self.data_path = data_path
        self.fsync = fsync

    def __call__(self, name: str, ephemeral: bool, existing: bool) -> DeadLetterFile | None:
        if ephemeral:
            return None
        sink = DeadLetterFile(dead_letter_path(self.data_path, name), self.fsync)
        if existing and not sink.exists():
            return None
        return sink
