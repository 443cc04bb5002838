"""nsqlookupd's HTTP API against a live in-process nsqlookupd (treq over loopback).

Registrations come from raw protocol V1 connections, so these tests check
nsqlookupd alone; time is a ``task.Clock`` wherever activity or tombstones matter.
"""

from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet.task import Clock

from lookupd_helpers import connect_v1, get, identified_v1, post, within
from nsqtw.lookupd.core.peers import GO_ZERO_TIME_NS
from nsqtw.lookupd.core.v1 import PING_COMMAND, register_command

pytestmark = pytest.mark.e2e


@pytest_twisted.async_yield_fixture
async def clocked():
    """(lookupd, clock): an nsqlookupd whose time is a task.Clock starting at 1000 s."""
    from nsqtw.embed import start_nsqlookupd

    clock = Clock()
    clock.advance(1000)
    handle = await start_nsqlookupd(clock=clock, tombstone_lifetime=45.0, inactive_producer_timeout=300.0)
    yield handle, clock
    await handle.stop()


# --- plain reads -----------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_ping_is_plain_ok(lookupd) -> None:
    """GET /ping answers the text OK without the V1 header."""
    code, body, headers = await get(lookupd.http_address, "/ping")
    assert (code, body) == (200, "OK")
    assert not headers.hasHeader(b"x-nsq-content-type")


@pytest_twisted.ensureDeferred
async def test_info_reports_the_version(lookupd) -> None:
    """GET /info is {"version": "1.3.0"} in the V1 envelope."""
    code, body, headers = await get(lookupd.http_address, "/info")
    assert (code, body) == (200, {"version": "1.3.0"})
    assert headers.getRawHeaders(b"x-nsq-content-type") == [b"nsq; version=1.0"]
    assert headers.getRawHeaders(b"content-type") == [b"application/json; charset=utf-8"]


@pytest_twisted.ensureDeferred
async def test_empty_lookupd_listings(lookupd) -> None:
    """With nothing registered: empty lists (never null) and an empty /debug object."""
    addr = lookupd.http_address
    assert (await get(addr, "/topics"))[:2] == (200, {"topics": []})
    assert (await get(addr, "/channels?topic=t"))[:2] == (200, {"channels": []})
    assert (await get(addr, "/nodes"))[:2] == (200, {"producers": []})
    assert (await get(addr, "/debug"))[:2] == (200, {})


@pytest.mark.parametrize("path, status, message", [
    ("/lookup", 400, "MISSING_ARG_TOPIC"),
    ("/lookup?topic=unknown", 404, "TOPIC_NOT_FOUND"),
    ("/channels", 400, "MISSING_ARG_TOPIC"),
    ("/lookup?topic=%zz", 400, "INVALID_REQUEST"),
    ("/lookup?topic=a;b", 400, "INVALID_REQUEST"),
    ("/nope", 404, "NOT_FOUND"),
    ("/topic/create?topic=t", 405, "METHOD_NOT_ALLOWED"),
])
@pytest_twisted.ensureDeferred
async def test_read_errors(lookupd, path, status, message) -> None:
    """Reads fail with nsqlookupd's statuses and {"message": TEXT} bodies."""
    code, body, headers = await get(lookupd.http_address, path)
    assert (code, body) == (status, {"message": message})
    assert headers.getRawHeaders(b"x-nsq-content-type") == [b"nsq; version=1.0"]


# --- writes ------------------------------------------------------------------------


