"""Helpers shared by the nsqadmin tests (imported by module name; tests/ has no packages)."""

from __future__ import annotations

import json
from typing import Any

import treq
from twisted.internet import defer

#: the longest any end-to-end wait may take before the test fails
TIMEOUT = 10.0


def within(d: Any, seconds: float = TIMEOUT) -> defer.Deferred:
    """``d`` (a Deferred or coroutine), failing with TimeoutError if not done in ``seconds`` (real time)."""
    from twisted.internet import reactor

    return defer.ensureDeferred(d).addTimeout(seconds, reactor)


async def call(method: str, url: str, body: Any = None, headers: dict[str, str] | None = None,
               raw: bytes | None = None) -> tuple[int, Any, Any]:
    """(status, parsed JSON or text, response headers) of one request."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    hdrs = {k.encode(): [v.encode()] for k, v in (headers or {}).items()}
    response = await within(defer.ensureDeferred(
        treq.request(method, url, data=data, headers=hdrs, persistent=False)))
    content = await within(defer.ensureDeferred(response.content()))
    ctype = response.headers.getRawHeaders(b"content-type", [b""])[0]
    if ctype.startswith(b"application/json"):
        return response.code, json.loads(content), response.headers
    return response.code, content.decode("utf-8", "replace"), response.headers


async def nsqd_stats(nsqd: Any) -> dict[str, Any]:
    """An nsqd's /stats document (through its public HTTP API)."""
    code, doc, _ = await call("GET", f"http://{nsqd.http_address}/stats?format=json")
    assert code == 200, doc
    return doc


def find_topic(stats: dict[str, Any], topic: str) -> dict[str, Any] | None:
    return next((t for t in stats.get("topics") or [] if t["topic_name"] == topic), None)


def find_channel(stats: dict[str, Any], topic: str, channel: str) -> dict[str, Any] | None:
    t = find_topic(stats, topic)
    if t is None:
        return None
    return next((c for c in t.get("channels") or [] if c["channel_name"] == channel), None)


async def publish(nsqd: Any, topic: str, bodies: list[bytes]) -> None:
    """Publish through nsqd's HTTP /mpub (public API, works for any nsqd)."""
    code, text, _ = await call("POST", f"http://{nsqd.http_address}/mpub?topic={topic}", raw=b"\n".join(bodies))
    assert code == 200, text


async def create_channel(nsqd: Any, topic: str, channel: str) -> None:
    """Create a topic and channel on an nsqd through its HTTP API (nsqd wants the topic first)."""
    for path in (f"/topic/create?topic={topic}", f"/channel/create?topic={topic}&channel={channel}"):
        code, text, _ = await call("POST", f"http://{nsqd.http_address}{path}")
        assert code == 200, text


async def attach_lookupd(nsqd: Any, lookupd: Any) -> Any:
    """Make an embedded nsqd register with ``lookupd`` (unless its service already does)."""
    from nsqtw.nsqd.lookup_peers import LookupPeersService

    peers = nsqd._service.namedServices.get(LookupPeersService.name)
    if peers is None:
        peers = LookupPeersService(nsqd._service)
        peers.setServiceParent(nsqd._service)
    await within(peers.peers[lookupd.tcp_address].when_registered())
    return peers


async def registered(peers: Any) -> None:
    """Every REGISTER/UNREGISTER the nsqd sent so far has been answered by every lookupd."""
    from nsqtw.lookupd.core.v1 import PING_COMMAND

    for peer in peers.peers.values():
        d = peer.command(PING_COMMAND)
        assert d is not None, f"{peer} is not identified"
        assert await within(d) == b"OK"
