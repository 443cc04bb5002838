"""
nsqtw's pytest plugin: a real nsqd / nsqlookupd in your test suite, no Go binary needed.

Installed with nsqtw (entry point ``pytest11: nsqtw``), it gives every pytest
run these fixtures, each started in-process on 127.0.0.1 port 0 inside
pytest-twisted's reactor and torn down after the test (listeners closed,
connections dropped, the temporary data directory deleted):

* ``nsqtw_nsqd``: one nsqd (:class:`NsqdFixture`); options with
  ``@pytest.mark.nsqtw_options(mem_queue_size=10, msg_timeout=5.0)``.
* ``nsqtw_nsqd_factory``: ``await nsqtw_nsqd_factory(**options)`` starts more.
* ``nsqtw_lookupd``: one nsqlookupd (:class:`LookupdFixture`).
* ``nsqtw_cluster``: an nsqlookupd and N nsqd registered with it
  (:class:`ClusterFixture`; ``@pytest.mark.nsqtw_cluster(nsqd=3)``, default 2, or one nsqd
  per entry of ``nodes=[{...}, ...]``, replicating with ``replicate_to=[j]``).
* ``nsqtw_clock``: virtual time (a ``task.Clock``) for the fixtures above, requested with
  them; ``nsqtw_reactor``: the reactor to hand to the test's own clients.

Every nsqd fixture records its traffic (``published``, ``assert_published``...) and can be
made to fail (``faults``).

::

    import pytest_twisted

    @pytest_twisted.ensureDeferred
    async def test_roundtrip(nsqtw_nsqd):
        await nsqtw_nsqd.publish("orders", b"hello")
        [msg] = await nsqtw_nsqd.wait_for_messages("orders", "audit", 1, timeout=5)
        assert msg.body == b"hello"

The fixtures are prefixed so they never clash with a project's own ``nsqd``
fixture.  Importing this module is cheap (pytest only; nsqtw and Twisted are
imported when a fixture is used), and it never breaks a run: without
pytest-twisted (or with ``-p no:twisted``) the fixtures skip the test with a
message saying so.
"""

from __future__ import annotations

import shutil
from typing import TYPE_CHECKING, Any, TypeVar
from collections.abc import Callable, Iterator, Sequence

import pytest

if TYPE_CHECKING:  # pragma: no cover
    from twisted.internet.defer import Deferred
    from twisted.internet.task import Clock
    from twisted.python.failure import Failure

    from nsqtw.client import Consumer, Message, Producer
    from nsqtw.lookupd.core.registry import Producer as Registration, RegistrationDB
    from nsqtw.lookupd.embed import LookupdHandle
    from nsqtw.nsqd.core.broker import Broker
    from nsqtw.nsqd.embed import NsqdHandle
    from nsqtw.nsqd.service import NsqdService
    from nsqtw.options import NsqdOptions
    from nsqtw.testing.faults import FullDisk, NsqdFaults
    from nsqtw.testing.traffic import Handled, Published, TrafficRecorder

    #: what a test may publish: bytes, or text (sent as UTF-8)
    Body = bytes | str

__all__ = [
    "NsqdFixture",
    "LookupdFixture",
    "ClusterFixture",
    "nsqtw_nsqd",
    "nsqtw_nsqd_factory",
    "nsqtw_lookupd",
    "nsqtw_cluster",
    "nsqtw_clock",
    "nsqtw_reactor",
    "start_nsqd_fixture",
    "start_lookupd_fixture",
    "start_cluster_fixture",
    "replication_security_options",
    "fast_data_dir",
]

T = TypeVar("T")

_SKIP_NO_PT = ("nsqtw's fixtures run nsqd inside pytest-twisted's reactor: "
               "install pytest-twisted (pip install 'nsqtw[pytest]')")
_SKIP_INACTIVE = ("nsqtw's fixtures need pytest-twisted's reactor, but the plugin is not active "
                  "(was it disabled with -p no:twisted?)")


def pytest_configure(config: pytest.Config) -> None:
    """Declare the markers (never fails: a broken plugin must not break someone's run)."""
    try:
        config.addinivalue_line("markers", "nsqtw_options(**kwargs): NsqdOptions for the nsqtw_nsqd fixture")
        config.addinivalue_line("markers", "nsqtw_cluster(nsqd=2, nodes=None, **kwargs): size and nsqd options "
                                           "of nsqtw_cluster (nodes: one dict of options per nsqd)")
    except Exception:  # pragma: no cover
        pass


# --- plumbing ----------------------------------------------------------------------------------


