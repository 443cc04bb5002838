"""Every V2 command and every E_* path with nsqd 1.3.0's exact text and fatal/non-fatal handling
(nsqd/protocol_v2.go), driven without sockets."""

from __future__ import annotations


import pytest

from nsqtw.nsqd.core.client import STATE_CLOSING, STATE_SUBSCRIBED
from nsqtw.protocol.frames import FRAME_ERROR, FRAME_RESPONSE
from nsqtw.protocol.names import is_valid_name

from nsqd_harness import Harness, body_cmd, cmd, dpub, identify, mpub, mpub_payload, pub, size

ID = "0123456789abcdef"  # well-formed, never minted by the broker in these tests


def subscribed(h: Harness, topic: str = "t", channel: str = "c", rdy: int = 0):
    w = h.consumer(topic, channel)
    if rdy:
        w.send(cmd("RDY", rdy))
    return w


# --- magic and framing --------------------------------------------------------------------


def test_bad_magic_gets_framed_error_then_close():
    """Any magic other than '  V2' gets one framed E_BAD_PROTOCOL and the connection closes."""
    h = Harness()
    w = h.connect(magic=False)
    assert w.send(b"  V1") is False
    assert w.frames() == [(FRAME_ERROR, b"E_BAD_PROTOCOL")]


def test_magic_split_across_reads():
    """The magic may arrive a byte at a time."""
    h = Harness()
    w = h.connect(magic=False)
    for b in b"  V2":
        assert w.send(bytes([b]))
    w.send(pub("t", b"x"))
    w.ok()


def test_crlf_line_endings_accepted():
    """A trailing \\r before \\n is stripped."""
    h = Harness()
    w = h.connect()
    w.send(b"PUB t\r\n" + size(2) + b"hi")
    w.ok()
    w.send(b"NOP\r\n")
    w.nothing()
    assert h.topic("t").message_count == 1


def test_params_split_on_single_space():
    """Two spaces make an empty parameter (so here an empty, invalid channel name)."""
    h = Harness()
    w = h.connect()
    assert w.send(b"SUB t  c\n") is False
    assert w.error() == b'E_BAD_CHANNEL SUB channel name "" is not valid'


@pytest.mark.parametrize("line,text", [
    (b"FOO\n", b"E_INVALID invalid command FOO"),
    (b"pub t\n", b"E_INVALID invalid command pub"),
    (b"\n", b"E_INVALID invalid command "),
    (b" NOP\n", b"E_INVALID invalid command "),
])
def test_unknown_command_is_fatal(line, text):
    """An unknown command (also an empty line or a leading space) is a fatal E_INVALID; later commands do not run."""
    h = Harness()
    w = h.connect()
    assert w.send(line + pub("t", b"x")) is False
    assert w.frames() == [(FRAME_ERROR, text)]
    assert "t" not in h.broker.topics


def test_whole_session_fed_one_byte_at_a_time():
    """Parsing does not depend on how the bytes are cut into reads."""
    h = Harness()
    prod = h.producer()
    cons = h.connect()
    data = identify(client_id="x") + cmd("SUB", "t", "c") + cmd("RDY", 10)
    for i in range(len(data)):
        cons.send(data[i:i + 1])
    assert cons.responses() == [b"OK", b"OK"]
    stream = pub("t", b"one") + mpub("t", [b"two", b"three"]) + dpub("t", 0, b"four")
    for i in range(len(stream)):
        prod.send(stream[i:i + 1])
    assert prod.responses() == [b"OK", b"OK", b"OK"]
    msgs = cons.messages()
    assert [m.body for m in msgs] == [b"one", b"two", b"three", b"four"]
    fins = b"".join(cmd("FIN", m.id.decode()) for m in msgs)
    for i in range(len(fins)):
        cons.send(fins[i:i + 1])
    cons.nothing()
    assert h.channel("t", "c").inflight == {}


# --- the 16 KiB line limit ----------------------------------------------------------------


def test_line_longer_than_16k_without_newline_closes_silently():
    """A command line longer than nsqd's 16 KiB read buffer closes the connection with no error frame."""
    h = Harness()
    w = h.connect()
    assert w.send(b"NOP " + b"x" * 20000) is False
    assert w.frames() == []


def test_line_longer_than_16k_with_newline_closes_silently():
    """The same when the over-long line is complete."""
    h = Harness()
    w = h.connect()
    assert w.send(b"NOP " + b"x" * 20000 + b"\n") is False
    assert w.frames() == []


