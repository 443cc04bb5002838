"""
Helpers for nsqd HTTP conformance tests: read the Go nsqd 1.3.0 ``curl -i`` fixtures, make raw HTTP/1.1
requests (so framing headers such as Content-Length and Transfer-Encoding are seen as sent), and compare
JSON documents by shape (key order and types, recursively) rather than by value.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from twisted.internet import defer, protocol, reactor
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol

FIXTURE_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "go-nsqd-1.3.0-http"


class HTTPExchange:
    """One HTTP response: status, reason, headers (name lower-cased -> list of values), body."""

    def __init__(self, status: int, reason: str, headers: list[tuple[str, str]], body: bytes) -> None:
        self.status = status
        self.reason = reason
        self.header_list = headers
        self.headers: dict[str, list[str]] = {}
        for k, v in headers:
            self.headers.setdefault(k.lower(), []).append(v)
        self.body = body

    def header(self, name: str) -> str | None:
        values = self.headers.get(name.lower())
        return values[0] if values else None

    def json(self) -> Any:
        return json.loads(self.body, object_pairs_hook=_Ordered)

    def __repr__(self) -> str:
        return f"<HTTPExchange {self.status} {self.header_list} {self.body[:200]!r}>"


class _Ordered(list):
    """JSON object kept as an ordered list of pairs, so key order can be compared."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        super().__init__(pairs)

    def keys(self) -> list[str]:
        return [k for k, _ in self]

    def get(self, key: str) -> Any:
        for k, v in self:
            if k == key:
                return v
        raise KeyError(key)


def parse_response(data: bytes) -> HTTPExchange:
    head, _, body = data.partition(b"\r\n\r\n") if b"\r\n\r\n" in data else data.partition(b"\n\n")
    lines = head.replace(b"\r\n", b"\n").split(b"\n")
    _, code, reason = lines[0].decode().split(" ", 2)
    headers = []
    for line in lines[1:]:
        k, _, v = line.decode("latin-1").partition(":")
        headers.append((k.strip(), v.strip()))
    ex = HTTPExchange(int(code), reason, headers, body)
    if (ex.header("transfer-encoding") or "").lower() == "chunked":
        ex.body = _dechunk(body)
    return ex


def _dechunk(data: bytes) -> bytes:
    out = []
    pos = 0
    while True:
        nl = data.index(b"\r\n", pos)
        n = int(data[pos:nl].split(b";")[0], 16)
        pos = nl + 2
        if n == 0:
            return b"".join(out)
        out.append(data[pos:pos + n])
        pos += n + 2


def fixture(name: str) -> HTTPExchange:
    return parse_response((FIXTURE_DIR / name).read_bytes())


class _Collect(protocol.Protocol):
    def __init__(self) -> None:
        self.data = b""
        self.done: defer.Deferred = defer.Deferred()

    def dataReceived(self, data: bytes) -> None:
        self.data += data

    def connectionLost(self, reason: Any = None) -> None:
        self.done.callback(self.data)


async def raw_http(port: int, method: str, path: str, body: bytes | None = None,
                   headers: dict[str, str] | None = None, timeout: float = 10.0) -> HTTPExchange:
    """One request on its own connection (Connection: close); the answer exactly as the server framed it."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close"]
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    for k, v in (headers or {}).items():
        lines.append(f"{k}: {v}")
    request = ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")
    proto = _Collect()
    await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", port), proto)
    proto.transport.write(request)
    d = proto.done
    d.addTimeout(timeout, reactor)
    return parse_response(await d)


def shape_diff(ours: Any, go: Any, path: str = "$") -> list[str]:
    """Differences in key order and JSON types between two parsed documents (values ignored).

    Lists are compared element by element against the Go document's first element; ``null`` in the Go
    document only matches ``null``.
    """
    problems: list[str] = []
    if isinstance(go, _Ordered):
        if not isinstance(ours, _Ordered):
            return [f"{path}: expected object, got {type(ours).__name__}"]
        if ours.keys() != go.keys():
            problems.append(f"{path}: keys {ours.keys()} != Go's {go.keys()}")
            return problems
        for (k, a), (_, b) in zip(ours, go, strict=True):
            problems += shape_diff(a, b, f"{path}.{k}")
        return problems
    if isinstance(go, list):
        if not isinstance(ours, list) or isinstance(ours, _Ordered):
            return [f"{path}: expected array, got {type(ours).__name__}"]
        if go:
            if not ours:
                return [f"{path}: empty array where Go had elements"]
            for i, item in enumerate(ours):
                problems += shape_diff(item, go[0], f"{path}[{i}]")
        return problems
    kind = _kind(go)
    if _kind(ours) != kind:
        problems.append(f"{path}: {_kind(ours)} {ours!r} where Go has {kind} {go!r}")
    return problems


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "float"
    if isinstance(v, str):
        return "string"
    if isinstance(v, _Ordered):
        return "object"
    if isinstance(v, list):
        return "array"
    return type(v).__name__
