"""nsqd registering with nsqlookupd: an embedded nsqd with LookupPeersService and an
in-process nsqlookupd over loopback.  The peers' PING interval, command deadline,
reconnect delays and HTTP timeouts run on a ``task.Clock`` the tests advance."""

from __future__ import annotations

from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock

from lookupd_helpers import barrier, get, post, within
from nsqtw.nsqd.lookup_peers import COMMAND_TIMEOUT, LookupdInfo, LookupPeersService

pytestmark = pytest.mark.e2e


async def attach(nsqd: Any, clock: Clock | None = None, **kwargs: Any) -> LookupPeersService:
    """Give an embedded nsqd its lookupd peers (replacing any the nsqd service made itself)."""
    existing = nsqd._service.namedServices.get(LookupPeersService.name)
    if existing is not None:
        await defer.maybeDeferred(existing.disownServiceParent)
    service = LookupPeersService(nsqd._service, clock=clock or Clock(), **kwargs)
    service.setServiceParent(nsqd._service)
    return service


async def lookup(lookupd: Any, topic: str) -> Any:
    return (await get(lookupd.http_address, f"/lookup?topic={topic}"))[1]


async def closed_on_lookupd(lookupd: Any, protocols: list[Any]) -> None:
    for proto in protocols:
        await within(proto.closed)


@pytest_twisted.async_yield_fixture
async def cluster():
    """(lookupd, nsqd, peers, peer clock, lookupd clock) with nsqd registered."""
    from nsqtw.embed import start_nsqd
    from nsqtw.embed import start_nsqlookupd

    lookupd_clock, peer_clock = Clock(), Clock()
    lookupd_clock.advance(1000)
    lookupd = await start_nsqlookupd(clock=lookupd_clock)
    nsqd = await start_nsqd(lookupd_tcp_addresses=[lookupd.tcp_address])
    peers = await attach(nsqd, peer_clock)
    await within(peers.peers[lookupd.tcp_address].when_registered())
    yield lookupd, nsqd, peers, peer_clock, lookupd_clock
    await nsqd.stop()
    await lookupd.stop()


def the_peer(peers: LookupPeersService) -> Any:
    (peer,) = peers.peers.values()
    return peer


# --- registration ---------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_nsqd_identifies_with_its_ports(cluster) -> None:
    """nsqd's IDENTIFY carries its bound ports and broadcast address; /nodes lists it."""
    lookupd, nsqd, peers, _, _ = cluster
    (node,) = (await get(lookupd.http_address, "/nodes"))[1]["producers"]
    assert (node["broadcast_address"], node["tcp_port"], node["http_port"], node["version"]) == (
        "127.0.0.1", nsqd.tcp_port, nsqd.http_port, "1.3.0")
    info = the_peer(peers).info
    assert info == LookupdInfo(tcp_port=lookupd.tcp_port, http_port=lookupd.http_port,
                               version="1.3.0", broadcast_address="127.0.0.1")
    assert peers.lookupd_http_addresses() == [lookupd.http_address]


@pytest_twisted.ensureDeferred
async def test_existing_topics_and_channels_are_replayed_on_connect(lookupd) -> None:
    """On connect nsqd REGISTERs topics without channels and every channel, ephemeral included."""
    from nsqtw.embed import start_nsqd

    nsqd = await start_nsqd(lookupd_tcp_addresses=[lookupd.tcp_address])
    broker = nsqd._broker
    broker.get_topic("lonely")
    t = broker.get_topic("busy")
    t.get_channel("c1", 0.0)
    t.get_channel("c2#ephemeral", 0.0)
    peers = await attach(nsqd)
    await within(the_peer(peers).when_registered())
    debug = (await get(lookupd.http_address, "/debug"))[1]
    assert sorted(debug) == ["channel:busy:c1", "channel:busy:c2#ephemeral", "client::", "topic:busy:",
                             "topic:lonely:"]
    assert sorted((await lookup(lookupd, "busy"))["channels"]) == ["c1", "c2#ephemeral"]
    assert len((await lookup(lookupd, "lonely"))["producers"]) == 1
    await nsqd.stop()


