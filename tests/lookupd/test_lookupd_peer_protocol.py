"""nsqd's side of protocol V1 without sockets: LookupPeersService over a MemoryReactorClock,
connections as StringTransports, time on a task.Clock."""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock, StringTransportWithDisconnection

from nsqtw.lookupd.core.v1 import response
from nsqtw.nsqd.core.broker import Broker
from nsqtw.options import NsqdOptions
from nsqtw.nsqd.lookup_peers import COMMAND_TIMEOUT, PING_INTERVAL, LookupdInfo, LookupPeersService

LOOKUPD_ANSWER = json.dumps({"broadcast_address": "lk.example", "hostname": "lk", "http_port": 4161,
                             "tcp_port": 4160, "version": "1.3.0"}).encode()


class FakeNsqd:
    """The parts of NsqdService that LookupPeersService reads."""

    def __init__(self, addresses: list[str], **options: Any) -> None:
        options.setdefault("broadcast_address", "nsqd.example")
        self.options = NsqdOptions(lookupd_tcp_addresses=addresses, https_address="", **options)
        self.reactor = MemoryReactorClock()
        self.broker = Broker(self.options, 0.0)
        self.tcp_port = 4150
        self.http_port = 4151
        self.settled = 0

    def settle(self) -> None:
        self.settled += 1


def started(addresses: tuple[str, ...] = ("127.0.0.1:4160",), **options: Any):
    nsqd = FakeNsqd(list(addresses), **options)
    clock = Clock()
    service = LookupPeersService(nsqd, clock=clock)
    service.startService()
    return nsqd, clock, service


def connect(nsqd: FakeNsqd, index: int = 0) -> StringTransportWithDisconnection:
    """Complete the index-th outgoing connection attempt over a StringTransport."""
    host, port, factory = nsqd.reactor.tcpClients[index][:3]
    proto = factory.buildProtocol(IPv4Address("TCP", host, port))
    transport = StringTransportWithDisconnection(hostAddress=IPv4Address("TCP", "127.0.0.1", 50000),
                                                 peerAddress=IPv4Address("TCP", host, port))
    transport.protocol = proto
    proto.makeConnection(transport)
    return transport


def take(transport: StringTransportWithDisconnection) -> bytes:
    data = transport.value()
    transport.clear()
    return data


def identify_body(data: bytes) -> dict:
    assert data.startswith(b"  V1IDENTIFY\n")
    (size,) = struct.unpack_from(">i", data, 13)
    body = data[17:17 + size]
    assert len(data) == 17 + size
    return json.loads(body)


def answer(transport: StringTransportWithDisconnection, *bodies: bytes) -> None:
    transport.protocol.dataReceived(b"".join(response(b) for b in bodies))


def test_connects_at_start_and_identifies_with_nsqds_fields() -> None:
    """Each address gets a connection at once; it opens with the magic and nsqd's IDENTIFY."""
    nsqd, _, service = started(("127.0.0.1:4160", "127.0.0.2:4160", "127.0.0.1:4160"))
    assert [(h, p) for h, p, *_ in nsqd.reactor.tcpClients] == [("127.0.0.1", 4160), ("127.0.0.2", 4160)]
    body = identify_body(take(connect(nsqd)))
    assert list(body) == ["broadcast_address", "hostname", "http_port", "tcp_port", "version"]
    assert (body["broadcast_address"], body["tcp_port"], body["http_port"], body["version"]) == (
        "nsqd.example", 4150, 4151, "1.3.0")


def test_broadcast_ports_replace_bound_ports() -> None:
    """--broadcast-tcp-port / --broadcast-http-port are what IDENTIFY reports when set."""
    nsqd, _, _ = started(broadcast_tcp_port=9150, broadcast_http_port=9151)
    body = identify_body(take(connect(nsqd)))
    assert (body["tcp_port"], body["http_port"]) == (9150, 9151)


def test_identify_answer_then_replay_of_every_registration() -> None:
    """After the lookupd's answer: REGISTER <topic> for channel-less topics, REGISTER <topic>
    <channel> for each channel (ephemeral too); registered once all are answered."""
    nsqd, _, service = started()
    broker = nsqd.broker
    broker.get_topic("a")
    b = broker.get_topic("b")
    b.get_channel("c1", 0.0)
    b.get_channel("c2#ephemeral", 0.0)
    transport = connect(nsqd)
    take(transport)
    (peer,) = service.peers.values()
    done = peer.when_registered()
    answer(transport, LOOKUPD_ANSWER)
    assert take(transport) == b"REGISTER a\nREGISTER b c1\nREGISTER b c2#ephemeral\n"
    assert peer.info == LookupdInfo(4160, 4161, "1.3.0", "lk.example")
    assert service.lookupd_http_addresses() == ["lk.example:4161"]
    answer(transport, b"OK", b"OK")
    assert not done.called
    answer(transport, b"OK")
    assert done.called and peer.registered


