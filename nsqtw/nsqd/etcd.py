"""
etcd glue (``--etcd-endpoints``): where several nodes must agree.

Everything goes through etcd's v3 JSON gateway (``/v3/kv/range``, ``/v3/kv/put``,
``/v3/kv/txn``, ``/v3/lease/grant``, ``/v3/lease/keepalive``, ``/v3/lease/revoke``; keys and
values base64) with treq, over a connection pool of its own:

* :class:`EtcdGateway`: the calls, tried on each endpoint in turn;
* :class:`EtcdSession`: this node's lease (granted at start, kept alive every third of its
  TTL, revoked at a clean stop) and the node id it holds under it
  (``<prefix>/ids/<id>``, claimed with a transaction that succeeds only when no live node
  holds it); :meth:`EtcdSession.record_state` writes ``<prefix>/nodes/<id>/state``;
* :class:`EtcdArbiter`: the :class:`~nsqtw.nsqd.core.replication.AdoptionArbiter` that lets
  a peer adopt an origin's epoch only while it holds ``<prefix>/adopt/<origin>/<epoch>``
  under its lease (created with a transaction: one holder, even when the survivors cannot
  see each other), and drops its shadow once the holder wrote
  ``<prefix>/adopted/<origin>/<epoch>``;
* :class:`EtcdNodeService`: the nsqd of a node with ``--etcd-endpoints``: it claims the node
  id first (``--node-id=auto``: one no live node holds), then builds and starts the nsqd
  with it.

A node whose lease is lost (etcd said it expired, or was unreachable for the lease's TTL) no
longer claims its id: it says so in its log and in ``/ping`` (503), adopts nothing, and claims
the same id again under a new lease as soon as etcd answers and no other node took it.
"""

from __future__ import annotations

import base64
import json
import math
import os
from collections.abc import Callable
from typing import Any

import attrs
from twisted.application.service import MultiService, Service
from twisted.internet import defer, task
from twisted.logger import Logger
from twisted.python.failure import Failure

from ..options import AutoNodeId, NsqdOptions
from ..protocol import replication as wire
from .core.replication.adoption import ADOPT, FORGET, STAND_BY, WAIT

__all__ = ["EtcdError", "EtcdGateway", "EtcdSession", "EtcdArbiter", "EtcdNodeService", "KeyValue", "lease_ttl",
           "prefix_end", "NODE_FILE"]

log = Logger(namespace="nsqtw.nsqd")

#: the file in the data path that keeps this node's key (who it is to etcd) and its last id
NODE_FILE = "nsqtw-etcd-node.json"
#: how long a start waits for etcd (to claim the node id) before it fails
START_TIMEOUT = 30.0
#: seconds between tries while etcd does not answer, or an id is held by this node's last run
RETRY_INTERVAL = 1.0
#: seconds between asks of an arbiter standing by for another holder (who may die meanwhile)
ASK_INTERVAL = 1.0
#: node ids are [0, 1024) (NSQ's message IDs hold 10 bits of it)
MAX_NODE_ID = 1024


class EtcdError(Exception):
    """etcd refused a call, or no endpoint answered."""


