"""Issue 27 in headless Chromium on a failing cluster: three nsqd processes, one hung with SIGSTOP and one
SIGKILLed (the ``processes`` fixture of ``test_failures``).

- item 1: a confirmation names the holders that do not answer (their messages are not counted);
- item 2: the Nodes page keeps "unreachable since ... last seen ..." through live refreshes, and at
  400 px the badge wraps instead of being cut;
- item 4: the killed node's share is marked (amber, "partial") in the charts instead of reading as a
  drain; the index sparklines break during the hang instead of dipping; the hung node's page shows no
  0s as current numbers;
- item 9: a node removed on purpose can be forgotten at once; the Counter says why its rate chart is
  blank; an unknown topic's page says what that means; at 400 px the footer addresses do not break and
  no empty group-heading row sits above the tables.

Screenshots go to ``test-artifacts/admin/``.
"""

from __future__ import annotations

from typing import Any

import pytest_twisted

from admin_helpers import call, publish, within
from test_browser import pytestmark as browser_marks
from test_failures import _missing, _settled, processes, until  # noqa: F401  (processes is a fixture)

pytestmark = list(browser_marks)


async def _width(browser: Any, width: int | None) -> None:
    if width is None:
        await browser._run(browser.driver.execute_cdp_cmd, "Emulation.clearDeviceMetricsOverride", {})
        return
    await browser._run(browser.driver.execute_cdp_cmd, "Emulation.setDeviceMetricsOverride",
                       {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False})


