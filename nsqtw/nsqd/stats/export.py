"""
Hourly JSON Lines snapshots of ``/stats`` (``--stats-export-path``), for Spark.

Every ``--stats-export-interval`` the :class:`StatsExportService` takes the
``/stats?format=json`` document (clients and memory included) in the reactor
thread, and a single worker thread serialises it and appends one line::

    {"timestamp":1700000000.0,"time":"2023-11-14T22:13:20Z",
     "node":{"broadcast_address":"h","hostname":"h","tcp_port":4150,"http_port":4151},
     "stats":<the /stats document, byte for byte as go_json writes it>}

to ``<path>/nsqd-stats.<YYYY-MM-DD_HH>.<host key>.jsonl`` (UTC hour of the
snapshot; host key = ``broadcast_address:http_port`` with ``.`` and ``:`` as
``_``, as statsd's).  Every node of a cluster can write into one shared
directory, and ``nsqtw-stats`` (or any Spark job) reads the lot with a glob.
Lines are flushed whole, so a reader never sees half a snapshot.
"""

from __future__ import annotations

import os
import socket
from datetime import datetime, timezone
from typing import Any, IO
from collections.abc import Callable

from twisted.application.service import Service
from twisted.internet import defer, task
from twisted.logger import Logger

from .node import StatsNode
from .snapshot import broker_stats, go_json

__all__ = ["StatsExportService", "node_identity", "host_key", "export_filename", "snapshot_line",
           "FILE_PREFIX", "FILE_SUFFIX"]

log = Logger(namespace="nsqtw.nsqd.stats.export")

FILE_PREFIX = "nsqd-stats."
FILE_SUFFIX = ".jsonl"

#: ``run_in_thread(f, *args) -> Deferred``: how blocking work leaves the reactor.
ThreadRunner = Callable[..., defer.Deferred]


def host_key(broadcast_address: str, http_port: int) -> str:
    """statsd's ``HostKey(JoinHostPort(addr, port))``: ``.`` and ``:`` become ``_``."""
    host = f"[{broadcast_address}]" if ":" in broadcast_address else broadcast_address
    return f"{host}:{http_port}".replace(".", "_").replace(":", "_")


def node_identity(node: StatsNode, hostname: str | None = None) -> dict[str, Any]:
    """Who wrote a snapshot: broadcast address, broadcast (or bound) ports, hostname."""
    opts = node.options
    tcp_port = opts.broadcast_tcp_port or (node.tcp_port or 0)
    http_port = opts.broadcast_http_port or (node.http_port or 0)
    return {
        "broadcast_address": opts.broadcast_address,
        "hostname": hostname if hostname is not None else socket.gethostname(),
        "tcp_port": int(tcp_port),
        "http_port": int(http_port),
    }


def export_filename(now: float, identity: dict[str, Any]) -> str:
    """One file per node and UTC hour; the date leads so globs select time ranges."""
    hour = datetime.fromtimestamp(now, tz=timezone.utc).strftime("%Y-%m-%d_%H")
    return f"{FILE_PREFIX}{hour}.{host_key(identity['broadcast_address'], identity['http_port'])}{FILE_SUFFIX}"


