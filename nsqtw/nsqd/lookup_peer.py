"""
nsqd's connection to one nsqlookupd (``nsqd/lookup_peer.go``): the magic, IDENTIFY, the
replay of the broker's registrations, then commands answered in order, each within
:data:`COMMAND_TIMEOUT`.  The peer it serves (a :class:`PeerOwner`'s
:class:`~nsqtw.nsqd.lookup_peers.LookupPeer`) decides what to send and what a lost
connection means; this module only speaks the protocol.
"""

from __future__ import annotations

import json
import typing
from collections import deque
from typing import Any

import attr
from twisted.internet import defer
from twisted.internet.error import ConnectionLost
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure

from ..lookupd.core.v1 import ResponseDecoder, ResponseTooBig, identify_command
from ..protocol.frames import MAGIC_V1

__all__ = ["COMMAND_TIMEOUT", "LookupdInfo", "LookupPeerProtocol", "PeerFactory", "PeerOwner", "Peer"]

log = Logger(namespace="nsqtw.nsqd")


class PeerOwner(typing.Protocol):
    """What a connection asks of the peers' owner (the LookupPeersService)."""

    clock: Any

    @property
    def max_response_size(self) -> int: ...

    def identify_fields(self) -> dict[str, Any]: ...

    def registration_commands(self) -> list[bytes]: ...


class Peer(typing.Protocol):
    """The nsqlookupd a connection is for (a LookupPeer): told of the connection's life."""

    info: LookupdInfo | None
    protocol: LookupPeerProtocol | None

    @property
    def address(self) -> str: ...

    @property
    def owner(self) -> PeerOwner: ...

    def _registered(self, proto: LookupPeerProtocol) -> None: ...

    def _lost(self, proto: LookupPeerProtocol) -> None: ...


#: nsqd's per-command read/write deadline and dial timeout
COMMAND_TIMEOUT = 1.0


@attr.s(frozen=True, slots=True, auto_attribs=True)
class LookupdInfo:
    """nsqlookupd's IDENTIFY answer (nsqd's ``peerInfo``)."""

    tcp_port: int = 0
    http_port: int = 0
    version: str = ""
    broadcast_address: str = ""

    @classmethod
    def from_json(cls, body: bytes) -> LookupdInfo:
        """Decode as Go does into ``peerInfo``; ValueError if it is not that JSON."""
        data = json.loads(body.decode("utf-8", "replace"))
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        values: dict[str, Any] = {}
        for name, kind in (("tcp_port", int), ("http_port", int), ("version", str),
                           ("broadcast_address", str)):
            value = data.get(name)
            if value is None:
                continue
            if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"cannot unmarshal {value!r} into {name}")
            if kind is str and not isinstance(value, str):
                raise ValueError(f"cannot unmarshal {value!r} into {name}")
            values[name] = value
        return cls(**values)