@pytest_twisted.ensureDeferred
async def test_create_and_delete_are_reflected(cluster) -> None:
    """Topic/channel creation REGISTERs, deletion UNREGISTERs; non-ephemeral keys stay, empty."""
    lookupd, nsqd, peers, _, _ = cluster
    broker, peer = nsqd._broker, the_peer(peers)
    topic = broker.get_topic("orders")
    topic.get_channel("billing", 0.0)
    topic.get_channel("tail#ephemeral", 0.0)
    await barrier(peer)
    # the topic's creation asked nsqlookupd for channels to pre-create (as NSQ does): let that
    # finish first, or on a slow machine its answer ("billing") re-creates the channel deleted below
    await within(peers.idle())
    body = await lookup(lookupd, "orders")
    assert sorted(body["channels"]) == ["billing", "tail#ephemeral"] and len(body["producers"]) == 1

    broker.delete_channel("orders", "billing")
    broker.delete_channel("orders", "tail#ephemeral")
    await barrier(peer)
    debug = (await get(lookupd.http_address, "/debug"))[1]
    assert "channel:orders:billing" not in debug  # no producer left under it ...
    # ... but the non-ephemeral key stays listed, the ephemeral one is gone
    assert (await lookup(lookupd, "orders"))["channels"] == ["billing"]

    broker.delete_topic("orders")
    await barrier(peer)
    assert await lookup(lookupd, "orders") == {"channels": ["billing"], "producers": []}
    assert (await get(lookupd.http_address, "/topics"))[1] == {"topics": ["orders"]}


@pytest_twisted.ensureDeferred
async def test_topic_delete_unregisters_its_channels_too(cluster) -> None:
    """Deleting a topic sends UNREGISTER <topic>; nsqlookupd drops the peer from its channels."""
    lookupd, nsqd, peers, _, _ = cluster
    t = nsqd._broker.get_topic("t")
    t.get_channel("c", 0.0)
    t.get_channel("e#ephemeral", 0.0)
    await barrier(the_peer(peers))
    nsqd._broker.delete_topic("t")
    await barrier(the_peer(peers))
    debug = (await get(lookupd.http_address, "/debug"))[1]
    assert sorted(debug) == ["client::"]


@pytest_twisted.ensureDeferred
async def test_ephemeral_topic_goes_away_with_its_last_channel(cluster) -> None:
    """An #ephemeral topic nsqd deletes with its last channel disappears from /topics."""
    lookupd, nsqd, peers, _, _ = cluster
    nsqd._broker.get_topic("tmp#ephemeral").get_channel("c", 0.0)
    await barrier(the_peer(peers))
    assert "tmp#ephemeral" in (await get(lookupd.http_address, "/topics"))[1]["topics"]
    nsqd._broker.delete_channel("tmp#ephemeral", "c")
    await barrier(the_peer(peers))
    assert nsqd._broker.topics == {}
    assert (await get(lookupd.http_address, "/topics"))[1] == {"topics": []}


@pytest_twisted.ensureDeferred
async def test_broadcast_ports_win_in_identify(lookupd) -> None:
    """--broadcast-tcp-port / --broadcast-http-port replace the bound ports in IDENTIFY."""
    from nsqtw.embed import start_nsqd

    nsqd = await start_nsqd(lookupd_tcp_addresses=[lookupd.tcp_address], broadcast_tcp_port=1111,
                            broadcast_http_port=2222, broadcast_address="nsqd.example")
    peers = await attach(nsqd)
    await within(the_peer(peers).when_registered())
    nsqd._broker.get_topic("t")
    await barrier(the_peer(peers))
    (producer,) = (await lookup(lookupd, "t"))["producers"]
    assert (producer["broadcast_address"], producer["tcp_port"], producer["http_port"]) == (
        "nsqd.example", 1111, 2222)
    await nsqd.stop()


@pytest_twisted.ensureDeferred
async def test_nsqd_stop_removes_its_registrations(cluster) -> None:
    """When nsqd stops its connection closes and nsqlookupd drops it as a producer."""
    lookupd, nsqd, peers, _, _ = cluster
    nsqd._broker.get_topic("t")
    await barrier(the_peer(peers))
    protocols = list(lookupd._service.tcp_factory.protocols)
    await nsqd.stop()
    await closed_on_lookupd(lookupd, protocols)
    assert await lookup(lookupd, "t") == {"channels": [], "producers": []}
    assert (await get(lookupd.http_address, "/nodes"))[1] == {"producers": []}


