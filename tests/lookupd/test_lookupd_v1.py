"""TCP protocol V1: the sans-IO session, the IDENTIFY decoder, the client helpers and the glue."""

from __future__ import annotations

import json
import struct

import pytest
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransportWithDisconnection

from lookupd_helpers import FakeServer
from nsqtw.errors import BadBody
from nsqtw.lookupd.core.peers import PeerInfo, peer_from_identify
from nsqtw.lookupd.core.registry import CHANNEL, CLIENT, TOPIC, Registration, RegistrationDB
from nsqtw.lookupd.core.v1 import (
    PING_COMMAND, LookupSession, ResponseDecoder, ResponseTooBig, go_trim_space, identify_command,
    register_command, response, unregister_command,
)
from nsqtw.lookupd.tcp import LookupdFactory

NSQD = {"broadcast_address": "nsqd1", "tcp_port": 4150, "http_port": 4151, "version": "1.3.0",
        "hostname": "host1"}


def identify(fields: dict = NSQD) -> bytes:
    return identify_command(fields)


def answers(data: bytes) -> list[bytes]:
    """Split size-prefixed responses."""
    out = []
    pos = 0
    while pos < len(data):
        (size,) = struct.unpack_from(">i", data, pos)
        out.append(data[pos + 4:pos + 4 + size])
        pos += 4 + size
    assert pos == len(data)
    return out


def session(db: RegistrationDB = None, remote: str = "127.0.0.1:50001") -> tuple[LookupSession, RegistrationDB]:
    db = db if db is not None else RegistrationDB()
    return LookupSession(db, remote, FakeServer()), db


def run(s: LookupSession, data: bytes, now: float = 100.0) -> tuple[list[bytes], bool]:
    out, keep = s.feed(data, now)
    return answers(out), keep


# --- magic --------------------------------------------------------------------------


def test_bad_magic_gets_unframed_e_bad_protocol_and_close() -> None:
    """A wrong magic is answered with size-prefixed E_BAD_PROTOCOL (no frame type), then close."""
    s, _ = session()
    out, keep = s.feed(b"  V2PING\n", 0.0)
    assert out == b"\x00\x00\x00\x0eE_BAD_PROTOCOL"
    assert keep is False and s.closed


def test_magic_may_arrive_in_pieces() -> None:
    """The four magic bytes may be split across reads; nothing is answered until a command."""
    s, _ = session()
    assert s.feed(b"  ", 0.0) == (b"", True)
    assert run(s, b"V1PI") == ([], True)
    assert run(s, b"NG\n") == ([b"OK"], True)


# --- IDENTIFY -----------------------------------------------------------------------


def test_identify_answers_lookupd_info_and_registers_client() -> None:
    """IDENTIFY answers the lookupd's ports, version, broadcast address and hostname (keys sorted)."""
    s, db = session()
    out, keep = s.feed(b"  V1" + identify(), 42.0)
    (body,) = answers(out)
    assert keep
    assert body == (b'{"broadcast_address":"lookupd.example","hostname":"lookupd-host",'
                    b'"http_port":4161,"tcp_port":4160,"version":"1.3.0"}')
    (producer,) = db.find_producers(CLIENT, "", "")
    p = producer.peer
    assert (p.id, p.remote_address, p.broadcast_address, p.tcp_port, p.http_port, p.version, p.hostname,
            p.last_update) == ("127.0.0.1:50001", "127.0.0.1:50001", "nsqd1", 4150, 4151, "1.3.0", "host1", 42.0)


def test_identify_body_split_across_reads() -> None:
    """The size and the JSON body may arrive one byte at a time."""
    s, db = session()
    data = b"  V1" + identify() + b"PING\n"
    outs = []
    for i in range(len(data)):
        out, keep = s.feed(data[i:i + 1], 1.0)
        assert keep
        outs.append(out)
    bodies = answers(b"".join(outs))
    assert len(bodies) == 2 and bodies[1] == b"OK" and json.loads(bodies[0])["tcp_port"] == 4160
    assert len(db.find_producers(CLIENT, "", "")) == 1


def test_identify_again_is_fatal() -> None:
    """A second IDENTIFY: E_INVALID cannot IDENTIFY again, then close."""
    s, _ = session()
    run(s, b"  V1" + identify())
    out, keep = run(s, identify())
    assert out == [b"E_INVALID cannot IDENTIFY again"] and not keep


