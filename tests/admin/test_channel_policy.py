"""nsqadmin and nsqtw's channel policies (issue 46): the channel page shows each nsqd's policy and
its dead, expired and dropped counts; /api/topics/<t>/<c>/policy changes the policy on every nsqd
holding the channel; the redrive and empty_dead actions reach the dead letters there. All against
real in-process nsqd over loopback."""

from __future__ import annotations

import html
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor, task

from admin_helpers import call, create_channel, publish, registered, within
from nsqtw.admin.cluster import ChannelStats
from nsqtw.admin.pages import confirm_text
from nsqtw.testing import command, connect_raw


async def until(check: Any, what: str, timeout: float = 10.0) -> Any:
    """Poll ``check()`` until it answers something truthy (what nsqd does on its own reactor turn)."""
    deadline = reactor.seconds() + timeout
    while True:
        last = await check()
        if last:
            return last
        if reactor.seconds() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await task.deferLater(reactor, 0.05, lambda: None)


async def _config(nsqd: Any, topic: str, channel: str) -> dict[str, Any]:
    code, doc, _ = await call("GET", f"http://{nsqd.http_address}/channel/config?topic={topic}&channel={channel}")
    assert code == 200, doc
    return doc


@pytest_twisted.ensureDeferred
async def test_a_policy_set_through_nsqadmin_is_on_every_nsqd_holding_the_channel(admin, nsqds) -> None:
    for n in nsqds:
        await create_channel(n, "orders", "billing")
    url = admin.url + "api/topics/orders/billing/policy"
    code, doc, _ = await call("POST", url, {"max_attempts": 3, "max_age": "90s", "max_depth": 5, "overflow": "refuse",
                                            "max_rate": 50, "dead_letter_topic": "orders-dead"})
    assert code == 200, doc
    assert doc["message"] == "" and sorted(n["node"] for n in doc["nodes"]) == sorted(n.http_address for n in nsqds)
    for n in nsqds:
        assert await _config(n, "orders", "billing") == {
            "topic": "orders", "channel": "billing", "max_attempts": 3, "max_age": "1m30s", "max_depth": 5,
            "overflow": "refuse", "max_rate": 50, "dead_letter_topic": "orders-dead"}
    # only the settings named change; an empty value (or null) turns one off
    code, doc, _ = await call("POST", url, {"max_age": "", "max_rate": None})
    assert code == 200, doc
    for n in nsqds:
        cfg = await _config(n, "orders", "billing")
        assert (cfg["max_age"], cfg["max_rate"], cfg["max_attempts"], cfg["max_depth"]) == (None, None, 3, 5)
    # nsqadmin's channel document carries the merged policy and counts
    code, doc, _ = await call("GET", admin.url + "api/topics/orders/billing")
    assert doc["policy"]["max_attempts"] == 3 and doc["policy"]["max_age"] is None
    assert (doc["dead_count"], doc["expired_count"], doc["dropped_count"]) == (0, 0, 0)
    assert "policies_differ" not in doc
    assert all(n["policy"]["dead_letter_topic"] == "orders-dead" for n in doc["nodes"])


@pytest_twisted.ensureDeferred
async def test_policy_errors_are_nsqds_own(admin, nsqds) -> None:
    for n in nsqds:
        await create_channel(n, "orders", "billing")
    url = admin.url + "api/topics/orders/billing/policy"
    assert (await call("POST", url, {"max_age": "soon"}))[:2] == (400, {"message": "INVALID_MAX_AGE"})
    assert (await call("POST", url, {"overflow": "spill"}))[:2] == (400, {"message": "INVALID_OVERFLOW"})
    assert (await call("POST", url, {"dead_letter_topic": "orders"}))[:2] == (
        400, {"message": "INVALID_DEAD_LETTER_TOPIC"})
    code, doc, _ = await call("POST", url, {"ttl": "5s"})
    assert code == 400 and doc["message"].startswith("INVALID_SETTING: ttl")
    assert (await call("POST", url, {}))[:2] == (400, {"message": "INVALID_BODY"})
    assert (await call("POST", url, {"max_attempts": True}))[:2] == (400, {"message": "INVALID_BODY"})
    assert (await call("POST", admin.url + "api/topics/orders/nobody/policy", {"max_attempts": 3}))[:2] == (
        404, {"message": "CHANNEL_NOT_FOUND"})
    for n in nsqds:  # nothing refused was applied anywhere
        assert (await _config(n, "orders", "billing"))["max_age"] is None