def test_line_of_16383_bytes_is_accepted():
    """A line of 16383 bytes plus its newline fills the 16 KiB buffer exactly and is read."""
    h = Harness()
    w = h.connect()
    line = b"NOP " + b"x" * (16383 - 4)
    assert len(line + b"\n") == 16384
    assert w.send(line + b"\n") is True
    w.send(pub("t", b"x"))
    w.ok()


def test_line_of_16384_bytes_closes():
    """A 16384-byte line plus newline does not fit nsqd's 16 KiB bufio buffer: closed, no error frame."""
    h = Harness()
    w = h.connect()
    line = b"NOP " + b"x" * (16384 - 4)
    assert w.send(line + b"\n") is False
    assert w.frames() == []


# --- fatal vs non-fatal -------------------------------------------------------------------


def test_non_fatal_error_keeps_later_commands_of_the_same_read():
    """E_FIN_FAILED, E_REQ_FAILED and E_TOUCH_FAILED leave the connection open and the rest of the read runs."""
    h = Harness()
    w = subscribed(h)
    data = (cmd("FIN", ID) + cmd("REQ", ID, 0) + cmd("TOUCH", ID) + cmd("NOP") + pub("t2", b"x")
            + cmd("FIN", ID))
    assert w.send(data) is True
    assert w.frames() == [
        (FRAME_ERROR, f"E_FIN_FAILED FIN {ID} failed ID not in flight".encode()),
        (FRAME_ERROR, f"E_REQ_FAILED REQ {ID} failed ID not in flight".encode()),
        (FRAME_ERROR, f"E_TOUCH_FAILED TOUCH {ID} failed ID not in flight".encode()),
        (FRAME_RESPONSE, b"OK"),
        (FRAME_ERROR, f"E_FIN_FAILED FIN {ID} failed ID not in flight".encode()),
    ]
    assert w.alive and h.topic("t2").message_count == 1


def test_fatal_error_drops_the_rest_of_the_read():
    """After a fatal error nothing else in the same read runs and the connection closes."""
    h = Harness()
    w = h.connect()
    assert w.send(cmd("RDY", 1) + pub("t", b"x")) is False
    assert w.frames() == [(FRAME_ERROR, b"E_INVALID cannot RDY in current state")]
    assert "t" not in h.broker.topics


# --- SUB ----------------------------------------------------------------------------------


def test_sub_creates_topic_and_channel():
    """SUB answers OK, creates topic and channel, subscribes with RDY 0."""
    h = Harness()
    w = h.connect()
    w.send(cmd("SUB", "events", "archive"))
    w.ok()
    ch = h.channel("events", "archive")
    assert w.client.state == STATE_SUBSCRIBED and w.client.rdy == 0
    assert w.client.id in ch.clients


@pytest.mark.parametrize("line,text", [
    (b"SUB t\n", b"E_INVALID SUB insufficient number of parameters"),
    (b"SUB\n", b"E_INVALID SUB insufficient number of parameters"),
    (b"SUB bad! c\n", b'E_BAD_TOPIC SUB topic name "bad!" is not valid'),
    (b"SUB t bad!\n", b'E_BAD_CHANNEL SUB channel name "bad!" is not valid'),
    (b"SUB bad! bad!\n", b'E_BAD_TOPIC SUB topic name "bad!" is not valid'),
    (b"SUB t " + b"c" * 65 + b"\n", b'E_BAD_CHANNEL SUB channel name "' + b"c" * 65 + b'" is not valid'),
])
def test_sub_errors(line, text):
    """SUB's parameter errors are fatal, topic checked before channel."""
    h = Harness()
    w = h.connect()
    assert w.send(line) is False
    assert w.error() == text


def test_sub_twice_is_fatal():
    """One SUB per connection."""
    h = Harness()
    w = subscribed(h)
    assert w.send(cmd("SUB", "t", "d")) is False
    assert w.error() == b"E_INVALID cannot SUB in current state"


def test_sub_heartbeat_check_comes_before_parameters():
    """With heartbeats disabled even a malformed SUB reports the heartbeat error."""
    h = Harness()
    w = h.connect()
    w.send(identify(heartbeat_interval=-1))
    w.ok()
    assert w.send(b"SUB\n") is False
    assert w.error() == b"E_INVALID cannot SUB with heartbeats disabled"


