"""A raw ``#`` in an HTTP request target is part of it, as Go's servers read it
(``url.ParseRequestURI`` knows no fragment): ``GET /stats?format=json&topic=t#ephemeral`` answers
for topic ``t#ephemeral`` on nsqd, and the same holds on nsqlookupd and nsqadmin (issue 14 item 3).
HTTP libraries never send a raw ``#``, so these requests go over a plain socket."""

from __future__ import annotations

import json
from typing import Any

import pytest_twisted
from twisted.internet import defer, protocol, reactor
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol


class _Raw(protocol.Protocol):
    def __init__(self, request: bytes) -> None:
        self.request = request
        self.data = b""
        self.done: defer.Deferred = defer.Deferred()

    def connectionMade(self) -> None:
        self.transport.write(self.request)

    def dataReceived(self, data: bytes) -> None:
        self.data += data

    def connectionLost(self, reason: Any = None) -> None:
        self.done.callback(self.data)


async def raw_http(port: int, method: str, target: str) -> tuple[int, Any]:
    req = f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    proto = _Raw(req.encode("latin-1"))
    await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", port), proto)
    data = await proto.done
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if b"chunked" in head.lower():
        chunks, rest = [], body
        while rest:
            size, _, rest = rest.partition(b"\r\n")
            n = int(size, 16)
            if not n:
                break
            chunks.append(rest[:n])
            rest = rest[n + 2:]
        body = b"".join(chunks)
    try:
        return status, json.loads(body) if body else None
    except ValueError:
        return status, body


@pytest_twisted.ensureDeferred
async def test_nsqd_takes_a_raw_hash_as_part_of_the_query(nsqd: Any) -> None:
    port = nsqd.http_port
    assert (await raw_http(port, "POST", "/topic/create?topic=t#ephemeral"))[0] == 200
    assert (await raw_http(port, "POST", "/channel/create?topic=t#ephemeral&channel=c#ephemeral"))[0] == 200
    assert "t#ephemeral" in nsqd._service.broker.topics
    code, doc = await raw_http(port, "GET", "/stats?format=json&topic=t#ephemeral")
    assert code == 200
    assert [t["topic_name"] for t in doc["topics"]] == ["t#ephemeral"]
    assert [c["channel_name"] for c in doc["topics"][0]["channels"]] == ["c#ephemeral"]
    code, _ = await raw_http(port, "POST", "/pub?topic=t#ephemeral")  # empty body: refused as nsqd does
    assert code == 400
    assert nsqd._service.broker.topics["t#ephemeral"].message_count == 0


@pytest_twisted.ensureDeferred
async def test_nsqlookupd_takes_a_raw_hash_as_part_of_the_query() -> None:
    from nsqtw.embed import start_nsqlookupd

    lookupd = await start_nsqlookupd()
    try:
        port = int(lookupd.http_address.rsplit(":", 1)[1])
        assert (await raw_http(port, "POST", "/topic/create?topic=x#ephemeral"))[0] == 200
        code, doc = await raw_http(port, "GET", "/topics")
        assert "x#ephemeral" in doc["topics"]
        assert (await raw_http(port, "POST", "/channel/create?topic=x#ephemeral&channel=y"))[0] == 200
        code, doc = await raw_http(port, "GET", "/channels?topic=x#ephemeral")
        assert code == 200 and doc["channels"] == ["y"]
    finally:
        await lookupd.stop()


@pytest_twisted.ensureDeferred
async def test_nsqadmin_takes_a_raw_hash_in_its_paths(nsqd: Any) -> None:
    from nsqtw.embed import start_nsqadmin

    await raw_http(nsqd.http_port, "POST", "/topic/create?topic=t#ephemeral")
    await raw_http(nsqd.http_port, "POST", "/channel/create?topic=t#ephemeral&channel=c")
    admin = await start_nsqadmin(nsqd_http_addresses=[nsqd.http_address])
    try:
        port = int(admin.url.rstrip("/").rsplit(":", 1)[1])
        code, doc = await raw_http(port, "GET", "/api/topics/t#ephemeral")
        assert code == 200 and doc["topic_name"] == "t#ephemeral"
        code, doc = await raw_http(port, "GET", "/api/topics/t#ephemeral/c")
        assert code == 200 and doc["channel_name"] == "c"
    finally:
        await admin.stop()
