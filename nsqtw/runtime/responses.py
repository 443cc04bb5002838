"""
NSQ's HTTP response shapes, shared by every daemon's klein app.

nsqd, nsqlookupd and nsqadmin answer in NSQ's "V1" envelope: a string is a
raw body, ``None`` an empty body, anything else JSON with
``Content-Type: application/json; charset=utf-8``; errors are
``{"message": "TEXT"}`` with their status; every V1 answer carries
``X-NSQ-Content-Type: nsq; version=1.0``.  Unknown paths and wrong methods
get NSQ's ``NOT_FOUND`` / ``METHOD_NOT_ALLOWED`` JSON instead of werkzeug's
HTML.
"""

from __future__ import annotations

import json

from typing import Any
from urllib.parse import unquote_to_bytes

from twisted.python.failure import Failure
from twisted.web.iweb import IRequest
from twisted.web import http as _web_http
from twisted.web import server as _web_server
from twisted.web.resource import Resource
from werkzeug.exceptions import MethodNotAllowed, NotFound

from .golog import direct_observer

from ..errors import HTTPAPIError
from ..protocol.names import is_valid_name
from ..protocol.gojson import go_json
from . import seam

__all__ = ["v1", "v1_error", "plain", "query", "first", "install_error_handlers", "RouterResource",
           "LimitedRequest", "limited_site", "go_site", "go_duration", "GoAccessLog", "parse_query", "topic_channel_args", "JSON_TYPE", "TEXT_TYPE"]

JSON_TYPE = b"application/json; charset=utf-8"
TEXT_TYPE = b"text/plain; charset=utf-8"
NSQ_TYPE = b"nsq; version=1.0"


_HEX = frozenset(b"0123456789abcdefABCDEF")


def _unescape(text: str) -> str:
    """Go's ``url.QueryUnescape``: '+' is a space, a '%' needs two hex digits."""
    raw = text.encode("utf-8", "surrogateescape")
    i = raw.find(b"%")
    while i >= 0:
        if i + 2 >= len(raw) or raw[i + 1] not in _HEX or raw[i + 2] not in _HEX:
            raise ValueError(f"invalid URL escape {raw[i:i + 3]!r}")
        i = raw.find(b"%", i + 3)
    return unquote_to_bytes(raw.replace(b"+", b" ")).decode("utf-8", "surrogateescape")


def parse_query(raw: str) -> dict[str, list[str]]:
    """Go's ``url.ParseQuery``: ``&``-separated, ``;`` refused, strict %-escapes."""
    out: dict[str, list[str]] = {}
    error: Exception | None = None
    for part in raw.split("&"):
        if not part:
            continue
        if ";" in part:
            error = error or ValueError("invalid semicolon separator in query")
            continue
        key, _, value = part.partition("=")
        try:
            k = _unescape(key)
            v = _unescape(value)
        except ValueError as e:
            error = error or e
            continue
        out.setdefault(k, []).append(v)
    if error is not None:
        raise error
    return out


def query(request: IRequest) -> dict[str, list[str]]:
    """Query-string parameters only (nsqd never reads form bodies); a query Go's
    ParseQuery refuses is 400 INVALID_REQUEST, as nsqd answers."""
    # Go's server parses the request target with url.ParseRequestURI, which knows no fragment: a
    # raw "#" (GET /stats?topic=t#ephemeral) is part of the query, never cut off as urlsplit would
    raw = request.uri.decode("latin-1").partition("?")[2]
    try:
        return parse_query(raw)
    except ValueError:
        raise HTTPAPIError(400, "INVALID_REQUEST") from None


def first(params: dict[str, list[str]], key: str) -> str | None:
    """Go's ``ReqParams.Get``: the first value, None if the key is absent."""
    values = params.get(key)
    return values[0] if values else None


def topic_channel_args(params: dict[str, list[str]]) -> tuple[str, str]:
    """NSQ's ``GetTopicChannelArgs`` (``http_api/topic_channel_args.go``)."""
    topic = first(params, "topic")
    if topic is None:
        raise HTTPAPIError(400, "MISSING_ARG_TOPIC")
    if not is_valid_name(topic):
        raise HTTPAPIError(400, "INVALID_ARG_TOPIC")
    channel = first(params, "channel")
    if channel is None:
        raise HTTPAPIError(400, "MISSING_ARG_CHANNEL")
    if not is_valid_name(channel):
        raise HTTPAPIError(400, "INVALID_ARG_CHANNEL")
    return topic, channel


