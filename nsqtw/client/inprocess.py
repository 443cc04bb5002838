"""
The in-process bus: a client and a broker in the same reactor, joined without a socket.

:func:`connect_inprocess` builds the broker's own V2 protocol from its
``tcp_factory`` and joins it to the client protocol with a pair of
:class:`MemoryTransport`: the same bytes flow through the same protocol code
as over TCP, but a write is handed to the peer by the reactor
(``callLater(0)``), never by a nested call, so delivery is asynchronous as on
a socket and there is no recursion however chatty the two sides are.  All
writes of one reactor turn reach the peer as one ``dataReceived``.

Brokers are found by name (``"inprocess:"`` is the name ``""``,
``"inprocess:orders"`` the name ``orders``) in a registry filled by
:func:`register`, or passed directly (the handle ``nsqtw.embed.start_nsqd``
returns, an ``NsqdService``, or any factory of the broker protocol)::

    nsqd = await start_nsqd()
    unregister = register(nsqd)                 # now "inprocess:" reaches it
    producer = Producer("inprocess:")           # or Producer(nsqd)
"""

from __future__ import annotations

import itertools
from typing import Any
from collections.abc import Callable

from twisted.internet import defer, error as ierror
from twisted.internet.address import IPv4Address
from twisted.internet.interfaces import IConsumer, IPushProducer, ITCPTransport, ITransport
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure
from zope.interface import implementer

__all__ = [
    "PREFIX",
    "register",
    "unregister",
    "registered",
    "is_inprocess",
    "broker_factory",
    "connect_inprocess",
    "MemoryTransport",
]

PREFIX = "inprocess:"

_registry: dict[str, Any] = {}
_ports = itertools.count(1)


def register(nsqd: object, name: str = "") -> Callable[[], None]:
    """Make ``inprocess:<name>`` reach this broker; returns a function that undoes it."""
    _registry[name] = nsqd

    def undo() -> None:
        if _registry.get(name) is nsqd:
            del _registry[name]

    return undo


def unregister(name: str = "") -> None:
    _registry.pop(name, None)


def registered() -> dict[str, Any]:
    """A copy of the registry (name -> broker)."""
    return dict(_registry)


def is_inprocess(address: Any) -> bool:
    """An ``inprocess:`` address, or a broker object rather than a string."""
    if isinstance(address, str):
        return address.startswith(PREFIX)
    return broker_factory(address, strict=False) is not None


def _running(obj: Any) -> bool:
    service = getattr(obj, "_service", obj)
    return bool(getattr(service, "running", True))


def broker_factory(target: Any, strict: bool = True) -> Any:
    """The broker protocol factory behind a name, a handle, a service or a factory."""
    obj = target
    if isinstance(target, str):
        name = target[len(PREFIX):] if target.startswith(PREFIX) else target
        obj = _registry.get(name)
        if obj is None:
            if strict:
                raise ierror.ConnectionRefusedError(f"no in-process broker named {name!r}")
            return None
    for path in (("_service", "tcp_factory"), ("tcp_factory",)):
        cur = obj
        for attr_name in path:
            cur = getattr(cur, attr_name, None)
            if cur is None:
                break
        if cur is not None:
            if strict and not _running(obj):
                raise ierror.ConnectionRefusedError("the in-process broker is stopped")
            return cur
    if callable(getattr(obj, "buildProtocol", None)):
        return obj
    if strict:
        raise ierror.ConnectionRefusedError(f"{target!r} is not an in-process broker")
    return None


def address_name(target: Any) -> str:
    """A readable address for a broker object (used as the connection's key)."""
    if isinstance(target, str):
        return target
    for name, obj in _registry.items():
        if obj is target:
            return PREFIX + name
    tcp_address = getattr(target, "tcp_address", None)
    if isinstance(tcp_address, str):
        return f"{PREFIX}{tcp_address}"
    return f"{PREFIX}{id(target):x}"


