"""
Property-based tests of every decoder that reads bytes a peer controls.

The central property is on :meth:`V2Session.feed`: for any command stream
(valid commands, every kind of bad one, FIN runs, MPUB bodies, garbage) and
any way of cutting it into reads, ``feed`` returns a bool and never raises,
the broker writes only well-formed frames, every fatal error frame is the
last thing before the close, and the frames written and the broker's state
afterwards are the same as when the stream arrives in one read.

Default runs use moderate example counts; the ``slow`` variants run the same
properties with many more examples.  Each weakness these properties found has
its own targeted test below too (F1 deep JSON, F2 lone surrogates, F3 lookupd
limits, F4/F5 codec bombs, F6 negative diskqueue positions, F14 huge
numbers); since they were fixed, the generators produce those inputs as well.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import tempfile
import zlib
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from nsqtw.client.config import Config
from nsqtw.client.core import EV_FAILED, ClientCore
from nsqtw.errors import NSQError, from_wire
from nsqtw.runtime.responses import parse_query
from nsqtw.lookupd.core.registry import RegistrationDB
from nsqtw.lookupd.core.v1 import LookupSession, ResponseDecoder
from nsqtw.nsqd.core.auth import Authorization, AuthState
from nsqtw.nsqd.core.v2 import MAX_LINE
from nsqtw.protocol.compression import CodecError, DeflateCodec, SnappyCodec
from nsqtw.protocol.frames import MAGIC_V1, MAGIC_V2, FrameDecoder, FrameTooBig, encode_frame
from nsqtw.protocol.identify import IdentifyDecodeError, IdentifyRequest, parse_identify
from nsqtw.nsqd.stats.snapshot import go_json

from hardening_support import (
    FATAL_CODES, T0, SansIOConn, body_cmd, cmd, errors_of, i32, small_options, wellformed,
)

QUIET = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
         HealthCheck.large_base_example]


def fast_and_slow(fast: int, slow: int, **given_kwargs: Any):
    """The same property twice: ``fast`` examples by default, ``slow`` under ``-m slow``."""

    def deco(fn):
        quick = settings(max_examples=fast, deadline=None, database=None,
                         suppress_health_check=QUIET)(given(**given_kwargs)(fn))
        thorough = pytest.mark.slow(settings(max_examples=slow, deadline=None, database=None,
                                             suppress_health_check=QUIET)(given(**given_kwargs)(fn)))
        return quick, thorough

    return deco


# ==========================================================================================
# V2Session.feed
# ==========================================================================================

TOPICS = st.sampled_from([b"t", b"t", b"t2", b"e#ephemeral", b"bad topic", b"x" * 65, b"\xff\xfe", b"",
                          b"a.b_c-d", b"t\r"])
CHANNELS = st.sampled_from([b"c", b"c", b"c2", b"c#ephemeral", b"!", b"", b"\xc3\x28"])
NUMBERS = st.one_of(st.integers(-3, 70).map(lambda n: str(n).encode()),
                    st.sampled_from([b"", b"abc", b"+5", b"-0", b"99999999999999999999", b"1.5", b"0x10",
                                     b"9" * 5000]))  # past Python's 4300-digit int() limit (F14)
BODIES = st.binary(max_size=80)


_SETUP_IDS: list[bytes] = []

MESSAGE_IDS = st.one_of(
    st.integers(0, 5).map(lambda i: ("pool", i)),
    st.binary(min_size=16, max_size=16).map(lambda b: ("raw", b)),
    st.binary(max_size=20).map(lambda b: ("raw", b)),
)


def _sized(name: bytes, params: list[bytes], body: bytes, mutation: str) -> bytes:
    """A body command whose size field is right or mutated (the bytes after it then misparse)."""
    n = len(body)
    size = {"ok": n, "neg": -1 - n, "zero": 0, "big": 70, "bigger": 600, "huge": 2 ** 31 - 1,
            "short": max(n - 1, 0), "long": n + 3, "min": -2 ** 31}[mutation]
    return b" ".join([name] + params) + b"\n" + i32(size) + body


SIZE_MUTATIONS = st.sampled_from(["ok"] * 8 + ["neg", "zero", "big", "bigger", "huge", "short", "long", "min"])


@st.composite
def pub_item(draw) -> Any:
    name = draw(st.sampled_from([b"PUB", b"DPUB"]))
    params = [draw(TOPICS)]
    if name == b"DPUB":
        params.append(draw(st.one_of(NUMBERS, st.sampled_from([b"10001", b"500"]))))
    if draw(st.integers(0, 9)) == 0:
        params = params[:draw(st.integers(0, len(params)))]
    return _sized(name, params, draw(BODIES), draw(SIZE_MUTATIONS))


@st.composite
def mpub_item(draw) -> Any:
    bodies = draw(st.lists(st.binary(min_size=0, max_size=70), min_size=0, max_size=6))
    inner = b""
    for b in bodies:
        m = draw(st.sampled_from(["ok"] * 6 + ["neg", "zero", "big", "short"]))
        size = {"ok": len(b), "neg": -7, "zero": 0, "big": 65, "short": max(len(b) - 1, 0)}[m]
        inner += i32(size) + b
    count = draw(st.sampled_from([len(bodies)] * 6 + [0, -1, len(bodies) + 1, 102, 2 ** 31 - 1]))
    payload = i32(count) + inner
    params = [draw(TOPICS)] if draw(st.integers(0, 9)) else []
    return _sized(b"MPUB", params, payload, draw(SIZE_MUTATIONS))


IDENTIFY_VALUES = st.one_of(
    st.integers(-2, 70000), st.sampled_from([-1, 0, 999, 1000, 60000, 60001, 2 ** 31, 2 ** 63, -2 ** 63 - 1]),
    st.booleans(), st.none(), st.text(max_size=10), st.floats(allow_nan=False, allow_infinity=False),
    st.lists(st.integers(), max_size=2),
)
IDENTIFY_KEYS = st.sampled_from(["client_id", "hostname", "heartbeat_interval", "output_buffer_size",
                                 "output_buffer_timeout", "feature_negotiation", "tls_v1", "deflate",
                                 "deflate_level", "snappy", "sample_rate", "user_agent", "msg_timeout",
                                 "HEARTBEAT_INTERVAL", "Client_Id", "unknown", "short_id"])


@st.composite
def identify_item(draw) -> Any:
    kind = draw(st.integers(0, 5))
    if kind == 0:
        body = draw(st.binary(max_size=60))
    elif kind == 1:
        body = draw(st.sampled_from([b"null", b"[]", b"1", b'"x"', b"{", b"{}", b'{"a":NaN}',
                                     b'{"heartbeat_interval":1e3}', b"\xef\xbb\xbf{}", b"{}junk",
                                     b"[" * 5000, b'{"a":' * 3000,  # deeper than json's recursion (F1)
                                     b'{"client_id":"\\ud800","hostname":"\\udfff x"}']))  # lone surrogates (F2)
    else:
        fields = draw(st.dictionaries(IDENTIFY_KEYS, IDENTIFY_VALUES, max_size=6))
        body = json.dumps(fields).encode()
    return _sized(b"IDENTIFY", [], body, draw(SIZE_MUTATIONS))


@st.composite
def auth_item(draw) -> Any:
    params = draw(st.sampled_from([[], [], [b"x"]]))
    return _sized(b"AUTH", params, draw(st.binary(min_size=0, max_size=20)), draw(SIZE_MUTATIONS))


def _id_bytes(spec: tuple[str, Any]) -> bytes:
    kind, v = spec
    if kind == "pool":
        return _SETUP_IDS[v] if v < len(_SETUP_IDS) else b"%016x" % v
    return v


@st.composite
def line_item(draw) -> Any:
    kind = draw(st.integers(0, 11))
    if kind == 0:
        line = b"NOP"
    elif kind == 1:
        line = b"CLS"
    elif kind == 2:
        line = b"RDY" + (b" " + draw(NUMBERS) if draw(st.booleans()) else b"")
    elif kind == 3:
        line = b"FIN " + _id_bytes(draw(MESSAGE_IDS))
    elif kind == 4:
        line = b"REQ " + _id_bytes(draw(MESSAGE_IDS)) + (b" " + draw(NUMBERS) if draw(st.integers(0, 4)) else b"")
    elif kind == 5:
        line = b"TOUCH " + _id_bytes(draw(MESSAGE_IDS))
    elif kind == 6:
        line = b"SUB " + draw(TOPICS) + (b" " + draw(CHANNELS) if draw(st.integers(0, 5)) else b"")
    elif kind == 7:  # a run of FINs, the fast path
        ids = draw(st.lists(st.integers(0, 7), min_size=1, max_size=6))
        return b"".join(b"FIN " + _id_bytes(("pool", i)) + b"\n" for i in ids)
    elif kind == 8:
        line = draw(st.binary(max_size=30)).replace(b"\n", b"")
    elif kind == 9:
        line = draw(st.sampled_from([b"", b" ", b"nop", b"PUB", b"FIN", b"RDY 1 2", b"SUB t c extra", b"\x00"]))
    elif kind == 10:
        line = b"A" * draw(st.sampled_from([MAX_LINE - 2, MAX_LINE - 1, MAX_LINE, MAX_LINE + 5]))
        if draw(st.booleans()):
            return line  # no newline at all
    else:
        return draw(st.binary(max_size=24))  # raw bytes, newlines or not
    return line + draw(st.sampled_from([b"\n", b"\n", b"\n", b"\r\n"]))




def _allow_all() -> AuthState:
    anything = re.compile("")
    return AuthState(b"secret", "tester", "", [Authorization(anything, (anything,), ("subscribe", "publish"))],
                     T0 + 3600)


AUTH_MODES = {"off": (None, None), "allow": (object(), _allow_all()), "fail": (object(), RuntimeError("down"))}


def _setup(setup: str, auth: str) -> SansIOConn:
    authorizer, result = AUTH_MODES[auth or "off"]
    conn = SansIOConn(small_options(), authorizer=authorizer, auth_result=result)
    conn.broker.publish("t", [b"m%d" % i for i in range(8)], conn.now)
    if setup == "subscribed":
        if authorizer is not None and isinstance(result, AuthState):
            conn.feed(MAGIC_V2 + body_cmd("AUTH", body=b"secret"))
        conn.feed(MAGIC_V2 + b"SUB t c\nRDY 6\n" if authorizer is None else b"SUB t c\nRDY 6\n")
        conn.settle()
        conn.take()
    elif setup == "magic":
        conn.feed(MAGIC_V2)
    return conn


def _init_ids() -> None:
    if not _SETUP_IDS:
        conn = SansIOConn(small_options())
        conn.broker.publish("t", [b"m%d" % i for i in range(8)], conn.now)
        conn.feed(MAGIC_V2 + b"SUB t c\nRDY 6\n")
        conn.settle()
        _SETUP_IDS.extend(p[10:26] for t, p in wellformed(conn.take()) if t == 2)
        assert len(_SETUP_IDS) == 6


_init_ids()


def _run(setup: str, auth: str, pieces: list[bytes]) -> dict[str, Any]:
    conn = _setup(setup, auth)
    for piece in pieces:
        if not conn.feed(piece):
            break
    assert all(type(r) is bool for r in conn.results), conn.results
    before_settle = wellformed(conn.take())
    conn.settle()
    after_settle = wellformed(conn.take())
    stats = conn.stats()
    go_json(stats)  # /stats must still render
    return {"frames": before_settle, "delivered": after_settle, "open": conn.open, "stats": stats,
            "buffered": len(conn.session._buf) + sum(map(len, conn.session._chunks))}


def _cut(stream: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted(set(c for c in cuts if 0 < c < len(stream)))
    out, last = [], 0
    for p in points + [len(stream)]:
        out.append(stream[last:p])
        last = p
    return out


def _long_segment(stream: bytes) -> bool:
    return any(len(seg) >= MAX_LINE - 8 for seg in stream.split(b"\n"))


GOOD_TOPICS = st.sampled_from(["t", "t", "t2", "e#ephemeral", "a.b_c-d"])


@st.composite
def good_publish(draw) -> bytes:
    kind = draw(st.integers(0, 3))
    topic = draw(GOOD_TOPICS)
    if kind == 0:
        return body_cmd("PUB", topic, body=draw(st.binary(min_size=1, max_size=64)))
    if kind == 1:
        bodies = draw(st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=8))
        return body_cmd("MPUB", topic, body=i32(len(bodies)) + b"".join(i32(len(b)) + b for b in bodies))
    if kind == 2:
        return body_cmd("DPUB", topic, draw(st.integers(0, 10000)), body=draw(st.binary(min_size=1, max_size=64)))
    return cmd("NOP")


@st.composite
def good_identify(draw) -> bytes:
    fields = draw(st.fixed_dictionaries({}, optional={
        "client_id": st.text(max_size=8), "hostname": st.text(max_size=8), "user_agent": st.text(max_size=8),
        "heartbeat_interval": st.sampled_from([0, 1000, 5000, 30000]),
        "output_buffer_size": st.sampled_from([0, -1, 64, 16384]),
        "output_buffer_timeout": st.sampled_from([0, -1, 250, 1000]),
        "feature_negotiation": st.booleans(), "sample_rate": st.integers(0, 99),
        "msg_timeout": st.sampled_from([0, 1000, 60000]), "deflate_level": st.integers(0, 9),
    }))
    return body_cmd("IDENTIFY", body=json.dumps(fields).encode())


@st.composite
def good_consumer(draw) -> bytes:
    kind = draw(st.integers(0, 6))
    pool = st.integers(0, 5).map(lambda i: _SETUP_IDS[i])
    if kind == 0:
        return cmd("RDY", draw(st.integers(0, 50)))
    if kind == 1:
        return cmd("FIN", draw(pool))
    if kind == 2:
        return cmd("REQ", draw(pool), draw(st.sampled_from([0, 0, 10, 5000, 99999])))
    if kind == 3:
        return cmd("TOUCH", draw(pool))
    if kind == 4:
        return b"".join(cmd("FIN", i) for i in draw(st.lists(pool, min_size=1, max_size=6)))
    if kind == 5:
        return cmd("NOP")
    return draw(good_publish())


BAD_ITEMS = st.one_of(line_item(), line_item(), line_item(), pub_item(), mpub_item(), identify_item(), auth_item())

@st.composite
def v2_case(draw) -> Any:
    """A plausible session (identify, auth, publishes, SUB, RDY/FIN/REQ/TOUCH, CLS) with up to
    three bad items slipped in anywhere, so that streams get past their first command."""
    setup = draw(st.sampled_from(["raw", "magic", "subscribed", "subscribed"]))
    auth = draw(st.sampled_from(["off", "off", "off", "allow", "fail"]))
    if auth == "fail" and setup == "subscribed":
        setup = "magic"  # nothing can SUB when the auth server fails
    items: list[bytes] = []
    subscribed = setup == "subscribed"
    if not subscribed:
        if draw(st.booleans()):
            items.append(draw(good_identify()))
        if auth != "off" and draw(st.integers(0, 4)):
            items.append(body_cmd("AUTH", body=b"secret"))
    items.extend(draw(st.lists(good_publish(), max_size=4)))
    if not subscribed and draw(st.booleans()):
        items.append(cmd("SUB", draw(GOOD_TOPICS), draw(st.sampled_from(["c", "c2", "c#ephemeral"]))))
        subscribed = True
    if subscribed:
        items.extend(draw(st.lists(good_consumer(), max_size=10)))
        if draw(st.integers(0, 3)) == 0:
            items.append(cmd("CLS"))
            items.extend(draw(st.lists(good_consumer(), max_size=4)))
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 1, 2, 3]))):
        items.insert(draw(st.integers(0, len(items))), draw(BAD_ITEMS))
    stream = b"".join(items)
    if setup == "raw":
        magic = draw(st.sampled_from([MAGIC_V2] * 12 + [b"  V1", b"    ", b"  V", b""]))
        stream = magic + stream
    cuts = draw(st.lists(st.integers(0, len(stream)), max_size=12))
    step = draw(st.integers(1, 9))
    return setup, auth, stream, cuts, step


def check_v2_feed(case: Any) -> None:
    """V2Session.feed: any stream, any cuts -> bools, well-formed frames, same frames and state."""
    setup, auth, stream, cuts, step = case
    whole = _run(setup, auth, [stream])
    pieces = _cut(stream, cuts)
    split = _run(setup, auth, pieces)
    if len(stream) <= 1200:
        tiny = [stream[i:i + 1] for i in range(len(stream))]
    else:
        tiny = [stream[i:i + step * 97] for i in range(0, len(stream), step * 97)]
    trickle = _run(setup, auth, tiny)
    for other in (split, trickle):
        assert other["frames"] == whole["frames"]
        assert other["delivered"] == whole["delivered"]
        assert other["open"] == whole["open"]
        assert other["stats"] == whole["stats"]
    errors = errors_of(whole["frames"])
    fatal = [e for e in errors if e.split(b" ", 1)[0] in FATAL_CODES]
    event(f"setup={setup} auth={auth}")
    event("open" if whole["open"] else "closed by " + (fatal[0].split(b" ", 1)[0].decode() if fatal else "silence"))
    event(f"answers before the close: {min(len(whole['frames']), 5)}{'+' if len(whole['frames']) >= 5 else ''}")
    if fatal:
        # a fatal error closes at once: it is the last frame, and there is only one
        assert not whole["open"]
        assert len(fatal) == 1 and whole["frames"][-1] == (1, fatal[0])
    elif not whole["open"]:
        # closed without an error frame: only a line over nsqd's 16 KiB read buffer does that
        assert _long_segment(stream), stream[:200]
    # an open connection holds at most one line or one body of its limit
    assert whole["buffered"] <= MAX_LINE + 512 + 8


test_v2_feed_any_split, test_v2_feed_any_split_slow = fast_and_slow(300, 4000, case=v2_case())(check_v2_feed)


# --- big bodies: the chunked path for bodies over 64 KiB and the resumable MPUB walk ----------------


@st.composite
def big_case(draw) -> Any:
    items = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.integers(0, 3))
        if kind == 0:
            n = draw(st.integers(1, 200_000))
            items.append(_sized(b"PUB", [b"big"], b"p" * n, draw(SIZE_MUTATIONS)))
        elif kind == 1:
            sizes = draw(st.lists(st.integers(1, 70_000), min_size=1, max_size=8))
            inner = b"".join(i32(s) + bytes([65 + i % 26]) * s for i, s in enumerate(sizes))
            items.append(_sized(b"MPUB", [b"big"], i32(len(sizes)) + inner, draw(SIZE_MUTATIONS)))
        elif kind == 2:
            n = draw(st.integers(1, 90_000))
            items.append(_sized(b"DPUB", [b"big", b"0"], b"d" * n, "ok"))
        else:
            items.append(b"NOP\n")
    stream = MAGIC_V2 + b"".join(items)
    cuts = draw(st.lists(st.integers(0, len(stream)), max_size=40))
    step = draw(st.sampled_from([1, 7, 1460, 4096, 65536]))
    return stream, cuts, step


def _big_options():
    return small_options(max_msg_size=128 * 1024, max_body_size=600 * 1024, mem_queue_size=100)


def _run_big(pieces: list[bytes]) -> dict[str, Any]:
    conn = SansIOConn(_big_options())
    for piece in pieces:
        if not conn.feed(piece):
            break
        assert len(conn.session._buf) <= 600 * 1024 + MAX_LINE + 16
    frames = wellformed(conn.take())
    conn.settle()
    return {"frames": frames, "open": conn.open, "stats": conn.stats()}


def check_big_bodies(case: Any) -> None:
    """Large PUB/MPUB/DPUB bodies cut anywhere give the same answers and state as one read."""
    stream, cuts, step = case
    whole = _run_big([stream])
    assert _run_big(_cut(stream, cuts)) == whole
    if step > 1 or len(stream) < 20_000:
        assert _run_big([stream[i:i + step] for i in range(0, len(stream), step)]) == whole


test_big_bodies_any_split, test_big_bodies_any_split_slow = fast_and_slow(25, 300, case=big_case())(check_big_bodies)


def test_fin_run_matches_fin_one_by_one():
    """A FIN run (the regex fast path) answers and finishes exactly as the same FINs one per read."""
    _init_ids()
    ids = _SETUP_IDS[:4] + [b"0" * 16, _SETUP_IDS[0]]
    stream = b"".join(b"FIN " + i + b"\n" for i in ids)
    whole = _run("subscribed", "off", [stream])
    one_by_one = _run("subscribed", "off", [b"FIN " + i + b"\n" for i in ids])
    slow_path = _run("subscribed", "off", [b"FIN " + i + b"\r\n" for i in ids])  # \r: not the fast path
    assert whole == one_by_one
    assert whole["frames"] == slow_path["frames"] and whole["stats"] == slow_path["stats"]
    assert [e[:12] for e in errors_of(whole["frames"])] == [b"E_FIN_FAILED"] * 2
    channel = whole["stats"]["topics"][0]["channels"][0]
    # 4 finished, so RDY 6 lets the last 2 queued messages out at the settle
    assert len(whole["delivered"]) == 2 and channel["in_flight_count"] == 4 and channel["depth"] == 0


# --- known weaknesses of the V2 decoder (kept out of the generator above) ---------------------------


def test_identify_deeply_nested_json_is_bad_body():
    """A deeply nested IDENTIFY body is E_BAD_BODY (Go: 'exceeded max depth'), not an exception out of feed."""
    conn = SansIOConn(small_options(max_body_size=1 << 20))
    keep = conn.feed(MAGIC_V2 + body_cmd("IDENTIFY", body=b"[" * 100_000))
    assert keep is False
    assert errors_of(wellformed(conn.take())) == [b"E_BAD_BODY IDENTIFY failed to decode JSON body"]


def test_identify_lone_surrogate_does_not_break_stats():
    """IDENTIFY {"client_id": "\\ud800"}: the client is accepted and /stats still renders."""
    conn = SansIOConn(small_options())
    conn.feed(MAGIC_V2 + body_cmd("IDENTIFY", body=b'{"client_id":"\\ud800","user_agent":"\\udfff"}')
              + cmd("SUB", "t", "c"))
    assert wellformed(conn.take()) == [(0, b"OK"), (0, b"OK")]
    json.loads(go_json(conn.stats()))


# ==========================================================================================
# FrameDecoder
# ==========================================================================================

FRAMES = st.lists(st.tuples(st.integers(0, 2), st.binary(max_size=60)), max_size=12)


def check_frame_decoder(frames: Any, cuts: Any, garbage: bytes) -> None:
    """FrameDecoder: encoded frames cut anywhere decode to the same frames; garbage after them is
    either more frames, a partial frame, or FrameTooBig -- nothing else."""
    data = b"".join(encode_frame(t, p) for t, p in frames)
    dec = FrameDecoder()
    got: list[tuple[int, bytes]] = []
    for piece in _cut(data, cuts):
        got.extend(dec.feed(piece))
    assert got == list(frames) and dec.pending() == 0
    for max_size in (0, 64):
        dec = FrameDecoder(max_size)
        whole_err = None
        whole = []
        try:
            whole = dec.feed(garbage)
        except FrameTooBig as e:
            whole_err = e
        dec2 = FrameDecoder(max_size)
        pieces_out: list[tuple[int, bytes]] = []
        err = None
        for piece in _cut(garbage, cuts):
            try:
                pieces_out.extend(dec2.feed(piece))
            except FrameTooBig as e:
                err = e
                break
        assert (whole_err is None) == (err is None)
        if whole_err is None:
            assert pieces_out == whole


test_frame_decoder, test_frame_decoder_slow = fast_and_slow(
    200, 5000, frames=FRAMES, cuts=st.lists(st.integers(0, 900), max_size=10),
    garbage=st.binary(max_size=120))(check_frame_decoder)


# ==========================================================================================
# parse_identify
# ==========================================================================================

JSON_LEAVES = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70), st.text(max_size=8),
                        st.floats(allow_nan=False, allow_infinity=False))
JSON_VALUES = st.recursive(JSON_LEAVES, lambda kids: st.lists(kids, max_size=3)
                           | st.dictionaries(st.text(max_size=5), kids, max_size=3), max_leaves=8)


def check_parse_identify(raw: bytes, obj: Any, fields: dict[str, Any]) -> None:
    """parse_identify: any bytes and any JSON give an IdentifyRequest or IdentifyDecodeError only;
    every well-typed field is taken over."""
    for body in (raw, json.dumps(obj).encode(), json.dumps(fields).encode()):
        try:
            req = parse_identify(body)
        except IdentifyDecodeError:
            continue
        assert isinstance(req, IdentifyRequest)
    import attr
    known = attr.fields_dict(IdentifyRequest)
    good = {k: v for k, v in fields.items() if k in known}
    try:
        req = parse_identify(json.dumps(good).encode())
    except IdentifyDecodeError:
        return
    for k, v in good.items():
        if v is not None:
            assert getattr(req, k) == v


test_parse_identify, test_parse_identify_slow = fast_and_slow(
    200, 5000, raw=st.binary(max_size=80), obj=JSON_VALUES,
    fields=st.dictionaries(IDENTIFY_KEYS, IDENTIFY_VALUES, max_size=8))(check_parse_identify)


# ==========================================================================================
# nsqlookupd's V1 session
# ==========================================================================================


class _Server:
    tcp_port = 4160
    http_port = 4161
    broadcast_address = "lookupd"
    hostname = "lookupd-host"


PEER = {"broadcast_address": "n1", "tcp_port": 4150, "http_port": 4151, "version": "1.3.0", "hostname": "h"}


@st.composite
def v1_item(draw) -> Any:
    kind = draw(st.integers(0, 6))
    if kind == 0:
        fields = dict(PEER)
        for k in draw(st.lists(st.sampled_from(sorted(PEER)), max_size=2)):
            fields[k] = draw(st.one_of(st.none(), st.integers(-1, 70000), st.text(max_size=5)))
        body = json.dumps(fields).encode()
        size = draw(st.sampled_from([len(body)] * 4 + [-1, 0, len(body) + 2, max(len(body) - 1, 0)]))
        return b"IDENTIFY\n" + i32(size) + body
    if kind in (1, 2):
        verb = draw(st.sampled_from([b"REGISTER", b"UNREGISTER"]))
        parts = [verb] + draw(st.lists(st.sampled_from([b"t", b"t2", b"c", b"bad!", b"x" * 70, b"e#ephemeral"]),
                                       max_size=3))
        return b" ".join(parts) + draw(st.sampled_from([b"\n", b"\r\n", b" \n"]))
    if kind == 3:
        return b"PING\n"
    if kind == 4:
        return draw(st.binary(max_size=20))
    if kind == 5:
        return draw(st.binary(max_size=20)).replace(b"\n", b"") + b"\n"
    if draw(st.booleans()):
        body = draw(st.sampled_from([b"[" * 5000, b'{"hostname":"\\ud800"}']))  # F1, F2
        return b"IDENTIFY\n" + i32(len(body)) + body
    return b"IDENTIFY\n" + i32(draw(st.integers(0, 30))) + draw(st.binary(max_size=30))


def _v1_sizes(out: bytes) -> list[bytes]:
    dec = ResponseDecoder(1 << 20)
    frames = dec.feed(out)
    assert dec._buf == b"", out
    return frames


def _run_v1(pieces: list[bytes]) -> Any:
    db = RegistrationDB()
    s = LookupSession(db, "127.0.0.1:5000", _Server())
    out = b""
    keep = True
    for p in pieces:
        o, keep = s.feed(p, 100.0)
        assert type(keep) is bool
        out += o
        if not keep:
            break
    regs = sorted((r.category, r.key, r.subkey, tuple(sorted(p))) for r, p in db.items())
    return _v1_sizes(out), keep, regs


def check_lookupd_v1(items: list[bytes], magic: bytes, cuts: list[int]) -> None:
    """LookupSession.feed: any stream, any cuts -> size-prefixed answers, the same ones and the same
    registrations as in one read; an error answer is always the last."""
    stream = magic + b"".join(items)
    whole = _run_v1([stream])
    assert _run_v1(_cut(stream, cuts)) == whole
    if len(stream) < 800:
        assert _run_v1([stream[i:i + 1] for i in range(len(stream))]) == whole
    answers, keep, _ = whole
    errs = [a for a in answers if a.startswith(b"E_")]
    if errs:
        assert not keep and answers[-1] == errs[0] and len(errs) == 1


test_lookupd_v1, test_lookupd_v1_slow = fast_and_slow(
    150, 3000, items=st.lists(v1_item(), max_size=10),
    magic=st.sampled_from([MAGIC_V1] * 8 + [MAGIC_V2, b"", b" "]),
    cuts=st.lists(st.integers(0, 600), max_size=10))(check_lookupd_v1)


def test_lookupd_v1_bounds_what_it_buffers():
    """A V1 peer sending a line without end, or announcing a 1 GiB IDENTIFY, is refused early."""
    s = LookupSession(RegistrationDB(), "127.0.0.1:5000", _Server())
    keep = True
    for _ in range(64):  # 4 MiB without a newline
        _, keep = s.feed(b"R" * 65536, 1.0)
        if not keep:
            break
    assert not keep
    s2 = LookupSession(RegistrationDB(), "127.0.0.1:5001", _Server())
    out, keep2 = s2.feed(MAGIC_V1 + b"IDENTIFY\n" + i32(1 << 30), 1.0)
    assert not keep2 and _v1_sizes(out)[0].startswith(b"E_BAD_BODY")


def test_lookupd_identify_deeply_nested_json_is_bad_body():
    """A deeply nested V1 IDENTIFY body is E_BAD_BODY, not an exception out of feed."""
    s = LookupSession(RegistrationDB(), "127.0.0.1:5000", _Server())
    body = b"[" * 100_000
    out, keep = s.feed(MAGIC_V1 + b"IDENTIFY\n" + i32(len(body)) + body, 1.0)
    assert not keep and _v1_sizes(out) == [b"E_BAD_BODY IDENTIFY failed to decode JSON body"]


# ==========================================================================================
# compression codecs
# ==========================================================================================


def check_codecs_round_trip(chunks: list[bytes], cuts: list[int], level: int) -> None:
    """Deflate and snappy: what one side encodes, the other decodes, whatever the read cuts."""
    for make in (lambda: DeflateCodec(level), SnappyCodec):
        enc, dec = make(), make()
        wire = b"".join(enc.encode(c) for c in chunks)
        got = b"".join(dec.decode(p) for p in _cut(wire, cuts))
        assert got == b"".join(chunks)


test_codecs_round_trip, test_codecs_round_trip_slow = fast_and_slow(
    120, 2000, chunks=st.lists(st.binary(max_size=3000), max_size=6),
    cuts=st.lists(st.integers(0, 20000), max_size=10), level=st.integers(1, 9))(check_codecs_round_trip)


def check_codecs_garbage(prefix_chunks: list[bytes], garbage: bytes, cuts: list[int], flip: int) -> None:
    """Garbage (or a valid stream with a flipped bit) decodes to bytes or raises CodecError only."""
    for make in (DeflateCodec, SnappyCodec):
        enc = make()
        wire = b"".join(enc.encode(c) for c in prefix_chunks) + garbage
        if wire and flip >= 0:
            i = flip % len(wire)
            wire = wire[:i] + bytes([wire[i] ^ (1 << (flip % 8))]) + wire[i + 1:]
        dec = make()
        try:
            for p in _cut(wire, cuts):
                out = dec.decode(p)
                assert isinstance(out, bytes)
        except CodecError:
            pass


test_codecs_garbage, test_codecs_garbage_slow = fast_and_slow(
    200, 4000, prefix_chunks=st.lists(st.binary(max_size=200), max_size=3), garbage=st.binary(max_size=200),
    cuts=st.lists(st.integers(0, 800), max_size=6), flip=st.integers(-1, 10_000))(check_codecs_garbage)


def test_deflate_decode_output_is_bounded_per_call():
    """One decode call never returns more than a bounded expansion of its input (a deflate bomb)."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    bomb = c.compress(b"NOP\n" * (16 << 20)) + c.flush(zlib.Z_SYNC_FLUSH)  # 64 MiB -> ~65 KiB
    assert len(bomb) < 100_000
    out = DeflateCodec().decode(bomb[:65536])
    assert len(out) <= 4 << 20


