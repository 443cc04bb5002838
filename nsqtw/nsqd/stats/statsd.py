"""
nsqd's statsd output (``--statsd-address`` and friends), metric for metric as nsqd's ``statsdLoop``.

Every ``--statsd-interval`` the :class:`StatsdService` takes ``/stats``
(without clients), turns it into NSQ's lines (``<prefix><stat>:<n>|c`` for
counters, which are deltas since the previous push, and ``|g`` for gauges),
packs them into datagrams of at most ``--statsd-udp-packet-size`` bytes
without splitting a line, and sends the datagrams spread evenly over
``interval - 1s`` on the injected clock, the first one at once.  The pure
parts (:func:`statsd_lines`, :func:`mem_lines`, :func:`pack_datagrams`,
:func:`statsd_prefix`) know nothing of sockets or time.
"""

from __future__ import annotations

import ipaddress
from typing import Any
from collections.abc import Iterable

from twisted.application.service import Service
from twisted.internet import defer, task
from twisted.internet.protocol import DatagramProtocol
from twisted.logger import Logger

from ...options import split_host_port
from .export import host_key
from ...runtime.memory import mem_stats
from .node import StatsNode
from .snapshot import broker_stats

__all__ = ["StatsdService", "statsd_prefix", "statsd_lines", "mem_lines", "pack_datagrams",
           "spread_delays"]

log = Logger(namespace="nsqtw.nsqd.stats.statsd")

EPHEMERAL_SUFFIX = "#ephemeral"


def statsd_prefix(template: str, broadcast_address: str, http_port: int) -> str:
    """nsqd's prefix: ``%s`` -> host key, and a trailing ``.`` unless the prefix is empty."""
    if not template:
        return ""
    prefix = template.replace("%s", host_key(broadcast_address, http_port))
    return prefix if prefix.endswith(".") else prefix + "."


def _counter(prefix: str, stat: str, value: int) -> bytes:
    return f"{prefix}{stat}:{int(value)}|c\n".encode()


def _gauge(prefix: str, stat: str, value: int) -> bytes:
    return f"{prefix}{stat}:{int(value)}|g\n".encode()


def _percentile_suffix(quantile: float) -> str:
    return "%.0f" % (quantile * 100.0)


def _by_name(items: Iterable[dict[str, Any]] | None, key: str) -> dict[str, dict[str, Any]]:
    return {item[key]: item for item in items or ()}


def statsd_lines(doc: dict[str, Any], last: dict[str, Any] | None, prefix: str,
                 exclude_ephemeral: bool = False) -> list[bytes]:
    """The topic and channel lines of one push; counters relative to ``last`` (a previous doc)."""
    out: list[bytes] = []
    add = out.append
    last_topics = _by_name((last or {}).get("topics"), "topic_name")
    for topic in doc.get("topics") or ():
        tname = topic["topic_name"]
        if exclude_ephemeral and tname.endswith(EPHEMERAL_SUFFIX):
            continue
        lt = last_topics.get(tname, {})
        t = f"topic.{tname}"
        add(_counter(prefix, f"{t}.message_count", topic["message_count"] - lt.get("message_count", 0)))
        add(_counter(prefix, f"{t}.message_bytes", topic["message_bytes"] - lt.get("message_bytes", 0)))
        add(_gauge(prefix, f"{t}.depth", topic["depth"]))
        add(_gauge(prefix, f"{t}.backend_depth", topic["backend_depth"]))
        for item in topic["e2e_processing_latency"].get("percentiles") or ():
            add(_gauge(prefix, f"{t}.e2e_processing_latency_{_percentile_suffix(item['quantile'])}",
                       item["value"]))
        last_channels = _by_name(lt.get("channels"), "channel_name")
        for ch in topic.get("channels") or ():
            cname = ch["channel_name"]
            if exclude_ephemeral and cname.endswith(EPHEMERAL_SUFFIX):
                continue
            lc = last_channels.get(cname, {})
            c = f"{t}.channel.{cname}"
            add(_counter(prefix, f"{c}.message_count", ch["message_count"] - lc.get("message_count", 0)))
            add(_gauge(prefix, f"{c}.depth", ch["depth"]))
            add(_gauge(prefix, f"{c}.backend_depth", ch["backend_depth"]))
            add(_gauge(prefix, f"{c}.in_flight_count", ch["in_flight_count"]))
            add(_gauge(prefix, f"{c}.deferred_count", ch["deferred_count"]))
            add(_counter(prefix, f"{c}.requeue_count", ch["requeue_count"] - lc.get("requeue_count", 0)))
            add(_counter(prefix, f"{c}.timeout_count", ch["timeout_count"] - lc.get("timeout_count", 0)))
            add(_gauge(prefix, f"{c}.clients", ch["client_count"]))
            for item in ch["e2e_processing_latency"].get("percentiles") or ():
                add(_gauge(prefix, f"{c}.e2e_processing_latency_{_percentile_suffix(item['quantile'])}",
                           item["value"]))
    return out


_MEM_GAUGES = ("heap_objects", "heap_idle_bytes", "heap_in_use_bytes", "heap_released_bytes",
               "gc_pause_usec_100", "gc_pause_usec_99", "gc_pause_usec_95", "next_gc_bytes")


def mem_lines(mem: dict[str, int], last: dict[str, int] | None, prefix: str) -> list[bytes]:
    """The ``mem.*`` gauges and the ``mem.gc_runs`` counter (delta)."""
    out = [_gauge(prefix, f"mem.{key}", mem[key]) for key in _MEM_GAUGES]
    out.append(_counter(prefix, "mem.gc_runs", mem["gc_total_runs"] - (last or {}).get("gc_total_runs", 0)))
    return out


