"""
Publishing over nsqd's HTTP API, for hosts that only reach port 4151.

:class:`HTTPProducer` posts to ``/pub`` (``defer`` in ms for a deferred
publish) and ``/mpub`` (binary by default, ``[4-byte count]([4-byte
size][body])*``; or newline-separated text, which forbids ``\\n`` in
bodies).  Errors come back as :class:`nsqtw.errors.HTTPAPIError` with nsqd's
status and text (``400 INVALID_TOPIC``, ``413 MSG_TOO_BIG`` ...).  The HTTP
client is any treq-compatible object (``treq.testing.StubTreq`` in tests).
"""

from __future__ import annotations

import json
import struct
from typing import Any
from collections.abc import Iterable
from urllib.parse import urlencode

from twisted.internet import defer

from ..errors import HTTPAPIError
from ..runtime.reactor import ListeningReactor, TreqClient, resolve_reactor
from ..runtime.upstream import Upstream, UpstreamResponse
from .commands import Body, ms, to_bytes

__all__ = ["HTTPProducer"]

_I32 = struct.Struct(">i").pack


class HTTPProducer:
    """``/pub`` and ``/mpub`` on one nsqd HTTP address (``host:port`` or a URL)."""

    def __init__(self, address: str, *, http_client: TreqClient = None, reactor: ListeningReactor = None,
                 timeout: float = 60.0) -> None:
        base = address if "://" in address else "http://" + address
        self.base_url = base.rstrip("/")
        self.timeout = timeout
        self._reactor = reactor
        self._http_client = http_client

    def _http(self) -> Any:
        if self._http_client is None:
            from treq.client import HTTPClient
            from twisted.web.client import Agent, HTTPConnectionPool
            reactor = resolve_reactor(self._reactor)
            self._http_client = HTTPClient(Agent(reactor, pool=HTTPConnectionPool(reactor)))
        return self._http_client

    def publish(self, topic: str, body: Body) -> defer.Deferred[None]:
        """POST one message to ``/pub?topic=``; fires once nsqd answered ``OK``, fails with the HTTP
        error otherwise."""
        return self._post("/pub", {"topic": topic}, to_bytes(body))

    def deferred_publish(self, topic: str, delay: float, body: Body) -> defer.Deferred[None]:
        """``/pub?defer=<ms>``: delivered after ``delay`` seconds."""
        return self._post("/pub", {"topic": topic, "defer": str(ms(delay))}, to_bytes(body))

    def multi_publish(self, topic: str, bodies: Iterable[Body], binary: bool = True) -> defer.Deferred[None]:
        """POST a batch to ``/mpub?topic=`` (binary framing by default; ``binary=False`` sends one
        message a line, which bodies containing a newline cannot use)."""
        data = [to_bytes(b) for b in bodies]
        if binary:
            payload = _I32(len(data)) + b"".join(_I32(len(b)) + b for b in data)
            return self._post("/mpub", {"topic": topic, "binary": "true"}, payload)
        for b in data:
            if b"\n" in b:
                return defer.fail(ValueError("newline mode cannot carry a body containing '\\n'; use binary=True"))
        return self._post("/mpub", {"topic": topic}, b"\n".join(data))

    def ping(self) -> defer.Deferred[None]:
        """``GET /ping``: fires with None when nsqd is healthy."""
        return self._request("GET", "/ping", None, None)

    def _post(self, path: str, params: dict[str, Any], body: bytes) -> defer.Deferred[None]:
        return self._request("POST", path, params, body)

    def _request(self, method: str, path: str, params: dict[str, Any] | None,
                 body: bytes | None) -> defer.Deferred[None]:
        url = self.base_url + path
        if params:
            url += "?" + urlencode(params)
        timeout = self.timeout if self.timeout and self.timeout > 0 else 0.0
        # nsqd's plain answers ("OK"): no NSQ Accept header, as before
        upstream = Upstream(resolve_reactor(self._reactor) if timeout else None, timeout,
                            http_client=self._http(), accept=None)
        headers = {b"Content-Type": b"application/octet-stream"} if method == "POST" else None

        def check(response: UpstreamResponse) -> None:
            if response.code == 200:
                return None
            data = response.body
            text = data.decode("utf-8", "replace").strip()
            try:
                doc = json.loads(data)
                if isinstance(doc, dict) and isinstance(doc.get("message"), str):
                    text = doc["message"]
                elif isinstance(doc, dict) and isinstance(doc.get("status_txt"), str):
                    text = doc["status_txt"]
            except ValueError:
                pass
            raise HTTPAPIError(response.code, text)

        return upstream.request(method, url, body=body, headers=headers).addCallback(check)