def test_max_channel_consumers():
    """--max-channel-consumers refuses the extra consumer with E_SUB_FAILED (fatal); other channels are free."""
    h = Harness(max_channel_consumers=2)
    subscribed(h)
    subscribed(h)
    w = h.connect()
    assert w.send(cmd("SUB", "t", "c")) is False
    assert w.error() == b"E_SUB_FAILED SUB failed consumers for t:c exceeds limit of 2"
    subscribed(h, channel="other")
    assert len(h.channel("t", "c").clients) == 2


# --- PUB ----------------------------------------------------------------------------------


def test_pub_ok_creates_topic_and_counts():
    """PUB answers OK, auto-creates the topic and counts messages and bytes."""
    h = Harness()
    w = h.connect()
    w.send(pub("t", b"hello"))
    w.ok()
    t = h.topic("t")
    assert (t.message_count, t.message_bytes, t.depth()) == (1, 5, 1)
    assert w.client.pub_counts == {"t": 1}


@pytest.mark.parametrize("data,text", [
    (b"PUB\n", b"E_INVALID PUB insufficient number of parameters"),
    (b"PUB bad!name\n" + size(1) + b"x", b'E_BAD_TOPIC PUB topic name "bad!name" is not valid'),
    (b"PUB bad!name\n" + size(0), b'E_BAD_TOPIC PUB topic name "bad!name" is not valid'),
    (b"PUB t\n" + size(0), b"E_BAD_MESSAGE PUB invalid message body size 0"),
    (b"PUB t\n" + size(-5), b"E_BAD_MESSAGE PUB invalid message body size -5"),
    (b"PUB t\n" + size(1024 * 1024 + 1), b"E_BAD_MESSAGE PUB message too big 1048577 > 1048576"),
])
def test_pub_errors(data, text):
    """PUB's errors, each fatal; an oversized body is refused before it is read."""
    h = Harness()
    w = h.connect()
    assert w.send(data) is False
    assert w.error() == text
    assert not h.broker.topics or h.topic("t").message_count == 0


def test_pub_max_msg_size_is_inclusive_and_configurable():
    """A body of exactly --max-msg-size is accepted; one byte more is not."""
    h = Harness(max_msg_size=10)
    w = h.connect()
    w.send(pub("t", b"x" * 10))
    w.ok()
    assert w.send(pub("t", b"x" * 11)) is False
    assert w.error() == b"E_BAD_MESSAGE PUB message too big 11 > 10"


def test_pub_allowed_in_every_state():
    """PUB, MPUB, DPUB and NOP work before SUB, after SUB and after CLS."""
    h = Harness()
    w = h.connect()
    w.send(pub("p", b"1"))
    w.ok()
    w.send(cmd("SUB", "t", "c"))
    w.ok()
    w.send(pub("p", b"2") + mpub("p", [b"3"]) + dpub("p", 10, b"4") + cmd("NOP"))
    assert w.responses() == [b"OK", b"OK", b"OK"]
    w.send(cmd("CLS"))
    assert w.responses() == [b"CLOSE_WAIT"]
    w.send(pub("p", b"5") + cmd("NOP"))
    w.ok()
    assert h.topic("p").message_count == 5


@pytest.mark.parametrize("name,quoted", [
    (b"bad\xffname", b'"bad\\xffname"'),
    (b"caf\xc3\xa9", b'"caf\xc3\xa9"'),
    (b"a\tb", b'"a\\tb"'),
    (b'q"uote', b'"q\\"uote"'),
])
def test_bad_topic_name_is_quoted_like_go(name, quoted):
    """The invalid name is printed with Go's %q (escapes, invalid UTF-8 as \\x.., printable runes as is)."""
    h = Harness()
    w = h.connect()
    assert w.send(b"PUB " + name + b"\n" + size(1) + b"x") is False
    assert w.error() == b"E_BAD_TOPIC PUB topic name " + quoted + b" is not valid"


# --- names --------------------------------------------------------------------------------


@pytest.mark.parametrize("name,valid", [
    ("a", True), ("a" * 64, True), ("a" * 65, False), ("", False),
    ("a.b-c_D9", True), ("x#ephemeral", True), ("#ephemeral", False),
    ("a" * 54 + "#ephemeral", True), ("a" * 55 + "#ephemeral", False),
    ("a#b", False), ("a#ephemeral#ephemeral", False), ("a#ephemeralx", False),
    ("a b", False), ("a:b", False), ("a/b", False), ("\u00e9", False), ("a\n", False),
])
def test_name_rules(name, valid):
    """Names are 1-64 chars of [.a-zA-Z0-9_-], optional #ephemeral suffix counted in the 64."""
    assert is_valid_name(name) is valid


