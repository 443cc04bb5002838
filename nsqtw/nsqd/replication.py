"""
Replication glue: the links to ``--replica-peer`` nodes, the ``--replication-address`` listener
and the shadow log files, around the sans-IO :mod:`nsqtw.nsqd.core.replication`.

The origin side (:class:`ReplicationService`) connects to every peer (again every second after
a failure), sends each end-of-turn batch to the peers in sync, and fires the Deferreds of the
held publisher answers as acknowledgements come back.  A link whose peer does not answer HELLO,
or leaves a batch unacknowledged, for ``--replication-timeout`` is dropped (a stalled link:
out of sync).

The peer side (:class:`ShadowFactory`) stores each origin's batches in
``<data-path>/nsqtw-shadow.<origin node id>.log`` (an nsqtw-only file beside the diskqueue
files; Go's nsqd ignores it), fsynced before the ACK when ``--sync-every=1``.
"""

from __future__ import annotations

import os
from typing import Any

from twisted.application.service import Service
from twisted.internet import defer, task
from twisted.internet.endpoints import HostnameEndpoint
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure

from ..options import NsqdOptions, split_host_port
from ..protocol.replication import LinkError
from .core.replication import OriginLink, PublishRefused, ReplicationOrigin, ShadowReceiver

__all__ = ["ReplicationService", "ShadowFactory", "ShadowFiles", "shadow_path"]

log = Logger(namespace="nsqtw.nsqd")

#: seconds between attempts to reach a peer
RECONNECT_INTERVAL = 1.0


def shadow_path(data_path: str, origin_node_id: int) -> str:
    return os.path.join(data_path, f"nsqtw-shadow.{origin_node_id}.log")


# --- the peer side: shadow logs -------------------------------------------------------


