"""
nsqd's HTTP API (``nsqd/http.go``) as a klein app.

Every route reads its parameters from the query string, answers in NSQ's V1
envelope and uses nsqd's exact error texts and statuses.  The app holds an
:class:`NsqdNode`-like object (the running service) for the broker, the clock,
the current options and the bound addresses; after a publish it asks the node
to settle so consumers get the messages in the same reactor turn.
"""

from __future__ import annotations

import json
import re
import socket
from typing import TYPE_CHECKING, Any, Protocol

from klein import Klein
from twisted.web.iweb import IRequest

from .. import NSQ_VERSION
from ..errors import BrokerError, ChannelNotFound, HTTPAPIError, TopicNotFound
from ..options import LOG_LEVELS, OptionError, config_value, parse_duration
from .core.broker import Draining
from .core.peek import DEFAULT_N, MAX_N, peek_channel, peek_topic
from .core.peek import STATES as PEEK_STATES
from ..protocol.names import is_valid_name
from .stats.snapshot import broker_stats, held_stats, render_text
from ..runtime.responses import first, install_error_handlers, plain, query, topic_channel_args, v1

if TYPE_CHECKING:
    from twisted.internet.defer import Deferred

    from .core.broker import Broker
    from ..options import NsqdOptions


class NsqdNode(Protocol):
    """What the HTTP API needs of the running nsqd (the NsqdService provides it)."""

    broker: Broker
    options: NsqdOptions

    @property
    def tcp_port(self) -> int | None: ...

    @property
    def http_port(self) -> int | None: ...

    @property
    def https_port(self) -> int | None: ...

    def now(self) -> float: ...

    def settle(self) -> None:
        """Deliver what became deliverable (after a publish)."""

    def persist_metadata(self, urgent: bool = False) -> Deferred[Any]: ...

    @property
    def durable_publish(self) -> bool:
        """True when a publish is answered only after :meth:`sync_barrier` fires."""

    def sync_barrier(self) -> Deferred[Any]:
        """Fires once what was published before it is as durable as --sync-every (and
        replication) promise."""

    def replication_health(self) -> tuple[bool, str] | None:
        """``(ok, text)`` of replicated publishing for /ping; None when not replicated."""

    def replication_stats(self) -> dict[str, Any] | None:
        """The replication section of /stats; None when not replicated."""

    def set_options(self, **changes: Any) -> None: ...

    def set_lookupd_addresses(self, addresses: list[str]) -> None: ...

    #: the node's drain (:class:`~nsqtw.nsqd.drain.DrainService`)
    drain: Any
    #: its links to its replica peers (None: not replicated)
    replication: Any

__all__ = ["NsqdHTTPAPI"]


def replication_text(doc: dict[str, Any]) -> str:
    """The replication section of the text /stats."""
    lines = []
    if "status" in doc:
        lines.append(f"\nReplication: {doc['status']} ({doc['peers_in_sync']} peers in sync, "
                     f"min acks {doc['min_acks']}, degraded mode {doc['degraded_mode']})")
        for p in doc["peers"]:
            extra = f" - {p['reason']}" if p.get("reason") else ""
            lines.append(f"   [peer {p['address']}] {p.get('sync_state', p['state'])} ({p['state']}) "
                         f"lag: {p.get('lag_messages', 0)} messages, {p.get('lag_seconds', 0.0):.3f}s "
                         f"unacked batches: {p['unacked_batches']}{extra}")
    for ad in doc.get("adopted", ()):
        lines.append(f"\nAdopted node {ad['origin_node_id']} (epoch {ad.get('epoch', 0)}): {ad['messages']} "
                     "messages republished here" + (f", {ad['refused']} refused" if ad["refused"] else ""))
    for sh in doc.get("shadows", ()):
        lines.append(f"\nShadow of node {sh['origin_node_id']}: {sh['unfinished_messages']} unfinished messages, "
                     f"{sh['topics']} topics, log {sh['log_bytes']} bytes")
    return "\n".join(lines) + "\n"

def drain_text(doc: dict[str, Any]) -> str:
    """The drain section of the text /stats."""
    peer = f", peer {doc['peer']}" if doc.get("peer") else ""
    error = f" (last hand-off failed: {doc['handoff_error']})" if doc.get("handoff_error") else ""
    return (f"\nDrain: {doc['state']}: {doc['queued']} queued, {doc['in_flight']} in flight, "
            f"{doc['handed_off']} handed off{peer}{error}\n")


