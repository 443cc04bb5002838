"""
The nsqd TCP listener: Twisted glue between sockets and :class:`V2Session`.

Per read: feed the bytes to the session and act on the :class:`Outcome` it
returns (write its answer, then each thing it asks for, in the outcome's
order), let the broker settle (deliver what became deliverable, to every
client), and write each client's output once.  Everything goes to the socket
through the client's own output (:meth:`ClientState.write` and ``flush``).
Timers live here because they need a reactor: the magic timeout, the
heartbeat ticker (``_heartbeat_`` every interval, traffic or not) and the
read deadline (two heartbeat intervals of silence close the connection, as
nsqd's read deadline does).
"""

from __future__ import annotations

from functools import partial
from typing import Any
from collections.abc import Callable

from twisted.internet import defer
from twisted.internet.interfaces import (
    IHalfCloseableProtocol, IHandshakeListener, IPushProducer, IReactorTime,
)
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from .core.broker import Broker
from .core.client import ClientState
from .core.v2 import CLOSE, CLOSE_HELD, Features, Outcome, Upgrade, V2Session
from ..protocol.compression import CodecError, DeflateCodec, SnappyCodec
from ..protocol.frames import HEARTBEAT_FRAME, OK_FRAME
from ..runtime import seam
from ..runtime.turn import TurnBatcher
from ..runtime.address import format_peer

__all__ = ["NsqdProtocol", "NsqdFactory"]

log = Logger(namespace="nsqtw.nsqd")