def _pytest_twisted() -> Any:
    """pytest-twisted, active; otherwise skip the test with the reason."""
    try:
        import pytest_twisted
    except ImportError:
        pytest.skip(_SKIP_NO_PT)
    instances = getattr(pytest_twisted, "_instances", None)
    if instances is None or getattr(instances, "reactor", None) is None:
        pytest.skip(_SKIP_INACTIVE)
    return pytest_twisted


def _reactor() -> Any:
    from nsqtw.runtime.reactor import resolve_reactor
    return resolve_reactor()


def fast_data_dir() -> str:
    """A fresh data directory on tmpfs when there is one (see :func:`nsqtw.nsqd.embed.scratch_dir`)."""
    from nsqtw.nsqd.embed import scratch_dir

    return scratch_dir()

def _timeout(d: Deferred[T], seconds: float | None, what: Callable[[], str]) -> Deferred[T]:
    """Fail ``d`` with a TimeoutError saying what was missing after ``seconds`` of reactor time."""
    from twisted.internet import defer

    if not seconds or seconds <= 0:
        return d

    def timed_out(f: Failure) -> Failure:
        if f.check(defer.CancelledError, defer.TimeoutError):
            raise TimeoutError(what())
        return f

    d.addTimeout(seconds, _reactor())
    return d.addErrback(timed_out)


def _wait_until(predicate: Callable[[], object], timeout: float | None,
                what: str = "the condition") -> Deferred[None]:
    from twisted.internet import defer, task

    async def poll() -> None:
        while not predicate():
            await task.deferLater(_reactor(), 0.002, lambda: None)

    return _timeout(defer.ensureDeferred(poll()), timeout, lambda: f"{what} did not hold within {timeout}s")


# --- nsqd --------------------------------------------------------------------------------------


