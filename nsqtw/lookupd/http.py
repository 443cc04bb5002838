"""
nsqlookupd's HTTP API (``nsqlookupd/http.go``) as a klein app.

Consumers poll ``/lookup?topic=`` to find the nsqd producing a topic; nsqd asks
``/channels?topic=`` to pre-create channels; nsqadmin reads ``/topics``,
``/nodes`` and calls the create/delete/tombstone endpoints.  Every answer is
NSQ's V1 envelope with nsqlookupd's exact error texts and statuses, and the
JSON keys come out in the order Go writes them: struct fields in declaration
order, map keys sorted.

Parameters are read from the query string with Go's ``url.ParseQuery`` rules:
a malformed query (a bad ``%`` escape, a ``;`` separator) is
``400 INVALID_REQUEST``, as nsqlookupd answers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from klein import Klein
from twisted.logger import Logger
from twisted.web.iweb import IRequest
from twisted.web.resource import Resource

from .. import NSQ_VERSION
from ..errors import HTTPAPIError
from .core.peers import GO_ZERO_TIME_NS
from ..protocol.names import is_valid_topic_name
from ..runtime.responses import first, install_error_handlers, plain, query, topic_channel_args, v1

if TYPE_CHECKING:
    from .options import LookupdOptions
    from .core.registry import RegistrationDB


class LookupdNode(Protocol):
    """What the HTTP API needs of the running nsqlookupd (the LookupdService provides it)."""

    db: RegistrationDB
    options: LookupdOptions

    def now(self) -> float: ...

__all__ = ["LookupdHTTPAPI"]

log = Logger(namespace="nsqtw.lookupd")



def _params(request: IRequest) -> dict[str, list[str]]:
    return query(request)


_get = first


def _topic_arg(params: dict[str, list[str]]) -> str:
    topic = _get(params, "topic")
    if topic is None:
        raise HTTPAPIError(400, "MISSING_ARG_TOPIC")
    return topic


_topic_channel_args = topic_channel_args


def _ns(seconds: float) -> int:
    return int(round(seconds * 1e9))


class _LookupFirst(Resource):
    """The app's resource, with ``GET /lookup`` (what every consumer polls) answered without
    klein's routing and Deferred machinery; anything else, and a ``/lookup`` that fails (a
    missing or bad topic, an unknown one), goes through klein as before, which gives the
    answer, errors included."""

    isLeaf = True

    def __init__(self, api: LookupdHTTPAPI, inner: Any) -> None:
        super().__init__()
        self.api = api
        self.inner = inner

    def render(self, request: Any) -> Any:
        if request.method == b"GET" and request.path == b"/lookup":
            try:
                return self.api.lookup(request)
            except Exception:
                pass  # klein answers it
        return self.inner.render(request)


class LookupdHTTPAPI:
    """The klein app of one nsqlookupd; ``node`` is the running LookupdService (a :class:`LookupdNode`)."""

    app = Klein()
    install_error_handlers(app)

    def __init__(self, node: LookupdNode) -> None:
        self.node = node

    def resource(self) -> Any:
        return _LookupFirst(self, self.app.resource())

    @property
    def _db(self) -> Any:
        return self.node.db

    # --- reads -----------------------------------------------------------------

    @app.route("/ping", methods=["GET"])
    def ping(self, request: IRequest) -> bytes:
        return plain(request, "OK")

    @app.route("/info", methods=["GET"])
    def info(self, request: IRequest) -> bytes:
        return v1(request, {"version": NSQ_VERSION})

    @app.route("/topics", methods=["GET"])
    def topics(self, request: IRequest) -> bytes:
        return v1(request, {"topics": self._db.topics()})

    @app.route("/channels", methods=["GET"])
    def channels(self, request: IRequest) -> bytes:
        topic = _topic_arg(_params(request))
        return v1(request, {"channels": self._db.channels(topic)})

    @app.route("/lookup", methods=["GET"])
    def lookup(self, request: IRequest) -> bytes:
        topic = _topic_arg(_params(request))
        db = self._db
        if not db.has_topic(topic):
            raise HTTPAPIError(404, "TOPIC_NOT_FOUND")
        opts = self.node.options
        producers = db.topic_producers(topic, opts.inactive_producer_timeout, opts.tombstone_lifetime,
                                       self.node.now())
        return v1(request, {
            "channels": db.channels(topic),
            "producers": [p.to_json() for p in producers],
        })

    @app.route("/nodes", methods=["GET"])
    def nodes(self, request: IRequest) -> bytes:
        opts = self.node.options
        out = []
        for peer, topics, tombstones in self._db.nodes(opts.inactive_producer_timeout,
                                                       opts.tombstone_lifetime, self.node.now()):
            entry = peer.to_json()
            entry["tombstones"] = tombstones
            entry["topics"] = topics
            out.append(entry)
        return v1(request, {"producers": out})

    @app.route("/debug", methods=["GET"])
    def debug(self, request: IRequest) -> bytes:
        data: dict[str, list[dict[str, Any]]] = {}
        for key, producers in self._db.items():
            for producer in producers.values():
                peer = producer.peer
                entry = {
                    "broadcast_address": peer.broadcast_address,
                    "hostname": peer.hostname,
                    "http_port": peer.http_port,
                    "id": peer.id,
                    "last_update": _ns(peer.last_update),
                    "tcp_port": peer.tcp_port,
                    "tombstoned": producer.tombstoned,
                    "tombstoned_at": (_ns(producer.tombstoned_at) if producer.tombstoned_at is not None
                                      else GO_ZERO_TIME_NS),
                    "topology_region": peer.topology_region,
                    "topology_zone": peer.topology_zone,
                    "version": peer.version,
                }
                data.setdefault(str(key), []).append(entry)
        return v1(request, {k: data[k] for k in sorted(data)})

    # --- writes (nsqadmin's) --------------------------------------------------------

    @app.route("/topic/create", methods=["POST"])
    def topic_create(self, request: IRequest) -> bytes:
        topic = _topic_arg(_params(request))
        if not is_valid_topic_name(topic):
            raise HTTPAPIError(400, "INVALID_ARG_TOPIC")
        log.info("DB: adding topic({topic})", topic=topic)
        self._db.create_topic(topic)
        return v1(request, None)

    @app.route("/topic/delete", methods=["POST"])
    def topic_delete(self, request: IRequest) -> bytes:
        topic = _topic_arg(_params(request))
        log.info("DB: removing topic({topic}) and its channels", topic=topic)
        self._db.delete_topic(topic)
        return v1(request, None)

    @app.route("/topic/tombstone", methods=["POST"])
    def topic_tombstone(self, request: IRequest) -> bytes:
        params = _params(request)
        topic = _topic_arg(params)
        node = _get(params, "node")
        if node is None:
            raise HTTPAPIError(400, "MISSING_ARG_NODE")
        log.info("DB: setting tombstone for producer@{node} of topic({topic})", node=node, topic=topic)
        self._db.tombstone_topic_producer(topic, node, self.node.now())
        return v1(request, None)

    @app.route("/channel/create", methods=["POST"])
    def channel_create(self, request: IRequest) -> bytes:
        topic, channel = _topic_channel_args(_params(request))
        log.info("DB: adding channel({channel}) in topic({topic})", channel=channel, topic=topic)
        self._db.create_channel(topic, channel)
        return v1(request, None)

    @app.route("/channel/delete", methods=["POST"])
    def channel_delete(self, request: IRequest) -> bytes:
        topic, channel = _topic_channel_args(_params(request))
        if not self._db.delete_channel(topic, channel):
            raise HTTPAPIError(404, "CHANNEL_NOT_FOUND")
        log.info("DB: removed channel({channel}) from topic({topic})", channel=channel, topic=topic)
        return v1(request, None)