@pytest.mark.parametrize("path, status, message", [
    ("/topic/create", 400, "MISSING_ARG_TOPIC"),
    ("/topic/create?topic=bad!", 400, "INVALID_ARG_TOPIC"),
    ("/topic/delete", 400, "MISSING_ARG_TOPIC"),
    ("/channel/create", 400, "MISSING_ARG_TOPIC"),
    ("/channel/create?topic=bad!&channel=c", 400, "INVALID_ARG_TOPIC"),
    ("/channel/create?topic=t", 400, "MISSING_ARG_CHANNEL"),
    ("/channel/create?topic=t&channel=bad!", 400, "INVALID_ARG_CHANNEL"),
    ("/channel/delete?topic=t", 400, "MISSING_ARG_CHANNEL"),
    ("/channel/delete?topic=t&channel=c", 404, "CHANNEL_NOT_FOUND"),
    ("/topic/tombstone", 400, "MISSING_ARG_TOPIC"),
    ("/topic/tombstone?topic=t", 400, "MISSING_ARG_NODE"),
    ("/lookup?topic=t", 405, "METHOD_NOT_ALLOWED"),
])
@pytest_twisted.ensureDeferred
async def test_write_errors(lookupd, path, status, message) -> None:
    """POST endpoints refuse bad arguments with nsqlookupd's texts."""
    assert (await post(lookupd.http_address, path))[:2] == (status, {"message": message})


@pytest_twisted.ensureDeferred
async def test_topic_and_channel_create_and_delete(lookupd) -> None:
    """create/delete change /topics, /channels and /lookup; successes have an empty body."""
    addr = lookupd.http_address
    assert (await post(addr, "/topic/create?topic=t1"))[:2] == (200, "")
    assert (await post(addr, "/channel/create?topic=t2&channel=c"))[:2] == (200, "")
    assert (await get(addr, "/topics"))[1] == {"topics": ["t1", "t2"]}
    assert (await get(addr, "/channels?topic=t2"))[1] == {"channels": ["c"]}
    # a registered topic without producers is found, with an empty producer list
    assert (await get(addr, "/lookup?topic=t2"))[:2] == (200, {"channels": ["c"], "producers": []})
    assert (await post(addr, "/channel/delete?topic=t2&channel=c"))[0] == 200
    assert (await get(addr, "/channels?topic=t2"))[1] == {"channels": []}
    assert (await post(addr, "/topic/delete?topic=t1"))[0] == 200
    assert (await post(addr, "/topic/delete?topic=never-existed"))[0] == 200
    assert (await get(addr, "/topics"))[1] == {"topics": ["t2"]}
    assert (await get(addr, "/lookup?topic=t1"))[:2] == (404, {"message": "TOPIC_NOT_FOUND"})


@pytest_twisted.ensureDeferred
async def test_topic_delete_drops_registrations_with_producers(lookupd) -> None:
    """/topic/delete removes the topic and its channels even while an nsqd produces them."""
    client, _ = await identified_v1(lookupd.tcp_port)
    assert await client.command(register_command("t", "c")) == b"OK"
    assert (await post(lookupd.http_address, "/topic/delete?topic=t"))[0] == 200
    assert (await get(lookupd.http_address, "/topics"))[1] == {"topics": []}
    assert (await get(lookupd.http_address, "/lookup?topic=t"))[0] == 404
    await client.close()


# --- registrations over TCP, seen over HTTP ---------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_identify_answer_over_tcp(lookupd) -> None:
    """IDENTIFY over a real socket answers this lookupd's bound ports and broadcast address."""
    client, answer = await identified_v1(lookupd.tcp_port)
    assert answer["tcp_port"] == lookupd.tcp_port and answer["http_port"] == lookupd.http_port
    assert answer["broadcast_address"] == "127.0.0.1" and answer["version"] == "1.3.0"
    assert sorted(answer) == ["broadcast_address", "hostname", "http_port", "tcp_port", "version"]
    await client.close()


@pytest_twisted.ensureDeferred
async def test_bad_magic_over_tcp(lookupd) -> None:
    """A client speaking V2 to nsqlookupd gets size-prefixed E_BAD_PROTOCOL and is disconnected."""
    client = await connect_v1(lookupd.tcp_port, send_magic=False)
    client.send(b"  V2")
    assert await client.response() == b"E_BAD_PROTOCOL"
    await within(client.closed)


