"""nsqadmin in a real browser: headless Chromium driven by selenium, against live in-process daemons.

The daemons run in this test's reactor; every selenium call runs in a thread
(``deferToThread``) so the reactor keeps serving while the browser waits.
Screenshots of every page are saved under ``test-artifacts/admin/``.
Needs the Debian packages ``chromium`` and ``chromium-driver``; skipped otherwise.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any
from collections.abc import Callable

import pytest
import pytest_twisted
from twisted.internet import threads

from admin_helpers import call, create_channel, find_channel, nsqd_stats, publish, registered, within
from nsqtw.testing import command, connect_raw, identify_command

CHROMIUM = os.environ.get("NSQTW_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("NSQTW_CHROMEDRIVER", "/usr/bin/chromedriver")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "admin"
WAIT = 15.0

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
    pytestmark.append(pytest.mark.skip(
        reason=f"headless Chromium not found ({CHROMIUM}, {CHROMEDRIVER}); "
               "install it with: apt-get install -y chromium chromium-driver"))

try:
    import selenium  # noqa: F401
except ImportError:  # pragma: no cover - selenium is in the test extras
    pytestmark.append(pytest.mark.skip(reason="selenium is not installed (pip install selenium)"))


class Browser:
    """A selenium Chrome session whose every call runs off the reactor thread."""

    def __init__(self, driver: Any, profile: str) -> None:
        self.driver = driver
        self.profile = profile

    @classmethod
    def start(cls) -> Browser:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        profile = tempfile.mkdtemp(prefix="nsqtw-chromium-")
        opts = webdriver.ChromeOptions()
        opts.binary_location = CHROMIUM
        for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    f"--user-data-dir={profile}", "--window-size=1440,1000"):
            opts.add_argument(arg)
        opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
        driver.set_page_load_timeout(WAIT)
        return cls(driver, profile)

    def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return within(threads.deferToThread(fn, *args), WAIT + 10)

    async def get(self, url: str) -> None:
        await self._run(self.driver.get, url)

    async def js(self, script: str, *args: Any) -> Any:
        return await self._run(self.driver.execute_script, script, *args)

    async def css(self, selector: str) -> list[Any]:
        from selenium.webdriver.common.by import By
        return await self._run(self.driver.find_elements, By.CSS_SELECTOR, selector)

    def _on_one(self, selector: str, act: Callable[[Any], Any]) -> Any:
        """``act`` on the one element matching ``selector``, found again if a live refresh replaced
        it in between (a fragment swap makes the old element stale)."""
        from selenium.common.exceptions import StaleElementReferenceException
        from selenium.webdriver.common.by import By

        for attempt in range(5):
            (el,) = self.driver.find_elements(By.CSS_SELECTOR, selector)
            try:
                return act(el)
            except StaleElementReferenceException:
                if attempt == 4:
                    raise
        return None

    async def text(self, selector: str) -> str:
        return await self._run(self._on_one, selector, lambda el: el.text)

    async def click(self, selector: str) -> None:
        await self._run(self._on_one, selector, lambda el: el.click())

    async def until(self, script: str, what: str) -> Any:
        """Wait (in the browser thread) until a JS expression is truthy; fail after WAIT seconds."""
        from selenium.webdriver.support.ui import WebDriverWait

        def wait() -> Any:
            return WebDriverWait(self.driver, WAIT, poll_frequency=0.1).until(
                lambda d: d.execute_script(script), message=f"timed out waiting for {what}")
        return await self._run(wait)

    async def header(self, name: str | None, value: str = "") -> None:
        """Send an extra request header on every request (what an auth proxy in front would add)."""
        headers = {name: value} if name else {}
        await self._run(self.driver.execute_cdp_cmd, "Network.enable", {})
        await self._run(self.driver.execute_cdp_cmd, "Network.setExtraHTTPHeaders", {"headers": headers})

    async def screenshot(self, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        await self._run(self.driver.save_screenshot, str(path))
        return path

    async def console_errors(self) -> list[Any]:
        logs = await self._run(self.driver.get_log, "browser")
        return [e for e in logs if e.get("level") == "SEVERE"]

    def quit(self) -> None:
        try:
            self.driver.quit()
        finally:
            shutil.rmtree(self.profile, ignore_errors=True)


async def subscribe(nsqd: Any, topic: str, channel: str, rdy: int = 2, **identify: Any) -> Any:
    client = await connect_raw(nsqd.tcp_port)
    client.send(identify_command(feature_negotiation=True, **identify))
    await within(client.response())
    client.send(command("SUB", topic, channel) + command("RDY", rdy))
    assert await within(client.response()) == b"OK"
    return client


@pytest.mark.admin_options(refresh_interval=0.5, history_interval=0.5)
@pytest_twisted.ensureDeferred
async def test_topics_page_shows_a_topic_just_published_to(admin, nsqds, browser) -> None:
    """Publish to an nsqd, open the topics page: the topic is listed and links to its page."""
    await publish(nsqds[0], "browser_topic", [b"hello"] * 3)
    await browser.get(admin.url)
    links = await browser.css('a[href="/topics/browser_topic"]')
    assert len(links) == 1 and await browser._run(lambda: links[0].text) == "browser_topic"
    # the sparkline fills in once nsqadmin has two samples and the page has polled them
    await browser.until("return document.querySelector('svg[data-spark=\"topics/browser_topic/rate\"] path.line')",
                        "the rate sparkline")
    await browser.screenshot("topics")
    assert await browser.console_errors() == []


@pytest.mark.admin_options(refresh_interval=0.5)
@pytest_twisted.ensureDeferred
async def test_channel_page_shows_consumer_then_pause_with_confirmation(admin, nsqds, browser) -> None:
    """The channel page lists a SUBscribed consumer; Pause Channel asks for confirmation, then nsqd's
    /stats says ``paused: true`` and the page offers Unpause without a reload."""
    consumer = await subscribe(nsqds[0], "orders", "archive", client_id="worker-7", hostname="worker7.example",
                               user_agent="nsqtw-browser-test/1.0")
    try:
        await browser.get(admin.url + "topics/orders/archive")
        row = await browser.text('tr[data-row^="client:"]')
        assert "nsqtw-browser-test/1.0" in row and "worker-7" in row and "subscribed" in row
        assert await browser.text(f'tr[data-row="node:{nsqds[0].http_address}"] [data-v="client_count"]') == "1"
        await browser.screenshot("channel")
        await browser.js("window.__same_page = true")

        await browser.click('button[data-action="pause"]')
        await browser.until("return document.getElementById('confirm').open", "the confirmation dialog")
        assert "Pause channel orders/archive on 1 node?" in await browser.text("#confirm-text")
        await browser.screenshot("channel-confirm-pause")
        # cancelling does nothing
        await browser.click("#confirm-no")
        assert find_channel(await nsqd_stats(nsqds[0]), "orders", "archive")["paused"] is False

        await browser.click('button[data-action="pause"]')
        await browser.until("return document.getElementById('confirm').open", "the confirmation dialog")
        await browser.click("#confirm-yes")
        await browser.until("return document.querySelector('button[data-action=\"unpause\"]')", "Unpause Channel")
        assert find_channel(await nsqd_stats(nsqds[0]), "orders", "archive")["paused"] is True
        assert await browser.js("return window.__same_page === true")
        assert "paused" in (await browser.text("#flash")).lower()
        await browser.screenshot("channel-paused")
        assert await browser.console_errors() == []
    finally:
        await consumer.close()


@pytest.mark.admin_options(admin_users=["alice"])
@pytest_twisted.ensureDeferred
async def test_non_admin_gets_no_action_buttons(admin, nsqds, browser) -> None:
    """With --admin-user alice, a browser without the ACL header sees no buttons; as alice it sees them."""
    await create_channel(nsqds[0], "acl", "c")
    await browser.get(admin.url + "topics/acl")
    assert await browser.css("button[data-action]") == []
    assert "read-only" in await browser.text(".who")
    await browser.screenshot("topic-read-only")
    await browser.get(admin.url + "topics/acl/c")
    assert await browser.css("button[data-action]") == []

    await browser.header("X-Forwarded-User", "alice")
    await browser.get(admin.url + "topics/acl")
    actions = sorted([await browser._run(el.get_attribute, "data-action")
                      for el in await browser.css("button[data-action]")])
    assert actions == ["delete", "empty", "pause", "tombstone"]
    assert "alice" in await browser.text(".who")
    await browser.screenshot("topic-admin")
    await browser.header(None)


@pytest.mark.admin_options(refresh_interval=0.3, history_interval=0.3)
@pytest_twisted.ensureDeferred
async def test_pages_refresh_live_without_reload(admin, nsqds, browser) -> None:
    """New messages update the depth cell in place; a new channel appears through a fragment refresh;
    the page itself is never reloaded.  (A consumer that takes nothing keeps the channel from being
    marked "backlog, no consumer", which would rightly re-render the row.)"""
    await create_channel(nsqds[0], "live", "first")
    idle = await subscribe(nsqds[0], "live", "first", rdy=0)
    await browser.get(admin.url + "topics/live")
    await browser.js("window.__same_page = true")
    assert await browser.text('tr[data-row="channel:first"] [data-v="depth"]') == "0"
    await publish(nsqds[0], "live", [b"x"] * 1234)
    await browser.until("return document.querySelector('tr[data-row=\"channel:first\"] [data-v=\"depth\"]')"
                        ".textContent === '1,234'", "the channel depth cell to show 1,234")
    assert await browser.text('tr[data-row="total"] [data-v="message_count"]') == "1,234"
    assert await browser.js("return window.nsqadmin.fragments") == 0
    await create_channel(nsqds[1], "live", "second")
    await browser.until("return document.querySelector('tr[data-row=\"channel:second\"]')", "the new channel row")
    assert await browser.js("return window.__same_page === true && window.nsqadmin.fragments >= 1")
    await browser.until("return document.querySelector('svg[data-spark=\"topic/depth\"] path.line')",
                        "the topic depth sparkline")
    await browser.screenshot("topic-live")
    assert await browser.console_errors() == []
    await idle.close()


@pytest_twisted.ensureDeferred
async def test_every_page_in_lookupd_mode(cluster, browser) -> None:
    """Against nsqlookupd and two nsqd: topics, topic, channel, nodes, node, lookup and counter render without
    script errors; the lookup page creates a topic and channel (after confirmation) on nsqlookupd."""
    admin, lookupd, nodes, peers = cluster
    consumer = await subscribe(nodes[0], "orders", "archive", client_id="w1", user_agent="demo-consumer/1.0")
    try:
        for n in nodes:
            await publish(n, "orders", [b"o"] * 40)
        await publish(nodes[1], "clicks", [b"c"] * 5)
        await within(consumer.message())
        for p in peers:
            await registered(p)
        for _ in range(3):
            await within(admin.poll())
        pages = [("lookupd-topics", ""), ("lookupd-topic", "topics/orders"),
                 ("lookupd-channel", "topics/orders/archive"), ("lookupd-nodes", "nodes"),
                 ("lookupd-node", f"nodes/{nodes[0].http_address}"), ("lookupd-counter", "counter"),
                 ("lookupd-lookup", "lookup")]
        for name, path in pages:
            await browser.get(admin.url + path)
            await browser.until("return window.nsqadmin && window.nsqadmin.polls >= 1 || "
                                "document.body.dataset.api === ''", f"{name} to poll")
            if name == "lookupd-counter":
                # archive exists on both nsqd (the second pre-created it from lookupd): 2 x 40 messages
                assert await browser.text("#counter") == "80"
            await browser.screenshot(name)
            assert await browser.console_errors() == [], name

        await browser.get(admin.url + "lookup")
        await browser._run((await browser.css('#create-form input[name="topic"]'))[0].send_keys, "planned")
        await browser._run((await browser.css('#create-form input[name="channel"]'))[0].send_keys, "later")
        await browser.click('#create-form button[type="submit"]')
        await browser.until("return document.getElementById('confirm').open", "the confirmation dialog")
        await browser.click("#confirm-yes")
        await browser.until("return document.querySelector('li[data-row=\"channel:planned/later\"]')",
                            "the new inactive topic in the tree")
        code, doc, _ = await call("GET", f"http://{lookupd.http_address}/channels?topic=planned")
        assert (code, doc["channels"]) == (200, ["later"])
        await browser.screenshot("lookupd-lookup-created")
    finally:
        await consumer.close()


@pytest.mark.admin_options(lookupd_http_addresses=["127.0.0.1:1"], refresh_interval=0.3)
@pytest_twisted.ensureDeferred
async def test_error_page_recovers_by_itself(cluster, browser) -> None:
    """With no reachable lookupd the page shows UPSTREAM_ERROR; once /config points at a live one,
    the page reloads itself and lists the topics."""
    admin, lookupd, nodes, peers = cluster
    await publish(nodes[0], "back", [b"1"])
    await registered(peers[0])
    await browser.get(admin.url + "topics")
    assert "UPSTREAM_ERROR: failed to query any nsqlookupd" in await browser.text(".alert.error")
    await browser.screenshot("upstream-error")
    code, _, _ = await call("PUT", admin.url + "config/nsqlookupd_http_addresses", [lookupd.http_address])
    assert code == 200
    await browser.until("return document.querySelector('tr[data-row=\"topic:back\"]')", "the topic after recovery")
