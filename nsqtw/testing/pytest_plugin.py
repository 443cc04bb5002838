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
  (:class:`ClusterFixture`; ``@pytest.mark.nsqtw_cluster(nsqd=3)``, default 2).

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
    from twisted.python.failure import Failure

    from nsqtw.client import Consumer, Message, Producer
    from nsqtw.lookupd.core.registry import Producer as Registration, RegistrationDB
    from nsqtw.lookupd.embed import LookupdHandle
    from nsqtw.nsqd.core.broker import Broker
    from nsqtw.nsqd.embed import NsqdHandle
    from nsqtw.nsqd.service import NsqdService
    from nsqtw.options import NsqdOptions

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
    "start_nsqd_fixture",
    "fast_data_dir",
]

T = TypeVar("T")

_SKIP_NO_PT = ("nsqtw's fixtures run nsqd inside pytest-twisted's reactor: "
               "install pytest-twisted (pip install pytest-twisted)")
_SKIP_INACTIVE = ("nsqtw's fixtures need pytest-twisted's reactor, but the plugin is not active "
                  "(was it disabled with -p no:twisted?)")


def pytest_configure(config: pytest.Config) -> None:
    """Declare the markers (never fails: a broken plugin must not break someone's run)."""
    try:
        config.addinivalue_line("markers", "nsqtw_options(**kwargs): NsqdOptions for the nsqtw_nsqd fixture")
        config.addinivalue_line("markers", "nsqtw_cluster(nsqd=2, **kwargs): size and nsqd options of nsqtw_cluster")
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


# --- nsqd --------------------------------------------------------------------------------------


class NsqdFixture:
    """A running in-process nsqd and helpers to talk to it.

    Which to ``await``: ``publish``, ``multi_publish``, ``deferred_publish``,
    ``wait_for_messages`` and ``stop`` return a Deferred (await it); ``depth`` and ``stats``
    answer at once (an ``int``, a ``dict``: never ``await`` them), as do the properties.
    The signatures say so, so ``await nsqtw_nsqd.depth("t")`` is a mypy error."""

    def __init__(self, handle: NsqdHandle, data_dir: str | None) -> None:
        self.handle = handle
        self._data_dir = data_dir
        self._producer: Producer | None = None
        self._consumers: list[Consumer] = []
        self._stopped = False

    # addresses
    @property
    def tcp_address(self) -> str:
        return self.handle.tcp_address

    @property
    def http_address(self) -> str | None:
        return self.handle.http_address

    @property
    def tcp_port(self) -> int:
        return self.handle.tcp_port

    @property
    def http_port(self) -> int | None:
        return self.handle.http_port

    @property
    def http_url(self) -> str:
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
        return self.handle.options

    @property
    def data_path(self) -> str:
        return self.handle.options.data_path

    # helpers
    def _producer_for(self) -> Producer:
        if self._producer is None:
            from nsqtw.client import Producer
            self._producer = Producer(self.handle)  # the in-process bus: real V2 protocol, no socket
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

        consumer = Consumer(topic, channel, handle, Config(max_in_flight=max(1, n)), reactor=_reactor())
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

    def stop(self) -> Deferred[None]:
        """Stop everything the fixture started, then the broker; delete its temporary data.
        A Deferred (await it); the fixtures call it after the test themselves."""
        from twisted.internet import defer

        if self._stopped:
            return defer.succeed(None)
        self._stopped = True
        waits: list[Deferred[Any]] = [c.stop() for c in self._consumers]
        if self._producer is not None:
            waits.append(self._producer.stop(timeout=1.0))
        d: Deferred[Any] = defer.DeferredList(waits, consumeErrors=True)
        d.addCallback(lambda _: self.handle.stop())

        def cleanup(result: object) -> object:
            if self._data_dir:
                shutil.rmtree(self._data_dir, ignore_errors=True)
            return result

        return d.addBoth(cleanup)

    def __repr__(self) -> str:
        return f"<nsqtw nsqd tcp={self.tcp_address} http={self.http_address}>"


def start_nsqd_fixture(**options: Any) -> Deferred[NsqdFixture]:
    """Start an nsqd for a test (127.0.0.1:0, no HTTPS, data in a fresh tmpfs directory).

    With the fixture's own throwaway directory, the disk sync worker runs its jobs
    inline, without fsync, instead of starting a thread: starting that thread is most of an
    nsqd's start-up time, and nothing in a directory deleted after the test needs to survive
    a power loss.  As :func:`nsqtw.embed.start_nsqd`, it changes nothing in pytest's process.
    """
    from twisted.internet import defer

    from nsqtw.embed import NsqdHandle, embedded_nsqd_options
    from nsqtw.nsqd.service import build_nsqd

    data_dir = None
    if not options.get("data_path"):
        data_dir = options["data_path"] = fast_data_dir()
    reactor = _reactor()

    def cleanup() -> None:
        if data_dir:
            shutil.rmtree(data_dir, ignore_errors=True)

    try:
        service = build_nsqd(embedded_nsqd_options(**options), reactor, throwaway=data_dir is not None)
        service.startService()
    except Exception:
        cleanup()
        return defer.fail()
    handle = NsqdHandle(service)
    fixture = NsqdFixture(handle, data_dir)

    def failed(f: Failure) -> Deferred[NsqdFixture]:
        stopping: Deferred[Any] = fixture.stop()
        return stopping.addBoth(lambda _: f)

    return service.ready().addCallbacks(lambda _: fixture, failed)