@pytest_twisted.ensureDeferred
async def test_only_the_nodes_holding_the_channel_are_asked(admin, nsqds) -> None:
    await create_channel(nsqds[0], "orders", "billing")
    await create_channel(nsqds[1], "orders", "shipping")  # the topic, not the channel
    code, doc, _ = await call("POST", admin.url + "api/topics/orders/billing/policy", {"max_attempts": "2"})
    assert code == 200 and doc["message"] == ""  # no CHANNEL_NOT_FOUND warning from the other node
    assert [n["node"] for n in doc["nodes"]] == [nsqds[0].http_address]
    assert (await _config(nsqds[0], "orders", "billing"))["max_attempts"] == 2


@pytest_twisted.ensureDeferred
async def test_through_nsqlookupd_too(cluster) -> None:
    """With --lookupd-http-address the channel's holders come from nsqlookupd's producers."""
    admin, _, nodes, peers = cluster
    for n, p in zip(nodes, peers, strict=True):
        await create_channel(n, "orders", "billing")
        await registered(p)
    code, doc, _ = await call("POST", admin.url + "api/topics/orders/billing/policy", {"max_depth": 10})
    assert code == 200 and len(doc["nodes"]) == 2, doc
    for n in nodes:
        assert (await _config(n, "orders", "billing"))["max_depth"] == 10
    code, doc, _ = await call("POST", admin.url + "api/topics/orders/billing", {"action": "empty_dead"})
    assert code == 200 and (doc["emptied"], doc["dead_count"], doc["message"]) == (0, 0, "")


@pytest.mark.admin_options(admin_users=["alice"])
@pytest_twisted.ensureDeferred
async def test_only_admins_change_policies_or_touch_dead_letters(admin, nsqds) -> None:
    await create_channel(nsqds[0], "orders", "billing")
    base = admin.url + "api/topics/orders/billing"
    assert (await call("POST", base + "/policy", {"max_attempts": 3}))[0] == 403
    assert (await call("POST", base, {"action": "redrive"}))[0] == 403
    assert (await call("POST", base, {"action": "empty_dead"}))[0] == 403
    assert (await _config(nsqds[0], "orders", "billing"))["max_attempts"] is None
    code, page, _ = await call("GET", admin.url + "topics/orders/billing", headers={"X-Forwarded-User": "bob"})
    assert code == 200 and "Policy and dead letters" in page  # shown read-only
    assert 'id="policy-form"' not in page and 'data-action="redrive"' not in page
    code, page, _ = await call("GET", admin.url + "topics/orders/billing", headers={"X-Forwarded-User": "alice"})
    assert 'id="policy-form"' in page and 'data-action="redrive"' in page


async def _dead_letters(admin: Any, nsqd: Any, count: int) -> Any:
    """``count`` messages on ``nsqd``'s orders/billing made dead (max_attempts=1, each REQ'd once);
    returns the consumer, still subscribed at RDY ``count``."""
    code, doc, _ = await call("POST", admin.url + "api/topics/orders/billing/policy", {"max_attempts": 1})
    assert code == 200, doc
    await publish(nsqd, "orders", [b"job %d" % i for i in range(count)])
    sub = await connect_raw(nsqd.tcp_port)
    sub.send(command("SUB", "orders", "billing"))
    assert await sub.response() == b"OK"
    sub.send(command("RDY", count))
    for _ in range(count):
        m = await sub.message()
        assert m.attempts == 1
        sub.send(command("REQ", m.id.decode(), 0))

    async def all_dead() -> bool:
        _, doc, _ = await call("GET", admin.url + "api/topics/orders/billing")
        return doc.get("dead_count") == count
    await until(all_dead, f"{count} dead letters")
    return sub


