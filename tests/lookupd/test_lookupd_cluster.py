"""A real multi-process cluster: one nsqlookupd under ``twistd`` and two nsqd processes.

nsqlookupd runs as ``twistd -n nsqlookupd`` with the repo's plugin file made
discoverable through a temporary ``twisted/plugins`` directory on PYTHONPATH
(a bare checkout is not an installed package).  Each nsqd runs from
``cluster_runner.py``, which builds the tree with the nsqd tap and attaches
the lookupd peers.  The tests wait for log lines of the processes (events,
not sleeps) and check nsqlookupd's HTTP answers.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any
from re import Pattern

import pytest
import pytest_twisted
from twisted.internet import defer
from twisted.internet.protocol import ProcessProtocol

from lookupd_helpers import get, post, within

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
START_TIMEOUT = 30.0

_LISTEN = r"{label}: listening on 127\.0\.0\.1:(\d+)"
_READY = re.compile(r"READY tcp=(\d+) http=(\d+)")


class Daemon(ProcessProtocol):
    """A child process whose output lines can be awaited by regular expression."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lines: list[str] = []
        self._partial = ""
        self._waiters: list[tuple[Pattern[str], int, list[re.Match], defer.Deferred]] = []
        self.ended: defer.Deferred = defer.Deferred()

    def outReceived(self, data: bytes) -> None:
        text = self._partial + data.decode("utf-8", "replace")
        *complete, self._partial = text.split("\n")
        for line in complete:
            self.lines.append(line)
            for waiter in list(self._waiters):
                pattern, count, found, d = waiter
                m = pattern.search(line)
                if m:
                    found.append(m)
                    if len(found) >= count:
                        self._waiters.remove(waiter)
                        d.callback(found)

    errReceived = outReceived

    def processEnded(self, reason: Any) -> None:
        waiters, self._waiters = self._waiters, []
        for _, _, _, d in waiters:
            d.errback(RuntimeError(f"{self.name} ended; output:\n" + "\n".join(self.lines[-40:])))
        self.ended.callback(None)

    def wait_for(self, pattern: str, count: int = 1, since: int = 0,
                 timeout: float = START_TIMEOUT) -> defer.Deferred:
        """The first ``count`` matches among the lines from index ``since`` on, present or future."""
        regex = re.compile(pattern)
        found = [m for m in (regex.search(line) for line in self.lines[since:]) if m]
        if len(found) >= count:
            return defer.succeed(found[:count])
        d: defer.Deferred = defer.Deferred()
        self._waiters.append((regex, count, found, d))

        def explain(f: Any) -> Any:
            if f.check(defer.TimeoutError):
                raise AssertionError(f"{self.name}: no {count} x {pattern!r}; output:\n"
                                     + "\n".join(self.lines[-40:]))
            return f

        return within(d, timeout).addErrback(explain)

    async def stop(self) -> None:
        if self.ended.called:
            return
        self.transport.signalProcess("TERM")
        try:
            await within(self.ended, 15.0)
        except defer.TimeoutError:
            self.transport.signalProcess("KILL")
            await within(self.ended, 5.0)


def _environment(plugin_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(HERE), str(plugin_dir)])
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture
def plugin_dir(tmp_path: Path) -> Path:
    """A ``twisted/plugins`` directory holding the repo's plugin file, for PYTHONPATH."""
    target = tmp_path / "plugins" / "twisted" / "plugins"
    target.mkdir(parents=True)
    shutil.copy(ROOT / "plugins" / "nsqtw_plugins.py", target / "nsqtw_plugins.py")
    return tmp_path / "plugins"


