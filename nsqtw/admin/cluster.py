"""
What nsqadmin knows about the cluster: who produces what, and the merged stats (``clusterinfo``).

Two halves, kept apart so the merging can be tested on plain dicts:

* pure functions and value types (:class:`Producer`, :class:`TopicStats`,
  :class:`ChannelStats`, :class:`ClientStats`, :class:`E2eAggregate`,
  :func:`merge_lookupd_nodes`, :func:`aggregate_stats`, ...) that turn the
  JSON documents of nsqlookupd's ``/nodes`` and ``/lookup`` and nsqd's
  ``/info`` and ``/stats`` into nsqadmin's ``/api/*`` shapes;
* :class:`Upstream` (one GET or POST through an injected treq client, with the
  request timeout on the injected clock) and :class:`ClusterInfo`, which asks
  every nsqlookupd or nsqd at once and sorts the answers from the failures.

Failures follow ``clusterinfo``: when some upstreams answer, the caller gets
the merged answer plus a list of error texts (shown as ``"WARNING: ..."``);
when none does, :class:`UpstreamError` is raised (a 502 ``UPSTREAM_ERROR``).
"""

from __future__ import annotations

import json
import re
from typing import Any, TypeVar, cast
from collections.abc import Awaitable, Callable, Iterable, Sequence
from urllib.parse import quote

import attr
from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from ..runtime.upstream import Upstream as SharedUpstream
from ..runtime.upstream import https_retry_url

from ..protocol.channels import ChannelCounts
from .nodes import NodeBook

__all__ = [
    "UpstreamError",
    "FetchError",
    "Producer",
    "ProducerTopic",
    "TopicStats",
    "ChannelStats",
    "ClientStats",
    "E2eAggregate",
    "Upstream",
    "ClusterInfo",
    "join_host_port",
    "merge_lookupd_nodes",
    "merge_topic_producers",
    "producer_from_nsqd",
    "aggregate_stats",
    "counter_stats",
    "topic_totals",
    "union_sorted",
    "warning_message",
]

log = Logger(namespace="nsqtw.admin")

T = TypeVar("T")



class UpstreamError(Exception):
    """No upstream answered; the text follows ``UPSTREAM_ERROR: ``."""


class FetchError(Exception):
    """One upstream call failed; the text says which and why."""


class NotYet(FetchError):
    """A node already known not to answer did not answer within :data:`KNOWN_DOWN_WAIT` either:
    the page goes on without it while its request runs on (its answer, when it comes, updates
    the :class:`NodeBook` for the next look)."""


#: how long a page waits for an nsqd that did not answer last time (its request runs on, up to the
#: request timeout, in the background): a page answers from what is known, not after the timeout
KNOWN_DOWN_WAIT = 0.25


def _within(d: defer.Deferred[Any], seconds: float, clock: Any, late: Callable[[], Exception]
            ) -> defer.Deferred[Any]:
    """``d``'s result if it comes within ``seconds`` on ``clock``, else the error ``late()``;
    ``d`` itself runs on either way (its result, when later, is dropped here)."""
    out: defer.Deferred[Any] = defer.Deferred()

    def expire() -> None:
        if not out.called:
            out.errback(Failure(late()))

    timer = clock.callLater(seconds, expire)

    def settle(result: Any) -> None:
        if timer.active():
            timer.cancel()
        if not out.called:
            if isinstance(result, Failure):
                out.errback(result)
            else:
                out.callback(result)

    d.addBoth(settle)
    return out


def warning_message(messages: Sequence[str]) -> str:
    """nsqadmin's ``maybeWarnMsg``."""
    return "WARNING: " + "; ".join(messages) if messages else ""


def join_host_port(host: str, port: int) -> str:
    """Go's ``net.JoinHostPort``."""
    if ":" in host:
        return f"[{host}]:{port}"
    return f"{host}:{port}"


def union_sorted(items: Iterable[str]) -> list[str]:
    return sorted(set(items))


_SEMVER = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?$")


def semver_key(version: str) -> tuple[Any, ...]:
    """A sort key for a semantic version; anything unparsable is ``0.0.0`` (as nsqadmin does)."""
    m = _SEMVER.match(version or "")
    if m is None:
        return (0, 0, 0, 1, ())
    pre = m.group(4)
    if not pre:
        return (int(m.group(1)), int(m.group(2)), int(m.group(3)), 1, ())
    parts = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre.split("."))
    return (int(m.group(1)), int(m.group(2)), int(m.group(3)), 0, parts)


# --- producers -------------------------------------------------------------------


@attr.s(slots=True, frozen=True)
class ProducerTopic:
    topic: str = attr.ib()
    tombstoned: bool = attr.ib(default=False)

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "tombstoned": self.tombstoned}


@attr.s(slots=True, eq=False)
class Producer:
    """One nsqd as nsqlookupd (or the nsqd itself) describes it."""

    remote_addresses: list[str] | None = attr.ib(default=None)
    remote_address: str = attr.ib(default="")
    hostname: str = attr.ib(default="")
    broadcast_address: str = attr.ib(default="")
    tcp_port: int = attr.ib(default=0)
    http_port: int = attr.ib(default=0)
    version: str = attr.ib(default="")
    topics: list[ProducerTopic] | None = attr.ib(default=None)
    out_of_date: bool = attr.ib(default=False)
    #: where nsqadmin reaches it (``scheme://host:port``); the configured address in
    #: --nsqd-http-address mode, the broadcast address otherwise
    fetch_base: str = attr.ib(default="")

    @classmethod
    def from_lookupd(cls, doc: dict[str, Any]) -> Producer:
        """A producer from ``/nodes`` (with topics and tombstones) or ``/lookup``."""
        topics_raw = doc.get("topics")
        topics: list[ProducerTopic] | None = None
        if topics_raw is not None:
            tombstones = doc.get("tombstones") or []
            topics = [ProducerTopic(str(t), bool(tombstones[i]) if i < len(tombstones) else False)
                      for i, t in enumerate(topics_raw)]
        return cls(
            remote_address=str(doc.get("remote_address") or ""),
            hostname=str(doc.get("hostname") or ""),
            broadcast_address=str(doc.get("broadcast_address") or ""),
            tcp_port=int(doc.get("tcp_port") or 0),
            http_port=int(doc.get("http_port") or 0),
            version=str(doc.get("version") or ""),
            topics=topics,
        )

    @property
    def http_address(self) -> str:
        return join_host_port(self.broadcast_address, self.http_port)

    @property
    def tcp_address(self) -> str:
        return join_host_port(self.broadcast_address, self.tcp_port)

    @property
    def base_url(self) -> str:
        return self.fetch_base or f"http://{self.http_address}"

    def to_json(self) -> dict[str, Any]:
        return {
            "remote_addresses": self.remote_addresses,
            "remote_address": self.remote_address,
            "hostname": self.hostname,
            "broadcast_address": self.broadcast_address,
            "tcp_port": self.tcp_port,
            "http_port": self.http_port,
            "version": self.version,
            "topics": None if self.topics is None else [t.to_json() for t in self.topics],
            "out_of_date": self.out_of_date,
        }


