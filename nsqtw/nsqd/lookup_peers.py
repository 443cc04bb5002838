"""
nsqd as an nsqlookupd peer (``nsqd/lookup.go``, ``lookup_peer.go``).

:class:`LookupPeersService` keeps one connection per ``--lookupd-tcp-address``,
each owned by a Twisted ``ClientService`` that reconnects forever with
backoff.  On every (re)connect the peer sends the magic and IDENTIFY (nsqd's
``version``, ``tcp_port``, ``http_port``, ``hostname``, ``broadcast_address``),
remembers the lookupd's answer (its ``broadcast_address`` and ``http_port``
are where ``/channels`` is asked), then REGISTERs the whole broker: one
``REGISTER <topic>`` for a topic without channels, ``REGISTER <topic>
<channel>`` for every channel, ephemeral ones included.  So a restarted
nsqlookupd is repopulated as soon as nsqd reaches it again.

After that the broker's events become commands: a created topic or channel is
REGISTERed and a deleted one UNREGISTERed (a deleted topic is one
``UNREGISTER <topic>``: nsqlookupd then drops the topic's channels too).
While a peer is not identified its commands are dropped, not queued: the
replay on the next connect describes the broker as it is then.  Every 15 s
each peer is PINGed, which keeps it active in nsqlookupd's eyes.  Every
command must be answered within a second, as nsqd's read deadline demands, or
the connection is closed and made again.

Channel pre-creation (checklist T20): when a topic is created at runtime
(not while metadata loads), its messages are held at the topic while every
known nsqlookupd is asked ``GET /channels?topic=``; the non-ephemeral channels
named are created, then the topic is released, whether the queries succeeded,
failed or timed out.  So no channel a consumer registered elsewhere misses the
first messages.

Time is injected: the PING interval, the command deadline, reconnect delays
and the HTTP request timeout all run on ``clock`` (the nsqd's reactor unless a
test passes a ``task.Clock``).
"""

from __future__ import annotations

import json
import socket
import typing
from typing import TYPE_CHECKING, Any
from collections.abc import Callable
from urllib.parse import quote

from twisted.application.internet import ClientService, backoffPolicy
from twisted.application.service import MultiService
from twisted.internet import defer, task
from twisted.internet.abstract import isIPAddress, isIPv6Address
from twisted.logger import Logger
from twisted.python.failure import Failure

from .. import NSQ_VERSION
from ..lookupd.core.v1 import (
    PING_COMMAND, register_command,
    unregister_command,
)
from .core.broker import Event
from ..options import split_host_port
from .lookup_peer import COMMAND_TIMEOUT, LookupdInfo, LookupPeerProtocol, PeerFactory
from ..runtime.upstream import Upstream, UpstreamResponse

if TYPE_CHECKING:
    from ..options import NsqdOptions


class PeerBroker(typing.Protocol):
    """What the lookup peers need of the broker, and no more: its event listeners (to turn
    creations and deletions into REGISTER/UNREGISTER), whether it is still loading
    ``nsqd.dat``, the registrations to replay on (re)connect, and channel pre-creation for a
    topic held while nsqlookupd is asked (the held topic is an opaque token here)."""

    @property
    def loading(self) -> bool: ...

    @property
    def listeners(self) -> list[Callable[[str, str, str | None], None]]: ...

    def registrations(self) -> list[tuple[str, str | None]]: ...

    def has_topic(self, name: str) -> bool: ...

    def hold_topic(self, name: str) -> Any: ...

    def precreate_channels(self, held: Any, channels: list[str], now: float) -> None: ...

    def release_topic(self, held: Any) -> None: ...


class NsqdPeerHost(typing.Protocol):
    """What the lookup peers need of their nsqd (the NsqdService provides it): the options,
    the bound ports, the broker (as :class:`PeerBroker`), the reactor and a settle after
    pre-creating channels."""

    options: NsqdOptions
    reactor: Any

    @property
    def broker(self) -> PeerBroker: ...

    @property
    def tcp_port(self) -> int | None: ...

    @property
    def http_port(self) -> int | None: ...

    def settle(self) -> None: ...

__all__ = ["LookupPeersService", "LookupPeer", "LookupdInfo", "PING_INTERVAL", "COMMAND_TIMEOUT"]

log = Logger(namespace="nsqtw.nsqd")