class Cluster:
    """Starts and stops the processes of one test."""

    def __init__(self, tmp_path: Path, plugin_dir: Path) -> None:
        self.tmp_path = tmp_path
        self.env = _environment(plugin_dir)
        self.daemons: list[Daemon] = []

    def spawn(self, name: str, argv: list[str]) -> Daemon:
        from twisted.internet import reactor

        daemon = Daemon(name)
        cwd = self.tmp_path / name
        cwd.mkdir(exist_ok=True)
        reactor.spawnProcess(daemon, argv[0], argv, env=self.env, path=str(cwd))
        self.daemons.append(daemon)
        return daemon

    async def nsqlookupd(self, name: str, tcp_port: int = 0, *flags: str) -> tuple[Daemon, int, int]:
        """``twistd -n nsqlookupd`` on 127.0.0.1; (process, tcp port, http port)."""
        daemon = self.spawn(name, [str(BIN / "twistd"), "-n", "--pidfile=", "--logfile=-", "nsqlookupd",
                                   f"--tcp-address=127.0.0.1:{tcp_port}", "--http-address=127.0.0.1:0",
                                   "--broadcast-address=127.0.0.1", *flags])
        (tcp,) = await daemon.wait_for(_LISTEN.format(label="TCP"))
        (http,) = await daemon.wait_for(_LISTEN.format(label="HTTP"))
        return daemon, int(tcp.group(1)), int(http.group(1))

    async def nsqd(self, name: str, lookupd_tcp_port: int, *flags: str, data_name: str = "") -> tuple[Daemon, int, int]:
        """An nsqd process registered with the given nsqlookupd; (process, tcp port, http port)."""
        data = self.tmp_path / (data_name or name) / "data"
        data.mkdir(parents=True, exist_ok=True)
        daemon = self.spawn(name, [sys.executable, str(HERE / "cluster_runner.py"), "nsqd",
                                   "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                                   "--https-address=", "--broadcast-address=127.0.0.1",
                                   f"--lookupd-tcp-address=127.0.0.1:{lookupd_tcp_port}",
                                   f"--data-path={data}", *flags])
        (ready,) = await daemon.wait_for(_READY.pattern)
        return daemon, int(ready.group(1)), int(ready.group(2))

    async def stop(self) -> None:
        for daemon in reversed(self.daemons):
            await daemon.stop()


@pytest_twisted.async_yield_fixture
async def cluster(tmp_path, plugin_dir):
    c = Cluster(tmp_path, plugin_dir)
    yield c
    await c.stop()


def _registered(topic: str, channel: str = "") -> str:
    return (r"DB: client\((127\.0\.0\.1:\d+)\) REGISTER category:"
            + (f"channel key:{re.escape(topic)} subkey:{re.escape(channel)}$" if channel
               else f"topic key:{re.escape(topic)} subkey:$"))


@pytest_twisted.ensureDeferred
async def test_two_nsqd_one_nsqlookupd_cluster(cluster) -> None:
    """Two nsqd processes register with a twistd nsqlookupd: /lookup lists both producers, a new
    topic gets the channel nsqlookupd knows, and a restarted nsqlookupd is repopulated."""
    lookupd, lk_tcp, lk_http = await cluster.nsqlookupd("nsqlookupd")
    lk = f"127.0.0.1:{lk_http}"
    n1, n1_tcp, n1_http = await cluster.nsqd("nsqd1", lk_tcp)
    n2, n2_tcp, n2_http = await cluster.nsqd("nsqd2", lk_tcp)
    await lookupd.wait_for(r"IDENTIFY Address:127\.0\.0\.1 TCP:\d+ HTTP:\d+ Version:1\.3\.0", count=2)

    for http in (n1_http, n2_http):
        assert (await get(f"127.0.0.1:{http}", "/pub?topic=events", method="POST", data=b"e"))[:2] == (200, "OK")
    matches = await lookupd.wait_for(_registered("events"), count=2)
    assert len({m.group(1) for m in matches}) == 2
    code, body, _ = await get(lk, "/lookup?topic=events")
    assert code == 200
    assert sorted((p["tcp_port"], p["http_port"]) for p in body["producers"]) == sorted(
        [(n1_tcp, n1_http), (n2_tcp, n2_http)])
    assert len((await get(lk, "/nodes"))[1]["producers"]) == 2

    # channel pre-creation across processes: nsqd1 asks nsqlookupd's /channels for a new topic
    assert (await post(lk, "/channel/create?topic=orders&channel=billing"))[0] == 200
    mark = len(lookupd.lines)
    assert (await get(f"127.0.0.1:{n1_http}", "/pub?topic=orders", method="POST", data=b"o"))[0] == 200
    await lookupd.wait_for(_registered("orders", "billing"), since=mark)
    stats = (await get(f"127.0.0.1:{n1_http}", "/stats?format=json&topic=orders"))[1]
    (topic,) = stats["topics"]
    assert [(c["channel_name"], c["depth"]) for c in topic["channels"]] == [("billing", 1)]

    # restart nsqlookupd on the same TCP address: both nsqd replay their registrations
    await lookupd.stop()
    fresh, _, fresh_http = await cluster.nsqlookupd("nsqlookupd-2", tcp_port=lk_tcp)
    await fresh.wait_for(_registered("events"), count=2)
    await fresh.wait_for(_registered("orders", "billing"))
    lk = f"127.0.0.1:{fresh_http}"
    assert len((await get(lk, "/lookup?topic=events"))[1]["producers"]) == 2
    body = (await get(lk, "/lookup?topic=orders"))[1]
    assert body["channels"] == ["billing"] and [p["tcp_port"] for p in body["producers"]] == [n1_tcp]


