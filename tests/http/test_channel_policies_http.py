"""Channel policies (issue 46) over real sockets: the HTTP API (config, redrive, empty, errors),
/stats only when asked, /metrics, peek's dead state, a stock consumer on the dead-letter topic,
and the policy and dead letters surviving a clean restart, a kill -9 under --sync-every=1, and
a start under Go's nsqd 1.3.0 (which ignores them)."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
import treq
from twisted.internet import defer, reactor

from nsqtw.embed import start_nsqd
from nsqtw.testing import connect_raw
from nsqtw.testing.raw import RawV2Client, command, mpub_command

GO_NSQD = Path(__file__).resolve().parents[3] / "shared" / "anchors" / "go-nsq-1.3.0" / "nsqd"
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from replication_support import ChildNsqd, sleep  # noqa: E402


async def _call(port: int, method: str, path: str) -> tuple[int, Any]:
    resp = await treq.request(method, f"http://127.0.0.1:{port}{path}")
    text = await resp.text()
    try:
        return resp.code, json.loads(text) if text else None
    except ValueError:
        return resp.code, text


async def _ok(port: int, method: str, path: str) -> Any:
    code, doc = await _call(port, method, path)
    assert code == 200, (path, code, doc)
    return doc


async def _publish(port: int, topic: str, bodies: list[bytes]) -> None:
    pub = await connect_raw(port)
    pub.send(mpub_command(topic, bodies))
    assert await pub.response() == b"OK"
    await pub.close()


async def _consumer(port: int, topic: str, channel: str, rdy: int) -> RawV2Client:
    sub = await connect_raw(port)
    sub.send(command("SUB", topic, channel))
    assert await sub.response() == b"OK"
    sub.send(command("RDY", rdy))
    return sub


async def _req_until_dead(port: int, topic: str, channel: str, n: int, attempts: int) -> dict[bytes, list[int]]:
    """A consumer that REQs everything: returns each body's delivery attempts."""
    sub = await _consumer(port, topic, channel, 100)
    seen: dict[bytes, list[int]] = {}
    for _ in range(n * attempts):
        m = await sub.message()
        seen.setdefault(m.body, []).append(m.attempts)
        sub.send(command("REQ", m.id.decode(), 0))
    # every REQ above is handled before this answer (a non-fatal error: the ID is in flight nowhere)
    sub.send(command("TOUCH", "0" * 16))
    assert (await sub.error()).startswith(b"E_TOUCH_FAILED")
    await sub.close()
    return seen


async def _dead(port: int, topic: str, channel: str) -> list[dict[str, Any]]:
    doc = await _ok(port, "GET", f"/channel/peek?topic={topic}&channel={channel}&state=dead&n=1000")
    return list(doc["messages"])


@pytest.mark.nsqd_options(peek_enabled=True)
@pytest_twisted.ensureDeferred
async def test_config_dead_letters_redrive_and_empty_over_http(nsqd: Any) -> None:
    port = nsqd.http_port
    await _ok(port, "POST", "/topic/create?topic=jobs")
    await _ok(port, "POST", "/channel/create?topic=jobs&channel=work")
    doc = await _ok(port, "GET", "/channel/config?topic=jobs&channel=work")
    assert doc == {"topic": "jobs", "channel": "work", "max_attempts": None, "max_age": None, "max_depth": None,
                   "overflow": "drop-oldest", "max_rate": None, "dead_letter_topic": None}
    doc = await _ok(port, "POST", "/channel/config?topic=jobs&channel=work&max_attempts=3&max_age=90s")
    assert (doc["max_attempts"], doc["max_age"]) == (3, "1m30s")
    # bad values: NSQ-style 400s, the policy unchanged
    for query, code in (("max_attempts=x", "INVALID_MAX_ATTEMPTS"), ("max_age=soon", "INVALID_MAX_AGE"),
                        ("max_depth=-1", "INVALID_MAX_DEPTH"), ("overflow=later", "INVALID_OVERFLOW"),
                        ("max_rate=fast", "INVALID_MAX_RATE"), ("dead_letter_topic=jobs", "INVALID_DEAD_LETTER_TOPIC")):
        assert await _call(port, "POST", f"/channel/config?topic=jobs&channel=work&{query}") == (400, {"message": code})
    assert await _call(port, "GET", "/channel/config?topic=jobs&channel=nope") == (404, {"message": "CHANNEL_NOT_FOUND"})
    assert await _call(port, "GET", "/channel/config?topic=nope&channel=x") == (404, {"message": "TOPIC_NOT_FOUND"})
    # an empty value turns one setting off
    doc = await _ok(port, "POST", "/channel/config?topic=jobs&channel=work&max_age=")
    assert (doc["max_attempts"], doc["max_age"]) == (3, None)

    await _publish(nsqd.tcp_port, "jobs", [b"j0", b"j1", b"j2"])
    seen = await _req_until_dead(nsqd.tcp_port, "jobs", "work", 3, 3)
    assert seen == {b"j0": [1, 2, 3], b"j1": [1, 2, 3], b"j2": [1, 2, 3]}
    dead = await _dead(port, "jobs", "work")
    assert sorted(base64.b64decode(m["body"]) for m in dead) == [b"j0", b"j1", b"j2"]
    assert {(m["state"], m["attempts"], m["reason"]) for m in dead} == {("dead", 3, "max_attempts")}

    # /stats keeps Go's shape unless asked
    plain = await _ok(port, "GET", "/stats?format=json&topic=jobs")
    assert "policy" not in plain["topics"][0]["channels"][0]
    asked = await _ok(port, "GET", "/stats?format=json&topic=jobs&include_policies=true")
    ch = asked["topics"][0]["channels"][0]
    assert ch["dead_count"] == 3 and ch["policy"]["max_attempts"] == 3 and ch["depth"] == 0
    code, metrics = await _call(port, "GET", "/metrics")
    assert 'nsq_channel_dead_messages{topic="jobs",channel="work"} 3' in metrics
    assert 'nsq_channel_policy_max_attempts{topic="jobs",channel="work"} 3' in metrics

    assert await _call(port, "POST", "/channel/redrive?topic=jobs&channel=work&count=0") == (
        400, {"message": "INVALID_COUNT"})
    assert await _ok(port, "POST", "/channel/redrive?topic=jobs&channel=work&count=2") == {
        "redriven": 2, "dead_count": 1}
    sub = await _consumer(nsqd.tcp_port, "jobs", "work", 10)
    got = [await sub.message(), await sub.message()]
    assert sorted(m.body for m in got) == [b"j0", b"j1"] and {m.attempts for m in got} == {1}
    for m in got:
        sub.send(command("FIN", m.id.decode()))
    await sub.close()
    assert await _ok(port, "POST", "/channel/dead/empty?topic=jobs&channel=work") == {"emptied": 1, "dead_count": 0}
    assert await _dead(port, "jobs", "work") == []


