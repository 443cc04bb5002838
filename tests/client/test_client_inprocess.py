"""The in-process bus: memory transports with asynchronous delivery, the registry, and a full
producer/consumer round trip with no socket."""

from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet import defer, task
from twisted.internet.protocol import Protocol

from nsqtw.client import Config, Consumer, NotConnected, Producer
from nsqtw.client.inprocess import MemoryTransport, connect_inprocess, register, registered, unregister


class Recorder(Protocol):
    def __init__(self, echo=0):
        self.data = []
        self.lost = []
        self.echo = echo  # echo this many chunks back

    def dataReceived(self, data):
        self.data.append(data)
        if self.echo:
            self.echo -= 1
            self.transport.write(data)

    def connectionLost(self, reason=None):
        self.lost.append(reason)


class EchoFactory:
    def __init__(self, echo=10 ** 9):
        self.protos = []
        self.echo = echo

    def buildProtocol(self, addr):
        p = Recorder(self.echo)
        self.protos.append(p)
        return p


def test_writes_arrive_on_a_later_turn_coalesced():
    """Nothing is delivered inside write(); one reactor turn delivers all writes as one chunk."""
    clock = task.Clock()
    factory = EchoFactory(echo=0)
    client = Recorder()
    connect_inprocess(factory, client, clock)
    server = factory.protos[0]
    client.transport.write(b"a")
    client.transport.write(b"b")
    assert server.data == []
    clock.advance(0)
    assert server.data == [b"ab"]
    server.transport.write(b"c")
    assert client.data == []
    clock.advance(0)
    assert client.data == [b"c"]


def test_ping_pong_never_recurses():
    """Two echoing ends bounce data 10,000 times (far past the recursion limit) with a flat stack."""
    clock = task.Clock()
    factory = EchoFactory(echo=5000)
    client = Recorder(echo=5000)
    connect_inprocess(factory, client, clock)
    client.transport.write(b"x")
    clock.advance(0)  # task.Clock runs the calls scheduled meanwhile too: all bounces, one by one
    assert len(client.data) == 5000 and len(factory.protos[0].data) == 5001


def test_lose_connection_delivers_pending_bytes_first():
    """loseConnection: written bytes still arrive, then both ends see connectionLost."""
    clock = task.Clock()
    factory = EchoFactory()
    client = Recorder()
    connect_inprocess(factory, client, clock)
    client.transport.write(b"last words")
    client.transport.loseConnection()
    client.transport.write(b"ignored")
    clock.advance(0)
    server = factory.protos[0]
    assert server.data == [b"last words"]
    assert len(client.lost) == 1 and len(server.lost) == 1


def test_abort_drops_pending_bytes():
    """abortConnection: nothing more is delivered; both ends are told."""
    clock = task.Clock()
    factory = EchoFactory()
    client = Recorder()
    connect_inprocess(factory, client, clock)
    client.transport.write(b"dropped")
    client.transport.abortConnection()
    clock.advance(0)
    assert factory.protos[0].data == [] and client.lost and factory.protos[0].lost


def test_registry_by_name():
    """register() makes inprocess:<name> resolve; the undo function removes it."""
    factory = EchoFactory()
    undo = register(factory, "reg-test")
    assert registered()["reg-test"] is factory
    clock = task.Clock()
    client = Recorder()
    assert connect_inprocess("inprocess:reg-test", client, clock).called
    undo()
    assert "reg-test" not in registered()
    failed = []
    connect_inprocess("inprocess:reg-test", Recorder(), clock).addErrback(failed.append)
    assert failed
    register(factory, "other")
    unregister("other")
    assert "other" not in registered()


def test_memory_transport_reports_addresses():
    """getPeer/getHost are IPv4 addresses, as the broker's glue expects."""
    t = MemoryTransport(task.Clock(), "host", "peer")
    assert (t.getHost(), t.getPeer()) == ("host", "peer")


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_producer_and_consumer_over_the_bus(nsqd):
    """10,000 messages published and consumed through 'inprocess:' with the broker's real protocol."""
    undo = register(nsqd, "bus-test")
    try:
        producer = Producer("inprocess:bus-test")
        n = 10000
        await defer.gatherResults([producer.multi_publish("bus", [b"%d" % i for i in range(j, j + 1000)])
                                   for j in range(0, n, 1000)])
        got = set()
        done = defer.Deferred()

        def handle(m):
            got.add(int(m.body))
            if len(got) == n and not done.called:
                done.callback(None)

        consumer = Consumer("bus", "c", handle, Config(max_in_flight=100))
        conn = await consumer.connect_to_nsqd("inprocess:bus-test")
        assert conn.address == "inprocess:bus-test"
        from twisted.internet import reactor
        await done.addTimeout(20, reactor)
        assert got == set(range(n))
        await consumer.stop()
        await producer.stop()
        ch = nsqd._broker.find_channel("bus", "c")
        assert ch.message_count == n and not ch.inflight
    finally:
        undo()


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_broker_handle_as_address_and_broker_stop(nsqd):
    """Passing the start_nsqd handle works without the registry; stopping the broker closes the bus."""
    producer = Producer(nsqd)
    await producer.publish("h", b"x")
    assert producer.conn.address.startswith("inprocess:")
    closed = producer.conn.closed
    await nsqd.stop()
    await closed
    with pytest.raises(NotConnected):
        await producer.publish("h", b"y")


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_unknown_inprocess_name_is_not_connected():
    """No broker registered under the name: NotConnected."""
    with pytest.raises(NotConnected):
        await Producer("inprocess:nobody-here").publish("t", b"x")
