"""IDENTIFY as nsqd 1.3.0 answers it: fields, bounds, error texts, the JSON answer (protocol_v2.go IDENTIFY,
client_v2.go Identify/Set*)."""

from __future__ import annotations

import json

import pytest

from nsqtw.nsqd.core.client import STATE_INIT
from nsqtw.nsqd.core.v2 import Features
from nsqtw.protocol.frames import FRAME_RESPONSE

from nsqd_harness import Harness, body_cmd, cmd, identify, stats_of

#: nsqd 1.3.0's answer struct, in Go's field order (protocol_v2.go, IDENTIFY)
GO_ANSWER_KEYS = [
    "max_rdy_count", "version", "max_msg_timeout", "msg_timeout", "tls_v1", "deflate", "deflate_level",
    "max_deflate_level", "snappy", "sample_rate", "auth_required", "output_buffer_size", "output_buffer_timeout",
]


def negotiate(h: Harness, **fields):
    w = h.connect()
    w.send(identify(feature_negotiation=True, **fields))
    ftype, data = w.one()
    assert ftype == FRAME_RESPONSE, data
    return w, data


def test_identify_without_negotiation_answers_ok():
    """Without feature_negotiation nsqd answers OK and upgrades nothing, even if TLS/snappy/deflate were asked."""
    h = Harness(features=Features(tls=True, snappy=True, deflate=True))
    w = h.connect()
    w.send(identify(tls_v1=True, snappy=True, deflate=True, client_id="x"))
    w.ok()
    assert w.session.upgrade is None and w.alive
    assert w.client.state == STATE_INIT


def test_identify_answer_is_go_json_with_13_fields_in_order():
    """The negotiated answer is compact JSON with nsqd 1.3.0's 13 fields in Go's struct order and default values."""
    h = Harness()
    _, data = negotiate(h)
    expected = (b'{"max_rdy_count":2500,"version":"1.3.0","max_msg_timeout":900000,"msg_timeout":60000,'
                b'"tls_v1":false,"deflate":false,"deflate_level":6,"max_deflate_level":6,"snappy":false,'
                b'"sample_rate":0,"auth_required":false,"output_buffer_size":16384,"output_buffer_timeout":250}')
    assert data == expected
    assert list(json.loads(data)) == GO_ANSWER_KEYS


def test_identify_answer_reflects_options():
    """max_rdy_count, max_msg_timeout, msg_timeout, max_deflate_level and the buffer timeout come from the options."""
    h = Harness(max_rdy_count=100, max_msg_timeout=120.0, msg_timeout=30.0, max_deflate_level=4,
                output_buffer_timeout=0.1)
    _, data = negotiate(h)
    ans = json.loads(data)
    assert ans["max_rdy_count"] == 100
    assert ans["max_msg_timeout"] == 120000
    assert ans["msg_timeout"] == 30000
    assert ans["max_deflate_level"] == 4
    assert ans["deflate_level"] == 4  # min(6, max) even though deflate was not negotiated
    assert ans["output_buffer_timeout"] == 100


def test_identify_every_field_applied():
    """Every identifyDataV2 field in one body is applied and echoed where nsqd echoes it; unknown keys are ignored."""
    h = Harness()
    w, data = negotiate(h, client_id="worker-1", hostname="worker-1.example", user_agent="example-client/1.0",
                        heartbeat_interval=5000, output_buffer_size=1024, output_buffer_timeout=100,
                        tls_v1=False, snappy=False, deflate=False, deflate_level=3, sample_rate=42,
                        msg_timeout=5000, short_id="old", long_id="old.example")
    ans = json.loads(data)
    assert ans["msg_timeout"] == 5000
    assert ans["sample_rate"] == 42
    assert ans["output_buffer_size"] == 1024
    assert ans["output_buffer_timeout"] == 100
    assert ans["deflate"] is False and ans["deflate_level"] == 6
    c = w.client
    assert (c.client_id, c.hostname, c.user_agent) == ("worker-1", "worker-1.example", "example-client/1.0")
    assert c.heartbeat_interval == 5.0 and c.msg_timeout == 5.0 and c.sample_rate == 42
    w.send(cmd("SUB", "t", "c"))
    w.ok()
    client = stats_of(h)["topics"][0]["channels"][0]["clients"][0]
    assert client["client_id"] == "worker-1"
    assert client["hostname"] == "worker-1.example"
    assert client["user_agent"] == "example-client/1.0"
    assert client["sample_rate"] == 42


