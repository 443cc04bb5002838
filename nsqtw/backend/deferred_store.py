"""
The deferred-timing sidecar of a disk queue: ``<name>.diskqueue.deferred.dat``.

go-diskqueue's record has no room for a delivery time, which is why Go's nsqd
forgets a deferral when a deferred message reaches the disk (clean shutdown,
or a DPUB that overflows the memory queue; NSQ issue #1107).  nsqtw keeps the
data files in the standard format and puts the timing beside them.

Design: **the message is written to the standard queue, the sidecar only
holds a hint** ``message id -> deliver-at``.

* Every deferred message that goes to disk is an ordinary record of the
  queue (attempts as Go would write them), in the order nsqd's flush uses.
  Go's nsqd reading the directory delivers it as ordinary backlog, exactly
  what it would have done itself; nothing acknowledged is lost for either
  broker, and no message exists twice.
* The sidecar maps its 16-byte ID to the absolute delivery time.  When
  nsqtw's reader reaches a record whose ID has a hint still in the future,
  the record is handed to the deferred queue (the ``deferred_sink`` of
  :class:`~nsqtw.backend.disk.DiskQueue`) with its remaining delay instead
  of being delivered; a hint whose time has passed is simply dropped.
  A message is therefore never delivered before its time, and its delay is
  counted from the original DPUB/REQ, not from the restart.
* Hints are consumed when their record is read, rewritten with the queue's
  metadata on every sync that follows a change, removed by ``Empty()``.
  Expired hints are pruned on save, so hints for records that Go's nsqd
  consumed meanwhile disappear within ``--max-req-timeout``.

File layout (big-endian)::

    [8 bytes "NSQTWDQD"][uint32 version = 1][uint32 count]
    count x [16-byte message id][int64 deliver-at, Unix ns]
    [uint32 CRC-32 of everything before]

Written atomically (``<file>.<rand>.tmp``, fsync, rename).  A missing file
means no hints; a damaged one is ignored with a warning (the messages are
safe in the queue, only their delay is lost).
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable, Iterable

from twisted.logger import Logger

from .metadata import write_file_atomically

__all__ = ["DeferredStore", "encode_hints", "decode_hints", "sidecar_file_name", "HintError"]

MAGIC = b"NSQTWDQD"
VERSION = 1
_HEAD = struct.Struct(">8sII")
_ENTRY = struct.Struct(">16sq")
_CRC = struct.Struct(">I")

log = Logger(namespace="nsqtw.diskqueue")

Hint = tuple[float, bytes]


class HintError(ValueError):
    """The sidecar's bytes are not a valid hint file."""


def sidecar_file_name(data_path: str, name: str) -> str:
    return os.path.join(data_path, f"{name}.diskqueue.deferred.dat")


def encode_hints(hints: Iterable[Hint]) -> bytes:
    """``(deliver_at seconds, 16-byte id)`` pairs as the sidecar's bytes."""
    body = [_ENTRY.pack(mid, int(round(at * 1e9))) for at, mid in hints]
    out = _HEAD.pack(MAGIC, VERSION, len(body)) + b"".join(body)
    return out + _CRC.pack(zlib.crc32(out))


def decode_hints(data: bytes) -> list[Hint]:
    """The pairs in file order; raises :class:`HintError` for anything else."""
    if len(data) < _HEAD.size + _CRC.size:
        raise HintError("too short")
    magic, version, count = _HEAD.unpack_from(data)
    if magic != MAGIC:
        raise HintError("bad magic")
    if version != VERSION:
        raise HintError(f"unknown version {version}")
    if len(data) != _HEAD.size + count * _ENTRY.size + _CRC.size:
        raise HintError("length does not match the entry count")
    if _CRC.unpack_from(data, len(data) - _CRC.size)[0] != zlib.crc32(data[:-_CRC.size]):
        raise HintError("checksum mismatch")
    return [(ns / 1e9, mid) for mid, ns in _ENTRY.iter_unpack(data[_HEAD.size:-_CRC.size])]


class DeferredStore:
    """One queue's sidecar file.  All methods block (call them from the sync worker)."""

    __slots__ = ("path",)

    def __init__(self, path: str) -> None:
        self.path = path

    @classmethod
    def for_queue(cls, data_path: str, name: str) -> DeferredStore:
        return cls(sidecar_file_name(data_path, name))

    def save(self, hints: Iterable[Hint], now: float | None = None) -> int:
        """Write the hints (those not after ``now`` are dropped); none removes the file.

        Returns how many were written.
        """
        if now is not None:
            hints = [(at, mid) for at, mid in hints if at > now]
        else:
            hints = list(hints)
        if not hints:
            self.remove()
            return 0
        write_file_atomically(self.path, encode_hints(hints))
        return len(hints)

    def load(self, warn: Callable[[str], None] | None = None) -> list[Hint]:
        """The saved hints, or [] when there are none or the file is damaged."""
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return []
        except OSError as e:
            text = f"cannot read deferred hints {self.path} - {e}; their delays are lost"
        else:
            try:
                return decode_hints(data)
            except HintError as e:
                text = f"ignoring damaged deferred hints {self.path} ({e}); their delays are lost"
        (warn or (lambda t: log.warn("{text}", text=t)))(text)
        return []

    def remove(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