class NsqdFixture:
    """A running in-process nsqd and helpers to talk to it.

    Which to ``await``: ``publish``, ``multi_publish``, ``deferred_publish``,
    ``wait_for_messages`` and ``stop`` return a Deferred (await it); ``depth`` and ``stats``
    answer at once (an ``int``, a ``dict``: never ``await`` them), as do the properties.
    The signatures say so, so ``await nsqtw_nsqd.depth("t")`` is a mypy error."""

    def __init__(self, handle: NsqdHandle, data_dir: str | None, *, reactor: Any = None,
                 traffic: TrafficRecorder | None = None) -> None:
        from nsqtw.testing.traffic import TrafficRecorder

        #: the embedded nsqd (:class:`nsqtw.embed.NsqdHandle`)
        self.handle = handle
        self._data_dir = data_dir
        self._producer: Producer | None = None
        self._consumers: list[Consumer] = []
        self._stopped = False
        #: the reactor the broker runs on (a :class:`~nsqtw.testing.clock.VirtualTimeReactor`
        #: under ``nsqtw_clock``)
        self.reactor: Any = reactor if reactor is not None else _reactor()
        #: everything published, delivered, finished, requeued and timed out (see
        #: :mod:`nsqtw.testing.traffic`)
        self.traffic: TrafficRecorder = traffic if traffic is not None else TrafficRecorder()
        self._full_disk: FullDisk | None = None

    # addresses
    @property
    def tcp_address(self) -> str:
        """``127.0.0.1:PORT`` of nsqd's TCP listener (for a producer or consumer)."""
        return self.handle.tcp_address

    @property
    def http_address(self) -> str | None:
        """``127.0.0.1:PORT`` of nsqd's HTTP API (None when HTTP is off)."""
        return self.handle.http_address

    @property
    def tcp_port(self) -> int:
        """The TCP port (chosen by the OS)."""
        return self.handle.tcp_port

    @property
    def http_port(self) -> int | None:
        """The HTTP port (None when HTTP is off)."""
        return self.handle.http_port

    @property
    def http_url(self) -> str:
        """``http://127.0.0.1:PORT``, for treq or any HTTP client."""
        return f"http://{self.http_address}"

    @property
    def _broker(self) -> Broker:
        # nsqtw's internals, for its own white-box tests (not part of the fixture's face)
        return self.handle._broker

    @property
    def _service(self) -> NsqdService:
        return self.handle._service

    @property
    def options(self) -> NsqdOptions:
        """The options this nsqd runs with."""
        return self.handle.options

    @property
    def data_path(self) -> str:
        """Its data directory (a fresh temporary one, removed after the test)."""
        return self.handle.options.data_path

    @property
    def replication_address(self) -> str | None:
        """``"host:port"`` other nodes name in ``replica_peers``; None without a
        ``replication_address`` option."""
        return self.handle.replication_address

    @property
    def virtual_time(self) -> bool:
        """True when the broker's timers run on ``nsqtw_clock``."""
        from nsqtw.testing.clock import VirtualTimeReactor

        return isinstance(self.reactor, VirtualTimeReactor)

    # helpers
    def _producer_for(self) -> Producer:
        if self._producer is None:
            from nsqtw.client import Producer
            # the in-process bus: real V2 protocol, no socket; the client's own timers on real time
            self._producer = Producer(self.handle)
        return self._producer

    def publish(self, topic: str, body: Body) -> Deferred[None]:
        """PUB one message (``bytes`` or ``str``). A Deferred (await it): fires once nsqd answered OK."""
        return self._producer_for().publish(topic, body)

    def multi_publish(self, topic: str, bodies: Sequence[Body]) -> Deferred[None]:
        """MPUB: all or nothing up to 20,000 messages (a bigger MPUB is stored a share per reactor
        turn, and a refusal between two shares keeps the shares stored, as Go's nsqd does).
        A Deferred (await it): fires once nsqd answered OK."""
        return self._producer_for().multi_publish(topic, list(bodies))

    def deferred_publish(self, topic: str, delay: float, body: Body) -> Deferred[None]:
        """DPUB: delivered after ``delay`` seconds. A Deferred (await it): fires once nsqd answered OK."""
        return self._producer_for().deferred_publish(topic, delay, body)

    def wait_for_messages(self, topic: str, channel: str, n: int,
                          timeout: float | None = 5.0) -> Deferred[list[Message]]:
        """Subscribe ``topic``/``channel``. A Deferred (await it): fires with the first ``n``
        messages (FINed); fails with TimeoutError after ``timeout`` seconds, naming how many came."""
        from twisted.internet import defer

        from nsqtw.client import Config, Consumer

        got: list[Message] = []
        done: defer.Deferred[None] = defer.Deferred()

        def handle(msg: Message) -> None:
            if len(got) >= n:
                msg.disable_auto_response()
                msg.requeue_without_backoff(0)  # not ours: hand it back unharmed
                return
            got.append(msg)
            if len(got) == n and not done.called:
                done.callback(None)

        config = Config(max_in_flight=max(1, n))
        if self.virtual_time:
            # a jump of the clock must not look to nsqd like a consumer silent for two heartbeats
            config.heartbeat_interval = 60.0  # nsqd's longest: jumps up to 2 min keep it
        consumer = Consumer(topic, channel, handle, config, reactor=_reactor())
        self._consumers.append(consumer)
        subscribed = consumer.connect_to_nsqd(self.handle)
        subscribed.addErrback(lambda f: None if done.called else done.errback(f))
        if n <= 0:
            done.callback(None)
        _timeout(done, timeout, lambda: f"got {len(got)} of {n} messages on {topic}/{channel} within {timeout}s")

        def finish(result: object) -> Deferred[object]:
            stopping = consumer.stop()

            def forget(_: object) -> object:
                if consumer in self._consumers:
                    self._consumers.remove(consumer)
                return result

            return stopping.addBoth(forget)

        finished: Deferred[object] = done.addBoth(finish)
        return finished.addCallback(lambda _: list(got))

    def depth(self, topic: str, channel: str | None = None) -> int:
        """Messages waiting at a topic or channel (memory + disk; 0 when it does not exist).
        Answers at once: an ``int``, not a Deferred (do not ``await`` it)."""
        t = self._broker.topics.get(topic)
        if t is None:
            return 0
        if channel is None:
            return int(t.depth())
        ch = t.channels.get(channel)
        return int(ch.depth()) if ch is not None else 0

    def stats(self, topic: str | None = None, channel: str | None = None) -> dict[str, Any]:
        """The ``/stats?format=json`` document, computed in-process. Answers at once: a ``dict``,
        not a Deferred (do not ``await`` it)."""
        from nsqtw.nsqd.stats.snapshot import broker_stats

        return broker_stats(self._broker, self._service.now(), topic=topic or "", channel=channel or "")

    def advance(self, seconds: float, timeout: float | None = 5.0) -> Deferred[None]:
        """Virtual time (``nsqtw_clock``): move the clock ``seconds`` ahead as if that time
        passed with every connection alive.  A Deferred (await it).

        ``nsqtw_clock.advance(s)`` is one jump, in which nobody on the network speaks: past
        two heartbeat intervals (60 s by default) nsqd drops a connected consumer, as it would a
        frozen one.  This moves in steps of half the shortest heartbeat interval and, after each,
        lets the connections answer the heartbeats it sent (real I/O, no sleeping), so the
        consumers stay connected, then runs the queue scan once more at that instant.  Fails
        with TimeoutError if a connection does not answer within ``timeout`` seconds of real
        time."""
        from twisted.internet import defer

        from nsqtw.testing.clock import VirtualTimeReactor

        vr = self.reactor
        if not isinstance(vr, VirtualTimeReactor):
            raise TypeError("advance() needs virtual time: request the nsqtw_clock fixture")
        clock = vr.clock

        def protocols() -> list[Any]:
            return [p for p in self._service.tcp_factory.protocols if p._interval > 0]

        def answered() -> bool:  # nsqtw's own protocol: _last_read is when the client last spoke
            now = clock.seconds()
            return all(p._last_read >= now - p._interval or not getattr(p.transport, "connected", True)
                       for p in protocols())

        async def steps() -> None:
            end = clock.seconds() + seconds
            while clock.seconds() < end:
                step = min([p._interval / 2 for p in protocols()], default=end - clock.seconds())
                clock.advance(min(step, end - clock.seconds()))
                await _wait_until(answered, timeout, "every connection answering its heartbeats")
                # what those answers brought (a new channel given a deferred message already
                # due, a FIN) is handled at this instant, as the next scan would in real time
                self._service.scan_once()

        return defer.ensureDeferred(steps())

    def wait_until(self, predicate: Callable[[], object], timeout: float | None = 5.0) -> Deferred[None]:
        """A Deferred (await it): fires once ``predicate()`` is true (checked every few
        milliseconds of real time: for I/O to happen, not for the broker's timers); fails with
        TimeoutError after ``timeout`` seconds."""
        return _wait_until(predicate, timeout)

    # recorded traffic (see nsqtw.testing.traffic)

    def published(self, topic: str) -> list[Published]:
        """Every message published on ``topic`` since the start (or :meth:`reset`), in order.
        Answers at once: a ``list``, not a Deferred (do not ``await`` it)."""
        return self.traffic.published_on(topic)

    def handled(self, kind: str | None = None, topic: str | None = None,
                channel: str | None = None) -> list[Handled]:
        """What channels did with messages, in order: ``kind`` is ``"delivered"``,
        ``"finished"``, ``"requeued"`` or ``"timed_out"`` (all when None).  Answers at once: a
        ``list``, not a Deferred (do not ``await`` it)."""
        return self.traffic.handled_as(kind, topic, channel)

    def assert_published(self, topic: str, body: Body | None = None, *, count: int | None = None) -> None:
        """Fail (with what was published there, and a diff against the closest body) unless a
        message with ``body`` (any when None) was published on ``topic``; exactly ``count``
        such messages when given.  Checks at once: not a Deferred (do not ``await`` it)."""
        self.traffic.assert_published(topic, body, count=count)

    def assert_nothing_published(self, topic: str) -> None:
        """Fail (listing what was) if anything was published on ``topic``.  Checks at once:
        not a Deferred (do not ``await`` it)."""
        self.traffic.assert_nothing_published(topic)

    def empty_all(self) -> None:
        """Drop every message of every topic and channel: queued, in flight and deferred.
        Done at once: not a Deferred (do not ``await`` it)."""
        broker = self._broker
        for topic in list(broker.topics.values()):
            for name in list(topic.channels):
                broker.empty(topic.name, name)
            broker.empty(topic.name)

    def reset(self) -> None:
        """Between tests sharing a broker: :meth:`empty_all` and forget the recorded traffic.
        Done at once: not a Deferred (do not ``await`` it)."""
        self.empty_all()
        self.traffic.clear()

    # faults (see nsqtw.testing.faults)

    @property
    def faults(self) -> NsqdFaults:
        """Make this broker fail: refuse publishes, drop connections, pause deliveries, fill
        its disk, restart it (:class:`~nsqtw.testing.faults.NsqdFaults`)."""
        from nsqtw.testing.faults import NsqdFaults

        return NsqdFaults(self)

    def _stop_clients(self) -> Deferred[Any]:
        from twisted.internet import defer

        waits: list[Deferred[Any]] = [c.stop() for c in self._consumers]
        if self._producer is not None:
            waits.append(self._producer.stop(timeout=1.0))
        self._producer = None
        return defer.DeferredList(waits, consumeErrors=True)

    def restart(self) -> Deferred[None]:
        """Stop the broker cleanly (its messages written to its data directory) and start it
        again on the same directory, options and ports; the recorded traffic goes on.
        A Deferred (await it)."""
        from twisted.internet import defer

        from nsqtw.embed import NsqdHandle

        async def restart() -> None:
            if self._full_disk is not None:
                self._full_disk.free()
                self._full_disk = None
            await self._stop_clients()
            old = self.handle
            same_ports: dict[str, Any] = {"tcp_address": old.tcp_address}  # read while bound
            if old.http_address is not None:
                same_ports["http_address"] = old.http_address
            if old.replication_address is not None:
                same_ports["replication_address"] = old.replication_address
            options = old.options.replace(**same_ports)
            await old.stop()  # the data directory stays: only the fixture's stop() removes it
            service = _build_service(options, self.reactor, self._data_dir is not None, self.traffic)
            self.handle = NsqdHandle(service)
            await service.ready()

        return defer.ensureDeferred(restart())

    def stop(self) -> Deferred[None]:
        """Stop everything the fixture started, then the broker; delete its temporary data.
        A Deferred (await it); the fixtures call it after the test themselves."""
        from twisted.internet import defer

        if self._stopped:
            return defer.succeed(None)
        self._stopped = True
        if self._full_disk is not None:  # a fault the test left: the stop itself must not fail
            self._full_disk.free()
            self._full_disk = None
        d = self._stop_clients()
        d.addCallback(lambda _: self.handle.stop())

        def cleanup(result: object) -> object:
            if self._data_dir:
                shutil.rmtree(self._data_dir, ignore_errors=True)
            return result

        return d.addBoth(cleanup)

    def __repr__(self) -> str:
        return f"<nsqtw nsqd tcp={self.tcp_address} http={self.http_address}>"