def test_identify_defaults_before_and_after():
    """Before IDENTIFY client_id/hostname are the remote IP; IDENTIFY without them overwrites both with ""."""
    h = Harness()
    w = h.connect(remote="10.1.2.3:5555")
    assert (w.client.client_id, w.client.hostname) == ("10.1.2.3", "10.1.2.3")
    w.send(identify(user_agent="ua"))
    w.ok()
    assert (w.client.client_id, w.client.hostname, w.client.user_agent) == ("", "", "ua")


def test_identify_minus_one_values():
    """output_buffer_size -1 means size 1 and timeout 0; output_buffer_timeout -1 means 0."""
    h = Harness()
    _, data = negotiate(h, output_buffer_size=-1, output_buffer_timeout=500)
    ans = json.loads(data)
    assert ans["output_buffer_size"] == 1 and ans["output_buffer_timeout"] == 0
    _, data = negotiate(h, output_buffer_timeout=-1)
    assert json.loads(data)["output_buffer_timeout"] == 0


def test_identify_zero_means_default():
    """0 for any numeric field keeps the server default."""
    h = Harness()
    w, data = negotiate(h, heartbeat_interval=0, output_buffer_size=0, output_buffer_timeout=0,
                        msg_timeout=0, sample_rate=0)
    ans = json.loads(data)
    assert (ans["msg_timeout"], ans["output_buffer_size"], ans["output_buffer_timeout"]) == (60000, 16384, 250)
    assert w.client.heartbeat_interval == 30.0


@pytest.mark.parametrize("field,value,text", [
    ("heartbeat_interval", 999, "IDENTIFY heartbeat interval (999) is invalid"),
    ("heartbeat_interval", 60001, "IDENTIFY heartbeat interval (60001) is invalid"),
    ("heartbeat_interval", -2, "IDENTIFY heartbeat interval (-2) is invalid"),
    ("output_buffer_timeout", 24, "IDENTIFY output buffer timeout (24) is invalid"),
    ("output_buffer_timeout", 30001, "IDENTIFY output buffer timeout (30001) is invalid"),
    ("output_buffer_timeout", -2, "IDENTIFY output buffer timeout (-2) is invalid"),
    ("output_buffer_size", 63, "IDENTIFY output buffer size (63) is invalid"),
    ("output_buffer_size", 65537, "IDENTIFY output buffer size (65537) is invalid"),
    ("output_buffer_size", -2, "IDENTIFY output buffer size (-2) is invalid"),
    ("sample_rate", -1, "IDENTIFY sample rate (-1) is invalid"),
    ("sample_rate", 100, "IDENTIFY sample rate (100) is invalid"),
    ("msg_timeout", 999, "IDENTIFY msg timeout (999) is invalid"),
    ("msg_timeout", 900001, "IDENTIFY msg timeout (900001) is invalid"),
    ("msg_timeout", -1, "IDENTIFY msg timeout (-1) is invalid"),
])
def test_identify_out_of_bounds_is_fatal_bad_body(field, value, text):
    """Each field outside its bounds is a fatal E_BAD_BODY with nsqd's text."""
    h = Harness()
    w = h.connect()
    assert w.send(identify(**{field: value}) + cmd("NOP")) is False
    assert w.error() == b"E_BAD_BODY " + text.encode()
    assert not w.alive


@pytest.mark.parametrize("field,value", [
    ("heartbeat_interval", 1000), ("heartbeat_interval", 60000),
    ("output_buffer_timeout", 25), ("output_buffer_timeout", 30000),
    ("output_buffer_size", 64), ("output_buffer_size", 65536),
    ("sample_rate", 99), ("msg_timeout", 1000), ("msg_timeout", 900000),
])
def test_identify_bounds_are_inclusive(field, value):
    """The bounds themselves are accepted."""
    h = Harness()
    w = h.connect()
    w.send(identify(**{field: value}))
    w.ok()


