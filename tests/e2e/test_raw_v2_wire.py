"""Raw TCP protocol V2 bytes against an embedded nsqd over loopback: every command, every error path with its
fatal/non-fatal handling, and isolation (a misbehaving client never costs another client a message)."""

from __future__ import annotations

import json
import struct

import pytest
import pytest_twisted
from twisted.internet import defer, reactor

from nsqtw.protocol.frames import FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE
from nsqtw.testing import body_command, command, connect_raw, decode_frames, identify_command, mpub_command

pytestmark = pytest.mark.e2e

OK = (FRAME_RESPONSE, b"OK")
ID = "0123456789abcdef"


def size(n: int) -> bytes:
    return struct.pack(">i", n)


async def closed_within(client, seconds: float = 5.0) -> None:
    d = defer.Deferred()
    client.closed.addBoth(lambda r: (d.callback(None) if not d.called else None, r)[1])
    d.addTimeout(seconds, reactor)
    await d


async def frames_until_closed(port: int, data: bytes, magic: bool = True) -> list[tuple[int, bytes]]:
    """Send ``data`` on a fresh connection and return every frame nsqd wrote before closing it."""
    c = await connect_raw(port, send_magic=magic)
    c.send(data)
    await closed_within(c)
    return decode_frames(c.received)


# --- every command's success path ---------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_identify_negotiation_answer(raw):
    """IDENTIFY with feature_negotiation answers nsqd 1.3.0's JSON; without it, OK."""
    raw.send(identify_command(feature_negotiation=True, client_id="c1", user_agent="raw/1.0", msg_timeout=5000))
    ans = json.loads(await raw.response())
    assert list(ans) == ["max_rdy_count", "version", "max_msg_timeout", "msg_timeout", "tls_v1", "deflate",
                         "deflate_level", "max_deflate_level", "snappy", "sample_rate", "auth_required",
                         "output_buffer_size", "output_buffer_timeout"]
    assert ans["version"] == "1.3.0" and ans["msg_timeout"] == 5000 and ans["auth_required"] is False
    raw.send(identify_command(client_id="again"))
    assert await raw.response() == b"OK"


@pytest_twisted.ensureDeferred
async def test_every_command_round_trip(nsqd, raw):
    """PUB, MPUB, DPUB, SUB, RDY, FIN, REQ, TOUCH, NOP and CLS over the wire, answered as nsqd answers them."""
    cons = await connect_raw(nsqd.tcp_port)
    cons.send(identify_command(heartbeat_interval=5000) + command("SUB", "t", "c") + command("RDY", 10))
    assert await cons.response() == b"OK"
    assert await cons.response() == b"OK"
    raw.send(body_command("PUB", "t", body=b"one"))
    assert await raw.response() == b"OK"
    raw.send(mpub_command("t", [b"two", b"three"]))
    assert await raw.response() == b"OK"
    raw.send(body_command("DPUB", "t", 0, body=b"four"))
    assert await raw.response() == b"OK"
    raw.send(command("NOP"))
    msgs = [await cons.message() for _ in range(4)]
    assert [m.body for m in msgs] == [b"one", b"two", b"three", b"four"]
    assert all(m.attempts == 1 for m in msgs)
    cons.send(command("TOUCH", msgs[0].id.decode()) + command("FIN", msgs[0].id.decode())
              + command("REQ", msgs[1].id.decode(), 0) + command("NOP"))
    again = await cons.message()
    assert (again.id, again.attempts) == (msgs[1].id, 2)
    cons.send(command("CLS"))
    assert await cons.response() == b"CLOSE_WAIT"
    cons.send(b"".join(command("FIN", m.id.decode()) for m in (again, msgs[2], msgs[3])))
    raw.send(body_command("PUB", "t", body=b"five"))
    assert await raw.response() == b"OK"
    ch = nsqd._broker.find_channel("t", "c")
    assert cons.connected_ and ch.depth() == 1
    await cons.close()
    assert raw.pending() == []


@pytest_twisted.ensureDeferred
async def test_message_frame_bytes_on_the_wire(nsqd, raw):
    """The raw bytes of a delivered message: [size][type 2][ts][attempts][16 hex id][body]."""
    raw.send(command("SUB", "t", "c") + command("RDY", 1))
    assert await raw.response() == b"OK"
    start = len(raw.received)
    prod = await connect_raw(nsqd.tcp_port)
    prod.send(body_command("PUB", "t", body=b"payload"))
    await prod.response()
    await raw.message()
    data = raw.received[start:]
    sz, ftype, ts, attempts = struct.unpack(">iiqH", data[:18])
    assert (sz, ftype, attempts) == (4 + 26 + 7, FRAME_MESSAGE, 1)
    assert int(ts) > 1_600_000_000 * 10**9
    assert len(data[18:34]) == 16 and data[34:] == b"payload"
    await prod.close()