def merge_lookupd_nodes(answers: Sequence[tuple[str, dict[str, Any]]]) -> list[Producer]:
    """``GetLookupdProducers``: union every lookupd's ``/nodes`` by TCP address.

    ``remote_addresses`` lists ``<lookupd>/<remote address>`` for each lookupd
    that knows the node; nodes older than the newest version are ``out_of_date``.
    """
    by_addr: dict[str, Producer] = {}
    order: list[Producer] = []
    for lookupd, doc in answers:
        for raw in doc.get("producers") or []:
            producer = Producer.from_lookupd(raw)
            known = by_addr.get(producer.tcp_address)
            if known is None:
                if producer.topics is not None:
                    producer.topics.sort(key=lambda t: t.topic)
                producer.remote_addresses = []
                by_addr[producer.tcp_address] = producer
                order.append(producer)
                known = producer
            assert known.remote_addresses is not None
            known.remote_addresses.append(f"{lookupd}/{producer.remote_address or 'N/A'}")
    if order:
        newest = max(semver_key(p.version) for p in order)
        for p in order:
            p.out_of_date = semver_key(p.version) < newest
    order.sort(key=lambda p: (p.hostname, p.http_address))
    return order


def merge_topic_producers(answers: Sequence[dict[str, Any]]) -> list[Producer]:
    """``GetLookupdTopicProducers``: the union of every lookupd's ``/lookup`` by HTTP address."""
    out: list[Producer] = []
    seen = set()
    for doc in answers:
        for raw in doc.get("producers") or []:
            producer = Producer.from_lookupd(raw)
            if producer.http_address in seen:
                continue
            seen.add(producer.http_address)
            out.append(producer)
    return out


def producer_from_nsqd(address: str, info: dict[str, Any], stats: dict[str, Any],
                       scheme: str = "http") -> Producer:
    """A producer from one nsqd's ``/info`` and ``/stats`` (``--nsqd-http-address`` mode)."""
    broadcast = str(info.get("broadcast_address") or "")
    http_port = int(info.get("http_port") or 0)
    hostname = str(info.get("hostname") or "")
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if not broadcast:
        # very old nsqd: fall back to the address nsqadmin was given
        broadcast = host
        http_port = int(port) if port.isdigit() else 0
    if not hostname:
        hostname = host
    topics = [ProducerTopic(str(t.get("topic_name", ""))) for t in stats.get("topics") or []]
    return Producer(
        hostname=hostname,
        broadcast_address=broadcast,
        tcp_port=int(info.get("tcp_port") or 0),
        http_port=http_port,
        version=str(info.get("version") or ""),
        topics=topics or None,
        fetch_base=f"{scheme}://{address}",
    )


def mark_out_of_date(producers: Sequence[Producer]) -> None:
    if producers:
        newest = max(semver_key(p.version) for p in producers)
        for p in producers:
            p.out_of_date = semver_key(p.version) < newest


# --- stats -------------------------------------------------------------------------


@attr.s(slots=True, eq=False)
class E2eAggregate:
    """``E2eProcessingLatencyAggregate``: percentiles merged across nodes by weighted average."""

    count: int = attr.ib(default=0)
    percentiles: list[dict[str, float]] | None = attr.ib(default=None)
    topic: str = attr.ib(default="")
    channel: str = attr.ib(default="")
    host: str = attr.ib(default="")

    @classmethod
    def from_nsqd(cls, doc: dict[str, Any] | None) -> E2eAggregate | None:
        if doc is None:
            return None
        count = int(doc.get("count") or 0)
        raw = doc.get("percentiles")
        percentiles = None
        if raw is not None:
            percentiles = []
            for p in raw:
                value = float(p.get("value", 0))
                percentiles.append({
                    "quantile": float(p.get("quantile", 0)),
                    "value": value, "min": value, "max": value, "average": value, "count": float(count),
                })
        return cls(count=count, percentiles=percentiles, topic=str(doc.get("topic") or ""),
                   channel=str(doc.get("channel") or ""), host=str(doc.get("host") or ""))

    def add(self, other: E2eAggregate | None) -> None:
        """Merge a node's percentiles in (a missing quantile is appended)."""
        self.host = "*"
        if other is None:
            return
        self.count += other.count
        for value in other.percentiles or []:
            mine = None
            for p in self.percentiles or []:
                if p.get("quantile") == value.get("quantile"):
                    mine = p
                    break
            if mine is None:
                mine = {"quantile": value["quantile"], "max": value.get("max", 0.0),
                        "min": value.get("min", 0.0), "count": 0.0, "average": 0.0}
                if self.percentiles is None:
                    self.percentiles = []
                self.percentiles.append(mine)
            else:
                mine["max"] = max(value.get("max", 0.0), mine.get("max", 0.0))
                mine["min"] = min(value.get("min", 0.0), mine.get("min", 0.0))
            mine["count"] = mine.get("count", 0.0) + value.get("count", 0.0)
            if mine["count"] == 0:
                mine["average"] = 0.0
                continue
            delta = value.get("average", 0.0) - mine.get("average", 0.0)
            mine["average"] = mine.get("average", 0.0) + delta * value.get("count", 0.0) / mine["count"]

    def to_json(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "percentiles": (None if self.percentiles is None
                            else [dict(sorted(p.items())) for p in self.percentiles]),
            "topic": self.topic,
            "channel": self.channel,
            "host": self.host,
        }


