"""nsq_to_http against a live nsqd and a local klein endpoint that fails sometimes: failures are
REQueued and retried until delivered, round-robin splits the load, hostpool avoids a dead host, GET
escapes the body into %s, --header / --content-type / User-Agent are sent, --sample 0 forwards nothing."""

from __future__ import annotations

from typing import Any

import pytest
import pytest_twisted
from klein import Klein
from twisted.internet import defer, task
from twisted.web.server import Site

from nsqtw.options import OptionError
from nsqtw.tools.to_http import HostPool, ToHttp, ToHttpOptions

from tools_support import reactor, tool_options, wait_for, within

FAST_RETRY = ["--consumer-opt=default_requeue_delay,0", "--consumer-opt=backoff_multiplier,1ms",
              "--consumer-opt=max_backoff_duration,10ms"]


class Endpoint:
    """A klein app: POST /in and GET /get record what arrives; every `fail_every`-th request gets a 500."""

    app = Klein()

    def __init__(self, fail_every: int = 0, always_fail: bool = False) -> None:
        self.fail_every = fail_every
        self.always_fail = always_fail
        self.requests = 0
        self.bodies: list[bytes] = []
        self.headers: list[dict[bytes, bytes]] = []

    def _answer(self, request: Any, body: bytes) -> bytes:
        self.requests += 1
        if self.always_fail or (self.fail_every and self.requests % self.fail_every == 0):
            request.setResponseCode(500)
            return b"nope"
        self.bodies.append(body)
        self.headers.append({k.lower(): v[0] for k, v in request.requestHeaders.getAllRawHeaders()})
        request.setResponseCode(201 if request.method == b"POST" else 200)
        return b"ok"

    @app.route("/in", methods=["POST"])
    def post(self, request: Any) -> bytes:
        return self._answer(request, request.content.read())

    @app.route("/get", methods=["GET"])
    def get(self, request: Any) -> bytes:
        return self._answer(request, request.args[b"data"][0])


async def serve(endpoint: Endpoint) -> Any:
    port = reactor().listenTCP(0, Site(endpoint.app.resource()), interface="127.0.0.1")
    return port


def url(port: Any, path: str) -> str:
    return f"http://127.0.0.1:{port.getHost().port}{path}"


def publish(nsqd, topic: str, bodies) -> None:
    nsqd._broker.publish(topic, list(bodies), nsqd._service.now())
    nsqd._service.settle()


@pytest.mark.parametrize("argv,message", [
    (["--nsqd-tcp-address=a:1", "--post=http://x/"], "--topic and --channel are required"),
    (["--topic=t", "--nsqd-tcp-address=a:1"], "--get or --post required"),
    (["--topic=t", "--nsqd-tcp-address=a:1", "--post=http://x/", "--get=http://x/%s"], "use --get or --post not both"),
    (["--topic=t", "--nsqd-tcp-address=a:1", "--get=http://x/"], "invalid GET address - must be a printf string"),
    (["--topic=t", "--nsqd-tcp-address=a:1", "--get=http://x/%s", "--content-type=text/plain"],
     "--content-type only used with --post"),
    (["--topic=t", "--nsqd-tcp-address=a:1", "--post=http://x/", "--sample=1.5"], "--sample must be between"),
    (["--topic=t", "--nsqd-tcp-address=a:1", "--post=http://x/", "--header=nocolon"], "--header value format"),
    (["--topic=t", "--nsqd-tcp-address=a:1", "--post=http://x/", "--mode=all"], "invalid --mode"),
])
def test_flag_checks(argv, message):
    """Go's refusals (and nsqtw's for an unknown --mode)."""
    with pytest.raises(OptionError, match=message):
        tool_options(ToHttpOptions, *argv)