@pytest.mark.parametrize("missing", ["broadcast_address", "tcp_port", "http_port", "version"])
def test_identify_requires_fields(missing: str) -> None:
    """Each of broadcast_address, tcp_port, http_port and version is required (and non-zero)."""
    s, db = session()
    fields = dict(NSQD)
    del fields[missing]
    out, keep = run(s, b"  V1" + identify(fields))
    assert out == [b"E_BAD_BODY IDENTIFY missing fields"] and not keep
    assert db.find_producers(CLIENT, "", "") == []


def test_identify_zero_port_counts_as_missing() -> None:
    """tcp_port 0 is Go's zero value: missing."""
    s, _ = session()
    out, _ = run(s, b"  V1" + identify(dict(NSQD, tcp_port=0)))
    assert out == [b"E_BAD_BODY IDENTIFY missing fields"]


@pytest.mark.parametrize("body", [b"{not json", b"[1,2]", b'{"tcp_port":"4150"}', b'{"tcp_port":4150.5}',
                                  b'{"version":1}', b'{"tcp_port":true}', b"NaN"])
def test_identify_bad_json_is_fatal(body: bytes) -> None:
    """Undecodable JSON or a value of the wrong type: E_BAD_BODY IDENTIFY failed to decode JSON body."""
    s, _ = session()
    out, keep = run(s, b"  V1IDENTIFY\n" + struct.pack(">i", len(body)) + body)
    assert out == [b"E_BAD_BODY IDENTIFY failed to decode JSON body"] and not keep


def test_identify_negative_size_is_fatal() -> None:
    """A negative body size cannot be read: E_BAD_BODY, close."""
    s, _ = session()
    out, keep = run(s, b"  V1IDENTIFY\n" + struct.pack(">i", -1))
    assert out == [b"E_BAD_BODY IDENTIFY failed to read body size"] and not keep


def test_identify_decodes_keys_case_insensitively_and_ignores_unknown() -> None:
    """Go's decoder: TCP_PORT fills tcp_port, unknown keys and nulls are ignored, the socket
    address wins over a claimed remote_address."""
    body = json.dumps({"BROADCAST_ADDRESS": "b", "Tcp_Port": 1, "http_port": 2, "version": "v",
                       "hostname": None, "extra": [1], "remote_address": "1.2.3.4:5",
                       "topology_zone": "z1"}).encode()
    p = peer_from_identify(body, "9.9.9.9:9", now=3.0)
    assert (p.broadcast_address, p.tcp_port, p.http_port, p.version, p.hostname, p.remote_address,
            p.id, p.topology_zone) == ("b", 1, 2, "v", "", "9.9.9.9:9", "9.9.9.9:9", "z1")


def test_identify_null_body_is_missing_fields() -> None:
    """JSON null decodes to nothing: the required fields are missing."""
    with pytest.raises(BadBody, match="IDENTIFY missing fields"):
        peer_from_identify(b"null", "a:1", now=0.0)


def test_peer_info_json_shape() -> None:
    """/lookup's producer object: NSQ's field names in Go's struct order."""
    p = PeerInfo(id="a:1", remote_address="a:1", hostname="h", broadcast_address="b", tcp_port=1,
                 http_port=2, version="1.3.0")
    assert list(p.to_json()) == ["remote_address", "hostname", "broadcast_address", "tcp_port",
                                 "http_port", "version", "topology_zone", "topology_region"]
    assert p.http_node == "b:2"


# --- REGISTER / UNREGISTER ------------------------------------------------------------


def test_register_before_identify_is_fatal() -> None:
    """REGISTER without IDENTIFY: E_INVALID client must IDENTIFY, then close."""
    s, db = session()
    out, keep = run(s, b"  V1REGISTER t c\n")
    assert out == [b"E_INVALID client must IDENTIFY"] and not keep
    assert len(db) == 0