#: nsqd's fixed heartbeat ticker towards every nsqlookupd
PING_INTERVAL = 15.0
def _endpoint(reactor: Any, address: str) -> Any:
    """A client endpoint for ``host:port`` (IP literals connect directly, names resolve)."""
    from twisted.internet.endpoints import HostnameEndpoint, TCP4ClientEndpoint, TCP6ClientEndpoint

    host, port = split_host_port(address, "lookupd-tcp-address")
    if isIPAddress(host):
        return TCP4ClientEndpoint(reactor, host, port, timeout=COMMAND_TIMEOUT)
    if isIPv6Address(host):
        return TCP6ClientEndpoint(reactor, host, port, timeout=COMMAND_TIMEOUT)
    return HostnameEndpoint(reactor, host.encode("idna"), port, timeout=COMMAND_TIMEOUT)


class LookupPeer:
    """One nsqlookupd as nsqd sees it: its address, its IDENTIFY answer, the live connection."""

    def __init__(self, owner: LookupPeersService, address: str) -> None:
        self.owner = owner
        self.address = address
        #: the last IDENTIFY answer; kept across reconnects, as nsqd keeps ``lp.Info``
        self.info: LookupdInfo | None = None
        #: the connection, once identified
        self.protocol: LookupPeerProtocol | None = None
        self.registered = False
        #: the answer to the last heartbeat sent (tests await it after advancing the clock)
        self.last_ping: defer.Deferred | None = None
        self._when_registered: list[defer.Deferred] = []
        self._when_lost: list[defer.Deferred] = []
        self.service = ClientService(_endpoint(owner.nsqd.reactor, address), PeerFactory(self),
                                     retryPolicy=owner.retry_policy, clock=owner.clock)

    def __repr__(self) -> str:
        return f"<LookupPeer {self.address}>"

    @property
    def http_address(self) -> str | None:
        """``broadcast_address:http_port`` from IDENTIFY: where to ask ``/channels``."""
        info = self.info
        if info is None or not info.broadcast_address:
            return None
        host = info.broadcast_address
        if ":" in host:
            host = f"[{host}]"
        return f"{host}:{info.http_port}"

    def command(self, data: bytes) -> defer.Deferred | None:
        """Send if identified (the Deferred fires with the answer); else drop it (None)."""
        proto = self.protocol
        if proto is None or not proto.identified:
            return None
        d = proto.command(data)
        d.addErrback(lambda f: None)
        return d

    def when_registered(self) -> defer.Deferred:
        """Fires once IDENTIFY and the replay of every registration were answered
        (at once if that is already so for the current connection)."""
        if self.registered:
            return defer.succeed(self)
        d: defer.Deferred = defer.Deferred()
        self._when_registered.append(d)
        return d

    def when_lost(self) -> defer.Deferred:
        """Fires when the current connection goes (at once if there is none)."""
        if self.protocol is None:
            return defer.succeed(self)
        d: defer.Deferred = defer.Deferred()
        self._when_lost.append(d)
        return d

    def _registered(self, proto: LookupPeerProtocol) -> None:
        if self.protocol is not proto:
            return
        self.registered = True
        waiting, self._when_registered = self._when_registered, []
        for d in waiting:
            d.callback(self)

    def _lost(self, proto: LookupPeerProtocol) -> None:
        if self.protocol is not proto and self.protocol is not None:
            return
        self.protocol = None
        self.registered = False
        waiting, self._when_lost = self._when_lost, []
        if waiting:
            # on the next reactor turn: the ClientService schedules its retry only after
            # this connectionLost returns, and a waiter may want to advance the clock
            self.owner.nsqd.reactor.callLater(0, self._fire_lost, waiting)

    def _fire_lost(self, waiting: list[defer.Deferred]) -> None:
        for d in waiting:
            d.callback(self)


