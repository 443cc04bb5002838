"""Issue 27 in headless Chromium, on embedded nsqd: what an operator meets on a busy cluster.

- item 1: the confirmations say what ``/channel/empty`` and ``/channel/delete`` really do (checked by
  doing it on live nsqd), with the counts the table shows when the button is pressed;
- item 3: a consumer's numbers on the node page sit under their own headings;
- item 4: a topic or channel created a moment ago is not shaded as "a node did not answer", and a topic's
  depth chart is its backlog (its channels'), not its own queue;
- item 5: a channel whose backlog grows although it has consumers is marked "growing", and every channel
  table says how long its oldest queued message has waited.

Screenshots go to ``test-artifacts/admin/``.
"""

from __future__ import annotations

import re

import pytest
import pytest_twisted

from admin_helpers import call, create_channel, nsqd_stats, publish, within
from test_browser import pytestmark as browser_marks, subscribe
from nsqtw.testing import command

pytestmark = list(browser_marks)


def _channel(stats: dict, topic: str, channel: str) -> dict:
    (t,) = [t for t in stats["topics"] if t["topic_name"] == topic]
    (c,) = [c for c in t["channels"] if c["channel_name"] == channel]
    return c


@pytest.mark.admin_options(refresh_interval=0.3, history_interval=3600.0)
@pytest_twisted.ensureDeferred
async def test_confirmations_say_what_nsqd_does_with_the_live_counts(admin, nsqds, browser) -> None:
    from nsqtw.admin.pages import confirm_text

    for n in nsqds:
        await create_channel(n, "t", "c")
    await publish(nsqds[0], "t", [b"a%d" % i for i in range(8)])
    await publish(nsqds[1], "t", [b"b%d" % i for i in range(4)])
    consumer = await subscribe(nsqds[0], "t", "c", rdy=4, client_id="worker-7")
    try:
        got = [await within(consumer.message()) for _ in range(4)]
        consumer.send(command("RDY", 0))  # no more for now (a FIN would make room for another)
        consumer.send(command("FIN", got[0].id.decode()))            # finished: 1
        consumer.send(command("REQ", got[1].id.decode(), 60000))     # deferred a minute: 1 (requeued: 1)
        # held: got[2], got[3] in flight; queued: 4 on the first node, 4 on the second

        async def settled() -> bool:
            c = _channel(await nsqd_stats(nsqds[0]), "t", "c")
            return c["in_flight_count"] == 2 and c["deferred_count"] == 1 and c["depth"] == 4
        for _ in range(50):
            if await settled():
                break
            await within(admin.poll())
        assert await settled()

        # --- item 3: the node page's client row, cell by cell under its heading -----------------
        await browser.get(admin.url + f"nodes/{nsqds[0].http_address}")
        under = await browser.js("""
            var heads = Array.from(document.querySelectorAll('thead tr:last-child th')).map(function (th) {
              return th.textContent.trim(); });
            var row = document.querySelector('tr.client-row');
            var out = {}; var col = 0;
            Array.from(row.cells).forEach(function (td) {
              if (td.colSpan === 1) { out[heads[col]] = td.textContent.trim(); }
              col += td.colSpan; });
            out.width = col; out.columns = heads.length;
            return out;""")
        assert under["width"] == under["columns"], under
        assert under["In-Flight"] == "2", under
        assert under["Deferred / RDY"] == "0", under             # RDY
        assert under["Requeued / Finished"] == "1", under        # finished
        assert under["Timed Out / Requeued"] == "1", under       # requeued
        assert under["Messages"] == "4", under                   # delivered to this client
        await browser.screenshot("node-client-row-aligned")

        # --- item 1: the counts are the ones the table shows when the button is pressed --------------
        await browser.get(admin.url + "topics/t/c")
        await browser.until("return window.nsqadmin.polls >= 1", "the first refresh")
        await publish(nsqds[1], "t", [b"late"] * 100)  # after the page was built
        await browser.until("return document.querySelector('tr.total [data-v=\"depth\"]').textContent === '108'",
                            "the table to show the new backlog")
        await browser.click('button[data-action="empty"]')
        await browser.until("return document.getElementById('confirm').open", "the confirmation")
        text = await browser.text("#confirm-text")
        assert text.startswith("Empty channel t/c: discard all 111 messages on 2 nodes (108 queued, 2 in flight, "
                               "1 deferred)? In-flight and deferred messages are dropped too"), text
        code, doc, _ = await call("GET", admin.url + "api/topics/t/c")
        assert code == 200 and confirm_text("empty", "t", "c", doc) == text  # the server's text is the same
        await browser.screenshot("confirm-empty-live-counts")
        await browser.click("#confirm-no")

        await browser.click('button[data-action="delete"]')
        await browser.until("return document.getElementById('confirm').open", "the confirmation")
        text = await browser.text("#confirm-text")
        assert "all 111 messages on 2 nodes (108 queued, 2 in flight, 1 deferred) are discarded and its " \
               "1 consumer disconnected." in text, text
        await browser.click("#confirm-no")

        # what the dialog says is what nsqd does: after Empty, nothing queued, in flight or deferred
        await browser.click('button[data-action="empty"]')
        await browser.until("return document.getElementById('confirm').open", "the confirmation")
        await browser.click("#confirm-yes")
        await browser.until("return !document.getElementById('flash').hidden", "the outcome")
        for n in nsqds:
            c = _channel(await nsqd_stats(n), "t", "c")
            assert (c["depth"], c["in_flight_count"], c["deferred_count"]) == (0, 0, 0), c
        # ... and a consumer can no longer finish what it held
        consumer.send(command("FIN", got[2].id.decode()))
        assert (await within(consumer.error())).startswith(b"E_FIN_FAILED")

        # Delete: every message goes and the consumer is disconnected, as the dialog says
        await publish(nsqds[0], "t", [b"again"] * 3)
        await browser.until("return document.querySelector('tr.total [data-v=\"depth\"]').textContent === '3'",
                            "the table to show the new messages")
        await browser.click('button[data-action="delete"]')
        await browser.until("return document.getElementById('confirm').open", "the confirmation")
        assert "all 3 messages on 2 nodes (3 queued, 0 in flight, 0 deferred) are discarded and its 1 consumer " \
               "disconnected." in await browser.text("#confirm-text")
        await browser.click("#confirm-yes")
        await within(consumer.closed)
        for n in nsqds:
            (t,) = [t for t in (await nsqd_stats(n))["topics"] if t["topic_name"] == "t"]
            assert t["channels"] == []
        await browser.until("return location.pathname === '/topics/t'", "the topic page")

        # a tab in the background does not poll; shown again, it polls at once
        await browser.js("Object.defineProperty(document, 'hidden', {configurable: true, get: function () {"
                         " return true; }}); window.__polls = window.nsqadmin.polls;")
        await browser.until("return (window.nsqadmin.skipped || 0) >= 2", "two skipped refreshes")
        assert await browser.js("return window.nsqadmin.polls - window.__polls") <= 1
        await browser.js("Object.defineProperty(document, 'hidden', {configurable: true, get: function () {"
                         " return false; }}); document.dispatchEvent(new Event('visibilitychange'));")
        await browser.until("return window.nsqadmin.polls >= window.__polls + 2", "polling again once shown")
        assert await browser.console_errors() == []
    finally:
        await consumer.close()