# --- heartbeats, activity, restarts ---------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_ping_every_15s_keeps_nsqd_active(cluster) -> None:
    """nsqd PINGs every 15 s; nsqlookupd hides it after 300 s of silence and shows it again
    after the next PING."""
    lookupd, nsqd, peers, peer_clock, lookupd_clock = cluster
    peer = the_peer(peers)
    nsqd._broker.get_topic("t")
    await barrier(peer)
    peer.last_ping = None
    peer_clock.advance(14.9)
    assert peer.last_ping is None
    lookupd_clock.advance(301)
    assert (await lookup(lookupd, "t"))["producers"] == []
    assert (await get(lookupd.http_address, "/nodes"))[1] == {"producers": []}
    peer_clock.advance(0.1)
    assert peer.last_ping is not None
    assert await within(peer.last_ping) == b"OK"
    (entry,) = (await get(lookupd.http_address, "/debug"))[1]["client::"]
    assert entry["last_update"] == int(lookupd_clock.seconds() * 1e9)
    assert len((await lookup(lookupd, "t"))["producers"]) == 1


@pytest_twisted.ensureDeferred
async def test_lookupd_restart_is_repopulated(cluster) -> None:
    """A restarted nsqlookupd (same address, empty memory) gets IDENTIFY and every REGISTER again."""
    from nsqtw.embed import start_nsqlookupd

    lookupd, nsqd, peers, peer_clock, _ = cluster
    peer = the_peer(peers)
    broker = nsqd._broker
    broker.get_topic("a").get_channel("c1", 0.0)
    broker.get_topic("b")
    await barrier(peer)
    lost = peer.when_lost()
    await lookupd.stop()
    await within(lost)
    fresh = await start_nsqlookupd(tcp_address=lookupd.tcp_address)
    try:
        assert (await get(fresh.http_address, "/topics"))[1] == {"topics": []}
        registered = peer.when_registered()
        peer_clock.advance(COMMAND_TIMEOUT + 15)
        await within(registered)
        assert sorted((await get(fresh.http_address, "/topics"))[1]["topics"]) == ["a", "b"]
        assert (await get(fresh.http_address, "/channels?topic=a"))[1] == {"channels": ["c1"]}
        (producer,) = (await get(fresh.http_address, "/lookup?topic=a"))[1]["producers"]
        assert producer["tcp_port"] == nsqd.tcp_port
    finally:
        await fresh.stop()


@pytest_twisted.ensureDeferred
async def test_reconnects_with_backoff_while_lookupd_is_down(lookupd) -> None:
    """While nothing listens the peer retries forever on its clock (commands meanwhile are
    dropped); once nsqlookupd is back the next attempt registers everything."""
    from twisted.internet import reactor

    from nsqtw.embed import start_nsqd
    from nsqtw.embed import start_nsqlookupd

    attempts: list[int] = []
    scheduled: list[defer.Deferred] = []

    def policy(attempt: int) -> float:
        attempts.append(attempt)
        if scheduled:
            # wake the test on the next turn, after ClientService has scheduled the retry
            reactor.callLater(0, scheduled.pop().callback, attempt)
        return 1.0

    def next_retry() -> defer.Deferred:
        d: defer.Deferred = defer.Deferred()
        scheduled.append(d)
        return within(d)

    clock = Clock()
    nsqd = await start_nsqd(lookupd_tcp_addresses=[lookupd.tcp_address])
    fresh = None
    try:
        peers = await attach(nsqd, clock, retry_policy=policy)
        peer = the_peer(peers)
        await within(peer.when_registered())
        retry = next_retry()
        await lookupd.stop()
        assert await retry == 1
        assert peer.command(b"PING\n") is None
        nsqd._broker.get_topic("created-while-down")
        for expected in (2, 3, 4):
            retry = next_retry()
            clock.advance(1.0)  # a refused attempt, then the next retry is scheduled
            assert await retry == expected
        fresh = await start_nsqlookupd(tcp_address=lookupd.tcp_address)
        registered = peer.when_registered()
        clock.advance(1.0)
        await within(registered)
        assert attempts == [1, 2, 3, 4]
        assert (await get(fresh.http_address, "/topics"))[1] == {"topics": ["created-while-down"]}
    finally:
        await nsqd.stop()
        if fresh is not None:
            await fresh.stop()