_BOOL = {"true": True, "1": True, "false": False, "0": False}
_PEEK_N = re.compile(r"[0-9]{1,9}\Z")
_GO_INT = re.compile(r"[+-]?[0-9]{1,19}\Z")  # strconv.ParseInt(s, 10, 64); longer is out of range


def _read_body(request: IRequest, limit: int) -> bytes | None:
    """At most ``limit`` bytes of the body; None if there were more."""
    data = request.content.read(limit + 1) if request.content is not None else b""
    if len(data) > limit:
        return None
    return data


class NsqdHTTPAPI:
    """The klein app serving one nsqd's HTTP (and HTTPS) listeners."""

    app = Klein()
    install_error_handlers(app)

    def __init__(self, node: NsqdNode, tls_only_http: bool = False) -> None:
        self.node = node
        self.tls_only_http = tls_only_http

    def resource(self) -> Any:
        return self.app.resource()

    # --- helpers -------------------------------------------------------------

    @property
    def _broker(self) -> Any:
        return self.node.broker

    def _settle(self) -> None:
        self.node.settle()

    def _topic_param(self, params: dict[str, list[str]]) -> str:
        name = first(params, "topic")
        if name is None:
            raise HTTPAPIError(400, "MISSING_ARG_TOPIC")
        if not is_valid_name(name):
            raise HTTPAPIError(400, "INVALID_TOPIC")
        return name

    def _guard(self, request: IRequest) -> None:
        """--tls-required=true: plain HTTP answers 403 TLS_REQUIRED to everything."""
        if self.tls_only_http and not request.isSecure():
            raise HTTPAPIError(403, "TLS_REQUIRED", {"https_port": self.node.https_port or 0})

    # --- routes ----------------------------------------------------------------

    @app.route("/ping", methods=["GET"])
    def ping(self, request: IRequest) -> bytes:
        self._guard(request)
        if self._broker.draining:  # producers and load balancers move on
            return plain(request, "NOK - draining", 503)
        health = self._broker.health_status()
        if health != "OK":
            return plain(request, health, 500)
        replication = self.node.replication_health()
        if replication is not None:
            ok, text = replication
            return plain(request, text, 200 if ok else 500)
        return plain(request, health)

    @app.route("/info", methods=["GET"])
    def info(self, request: IRequest) -> bytes:
        self._guard(request)
        node = self.node
        opts = node.options
        return v1(request, {
            "version": NSQ_VERSION,
            "broadcast_address": opts.broadcast_address,
            "hostname": socket.gethostname(),
            "http_port": node.http_port if node.http_port is not None else -1,
            "tcp_port": node.tcp_port if node.tcp_port is not None else -1,
            "start_time": int(self._broker.start_time),
            "max_heartbeat_interval": int(opts.max_heartbeat_interval * 1e9),
            "max_output_buffer_size": opts.max_output_buffer_size,
            "max_output_buffer_timeout": int(opts.max_output_buffer_timeout * 1e9),
            "max_deflate_level": opts.max_deflate_level,
        })

    @app.route("/pub", methods=["POST"])
    def pub(self, request: IRequest) -> bytes:
        self._guard(request)
        max_size = self.node.options.max_msg_size
        length = request.getHeader(b"content-length")
        if length is not None and length.isdigit() and int(length) > max_size:
            raise HTTPAPIError(413, "MSG_TOO_BIG")
        body = _read_body(request, max_size)
        if body is None:
            raise HTTPAPIError(413, "MSG_TOO_BIG")
        if not body:
            raise HTTPAPIError(400, "MSG_EMPTY")
        params = query(request)
        topic = self._topic_param(params)
        defer = first(params, "defer")
        delay = 0.0
        if defer is not None:
            if not _GO_INT.match(defer):  # strconv.ParseInt: an optional sign and digits only
                raise HTTPAPIError(400, "INVALID_DEFER")
            ms = int(defer, 10)
            if ms < 0 or ms > self.node.options.max_req_timeout * 1000:
                raise HTTPAPIError(400, "INVALID_DEFER")
            delay = ms / 1000.0
        now = self.node.now()
        try:
            if delay > 0:
                self._broker.publish_deferred(topic, body, delay, now)
            else:
                self._broker.publish(topic, [body], now)
        except Draining:
            raise HTTPAPIError(503, "DRAINING") from None
        except BrokerError:
            raise HTTPAPIError(503, "EXITING") from None
        self._settle()
        return self._ok_when_durable(request)

    def _ok_when_durable(self, request: IRequest) -> Any:
        """``OK`` now, or (--sync-every=1, replication) once the fsync covering the publish
        is done and the peers stored it; 503 with nsqd's message for a failed publish."""
        if not self.node.durable_publish:
            return v1(request, "OK")

        def failed(f: Any) -> Any:
            raise HTTPAPIError(503, "EXITING")

        d = self.node.sync_barrier()
        return d.addCallbacks(lambda _: v1(request, "OK"), failed)

    @app.route("/mpub", methods=["POST"])
    def mpub(self, request: IRequest) -> bytes:
        self._guard(request)
        opts = self.node.options
        length = request.getHeader(b"content-length")
        if length is not None and length.isdigit() and int(length) > opts.max_body_size:
            raise HTTPAPIError(413, "BODY_TOO_BIG")
        params = query(request)
        topic = self._topic_param(params)
        if self._broker.draining:
            raise HTTPAPIError(503, "DRAINING")
        self._broker.get_topic(topic, self.node.now())
        binary = False
        raw = first(params, "binary")
        if raw is not None:
            binary = _BOOL.get(raw, True)
        if binary:
            bodies = self._read_binary_mpub(request)
        else:
            data = _read_body(request, opts.max_body_size)
            if data is None:
                raise HTTPAPIError(413, "BODY_TOO_BIG")
            bodies = []
            for block in data.split(b"\n"):
                if not block:
                    continue
                if len(block) > opts.max_msg_size:
                    raise HTTPAPIError(413, "MSG_TOO_BIG")
                bodies.append(block)
        if bodies:
            try:
                self._broker.publish(topic, bodies, self.node.now())
            except Draining:
                raise HTTPAPIError(503, "DRAINING") from None
            except BrokerError:
                raise HTTPAPIError(503, "EXITING") from None
            self._settle()
        return self._ok_when_durable(request)

    def _read_binary_mpub(self, request: IRequest) -> list[bytes]:
        """nsqd's readMPUB over the body: errors become 413 with the ``E_`` cut off."""
        opts = self.node.options
        content = request.content
        data = content.read() if content is not None else b""
        pos = 0

        def read_len() -> int | None:
            nonlocal pos
            if pos + 4 > len(data):
                return None
            value = int.from_bytes(data[pos:pos + 4], "big", signed=True)
            pos += 4
            return value

        num = read_len()
        if num is None:
            raise HTTPAPIError(413, "BAD_BODY")
        if num <= 0 or num > (opts.max_body_size - 4) // 5:
            raise HTTPAPIError(413, "BAD_BODY")
        bodies = []
        for _ in range(num):
            size = read_len()
            if size is None or size <= 0 or size > opts.max_msg_size or pos + size > len(data):
                raise HTTPAPIError(413, "BAD_MESSAGE")
            bodies.append(data[pos:pos + size])
            pos += size
        return bodies

    @app.route("/stats", methods=["GET"])
    def stats(self, request: IRequest) -> bytes:
        self._guard(request)
        params = query(request)
        fmt = first(params, "format") or ""
        topic = first(params, "topic") or ""
        channel = first(params, "channel") or ""
        include_clients = _BOOL.get(first(params, "include_clients") or "", True)
        include_mem = _BOOL.get(first(params, "include_mem") or "", True)
        # nsqtw addition, off unless asked (nsqadmin asks): each channel's oldest_message_ts
        include_oldest = _BOOL.get(first(params, "include_oldest_message_ts") or "", False)
        # nsqtw addition, off unless asked (nsqadmin asks): each channel's policy and its counts
        include_policies = _BOOL.get(first(params, "include_policies") or "", False)
        now = self.node.now()
        doc = broker_stats(self._broker, now, topic=topic, channel=channel,
                           include_clients=include_clients, include_mem=include_mem,
                           include_oldest=include_oldest, include_policies=include_policies)
        replication = self.node.replication_stats()
        if replication is not None:
            doc["replication"] = replication  # nsqtw addition, only when --replica-peer is given
        if self.node.drain.draining:
            doc["drain"] = self.node.drain.progress()  # nsqtw addition, only while draining
        if fmt != "json":
            text = render_text(doc, now, self._broker.start_time)
            if replication is not None:
                text += replication_text(replication)
            if "drain" in doc:
                text += drain_text(doc["drain"])
            return v1(request, text)
        return v1(request, doc)

    @app.route("/metrics", methods=["GET"])
    def metrics(self, request: IRequest) -> bytes:
        """nsqtw addition: /stats in Prometheus' text format (nsqio/nsq#732)."""
        from .stats.prometheus import CONTENT_TYPE, render_metrics

        self._guard(request)
        params = query(request)
        include_clients = _BOOL.get(first(params, "include_clients") or "", True)
        doc = broker_stats(self._broker, self.node.now(), include_clients=include_clients,
                           include_policies=True)
        doc["held"] = held_stats(self._broker)  # always on /metrics (the cap included)
        replication = self.node.replication_stats()
        if replication is not None:
            doc["replication"] = replication
        doc["drain"] = self.node.drain.progress()  # /metrics always says the drain's state
        request.setHeader(b"Content-Type", CONTENT_TYPE.encode())
        body = render_metrics(doc)
        request.setHeader(b"Content-Length", b"%d" % len(body))
        return body

    @app.route("/topic/create", methods=["POST"])
    def topic_create(self, request: IRequest) -> bytes:
        self._guard(request)
        topic = self._topic_param(query(request))
        try:
            self._broker.get_topic(topic, self.node.now())
        except BrokerError:
            raise HTTPAPIError(503, "EXITING") from None
        return v1(request, None)

    @app.route("/topic/delete", methods=["POST"])
    def topic_delete(self, request: IRequest) -> bytes:
        self._guard(request)
        topic = first(query(request), "topic")
        if topic is None:
            raise HTTPAPIError(400, "MISSING_ARG_TOPIC")
        try:
            self._broker.delete_topic(topic)
        except TopicNotFound:
            raise HTTPAPIError(404, "TOPIC_NOT_FOUND") from None
        self._settle()
        return v1(request, None)

    @app.route("/topic/empty", methods=["POST"])
    def topic_empty(self, request: IRequest) -> bytes:
        self._guard(request)
        topic = self._topic_param(query(request))
        try:
            self._broker.empty(topic)
        except TopicNotFound:
            raise HTTPAPIError(404, "TOPIC_NOT_FOUND") from None
        return v1(request, None)

    @app.route("/topic/pause", methods=["POST"])
    def topic_pause(self, request: IRequest) -> bytes:
        return self._pause_topic(request, True)

    @app.route("/topic/unpause", methods=["POST"])
    def topic_unpause(self, request: IRequest) -> bytes:
        return self._pause_topic(request, False)

    def _pause_topic(self, request: IRequest, paused: bool) -> bytes:
        self._guard(request)
        topic = first(query(request), "topic")
        if topic is None:
            raise HTTPAPIError(400, "MISSING_ARG_TOPIC")
        try:
            self._broker.set_paused(topic, None, paused)
        except TopicNotFound:
            raise HTTPAPIError(404, "TOPIC_NOT_FOUND") from None
        self.node.persist_metadata()
        self._settle()
        return v1(request, None)

    @app.route("/channel/create", methods=["POST"])
    def channel_create(self, request: IRequest) -> bytes:
        self._guard(request)
        topic, channel = topic_channel_args(query(request))
        try:
            self._broker.find_topic(topic).get_channel(channel, self.node.now())
        except TopicNotFound:
            raise HTTPAPIError(404, "TOPIC_NOT_FOUND") from None
        except BrokerError:
            raise HTTPAPIError(503, "EXITING") from None
        self._settle()
        return v1(request, None)

    @app.route("/channel/delete", methods=["POST"])
    def channel_delete(self, request: IRequest) -> bytes:
        self._guard(request)
        topic, channel = topic_channel_args(query(request))
        try:
            self._broker.delete_channel(topic, channel)
        except TopicNotFound:
            raise HTTPAPIError(404, "TOPIC_NOT_FOUND") from None
        except ChannelNotFound:
            raise HTTPAPIError(404, "CHANNEL_NOT_FOUND") from None
        self._settle()
        return v1(request, None)

    @app.route("/channel/empty", methods=["POST"])
    def channel_empty(self, request: IRequest) -> bytes:
        self._guard(request)
        topic, channel = topic_channel_args(query(request))
        try:
            self._broker.empty(topic, channel)
        except TopicNotFound:
            raise HTTPAPIError(404, "TOPIC_NOT_FOUND") from None
        except ChannelNotFound:
            raise HTTPAPIError(404, "CHANNEL_NOT_FOUND") from None
        return v1(request, None)

    @app.route("/channel/pause", methods=["POST"])
    def channel_pause(self, request: IRequest) -> bytes:
        return self._pause_channel(request, True)

    @app.route("/channel/unpause", methods=["POST"])
    def channel_unpause(self, request: IRequest) -> bytes:
        return self._pause_channel(request, False)

    def _pause_channel(self, request: IRequest, paused: bool) -> bytes:
        self._guard(request)
        topic, channel = topic_channel_args(query(request))
        try:
            self._broker.set_paused(topic, channel, paused)
        except TopicNotFound:
            raise HTTPAPIError(404, "TOPIC_NOT_FOUND") from None
        except ChannelNotFound:
            raise HTTPAPIError(404, "CHANNEL_NOT_FOUND") from None
        self.node.persist_metadata()
        self._settle()
        return v1(request, None)

    # --- channel policies (nsqtw; see nsqtw.nsqd.core.policy) ------------------------------

    def _find_channel(self, params: dict[str, list[str]]) -> Any:
        topic, channel = topic_channel_args(params)
        try:
            return self._broker.find_channel(topic, channel)
        except TopicNotFound:
            raise HTTPAPIError(404, "TOPIC_NOT_FOUND") from None
        except ChannelNotFound:
            raise HTTPAPIError(404, "CHANNEL_NOT_FOUND") from None

    @staticmethod
    def _policy_doc(ch: Any) -> dict[str, Any]:
        from .core.policy import ChannelPolicy
        doc: dict[str, Any] = {"topic": ch.topic.name, "channel": ch.name}
        doc.update((ch.policy or ChannelPolicy()).to_json())
        return doc

    @app.route("/channel/config", methods=["GET", "POST"])
    def channel_config(self, request: IRequest) -> bytes:
        """A channel's policy: GET answers it, POST changes the settings it names."""
        from .core.policy import POLICY_PARAMS, ChannelPolicy, PolicyError

        self._guard(request)
        params = query(request)
        ch = self._find_channel(params)
        if request.method == b"POST":
            changes = {name: first(params, name) or "" for name in POLICY_PARAMS if name in params}
            try:
                policy = (ch.policy or ChannelPolicy()).updated(changes, topic=ch.topic.name)
            except PolicyError as e:
                raise HTTPAPIError(400, e.code) from None
            self._broker.set_policy(ch.topic.name, ch.name, policy, self.node.now())
            self._settle()
        return v1(request, self._policy_doc(ch))

    @app.route("/channel/redrive", methods=["POST"])
    def channel_redrive(self, request: IRequest) -> bytes:
        """Dead letters back into their channel with fresh attempts (``count``: the oldest N)."""
        self._guard(request)
        params = query(request)
        ch = self._find_channel(params)
        raw = first(params, "count")
        count = None
        if raw:
            if _PEEK_N.match(raw) is None or int(raw) <= 0:
                raise HTTPAPIError(400, "INVALID_COUNT")
            count = int(raw)
        n = ch.redrive(count, self.node.now())
        self._settle()
        return v1(request, {"redriven": n, "dead_count": len(ch.dead) if ch.dead is not None else 0})

    @app.route("/channel/dead/empty", methods=["POST"])
    def channel_dead_empty(self, request: IRequest) -> bytes:
        """Drop every dead letter of the channel."""
        self._guard(request)
        ch = self._find_channel(query(request))
        return v1(request, {"emptied": ch.empty_dead(), "dead_count": 0})

    @staticmethod
    def _null(request: IRequest) -> bytes:
        """An empty address list as Go marshals a nil slice."""
        request.setHeader(b"X-NSQ-Content-Type", b"nsq; version=1.0")
        request.setHeader(b"Content-Type", b"application/json; charset=utf-8")
        request.setHeader(b"Content-Length", b"4")
        return b"null"

    # --- peek (nsqtw; off unless --peek-enabled) ------------------------------------------

    def _peek_args(self, request: IRequest, params: dict[str, list[str]]) -> int:
        """403 PEEK_DISABLED unless enabled; ``n`` (default 20, at most 1000) else 400 INVALID_N."""
        if not self.node.options.peek_enabled:
            raise HTTPAPIError(403, "PEEK_DISABLED")
        raw = first(params, "n")
        if raw is None:
            return DEFAULT_N
        if _PEEK_N.match(raw) is None or not 0 < int(raw) <= MAX_N:
            raise HTTPAPIError(400, "INVALID_N")
        return int(raw)

    @app.route("/channel/peek", methods=["GET"])
    def channel_peek(self, request: IRequest) -> bytes:
        self._guard(request)
        params = query(request)
        n = self._peek_args(request, params)
        topic, channel = topic_channel_args(params)
        state = first(params, "state") or "all"
        if state != "all" and state not in PEEK_STATES:
            raise HTTPAPIError(400, "INVALID_STATE")
        try:
            ch = self._broker.find_channel(topic, channel)
        except TopicNotFound:
            raise HTTPAPIError(404, "TOPIC_NOT_FOUND") from None
        except ChannelNotFound:
            raise HTTPAPIError(404, "CHANNEL_NOT_FOUND") from None
        states = PEEK_STATES if state == "all" else (state,)
        return v1(request, peek_channel(ch, states, n, self.node.options.peek_max_body_size, self.node.now()))

    @app.route("/topic/peek", methods=["GET"])
    def topic_peek(self, request: IRequest) -> bytes:
        self._guard(request)
        params = query(request)
        n = self._peek_args(request, params)
        name = self._topic_param(params)
        try:
            topic = self._broker.find_topic(name)
        except TopicNotFound:
            raise HTTPAPIError(404, "TOPIC_NOT_FOUND") from None
        return v1(request, peek_topic(topic, n, self.node.options.peek_max_body_size, self.node.now()))

    @app.route("/config/<string:opt>", methods=["GET", "PUT"])
    def config(self, request: IRequest, opt: str) -> bytes:
        self._guard(request)
        if request.method == b"PUT":
            limit = self.node.options.max_msg_size
            body = _read_body(request, limit)
            if body is None or not body:
                raise HTTPAPIError(413, "INVALID_VALUE")
            if opt == "nsqlookupd_tcp_addresses":
                try:
                    value = json.loads(body)
                except (ValueError, RecursionError):
                    raise HTTPAPIError(400, "INVALID_VALUE") from None
                if value is not None and (
                        not isinstance(value, list) or not all(isinstance(v, str) for v in value)):
                    raise HTTPAPIError(400, "INVALID_VALUE")
                self.node.set_lookupd_addresses(value or [])
                if value is None:
                    return self._null(request)  # Go unmarshals null into a nil slice
            elif opt == "log_level":
                level = body.decode("utf-8", "replace").lower()
                if level not in LOG_LEVELS:
                    raise HTTPAPIError(400, "INVALID_VALUE")
                self.node.set_options(log_level=LOG_LEVELS[level])
            else:
                raise HTTPAPIError(400, "INVALID_OPTION")
        try:
            value = config_value(self.node.options, opt)
        except KeyError:
            raise HTTPAPIError(400, "INVALID_OPTION") from None
        return v1(request, value)

    # --- drain and maintenance (nsqtw) ----------------------------------------------------

    @app.route("/drain", methods=["GET", "POST", "DELETE"])
    def drain(self, request: IRequest) -> bytes:
        """nsqtw addition: ``POST`` starts draining (publishes refused, topics unregistered
        from nsqlookupd, the backlog delivered or handed to a replica peer in sync),
        ``DELETE`` cancels, ``GET`` reports the progress."""
        self._guard(request)
        drain = self.node.drain
        if request.method == b"POST":
            doc = drain.start()
            drain.step()
            doc = drain.progress()
        elif request.method == b"DELETE":
            doc = drain.cancel()
        else:
            doc = drain.progress()
        return v1(request, doc)

    @app.route("/replication/maintenance", methods=["GET", "POST"])
    def maintenance(self, request: IRequest) -> bytes:
        """nsqtw addition: ``POST ?for=DURATION`` asks this node's replica peers not to adopt
        it for that long (``for=0``: the window is over); ``GET`` shows the window."""
        self._guard(request)
        replication = self.node.replication
        if replication is None:
            raise HTTPAPIError(400, "NOT_REPLICATED")
        if request.method == b"POST":
            raw = first(query(request), "for")
            if raw is None:
                raise HTTPAPIError(400, "MISSING_ARG_FOR")
            try:
                seconds = parse_duration(raw, "for")
            except OptionError:
                raise HTTPAPIError(400, "INVALID_FOR") from None
            if seconds < 0:
                raise HTTPAPIError(400, "INVALID_FOR")
            return v1(request, replication.maintenance(seconds))
        return v1(request, replication.maintenance_stats())