@attr.s(slots=True, eq=False)
class ClientStats:
    """One consumer connection as nsqadmin shows it (``connected`` is derived from ``connect_ts``)."""

    node: str = attr.ib(default="")
    remote_address: str = attr.ib(default="")
    version: str = attr.ib(default="")
    client_id: str = attr.ib(default="")
    hostname: str = attr.ib(default="")
    user_agent: str = attr.ib(default="")
    connect_ts: int = attr.ib(default=0)
    connected: int = attr.ib(default=0)
    in_flight_count: int = attr.ib(default=0)
    ready_count: int = attr.ib(default=0)
    finish_count: int = attr.ib(default=0)
    requeue_count: int = attr.ib(default=0)
    message_count: int = attr.ib(default=0)
    sample_rate: int = attr.ib(default=0)
    deflate: bool = attr.ib(default=False)
    snappy: bool = attr.ib(default=False)
    authed: bool = attr.ib(default=False)
    auth_identity: str = attr.ib(default="")
    auth_identity_url: str = attr.ib(default="")
    tls: bool = attr.ib(default=False)
    tls_cipher_suite: str = attr.ib(default="")
    tls_version: str = attr.ib(default="")
    tls_negotiated_protocol: str = attr.ib(default="")
    tls_negotiated_protocol_is_mutual: bool = attr.ib(default=False)
    #: nsqtw addition: the connection state (nsqd's ``state``; 3 is subscribed)
    state: int | None = attr.ib(default=None)

    @classmethod
    def from_nsqd(cls, doc: dict[str, Any], node: str, now: float) -> ClientStats:
        connect_ts = int(doc.get("connect_ts") or 0)
        return cls(
            node=node,
            remote_address=str(doc.get("remote_address") or ""),
            version=str(doc.get("version") or ""),
            client_id=str(doc.get("client_id") or ""),
            hostname=str(doc.get("hostname") or ""),
            user_agent=str(doc.get("user_agent") or ""),
            connect_ts=connect_ts,
            connected=max(0, int(now) - connect_ts) * 1_000_000_000,
            in_flight_count=int(doc.get("in_flight_count") or 0),
            ready_count=int(doc.get("ready_count") or 0),
            finish_count=int(doc.get("finish_count") or 0),
            requeue_count=int(doc.get("requeue_count") or 0),
            message_count=int(doc.get("message_count") or 0),
            sample_rate=int(doc.get("sample_rate") or 0),
            deflate=bool(doc.get("deflate")),
            snappy=bool(doc.get("snappy")),
            authed=bool(doc.get("authed")),
            auth_identity=str(doc.get("auth_identity") or ""),
            auth_identity_url=str(doc.get("auth_identity_url") or ""),
            tls=bool(doc.get("tls")),
            tls_cipher_suite=str(doc.get("tls_cipher_suite") or ""),
            tls_version=str(doc.get("tls_version") or ""),
            tls_negotiated_protocol=str(doc.get("tls_negotiated_protocol") or ""),
            tls_negotiated_protocol_is_mutual=bool(doc.get("tls_negotiated_protocol_is_mutual")),
            state=doc.get("state") if isinstance(doc.get("state"), int) else None,
        )

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in attr.fields(ClientStats) if f.name != "state"}
        if self.state is not None:
            out["state"] = self.state
        return out


def _int(doc: dict[str, Any], key: str) -> int:
    value = doc.get(key)
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


@attr.s(slots=True, eq=False)
class ChannelStats(ChannelCounts):
    """One channel on one node, or (``node == "*"``) summed over nodes with ``nodes`` set; its
    counters (``depth`` ... ``client_count``) and their sum are :class:`ChannelCounts`', the
    same as ``nsq_stat``'s."""

    node: str = attr.ib(default="", kw_only=True)
    hostname: str = attr.ib(default="", kw_only=True)
    topic_name: str = attr.ib(default="", kw_only=True)
    channel_name: str = attr.ib(default="", kw_only=True)
    nodes: list[ChannelStats] | None = attr.ib(default=None, kw_only=True)
    clients: list[ClientStats] | None = attr.ib(default=None, kw_only=True)
    paused: bool = attr.ib(default=False, kw_only=True)
    e2e_processing_latency: E2eAggregate | None = attr.ib(default=None, kw_only=True)
    #: when its oldest queued message was published (unix seconds; nsqtw's nsqd says so in /stats while
    #: something is queued, Go's does not); summed channels keep the oldest of their nodes
    oldest_message_ts: int | None = attr.ib(default=None, kw_only=True)
    #: nsqtw's channel policy (``/stats?include_policies=true``; Go's nsqd has none): whether the node(s)
    #: reported one, the policy (None: no setting on; summed channels: the one every node has, None when
    #: they differ, see ``policies_differ``) and what it did (dead letters kept, expired, dropped)
    policy_known: bool = attr.ib(default=False, kw_only=True)
    policy: dict[str, Any] | None = attr.ib(default=None, kw_only=True)
    policies_differ: bool = attr.ib(default=False, kw_only=True)
    dead_count: int = attr.ib(default=0, kw_only=True)
    expired_count: int = attr.ib(default=0, kw_only=True)
    dropped_count: int = attr.ib(default=0, kw_only=True)

    @classmethod
    def from_nsqd_channel(cls, doc: dict[str, Any], topic: str, node: str, hostname: str,
                          now: float) -> ChannelStats:
        clients_raw = doc.get("clients")
        clients = None
        if clients_raw is not None:
            clients = [ClientStats.from_nsqd(c, node, now) for c in clients_raw]
        counts = ChannelCounts.from_nsqd(doc)
        return cls(
            **attr.asdict(counts),
            node=node, hostname=hostname, topic_name=topic,
            channel_name=str(doc.get("channel_name") or ""),
            clients=clients,
            paused=bool(doc.get("paused")),
            e2e_processing_latency=E2eAggregate.from_nsqd(doc.get("e2e_processing_latency")),
            oldest_message_ts=(int(doc["oldest_message_ts"]) if isinstance(doc.get("oldest_message_ts"), int)
                               and not isinstance(doc.get("oldest_message_ts"), bool) else None),
            policy_known="policy" in doc,
            policy=doc["policy"] if isinstance(doc.get("policy"), dict) else None,
            dead_count=_int(doc, "dead_count"),
            expired_count=_int(doc, "expired_count"),
            dropped_count=_int(doc, "dropped_count"),
        )

    def add(self, a: ChannelCounts) -> None:
        """``ChannelStats.Add``: sum a node's channel in; keep it under ``nodes``."""
        ChannelCounts.add(self, a)
        if not isinstance(a, ChannelStats):
            return
        self.node = "*"
        if a.paused:
            self.paused = True
        if a.oldest_message_ts is not None and (self.oldest_message_ts is None
                                                or a.oldest_message_ts < self.oldest_message_ts):
            self.oldest_message_ts = a.oldest_message_ts
        if a.policy_known:
            if not self.policy_known:
                self.policy = a.policy
            elif a.policy != self.policy or a.policies_differ:
                self.policies_differ = True
            if self.policies_differ:
                self.policy = None
            self.policy_known = True
            self.dead_count += a.dead_count
            self.expired_count += a.expired_count
            self.dropped_count += a.dropped_count
        if self.nodes is None:
            self.nodes = []
        self.nodes.append(a)
        self.nodes.sort(key=lambda s: (s.hostname, s.node))
        if self.e2e_processing_latency is None:
            self.e2e_processing_latency = E2eAggregate(host=self.node, topic=self.topic_name,
                                                       channel=self.channel_name)
        self.e2e_processing_latency.add(a.e2e_processing_latency)
        if a.clients:
            if self.clients is None:
                self.clients = []
            self.clients.extend(a.clients)
            self.clients.sort(key=lambda c: c.hostname)

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "hostname": self.hostname,
            "topic_name": self.topic_name,
            "channel_name": self.channel_name,
            "depth": self.depth,
            "memory_depth": self.memory_depth,
            "backend_depth": self.backend_depth,
            "in_flight_count": self.in_flight_count,
            "deferred_count": self.deferred_count,
            "requeue_count": self.requeue_count,
            "timeout_count": self.timeout_count,
            "message_count": self.message_count,
            "client_count": self.client_count,
            "nodes": None if self.nodes is None else [n.to_json() for n in self.nodes],
            "clients": None if self.clients is None else [c.to_json() for c in self.clients],
            "paused": self.paused,
            "e2e_processing_latency": (None if self.e2e_processing_latency is None
                                       else self.e2e_processing_latency.to_json()),
            **({} if self.oldest_message_ts is None else {"oldest_message_ts": self.oldest_message_ts}),
            **(self._policy_json() if self.policy_known else {}),
        }

    def _policy_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"policy": self.policy, "dead_count": self.dead_count,
                               "expired_count": self.expired_count, "dropped_count": self.dropped_count}
        if self.policies_differ:
            out["policies_differ"] = True
        return out