@pytest_twisted.ensureDeferred
async def test_unanswered_command_closes_the_connection() -> None:
    """A lookupd that never answers: after nsqd's 1 s deadline the connection is closed."""
    from twisted.internet import reactor
    from twisted.internet.endpoints import TCP4ServerEndpoint

    from nsqtw.embed import start_nsqd

    received: list[bytes] = []
    lost = defer.Deferred()

    class Silent(Protocol):
        def dataReceived(self, data: bytes) -> None:
            received.append(data)

        def connectionLost(self, reason: Any = None) -> None:
            if not lost.called:
                lost.callback(None)

    port = await TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(Factory.forProtocol(Silent))
    address = f"127.0.0.1:{port.getHost().port}"
    nsqd = await start_nsqd(lookupd_tcp_addresses=[address])
    clock = Clock()
    try:
        peers = await attach(nsqd, clock)
        peer = the_peer(peers)
        connected = peer.service.whenConnected()
        await within(connected)
        clock.advance(COMMAND_TIMEOUT - 0.01)
        assert peer.protocol is not None
        clock.advance(0.01)
        await within(lost)
        assert b"".join(received).startswith(b"  V1IDENTIFY\n")
        assert not peer.registered
    finally:
        await nsqd.stop()
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_refused_identify_closes_and_registers_nothing(lookupd) -> None:
    """An nsqd without an HTTP port is refused (IDENTIFY missing fields); the peer hangs up."""
    from nsqtw.embed import start_nsqd

    nsqd = await start_nsqd(lookupd_tcp_addresses=[lookupd.tcp_address], http_address="")
    try:
        peers = await attach(nsqd)
        peer = the_peer(peers)
        await within(peer.service.whenConnected())
        await within(peer.when_lost())
        assert not peer.registered and peer.info is None
        assert (await get(lookupd.http_address, "/nodes"))[1] == {"producers": []}
    finally:
        await nsqd.stop()


# --- the peer list at runtime ------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_set_addresses_moves_registrations(cluster) -> None:
    """set_addresses closes removed peers (their lookupd drops nsqd) and connects new ones."""
    from nsqtw.embed import start_nsqlookupd

    lookupd, nsqd, peers, _, _ = cluster
    nsqd._broker.get_topic("t")
    await barrier(the_peer(peers))
    second = await start_nsqlookupd()
    try:
        protocols = list(lookupd._service.tcp_factory.protocols)
        await within(peers.set_addresses([second.tcp_address, second.tcp_address]))
        assert list(peers.peers) == [second.tcp_address]
        await within(peers.peers[second.tcp_address].when_registered())
        await closed_on_lookupd(lookupd, protocols)
        assert (await lookup(lookupd, "t"))["producers"] == []
        assert len((await get(second.http_address, "/lookup?topic=t"))[1]["producers"]) == 1
        await within(peers.set_addresses([]))
        assert peers.peers == {}
    finally:
        await second.stop()


# --- channel pre-creation (T20) --------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_new_topic_precreates_channels_lookupd_knows(cluster) -> None:
    """A topic created at runtime gets the non-ephemeral channels nsqlookupd lists, before its
    first message flows, so that message reaches them."""
    lookupd, nsqd, peers, _, _ = cluster
    for ch in ("audit", "archive", "tail%23ephemeral"):
        assert (await post(lookupd.http_address, f"/channel/create?topic=fresh&channel={ch}"))[0] == 200
    assert sorted((await get(lookupd.http_address, "/channels?topic=fresh"))[1]["channels"]) == [
        "archive", "audit", "tail#ephemeral"]
    topic = nsqd._broker.publish("fresh", [b"first"], 0.0)
    assert topic.holds == 1 and not topic.channels
    await within(peers.idle())
    assert topic.holds == 0
    assert sorted(topic.channels) == ["archive", "audit"]
    for ch in topic.channels.values():
        assert ch.depth() == 1
    assert topic.depth() == 0
    await barrier(the_peer(peers))
    debug = (await get(lookupd.http_address, "/debug"))[1]
    assert "channel:fresh:audit" in debug and "channel:fresh:archive" in debug