def lease_ttl(replication_timeout: float) -> int:
    """The lease's TTL in seconds: ``--replication-timeout`` rounded up, at least 2 (etcd's
    own minimum): a node lost is let go of in etcd about when its peers' links drop it."""
    return max(2, math.ceil(replication_timeout))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def prefix_end(prefix: bytes) -> bytes:
    """The ``range_end`` that makes a range of every key starting with ``prefix``."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"


@attrs.frozen
class KeyValue:
    """One key as etcd returns it."""

    key: bytes
    value: bytes
    lease: int = 0
    create_revision: int = 0

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> KeyValue:
        return cls(base64.b64decode(doc.get("key", "")), base64.b64decode(doc.get("value", "")),
                   int(doc.get("lease", 0)), int(doc.get("create_revision", 0)))


class EtcdGateway:
    """etcd's v3 JSON gateway at ``urls`` (tried in turn from the last that answered), each
    call within ``timeout`` seconds; ``http_client`` is any treq-compatible client (a pool of
    its own when None, closed by :meth:`close`)."""

    def __init__(self, urls: list[str], reactor: Any, timeout: float, http_client: Any = None) -> None:
        if not urls:
            raise ValueError("no etcd endpoint")
        self.urls = list(urls)
        self.reactor = reactor
        self.timeout = timeout
        self._http = http_client
        self._pool: Any = None
        self._current = 0

    def _client(self) -> Any:
        if self._http is None:
            from treq.client import HTTPClient
            from twisted.web.client import Agent, HTTPConnectionPool

            self._pool = HTTPConnectionPool(self.reactor, persistent=True)
            self._pool.maxPersistentPerHost = 2
            self._http = HTTPClient(Agent(self.reactor, connectTimeout=self.timeout, pool=self._pool))
        return self._http

    def close(self) -> defer.Deferred[Any]:
        """Close the pool's connections (when it made its own)."""
        if self._pool is not None:
            return defer.maybeDeferred(self._pool.closeCachedConnections)
        return defer.succeed(None)

    def call(self, path: str, doc: dict[str, Any]) -> defer.Deferred[dict[str, Any]]:
        """POST ``doc`` to ``path`` (``/v3/kv/put``...); fires with etcd's answer, fails with
        :class:`EtcdError` (an error etcd answered, or no endpoint answered)."""
        return defer.ensureDeferred(self._call(path, doc))

    async def _call(self, path: str, doc: dict[str, Any]) -> dict[str, Any]:
        import treq

        body = json.dumps(doc).encode()
        errors = []
        n = len(self.urls)
        for i in range(n):
            at = (self._current + i) % n
            url = self.urls[at] + path
            try:
                d = self._client().post(url, data=body, headers={b"Content-Type": [b"application/json"]})
                d.addTimeout(self.timeout, self.reactor)
                response = await d
                c = treq.content(response)
                c.addTimeout(self.timeout, self.reactor)
                content = await c
            except Exception as e:  # unreachable, timed out: the next endpoint
                errors.append(f"{self.urls[at]}: {type(e).__name__}: {e}".rstrip(": "))
                continue
            self._current = at
            try:
                answer = json.loads(content)
            except ValueError:
                raise EtcdError(f"{url}: HTTP {response.code}, not JSON: {content[:200]!r}") from None
            if response.code != 200:
                raise EtcdError(f"{url}: {answer.get('message') or answer.get('error') or response.code}")
            if not isinstance(answer, dict):
                raise EtcdError(f"{url}: unexpected answer {content[:200]!r}")
            return answer
        raise EtcdError("no etcd endpoint answered (" + "; ".join(errors) + ")")

    # --- the calls ----------------------------------------------------------------

    async def grant(self, ttl: int) -> tuple[int, int]:
        """A new lease: ``(its id, its TTL)``."""
        doc = await self._call("/v3/lease/grant", {"TTL": ttl})
        if doc.get("error"):
            raise EtcdError(str(doc["error"]))
        return int(doc["ID"]), int(doc.get("TTL", ttl))

    async def keepalive(self, lease: int) -> int:
        """Renew ``lease``; its TTL now (0: it expired or was revoked)."""
        doc = await self._call("/v3/lease/keepalive", {"ID": str(lease)})
        return int(doc.get("result", {}).get("TTL", 0))

    async def revoke(self, lease: int) -> None:
        await self._call("/v3/lease/revoke", {"ID": str(lease)})

    async def put(self, key: bytes, value: bytes, lease: int = 0) -> None:
        doc: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            doc["lease"] = str(lease)
        await self._call("/v3/kv/put", doc)

    async def get(self, key: bytes) -> KeyValue | None:
        doc = await self._call("/v3/kv/range", {"key": _b64(key)})
        kvs = doc.get("kvs") or []
        return KeyValue.from_json(kvs[0]) if kvs else None

    async def get_prefix(self, prefix: bytes) -> list[KeyValue]:
        doc = await self._call("/v3/kv/range", {"key": _b64(prefix), "range_end": _b64(prefix_end(prefix))})
        return [KeyValue.from_json(kv) for kv in doc.get("kvs") or []]

    async def create(self, key: bytes, value: bytes, lease: int = 0,
                     absent: tuple[bytes, ...] = ()) -> tuple[bool, dict[bytes, KeyValue]]:
        """Put ``key`` only if neither it nor any key of ``absent`` exists (one transaction:
        ``create_revision == 0`` of each); ``(created, {key: what holds it})`` (the second
        empty when created)."""
        keys = (key, *absent)
        put: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            put["lease"] = str(lease)
        doc = await self._call("/v3/kv/txn", {
            "compare": [{"key": _b64(k), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}
                        for k in keys],
            "success": [{"request_put": put}],
            "failure": [{"request_range": {"key": _b64(k)}} for k in keys],
        })
        if doc.get("succeeded"):
            return True, {}
        held: dict[bytes, KeyValue] = {}
        for r in doc.get("responses") or []:
            for kv in (r.get("response_range") or {}).get("kvs") or []:
                item = KeyValue.from_json(kv)
                held[item.key] = item
        return False, held