class ShadowFiles:
    """Append-only shadow logs, one per origin; ``fsync`` before each acknowledgement when
    ``--sync-every=1`` (otherwise the OS writes them out, as the diskqueue's unsynced tail)."""

    def __init__(self, data_path: str, fsync: bool) -> None:
        self.data_path = data_path
        self.fsync = fsync
        self._fds: dict[int, int] = {}

    def append(self, origin: int, record: bytes) -> None:
        fd = self._fds.get(origin)
        if fd is None:
            fd = os.open(shadow_path(self.data_path, origin), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._fds[origin] = fd
        view = memoryview(record)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        if self.fsync:
            os.fsync(fd)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


class _ShadowProtocol(Protocol):
    #: the reactor's TCP transport
    transport: Any
    factory: ShadowFactory

    def __init__(self, receiver: ShadowReceiver) -> None:
        self.receiver = receiver

    def connectionMade(self) -> None:
        self.factory.protocols.add(self)

    def connectionLost(self, reason: Failure | None = None) -> None:
        self.factory.protocols.discard(self)

    def dataReceived(self, data: bytes) -> None:
        receiver = self.receiver
        was = receiver.origin
        out = receiver.feed(data)
        if out:
            self.transport.write(out)
        if receiver.origin is not None and was is None:
            log.info("REPLICATION: origin {name} (node {id}) linked from {peer}", name=receiver.origin.name,
                     id=receiver.origin.node_id, peer=self.transport.getPeer())
        if receiver.closed:
            log.warn("REPLICATION: link from {peer} refused: {why}", peer=self.transport.getPeer(),
                     why=out[5:].decode(errors="replace"))
            self.transport.loseConnection()


class ShadowFactory(Factory):
    """The ``--replication-address`` listener's factory."""

    noisy = False

    def __init__(self, node_id: int, instance: bytes, name: str, files: ShadowFiles) -> None:
        self.node_id = node_id
        self.instance = instance
        self.name = name
        self.files = files
        self.protocols: set[_ShadowProtocol] = set()

    def close_links(self) -> None:
        """The node stops: drop every origin's link (the origins see the peer out of sync)."""
        for p in list(self.protocols):
            p.transport.abortConnection()

    def buildProtocol(self, addr: Any) -> Protocol:
        p = _ShadowProtocol(ShadowReceiver(self.node_id, self.instance, self.name, self.files.append))
        p.factory = self
        return p


# --- the origin side ----------------------------------------------------------------


class _PeerLink(Protocol):
    #: the reactor's TCP transport
    transport: Any

    def __init__(self, service: ReplicationService, address: str) -> None:
        self.service = service
        self.address = address
        origin = service.origin_identity
        self.link = OriginLink(*origin)
        self.up = False

    def connectionMade(self) -> None:
        if hasattr(self.transport, "setTcpNoDelay"):
            self.transport.setTcpNoDelay(True)
        self.transport.write(self.link.start())

    def dataReceived(self, data: bytes) -> None:
        try:
            hello, acks = self.link.feed(data)
        except LinkError as e:
            self.service.link_failed(self, str(e))
            self.transport.abortConnection()
            return
        if hello is not None:
            self.up = True
            self.service.link_up(self, hello.node_id, hello.name)
        for seq in acks:
            self.service.acked(self.address, seq)

    def connectionLost(self, reason: Failure | None = None) -> None:
        self.service.link_lost(self, reason.getErrorMessage() if reason is not None else "closed")


class ReplicationService(Service):
    """The origin's links to its peers and its publish barrier."""

    def __init__(self, options: NsqdOptions, reactor: Any, *, instance: bytes, name: str,
                 turn: Any) -> None:
        self.setName("replication")
        self.options = options
        self.reactor = reactor
        self.turn = turn
        self.origin = ReplicationOrigin(list(options.replica_peers), options.replication_min_acks,
                                        options.replication_degraded == "accept")
        self.origin_identity = (options.node_id, instance, name)
        self.links: dict[str, _PeerLink] = {}
        self._retries: dict[str, Any] = {}
        self._connecting: dict[str, Any] = {}
        self._loop: task.LoopingCall | None = None
        self._flush = self.flush

    # --- what the broker and the glue call -------------------------------------------

    def record(self, topic: str, due_ns: int, frames: bytes, count: int) -> None:
        self.origin.record(topic, due_ns, frames, count)
        self.turn.soon(self._flush)

    def barrier(self) -> defer.Deferred[Any]:
        """Fires once ``--replication-min-acks`` peers stored everything recorded so far;
        fails with :class:`PublishRefused` when too few peers are in sync."""
        d: defer.Deferred[Any] = defer.Deferred()
        try:
            if self.origin.barrier(d):
                d.callback(None)
        except PublishRefused as e:
            d.errback(Failure(e))
        return d

    def flush(self) -> None:
        """Send what was recorded this turn to every peer in sync, as one batch."""
        batch = self.origin.take_batch(self.reactor.seconds())
        if batch is None:
            return
        frame, peers = batch
        for p in peers:
            link = self.links.get(p.address)
            if link is not None and link.transport is not None:
                link.transport.write(frame)

    def health(self) -> tuple[bool, str]:
        """``(ok, text)`` for /ping: not ok while publishes are refused."""
        origin = self.origin
        if not origin.degraded:
            return True, "OK"
        text = origin.refusal()
        if origin.accept_degraded:
            return True, f"OK - degraded ({text}; publishes accepted)"
        return False, f"NOK - {text}; publishes refused"

    def stats(self) -> dict[str, Any]:
        return self.origin.stats(self.reactor.seconds())

    # --- links ------------------------------------------------------------------

    def startService(self) -> None:
        super().startService()
        for address in self.origin.peers:
            self._connect(address)
        timeout = self.options.replication_timeout
        self._loop = task.LoopingCall(self._check_stalled)
        self._loop.clock = self.reactor
        self._loop.start(min(1.0, timeout / 4), now=False)

    def stopService(self) -> None:
        super().stopService()
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None
        for call in self._retries.values():
            if call.active():
                call.cancel()
        self._retries.clear()
        for d in list(self._connecting.values()):
            d.cancel()
        self._connecting.clear()
        for link in list(self.links.values()):
            link.transport.loseConnection()
        self._refuse(self.origin.fail_all(), "exiting")

    def _connect(self, address: str) -> None:
        self._retries.pop(address, None)
        if not self.running:
            return
        host, port = split_host_port(address, "replica-peer")
        self.origin.connecting(address, self.reactor.seconds())
        endpoint = HostnameEndpoint(self.reactor, host, port, timeout=self.options.replication_timeout)
        d = endpoint.connect(_LinkFactory(self, address))
        self._connecting[address] = d

        def connected(link: _PeerLink) -> None:
            self._connecting.pop(address, None)
            self.links[address] = link

        def failed(f: Failure) -> None:
            self._connecting.pop(address, None)
            self._down(address, f"connect failed: {f.getErrorMessage()}")

        d.addCallbacks(connected, failed)

    def _down(self, address: str, reason: str) -> None:
        was = self.origin.peers[address].state
        released, refused = self.origin.unlinked(address, self.reactor.seconds(), reason)
        if was != "out_of_sync":
            log.warn("REPLICATION: peer {peer} out of sync: {why}", peer=address, why=reason)
        self._release(released)
        self._refuse(refused, self.origin.refusal())
        if self.running and address not in self._retries:
            self._retries[address] = self.reactor.callLater(RECONNECT_INTERVAL, self._connect, address)

    def link_up(self, link: _PeerLink, node_id: int, name: str) -> None:
        self.origin.linked(link.address, node_id, self.reactor.seconds())
        log.info("REPLICATION: peer {peer} ({name}, node {id}) in sync", peer=link.address, name=name, id=node_id)

    def link_failed(self, link: _PeerLink, reason: str) -> None:
        link.up = False
        self.links.pop(link.address, None)
        self._down(link.address, reason)

    def link_lost(self, link: _PeerLink, reason: str) -> None:
        if self.links.get(link.address) is link:
            del self.links[link.address]
            self._down(link.address, f"link lost: {reason}")

    def acked(self, address: str, seq: int) -> None:
        self._release(self.origin.acked(address, seq))

    def _check_stalled(self) -> None:
        now = self.reactor.seconds()
        for address in self.origin.overdue(now, self.options.replication_timeout):
            link = self.links.pop(address, None)
            pending = self._connecting.pop(address, None)
            self._down(address, "stalled: no answer within --replication-timeout")
            if link is not None:
                link.transport.abortConnection()
            if pending is not None:
                pending.cancel()

    @staticmethod
    def _release(tokens: list[Any]) -> None:
        for d in tokens:
            d.callback(None)

    @staticmethod
    def _refuse(tokens: list[Any], reason: str) -> None:
        for d in tokens:
            d.errback(Failure(PublishRefused(reason)))


class _LinkFactory(Factory):
    noisy = False

    def __init__(self, service: ReplicationService, address: str) -> None:
        self.service = service
        self.address = address

    def buildProtocol(self, addr: Any) -> Protocol:
        p = _PeerLink(self.service, self.address)
        p.factory = self
        return p

