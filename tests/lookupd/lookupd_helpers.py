"""Helpers shared by the nsqlookupd tests (imported by module name; tests/ has no packages)."""

from __future__ import annotations

import json
from collections import deque
from typing import Any

import attr
import treq
from twisted.internet import defer
from twisted.internet.protocol import Protocol

from nsqtw.lookupd.core.v1 import PING_COMMAND, ResponseDecoder, identify_command
from nsqtw.protocol.frames import MAGIC_V1

#: the longest any end-to-end wait may take before the test fails
TIMEOUT = 10.0


@attr.s(auto_attribs=True)
class FakeServer:
    """What an IDENTIFY answer reports, for sessions built without a service."""

    tcp_port: int | None = 4160
    http_port: int | None = 4161
    broadcast_address: str = "lookupd.example"
    hostname: str = "lookupd-host"


def within(d: defer.Deferred, seconds: float = TIMEOUT) -> defer.Deferred:
    """``d``, failing with TimeoutError if it has not fired in ``seconds`` (real time)."""
    from twisted.internet import reactor

    return d.addTimeout(seconds, reactor)


async def get(address: str, path: str, method: str = "GET", data: bytes | None = None) -> tuple[int, Any, Any]:
    """(status, parsed JSON or text, headers) of one request to ``http://address/path``."""
    response = await within(treq.request(method, f"http://{address}{path}", data=data, persistent=False))
    body = await within(response.content())
    ctype = response.headers.getRawHeaders(b"content-type", [b""])[0]
    if ctype.startswith(b"application/json"):
        return response.code, json.loads(body), response.headers
    return response.code, body.decode(), response.headers


async def post(address: str, path: str) -> tuple[int, Any, Any]:
    return await get(address, path, method="POST")


async def barrier(peer: Any) -> None:
    """Every command the peer sent so far has been answered (answers come in order)."""
    d = peer.command(PING_COMMAND)
    assert d is not None, f"{peer} is not identified"
    assert await within(d) == b"OK"


class RawV1Client(Protocol):
    """A bare protocol V1 connection: write bytes, await size-prefixed answers and the close."""

    def __init__(self, send_magic: bool = True) -> None:
        self.send_magic = send_magic
        self._decoder = ResponseDecoder(1 << 24)
        self._answers: deque[bytes] = deque()
        self._waiters: deque[defer.Deferred] = deque()
        self.closed: defer.Deferred = defer.Deferred()

    def connectionMade(self) -> None:
        if self.send_magic:
            self.transport.write(MAGIC_V1)

    def dataReceived(self, data: bytes) -> None:
        for body in self._decoder.feed(data):
            if self._waiters:
                self._waiters.popleft().callback(body)
            else:
                self._answers.append(body)

    def connectionLost(self, reason: Any = None) -> None:
        waiters, self._waiters = self._waiters, deque()
        for d in waiters:
            d.errback(reason)
        self.closed.callback(None)

    def send(self, data: bytes) -> None:
        self.transport.write(data)

    def response(self) -> defer.Deferred:
        """The next answer."""
        if self._answers:
            return defer.succeed(self._answers.popleft())
        d: defer.Deferred = defer.Deferred()
        self._waiters.append(d)
        return within(d)

    async def command(self, data: bytes) -> bytes:
        self.send(data)
        return await self.response()

    async def close(self) -> None:
        self.transport.loseConnection()
        await within(self.closed)


async def connect_v1(port: int, send_magic: bool = True) -> RawV1Client:
    from twisted.internet import reactor
    from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol

    client = RawV1Client(send_magic)
    await within(connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", port), client))
    return client


async def identified_v1(port: int, **fields: Any) -> tuple[RawV1Client, dict[str, Any]]:
    """A V1 connection that has IDENTIFYed as an nsqd (fields override the defaults)."""
    body = {"broadcast_address": "127.0.0.1", "tcp_port": 4150, "http_port": 4151, "version": "1.3.0",
            "hostname": "nsqd-host"}
    body.update(fields)
    client = await connect_v1(port)
    answer = json.loads(await client.command(identify_command(body)))
    return client, answer
