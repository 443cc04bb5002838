"""A daemon's access lines go straight to its Go-style log (issue 47: nsqlookupd's CPU under
/lookup polling), and an embedded daemon's still go through Twisted's log."""

from __future__ import annotations

import io

from twisted.logger import globalLogPublisher

from nsqtw.runtime import golog
from nsqtw.runtime.responses import GoAccessLog


class FakeRequest:
    path = b"/lookup"
    uri = b"/lookup?topic=t"
    method = b"GET"
    code = 200
    _go_started = 10.0

    def __init__(self, agent: bytes = b"go-nsq/1.1.0") -> None:
        self.agent = agent

    def getClientAddress(self):
        class Peer:
            host, port = "127.0.0.1", 5555
        return Peer()

    def getHeader(self, name: bytes) -> bytes:
        return self.agent


def test_access_lines_go_straight_to_the_daemons_log_at_its_level(monkeypatch):
    stream = io.StringIO()
    observer = golog.GoLogObserver(stream, "[nsqlookupd] ", level=2)
    monkeypatch.setattr(golog, "_direct", observer)
    events: list[dict] = []
    globalLogPublisher.addObserver(events.append)
    try:
        access = GoAccessLog("nsqtw.lookupd.http")
        access(FakeRequest(), 10.0015)
        access(FakeRequest(b"nsqadmin/v1.3.0"), 10.001)  # nsqadmin's polls: DEBUG, below INFO
    finally:
        globalLogPublisher.removeObserver(events.append)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("[nsqlookupd] ")
    assert lines[0].endswith(" INFO: 200 GET /lookup?topic=t (127.0.0.1:5555) 1.5ms")
    assert not [e for e in events if e.get("log_namespace") == "nsqtw.lookupd.http"]  # no Twisted event built
    observer.level = 1
    access(FakeRequest(b"nsqadmin/v1.3.0"), 10.001)
    assert stream.getvalue().splitlines()[-1].endswith(" DEBUG: 200 GET /lookup?topic=t (127.0.0.1:5555) 1ms")


def test_an_embedded_daemons_access_lines_are_twisted_log_events(monkeypatch):
    monkeypatch.setattr(golog, "_direct", None)
    events: list[dict] = []
    globalLogPublisher.addObserver(events.append)
    try:
        GoAccessLog("nsqtw.lookupd.http")(FakeRequest(), 10.0015)
    finally:
        globalLogPublisher.removeObserver(events.append)
    (event,) = [e for e in events if e.get("log_namespace") == "nsqtw.lookupd.http"]
    assert event["uri"] == "/lookup?topic=t" and event["code"] == 200 and event["peer"] == "127.0.0.1:5555"
