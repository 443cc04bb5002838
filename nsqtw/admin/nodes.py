"""
Every nsqd nsqadmin knows of, and whether it answers (issue 17: failures shown, never hidden).

A node enters the :class:`NodeBook` when nsqlookupd lists it, when it is
configured with ``--nsqd-http-address`` or when it answers; it stays there after
it stops answering ("unreachable since ...") or leaves nsqlookupd ("gone since
..."), with its last-seen time and what it last reported (topics, channels,
message counts), until ``retention`` seconds after it went away.  Pages use it
to keep a failed node's row, to say which totals are partial and to label the
last value they know as such.  Nothing here does I/O; the clock is injected.
"""

from __future__ import annotations

from typing import Any
from collections.abc import Iterable

import attr

__all__ = ["NodeState", "NodeBook", "OK", "UNREACHABLE", "GONE", "node_alerts"]

OK = "ok"
UNREACHABLE = "unreachable"
GONE = "gone"


@attr.s(slots=True, eq=False)
class NodeState:
    """What nsqadmin last knew of one nsqd (keyed by its HTTP address, as pages name nodes)."""

    address: str = attr.ib()
    hostname: str = attr.ib(default="")
    tcp_port: int = attr.ib(default=0)
    version: str = attr.ib(default="")
    #: when it last answered (None: never)
    last_seen: float | None = attr.ib(default=None)
    #: first failed answer since it last answered
    unreachable_since: float | None = attr.ib(default=None)
    #: when nsqlookupd stopped listing it
    gone_since: float | None = attr.ib(default=None)
    error: str = attr.ib(default="")
    start_time: int | None = attr.ib(default=None)
    #: topic -> its channels, from the last full /stats answer
    topics: dict[str, list[str]] = attr.ib(factory=dict)
    #: ``topic:channel`` -> message_count from the last full answer
    counts: dict[str, int] = attr.ib(factory=dict)
    depth: int | None = attr.ib(default=None)
    clients: int | None = attr.ib(default=None)
    #: the ``replication`` section of its last /stats (nsqtw with --replica-peer or
    #: --replication-address; None for any other nsqd)
    replication: dict[str, Any] | None = attr.ib(default=None)
    #: its /stats ``health`` ("OK", or "NOK - ..." while its disk refuses writes)
    health: str = attr.ib(default="OK")
    #: the ``drain`` section of its last /stats (nsqtw, only while it drains; None otherwise)
    drain: dict[str, Any] | None = attr.ib(default=None)

    @property
    def alerts(self) -> list[dict[str, str]]:
        """What an operator must see of it on every page (see :func:`node_alerts`)."""
        return node_alerts(self.replication, self.health, self.drain) if self.status == OK else []

    @property
    def status(self) -> str:
        if self.gone_since is not None:
            return GONE
        if self.unreachable_since is not None:
            return UNREACHABLE
        return OK

    @property
    def since(self) -> float | None:
        """When it stopped answering or left nsqlookupd (None while it answers)."""
        if self.gone_since is not None:
            return self.gone_since
        return self.unreachable_since

    def to_json(self, now: float | None = None) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "node": self.address,
            "hostname": self.hostname,
            "status": self.status,
            "since": self.since,
            "last_seen": self.last_seen,
            "error": self.error,
            "version": self.version,
            "start_time": self.start_time,
            "depth": self.depth,
            "clients": self.clients,
            "topics": sorted(self.topics),
            "channel_count": sum(len(chans) for chans in self.topics.values()),
        }
        if now is not None and self.start_time and self.status == OK:
            doc["uptime_seconds"] = max(0, int(now) - int(self.start_time))
        alerts = self.alerts
        if alerts:
            doc["alerts"] = alerts
        return doc


