"""Issue 47 in headless Chromium: nsqadmin's node page of a replicated nsqtw node offers an admin
Drain; its dialog says what will happen (publishes refused, nsqlookupd, the peer in sync that
takes the messages); confirmed, the node drains and the page shows it, and Undrain serves again."""

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
async def test_drain_from_the_node_page(start_admin, browser) -> None:
    peer = await start_nsqd(replication_insecure=True, node_id=2, replication_address="127.0.0.1:0")
    address = f"127.0.0.1:{peer._service.replication_port}"
    origin = await start_nsqd(replication_insecure=True, node_id=1, replica_peers=[address])
    try:
        await until(lambda: origin._service.replication.origin.in_sync() == 1)
        node = f"127.0.0.1:{origin.http_port}"
        admin = await start_admin(nsqd_http_addresses=[node], refresh_interval=0.3, history_interval=0.3)
        await browser.get(admin.url + f"nodes/{node}")
        await browser.click('button[data-action="drain"]')
        await browser.until("return document.getElementById('confirm').open", "the confirmation")
        text = await browser.text("#confirm-text")
        assert f"Drain node {node}?" in text and "E_PUB_FAILED" in text and address in text, text
        await browser.screenshot("drain-confirm")
        await browser.click("#confirm-yes")
        await until(lambda: origin._service.drain.draining)
        await browser.until("return !!document.querySelector('button[data-action=\"undrain\"]')",
                            "the Undrain button")
        await browser.screenshot("node-drained")
        await browser.click('button[data-action="undrain"]')
        await browser.until("return document.getElementById('confirm').open", "the confirmation")
        await browser.click("#confirm-yes")
        await until(lambda: not origin._service.drain.draining)
    finally:
        await origin.stop()
        await peer.stop()
