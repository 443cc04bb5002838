"""``message_count`` counts what a topic (and a channel) stored, as nsqd does: a publish the
disk refused (``E_PUB_FAILED``, HTTP 503) is not counted (issue 14 item 5)."""

from __future__ import annotations

from typing import Any

import pytest

from nsqtw.backend.runs import Run
from nsqtw.errors import BackendError
from nsqtw.nsqd.core.broker import Broker
from nsqtw.options import NsqdOptions

NOW = 1.7e9


class FullDisk:
    """A disk queue on a full disk: stores until ``room`` runs out, then refuses."""

    accepts_all = True

    def __init__(self, room: int) -> None:
        self.room = room
        self.stored = 0

    def put(self, run: Run) -> Run | None:
        n = len(run[1])
        if n > self.room:
            raise BackendError("write failed - No space left on device")
        self.room -= n
        self.stored += n
        return None

    def depth(self) -> int:
        return self.stored

    def read(self, n: int, max_bytes: int = 0) -> Any:
        return []

    def empty(self) -> None:
        pass

    def delete(self) -> None:
        pass

    def close(self) -> None:
        pass


def _broker(disk_room: int, mem: int) -> Any:
    disks: dict = {}

    def factory(name: str, ephemeral: bool) -> FullDisk:
        disks[name] = FullDisk(disk_room)
        return disks[name]

    return Broker(NsqdOptions(mem_queue_size=mem), NOW, backend_factory=factory), disks


def test_refused_publishes_are_not_counted_on_the_topic() -> None:
    broker, disks = _broker(disk_room=5, mem=3)
    ok = failed = 0
    for i in range(20):
        try:
            broker.publish("t", [b"m%d" % i], NOW)
            ok += 1
        except BackendError:
            failed += 1
    topic = broker.topics["t"]
    assert (ok, failed) == (8, 12)
    assert topic.message_count == 8 == topic.depth()
    assert topic.message_bytes == sum(len(b"m%d" % i) for i in range(8))


def test_an_mpub_split_between_memory_and_a_full_disk_counts_only_the_stored_head() -> None:
    broker, disks = _broker(disk_room=0, mem=3)
    with pytest.raises(BackendError):
        broker.publish("t", [b"a", b"b", b"c", b"d", b"e"], NOW)
    topic = broker.topics["t"]
    assert topic.message_count == topic.mem.depth() == 3


def test_refused_publishes_are_not_counted_on_a_flowing_channel() -> None:
    broker, disks = _broker(disk_room=2, mem=1)
    topic = broker.get_topic("t", NOW)
    ch = topic.get_channel("c", NOW)
    stored = 0
    for _ in range(6):
        try:
            broker.publish("t", [b"x"], NOW)
            stored += 1
        except BackendError:
            pass
    assert stored == 3
    assert topic.message_count == ch.message_count == 3 == ch.depth()
