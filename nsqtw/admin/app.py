"""
nsqadmin's HTTP side as a klein app: the JSON API, the pages, ``/config``, ``/ping`` and static files.

Routes are nsqadmin's (``nsqadmin/http.go``) under ``--base-path``; the API
answers in NSQ's V1 envelope with nsqadmin's shapes, fans actions out to every
nsqd and nsqlookupd the way ``clusterinfo`` does, refuses privileged calls from
non-admins with 403 ``FORBIDDEN`` and reports each action to
``--notification-http-endpoint``.  nsqtw adds ``/api/history[/:topic[/:channel]]``,
the series the pages draw their graphs from.

Path parameters arrive percent-decoded (twisted.web unquotes each segment), so
``/api/topics/tmp%23ephemeral`` names ``tmp#ephemeral``.  The app holds an
:class:`AdminNode` (the running service, an :class:`~nsqtw.admin.service.AdminService`): the current options,
the :class:`~nsqtw.admin.cluster.ClusterInfo`, the history and the notifier.
"""

from __future__ import annotations

import ipaddress
import json
import mimetypes
import os
from importlib import resources
from typing import Any, Protocol, cast

from klein import Klein
from twisted.internet.defer import CancelledError
from twisted.logger import Logger
from twisted.python.failure import Failure
from typing import Any as HTTPRequest  # an IRequest (zope interfaces do not type-check without a mypy plugin)
from twisted.web.resource import Resource
from twisted.web.server import GzipEncoderFactory
from twisted.web.resource import EncodingResourceWrapper

from ..errors import HTTPAPIError
from ..options import LOG_LEVELS, OptionError, config_value
from ..protocol.names import is_valid_name
from ..runtime.responses import first, install_error_handlers, plain, query, v1, v1_error
from werkzeug.exceptions import NotFound

from . import pages
from .cluster import FetchError, UpstreamError, counter_stats, topic_totals, warning_message

from .cluster import ClusterInfo
from .history import History
from .options import AdminOptions


class AdminNode(Protocol):
    """What the app needs of the running nsqadmin (``nsqtw.admin.service.AdminService`` is one), so
    this module does not import the service layer that builds it."""

    options: AdminOptions
    cluster: ClusterInfo
    history: History
    clock: Any

    def notify(self, action: str, topic: str, channel: str, node: str, request: Any) -> None: ...

    def set_options(self, **changes: Any) -> None: ...

__all__ = ["AdminHTTPAPI", "is_admin_request"]

log = Logger(namespace="nsqtw.admin")

_ACTIONS = ("pause", "unpause", "empty")
#: nsqtw: a channel's dead letters (see nsqd's /channel/redrive and /channel/dead/empty)
_DEAD_ACTIONS = {"redrive": ("channel/redrive", "redriven"), "empty_dead": ("channel/dead/empty", "emptied")}
#: the settings of a channel's policy (nsqd's ``POST /channel/config`` parameters)
POLICY_SETTINGS = ("max_attempts", "max_age", "max_depth", "overflow", "max_rate", "dead_letter_topic")
_MAX_BODY = 1024 * 1024
HTML_TYPE = b"text/html; charset=utf-8"


def is_admin_request(request: HTTPRequest, admin_users: list[str], header: str) -> bool:
    """``isAuthorizedAdminRequest``: everyone without ``--admin-user``, else a listed user."""
    if not admin_users:
        return True
    user = request.getHeader(header)
    return user is not None and user in admin_users


def _read_json(request: HTTPRequest) -> Any:
    data = request.content.read(_MAX_BODY + 1) if request.content is not None else b""
    if len(data) > _MAX_BODY:
        raise HTTPAPIError(413, "INVALID_BODY")
    try:
        return json.loads(data or b"null")
    except ValueError:
        raise HTTPAPIError(400, "INVALID_BODY") from None