def test_snappy_refuses_oversized_chunk_at_once():
    """A snappy chunk header announcing 16 MiB is a CodecError before the chunk body is buffered."""
    dec = SnappyCodec()
    with pytest.raises(CodecError):
        dec.decode(b"\xff\x06\x00\x00sNaPpY" + b"\x00\xff\xff\xff" + b"\x00" * 100)


# ==========================================================================================
# parse_query (nsqtw.runtime.responses)
# ==========================================================================================

QUERY_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)


def check_parse_query(raw: str, params: dict[str, list[str]]) -> None:
    """parse_query: any string is a dict of lists or ValueError; urlencoded dicts round-trip."""
    from urllib.parse import quote
    try:
        out = parse_query(raw)
        assert isinstance(out, dict)
        assert all(isinstance(k, str) and isinstance(v, list) for k, v in out.items())
    except ValueError:
        pass
    pairs = [(k, v) for k, vs in params.items() for v in vs]
    encoded = "&".join(quote(k, safe="") + "=" + quote(v, safe="") for k, v in pairs)
    want: dict[str, list[str]] = {}
    for k, v in pairs:
        want.setdefault(k, []).append(v)
    assert parse_query(encoded) == want


test_parse_query, test_parse_query_slow = fast_and_slow(
    300, 5000, raw=st.text(max_size=40) | st.sampled_from(["%", "%zz", "a=%2", "a;b=c", "&&", "=x", "+=+"]),
    params=st.dictionaries(QUERY_TEXT, st.lists(QUERY_TEXT, min_size=1, max_size=3), max_size=4))(check_parse_query)


