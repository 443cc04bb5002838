"""Every overflow store the broker is given speaks exactly :class:`IBackendQueue`."""

from __future__ import annotations

import pytest
from zope.interface.verify import verifyClass, verifyObject

from nsqtw.backend import IBackendQueue
from nsqtw.backend.dummy import DummyQueue
from nsqtw.backend.memory import MemoryQueue
from nsqtw.nsqd.core.broker import memory_only_backends

from dq_helpers import open_queue


@pytest.mark.parametrize("make", [
    lambda tmp: MemoryQueue(10),
    lambda tmp: DummyQueue(),
    lambda tmp: memory_only_backends("t", False),  # the refusing queue: no disk configured
    lambda tmp: memory_only_backends("t#ephemeral", True),
    lambda tmp: open_queue(tmp),
], ids=["memory", "dummy", "refusing", "ephemeral", "disk"])
def test_queue_provides_the_backend_interface(make, tmp_path):
    q = make(tmp_path)
    assert verifyClass(IBackendQueue, type(q))
    assert verifyObject(IBackendQueue, q)
    assert isinstance(q.accepts_all, bool)


def test_only_queues_with_no_room_for_everything_say_so(tmp_path):
    """``accepts_all`` is what the broker checks before a publish that needs room."""
    assert open_queue(tmp_path).accepts_all is True
    assert DummyQueue().accepts_all is True
    assert memory_only_backends("t", False).accepts_all is False
    assert MemoryQueue(1).accepts_all is False


def test_the_interface_declares_only_what_the_broker_uses():
    assert sorted(IBackendQueue.names()) == ["accepts_all", "close", "delete", "depth", "empty", "put", "read"]
