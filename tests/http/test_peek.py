"""Peek (issue 16): GET /channel/peek and /topic/peek over real HTTP against live brokers, for
every state, the disk part, the errors, and non-interference (a consumer sees exactly the same
deliveries and every counter is the same with and without peeks in between)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
import pytest_twisted
import treq

from nsqtw.embed import start_nsqd
from nsqtw.testing import connect_raw
from nsqtw.testing.raw import command, identify_command, mpub_command


async def _get(nsqd: Any, path: str) -> tuple[int, Any]:
    resp = await treq.get(f"http://127.0.0.1:{nsqd.http_port}{path}")
    text = await resp.text()
    return resp.code, json.loads(text) if text else None


async def _post(nsqd: Any, path: str) -> int:
    resp = await treq.post(f"http://127.0.0.1:{nsqd.http_port}{path}")
    await resp.content()
    return resp.code


async def _publish(nsqd: Any, topic: str, bodies: list[bytes]) -> None:
    pub = await connect_raw(nsqd.tcp_port)
    pub.send(mpub_command(topic, bodies))
    assert await pub.response() == b"OK"
    await pub.close()


def _bodies(answer: dict[str, Any]) -> list[bytes]:
    return [base64.b64decode(m["body"]) for m in answer["messages"]]


@pytest_twisted.ensureDeferred
async def test_peek_is_off_by_default(nsqd: Any) -> None:
    await _publish(nsqd, "t", [b"a"])
    assert await _get(nsqd, "/topic/peek?topic=t") == (403, {"message": "PEEK_DISABLED"})
    assert await _get(nsqd, "/channel/peek?topic=t&channel=c") == (403, {"message": "PEEK_DISABLED"})


@pytest.mark.nsqd_options(peek_enabled=True)
@pytest_twisted.ensureDeferred
async def test_topic_peek_lists_the_topics_own_queue_in_order(nsqd: Any) -> None:
    await _publish(nsqd, "t", [b"m%d" % i for i in range(5)])
    code, answer = await _get(nsqd, "/topic/peek?topic=t")
    assert code == 200
    assert answer["topic"] == "t" and answer["channel"] is None and answer["depth"] == 5
    assert _bodies(answer) == [b"m%d" % i for i in range(5)] and answer["truncated"] is False
    first = answer["messages"][0]
    assert first["state"] == "queued" and first["attempts"] == 0 and first["body_size"] == 2
    assert len(first["id"]) == 16 and first["deliver_at"] is None and first["client_id"] is None
    assert first["timestamp"] > 1_600_000_000_000_000_000
    code, answer = await _get(nsqd, "/topic/peek?topic=t&n=2")
    assert _bodies(answer) == [b"m0", b"m1"] and answer["truncated"] is True


@pytest.mark.nsqd_options(peek_enabled=True)
@pytest_twisted.ensureDeferred
async def test_peek_errors(nsqd: Any) -> None:
    await _publish(nsqd, "t", [b"a"])
    assert await _post(nsqd, "/channel/create?topic=t&channel=c") == 200
    for n in ("0", "1001", "abc", "-1", "99999999999"):
        assert await _get(nsqd, f"/channel/peek?topic=t&channel=c&n={n}") == (400, {"message": "INVALID_N"})
    assert (await _get(nsqd, "/channel/peek?topic=t&channel=c&n=1000"))[0] == 200
    assert await _get(nsqd, "/channel/peek?topic=nope&channel=c") == (404, {"message": "TOPIC_NOT_FOUND"})
    assert await _get(nsqd, "/channel/peek?topic=t&channel=nope") == (404, {"message": "CHANNEL_NOT_FOUND"})
    assert await _get(nsqd, "/topic/peek?topic=nope") == (404, {"message": "TOPIC_NOT_FOUND"})
    assert await _get(nsqd, "/channel/peek?topic=t&channel=c&state=lost") == (400, {"message": "INVALID_STATE"})
    assert await _get(nsqd, "/channel/peek?channel=c") == (400, {"message": "MISSING_ARG_TOPIC"})


@pytest.mark.nsqd_options(peek_enabled=True, peek_max_body_size=4)
@pytest_twisted.ensureDeferred
async def test_channel_peek_lists_queued_in_flight_and_deferred(nsqd: Any) -> None:
    await _publish(nsqd, "t", [b"x"])  # creates the topic
    assert await _post(nsqd, "/channel/create?topic=t&channel=c") == 200
    await _publish(nsqd, "t", [b"body-%02d" % i for i in range(10)])
    sub = await connect_raw(nsqd.tcp_port)
    sub.send(identify_command(client_id="peeker-test"))
    await sub.response()
    sub.send(command("SUB", "t", "c"))
    assert await sub.response() == b"OK"
    sub.send(command("RDY", 3))
    got = [await sub.message() for _ in range(3)]
    sub.send(command("RDY", 0))  # no more deliveries once the REQ frees a place
    sub.send(command("REQ", got[0].id.decode(), 60000))  # deferred a minute
    code, answer = await _get(nsqd, "/channel/peek?topic=t&channel=c&n=50")
    assert code == 200
    states = [m["state"] for m in answer["messages"]]
    # "x" (published before the channel existed) came first and is the one deferred
    assert states == ["queued"] * 8 + ["in_flight"] * 2 + ["deferred"]
    assert answer["depth"] == 8 and answer["in_flight_count"] == 2 and answer["deferred_count"] == 1
    assert [base64.b64decode(m["body"]) for m in answer["messages"]][:8] == [b"body"] * 8  # 4 bytes shown
    assert [m["body_size"] for m in answer["messages"]] == [7] * 10 + [1]
    inflight = [m for m in answer["messages"] if m["state"] == "in_flight"]
    assert [m["id"] for m in inflight] == [g.id.decode() for g in got[1:]]
    assert all(m["client_id"] == "peeker-test" and m["attempts"] == 1 for m in inflight)
    (deferred,) = [m for m in answer["messages"] if m["state"] == "deferred"]
    assert deferred["id"] == got[0].id.decode() and deferred["attempts"] == 1
    assert deferred["deliver_at"] > deferred["timestamp"] + 50 * 10**9
    code, only = await _get(nsqd, "/channel/peek?topic=t&channel=c&state=in_flight")
    assert [m["state"] for m in only["messages"]] == ["in_flight"] * 2 and only["truncated"] is False
    code, some = await _get(nsqd, "/channel/peek?topic=t&channel=c&n=9")
    assert [m["state"] for m in some["messages"]] == ["queued"] * 8 + ["in_flight"] and some["truncated"] is True
    await sub.close()


@pytest_twisted.ensureDeferred
async def test_disk_backlog_is_peeked_in_delivery_order_while_a_consumer_reads() -> None:
    nsqd = await start_nsqd(peek_enabled=True, mem_queue_size=0)
    try:
        assert await _post(nsqd, "/topic/create?topic=t") == 200
        assert await _post(nsqd, "/channel/create?topic=t&channel=c") == 200
        await _publish(nsqd, "t", [b"disk-%03d" % i for i in range(200)])
        code, answer = await _get(nsqd, "/channel/peek?topic=t&channel=c&state=queued&n=5")
        assert _bodies(answer) == [b"disk-%03d" % i for i in range(5)] and answer["truncated"] is True
        assert answer["depth"] == 200
        sub = await connect_raw(nsqd.tcp_port)
        sub.send(command("SUB", "t", "c"))
        assert await sub.response() == b"OK"
        sub.send(command("RDY", 1))
        for i in range(30):
            msg = await sub.message()
            assert msg.body == b"disk-%03d" % i
            code, answer = await _get(nsqd, "/channel/peek?topic=t&channel=c&n=3")
            queued = [m for m in answer["messages"] if m["state"] == "queued"]
            assert [base64.b64decode(m["body"]) for m in queued] == [b"disk-%03d" % j for j in range(i + 1, i + 4)]
            assert answer["truncated"] is True  # n=3 in all: the in-flight one did not fit
            code, answer = await _get(nsqd, "/channel/peek?topic=t&channel=c&state=in_flight")
            assert [m["id"] for m in answer["messages"]] == [msg.id.decode()]
            sub.send(command("FIN", msg.id.decode()))
        await sub.close()
    finally:
        await nsqd.stop()


async def _run_consumer_scenario(peek: bool) -> tuple[list[tuple[bytes, int]], dict[str, Any]]:
    """Publish to memory and disk, consume with a REQ and a deferral, FIN the rest; with
    ``peek``, peek every state between every step.  Returns deliveries and the counters."""
    nsqd = await start_nsqd(peek_enabled=True, mem_queue_size=5)
    try:
        assert await _post(nsqd, "/topic/create?topic=t") == 200
        assert await _post(nsqd, "/channel/create?topic=t&channel=c") == 200
        await _publish(nsqd, "t", [b"msg-%02d" % i for i in range(20)])
        sub = await connect_raw(nsqd.tcp_port)
        sub.send(command("SUB", "t", "c"))
        assert await sub.response() == b"OK"
        sub.send(command("RDY", 1))
        seen: list[tuple[bytes, int]] = []
        for step in range(22):
            if peek:
                for path in ("/channel/peek?topic=t&channel=c&n=1000", "/channel/peek?topic=t&channel=c&state=queued",
                             "/channel/peek?topic=t&channel=c&state=in_flight&n=1", "/topic/peek?topic=t"):
                    assert (await _get(nsqd, path))[0] == 200
            msg = await sub.message()
            seen.append((msg.body, msg.attempts))
            if step == 3 or step == 9:
                sub.send(command("REQ", msg.id.decode(), 0))
            else:
                sub.send(command("FIN", msg.id.decode()))
        code, stats = await _get(nsqd, "/stats?format=json&topic=t")
        (topic,) = stats["topics"]
        (ch,) = topic["channels"]
        counters = {k: ch[k] for k in ("depth", "backend_depth", "in_flight_count", "deferred_count",
                                        "message_count", "requeue_count", "timeout_count")}
        counters["topic_message_count"] = topic["message_count"]
        await sub.close()
        return seen, counters
    finally:
        await nsqd.stop()


@pytest_twisted.ensureDeferred
async def test_peeking_changes_nothing_a_consumer_sees_or_any_counter() -> None:
    plain = await _run_consumer_scenario(peek=False)
    peeked = await _run_consumer_scenario(peek=True)
    assert peeked == plain
    seen, counters = plain
    assert len(seen) == 22 and counters["requeue_count"] == 2


@pytest.mark.nsqtw_options(peek_enabled=True)
@pytest_twisted.ensureDeferred
async def test_the_pytest_fixture_takes_peek_enabled(nsqtw_nsqd: Any) -> None:
    await nsqtw_nsqd.publish("orders", b'{"id": 1}')
    code, answer = await _get(nsqtw_nsqd, "/topic/peek?topic=orders")
    assert code == 200 and _bodies(answer) == [b'{"id": 1}']


def test_the_drop_in_command_takes_peek_enabled(tmp_path: Any) -> None:
    import socket
    import subprocess
    import sys
    import time
    import urllib.request
    from pathlib import Path

    ports = []
    for _ in range(2):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        ports.append(s.getsockname()[1])
        s.close()
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-m", "nsqtw.cli", "nsqd", "--peek-enabled",
                             f"--tcp-address=127.0.0.1:{ports[0]}", f"--http-address=127.0.0.1:{ports[1]}",
                             f"--data-path={tmp_path}"], cwd=str(root),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{ports[1]}"
        for _ in range(1000):
            try:
                urllib.request.urlopen(base + "/ping", timeout=5).read()
                break
            except OSError:
                time.sleep(0.01)
        urllib.request.urlopen(urllib.request.Request(base + "/pub?topic=t", data=b"hello", method="POST")).read()
        answer = json.loads(urllib.request.urlopen(base + "/topic/peek?topic=t").read())
        assert _bodies(answer) == [b"hello"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