@pytest_twisted.ensureDeferred
async def test_lookup_nodes_and_debug_shapes(clocked) -> None:
    """/lookup, /nodes and /debug have NSQ's keys, in Go's order, with nanosecond times."""
    lookupd, clock = clocked
    client, _ = await identified_v1(lookupd.tcp_port, broadcast_address="nsqd1", tcp_port=5150,
                                    http_port=5151, hostname="h1")
    for cmd in (register_command("t", "c1"), register_command("t", "c2"), register_command("u")):
        assert await client.command(cmd) == b"OK"
    code, body, _ = await get(lookupd.http_address, "/lookup?topic=t")
    assert code == 200 and list(body) == ["channels", "producers"]
    assert sorted(body["channels"]) == ["c1", "c2"]
    (producer,) = body["producers"]
    assert list(producer) == ["remote_address", "hostname", "broadcast_address", "tcp_port", "http_port",
                              "version", "topology_zone", "topology_region"]
    assert producer["remote_address"].startswith("127.0.0.1:")
    assert (producer["hostname"], producer["broadcast_address"], producer["tcp_port"],
            producer["http_port"], producer["version"]) == ("h1", "nsqd1", 5150, 5151, "1.3.0")

    (node,) = (await get(lookupd.http_address, "/nodes"))[1]["producers"]
    assert list(node) == list(producer) + ["tombstones", "topics"]
    assert sorted(zip(node["topics"], node["tombstones"], strict=True)) == [("t", False), ("u", False)]

    debug = (await get(lookupd.http_address, "/debug"))[1]
    assert sorted(debug) == ["channel:t:c1", "channel:t:c2", "client::", "topic:t:", "topic:u:"]
    (entry,) = debug["client::"]
    assert list(entry) == sorted(entry)
    assert entry["id"] == producer["remote_address"]
    assert entry["last_update"] == 1000 * 10**9
    assert entry["tombstoned"] is False and entry["tombstoned_at"] == GO_ZERO_TIME_NS
    await client.close()


@pytest_twisted.ensureDeferred
async def test_tombstone_hides_a_producer_for_its_lifetime(clocked) -> None:
    """A tombstoned producer leaves /lookup for --tombstone-lifetime; /nodes keeps it, flagged."""
    lookupd, clock = clocked
    c1, _ = await identified_v1(lookupd.tcp_port, broadcast_address="nsqd1", http_port=4151)
    c2, _ = await identified_v1(lookupd.tcp_port, broadcast_address="nsqd2", http_port=4151)
    for c in (c1, c2):
        assert await c.command(register_command("t")) == b"OK"
    assert (await post(lookupd.http_address, "/topic/tombstone?topic=t&node=nsqd1:4151"))[:2] == (200, "")
    producers = (await get(lookupd.http_address, "/lookup?topic=t"))[1]["producers"]
    assert [p["broadcast_address"] for p in producers] == ["nsqd2"]
    nodes = {n["broadcast_address"]: n["tombstones"] for n in (await get(lookupd.http_address, "/nodes"))[1]["producers"]}
    assert nodes == {"nsqd1": [True], "nsqd2": [False]}
    debug = (await get(lookupd.http_address, "/debug"))[1]["topic:t:"]
    tomb = [e for e in debug if e["broadcast_address"] == "nsqd1"][0]
    assert tomb["tombstoned"] is True and tomb["tombstoned_at"] == 1000 * 10**9

    clock.advance(44.9)
    assert len((await get(lookupd.http_address, "/lookup?topic=t"))[1]["producers"]) == 1
    clock.advance(0.1)
    producers = (await get(lookupd.http_address, "/lookup?topic=t"))[1]["producers"]
    assert sorted(p["broadcast_address"] for p in producers) == ["nsqd1", "nsqd2"]
    await c1.close()
    await c2.close()


