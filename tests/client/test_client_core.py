"""The sans-IO connection core: IDENTIFY, feature negotiation, codecs and frame splitting."""

from __future__ import annotations

import json
import struct
import zlib

import pytest

from client_support import error, identify_answer, message_frame, msg_id, response
from nsqtw.client.config import Config
from nsqtw.client.core import (
    EV_FAILED, EV_READY, EV_START_TLS, EV_WRITE, ClientCore, DeflateCodec, SnappyCodec,
)
from nsqtw.client.errors import AuthRequired, IdentifyError, ProtocolError
from nsqtw.errors import AuthFailed, BadBody
from nsqtw.protocol.frames import FRAME_MESSAGE, FRAME_RESPONSE


def kinds(events):
    return [k for k, _ in events]


def test_start_is_magic_then_identify_json():
    """The first bytes are '  V2' and IDENTIFY with go-nsq's JSON body."""
    core = ClientCore(Config(client_id="me"))
    data = core.start()
    assert data.startswith(b"  V2IDENTIFY\n")
    size = struct.unpack(">i", data[13:17])[0]
    body = json.loads(data[17:17 + size])
    assert body["client_id"] == "me" and body["feature_negotiation"] is True
    assert len(data) == 17 + size


def test_identify_answer_keeps_max_rdy_count_and_msg_timeout():
    """The JSON answer's max_rdy_count and msg_timeout are kept; frames after it are passed on."""
    core = ClientCore(Config())
    events = core.receive(identify_answer(max_rdy_count=77, msg_timeout=5000) + response(b"OK"))
    assert kinds(events) == [EV_READY, FRAME_RESPONSE]
    assert core.max_rdy_count == 77 and core.msg_timeout == 5.0 and core.ready
    assert events[1][1] == b"OK"


def test_identify_answer_split_across_reads():
    """A frame cut anywhere is reassembled."""
    core = ClientCore(Config())
    data = identify_answer() + message_frame(msg_id(1), b"x")
    events = []
    for i in range(len(data)):
        events += core.receive(data[i:i + 1])
    assert kinds(events) == [EV_READY, FRAME_MESSAGE]


def test_old_nsqd_ok_answer_means_no_negotiation():
    """A plain OK (no feature negotiation) is accepted; max_rdy_count stays 2500."""
    core = ClientCore(Config())
    assert kinds(core.receive(response(b"OK"))) == [EV_READY]
    assert core.identify_response is None and core.max_rdy_count == 2500


def test_identify_error_frame_fails_with_the_typed_cause():
    """An error frame answering IDENTIFY is IdentifyError, caused by the typed NSQ error."""
    core = ClientCore(Config())
    (kind, err), = core.receive(error(b"E_BAD_BODY IDENTIFY heartbeat interval (5) is invalid"))
    assert kind == EV_FAILED and isinstance(err, IdentifyError)
    assert isinstance(err.__cause__, BadBody) and "heartbeat interval" in str(err)


def test_http_server_on_the_tcp_port_is_recognised():
    """'HTTP/1.1 400' read as a frame size gives go-nsq's message."""
    core = ClientCore(Config())
    (kind, err), = core.receive(b"HTTP/1.1 400 Bad Request\r\n\r\n")
    assert kind == EV_FAILED and "a nsqd TCP endpoint is required" in str(err)


def test_tls_step_comes_first_then_ok():
    """tls_v1 in the answer: START_TLS, then an OK (read over TLS) makes the connection ready."""
    core = ClientCore(Config(tls_v1=True))
    assert kinds(core.receive(identify_answer(tls_v1=True))) == [EV_START_TLS]
    assert not core.ready
    assert kinds(core.receive(response(b"OK"))) == [EV_READY]


def test_tls_upgrade_answered_by_an_error_fails():
    """Anything but OK after the upgrade is 'invalid response from TLS upgrade'."""
    core = ClientCore(Config(tls_v1=True))
    core.receive(identify_answer(tls_v1=True))
    (kind, err), = core.receive(response(b"NOPE"))
    assert kind == EV_FAILED and "invalid response from TLS upgrade" in str(err)


def _deflate_server():
    return zlib.compressobj(6, zlib.DEFLATED, -15), zlib.decompressobj(-15)