def _sized(request: IRequest, body: bytes) -> bytes:
    """Answer with a Content-Length (as Go's net/http does for small bodies), not chunked."""
    request.setHeader(b"Content-Length", b"%d" % len(body))
    if not body:
        # net/http sniffs a Content-Type only for a non-empty body
        request.defaultContentType = None  # type: ignore[attr-defined]  # twisted.web Request's, not in IRequest
    return body


def v1(request: IRequest, data: Any) -> bytes:
    """A 200 answer in the V1 envelope."""
    request.setHeader(b"X-NSQ-Content-Type", NSQ_TYPE)
    if data is None:
        return _sized(request, b"")
    if isinstance(data, bytes):
        request.setHeader(b"Content-Type", TEXT_TYPE)
        return _sized(request, data)
    if isinstance(data, str):
        request.setHeader(b"Content-Type", TEXT_TYPE)
        return _sized(request, data.encode())
    request.setHeader(b"Content-Type", JSON_TYPE)
    return _sized(request, go_json(data))


def v1_error(request: IRequest, status: int, text: str, extra: dict[str, Any] | None = None) -> bytes:
    request.setResponseCode(status)
    request.setHeader(b"Content-Type", JSON_TYPE)
    request.setHeader(b"X-NSQ-Content-Type", NSQ_TYPE)
    body: dict[str, Any] = {"message": text}
    if extra:
        body.update(extra)
    return _sized(request, go_json(body))


def plain(request: IRequest, text: str, status: int = 200) -> bytes:
    """NSQ's PlainText decorator (``/ping``): no V1 header."""
    request.setResponseCode(status)
    request.setHeader(b"Content-Type", TEXT_TYPE)
    return _sized(request, text.encode())


def install_error_handlers(app: Any) -> None:
    """Map HTTPAPIError, unknown routes, wrong methods and crashes onto NSQ's JSON errors."""

    @app.handle_errors(HTTPAPIError)
    def _api_error(instance: Any, request: IRequest, failure: Failure) -> bytes:
        err = failure.value
        return v1_error(request, err.status, err.text, err.extra)

    @app.handle_errors(NotFound)
    def _not_found(instance: Any, request: IRequest, failure: Failure) -> bytes:
        return v1_error(request, 404, "NOT_FOUND")

    @app.handle_errors(MethodNotAllowed)
    def _bad_method(instance: Any, request: IRequest, failure: Failure) -> bytes:
        valid = set(failure.value.valid_methods or ())
        valid.discard("HEAD")
        valid.add("OPTIONS")
        request.setHeader(b"Allow", ", ".join(sorted(valid)).encode())
        return v1_error(request, 405, "METHOD_NOT_ALLOWED")

    @app.handle_errors(Exception)
    def _crash(instance: Any, request: IRequest, failure: Failure) -> bytes:
        from twisted.logger import Logger
        Logger(namespace="nsqtw.http").failure("unhandled error in HTTP handler", failure)
        return v1_error(request, 500, "INTERNAL_ERROR")


class RouterResource(Resource):
    """
    httprouter's manners around a klein app, as nsqd and nsqlookupd have them.

    OPTIONS on a known path answers 200 with ``Allow``; HEAD is not GET (405);
    a path that differs from a route only by a trailing slash or by letter case
    is redirected to it (301 for GET, 307 otherwise).
    """

    isLeaf = True

    def __init__(self, app: Any) -> None:
        super().__init__()
        self._app = app
        self._inner = app.resource()

    def getChildWithDefault(self, name: bytes, request: Any) -> Any:
        return self

    def _allowed(self, path: str) -> list[str]:
        adapter = self._app.url_map.bind("localhost")
        try:
            methods = set(adapter.allowed_methods(path))
        except Exception:
            return []
        methods.discard("HEAD")
        return sorted(methods | {"OPTIONS"}) if methods else []

    def _matches(self, path: str, method: str) -> bool:
        adapter = self._app.url_map.bind("localhost")
        try:
            adapter.match(path, method=method)
            return True
        except Exception:
            return False

    def _fixed_path(self, path: str, method: str) -> str | None:
        candidates = [path[:-1] if path.endswith("/") and len(path) > 1 else path + "/"]
        lowered = path.rstrip("/").lower() or "/"
        for rule in self._app.url_map.iter_rules():
            text = rule.rule
            if "<" in text:
                prefix = text.split("<", 1)[0]
                if lowered.startswith(prefix.lower()) and not path.startswith(prefix):
                    candidates.append(prefix + path.rstrip("/")[len(prefix):])
            elif text.lower() == lowered:
                candidates.append(text)
        for candidate in candidates:
            if candidate != path and self._matches(candidate, method):
                return candidate
        return None

    def render(self, request: Any) -> Any:
        path = request.path.decode("latin-1")
        method = request.method.decode("latin-1")
        if method == "OPTIONS":
            allowed = self._allowed(path)
            if allowed:
                request.setHeader(b"Allow", ", ".join(allowed).encode())
                return _sized(request, b"")
        elif method == "HEAD":
            allowed = self._allowed(path)
            if allowed:
                request.setHeader(b"Allow", ", ".join(allowed).encode())
                return v1_error(request, 405, "METHOD_NOT_ALLOWED")
        elif path != "/" and not self._allowed(path):
            fixed = self._fixed_path(path, method)
            if fixed is not None:
                query_part = request.uri.decode("latin-1").partition("?")
                location = fixed + (query_part[1] + query_part[2] if query_part[1] else "")
                request.setResponseCode(301 if method == "GET" else 307)
                request.setHeader(b"Location", location.encode("latin-1"))
                if method == "GET":
                    request.setHeader(b"Content-Type", b"text/html; charset=utf-8")
                    return _sized(request, b'<a href="%s">Moved Permanently</a>.\n\n' % location.encode("latin-1"))
                return _sized(request, b"")
        return self._inner.render(request)


