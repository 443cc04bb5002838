"""
One HTTP client for NSQ's JSON APIs: nsqd's and nsqlookupd's HTTP endpoints and auth servers.

:class:`Upstream` makes a call the way NSQ's Go HTTP clients do: NSQ's
``Accept: application/vnd.nsq; version=1.0`` header (so nsqd and nsqlookupd
answer with their V1 documents), an optional ``User-Agent``, and a deadline
covering the whole call, answer body included (Go's ``http.Client.Timeout``),
on the injected clock, so tests drive it with a ``task.Clock``.  The HTTP
client under it is any treq-compatible object (``treq`` itself, a
``treq.client.HTTPClient`` over an agent with its own connect timeout and
pool, or ``treq.testing.StubTreq``).

:meth:`Upstream.request` answers every status with an :class:`UpstreamResponse`;
:meth:`Upstream.fetch` wants a 200 and raises :class:`UpstreamStatusError`
otherwise (optionally retrying a 403 that names an ``https_port`` over HTTPS,
as nsqd's and nsqadmin's clients do); :meth:`Upstream.get_json` decodes it.
Callers keep their own error texts: the exception carries the status, the
reason phrase and the body.
"""

from __future__ import annotations

import json
from typing import Any
from collections.abc import Mapping

import attr
from twisted.internet import defer

__all__ = ["NSQ_ACCEPT", "Upstream", "UpstreamResponse", "UpstreamStatusError", "https_retry_url"]

#: the Accept header that makes nsqd and nsqlookupd answer with their V1 documents
NSQ_ACCEPT = b"application/vnd.nsq; version=1.0"


@attr.s(frozen=True, slots=True, auto_attribs=True)
class UpstreamResponse:
    """One answer: status, reason phrase, headers (Twisted's ``Headers``) and the whole body."""

    url: str
    code: int
    phrase: bytes
    headers: Any
    body: bytes

    def header(self, name: bytes) -> list[bytes]:
        """The raw values of one header (none: an empty list)."""
        values = self.headers.getRawHeaders(name) if self.headers is not None else None
        return list(values or [])


class UpstreamStatusError(Exception):
    """An answer other than 200 (from :meth:`Upstream.fetch`)."""

    def __init__(self, method: str, response: UpstreamResponse) -> None:
        self.method = method
        self.response = response
        self.code = response.code
        super().__init__(f'{method} "{response.url}": got response {response.code} '
                         f'{response.phrase.decode("latin-1")} '
                         f'{json.dumps(response.body.decode("utf-8", "replace"))}')


def https_retry_url(url: str, body: bytes) -> str | None:
    """The HTTPS URL a plain-HTTP 403 names (``{"https_port": N}``, nsqd's --tls-required),
    or None when it names none."""
    if not url.startswith("http://"):
        return None
    try:
        port = json.loads(body).get("https_port")
    except (ValueError, AttributeError):
        return None
    if not isinstance(port, int) or isinstance(port, bool) or port <= 0:
        return None
    rest = url[len("http://"):]
    hostport, slash, tail = rest.partition("/")
    host = hostport.rsplit(":", 1)[0] if not hostport.endswith("]") else hostport
    return f"https://{host}:{port}{slash}{tail}"


def _timed_out(result: Any, timeout: float) -> Any:
    # the deadline cancelled the call: treq then fails with ResponseNeverReceived (or whatever the
    # connection was doing), which would hide that the server simply did not answer in time
    from twisted.python.failure import Failure

    if isinstance(result, Failure):
        raise defer.TimeoutError(timeout, "Deferred")
    return result


class Upstream:
    """Calls to NSQ's HTTP APIs through ``http_client`` (treq when None), each within
    ``request_timeout`` seconds on ``clock`` (no deadline when it is 0 or there is no clock)."""

    def __init__(self, clock: Any, request_timeout: float, *, http_client: Any = None,
                 user_agent: str | None = None, accept: bytes | None = NSQ_ACCEPT) -> None:
        self.clock = clock
        self.request_timeout = request_timeout
        self.user_agent = user_agent
        self.accept = accept
        self._http = http_client

    @property
    def http_client(self) -> Any:
        if self._http is None:
            import treq
            self._http = treq
        return self._http

    def headers(self, extra: Mapping[bytes, bytes] | None = None) -> dict[bytes, list[bytes]]:
        """The request headers: NSQ's Accept, the User-Agent, then ``extra`` (which wins)."""
        out: dict[bytes, list[bytes]] = {}
        if self.accept is not None:
            out[b"Accept"] = [self.accept]
        if self.user_agent:
            out[b"User-Agent"] = [self.user_agent.encode()]
        for k, v in (extra or {}).items():
            out[k] = [v]
        return out

    def request(self, method: str, url: str, *, body: bytes | None = None,
                headers: Mapping[bytes, bytes] | None = None) -> defer.Deferred[UpstreamResponse]:
        """One call; fires with the answer whatever its status, fails with the transport's error
        or :class:`twisted.internet.defer.TimeoutError` past the deadline."""
        client = self.http_client
        hdrs = self.headers(headers)
        d: defer.Deferred[Any]
        if method == "GET":
            d = client.get(url, headers=hdrs)
        elif method == "POST":
            d = client.post(url, data=body, headers=hdrs)
        else:
            d = client.request(method, url, data=body, headers=hdrs)

        def got(response: Any) -> defer.Deferred[UpstreamResponse]:
            import treq

            content: defer.Deferred[bytes] = treq.content(response)
            return content.addCallback(
                lambda data: UpstreamResponse(url, int(response.code), getattr(response, "phrase", b"") or b"",
                                              getattr(response, "headers", None), data))

        result: defer.Deferred[UpstreamResponse] = d.addCallback(got)
        if self.request_timeout and self.request_timeout > 0 and self.clock is not None:
            result.addTimeout(self.request_timeout, self.clock, onTimeoutCancel=_timed_out)
        return result

    def fetch(self, method: str, url: str, *, body: bytes | None = None,
              headers: Mapping[bytes, bytes] | None = None, https_retry: bool = False) -> defer.Deferred[bytes]:
        """The body of a 200 answer; :class:`UpstreamStatusError` for any other status.  With
        ``https_retry``, a 403 naming an ``https_port`` is asked again over HTTPS."""

        def check(response: UpstreamResponse) -> Any:
            if response.code == 403 and https_retry:
                https = https_retry_url(url, response.body)
                if https is not None:
                    return self.fetch(method, https, body=body, headers=headers)
            if response.code != 200:
                raise UpstreamStatusError(method, response)
            return response.body

        return self.request(method, url, body=body, headers=headers).addCallback(check)

    def get_json(self, url: str, *, https_retry: bool = False) -> defer.Deferred[Any]:
        """``GET url`` and decode its JSON; ValueError if the body is not JSON."""
        def decode(body: bytes) -> Any:
            return json.loads(body)

        return self.fetch("GET", url, https_retry=https_retry).addCallback(decode)