@attr.s(slots=True, eq=False)
class TopicStats:
    """One topic on one node, or (``node == "*"``) summed over nodes with ``nodes`` set."""

    node: str = attr.ib(default="")
    hostname: str = attr.ib(default="")
    topic_name: str = attr.ib(default="")
    depth: int = attr.ib(default=0)
    memory_depth: int = attr.ib(default=0)
    backend_depth: int = attr.ib(default=0)
    message_count: int = attr.ib(default=0)
    nodes: list[TopicStats] | None = attr.ib(default=None)
    channels: list[ChannelStats] | None = attr.ib(default=None)
    paused: bool = attr.ib(default=False)
    e2e_processing_latency: E2eAggregate | None = attr.ib(default=None)

    @classmethod
    def from_nsqd(cls, doc: dict[str, Any], node: str, hostname: str, now: float) -> TopicStats:
        name = str(doc.get("topic_name") or "")
        depth = _int(doc, "depth")
        backend = _int(doc, "backend_depth")
        channels_raw = doc.get("channels")
        channels = None
        if channels_raw is not None:
            channels = [ChannelStats.from_nsqd_channel(c, name, node, hostname, now) for c in channels_raw]
        return cls(
            node=node, hostname=hostname, topic_name=name,
            depth=depth, memory_depth=depth - backend, backend_depth=backend,
            message_count=_int(doc, "message_count"),
            channels=channels,
            paused=bool(doc.get("paused")),
            e2e_processing_latency=E2eAggregate.from_nsqd(doc.get("e2e_processing_latency")),
        )

    def add(self, a: TopicStats) -> None:
        """``TopicStats.Add``: sum a node's topic in, merging its channels by name."""
        self.node = "*"
        self.depth += a.depth
        self.memory_depth += a.memory_depth
        self.backend_depth += a.backend_depth
        self.message_count += a.message_count
        if a.paused:
            self.paused = True
        for ch in a.channels or []:
            mine = None
            for c in self.channels or []:
                if c.channel_name == ch.channel_name:
                    mine = c
                    break
            if mine is None:
                mine = ChannelStats(node=ch.node, hostname=ch.hostname, topic_name=ch.topic_name,
                                    channel_name=ch.channel_name)
                if self.channels is None:
                    self.channels = []
                self.channels.append(mine)
            mine.add(ch)
        if self.nodes is None:
            self.nodes = []
        self.nodes.append(a)
        self.nodes.sort(key=lambda s: (s.hostname, s.node))
        if self.e2e_processing_latency is None:
            self.e2e_processing_latency = E2eAggregate(host=self.node, topic=self.topic_name)
        self.e2e_processing_latency.add(a.e2e_processing_latency)

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "hostname": self.hostname,
            "topic_name": self.topic_name,
            "depth": self.depth,
            "memory_depth": self.memory_depth,
            "backend_depth": self.backend_depth,
            "message_count": self.message_count,
            "nodes": None if self.nodes is None else [n.to_json() for n in self.nodes],
            "channels": None if self.channels is None else [c.to_json() for c in self.channels],
            "paused": self.paused,
            "e2e_processing_latency": (None if self.e2e_processing_latency is None
                                       else self.e2e_processing_latency.to_json()),
        }


def aggregate_stats(answers: Sequence[tuple[Producer, dict[str, Any]]], topic: str = "",
                    channel: str = "", now: float = 0.0
                    ) -> tuple[list[TopicStats], dict[str, ChannelStats]]:
    """``GetNSQDStats``'s merge: per-node topic rows, and channels summed across nodes.

    The channel map is keyed by channel name when ``topic`` is given, else by
    ``topic:channel``.  ``channel`` narrows the channels when an nsqd did not.
    """
    topics: list[TopicStats] = []
    channels: dict[str, ChannelStats] = {}
    for producer, doc in answers:
        node = producer.http_address
        for raw in doc.get("topics") or []:
            ts = TopicStats.from_nsqd(raw, node, producer.hostname, now)
            if topic and ts.topic_name != topic:
                continue
            if channel and ts.channels is not None:
                ts.channels = [c for c in ts.channels if c.channel_name == channel]
            topics.append(ts)
            for cs in ts.channels or []:
                key = cs.channel_name if topic else f"{ts.topic_name}:{cs.channel_name}"
                agg = channels.get(key)
                if agg is None:
                    agg = ChannelStats(node=node, topic_name=ts.topic_name, channel_name=cs.channel_name)
                    channels[key] = agg
                agg.add(cs)
    topics.sort(key=lambda s: (s.hostname, s.node))
    return topics, channels


def topic_totals(topic: str, per_node: Sequence[TopicStats]) -> TopicStats:
    """All nodes' rows of one topic summed (what ``/api/topics/:topic`` answers)."""
    total = TopicStats(topic_name=topic)
    for ts in per_node:
        total.add(ts)
    return total


def counter_stats(channels: dict[str, ChannelStats]) -> dict[str, dict[str, Any]]:
    """``/api/counter``'s ``stats``: message counts per ``topic:channel:node``."""
    out: dict[str, dict[str, Any]] = {}
    for cs in channels.values():
        for node_cs in cs.nodes or []:
            key = f"{cs.topic_name}:{cs.channel_name}:{node_cs.node}"
            entry = out.get(key)
            if entry is None:
                entry = out[key] = {"node": node_cs.node, "topic_name": cs.topic_name,
                                    "channel_name": cs.channel_name, "message_count": 0}
            entry["message_count"] += node_cs.message_count
    return out