@implementer(IPushProducer, IHandshakeListener, IHalfCloseableProtocol)
class NsqdProtocol(Protocol):
    """One V2 client connection.

    It registers itself as the producer of its own transport: when a client
    stops reading and its unsent output passes the transport's buffer size,
    Twisted pauses us and we stop reading that client's commands, so a
    client that does not read cannot make the broker's memory grow (its
    deliveries are bounded by its RDY window anyway).
    """

    #: the reactor's TCP transport (producer/consumer and TLS methods beyond ITransport), or a test's fake
    transport: Any

    def __init__(self, factory: NsqdFactory) -> None:
        self.factory = factory
        self.clock = factory.clock
        self.client: ClientState | None = None
        self.session: V2Session | None = None
        self._last_read = 0.0
        self._magic_call: Any = None
        self._heartbeat_call: Any = None
        self._deadline_call: Any = None
        self._interval = 0.0
        self._codec: Any = None
        self._more_call: Any = None
        self._write_deadline: Any = None
        self._eof_pending = False
        #: the eager write and reused-buffer read, on a plain TCP connection (see nsqtw.runtime.seam)
        self._seam: seam.SocketSeam | None = None

    # --- connection lifecycle ------------------------------------------------

    def connectionMade(self) -> None:
        factory = self.factory
        now = self.clock.seconds()
        transport = self.transport
        if hasattr(transport, "setTcpNoDelay"):
            transport.setTcpNoDelay(True)  # as Go's connections: small frames go out at once
        self._seam = seam.attach(transport, self, self.dataReceived) if factory.fast_io else None
        client = factory.broker.new_client(format_peer(transport.getPeer()), now)
        client.writer = self._seam.write if self._seam is not None else transport.write
        client.closer = self.transport.loseConnection
        self.client = client
        self.session = V2Session(factory.broker, client, features=factory.features,
                                 authorizer=factory.authorizer, sync_publish=factory.sync_barrier is not None)
        self._last_read = now
        factory.protocols.add(self)
        self.transport.registerProducer(self, True)
        self._magic_call = self.clock.callLater(factory.broker.options.magic_timeout, self._no_magic)

    # --- IPushProducer: backpressure from our own transport ---------------------------

    def pauseProducing(self) -> None:
        """The client is not reading: stop reading it and stop delivering to it; if it still
        has not read after a heartbeat interval, close it (nsqd's write deadline)."""
        self.transport.stopReading()
        client = self.client
        if client is not None:
            client.blocked = True
            if self._write_deadline is None:
                limit = client.heartbeat_interval or self.factory.broker.options.heartbeat_interval
                self._write_deadline = self.clock.callLater(limit, self._write_timed_out)

    def resumeProducing(self) -> None:
        if self._write_deadline is not None and self._write_deadline.active():
            self._write_deadline.cancel()
        self._write_deadline = None
        client = self.client
        if client is not None and client.blocked:
            client.blocked = False
            if client.channel is not None:
                self.factory.broker.dirty.add(client.channel)
                self.factory.settle_soon()
        if self.transport.connected and not self.transport.disconnecting:
            self.transport.startReading()

    def _write_timed_out(self) -> None:
        self._write_deadline = None
        log.info("client({peer}) did not read for a heartbeat interval, closing",
                 peer=self.client and self.client.remote_address)
        self._stop_timers()
        self.transport.abortConnection()

    def stopProducing(self) -> None:
        pass

    def handshakeCompleted(self) -> None:
        """IHandshakeListener: TLS is up, backpressure applies again."""
        if self.transport.connected and getattr(self.transport, "producer", None) is None:
            self.transport.registerProducer(self, True)

    def connectionLost(self, reason: Failure | None = None) -> None:
        self._stop_timers()
        if self._seam is not None:
            self._seam.detach()
            self._seam = None
        factory = self.factory
        factory.protocols.discard(self)
        if self.client is not None:
            factory.broker.client_gone(self.client, self.clock.seconds())
            factory.settle_soon()  # its in-flight messages go to the other consumers

    # --- IHalfCloseableProtocol: the client stopped sending --------------------------

    def readConnectionLost(self) -> None:
        """EOF from the client (a half-close): nsqd answers a command cut inside its body with
        its fatal error (``E_BAD_MESSAGE PUB failed to read message body``...) before it closes;
        answers still held for an fsync go out first."""
        session = self.session
        if session is None:
            self._close()
            return
        if self._more_call is not None:
            self._eof_pending = True  # what was read is still being worked through: after it
            return
        self._act(session.eof(), self.clock.seconds())

    def writeConnectionLost(self) -> None:
        pass  # nsqtw never half-closes its own side

    def _stop_timers(self) -> None:
        for call in (self._magic_call, self._heartbeat_call, self._deadline_call, self._more_call,
                     self._write_deadline):
            if call is not None and call.active():
                call.cancel()
        self._magic_call = self._heartbeat_call = self._deadline_call = self._more_call = None
        self._write_deadline = None

    # --- reads ---------------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        session = self.session
        if session is None:
            return
        now = self.clock.seconds()
        codec = self._codec
        if codec is not None:
            try:
                data = codec.decode(data)
            except CodecError as e:
                log.info("client({peer}) sent undecodable data ({err}), closing",
                         peer=self.client and self.client.remote_address, err=e)
                self._close()
                return
            if codec.pending and self._more_call is None:
                # a highly compressed read: decode the rest in later turns, a bounded piece each
                self._more_call = self.clock.callLater(0, self._decode_more)
        self._act(session.feed(data, now), now)

    def _act(self, out: Outcome, now: float) -> None:
        """Do what the session's outcome asks, field by field in :class:`Outcome`'s order."""
        answer, progressed, heartbeats, more, sync, auth, upgrade, close = out
        if answer:
            self.client.write(answer)  # type: ignore[union-attr]  # set in connectionMade, before any read
        factory = self.factory
        broker = factory.broker
        if broker.dirty or broker.pumping or broker.outbox:
            factory.settle_soon()  # deliveries: once, when this reactor turn's reads are done
        if progressed:
            # nsqd's read deadline is set once per command: only a whole command resets it,
            # so a client cannot hold its connection by dribbling bytes
            self._last_read = now
        if not (heartbeats or more or sync or close or auth is not None or upgrade is not None
                or self._eof_pending):
            return  # nothing more to do for this read (the commonest case)
        if heartbeats:
            if self._magic_call is not None:
                self._magic_call.cancel()
                self._magic_call = None
            self._start_heartbeats()
        if more and self._more_call is None:
            self._more_call = self.clock.callLater(0, self._decode_more)  # its work goes on next turn
        if sync:
            self._wait_sync(sync)
        if auth is not None:
            self._ask_auth_server(auth)
        if self._eof_pending and self._more_call is None:
            self._eof_pending = False
            self.readConnectionLost()
            return
        if close == CLOSE:
            self._close()
        elif close == CLOSE_HELD:
            self.transport.pauseProducing()  # read nothing more; close once the held answers are out
        elif upgrade is not None:
            self._upgrade(upgrade)

    def _decode_more(self) -> None:
        self._more_call = None
        if self.transport.connected:
            self.dataReceived(b"")

    def _upgrade(self, upgrade: Upgrade) -> None:
        """The IDENTIFY answer is out in the clear; now TLS, then snappy or deflate, each
        confirmed by an OK sent through the new layer (nsqd's order)."""
        client = self.client
        session = self.session
        assert client is not None and session is not None
        client.flush()
        transport = self.transport
        if upgrade.tls:
            # the TLS layer must read the handshake whatever its buffers say: register
            # again as producer once the handshake is done (handshakeCompleted)
            transport.unregisterProducer()
            if self._seam is not None:
                self._seam.detach()  # TLS reads and writes through its own layer
                self._seam = None
            from ..runtime.tls import tls_details
            transport.startTLS(self.factory.tls_context)
            client.writer = transport.write  # from now on through the TLS layer
            client.tls = True
            client.tls_details = lambda: tls_details(transport)
            client.write(OK_FRAME)
        codec: Any = None
        if upgrade.snappy:
            codec = SnappyCodec()
            client.snappy = True
        elif upgrade.deflate:
            codec = DeflateCodec(upgrade.deflate_level)
            client.deflate = True
            client.deflate_level = upgrade.deflate_level
        if codec is not None:
            write = client.writer
            encode = codec.encode
            client.writer = lambda data: write(encode(data))
            self._codec = codec
            client.write(OK_FRAME)
        rest = session.take_remainder()
        if rest and not upgrade.tls:
            self.dataReceived(rest)  # sent compressed right after IDENTIFY: decode it now

    def _ask_auth_server(self, secret: bytes) -> None:
        """AUTH (or a TTL re-check): ask the auth servers, then run the command again."""
        client = self.client
        assert client is not None
        ip = client.remote_address.rsplit(":", 1)[0].strip("[]") if ":" in client.remote_address else ""
        common_name = client.tls_details()[2] if client.tls else ""
        d = defer.ensureDeferred(self.factory.authorizer.query(secret, ip, client.tls, common_name))

        def answered(result: Any) -> None:
            if isinstance(result, Failure):
                log.warn("PROTOCOL(V2): [{peer}] AUTH failed {err}", peer=client.remote_address,
                         err=result.getErrorMessage())
                result = result.value
            session = self.session
            if session is None or not self.transport.connected:
                return
            session.resume(result)
            self.dataReceived(b"")

        d.addBoth(answered)

    def _wait_sync(self, gen: int) -> None:
        """--sync-every=1: release the answers of ``gen`` once the fsync covering it is done
        (replicated: once enough peers stored them)."""
        hold = self.factory.sync_hold
        if hold is not None:
            hold(partial(self._held_done, gen))
            return
        d = self.factory.sync_barrier()

        def synced(_: Any) -> None:
            session = self.session
            if session is not None:
                self._act(session.synced(gen), self.clock.seconds())

        def failed(f: Failure) -> None:
            session = self.session
            if session is not None:
                self._act(session.sync_failed(gen, f.getErrorMessage()), self.clock.seconds())

        d.addCallbacks(synced, failed)

    def _held_done(self, gen: int, refused: str | None) -> None:
        """The replication barrier's answer for ``gen`` (see ``sync_hold``): write the held
        answers, or refuse them and close, as :meth:`_wait_sync`'s callbacks do."""
        session = self.session
        if session is None:
            return
        if refused is None:
            self._act(session.synced(gen), self.clock.seconds())
        else:
            self._act(session.sync_failed(gen, refused), self.clock.seconds())

    def _close(self) -> None:
        self._stop_timers()
        self.transport.loseConnection()

    def _no_magic(self) -> None:
        self._magic_call = None
        log.info("client({peer}) sent no protocol magic in time, closing", peer=self.client and self.client.remote_address)
        self.transport.abortConnection()

    # --- heartbeats and the read deadline ---------------------------------------

    def _start_heartbeats(self) -> None:
        for call in (self._heartbeat_call, self._deadline_call):
            if call is not None and call.active():
                call.cancel()
        self._heartbeat_call = self._deadline_call = None
        assert self.client is not None
        interval = self.client.heartbeat_interval
        self._interval = interval
        if interval > 0:
            self._heartbeat_call = self.clock.callLater(interval, self._heartbeat)
            self._deadline_call = self.clock.callLater(2 * interval, self._check_deadline)

    def _heartbeat(self) -> None:
        self._heartbeat_call = self.clock.callLater(self._interval, self._heartbeat)
        client = self.client
        if client is not None:
            client.write(HEARTBEAT_FRAME)

    def _check_deadline(self) -> None:
        """nsqd's read deadline: two heartbeat intervals since the last read."""
        self._deadline_call = None
        remaining = self._last_read + 2 * self._interval - self.clock.seconds()
        if remaining > 0:
            self._deadline_call = self.clock.callLater(remaining, self._check_deadline)
            return
        log.info("client({peer}) missed two heartbeats, closing", peer=self.client and self.client.remote_address)
        self._stop_timers()
        self.transport.abortConnection()