@pytest_twisted.ensureDeferred
async def test_precreation_unions_every_lookupd() -> None:
    """With two nsqlookupd the channels of both are created."""
    from nsqtw.embed import start_nsqd
    from nsqtw.embed import start_nsqlookupd

    lk1, lk2 = await start_nsqlookupd(), await start_nsqlookupd()
    nsqd = await start_nsqd(lookupd_tcp_addresses=[lk1.tcp_address, lk2.tcp_address])
    try:
        peers = await attach(nsqd)
        for peer in peers.peers.values():
            await within(peer.when_registered())
        await post(lk1.http_address, "/channel/create?topic=t&channel=one")
        await post(lk2.http_address, "/channel/create?topic=t&channel=two")
        await post(lk2.http_address, "/channel/create?topic=t&channel=one")
        topic = nsqd._broker.get_topic("t")
        await within(peers.idle())
        assert sorted(topic.channels) == ["one", "two"]
    finally:
        await nsqd.stop()
        await lk1.stop()
        await lk2.stop()


@pytest_twisted.ensureDeferred
async def test_precreation_failure_releases_the_topic(cluster) -> None:
    """If no nsqlookupd answers /channels the topic is released anyway (no channels made)."""
    from twisted.internet import reactor
    from twisted.internet.endpoints import TCP4ServerEndpoint

    lookupd, nsqd, peers, _, _ = cluster
    port = await TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(Factory.forProtocol(Protocol))
    dead = port.getHost().port
    await port.stopListening()
    the_peer(peers).info = LookupdInfo(tcp_port=1, http_port=dead, version="1.3.0",
                                       broadcast_address="127.0.0.1")
    topic = nsqd._broker.publish("t", [b"x"], 0.0)
    assert topic.holds == 1
    await within(peers.idle())
    assert topic.holds == 0 and topic.channels == {} and topic.depth() == 1


@pytest_twisted.ensureDeferred
async def test_precreation_times_out_and_releases(cluster) -> None:
    """A /channels query unanswered for --http-client-request-timeout releases the topic."""
    from twisted.internet import reactor
    from twisted.internet.endpoints import TCP4ServerEndpoint

    lookupd, nsqd, peers, peer_clock, _ = cluster
    accepted = defer.Deferred()

    class Hang(Protocol):
        def connectionMade(self) -> None:
            if not accepted.called:
                accepted.callback(self)

    port = await TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(Factory.forProtocol(Hang))
    try:
        the_peer(peers).info = LookupdInfo(tcp_port=1, http_port=port.getHost().port, version="1.3.0",
                                           broadcast_address="127.0.0.1")
        topic = nsqd._broker.get_topic("slow")
        await within(accepted)
        idle = peers.idle()
        peer_clock.advance(nsqd.options.http_client_request_timeout - 0.01)
        assert not idle.called and topic.holds == 1
        peer_clock.advance(0.01)
        await within(idle)
        assert topic.holds == 0
        topic.get_channel("late", 0.0)
        nsqd._broker.publish("slow", [b"m"], 0.0)
        nsqd._service.settle()
        assert topic.channels["late"].depth() == 1
    finally:
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_no_precreation_while_loading(cluster) -> None:
    """Topics created while metadata loads are not held and nsqlookupd is not asked."""
    lookupd, nsqd, peers, _, _ = cluster
    await post(lookupd.http_address, "/channel/create?topic=loaded&channel=c")
    nsqd._broker.loading = True
    try:
        topic = nsqd._broker.get_topic("loaded")
    finally:
        nsqd._broker.loading = False
    assert topic.holds == 0 and peers.idle().called and topic.channels == {}


@pytest_twisted.ensureDeferred
async def test_stopping_nsqd_cancels_pending_precreation(cluster) -> None:
    """Stopping nsqd while a /channels query hangs cancels it and releases the topic."""
    from twisted.internet import reactor
    from twisted.internet.endpoints import TCP4ServerEndpoint

    lookupd, nsqd, peers, _, _ = cluster
    port = await TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(Factory.forProtocol(Protocol))
    try:
        the_peer(peers).info = LookupdInfo(http_port=port.getHost().port, broadcast_address="127.0.0.1")
        topic = nsqd._broker.get_topic("t")
        idle = peers.idle()
        await defer.maybeDeferred(peers.disownServiceParent)
        await within(idle)
        assert topic.holds == 0
    finally:
        await port.stopListening()