@pytest_twisted.ensureDeferred
async def test_an_operator_on_a_failing_cluster(processes, browser) -> None:  # noqa: F811
    admin, lookupd, procs = processes
    healthy, hung, killed = procs
    for p in procs:
        await publish(p, "orders", [b"o"] * 100)
        code, _, _ = await call("POST", f"http://{p.http_address}/channel/create?topic=orders&channel=archive")
        assert code == 200

    async def all_sampled() -> bool:
        await within(admin.poll())
        h = admin._history.topic("orders")
        return len(h["nodes"]) == 3 and h["topic"]["depth"][-1] is not None
    await until(all_sampled, "the history to hold orders on all three nodes")
    for _ in range(3):
        await within(admin.poll())

    # the kill first: samples in which only its share is missing (partial, not a gap), then the hang
    killed.signal("KILL")
    await within(killed.ended, 15.0)

    async def partial_in_history() -> bool:
        await within(admin.poll())
        return any(admin._history.charts(topic="orders", channel="archive")["partial"])
    await until(partial_in_history, "a sample with the killed node gone")
    hung.signal("STOP")

    async def both_marked() -> Any:
        code, doc, _ = await call("GET", admin.url + "api/topics/orders/archive")
        if code == 200 and _missing(doc) == {hung.http_address: "unreachable", killed.http_address: "gone"}:
            return doc
        return None
    await until(both_marked, "the channel to list the hung node as unreachable and the killed one as gone")

    async def marked_in_history() -> bool:
        await within(admin.poll())
        doc = admin._history.charts(topic="orders", channel="archive")
        over = admin._history.overview()["topics"]["orders"]
        return doc["gaps"][-1] and over["gaps"][-1]
    await until(marked_in_history, "the history to hold samples with the node gone and the hang")

    # --- item 2: the Nodes page keeps the failure times through live refreshes --------------------
    await browser.get(admin.url + "nodes")
    await _settled(browser, "the nodes page")
    hung_row = f'tr[data-row="missing:{hung.http_address}"]'
    text = await browser.text(f"{hung_row} td.status")
    assert "unreachable since" in text and "last seen" in text, text
    assert "gone from nsqlookupd since" in await browser.text(f'tr[data-row="missing:{killed.http_address}"] td.status')
    assert await browser.text(f'tr[data-row="node:{healthy.http_address}"] td.status') == "reachable"
    await _width(browser, 400)
    box = await browser.js(f"var b = document.querySelector('{hung_row} .badge.danger').getBoundingClientRect();"
                           " return [b.right, document.documentElement.clientWidth];")
    assert box[0] <= box[1], f"the badge ends at {box[0]}px in a {box[1]}px window"
    assert await browser.js(f"var b = document.querySelector('{hung_row} .badge.danger');"
                            " return b.scrollWidth <= b.clientWidth + 1")
    # the footer's addresses never break inside
    assert await browser.js("return Array.from(document.querySelectorAll('.foot .addr'))"
                            ".every(function (a) { return a.getClientRects().length === 1; })")
    await browser.screenshot("nodes-failed-400")
    await _width(browser, None)

    # --- item 9: forget the killed node -------------------------------------------------------------
    await browser.click(f'tr[data-row="missing:{killed.http_address}"] button[data-action="forget"]')
    await browser.until("return document.getElementById('confirm').open", "the confirmation")
    assert "Forget node" in await browser.text("#confirm-text")
    await browser.click("#confirm-yes")
    await browser.until(f"return !document.querySelector('tr[data-row=\"missing:{killed.http_address}\"]')",
                        "the forgotten node's row to go")
    code, doc, _ = await call("GET", admin.url + "api/nodes")
    assert doc["partial"] == {"answered": 1, "total": 2}
    assert killed.http_address not in {f"127.0.0.1:{n['http_port']}" for n in doc["nodes"]}
    # the hung node is still listed by nsqlookupd: it cannot be forgotten (it would come back at once)
    code, doc, _ = await call("POST", admin.url + f"api/nodes/{hung.http_address}", {"action": "forget"})
    assert code == 400 and doc["message"].startswith("NODE_NOT_GONE")
    await browser.screenshot("nodes-after-forget")

    # --- item 1: the confirmation names the holder that does not answer -------------------------------
    await browser.get(admin.url + "topics/orders/archive")
    await browser.until("return window.nsqadmin.polls >= 1", "the first refresh")
    await browser.click('button[data-action="empty"]')
    await browser.until("return document.getElementById('confirm').open", "the confirmation")
    text = await browser.text("#confirm-text")
    assert "discard all 100 messages on 1 node" in text, text
    assert f"1 more node holding it does not answer ({hung.http_address} unreachable): its messages are not " \
           "counted here and this does not reach it." in text, text
    await browser.screenshot("confirm-with-unanswering-holder")
    await browser.click("#confirm-no")
    # at 400 px no empty group-heading row sits above the table
    await _width(browser, 400)
    assert await browser.js("return Array.from(document.querySelectorAll('thead tr.group-row'))"
                            ".every(function (r) { return r.getBoundingClientRect().height === 0; })")
    # ... and the failed rows' badges stay within the window
    rights = await browser.js("return Array.from(document.querySelectorAll('tr.failed .badge.danger'))"
                              ".map(function (b) { return b.getBoundingClientRect().right; })")
    assert rights and max(rights) <= 400, rights
    await browser.screenshot("channel-failed-400")
    await _width(browser, None)

    # --- item 4: charts mark the killed node's share as partial ---------------------------------------
    await browser.get(admin.url + "topics/orders")
    fig = 'figure[data-chart="depth"]'
    await browser.until(f"return document.querySelector('{fig} rect.partial')", "the partial samples to be marked")
    assert killed.http_address in await browser.text(f"{fig} .chart-note")
    await browser.js("document.querySelector('.charts-panel').scrollIntoView()")
    await browser.screenshot("topic-charts-partial")

    # --- item 4: the index sparklines break during the hang instead of dipping --------------------------
    await browser.get(admin.url + "topics")
    spark = 'tr[data-row="topic:orders"] svg[data-spark="topics/orders/backlog"] path.line'
    await browser.until(f"return document.querySelector('{spark}')", "the backlog sparkline")
    d = await browser.js(f"return document.querySelector('{spark}').getAttribute('d')")
    assert "120.0," not in d, d  # nothing drawn at the newest sample (a gap, not a partial sum)

    # --- item 4: the hung node's page shows no current numbers ------------------------------------------
    await browser.get(admin.url + f"nodes/{hung.http_address}")
    await _settled(browser, "the hung node's page")
    cards = await browser.js("return Array.from(document.querySelectorAll('.cards .card .big'))"
                             ".map(function (c) { return c.textContent; })")
    assert cards[0] == "last 1" and cards[1] == "last 1", cards  # topics, channels as last reported
    assert cards[3] == "\u2013", cards  # messages: nothing current
    assert "0" not in cards[:4], cards
    await browser.screenshot("node-hung-cards")

    # --- item 9: the Counter says why its rate chart is blank --------------------------------------------
    await browser.get(admin.url + "counter")
    await browser.until("return document.querySelector('.spark-caption').textContent.length > 0", "the caption")
    assert "does not answer" in await browser.text(".spark-caption")
    await browser.screenshot("counter-rate-why")

    assert await browser.console_errors() == []

    # --- item 9: an unknown topic's page says what that means (a 404, which Chromium logs) ---------------
    await browser.get(admin.url + "topics/no-such-topic")
    text = await browser.text("main")
    assert "Topic not found" in text and "no-such-topic" in text and "deleted, or never created" in text, text
    await browser.screenshot("topic-not-found")