@pytest.mark.parametrize("reply", [b"E_INVALID", b"E_BAD_BODY IDENTIFY missing fields", b"[1]",
                                   b'{"tcp_port":"x"}'])
def test_refused_or_unparsable_identify_answer_closes(reply: bytes) -> None:
    """E_INVALID or an answer that is not nsqlookupd's JSON closes the connection, registering nothing."""
    nsqd, _, service = started()
    nsqd.broker.get_topic("t")
    transport = connect(nsqd)
    take(transport)
    answer(transport, reply)
    assert transport.value() == b"" and not transport.connected
    (peer,) = service.peers.values()
    assert not peer.registered and peer.protocol is None


def test_commands_follow_broker_events_once_identified() -> None:
    """Create/delete events become REGISTER/UNREGISTER; a topic delete is one UNREGISTER <topic>;
    before IDENTIFY is answered nothing is sent."""
    nsqd, _, service = started()
    broker = nsqd.broker
    transport = connect(nsqd)
    take(transport)
    broker.get_topic("early")
    assert take(transport) == b""
    answer(transport, LOOKUPD_ANSWER)
    assert take(transport) == b"REGISTER early\n"
    t = broker.get_topic("t")
    t.get_channel("c", 0.0)
    t.get_channel("d", 0.0)
    broker.delete_channel("t", "c")
    broker.delete_topic("t")
    broker.set_paused("early", None, True)
    assert take(transport) == (b"REGISTER t\nREGISTER t c\nREGISTER t d\nUNREGISTER t c\nUNREGISTER t\n")


def test_ping_every_interval_on_the_clock() -> None:
    """PING goes out every 15 s to identified peers, not before."""
    nsqd, clock, service = started()
    transport = connect(nsqd)
    take(transport)
    answer(transport, LOOKUPD_ANSWER)
    clock.advance(PING_INTERVAL - 0.5)
    assert take(transport) == b""
    clock.advance(0.5)
    assert take(transport) == b"PING\n"
    (peer,) = service.peers.values()
    answer(transport, b"OK")
    assert peer.last_ping.result == b"OK"
    clock.advance(PING_INTERVAL)
    assert take(transport) == b"PING\n"


def test_unanswered_command_closes_after_the_deadline() -> None:
    """Each command must be answered within 1 s of the previous answer, or the peer hangs up."""
    nsqd, clock, service = started()
    transport = connect(nsqd)
    clock.advance(COMMAND_TIMEOUT - 0.1)
    answer(transport, LOOKUPD_ANSWER)
    assert transport.connected
    clock.advance(PING_INTERVAL)
    clock.advance(COMMAND_TIMEOUT - 0.1)
    assert transport.connected
    clock.advance(0.1)
    assert not transport.connected


def test_oversized_answer_closes() -> None:
    """An answer longer than --max-body-size is refused by closing the connection."""
    nsqd, _, _ = started(max_body_size=16)
    transport = connect(nsqd)
    answer(transport, b"x" * 17)
    assert not transport.connected


def test_lost_connection_is_retried_on_the_clock() -> None:
    """After the connection drops the ClientService dials again once its backoff delay passes."""
    nsqd, clock, service = started()
    transport = connect(nsqd)
    answer(transport, LOOKUPD_ANSWER)
    transport.loseConnection()
    assert len(nsqd.reactor.tcpClients) == 1
    clock.advance(PING_INTERVAL + 1)
    assert len(nsqd.reactor.tcpClients) == 2
    (peer,) = service.peers.values()
    assert peer.info is not None and peer.protocol is None


def test_set_addresses_diffs_the_peer_list() -> None:
    """New addresses are dialled, removed ones closed, kept ones untouched."""
    nsqd, _, service = started(("127.0.0.1:4160", "127.0.0.2:4160"))
    t1 = connect(nsqd, 0)
    t2 = connect(nsqd, 1)
    d = service.set_addresses(["127.0.0.2:4160", "127.0.0.3:4160"])
    assert not t1.connected and t2.connected
    assert d.called
    assert list(service.peers) == ["127.0.0.2:4160", "127.0.0.3:4160"]
    assert [(h, p) for h, p, *_ in nsqd.reactor.tcpClients][-1] == ("127.0.0.3", 4160)


def test_stop_closes_connections_and_unsubscribes() -> None:
    """Stopping closes every peer and stops listening to the broker and the clock."""
    nsqd, clock, service = started()
    transport = connect(nsqd)
    answer(transport, LOOKUPD_ANSWER)
    service.stopService()
    assert not transport.connected
    assert service._on_event not in nsqd.broker.listeners
    assert clock.getDelayedCalls() == []
    assert service.peers == {}