def start_nsqd_fixture(*, reactor: Any = None, **options: Any) -> Deferred[NsqdFixture]:
    """Start an nsqd for a test (127.0.0.1:0, no HTTPS, data in a fresh tmpfs directory).

    ``reactor``: what it runs on (the real reactor when None; a
    :class:`~nsqtw.testing.clock.VirtualTimeReactor` for virtual time).  Its traffic is
    recorded (:attr:`NsqdFixture.traffic`) and its randomness seeded, so a test on virtual
    time makes the same choices on every run.

    With the fixture's own throwaway directory, the disk sync worker runs its jobs
    inline, without fsync, instead of starting a thread: starting that thread is most of an
    nsqd's start-up time, and nothing in a directory deleted after the test needs to survive
    a power loss.  As :func:`nsqtw.embed.start_nsqd`, it changes nothing in pytest's process.
    """
    from twisted.internet import defer

    from nsqtw.embed import NsqdHandle, embedded_nsqd_options
    from nsqtw.testing.traffic import TrafficRecorder

    data_dir = None
    if not options.get("data_path"):
        data_dir = options["data_path"] = fast_data_dir()
    reactor = reactor if reactor is not None else _reactor()

    def cleanup() -> None:
        if data_dir:
            shutil.rmtree(data_dir, ignore_errors=True)

    traffic = TrafficRecorder()
    try:
        service = _build_service(embedded_nsqd_options(**options), reactor, data_dir is not None, traffic)
    except Exception:
        cleanup()
        return defer.fail()
    handle = NsqdHandle(service)
    fixture = NsqdFixture(handle, data_dir, reactor=reactor, traffic=traffic)

    def failed(f: Failure) -> Deferred[NsqdFixture]:
        stopping: Deferred[Any] = fixture.stop()
        return stopping.addBoth(lambda _: f)

    return service.ready().addCallbacks(lambda _: fixture, failed)