def test_hostpool_skips_failed_host_until_retry():
    """A failed host is skipped for 30 s, then tried once; on a new failure it waits 60 s."""
    clock = task.Clock()
    pool = HostPool(["a", "b"], clock)
    assert [pool.get() for _ in range(4)] == ["a", "b", "a", "b"]
    pool.mark("a", True)
    assert [pool.get() for _ in range(3)] == ["b", "b", "b"]
    clock.advance(30)
    assert "a" in [pool.get(), pool.get()]
    assert [pool.get() for _ in range(3)] == ["b", "b", "b"]  # a's next retry is 60 s away
    pool.mark("b", True)
    assert pool.get() in ("a", "b")  # all down: start over


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_post_with_failures_are_retried_until_delivered(nsqd):
    """Every third POST gets a 500: those messages are REQueued and delivered later; each body arrives,
    with the custom header, the content type and nsq_to_http's User-Agent."""
    endpoint = Endpoint(fail_every=3)
    port = await serve(endpoint)
    try:
        bodies = [b"m%02d" % i for i in range(20)]
        publish(nsqd, "hooks", bodies)
        app = ToHttp(tool_options(ToHttpOptions, "--topic=hooks", f"--nsqd-tcp-address={nsqd.tcp_address}",
                                  f"--post={url(port, '/in')}", "--header=X-Trace: abc", "--content-type=text/plain",
                                  "-n", "4", *FAST_RETRY))
        await within(app.start())
        await wait_for(lambda: set(endpoint.bodies) == set(bodies), what="all bodies delivered")
        assert app.failed >= 6 and app.consumers[0].messages_requeued >= 6
        await within(app.stop())
        assert endpoint.headers[0][b"x-trace"] == b"abc"
        assert endpoint.headers[0][b"content-type"] == b"text/plain"
        assert endpoint.headers[0][b"user-agent"] == b"nsq_to_http v1.3.0"
        channel = nsqd._broker.topics["hooks"].channels["nsq_to_http"]
        assert channel.depth() == 0 and not channel.inflight
    finally:
        await port.stopListening()


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_round_robin_splits_and_get_escapes(nsqd):
    """--mode=round-robin over two GET endpoints: each gets half; the body is URL-escaped into %s."""
    e1, e2 = Endpoint(), Endpoint()
    p1, p2 = await serve(e1), await serve(e2)
    try:
        bodies = [b"a b&c=%d/\xc3\xa9" % i for i in range(10)]
        publish(nsqd, "gets", bodies)
        app = ToHttp(tool_options(ToHttpOptions, "--topic=gets", f"--nsqd-tcp-address={nsqd.tcp_address}",
                                  "--mode=round-robin", f"--get={url(p1, '/get?data=%s')}",
                                  f"--get={url(p2, '/get?data=%s')}"))
        await within(app.start())
        await wait_for(lambda: len(e1.bodies) + len(e2.bodies) == 10, what="ten GETs")
        assert len(e1.bodies) == len(e2.bodies) == 5
        assert sorted(e1.bodies + e2.bodies) == sorted(bodies)
        await within(app.stop())
    finally:
        await p1.stopListening()
        await p2.stopListening()


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_hostpool_avoids_dead_endpoint(nsqd):
    """hostpool: an endpoint that always fails is tried once, then the healthy one takes everything."""
    dead, alive = Endpoint(always_fail=True), Endpoint()
    pd, pa = await serve(dead), await serve(alive)
    try:
        publish(nsqd, "pool", [b"%d" % i for i in range(10)])
        app = ToHttp(tool_options(ToHttpOptions, "--topic=pool", f"--nsqd-tcp-address={nsqd.tcp_address}",
                                  f"--post={url(pd, '/in')}", f"--post={url(pa, '/in')}", "-n", "1", *FAST_RETRY))
        await within(app.start())
        await wait_for(lambda: len(alive.bodies) == 10, what="all on the healthy endpoint")
        assert dead.requests == 1 and app.pool.healthy() == [url(pa, "/in")]
        await within(app.stop())
    finally:
        await pd.stopListening()
        await pa.stopListening()


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_sample_zero_forwards_nothing(nsqd):
    """--sample=0: every message is FINed without a request."""
    endpoint = Endpoint()
    port = await serve(endpoint)
    try:
        publish(nsqd, "sampled", [b"x"] * 5)
        app = ToHttp(tool_options(ToHttpOptions, "--topic=sampled", f"--nsqd-tcp-address={nsqd.tcp_address}",
                                  f"--post={url(port, '/in')}", "--sample=0"))
        await within(app.start())
        await wait_for(lambda: app.skipped == 5, what="five skipped")
        await within(app.stop())
        assert endpoint.requests == 0
        assert nsqd._broker.topics["sampled"].channels["nsq_to_http"].depth() == 0
    finally:
        await port.stopListening()


class _Recorder:
    """What a Python ``http.server.ThreadingHTTPServer`` (HTTP/1.1, listen backlog 5, answering
    200 at once) received, from its handler threads."""

    def __init__(self) -> None:
        import threading

        self.lock = threading.Lock()
        self.posts: list[bytes] = []
        self.gets: list[str] = []


