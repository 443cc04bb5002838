"""
Asking NSQ auth servers (``--auth-http-address``) with treq.

The servers are tried from a random starting point, each in turn, until one
answers; errors are collected into one message that is logged (the client
only ever hears ``E_AUTH_FAILED AUTH failed``).  GET sends the query
``common_name, remote_ip, secret, tls`` with sorted keys, as Go's
``url.Values.Encode``; ``--auth-http-request-method=post`` sends the same
values as a JSON object of arrays.  A 403 carrying an ``https_port`` is
retried over HTTPS, as nsqd's HTTP client does.
"""

from __future__ import annotations

import json
import random
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit


from .core.auth import AuthState, parse_auth_response
from ..runtime.upstream import Upstream

__all__ = ["AuthServerClient", "auth_endpoint"]


def auth_endpoint(address: str) -> str:
    return address if "://" in address else f"http://{address}/auth"


class AuthServerClient:
    """Queries the configured auth servers for one broker."""

    def __init__(self, addresses: list[str], method: str, reactor: Any, *, connect_timeout: float,
                 request_timeout: float, rng: random.Random | None = None, http_client: Any = None) -> None:
        self.endpoints = [auth_endpoint(a) for a in addresses]
        self.method = method.lower()
        self.reactor = reactor
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.rng = rng or random.Random()
        self._http = http_client

    def _client(self) -> Any:
        if self._http is None:
            import treq
            self._http = treq
        return self._http

    async def query(self, secret: bytes, remote_ip: str, tls: bool, common_name: str) -> AuthState:
        values = {"common_name": common_name, "remote_ip": remote_ip,
                  "secret": secret.decode("utf-8", "surrogateescape"), "tls": "true" if tls else "false"}
        n = len(self.endpoints)
        start = self.rng.randrange(n)
        errors: list[str] = []
        for i in range(n):
            endpoint = self.endpoints[(start + i) % n]
            try:
                body = await self._fetch(endpoint, values)
                return parse_auth_response(body, secret, self.reactor.seconds())
            except Exception as e:
                errors.append(f"failed to auth against {endpoint} - {e}")
        raise RuntimeError("; ".join(errors))

    async def _fetch(self, endpoint: str, values: dict[str, str]) -> bytes:
        upstream = Upstream(self.reactor, self.request_timeout, http_client=self._client())
        for _ in range(2):
            if self.method == "post":
                response = await upstream.request(
                    "POST", endpoint, body=json.dumps({k: [v] for k, v in sorted(values.items())}).encode(),
                    headers={b"Content-Type": b"application/json"})
            else:
                sep = "&" if "?" in endpoint else "?"
                response = await upstream.request("GET", endpoint + sep + urlencode(sorted(values.items())))
            body = response.body
            if response.code == 403 and not endpoint.startswith("https"):
                try:
                    port = json.loads(body)["https_port"]
                except Exception:
                    raise RuntimeError(f"got response {response.code} {body!r}") from None
                parts = urlsplit(endpoint)
                endpoint = urlunsplit(("https", f"{parts.hostname}:{port}", parts.path, parts.query, ""))
                continue
            if response.code != 200:
                raise RuntimeError(f"got response {response.code} {body!r}")
            return body
        raise RuntimeError("too many redirects to https")
