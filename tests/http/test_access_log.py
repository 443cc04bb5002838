"""Go's HTTP access line (``http_api.Log``): nsqd and nsqlookupd log each answered request at INFO,
``200 GET /stats?format=json (127.0.0.1:51234) 1.234ms``; nsqd leaves out /pub and /mpub, as Go's
nsqd does; nsqadmin's own polling shows at DEBUG only."""

from __future__ import annotations

import re

import pytest
import treq
from twisted.logger import LogLevel, formatEvent, globalLogPublisher

from nsqtw.embed import start_nsqd, start_nsqlookupd
from nsqtw.runtime.responses import go_duration

LINE = re.compile(r"^(\d{3}) (GET|POST) (\S+) \(127\.0\.0\.1:\d+\) \d+(\.\d+)?(ns|µs|ms|s)$")


@pytest.mark.parametrize("seconds,text", [
    (0.0, "0s"), (812e-9, "812ns"), (1.25e-6, "1.25µs"), (1e-6, "1µs"), (3.000001e-3, "3.000001ms"),
    (0.5, "500ms"), (1.5, "1.5s"), (62.5, "1m2.5s"), (3723.0, "1h2m3s"), (3600.0, "1h0m0s"),
])
def test_go_duration_matches_go_string(seconds, text):
    """time.Duration.String(): the unit by size, trailing zeros cut, h/m above a minute."""
    assert go_duration(seconds) == text


def _access(events):
    out = []
    for e in events:
        if str(e.get("log_namespace", "")).endswith(".http") and "code" in e:
            out.append((e["log_namespace"], e["log_level"], formatEvent(e)))
    return out


@pytest.fixture
def events():
    got: list[dict] = []
    globalLogPublisher.addObserver(got.append)
    try:
        yield got
    finally:
        globalLogPublisher.removeObserver(got.append)


@pytest.mark.e2e
async def test_nsqd_logs_each_answer_but_pub_as_go_does(events):
    nsqd = await start_nsqd()
    try:
        base = f"http://{nsqd.http_address}"
        await (await treq.get(f"{base}/stats?format=json")).content()
        await (await treq.post(f"{base}/pub?topic=t", data=b"x")).content()
        await (await treq.post(f"{base}/mpub?topic=t", data=b"x\ny")).content()
        await (await treq.post(f"{base}/topic/create?topic=bad!")).content()
        await (await treq.get(f"{base}/stats", headers={"User-Agent": "nsqadmin/v1.3.0"})).content()
    finally:
        await nsqd.stop()
    got = _access(events)
    assert [(ns, lvl, LINE.match(text).group(1, 2, 3)) for ns, lvl, text in got] == [
        ("nsqtw.nsqd.http", LogLevel.info, ("200", "GET", "/stats?format=json")),
        ("nsqtw.nsqd.http", LogLevel.info, ("400", "POST", "/topic/create?topic=bad!")),
        ("nsqtw.nsqd.http", LogLevel.debug, ("200", "GET", "/stats")),
    ], got


@pytest.mark.e2e
async def test_nsqlookupd_logs_each_answer(events):
    lookupd = await start_nsqlookupd()
    try:
        resp = await treq.get(f"http://{lookupd.http_address}/lookup?topic=x")
        await resp.content()
    finally:
        await lookupd.stop()
    got = _access(events)
    assert len(got) == 1 and got[0][:2] == ("nsqtw.lookupd.http", LogLevel.info)
    assert LINE.match(got[0][2]).group(1, 2, 3) == ("404", "GET", "/lookup?topic=x")