def snapshot_line(now: float, identity: dict[str, Any], doc: dict[str, Any]) -> bytes:
    """One JSON Lines record; ``stats`` is exactly ``go_json(doc)``."""
    ts = round(now, 3)
    iso = datetime.fromtimestamp(now, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    iso = iso[:-4] + "Z"  # milliseconds
    head = go_json({"timestamp": ts, "time": iso, "node": identity})
    return head[:-1] + b',"stats":' + go_json(doc) + b"}\n"


class _HourlyFiles:
    """The worker thread's side: append lines, one open file per hour (thread-confined)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._name: str | None = None
        self._file: IO[bytes] | None = None

    def write(self, name: str, line: bytes) -> str:
        if name != self._name:
            self.close()
            os.makedirs(self.directory, exist_ok=True)
            self._file = open(os.path.join(self.directory, name), "ab")
            self._name = name
        assert self._file is not None
        self._file.write(line)
        self._file.flush()
        return os.path.join(self.directory, name)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file = None
        self._name = None


class StatsExportService(Service):
    """Write a ``/stats`` snapshot line every ``interval`` seconds; attach to an NsqdService."""

    name = "stats-export"  # type: ignore[assignment]  # Twisted's Service declares name = None (unannotated)

    def __init__(self, node: StatsNode, *, path: str | None = None, interval: float | None = None,
                 clock: Any = None, run_in_thread: ThreadRunner | None = None,
                 hostname: str | None = None) -> None:
        self.node = node
        self.path = path if path is not None else node.options.stats_export_path
        self.interval = float(interval if interval is not None else node.options.stats_export_interval)
        if not self.path:
            raise ValueError("--stats-export-path is empty")
        if self.interval <= 0:
            raise ValueError("--stats-export-interval must be positive")
        self.clock = clock if clock is not None else node.reactor
        self.hostname = hostname if hostname is not None else socket.gethostname()
        self._run_in_thread = run_in_thread
        self._pool: Any = None
        self._files = _HourlyFiles(self.path)
        self._loop: task.LoopingCall | None = None
        self._pending: defer.Deferred | None = None
        self.written = 0
        self.skipped = 0

    # --- lifecycle ----------------------------------------------------------------

    def startService(self) -> None:
        super().startService()
        if self._run_in_thread is None:
            from twisted.python.threadpool import ThreadPool
            from twisted.internet.threads import deferToThreadPool
            reactor = self.node.reactor
            self._pool = ThreadPool(minthreads=1, maxthreads=1, name="nsqtw-stats-export")
            self._pool.start()
            pool = self._pool
            self._run_in_thread = lambda f, *a: deferToThreadPool(reactor, pool, f, *a)
        self._loop = task.LoopingCall(self._tick)
        self._loop.clock = self.clock
        self._loop.start(self.interval, now=False)

    def stopService(self) -> defer.Deferred:
        """Stop ticking, let the last write finish, close the file, stop the thread."""
        super().stopService()
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None
        pending = self._pending if self._pending is not None else defer.succeed(None)
        d: defer.Deferred[Any] = defer.Deferred()

        def relay(result: Any) -> Any:
            d.callback(None)
            return result

        pending.addBoth(relay)

        def close(_: Any) -> Any:
            closing = self._run_in_thread(self._files.close) if self._run_in_thread else defer.succeed(None)
            return closing.addBoth(lambda _: self._stop_pool())

        return d.addCallback(close)

    def _stop_pool(self) -> None:
        if self._pool is not None:
            self._pool.stop()
            self._pool = None
            self._run_in_thread = None

    # --- snapshots --------------------------------------------------------------------

    def _tick(self) -> None:
        if self._pending is not None:
            self.skipped += 1
            log.warn("STATS EXPORT: previous snapshot still being written, skipping one")
            return
        self.snapshot_now()

    def snapshot_now(self) -> defer.Deferred:
        """Take a snapshot now; fires with the file written once the line is on disk."""
        now = self.clock.seconds()
        try:
            doc = broker_stats(self.node.broker, now)
            identity = node_identity(self.node, self.hostname)
        except Exception:
            log.failure("STATS EXPORT: collecting /stats failed")
            return defer.succeed(None)
        name = export_filename(now, identity)
        assert self._run_in_thread is not None, "service not running"
        d = self._run_in_thread(self._write, name, now, identity, doc)
        self._pending = d

        def done(result: Any) -> Any:
            if self._pending is d:
                self._pending = None
            return result

        def failed(f: Any) -> None:
            log.failure("STATS EXPORT: writing {name} failed", f, name=name)
            return None

        d.addBoth(done)
        d.addErrback(failed)
        return d

    def _write(self, name: str, now: float, identity: dict[str, Any], doc: dict[str, Any]) -> str:
        written = self._files.write(name, snapshot_line(now, identity, doc))
        self.written += 1
        return written