def test_identify_bounds_follow_options():
    """The bounds come from --max-heartbeat-interval, --max-output-buffer-size, --min/max-output-buffer-timeout
    and --max-msg-timeout."""
    h = Harness(max_heartbeat_interval=10.0, max_output_buffer_size=128, min_output_buffer_timeout=0.05,
                max_output_buffer_timeout=1.0, max_msg_timeout=10.0, msg_timeout=5.0)
    for field, bad in (("heartbeat_interval", 10001), ("output_buffer_size", 129),
                       ("output_buffer_timeout", 49), ("output_buffer_timeout", 1001), ("msg_timeout", 10001)):
        w = h.connect()
        assert w.send(identify(**{field: bad})) is False, field
        assert w.error().startswith(b"E_BAD_BODY IDENTIFY ")


def test_identify_checks_fields_in_go_order():
    """With several bad fields the first checked (heartbeat, buffer timeout, buffer size, sample rate,
    msg timeout) is reported."""
    h = Harness()
    w = h.connect()
    w.send(identify(msg_timeout=1, sample_rate=500, output_buffer_size=1, output_buffer_timeout=1,
                    heartbeat_interval=1))
    assert w.error() == b"E_BAD_BODY IDENTIFY heartbeat interval (1) is invalid"
    w = h.connect()
    w.send(identify(msg_timeout=1, sample_rate=500, output_buffer_size=1, output_buffer_timeout=1))
    assert w.error() == b"E_BAD_BODY IDENTIFY output buffer timeout (1) is invalid"
    w = h.connect()
    w.send(identify(msg_timeout=1, sample_rate=500, output_buffer_size=1))
    assert w.error() == b"E_BAD_BODY IDENTIFY output buffer size (1) is invalid"
    w = h.connect()
    w.send(identify(msg_timeout=1, sample_rate=500))
    assert w.error() == b"E_BAD_BODY IDENTIFY sample rate (500) is invalid"


@pytest.mark.parametrize("body", [
    b"{not json", b'{"heartbeat_interval": "5000"}', b'{"heartbeat_interval": 1.5}',
    b'{"feature_negotiation": "yes"}', b'{"client_id": 5}', b"[1,2]", b'"text"',
])
def test_identify_undecodable_json(body):
    """Invalid JSON or a value of the wrong type is E_BAD_BODY IDENTIFY failed to decode JSON body (fatal)."""
    h = Harness()
    w = h.connect()
    assert w.send(body_cmd("IDENTIFY", body=body)) is False
    assert w.error() == b"E_BAD_BODY IDENTIFY failed to decode JSON body"


def test_identify_keys_match_case_insensitively_and_null_is_ignored():
    """Go's decoder matches keys case-insensitively and leaves a field alone for null."""
    h = Harness()
    w = h.connect()
    w.send(body_cmd("IDENTIFY", body=b'{"Client_ID":"abc","MSG_TIMEOUT":2000,"hostname":null}'))
    w.ok()
    assert w.client.client_id == "abc" and w.client.msg_timeout == 2.0
    assert w.client.hostname == ""


@pytest.mark.parametrize("n,text", [
    (0, b"E_BAD_BODY IDENTIFY invalid body size 0"),
    (-1, b"E_BAD_BODY IDENTIFY invalid body size -1"),
    (5 * 1024 * 1024 + 1, b"E_BAD_BODY IDENTIFY body too big 5242881 > 5242880"),
])
def test_identify_body_size_bounds(n, text):
    """The body size must be 1..--max-body-size; nsqd does not wait for the body before refusing."""
    h = Harness()
    w = h.connect()
    import struct
    assert w.send(cmd("IDENTIFY") + struct.pack(">i", n)) is False
    assert w.error() == text


def test_identify_after_sub_is_fatal():
    """IDENTIFY is only allowed in the init state."""
    h = Harness()
    w = h.connect()
    w.send(cmd("SUB", "t", "c"))
    w.ok()
    assert w.send(identify(client_id="late")) is False
    assert w.error() == b"E_INVALID cannot IDENTIFY in current state"


