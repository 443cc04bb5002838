"""
The nsqlookupd TCP listener: Twisted glue around :class:`~nsqtw.lookupd.core.v1.LookupSession`.

Per read the session runs every complete command and returns the answers;
the glue writes them and closes the connection after a fatal error.  When a
connection goes, for whatever reason, the session drops the peer's
registrations.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure

from .core.registry import RegistrationDB
from .core.v1 import LookupSession, ServerInfo
from ..runtime.address import format_peer

__all__ = ["LookupdProtocol", "LookupdFactory", "format_peer"]

log = Logger(namespace="nsqtw.lookupd")


class LookupdProtocol(Protocol):
    """One nsqd connection."""

    #: the reactor's TCP transport (producer/consumer and TLS methods beyond ITransport), or a test's fake
    transport: Any

    def __init__(self, factory: LookupdFactory) -> None:
        self.factory = factory
        self.session: LookupSession | None = None
        self.closed: defer.Deferred = defer.Deferred()

    def connectionMade(self) -> None:
        peer = format_peer(self.transport.getPeer())
        log.info("TCP: new client({peer})", peer=peer)
        self.session = LookupSession(self.factory.db, peer, self.factory.server)
        self.factory.protocols.add(self)

    def dataReceived(self, data: bytes) -> None:
        session = self.session
        if session is None:
            return
        out, keep = session.feed(data, self.factory.clock.seconds())
        if out:
            self.transport.write(out)
        if not keep:
            self.transport.loseConnection()

    def connectionLost(self, reason: Failure | None = None) -> None:
        self.factory.protocols.discard(self)
        if self.session is not None:
            log.info("PROTOCOL(V1): [{peer}] exiting ioloop", peer=self.session.remote_address)
            self.session.connection_lost()
        self.closed.callback(None)


class LookupdFactory(Factory):
    """Builds :class:`LookupdProtocol` over one RegistrationDB."""

    noisy = False

    def __init__(self, db: RegistrationDB, server: ServerInfo, clock: IReactorTime) -> None:
        self.db = db
        self.server = server
        self.clock = clock
        self.protocols: set[LookupdProtocol] = set()

    def buildProtocol(self, addr: Any) -> LookupdProtocol:
        return LookupdProtocol(self)

    def close_all(self) -> defer.Deferred:
        """Close every connection (nsqlookupd's exit); fires once each has dropped its
        registrations."""
        waits = []
        for proto in list(self.protocols):
            waits.append(proto.closed)
            proto.transport.loseConnection()
        return defer.gatherResults(waits, consumeErrors=True)
