"""An nsqd tells a reactor that tunes itself (nsqtw's spin reactor, :class:`IReactorWorkMeter`)
what its work is (messages published, delivered, finished and stored for origins), and a replication peer asks it
to spin longer for its origin's next batch."""

from __future__ import annotations

from typing import Any
from collections.abc import Callable

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.interfaces import IReactorPluggableNameResolver
from zope.interface import implementer

from nsqtw.embed import start_nsqd
from nsqtw.nsqd.replication import PEER_SPIN_SECONDS
from nsqtw.runtime.turn import IReactorWorkMeter
from nsqtw.testing import body_command, command, connect_raw

from replication_support import until

pytestmark = pytest.mark.e2e


# the name resolver too (delegated below): HostnameEndpoint warns of a reactor without one
@implementer(IReactorWorkMeter, IReactorPluggableNameResolver)
class MeteredReactor:
    """The test's reactor, recording what nsqd tells it (the rest is the real reactor)."""

    def __init__(self) -> None:
        self.work: Callable[[], int] | None = None
        self.told: list[Any] = []
        self.spin: list[float] = []
        self.yielding: list[bool] = []

    def measure_work(self, fn: Callable[[], int] | None) -> None:
        self.work = fn
        self.told.append(fn)

    def spin_at_least(self, seconds: float, yielding: bool = False) -> None:
        self.spin.append(seconds)
        self.yielding.append(yielding)

    def __getattr__(self, name: str) -> Any:
        return getattr(reactor, name)


@pytest_twisted.ensureDeferred
async def test_a_peer_spins_longer_and_both_count_messages_as_their_work():
    pr, orr = MeteredReactor(), MeteredReactor()
    peer = await start_nsqd(pr, replication_insecure=True, node_id=2, replication_address="127.0.0.1:0")
    origin = await start_nsqd(orr, replication_insecure=True, node_id=1, replica_peers=[f"127.0.0.1:{peer._service.replication_port}"])
    try:
        await until(lambda: origin._service.replication.origin.in_sync() == 1)
        assert pr.spin == [PEER_SPIN_SECONDS] and PEER_SPIN_SECONDS > 5e-5
        assert pr.yielding == [True]  # the peer's long spin gives way to the processes it waits for
        assert orr.spin == []  # an origin only: its answers come within the default spin
        assert pr.work is not None and orr.work is not None
        p0, o0 = pr.work(), orr.work()
        c = await connect_raw(origin.tcp_port)
        for i in range(3):
            c.send(body_command("PUB", "t", body=b"m%d" % i))
            assert await c.response() == b"OK"
        assert orr.work() - o0 == 3  # published here
        assert pr.work() - p0 == 3  # stored for the origin (one message entry each; not the topic's creation)
        sub = await connect_raw(origin.tcp_port)
        sub.send(command("SUB", "t", "c"))
        assert await sub.response() == b"OK"
        o1 = orr.work()
        sub.send(command("RDY", 3))
        for _ in range(3):
            m = await sub.message()
            sub.send(command("FIN", m.id.decode()))
        await until(lambda: orr.work() - o1 == 6)  # delivered and finished: consumers' work too
        c.close()
        sub.close()
    finally:
        await origin.stop()
        await peer.stop()
    assert pr.told[-1] is None and orr.told[-1] is None  # stopped: events again

