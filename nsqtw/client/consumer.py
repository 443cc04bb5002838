"""
Consuming a topic's channel from many nsqd (go-nsq ``consumer.go``).

A :class:`Consumer` subscribes one connection per nsqd, found directly
(:meth:`Consumer.connect_to_nsqd`) or through nsqlookupd
(:meth:`Consumer.connect_to_nsqlookupd`), and hands each message to the
handler.  The handler returns a value or a Deferred (or a coroutine), or
raises: success FINs the message, failure REQs it with go-nsq's delay
(``default_requeue_delay × attempts``, capped by ``max_requeue_delay``) and
signals backoff.  A message delivered more than ``max_attempts`` times goes
to the give-up hook and is FINed without calling the handler.  At most
``concurrency`` handlers run at once; the others wait in arrival order.

Flow control (RDY) and backoff are :class:`~nsqtw.client.rdy.RdyController`'s.
:meth:`Consumer.stop` is go-nsq's graceful stop: CLS on every connection,
each one closes once its messages are answered, then the handlers finish; a
hard stop follows after 30 s.

::

    def handle(message):
        print(message.body)

    consumer = Consumer("events", "archive", handle, Config(max_in_flight=10))
    await consumer.connect_to_nsqd("127.0.0.1:4150")
    ...
    await consumer.stop()
"""

from __future__ import annotations

import inspect
import random
from collections import deque
from typing import Any
from collections.abc import Callable

import attr
from twisted.internet import defer, task
from twisted.logger import Logger
from twisted.python.failure import Failure

from ..errors import NSQError
from ..protocol.frames import CLOSE_WAIT
from ..protocol.names import is_valid_name
from ..runtime.reactor import Clock, TreqClient, resolve_reactor
from . import commands
from .addresses import NsqdAddress, address_key
from .config import Config
from .connection import ConnectionDelegate, Connector, NSQConnection, dial, new_connection
from .discovery import build_lookup_url, query_lookupd
from .errors import AlreadyConnected, ConfigError, NotConnected, Stopped
from ._once import Once
from .message import Message
from .rdy import BACKOFF, CONTINUE, RESUME, RdyController

__all__ = ["Consumer", "ConsumerStats", "HARD_STOP_TIMEOUT"]

log = Logger(namespace="nsqtw.client")

#: go-nsq gives up waiting for a graceful stop after 30 s
HARD_STOP_TIMEOUT = 30.0

Handler = Callable[[Message], Any]


@attr.s(frozen=True, slots=True, auto_attribs=True)
class ConsumerStats:
    """go-nsq ``ConsumerStats``."""

    messages_received: int
    messages_finished: int
    messages_requeued: int
    connections: int