class LimitedRequest(_web_server.Request):
    """
    A request whose body is refused before it is buffered whole.

    The site's ``body_limit(path)`` gives ``(max bytes, NSQ error text)`` for a
    path (for None, a path not known: the largest of them, the route refusing the rest); a ``Content-Length`` above it, or a chunked body that grows past it,
    is discarded as it arrives and answered ``413 {"message": TEXT}``, as nsqd
    answers ``MSG_TOO_BIG`` / ``BODY_TOO_BIG`` without holding the body.
    """

    _limit: tuple[int, str] | None = None
    _refused: str | None = None
    _received = 0

    def gotLength(self, length: int | None) -> None:
        site = getattr(self.channel, "site", None)
        body_limit = getattr(site, "body_limit", None)
        path = seam.request_path(self.channel)  # None: this Twisted does not say (the largest limit)
        self._limit = body_limit(path and path.split(b"?", 1)[0]) if body_limit is not None else None
        if self._limit is not None and length is not None and length > self._limit[0]:
            self._refused = self._limit[1]
            super().gotLength(0)
            self._answer_early()
            return
        super().gotLength(length)

    def _answer_early(self) -> None:
        """Answer 413 from the headers alone and close, without reading the body (as nsqd)."""
        body = json.dumps({"message": self._refused}, separators=(",", ":")).encode()
        transport: Any = self.channel.transport
        transport.write(b"HTTP/1.1 413 Request Entity Too Large\r\n"
                        b"Content-Type: application/json; charset=utf-8\r\n"
                        b"X-Nsq-Content-Type: nsq; version=1.0\r\n"
                        b"Connection: close\r\n"
                        b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        transport.loseConnection()

    def handleContentChunk(self, data: bytes) -> None:
        if self._refused is not None:
            return
        self._received += len(data)
        if self._limit is not None and self._received > self._limit[0]:
            self._refused = self._limit[1]
            content: Any = self.content  # Request.content is declared None until the request starts
            content.seek(0)
            content.truncate()
            # answer now and close, as nsqd does: a chunked body has no length to refuse from
            # the headers, and reading it to its end (1 GB, or forever) serves no one
            self._answer_early()
            return
        super().handleContentChunk(data)

    def process(self) -> None:
        if self._refused is not None:
            self.setResponseCode(413)
            body = v1_error(self, 413, self._refused)
            self.write(body)
            self.finish()
            return
        super().process()


class GuardedHTTPChannel(_web_http.HTTPChannel):
    """Twisted's HTTP channel, refusing a Content-Length no int64 can hold (400, as Go's server)
    before Twisted's own parser chokes on it."""

    def lineLengthExceeded(self, line: bytes) -> None:
        """A request line or header line longer than Twisted's 16 KiB: answer 400 and close
        (Go's server answers too; Twisted's default closes without a word)."""
        seam.bad_request(self)

    def headerReceived(self, line: bytes) -> bool:
        name, sep, value = line.partition(b":")
        if sep and name.strip().lower() == b"content-length" and len(value.strip()) > 18:
            seam.bad_request(self)
            return False
        return super().headerReceived(line)


def go_duration(seconds: float) -> str:
    """Go's ``time.Duration.String()`` (``812ns``, ``1.25µs``, ``3.000001ms``, ``1m2.5s``)."""
    ns = max(0, int(round(seconds * 1e9)))
    if ns == 0:
        return "0s"
    if ns < 1_000:
        return f"{ns}ns"

    def frac(value: int, digits: int) -> str:
        whole, rest = divmod(value, 10 ** digits)
        tail = f"{rest:0{digits}d}".rstrip("0")
        return f"{whole}.{tail}" if tail else str(whole)

    if ns < 1_000_000:
        return frac(ns, 3) + "µs"
    if ns < 1_000_000_000:
        return frac(ns, 6) + "ms"
    hours, rest = divmod(ns, 3_600_000_000_000)
    minutes, rest = divmod(rest, 60_000_000_000)
    out = f"{hours}h" if hours else ""
    if hours or minutes:
        out += f"{minutes}m"
    return out + frac(rest, 9) + "s"


class GoAccessLog:
    """Go's NSQ access line for each answered request, at INFO:
    ``200 GET /stats?format=json (127.0.0.1:51234) 1.234ms`` (``http_api.Log``).

    As Go's nsqd, ``/pub`` and ``/mpub`` are not logged (``quiet_paths``).  Requests from
    nsqadmin's own polling (a ``User-Agent`` starting ``nsqadmin/``) are logged at DEBUG, so an
    idle cluster's log does not scroll (``--log-level=debug`` shows them)."""

    def __init__(self, namespace: str, quiet_paths: frozenset[bytes] = frozenset()) -> None:
        from twisted.logger import Logger

        self._log = Logger(namespace=namespace)
        self._namespace = namespace
        self.quiet_paths = quiet_paths

    def __call__(self, request: Any, now: float) -> None:
        path = request.path
        if path in self.quiet_paths:
            return
        started = getattr(request, "_go_started", None)
        elapsed = go_duration(now - started) if started is not None else "0s"
        peer = request.getClientAddress()
        host = str(getattr(peer, "host", ""))
        where = f"[{host}]:{getattr(peer, 'port', '')}" if ":" in host else f"{host}:{getattr(peer, 'port', '')}"
        agent = request.getHeader(b"User-Agent") or b""
        quiet = agent.startswith(b"nsqadmin/")
        method, uri = request.method.decode("latin-1"), request.uri.decode("latin-1")
        direct = direct_observer()
        if direct is not None:  # a daemon's own process: the line straight to its log
            direct.write_line(self._namespace, 1 if quiet else 2, f"{request.code} {method} {uri} ({where}) {elapsed}")
            return
        emit = self._log.debug if quiet else self._log.info
        emit("{code} {method} {uri} ({peer}) {elapsed}", code=request.code, method=method, uri=uri,
             peer=where, elapsed=elapsed)


class _GoLoggingSite(_web_server.Site):
    """A Site whose access log is :class:`GoAccessLog` (Twisted's own combined log is off)."""

    go_access_log: GoAccessLog | None = None

    def log(self, request: Any) -> None:
        access = self.go_access_log
        if access is not None:
            access(request, self.reactor.seconds())


class _TimedRequest(_web_server.Request):
    """Notes when its handling starts, for the access line's duration."""

    def process(self) -> None:
        self._go_started = self.channel.site.reactor.seconds()  # type: ignore[attr-defined]  # a Site has a reactor; the stubs do not say so
        super().process()


class _TimedLimitedRequest(LimitedRequest):
    def process(self) -> None:
        self._go_started = self.channel.site.reactor.seconds()  # type: ignore[attr-defined]  # a Site has a reactor; the stubs do not say so
        super().process()


def go_site(resource: Any, reactor: Any = None, access_log: GoAccessLog | None = None) -> Any:
    """A quiet Site on ``reactor`` writing Go's access lines (see :class:`GoAccessLog`)."""
    site: Any = _GoLoggingSite(resource, requestFactory=_TimedRequest, reactor=reactor)
    site.go_access_log = access_log
    site.noisy = False
    site.displayTracebacks = False
    return site


def limited_site(resource: Any, body_limit: Any, reactor: Any = None,
                 access_log: GoAccessLog | None = None) -> Any:
    """A quiet Site whose requests refuse oversized bodies early (see LimitedRequest) and
    which writes Go's access lines."""
    site: Any = _GoLoggingSite(resource, requestFactory=_TimedLimitedRequest, reactor=reactor)
    site.protocol = GuardedHTTPChannel
    site.body_limit = body_limit
    site.go_access_log = access_log
    site.noisy = False
    site.displayTracebacks = False
    return site