@implementer(ITransport, ITCPTransport, IConsumer, IPushProducer)
class MemoryTransport:
    """One end of an in-memory connection; writes reach the peer on a later reactor turn."""

    disconnecting = False
    disconnected = False

    def __init__(self, reactor: Any, host: Any, peer_address: Any) -> None:
        self.reactor = reactor
        self._host = host
        self._peer_address = peer_address
        self.peer: MemoryTransport | None = None
        self.protocol: Protocol | None = None
        self._out: list[bytes] = []
        self._call: Any = None
        self._paused = False          # reading paused (pauseProducing on us)
        self._closing = False
        self._close_reason: Failure | None = None
        self.producer: Any = None
        self.streaming = False
        self.bytes_written = 0

    # --- ITransport ------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if self.disconnected or self._closing or not data:
            return
        self._out.append(data)
        self.bytes_written += len(data)
        self._schedule()

    def writeSequence(self, seq: Any) -> None:
        for data in seq:
            self.write(data)

    def loseConnection(self) -> None:
        """Hang up once what was written has been delivered."""
        if self.disconnected or self._closing:
            return
        self._closing = True
        self.disconnecting = True
        self._close_reason = Failure(ierror.ConnectionDone("Connection was closed cleanly."))
        self._schedule()

    def abortConnection(self) -> None:
        """Hang up now, dropping what was not delivered."""
        if self.disconnected:
            return
        self._out.clear()
        self._closing = True
        self.disconnecting = True
        self._close_reason = Failure(ierror.ConnectionAborted())
        self._schedule()

    def getPeer(self) -> Any:
        return self._peer_address

    def getHost(self) -> Any:
        return self._host

    # --- ITCPTransport niceties the broker or clients may call ---------------------------

    def getTcpNoDelay(self) -> bool:
        return True

    def setTcpNoDelay(self, enabled: bool) -> None:
        pass

    def getTcpKeepAlive(self) -> bool:
        return False

    def setTcpKeepAlive(self, enabled: bool) -> None:
        pass

    def loseWriteConnection(self) -> None:
        self.loseConnection()

    # --- IConsumer (producers writing into us; there is no buffer limit to signal) --------

    def registerProducer(self, producer: Any, streaming: bool) -> None:
        self.producer = producer
        self.streaming = streaming
        if not streaming:
            producer.resumeProducing()

    def unregisterProducer(self) -> None:
        self.producer = None

    # --- IPushProducer: pausing *reading* on this end ---------------------------------------

    def pauseProducing(self) -> None:
        self._paused = True

    def resumeProducing(self) -> None:
        self._paused = False
        if self.peer is not None and self.peer._out:
            self.peer._schedule()

    def stopProducing(self) -> None:
        self.loseConnection()

    # --- delivery ------------------------------------------------------------------------

    def _schedule(self) -> None:
        if self._call is None:
            self._call = self.reactor.callLater(0, self._deliver)

    def _deliver(self) -> None:
        self._call = None
        if self.disconnected:
            return
        peer = self.peer
        if self._out and peer is not None and not peer.disconnected:
            if peer._paused:
                return  # resumeProducing on the peer reschedules us
            out = self._out
            data = out[0] if len(out) == 1 else b"".join(out)
            self._out = []
            assert peer.protocol is not None
            peer.protocol.dataReceived(data)
        if self._closing and not self._out:
            self._teardown()

    def _teardown(self) -> None:
        """Both ends go: the peer's pending bytes are delivered first when the close is clean."""
        peer = self.peer
        reason = self._close_reason or Failure(ierror.ConnectionDone())
        clean = reason.check(ierror.ConnectionDone) is not None
        if peer is not None and not peer.disconnected and clean and peer._out and not peer._paused:
            out, peer._out = peer._out, []
            if self.protocol is not None:
                self.protocol.dataReceived(b"".join(out))
        peer_reason = Failure(ierror.ConnectionDone("Connection was closed cleanly.")) if clean \
            else Failure(ierror.ConnectionLost("Connection to the other side was lost."))
        for end, why in ((self, reason), (peer, peer_reason)):
            if end is None or end.disconnected:
                continue
            end.disconnected = True
            end.disconnecting = False
            end._out = []
            if end._call is not None and end._call.active():
                end._call.cancel()
            end._call = None
            if end.producer is not None:
                producer, end.producer = end.producer, None
                try:
                    producer.stopProducing()
                except Exception:  # pragma: no cover - a producer's own failure
                    pass
            if end.protocol is not None:
                end.protocol.connectionLost(why)


def connect_inprocess(target: Any, protocol: Protocol, reactor: Any = None) -> defer.Deferred[Any]:
    """Join ``protocol`` to a new broker-side protocol; fires with ``protocol``.

    ``target`` is an ``inprocess:[name]`` address, a broker handle, an
    ``NsqdService`` or a protocol factory.  Fails with ``ConnectionRefusedError``
    when no such broker runs.
    """
    from ..runtime.reactor import resolve_reactor
    reactor = resolve_reactor(reactor)
    try:
        factory = broker_factory(target)
    except ierror.ConnectError:
        return defer.fail()
    port = next(_ports)
    client_addr = IPv4Address("TCP", "127.0.0.1", port)
    server_addr = IPv4Address("TCP", "127.0.0.1", 0)
    server_proto = factory.buildProtocol(client_addr)
    if server_proto is None:
        return defer.fail(ierror.ConnectionRefusedError("the broker refused the connection"))
    client_end = MemoryTransport(reactor, client_addr, server_addr)
    server_end = MemoryTransport(reactor, server_addr, client_addr)
    client_end.peer, server_end.peer = server_end, client_end
    client_end.protocol, server_end.protocol = protocol, server_proto
    server_proto.makeConnection(server_end)
    protocol.makeConnection(client_end)
    return defer.succeed(protocol)