class LookupPeersService(MultiService):
    """Every nsqlookupd this nsqd registers with (a child of the NsqdService)."""

    name = "lookup-peers"  # type: ignore[assignment]  # Twisted's Service declares name = None (unannotated)

    def __init__(self, nsqd: NsqdPeerHost, *, clock: Any = None, ping_interval: float = PING_INTERVAL,
                 retry_policy: Callable[[int], float] | None = None,
                 http_client: Any = None) -> None:
        super().__init__()
        self.nsqd = nsqd
        self.clock = clock if clock is not None else nsqd.reactor
        self.ping_interval = ping_interval
        # nsqd retries on its next PING (15 s); start quicker, never wait longer
        self.retry_policy = retry_policy or backoffPolicy(initialDelay=1.0, maxDelay=ping_interval)
        self.peers: dict[str, LookupPeer] = {}
        self._addresses: list[str] | None = None
        self._http_client = http_client
        self._loop: task.LoopingCall | None = None
        self._precreating: set[defer.Deferred] = set()
        self._idle_waiters: list[defer.Deferred] = []
        #: the node drains: its topics are unregistered and nothing is registered (consumers
        #: stop discovering it) until :meth:`restore`
        self.withdrawn = False

    # --- what the peers ask of the nsqd ---------------------------------------------

    @property
    def max_response_size(self) -> int:
        return int(self.nsqd.options.max_body_size)

    def identify_fields(self) -> dict[str, Any]:
        """nsqd's IDENTIFY body (broadcast ports win over the bound ones when set)."""
        opts = self.nsqd.options
        return {
            "version": NSQ_VERSION,
            "tcp_port": opts.broadcast_tcp_port or self.nsqd.tcp_port or 0,
            "http_port": opts.broadcast_http_port or self.nsqd.http_port or 0,
            "hostname": socket.gethostname(),
            "broadcast_address": opts.broadcast_address,
        }

    def registration_commands(self) -> list[bytes]:
        """The replay: REGISTER every topic without channels and every channel (nothing while
        :attr:`withdrawn`)."""
        if self.withdrawn:
            return []
        commands = [register_command(topic, channel) if channel is not None else register_command(topic)
                    for topic, channel in self.nsqd.broker.registrations()]
        return commands

    # --- peers ------------------------------------------------------------------

    def set_addresses(self, addresses: list[str]) -> defer.Deferred:
        """``PUT /config/nsqlookupd_tcp_addresses``: close removed peers, connect new ones;
        fires when the removed peers are closed."""
        wanted = list(dict.fromkeys(addresses))
        self._addresses = wanted
        if not self.running:
            return defer.succeed(None)
        stops = []
        for address in list(self.peers):
            if address not in wanted:
                stops.append(self._remove_peer(address))
        for address in wanted:
            if address not in self.peers:
                self._add_peer(address)
        return defer.gatherResults(stops, consumeErrors=True)

    def lookupd_http_addresses(self) -> list[str]:
        """The HTTP addresses of every peer that has identified at least once."""
        return [a for a in (p.http_address for p in self.peers.values()) if a]

    def _add_peer(self, address: str) -> LookupPeer:
        log.info("LOOKUP({peer}): adding peer", peer=address)
        peer = LookupPeer(self, address)
        self.peers[address] = peer
        peer.service.setServiceParent(self)
        return peer

    def _remove_peer(self, address: str) -> defer.Deferred:
        log.info("LOOKUP({peer}): removing peer", peer=address)
        peer = self.peers.pop(address)
        return defer.maybeDeferred(peer.service.disownServiceParent)

    def send(self, data: bytes) -> None:
        """A command to every identified peer (the others get the replay when they connect)."""
        for peer in list(self.peers.values()):
            if peer.command(data) is not None:
                log.info("LOOKUPD({peer}): {cmd}", peer=peer.address, cmd=data.decode().strip())

    def ping(self) -> None:
        """nsqd's heartbeat: PING every identified peer (an unanswered PING closes it)."""
        for peer in list(self.peers.values()):
            d = peer.command(PING_COMMAND)
            if d is not None:
                peer.last_ping = d
                log.debug("LOOKUPD({peer}): sending heartbeat", peer=peer.address)

    def withdraw(self) -> None:
        """A drain: UNREGISTER every topic (nsqlookupd drops its channels with it) from every
        peer, and register nothing until :meth:`restore`; the node stays connected (and PINGs)."""
        if self.withdrawn:
            return
        topics = dict.fromkeys(topic for topic, _ in self.nsqd.broker.registrations())
        self.withdrawn = True
        for topic in topics:
            self.send(unregister_command(topic))

    def restore(self) -> None:
        """A drain cancelled: REGISTER everything again."""
        if not self.withdrawn:
            return
        self.withdrawn = False
        for command in self.registration_commands():
            self.send(command)

    # --- broker events ------------------------------------------------------------

    def _on_event(self, event: str, topic: str, channel: str | None) -> None:
        if self.withdrawn and event in (Event.TOPIC_CREATED, Event.CHANNEL_CREATED):
            return
        try:
            if event == Event.TOPIC_CREATED:
                self.send(register_command(topic))
                self._precreate_channels(topic)
            elif event == Event.CHANNEL_CREATED:
                self.send(register_command(topic, channel or ""))
            elif event == Event.TOPIC_DELETED:
                self.send(unregister_command(topic))
            elif event == Event.CHANNEL_DELETED:
                self.send(unregister_command(topic, channel or ""))
        except Exception:
            log.failure("lookupd notification for {event} {topic}:{channel} failed",
                        event=event, topic=topic, channel=channel)

    # --- channel pre-creation (T20) -------------------------------------------------

    def _precreate_channels(self, name: str) -> None:
        broker = self.nsqd.broker
        if broker.loading or not broker.has_topic(name):
            return
        addresses = self.lookupd_http_addresses()
        if not addresses:
            if self.peers:
                log.error("no available nsqlookupd to query for channels to pre-create for topic {topic}",
                          topic=name)
            return
        topic = broker.hold_topic(name)
        if topic is None:
            return
        d = self._query_channels(name, addresses)

        def create(channels: list[str]) -> None:
            broker.precreate_channels(topic, channels, self.nsqd.reactor.seconds())

        def failed(f: Failure) -> None:
            if self.running and not f.check(defer.CancelledError):
                log.warn("failed to query nsqlookupd for channels to pre-create for topic {topic} - {err}",
                         topic=name, err=f.getErrorMessage())

        def release(_: Any) -> None:
            self._precreating.discard(d)
            broker.release_topic(topic)
            self.nsqd.settle()
            if not self._precreating:
                waiting, self._idle_waiters = self._idle_waiters, []
                for w in waiting:
                    w.callback(None)

        d.addCallback(create)
        d.addErrback(failed)
        d.addBoth(release)
        if not d.called:
            self._precreating.add(d)

    def idle(self) -> defer.Deferred:
        """Fires once no channel pre-creation is in flight (every held topic released)."""
        if not self._precreating:
            return defer.succeed(None)
        d: defer.Deferred = defer.Deferred()
        self._idle_waiters.append(d)
        return d

    def _client(self) -> Any:
        if self._http_client is None:
            from treq.client import HTTPClient
            from twisted.web.client import Agent, HTTPConnectionPool

            reactor = self.nsqd.reactor
            pool = HTTPConnectionPool(reactor, persistent=False)
            agent = Agent(reactor, connectTimeout=self.nsqd.options.http_client_connect_timeout, pool=pool)
            self._http_client = HTTPClient(agent)
        return self._http_client

    def _query_channels(self, topic: str, addresses: list[str]) -> defer.Deferred:
        """NSQ's ``GetLookupdTopicChannels``: the union of every lookupd's answer, sorted;
        fails only if every lookupd failed."""
        queries = [self._get_channels(f"http://{a}/channels?topic={quote(topic, safe='')}")
                   for a in addresses]
        d = defer.DeferredList(queries, consumeErrors=True)

        def merge(results: list[Any]) -> list[str]:
            channels: set[str] = set()
            errors = []
            for ok, value in results:
                if ok:
                    channels.update(value)
                else:
                    errors.append(value.getErrorMessage())
            if errors and len(errors) == len(results):
                raise RuntimeError(f"failed to query any nsqlookupd: {'; '.join(errors)}")
            if errors:
                log.warn("failed to query some nsqlookupd for channels of topic {topic} - {err}",
                         topic=topic, err="; ".join(errors))
            return sorted(channels)

        return d.addCallback(merge)

    def _get_channels(self, url: str) -> defer.Deferred:
        """One ``GET /channels`` (V1), within ``--http-client-request-timeout``."""
        log.debug("CI: querying nsqlookupd {url}", url=url)
        upstream = Upstream(self.clock, self.nsqd.options.http_client_request_timeout, http_client=self._client())

        def parse(response: UpstreamResponse) -> list[str]:
            data = response.body
            if response.code != 200:
                raise RuntimeError(f"got response {response.code} {data!r}")
            doc = json.loads(data)
            channels = doc.get("channels") if isinstance(doc, dict) else None
            if channels is None:
                return []
            if not isinstance(channels, list) or not all(isinstance(c, str) for c in channels):
                raise ValueError(f"bad /channels answer {data!r}")
            return channels

        return upstream.request("GET", url).addCallback(parse)

    # --- lifecycle ------------------------------------------------------------------

    def startService(self) -> None:
        super().startService()
        self.nsqd.broker.listeners.append(self._on_event)
        addresses = self._addresses
        if addresses is None:
            addresses = list(dict.fromkeys(self.nsqd.options.lookupd_tcp_addresses))
        for address in addresses:
            if address not in self.peers:
                self._add_peer(address)
        self._loop = task.LoopingCall(self._safe_ping)
        self._loop.clock = self.clock
        self._loop.start(self.ping_interval, now=False)

    def _safe_ping(self) -> None:
        try:
            self.ping()
        except Exception:
            log.failure("LOOKUP: heartbeat failed")

    def stopService(self) -> defer.Deferred:
        log.info("LOOKUP: closing")
        listeners = self.nsqd.broker.listeners
        if self._on_event in listeners:
            listeners.remove(self._on_event)
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None
        for d in list(self._precreating):
            d.cancel()
        self._precreating.clear()
        stopping = defer.maybeDeferred(super().stopService)

        def forget(result: Any) -> Any:
            self.peers.clear()
            return result

        return stopping.addBoth(forget)