def _build_service(options: NsqdOptions, reactor: Any, throwaway: bool,
                   traffic: TrafficRecorder) -> NsqdService:
    """An nsqd whose traffic ``traffic`` records, started (its listeners may still be binding)."""
    import random

    from nsqtw.nsqd.service import NsqdService

    service = NsqdService(options, reactor, rng=random.Random(0), throwaway=throwaway)
    traffic.attach(service.broker)  # before the start makes the channels of nsqd.dat
    service.startService()
    return service


def _options_from_marker(request: pytest.FixtureRequest, name: str) -> dict[str, Any]:
    marker = request.node.get_closest_marker(name)
    return dict(marker.kwargs) if marker else {}


def _fixture_reactor(request: pytest.FixtureRequest) -> Any:
    """The real reactor; with ``nsqtw_clock`` in the test, one taking its time from the clock."""
    if "nsqtw_clock" not in request.fixturenames:
        return _reactor()
    from nsqtw.testing.clock import VirtualTimeReactor

    return VirtualTimeReactor(request.getfixturevalue("nsqtw_clock"), _reactor())


@pytest.fixture
def nsqtw_clock() -> Clock:
    """Virtual time: a ``task.Clock`` (starting at :data:`~nsqtw.testing.clock.VIRTUAL_EPOCH`)
    that runs every timer of the test's nsqd and nsqlookupd fixtures: message timeouts,
    deferred messages, requeue delays, heartbeats, lookupd polls, queue scans.  Sockets stay
    real.  ``nsqtw_clock.advance(61)`` times out a message left unfinished."""
    from nsqtw.testing.clock import virtual_clock

    return virtual_clock()