def test_name_rules_apply_to_sub_and_pub():
    """A 64-char ephemeral name is usable over the wire; 65 chars are refused."""
    h = Harness()
    good = "a" * 54 + "#ephemeral"
    w = h.connect()
    w.send(cmd("SUB", good, good))
    w.ok()
    w = h.connect()
    assert w.send(pub("a" * 55 + "#ephemeral", b"x")) is False
    assert w.error().startswith(b"E_BAD_TOPIC PUB topic name ")


# --- MPUB ---------------------------------------------------------------------------------


def test_mpub_ok():
    """MPUB queues every message and answers OK once."""
    h = Harness()
    w = h.connect()
    w.send(mpub("t", [b"a", b"bb", b"ccc"]))
    w.ok()
    t = h.topic("t")
    assert (t.message_count, t.message_bytes) == (3, 6)
    assert w.client.pub_counts == {"t": 3}


@pytest.mark.parametrize("data,text", [
    (b"MPUB\n", b"E_INVALID MPUB insufficient number of parameters"),
    (b"MPUB bad!\n" + size(4), b'E_BAD_TOPIC E_BAD_TOPIC MPUB topic name "bad!" is not valid'),
    (b"MPUB t\n" + size(0), b"E_BAD_BODY MPUB invalid body size 0"),
    (b"MPUB t\n" + size(-1), b"E_BAD_BODY MPUB invalid body size -1"),
    (b"MPUB t\n" + size(5 * 1024 * 1024 + 1), b"E_BAD_BODY MPUB body too big 5242881 > 5242880"),
    (b"MPUB t\n" + size(4) + size(0), b"E_BAD_BODY MPUB invalid message count 0"),
    (b"MPUB t\n" + size(4) + size(-3), b"E_BAD_BODY MPUB invalid message count -3"),
    (b"MPUB t\n" + size(8) + size(1048576) + size(1), b"E_BAD_BODY MPUB invalid message count 1048576"),
    (b"MPUB t\n" + size(14) + size(2) + size(1) + b"a" + size(0) + b"x",
     b"E_BAD_MESSAGE MPUB invalid message(1) body size 0"),
    (b"MPUB t\n" + size(9) + size(1) + size(-2) + b"x", b"E_BAD_MESSAGE MPUB invalid message(0) body size -2"),
    (b"MPUB t\n" + size(12) + size(1) + size(1048577) + b"xxxx",
     b"E_BAD_MESSAGE MPUB message too big 1048577 > 1048576"),
])
def test_mpub_errors(data, text):
    """MPUB's errors with nsqd's texts (the duplicated E_BAD_TOPIC included), all fatal."""
    h = Harness()
    w = h.connect()
    assert w.send(data) is False
    assert w.error() == text


def test_mpub_creates_topic_before_reading_body():
    """nsqd calls GetTopic before the body size, so a refused MPUB still leaves the topic created."""
    h = Harness()
    w = h.connect()
    w.send(b"MPUB fresh\n" + size(0))
    assert w.error() == b"E_BAD_BODY MPUB invalid body size 0"
    assert h.topic("fresh").message_count == 0


def test_mpub_is_all_or_nothing():
    """A bad message anywhere in an MPUB queues none of the messages before it."""
    h = Harness()
    cons = subscribed(h, rdy=100)
    w = h.connect()
    bodies = [b"a", b"b", b"c"]
    payload = mpub_payload(bodies)[:-5] + size(0) + b"c"  # third message announces size 0
    assert w.send(body_cmd("MPUB", "t", body=payload)) is False
    assert w.error() == b"E_BAD_MESSAGE MPUB invalid message(2) body size 0"
    assert h.topic("t").message_count == 0
    assert h.channel("t", "c").message_count == 0
    cons.nothing()


def test_mpub_max_count_follows_max_body_size():
    """The message count is bounded by (--max-body-size - 4) / 5."""
    h = Harness(max_body_size=54)  # (54-4)/5 = 10
    w = h.connect()
    w.send(mpub("t", [b"x"] * 10))  # 4 + 10 * 5 = 54 bytes, the maximum
    w.ok()
    assert w.send(b"MPUB t\n" + size(8) + size(11) + size(1)) is False
    assert w.error() == b"E_BAD_BODY MPUB invalid message count 11"


