"""nsqadmin's Messages panel (issue 16): /api/topics/<t>/<c>/peek merges every nsqd's peek and
says why a node has none; in headless Chromium the channel page lists what peek returns when
asked (screenshot under test-artifacts/admin/)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
import pytest_twisted
import treq

from admin_helpers import create_channel, publish
from nsqtw.testing import command, connect_raw, identify_command


@pytest_twisted.async_yield_fixture
async def peek_nodes():
    """Two nsqd: the first with --peek-enabled, the second without."""
    from nsqtw.embed import start_nsqd

    handles = [await start_nsqd(peek_enabled=True), await start_nsqd()]
    yield handles
    for h in handles:
        await h.stop()


async def _get(url: str) -> Any:
    resp = await treq.get(url)
    return resp.code, json.loads(await resp.text())


async def _setup(nodes: list[Any]) -> Any:
    for n in nodes:
        await create_channel(n, "orders", "billing")
    await publish(nodes[0], "orders", [b'{"id": %d, "sku": "A-1"}' % i for i in range(3)] + [b"plain text", b"\xff\x00\x01"])
    await publish(nodes[1], "orders", [b"on the other node"])
    sub = await connect_raw(nodes[0].tcp_port)
    sub.send(identify_command(client_id="billing-worker-1"))
    await sub.response()
    sub.send(command("SUB", "orders", "billing") + command("RDY", 1))
    assert await sub.response() == b"OK"
    await sub.message()  # one in flight, held by billing-worker-1
    return sub


@pytest_twisted.ensureDeferred
async def test_admin_peek_api_merges_nodes_and_says_why_one_has_none(peek_nodes, start_admin) -> None:
    admin = await start_admin(nsqd_http_addresses=[n.http_address for n in peek_nodes])
    sub = await _setup(peek_nodes)
    try:
        code, doc = await _get(admin.url + "api/topics/orders/billing/peek?n=50")
        assert code == 200
        states = [m["state"] for m in doc["messages"]]
        assert states == ["queued"] * 4 + ["in_flight"]
        assert {m["node"] for m in doc["messages"]} == {peek_nodes[0].http_address}
        assert [m["client_id"] for m in doc["messages"] if m["state"] == "in_flight"] == ["billing-worker-1"]
        nodes = {n["node"]: n for n in doc["nodes"]}
        assert nodes[peek_nodes[0].http_address]["ok"] is True
        assert nodes[peek_nodes[0].http_address]["in_flight_count"] == 1
        bad = nodes[peek_nodes[1].http_address]
        assert bad["ok"] is False and "--peek-enabled" in bad["error"]
        # n is per node and per state: a backlog never hides what is in flight
        code, doc = await _get(admin.url + "api/topics/orders/billing/peek?n=2")
        assert [m["state"] for m in doc["messages"]] == ["queued", "queued", "in_flight"]
        assert doc["truncated"] is True and nodes[peek_nodes[0].http_address]["depth"] == 4
        assert (await _get(admin.url + "api/topics/orders/billing/peek?n=0"))[1]["message"] == "INVALID_N"
    finally:
        await sub.close()


@pytest_twisted.ensureDeferred
async def test_admin_topic_peek_for_a_topic_without_channels(peek_nodes, start_admin) -> None:
    admin = await start_admin(nsqd_http_addresses=[peek_nodes[0].http_address])
    await publish(peek_nodes[0], "waiting", [b"first", b"second"])
    code, doc = await _get(admin.url + "api/topic-peek/waiting")
    assert code == 200
    assert [base64.b64decode(m["body"]) for m in doc["messages"]] == [b"first", b"second"]


# --- in a browser ------------------------------------------------------------------------------

try:
    from test_browser import Browser, within  # noqa: F401  (the browser fixture is in conftest)
    from test_browser import pytestmark as _browser_marks
except Exception:  # pragma: no cover
    _browser_marks = [pytest.mark.skip(reason="the browser test support did not import")]


@pytest.mark.parametrize("_", [0])
@pytest_twisted.ensureDeferred
async def test_messages_panel_in_chromium(_, peek_nodes, start_admin, browser) -> None:
    for mark in _browser_marks:
        if mark.name == "skip":
            pytest.skip(mark.kwargs.get("reason", "no browser"))
    admin = await start_admin(nsqd_http_addresses=[n.http_address for n in peek_nodes])
    sub = await _setup(peek_nodes)
    try:
        await browser.get(admin.url + "topics/orders/billing")
        assert await browser.css("section.peek tr.peek-msg") == []  # never loaded on its own
        await browser.click("section.peek button.peek-load")
        await browser.until("return document.querySelector('section.peek').dataset.loaded", "the peek answer")
        rows = await browser.js(
            "return Array.from(document.querySelectorAll('section.peek tr.peek-msg')).map(function (r) {"
            " return [r.children[1].textContent, r.children[6].textContent, r.querySelector('pre').dataset.kind,"
            " r.querySelector('pre').textContent]; })")
        assert [r[0] for r in rows] == ["queued"] * 4 + ["in flight"]
        kinds = [r[2] for r in rows]
        assert kinds[:2] == ["json", "json"] and "text" in kinds and "hex" in kinds
        assert '"sku": "A-1"' in rows[0][3]  # pretty-printed JSON
        assert rows[-1][1] == "billing-worker-1"
        errors = await browser.js("return Array.from(document.querySelectorAll('section.peek .peek-node-error'))"
                                  ".map(function (e) { return e.textContent; })")
        assert len(errors) == 1 and peek_nodes[1].http_address in errors[0] and "--peek-enabled" in errors[0]
        await browser.screenshot("channel-messages-panel")
        assert await browser.console_errors() == []
    finally:
        await sub.close()