def node_alerts(rep: dict[str, Any] | None, health: str = "OK",
                drain: dict[str, Any] | None = None) -> list[dict[str, str]]:
    """``{"label", "kind", "title"}`` of each thing wrong with an answering node that its
    Reachability does not show: it refuses publishes (replication degraded under ``refuse``, a
    disk refusing writes, a drain), it cannot store its origins' batches, an adoption fails; and
    that it holds an adopted origin's backlog, or is (or keeps a peer) in a maintenance window."""
    out: list[dict[str, str]] = []
    if drain and drain.get("state", "serving") != "serving":
        state = drain["state"]
        peer = f"; handed {drain.get('handed_off', 0)} messages to {drain['peer']}" if drain.get("peer") else ""
        out.append({"label": "drained" if state == "drained" else "draining", "kind": "warn",
                    "title": f"publishes refused and topics unregistered from nsqlookupd ({state}): "
                             f"{drain.get('queued', 0)} messages queued, {drain.get('in_flight', 0)} in flight"
                             f"{peer}" + (f"; last hand-off failed: {drain['handoff_error']}"
                                          if drain.get("handoff_error") else "")})
    rep = rep or {}
    status = rep.get("status")
    if status == "degraded-refusing":
        why = "; ".join(f"{p.get('address')}: {p.get('reason')}" for p in rep.get("peers") or []
                        if p.get("sync_state") != "in_sync" and p.get("reason"))
        out.append({"label": "refusing publishes", "kind": "danger",
                    "title": f"{rep.get('peers_in_sync', 0)} of {len(rep.get('peers') or [])} replica peers in "
                             f"sync, --replication-min-acks={rep.get('min_acks')}" + (f" ({why})" if why else "")})
    elif status == "degraded-accepting":
        out.append({"label": "unreplicated", "kind": "warn",
                    "title": "too few replica peers in sync: publishes are accepted and stored on this node only"})
    if health and health != "OK":
        out.append({"label": "disk refusing writes", "kind": "danger", "title": health})
    if rep.get("store_error"):
        out.append({"label": "cannot store replicas", "kind": "danger", "title": str(rep["store_error"])})
    for f in (rep.get("adoption") or {}).get("failing") or []:
        out.append({"label": f"adopting node {f.get('origin_node_id')} failing", "kind": "danger",
                    "title": f"{f.get('error')} ({f.get('tries')} tries; retried until it succeeds)"})
    maintenance = rep.get("maintenance") or {}
    if maintenance.get("active"):
        out.append({"label": "maintenance", "kind": "info",
                    "title": f"its replica peers do not adopt it for {maintenance.get('remaining_seconds')}s "
                             "(a planned restart keeps its messages here)"})
    for w in rep.get("maintenance_windows") or []:
        out.append({"label": f"node {w.get('origin_node_id')} in maintenance", "kind": "info",
                    "title": f"not adopted here for {w.get('remaining_seconds')}s unless it is back sooner"})
    for ad in rep.get("adopted") or []:
        out.append({"label": f"adopted node {ad.get('origin_node_id')}", "kind": "info",
                    "title": f"{ad.get('messages', 0)} messages of node {ad.get('origin_node_id')} were "
                             "republished here when it was lost"})
    return out


def stats_summary(doc: dict[str, Any]) -> tuple[dict[str, list[str]], dict[str, int], int, int]:
    """(topic -> channels, ``topic:channel`` -> message count, total depth, clients) of one /stats answer.

    Depth counts every message waiting on the node (topic queues and channel
    queues); clients counts channel subscriptions."""
    topics: dict[str, list[str]] = {}
    counts: dict[str, int] = {}
    depth = 0
    clients = 0
    for t in doc.get("topics") or []:
        name = str(t.get("topic_name") or "")
        depth += int(t.get("depth") or 0)
        chans = []
        for c in t.get("channels") or []:
            cname = str(c.get("channel_name") or "")
            chans.append(cname)
            counts[f"{name}:{cname}"] = int(c.get("message_count") or 0)
            depth += int(c.get("depth") or 0)
            clients += int(c.get("client_count") or 0)
        topics[name] = sorted(chans)
    return topics, counts, depth, clients