@pytest.fixture
def nsqtw_reactor(request: pytest.FixtureRequest) -> Any:
    """The reactor to hand to the test's own clients (``Consumer(..., reactor=nsqtw_reactor)``):
    with ``nsqtw_clock``, their timers run on the clock too; without it, the real reactor."""
    _pytest_twisted()
    return _fixture_reactor(request)


@pytest.fixture
def nsqtw_nsqd(request: pytest.FixtureRequest) -> Iterator[NsqdFixture]:
    """An in-process nsqd on 127.0.0.1 (ports chosen by the OS); ``@pytest.mark.nsqtw_options(...)``."""
    pt = _pytest_twisted()
    nsqd = pt.blockon(start_nsqd_fixture(reactor=_fixture_reactor(request),
                                         **_options_from_marker(request, "nsqtw_options")))
    try:
        yield nsqd
    finally:
        pt.blockon(nsqd.stop())


@pytest.fixture
def nsqtw_nsqd_factory(request: pytest.FixtureRequest) -> Iterator[Callable[..., Deferred[NsqdFixture]]]:
    """``await nsqtw_nsqd_factory(**options)``: more nsqd, all stopped after the test (the
    factory returns a Deferred firing with an :class:`NsqdFixture`)."""
    pt = _pytest_twisted()
    started: list[NsqdFixture] = []
    reactor = _fixture_reactor(request)

    def factory(**options: Any) -> Deferred[NsqdFixture]:
        d = start_nsqd_fixture(reactor=reactor, **options)

        def keep(n: NsqdFixture) -> NsqdFixture:
            started.append(n)
            return n

        d.addCallback(keep)
        return d

    try:
        yield factory
    finally:
        from twisted.internet import defer
        pt.blockon(defer.DeferredList([n.stop() for n in started], consumeErrors=True))


# --- nsqlookupd -------------------------------------------------------------------------------


class LookupdFixture:
    """A running in-process nsqlookupd."""

    def __init__(self, handle: LookupdHandle) -> None:
        #: the embedded nsqlookupd (:class:`nsqtw.embed.LookupdHandle`)
        self.handle = handle

    @property
    def tcp_address(self) -> str:
        """``127.0.0.1:PORT`` of nsqlookupd's TCP listener (nsqd's ``--lookupd-tcp-address``)."""
        return self.handle.tcp_address

    @property
    def http_address(self) -> str:
        """``127.0.0.1:PORT`` of nsqlookupd's HTTP API (a consumer's ``connect_to_nsqlookupd``)."""
        return self.handle.http_address

    @property
    def http_url(self) -> str:
        """``http://127.0.0.1:PORT``, for treq or any HTTP client."""
        return f"http://{self.http_address}"

    @property
    def _db(self) -> RegistrationDB:
        # nsqtw's internals, for its own white-box tests (not part of the fixture's face)
        return self.handle._db

    def producers(self, topic: str | None = None) -> list[Registration]:
        """Registered nsqd: all identified ones, or the producers of ``topic``. Answers at once:
        a ``list``, not a Deferred (do not ``await`` it)."""
        if topic is None:
            return list(self._db.find_producers("client", "", ""))
        return list(self._db.find_producers("topic", topic, ""))

    def wait_for_producers(self, n: int, topic: str | None = None,
                           timeout: float | None = 5.0) -> Deferred[list[Registration]]:
        """A Deferred (await it): fires with the producers once ``n`` nsqd are registered (for
        ``topic`` when given); fails with TimeoutError after ``timeout`` seconds."""
        from twisted.internet import defer, task

        async def poll() -> list[Registration]:
            while len(self.producers(topic)) < n:
                await task.deferLater(_reactor(), 0.002, lambda: None)
            return self.producers(topic)

        d = defer.ensureDeferred(poll())
        what = f"topic {topic}" if topic else "the cluster"
        return _timeout(d, timeout,
                        lambda: f"{len(self.producers(topic))} of {n} nsqd registered for {what} within {timeout}s")

    def stop(self) -> Deferred[None]:
        """A Deferred (await it); the fixture calls it after the test itself."""
        return self.handle.stop()

    def __repr__(self) -> str:
        return f"<nsqtw nsqlookupd tcp={self.tcp_address} http={self.http_address}>"


