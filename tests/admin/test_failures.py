"""nsqadmin when nodes fail (issue 17 item 1): real nsqd processes, one hung with SIGSTOP, one SIGKILLed.

nsqlookupd and nsqadmin run in this test's reactor; three nsqd run as processes
of their own (``tests/lookupd/cluster_runner.py``).  After the hang and the
kill, the API must keep both failed nodes, say "partial: 1 of 3 nodes" and
never hand out a failed node's numbers as current; headless Chromium must show
the same (DOM checks plus screenshots under ``test-artifacts/admin/``), and
every page must fit 400, 1280 and 1400 pixel wide windows without the page
scrolling sideways.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest_twisted
from twisted.internet import defer, task
from twisted.internet.protocol import ProcessProtocol

from admin_helpers import call, publish, within
from test_browser import pytestmark as browser_marks, subscribe
from nsqtw.testing import command

ROOT = Path(__file__).resolve().parents[2]
RUNNER = ROOT / "tests" / "lookupd" / "cluster_runner.py"
_READY = re.compile(r"READY tcp=(\d+) http=(\d+)")

pytestmark = list(browser_marks)


class NsqdProcess(ProcessProtocol):
    """One nsqd in a process of its own; ``ready`` fires with (tcp port, http port)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.output: list[str] = []
        self.ready: defer.Deferred = defer.Deferred()
        self.ended: defer.Deferred = defer.Deferred()
        self.tcp_port = 0
        self.http_port = 0

    @property
    def http_address(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    def outReceived(self, data: bytes) -> None:
        text = data.decode("utf-8", "replace")
        self.output.append(text)
        m = _READY.search("".join(self.output[-3:]))
        if m and not self.ready.called:
            self.tcp_port, self.http_port = int(m.group(1)), int(m.group(2))
            self.ready.callback((self.tcp_port, self.http_port))

    errReceived = outReceived

    def processEnded(self, reason: Any) -> None:
        if not self.ready.called:
            self.ready.errback(RuntimeError(f"{self.name} ended:\n" + "".join(self.output)[-3000:]))
        self.ended.callback(None)

    def signal(self, name: str) -> None:
        import signal

        if not self.ended.called:
            self.transport.signalProcess(int(getattr(signal, f"SIG{name}")))

    async def stop(self) -> None:
        if self.ended.called:
            return
        self.signal("CONT")
        self.signal("TERM")
        try:
            await within(self.ended, 15.0)
        except defer.TimeoutError:
            self.signal("KILL")
            await within(self.ended, 5.0)


async def spawn_nsqd(name: str, lookupd_tcp: str, data: Path) -> NsqdProcess:
    from twisted.internet import reactor

    data.mkdir(parents=True, exist_ok=True)
    proc = NsqdProcess(name)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    argv = [sys.executable, str(RUNNER), "nsqd", "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
            "--https-address=", "--broadcast-address=127.0.0.1", f"--lookupd-tcp-address={lookupd_tcp}",
            f"--data-path={data}", "--e2e-processing-latency-percentile=0.99,0.95,0.5"]
    reactor.spawnProcess(proc, argv[0], argv, env=env, path=str(data))
    await within(proc.ready, 60.0)
    return proc


async def until(check: Any, what: str, timeout: float = 30.0) -> Any:
    """Poll ``check()`` (async, returns a truthy value when done) until it succeeds or the deadline passes."""
    from twisted.internet import reactor

    deadline = reactor.seconds() + timeout
    last: Any = None
    while True:
        last = await check()
        if last:
            return last
        if reactor.seconds() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await task.deferLater(reactor, 0.2, lambda: None)


@pytest_twisted.async_yield_fixture
async def processes(tmp_path):
    """An in-process nsqlookupd, three nsqd processes registered with it, and an nsqadmin over lookupd."""
    from nsqtw.embed import start_nsqadmin
    from nsqtw.embed import start_nsqlookupd

    lookupd = await start_nsqlookupd()
    procs: list[NsqdProcess] = []
    admin = None
    try:
        for i in range(3):
            procs.append(await spawn_nsqd(f"nsqd{i}", lookupd.tcp_address, tmp_path / f"nsqd{i}"))
        admin = await start_nsqadmin(lookupd_http_addresses=[lookupd.http_address], http_client_request_timeout=1.0,
                                     http_client_connect_timeout=1.0, history_interval=0.5, refresh_interval=0.5)
        yield admin, lookupd, procs
    finally:
        if admin is not None:
            await admin.stop()
        for p in procs:
            await p.stop()
        await lookupd.stop()


def _missing(doc: dict[str, Any]) -> dict[str, str]:
    return {m["node"]: m["status"] for m in doc.get("nodes_missing") or []}


async def _settled(browser: Any, what: str) -> None:
    """Three more live refreshes without re-rendering <main>: the rows the page shows are the rows the
    API answer has (a marker the script expects but the server never renders would re-render forever)."""
    await browser.until("return window.nsqadmin.polls >= 1", f"{what} to poll")
    fragments = await browser.js("return window.nsqadmin.fragments")
    polls = await browser.js("return window.nsqadmin.polls")
    await browser.until(f"return window.nsqadmin.polls >= {polls} + 3", f"{what} to poll three more times")
    assert await browser.js("return window.nsqadmin.fragments") <= fragments + 1, what


async def _fits(browser: Any, width: int, name: str) -> None:
    """At ``width`` CSS pixels the page never scrolls sideways; at 1280 and up every table fits its box."""
    await browser._run(browser.driver.execute_cdp_cmd, "Emulation.setDeviceMetricsOverride",
                       {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False})
    overflow = await browser.js("return document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"{name} at {width}px: the page is {overflow}px wider than the window"
    if width >= 1280:
        boxes = await browser.js(
            "return Array.from(document.querySelectorAll('main .scroll')).map(function (b) {"
            " var s = b.closest('section'); var h = s && s.querySelector('h2');"
            " return [b.scrollWidth, b.clientWidth, h ? h.textContent : '']; })")
        for scroll_width, client_width, heading in boxes:
            assert scroll_width <= client_width + 1, f"{name} at {width}px: table {heading!r} is {scroll_width}px " \
                                                      f"in a {client_width}px box"
    await browser.screenshot(f"{name}-{width}")


@pytest_twisted.ensureDeferred
async def test_hung_and_killed_nsqd_are_shown_not_hidden(processes, browser) -> None:
    admin, lookupd, procs = processes
    healthy, hung, killed = procs
    for p in procs:
        await publish(p, "orders", [b"o"] * 100)
        code, _, _ = await call("POST", f"http://{p.http_address}/channel/create?topic=orders&channel=archive")
        assert code == 200
    await publish(hung, "solo", [b"s"] * 7)
    # a consumer that finishes some messages on the healthy node (E2E latency columns appear)
    consumer = await subscribe(healthy, "orders", "archive", rdy=5, client_id="worker-1", user_agent="failtest/1.0")
    try:
        for _ in range(5):
            msg = await within(consumer.message())
            consumer.send(command("FIN", msg.id.decode()))
        await publish(healthy, "orders", [b"o"] * 20)

        async def all_three() -> bool:
            code, doc, _ = await call("GET", admin.url + "api/topics/orders")
            return code == 200 and len(doc["nodes"]) == 3
        await until(all_three, "all three nsqd producing orders")

        async def solo_sampled() -> bool:
            await within(admin.poll())
            h = admin._history.overview()["topics"].get("solo") or {}
            return bool(h.get("depth")) and h["depth"][-1] == 7
        await until(solo_sampled, "the history to hold topic solo")

        hung.signal("STOP")
        killed.signal("KILL")
        await within(killed.ended, 15.0)

        # --- the API -----------------------------------------------------------------------------
        async def both_marked() -> Any:
            code, doc, _ = await call("GET", admin.url + "api/topics/orders")
            if code == 200 and _missing(doc) == {hung.http_address: "unreachable", killed.http_address: "gone"}:
                return doc
            return None
        doc = await until(both_marked, "orders to list the hung node as unreachable and the killed one as gone")
        assert doc["partial"] == {"answered": 1, "total": 3}
        assert [n["node"] for n in doc["nodes"]] == [healthy.http_address]
        # only the healthy node's numbers (100 + 20 published there), never a failed node's last ones
        assert doc["message_count"] == 120
        for m in doc["nodes_missing"]:
            assert m["since"] is not None and m["last_seen"] is not None and m["last_seen"] <= m["since"]

        code, doc, _ = await call("GET", admin.url + "api/topics/orders/archive")
        assert code == 200 and doc["partial"] == {"answered": 1, "total": 3}
        assert _missing(doc) == {hung.http_address: "unreachable", killed.http_address: "gone"}

        code, doc, _ = await call("GET", admin.url + "api/nodes")
        assert code == 200 and doc["partial"] == {"answered": 1, "total": 3}
        by_node = {f"127.0.0.1:{n['http_port']}": n for n in doc["nodes"]}
        assert by_node[hung.http_address]["status"] == "unreachable"
        assert by_node[killed.http_address]["status"] == "gone"
        ok = by_node[healthy.http_address]
        assert ok["status"] == "ok" and ok["uptime_seconds"] >= 0 and ok["version"]
        assert ok["depth"] > 0 and ok["clients"] == 1

        code, doc, _ = await call("GET", admin.url + "api/counter")
        assert code == 200 and doc["partial"] == {"answered": 1, "total": 3}
        stale = {v["node"] for v in doc["stats"].values() if v.get("stale")}
        assert stale == {hung.http_address, killed.http_address}

        async def solo_gap() -> bool:
            await within(admin.poll())
            h = admin._history.overview()["topics"]["solo"]
            return h["depth"][-1] is None and 7 in h["depth"]
        await until(solo_gap, "a gap (not the last value) in topic solo's history")

        # --- what the browser shows ------------------------------------------------------------------
        await browser.get(admin.url + "topics")
        await browser.until("return document.getElementById('live').classList.contains('warn')",
                            "the live dot to turn to a warning")
        solo = 'tr[data-row="topic:solo"]'
        await browser.until(f"return document.querySelector('{solo} [data-v=\"depth\"] .stale')",
                            "topic solo's depth greyed as the last value")
        assert await browser.text(f'{solo} [data-v="depth"]') == "last 7"
        assert "not answering" in await browser.text(solo)
        await browser.screenshot("failed-topics")
        await _settled(browser, "the topics page")

        await browser.get(admin.url + "topics/orders")
        failed = await browser.css("tr.failed")
        texts = sorted([await browser._run(lambda e=e: e.text) for e in failed])
        assert len(texts) == 2
        assert any("gone from nsqlookupd since" in t and "last seen" in t for t in texts), texts
        assert any("unreachable since" in t and "last seen" in t for t in texts), texts
        assert "partial: 1 of 3 nodes" in await browser.text('tr.total')
        await browser.until("return document.getElementById('live').classList.contains('warn')", "warning dot")
        await browser.screenshot("failed-topic")
        await _settled(browser, "the topic page")

        await browser.get(admin.url + "topics/orders/archive")
        assert "partial: 1 of 3 nodes" in await browser.text("tr.total")
        assert len(await browser.css("tr.failed")) == 2
        await browser.screenshot("failed-channel")
        # the charts: the hung node's samples are gaps (shaded), not zeros
        await browser.until("return document.querySelector('figure[data-chart=\"depth\"] rect.gap')",
                            "a gap in the channel's depth chart")
        await browser.js("document.querySelector('.charts-panel').scrollIntoView()")
        await browser.screenshot("failed-channel-charts")

        await browser.get(admin.url + "nodes")
        assert "unreachable since" in await browser.text(f'tr[data-row="missing:{hung.http_address}"]')
        assert "gone from nsqlookupd" in await browser.text(f'tr[data-row="missing:{killed.http_address}"]')
        assert "reachable" in await browser.text(f'tr[data-row="node:{healthy.http_address}"]')
        await browser.screenshot("failed-nodes")
        await _settled(browser, "the nodes page")

        await browser.get(admin.url + f"nodes/{hung.http_address}")
        assert "unreachable since" in await browser.text(".node-status")
        await _settled(browser, "a hung node's page")

        await browser.get(admin.url + f"nodes/{healthy.http_address}")
        assert "worker-1" in await browser.text('tr.client-row')
        await browser.screenshot("node-clients")
        await _settled(browser, "the healthy node's page")

        await browser.get(admin.url + "counter")
        assert "partial: 1 of 3 nodes" in await browser.text("#counter-partial")
        await browser.screenshot("failed-counter")
        assert await browser.console_errors() == []

        # --- layout: every page at 400, 1280 and 1400 pixels --------------------------------------
        for name, path in (("layout-topics", "topics"), ("layout-topic", "topics/orders"),
                           ("layout-channel", "topics/orders/archive"), ("layout-nodes", "nodes"),
                           ("layout-node", f"nodes/{healthy.http_address}"), ("layout-counter", "counter"),
                           ("layout-lookup", "lookup")):
            await browser.get(admin.url + path)
            for width in (400, 1280, 1400):
                await _fits(browser, width, name)
        await browser._run(browser.driver.execute_cdp_cmd, "Emulation.clearDeviceMetricsOverride", {})
    finally:
        await consumer.close()