class NodeBook:
    """The nodes nsqadmin knows of, updated by every fetch (``clock`` gives ``seconds()``)."""

    def __init__(self, clock: Any, retention: float = 3600.0) -> None:
        self.clock = clock
        self.retention = retention
        self.nodes: dict[str, NodeState] = {}
        #: a configured ``--nsqd-http-address`` -> the HTTP address the node calls itself
        self.aliases: dict[str, str] = {}

    def _now(self) -> float:
        return float(self.clock.seconds())

    def alerts(self) -> dict[str, list[dict[str, str]]]:
        """Each answering node's alerts (:func:`node_alerts`), by address; nodes without any left out."""
        return {address: found for address, state in sorted(self.nodes.items()) if (found := state.alerts)}

    def get(self, address: str) -> NodeState | None:
        return self.nodes.get(self.aliases.get(address, address))

    def _state(self, address: str) -> NodeState:
        key = self.aliases.get(address, address)
        state = self.nodes.get(key)
        if state is None:
            state = self.nodes[key] = NodeState(key)
        return state

    def alias(self, configured: str, address: str) -> None:
        """Remember that ``configured`` (an ``--nsqd-http-address``) is the node ``address``."""
        if configured == address:
            return
        self.aliases[configured] = address
        old = self.nodes.pop(configured, None)
        if old is not None and address not in self.nodes:
            old.address = address
            self.nodes[address] = old

    def describe(self, address: str, hostname: str = "", tcp_port: int = 0, version: str = "") -> NodeState:
        state = self._state(address)
        if hostname:
            state.hostname = hostname
        if tcp_port:
            state.tcp_port = tcp_port
        if version:
            state.version = version
        return state

    def answered(self, address: str, doc: dict[str, Any] | None = None, full: bool = False) -> None:
        """The node answered (``doc``: its /stats; ``full``: unfiltered, so its topic list is complete)."""
        state = self._state(address)
        state.last_seen = self._now()
        state.unreachable_since = None
        state.gone_since = None
        state.error = ""
        if doc is None:
            return
        if isinstance(doc.get("start_time"), int):
            state.start_time = doc["start_time"]
        if doc.get("version"):
            state.version = str(doc["version"])
        rep = doc.get("replication")
        state.replication = rep if isinstance(rep, dict) else None
        if isinstance(doc.get("health"), str):
            state.health = doc["health"]
        drain = doc.get("drain")
        state.drain = drain if isinstance(drain, dict) else None
        if full:
            state.topics, state.counts, state.depth, state.clients = stats_summary(doc)
            return
        topics, counts, _, _ = stats_summary(doc)
        for name, chans in topics.items():
            known = state.topics.setdefault(name, [])
            known.extend(c for c in chans if c not in known)
        state.counts.update(counts)

    def failed(self, address: str, error: str, topic: str = "") -> None:
        """The node did not answer; ``topic``: it was asked as a producer of that topic."""
        state = self._state(address)
        if state.unreachable_since is None:
            state.unreachable_since = self._now()
        state.error = error
        if topic and topic not in state.topics:
            state.topics[topic] = []

    def listed(self, addresses: Iterable[str]) -> None:
        """Every nsqlookupd answered /nodes with these: the others have left (gone since now)."""
        present = set(addresses)
        now = self._now()
        for address in present:
            state = self._state(address)
            state.gone_since = None
        for state in self.nodes.values():
            if state.address not in present and state.gone_since is None:
                state.gone_since = now
        self.forget()

    def forget(self) -> None:
        """Drop nodes gone (or unreachable and unlisted) longer than ``retention`` ago."""
        horizon = self._now() - self.retention
        for key in [k for k, s in self.nodes.items() if s.gone_since is not None and s.gone_since < horizon]:
            del self.nodes[key]

    def drop(self, address: str) -> NodeState | None:
        """Forget one node now (an operator removed it on purpose): no row, no partial totals for it.
        It comes back if nsqlookupd lists it again or it answers."""
        key = self.aliases.get(address, address)
        for alias in [a for a, to in self.aliases.items() if to == key]:
            del self.aliases[alias]
        return self.nodes.pop(key, None)

    def failing(self, topic: str | None = None, present: Iterable[str] = ()) -> list[NodeState]:
        """Nodes not answering (of ``topic`` when given: they last reported it), minus ``present``."""
        skip = set(present)
        out = [s for s in self.nodes.values()
               if s.status != OK and s.address not in skip and (topic is None or topic in s.topics)]
        out.sort(key=lambda s: (s.hostname, s.address))
        return out

    def failing_channel(self, topic: str, channel: str, present: Iterable[str] = ()) -> list[NodeState]:
        skip = set(present)
        out = [s for s in self.nodes.values()
               if s.status != OK and s.address not in skip and topic in s.topics
               and (channel in s.topics[topic] or not s.topics[topic])]
        out.sort(key=lambda s: (s.hostname, s.address))
        return out