# ==========================================================================================
# the disk queue's record reader on corrupted files
# ==========================================================================================


def _frame(i: int, body: bytes) -> bytes:
    rec = struct.pack(">qH", 1_700_000_000_000_000_000 + i, 0) + (b"%016x" % i) + body
    return struct.pack(">ii", len(rec) + 4, 2) + rec[:8] + struct.pack(">H", 1) + rec[10:]


@st.composite
def corruption(draw) -> Any:
    bodies = draw(st.lists(st.binary(min_size=1, max_size=60), min_size=1, max_size=30))
    ops = draw(st.lists(st.tuples(st.sampled_from(["flip", "truncate", "overwrite", "append", "delete",
                                                   "meta", "meta_garbage", "extra_file"]),
                                  st.integers(0, 10 ** 6), st.binary(max_size=12)), min_size=1, max_size=4))
    return bodies, ops, draw(st.integers(80, 700))


def check_disk_reader(case: Any) -> None:
    """DiskQueue on corrupted files: opening and reading never raise; what comes out is well-formed
    frames; bad files are quarantined (.bad); the queue ends empty and still works."""
    import os

    from nsqtw.backend.disk import DiskQueue, SyncWorker
    from nsqtw.backend.runs import run_frames

    bodies, ops, max_bytes = case
    path = tempfile.mkdtemp()
    try:
        def open_q():
            return DiskQueue("q", path, max_bytes_per_file=max_bytes, max_msg_size=64, sync_every=1,
                             worker=SyncWorker(None, clock=None, threaded=False))

        q = open_q()
        frames = [_frame(i, b) for i, b in enumerate(bodies)]
        for f in frames:
            q.put((f, [0], len(f)))
        q.read(len(frames) // 3)  # some consumed
        q.close()
        names = sorted(os.listdir(path))
        data_files = [n for n in names if n.endswith(".dat") and "meta" not in n and "deferred" not in n]
        for op, pos, blob in ops:
            target = os.path.join(path, data_files[pos % len(data_files)]) if data_files else None
            if op == "meta":
                with open(os.path.join(path, "q.diskqueue.meta.dat"), "wb") as f:
                    # small, large and negative numbers (F6)
                    f.write(b"%d\n%d,%d\n%d,%d\n" % tuple(((pos >> (4 * k)) % 97 - (20 if pos & 2 else 0))
                                                          * (1 + (pos & 1) * 1000) for k in range(5)))
            elif op == "meta_garbage":
                with open(os.path.join(path, "q.diskqueue.meta.dat"), "wb") as f:
                    f.write(blob)
            elif op == "extra_file":
                with open(os.path.join(path, f"q.diskqueue.{pos % 5:06d}.dat"), "ab") as f:
                    f.write(blob * 3)
            elif target is None or not os.path.exists(target):
                continue
            elif op == "delete":
                os.unlink(target)
            else:
                with open(target, "rb") as f:
                    data = bytearray(f.read())
                if not data:
                    continue
                i = pos % len(data)
                if op == "flip":
                    data[i] ^= 1 << (pos % 8)
                elif op == "truncate":
                    del data[i:]
                elif op == "overwrite":
                    data[i:i + len(blob)] = blob
                else:
                    data += blob
                with open(target, "wb") as f:
                    f.write(data)
        q = open_q()
        out: list[bytes] = []
        for _ in range(200):
            assert q.depth() >= 0
            runs = q.read(7)
            if not runs:
                break
            for r in runs:
                out.extend(run_frames(r))
        for f in out:
            size, ftype = struct.unpack_from(">ii", f)
            assert ftype == 2 and size == len(f) - 4 and 26 <= size - 4 <= 64 + 26
        assert q.depth() == 0
        fresh = _frame(999, b"after")
        q.put((fresh, [0], len(fresh)))
        assert [f for r in q.read(5) for f in run_frames(r)] == [fresh]
        q.close()
        leftovers = [n for n in os.listdir(path) if n.endswith(".dat.bad")]
        assert all(re.match(r"q\.diskqueue\.\d{6}\.dat\.bad\Z", n) for n in leftovers)
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("with_data_file", [True, False])
def test_disk_metadata_negative_positions(tmp_path, with_data_file):
    """A metadata file with negative read/write positions opens (recovered or reset) and the queue works."""
    from nsqtw.backend.disk import DiskQueue, SyncWorker
    from nsqtw.backend.runs import run_frames

    if with_data_file:
        f = _frame(1, b"x")
        (tmp_path / "q.diskqueue.000000.dat").write_bytes(struct.pack(">i", len(f) - 8) + f[8:])
    (tmp_path / "q.diskqueue.meta.dat").write_bytes(b"1\n0,-20\n0,-20\n")
    with mock.patch("os.fsync", lambda fd: None):
        q = DiskQueue("q", str(tmp_path), max_msg_size=64, worker=SyncWorker(None, clock=None, threaded=False))
        q.read(10)
        fresh = _frame(999, b"after")
        q.put((fresh, [0], len(fresh)))
        assert fresh in [f for r in q.read(10) for f in run_frames(r)]


def _no_fsync(fn):
    import functools

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        with mock.patch("os.fsync", lambda fd: None):
            return fn(*a, **kw)
    return wrapper


test_disk_reader_corruption, test_disk_reader_corruption_slow = fast_and_slow(
    80, 1500, case=corruption())(_no_fsync(check_disk_reader))


# ==========================================================================================
# the client's frame and response parsing
# ==========================================================================================


def check_client_core(answers: list[tuple[int, bytes]], garbage: bytes, cuts: list[int], ready: bool) -> None:
    """ClientCore.receive: whatever nsqd sends, in any cuts, gives events (frames, or one EV_FAILED
    that ends the connection) and never raises; typed errors come from any error body."""
    core = ClientCore(Config())
    core.start()
    stream = b""
    if ready:
        stream += encode_frame(0, b"OK")
    stream += b"".join(encode_frame(t, p) for t, p in answers) + garbage
    events = []
    for piece in _cut(stream, cuts):
        got = core.receive(piece)
        assert isinstance(got, list)
        events.extend(got)
    failed = [e for e in events if e[0] == EV_FAILED]
    assert len(failed) <= 1
    if failed:
        assert events[-1][0] == EV_FAILED and core.receive(b"more") == []
    for t, p in answers:
        if t == 1:
            assert isinstance(from_wire(p), NSQError)


test_client_core, test_client_core_slow = fast_and_slow(
    200, 4000, answers=st.lists(st.tuples(st.integers(-1, 3), st.binary(max_size=40)
                                          | st.sampled_from([b"OK", b"_heartbeat_", b"{}", b'{"tls_v1":true}',
                                                             b'{"deflate":true}', b'{"snappy":true}',
                                                             b'{"auth_required":true}', b"E_INVALID x"])),
                                max_size=6),
    garbage=st.binary(max_size=40), cuts=st.lists(st.integers(0, 400), max_size=8),
    ready=st.booleans())(check_client_core)


def test_client_rejects_oversized_frame_before_buffering():
    """With max_msg_size set, a frame header announcing more is refused at once (nothing buffered)."""
    core = ClientCore(Config(max_msg_size=1024))
    core.start()
    events = core.receive(struct.pack(">ii", 1 << 30, 2) + b"x" * 100)
    assert [e[0] for e in events] == [EV_FAILED]