def test_deflate_negotiation_with_the_compressed_ok_in_the_same_read():
    """Bytes after the JSON answer are already raw DEFLATE; writes are compressed afterwards."""
    core = ClientCore(Config(deflate=True))
    comp, decomp = _deflate_server()
    ok = comp.compress(response(b"OK")) + comp.flush(zlib.Z_SYNC_FLUSH)
    events = core.receive(identify_answer(deflate=True) + ok)
    assert kinds(events) == [EV_READY] and core.compression == "deflate"
    more = comp.compress(message_frame(msg_id(2), b"hello")) + comp.flush(zlib.Z_SYNC_FLUSH)
    (kind, data), = core.receive(more[:5]) + core.receive(more[5:])
    assert kind == FRAME_MESSAGE and data.endswith(b"hello")
    assert decomp.decompress(core.encode(b"NOP\n")) == b"NOP\n"


def test_snappy_negotiation_and_framing():
    """Snappy framing both ways (stream identifier, compressed chunks), split reads included."""
    core = ClientCore(Config(snappy=True))
    server = SnappyCodec()
    ok = server.encode(response(b"OK"))
    assert ok.startswith(b"\xff\x06\x00\x00sNaPpY")
    assert kinds(core.receive(identify_answer(snappy=True) + ok[:7])) == []
    assert kinds(core.receive(ok[7:])) == [EV_READY]
    big = message_frame(msg_id(3), b"z" * 100000)
    wire = server.encode(big)
    events = []
    for i in range(0, len(wire), 999):
        events += core.receive(wire[i:i + 999])
    assert kinds(events) == [FRAME_MESSAGE] and events[0][1].endswith(b"z" * 100000)
    reader = SnappyCodec()
    assert reader.decode(core.encode(b"RDY 1\n")) + reader.decode(core.encode(b"NOP\n")) == b"RDY 1\nNOP\n"


def test_deflate_codec_round_trip():
    """Each write is complete after its sync flush."""
    a, b = DeflateCodec(1), DeflateCodec(9)
    for chunk in (b"x", b"y" * 5000, b"FIN 0123456789abcdef\n"):
        assert b.decode(a.encode(chunk)) == chunk


def test_auth_is_sent_when_required_and_its_answer_completes_the_handshake():
    """auth_required: AUTH <secret> is written; the JSON answer is kept."""
    core = ClientCore(Config(auth_secret="s3cret"))
    (kind, data), = core.receive(identify_answer(auth_required=True))
    assert kind == EV_WRITE and data == b"AUTH\n\x00\x00\x00\x06s3cret"
    events = core.receive(response(b'{"identity":"me","identity_url":"","permission_count":2}'))
    assert kinds(events) == [EV_READY] and core.auth_response["permission_count"] == 2


def test_auth_required_without_a_secret_fails():
    """No auth_secret when nsqd requires AUTH: 'Auth Required'."""
    core = ClientCore(Config())
    (kind, err), = core.receive(identify_answer(auth_required=True))
    assert kind == EV_FAILED and isinstance(err, AuthRequired)


def test_auth_refused_is_the_typed_error():
    """An AUTH error frame fails the handshake with nsqd's typed error."""
    core = ClientCore(Config(auth_secret="x"))
    core.receive(identify_answer(auth_required=True))
    (kind, err), = core.receive(error(b"E_AUTH_FAILED AUTH failed"))
    assert kind == EV_FAILED and isinstance(err, AuthFailed) and err.code == b"E_AUTH_FAILED"


def test_heartbeat_during_handshake_is_passed_on():
    """A heartbeat before the handshake ends is handed to the glue (which answers NOP)."""
    core = ClientCore(Config(auth_secret="x"))
    core.receive(identify_answer(auth_required=True))
    assert core.receive(response(b"_heartbeat_")) == [(FRAME_RESPONSE, b"_heartbeat_")]


def test_frames_over_max_msg_size_fail():
    """max_msg_size caps incoming frames."""
    core = ClientCore(Config(max_msg_size=1000))
    assert kinds(core.receive(identify_answer())) == [EV_READY]
    (kind, err), = core.receive(message_frame(msg_id(1), b"x" * 2000))
    assert kind == EV_FAILED and isinstance(err, ProtocolError)


def test_corrupt_snappy_input_fails_cleanly():
    """An unknown unskippable chunk type is a protocol error, not a crash."""
    core = ClientCore(Config(snappy=True))
    server = SnappyCodec()
    core.receive(identify_answer(snappy=True) + server.encode(response(b"OK")))
    (kind, err), = core.receive(b"\x05\x01\x00\x00x")
    assert kind == EV_FAILED and "snappy" in str(err)


@pytest.mark.parametrize("answer", [b"{not json", b'{"unterminated": 1'])
def test_bad_identify_json_fails(answer):
    """An answer that starts like JSON but does not parse fails the handshake (go-nsq ErrIdentify)."""
    core = ClientCore(Config())
    (kind, err), = core.receive(response(answer))
    assert kind == EV_FAILED and isinstance(err, IdentifyError)
