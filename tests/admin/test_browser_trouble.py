"""Issue 17 item 4 in headless Chromium: trouble stands out (backlog per topic, badges, sorting, marked
channels, confirmations that say what happens, an outcome message that survives a navigation), and the
page script's duration format (item 6).  Screenshots go to ``test-artifacts/admin/``."""

from __future__ import annotations

import pytest
import pytest_twisted

import re

from admin_helpers import call, create_channel, nsqd_stats, publish, within
from test_browser import pytestmark as browser_marks, subscribe

pytestmark = list(browser_marks)


@pytest.mark.admin_options(refresh_interval=0.3, history_interval=0.3)
@pytest_twisted.ensureDeferred
async def test_topics_list_shows_backlog_badges_and_sorts(admin, nsqds, browser) -> None:
    # refunds: nothing in the topic's own queue, 9,000 waiting in its channels (on two nodes), no consumer
    for n in nsqds:
        await create_channel(n, "refunds", "audit")
    await publish(nsqds[0], "refunds", [b"r"] * 5000)
    await publish(nsqds[1], "refunds", [b"r"] * 4000)
    await publish(nsqds[0], "clicks", [b"c"] * 3)  # no channel: 3 in the topic's own queue
    await create_channel(nsqds[1], "tmp%23ephemeral", "c%23ephemeral")
    consumer = await subscribe(nsqds[1], "tmp#ephemeral", "c#ephemeral", rdy=0)
    try:
        for _ in range(2):
            await within(admin.poll())
        await browser.get(admin.url + "topics")
        row = 'tr[data-row="topic:refunds"]'
        assert await browser.text(f'{row} [data-v="backlog"]') == "9,000"
        assert await browser.text(f'{row} [data-v="depth"]') == "0"
        assert await browser.text('tr[data-row="topic:clicks"] [data-v="backlog"]') == "0"
        assert "ephemeral" in await browser.text('tr[data-row="topic:tmp#ephemeral"] td.name')
        heads = [await browser._run(lambda e=e: e.text) for e in await browser.css("thead th")]
        assert len(heads) == len(set(heads)), heads  # no two columns share a heading

        def order() -> str:
            return ("return Array.from(document.querySelectorAll('tbody tr[data-row]'))"
                    ".map(function (r) { return r.dataset.row; })")
        # Channel backlog, biggest first; a second click reverses; the order survives refreshes
        await browser.click("thead th:nth-child(3)")
        rows = await browser.js(order())
        assert rows[0] == "topic:refunds", rows
        await browser.click("thead th:nth-child(3)")
        assert (await browser.js(order()))[-1] == "topic:refunds"
        polls = await browser.js("return window.nsqadmin.polls")
        await browser.until(f"return window.nsqadmin.polls > {polls} + 1", "two more refreshes")
        assert (await browser.js(order()))[-1] == "topic:refunds"
        assert await browser.js("return document.querySelector('thead th:nth-child(3)').getAttribute('aria-sort')") \
            == "ascending"
        await browser.screenshot("topics-backlog-sorted")

        # the channel with a backlog and no consumer is marked on the topic page
        await browser.get(admin.url + "topics/refunds")
        assert "backlog, no consumer" in await browser.text('tr[data-row="channel:audit"]')
        assert await browser.css('tr.trouble[data-row="channel:audit"]')
        # confirmations say what will happen
        await browser.click('button[data-action="empty"]')
        await browser.until("return document.getElementById('confirm').open", "the confirmation")
        assert "discard the 0 messages queued at the topic on 2 nodes" in await browser.text("#confirm-text")
        await browser.click("#confirm-no")
        await browser.get(admin.url + "topics/refunds/audit")
        await browser.click('button[data-action="empty"]')
        await browser.until("return document.getElementById('confirm').open", "the confirmation")
        assert "Empty channel refunds/audit: discard all 9,000 messages on 2 nodes (9,000 queued, 0 in flight, " \
               "0 deferred)?" in await browser.text("#confirm-text")
        await browser.screenshot("channel-confirm-empty")
        await browser.click("#confirm-no")

        # after Delete Channel the page moves to the topic, and the outcome is still said there
        await browser.click('button[data-action="delete"]')
        await browser.until("return document.getElementById('confirm').open", "the confirmation")
        assert "all 9,000 messages on 2 nodes (9,000 queued, 0 in flight, 0 deferred) are discarded and its " \
               "0 consumers disconnected" in await browser.text("#confirm-text")
        await browser.click("#confirm-yes")
        await browser.until("return location.pathname === '/topics/refunds' && "
                            "!document.getElementById('flash').hidden", "the topic page with the outcome")
        assert "Channel refunds/audit deleted." in await browser.text("#flash")
        await browser.screenshot("flash-after-delete")
        stats = await nsqd_stats(nsqds[0])
        assert [c["channel_name"] for t in stats["topics"] if t["topic_name"] == "refunds"
                for c in t["channels"]] == []
        assert await browser.console_errors() == []
    finally:
        await consumer.close()


