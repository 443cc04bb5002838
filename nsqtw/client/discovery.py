"""
Finding the nsqd instances of a topic through nsqlookupd's ``/lookup``.

The pure parts (building the URL as go-nsq does, reading both the 1.x JSON
shape and the pre-1.0 ``{"status_code", "status_txt", "data"}`` wrapper) are
functions; :func:`query_lookupd` does one request through
:class:`nsqtw.runtime.upstream.Upstream` with any treq-compatible client (``treq``
itself, an ``HTTPClient``, ``treq.testing.StubTreq``) and a timeout on the
injected clock.
"""

from __future__ import annotations

import json
from typing import Any
from collections.abc import Mapping
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from twisted.internet import defer

from ..runtime.upstream import Upstream, UpstreamResponse
from .addresses import join_host_port
from .errors import ConfigError

__all__ = ["build_lookup_url", "parse_lookup_response", "query_lookupd", "LookupError_", "ACCEPT"]

#: what go-nsq (``apiRequestNegotiateV1``) sends
ACCEPT = "application/vnd.nsq; version=1.0"


class LookupError_(Exception):
    """A lookupd answer that cannot be used (HTTP error, not JSON, wrong shape)."""


def build_lookup_url(address: str, topic: str) -> str:
    """go-nsq ``buildLookupAddr``: scheme defaults to http, the path to ``/lookup``, adds ``topic``."""
    text = address if "://" in address else "http://" + address
    parts = urlsplit(text)
    try:
        port = parts.port
    except ValueError:
        raise ConfigError(f"lookupd address {address}: invalid port") from None
    if port is None:
        raise ConfigError(f"lookupd address {address}: missing port")
    path = parts.path if parts.path not in ("", "/") else "/lookup"
    query = parse_qsl(parts.query, keep_blank_values=True)
    query.append(("topic", topic))
    query.sort(key=lambda kv: kv[0])  # Go's url.Values.Encode sorts by key
    return urlunsplit((parts.scheme, parts.netloc, path, urlencode(query), parts.fragment))


def parse_lookup_response(body: bytes, v1: bool | None = None) -> list[str]:
    """The ``broadcast_address:tcp_port`` of every producer in a ``/lookup`` answer.

    ``v1`` is whether the answer carried ``X-NSQ-Content-Type: nsq; version=1.0``
    (then the JSON is the data itself); otherwise the pre-1.0 wrapper is
    unwrapped when present.  Either way the shape decides as a fallback, so a
    proxy that drops the header does no harm.
    """
    if not body.strip():
        body = b"{}"
    try:
        doc = json.loads(body)
    except ValueError as e:
        raise LookupError_(f"lookupd answered something that is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise LookupError_("lookupd answered JSON that is not an object")
    data: Any = doc
    if "producers" not in doc and isinstance(doc.get("data"), dict):
        data = doc["data"]  # the pre-1.0 {"status_code", "status_txt", "data"} wrapper
    producers = data.get("producers") or []
    if not isinstance(producers, list):
        raise LookupError_("lookupd answer: producers is not a list")
    out: list[str] = []
    for p in producers:
        if not isinstance(p, dict):
            continue
        host = p.get("broadcast_address")
        port = p.get("tcp_port")
        if not isinstance(host, str) or not host or not isinstance(port, int) or isinstance(port, bool):
            continue
        addr = join_host_port(host, port)
        if addr not in out:
            out.append(addr)
    return out


def query_lookupd(http_client: Any, url: str, *, headers: Mapping[str, str] | None = None,
                  timeout: float = 60.0, clock: Any = None) -> defer.Deferred[Any]:
    """GET ``url``; fires with the producer addresses, fails with the reason."""
    upstream = Upstream(clock, timeout, http_client=http_client, accept=ACCEPT.encode())
    extra = {k.encode(): v.encode() for k, v in (headers or {}).items()}

    def parse(response: UpstreamResponse) -> list[str]:
        if response.code != 200:
            raise LookupError_(f"got response {response.code} {response.body[:200]!r}")
        v1 = any(v.strip() == b"nsq; version=1.0" for v in response.header(b"X-NSQ-Content-Type"))
        return parse_lookup_response(response.body, v1)

    return upstream.request("GET", url, headers=extra).addCallback(parse)
