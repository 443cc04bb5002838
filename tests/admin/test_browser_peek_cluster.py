"""Issue 27 items 6 and 7 in headless Chromium: the Messages panel on a mixed cluster.

Three nsqd hold one channel: nsqtw's with peek and its backlog split between memory and disk (so the
order it delivers is not the order of publication), nsqtw's with peek and a memory backlog, and Go's
nsqd 1.3.0 (no peek at all).  The panel must show each node's part in that node's own delivery order
(exactly what its ``/channel/peek`` says), ``n`` per node (no node vanishes), each node's counts, what is
in flight although the backlog is larger than ``n``, and Go's nsqd as "has no peek", never "not on
this node".  Bodies are one line each.  Screenshots go to ``test-artifacts/admin/``.
"""

from __future__ import annotations

import base64
import os
import socket
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer, task
from twisted.internet.protocol import ProcessProtocol

from admin_helpers import call, create_channel, publish, within
from test_browser import pytestmark as browser_marks, subscribe
from nsqtw.testing import command

pytestmark = list(browser_marks)

GO_NSQD = Path(__file__).resolve().parents[3] / "shared" / "anchors" / "go-nsq-1.3.0" / "nsqd"


class _Quiet(ProcessProtocol):
    def __init__(self) -> None:
        self.ended: defer.Deferred = defer.Deferred()

    def processEnded(self, reason: Any) -> None:
        self.ended.callback(None)


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest_twisted.async_yield_fixture
async def go_nsqd(tmp_path):
    """Go's nsqd 1.3.0 on loopback: ``(http address, tcp port)``."""
    from twisted.internet import reactor

    if not os.access(GO_NSQD, os.X_OK):
        pytest.skip(f"Go's nsqd 1.3.0 is not at {GO_NSQD} (a build of NSQ 1.3.0's nsqd, for the comparison)")
    tcp, http = _free_port(), _free_port()
    proto = _Quiet()
    argv = [str(GO_NSQD), f"--tcp-address=127.0.0.1:{tcp}", f"--http-address=127.0.0.1:{http}",
            "--broadcast-address=127.0.0.1", f"--data-path={tmp_path}"]
    process = reactor.spawnProcess(proto, argv[0], argv, env={}, path=str(tmp_path))
    try:
        for _ in range(200):
            try:
                code, _, _ = await call("GET", f"http://127.0.0.1:{http}/ping")
                if code == 200:
                    break
            except Exception:
                pass
            await task.deferLater(reactor, 0.05, lambda: None)
        else:
            raise AssertionError("Go's nsqd did not answer /ping")
        yield f"127.0.0.1:{http}", tcp
    finally:
        if not proto.ended.called:
            process.signalProcess("KILL")
        await within(proto.ended, 10)


async def _nsqd_order(nsqd: Any, state: str, n: int) -> list[str]:
    code, doc, _ = await call("GET", f"http://{nsqd.http_address}/channel/peek?topic=t&channel=c&state={state}&n={n}")
    assert code == 200, doc
    return [m["id"] for m in doc["messages"]]