# --- fatal error paths ----------------------------------------------------------------------------------


FATAL = [
    ("bad-magic", b"  V1", [(FRAME_ERROR, b"E_BAD_PROTOCOL")]),
    ("invalid-command", b"FOO\n", [(FRAME_ERROR, b"E_INVALID invalid command FOO")]),
    ("empty-line", b"\n", [(FRAME_ERROR, b"E_INVALID invalid command ")]),
    ("identify-bad-json", body_command("IDENTIFY", body=b"{"),
     [(FRAME_ERROR, b"E_BAD_BODY IDENTIFY failed to decode JSON body")]),
    ("identify-bad-heartbeat", identify_command(heartbeat_interval=10),
     [(FRAME_ERROR, b"E_BAD_BODY IDENTIFY heartbeat interval (10) is invalid")]),
    ("identify-size-0", b"IDENTIFY\n" + size(0), [(FRAME_ERROR, b"E_BAD_BODY IDENTIFY invalid body size 0")]),
    ("identify-after-sub", command("SUB", "t", "c") + identify_command(),
     [OK, (FRAME_ERROR, b"E_INVALID cannot IDENTIFY in current state")]),
    ("sub-twice", command("SUB", "t", "c") + command("SUB", "t", "c"),
     [OK, (FRAME_ERROR, b"E_INVALID cannot SUB in current state")]),
    ("sub-missing", b"SUB t\n", [(FRAME_ERROR, b"E_INVALID SUB insufficient number of parameters")]),
    ("sub-bad-topic", b"SUB t! c\n", [(FRAME_ERROR, b'E_BAD_TOPIC SUB topic name "t!" is not valid')]),
    ("sub-bad-channel", b"SUB t c!\n", [(FRAME_ERROR, b'E_BAD_CHANNEL SUB channel name "c!" is not valid')]),
    ("sub-no-heartbeat", identify_command(heartbeat_interval=-1) + command("SUB", "t", "c"),
     [OK, (FRAME_ERROR, b"E_INVALID cannot SUB with heartbeats disabled")]),
    ("pub-missing", b"PUB\n", [(FRAME_ERROR, b"E_INVALID PUB insufficient number of parameters")]),
    ("pub-bad-topic", b"PUB a/b\n" + size(1) + b"x", [(FRAME_ERROR, b'E_BAD_TOPIC PUB topic name "a/b" is not valid')]),
    ("pub-size-0", b"PUB t\n" + size(0), [(FRAME_ERROR, b"E_BAD_MESSAGE PUB invalid message body size 0")]),
    ("pub-too-big", b"PUB t\n" + size(1048577), [(FRAME_ERROR, b"E_BAD_MESSAGE PUB message too big 1048577 > 1048576")]),
    ("mpub-bad-topic", b"MPUB a/b\n", [(FRAME_ERROR, b'E_BAD_TOPIC E_BAD_TOPIC MPUB topic name "a/b" is not valid')]),
    ("mpub-body-0", b"MPUB t\n" + size(0), [(FRAME_ERROR, b"E_BAD_BODY MPUB invalid body size 0")]),
    ("mpub-body-too-big", b"MPUB t\n" + size(5242881), [(FRAME_ERROR, b"E_BAD_BODY MPUB body too big 5242881 > 5242880")]),
    ("mpub-count-0", b"MPUB t\n" + size(4) + size(0), [(FRAME_ERROR, b"E_BAD_BODY MPUB invalid message count 0")]),
    ("mpub-msg-0", b"MPUB t\n" + size(13) + size(2) + size(1) + b"a" + size(0),
     [(FRAME_ERROR, b"E_BAD_MESSAGE MPUB invalid message(1) body size 0")]),
    ("dpub-missing", b"DPUB t\n", [(FRAME_ERROR, b"E_INVALID DPUB insufficient number of parameters")]),
    ("dpub-parse", b"DPUB t soon\n", [(FRAME_ERROR, b"E_INVALID DPUB could not parse timeout soon")]),
    ("dpub-range", b"DPUB t 3600001\n", [(FRAME_ERROR, b"E_INVALID DPUB timeout 3600001 out of range 0-3600000")]),
    ("rdy-before-sub", b"RDY 1\n", [(FRAME_ERROR, b"E_INVALID cannot RDY in current state")]),
    ("rdy-parse", command("SUB", "t", "c") + b"RDY x\n", [OK, (FRAME_ERROR, b"E_INVALID RDY could not parse count x")]),
    ("rdy-range", command("SUB", "t", "c") + b"RDY 2501\n",
     [OK, (FRAME_ERROR, b"E_INVALID RDY count 2501 out of range 0-2500")]),
    ("fin-before-sub", command("FIN", ID), [(FRAME_ERROR, b"E_INVALID cannot FIN in current state")]),
    ("fin-missing", command("SUB", "t", "c") + b"FIN\n", [OK, (FRAME_ERROR, b"E_INVALID FIN insufficient number of params")]),
    ("fin-bad-id", command("SUB", "t", "c") + b"FIN 123\n", [OK, (FRAME_ERROR, b"E_INVALID invalid message ID")]),
    ("req-before-sub", command("REQ", ID, 0), [(FRAME_ERROR, b"E_INVALID cannot REQ in current state")]),
    ("req-missing", command("SUB", "t", "c") + command("REQ", ID),
     [OK, (FRAME_ERROR, b"E_INVALID REQ insufficient number of params")]),
    ("req-parse", command("SUB", "t", "c") + command("REQ", ID, "x"),
     [OK, (FRAME_ERROR, b"E_INVALID REQ could not parse timeout x")]),
    ("touch-before-sub", command("TOUCH", ID), [(FRAME_ERROR, b"E_INVALID cannot TOUCH in current state")]),
    ("touch-missing", command("SUB", "t", "c") + b"TOUCH\n",
     [OK, (FRAME_ERROR, b"E_INVALID TOUCH insufficient number of params")]),
    ("cls-before-sub", b"CLS\n", [(FRAME_ERROR, b"E_INVALID cannot CLS in current state")]),
    ("cls-twice", command("SUB", "t", "c") + b"CLS\nCLS\n",
     [OK, (FRAME_RESPONSE, b"CLOSE_WAIT"), (FRAME_ERROR, b"E_INVALID cannot CLS in current state")]),
    ("auth-disabled", body_command("AUTH", body=b"secret"), [(FRAME_ERROR, b"E_AUTH_DISABLED AUTH disabled")]),
    ("auth-params", body_command("AUTH", "x", body=b"secret"),
     [(FRAME_ERROR, b"E_INVALID AUTH invalid number of parameters")]),
    ("over-long-line", b"X" * 17000 + b"\n", []),
]