@pytest.mark.parametrize("line, error", [
    (b"REGISTER\n", b"E_INVALID REGISTER insufficient number of params"),
    (b"REGISTER   \n", b"E_INVALID REGISTER insufficient number of params"),
    (b"UNREGISTER\n", b"E_INVALID UNREGISTER insufficient number of params"),
    (b"REGISTER bad!topic\n", b"E_BAD_TOPIC REGISTER topic name 'bad!topic' is not valid"),
    (b"REGISTER t bad!chan\n", b"E_BAD_CHANNEL REGISTER channel name 'bad!chan' is not valid"),
    (b"UNREGISTER t bad!chan\n", b"E_BAD_CHANNEL UNREGISTER channel name 'bad!chan' is not valid"),
    (b"REGISTER  t\n", b"E_BAD_TOPIC REGISTER topic name '' is not valid"),
    (b"REGISTER " + b"x" * 65 + b"\n", b"E_BAD_TOPIC REGISTER topic name '" + b"x" * 65 + b"' is not valid"),
    (b"FOO bar\n", b"E_INVALID invalid command FOO"),
    (b"\n", b"E_INVALID invalid command "),
    (b"ping\n", b"E_INVALID invalid command ping"),
])
def test_command_errors_are_fatal_with_nsq_texts(line: bytes, error: bytes) -> None:
    """Every error is sent with nsqlookupd's text and closes the connection."""
    s, _ = session()
    run(s, b"  V1" + identify())
    out, keep = run(s, line)
    assert out == [error] and not keep


def test_error_stops_the_commands_after_it() -> None:
    """Commands after a fatal error in the same read are not run."""
    s, db = session()
    out, keep = run(s, b"  V1" + identify() + b"REGISTER a\nBAD\nREGISTER b\n")
    assert out[1:] == [b"OK", b"E_INVALID invalid command BAD"] and not keep
    assert db.topics() == ["a"]
    assert s.feed(b"REGISTER c\n", 1.0) == (b"", False)


def test_register_and_unregister_round_trip() -> None:
    """REGISTER t c answers OK and registers channel and topic; UNREGISTER t c leaves the channel."""
    s, db = session()
    out, keep = run(s, b"  V1" + identify() + b"REGISTER t c\nREGISTER u\n")
    assert out[1:] == [b"OK", b"OK"] and keep
    assert db.topics() == ["t", "u"] and db.channels("t") == ["c"]
    out, keep = run(s, b"UNREGISTER t c\nUNREGISTER u\n")
    assert out == [b"OK", b"OK"] and keep
    assert db.find_producers(CHANNEL, "t", "c") == [] and db.find_producers(TOPIC, "u", "") == []
    assert db.channels("t") == ["c"] and "u" in db.topics()


def test_lines_are_trimmed_like_go() -> None:
    """CRLF and surrounding blanks are trimmed before the single-space split."""
    s, db = session()
    out, keep = run(s, b"  V1" + identify() + b"  REGISTER t c \r\n")
    assert out[1:] == [b"OK"] and keep
    assert db.channels("t") == ["c"]
    assert go_trim_space("\x1c x \u00a0") == "\x1c x"


def test_unregister_ephemeral_channel_removes_key() -> None:
    """UNREGISTER of the last producer of an #ephemeral channel deletes the registration."""
    s, db = session()
    run(s, b"  V1" + identify() + b"REGISTER t c#ephemeral\n")
    run(s, b"UNREGISTER t c#ephemeral\n")
    assert db.channels("t") == []


def test_ping_refreshes_last_update_only_when_identified() -> None:
    """PING answers OK before and after IDENTIFY; only an identified peer's last_update moves."""
    s, db = session()
    assert run(s, b"  V1PING\n", now=1.0) == ([b"OK"], True)
    run(s, identify(), now=2.0)
    assert run(s, PING_COMMAND, now=50.0) == ([b"OK"], True)
    assert db.find_producers(CLIENT, "", "")[0].peer.last_update == 50.0


def test_connection_lost_drops_every_registration() -> None:
    """When the connection goes the peer leaves client, topic and channel registrations."""
    db = RegistrationDB()
    s1, _ = session(db, "10.0.0.1:1")
    s2, _ = session(db, "10.0.0.2:2")
    run(s1, b"  V1" + identify() + b"REGISTER t c\n")
    run(s2, b"  V1" + identify(dict(NSQD, broadcast_address="nsqd2")) + b"REGISTER t\n")
    s1.connection_lost()
    assert db.lookup_registrations("10.0.0.1:1") == []
    assert [p.peer.id for p in db.find_producers(TOPIC, "t", "")] == ["10.0.0.2:2"]
    assert db.channels("t") == ["c"]