def _threading_server(rec: _Recorder) -> Any:
    import http.server
    import threading
    from urllib.parse import parse_qs, urlsplit

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with rec.lock:
                rec.posts.append(body)
            self._answer()

        def do_GET(self) -> None:
            with rec.lock:
                rec.gets.extend(parse_qs(urlsplit(self.path).query).get("m", []))
            self._answer()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    assert server.request_queue_size == 5  # the stdlib default this test is about
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_post_and_get_at_once_into_a_threading_http_server_deliver_each_message_once(nsqd):
    """200 messages with --post and 50 with --get at the same time, -n 100 (Go's default), into one
    stdlib ThreadingHTTPServer: every message arrives once and none is requeued (issue 14 item 4;
    before, a burst of -n new connections overflowed the server's backlog of 5 and the requests
    sent on the dropped ones hung until the timeout)."""
    rec = _Recorder()
    server = _threading_server(rec)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    posts = [b"post-%03d" % i for i in range(200)]
    gets = [b"get-%02d" % i for i in range(50)]
    publish(nsqd, "to_post", posts)
    publish(nsqd, "to_get", gets)
    apps = [
        ToHttp(tool_options(ToHttpOptions, "--topic=to_post", f"--nsqd-tcp-address={nsqd.tcp_address}",
                            f"--post={base}/in", "--http-client-request-timeout=5s")),
        ToHttp(tool_options(ToHttpOptions, "--topic=to_get", f"--nsqd-tcp-address={nsqd.tcp_address}",
                            f"--get={base}/get?m=%s", "--http-client-request-timeout=5s")),
    ]
    try:
        for app in apps:
            await within(app.start())
        await wait_for(lambda: len(rec.posts) >= 200 and len(rec.gets) >= 50, timeout=20,
                       what="every message forwarded")
        with rec.lock:
            assert sorted(rec.posts) == posts and sorted(rec.gets) == [g.decode() for g in gets]
        assert [app.failed for app in apps] == [0, 0]
        assert [app.consumers[0].messages_requeued for app in apps] == [0, 0]
    finally:
        for app in apps:
            await within(app.stop())
        server.shutdown()
        server.server_close()


def test_new_connections_to_one_host_are_paced() -> None:
    from nsqtw.tools.to_http import PacedEndpointFactory

    clock = task.Clock()
    f = PacedEndpointFactory(clock, 2.0, spacing=0.002)
    waits = [f.delay((b"h", 1)) for _ in range(4)]
    assert waits == pytest.approx([0.0, 0.002, 0.004, 0.006])
    assert f.delay((b"other", 1)) == 0.0  # per host
    clock.advance(1.0)
    assert f.delay((b"h", 1)) == 0.0  # a quiet host connects at once


def test_at_most_four_new_connections_per_host_wait_for_the_server() -> None:
    """However slowly a server accepts, a burst of new connections never has more than
    ``UNANSWERED_PER_HOST`` (4, under http.server's listen backlog of 5) waiting for the
    server's first bytes; each answer, failure or close lets the next one open."""
    from twisted.internet.protocol import Protocol

    from nsqtw.tools import to_http

    clock = task.Clock()
    opened: list[tuple[Protocol, defer.Deferred]] = []

    class Endpoint:
        def connect(self, factory: Any) -> defer.Deferred:
            d: defer.Deferred = defer.Deferred()
            opened.append((Protocol(), d))
            return d

    f = to_http.PacedEndpointFactory(clock, 2.0, spacing=0.0)
    key = (b"slow-host-%d" % id(clock), 80)
    results = [to_http._PacedEndpoint(f, key, Endpoint()).connect(None) for _ in range(7)]
    assert len(opened) == 4  # three wait
    for proto, d in opened[:4]:
        d.callback(proto)
    assert len(opened) == 4  # connected, but the server said nothing yet
    opened[0][0].dataReceived(b"HTTP/1.1 200 OK\r\n")
    assert len(opened) == 5
    opened[1][0].connectionLost(None)
    assert len(opened) == 6
    opened[4][1].errback(ConnectionRefusedError())
    results[4].addErrback(lambda f: None)
    assert len(opened) == 7
    opened[0][0].dataReceived(b"more")  # a second read gives back nothing more
    assert len(to_http._unanswered[key].waiting) == 0 and to_http._unanswered[key].tokens == 0
