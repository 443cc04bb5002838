"""
One connection to an nsqd: the Twisted Protocol over :class:`~nsqtw.client.core.ClientCore`.

It writes what the core says, starts TLS when negotiated, answers
``_heartbeat_`` with ``NOP``, matches responses to the commands that expect
one in FIFO order (:meth:`NSQConnection.command`), and declares the server
dead when nothing arrives for two heartbeat intervals (``read_timeout`` when
heartbeats are off, and for the handshake).  Error frames are typed with
:func:`nsqtw.errors.from_wire`: ``E_FIN_FAILED``, ``E_REQ_FAILED`` and
``E_TOUCH_FAILED`` are non-fatal and answer no pending command (FIN, REQ and
TOUCH expect no response); every other error answers the oldest pending
command and, being fatal, closes the connection as nsqd does.

What the connection's owner (a producer or a consumer) learns arrives through
a :class:`ConnectionDelegate`.  :func:`connect` dials any address form
(``host:port``, ``inprocess:[name]``, an embedded broker handle) and fires
once the handshake is done.
"""

from __future__ import annotations

from collections import deque
import struct
from typing import TYPE_CHECKING, Any
from collections.abc import Callable

from twisted.internet import defer, error as ierror
from twisted.internet.interfaces import IReactorTime
from twisted.internet.protocol import Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from ..runtime.reactor import Clock

from ..errors import NSQError, from_wire
from ..protocol.frames import FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE, HEARTBEAT
from ..protocol.message import MIN_MESSAGE_LENGTH
from . import commands
from .config import Config
from .core import EV_FAILED, EV_READY, EV_START_TLS, EV_WRITE, ClientCore
from .errors import ClientError, IdentifyError, NotConnected, ProtocolError
from .message import Message

if TYPE_CHECKING:
    from .addresses import NsqdAddress

__all__ = ["NSQConnection", "ConnectionDelegate", "connect", "dial", "new_connection", "Connector"]

log = Logger(namespace="nsqtw.client")

_NOP = commands.NOP
_TS_ATTEMPTS = struct.Struct(">qH").unpack_from

#: ``connector(address, protocol) -> Deferred[protocol]``: how a connection is dialed
Connector = Callable[[Any, Protocol], defer.Deferred[Any]]


class ConnectionDelegate:
    """What an owner hears from its connections (every method optional)."""

    def on_message(self, conn: NSQConnection, msg: Message) -> None:
        """A message arrived (counted in flight until answered)."""

    def on_response(self, conn: NSQConnection, data: bytes) -> None:
        """A response no pending command was waiting for."""

    def on_error(self, conn: NSQConnection, err: NSQError) -> None:
        """An error frame no pending command took (non-fatal ones always come here)."""

    def on_heartbeat(self, conn: NSQConnection) -> None:
        """``_heartbeat_`` arrived (NOP already sent)."""

    def on_message_finished(self, conn: NSQConnection, msg: Message) -> None:
        """A FIN is about to be written."""

    def on_message_requeued(self, conn: NSQConnection, msg: Message, backoff: bool) -> None:
        """A REQ is about to be written."""

    def on_close(self, conn: NSQConnection, reason: Failure) -> None:
        """The connection is gone (after a successful handshake or not)."""