# --- the node's lease and id ------------------------------------------------------------


def _read_node_file(data_path: str) -> tuple[str, int | None]:
    """This data path's node key (made and kept on first use) and the id it last held."""
    path = os.path.join(data_path, NODE_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        key = str(doc["node_key"])
        last = doc.get("node_id")
        return key, int(last) if isinstance(last, int) else None
    except (OSError, ValueError, KeyError, TypeError):
        return os.urandom(16).hex(), None


def _write_node_file(data_path: str, node_key: str, node_id: int) -> None:
    os.makedirs(data_path, exist_ok=True)
    path = os.path.join(data_path, NODE_FILE)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"node_key": node_key, "node_id": node_id}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class EtcdSession(Service):
    """This node in etcd: its lease, the node id held under it, its recorded states.

    :meth:`claim` (before the nsqd is built) grants the lease and takes the id; once started,
    the lease is kept alive every third of its TTL.  ``gateway`` is an :class:`EtcdGateway`
    (or a fake one in tests: the same coroutine methods)."""

    def __init__(self, options: NsqdOptions, reactor: Any, data_path: str, gateway: Any = None) -> None:
        self.setName("etcd")
        self.reactor = reactor
        self.data_path = data_path
        self.ttl = lease_ttl(options.replication_timeout)
        self.prefix = options.etcd_prefix.rstrip("/").encode()
        self.gateway = gateway if gateway is not None else EtcdGateway(
            options.etcd_urls, reactor, timeout=max(1.0, self.ttl / 2))
        self.node_key, self.last_id = _read_node_file(data_path)
        self.identity = {"node_key": self.node_key, "broadcast_address": options.broadcast_address,
                         "tcp_address": options.tcp_address}
        #: the lease (0: none) and when etcd last renewed it
        self.lease = 0
        self.renewed = 0.0
        #: the node id (None before the claim) and whether this node holds it in etcd now
        self.node_id: int | None = None
        self.holding = False
        #: why the id is not held (empty while it is)
        self.problem = ""
        #: ``kind -> value`` recorded at ``<prefix>/nodes/<id>/state``
        self.states: dict[str, Any] = {}
        self._loop: task.LoopingCall | None = None
        self._busy = False

    # --- keys ----------------------------------------------------------------------

    def key(self, *parts: object) -> bytes:
        return self.prefix + b"".join(b"/" + str(p).encode() for p in parts)

    def id_key(self, node_id: int) -> bytes:
        return self.key("ids", node_id)

    # --- the claim -----------------------------------------------------------------

    def claim(self, requested: int | None) -> defer.Deferred[int]:
        """Grant the lease and hold a node id under it: ``requested`` (an explicit
        ``--node-id``), or (None: ``--node-id=auto``) the id this data path held last if no
        other node holds it, else the lowest no live node holds.  An id held by this data
        path's last run (a crash: its lease is not expired yet) is waited for, at most the
        lease's TTL and a second.  Fails with :class:`EtcdError` when another live node
        holds the requested id, or etcd does not answer within :data:`START_TIMEOUT`."""
        return defer.ensureDeferred(self._claim(requested))

    async def _claim(self, requested: int | None) -> int:
        start = self.reactor.seconds()
        said = ""
        while True:
            try:
                node_id = await self._try_claim(requested, start)
            except EtcdError as e:
                if "held by another" in str(e) or self.reactor.seconds() - start >= START_TIMEOUT:
                    raise
                if str(e) != said:
                    said = str(e)
                    log.warn("ETCD: claiming a node id: {why}; trying again every {t}s", why=said, t=RETRY_INTERVAL)
                node_id = None
            if node_id is not None:
                self.node_id = node_id
                self.holding = True
                self.problem = ""
                _write_node_file(self.data_path, self.node_key, node_id)
                log.info("ETCD: node id {id} held under lease {lease:x} (TTL {ttl}s)", id=node_id,
                         lease=self.lease, ttl=self.ttl)
                return node_id
            await task.deferLater(self.reactor, RETRY_INTERVAL, lambda: None)

    async def _grant(self) -> None:
        self.lease, ttl = await self.gateway.grant(self.ttl)
        self.renewed = self.reactor.seconds()
        if ttl > 0:
            self.ttl = ttl

    async def _try_claim(self, requested: int | None, start: float) -> int | None:
        """One round: the id held, or None (try again a second later)."""
        if not self.lease:
            await self._grant()
        value = json.dumps(dict(self.identity)).encode()
        waited = self.reactor.seconds() - start
        if requested is not None:
            candidates = [requested]
        else:
            taken = {kv.key for kv in await self.gateway.get_prefix(self.key("ids") + b"/")}
            free = [n for n in range(1, MAX_NODE_ID) if self.id_key(n) not in taken]
            candidates = free[:8]
            if self.last_id is not None:  # this data path's id first: its peers know it by it
                candidates = [self.last_id] + [n for n in candidates if n != self.last_id]
            if not candidates and self.id_key(0) not in taken:
                candidates = [0]
            if not candidates:
                raise EtcdError(f"every node id in [0,{MAX_NODE_ID}) is held by a live node")
        for n in candidates:
            created, held = await self.gateway.create(self.id_key(n), value, self.lease)
            if created:
                return n
            holder = held.get(self.id_key(n))
            ours = holder is not None and self._is_ours(holder.value)
            if ours and holder is not None and holder.lease == self.lease:
                return n
            if ours and waited < self.ttl + RETRY_INTERVAL:
                return None  # this data path's last run: its lease expires within the TTL
            if requested is not None:
                raise EtcdError(f"--node-id {n} is held by another live node in etcd "
                                f"({_describe(holder.value if holder else b'')}); give each node its own id, "
                                "or --node-id=auto")
        return None  # every candidate was taken meanwhile (another node's claim): look again

    def _is_ours(self, value: bytes) -> bool:
        try:
            return bool(json.loads(value).get("node_key") == self.node_key)
        except (ValueError, AttributeError):
            return False

    # --- the lease while running ---------------------------------------------------

    def startService(self) -> None:
        super().startService()
        self._loop = task.LoopingCall(self._renew)
        self._loop.clock = self.reactor
        self._loop.start(self.ttl / 3, now=False)

    def stopService(self) -> defer.Deferred[Any]:
        super().stopService()
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None
        d: defer.Deferred[Any]
        if self.lease and self.holding:  # the id is free at once for the next run
            lease, self.lease, self.holding = self.lease, 0, False
            d = defer.ensureDeferred(self.gateway.revoke(lease))
            d.addErrback(lambda f: log.warn("ETCD: revoking the lease at the stop: {why}", why=f.getErrorMessage()))
        else:
            d = defer.succeed(None)
        d.addBoth(lambda _: self.gateway.close() if hasattr(self.gateway, "close") else None)
        return d

    def alive(self, now: float) -> bool:
        """True while this node holds its id under a lease etcd renewed within two thirds of
        its TTL (what it holds under the lease is its own)."""
        return self.holding and bool(self.lease) and now - self.renewed < self.ttl * 2 / 3

    def _renew(self) -> defer.Deferred[None]:
        if self._busy:
            return defer.succeed(None)
        self._busy = True
        d = defer.ensureDeferred(self._renew_once())
        d.addErrback(lambda f: log.failure("ETCD: renewing the lease", f))

        def done(_: Any) -> None:
            self._busy = False

        return d.addBoth(done)

    async def _renew_once(self) -> None:
        now = self.reactor.seconds()
        if not self.holding:
            await self._reclaim()
            return
        try:
            ttl = await self.gateway.keepalive(self.lease)
        except EtcdError as e:
            if self.reactor.seconds() - self.renewed >= self.ttl:
                self._lost(f"etcd unreachable for the lease's TTL ({self.ttl}s): {e}")
            return
        if ttl <= 0:
            self._lost("etcd says the lease expired (or was revoked)")
            return
        self.renewed = now

    def _lost(self, why: str) -> None:
        self.holding = False
        self.lease = 0
        self.problem = f"node id {self.node_id} is no longer held in etcd: {why}"
        log.error("ETCD: {problem}; this node adopts nothing until it holds its id again", problem=self.problem)

    async def _reclaim(self) -> None:
        """Hold the same id again under a new lease, unless another node took it."""
        assert self.node_id is not None
        try:
            if not self.lease:
                await self._grant()
            value = json.dumps(dict(self.identity)).encode()
            created, held = await self.gateway.create(self.id_key(self.node_id), value, self.lease)
        except EtcdError as e:
            if not self.problem.endswith(str(e)):
                self.problem = f"node id {self.node_id} is not held in etcd: {e}"
            return
        holder = held.get(self.id_key(self.node_id))
        if created or (holder is not None and holder.lease == self.lease):
            self.holding = True
            self.problem = ""
            log.info("ETCD: node id {id} held again under lease {lease:x}", id=self.node_id, lease=self.lease)
            if self.states:
                await self._write_states()
            return
        problem = (f"node id {self.node_id} is held by another node in etcd "
                   f"({_describe(holder.value if holder else b'')}); restart this node to claim another "
                   "(--node-id=auto) or give it a free one")
        if problem != self.problem:
            self.problem = problem
            log.critical("ETCD: {problem}", problem=problem)

    def arbiter(self) -> EtcdArbiter:
        """The adoption arbiter of this node (adoption under a lease in etcd)."""
        return EtcdArbiter(self)

    def health(self) -> tuple[bool, str]:
        """``(ok, text)`` for /ping: not ok while the node id is not held."""
        if self.holding:
            return True, "OK"
        return False, f"NOK - {self.problem or 'node id not held in etcd'}"

    def stats(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "holding": self.holding, "lease": f"{self.lease:x}", "ttl": self.ttl,
                "problem": self.problem, "states": dict(self.states)}

    # --- recorded states ---------------------------------------------------------------

    def state_key(self, node_id: int | None = None) -> bytes:
        return self.key("nodes", self.node_id if node_id is None else node_id, "state")

    def record_state(self, kind: str, value: Any) -> defer.Deferred[None]:
        """Record this node's ``kind`` state (``"drain"``, ``"maintenance"``...) as ``value``
        (anything JSON takes; None removes it) at ``<prefix>/nodes/<id>/state``: one JSON
        document of every kind recorded, ``{"node_id": ..., "states": {kind: value}}``.  Not
        under the lease: a node in maintenance is expected to be down.  Fires once etcd
        stored it; fails with :class:`EtcdError` (also logged) when it could not."""
        if value is None:
            self.states.pop(kind, None)
        else:
            self.states[kind] = value
        d = defer.ensureDeferred(self._write_states())

        def failed(f: Any) -> Any:
            log.warn("ETCD: recording the {kind} state: {why}", kind=kind, why=f.getErrorMessage())
            return f

        return d.addErrback(failed)

    async def _write_states(self) -> None:
        doc = {"node_id": self.node_id, "states": self.states}
        await self.gateway.put(self.state_key(), json.dumps(doc, sort_keys=True).encode())

    def read_state(self, node_id: int) -> defer.Deferred[dict[str, Any]]:
        """The states recorded by node ``node_id`` (``{}`` when none)."""

        async def read() -> dict[str, Any]:
            kv = await self.gateway.get(self.state_key(node_id))
            if kv is None:
                return {}
            states = json.loads(kv.value).get("states")
            return states if isinstance(states, dict) else {}

        return defer.ensureDeferred(read())


