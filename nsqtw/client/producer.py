"""
Publishing to one nsqd over TCP (go-nsq ``producer.go``).

A :class:`Producer` is one nsqd address and at most one connection, dialed
lazily by the first command.  Commands are pipelined on it and each answer
is matched to its command in FIFO order: the Deferred of ``publish``,
``multi_publish`` and ``deferred_publish`` fires with ``None`` on ``OK`` and
fails with the typed error of nsqd's error frame (``BadTopic``,
``PubFailed`` ...), or with :class:`~nsqtw.client.errors.NotConnected` when
the connection is lost before the answer.  Like go-nsq there is no automatic
retry and no failover; the next command after a lost connection dials again.

::

    producer = Producer("127.0.0.1:4150")
    await producer.publish("events", b"hello")
    await producer.stop()
"""

from __future__ import annotations

from collections import deque
from typing import Any
from collections.abc import Iterable

from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from ..runtime.reactor import Clock, resolve_reactor
from . import commands
from .addresses import NsqdAddress, address_key
from .config import Config
from .connection import ConnectionDelegate, Connector, NSQConnection, connect
from ._once import Once
from .errors import NotConnected, Stopped

__all__ = ["Producer"]

log = Logger(namespace="nsqtw.client")


class Producer(ConnectionDelegate):
    """Pipelined PUB / MPUB / DPUB to one nsqd (TCP or the in-process bus)."""

    def __init__(self, address: NsqdAddress, config: Config | None = None, *, reactor: Clock = None,
                 connector: Connector | None = None) -> None:
        config = (config or Config()).copy()
        config.validate()
        self.config = config
        self.target = address
        self.address = address_key(address)
        self.reactor = resolve_reactor(reactor)
        self._connector = connector
        self.conn: NSQConnection | None = None
        self._connecting: defer.Deferred[NSQConnection] | None = None
        self._queue: deque[tuple[bytes, defer.Deferred[Any]]] = deque()
        self._stopped = False
        self._stop_done: Once | None = None

    # --- the API ----------------------------------------------------------------------

    def publish(self, topic: str, body: commands.Body) -> defer.Deferred[None]:
        """PUB; fires with None on OK."""
        return self._send(commands.pub(topic, body))

    def multi_publish(self, topic: str, bodies: Iterable[commands.Body]) -> defer.Deferred[None]:
        """MPUB (atomic on nsqd: all or none)."""
        return self._send(commands.mpub(topic, bodies))

    def deferred_publish(self, topic: str, delay: float, body: commands.Body) -> defer.Deferred[None]:
        """DPUB: delivered after ``delay`` seconds."""
        return self._send(commands.dpub(topic, delay, body))

    def ping(self) -> defer.Deferred[None]:
        """Connect if needed and write NOP (go-nsq ``Ping``); fires once the NOP is written."""
        if self._stopped:
            return defer.fail(Stopped())
        d = self._ready()

        def nop(conn: NSQConnection) -> None:
            conn.send(commands.nop())

        return d.addCallback(nop)

    @property
    def connected(self) -> bool:
        """Whether the connection to nsqd is open and identified."""
        return self.conn is not None and self.conn.ready

    @property
    def stopped(self) -> bool:
        """Whether :meth:`stop` was called (publishing then fails with ``Stopped``)."""
        return self._stopped

    def stop(self, timeout: float | None = None) -> defer.Deferred[None]:
        """Refuse new commands, wait for the answers of those sent (up to ``timeout``,
        default ``read_timeout``), then close.  Unsent ones fail with ``Stopped``."""
        if self._stop_done is not None:
            return self._stop_done.when()
        self._stopped = True
        done = self._stop_done = Once()
        result = done.when()
        queued, self._queue = self._queue, deque()
        for _, d in queued:
            d.errback(Stopped())
        if self._connecting is not None:
            self._connecting.cancel()
        conn = self.conn
        if conn is None or conn.lost:
            done.fire(None)
            return result
        limit = self.config.read_timeout if timeout is None else timeout
        idle = conn.when_idle()
        idle.addTimeout(limit, self.reactor)

        def close(_: Any) -> defer.Deferred[Any]:
            if conn.lost:
                return defer.succeed(None)
            if isinstance(_, Failure):
                log.warn("({addr}) stop: answers still pending after {t}s; closing",
                         addr=self.address, t=limit)
                conn.abort()
            else:
                conn.close()
            return conn.closed

        idle.addBoth(close)
        idle.addBoth(lambda _: done.fire(None))
        return result

    # --- sending ---------------------------------------------------------------------------

    def _send(self, cmd: bytes) -> defer.Deferred[None]:
        if self._stopped:
            return defer.fail(Stopped())
        conn = self.conn
        if conn is not None and conn.ready and not conn.closing:
            return conn.command(cmd).addCallback(_ok)
        d: defer.Deferred[Any] = defer.Deferred()
        self._queue.append((cmd, d))
        self._dial()
        return d.addCallback(_ok)

    def _ready(self) -> defer.Deferred[NSQConnection]:
        conn = self.conn
        if conn is not None and conn.ready and not conn.closing:
            return defer.succeed(conn)
        d: defer.Deferred[Any] = defer.Deferred()
        self._queue.append((b"", d))
        self._dial()
        return d

    def _dial(self) -> None:
        if self._connecting is not None:
            return
        log.info("({addr}) connecting to nsqd", addr=self.address)
        d = connect(self.target, self.config, self, reactor=self.reactor, connector=self._connector)
        self._connecting = d
        d.addCallbacks(self._connected, self._connect_failed)

    def _connected(self, conn: NSQConnection) -> None:
        self._connecting = None
        if self._stopped:
            conn.close()
            return
        self.conn = conn
        queued, self._queue = self._queue, deque()
        for cmd, d in queued:
            if not cmd:
                d.callback(conn)
            else:
                conn.command(cmd).chainDeferred(d)

    def _connect_failed(self, f: Failure) -> None:
        self._connecting = None
        if f.check(defer.CancelledError):
            f = Failure(Stopped())
        log.warn("({addr}) error connecting to nsqd - {err}", addr=self.address, err=f.getErrorMessage())
        queued, self._queue = self._queue, deque()
        for _, d in queued:
            d.errback(f)

    # --- ConnectionDelegate -------------------------------------------------------------------

    def on_response(self, conn: NSQConnection, data: bytes) -> None:
        """Connection callback: a response frame nobody waited for; the connection is closed."""
        log.error("({addr}) unexpected response {data!r}; closing", addr=self.address, data=data[:32])
        conn.abort(NotConnected("unexpected response"))

    def on_error(self, conn: NSQConnection, err: Exception) -> None:
        """Connection callback: an error frame; a fatal one is logged (the waiting publish fails with
        it)."""
        if getattr(err, "fatal", True):
            log.error("({addr}) unexpected error {err}; closing", addr=self.address, err=err)

    def on_close(self, conn: NSQConnection, reason: Failure) -> None:
        """Connection callback: the connection closed; the next publish connects again."""
        if self.conn is conn:
            self.conn = None

    def __repr__(self) -> str:
        return f"<Producer {self.address}{' stopped' if self._stopped else ''}>"


def _ok(_: Any) -> None:
    return None