@pytest_twisted.ensureDeferred
async def test_inactive_producers_are_hidden_until_they_ping(clocked) -> None:
    """After --inactive-producer-timeout without IDENTIFY or PING a producer is hidden from
    /lookup and /nodes; a PING brings it back."""
    lookupd, clock = clocked
    client, _ = await identified_v1(lookupd.tcp_port)
    assert await client.command(register_command("t")) == b"OK"
    clock.advance(300)
    assert len((await get(lookupd.http_address, "/lookup?topic=t"))[1]["producers"]) == 1
    clock.advance(1)
    assert (await get(lookupd.http_address, "/lookup?topic=t"))[1] == {"channels": [], "producers": []}
    assert (await get(lookupd.http_address, "/nodes"))[1] == {"producers": []}
    assert await client.command(PING_COMMAND) == b"OK"
    assert len((await get(lookupd.http_address, "/lookup?topic=t"))[1]["producers"]) == 1
    assert len((await get(lookupd.http_address, "/nodes"))[1]["producers"]) == 1
    await client.close()


@pytest_twisted.ensureDeferred
async def test_disconnect_removes_producers_but_keeps_keys(lookupd) -> None:
    """A closed nsqd connection leaves /lookup with no producers; topics and channels stay listed."""
    client, _ = await identified_v1(lookupd.tcp_port)
    assert await client.command(register_command("t", "c")) == b"OK"
    protocols = list(lookupd._service.tcp_factory.protocols)
    await client.close()
    for proto in protocols:
        await within(proto.closed)
    assert (await get(lookupd.http_address, "/lookup?topic=t"))[1] == {"channels": ["c"], "producers": []}
    assert (await get(lookupd.http_address, "/nodes"))[1] == {"producers": []}


@pytest_twisted.ensureDeferred
async def test_stop_closes_every_nsqd_connection(lookupd) -> None:
    """Stopping nsqlookupd closes its nsqd connections (they reconnect elsewhere)."""
    client, _ = await identified_v1(lookupd.tcp_port)
    await lookupd.stop()
    await within(client.closed)
    assert lookupd._db.find_producers("client", "", "") == []


async def _raw_get(address: str, path: str) -> tuple[int, dict[bytes, list[bytes]], bytes]:
    """Status, every header but Date (Content-Length included) and body, read off the socket."""
    import socket

    from twisted.internet import threads

    def fetch() -> bytes:
        host, port = address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n".encode())
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks)

    raw = await within(threads.deferToThread(fetch))
    head, _, body = raw.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    headers: dict[bytes, list[bytes]] = {}
    for line in lines:
        name, _, value = line.partition(b":")
        if name.lower() != b"date":
            headers.setdefault(name.lower(), []).append(value.strip())
    return int(status.split()[1]), headers, body


@pytest_twisted.ensureDeferred
async def test_lookup_answers_as_the_klein_route_does_without_it(lookupd, monkeypatch) -> None:
    """GET /lookup (what every consumer polls) skips klein's routing (issue 47): the same status,
    headers and body as the klein route gives, errors included; other paths go through klein."""
    from klein.resource import KleinResource

    client, _ = await identified_v1(lookupd.tcp_port)
    assert await client.command(register_command("t", "c")) == b"OK"
    through_klein: list[bytes] = []
    render = KleinResource.render

    def counting(self, request):
        through_klein.append(request.uri)
        return render(self, request)

    monkeypatch.setattr(KleinResource, "render", counting)
    paths = ["/lookup?topic=t", "/lookup?topic=unknown", "/lookup", "/lookup?topic=a;b"]
    fast = [await _raw_get(lookupd.http_address, p) for p in paths]
    assert through_klein == [b"/lookup?topic=unknown", b"/lookup", b"/lookup?topic=a;b"]  # the found topic: not
    code, headers, body = fast[0]
    assert code == 200 and headers[b"x-nsq-content-type"] == [b"nsq; version=1.0"]
    assert headers[b"content-length"] == [str(len(body)).encode()] and b'"producers":[{' in body
    from nsqtw.lookupd import http as lookupd_http

    monkeypatch.setattr(lookupd_http._LookupFirst, "render", lambda self, request: self.inner.render(request))
    slow = [await _raw_get(lookupd.http_address, p) for p in paths]
    assert slow == fast
    assert (await get(lookupd.http_address, "/topics"))[:2] == (200, {"topics": ["t"]})