def start_lookupd_fixture(*, reactor: Any = None, **options: Any) -> Deferred[LookupdFixture]:
    """Start an nsqlookupd for a test on ``reactor`` (the real one when None)."""
    from nsqtw.embed import start_nsqlookupd

    return start_nsqlookupd(reactor if reactor is not None else _reactor(), **options).addCallback(LookupdFixture)


@pytest.fixture
def nsqtw_lookupd(request: pytest.FixtureRequest) -> Iterator[LookupdFixture]:
    """An in-process nsqlookupd on 127.0.0.1 (ports chosen by the OS)."""
    pt = _pytest_twisted()
    lookupd = pt.blockon(start_lookupd_fixture(reactor=_fixture_reactor(request)))
    try:
        yield lookupd
    finally:
        pt.blockon(lookupd.stop())


# --- a cluster ---------------------------------------------------------------------------------


#: a node's key in ``nodes=[...]`` that is not an nsqd option: the indexes of the nodes it
#: replicates to (their replication addresses become its ``replica_peers``)
REPLICATE_TO = "replicate_to"


def replication_security_options(secret_file: str) -> dict[str, Any]:
    """The options every replicated node of a cluster fixture gets, given the cluster's
    secret file (a fresh random secret, written for each cluster in its own directory): the
    nodes prove it to each other on every replication link."""
    return {"replication_secret_file": secret_file}


class ClusterFixture:
    """An nsqlookupd and N nsqd registered with it (optionally replicating to each other)."""

    def __init__(self, lookupd: LookupdFixture, nsqds: list[NsqdFixture], *,
                 secret_file: str | None = None, tempdir: str | None = None) -> None:
        #: the nsqlookupd every nsqd of the cluster registers with
        self.lookupd = lookupd
        #: the nsqd nodes (``@pytest.mark.nsqtw_cluster(nsqd=N)``; 2 by default), each registered
        self.nsqds = nsqds
        #: a file holding a random secret made for this cluster (see
        #: :func:`replication_security_options`); deleted with the cluster
        self.secret_file = secret_file
        self._tempdir = tempdir

    @property
    def nsqd_tcp_addresses(self) -> list[str]:
        """Every nsqd's TCP address, in the order of :attr:`nsqds`."""
        return [n.tcp_address for n in self.nsqds]

    @property
    def nsqd_http_addresses(self) -> list[str]:
        """Every nsqd's HTTP address, in the order of :attr:`nsqds`."""
        return [n.http_address or "" for n in self.nsqds]

    @property
    def lookupd_http_address(self) -> str:
        """The nsqlookupd's HTTP address (what consumers and nsqadmin are given)."""
        return self.lookupd.http_address

    @property
    def replication_addresses(self) -> list[str | None]:
        """Each node's replication address (None for a node without one)."""
        return [n.replication_address for n in self.nsqds]

    def links_in_sync(self) -> bool:
        """True when every replication link of every running node is in sync (read from each
        node's /stats replication section).  Answers at once: not a Deferred (do not
        ``await`` it)."""
        for n in self.nsqds:
            if n._stopped:
                continue
            doc = n._service.replication_stats() or {}
            if any(peer.get("state") != "in_sync" for peer in doc.get("peers", ())):
                return False
        return True

    def wait_in_sync(self, timeout: float | None = 5.0) -> Deferred[None]:
        """A Deferred (await it): fires once every replication link is in sync; fails with
        TimeoutError after ``timeout`` seconds."""
        return _wait_until(self.links_in_sync, timeout, "every replication link in sync")

    def kill(self, index: int) -> Deferred[None]:
        """Take node ``index`` away (its listeners, connections and replication links close;
        its data is deleted): a node that keeps its shadow adopts its unfinished messages
        after ``adopt_after``. A Deferred (await it)."""
        return self.nsqds[index].stop()

    def cut_link(self, origin: int, replica: int) -> bool:
        """Break the replication link from node ``origin`` to node ``replica`` now, as a network
        failure would (False if there was none).  The origin reconnects after a second of its
        clock: with ``nsqtw_clock`` the link stays cut until the clock moves.  Done at once:
        not a Deferred (do not ``await`` it)."""
        address = self.nsqds[replica].replication_address
        replication = self.nsqds[origin]._service.replication
        link = replication.links.get(address) if replication is not None and address else None
        if link is None or link.transport is None:
            return False
        link.transport.abortConnection()
        return True

    def stop(self) -> Deferred[None]:
        """Stop every nsqd, then nsqlookupd. A Deferred (await it); the fixture calls it itself."""
        from twisted.internet import defer

        d: Deferred[Any] = defer.DeferredList([n.stop() for n in self.nsqds], consumeErrors=True)

        def cleanup(_: object) -> Deferred[None]:
            if self._tempdir:
                shutil.rmtree(self._tempdir, ignore_errors=True)
            return self.lookupd.stop()

        return d.addBoth(cleanup)

    def __repr__(self) -> str:
        return f"<nsqtw cluster lookupd={self.lookupd.http_address} nsqd={self.nsqd_tcp_addresses}>"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _node_options(n: int, nodes: Sequence[dict[str, Any]] | None, common: dict[str, Any],
                  secret_file: str) -> list[dict[str, Any]]:
    """Each node's nsqd options: the common ones, then its own; distinct node IDs; the
    replication addresses of the nodes others replicate to chosen now (they must be named
    before they listen), and ``replicate_to`` turned into ``replica_peers``."""
    specs = [dict(spec) for spec in nodes] if nodes is not None else [{} for _ in range(n)]
    out = [dict(common, **spec) for spec in specs]
    for i, opts in enumerate(out):
        opts.setdefault("node_id", i + 1)
        for j in opts.get(REPLICATE_TO, ()):
            if not 0 <= j < len(out) or j == i:
                raise ValueError(f"node {i}: replicate_to names node {j} (of 0..{len(out) - 1}, not itself)")
    targets = {j for opts in out for j in opts.get(REPLICATE_TO, ())}
    for j in sorted(targets):
        address = out[j].get("replication_address", "")
        if not address or address.endswith(":0"):
            out[j]["replication_address"] = f"127.0.0.1:{_free_port()}"
    for opts in out:
        to = opts.pop(REPLICATE_TO, None)
        if to:
            opts["replica_peers"] = [out[j]["replication_address"] for j in to]
        if opts.get("replica_peers") or opts.get("replication_address"):
            opts.update(replication_security_options(secret_file))
    return out