def test_mpub_outer_size_smaller_than_content_is_refused():
    """Deliberately stricter than nsqd (which only bounds-checks the outer size): messages may not
    run past the body size the MPUB announced, so a client cannot make nsqd buffer more than
    --max-body-size; the MPUB is refused whole."""
    h = Harness()
    w = h.connect()
    payload = mpub_payload([b"hello", b"world"])
    w.send(b"MPUB t\n" + size(5) + payload)
    assert w.error() == b"E_BAD_BODY MPUB message(0) body size 5 overruns the announced body size"
    assert h.topic("t").message_count == 0


def test_mpub_outer_size_larger_than_content_answers_at_once():
    """An MPUB whose outer size overstates its content is answered as soon as its messages are read."""
    h = Harness()
    w = h.connect()
    payload = mpub_payload([b"hello", b"world"])
    w.send(b"MPUB t\n" + size(len(payload) + 100) + payload)
    assert w.frames() == [(FRAME_RESPONSE, b"OK")]


# --- DPUB ---------------------------------------------------------------------------------


@pytest.mark.parametrize("data,text", [
    (b"DPUB t\n", b"E_INVALID DPUB insufficient number of parameters"),
    (b"DPUB\n", b"E_INVALID DPUB insufficient number of parameters"),
    (b"DPUB bad! 10\n" + size(1) + b"x", b'E_BAD_TOPIC DPUB topic name "bad!" is not valid'),
    (b"DPUB t abc\n" + size(1) + b"x", b"E_INVALID DPUB could not parse timeout abc"),
    (b"DPUB t -1\n" + size(1) + b"x", b"E_INVALID DPUB could not parse timeout -1"),
    (b"DPUB t +5\n" + size(1) + b"x", b"E_INVALID DPUB could not parse timeout +5"),
    (b"DPUB t 3600001\n" + size(1) + b"x", b"E_INVALID DPUB timeout 3600001 out of range 0-3600000"),
    (b"DPUB t 10\n" + size(0), b"E_BAD_MESSAGE DPUB invalid message body size 0"),
    (b"DPUB t 10\n" + size(1024 * 1024 + 1), b"E_BAD_MESSAGE DPUB message too big 1048577 > 1048576"),
])
def test_dpub_errors(data, text):
    """DPUB's errors; a delay outside [0, --max-req-timeout] is fatal (not clamped, unlike REQ)."""
    h = Harness()
    w = h.connect()
    assert w.send(data) is False
    assert w.error() == text


def test_dpub_range_follows_max_req_timeout():
    """The DPUB bound is --max-req-timeout in ms, inclusive."""
    h = Harness(max_req_timeout=10.0)
    w = h.connect()
    w.send(dpub("t", 10000, b"x"))
    w.ok()
    assert w.send(dpub("t", 10001, b"x")) is False
    assert w.error() == b"E_INVALID DPUB timeout 10001 out of range 0-10000"


def test_dpub_empty_timeout_parses_as_zero():
    """nsqd's ByteToBase10 reads an empty parameter as 0: an immediate message."""
    h = Harness()
    cons = subscribed(h, rdy=1)
    w = h.connect()
    w.send(b"DPUB t \n" + size(1) + b"x")
    w.ok()
    assert [m.body for m in cons.messages()] == [b"x"]


# --- RDY ----------------------------------------------------------------------------------


@pytest.mark.parametrize("line,text", [
    (b"RDY abc\n", b"E_INVALID RDY could not parse count abc"),
    (b"RDY -1\n", b"E_INVALID RDY could not parse count -1"),
    (b"RDY 1.5\n", b"E_INVALID RDY could not parse count 1.5"),
    (b"RDY 2501\n", b"E_INVALID RDY count 2501 out of range 0-2500"),
])
def test_rdy_errors_are_fatal(line, text):
    """A count that does not parse or exceeds --max-rdy-count is fatal."""
    h = Harness()
    w = subscribed(h)
    assert w.send(line) is False
    assert w.error() == text


def test_rdy_before_sub_is_fatal():
    """RDY needs the subscribed state."""
    h = Harness()
    w = h.connect()
    assert w.send(cmd("RDY", 1)) is False
    assert w.error() == b"E_INVALID cannot RDY in current state"


