#!/usr/bin/env python
"""
A small reference NSQ auth server (klein) that reads its grants from a JSON file.

Point nsqd at it with ``--auth-http-address=127.0.0.1:4181``; clients then send
``AUTH <secret>`` and get the permissions the file grants that secret::

    {
      "secrets": {
        "s3cret": {
          "identity": "billing-service",
          "identity_url": "https://example.com/billing",
          "ttl": 3600,
          "require_tls": false,
          "authorizations": [
            {"topic": "^orders$", "channels": ["^billing$"], "permissions": ["subscribe"]},
            {"topic": "^orders$", "channels": [".*"], "permissions": ["publish"]}
          ]
        }
      }
    }

It answers nsqd's GET (``?secret=&remote_ip=&tls=&common_name=``) and POST
(a JSON object of arrays) requests.  An unknown secret, or a ``require_tls``
grant asked for over plain TCP, gets no authorizations, which nsqd reports as
``E_UNAUTHORIZED AUTH no authorizations found``.  The file is re-read when it
changes, so grants can be edited while it runs.

    python examples/auth_server.py --grants grants.json --http-address 127.0.0.1:4181
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from klein import Klein

__all__ = ["AuthServer"]


class AuthServer:
    app = Klein()

    def __init__(self, grants_path: str) -> None:
        self.grants_path = grants_path
        self._mtime = -1.0
        self._secrets: dict[str, Any] = {}
        self.requests: list[dict[str, str]] = []

    def _grants(self) -> dict[str, Any]:
        mtime = os.stat(self.grants_path).st_mtime
        if mtime != self._mtime:
            with open(self.grants_path, "rb") as f:
                self._secrets = json.load(f).get("secrets", {})
            self._mtime = mtime
        return self._secrets

    @app.route("/auth", methods=["GET", "POST"])
    def auth(self, request: Any) -> bytes:
        if request.method == b"POST":
            body = json.loads(request.content.read() or b"{}")
            values = {k: (v[0] if isinstance(v, list) and v else "") for k, v in body.items()}
        else:
            values = {k.decode(): v[0].decode() for k, v in request.args.items()}
        self.requests.append(values)
        grant = self._grants().get(values.get("secret", ""))
        request.setHeader(b"Content-Type", b"application/json")
        if grant is None or (grant.get("require_tls") and values.get("tls") != "true"):
            return json.dumps({"ttl": 60, "identity": "", "identity_url": "", "authorizations": []}).encode()
        return json.dumps({
            "ttl": int(grant.get("ttl", 3600)),
            "identity": grant.get("identity", ""),
            "identity_url": grant.get("identity_url", ""),
            "authorizations": grant.get("authorizations", []),
        }).encode()


def main(argv: list[str] = None) -> int:
    parser = argparse.ArgumentParser(description="reference NSQ auth server")
    parser.add_argument("--grants", required=True, help="JSON file of secrets and their authorizations")
    parser.add_argument("--http-address", default="127.0.0.1:4181")
    args = parser.parse_args(argv)
    from twisted.internet import endpoints, reactor
    from twisted.web.server import Site

    host, port = args.http_address.rsplit(":", 1)
    server = AuthServer(args.grants)
    endpoints.TCP4ServerEndpoint(reactor, int(port), interface=host).listen(Site(server.app.resource()))
    print(f"auth server on http://{args.http_address}/auth, grants from {args.grants}", file=sys.stderr)
    reactor.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
