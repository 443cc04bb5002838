"""nsqtw.runtime.upstream: the one HTTP client for NSQ's JSON APIs (headers, deadline on the clock, statuses)."""

from __future__ import annotations

import json

import pytest
from treq.testing import StubTreq
from twisted.internet import defer, task
from twisted.web.resource import Resource

from nsqtw.runtime.upstream import NSQ_ACCEPT, Upstream, UpstreamStatusError, https_retry_url


class Recorder(Resource):
    isLeaf = True

    def __init__(self, code: int = 200, body: bytes = b'{"channels":["a"]}') -> None:
        super().__init__()
        self.code = code
        self.body = body
        self.seen: list[tuple[bytes, bytes, dict[bytes, list[bytes]]]] = []

    def render(self, request):  # noqa: ANN001 - twisted.web
        self.seen.append((request.method, request.uri, dict(request.requestHeaders.getAllRawHeaders())))
        request.setResponseCode(self.code)
        return self.body


def results(d: defer.Deferred) -> list:
    out: list = []
    d.addBoth(out.append)
    return out


def test_get_sends_nsq_accept_and_user_agent() -> None:
    res = Recorder()
    stub = StubTreq(res)
    up = Upstream(task.Clock(), 5.0, http_client=stub, user_agent="nsqtw-test/1")
    got = results(up.get_json("http://127.0.0.1:4161/channels?topic=t"))
    stub.flush()
    assert got == [{"channels": ["a"]}]
    method, uri, headers = res.seen[0]
    assert (method, uri) == (b"GET", b"/channels?topic=t")
    assert headers[b"Accept"] == [NSQ_ACCEPT] and headers[b"User-Agent"] == [b"nsqtw-test/1"]


def test_no_accept_header_when_asked_for_none() -> None:
    res = Recorder(body=b"OK")
    stub = StubTreq(res)
    up = Upstream(None, 0, http_client=stub, accept=None)
    got = results(up.fetch("POST", "http://h:4151/pub?topic=t", body=b"x",
                           headers={b"Content-Type": b"application/octet-stream"}))
    stub.flush()
    assert got == [b"OK"]
    assert b"Accept" not in res.seen[0][2]
    assert res.seen[0][2][b"Content-Type"] == [b"application/octet-stream"]


def test_a_status_other_than_200_is_an_error_carrying_it() -> None:
    stub = StubTreq(Recorder(code=404, body=b'{"message":"TOPIC_NOT_FOUND"}'))
    up = Upstream(task.Clock(), 5.0, http_client=stub)
    got = results(up.fetch("GET", "http://h:4161/lookup?topic=t"))
    stub.flush()
    err = got[0].value
    assert isinstance(err, UpstreamStatusError) and err.code == 404
    assert err.response.body == b'{"message":"TOPIC_NOT_FOUND"}'
    assert str(err).startswith('GET "http://h:4161/lookup?topic=t": got response 404')


def test_the_deadline_runs_on_the_injected_clock_and_covers_the_body() -> None:
    """A server that never finishes its answer is given up after request_timeout on the clock."""
    class Stalled:
        def get(self, url, headers=None):
            class Response:
                code = 200
                phrase = b"OK"
                headers = None
                length = 10

                def deliverBody(self, protocol):  # headers arrived; the body never does
                    pass

            return defer.succeed(Response())

    clock = task.Clock()
    up = Upstream(clock, 2.0, http_client=Stalled())
    got = results(up.fetch("GET", "http://h:4161/ping"))
    clock.advance(1.9)
    assert got == []
    clock.advance(0.2)
    assert got and got[0].check(defer.TimeoutError)


@pytest.mark.parametrize("url, body, want", [
    ("http://h:4151/stats", b'{"https_port":4152}', "https://h:4152/stats"),
    ("http://[::1]:4151/x", b'{"https_port":4152}', "https://[::1]:4152/x"),
    ("http://h:4151/stats", b'{"message":"TLS_REQUIRED"}', None),
    ("https://h:4152/stats", b'{"https_port":4152}', None),
    ("http://h:4151/stats", b"not json", None),
])
def test_https_retry_url(url: str, body: bytes, want: str | None) -> None:
    assert https_retry_url(url, body) == want


def test_a_403_naming_an_https_port_is_asked_again_over_https() -> None:
    calls: list[str] = []

    class Client:
        def get(self, url, headers=None):
            calls.append(url)
            from treq.testing import StubTreq as S
            if url.startswith("http://"):
                return S(Recorder(code=403, body=json.dumps({"https_port": 4152}).encode())).get(url, headers=headers)
            return S(Recorder(body=b'{"ok":1}')).get(url, headers=headers)

    up = Upstream(None, 0, http_client=Client())
    d = up.get_json("http://h:4151/stats", https_retry=True)
    got: list = []
    d.addBoth(got.append)
    assert calls == ["http://h:4151/stats", "https://h:4152/stats"]
    assert got == [{"ok": 1}]