class NsqdFactory(Factory):
    """Builds :class:`NsqdProtocol` for one broker; also the entry point for settling."""

    protocol = NsqdProtocol

    def __init__(self, broker: Broker, clock: IReactorTime, *, features: Features = Features(),
                 authorizer: Any = None, settle: Callable[[], None] | None = None,
                 sync_barrier: Callable[[], Any] | None = None,
                 sync_hold: Callable[[Callable[[str | None], None]], None] | None = None,
                 tls_context: Any = None, turn: TurnBatcher | None = None,
                 fast_io: bool = True) -> None:
        """``turn`` runs the end-of-turn work (a batcher of its own on ``clock`` when not
        given); ``fast_io=False`` keeps every connection on Twisted's own reads and writes
        (see :mod:`nsqtw.runtime.seam`)."""
        self.broker = broker
        self.sync_barrier = sync_barrier
        #: ``sync_barrier`` without a Deferred, when it is only the replication barrier: it
        #: calls its argument with None once the answers may go, with a reason if refused
        self.sync_hold = sync_hold
        self.tls_context = tls_context
        self.clock = clock
        self.features = features
        self.authorizer = authorizer
        self.protocols: set[NsqdProtocol] = set()
        self.fast_io = fast_io
        self._settle = settle
        self.turn = turn if turn is not None else TurnBatcher(clock)
        self._settle_bound = self.settle  # one bound method: settle_soon runs on every read

    def buildProtocol(self, addr: Any) -> NsqdProtocol:
        return NsqdProtocol(self)

    def settle_soon(self) -> None:
        """Deliver what became deliverable at the end of this reactor turn (once per turn,
        however many reads asked: each consumer gets one write)."""
        self.turn.soon(self._settle_bound)

    def settle(self) -> None:
        if self._settle is not None:
            self._settle()
        else:
            self.broker.settle(self.clock.seconds())