def _options_from_marker(request: pytest.FixtureRequest, name: str) -> dict[str, Any]:
    marker = request.node.get_closest_marker(name)
    return dict(marker.kwargs) if marker else {}


@pytest.fixture
def nsqtw_nsqd(request: pytest.FixtureRequest) -> Iterator[NsqdFixture]:
    """An in-process nsqd on 127.0.0.1 (ports chosen by the OS); ``@pytest.mark.nsqtw_options(...)``."""
    pt = _pytest_twisted()
    nsqd = pt.blockon(start_nsqd_fixture(**_options_from_marker(request, "nsqtw_options")))
    try:
        yield nsqd
    finally:
        pt.blockon(nsqd.stop())


@pytest.fixture
def nsqtw_nsqd_factory() -> Iterator[Callable[..., Deferred[NsqdFixture]]]:
    """``await nsqtw_nsqd_factory(**options)``: more nsqd, all stopped after the test (the
    factory returns a Deferred firing with an :class:`NsqdFixture`)."""
    pt = _pytest_twisted()
    started: list[NsqdFixture] = []

    def factory(**options: Any) -> Deferred[NsqdFixture]:
        d = start_nsqd_fixture(**options)

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
        self.handle = handle

    @property
    def tcp_address(self) -> str:
        return self.handle.tcp_address

    @property
    def http_address(self) -> str:
        return self.handle.http_address

    @property
    def http_url(self) -> str:
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


def start_lookupd_fixture(**options: Any) -> Deferred[LookupdFixture]:
    from nsqtw.embed import start_nsqlookupd

    return start_nsqlookupd(_reactor(), **options).addCallback(LookupdFixture)


@pytest.fixture
def nsqtw_lookupd() -> Iterator[LookupdFixture]:
    """An in-process nsqlookupd on 127.0.0.1 (ports chosen by the OS)."""
    pt = _pytest_twisted()
    lookupd = pt.blockon(start_lookupd_fixture())
    try:
        yield lookupd
    finally:
        pt.blockon(lookupd.stop())


# --- a cluster ---------------------------------------------------------------------------------


class ClusterFixture:
    """An nsqlookupd and N nsqd registered with it."""

    def __init__(self, lookupd: LookupdFixture, nsqds: list[NsqdFixture]) -> None:
        self.lookupd = lookupd
        self.nsqds = nsqds

    @property
    def nsqd_tcp_addresses(self) -> list[str]:
        return [n.tcp_address for n in self.nsqds]

    @property
    def nsqd_http_addresses(self) -> list[str]:
        return [n.http_address or "" for n in self.nsqds]

    @property
    def lookupd_http_address(self) -> str:
        return self.lookupd.http_address

    def stop(self) -> Deferred[None]:
        """Stop every nsqd, then nsqlookupd. A Deferred (await it); the fixture calls it itself."""
        from twisted.internet import defer

        d: Deferred[Any] = defer.DeferredList([n.stop() for n in self.nsqds], consumeErrors=True)
        return d.addBoth(lambda _: self.lookupd.stop())

    def __repr__(self) -> str:
        return f"<nsqtw cluster lookupd={self.lookupd.http_address} nsqd={self.nsqd_tcp_addresses}>"


def start_cluster_fixture(n: int = 2, timeout: float = 5.0, **nsqd_options: Any) -> Deferred[ClusterFixture]:
    """Start nsqlookupd, then ``n`` nsqd pointed at it. A Deferred (await it): fires with the
    :class:`ClusterFixture` once all are registered."""
    from twisted.internet import defer

    async def start() -> ClusterFixture:
        lookupd = await start_lookupd_fixture()
        nsqds: list[NsqdFixture] = []
        cluster = ClusterFixture(lookupd, nsqds)
        try:
            for _ in range(n):
                opts = dict(nsqd_options, lookupd_tcp_addresses=[lookupd.tcp_address])
                nsqds.append(await start_nsqd_fixture(**opts))
            await lookupd.wait_for_producers(n, timeout=timeout)
        except BaseException:
            await cluster.stop()
            raise
        return cluster

    return defer.ensureDeferred(start())


@pytest.fixture
def nsqtw_cluster(request: pytest.FixtureRequest) -> Iterator[ClusterFixture]:
    """nsqlookupd + N nsqd registered with it; ``@pytest.mark.nsqtw_cluster(nsqd=3, **nsqd_options)``."""
    pt = _pytest_twisted()
    options = _options_from_marker(request, "nsqtw_cluster")
    n = int(options.pop("nsqd", 2))
    cluster = pt.blockon(start_cluster_fixture(n, **options))
    try:
        yield cluster
    finally:
        pt.blockon(cluster.stop())