class NSQConnection(Protocol):
    """A V2 client connection (consumer and producer alike)."""

    #: the reactor's TCP transport (producer/consumer and TLS methods beyond ITransport), or a test's fake
    transport: Any

    def __init__(self, config: Config, address: str, delegate: ConnectionDelegate | None = None,
                 clock: IReactorTime | None = None, *, host: str = "") -> None:
        self.config = config
        self.address = address
        self.host = host or address.rpartition(":")[0].strip("[]")
        self.delegate = delegate or ConnectionDelegate()
        if clock is None:
            from ..runtime.reactor import resolve_reactor
            clock = resolve_reactor()
        self.clock = clock
        self.core = ClientCore(config)
        #: fires with this connection once IDENTIFY (and any upgrade, AUTH) is done
        self.handshake: defer.Deferred[NSQConnection] = defer.Deferred(lambda _: self.abort())
        #: fires (with None; see ``close_reason``) when the connection is gone
        self.closed: defer.Deferred[None] = defer.Deferred()
        self._open = False
        self.ready = False
        self.closing = False
        self.lost = False
        self.close_reason: Failure | None = None
        self._pending: deque[defer.Deferred[bytes]] = deque()
        self._idle_waiters: list[defer.Deferred[None]] = []
        self._last_read = 0.0
        self._timeout = 0.0
        self._deadline: Any = None
        self._write_stall: Any = None
        self._fatal: Exception | None = None
        self._producing = False
        self._close_guard: Any = None
        #: commands written while a read is being handled go out as one write after it
        self._batch: list[bytes] | None = None
        #: the eager write and reused-buffer read on a plain TCP connection once it is ready
        #: (nsqtw.runtime.seam): a heartbeat's NOP or a FIN is one send(), not a buffered write
        #: and two epoll changes in the next reactor turn
        self._seam: Any = None
        # consumer bookkeeping (go-nsq Conn fields), read and written by the RDY logic
        self.rdy = 0
        self.last_rdy_time = 0.0
        self.last_msg_time = self.clock.seconds()
        self.in_flight = 0
        self.messages_received = 0

    # --- what the RDY logic reads --------------------------------------------------

    @property
    def max_rdy_count(self) -> int:
        """nsqd's ``max_rdy_count`` from the IDENTIFY response."""
        return self.core.max_rdy_count

    @property
    def identify_response(self) -> dict[str, Any] | None:
        """nsqd's IDENTIFY response (a dict), or None before it came or when nsqd sent ``OK``."""
        return self.core.identify_response

    @property
    def msg_timeout(self) -> float | None:
        """nsqd's message timeout for this connection, in seconds, from the IDENTIFY response."""
        return self.core.msg_timeout

    def is_closing(self) -> bool:
        """Whether the connection is closing or closed."""
        return self.closing or self.lost

    @property
    def is_open(self) -> bool:
        """Connected (the handshake may still be running); False once lost."""
        return self._open

    def write_rdy(self, count: int) -> None:
        """Send ``RDY count``."""
        self.send(commands.rdy(count))

    # --- lifecycle -------------------------------------------------------------------

    def connectionMade(self) -> None:
        """Twisted: connected; sends the magic and IDENTIFY and arms the read timeout."""
        self._open = True
        now = self.clock.seconds()
        self._last_read = now
        self.last_msg_time = now
        self._timeout = self.config.read_timeout
        self._arm_deadline(self._timeout)
        nodelay = getattr(self.transport, "setTcpNoDelay", None)
        if nodelay is not None:
            # Go's TCP connections default to TCP_NODELAY; without it a small command (RDY 1
            # after a backoff) can wait ~40 ms for the peer's delayed ACK (Nagle)
            try:
                nodelay(True)
            except Exception:  # pragma: no cover - a transport without the socket option
                pass
        register = getattr(self.transport, "registerProducer", None)
        if register is not None:
            try:
                register(self, True)
                self._producing = True
            except Exception:  # pragma: no cover - a transport that refuses producers
                pass
        self.transport.write(self.core.start())

    def connectionLost(self, reason: Failure | None = None) -> None:
        """Twisted: the connection is gone; pending commands fail and the delegate's ``on_close`` is
        called."""
        if reason is None:
            reason = Failure(ierror.ConnectionDone())
        self._open = False
        self.lost = True
        self.ready = False
        self._detach_seam()
        self.core.close()
        for call in (self._deadline, self._write_stall, self._close_guard):
            if call is not None and call.active():
                call.cancel()
        self._deadline = self._write_stall = self._close_guard = None
        cause = self._fatal
        if cause is not None and not isinstance(cause, NSQError):
            reason = Failure(cause)
        self.close_reason = reason
        why = reason.getErrorMessage() if reason is not None else "closed"
        pending, self._pending = self._pending, deque()
        # the owner hears first, so that a retry from an errback below dials anew
        self.delegate.on_close(self, reason)
        for d in pending:
            d.errback(NotConnected(f"connection closed before the answer ({why})"))
        self._fire_idle()
        if not self.handshake.called:
            if cause is not None:
                err: Exception = cause
            else:
                err = NotConnected(f"connection to {self.address} closed during the handshake ({why})")
            self.handshake.errback(err)
        if not self.closed.called:
            self.closed.callback(None)

    def close(self) -> None:
        """Graceful close: wait for the messages in flight to be answered, then hang up."""
        self.closing = True
        if self.in_flight <= 0 and self._open:
            self._hang_up()

    def _write(self, data: bytes) -> None:
        batch = self._batch
        if batch is not None:
            batch.append(data)
        elif self._open:
            seam = self._seam
            (seam.write if seam is not None else self.transport.write)(self.core.encode(data))

    def _flush_batch(self) -> None:
        batch = self._batch
        if batch:
            self._batch = []
            if self._open and not self.lost:
                seam = self._seam
                (seam.write if seam is not None else self.transport.write)(self.core.encode(b"".join(batch)))

    def _detach_seam(self) -> None:
        seam, self._seam = self._seam, None
        if seam is not None:
            seam.detach()

    def _hang_up(self) -> None:
        """loseConnection, after unregistering as the transport's producer (TLS waits for that)."""
        self._flush_batch()
        transport = self.transport
        if self._close_guard is None and not self.lost:
            # a peer that never completes the close (a TLS close_notify unanswered) is cut off
            self._close_guard = self.clock.callLater(max(self.config.read_timeout, 1.0), self.abort)
        if self._producing:
            self._producing = False
            try:
                transport.unregisterProducer()
            except Exception:  # pragma: no cover - a transport without producers
                pass
        transport.loseConnection()

    def abort(self, reason: Exception | None = None) -> None:
        """Close now; pending commands fail."""
        if reason is not None and self._fatal is None:
            self._fatal = reason
        if self._batch:
            self._batch = []
        self.closing = True
        if self._open:
            abort = getattr(self.transport, "abortConnection", None)
            if abort is not None:
                abort()
            else:  # pragma: no cover - transports without abort
                self._hang_up()

    # --- writing --------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        """Write a command that expects no response (NOP, RDY, FIN, REQ, TOUCH)."""
        if not self.ready or not self._open:
            raise NotConnected(f"not connected to {self.address}")
        self._write(data)

    def command(self, data: bytes) -> defer.Deferred[bytes]:
        """Write a command that expects a response; fires with it (FIFO matching)."""
        if not self.ready or not self._open:
            return defer.fail(NotConnected(f"not connected to {self.address}"))
        d: defer.Deferred[bytes] = defer.Deferred()
        self._pending.append(d)
        self._write(data)
        return d

    @property
    def pending(self) -> int:
        """Commands written and not answered yet."""
        return len(self._pending)

    def when_idle(self) -> defer.Deferred[None]:
        """Fires once no command awaits its answer."""
        if not self._pending:
            return defer.succeed(None)
        d: defer.Deferred[None] = defer.Deferred()
        self._idle_waiters.append(d)
        return d

    def _fire_idle(self) -> None:
        waiters, self._idle_waiters = self._idle_waiters, []
        for d in waiters:
            d.callback(None)

    # --- the transport's producer hooks: a stalled write is the write timeout ------------

    def pauseProducing(self) -> None:
        """Twisted (IPushProducer): the transport's buffer is full; the write timeout starts."""
        if self._write_stall is None and self._open:
            self._write_stall = self.clock.callLater(self.config.write_timeout, self._write_timed_out)

    def resumeProducing(self) -> None:
        """Twisted (IPushProducer): the buffer drained; the write timeout is cancelled."""
        call, self._write_stall = self._write_stall, None
        if call is not None and call.active():
            call.cancel()

    def stopProducing(self) -> None:
        """Twisted (IPushProducer): the transport stops; as :meth:`resumeProducing`."""
        self.resumeProducing()

    def _write_timed_out(self) -> None:
        self._write_stall = None
        log.warn("({addr}) write timed out after {t}s", addr=self.address, t=self.config.write_timeout)
        self.abort(NotConnected("i/o timeout (write)"))

    # --- liveness -------------------------------------------------------------------------

    def _arm_deadline(self, delay: float) -> None:
        if self._deadline is not None and self._deadline.active():
            self._deadline.cancel()
        self._deadline = self.clock.callLater(delay, self._check_deadline) if delay > 0 else None

    def _check_deadline(self) -> None:
        """Nothing read for the whole timeout: the server is gone (go-nsq's read deadline)."""
        self._deadline = None
        remaining = self._last_read + self._timeout - self.clock.seconds()
        if remaining > 1e-9:
            self._deadline = self.clock.callLater(remaining, self._check_deadline)
            return
        what = "heartbeats" if self.ready else "the IDENTIFY answer"
        log.warn("({addr}) nothing read for {t}s (waiting for {what}); closing",
                 addr=self.address, t=self._timeout, what=what)
        self.abort(NotConnected(f"i/o timeout: nothing read from {self.address} for {self._timeout:g}s"))

    # --- reading ---------------------------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        """Twisted: bytes from nsqd; frames are decoded and dispatched, answers written once per read."""
        self._last_read = self.clock.seconds()
        if not self.ready or self._batch is not None:
            self._dispatch(data)  # the handshake writes as it goes (upgrades change the encoding)
            return
        self._batch = []
        try:
            self._dispatch(data)
        finally:
            self._flush_batch()
            self._batch = None

    def _dispatch(self, data: bytes) -> None:
        for ftype, payload in self.core.receive(data):
            if self._fatal is not None or self.lost:
                return  # after a fatal error or an abort nothing more is read
            if ftype == FRAME_MESSAGE:
                self._on_message(payload)
            elif ftype == FRAME_RESPONSE:
                if payload == HEARTBEAT:
                    self._write(_NOP)
                    self.delegate.on_heartbeat(self)
                elif self._pending:
                    d = self._pending.popleft()
                    if not self._pending:
                        self._fire_idle()
                    d.callback(payload)
                else:
                    self.delegate.on_response(self, payload)
            elif ftype == FRAME_ERROR:
                self._on_error_frame(payload)
            elif ftype == EV_WRITE:
                self.transport.write(payload)
            elif ftype == EV_START_TLS:
                self._start_tls()
            elif ftype == EV_READY:
                self._on_ready()
            elif ftype == EV_FAILED:
                self._fail_handshake(payload)
                return
            else:
                self.abort(ProtocolError(f"unknown frame type {ftype}"))
                return

    def _on_message(self, payload: bytes) -> None:
        if len(payload) < MIN_MESSAGE_LENGTH:
            self.abort(ProtocolError(f"invalid message buffer size ({len(payload)})"))
            return
        ts, attempts = _TS_ATTEMPTS(payload, 0)
        msg = Message(payload[10:26], payload[26:], ts, attempts, self, self.address)
        self.in_flight += 1
        self.messages_received += 1
        self.last_msg_time = self._last_read
        self.delegate.on_message(self, msg)

    def _on_error_frame(self, payload: bytes) -> None:
        err = from_wire(payload)
        if not err.fatal:
            log.info("({addr}) protocol error - {err}", addr=self.address, err=payload.decode("utf-8", "replace"))
            self.delegate.on_error(self, err)
            return
        log.warn("({addr}) protocol error - {err}", addr=self.address, err=payload.decode("utf-8", "replace"))
        # nsqd closes after a fatal error; so do we (later pending commands fail as not
        # connected).  Marked before any callback runs, so that a retry dials anew.
        self._fatal = err
        self.closing = True
        self.ready = False
        if self._open:
            self._hang_up()
        if self._pending:
            d = self._pending.popleft()
            if not self._pending:
                self._fire_idle()
            d.errback(err)
        else:
            self.delegate.on_error(self, err)

    def _on_ready(self) -> None:
        self.ready = True
        if self._seam is None and self._open:
            from ..runtime import seam
            self._seam = seam.attach_client(self.transport, self.dataReceived)
        hb = self.config.heartbeat_interval
        self._timeout = 2 * hb if hb > 0 else self.config.read_timeout
        self._arm_deadline(self._timeout)
        if not self.handshake.called:
            self.handshake.callback(self)

    def _fail_handshake(self, err: Exception) -> None:
        log.warn("({addr}) {err}", addr=self.address, err=err)
        self.abort(err)

    def _start_tls(self) -> None:
        start = getattr(self.transport, "startTLS", None)
        if start is None:
            self._fail_handshake(IdentifyError("TLS negotiated but this transport cannot start TLS"))
            return
        from .tls import client_tls_options
        try:
            options = client_tls_options(self.config, self.host)
        except Exception as e:
            self._fail_handshake(IdentifyError(f"TLS setup failed: {e}"))
            return
        start(options)

    # --- answers to messages (called by Message) -------------------------------------------

    def _answered(self) -> None:
        self.in_flight -= 1
        if self.in_flight <= 0 and self.closing and self._open:
            self._hang_up()

    def _write_answer(self, data: bytes) -> None:
        if self._open and not self.lost:
            self._write(data)

    def on_message_finish(self, msg: Message) -> None:
        """Message callback: send FIN for ``msg``."""
        self.delegate.on_message_finished(self, msg)
        self._write_answer(commands.fin(msg.id))
        self._answered()

    def on_message_requeue(self, msg: Message, delay: float | None, backoff: bool) -> None:
        """Message callback: send REQ for ``msg`` (``delay`` None: the config's requeue delay)."""
        if delay is None or delay < 0:
            delay = self.config.requeue_delay(msg.attempts)
        self.delegate.on_message_requeued(self, msg, backoff)
        self._write_answer(commands.req(msg.id, delay))
        self._answered()

    def on_message_touch(self, msg: Message) -> None:
        """Message callback: send TOUCH for ``msg``."""
        self._write_answer(commands.touch(msg.id))

    def __repr__(self) -> str:
        return f"<NSQConnection {self.address} rdy={self.rdy} in_flight={self.in_flight}>"