@pytest.mark.parametrize("data,expected", [c[1:] for c in FATAL], ids=[c[0] for c in FATAL])
@pytest_twisted.ensureDeferred
async def test_fatal_error_then_close(nsqd, data, expected):
    """A fatal error: nsqd writes the error frame (none for an over-long line) and closes; trailing
    commands in the same write are not run."""
    magic = not data.startswith(b"  V")
    trailer = command("NOP") + body_command("PUB", "never", body=b"x")
    frames = await frames_until_closed(nsqd.tcp_port, data + trailer, magic=magic)
    assert frames == expected
    assert "never" not in nsqd._broker.topics


# --- non-fatal error paths ----------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_non_fatal_errors_keep_the_connection(nsqd, raw):
    """E_FIN_FAILED, E_REQ_FAILED, E_TOUCH_FAILED: the error frame, and the connection and later
    commands of the same write carry on."""
    raw.send(command("SUB", "t", "c"))
    assert await raw.response() == b"OK"
    raw.send(command("FIN", ID) + command("REQ", ID, 10) + command("TOUCH", ID)
             + body_command("PUB", "other", body=b"x"))
    assert await raw.error() == f"E_FIN_FAILED FIN {ID} failed ID not in flight".encode()
    assert await raw.error() == f"E_REQ_FAILED REQ {ID} failed ID not in flight".encode()
    assert await raw.error() == f"E_TOUCH_FAILED TOUCH {ID} failed ID not in flight".encode()
    assert await raw.response() == b"OK"
    assert raw.connected_


@pytest_twisted.ensureDeferred
async def test_ownership_errors_between_two_consumers(nsqd):
    """FIN/REQ/TOUCH of a message another consumer holds: non-fatal 'client does not own message'."""
    a = await connect_raw(nsqd.tcp_port)
    b = await connect_raw(nsqd.tcp_port)
    a.send(command("SUB", "t", "c") + command("RDY", 1))
    b.send(command("SUB", "t", "c"))
    assert await a.response() == b"OK" and await b.response() == b"OK"
    b.send(body_command("PUB", "t", body=b"x"))
    assert await b.response() == b"OK"
    mid = (await a.message()).id.decode()
    b.send(command("FIN", mid) + command("REQ", mid, 0) + command("TOUCH", mid))
    for verb in ("FIN", "REQ", "TOUCH"):
        assert await b.error() == f"E_{verb}_FAILED {verb} {mid} failed client does not own message".encode()
    a.send(command("FIN", mid) + command("NOP"))
    b.send(body_command("PUB", "t", body=b"y"))
    assert await b.response() == b"OK"
    assert (await a.message()).body == b"y"
    await a.close()
    await b.close()