# --- fetching ------------------------------------------------------------------------


def _url(base: str, path: str, **params: str) -> str:
    query = "&".join(f"{k}={quote(v, safe='')}" for k, v in params.items())
    return f"{base}/{path}" + (f"?{query}" if query else "")


def upstream_base(address: str) -> str:
    """A configured upstream (``host:port`` or a URL) as ``scheme://host:port``."""
    low = address.lower()
    if low.startswith(("http://", "https://")):
        return address.rstrip("/")
    return f"http://{address}"


class Upstream:
    """One HTTP call to nsqd or nsqlookupd the way nsqadmin's ``http_api.Client`` makes it: the
    shared :class:`nsqtw.runtime.upstream.Upstream` (NSQ's Accept header, the whole call within
    ``request_timeout`` seconds on ``clock``) with nsqadmin's error texts.

    ``client`` is a treq ``HTTPClient`` (its agent carries the connect timeout and TLS policy).
    A 403 from a plain-HTTP nsqd that requires TLS is retried on the ``https_port`` it names.
    """

    def __init__(self, client: Any, clock: Any, request_timeout: float, user_agent: str) -> None:
        self.client = client
        self.clock = clock
        self.request_timeout = request_timeout
        self.user_agent = user_agent
        self._shared = SharedUpstream(clock, request_timeout, http_client=client, user_agent=user_agent)
        #: GETs under way: url -> the callers waiting for its body (see :meth:`get_json`)
        self._pending: dict[str, tuple[list[defer.Deferred[bytes]], defer.Deferred[bytes]]] = {}

    async def _call(self, method: str, url: str, body: bytes | None,
                    headers: dict[bytes, bytes] | None) -> tuple[int, str, bytes]:
        try:
            response = await self._shared.request(method, url, body=body, headers=headers)
        except defer.TimeoutError:
            raise FetchError(f'{method} "{url}": no answer within {self.request_timeout:g}s') from None
        except defer.CancelledError:
            raise  # the browser that asked went away: nobody waits for this answer
        except Exception as e:  # connection refused, DNS, TLS, ...
            raise FetchError(f'{method} "{url}": {_describe(e)}') from None
        return response.code, response.phrase.decode("latin-1"), response.body

    async def request(self, method: str, url: str, body: bytes | None = None,
                      headers: dict[bytes, bytes] | None = None) -> bytes:
        """The body of a 200 answer; anything else raises :class:`FetchError`."""
        code, phrase, content = await self._call(method, url, body, headers)
        if code == 403:
            https = https_retry_url(url, content)
            if https is not None:
                code, phrase, content = await self._call(method, https, body, headers)
                url = https
        if code != 200:
            raise FetchError(f'{method} "{url}": got response {code} {phrase} '
                             f'{json.dumps(content.decode("utf-8", "replace"))}')
        return content

    def _shared_get(self, url: str) -> defer.Deferred[bytes]:
        """The body of ``GET url``, one request for every caller that asks while it is under way (open
        tabs and the history poller asking the same nsqd at once cost it one request).  A caller that
        is cancelled (its browser went away) only stops waiting; when the last one does, the request
        is cancelled."""
        entry = self._pending.get(url)

        def cancel(d: defer.Deferred[bytes]) -> None:
            current = self._pending.get(url)
            if current is None or d not in current[0]:
                return
            current[0].remove(d)
            if not current[0]:
                del self._pending[url]
                current[1].cancel()

        mine: defer.Deferred[bytes] = defer.Deferred(cancel)
        if entry is not None:
            entry[0].append(mine)
            return mine
        waiters = [mine]
        fetch = defer.Deferred.fromCoroutine(self.request("GET", url))
        if fetch.called:  # answered at once (a test's in-memory nsqd)
            fetch.chainDeferred(mine)
            return mine
        self._pending[url] = (waiters, fetch)

        def settle(result: Any) -> None:
            if self._pending.get(url, (None,))[0] is waiters:
                del self._pending[url]
            for w in list(waiters):
                if not w.called:
                    if isinstance(result, Failure):
                        w.errback(result)
                    else:
                        w.callback(result)
        fetch.addBoth(settle)
        return mine

    async def get_json(self, url: str) -> Any:
        content = await self._shared_get(url)
        try:
            return json.loads(content)
        except ValueError as e:
            raise FetchError(f'GET "{url}": invalid JSON - {e}') from None

    async def post(self, url: str) -> None:
        await self.request("POST", url)


def _clock_text(t: float) -> str:
    """A time of day (UTC) as the pages' error texts give it."""
    import time

    return time.strftime("%H:%M:%SZ", time.gmtime(t))


def _describe(e: BaseException) -> str:
    from twisted.web.client import RequestTransmissionFailed, ResponseNeverReceived
    if isinstance(e, (ResponseNeverReceived, RequestTransmissionFailed)):
        reasons = getattr(e, "reasons", None) or []
        return "; ".join(r.getErrorMessage() for r in reasons) or e.__class__.__name__
    text = str(e)
    return f"{e.__class__.__name__}: {text}" if text else e.__class__.__name__


async def _each(items: Sequence[T], call: Callable[[T], Awaitable[Any]]) -> tuple[list[tuple[T, Any]], list[str]]:
    """Run ``call`` for every item at once; (item, result) pairs in item order, and the error texts."""
    results, failed = await _each_failed(items, call)
    return results, [text for _, text in failed]


async def _each_failed(items: Sequence[T], call: Callable[[T], Awaitable[Any]]
                       ) -> tuple[list[tuple[T, Any]], list[tuple[T, str]]]:
    """Like :func:`_each`, with each failed item beside its error text."""
    ds: list[defer.Deferred[Any]] = [defer.ensureDeferred(cast(Any, call(item))) for item in items]
    outcomes = await defer.DeferredList(ds, consumeErrors=True)
    results: list[tuple[T, Any]] = []
    failed: list[tuple[T, str]] = []
    for item, (ok, value) in zip(items, outcomes, strict=True):
        if ok:
            results.append((item, value))
        else:
            exc = value.value
            if isinstance(exc, defer.CancelledError):
                raise exc
            failed.append((item, str(exc) if isinstance(exc, FetchError) else f"{item}: {_describe(exc)}"))
    return results, failed


def _total_failure(kind: str, count: int, errors: list[str]) -> None:
    if count and len(errors) == count:
        raise UpstreamError(f"failed to query any {kind}: " + "\n".join(errors))