def test_rdy_bounds_and_defaults():
    """Bare RDY means 1, 'RDY ' (empty) means 0, --max-rdy-count itself is allowed, and RDY has no answer."""
    h = Harness(max_rdy_count=50)
    w = subscribed(h)
    w.send(b"RDY\n")
    assert w.client.rdy == 1
    w.send(b"RDY 50\n")
    assert w.client.rdy == 50
    w.send(b"RDY \n")
    assert w.client.rdy == 0
    w.nothing()
    assert w.send(b"RDY 51\n") is False
    assert w.error() == b"E_INVALID RDY count 51 out of range 0-50"


def test_rdy_after_cls_is_ignored():
    """In the closing state RDY is silently ignored (no error, RDY stays 0)."""
    h = Harness()
    w = subscribed(h, rdy=5)
    w.send(cmd("CLS"))
    assert w.responses() == [b"CLOSE_WAIT"]
    assert w.send(cmd("RDY", 5)) is True
    assert w.send(cmd("RDY", 99999)) is True
    w.nothing()
    assert w.client.rdy == 0
    h.publish("t", b"x")
    w.nothing()


# --- FIN ----------------------------------------------------------------------------------


@pytest.mark.parametrize("line,text", [
    (b"FIN\n", b"E_INVALID FIN insufficient number of params"),
    (b"FIN abc\n", b"E_INVALID invalid message ID"),
    (b"FIN 0123456789abcdef0\n", b"E_INVALID invalid message ID"),
])
def test_fin_parameter_errors_are_fatal(line, text):
    """A missing or malformed message ID is a fatal E_INVALID."""
    h = Harness()
    w = subscribed(h)
    assert w.send(line) is False
    assert w.error() == text


def test_fin_before_sub_is_fatal():
    """FIN needs the subscribed or closing state."""
    h = Harness()
    w = h.connect()
    assert w.send(cmd("FIN", ID)) is False
    assert w.error() == b"E_INVALID cannot FIN in current state"


def test_fin_of_another_clients_message():
    """FIN of a message another client holds fails (non-fatal) and leaves it in flight for its owner."""
    h = Harness()
    a = subscribed(h, rdy=1)
    b = subscribed(h, rdy=1)
    h.publish("t", b"x")
    msgs = a.messages() + b.messages()
    assert len(msgs) == 1
    owner, other = (a, b) if a.client.in_flight else (b, a)
    mid = msgs[0].id.decode()
    other.send(cmd("FIN", mid) + cmd("NOP"))
    assert other.error() == f"E_FIN_FAILED FIN {mid} failed client does not own message".encode()
    assert other.alive
    owner.send(cmd("FIN", mid))
    owner.nothing()
    assert owner.client.finish_count == 1 and h.channel("t", "c").inflight == {}


def test_fin_lines_cut_across_reads():
    """A batch of FIN lines split mid-line (and mid-ID) across reads finishes every message."""
    h = Harness()
    w = subscribed(h, rdy=100)
    h.publish("t", *[b"m%d" % i for i in range(50)])
    msgs = w.messages()
    assert len(msgs) == 50
    data = b"".join(cmd("FIN", m.id.decode()) for m in msgs)
    w.send(data[:21 * 10 + 7])
    w.send(data[21 * 10 + 7:21 * 30 + 19])
    w.send(data[21 * 30 + 19:])
    w.nothing()
    assert w.client.finish_count == 50 and w.client.in_flight == 0
    assert h.channel("t", "c").inflight == {}


def test_fin_batch_with_one_unknown_id_reports_only_that_one():
    """In a run of FINs, one unknown ID gets its E_FIN_FAILED and the others are finished."""
    h = Harness()
    w = subscribed(h, rdy=10)
    h.publish("t", b"a", b"b", b"c")
    ids = [m.id.decode() for m in w.messages()]
    w.send(cmd("FIN", ids[0]) + cmd("FIN", ID) + cmd("FIN", ids[1]) + cmd("FIN", ids[2]))
    assert w.frames() == [(FRAME_ERROR, f"E_FIN_FAILED FIN {ID} failed ID not in flight".encode())]
    assert w.client.finish_count == 3 and w.client.in_flight == 0


def test_fin_twice():
    """The second FIN of the same message fails with 'ID not in flight' (non-fatal)."""
    h = Harness()
    w = subscribed(h, rdy=1)
    h.publish("t", b"x")
    mid = w.messages()[0].id.decode()
    w.send(cmd("FIN", mid) + cmd("FIN", mid))
    assert w.error() == f"E_FIN_FAILED FIN {mid} failed ID not in flight".encode()
    assert w.alive


