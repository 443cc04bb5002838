"""Issue 26 item 5 in headless Chromium: nsqadmin's node page of a replicated nsqtw origin shows
the Replication panel, keeps it live without re-rendering the page while nothing changes
shape (no fragment refresh per poll), and re-renders it when the peer goes down."""

from __future__ import annotations

import pytest_twisted
from twisted.internet import defer, reactor

from test_browser import pytestmark as browser_marks
from nsqtw.embed import start_nsqd

pytestmark = list(browser_marks)


async def until(predicate, seconds: float = 10.0) -> None:
    for _ in range(int(seconds / 0.02)):
        if predicate():
            return
        d = defer.Deferred()
        reactor.callLater(0.02, d.callback, None)
        await d
    raise AssertionError("condition not reached")


@pytest_twisted.ensureDeferred
async def test_replication_panel_is_live_and_follows_the_peer(start_admin, browser) -> None:
    peer = await start_nsqd(replication_insecure=True, node_id=2, replication_address="127.0.0.1:0")
    address = f"127.0.0.1:{peer._service.replication_port}"
    origin = await start_nsqd(replication_insecure=True, node_id=1, replica_peers=[address], replication_degraded="accept")
    try:
        await until(lambda: origin._service.replication.origin.in_sync() == 1)
        admin = await start_admin(nsqd_http_addresses=[f"127.0.0.1:{origin.http_port}"],
                                  refresh_interval=0.3, history_interval=0.3)
        await browser.get(admin.url + f"nodes/127.0.0.1:{origin.http_port}")
        await browser.js("window.__same_page = true")
        row = f'tr[data-row="peer:{address}:in_sync"]'
        assert await browser.text(f'{row} [data-v="lag_messages"]') == "0"
        polls = await browser.js("return window.nsqadmin.polls")
        await browser.until(f"return window.nsqadmin.polls >= {polls + 3}", "three more polls")
        assert await browser.js("return window.nsqadmin.fragments") == 0  # same shape: cells only
        await peer.stop()
        await until(lambda: origin._service.replication.origin.in_sync() == 0)
        await browser.until(f"return document.querySelector('tr[data-row=\"peer:{address}:down\"]')",
                            "the peer's row to say down")
        assert await browser.js("return window.__same_page === true && window.nsqadmin.fragments >= 1")
        assert "down" in await browser.text(f'tr[data-row="peer:{address}:down"]')
        await browser.screenshot("node-replication")
        assert await browser.console_errors() == []
    finally:
        await origin.stop()
        if peer._service.running:
            await peer.stop()