@pytest_twisted.ensureDeferred
async def test_dead_letter_topic_reaches_a_stock_consumer(nsqd: Any) -> None:
    port = nsqd.http_port
    await _ok(port, "POST", "/topic/create?topic=mail")
    await _ok(port, "POST", "/channel/create?topic=mail&channel=send")
    await _ok(port, "POST", "/channel/config?topic=mail&channel=send&max_attempts=2&dead_letter_topic=mail_dead")
    await _ok(port, "POST", "/topic/create?topic=mail_dead")
    await _ok(port, "POST", "/channel/create?topic=mail_dead&channel=ops")
    await _publish(nsqd.tcp_port, "mail", [b"to: customer"])
    await _req_until_dead(nsqd.tcp_port, "mail", "send", 1, 2)
    from nsqtw.client import Consumer

    got: defer.Deferred[bytes] = defer.Deferred()

    def handler(message: Any) -> None:
        if not got.called:
            got.callback(message.body)

    consumer = Consumer("mail_dead", "ops", handler)
    await consumer.connect_to_nsqd(f"127.0.0.1:{nsqd.tcp_port}")
    try:
        assert await got.addTimeout(5, reactor) == b"to: customer"
    finally:
        await consumer.stop()


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_policy_and_dead_letters_survive_a_restart(tmp_path: Any) -> None:
    data = str(tmp_path)
    nsqd = await start_nsqd(data_path=data, peek_enabled=True)
    await _ok(nsqd.http_port, "POST", "/topic/create?topic=t")
    await _ok(nsqd.http_port, "POST", "/channel/create?topic=t&channel=c")
    await _ok(nsqd.http_port, "POST", "/channel/config?topic=t&channel=c&max_attempts=1&max_rate=20")
    await _publish(nsqd.tcp_port, "t", [b"a", b"b"])
    await _req_until_dead(nsqd.tcp_port, "t", "c", 2, 1)
    await nsqd.stop()
    assert os.path.exists(os.path.join(data, "nsqtw.policies.json"))
    assert os.path.exists(os.path.join(data, "t:c#dead.nsqtw"))

    again = await start_nsqd(data_path=data, peek_enabled=True)
    try:
        doc = await _ok(again.http_port, "GET", "/channel/config?topic=t&channel=c")
        assert (doc["max_attempts"], doc["max_rate"]) == (1, 20)
        assert sorted(base64.b64decode(m["body"]) for m in await _dead(again.http_port, "t", "c")) == [b"a", b"b"]
        # a deleted channel takes its policy and dead letters with it
        await _ok(again.http_port, "POST", "/channel/delete?topic=t&channel=c")
        assert not os.path.exists(os.path.join(data, "t:c#dead.nsqtw"))
        assert not os.path.exists(os.path.join(data, "nsqtw.policies.json"))
    finally:
        await again.stop()


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_dead_letters_survive_kill_9_under_sync_every_1(tmp_path: Any) -> None:
    data = str(tmp_path)
    flags = ("--sync-every=1", "--mem-queue-size=0", "--peek-enabled")
    child = await ChildNsqd.start(data, *flags)
    try:
        await _ok(child.http_port, "POST", "/topic/create?topic=t")
        await _ok(child.http_port, "POST", "/channel/create?topic=t&channel=c")
        await _ok(child.http_port, "POST", "/channel/config?topic=t&channel=c&max_attempts=2")
        await _publish(child.tcp_port, "t", [b"m%d" % i for i in range(5)] + [b"live"])
        sub = await _consumer(child.tcp_port, "t", "c", 100)
        deaths = 0
        while deaths < 5:
            m = await sub.message()
            if m.body == b"live":
                continue  # left in flight at the kill
            sub.send(command("REQ", m.id.decode(), 0))
            deaths += m.attempts == 2
        assert len(await _dead(child.http_port, "t", "c")) == 5
        await _until(lambda: '"name":"c"' in Path(data, "nsqd.dat").read_text())  # nsqd.dat is rewritten
        # in the background (as Go's nsqd does): the channel must be in it for the restart to know it
    finally:
        child.signal(signal.SIGKILL)
        await child.ended
    again = await ChildNsqd.start(data, *flags)
    try:
        dead = await _dead(again.http_port, "t", "c")
        assert sorted(base64.b64decode(m["body"]) for m in dead) == [b"m%d" % i for i in range(5)]
        assert (await _ok(again.http_port, "GET", "/channel/config?topic=t&channel=c"))["max_attempts"] == 2
        sub = await _consumer(again.tcp_port, "t", "c", 100)
        m = await sub.message()
        assert m.body == b"live"  # the one message not dead is delivered, and only it
        sub.send(command("FIN", m.id.decode()))
        # redrive after the restart: each dead message is delivered once more, attempts fresh
        assert (await _ok(again.http_port, "POST", "/channel/redrive?topic=t&channel=c"))["redriven"] == 5
        back = [await sub.message() for _ in range(5)]
        assert sorted(x.body for x in back) == [b"m%d" % i for i in range(5)] and {x.attempts for x in back} == {1}
        for x in back:
            sub.send(command("FIN", x.id.decode()))
        await sub.close()
    finally:
        again.signal(signal.SIGKILL)
        await again.ended


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_a_data_directory_with_policies_starts_under_go_nsqd(tmp_path: Any) -> None:
    if not os.access(GO_NSQD, os.X_OK):
        pytest.skip(f"Go's nsqd 1.3.0 is not at {GO_NSQD} (a build of NSQ 1.3.0's nsqd, for the comparison)")
    data = str(tmp_path)
    nsqd = await start_nsqd(data_path=data)
    await _ok(nsqd.http_port, "POST", "/topic/create?topic=t")
    await _ok(nsqd.http_port, "POST", "/channel/create?topic=t&channel=c")
    await _ok(nsqd.http_port, "POST", "/channel/config?topic=t&channel=c&max_attempts=1&max_depth=100")
    await _publish(nsqd.tcp_port, "t", [b"dies", b"stays"])
    sub = await _consumer(nsqd.tcp_port, "t", "c", 1)
    m = await sub.message()
    sub.send(command("REQ", m.id.decode(), 0))
    sub.send(command("TOUCH", "0" * 16))  # its answer comes after the REQ was handled
    assert (await sub.error()).startswith(b"E_TOUCH_FAILED")
    await sub.close()
    await nsqd.stop()
    assert os.path.exists(os.path.join(data, "t:c#dead.nsqtw"))
    out = subprocess.run([str(GO_NSQD), "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                          "--https-address=", f"--data-path={data}", "--version"], capture_output=True, text=True)
    assert out.returncode == 0
    proc = await _go_nsqd_stats(data)
    assert proc["topics"][0]["topic_name"] == "t"
    channel = proc["topics"][0]["channels"][0]
    assert channel["channel_name"] == "c" and channel["depth"] == 1


async def _until(check: Any) -> None:
    for _ in range(500):
        if check():
            return
        await sleep(0.01)
    raise AssertionError("never happened")


async def _go_nsqd_stats(data: str) -> Any:
    """Go's nsqd on ``data``: its /stats once it answers."""
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    http = s.getsockname()[1]
    s.close()
    proc = subprocess.Popen([str(GO_NSQD), "--tcp-address=127.0.0.1:0", f"--http-address=127.0.0.1:{http}",
                             "--https-address=", f"--data-path={data}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        for _ in range(300):
            try:
                code, doc = await _call(http, "GET", "/stats?format=json")
                if code == 200:
                    return doc
            except Exception:
                pass
            if proc.poll() is not None:
                raise AssertionError(f"Go's nsqd exited: {proc.stderr.read() if proc.stderr else ''}")
            await sleep(0.05)
        raise AssertionError("Go's nsqd did not answer")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait()