def _body_str(doc: Any, key: str) -> str:
    if doc is None:
        raise HTTPAPIError(400, "INVALID_BODY")
    if not isinstance(doc, dict):
        raise HTTPAPIError(400, "INVALID_BODY")
    value = doc.get(key, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise HTTPAPIError(400, "INVALID_BODY")
    return value


def _flag(page: pages.Page, doc: dict[str, Any]) -> pages.Page:
    """Mark a page whose picture is partial, so its live dot starts as a warning."""
    why = []
    partial = doc.get("partial")
    if partial:
        why.append(f"partial: {partial['answered']} of {partial['total']} nodes answered")
    elif doc.get("nodes_missing"):
        why.append(f"{len(doc['nodes_missing'])} node(s) not answering")
    if doc.get("message"):
        why.append(str(doc["message"]))
    page.trouble = "\n".join(why)
    return page


class _JSONNotFound(Resource):
    isLeaf = True

    def render(self, request: HTTPRequest) -> bytes:
        return v1_error(request, 404, "NOT_FOUND")


class _Prefix(Resource):
    """One segment of ``--base-path``; anything else is nsqadmin's JSON 404."""

    def getChild(self, path: bytes, request: HTTPRequest) -> Resource:
        return _JSONNotFound()

    def render(self, request: HTTPRequest) -> bytes:
        return v1_error(request, 404, "NOT_FOUND")


class _Slashless(Resource):
    """The klein app with empty path segments dropped, so ``/base``, ``/base/`` and
    ``/topics/`` route like ``/base/`` and ``/topics`` instead of hitting werkzeug's
    strict-slash redirects."""

    isLeaf = True

    def __init__(self, inner: Resource) -> None:
        super().__init__()
        self.inner = inner

    def render(self, request: HTTPRequest) -> Any:
        request.postpath = [seg for seg in request.postpath if seg] or [b""]
        d = request.notifyFinish()

        def gone(reason: Failure) -> None:
            # the browser closed the connection before the answer (often while nsqd or nsqlookupd was
            # still being asked): one line, and the upstream calls for it are cancelled
            log.info("{method} {uri}: the client went away before the answer ({why})",
                     method=request.method.decode("latin-1"), uri=request.uri.decode("latin-1"),
                     why=reason.getErrorMessage())
        d.addErrback(gone)
        return self.inner.render(request)


def mount(base: str, leaf: Resource) -> Resource:
    """``leaf`` served under ``base`` (``/`` means at the root)."""
    segments = [s for s in base.split("/") if s]
    if not segments:
        return leaf
    root: Resource = _Prefix()
    node = root
    for i, seg in enumerate(segments):
        child: Resource = leaf if i == len(segments) - 1 else _Prefix()
        node.putChild(seg.encode(), cast(Any, child))  # a Resource is an IResource
        node = child
    return root


class AdminHTTPAPI:
    """The klein app serving one nsqadmin."""

    app = Klein()

    @app.handle_errors(NotFound)
    def _not_found_page(self, request: HTTPRequest, failure: Failure) -> bytes:
        """An unknown path: the JSON 404 under /api, /static and /config, an HTML page elsewhere."""
        path = request.path.decode("latin-1")
        base = self._opts.base.rstrip("/")
        rel = path[len(base):] if base and path.startswith(base) else path
        accept = (request.getHeader(b"Accept") or b"").decode("latin-1")
        if rel.startswith(("/api", "/static", "/config")) or ("json" in accept and "html" not in accept):
            return v1_error(request, 404, "NOT_FOUND")
        ctx = self._ctx(request)
        page = pages.error_page(ctx, "Page not found", f"NOT_FOUND: nsqadmin has no page at {path}", 404)
        return self._page(request, ctx, page)

    @app.handle_errors(CancelledError)
    def _cancelled(self, request: HTTPRequest, failure: Failure) -> bytes:
        """The client went away (logged once by _Slashless); nothing to answer."""
        return b""

    install_error_handlers(app)

    def __init__(self, node: AdminNode) -> None:
        self.node = node

    def resource(self) -> Resource:
        """The site's root: the app under the base path, gzip when the client accepts it."""
        leaf = EncodingResourceWrapper(_Slashless(self.app.resource()), [GzipEncoderFactory()])
        return mount(self.node.options.base, leaf)

    # --- helpers --------------------------------------------------------------------

    @property
    def _opts(self) -> Any:
        return self.node.options

    @property
    def _ci(self) -> Any:
        return self.node.cluster

    def _is_admin(self, request: HTTPRequest) -> bool:
        o = self._opts
        return is_admin_request(request, o.admin_users, o.acl_http_header)

    def _require_admin(self, request: HTTPRequest) -> None:
        if not self._is_admin(request):
            raise HTTPAPIError(403, "FORBIDDEN")

    def _ctx(self, request: HTTPRequest) -> pages.PageContext:
        o = self._opts
        user = request.getHeader(o.acl_http_header) or ""
        return pages.PageContext(
            base=o.base, is_admin=self._is_admin(request), user=user,
            lookupds=tuple(o.lookupd_http_addresses), nsqds=tuple(o.nsqd_http_addresses),
            refresh_ms=int(o.refresh_interval * 1000), acl_enforced=bool(o.admin_users), now=self._now(),
        )

    def _page(self, request: HTTPRequest, ctx: pages.PageContext, page: pages.Page) -> bytes:
        request.setHeader(b"Content-Type", HTML_TYPE)
        request.setHeader(b"Cache-Control", b"no-store")
        request.setResponseCode(page.status)
        if first(query(request), "fragment") == "1":
            return page.content.encode()
        return pages.render(ctx, page).encode()

    @staticmethod
    def _upstream(e: UpstreamError) -> HTTPAPIError:
        return HTTPAPIError(502, f"UPSTREAM_ERROR: {e}")

    # --- data shared by pages and the API -------------------------------------------------

    def _now(self) -> float:
        return float(self.node.clock.seconds())

    def _missing_json(self, states: list[Any]) -> list[dict[str, Any]]:
        now = self._now()
        return [st.to_json(now) for st in states]

    @staticmethod
    def _partial(doc: dict[str, Any], answered: int, missing: list[dict[str, Any]]) -> dict[str, Any]:
        """``nodes_missing`` and the ``partial`` counts every read document carries (issue 17)."""
        if missing:  # only then: with every node answering, the shapes stay nsqadmin's
            doc["nodes_missing"] = missing
            doc["partial"] = {"answered": answered, "total": answered + len(missing)}
        return doc

    async def _topics_doc(self, inactive: bool) -> dict[str, Any]:
        topics, errors = await self._ci.topics()
        if inactive:
            return {"topics": await self._ci.inactive_topics(topics), "message": warning_message(errors)}
        failing = self._ci.book.failing()
        # a topic only on a node that stopped answering stays listed (marked), never silently dropped
        names = sorted(set(topics) | {t for st in failing for t in st.topics})
        by_topic: dict[str, list[str]] = {}
        for st in failing:
            for t in st.topics:
                by_topic.setdefault(t, []).append(st.address)
        doc: dict[str, Any] = {"topics": names, "message": warning_message(errors)}
        alerts = self._ci.book.alerts()
        if alerts:
            doc["node_alerts"] = alerts
        if failing:
            doc["nodes_missing"] = self._missing_json(failing)
            doc["topics_missing_nodes"] = by_topic
        return doc

    async def _topic_doc(self, topic: str) -> dict[str, Any]:
        producers, errors = await self._ci.topic_producers(topic)
        per_node: list[Any] = []
        errs: list[str] = []
        if producers:
            try:
                per_node, _, errs, _ = await self._ci.nsqd_stats_failed(producers, topic, "", False)
            except UpstreamError as e:
                errs = [str(e)]
        present = [t.node for t in per_node]
        missing = self._ci.book.failing(topic, present)
        if not per_node and not missing and not await self._ci.topic_known(topic):
            raise HTTPAPIError(404, "TOPIC_NOT_FOUND")
        total = topic_totals(topic, per_node)
        doc = total.to_json()
        doc["message"] = warning_message(list(errors) + list(errs))
        lookupds, _ = self._ci.addresses()
        known = {c.channel_name for c in total.channels or []}
        extra: list[str] = []
        if lookupds:
            try:
                registered, _ = await self._ci.lookupd_topic_channels(topic, lookupds)
            except UpstreamError:
                registered = []
            extra = [c for c in registered if c not in known]
        for st in missing:
            extra += [c for c in st.topics.get(topic, []) if c not in known and c not in extra]
        doc["channels_elsewhere"] = sorted(extra)
        return self._partial(doc, len(present), self._missing_json(missing))

    async def _channel_doc(self, topic: str, channel: str, strict: bool = False) -> dict[str, Any]:
        """``strict`` (the page): an unknown topic or channel is a 404; the API answers an unknown
        channel of a known topic as nsqadmin does (200, no stats)."""
        producers, errors = await self._ci.topic_producers(topic)
        channels: dict[str, Any] = {}
        errs: list[str] = []
        if producers:
            try:
                _, channels, errs, _ = await self._ci.nsqd_stats_failed(producers, topic, channel, True)
            except UpstreamError as e:
                errs = [str(e)]
        found = channels.get(channel)
        present = [n.node for n in (found.nodes or [])] if found is not None else []
        missing = self._ci.book.failing_channel(topic, channel, present)
        if found is None and not missing and strict:
            if not producers and not await self._ci.topic_known(topic):
                raise HTTPAPIError(404, "TOPIC_NOT_FOUND")
            lookupds, _ = self._ci.addresses()
            registered: list[str] = []
            if lookupds:
                try:
                    registered, _ = await self._ci.lookupd_topic_channels(topic, lookupds)
                except UpstreamError:
                    registered = []
            if channel not in registered:
                raise HTTPAPIError(404, "CHANNEL_NOT_FOUND")
        doc = found.to_json() if found is not None else {}
        doc["message"] = warning_message(list(errors) + list(errs))
        return self._partial(doc, len(present), self._missing_json(missing))

    def _recently_answered(self, address: str, now: float) -> bool:
        """Whether the node answered a full ``/stats`` (the history poller's, or a page's) within
        the last two history intervals and has not failed since: the node list shows that answer
        rather than asking the node again."""
        state = self._ci.book.get(address)
        window = 2 * float(getattr(self._opts, "history_interval", 0.0) or 0.0)
        return (state is not None and state.last_seen is not None and state.unreachable_since is None
                and window > 0 and now - state.last_seen <= window)

    async def _nodes_doc(self) -> dict[str, Any]:
        producers, errors = await self._ci.producers()
        lookupds, _ = self._ci.addresses()
        errs: list[str] = []
        # lookupd's list, and of each node what nsqadmin's recent polls know; only a node not
        # heard from lately (new, failing, or the poller is behind) is asked now
        stale = [p for p in producers if not self._recently_answered(p.http_address, self._now())]
        if lookupds and stale:
            try:
                _, _, errs, _ = await self._ci.nsqd_stats_failed(stale, "", "", False)
            except UpstreamError as e:
                errs = [str(e)]
        now = self._now()
        book = self._ci.book
        nodes = []
        for p in producers:
            doc = p.to_json()
            state = book.get(p.http_address)
            if state is not None:
                doc.update({k: v for k, v in state.to_json(now).items() if k not in ("topics", "node", "hostname")})
            nodes.append(doc)
        listed = {p.http_address for p in producers}
        for state in book.failing(present=listed):
            host, _, port = state.address.rpartition(":")
            doc = {"remote_addresses": [], "remote_address": "", "hostname": state.hostname,
                   "broadcast_address": host.strip("[]"), "tcp_port": state.tcp_port,
                   "http_port": int(port) if port.isdigit() else 0, "version": state.version,
                   "topics": [{"topic": t, "tombstoned": False} for t in sorted(state.topics)],
                   "out_of_date": False}
            doc.update({k: v for k, v in state.to_json(now).items() if k not in ("topics", "node", "hostname")})
            nodes.append(doc)
        answered = sum(1 for n in nodes if n.get("status", "ok") == "ok")
        out: dict[str, Any] = {"nodes": nodes, "message": warning_message(list(errors) + list(errs))}
        missing = [n for n in nodes if n.get("status", "ok") != "ok"]
        if missing:
            out["partial"] = {"answered": answered, "total": len(nodes)}
        return out

    async def _node_doc(self, node: str) -> dict[str, Any]:
        producers, errors = await self._ci.producers()
        producer = next((p for p in producers if p.http_address == node), None)
        state = self._ci.book.get(node)
        if producer is None and (state is None or state.status == "ok"):
            raise HTTPAPIError(404, "NODE_NOT_FOUND")
        per_node: list[Any] = []
        errs: list[str] = []
        if producer is not None:
            try:
                per_node, _, errs, _ = await self._ci.nsqd_stats_failed([producer], "", "", True)
            except UpstreamError as e:
                errs = [str(e)]
        state = self._ci.book.get(node)
        total_clients = sum(len(c.clients or []) for t in per_node for c in (t.channels or []))
        total_messages = sum(t.message_count for t in per_node)
        doc = {"node": node, "topics": [t.to_json() for t in per_node], "total_messages": total_messages,
               "total_clients": total_clients, "message": warning_message(list(errors) + list(errs)),
               "status": state.to_json(self._now()) if state is not None else None}
        if state is not None and state.replication is not None:
            doc["replication"] = state.replication  # nsqtw's replication section, only when the node has one
        if state is not None and state.drain is not None:
            doc["drain"] = state.drain  # nsqtw's drain section, only while the node drains
        if not per_node and state is not None and state.status != "ok":
            # no answer: no current numbers (the page shows the last ones it knows, marked as such)
            doc.update(total_messages=None, total_clients=None)
        return doc

    async def _counter_doc(self) -> dict[str, Any]:
        producers, errors = await self._ci.producers()
        channels: dict[str, Any] = {}
        errs: list[str] = []
        answered = len(producers)
        if producers:
            try:
                _, channels, errs, failed = await self._ci.nsqd_stats_failed(producers, "", "", False)
                answered -= len(failed)
            except UpstreamError as e:
                errs = [str(e)]
                answered = 0
        stats = counter_stats(channels)
        missing = self._ci.book.failing()
        # a node that stopped answering keeps its last counts, marked stale: the sum says it is partial
        for st in missing:
            for key, count in st.counts.items():
                topic, _, channel = key.partition(":")
                stats[f"{key}:{st.address}"] = {"node": st.address, "topic_name": topic, "channel_name": channel,
                                                "message_count": count, "stale": True, "last_seen": st.last_seen}
        doc = {"stats": stats, "message": warning_message(list(errors) + list(errs))}
        return self._partial(doc, answered, self._missing_json(missing))

    # --- pages ------------------------------------------------------------------------------

    async def _render(self, request: HTTPRequest, build: Any, title: str, nav: str, api: str) -> bytes:
        """A page, or an error page that keeps polling ``api`` and reloads once it answers again."""
        ctx = self._ctx(request)
        try:
            page = await build(ctx)
        except UpstreamError as e:
            page = pages.error_page(ctx, title, f"UPSTREAM_ERROR: {e}", 502, nav=nav, api=ctx.url(api))
        except HTTPAPIError as e:
            page = pages.not_found_page(ctx, title, e.text, e.status, nav=nav)
        return self._page(request, ctx, page)

    @app.route("/", methods=["GET"])
    @app.route("/topics", methods=["GET"])
    async def topics_page(self, request: HTTPRequest) -> bytes:
        async def build(ctx: pages.PageContext) -> pages.Page:
            doc = await self._topics_doc(False)
            return _flag(pages.topics_page(ctx, doc["topics"], self.node.history.overview(), doc["message"],
                                           doc.get("topics_missing_nodes"), doc.get("node_alerts")), doc)
        return await self._render(request, build, "Topics", "topics", "/api/topics")

    @app.route("/topics/<topic>", methods=["GET"])
    async def topic_page(self, request: HTTPRequest, topic: str) -> bytes:

        async def build(ctx: pages.PageContext) -> pages.Page:
            doc = await self._topic_doc(topic)
            return _flag(pages.topic_page(ctx, topic, doc, self.node.history.topic(topic), doc["message"]), doc)
        return await self._render(request, build, f"Topic {topic}", "topics", f"/api/topics/{pages.q(topic)}")

    @app.route("/topics/<topic>/<channel>", methods=["GET"])
    async def channel_page(self, request: HTTPRequest, topic: str, channel: str) -> bytes:

        async def build(ctx: pages.PageContext) -> pages.Page:
            doc = await self._channel_doc(topic, channel, strict=True)
            return _flag(pages.channel_page(ctx, topic, channel, doc, self.node.history.channel(topic, channel),
                                            doc["message"]), doc)
        return await self._render(request, build, f"Channel {topic}/{channel}", "topics",
                                  f"/api/topics/{pages.q(topic)}/{pages.q(channel)}")

    @app.route("/nodes", methods=["GET"])
    async def nodes_page(self, request: HTTPRequest) -> bytes:
        async def build(ctx: pages.PageContext) -> pages.Page:
            doc = await self._nodes_doc()
            return _flag(pages.nodes_page(ctx, doc["nodes"], doc["message"], doc.get("partial")), doc)
        return await self._render(request, build, "Nodes", "nodes", "/api/nodes")

    @app.route("/nodes/<node>", methods=["GET"])
    async def node_page(self, request: HTTPRequest, node: str) -> bytes:

        async def build(ctx: pages.PageContext) -> pages.Page:
            doc = await self._node_doc(node)
            return _flag(pages.node_page(ctx, node, doc, doc["message"]), doc)
        return await self._render(request, build, f"Node {node}", "nodes", f"/api/nodes/{pages.q(node)}")

    @app.route("/lookup", methods=["GET"])
    async def lookup_page(self, request: HTTPRequest) -> bytes:
        async def build(ctx: pages.PageContext) -> pages.Page:
            inactive: dict[str, list[str]] = {}
            message = ""
            if ctx.lookupds:
                doc = await self._topics_doc(True)
                inactive, message = doc["topics"], doc["message"]
            return pages.lookup_page(ctx, inactive, message)
        return await self._render(request, build, "Lookup", "lookup", "/api/topics?inactive=true")

    @app.route("/counter", methods=["GET"])
    async def counter_page(self, request: HTTPRequest) -> bytes:
        async def build(ctx: pages.PageContext) -> pages.Page:
            doc = await self._counter_doc()
            total = sum(s["message_count"] for s in doc["stats"].values())
            return _flag(pages.counter_page(ctx, total, doc["message"], doc.get("partial"),
                                            doc.get("nodes_missing") or []), doc)
        return await self._render(request, build, "Counter", "counter", "/api/counter")

    @app.route("/ping", methods=["GET"])
    def ping(self, request: HTTPRequest) -> bytes:
        return plain(request, "OK")

    @app.route("/static/<asset>", methods=["GET"])
    def static(self, request: HTTPRequest, asset: str) -> bytes:
        if not asset or asset.startswith(".") or "/" in asset or "\\" in asset:
            raise HTTPAPIError(404, "NOT_FOUND")
        data = self._asset(asset)
        if data is None:
            raise HTTPAPIError(404, "NOT_FOUND")
        ctype = mimetypes.guess_type(asset)[0] or "application/octet-stream"
        if ctype.startswith("text/") or ctype in ("application/javascript", "image/svg+xml"):
            ctype += "; charset=utf-8"
        request.setHeader(b"Content-Type", ctype.encode())
        request.setHeader(b"Cache-Control", b"public, max-age=60")
        return data

    def _asset(self, name: str) -> bytes | None:
        dev = self._opts.dev_static_dir
        if dev:
            path = os.path.join(dev, name)
            if os.path.isfile(path):
                with open(path, "rb") as f:
                    return f.read()
            return None
        ref = resources.files("nsqtw.admin").joinpath("static").joinpath(name)
        if not ref.is_file():
            return None
        return ref.read_bytes()

    # --- JSON API: reads ------------------------------------------------------------------------

    @app.route("/api/topics", methods=["GET"])
    async def api_topics(self, request: HTTPRequest) -> bytes:
        inactive = first(query(request), "inactive") == "true"
        try:
            return v1(request, await self._topics_doc(inactive))
        except UpstreamError as e:
            raise self._upstream(e) from None

    @app.route("/api/topics/<topic>", methods=["GET"])
    async def api_topic(self, request: HTTPRequest, topic: str) -> bytes:
        try:
            return v1(request, await self._topic_doc(topic))
        except UpstreamError as e:
            raise self._upstream(e) from None

    @app.route("/api/topics/<topic>/<channel>", methods=["GET"])
    async def api_channel(self, request: HTTPRequest, topic: str, channel: str) -> bytes:
        try:
            return v1(request, await self._channel_doc(topic, channel))
        except UpstreamError as e:
            raise self._upstream(e) from None

    # --- peek (nsqtw): every nsqd's queued, in-flight and deferred messages, merged ----------------

    def _peek_params(self, request: HTTPRequest) -> tuple[int, str]:
        params = query(request)
        raw = first(params, "n") or "20"
        if not raw.isascii() or not raw.isdigit() or not 0 < int(raw) <= 1000:
            raise HTTPAPIError(400, "INVALID_N")
        state = first(params, "state") or "all"
        if state not in ("all", "queued", "in_flight", "deferred", "dead"):
            raise HTTPAPIError(400, "INVALID_STATE")
        return int(raw), state

    @app.route("/api/topics/<topic>/<channel>/peek", methods=["GET"])
    async def api_channel_peek(self, request: HTTPRequest, topic: str, channel: str) -> bytes:
        if not (is_valid_name(topic) and is_valid_name(channel)):
            raise HTTPAPIError(400, "INVALID_TOPIC_OR_CHANNEL")
        n, state = self._peek_params(request)
        try:
            return v1(request, await self._ci.peek(topic, channel, n, state))
        except UpstreamError as e:
            raise self._upstream(e) from None

    @app.route("/api/topic-peek/<topic>", methods=["GET"])
    async def api_topic_peek(self, request: HTTPRequest, topic: str) -> bytes:
        """A topic's own queue (what waits before it has channels)."""
        if not is_valid_name(topic):
            raise HTTPAPIError(400, "INVALID_TOPIC")
        n, _ = self._peek_params(request)
        try:
            return v1(request, await self._ci.peek(topic, None, n))
        except UpstreamError as e:
            raise self._upstream(e) from None

    @app.route("/api/nodes", methods=["GET"])
    async def api_nodes(self, request: HTTPRequest) -> bytes:
        try:
            return v1(request, await self._nodes_doc())
        except UpstreamError as e:
            raise self._upstream(e) from None

    @app.route("/api/nodes/<node>", methods=["GET"])
    async def api_node(self, request: HTTPRequest, node: str) -> bytes:
        try:
            return v1(request, await self._node_doc(node))
        except UpstreamError as e:
            raise self._upstream(e) from None

    @app.route("/api/counter", methods=["GET"])
    async def api_counter(self, request: HTTPRequest) -> bytes:
        try:
            return v1(request, await self._counter_doc())
        except UpstreamError as e:
            raise self._upstream(e) from None

    @app.route("/api/history", methods=["GET"])
    def api_history(self, request: HTTPRequest) -> bytes:
        return v1(request, self.node.history.overview())

    @app.route("/api/history/<topic>", methods=["GET"])
    def api_history_topic(self, request: HTTPRequest, topic: str) -> bytes:
        return v1(request, self.node.history.topic(topic))

    @app.route("/api/history/<topic>/<channel>", methods=["GET"])
    def api_history_channel(self, request: HTTPRequest, topic: str, channel: str) -> bytes:
        return v1(request, self.node.history.channel(topic, channel))

    # --- charts (nsqtw): the long series the topic, channel and node pages draw ------------------------

    def _since(self, request: HTTPRequest) -> float:
        raw = first(query(request), "range") or "300"
        if not raw.isascii() or not raw.isdigit() or int(raw) <= 0:
            raise HTTPAPIError(400, "INVALID_RANGE")
        return self._now() - int(raw)

    @app.route("/api/charts/topics/<topic>", methods=["GET"])
    def api_charts_topic(self, request: HTTPRequest, topic: str) -> bytes:
        return v1(request, self.node.history.charts(topic=topic, since=self._since(request)))

    @app.route("/api/charts/topics/<topic>/<channel>", methods=["GET"])
    def api_charts_channel(self, request: HTTPRequest, topic: str, channel: str) -> bytes:
        return v1(request, self.node.history.charts(topic=topic, channel=channel, since=self._since(request)))

    @app.route("/api/charts/nodes/<node>", methods=["GET"])
    def api_charts_node(self, request: HTTPRequest, node: str) -> bytes:
        return v1(request, self.node.history.charts(node=node, since=self._since(request)))

    @app.route("/api/graphite", methods=["GET"])
    def api_graphite(self, request: HTTPRequest) -> bytes:
        raise HTTPAPIError(404, "NOT_FOUND: nsqtw does not use graphite; see /api/history")

    # --- JSON API: actions -------------------------------------------------------------------------

    def _done(self, request: HTTPRequest, errors: list[str]) -> bytes:
        return v1(request, {"message": warning_message(errors)})

    @app.route("/api/topics", methods=["POST"])
    async def api_create(self, request: HTTPRequest) -> bytes:
        self._require_admin(request)
        doc = _read_json(request)
        topic = _body_str(doc, "topic")
        channel = _body_str(doc, "channel")
        if not is_valid_name(topic):
            raise HTTPAPIError(400, "INVALID_TOPIC")
        if channel and not is_valid_name(channel):
            raise HTTPAPIError(400, "INVALID_CHANNEL")
        try:
            errors = await self._ci.create_topic_channel(topic, channel)
        except UpstreamError as e:
            raise self._upstream(e) from None
        self.node.notify("create_topic", topic, "", "", request)
        if channel:
            self.node.notify("create_channel", topic, channel, "", request)
        return self._done(request, errors)

    @app.route("/api/topics/<topic>", methods=["POST"])
    async def api_topic_action(self, request: HTTPRequest, topic: str) -> bytes:
        return await self._action(request, topic, "")

    @app.route("/api/topics/<topic>/<channel>", methods=["POST"])
    async def api_channel_action(self, request: HTTPRequest, topic: str, channel: str) -> bytes:
        return await self._action(request, topic, channel)

    async def _action(self, request: HTTPRequest, topic: str, channel: str) -> bytes:
        self._require_admin(request)
        doc = _read_json(request)
        action = _body_str(doc, "action")
        if channel and action in _DEAD_ACTIONS:
            return await self._dead_action(request, doc, topic, channel, action)
        if action not in _ACTIONS:
            raise HTTPAPIError(400, "INVALID_ACTION")
        kind = "channel" if channel else "topic"
        # nsqadmin notifies before it knows whether the fan-out worked
        self.node.notify(f"{action}_{kind}", topic, channel, "", request)
        try:
            if channel:
                errors = await self._ci.channel_action(topic, channel, action)
            else:
                errors = await self._ci.topic_action(topic, action)
        except UpstreamError as e:
            raise self._upstream(e) from None
        return self._done(request, errors)

    # --- channel policies and dead letters (nsqtw): sent to every nsqd holding the channel ----------

    async def _holders(self, topic: str, channel: str) -> tuple[list[Any], list[str]]:
        if not (is_valid_name(topic) and is_valid_name(channel)):
            raise HTTPAPIError(400, "INVALID_TOPIC_OR_CHANNEL")
        try:
            holders, errors = await self._ci.channel_holders(topic, channel)
        except UpstreamError as e:
            raise self._upstream(e) from None
        if not holders and not errors:
            raise HTTPAPIError(404, "CHANNEL_NOT_FOUND")
        return holders, errors

    @staticmethod
    def _answered(answers: list[tuple[str, int, dict[str, Any], str]], errors: list[str]
                  ) -> list[tuple[str, dict[str, Any]]]:
        """The nodes that took the change; when none did, the error every node gave (a value all of
        them refuse is that 400), else 502 ``UPSTREAM_ERROR``."""
        ok = [(node, doc) for node, code, doc, _ in answers if code == 200]
        errors.extend(error for _, code, _, error in answers if code != 200)
        if ok:
            return ok
        refusals = {(code, str(doc.get("message") or "")) for _, code, doc, _ in answers}
        if len(refusals) == 1:
            code, text = refusals.pop()
            if 400 <= code < 500 and text:
                raise HTTPAPIError(code, text)
        raise HTTPAPIError(502, "UPSTREAM_ERROR: " + "; ".join(errors))

    async def _dead_action(self, request: HTTPRequest, doc: Any, topic: str, channel: str, action: str) -> bytes:
        """``redrive`` (dead letters back into the channel with fresh attempts; ``count``: at most that
        many per node, the oldest first) or ``empty_dead`` (dead letters dropped) on every holder."""
        path, key = _DEAD_ACTIONS[action]
        params = {"topic": topic, "channel": channel}
        count = doc.get("count") if action == "redrive" else None
        if count is not None:
            if isinstance(count, bool) or not isinstance(count, int) or count <= 0:
                raise HTTPAPIError(400, "INVALID_COUNT")
            params["count"] = str(count)
        self.node.notify(f"{action}_channel", topic, channel, "", request)
        holders, errors = await self._holders(topic, channel)
        ok = self._answered(await self._ci.channel_post(holders, path, **params), errors) if holders else []
        return v1(request, {"message": warning_message(errors),
                            key: sum(int(d.get(key) or 0) for _, d in ok),
                            "dead_count": sum(int(d.get("dead_count") or 0) for _, d in ok)})

    @app.route("/api/topics/<topic>/<channel>/policy", methods=["POST"])
    async def api_channel_policy(self, request: HTTPRequest, topic: str, channel: str) -> bytes:
        """nsqtw: change the settings named in the body (``{"max_attempts": 3, "max_age": "90s"}``;
        ``""`` or null turns one off) on every nsqd holding the channel."""
        self._require_admin(request)
        doc = _read_json(request)
        if not isinstance(doc, dict) or not doc:
            raise HTTPAPIError(400, "INVALID_BODY")
        params: dict[str, str] = {}
        for name, value in doc.items():
            if name not in POLICY_SETTINGS:
                raise HTTPAPIError(400, f"INVALID_SETTING: {name} (one of {', '.join(POLICY_SETTINGS)})")
            if value is None:
                value = ""
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                raise HTTPAPIError(400, "INVALID_BODY")
            params[name] = str(value).strip()
        self.node.notify("set_policy_channel", topic, channel, "", request)
        holders, errors = await self._holders(topic, channel)
        ok = self._answered(await self._ci.channel_post(
            holders, "channel/config", topic=topic, channel=channel, **params), errors) if holders else []
        return v1(request, {"message": warning_message(errors),
                            "nodes": [{"node": node, "policy": {k: d.get(k) for k in POLICY_SETTINGS}}
                                      for node, d in ok]})

    @app.route("/api/topics/<topic>", methods=["DELETE"])
    async def api_delete_topic(self, request: HTTPRequest, topic: str) -> bytes:
        self._require_admin(request)
        try:
            errors = await self._ci.delete_topic(topic)
        except UpstreamError as e:
            raise self._upstream(e) from None
        self.node.notify("delete_topic", topic, "", "", request)
        return self._done(request, errors)

    @app.route("/api/topics/<topic>/<channel>", methods=["DELETE"])
    async def api_delete_channel(self, request: HTTPRequest, topic: str, channel: str) -> bytes:
        self._require_admin(request)
        try:
            errors = await self._ci.delete_channel(topic, channel)
        except UpstreamError as e:
            raise self._upstream(e) from None
        self.node.notify("delete_channel", topic, channel, "", request)
        return self._done(request, errors)

    @app.route("/api/nodes/<node>", methods=["POST"])
    async def api_node_action(self, request: HTTPRequest, node: str) -> bytes:
        """nsqtw: ``{"action": "forget"}`` drops a node that left nsqlookupd (gone) from nsqadmin's book
        now instead of after ``--history-retention``: its row goes and totals stop being partial;
        ``{"action": "drain"}`` (or ``"undrain"``) starts (or cancels) the node's drain (its ``/drain``)."""
        self._require_admin(request)
        action = _body_str(_read_json(request), "action")
        if action in ("drain", "undrain"):
            try:
                producers, errors = await self._ci.nsqd_producers([node])
            except UpstreamError as e:
                raise self._upstream(e) from None
            if not producers:
                raise HTTPAPIError(404, "NODE_NOT_FOUND")
            try:
                await self._ci.upstream.request("POST" if action == "drain" else "DELETE",
                                                f"{producers[0].base_url}/drain")
            except FetchError as e:
                raise HTTPAPIError(502, f"UPSTREAM_ERROR: {e}") from None
            self.node.notify(f"{action}_node", "", "", node, request)
            return self._done(request, list(errors))
        if action != "forget":
            raise HTTPAPIError(400, "INVALID_ACTION")
        state = self._ci.book.get(node)
        if state is None:
            raise HTTPAPIError(404, "NODE_NOT_FOUND")
        if state.status != "gone":
            # one that nsqlookupd still lists (or that is configured) is asked again at the next poll
            raise HTTPAPIError(400, "NODE_NOT_GONE: only a node that left nsqlookupd can be forgotten")
        self._ci.book.drop(node)
        self.node.notify("forget_node", "", "", node, request)
        return self._done(request, [])

    @app.route("/api/nodes/<node>", methods=["DELETE"])
    async def api_tombstone(self, request: HTTPRequest, node: str) -> bytes:
        self._require_admin(request)
        topic = _body_str(_read_json(request), "topic")
        if not is_valid_name(topic):
            raise HTTPAPIError(400, "INVALID_TOPIC")
        try:
            errors = await self._ci.tombstone_node_for_topic(topic, node)
        except UpstreamError as e:
            raise self._upstream(e) from None
        self.node.notify("tombstone_topic_producer", topic, "", node, request)
        return self._done(request, errors)

    # --- /config -----------------------------------------------------------------------------------

    def _check_cidr(self, request: HTTPRequest) -> None:
        cidr = self._opts.allow_config_from_cidr
        if not cidr:
            return
        host = getattr(request.getClientAddress(), "host", None)
        try:
            ip = ipaddress.ip_address(host or "")
        except ValueError:
            raise HTTPAPIError(400, "INVALID_REMOTE_ADDR") from None
        network = ipaddress.ip_network(cidr, strict=False)
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if ip.version != network.version or ip not in network:
            raise HTTPAPIError(403, "FORBIDDEN")

    @app.route("/config/<opt>", methods=["GET", "PUT"])
    def config(self, request: HTTPRequest, opt: str) -> bytes:
        self._check_cidr(request)
        if request.method == b"PUT":
            data = request.content.read(_MAX_BODY + 1) if request.content is not None else b""
            if len(data) > _MAX_BODY or not data:
                raise HTTPAPIError(413, "INVALID_VALUE")
            if opt == "nsqlookupd_http_addresses":
                try:
                    addresses = json.loads(data)
                except ValueError:
                    raise HTTPAPIError(400, "INVALID_VALUE") from None
                if not isinstance(addresses, list) or not all(isinstance(a, str) for a in addresses):
                    raise HTTPAPIError(400, "INVALID_VALUE")
                try:
                    self.node.set_options(lookupd_http_addresses=addresses)
                except OptionError:
                    raise HTTPAPIError(400, "INVALID_VALUE") from None
            elif opt == "log_level":
                level = data.decode("utf-8", "replace").strip().lower()
                if level not in LOG_LEVELS:
                    raise HTTPAPIError(400, "INVALID_VALUE")
                self.node.set_options(log_level=LOG_LEVELS[level])
            else:
                raise HTTPAPIError(400, "INVALID_OPTION")
        try:
            value = config_value(self._opts, opt)
        except KeyError:
            raise HTTPAPIError(400, "INVALID_OPTION") from None
        return v1(request, value)
