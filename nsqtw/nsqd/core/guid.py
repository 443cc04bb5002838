"""
Message IDs as NSQ mints them (``nsqd/guid.go``).

A snowflake-style 64-bit integer rendered as 16 lowercase hex ASCII bytes::

    id = ((ts - 1288834974288) << 22) | (node_id << 12) | sequence

where ``ts`` is nanoseconds >> 20 ("pseudo-milliseconds").  NSQ's factory
fails and retries 1 ms later when the 12-bit sequence runs out; this one
borrows the next pseudo-millisecond instead, so IDs stay unique and
increasing without waiting, and a batch of N IDs is N consecutive integers
formatted by ``map`` in C.
"""

from __future__ import annotations

from itertools import chain

__all__ = ["GUIDFactory", "TWEPOCH"]

TWEPOCH = 1288834974288
_SEQ_LIMIT = 1 << 12
_HEX = b"%016x".__mod__
#: the low 12 bits of an ID are its sequence: exactly its last three hex digits
_SEQ_HEX = [b"%03x" % i for i in range(_SEQ_LIMIT)]


class GUIDFactory:
    """Mints increasing IDs for one node; time is passed in, never read."""

    __slots__ = ("node_part", "last_ts", "seq", "_head_ts", "_head")

    def __init__(self, node_id: int) -> None:
        if not 0 <= node_id < 1024:
            raise ValueError("node id must be [0,1024)")
        self.node_part = node_id << 12
        self.last_ts = -1
        self.seq = 0
        #: the pseudo-millisecond ``_head`` was formatted for, and the first 13 hex digits of
        #: every ID minted in it (timestamp and node; the last three are the sequence)
        self._head_ts = -1
        self._head = b""

    def new_id(self, now_ns: int) -> bytes:
        """One fresh ID (``new_ids(1, now_ns)[0]``): one concatenation while the
        pseudo-millisecond stays the same (a PUB's path)."""
        ts = now_ns >> 20
        last = self.last_ts
        if ts > last:
            if ts < TWEPOCH:
                return self.new_ids(1, now_ns)[0]
            last = ts
            seq = 0
        else:
            seq = self.seq
        if last != self._head_ts:
            self._head = _HEX(((last - TWEPOCH) << 22) | self.node_part)[:13]
            self._head_ts = last
        out = self._head + _SEQ_HEX[seq]
        seq += 1
        if seq == _SEQ_LIMIT:
            last += 1
            seq = 0
        self.last_ts = last
        self.seq = seq
        return out

    def new_ids(self, count: int, now_ns: int, prefix: bytes = b"") -> list[bytes]:
        """``count`` fresh IDs (16 hex bytes each) for a message batch published at ``now_ns``;
        with ``prefix``, each ID comes with those bytes in front (one object per message)."""
        ts = max(now_ns >> 20, TWEPOCH)  # a clock before 2012 (a test's task.Clock) still mints valid IDs
        if ts <= self.last_ts:
            ts = self.last_ts
            seq = self.seq
        else:
            seq = 0
        node = self.node_part
        base = ((ts - TWEPOCH) << 22) | node
        if seq + count <= _SEQ_LIMIT:
            # same pseudo-millisecond: a fixed 13-digit prefix and the sequence's 3 digits
            head = prefix + _HEX(base)[:13]
            out = list(map(head.__add__, _SEQ_HEX[seq:seq + count]))
            seq += count
        else:
            ranges = []
            while count:
                take = min(count, _SEQ_LIMIT - seq)
                ranges.append(range(base + seq, base + seq + take))
                seq += take
                count -= take
                if seq == _SEQ_LIMIT:
                    ts += 1
                    seq = 0
                    base = ((ts - TWEPOCH) << 22) | node
            out = list(map(_HEX, chain.from_iterable(ranges)))
            if prefix:
                out = list(map(prefix.__add__, out))
        if seq == _SEQ_LIMIT:
            ts += 1
            seq = 0
        self.last_ts = ts
        self.seq = seq
        return out