class ClusterInfo:
    """nsqadmin's view of the cluster, asked fresh on every call (``clusterinfo.ClusterInfo``).

    ``addresses()`` returns the current ``(lookupd, nsqd)`` address lists, so a
    ``PUT /config/nsqlookupd_http_addresses`` takes effect on the next call.
    Methods return ``(value, errors)``; a total failure raises :class:`UpstreamError`.
    """

    def __init__(self, upstream: Upstream, addresses: Callable[[], tuple[list[str], list[str]]],
                 clock: Any, book: NodeBook | None = None) -> None:
        self.upstream = upstream
        self.addresses = addresses
        self.clock = clock
        #: every nsqd seen, and whether it answers (updated by every fetch)
        self.book = book if book is not None else NodeBook(clock)

    def _describe_all(self, producers: Iterable[Producer]) -> None:
        for p in producers:
            self.book.describe(p.http_address, p.hostname, p.tcp_port, p.version)

    # --- nsqlookupd ------------------------------------------------------------

    async def lookupd_topics(self, lookupds: list[str]) -> tuple[list[str], list[str]]:
        results, errors = await _each(lookupds, lambda a: self.upstream.get_json(_url(upstream_base(a), "topics")))
        _total_failure("nsqlookupd", len(lookupds), errors)
        return union_sorted(t for _, doc in results for t in (doc.get("topics") or [])), errors

    async def lookupd_topic_channels(self, topic: str, lookupds: list[str]) -> tuple[list[str], list[str]]:
        results, errors = await _each(
            lookupds, lambda a: self.upstream.get_json(_url(upstream_base(a), "channels", topic=topic)))
        _total_failure("nsqlookupd", len(lookupds), errors)
        return union_sorted(c for _, doc in results for c in (doc.get("channels") or [])), errors

    async def lookupd_producers(self, lookupds: list[str]) -> tuple[list[Producer], list[str]]:
        results, errors = await _each(lookupds, lambda a: self.upstream.get_json(_url(upstream_base(a), "nodes")))
        _total_failure("nsqlookupd", len(lookupds), errors)
        producers = merge_lookupd_nodes([(a, doc) for a, doc in results])
        self._describe_all(producers)
        if not errors:
            self.book.listed(p.http_address for p in producers)
        return producers, errors

    async def lookupd_topic_producers(self, topic: str, lookupds: list[str]) -> tuple[list[Producer], list[str]]:
        async def one(a: str) -> Any:
            try:
                return await self.upstream.get_json(_url(upstream_base(a), "lookup", topic=topic))
            except FetchError as e:
                # nsqlookupd answers 404 TOPIC_NOT_FOUND for a topic it does not know: no producers
                if " got response 404 " in str(e):
                    return {"producers": [], "not_found": True}
                raise

        results, errors = await _each(lookupds, one)
        _total_failure("nsqlookupd", len(lookupds), errors)
        producers = merge_topic_producers([doc for _, doc in results])
        self._describe_all(producers)
        return producers, errors

    async def topic_known(self, topic: str) -> bool:
        """Whether any nsqlookupd (or, without one, any nsqd nsqadmin knows) has ``topic``."""
        lookupds, _ = self.addresses()
        if lookupds:
            topics, _ = await self.lookupd_topics(lookupds)
            return topic in topics
        return any(topic in s.topics for s in self.book.nodes.values())

    # --- nsqd ----------------------------------------------------------------------

    async def nsqd_topics(self, nsqds: list[str]) -> tuple[list[str], list[str]]:
        results, errors = await _each(
            nsqds, lambda a: self.upstream.get_json(_url(upstream_base(a), "stats", format="json",
                                                         include_clients="false")))
        _total_failure("nsqd", len(nsqds), errors)
        names = [str(t.get("topic_name", "")) for _, doc in results for t in (doc.get("topics") or [])]
        return union_sorted(names), errors

    async def _nsqd_producer(self, address: str) -> Producer:
        base = upstream_base(address)
        info = await self.upstream.get_json(_url(base, "info"))
        stats = await self.upstream.get_json(_url(base, "stats", format="json", include_clients="false"))
        scheme, _, hostport = base.partition("://")
        producer = producer_from_nsqd(hostport, info, stats, scheme)
        self.book.alias(address, producer.http_address)
        self._describe_all([producer])
        self.book.answered(producer.http_address, stats, full=True)
        return producer

    def _ask(self, address: str, call: Awaitable[T], failed: Callable[[str], None], patient: bool
             ) -> defer.Deferred[T]:
        """Run ``call``, a fetch from the nsqd at ``address``; its failure is recorded (``failed``)
        when it comes.  Unless ``patient``, a node that did not answer last time is waited for
        :data:`KNOWN_DOWN_WAIT` at most (:class:`NotYet`): the fetch runs on, and what it finds
        updates the book when it ends."""
        async def recorded() -> T:
            try:
                return await call
            except FetchError as e:
                failed(str(e))
                raise

        d = defer.ensureDeferred(recorded())
        state = self.book.get(address)
        if patient or state is None or state.unreachable_since is None:
            return d
        since = state.unreachable_since
        return _within(d, KNOWN_DOWN_WAIT, self.clock, lambda: NotYet(
            f"{address}: not answering since {_clock_text(since)} (asked again, the page fills in when it answers)"))

    async def nsqd_producers(self, nsqds: list[str], patient: bool = False) -> tuple[list[Producer], list[str]]:
        results, failed = await _each_failed(nsqds, lambda a: self._ask(
            a, self._nsqd_producer(a), lambda text: self.book.failed(a, text), patient))
        errors = [text for _, text in failed]
        _total_failure("nsqd", len(nsqds), errors)
        producers = [p for _, p in results]
        mark_out_of_date(producers)
        return producers, errors

    async def nsqd_topic_producers(self, topic: str, nsqds: list[str]) -> tuple[list[Producer], list[str]]:
        async def one(address: str) -> Producer | None:
            base = upstream_base(address)
            stats = await self.upstream.get_json(
                _url(base, "stats", format="json", topic=topic, include_clients="false"))
            if not any(t.get("topic_name") == topic for t in stats.get("topics") or []):
                return None
            info = await self.upstream.get_json(_url(base, "info"))
            scheme, _, hostport = base.partition("://")
            producer = producer_from_nsqd(hostport, info, stats, scheme)
            self.book.alias(address, producer.http_address)
            self._describe_all([producer])
            self.book.answered(producer.http_address, stats)
            return producer

        def failed_one(address: str, text: str) -> None:
            known = self.book.get(address)
            # only a node that last reported this topic is a missing producer of it
            self.book.failed(address, text, topic if known is not None and topic in known.topics else "")

        results, failed = await _each_failed(nsqds, lambda a: self._ask(
            a, one(a), lambda text: failed_one(a, text), False))
        errors = [text for _, text in failed]
        _total_failure("nsqd", len(nsqds), errors)
        return [p for _, p in results if p is not None], errors

    async def nsqd_stats(self, producers: Sequence[Producer], topic: str = "", channel: str = "",
                         include_clients: bool = False
                         ) -> tuple[list[TopicStats], dict[str, ChannelStats], list[str]]:
        """Every producer's ``/stats`` merged (``GetNSQDStats``)."""
        topics, channels, errors, _ = await self.nsqd_stats_failed(producers, topic, channel, include_clients)
        return topics, channels, errors

    async def nsqd_stats_failed(self, producers: Sequence[Producer], topic: str = "", channel: str = "",
                                include_clients: bool = False, patient: bool = False
                                ) -> tuple[list[TopicStats], dict[str, ChannelStats], list[str], list[str]]:
        """:meth:`nsqd_stats`, plus the HTTP addresses of the producers that did not answer (a node
        that did not answer last time is waited for briefly unless ``patient``: see :meth:`_ask`).
        Each answer is booked when it arrives (its node's "last seen" is then, not when the
        slowest node answered)."""
        # include_oldest_message_ts: nsqtw's nsqd adds each channel's oldest queued message (the
        # Oldest column); Go's nsqd ignores the argument
        # include_policies: nsqtw's nsqd adds each channel's policy and its dead, expired and dropped
        # counts (the channel page's Policy section); Go's nsqd ignores it too
        params: dict[str, str] = {"format": "json", "include_oldest_message_ts": "true",
                                  "include_policies": "true"}
        if topic:
            params["topic"] = topic
            if channel:
                params["channel"] = channel
        if not include_clients:
            params["include_clients"] = "false"

        async def one(p: Producer) -> Any:
            doc = await self.upstream.get_json(_url(p.base_url, "stats", **params))
            self.book.answered(p.http_address, doc, full=not topic)
            return doc

        results, failed = await _each_failed(list(producers), lambda p: self._ask(
            p.http_address, one(p), lambda text: self.book.failed(p.http_address, text, topic), patient))
        errors = [text for _, text in failed]
        _total_failure("nsqd", len(producers), errors)
        topics, channels = aggregate_stats(results, topic, channel, self.clock.seconds())
        return topics, channels, errors, [p.http_address for p, _ in failed]

    # --- either mode ----------------------------------------------------------------

    async def topics(self) -> tuple[list[str], list[str]]:
        lookupds, nsqds = self.addresses()
        if lookupds:
            return await self.lookupd_topics(lookupds)
        return await self.nsqd_topics(nsqds)

    async def producers(self, patient: bool = False) -> tuple[list[Producer], list[str]]:
        lookupds, nsqds = self.addresses()
        if lookupds:
            return await self.lookupd_producers(lookupds)
        return await self.nsqd_producers(nsqds, patient)

    async def topic_producers(self, topic: str) -> tuple[list[Producer], list[str]]:
        lookupds, nsqds = self.addresses()
        if lookupds:
            return await self.lookupd_topic_producers(topic, lookupds)
        return await self.nsqd_topic_producers(topic, nsqds)

    async def inactive_topics(self, topics: list[str]) -> dict[str, list[str]]:
        """Topics lookupd knows with no producer, with their channels (``?inactive=true``)."""
        lookupds, _ = self.addresses()
        out: dict[str, list[str]] = {}
        if not lookupds:
            return out

        async def one(topic: str) -> list[str] | None:
            try:
                producers, _ = await self.lookupd_topic_producers(topic, lookupds)
            except UpstreamError:
                producers = []
            if producers:
                return None
            try:
                channels, _ = await self.lookupd_topic_channels(topic, lookupds)
            except UpstreamError:
                channels = []
            return channels

        results, _ = await _each(topics, one)
        for topic, channels in results:
            if channels is not None:
                out[topic] = channels
        return out

    # --- actions (fan-out) -----------------------------------------------------------

    async def _post_all(self, urls: list[str]) -> list[str]:
        _, errors = await _each(urls, self.upstream.post)
        return errors

    async def _lookupd_post(self, path: str, **params: str) -> list[str]:
        lookupds, _ = self.addresses()
        return await self._post_all([_url(upstream_base(a), path, **params) for a in lookupds])

    async def _producers_post(self, producers: Sequence[Producer], path: str, **params: str) -> list[str]:
        return await self._post_all([_url(p.base_url, path, **params) for p in producers])

    async def create_topic_channel(self, topic: str, channel: str) -> list[str]:
        """lookupd ``/topic/create`` (and ``/channel/create``) everywhere, then the channel on
        the topic's producers.  With ``--nsqd-http-address`` (no lookupd, where nsqadmin does
        nothing) nsqtw creates the topic and channel on every configured nsqd instead."""
        lookupds, nsqds = self.addresses()
        errors: list[str] = []
        if not lookupds:
            bases = [upstream_base(a) for a in nsqds]
            errors += await self._post_all([_url(b, "topic/create", topic=topic) for b in bases])
            if channel:
                errors += await self._post_all(
                    [_url(b, "channel/create", topic=topic, channel=channel) for b in bases])
            return errors
        errors += await self._lookupd_post("topic/create", topic=topic)
        if channel:
            errors += await self._lookupd_post("channel/create", topic=topic, channel=channel)
            producers, errs = await self.lookupd_topic_producers(topic, lookupds)
            errors += errs
            errors += await self._producers_post(producers, "channel/create", topic=topic, channel=channel)
        return errors

    async def delete_topic(self, topic: str) -> list[str]:
        """Producers first, then lookupd ``/topic/delete`` everywhere, then nsqd ``/topic/delete``."""
        producers, errors = await self.topic_producers(topic)
        errors = list(errors)
        errors += await self._lookupd_post("topic/delete", topic=topic)
        errors += await self._producers_post(producers, "topic/delete", topic=topic)
        return errors

    async def delete_channel(self, topic: str, channel: str) -> list[str]:
        producers, errors = await self.topic_producers(topic)
        errors = list(errors)
        errors += await self._lookupd_post("channel/delete", topic=topic, channel=channel)
        errors += await self._producers_post(producers, "channel/delete", topic=topic, channel=channel)
        return errors

    async def topic_action(self, topic: str, action: str) -> list[str]:
        """``pause``, ``unpause`` or ``empty`` on every producer of the topic."""
        producers, errors = await self.topic_producers(topic)
        return list(errors) + await self._producers_post(producers, f"topic/{action}", topic=topic)

    async def channel_action(self, topic: str, channel: str, action: str) -> list[str]:
        producers, errors = await self.topic_producers(topic)
        return list(errors) + await self._producers_post(
            producers, f"channel/{action}", topic=topic, channel=channel)

    # --- channel policies (nsqtw) --------------------------------------------------

    async def channel_holders(self, topic: str, channel: str) -> tuple[list[Producer], list[str]]:
        """The topic's producers that hold ``channel`` now (asked through their ``/stats``), and
        the error texts of those that did not answer."""
        producers, errors = await self.topic_producers(topic)
        if not producers:
            return [], list(errors)
        _, channels, errs, _ = await self.nsqd_stats_failed(producers, topic, channel, False, patient=True)
        found = channels.get(channel)
        holding = {n.node for n in (found.nodes or [])} if found is not None else set()
        return [p for p in producers if p.http_address in holding], list(errors) + list(errs)

    async def channel_post(self, producers: Sequence[Producer], path: str, **params: str
                           ) -> list[tuple[str, int, dict[str, Any], str]]:
        """``POST /<path>?params`` on each producer: (node, status, JSON answer, error text); status 0
        with the error text when a node did not answer (an answer that is not 200 is returned, not raised:
        the caller tells a refused value from a node that failed)."""
        async def one(p: Producer) -> tuple[str, int, dict[str, Any], str]:
            url = _url(p.base_url, path, **params)
            try:
                code, phrase, content = await self.upstream._call("POST", url, None, None)
            except FetchError as e:
                return p.http_address, 0, {}, str(e)
            try:
                doc = json.loads(content) if content else {}
            except ValueError:
                doc = {}
            if not isinstance(doc, dict):
                doc = {}
            if isinstance(doc.get("data"), dict) and "status_code" in doc:
                doc = doc["data"]  # an answer in NSQ's old envelope
            error = "" if code == 200 else (f'POST "{url}": got response {code} {phrase} '
                                            f'{json.dumps(doc.get("message") or content.decode("utf-8", "replace"))}')
            return p.http_address, code, doc, error

        return list(await defer.gatherResults([defer.ensureDeferred(one(p)) for p in producers]))

    async def tombstone_node_for_topic(self, topic: str, node: str) -> list[str]:
        """lookupd ``/topic/tombstone`` everywhere, then ``/topic/delete`` on that node."""
        errors = await self._lookupd_post("topic/tombstone", topic=topic, node=node)
        producers, errs = await self.nsqd_producers([node])
        errors += errs
        errors += await self._producers_post(producers, "topic/delete", topic=topic)
        return errors

    # --- peek (nsqtw) -----------------------------------------------------------

    async def peek(self, topic: str, channel: str | None, n: int, state: str = "all") -> dict[str, Any]:
        """What every nsqd producing ``topic`` has queued, in flight and deferred for ``channel``
        (or in the topic's own queue when ``channel`` is None), node by node: each node's part is in
        the order that node delivers (nsqd's own order, never re-sorted across nodes), at most ``n``
        messages per state (``all`` asks each state, so a backlog never hides the in-flight and deferred
        ones), with its depth and counts; a node that could not be peeked says why (peek off, a Go
        nsqd without peek, not answering, or gone from nsqlookupd though it held the topic).
        ``messages`` is every node's part, one after the other."""
        producers, errors = await self.topic_producers(topic)
        path = "channel/peek" if channel is not None else "topic/peek"
        states = [state] if channel is None or state != "all" else ["queued", "in_flight", "deferred", "dead"]

        async def ask(p: Producer, st: str) -> tuple[int, dict[str, Any], str]:
            params = {"topic": topic, "n": str(n)}
            if channel is not None:
                params.update(channel=channel, state=st)
            url = _url(p.base_url, path, **params)
            try:
                code, _, content = await self.upstream._call("GET", url, None, None)
            except FetchError as e:
                return 0, {}, str(e)
            try:
                doc = json.loads(content) if content else {}
            except ValueError:
                doc = {}
            return code, doc if isinstance(doc, dict) else {}, ""

        async def one(p: Producer) -> dict[str, Any]:
            node: dict[str, Any] = {"node": p.http_address, "ok": False, "messages": [], "truncated": False}
            for st in states:
                code, doc, error = await ask(p, st)
                if st == "dead" and state == "all" and code == 400:
                    continue  # an nsqd without dead letters (nsqtw's own before channel policies)
                if code == 200:
                    node["ok"] = True
                    node["messages"].extend(dict(m, node=p.http_address) for m in doc.get("messages") or [])
                    node["truncated"] = node["truncated"] or bool(doc.get("truncated"))
                    node.update(depth=doc.get("depth"), in_flight_count=doc.get("in_flight_count"),
                                deferred_count=doc.get("deferred_count"))
                    if "dead_count" in doc:
                        node["dead_count"] = doc["dead_count"]
                    continue
                node["ok"] = False
                node["messages"] = []
                if error:
                    node["error"] = error
                elif code == 403 and doc.get("message") == "PEEK_DISABLED":
                    node["error"] = "peek is off on this nsqd (start it with --peek-enabled)"
                elif code in (404, 405) and doc.get("message") not in ("TOPIC_NOT_FOUND", "CHANNEL_NOT_FOUND"):
                    # the route itself is missing: an nsqd without peek (Go's answers 404 NOT_FOUND)
                    node["error"] = "peek is not available on this nsqd (Go's nsqd has no peek)"
                elif code == 404:
                    node["error"] = f"not on this node ({doc.get('message')})"
                else:
                    node["error"] = f"got response {code} {doc.get('message', '')}".strip()
                break
            return node

        nodes = list(await defer.gatherResults([defer.ensureDeferred(one(p)) for p in producers]))
        # nodes that held it and are no longer asked (gone from nsqlookupd, not answering): said, not left out
        asked = [p.http_address for p in producers]
        missing = (self.book.failing(topic, present=asked) if channel is None
                   else self.book.failing_channel(topic, channel, present=asked))
        for state_ in missing:
            why = "gone from nsqlookupd" if state_.gone_since is not None else "not answering"
            seen = f", last seen {_clock_text(state_.last_seen)}" if state_.last_seen is not None else ""
            nodes.append({"node": state_.address, "ok": False, "messages": [], "truncated": False,
                          "status": state_.status, "error": f"{why} since {_clock_text(state_.since or 0.0)}{seen}: "
                                                            "its messages (if it still holds any) cannot be peeked"})
        messages = [m for a in nodes for m in a["messages"]]
        return {"topic": topic, "channel": channel, "state": state, "n": n, "nodes": nodes, "messages": messages,
                "truncated": any(a["truncated"] for a in nodes), "message": warning_message(errors)}