@pytest_twisted.ensureDeferred
async def test_dead_letters_are_shown_redriven_and_emptied_through_nsqadmin(admin, nsqds) -> None:
    for n in nsqds:
        await create_channel(n, "orders", "billing")
    sub = await _dead_letters(admin, nsqds[0], 3)
    try:
        _, doc, _ = await call("GET", admin.url + "api/topics/orders/billing")
        assert doc["depth"] == 0 and doc["in_flight_count"] == 0
        per_node = {n["node"]: n["dead_count"] for n in doc["nodes"]}
        assert per_node == {nsqds[0].http_address: 3, nsqds[1].http_address: 0}
        # the page: the policy, the counts, and buttons whose dialogs say exactly what happens
        code, page, _ = await call("GET", admin.url + "topics/orders/billing")
        assert code == 200
        text = html.unescape(page)
        assert "Put the 3 dead messages of orders/billing on 2 nodes back into the channel with fresh attempts; " \
               "consumers receive them again." in text
        assert "Drop the 3 dead messages of orders/billing on 2 nodes for good; they cannot be recovered." in text
        assert confirm_text("redrive", "orders", "billing", doc) in text
        assert 'data-setting="max_attempts">1<' in page
        assert '<td class="num" data-v="dead_count">3</td>' in page
        # redrive two: fresh attempts, delivered again
        base = admin.url + "api/topics/orders/billing"
        assert (await call("POST", base, {"action": "redrive", "count": 0}))[:2] == (400, {"message": "INVALID_COUNT"})
        code, doc, _ = await call("POST", base, {"action": "redrive", "count": 2})
        assert code == 200 and (doc["redriven"], doc["dead_count"], doc["message"]) == (2, 1, "")
        again = [await sub.message(), await sub.message()]
        assert sorted(m.attempts for m in again) == [1, 1]
        for m in again:
            sub.send(command("FIN", m.id.decode()))
        # empty the rest: gone for good
        code, doc, _ = await call("POST", base, {"action": "empty_dead"})
        assert code == 200 and (doc["emptied"], doc["dead_count"]) == (1, 0)
        _, doc, _ = await call("GET", base)
        assert doc["dead_count"] == 0
        # a topic has no dead letters of its own
        assert (await call("POST", admin.url + "api/topics/orders", {"action": "redrive"}))[:2] == (
            400, {"message": "INVALID_ACTION"})
    finally:
        await within(sub.close())


@pytest_twisted.async_yield_fixture
async def peek_nsqd():
    from nsqtw.embed import start_nsqd

    h = await start_nsqd(peek_enabled=True)
    yield h
    await h.stop()


@pytest_twisted.ensureDeferred
async def test_peek_through_nsqadmin_lists_dead_letters(peek_nsqd, start_admin) -> None:
    admin = await start_admin(nsqd_http_addresses=[peek_nsqd.http_address])
    await create_channel(peek_nsqd, "orders", "billing")
    sub = await _dead_letters(admin, peek_nsqd, 2)
    try:
        code, doc, _ = await call("GET", admin.url + "api/topics/orders/billing/peek?state=dead")
        assert code == 200, doc
        assert [(m["state"], m["attempts"], m["reason"]) for m in doc["messages"]] == [("dead", 1, "max_attempts")] * 2
        assert doc["nodes"][0]["dead_count"] == 2
        code, doc, _ = await call("GET", admin.url + "api/topics/orders/billing/peek")  # all states: dead too
        assert [m["state"] for m in doc["messages"]] == ["dead", "dead"]
    finally:
        await within(sub.close())


def _node(node: str, policy: dict[str, Any] | None, dead: int) -> dict[str, Any]:
    return {"channel_name": "c", "depth": 0, "policy": policy, "dead_count": dead, "expired_count": 1,
            "dropped_count": 2}