def _describe(value: bytes) -> str:
    try:
        doc = json.loads(value)
        return f"broadcast address {doc.get('broadcast_address')!r}, TCP {doc.get('tcp_address')!r}"
    except (ValueError, AttributeError):
        return repr(value[:60])


# --- adoption under a lease ------------------------------------------------------------


class EtcdArbiter:
    """Who adopts an origin's epoch: the peer that holds ``<prefix>/adopt/<origin>/<epoch>``
    under its lease.  At each check while the origin is due: ``ADOPT`` once this node created
    the key (a transaction: it did not exist, nor ``adopted/<origin>/<epoch>``) and its lease
    lives; ``STAND_BY`` while another node holds it (asked again every second: a holder that
    dies before it finishes lets its key expire, and another survivor takes it); ``FORGET``
    once the holder wrote ``adopted/<origin>/<epoch>`` (or a linked peer says it adopted);
    ``WAIT`` until etcd answered, and while this node does not hold its own id."""

    def __init__(self, session: EtcdSession) -> None:
        self.session = session
        #: (origin, epoch) -> (action, peer, when decided, why waiting)
        self.answers: dict[tuple[int, int], tuple[str, int | None, float, str]] = {}
        self._asking: set[tuple[int, int]] = set()

    def _keys(self, origin: int, epoch: int) -> tuple[bytes, bytes]:
        return self.session.key("adopt", origin, epoch), self.session.key("adopted", origin, epoch)

    def decide(self, origin: int, epoch: int, holders: list[tuple[int, int]], now: float) -> tuple[str, int | None]:
        done = [n for n, st in holders if st == wire.ADOPTED]
        if done:
            return FORGET, min(done)
        key = (origin, epoch)
        answer = self.answers.get(key)
        if answer is not None and answer[0] == FORGET:
            return FORGET, answer[1]
        if not self.session.alive(now):
            why = self.session.problem or "the lease is not renewed"
            self.answers[key] = (WAIT, None, now, f"this node does not hold its id in etcd ({why})")
            return WAIT, None
        if answer is not None and answer[0] == ADOPT:
            return ADOPT, None
        if answer is None:
            self.answers[key] = (WAIT, None, now, "asking etcd")
        if key not in self._asking and (answer is None or answer[0] == WAIT or now - answer[2] >= ASK_INTERVAL):
            self._ask(origin, epoch)  # the answer comes later (or at once: then it is taken next time)
        if answer is not None and answer[0] == STAND_BY:
            return STAND_BY, answer[1]
        return WAIT, None

    def _ask(self, origin: int, epoch: int) -> None:
        key = (origin, epoch)
        self._asking.add(key)
        session = self.session
        node_id = session.node_id
        adopt_key, adopted_key = self._keys(origin, epoch)
        lease = session.lease
        d = defer.ensureDeferred(session.gateway.create(adopt_key, str(node_id).encode(), lease, (adopted_key,)))

        def answered(result: tuple[bool, dict[bytes, KeyValue]]) -> None:
            created, held = result
            now = session.reactor.seconds()
            done = held.get(adopted_key)
            holder = held.get(adopt_key)
            if done is not None:
                self.answers[key] = (FORGET, _node(done.value), now, "")
            elif created or (holder is not None and holder.lease == lease and _node(holder.value) == node_id):
                if lease != session.lease:  # the lease changed meanwhile: ask again under the new one
                    self.answers[key] = (WAIT, None, now, "the lease changed")
                    return
                self.answers[key] = (ADOPT, None, now, "")
                log.info("ETCD: this node holds the adoption of node {id} (epoch {epoch})", id=origin, epoch=epoch)
            elif holder is not None:
                peer = _node(holder.value)
                if self.answers.get(key, (None,))[:2] != (STAND_BY, peer):
                    log.info("ETCD: node {peer} holds the adoption of node {id} (epoch {epoch}): this node "
                             "stands by", peer=peer, id=origin, epoch=epoch)
                self.answers[key] = (STAND_BY, peer, now, "")
            else:  # both keys gone between the compare and the read: ask again
                self.answers[key] = (WAIT, None, now, "asking etcd again")

        def failed(f: Any) -> None:
            self.answers[key] = (WAIT, None, session.reactor.seconds(), f"etcd: {f.getErrorMessage()}")

        def finished(_: Any) -> None:
            self._asking.discard(key)

        d.addCallbacks(answered, failed)
        d.addBoth(finished)

    def adopted(self, origin: int, epoch: int) -> None:
        """Say in etcd that this node adopted ``origin``'s ``epoch`` (the others drop their
        shadow): ``adopted/<origin>/<epoch>`` = this node's id, not under the lease."""
        _, adopted_key = self._keys(origin, epoch)
        self.answers.pop((origin, epoch), None)
        d = defer.ensureDeferred(self.session.gateway.put(adopted_key, str(self.session.node_id).encode()))
        d.addErrback(lambda f: log.warn("ETCD: recording the adoption of node {id}: {why}", id=origin,
                                        why=f.getErrorMessage()))

    def status(self) -> list[dict[str, object]]:
        return [{"origin_node_id": o, "epoch": e, "action": a, "peer_node_id": p, "waiting": why}
                for (o, e), (a, p, _, why) in sorted(self.answers.items()) if a in (WAIT, STAND_BY)]