def test_fin_short_id_with_crlf_is_invalid():
    """'FIN <15 bytes>\\r\\n' is a 15-byte ID once the \\r is stripped: fatal E_INVALID."""
    h = Harness()
    w = subscribed(h)
    assert w.send(b"FIN 0123456789abcde\r\n") is False
    assert w.error() == b"E_INVALID invalid message ID"


def test_fin_id_with_space_is_invalid():
    """A 16-byte 'ID' holding a space is two parameters for nsqd: the first is not 16 bytes, fatal E_INVALID."""
    h = Harness()
    w = subscribed(h)
    assert w.send(b"FIN 01234567 9abcdef\n") is False
    assert w.error() == b"E_INVALID invalid message ID"


def test_fin_with_crlf_finishes():
    """'FIN <id>\\r\\n' is a normal FIN."""
    h = Harness()
    w = subscribed(h, rdy=1)
    h.publish("t", b"x")
    mid = w.messages()[0].id
    w.send(b"FIN " + mid + b"\r\n")
    w.nothing()
    assert w.client.finish_count == 1


# --- REQ ----------------------------------------------------------------------------------


@pytest.mark.parametrize("line,text", [
    (b"REQ\n", b"E_INVALID REQ insufficient number of params"),
    (b"REQ " + ID.encode() + b"\n", b"E_INVALID REQ insufficient number of params"),
    (b"REQ abc 0\n", b"E_INVALID invalid message ID"),
    (b"REQ abc x\n", b"E_INVALID invalid message ID"),
    (b"REQ " + ID.encode() + b" x\n", b"E_INVALID REQ could not parse timeout x"),
    (b"REQ " + ID.encode() + b" -1\n", b"E_INVALID REQ could not parse timeout -1"),
])
def test_req_parameter_errors_are_fatal(line, text):
    """REQ's parameter errors are fatal E_INVALID; the ID is checked before the timeout."""
    h = Harness()
    w = subscribed(h)
    assert w.send(line) is False
    assert w.error() == text


def test_req_before_sub_is_fatal():
    """REQ needs the subscribed or closing state."""
    h = Harness()
    w = h.connect()
    assert w.send(cmd("REQ", ID, 0)) is False
    assert w.error() == b"E_INVALID cannot REQ in current state"


def test_req_failures_are_non_fatal():
    """REQ of an unknown ID or of another client's message fails without closing."""
    h = Harness()
    a = subscribed(h, rdy=1)
    b = subscribed(h, rdy=0)
    h.publish("t", b"x")
    mid = a.messages()[0].id.decode()
    b.send(cmd("REQ", mid, 0) + cmd("REQ", ID, 0))
    assert b.frames() == [
        (FRAME_ERROR, f"E_REQ_FAILED REQ {mid} failed client does not own message".encode()),
        (FRAME_ERROR, f"E_REQ_FAILED REQ {ID} failed ID not in flight".encode()),
    ]
    assert b.alive and a.client.in_flight == 1


# --- TOUCH --------------------------------------------------------------------------------


@pytest.mark.parametrize("line,text", [
    (b"TOUCH\n", b"E_INVALID TOUCH insufficient number of params"),
    (b"TOUCH abc\n", b"E_INVALID invalid message ID"),
])
def test_touch_parameter_errors_are_fatal(line, text):
    """TOUCH's parameter errors are fatal E_INVALID."""
    h = Harness()
    w = subscribed(h)
    assert w.send(line) is False
    assert w.error() == text


def test_touch_before_sub_is_fatal():
    """TOUCH needs the subscribed or closing state."""
    h = Harness()
    w = h.connect()
    assert w.send(cmd("TOUCH", ID)) is False
    assert w.error() == b"E_INVALID cannot TOUCH in current state"


def test_touch_failures_are_non_fatal():
    """TOUCH of an unknown ID or of another client's message fails without closing."""
    h = Harness()
    a = subscribed(h, rdy=1)
    b = subscribed(h, rdy=0)
    h.publish("t", b"x")
    mid = a.messages()[0].id.decode()
    b.send(cmd("TOUCH", mid) + cmd("TOUCH", ID))
    assert b.frames() == [
        (FRAME_ERROR, f"E_TOUCH_FAILED TOUCH {mid} failed client does not own message".encode()),
        (FRAME_ERROR, f"E_TOUCH_FAILED TOUCH {ID} failed ID not in flight".encode()),
    ]
    assert b.alive


# --- CLS and NOP --------------------------------------------------------------------------