def test_fatal_error_after_identify_drops_registrations() -> None:
    """A fatal error closes the session, and the peer's registrations go with it."""
    s, db = session()
    run(s, b"  V1" + identify() + b"REGISTER t\n")
    run(s, b"NOPE\n")
    assert db.find_producers(TOPIC, "t", "") == [] and db.find_producers(CLIENT, "", "") == []


# --- the client side helpers ---------------------------------------------------------


def test_client_command_encoding() -> None:
    """nsqd's commands: IDENTIFY with a sorted JSON body; REGISTER/UNREGISTER with optional channel."""
    data = identify_command({"version": "1.3.0", "tcp_port": 1, "broadcast_address": "b"})
    body = b'{"broadcast_address":"b","tcp_port":1,"version":"1.3.0"}'
    assert data == b"IDENTIFY\n" + struct.pack(">i", len(body)) + body
    assert register_command("t") == b"REGISTER t\n"
    assert register_command("t", "c") == b"REGISTER t c\n"
    assert unregister_command("t", "c#ephemeral") == b"UNREGISTER t c#ephemeral\n"


def test_response_decoder_splits_and_bounds() -> None:
    """Responses are split at their size prefix; one beyond the limit is refused."""
    dec = ResponseDecoder(max_size=10)
    data = response(b"OK") + response(b"{}")
    assert dec.feed(data[:3]) == []
    assert dec.feed(data[3:7]) == [b"OK"]
    assert dec.feed(data[7:]) == [b"{}"]
    with pytest.raises(ResponseTooBig):
        dec.feed(response(b"x" * 11))


# --- the Twisted glue -------------------------------------------------------------------


def connected(db: RegistrationDB, clock: Clock, port: int = 50001):
    factory = LookupdFactory(db, FakeServer(), clock)
    proto = factory.buildProtocol(None)
    transport = StringTransportWithDisconnection(peerAddress=IPv4Address("TCP", "10.1.1.1", port))
    transport.protocol = proto
    proto.makeConnection(transport)
    return factory, proto, transport


def test_glue_writes_answers_and_uses_the_clock() -> None:
    """The protocol writes size-prefixed answers; IDENTIFY's last_update is the clock's time."""
    db, clock = RegistrationDB(), Clock()
    clock.advance(7)
    factory, proto, transport = connected(db, clock)
    proto.dataReceived(b"  V1" + identify() + b"REGISTER t\n")
    out = answers(transport.value())
    assert out[1:] == [b"OK"] and transport.connected
    peer = db.find_producers(TOPIC, "t", "")[0].peer
    assert peer.id == "10.1.1.1:50001" and peer.last_update == 7.0
    assert factory.protocols == {proto}


def test_glue_closes_after_fatal_error_and_cleans_up() -> None:
    """A fatal error is written, the transport closed, and the registrations dropped."""
    db, clock = RegistrationDB(), Clock()
    factory, proto, transport = connected(db, clock)
    proto.dataReceived(b"  V1" + identify() + b"REGISTER t\nREGISTER !\n")
    assert answers(transport.value())[-1] == b"E_BAD_TOPIC REGISTER topic name '!' is not valid"
    assert not transport.connected
    assert db.find_producers(TOPIC, "t", "") == [] and factory.protocols == set()
    assert db.topics() == ["t"]


def test_glue_close_all_fires_when_every_connection_is_gone() -> None:
    """close_all closes each connection and fires once their registrations are dropped."""
    db, clock = RegistrationDB(), Clock()
    factory, p1, t1 = connected(db, clock, 1)
    p2 = factory.buildProtocol(None)
    t2 = StringTransportWithDisconnection(peerAddress=IPv4Address("TCP", "10.1.1.2", 2))
    t2.protocol = p2
    p2.makeConnection(t2)
    p1.dataReceived(b"  V1" + identify() + b"REGISTER t\n")
    d = factory.close_all()
    assert d.called and not t1.connected and not t2.connected
    assert db.find_producers(CLIENT, "", "") == [] and db.topics() == ["t"]
    assert Registration(TOPIC, "t") in db
