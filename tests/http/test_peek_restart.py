"""Peek after a restart (issue 27 item 8) and /stats' ``oldest_message_ts`` (issue 27 item 5).

After a clean stop, deferred messages are stored on disk as ordinary records with a due time; after
the restart they wait among the queued records until the reader reaches them.  ``state=deferred``
must find them (and count them) as ``state=all`` does."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
import pytest_twisted
import treq

from nsqtw.embed import start_nsqd
from nsqtw.testing import connect_raw
from nsqtw.testing.raw import body_command, mpub_command


async def _get(nsqd: Any, path: str) -> Any:
    resp = await treq.get(f"http://127.0.0.1:{nsqd.http_port}{path}")
    assert resp.code == 200
    return json.loads(await resp.text())


async def _post(nsqd: Any, path: str) -> None:
    resp = await treq.post(f"http://127.0.0.1:{nsqd.http_port}{path}")
    await resp.content()
    assert resp.code == 200


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_deferred_messages_restored_from_disk_are_peeked_as_deferred(tmp_path: Any) -> None:
    data = str(tmp_path)
    nsqd = await start_nsqd(data_path=data, peek_enabled=True)
    await _post(nsqd, "/topic/create?topic=orders")
    await _post(nsqd, "/channel/create?topic=orders&channel=billing")
    pub = await connect_raw(nsqd.tcp_port)
    pub.send(mpub_command("orders", [b"m%d" % i for i in range(30)]))
    assert await pub.response() == b"OK"
    pub.send(body_command("DPUB", "orders", 3_600_000, body=b"later"))
    assert await pub.response() == b"OK"
    await pub.close()
    before = await _get(nsqd, "/channel/peek?topic=orders&channel=billing&state=deferred")
    assert [base64.b64decode(m["body"]) for m in before["messages"]] == [b"later"]
    await nsqd.stop()

    again = await start_nsqd(data_path=data, peek_enabled=True)
    try:
        answer = await _get(again, "/channel/peek?topic=orders&channel=billing&state=deferred")
        assert [base64.b64decode(m["body"]) for m in answer["messages"]] == [b"later"]
        assert answer["messages"][0]["state"] == "deferred" and answer["messages"][0]["deliver_at"]
        assert answer["deferred_count"] == 1
        # n smaller than the queued records in front of it: still found
        small = await _get(again, "/channel/peek?topic=orders&channel=billing&state=all&n=5")
        assert [m["state"] for m in small["messages"]] == ["queued"] * 5
        assert small["deferred_count"] == 1
    finally:
        await again.stop()


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_stats_say_when_the_oldest_queued_message_was_published() -> None:
    from twisted.internet import reactor

    nsqd = await start_nsqd(mem_queue_size=2)  # some in memory, the rest on disk
    try:
        await _post(nsqd, "/topic/create?topic=t")
        await _post(nsqd, "/channel/create?topic=t&channel=c")
        await _post(nsqd, "/channel/create?topic=t&channel=empty")
        before = int(reactor.seconds())
        pub = await connect_raw(nsqd.tcp_port)
        pub.send(mpub_command("t", [b"x"] * 5))
        assert await pub.response() == b"OK"
        await pub.close()
        after = int(reactor.seconds()) + 1
        await _post(nsqd, "/channel/empty?topic=t&channel=empty")
        stats = await _get(nsqd, "/stats?format=json&topic=t&include_oldest_message_ts=true")
        chans = {c["channel_name"]: c for c in stats["topics"][0]["channels"]}
        assert chans["c"]["depth"] == 5 and chans["c"]["backend_depth"] == 3
        assert before <= chans["c"]["oldest_message_ts"] <= after
        assert "oldest_message_ts" not in chans["empty"]  # nothing queued: Go's shape
        # not asked: Go's document, without the field, although messages are queued
        plain = await _get(nsqd, "/stats?format=json&topic=t")
        assert plain["topics"][0]["channels"][0]["depth"] == 5
        assert all("oldest_message_ts" not in c for c in plain["topics"][0]["channels"])
    finally:
        await nsqd.stop()
