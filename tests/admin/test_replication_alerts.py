"""nsqadmin shows where operators look what replication says about a node: on the Nodes page
and the Topics page a node refusing publishes (replication degraded, a disk refusing writes,
replicas it cannot store, an adoption failing) and a node holding an adopted backlog; on the
node's page each linked origin's last batch or heartbeat and the adoptions failing or
standing by."""

from __future__ import annotations

from typing import Any

from twisted.internet import task

from nsqtw.admin import pages
from nsqtw.admin.nodes import NodeBook, node_alerts

REFUSING: dict[str, Any] = {
    "status": "degraded-refusing", "min_acks": 1, "peers_in_sync": 0,
    "peers": [{"address": "10.0.0.2:4153", "sync_state": "down",
               "reason": "the peer has the same --node-id (2); replicated nodes need distinct --node-id values"}],
    "store_error": "E_STORE_FAILED [Errno 28] No space left on device",
    "origins": [{"origin_node_id": 7, "name": "n7", "last_heard_seconds": 0.42, "batches": 12}],
    "adoption": {"failing": [{"origin_node_id": 4, "error": "OSError: No space left on device", "tries": 3,
                              "adopted_so_far": 10, "since_seconds": 3.0}],
                 "standing_by": [{"origin_node_id": 5, "for_node_id": 2}],
                 "adopted_by_peer": [{"origin_node_id": 6, "peer_node_id": 2, "at": 1_700_000_000.0}]},
    "adopted": [{"origin_node_id": 3, "messages": 40, "epoch": 1, "at": 1_700_000_000.0}],
}


def test_a_refusing_node_gets_each_alert_and_a_healthy_one_none():
    labels = [a["label"] for a in node_alerts(REFUSING, "NOK - DISKQUEUE(t) write failed")]
    assert labels == ["refusing publishes", "disk refusing writes", "cannot store replicas",
                      "adopting node 4 failing", "adopted node 3"]
    assert "same --node-id" in node_alerts(REFUSING)[0]["title"]
    assert node_alerts({"status": "ok", "peers": []}) == [] and node_alerts(None) == []
    assert [a["label"] for a in node_alerts({"status": "degraded-accepting"})] == ["unreplicated"]


def test_the_nodes_and_topics_pages_show_the_alerts():
    book = NodeBook(task.Clock())
    book.answered("10.0.0.1:4151", {"version": "1.3.0", "health": "OK", "replication": REFUSING, "topics": []},
                  full=True)
    book.answered("10.0.0.9:4151", {"version": "1.3.0", "health": "OK", "topics": []}, full=True)
    assert list(book.alerts()) == ["10.0.0.1:4151"]
    ctx = pages.PageContext(base="/", is_admin=True)
    node = {"broadcast_address": "10.0.0.1", "http_port": 4151, "hostname": "a", "status": "ok",
            **book.get("10.0.0.1:4151").to_json(0.0)}  # type: ignore[union-attr]  # answered just above
    html = str(pages.nodes_page(ctx, [node], "").content)
    assert 'data-alert="refusing publishes"' in html and 'data-alert="adopted node 3"' in html
    topics = str(pages.topics_page(ctx, ["t"], {}, "", None, book.alerts()).content)
    assert "node-alerts" in topics and "10.0.0.1:4151" in topics and "cannot store replicas" in topics
    assert "node-alerts" not in str(pages.topics_page(ctx, ["t"], {}, "").content)


def test_the_node_page_shows_each_origins_last_heard_and_the_adoptions():
    html = str(pages.replication_panel(REFUSING))
    assert 'data-row="origin:7"' in html and "0.4s ago" in html
    assert "adopting node 4 failing" in html and "standing by for node 2" in html
    assert "node 6 adopted by node 2" in html and "No space left on device" in html
