"""Who may do what: the --admin-user ACL, action notifications, /config's CIDR check and --base-path."""

from __future__ import annotations

import base64
import json
import socket
from typing import Any

import pytest
import pytest_twisted
from klein import Klein
from twisted.internet import defer
from twisted.web.server import Site

from admin_helpers import call, create_channel, find_channel, find_topic, nsqd_stats, publish, within

pytestmark = pytest.mark.e2e


class Collector:
    """A local HTTP endpoint that records every notification POSTed to it."""

    app = Klein()

    def __init__(self) -> None:
        self.received: list[Any] = []
        self.headers: list[Any] = []
        self._waiters: list[defer.Deferred] = []
        self.port: Any = None

    @app.route("/notify", methods=["POST"])
    def notify(self, request: Any) -> bytes:
        self.received.append(json.loads(request.content.read()))
        self.headers.append(request.requestHeaders)
        waiters, self._waiters = self._waiters, []
        for d in waiters:
            d.callback(None)
        return b"ok"

    async def wait_for(self, count: int) -> list[Any]:
        """Await until ``count`` notifications have arrived (real events, bounded by a timeout)."""
        while len(self.received) < count:
            d: defer.Deferred = defer.Deferred()
            self._waiters.append(d)
            await within(d)
        return self.received

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port.getHost().port}/notify"


@pytest_twisted.async_yield_fixture
async def collector():
    from twisted.internet import reactor

    c = Collector()
    c.port = reactor.listenTCP(0, Site(c.app.resource()), interface="127.0.0.1")
    yield c
    await c.port.stopListening()


# --- ACL -----------------------------------------------------------------------------------------------


@pytest.mark.admin_options(admin_users=["alice"])
@pytest_twisted.ensureDeferred
async def test_only_admin_users_may_act(admin, nsqds) -> None:
    """With --admin-user alice, every privileged call from anyone else is 403 FORBIDDEN and changes nothing."""
    await create_channel(nsqds[0], "t", "c")
    privileged = [
        ("POST", "api/topics", {"topic": "new"}),
        ("POST", "api/topics/t", {"action": "pause"}),
        ("POST", "api/topics/t/c", {"action": "pause"}),
        ("DELETE", "api/topics/t/c", None),
        ("DELETE", "api/topics/t", None),
        ("DELETE", f"api/nodes/{nsqds[0].http_address}", {"topic": "t"}),
    ]
    for who in ({}, {"X-Forwarded-User": "bob"}, {"X-Forwarded-User": "alice2"}):
        for method, path, body in privileged:
            code, doc, _ = await call(method, admin.url + path, body, headers=who)
            assert (code, doc) == (403, {"message": "FORBIDDEN"}), (method, path, who)
    stats = await nsqd_stats(nsqds[0])
    assert find_channel(stats, "t", "c")["paused"] is False and find_topic(stats, "new") is None
    # reads stay open to everyone
    assert (await call("GET", admin.url + "api/topics/t/c"))[0] == 200
    code, doc, _ = await call("POST", admin.url + "api/topics/t/c", {"action": "pause"},
                              headers={"X-Forwarded-User": "alice"})
    assert (code, doc) == (200, {"message": ""})
    assert find_channel(await nsqd_stats(nsqds[0]), "t", "c")["paused"] is True


@pytest.mark.admin_options(admin_users=["alice", "carol"], acl_http_header="X-Auth-User")
@pytest_twisted.ensureDeferred
async def test_acl_header_is_configurable(admin, nsqds) -> None:
    """--acl-http-header names the header; the default X-Forwarded-User then means nothing."""
    await publish(nsqds[0], "t", [b"1"])
    code, _, _ = await call("POST", admin.url + "api/topics/t", {"action": "pause"},
                            headers={"X-Forwarded-User": "alice"})
    assert code == 403
    code, _, _ = await call("POST", admin.url + "api/topics/t", {"action": "pause"},
                            headers={"X-Auth-User": "carol"})
    assert code == 200


