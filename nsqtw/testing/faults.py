"""
Making a test's nsqd fail on purpose, while it runs.

::

    @pytest_twisted.ensureDeferred
    async def test_the_publisher_retries(nsqtw_nsqd):
        nsqtw_nsqd.faults.refuse_publishes(2)    # the next two: E_PUB_FAILED
        await publish_with_retries(nsqtw_nsqd.tcp_address, b"x")
        nsqtw_nsqd.assert_published("orders", body=b"x", count=1)

Each fault goes through the path a real one takes: a refused publish is the
broker's own ``E_PUB_FAILED`` (HTTP: 503), a full disk is the disk queue's
``write`` failing with ``ENOSPC`` (its queue files are pointed at ``/dev/full``),
dropped connections are closed by the broker as a crashed peer's would be, and a
restart is a clean stop and a start on the same data directory and ports.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ..backend.disk import DiskQueue

if TYPE_CHECKING:
    from twisted.internet.defer import Deferred

    from .pytest_plugin import NsqdFixture

__all__ = ["NsqdFaults", "FullDisk"]

#: a file every write to which fails with ENOSPC (Linux, BSDs)
DEV_FULL = "/dev/full"


class FullDisk:
    """The disk of one broker's queues refuses every write (ENOSPC) until :meth:`free`."""

    def __init__(self, broker: Any) -> None:
        if not os.path.exists(DEV_FULL):
            raise RuntimeError(f"filling the disk needs {DEV_FULL}")
        self.broker = broker
        #: queue -> its own write file descriptor, given back by :meth:`free`
        self._saved: dict[DiskQueue, tuple[int | None, int]] = {}
        self._factory = broker.backend_factory

        def filled_factory(name: str, ephemeral: bool) -> Any:
            backend = self._factory(name, ephemeral)
            self._fill(backend)
            return backend

        broker.backend_factory = filled_factory
        for topic in list(broker.topics.values()):
            self._fill(topic.backend)
            for ch in list(topic.channels.values()):
                self._fill(ch.backend)

    def _fill(self, backend: Any) -> None:
        if not isinstance(backend, DiskQueue) or backend in self._saved:
            return
        full = os.open(DEV_FULL, os.O_WRONLY | os.O_CLOEXEC)
        self._saved[backend] = (backend._wfd, full)
        backend._wfd = full  # its next write: ENOSPC, through DiskQueue's own error path

    def free(self) -> None:
        """Writes succeed again (the queues write to their own files)."""
        self.broker.backend_factory = self._factory
        for queue, (own, full) in self._saved.items():
            if queue._wfd == full:
                queue._wfd = own
            elif own is not None:  # the queue moved on (rolled or closed) meanwhile
                os.close(own)
            if queue._wfd != full:
                try:
                    os.close(full)
                except OSError:
                    pass
        self._saved.clear()


class NsqdFaults:
    """The faults a test can inject into a running :class:`~nsqtw.testing.pytest_plugin.NsqdFixture`
    (``nsqtw_nsqd.faults``)."""

    def __init__(self, nsqd: NsqdFixture) -> None:
        self.nsqd = nsqd

    def refuse_publishes(self, n: int = 1) -> None:
        """Refuse the next ``n`` publish commands (PUB, MPUB, DPUB, /pub, /mpub):
        ``E_PUB_FAILED PUB failed refused by the test`` over TCP, a 503 over HTTP."""
        self.nsqd.traffic.refuse_next += n

    def drop_connections(self) -> int:
        """Close every client connection at once, as a network failure would (in-flight
        messages go back to their channels); returns how many were closed."""
        protocols = list(self.nsqd._service.tcp_factory.protocols)
        for proto in protocols:
            transport = proto.transport
            abort = getattr(transport, "abortConnection", None)
            if abort is not None:
                abort()
            else:
                transport.loseConnection()
        return len(protocols)

    def pause_deliveries(self) -> None:
        """Hand no message to any consumer (publishes are still accepted and queued)."""
        self.nsqd._broker.delivery_held = True

    def resume_deliveries(self) -> None:
        """Deliver again what waited meanwhile."""
        broker = self.nsqd._broker
        broker.delivery_held = False
        for topic in broker.topics.values():
            for ch in topic.channels.values():
                if ch.clients:
                    broker.dirty.add(ch)
        self.nsqd._service.settle()

    def fill_disk(self) -> None:
        """The disk refuses every write (ENOSPC), as a full one does: what does not fit in a
        memory queue (``mem_queue_size``) is refused with the disk queue's own error, /ping
        turns NOK, and messages already acknowledged are held in memory, never lost."""
        if self.nsqd._full_disk is None:
            self.nsqd._full_disk = FullDisk(self.nsqd._broker)

    def free_disk(self) -> None:
        """The disk accepts writes again (held messages are written by the next retry)."""
        full, self.nsqd._full_disk = self.nsqd._full_disk, None
        if full is not None:
            full.free()

    def restart(self) -> Deferred[None]:
        """Stop the broker cleanly and start it again with the same data directory, options
        and ports. A Deferred (await it); clients reconnect as to any restarted nsqd."""
        return self.nsqd.restart()