@pytest.mark.admin_options(refresh_interval=0.3, history_interval=3600.0)
@pytest_twisted.ensureDeferred
async def test_growing_backlog_and_oldest_message_age(admin, nsqds, browser) -> None:
    await create_channel(nsqds[0], "g", "slow")
    await create_channel(nsqds[0], "g", "idle")
    consumer = await subscribe(nsqds[0], "g", "slow", rdy=0)  # a consumer that takes nothing: falls behind
    try:
        for i in range(5):
            await publish(nsqds[0], "g", [b"m"] * (10 + i))
            await within(admin.poll())
        await browser.get(admin.url + "topics/g")
        slow = 'tr[data-row="channel:slow"]'
        assert "growing" in await browser.text(slow)
        # idle has no consumer: it is "backlog, no consumer", not "growing"
        idle = await browser.text('tr[data-row="channel:idle"]')
        assert "backlog, no consumer" in idle and "growing" not in idle
        # the page script computes the same marks: no re-render loop
        await browser.until("return window.nsqadmin.polls >= 3", "three refreshes")
        assert await browser.js("return window.nsqadmin.fragments") == 0
        oldest = await browser.text(f'{slow} [data-v="oldest"]')
        assert re.fullmatch(r"\d+s", oldest), oldest
        await browser.screenshot("topic-growing-oldest")
        # no longer rising: the mark goes
        await within(admin.poll())
        await browser.until(f"return !document.querySelector('{slow}').textContent.includes('growing')",
                            "the growing mark to go once the backlog stops rising")

        await browser.get(admin.url + "topics/g/slow")
        assert re.fullmatch(r"\d+s", await browser.text('tr.total [data-v="oldest"]'))
        assert await browser.console_errors() == []
    finally:
        await consumer.close()