def _node(value: bytes) -> int | None:
    try:
        return int(value)
    except ValueError:
        return None


# --- the nsqd of a node with --etcd-endpoints ------------------------------------------


class EtcdNodeService(MultiService):
    """An nsqd that claims its node id in etcd before it is built: :meth:`startService`
    claims it (``--node-id=auto``: one no live node holds), then builds the nsqd with that
    id (``build(options, session)``) and starts it; :meth:`ready` fires once it listens (or
    fails: the claim failed).  Attributes of the nsqd (``broker``, ``tcp_port``...) are read
    through this service once it is built."""

    def __init__(self, options: NsqdOptions, reactor: Any, build: Callable[[NsqdOptions, EtcdSession], Any],
                 *, gateway: Any = None) -> None:
        super().__init__()
        self._options = options
        self.reactor = reactor
        self.build = build
        self.session = EtcdSession(options, reactor, options.data_path or os.getcwd(), gateway=gateway)
        self.inner: Any = None
        self._ready: defer.Deferred[Any] = defer.Deferred()
        self._claiming: defer.Deferred[int] | None = None

    def __getattr__(self, name: str) -> Any:
        inner = self.__dict__.get("inner")
        if inner is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(inner, name)

    @property
    def options(self) -> NsqdOptions:
        """The nsqd's options once it is built (they change at runtime: ``PUT /config``,
        lookupd addresses), the ones it will be built with until then."""
        inner = self.__dict__.get("inner")
        return inner.options if inner is not None else self._options

    @property
    def lost_at_shutdown(self) -> int:
        return int(getattr(self.inner, "lost_at_shutdown", 0))

    def ready(self) -> defer.Deferred[Any]:
        d: defer.Deferred[Any] = defer.Deferred()

        def relay(result: Any) -> Any:
            if isinstance(result, Failure):
                d.errback(result)
                return None  # handled by whoever waits on ready()
            d.callback(result)
            return result

        self._ready.addBoth(relay)
        return d

    def startService(self) -> None:
        Service.startService(self)
        for s in list(self):  # what was attached before the start (the daemon's memory trim)
            s.startService()
        requested = None if isinstance(self._options.node_id, AutoNodeId) else int(self._options.node_id)
        self._claiming = self.session.claim(requested)
        self._claiming.addCallbacks(self._claimed, self._failed)

    def _claimed(self, node_id: int) -> None:
        self._claiming = None
        if not self.running:
            return
        self.session.setServiceParent(self)
        self._options = options = self._options.replace(node_id=node_id)
        try:
            self.inner = self.build(options, self.session)
            self.inner.setServiceParent(self)
        except Exception as e:
            self._failed(Failure(e))
            return
        self.inner.ready().addCallbacks(lambda _: self._ready.callback(self), self._ready.errback)

    def _failed(self, f: Any) -> None:
        self._claiming = None
        if isinstance(f.value, defer.CancelledError):
            return
        log.error("ETCD: cannot hold a node id: {why}", why=f.getErrorMessage())
        if not self._ready.called:
            self._ready.errback(f)

    def stopService(self) -> defer.Deferred[Any]:
        """Stop the nsqd first (it flushes its queues), then let go of the lease."""
        Service.stopService(self)
        if self._claiming is not None:
            self._claiming.cancel()
        d: defer.Deferred[Any] = defer.succeed(None)
        if self.inner is not None and self.inner.running:
            d = defer.maybeDeferred(self.inner.stopService)
        others = [s for s in reversed(list(self)) if s is not self.inner and s is not self.session and s.running]

        def rest(_: Any) -> Any:
            waits = [defer.maybeDeferred(s.stopService) for s in others]
            if self.session.running:
                waits.append(defer.maybeDeferred(self.session.stopService))
            elif not self.session.lease:
                waits.append(self.session.gateway.close() if hasattr(self.session.gateway, "close")
                             else defer.succeed(None))
            else:  # claimed, never started (the build failed): let go of the lease
                self.session.holding = True
                waits.append(defer.maybeDeferred(self.session.stopService))
            return defer.DeferredList(waits, consumeErrors=True)

        return d.addBoth(rest)