@pytest_twisted.ensureDeferred
async def test_messages_panel_node_by_node_on_a_mixed_cluster(start_admin, go_nsqd, browser) -> None:
    from twisted.internet import reactor

    from nsqtw.embed import start_nsqd

    split = await start_nsqd(peek_enabled=True, mem_queue_size=3)   # a backlog in memory and on disk
    plain = await start_nsqd(peek_enabled=True)
    go_http, _ = go_nsqd
    consumers: list[Any] = []
    try:
        for n in (split, plain):
            await create_channel(n, "t", "c")
        for path in ("/topic/create?topic=t", "/channel/create?topic=t&channel=c"):
            code, _, _ = await call("POST", f"http://{go_http}{path}")
            assert code == 200
        # split: p00..p09 (p00-p02 in memory, the rest on disk); a consumer takes p00-p02 and finishes
        # them, then q0, q1 arrive and go to the memory queue: they are delivered before p03-p09
        await publish(split, "t", [b'{"n": "p%02d", "pad": "%s"}' % (i, b"x" * 200) for i in range(10)])
        taker = await subscribe(split, "t", "c", rdy=3)
        consumers.append(taker)
        for _ in range(3):
            m = await within(taker.message())
            taker.send(command("FIN", m.id.decode()))
        taker.send(command("RDY", 0))
        await task.deferLater(reactor, 0.2, lambda: None)
        await publish(split, "t", [b'{"n": "q0"}', b'{"n": "q1"}'])
        # plain: 40 queued and 2 in flight (held by a consumer), more than n=5 queued
        await publish(plain, "t", [b"plain %d" % i for i in range(42)])
        holder = await subscribe(plain, "t", "c", rdy=2, client_id="holder")
        consumers.append(holder)
        for _ in range(2):
            await within(holder.message())

        admin = await start_admin(nsqd_http_addresses=[split.http_address, plain.http_address, go_http],
                                  history_interval=3600.0, refresh_interval=1.0)
        split_order = await _nsqd_order(split, "queued", 5)
        code, raw, _ = await call("GET", f"http://{split.http_address}/channel/peek?topic=t&channel=c&state=queued&n=20")
        stamps = {m["id"]: m["timestamp"] for m in raw["messages"]}
        by_time = sorted(stamps, key=lambda i: stamps[i])[:5]
        assert split_order != by_time, "the scenario must make delivery order differ from publish order"

        await browser.get(admin.url + "topics/t/c")
        await browser.js("document.querySelector('section.peek input.peek-n').value = '5'")
        await browser.click("section.peek button.peek-load")
        await browser.until("return document.querySelector('section.peek').dataset.loaded", "the peek answer")

        def part(node: str) -> str:
            return f"section.peek .peek-node[data-node=\"{node}\"]"
        rows = await browser.js(
            "var out = {}; document.querySelectorAll('section.peek .peek-node').forEach(function (p) {"
            " out[p.dataset.node] = Array.from(p.querySelectorAll('tr.peek-msg')).map(function (r) {"
            "  return [r.dataset.id, r.children[1].textContent]; }); }); return out;")
        # item 6: each node's part in its own delivery order, n per node (no node vanishes)
        assert [i for i, st in rows[split.http_address] if st == "queued"] == split_order
        plain_queued = [i for i, st in rows[plain.http_address] if st == "queued"]
        assert plain_queued == await _nsqd_order(plain, "queued", 5)
        # item 7: all states: the 2 in flight show although 40 are queued
        assert [st for _, st in rows[plain.http_address]].count("in flight") == 2
        assert "queued 40" in await browser.text(f"{part(plain.http_address)} .peek-counts")
        assert "in flight 2" in await browser.text(f"{part(plain.http_address)} .peek-counts")
        assert "queued 9" in await browser.text(f"{part(split.http_address)} .peek-counts")
        # item 7: Go's nsqd has no peek (its 404 is the route's, not a missing channel)
        go_error = await browser.text(f"{part(go_http)} .peek-node-error")
        assert "Go's nsqd has no peek" in go_error and "NOT_FOUND" not in go_error, go_error
        # item 7: bodies are one line in their row, the whole of it on demand
        heights = await browser.js("return Array.from(document.querySelectorAll('section.peek tr.peek-msg'))"
                                   ".map(function (r) { return r.getBoundingClientRect().height; })")
        assert max(heights) < 40, heights
        first_json = f"{part(split.http_address)} tr.peek-msg:first-child details"
        await browser.click(f"{first_json} summary")
        # q0, published last but first to be delivered (memory before disk), pretty-printed when opened
        assert await browser.js(f"return document.querySelector('{first_json} pre').textContent") \
            == '{\n  "n": "q0"\n}'
        assert await browser.text(f"{first_json} summary") == '{"n":"q0"}'
        assert await browser.js(f"return document.querySelector('{first_json}').open") is True
        await browser.js("document.querySelector('section.peek').scrollIntoView()")
        await browser.screenshot("peek-mixed-cluster")

        # a body cut inside a UTF-8 character is text up to the cut, not hex
        cut = base64.b64encode("h\u00e9llo w\u00f6".encode()[:-1]).decode()
        p = await browser.js(f"return window.nsqadminPeek.preview({{body: '{cut}', body_size: 10}})")
        assert p["kind"] == "text" and p["line"] == "h\u00e9llo w \u2026", p

        # no node could be peeked: said so, never "no messages"
        only_go = await start_admin(nsqd_http_addresses=[go_http], history_interval=3600.0)
        await browser.get(only_go.url + "topics/t/c")
        await browser.click("section.peek button.peek-load")
        await browser.until("return document.querySelector('section.peek').dataset.loaded", "the peek answer")
        text = await browser.text("section.peek .peek-out")
        assert "No node could be peeked" in text and "No messages" not in text, text
        await browser.screenshot("peek-no-node-peeked")
        assert await browser.console_errors() == []
    finally:
        for c in consumers:
            await c.close()
        await split.stop()
        await plain.stop()


@pytest_twisted.ensureDeferred
async def test_messages_panel_lists_deferred_messages_after_a_restart(start_admin, browser, tmp_path) -> None:
    """Item 8: deferred messages a clean stop wrote to disk are deferred in the panel after the restart,
    in "deferred" as in "all states", and counted."""
    from nsqtw.embed import start_nsqd
    from nsqtw.testing import connect_raw
    from nsqtw.testing.raw import body_command

    nsqd = await start_nsqd(data_path=str(tmp_path), peek_enabled=True)
    await create_channel(nsqd, "t", "c")
    await publish(nsqd, "t", [b"now %d" % i for i in range(30)])
    pub = await connect_raw(nsqd.tcp_port)
    pub.send(body_command("DPUB", "t", 3_600_000, body=b"in an hour"))
    assert await within(pub.response()) == b"OK"
    await pub.close()
    await nsqd.stop()
    again = await start_nsqd(data_path=str(tmp_path), peek_enabled=True)
    try:
        admin = await start_admin(nsqd_http_addresses=[again.http_address], history_interval=3600.0)
        await browser.get(admin.url + "topics/t/c")
        for state in ("deferred", "all"):
            await browser.js(f"document.querySelector('section.peek select.peek-state').value = '{state}';"
                             " delete document.querySelector('section.peek').dataset.loaded;")
            await browser.click("section.peek button.peek-load")
            await browser.until("return document.querySelector('section.peek').dataset.loaded", "the peek answer")
            rows = await browser.js("return Array.from(document.querySelectorAll('section.peek tr.state-deferred'))"
                                    ".map(function (r) { return r.querySelector('pre').textContent; })")
            assert rows == ["in an hour"], (state, rows)
            assert "deferred 1" in await browser.text("section.peek .peek-counts")
        await browser.js("document.querySelector('section.peek').scrollIntoView()")
        await browser.screenshot("peek-deferred-after-restart")
        assert await browser.console_errors() == []
    finally:
        await again.stop()