@pytest.mark.admin_options(refresh_interval=0.3, history_interval=3600.0)
@pytest_twisted.ensureDeferred
async def test_new_topic_is_not_shaded_and_topic_depth_is_its_backlog(admin, nsqds, browser) -> None:
    """A topic created 10 s ago: the minutes before are blank, not "a node did not answer"; the topic's
    Backlog chart follows its channels (its own queue is 0 once it has channels)."""
    from twisted.internet import reactor

    from nsqtw.admin.cluster import ChannelStats, TopicStats

    def _chan(node: str, depth: int, backend: int, msgs: int, topic: str) -> TopicStats:
        cs = ChannelStats(node=node, topic_name=topic, channel_name="c", depth=depth, memory_depth=depth - backend,
                          backend_depth=backend, message_count=msgs, client_count=1)
        return TopicStats(node=node, topic_name=topic, message_count=msgs, channels=[cs])

    node = nsqds[0].http_address
    await create_channel(nsqds[0], "fresh", "c")
    now = reactor.seconds()
    admin._history.samples.clear()
    for i in range(30):  # 5 minutes, the topic only in the last 3 samples, with 700 waiting in channel c
        rows = [_chan(node, 700, 0, 10 * i, topic="fresh")] if i >= 27 else []
        admin._history.record(now - 290 + 10 * i, rows, failed=[])
    doc = admin._history.charts(topic="fresh", since=now - 300)
    assert not any(doc["gaps"]) and doc["created"] == int(now - 20)
    assert doc["series"]["memory_depth"][-1] == 700
    await browser.get(admin.url + "topics/fresh")
    fig = 'figure[data-chart="depth"]'
    await browser.until(f"return document.querySelector('{fig} path[data-series=\"memory_depth\"]')"
                        " && window.nsqadmin.charts >= 1", "the backlog chart")
    assert await browser.css(f"{fig} rect.gap") == []
    assert await browser.css(f"{fig} line.created")
    assert "Backlog" in await browser.text(f"{fig} figcaption")
    assert "created" in await browser.text(f"{fig} .chart-note")
    labels = await browser.js(f"return Array.from(document.querySelectorAll('{fig} text.axis.y'))"
                              ".map(function (t) { return t.textContent; })")
    assert labels[-1] in ("1k", "1000"), labels  # the 700 waiting in the channel, not the topic's 0
    await browser.js("document.querySelector('.charts-panel').scrollIntoView()")
    await browser.screenshot("topic-created-backlog-chart")
    assert await browser.console_errors() == []


@pytest.mark.admin_options(refresh_interval=1.0, history_interval=3600.0)
@pytest_twisted.ensureDeferred
async def test_two_windows_share_one_poll_per_interval(admin, nsqds, browser) -> None:
    """Item 9: a second window on the same nsqadmin mostly uses what the first fetched less than an
    interval ago instead of asking nsqadmin (and through it every nsqd) again."""
    await create_channel(nsqds[0], "t", "c")
    counts = "return [window.nsqadmin.fetched, window.nsqadmin.shared, window.nsqadmin.polls]"
    await browser.get(admin.url + "topics")
    first = browser.driver.current_window_handle
    await browser._run(browser.driver.switch_to.new_window, "window")
    await browser.get(admin.url + "topics")
    await browser.until("return window.nsqadmin.polls >= 5", "five refreshes in the second window")
    second = await browser.js(counts)
    await browser._run(browser.driver.switch_to.window, first)
    one = await browser.js(counts)
    fetched, shared, polls = (a + b for a, b in zip(one, second, strict=True))
    assert shared > 0, (one, second)
    # every poll wants two answers (/api/topics and /api/history); shared ones were not asked for
    assert fetched + shared == 2 * polls or fetched + shared == 2 * polls + 2, (one, second)
    assert fetched < 2 * polls, (one, second)
    assert await browser.console_errors() == []