def connect(address: NsqdAddress, config: Config, delegate: ConnectionDelegate | None = None, *,
            reactor: Clock = None, connector: Connector | None = None) -> defer.Deferred[NSQConnection]:
    """Dial ``address`` and run the handshake; fires with the ready :class:`NSQConnection`."""
    return dial(new_connection(address, config, delegate, reactor), address, connector=connector)


def new_connection(address: NsqdAddress, config: Config, delegate: ConnectionDelegate | None = None,
                   reactor: Any = None) -> NSQConnection:
    """A not yet dialed connection for ``address`` (any address form)."""
    from ..runtime.reactor import resolve_reactor
    from .addresses import address_key, tls_host

    return NSQConnection(config, address_key(address), delegate, resolve_reactor(reactor),
                         host=tls_host(address))


def dial(proto: NSQConnection, address: NsqdAddress, *, connector: Connector | None = None) -> defer.Deferred[NSQConnection]:
    """Connect ``proto`` to ``address``; fires with it once the handshake is done.

    Dial failures become :class:`~nsqtw.client.errors.NotConnected`; handshake failures keep their
    type (:class:`~nsqtw.client.errors.IdentifyError`, a typed AUTH error ...).
    """
    from .addresses import default_connector

    do_dial = connector or default_connector(proto.clock, proto.config)
    d = defer.maybeDeferred(do_dial, address, proto)

    def dialed(_: object) -> defer.Deferred[NSQConnection]:
        return proto.handshake

    def failed(f: Failure) -> Failure:
        if f.check(ClientError, NSQError, defer.CancelledError):
            return f
        err = NotConnected(f"dial {proto.address}: {f.getErrorMessage()}")
        err.__cause__ = f.value
        return Failure(err)

    d.addCallback(dialed)
    d.addErrback(failed)
    return d