def test_policies_merge_across_nodes() -> None:
    one = {"max_attempts": 3, "max_age": None, "max_depth": None, "overflow": "drop-oldest", "max_rate": None,
           "dead_letter_topic": None}
    total = ChannelStats(node="a", topic_name="t", channel_name="c")
    for name, doc in (("a", _node("a", one, 2)), ("b", _node("b", dict(one), 5))):
        total.add(ChannelStats.from_nsqd_channel(doc, "t", name, name, 0.0))
    doc = total.to_json()
    assert (doc["policy"], doc["dead_count"], doc["expired_count"], doc["dropped_count"]) == (one, 7, 2, 4)
    assert "policies_differ" not in doc
    total.add(ChannelStats.from_nsqd_channel(_node("c", None, 0), "t", "c", "c", 0.0))
    doc = total.to_json()
    assert doc["policy"] is None and doc["policies_differ"] is True
    # a Go nsqd reports no policy: its channel document stays Go's shape
    go = ChannelStats.from_nsqd_channel({"channel_name": "c", "depth": 4}, "t", "g", "g", 0.0)
    assert "policy" not in go.to_json() and "dead_count" not in go.to_json()
    mixed = ChannelStats(node="g", topic_name="t", channel_name="c")
    mixed.add(go)
    mixed.add(ChannelStats.from_nsqd_channel(_node("a", one, 2), "t", "a", "a", 0.0))
    assert mixed.to_json()["policy"] == one and mixed.to_json()["dead_count"] == 2


# --- in a browser ------------------------------------------------------------------------------

try:
    from test_browser import pytestmark as _browser_marks
except Exception:  # pragma: no cover
    _browser_marks = [pytest.mark.skip(reason="the browser test support did not import")]


@pytest.mark.browser
@pytest.mark.admin_options(refresh_interval=0.3, history_interval=3600.0)
@pytest_twisted.ensureDeferred
async def test_policy_form_and_dead_letter_buttons_in_chromium(admin, nsqds, browser) -> None:
    for mark in _browser_marks:
        if mark.name == "skip":
            pytest.skip(mark.kwargs.get("reason", "no browser"))
    await create_channel(nsqds[0], "orders", "billing")
    sub = await _dead_letters(admin, nsqds[0], 3)
    try:
        await browser.get(admin.url + "topics/orders/billing")
        await browser.until("return window.nsqadmin.polls >= 1", "the first refresh")
        assert await browser.text('section.policy tr.policy-total [data-v="dead_count"]') == "3"
        # the form sends only what changed, after a dialog naming each change and what it does
        await browser.js("document.querySelector('#policy-form [name=max_age]').value = '90s';"
                         "document.querySelector('#policy-form [name=overflow]').value = 'refuse';")
        await browser.click('#policy-form button[type="submit"]')
        await browser.until("return document.getElementById('confirm').open", "the confirmation")
        text = await browser.text("#confirm-text")
        lines = text.split("\n")
        assert lines[0] == "Set the policy of channel orders/billing on 1 node?", text
        assert lines[1].startswith("max age 90s: a queued message older than 90s is not delivered"), text
        assert lines[2] == "overflow refuse: at max depth, publishes to topic orders fail (E_PUB_FAILED, HTTP 503).", text
        assert "max attempts" not in text  # unchanged: not sent
        await browser.screenshot("channel-policy-confirm")
        await browser.click("#confirm-yes")
        await browser.until("return !document.getElementById('flash').hidden", "the outcome")
        cfg = await _config(nsqds[0], "orders", "billing")
        assert (cfg["max_age"], cfg["overflow"], cfg["max_attempts"]) == ("1m30s", "refuse", 1)
        await browser.until("return document.querySelector('#policy-form [name=max_age]').defaultValue === '1m30s'",
                            "the page to show the new policy")
        # redrive: the dialog says what happens, with the live count
        await browser.click('button[data-action="redrive"]')
        await browser.until("return document.getElementById('confirm').open", "the confirmation")
        text = await browser.text("#confirm-text")
        assert text == ("Put the 3 dead messages of orders/billing on 1 node back into the channel with fresh "
                        "attempts; consumers receive them again."), text
        await browser.click("#confirm-yes")
        await browser.until("return /Redrove 3 dead messages/.test(document.getElementById('flash').textContent)",
                            "the outcome")
        assert [(await sub.message()).attempts for _ in range(3)] == [1, 1, 1]
        await browser.screenshot("channel-policy-redriven")
        assert await browser.console_errors() == []
    finally:
        await within(sub.close())