def test_cls_answers_close_wait_and_stops_delivery():
    """CLS answers CLOSE_WAIT, sets RDY 0 and the closing state, keeps the socket, and FIN still works."""
    h = Harness()
    w = subscribed(h, rdy=5)
    h.publish("t", b"a")
    mid = w.messages()[0].id.decode()
    w.send(cmd("CLS"))
    assert w.frames() == [(FRAME_RESPONSE, b"CLOSE_WAIT")]
    assert w.alive and not w.server_closed
    assert w.client.state == STATE_CLOSING and w.client.rdy == 0
    h.publish("t", b"b")
    w.nothing()
    w.send(cmd("FIN", mid))
    w.nothing()
    assert w.client.finish_count == 1
    assert h.channel("t", "c").depth() == 1


def test_cls_errors():
    """CLS before SUB, and a second CLS, are fatal E_INVALID."""
    h = Harness()
    w = h.connect()
    assert w.send(cmd("CLS")) is False
    assert w.error() == b"E_INVALID cannot CLS in current state"
    w = subscribed(h)
    w.send(cmd("CLS"))
    assert w.responses() == [b"CLOSE_WAIT"]
    assert w.send(cmd("CLS")) is False
    assert w.error() == b"E_INVALID cannot CLS in current state"


def test_req_and_touch_allowed_after_cls():
    """FIN, REQ and TOUCH are accepted in the closing state."""
    h = Harness()
    w = subscribed(h, rdy=3)
    h.publish("t", b"a", b"b")
    a, b = (m.id.decode() for m in w.messages())
    w.send(cmd("CLS") + cmd("TOUCH", a) + cmd("REQ", a, 0) + cmd("FIN", b))
    assert w.frames() == [(FRAME_RESPONSE, b"CLOSE_WAIT")]
    assert w.client.requeue_count == 1 and w.client.finish_count == 1 and w.client.in_flight == 0


def test_nop_has_no_answer_in_any_state():
    """NOP never answers, before or after SUB."""
    h = Harness()
    w = h.connect()
    w.send(cmd("NOP") + cmd("NOP"))
    w.nothing()
    w.send(cmd("SUB", "t", "c"))
    w.ok()
    w.send(cmd("NOP"))
    w.nothing()
    assert w.alive


# --- large bodies in small reads ----------------------------------------------------------


@pytest.mark.parametrize("n,piece", [(1024 * 1024, 1000), (60000, 7), (70000, 65536)])
def test_large_pub_in_small_reads(n, piece):
    """A large PUB body arriving in many small reads is reassembled intact."""
    h = Harness()
    cons = subscribed(h, rdy=1)
    body = bytes(range(256)) * (n // 256) + b"z" * (n % 256)
    w = h.connect()
    assert w.send_in_pieces(pub("t", body) + cmd("NOP"), piece)
    w.ok()
    msgs = cons.messages()
    assert len(msgs) == 1 and msgs[0].body == body


def test_large_mpub_in_small_reads():
    """A multi-megabyte MPUB in 777-byte reads arrives complete and in order."""
    h = Harness()
    cons = subscribed(h, rdy=2500)
    bodies = [(b"%05d" % i) * 2000 for i in range(300)]
    w = h.connect()
    assert w.send_in_pieces(mpub("t", bodies) + pub("t", b"after"), 777)
    assert w.responses() == [b"OK", b"OK"]
    assert [m.body for m in cons.messages()] == bodies + [b"after"]


def test_commands_pipelined_in_one_read():
    """Many commands in one read are all answered in order, in one write."""
    h = Harness()
    w = h.connect()
    w.send(b"".join(pub("t", b"%d" % i) for i in range(100)))
    assert w.responses() == [b"OK"] * 100
    assert h.topic("t").message_count == 100


def test_unknown_command_between_bodies():
    """A body is never mistaken for a command: binary bodies containing newlines are fine."""
    h = Harness()
    w = h.connect()
    body = b"line1\nFOO\nline3\n"
    w.send(pub("t", body) + mpub("t", [b"\n", b"SUB x y\n"]))
    assert w.responses() == [b"OK", b"OK"]
    assert h.topic("t").message_count == 3


def test_size_prefix_split_across_reads():
    """A 4-byte size prefix cut in two still parses."""
    h = Harness()
    w = h.connect()
    data = pub("t", b"hello")
    w.send(data[:7])
    w.send(data[7:9])
    w.nothing()
    w.send(data[9:])
    w.ok()