def start_cluster_fixture(n: int = 2, timeout: float = 5.0, *, nodes: Sequence[dict[str, Any]] | None = None,
                          reactor: Any = None, **nsqd_options: Any) -> Deferred[ClusterFixture]:
    """Start nsqlookupd, then ``n`` nsqd pointed at it (or one per entry of ``nodes``: its own
    options over ``nsqd_options``; ``replicate_to=[j, ...]`` makes node ``j`` its replica).
    A Deferred (await it): fires with the :class:`ClusterFixture` once every nsqd is registered
    and every replication link is in sync."""
    import os
    import tempfile

    from twisted.internet import defer

    async def start() -> ClusterFixture:
        tempdir = tempfile.mkdtemp(prefix="nsqtw-cluster-")
        secret_file = os.path.join(tempdir, "replication.secret")
        fd = os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(os.urandom(32).hex() + "\n")
        try:
            specs = _node_options(n, nodes, nsqd_options, secret_file)
            lookupd = await start_lookupd_fixture(reactor=reactor)
        except BaseException:
            shutil.rmtree(tempdir, ignore_errors=True)
            raise
        nsqds: list[NsqdFixture] = []
        cluster = ClusterFixture(lookupd, nsqds, secret_file=secret_file, tempdir=tempdir)
        try:
            for opts in specs:
                opts["lookupd_tcp_addresses"] = [lookupd.tcp_address]
                nsqds.append(await start_nsqd_fixture(reactor=reactor, **opts))
            await lookupd.wait_for_producers(len(specs), timeout=timeout)
            await cluster.wait_in_sync(timeout)
        except BaseException:
            await cluster.stop()
            raise
        return cluster

    return defer.ensureDeferred(start())


@pytest.fixture
def nsqtw_cluster(request: pytest.FixtureRequest) -> Iterator[ClusterFixture]:
    """nsqlookupd + N nsqd registered with it: ``@pytest.mark.nsqtw_cluster(nsqd=3, **nsqd_options)``,
    or one nsqd per entry of ``nodes=[{...}, {...}]`` (each its own options; ``replicate_to``)."""
    pt = _pytest_twisted()
    options = _options_from_marker(request, "nsqtw_cluster")
    n = int(options.pop("nsqd", 2))
    cluster = pt.blockon(start_cluster_fixture(n, reactor=_fixture_reactor(request), **options))
    try:
        yield cluster
    finally:
        pt.blockon(cluster.stop())
