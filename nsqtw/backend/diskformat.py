"""go-diskqueue's file format beyond the records: the ``.meta.dat`` text, the data files'
names, and the one listing of a data path that tells which queues have files."""

from __future__ import annotations

import os
import re

__all__ = ["DirListing", "format_queue_metadata", "read_queue_metadata"]

_META_RE = re.compile(rb"\A\s*(-?\d+)[ \t]*\r?\n\s*(-?\d+),(-?\d+)[ \t]*\r?\n\s*(-?\d+),(-?\d+)")
_DATA_RE_TMPL = r"\A%s\.diskqueue\.(\d{6,})\.dat\Z"


def format_queue_metadata(depth: int, read_file: int, read_pos: int, write_file: int, write_pos: int) -> bytes:
    """The ``.meta.dat`` text, exactly as go-diskqueue's ``persistMetaData`` writes it."""
    return b"%d\n%d,%d\n%d,%d\n" % (depth, read_file, read_pos, write_file, write_pos)


def read_queue_metadata(data: bytes) -> tuple[int, int, int, int, int]:
    """``(depth, readFileNum, readPos, writeFileNum, writePos)``; ValueError if unparsable."""
    m = _META_RE.match(data)
    if m is None:
        raise ValueError(f"invalid diskqueue metadata {data[:80]!r}")
    d, rf, rp, wf, wp = (int(x) for x in m.groups())
    if rf < 0 or rp < 0 or wf < 0 or wp < 0:
        raise ValueError(f"invalid diskqueue metadata: negative position {data[:80]!r}")
    return d, rf, rp, wf, wp


_ANY_DATA_FILE = re.compile(r"\A(.+)\.diskqueue\.(\d{6,})\.dat\Z")


class DirListing:
    """The data files every queue had when the data path was first listed (once, lazily).

    A queue opened later without metadata is either new (its files, if any, were all
    there at that listing: nsqd holds the data path's lock) or was deleted and made again
    by this process (its files are removed, so :meth:`DiskQueue._existing_data_files`
    keeps only those that still exist).
    """

    __slots__ = ("path", "_files")

    def __init__(self, path: str) -> None:
        self.path = path
        self._files: dict[str, list[int]] | None = None

    def data_files(self, name: str) -> list[int]:
        if self._files is None:
            files: dict[str, list[int]] = {}
            try:
                names = os.listdir(self.path)
            except OSError:
                names = []
            for fn in names:
                m = _ANY_DATA_FILE.match(fn)
                if m:
                    files.setdefault(m.group(1), []).append(int(m.group(2)))
            for nums in files.values():
                nums.sort()
            self._files = files
        return self._files.get(name, [])