class LookupPeerProtocol(Protocol):
    """One connection to nsqlookupd: IDENTIFY, the replay, then commands answered in order."""

    #: the reactor's TCP transport (producer/consumer and TLS methods beyond ITransport), or a test's fake
    transport: Any

    def __init__(self, peer: Peer) -> None:
        self.peer = peer
        self.clock = peer.owner.clock
        self.identified = False
        self._decoder = ResponseDecoder(peer.owner.max_response_size)
        self._pending: deque[defer.Deferred] = deque()
        self._deadline: Any = None
        self._closing = False

    # --- connection ------------------------------------------------------------

    def connectionMade(self) -> None:
        self.peer.protocol = self
        self.transport.write(MAGIC_V1)
        fields = self.peer.owner.identify_fields()
        self.command(identify_command(fields)).addCallbacks(self._identified, self._not_identified)

    def connectionLost(self, reason: Failure | None = None) -> None:
        self._cancel_deadline()
        self.identified = False
        pending, self._pending = self._pending, deque()
        for d in pending:
            d.errback(Failure(ConnectionLost(f"lookupd {self.peer.address} connection lost")))
        self.peer._lost(self)

    def close(self, why: str) -> None:
        """Drop the connection; the ClientService makes a new one after a backoff delay."""
        if self._closing:
            return
        self._closing = True
        log.info("LOOKUPD({peer}): closing connection - {why}", peer=self.peer.address, why=why)
        self.transport.loseConnection()

    # --- commands ----------------------------------------------------------------

    def command(self, data: bytes) -> defer.Deferred:
        """Send one command; the Deferred fires with its response."""
        d: defer.Deferred = defer.Deferred()
        if self._closing:
            d.errback(Failure(ConnectionLost("closing")))
            return d
        self._pending.append(d)
        self.transport.write(data)
        if self._deadline is None:
            self._deadline = self.clock.callLater(COMMAND_TIMEOUT, self._timed_out)
        return d

    def dataReceived(self, data: bytes) -> None:
        try:
            responses = self._decoder.feed(data)
        except ResponseTooBig as e:
            log.error("LOOKUPD({peer}): {err}", peer=self.peer.address, err=str(e))
            self.close(str(e))
            return
        for body in responses:
            if not self._pending:
                self.close("unexpected response")
                return
            self._cancel_deadline()
            if len(self._pending) > 1:
                self._deadline = self.clock.callLater(COMMAND_TIMEOUT, self._timed_out)
            self._pending.popleft().callback(body)

    def _timed_out(self) -> None:
        self._deadline = None
        log.error("LOOKUPD({peer}): no response within {timeout}s", peer=self.peer.address,
                  timeout=COMMAND_TIMEOUT)
        self.close("i/o timeout")

    def _cancel_deadline(self) -> None:
        if self._deadline is not None and self._deadline.active():
            self._deadline.cancel()
        self._deadline = None

    # --- IDENTIFY and the replay ------------------------------------------------------

    def _identified(self, body: bytes) -> None:
        peer = self.peer
        if body == b"E_INVALID":
            log.info("LOOKUPD({peer}): lookupd returned {resp}", peer=peer.address, resp=body)
            self.close("IDENTIFY refused")
            return
        try:
            info = LookupdInfo.from_json(body)
        except ValueError:
            log.error("LOOKUPD({peer}): parsing response - {resp!r}", peer=peer.address, resp=body)
            self.close("bad IDENTIFY response")
            return
        peer.info = info
        log.info("LOOKUPD({peer}): peer info {info}", peer=peer.address, info=info)
        if not info.broadcast_address:
            log.error("LOOKUPD({peer}): no broadcast address", peer=peer.address)
        self.identified = True
        commands = peer.owner.registration_commands()
        log.info("LOOKUPD({peer}): registering {n} topics and channels", peer=peer.address, n=len(commands))
        waits = []
        for cmd in commands:
            log.debug("LOOKUPD({peer}): {cmd}", peer=peer.address, cmd=cmd.decode().strip())
            waits.append(self.command(cmd).addCallback(self._check_ok, cmd))
        done = defer.gatherResults(waits, consumeErrors=True)
        done.addCallbacks(lambda _: peer._registered(self), lambda f: None)

    def _not_identified(self, failure: Failure) -> None:
        """The connection went before IDENTIFY was answered; the ClientService dials again."""
        log.debug("LOOKUPD({peer}): IDENTIFY - {err}", peer=self.peer.address, err=failure.getErrorMessage())

    def _check_ok(self, body: bytes, cmd: bytes) -> bytes:
        if body != b"OK":
            log.error("LOOKUPD({peer}): {cmd} - {resp}", peer=self.peer.address,
                      cmd=cmd.decode().strip(), resp=body.decode("utf-8", "replace"))
        return body


class PeerFactory(Factory):
    noisy = False

    def __init__(self, peer: Peer) -> None:
        self.peer = peer

    def buildProtocol(self, addr: Any) -> LookupPeerProtocol:
        return LookupPeerProtocol(self.peer)