# --- isolation ----------------------------------------------------------------------------------------


def _bad_behaviours() -> list[bytes]:
    return [
        b"\x00\x01\x02garbage\xff\n",
        b"HTTP/1.1 200 OK\r\n\r\n",
        b"PUB t\n" + size(10 * 1024 * 1024),
        b"MPUB t\n" + size(13) + size(3) + size(1) + b"a" + size(-1),
        b"RDY 5\n",
        command("FIN", ID),
        b"A" * 40000,
        body_command("IDENTIFY", body=b"[]"),
        command("SUB", "t", "c") + b"RDY 999999\n",
        command("SUB", "t", "bad!"),
        b"DPUB t 99999999999\n" + size(1) + b"x",
    ]


@pytest_twisted.ensureDeferred
async def test_misbehaving_clients_cost_a_good_pair_nothing(nsqd):
    """While other clients send garbage, oversized bodies, commands in the wrong state and bad magic, a
    producer keeps publishing and a consumer on the same topic gets every message exactly once."""
    cons = await connect_raw(nsqd.tcp_port)
    cons.send(command("SUB", "t", "c") + command("RDY", 2500))
    assert await cons.response() == b"OK"
    prod = await connect_raw(nsqd.tcp_port)
    bad = _bad_behaviours()
    expected = []
    victims = []
    for round_no in range(len(bad)):
        v = await connect_raw(nsqd.tcp_port, send_magic=(round_no % 4 != 3))
        v.send(bad[round_no])
        victims.append(v)
        batch = [b"r%d-%d" % (round_no, i) for i in range(20)]
        expected += batch
        prod.send(mpub_command("t", batch[:10]) + b"".join(body_command("PUB", "t", body=b) for b in batch[10:]))
        for _ in range(11):
            assert await prod.response() == b"OK"
    for v in victims:
        await closed_within(v)
        frames = decode_frames(v.received)
        assert all(t == FRAME_ERROR for t, _ in frames if (t, _) != OK), frames
    got = [await cons.message() for _ in range(len(expected))]
    assert sorted(m.body for m in got) == sorted(expected)
    assert len({m.id for m in got}) == len(expected)
    cons.send(b"".join(command("FIN", m.id.decode()) for m in got) + command("NOP"))
    prod.send(body_command("PUB", "t", body=b"last"))
    assert await prod.response() == b"OK"
    assert (await cons.message()).body == b"last"
    ch = nsqd._broker.find_channel("t", "c")
    assert ch.message_count == len(expected) + 1 and len(ch.inflight) == 1
    assert prod.connected_ and cons.connected_
    await prod.close()
    await cons.close()


@pytest_twisted.ensureDeferred
async def test_client_vanishing_mid_body_publishes_nothing(nsqd):
    """A publisher that disconnects halfway through a PUB or MPUB body leaves no partial message behind,
    and the topic keeps working for others."""
    half = await connect_raw(nsqd.tcp_port)
    data = body_command("PUB", "t", body=b"x" * 100000)
    half.send(data[: len(data) // 2])
    half2 = await connect_raw(nsqd.tcp_port)
    m = mpub_command("t", [b"a" * 1000] * 10)
    half2.send(m[:5000])
    await half.close()
    await half2.close()
    good = await connect_raw(nsqd.tcp_port)
    good.send(body_command("PUB", "t", body=b"whole"))
    assert await good.response() == b"OK"
    assert nsqd._broker.find_topic("t").message_count == 1
    await good.close()


@pytest_twisted.ensureDeferred
async def test_large_pub_arrives_intact_over_loopback(nsqd):
    """A 1 MiB PUB body and a 4 MiB MPUB arrive intact and in order."""
    cons = await connect_raw(nsqd.tcp_port)
    cons.send(command("SUB", "big", "c") + command("RDY", 100))
    assert await cons.response() == b"OK"
    prod = await connect_raw(nsqd.tcp_port)
    body = bytes(range(256)) * 4096
    bodies = [bytes([i]) * 100000 for i in range(40)]
    prod.send(body_command("PUB", "big", body=body) + mpub_command("big", bodies))
    assert await prod.response() == b"OK"
    assert await prod.response() == b"OK"
    got = [await cons.message() for _ in range(41)]
    assert got[0].body == body and [m.body for m in got[1:]] == bodies
    await prod.close()
    await cons.close()
