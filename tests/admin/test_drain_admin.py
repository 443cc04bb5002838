"""nsqadmin and a node's drain and maintenance: a draining node is flagged wherever node alerts
show, a node in a maintenance window (or keeping a peer's) too; the node's page offers an admin
a Drain button whose dialog says what happens, and the action drains the real node."""

from __future__ import annotations

from typing import Any

import pytest_twisted
from twisted.internet import task

from nsqtw.admin import pages
from nsqtw.admin.nodes import NodeBook, node_alerts

from admin_helpers import call

DRAINING: dict[str, Any] = {"state": "holding", "queued": 40, "in_flight": 2, "handed_off": 0, "peer": "10.0.0.2:4153"}
REPLICATED: dict[str, Any] = {
    "status": "ok", "min_acks": 1, "peers_in_sync": 1,
    "peers": [{"address": "10.0.0.2:4153", "sync_state": "in_sync", "state": "in_sync"}],
    "maintenance": {"active": True, "remaining_seconds": 540.0},
    "maintenance_windows": [{"origin_node_id": 3, "remaining_seconds": 120.0}],
}


def test_a_draining_node_and_maintenance_windows_are_alerts():
    labels = [a["label"] for a in node_alerts(REPLICATED, "OK", DRAINING)]
    assert labels == ["draining", "maintenance", "node 3 in maintenance"]
    assert "publishes refused" in node_alerts(None, "OK", DRAINING)[0]["title"]
    assert node_alerts(None, "OK", {"state": "drained", "queued": 0, "in_flight": 0})[0]["label"] == "drained"
    assert node_alerts(None, "OK", {"state": "serving"}) == [] and node_alerts(None) == []
    book = NodeBook(task.Clock())
    book.answered("10.0.0.1:4151", {"version": "1.3.0", "health": "OK", "drain": DRAINING, "topics": []}, full=True)
    book.answered("10.0.0.9:4151", {"version": "1.3.0", "health": "OK", "topics": []}, full=True)
    assert [a["label"] for a in book.alerts()["10.0.0.1:4151"]] == ["draining"]
    book.answered("10.0.0.1:4151", {"version": "1.3.0", "health": "OK", "topics": []}, full=True)
    assert not book.alerts()  # it serves again


def test_the_drain_dialog_says_what_happens():
    ctx = pages.PageContext(base="/", is_admin=True)
    html = str(pages.drain_panel(ctx, "10.0.0.1:4151", None, REPLICATED, False))
    assert 'data-action="drain"' in html and "refuses every publish" in html
    assert "unregisters its topics from nsqlookupd" in html and "10.0.0.2:4153" in html
    assert "delivered twice" in html
    alone = pages.drain_confirm_text("n:1", None)
    assert "keeps delivering its messages to the consumers connected to it" in alone
    html = str(pages.drain_panel(ctx, "10.0.0.1:4151", DRAINING, REPLICATED, False))
    assert 'data-action="undrain"' in html and "40 messages queued" in html
    reader = pages.PageContext(base="/", is_admin=False)
    assert "data-action" not in str(pages.drain_panel(reader, "10.0.0.1:4151", None, REPLICATED, False))


@pytest_twisted.ensureDeferred
async def test_the_drain_action_drains_the_node_and_undrain_serves_again(admin, nsqds) -> None:
    node = nsqds[0]
    code, doc, _ = await call("POST", admin.url + f"api/nodes/{node.http_address}", {"action": "drain"})
    assert code == 200, doc
    assert node._service.drain.draining and node._service.broker.draining
    code, doc, _ = await call("GET", admin.url + f"api/nodes/{node.http_address}")
    assert code == 200 and doc["drain"]["state"] in ("draining", "drained")
    assert any(a["label"] in ("draining", "drained") for a in doc["status"]["alerts"])
    code, html, _ = await call("GET", admin.url + f"nodes/{node.http_address}")
    assert 'data-action="undrain"' in html
    code, doc, _ = await call("POST", admin.url + f"api/nodes/{node.http_address}", {"action": "undrain"})
    assert code == 200 and not node._service.drain.draining
    code, doc, _ = await call("POST", admin.url + "api/nodes/127.0.0.1:1", {"action": "drain"})
    assert code in (404, 502)