async def _lookup_ports(lk: str, topic: str) -> set:
    code, body, _ = await get(lk, f"/lookup?topic={topic}")
    return {p["tcp_port"] for p in body["producers"]} if code == 200 else set()


async def _until(check: Any, timeout: float, what: str) -> None:
    from twisted.internet import reactor, task

    deadline = reactor.seconds() + timeout
    while not await check():
        if reactor.seconds() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await task.deferLater(reactor, 0.2, lambda: None)


@pytest_twisted.ensureDeferred
async def test_consumer_through_lookupd_survives_a_dead_node(cluster) -> None:
    """Two nsqd processes and a twistd nsqlookupd; a Consumer that knows only nsqlookupd receives
    every message; nsqd1 hangs (SIGSTOP): it leaves /lookup after --inactive-producer-timeout and
    the consumer keeps going on nsqd2; nsqd1 is then killed (SIGKILL) and restarted on its data:
    it is rediscovered and its disk backlog delivered."""
    from nsqtw.client import Config, Consumer

    lookupd, lk_tcp, lk_http = await cluster.nsqlookupd("nsqlookupd", 0, "--inactive-producer-timeout=20s")
    lk = f"127.0.0.1:{lk_http}"
    n1, n1_tcp, n1_http = await cluster.nsqd("nsqd1", lk_tcp, "--mem-queue-size=0")
    n2, n2_tcp, n2_http = await cluster.nsqd("nsqd2", lk_tcp)
    for http, tag in ((n1_http, b"one"), (n2_http, b"two")):
        body = b"\n".join(tag + b"-%d" % i for i in range(50))
        assert (await get(f"127.0.0.1:{http}", "/mpub?topic=events", method="POST", data=body))[0] == 200

    async def both_listed() -> bool:
        return await _lookup_ports(lk, "events") == {n1_tcp, n2_tcp}

    await _until(both_listed, 30, "both nodes in /lookup")
    got: list[bytes] = []
    consumer = Consumer("events", "c", lambda m: got.append(m.body),
                        Config(max_in_flight=20, lookupd_poll_interval=0.5, lookupd_poll_jitter=0.0))
    try:
        await consumer.connect_to_nsqlookupd(lk)
        expected = {b"one-%d" % i for i in range(50)} | {b"two-%d" % i for i in range(50)}

        async def all_first() -> bool:
            return expected <= set(got)

        await _until(all_first, 30, "every message of both nodes")

        # a backlog on nsqd1's disk, then nsqd1 hangs: gone from /lookup after the inactive timeout
        consumer.change_max_in_flight(0)
        body = b"\n".join(b"backlog-%d" % i for i in range(30))
        assert (await get(f"127.0.0.1:{n1_http}", "/mpub?topic=events", method="POST", data=body))[0] == 200
        n1.transport.signalProcess("STOP")
        consumer.change_max_in_flight(20)

        async def only_n2() -> bool:
            return await _lookup_ports(lk, "events") == {n2_tcp}

        await _until(only_n2, 60, "the hung node to leave /lookup")
        body = b"\n".join(b"meanwhile-%d" % i for i in range(30))
        assert (await get(f"127.0.0.1:{n2_http}", "/mpub?topic=events", method="POST", data=body))[0] == 200

        async def meanwhile() -> bool:
            return {b"meanwhile-%d" % i for i in range(30)} <= set(got)

        await _until(meanwhile, 30, "the surviving node's messages")

        # nsqd1 is killed and restarted on its data directory: rediscovered, backlog delivered
        n1.transport.signalProcess("KILL")
        await n1.ended
        n1b, n1b_tcp, _ = await cluster.nsqd("nsqd1-again", lk_tcp, "--mem-queue-size=0", data_name="nsqd1")

        async def backlog() -> bool:
            return {b"backlog-%d" % i for i in range(30)} <= set(got)

        await _until(backlog, 60, "the restarted node's disk backlog")
        assert n1b_tcp in await _lookup_ports(lk, "events")
    finally:
        await consumer.stop()