def pack_datagrams(lines: Iterable[bytes], size: int) -> list[bytes]:
    """Go's BoundaryBufferedWriter: whole lines per datagram; a longer line goes alone."""
    out: list[bytes] = []
    buf = b""
    for line in lines:
        if len(line) > size - len(buf):
            if buf:
                out.append(buf)
            buf = b""
            if len(line) > size:
                out.append(line)
                continue
        buf += line
    if buf:
        out.append(buf)
    return out


def spread_delays(count: int, interval: float) -> list[float]:
    """Go's SpreadWriter: the first datagram at once, then one every ``(interval - 1s) / count``."""
    span = interval - 1.0
    if count == 0:
        return []
    if span <= 0:
        return [0.0] * count
    step = span / count
    return [i * step for i in range(count)]


class _StatsdProtocol(DatagramProtocol):
    """Write-only UDP endpoint; statsd never answers."""

    noisy = False

    def datagramReceived(self, datagram: bytes, addr: Any) -> None:  # pragma: no cover
        pass


class StatsdService(Service):
    """Push nsqd's stats to statsd; attach to an NsqdService (options from it unless given)."""

    name = "statsd"  # type: ignore[assignment]  # Twisted's Service declares name = None (unannotated)

    def __init__(self, node: StatsNode, *, address: str | None = None, prefix: str | None = None,
                 interval: float | None = None, mem_stats: bool | None = None,
                 packet_size: int | None = None, exclude_ephemeral: bool | None = None,
                 clock: Any = None, reactor: Any = None) -> None:
        opts = node.options
        self.node = node
        self.address = address if address is not None else opts.statsd_address
        if not self.address:
            raise ValueError("--statsd-address is empty")
        self.host, self.port = split_host_port(self.address, "statsd-address")
        self.prefix_template = prefix if prefix is not None else opts.statsd_prefix
        self.interval = float(interval if interval is not None else opts.statsd_interval)
        if self.interval <= 0:
            raise ValueError("--statsd-interval must be positive")
        self.mem_stats = opts.statsd_mem_stats if mem_stats is None else mem_stats
        self.packet_size = int(packet_size if packet_size is not None else opts.statsd_udp_packet_size)
        self.exclude_ephemeral = (opts.statsd_exclude_ephemeral if exclude_ephemeral is None
                                  else exclude_ephemeral)
        self.reactor = reactor if reactor is not None else node.reactor
        self.clock = clock if clock is not None else self.reactor
        self._last: dict[str, Any] | None = None
        self._last_mem: dict[str, int] | None = None
        self._loop: task.LoopingCall | None = None
        self._udp: Any = None
        self._calls: list[Any] = []
        self.pushes = 0
        self.last_push_datagrams = 0
        self.datagrams_sent = 0

    @property
    def prefix(self) -> str:
        opts = self.node.options
        http_port = opts.broadcast_http_port or (self.node.http_port or 0)
        return statsd_prefix(self.prefix_template, opts.broadcast_address, http_port)

    def startService(self) -> None:
        super().startService()
        interface = "::" if ":" in self.host else ""
        self._udp = self.reactor.listenUDP(0, _StatsdProtocol(), interface=interface)
        self._loop = task.LoopingCall(self._tick)
        self._loop.clock = self.clock
        self._loop.start(self.interval, now=False)

    def stopService(self) -> Any:
        super().stopService()
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None
        for call in self._calls:
            if call.active():
                call.cancel()
        self._calls = []
        udp, self._udp = self._udp, None
        if udp is not None:
            return defer.maybeDeferred(udp.stopListening)
        return None

    def _tick(self) -> None:
        d = self.push()
        d.addErrback(lambda f: log.failure("STATSD: push failed", f))

    def collect(self, now: float) -> list[bytes]:
        """The lines of one push (updates the counters' baseline)."""
        prefix = self.prefix
        doc = broker_stats(self.node.broker, now, include_clients=False, include_mem=False)
        lines = statsd_lines(doc, self._last, prefix, self.exclude_ephemeral)
        self._last = doc
        if self.mem_stats:
            mem = mem_stats()
            lines.extend(mem_lines(mem, self._last_mem, prefix))
            self._last_mem = mem
        return lines

    @defer.inlineCallbacks
    def push(self) -> Any:
        """One statsd push: resolve, collect, pack and schedule the datagrams."""
        try:
            ipaddress.ip_address(self.host)
            ip = self.host
        except ValueError:
            try:
                ip = yield self.reactor.resolve(self.host)
            except Exception:
                log.error("failed to create UDP socket to statsd({addr})", addr=self.address)
                return
        if self._udp is None:
            return
        log.info("STATSD: pushing stats to {addr}", addr=self.address)
        datagrams = pack_datagrams(self.collect(self.clock.seconds()), self.packet_size)
        self.pushes += 1
        self.last_push_datagrams = len(datagrams)
        self._calls = [c for c in self._calls if c.active()]
        for delay, datagram in zip(spread_delays(len(datagrams), self.interval), datagrams, strict=True):
            if delay == 0:
                self._send(datagram, ip)
            else:
                self._calls.append(self.clock.callLater(delay, self._send, datagram, ip))

    def _send(self, datagram: bytes, ip: str) -> None:
        if self._udp is None:
            return
        try:
            self._udp.write(datagram, (ip, self.port))
            self.datagrams_sent += 1
        except Exception as e:
            log.warn("STATSD: sending to {addr} failed: {err}", addr=self.address, err=e)