class Consumer(ConnectionDelegate):
    """Subscribe ``topic``/``channel`` on many nsqd and run ``handler`` for each message."""

    def __init__(self, topic: str, channel: str, handler: Handler, config: Config | None = None, *,
                 concurrency: int = 1, give_up: Callable[[Message], Any] | None = None,
                 reactor: Clock = None, rng: random.Random | None = None,
                 connector: Connector | None = None, http_client: TreqClient = None,
                 discovery_filter: Callable[[list[str]], list[str]] | None = None) -> None:
        if not is_valid_name(topic):
            raise ConfigError("invalid topic name")
        if not is_valid_name(channel):
            raise ConfigError("invalid channel name")
        if concurrency < 1:
            raise ConfigError("concurrency must be >= 1")
        config = (config or Config()).copy()
        config.validate()
        self.topic = topic
        self.channel = channel
        self.handler = handler
        self.config = config
        self.concurrency = concurrency
        self.give_up = give_up if give_up is not None else getattr(handler, "log_failed_message", None)
        self.reactor = resolve_reactor(reactor)
        self.rng = rng or random.Random()
        self.rdy = RdyController(config, self.reactor, self.rng)
        self.discovery_filter = discovery_filter
        self._connector = connector
        self._http_client = http_client
        self.pending_connections: dict[str, NSQConnection] = {}
        #: every nsqd address asked for (directly or found by lookupd): reconnect while listed
        self.nsqd_addresses: list[str] = []
        self._targets: dict[str, Any] = {}
        self.lookupd_urls: list[str] = []
        self._lookupd_index = 0
        self._querying: Once | None = None
        self._requery = False
        self._recheck_call: Any = None
        self._jitter_call: Any = None
        self._poll_group: Any = None
        self._rdy_loop: task.LoopingCall | None = None
        self._reconnect_calls: dict[str, Any] = {}
        self._queue: deque[Message] = deque()
        self._running = 0
        self._pumping = False
        self.messages_received = 0
        self.messages_finished = 0
        self.messages_requeued = 0
        self.messages_given_up = 0
        self._stopping = False
        self._stop_done: Once | None = None
        self._hard_stop_call: Any = None

    # --- inspection -------------------------------------------------------------------------

    @property
    def connections(self) -> dict[str, NSQConnection]:
        """Subscribed connections by address."""
        return self.rdy.conns

    def stats(self) -> ConsumerStats:
        """The counts so far: messages received, finished and requeued, and open connections."""
        return ConsumerStats(self.messages_received, self.messages_finished,
                             self.messages_requeued, len(self.rdy.conns))

    def is_starved(self) -> bool:
        """A connection's in-flight count reached 85% of its RDY (time to flush a batch)."""
        return self.rdy.is_starved()

    def in_backoff(self) -> bool:
        """Whether the consumer is backing off (RDY 0 everywhere, or 1 while testing)."""
        return self.rdy.in_backoff()

    @property
    def max_in_flight(self) -> int:
        """The current ``max_in_flight`` (see :meth:`change_max_in_flight`)."""
        return self.rdy.max_in_flight

    def change_max_in_flight(self, max_in_flight: int) -> None:
        """Resize the total RDY (0 pauses the flow)."""
        self.rdy.change_max_in_flight(max_in_flight)

    @property
    def stopping(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._stopping

    # --- nsqd -------------------------------------------------------------------------------

    def connect_to_nsqd(self, address: NsqdAddress) -> defer.Deferred[NSQConnection]:
        """Connect and SUB; fires with the connection once nsqd answered the SUB.

        While the address stays configured (no ``disconnect_from_nsqd``) and no
        lookupd is in use, a dropped connection is re-dialed every
        ``lookupd_poll_interval``.
        """
        if self._stopping:
            return defer.fail(Stopped("consumer stopped"))
        try:
            key = address_key(address)
        except ConfigError:
            return defer.fail()
        if key in self.pending_connections or key in self.rdy.conns:
            return defer.fail(AlreadyConnected(key))
        self._start_rdy_loop()
        if key not in self.nsqd_addresses:
            self.nsqd_addresses.append(key)
        self._targets[key] = address
        log.info("({addr}) connecting to nsqd", addr=key)
        conn = new_connection(address, self.config, self, self.reactor)
        self.pending_connections[key] = conn
        d = dial(conn, address, connector=self._connector)

        def connected(conn: NSQConnection) -> defer.Deferred[NSQConnection]:
            if self.pending_connections.get(key) is conn:
                del self.pending_connections[key]
            if self._stopping:
                conn.close()
                raise Stopped("consumer stopped")
            if conn.max_rdy_count < self.rdy.max_in_flight:
                log.warn("({addr}) max RDY count {m} < consumer max in flight {n}, truncation possible",
                         addr=key, m=conn.max_rdy_count, n=self.rdy.max_in_flight)
            subscribed = conn.command(commands.sub(self.topic, self.channel))
            self.rdy.add(conn)
            return subscribed.addCallback(lambda _: conn)

        def failed(f: Failure) -> Failure:
            if self.pending_connections.get(key) is conn:
                del self.pending_connections[key]
            log.warn("({addr}) error connecting to nsqd - {err}", addr=key, err=f.getErrorMessage())
            return f

        subscribed: defer.Deferred[NSQConnection] = d.addCallbacks(connected, failed)
        return subscribed

    def connect_to_nsqds(self, addresses: list[NsqdAddress]) -> defer.Deferred[list[NSQConnection]]:
        """:meth:`connect_to_nsqd` for each address; fires with the connections once all are subscribed."""
        return defer.gatherResults([self.connect_to_nsqd(a) for a in addresses], consumeErrors=True)

    def disconnect_from_nsqd(self, address: NsqdAddress) -> None:
        """Forget the address and close its connection (gracefully)."""
        key = address_key(address)
        if key not in self.nsqd_addresses:
            raise NotConnected(f"not connected to {key}")
        self.nsqd_addresses.remove(key)
        self._targets.pop(key, None)
        call = self._reconnect_calls.pop(key, None)
        if call is not None and call.active():
            call.cancel()
        conn = self.rdy.conns.get(key)
        if conn is not None:
            conn.close()
        elif key in self.pending_connections:
            self.pending_connections[key].abort()

    def _schedule_reconnect(self, key: str) -> None:
        if key in self._reconnect_calls or self._stopping:
            return
        delay = self.config.lookupd_poll_interval
        log.info("({addr}) re-connecting in {d}s", addr=key, d=delay)
        self._reconnect_calls[key] = self.reactor.callLater(delay, self._reconnect, key)

    def _reconnect(self, key: str) -> None:
        self._reconnect_calls.pop(key, None)
        if self._stopping:
            return
        if key not in self.nsqd_addresses:
            log.warn("({addr}) skipped reconnect after removal...", addr=key)
            return
        d = self.connect_to_nsqd(self._targets.get(key, key))

        def failed(f: Failure) -> None:
            if f.check(AlreadyConnected, Stopped):
                return
            if key in self.rdy.conns:
                return  # connected but the SUB was refused: its close schedules the next try
            self._schedule_reconnect(key)

        d.addErrback(failed)

    # --- nsqlookupd ----------------------------------------------------------------------------

    def connect_to_nsqlookupd(self, address: str) -> defer.Deferred[None]:
        """Add a lookupd (``host:port`` or a URL); the first one starts polling.

        Fires once the first query has been answered (or has failed: a lookupd
        that is down or answers garbage is logged and polled again later).
        """
        if self._stopping:
            return defer.fail(Stopped("consumer stopped"))
        try:
            url = build_lookup_url(address, self.topic)
        except ConfigError:
            return defer.fail()
        if url in self.lookupd_urls:
            return defer.succeed(None)
        self.lookupd_urls.append(url)
        self._start_rdy_loop()
        if len(self.lookupd_urls) > 1:
            self._regroup()
            return defer.succeed(None)
        d = self._query_lookupd()
        jitter = self.rng.random() * self.config.lookupd_poll_jitter * self.config.lookupd_poll_interval
        self._jitter_call = self.reactor.callLater(jitter, self._start_lookupd_loop)
        return d

    def connect_to_nsqlookupds(self, addresses: list[str]) -> defer.Deferred[list[None]]:
        """:meth:`connect_to_nsqlookupd` for each address."""
        return defer.gatherResults([self.connect_to_nsqlookupd(a) for a in addresses], consumeErrors=True)

    def disconnect_from_nsqlookupd(self, address: str) -> None:
        """Stop polling one nsqlookupd (raises ``NotConnected`` for an unknown one, ``ConfigError`` for
        the last one)."""
        url = build_lookup_url(address, self.topic)
        if url not in self.lookupd_urls:
            raise NotConnected(f"not connected to {address}")
        if len(self.lookupd_urls) == 1:
            raise ConfigError(f"cannot disconnect from only remaining nsqlookupd HTTP address {address}")
        self.lookupd_urls.remove(url)
        self._regroup()

    def _poll_key(self) -> tuple[Any, ...]:
        """What consumers must have in common to share the periodic poll (nsqtw.client.polling)."""
        auth = self.config.auth_secret if self.config.skip_lookupd_authorization else ""
        return (self.topic, tuple(sorted(self.lookupd_urls)), self.config.lookupd_poll_interval,
                self.config.lookupd_poll_timeout, auth, id(self._http_client) if self._http_client else None)

    def _start_lookupd_loop(self) -> None:
        self._jitter_call = None
        if self._stopping:
            return
        from .polling import join_poll_group
        self._poll_group = join_poll_group(self, self._poll_key())

    def _regroup(self) -> None:
        """The lookupd addresses changed: move to the group of the new set."""
        group = self._poll_group
        if group is not None and group.key != self._poll_key():
            group.leave(self)
            self._poll_group = None
            self._start_lookupd_loop()

    def _leave_poll_group(self) -> None:
        group, self._poll_group = self._poll_group, None
        if group is not None:
            group.leave(self)


    def _recheck_lookupd(self) -> None:
        """A connection closed: ask lookupd again right away (go-nsq ``lookupdRecheckChan``)."""
        if self._recheck_call is None and not self._stopping:
            self._recheck_call = self.reactor.callLater(0, self._run_recheck)

    def _run_recheck(self) -> None:
        self._recheck_call = None
        self._query_lookupd()

    def _next_lookupd(self) -> str:
        if self._lookupd_index >= len(self.lookupd_urls):
            self._lookupd_index = 0
        url = self.lookupd_urls[self._lookupd_index]
        self._lookupd_index = (self._lookupd_index + 1) % len(self.lookupd_urls)
        return url

    def _http(self) -> Any:
        if self._http_client is None:
            from treq.client import HTTPClient
            from twisted.web.client import Agent, HTTPConnectionPool
            pool = HTTPConnectionPool(self.reactor, persistent=False)
            self._http_client = HTTPClient(Agent(self.reactor, pool=pool))
        return self._http_client

    def _query_lookupd(self, others: list[Consumer] | None = None) -> defer.Deferred[Any]:
        """One poll: one lookupd (round-robin), up to 3 tries; then connect to what it lists
        (and so does each of ``others``)."""
        if self._stopping or not self.lookupd_urls:
            return defer.succeed(None)
        if self._querying is not None:
            self._requery = True
            return self._querying.when()
        done = Once()
        self._querying = done
        headers = {}
        if self.config.auth_secret and self.config.skip_lookupd_authorization:
            headers["Authorization"] = f"Bearer {self.config.auth_secret}"

        def attempt(tries: int) -> None:
            url = self._next_lookupd()
            log.info("querying nsqlookupd {url}", url=url)
            try:
                d = query_lookupd(self._http(), url, headers=headers,
                                  timeout=self.config.lookupd_poll_timeout, clock=self.reactor)
            except Exception:
                d = defer.fail()

            def failed(f: Failure) -> None:
                log.warn("error querying nsqlookupd ({url}) - {err}", url=url, err=f.getErrorMessage())
                if tries + 1 < 3 and not self._stopping:
                    attempt(tries + 1)
                else:
                    finish(None)

            d.addCallbacks(found, failed)

        def found(addresses: list[str]) -> None:
            for consumer in (self, *(others or ())):
                consumer._connect_discovered(addresses)
            finish(None)

        def finish(_: Any) -> None:
            self._querying = None
            done.fire(None)
            if self._requery:
                self._requery = False
                self._recheck_lookupd()

        result = done.when()
        attempt(0)
        return result

    def _connect_discovered(self, addresses: list[str]) -> None:
        """Connect to the nsqd a lookupd listed that this consumer lacks (after its filter)."""
        if self.discovery_filter is not None:
            addresses = list(self.discovery_filter(addresses))
        for addr in addresses:
            if self._stopping:
                break
            if addr in self.rdy.conns or addr in self.pending_connections:
                continue
            self.connect_to_nsqd(addr).addErrback(self._discovered_failed, addr)

    def _discovered_failed(self, f: Failure, addr: str) -> None:
        if not f.check(AlreadyConnected, Stopped):
            log.warn("({addr}) error connecting to nsqd - {err}", addr=addr, err=f.getErrorMessage())

    # --- timers ---------------------------------------------------------------------------------

    def _start_rdy_loop(self) -> None:
        if self._rdy_loop is not None:
            return
        loop = task.LoopingCall(self._redistribute)
        loop.clock = self.reactor
        self._rdy_loop = loop
        loop.start(self.config.rdy_redistribute_interval, now=False)

    def _redistribute(self) -> None:
        try:
            self.rdy.redistribute()
        except Exception:
            log.failure("RDY redistribution failed")

    # --- ConnectionDelegate -------------------------------------------------------------------

    def on_message(self, conn: NSQConnection, msg: Message) -> None:
        """Connection callback: a message arrived; it is queued for the handler."""
        self.messages_received += 1
        self._queue.append(msg)
        self._pump()

    def on_message_finished(self, conn: NSQConnection, msg: Message) -> None:
        """Connection callback: a message was finished; RDY may grow again."""
        self.messages_finished += 1
        self.rdy.signal(RESUME)

    def on_message_requeued(self, conn: NSQConnection, msg: Message, backoff: bool) -> None:
        """Connection callback: a message was requeued; with ``backoff`` the consumer backs off."""
        self.messages_requeued += 1
        self.rdy.signal(BACKOFF if backoff else CONTINUE)

    def on_response(self, conn: NSQConnection, data: bytes) -> None:
        """Connection callback: a response frame (``CLOSE_WAIT`` after CLS closes the connection)."""
        if data == CLOSE_WAIT:
            # nsqd acknowledged CLS: no more messages; close once ours are answered
            conn.close()
        else:
            log.info("({addr}) unexpected response {data!r}", addr=conn.address, data=data[:32])

    def on_error(self, conn: NSQConnection, err: NSQError) -> None:
        """Connection callback: an error frame (the connection logs it and closes on a fatal one)."""
        pass  # logged by the connection; fatal ones close it

    def on_close(self, conn: NSQConnection, reason: Failure) -> None:
        """Connection callback: a connection closed; it is reconnected unless the consumer is stopping."""
        key = conn.address
        subscribed = self.rdy.conns.get(key) is conn
        if subscribed:
            self.rdy.remove(conn)
            log.warn("({addr}) connection closed ({why}); {n} connections left", addr=key,
                     why=reason.getErrorMessage(), n=len(self.rdy.conns))
        if self.pending_connections.get(key) is conn:
            del self.pending_connections[key]
        if self._stopping:
            if not self.rdy.conns and not self.pending_connections:
                self._stop_handlers()
            return
        if not subscribed:
            return
        if self.lookupd_urls:
            self._recheck_lookupd()
        elif key in self.nsqd_addresses:
            self._schedule_reconnect(key)

    # --- handlers -------------------------------------------------------------------------------

    def _pump(self) -> None:
        if self._pumping:
            return
        self._pumping = True
        try:
            queue = self._queue
            while queue and self._running < self.concurrency:
                self._running += 1
                self._handle(queue.popleft())
        finally:
            self._pumping = False

    def _should_give_up(self, msg: Message) -> bool:
        limit = self.config.max_attempts
        return limit > 0 and msg.attempts > limit

    def _handle(self, msg: Message) -> None:
        if self._should_give_up(msg):
            log.warn("msg {id} attempted {n} times, giving up", id=msg.id.decode("ascii", "replace"),
                     n=msg.attempts)
            self.messages_given_up += 1
            if self.give_up is not None:
                try:
                    self.give_up(msg)
                except Exception:
                    log.failure("give-up hook failed for {id}", id=msg.id.decode("ascii", "replace"))
            msg.finish()
            self._handler_done()
            return
        try:
            result = self.handler(msg)
        except Exception:
            self._handler_failed(Failure(), msg)
            self._handler_done()
            return
        if result is not None and not isinstance(result, defer.Deferred) and inspect.isawaitable(result):
            # a coroutine in practice; ensureDeferred refuses other awaitables (NotAnEntryPoint)
            result = defer.ensureDeferred(result)  # type: ignore[arg-type]  # see above
        if isinstance(result, defer.Deferred):
            result.addCallbacks(self._handler_succeeded, self._handler_failed,
                                callbackArgs=(msg,), errbackArgs=(msg,))
            result.addBoth(self._handler_done)
            return
        self._handler_succeeded(result, msg)
        self._handler_done()

    def _handler_succeeded(self, result: Any, msg: Message) -> None:
        if msg.auto_response:
            msg.finish()

    def _handler_failed(self, f: Failure, msg: Message) -> None:
        log.failure("Handler returned error for msg {id}", failure=f, id=msg.id.decode("ascii", "replace"))
        if msg.auto_response:
            msg.requeue(None)

    def _handler_done(self, _: Any = None) -> None:
        self._running -= 1
        if self._queue:
            self._pump()
        elif self._running == 0 and self._stopping and self._handlers_stopping:
            self._exit()

    # --- stopping -----------------------------------------------------------------------------------

    _handlers_stopping = False

    def stop(self) -> defer.Deferred[None]:
        """Graceful stop; fires once every connection is closed and every handler done."""
        if self._stop_done is not None:
            return self._stop_done.when()
        self._stopping = True
        self._stop_done = Once()
        log.info("[{t}/{c}] stopping...", t=self.topic, c=self.channel)
        for call in list(self._reconnect_calls.values()):
            if call.active():
                call.cancel()
        self._reconnect_calls.clear()
        for call in (self._jitter_call, self._recheck_call):
            if call is not None and call.active():
                call.cancel()
        self._jitter_call = self._recheck_call = None
        self._leave_poll_group()
        for conn in list(self.pending_connections.values()):
            conn.abort(Stopped("consumer stopped"))
        conns = list(self.rdy.conns.values())
        if not conns:
            self._stop_handlers()
        else:
            for conn in conns:
                try:
                    d = conn.command(commands.cls())
                except Exception:
                    conn.close()
                    continue
                d.addCallbacks(self._cls_answered, self._cls_failed, callbackArgs=(conn,), errbackArgs=(conn,))
            self._hard_stop_call = self.reactor.callLater(HARD_STOP_TIMEOUT, self._hard_stop)
        return self._stop_done.when()

    def _cls_answered(self, data: bytes, conn: NSQConnection) -> None:
        if data != CLOSE_WAIT:
            log.warn("({addr}) CLS answered {data!r}", addr=conn.address, data=data[:32])
        conn.close()

    def _cls_failed(self, f: Failure, conn: NSQConnection) -> None:
        log.warn("({addr}) error sending CLS - {err}", addr=conn.address, err=f.getErrorMessage())
        conn.close()

    def _stop_handlers(self) -> None:
        """No connection left: wait for the handlers still running, then exit."""
        self._handlers_stopping = True
        if self._running == 0 and not self._queue:
            self._exit()

    def _hard_stop(self) -> None:
        self._hard_stop_call = None
        log.warn("[{t}/{c}] handlers still busy after {s}s; stopping anyway",
                 t=self.topic, c=self.channel, s=HARD_STOP_TIMEOUT)
        for conn in list(self.rdy.conns.values()) + list(self.pending_connections.values()):
            conn.abort(Stopped("hard stop"))
        self._queue.clear()
        self._exit()

    def _exit(self) -> None:
        if self._stop_done is None or self._stop_done.called:
            return
        if self._hard_stop_call is not None and self._hard_stop_call.active():
            self._hard_stop_call.cancel()
        self._hard_stop_call = None
        if self._rdy_loop is not None and self._rdy_loop.running:
            self._rdy_loop.stop()
        self.rdy.stop()
        log.info("[{t}/{c}] stopped", t=self.topic, c=self.channel)
        self._stop_done.fire(None)

    def __repr__(self) -> str:
        return f"<Consumer {self.topic}/{self.channel} conns={len(self.rdy.conns)}>"