@pytest.mark.admin_options(admin_users=["alice"])
@pytest_twisted.ensureDeferred
async def test_pages_hide_action_buttons_from_non_admins(admin, nsqds) -> None:
    """The topic, channel, node and lookup pages render action buttons only for admins."""
    await create_channel(nsqds[0], "t", "c")
    pages = ["topics/t", "topics/t/c", f"nodes/{nsqds[0].http_address}", "lookup"]
    for path in pages:
        code, html, _ = await call("GET", admin.url + path, headers={"X-Forwarded-User": "mallory"})
        assert code == 200 and "data-action=" not in html and 'id="create-form"' not in html, path
        assert "read-only" in html
    code, html, _ = await call("GET", admin.url + "topics/t", headers={"X-Forwarded-User": "alice"})
    assert 'data-action="pause"' in html and 'data-action="delete"' in html and 'data-action="empty"' in html
    assert 'data-action="tombstone"' in html
    code, html, _ = await call("GET", admin.url + "topics/t/c", headers={"X-Forwarded-User": "alice"})
    assert ">Pause Channel<" in html
    code, html, _ = await call("GET", admin.url + "lookup", headers={"X-Forwarded-User": "alice"})
    assert 'id="create-form"' in html


@pytest_twisted.ensureDeferred
async def test_without_admin_users_everyone_is_admin(admin, nsqds) -> None:
    """No --admin-user: every request may act, and the pages say so."""
    await publish(nsqds[0], "t", [b"1"])
    code, html, _ = await call("GET", admin.url + "topics/t")
    assert "Pause Topic" in html and "everyone is admin" in html
    assert (await call("POST", admin.url + "api/topics/t", {"action": "pause"}))[0] == 200


# --- notifications ---------------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_every_action_is_notified(start_admin, nsqds, collector) -> None:
    """Each action POSTs NSQ's AdminAction JSON (action, topic, channel, node, timestamp, user, remote_ip,
    user_agent, url, via) to --notification-http-endpoint; empty channel/node/user are omitted."""
    admin = await start_admin(nsqd_http_addresses=[nsqds[0].http_address],
                              notification_http_endpoint=collector.url)
    await create_channel(nsqds[0], "t", "c")
    auth = {"Authorization": "Basic " + base64.b64encode(b"bob:secret").decode(), "User-Agent": "ops-cli/1.0"}
    steps = [
        ("POST", "api/topics", {"topic": "t2", "channel": "c2"}),
        ("POST", "api/topics/t", {"action": "pause"}),
        ("POST", "api/topics/t", {"action": "unpause"}),
        ("POST", "api/topics/t", {"action": "empty"}),
        ("POST", "api/topics/t/c", {"action": "pause"}),
        ("POST", "api/topics/t/c", {"action": "unpause"}),
        ("POST", "api/topics/t/c", {"action": "empty"}),
        ("DELETE", "api/topics/t/c", None),
        ("DELETE", "api/topics/t2", None),
        ("DELETE", f"api/nodes/{nsqds[0].http_address}", {"topic": "t"}),
    ]
    for method, path, body in steps:
        code, doc, _ = await call(method, admin.url + path, body, headers=auth)
        assert code == 200, (path, doc)
    received = await collector.wait_for(11)
    assert sorted(r["action"] for r in received) == sorted([
        "create_topic", "create_channel", "pause_topic", "unpause_topic", "empty_topic", "pause_channel",
        "unpause_channel", "empty_channel", "delete_channel", "delete_topic", "tombstone_topic_producer"])
    by_action = {r["action"]: r for r in received}
    pause = by_action["pause_channel"]
    assert list(pause) == ["action", "topic", "channel", "timestamp", "user", "remote_ip", "user_agent", "url",
                           "via"]
    assert pause["topic"] == "t" and pause["channel"] == "c" and pause["user"] == "bob"
    assert pause["user_agent"] == "ops-cli/1.0" and pause["via"] == socket.gethostname()
    assert pause["url"] == f"http://{admin.http_address}/api/topics/t/c"
    assert pause["remote_ip"].startswith("127.0.0.1:")
    assert abs(pause["timestamp"] - admin._service.clock.seconds()) < 60
    assert "channel" not in by_action["pause_topic"] and "node" not in by_action["pause_topic"]
    assert by_action["tombstone_topic_producer"]["node"] == nsqds[0].http_address
    assert by_action["create_channel"]["channel"] == "c2"
    assert collector.headers[0].getRawHeaders(b"content-type") == [b"application/json"]