@pytest_twisted.ensureDeferred
async def test_page_script_formats_durations_like_the_server(admin, browser) -> None:
    await browser.get(admin.url + "topics")
    assert await browser.js("return window.nsqadmin.fmt.nanotohuman(3600e9 + 39 * 60e9 + 277.81e6)") == "1h39m0.28s"
    assert await browser.js("return window.nsqadmin.fmt.nanotohuman(277.81e6)") == "277.81ms"
    code, _, _ = await call("GET", admin.url + "topics")
    assert code == 200


@pytest.mark.admin_options(history_interval=3600.0, refresh_interval=0.3)
@pytest_twisted.ensureDeferred
async def test_chart_paths_follow_the_data(admin, nsqds, browser) -> None:
    """In Chromium, the channel page's depth chart has one path piece per run of answers (the gap
    between them is shaded, not drawn as zero), its points sit at the data's heights, and hovering
    reads the value out."""
    from twisted.internet import reactor

    from test_details import _chan

    await create_channel(nsqds[0], "t", "c")
    node = nsqds[0].http_address
    now = reactor.seconds()
    admin._history.samples.clear()
    # five minutes of samples 10 s apart: depth a triangle wave 0..100, a 3-sample gap in the middle
    depths = [None if 14 <= i <= 16 else abs(5 - i % 10) * 20 for i in range(30)]
    for i, depth in enumerate(depths):
        stats = [] if depth is None else [_chan(node, depth, 0, 50 * i, in_flight=5, clients=2)]
        admin._history.record(now - 290 + 10 * i, stats, failed=[node] if depth is None else [])
    b = browser
    await b.get(admin.url + "topics/t/c")
    fig = 'figure[data-chart="depth"]'
    await b.until(f"return document.querySelector('{fig} path[data-series=\"memory_depth\"]')"
                  " && window.nsqadmin.charts >= 1", "the depth chart")
    d = await b.js(f"return document.querySelector('{fig} path[data-series=\"memory_depth\"]').getAttribute('d')")
    assert d.count("M") == 2, d  # one piece before the gap, one after
    ys = [float(y) for y in re.findall(r"[ML][\d.]+,([\d.]+)", d)]
    assert len(ys) == 27 and min(ys) == 8.0 and max(ys) == 148.0, d  # 100 at the top of 0..100, 0 at the bottom
    assert len(await b.css(f"{fig} rect.gap")) == 3
    labels = await b.js(f"return Array.from(document.querySelectorAll('{fig} text.axis.y'))"
                        ".map(function (t) { return t.textContent; })")
    assert labels == ["0", "50", "100"]
    await b.js(f"""var svg = document.querySelector('{fig} svg');
        var box = svg.getBoundingClientRect(); var vb = svg.viewBox.baseVal;
        var first = svg.querySelector('path[data-series="memory_depth"]').getAttribute('d').split('L')[0];
        var x = parseFloat(first.slice(1).split(',')[0]);
        svg.dispatchEvent(new MouseEvent('mousemove', {{clientX: box.left + x / vb.width * box.width,
                                                        clientY: box.top + 10}}));""")
    assert "memory 100" in await b.text(f"{fig} .readout")
    await b.js("document.querySelector('.charts-panel').scrollIntoView()")
    await b.screenshot("channel-charts")
    await b.click('button[data-range="3600"]')
    await b.until("return document.querySelector('button[data-range=\"3600\"]').getAttribute('aria-pressed')"
                  " === 'true'", "the 1 h range")
    assert await b.console_errors() == []