def test_second_identify_before_sub_is_accepted():
    """A second IDENTIFY before SUB is not refused."""
    h = Harness()
    w = h.connect()
    w.send(identify(client_id="one"))
    w.ok()
    w.send(identify(client_id="two"))
    w.ok()
    assert w.client.client_id == "two"


def test_heartbeats_disabled_forbid_sub():
    """heartbeat_interval -1 disables heartbeats, and then SUB is refused (fatal)."""
    h = Harness()
    w = h.connect()
    w.send(identify(heartbeat_interval=-1))
    w.ok()
    assert w.client.heartbeat_interval == 0
    assert w.send(cmd("SUB", "t", "c")) is False
    assert w.error() == b"E_INVALID cannot SUB with heartbeats disabled"


def test_deflate_level_negotiation():
    """deflate_level is the client's when deflate is negotiated, capped by --max-deflate-level."""
    h = Harness(features=Features(deflate=True, snappy=True), max_deflate_level=6)
    w, data = negotiate(h, deflate=True, deflate_level=9)
    ans = json.loads(data)
    assert ans["deflate"] is True and ans["deflate_level"] == 6
    assert w.session.upgrade is not None and w.session.upgrade.deflate and w.session.upgrade.deflate_level == 6
    w, data = negotiate(h, deflate=True, deflate_level=3)
    assert json.loads(data)["deflate_level"] == 3
    w, data = negotiate(h, deflate=True)
    assert json.loads(data)["deflate_level"] == 6


def test_snappy_negotiation_and_server_switches():
    """snappy/deflate are negotiated only when the server allows them (--snappy/--deflate)."""
    h = Harness(features=Features(deflate=True, snappy=True))
    w, data = negotiate(h, snappy=True)
    assert json.loads(data)["snappy"] is True
    assert w.session.upgrade is not None and w.session.upgrade.snappy
    h = Harness(features=Features(deflate=True, snappy=True), snappy=False, deflate=False)
    w, data = negotiate(h, snappy=True, deflate=True)
    ans = json.loads(data)
    assert ans["snappy"] is False and ans["deflate"] is False
    assert w.session.upgrade is None


def test_tls_not_offered_without_certificate():
    """tls_v1 is false in the answer when the server has no TLS, and nothing is upgraded."""
    h = Harness()
    w, data = negotiate(h, tls_v1=True)
    assert json.loads(data)["tls_v1"] is False
    assert w.session.upgrade is None


def test_snappy_and_deflate_together_fail():
    """Asking for both compressions when both are available is a fatal E_IDENTIFY_FAILED."""
    h = Harness(features=Features(deflate=True, snappy=True))
    w = h.connect()
    assert w.send(identify(feature_negotiation=True, snappy=True, deflate=True)) is False
    assert w.error() == b"E_IDENTIFY_FAILED cannot enable both deflate and snappy compression"


def test_identify_text_fields_are_kept_to_256_bytes():
    """A 1 MB user_agent is accepted but nsqtw keeps (and /stats shows) its first 256 bytes; a cut
    never splits a UTF-8 character; short values are kept whole."""
    h = Harness()
    w = h.connect()
    w.send(identify(user_agent="u" * (1 << 20), hostname="é" * 200, client_id="c" * 256))
    w.ok()
    c = w.client
    assert c.user_agent == "u" * 256
    assert c.hostname == "é" * 128 and len(c.hostname.encode()) == 256
    assert c.client_id == "c" * 256
    w.send(cmd("SUB", "t", "c"))
    w.ok()
    client = stats_of(h)["topics"][0]["channels"][0]["clients"][0]
    assert client["user_agent"] == "u" * 256
    w2 = h.connect()
    w2.send(identify(hostname="h" + "€" * 85))  # 1 + 255 bytes: kept whole
    w2.ok()
    assert w2.client.hostname == "h" + "€" * 85
    w3 = h.connect()
    w3.send(identify(user_agent="x" + "€" * 86))  # 259 bytes: the last character goes whole
    w3.ok()
    assert w3.client.user_agent == "x" + "€" * 85