@pytest.mark.admin_options(admin_users=["alice"])
@pytest_twisted.ensureDeferred
async def test_notification_url_scheme_and_forbidden_actions(start_admin, nsqds, collector) -> None:
    """X-Scheme: https makes the reported URL https; a forbidden action is not notified; no user, no key."""
    admin = await start_admin(nsqd_http_addresses=[nsqds[0].http_address], admin_users=["alice"],
                              notification_http_endpoint=collector.url)
    await publish(nsqds[0], "t", [b"1"])
    assert (await call("POST", admin.url + "api/topics/t", {"action": "pause"}))[0] == 403
    code, _, _ = await call("POST", admin.url + "api/topics/t?x=1", {"action": "empty"},
                            headers={"X-Forwarded-User": "alice", "X-Scheme": "https"})
    assert code == 200
    (only,) = await collector.wait_for(1)
    assert only["action"] == "empty_topic" and "user" not in only
    assert only["url"] == f"https://{admin.http_address}/api/topics/t?x=1"


# --- /config ----------------------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_config_is_readable_from_the_allowed_cidr(admin, nsqds) -> None:
    """GET /config/:opt from 127.0.0.1 (inside the default 127.0.0.1/8) answers the option as Go's JSON."""
    assert (await call("GET", admin.url + "config/nsqd_http_addresses"))[:2] == (
        200, [n.http_address for n in nsqds])
    assert (await call("GET", admin.url + "config/http_client_connect_timeout"))[:2] == (200, 2_000_000_000)
    assert (await call("GET", admin.url + "config/admin_users"))[:2] == (200, [])
    assert (await call("GET", admin.url + "config/acl_http_header"))[:2] == (200, "X-Forwarded-User")
    assert (await call("GET", admin.url + "config/nope"))[:2] == (400, {"message": "INVALID_OPTION"})
    assert (await call("PUT", admin.url + "config/log_level", raw=b"debug"))[:2] == (200, 1)
    assert (await call("PUT", admin.url + "config/log_level", raw=b"loud"))[:2] == (400, {"message": "INVALID_VALUE"})
    assert (await call("PUT", admin.url + "config/admin_users", raw=b"[]"))[:2] == (
        400, {"message": "INVALID_OPTION"})
    assert (await call("PUT", admin.url + "config/log_level", raw=b""))[:2] == (413, {"message": "INVALID_VALUE"})


@pytest.mark.admin_options(allow_config_from_cidr="10.0.0.0/8")
@pytest_twisted.ensureDeferred
async def test_config_is_forbidden_outside_the_cidr(admin) -> None:
    """A client outside --allow-config-from-cidr gets 403 FORBIDDEN for GET and PUT."""
    assert (await call("GET", admin.url + "config/nsqd_http_addresses"))[:2] == (403, {"message": "FORBIDDEN"})
    assert (await call("PUT", admin.url + "config/log_level", raw=b"debug"))[:2] == (403, {"message": "FORBIDDEN"})
    assert admin.options.log_level == 2


@pytest.mark.admin_options(allow_config_from_cidr="")
@pytest_twisted.ensureDeferred
async def test_empty_cidr_allows_everyone(admin) -> None:
    """An empty --allow-config-from-cidr turns the check off, as in nsqadmin."""
    assert (await call("GET", admin.url + "config/base_path"))[:2] == (200, "/")


# --- base path -----------------------------------------------------------------------------------------------


@pytest.mark.admin_options(base_path="ops/nsq/")
@pytest_twisted.ensureDeferred
async def test_everything_lives_under_the_base_path(admin, nsqds) -> None:
    """--base-path ops/nsq/ (normalised to /ops/nsq) prefixes pages, API, static files and links."""
    await publish(nsqds[0], "t", [b"1"])
    root = f"http://{admin.http_address}"
    assert admin.url == f"{root}/ops/nsq/"
    assert (await call("GET", root + "/ops/nsq/api/topics"))[:2] == (200, {"topics": ["t"], "message": ""})
    assert (await call("GET", root + "/api/topics"))[:2] == (404, {"message": "NOT_FOUND"})
    assert (await call("GET", root + "/ops/other"))[:2] == (404, {"message": "NOT_FOUND"})
    assert (await call("GET", root + "/ops/nsq/ping"))[:2] == (200, "OK")
    code, css, _ = await call("GET", root + "/ops/nsq/static/admin.css")
    assert code == 200 and "--brand" in css
    for path in ("/ops/nsq", "/ops/nsq/", "/ops/nsq/topics", "/ops/nsq/topics/"):
        code, html, _ = await call("GET", root + path)
        assert code == 200 and 'href="/ops/nsq/topics/t"' in html, path
        assert 'src="/ops/nsq/static/admin.js"' in html and 'data-base="/ops/nsq"' in html
