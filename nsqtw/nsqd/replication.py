"""
Replication glue: the links to ``--replica-peer`` nodes, the ``--replication-address`` listener
and the shadow log files, around the sans-IO :mod:`nsqtw.nsqd.core.replication`.

The origin side (:class:`ReplicationService`) connects to every peer (again every second after
a failure), sends each end-of-turn batch to the peers in sync, and fires the Deferreds of the
held publisher answers as acknowledgements come back.  A link whose peer does not answer HELLO,
or leaves a batch unacknowledged, for ``--replication-timeout`` is dropped (a stalled link:
out of sync).

The peer side (:class:`ShadowFactory`) stores each origin's batches in
``<data-path>/nsqtw-shadow.<origin node id>.log`` (an nsqtw-only file beside the diskqueue
files; Go's nsqd ignores it), fsynced before the ACK when ``--sync-every=1``.
"""

from __future__ import annotations

import mmap
import os
import re
import socket
import struct
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

from twisted.application.service import Service
from twisted.internet import defer, task
from twisted.internet.endpoints import HostnameEndpoint
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure

from ..options import NsqdOptions, OptionError, split_host_port
from ..runtime import seam
from ..runtime.files import write_atomically
from ..protocol.names import is_ephemeral
from ..protocol import replication as wire
from ..protocol.replication import (
    LinkError, batch_body, decode_batch, shadow_record_head,
)
from .core.broker import Broker, Event
from .core.replication import (
    CATCHING_UP, IN_SYNC, SNAPSHOT_BATCH_BYTES, AdoptionArbiter, AdoptionPolicy, OriginLink, PeerRule, PublishRefused, ReplicationOrigin,
    ShadowReceiver, ShadowState, iter_chunks, outstanding,
)
from .core.replication import PeerLag, peer_stats
from .core.replication.adoption import FORGET, STAND_BY, WAIT
from .core.replication.maintenance import MaintenanceWindows
from .core.replication.broker import StoreHooks

__all__ = ["AdoptionService", "ReplicationService", "ShadowFactory", "ShadowFiles", "shadow_path", "read_secret",
           "tune_link_socket", "save_window", "load_windows"]

log = Logger(namespace="nsqtw.nsqd")

#: seconds between attempts to reach a peer
#: a frame's first four bytes as its size
_U32_AT = struct.Struct(">I").unpack_from

RECONNECT_INTERVAL = 1.0
#: seconds between consumer-state batches (FINs and REQs)
CONSUMER_STATE_INTERVAL = 0.1
#: a shadow log is compacted once larger than this and four times what is unfinished
COMPACT_MIN_BYTES = 16 * 1024 * 1024
_SHADOW_NAME = re.compile(r"nsqtw-shadow\.([0-9]+)\.log\Z")
_ADOPTED_NAME = re.compile(r"nsqtw-adopted\.([0-9]+)\.([0-9]+)\Z")
#: the origin's epoch, beside its diskqueue files
EPOCH_FILE = "nsqtw-replication.epoch"


#: a turn's publishes are sent to the peers at its end, unless they reach this many messages
#: first: then at once, so that the peer stores them while this node handles the rest of the
#: turn (two MPUBs of 200 read in one poll: the first is on its way before the second is parsed)
EARLY_FLUSH_MESSAGES = 100


def _write_file(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically and durably (a temporary file, fsync, rename)."""
    write_atomically(path, data)


def read_epoch(data_path: str) -> int:
    """The origin's epoch kept in its data path (0: none yet)."""
    try:
        with open(os.path.join(data_path, EPOCH_FILE), "rb") as f:
            return int(f.read().strip() or b"0")
    except (OSError, ValueError):
        return 0


def new_epoch(data_path: str, now_ns: int, old: int = 0) -> int:
    """A new epoch (after ``old``), kept in the data path before it is used."""
    epoch = max(now_ns, old + 1)
    os.makedirs(data_path, exist_ok=True)
    _write_file(os.path.join(data_path, EPOCH_FILE), b"%d\n" % epoch)
    return epoch


#: the fewest bytes a --replication-secret-file may hold
MIN_SECRET_BYTES = 16


def read_secret(path: str) -> bytes:
    """The shared secret in ``--replication-secret-file`` (its trailing newline dropped);
    refused with :class:`OptionError` naming the flag when it cannot be read or is too short."""
    try:
        with open(path, "rb") as f:
            secret = f.read().rstrip(b"\r\n")
        mode = os.stat(path).st_mode
    except OSError as e:
        raise OptionError(f"--replication-secret-file {path}: {e.strerror}") from None
    if len(secret) < MIN_SECRET_BYTES:
        raise OptionError(f"--replication-secret-file {path}: the secret must be at least {MIN_SECRET_BYTES} "
                          "bytes (e.g. head -c 32 /dev/urandom | base64 > FILE)")
    if mode & 0o077:
        log.warn("REPLICATION: --replication-secret-file {path} is readable by other users (chmod 600 it)",
                 path=path)
    return secret


_WINDOW_NAME = re.compile(r"nsqtw-maintenance\.([0-9]+)\Z")


def save_window(data_path: str, origin: int, until: float | None) -> None:
    """Keep an origin's maintenance window (until when, on this node's clock: seconds since the
    epoch) in the data path, so a restart of this node within it does not adopt the origin
    (None: the window is over, the file goes)."""
    path = os.path.join(data_path, f"nsqtw-maintenance.{origin}")
    try:
        if until is None:
            if os.path.exists(path):
                os.unlink(path)
        else:
            os.makedirs(data_path, exist_ok=True)
            _write_file(path, b"%.3f\n" % until)
    except OSError as e:
        log.warn("REPLICATION: cannot keep node {id}'s maintenance window in {path}: {err}", id=origin,
                 path=path, err=e)


def load_windows(data_path: str) -> dict[int, float]:
    """The maintenance windows kept in the data path (:func:`save_window`)."""
    out: dict[int, float] = {}
    if not os.path.isdir(data_path):
        return out
    for name in os.listdir(data_path):
        m = _WINDOW_NAME.match(name)
        if m is None:
            continue
        try:
            with open(os.path.join(data_path, name), "rb") as f:
                out[int(m.group(1))] = float(f.read().strip())
        except (OSError, ValueError):
            continue
    return out


def shadow_path(data_path: str, origin_node_id: int) -> str:
    return os.path.join(data_path, f"nsqtw-shadow.{origin_node_id}.log")


# --- the peer side: shadow logs -------------------------------------------------------


class _ShadowLog:
    """One origin's shadow log: records appended at :attr:`end`, read back through read-only
    mappings of the file, so what the shadow keeps of a message is a view of the log (on disk
    and in the page cache, which the kernel can reclaim), not a copy in the process's memory.

    The file is extended a window (:data:`LOG_WINDOW_BYTES`, sparse: nothing is allocated
    until written) at a time and each window is mapped once; a record never spans two
    windows (what is left of a window is a padding record, see ``wire.SHADOW_PAD``).  What
    follows the last record reads as zeros, the end of the log."""

    def __init__(self, path: str, window: int) -> None:
        self.path = path
        self.window = window
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        #: where the next record goes, and how far the file is extended (and mapped)
        self.end = 0
        self.size = os.fstat(self.fd).st_size
        #: the mapped window records are appended into: its start and a view of it
        self._start = 0
        self._view: memoryview | None = None

    def records(self) -> Iterator[tuple[int, list[wire.Entry], memoryview, list[int]]]:
        """What the file holds, record by record (items' data are views of the mapped log):
        ``(where it starts, items, the mapped log, where each item's data starts in it)``,
        :attr:`end` after each.  Then :meth:`cut` the log where the replay ended."""
        if self.size:
            view = self._map(0, self.size)
            start = 0
            for self.end, _, entries, starts in wire.shadow_records_placed(view):
                yield start, entries, view, starts
                start = self.end

    def cut(self, end: int) -> None:
        """End the log at ``end`` (after the last record replayed whole): a record cut short by
        a crash, or the unwritten rest of a window, goes; the next record is appended there."""
        if end + 4 <= self.size and os.pread(self.fd, 4, end).strip(b"\0"):
            log.warn("REPLICATION: {path}: the record at byte {at} cannot be read (cut short by a "
                     "crash?): the shadow ends before it", path=self.path, at=end)
        os.ftruncate(self.fd, end)
        self.end = self.size = end
        self._view = None  # the next record starts a window of its own

    def append(self, parts: tuple[bytes | memoryview, ...], fsync: bool) -> tuple[memoryview, int]:
        """Write one record (its parts, without joining them) at the end; where it is in the
        mapped log: ``(window, offset)``, the record being ``window[offset:offset + size]``."""
        total = sum(map(len, parts))
        at = self.end
        if self._view is None or at + total > self.size:
            at = self._extend(total)
        n = os.pwritev(self.fd, parts, at)  # the commonest case: all of it in one call
        if n != total:
            views = [memoryview(p) for p in parts if p]
            pos = at + n
            while views:
                while views and n >= len(views[0]):
                    n -= len(views[0])
                    views.pop(0)
                if n:
                    views[0] = views[0][n:]
                if views:
                    n = os.pwritev(self.fd, views, pos)
                    pos += n
        if fsync:
            os.fsync(self.fd)
        self.end = at + total
        assert self._view is not None
        return self._view, at - self._start

    def _extend(self, total: int) -> int:
        """A new window for a record of ``total`` bytes (padding what is left of the last);
        where the record goes."""
        grain = mmap.ALLOCATIONGRANULARITY
        start = -(-max(self.size, self.end) // grain) * grain
        if 0 < start - self.end < 4:
            start += grain
        length = max(self.window, -(-total // grain) * grain)
        os.ftruncate(self.fd, start + length)
        if start > self.end:
            os.pwrite(self.fd, wire.shadow_pad(start - self.end - 4), self.end)
        self.size = start + length
        self._view = self._map(start, length)
        self._start = start
        self.end = start
        return start

    def _map(self, start: int, length: int) -> memoryview:
        return memoryview(mmap.mmap(self.fd, length, prot=mmap.PROT_READ, offset=start))

    def close(self) -> None:
        """Close the file (views of it stay readable until the shadow lets them go)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


#: a shadow log is extended and mapped this many bytes at a time
LOG_WINDOW_BYTES = 64 * 1024 * 1024


class ShadowFiles:
    """Each origin's shadow: its state in memory (:class:`ShadowState`) and its append-only log
    on disk, replayed at start.  Each batch is appended (and fsynced when ``--sync-every=1``)
    before it is acknowledged; once the log is much larger than what is still unfinished, it
    is rewritten as a snapshot of the unfinished messages (the finished ones are dropped).

    The state holds each message's frame as a view of the log, mapped (:class:`_ShadowLog`):
    a peer's own memory grows with how many messages are unfinished (their index), not with
    their bodies, which stay on disk and in the page cache."""

    def __init__(self, data_path: str, fsync: bool, compact_min: int = COMPACT_MIN_BYTES,
                 window: int = LOG_WINDOW_BYTES) -> None:
        self.data_path = data_path
        self.fsync = fsync
        self.compact_min = compact_min
        self.window = window
        self._logs: dict[int, _ShadowLog] = {}
        self.sizes: dict[int, int] = {}
        self.states: dict[int, ShadowState] = {}
        #: (origin, items as read, where each item's data starts, the log's window and where the
        #: batch is in it)
        self._unapplied: list[tuple[int, list[tuple[int, str, str, int, memoryview]], list[int], memoryview, int]] = []
        self.compactions = 0
        #: publishes (batch entries of messages: a PUB's, an MPUB's) stored for origins since
        #: the start
        self.stored = 0
        #: (origin node id, epoch) -> the highest message ID adopted of it (kept on disk as
        #: ``nsqtw-adopted.<id>.<epoch>``; what this node answers an origin asking at link setup)
        self.adopted: dict[tuple[int, int], bytes] = {}

    def load(self) -> None:
        """Replay every shadow log of the data path (a record cut short by a crash ends it)."""
        if not os.path.isdir(self.data_path):
            return
        for name in sorted(os.listdir(self.data_path)):
            a = _ADOPTED_NAME.match(name)
            if a is not None:
                with open(os.path.join(self.data_path, name), "rb") as f:
                    self.adopted[(int(a.group(1)), int(a.group(2)))] = f.read(16).ljust(16, b"\0")
                continue
            m = _SHADOW_NAME.match(name)
            if m is None:
                continue
            origin = int(m.group(1))
            shadow = self._logs[origin] = _ShadowLog(os.path.join(self.data_path, name), self.window)
            state = self.states.setdefault(origin, ShadowState())
            end = 0
            for start, entries, view, starts in shadow.records():
                if len(entries) == 1 and entries[0][0] == wire.MSG:  # a PUB's batch, gathered as live
                    _, topic, _, due, x = entries[0]
                    size = len(x)
                    if size >= 34 and _U32_AT(x)[0] + 4 == size:
                        state.add_frame(topic, due, view, starts[0], starts[0] + size)
                        end = shadow.end
                        continue
                try:
                    state.apply(_held(entries))
                except wire.LinkError as e:  # skipped: the log goes on after it (if it was the
                    # last, cut short by a crash, the next record is written over it)
                    log.warn("REPLICATION: {path}: the record at byte {at} is skipped: {why}",
                             path=shadow.path, at=start, why=str(e))
                    continue
                end = shadow.end
            shadow.cut(end)
            self.sizes[origin] = shadow.end
            log.info("REPLICATION: shadow of node {id}: {n} unfinished messages", id=origin,
                     n=state.count())

    def store(self, origin: int, body: bytes | memoryview) -> None:
        """Append one batch (checked first) to the origin's log: once this returns, the batch
        may be acknowledged; its effect on the state in memory follows in :meth:`apply`.

        Nothing of the batch is copied: it is checked and appended as a view of the read it
        came in, and what the state keeps are views of the log it was appended to."""
        positions: list[int] = []
        _, entries = decode_batch(body if isinstance(body, memoryview) else memoryview(body), positions)
        window, at = self._append(origin, shadow_record_head(body), body)  # one pwritev, nothing joined
        self._unapplied.append((origin, entries, positions, window, at + 4))
        if len(entries) == 1:
            self.stored += entries[0][0] == wire.MSG
        else:
            self.stored += [e[0] for e in entries].count(wire.MSG)

    def apply(self) -> None:
        """Apply the batches stored since the last call (after their ACK is on its way): their
        messages as views of the log, where :meth:`store` found them in the batch read."""
        todo, self._unapplied = self._unapplied, []
        for origin, entries, positions, window, at in todo:
            state = self.states.get(origin)
            if state is None:
                state = self.states[origin] = ShadowState()
            if len(entries) == 1 and entries[0][0] == wire.MSG:  # a PUB's batch: the commonest
                _, topic, _, due, x = entries[0]
                size = len(x)
                if size >= 34 and _U32_AT(x)[0] + 4 == size:  # one frame
                    start = at + positions[0]
                    state.add_frame(topic, due, window, start, start + size)
                    continue
            state.apply([cast(wire.Entry, (k, t, c, d, window[at + p:at + p + len(x)]))
                         if k == wire.MSG or k == wire.SNAP_MSG else (k, t, c, d, bytes(x))
                         for (k, t, c, d, x), p in zip(entries, positions, strict=True)])
        # once every stored batch is applied (a compaction writes the state: a batch in the log
        # but not applied yet would be lost from it), and not while a snapshot is coming in
        # (the log holds its first batches, which a compaction of the state before it drops)
        for origin in (todo[0][0],) if len(todo) == 1 else {item[0] for item in todo}:
            state = self.states[origin]
            size = self.sizes.get(origin, 0)
            if size > self.compact_min and size > 4 * state.live_bytes and not state.catching_up:
                self.compact(origin)

    def _log(self, origin: int) -> _ShadowLog:
        shadow = self._logs.get(origin)
        if shadow is None:
            shadow = self._logs[origin] = _ShadowLog(shadow_path(self.data_path, origin), self.window)
            end = 0
            for _ in shadow.records():  # a file not loaded: appended after its last whole record
                end = shadow.end
            shadow.cut(end)
        return shadow

    def _append(self, origin: int, *parts: bytes | memoryview) -> tuple[memoryview, int]:
        shadow = self._logs.get(origin)
        if shadow is None:
            shadow = self._log(origin)
        stored = shadow.append(parts, self.fsync)
        self.sizes[origin] = shadow.end
        return stored

    def compact(self, origin: int) -> None:
        """Rewrite an origin's log as a snapshot of what is unfinished (in batches of about
        ``SNAPSHOT_BATCH_BYTES``), and the state as views of the new log."""
        state = self.states[origin]
        path = shadow_path(self.data_path, origin)
        tmp = path + ".tmp"
        if os.path.exists(tmp):
            os.unlink(tmp)
        new = _ShadowLog(tmp, self.window)
        fresh = ShadowState()
        try:
            for entries in iter_chunks(state.snapshot(), SNAPSHOT_BATCH_BYTES):
                body = batch_body(0, entries)
                window, at = new.append((shadow_record_head(body), body), False)
                fresh.apply(_held(decode_batch(window[at + 4:at + 4 + len(body)])[1]))
            os.fsync(new.fd)
        except BaseException:
            new.close()
            os.unlink(tmp)
            raise
        os.replace(tmp, path)
        new.path = path
        old = self._logs.pop(origin, None)
        if old is not None:
            old.close()
        self._logs[origin] = new
        fresh.max_id = max(fresh.max_id, state.max_id)
        fresh.snapshots = state.snapshots
        self.states[origin] = fresh
        self.sizes[origin] = new.end
        self.compactions += 1

    def adopted_id(self, origin: int, epoch: int) -> bytes:
        """The highest ID adopted of ``origin``'s ``epoch`` (NO_ID: that epoch was not adopted)."""
        return self.adopted.get((origin, epoch), wire.NO_ID)

    def retire(self, origin: int, stamp: int, record: bool = True) -> str:
        """The origin was adopted: forget its shadow; its log is kept, renamed
        ``nsqtw-shadow.<id>.adopted.<stamp>`` (never replayed again), and the adopted epoch
        recorded (``nsqtw-adopted.<id>.<epoch>``, holding the highest ID adopted) before it is
        forgotten, so the origin, when it comes back, learns it was adopted (not when
        ``record`` is False: another peer adopted it, and answers the origin)."""
        state = self.states.get(origin)
        if state is not None and record:
            _write_file(os.path.join(self.data_path, f"nsqtw-adopted.{origin}.{state.epoch}"), state.max_id)
            self.adopted[(origin, state.epoch)] = state.max_id
        shadow = self._logs.pop(origin, None)
        if shadow is not None:
            shadow.close()
        self.states.pop(origin, None)
        self.sizes.pop(origin, None)
        path = shadow_path(self.data_path, origin)
        kept = os.path.join(self.data_path, f"nsqtw-shadow.{origin}.adopted.{stamp}")
        if os.path.exists(path):
            os.replace(path, kept)
        return kept

    def stats(self) -> list[dict[str, Any]]:
        return [{"origin_node_id": origin, "unfinished_messages": state.count(),
                 "topics": len(state.topics), "log_bytes": self.sizes.get(origin, 0),
                 "epoch": state.epoch, "catching_up": state.catching_up}
                for origin, state in sorted(self.states.items())]

    def close(self) -> None:
        for shadow in self._logs.values():
            shadow.close()
        self._logs.clear()


def _held(entries: Sequence[tuple[int, str, str, int, bytes | memoryview]]) -> list[wire.Entry]:
    """A batch's items as the shadow takes them: messages as they are (views of the log,
    which :class:`ShadowState` keeps as they are), everything else (names, FIN and REQ
    lists: small, looked up, compared) as bytes."""
    return [cast(wire.Entry, e) if e[0] == wire.MSG or e[0] == wire.SNAP_MSG or type(e[4]) is bytes
            else (e[0], e[1], e[2], e[3], bytes(e[4])) for e in entries]


def tune_link_socket(transport: Any, timeout: float) -> None:
    """A replication link's socket: no Nagle delay, and the kernel's own backstop for a dead
    peer (TCP keepalive after ``timeout`` idle, and ``TCP_USER_TIMEOUT``: data unacknowledged
    for ``timeout`` fails the connection), beside the link's heartbeats."""
    if hasattr(transport, "setTcpNoDelay"):
        transport.setTcpNoDelay(True)
    if hasattr(transport, "setTcpKeepAlive"):
        transport.setTcpKeepAlive(True)
    handle = transport.getHandle() if hasattr(transport, "getHandle") else None
    if not isinstance(handle, socket.socket):
        return
    idle = max(1, int(timeout))
    for name, value in (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", 1), ("TCP_KEEPCNT", 3),
                        ("TCP_USER_TIMEOUT", max(1000, int(timeout * 1000)))):
        opt = getattr(socket, name, None)
        if opt is not None:
            try:
                handle.setsockopt(socket.IPPROTO_TCP, opt, value)
            except OSError:  # not on this platform: heartbeats still find a dead peer
                pass


#: unauthenticated connections a peer keeps at once (more are closed as they come)
MAX_UNAUTHENTICATED = 32


def check_interval(timeout: float) -> float:
    """Seconds between the checks of a link's silence (on both ends): a link silent for
    ``--replication-timeout`` is dropped at most this much later."""
    return min(0.25, timeout / 8)


def beat_interval(timeout: float) -> float:
    """A link end that sent nothing for this long sends a BEAT: every second, or three times
    within a shorter ``--replication-timeout``."""
    return min(1.0, timeout / 3)


class _ShadowProtocol(Protocol):
    #: the reactor's TCP transport
    transport: Any
    factory: ShadowFactory

    def __init__(self, receiver: ShadowReceiver, now: float) -> None:
        self.receiver = receiver
        self._seam: seam.SocketSeam | None = None
        self._write: Callable[[bytes], None] = lambda data: None
        #: when the link was last heard, and last written to (see ShadowFactory.tick)
        self.heard = self.wrote = self.started = now
        self.writes = self.seen_writes = 0
        self._seconds: Callable[[], float] = lambda: self.heard

    def connectionMade(self) -> None:
        self.factory.protocols.add(self)
        if self.factory.reactor is not None:
            self._seconds = self.factory.reactor.seconds
        tune_link_socket(self.transport, self.factory.timeout)
        # the ACK goes out at once (an eager send), before the batch is applied in memory
        self._seam = seam.attach(self.transport, self, self.dataReceived)
        self._write = self._seam.write if self._seam is not None else self.transport.write

    def connectionLost(self, reason: Failure | None = None) -> None:
        if self._seam is not None:
            self._seam.detach()
            self._seam = None
        self.factory.protocols.discard(self)
        origin = self.receiver.origin
        if origin is not None and self.factory.adoption is not None:
            self.factory.adoption.origin_down(origin.node_id)

    def send(self, data: bytes) -> None:
        self.writes += 1
        self._write(data)

    def dataReceived(self, data: bytes) -> None:
        self.heard = self._seconds()
        receiver = self.receiver
        was = receiver.origin
        out = receiver.feed(data)
        if out:
            self.writes += 1
            self._write(out)
        self.factory.files.apply()
        if receiver.origin is not None and was is None:
            self.factory.linked(self, receiver.origin)
        if receiver.requests:  # after the batches before them are stored and applied
            requests, receiver.requests = receiver.requests, []
            self.factory.requested(self, requests)
        if receiver.closed:
            why = out[5:].decode(errors="replace")
            if why.startswith("E_STORE_FAILED"):
                self.factory.store_failed(why)
            log.warn("REPLICATION: link from {peer} refused: {why}", peer=self.transport.getPeer(), why=why)
            self.transport.loseConnection()
        elif self.factory.store_error:
            self.factory.store_error = ""


class ShadowFactory(Factory):
    """The ``--replication-address`` listener's factory: each origin's links, their
    handshake deadline, heartbeats and silence (:meth:`tick`), and what this node tells its
    origins it holds (HOLDS)."""

    noisy = False

    def __init__(self, node_id: int, instance: bytes, name: str, files: ShadowFiles, *,
                 reactor: Any = None, timeout: float = 5.0, secret: bytes | None = None,
                 allowed: Callable[[int], bool] = lambda origin: True,
                 max_frame: int = wire.MAX_FRAME) -> None:
        self.node_id = node_id
        self.instance = instance
        self.name = name
        self.files = files
        self.reactor = reactor
        self.timeout = timeout
        self.secret = secret
        self.allowed = allowed
        self.max_frame = max_frame
        self.protocols: set[_ShadowProtocol] = set()
        self.adoption: AdoptionService | None = None
        #: the origins' maintenance windows (MAINT), kept on this node's clock and in its data
        #: path (see :func:`save_window`); None: the adoption policy does not look at them
        self.maintenance: MaintenanceWindows | None = None
        #: why this node takes no hand-off now (e.g. it drains itself): "" when it takes them
        self.refuse_handoff: Callable[[], str] = lambda: ""
        #: the last error storing a batch ("" once a batch is stored again): a full disk
        self.store_error = ""
        #: connections closed because too many were unauthenticated
        self.turned_away = 0
        #: seconds between ticks (a silent link is dropped at most this late), and when the
        #: last one ran
        self.interval = check_interval(timeout)
        self._ticked = 0.0
        self._loop: task.LoopingCall | None = None

    def doStart(self) -> None:
        if self.reactor is not None and self._loop is None:
            self._ticked = self.reactor.seconds()
            self._loop = task.LoopingCall(self.tick)
            self._loop.clock = self.reactor
            self._loop.start(self.interval, now=False)

    def doStop(self) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None

    def close_links(self) -> None:
        """The node stops: drop every origin's link (the origins see the peer out of sync)."""
        for p in list(self.protocols):
            p.transport.abortConnection()

    def buildProtocol(self, addr: Any) -> Protocol | None:
        pending = sum(1 for p in self.protocols if p.receiver.origin is None)
        if pending >= MAX_UNAUTHENTICATED:
            self.turned_away += 1
            if self.turned_away == 1 or self.turned_away % 1000 == 0:
                log.warn("REPLICATION: {n} connections waiting for their handshake: closing new ones "
                         "from {peer} ({total} so far)", n=pending, peer=addr, total=self.turned_away)
            return None
        now = self.reactor.seconds() if self.reactor is not None else 0.0
        p = _ShadowProtocol(ShadowReceiver(self.node_id, self.instance, self.name, self.files.store,
                                           self.files.adopted_id, secret=self.secret, allowed=self.allowed,
                                           max_frame=self.max_frame), now)
        p.factory = self
        return p

    def linked(self, proto: _ShadowProtocol, origin: wire.Hello) -> None:
        """An origin proved itself on ``proto``: the link counts (for adoption), replaces any
        older link from the same node (a half-open one never holds adoption off), and is told
        what this node holds."""
        if self.adoption is not None:
            self.adoption.origin_up(origin.node_id)
        log.info("REPLICATION: origin {name} (node {id}) linked from {peer}", name=origin.name,
                 id=origin.node_id, peer=proto.transport.getPeer())
        for other in list(self.protocols):
            o = other.receiver.origin
            if other is not proto and o is not None and o.node_id == origin.node_id:
                log.info("REPLICATION: an older link from node {id} ({peer}) is replaced by the new one",
                         id=origin.node_id, peer=other.transport.getPeer())
                other.transport.abortConnection()
        self.announce()

    def requested(self, proto: _ShadowProtocol, requests: list[tuple[str, int, int]]) -> None:
        """What an origin asked on its link (see ``ShadowReceiver.requests``): a maintenance
        window, kept here; a hand-off, adopted now and answered (HANDED) on the same link."""
        origin = proto.receiver.origin
        assert origin is not None
        now = self.reactor.seconds() if self.reactor is not None else 0.0
        for what, counter, value in requests:
            if what == "maintenance":
                if self.maintenance is None:
                    continue
                self.maintenance.set(origin.node_id, value / 1000, now)
                save_window(self.files.data_path, origin.node_id, now + value / 1000 if value else None)
                if value:
                    log.info("REPLICATION: node {id} is going down for maintenance: not adopted for {s}s "
                             "unless it is back sooner", id=origin.node_id, s=round(value / 1000, 3))
                else:
                    log.info("REPLICATION: node {id}'s maintenance window is over", id=origin.node_id)
                continue
            self._hand_off(proto, origin.node_id, counter, value)

    def _hand_off(self, proto: _ShadowProtocol, origin: int, counter: int, epoch: int) -> None:
        why = self.refuse_handoff()
        if self.adoption is None or why:
            d: defer.Deferred[tuple[bool, bytes, int, str]] = defer.succeed(
                (False, wire.NO_ID, 0, why or "this node does not adopt"))
        else:
            log.info("REPLICATION: node {id} drains and hands its messages to this node", id=origin)
            d = self.adoption.take_handoff(origin, epoch)

        def answer(result: tuple[bool, bytes, int, str]) -> None:
            ok, adopted, count, reason = result
            if not ok:
                log.warn("REPLICATION: hand-off from node {id} refused: {why}", id=origin, why=reason)
            if proto in self.protocols and not proto.receiver.closed:
                proto.send(proto.receiver.handed(counter, ok, adopted, count, reason))

        d.addCallback(answer)
        d.addErrback(lambda f: log.failure("REPLICATION: answering a hand-off failed", f))

    def holds(self) -> dict[int, int]:
        """The origins whose shadow this node holds (or is adopting), and those it adopted."""
        out = {origin: wire.HELD for origin in self.files.states}
        for p in self.protocols:  # a linked origin's shadow is here, or on its way (the snapshot)
            if p.receiver.origin is not None:
                out[p.receiver.origin.node_id] = wire.HELD
        if self.adoption is not None:
            out.update(self.adoption.holding)
        return out

    def announce(self) -> None:
        """Tell every linked origin what this node holds (after a change)."""
        holds = self.holds()
        for p in list(self.protocols):
            if p.receiver.origin is not None and not p.receiver.closed:
                p.send(p.receiver.holds(holds))

    def store_failed(self, why: str) -> None:
        self.store_error = why

    def tick(self) -> None:
        """Every second or so: drop a link whose handshake did not finish, or that has been
        silent, within ``--replication-timeout``; send a BEAT on a link that sent nothing."""
        now = self.reactor.seconds()
        late = now - self._ticked > 2 * self.interval  # this node was busy: what it did not read is no silence
        self._ticked = now
        beat = beat_interval(self.timeout)
        for p in list(self.protocols):
            if late:
                p.heard = now
            receiver = p.receiver
            if receiver.origin is None:
                if now - p.started >= self.timeout:
                    log.warn("REPLICATION: connection from {peer} dropped: no handshake within "
                             "--replication-timeout ({t}s)", peer=p.transport.getPeer(), t=self.timeout)
                    p.transport.abortConnection()
                continue
            if now - p.heard >= self.timeout:
                log.warn("REPLICATION: link from node {id} dropped: nothing heard for {t}s "
                         "(--replication-timeout)", id=receiver.origin.node_id, t=round(now - p.heard, 1))
                p.transport.abortConnection()
                continue
            if p.writes != p.seen_writes:
                p.seen_writes = p.writes
                p.wrote = now
            elif now - p.wrote >= beat and not receiver.closed:
                p.send(receiver.beat())
                p.seen_writes = p.writes
                p.wrote = now

    def link_stats(self) -> list[dict[str, Any]]:
        """Per linked origin: its node id, peer address, and how long ago it was last heard."""
        now = self.reactor.seconds() if self.reactor is not None else 0.0
        out = []
        for p in self.protocols:
            o = p.receiver.origin
            if o is not None:
                out.append({"origin_node_id": o.node_id, "name": o.name,
                            "last_heard_seconds": round(max(0.0, now - p.heard), 3),
                            "batches": p.receiver.batches})
        return sorted(out, key=lambda e: e["origin_node_id"])


class AdoptionService(Service):
    """Adopts an origin's shadow when the :class:`AdoptionPolicy` says so and the
    :class:`AdoptionArbiter` picks this node among the survivors (by default the peers' own
    rule, :func:`choose`; with ``--etcd-endpoints``, the holder of the origin's adoption
    lease): every unfinished message is republished into this
    node's queues (``adopt``), and the shadow retired once all of it is stored.  An adoption
    that fails (a full disk) is logged, shown in /stats, and tried again at each check (four
    times a second) for what is left; other origins are adopted meanwhile.

    ``adopt(origin, state, done)`` republishes (see :func:`~nsqtw.nsqd.core.replication.adopt`)
    and returns ``(adopted, refused, stored)``: ``stored`` fires once this node's own peers
    stored what it adopted (None: nothing to wait for).  ``peers_holding(origin)`` is
    ``(node id, HELD or ADOPTED)`` of each live peer holding that origin's shadow."""

    def __init__(self, files: ShadowFiles, policy: AdoptionPolicy, reactor: Any,
                 adopt: Callable[[int, ShadowState, set[bytes]], tuple[int, int, defer.Deferred[Any] | None]],
                 interval: float, *, node_id: int = 0,
                 peers_holding: Callable[[int], list[tuple[int, int]]] = lambda origin: [],
                 announce: Callable[[], None] = lambda: None,
                 health: Callable[[], str] = lambda: "refused",
                 arbiter: AdoptionArbiter | None = None) -> None:
        self.setName("adoption")
        #: who adopts an origin that is due (the peers' own rule unless another is given: etcd's)
        self.arbiter: AdoptionArbiter = arbiter if arbiter is not None else PeerRule(node_id)
        #: what the broker says of its storage (a refused adoption's reason: "NOK - ...")
        self.health = health
        self.files = files
        self.policy = policy
        self.reactor = reactor
        self.adopt_into = adopt
        self.interval = interval
        self.node_id = node_id
        self.peers_holding = peers_holding
        self.announce = announce
        self.links: dict[int, int] = {}
        #: (origin node id, messages adopted, refused, when) of every adoption so far
        self.adopted: list[tuple[int, int, int, float]] = []
        #: origins due and not adopted yet: standing by for a peer, or an adoption to retry
        self.pending: dict[int, float] = {}
        #: origin -> (why the last try failed, since when, tries)
        self.failures: dict[int, tuple[str, float, int]] = {}
        #: origin -> the peer this node stands by for
        self.standing_by: dict[int, int] = {}
        #: origin -> (peer that adopted it, when) for shadows dropped because a peer adopted them
        self.forgotten: dict[int, tuple[int, float]] = {}
        #: what HOLDS says beside the shadows: origins being adopted (HELD) or adopted here (ADOPTED)
        self.holding: dict[int, int] = {}
        #: message IDs already republished, per origin whose adoption is not finished
        self._done: dict[int, set[bytes]] = {}
        #: (origin, messages, when) of every hand-off a draining origin made to this node
        self.handed_over: list[tuple[int, int, float]] = []
        #: the origins' maintenance windows: an origin due while in one is kept pending (not
        #: adopted) until the window is over or it is back (None: no windows)
        self.maintenance: MaintenanceWindows | None = None
        self._loop: task.LoopingCall | None = None

    def startService(self) -> None:
        super().startService()
        now = self.reactor.seconds()
        for origin in self.files.states:  # shadows from before the start: adopt unless they link
            if not self.links.get(origin):
                if self.maintenance is not None:
                    self.maintenance.down(origin)
                self.policy.origin_down(origin, now)
        self._loop = task.LoopingCall(self.check)
        self._loop.clock = self.reactor
        self._loop.start(self.interval, now=False)

    def stopService(self) -> None:
        super().stopService()
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None

    def origin_up(self, origin: int) -> None:
        if self.maintenance is not None:
            self.maintenance.up(origin)
        self.links[origin] = self.links.get(origin, 0) + 1
        self.policy.origin_up(origin, self.reactor.seconds())
        self.pending.pop(origin, None)
        self.standing_by.pop(origin, None)
        if self.holding.get(origin) == wire.ADOPTED:
            del self.holding[origin]

    def origin_down(self, origin: int) -> None:
        n = self.links.get(origin, 0) - 1
        if n > 0:
            self.links[origin] = n
            return
        self.links.pop(origin, None)
        if self.maintenance is not None:
            self.maintenance.down(origin)
        self.policy.origin_down(origin, self.reactor.seconds())

    def check(self) -> None:
        now = self.reactor.seconds()
        for origin in self.policy.due(now):
            self.pending.setdefault(origin, now)
        for origin in sorted(self.pending):
            if self.links.get(origin) or origin not in self.files.states:
                self.pending.pop(origin, None)
                continue
            if self.maintenance is not None and self.maintenance.active(origin, now):
                continue  # down for maintenance: kept pending until its window is over
            try:
                self._decide(origin, now)
            except Exception as e:  # never the loop's end: the other origins go on
                self._failed(origin, now, f"{type(e).__name__}: {e}")

    def _decide(self, origin: int, now: float) -> None:
        epoch = self.files.states[origin].epoch
        action, peer = self.arbiter.decide(origin, epoch, self.peers_holding(origin), now)
        if action == WAIT:
            return
        if action == FORGET:
            assert peer is not None
            kept = self.files.retire(origin, int(now * 1e9), record=False)
            self.pending.pop(origin, None)
            self.standing_by.pop(origin, None)
            self.forgotten[origin] = (peer, now)
            log.warn("REPLICATION: node {peer} adopted node {id}: its shadow here is dropped (kept as {kept})",
                     peer=peer, id=origin, kept=kept)
            self.announce()
            return
        if action == STAND_BY:
            assert peer is not None
            if self.standing_by.get(origin) != peer:
                log.info("REPLICATION: node {id} is down; node {peer} (a lower id, holding its shadow) "
                         "adopts it: this node stands by", id=origin, peer=peer)
            self.standing_by[origin] = peer
            return
        self.standing_by.pop(origin, None)
        self._adopt_now(origin, now)

    def _adopt_now(self, origin: int, now: float, handoff: bool = False) -> tuple[int, defer.Deferred[Any] | None]:
        """Adopt ``origin``'s shadow now: ``(messages adopted, fired once this node's peers
        stored them or None)``; raises when this node's queues refuse some (tried again for
        what is left).  A hand-off (the origin drains) is recorded in :attr:`handed_over`,
        not among the adoptions of lost origins."""
        self.holding[origin] = wire.HELD
        done = self._done.setdefault(origin, set())
        state = self.files.states[origin]
        epoch = state.epoch
        adopted, refused, stored = self.adopt_into(origin, state, done)
        if refused:
            raise OSError(f"{refused} of {refused + len(done)} messages refused by this node's queues "
                          f"({self.health()})")
        kept = self.files.retire(origin, int(now * 1e9))
        total = len(done)
        del self._done[origin]
        self.pending.pop(origin, None)
        failure = self.failures.pop(origin, None)
        if handoff:
            self.handed_over.append((origin, total, now))
            log.info("REPLICATION: took over node {id}'s messages (it drains): {n} republished here "
                     "(its shadow log kept as {kept})", id=origin, n=total, kept=kept)
        else:
            self.adopted.append((origin, total, 0, now))
            log.warn("REPLICATION: adopted node {id}: {n} unfinished messages republished here{retried} "
                     "(its shadow log kept as {kept})", id=origin, n=total, kept=kept,
                     retried=f" after {failure[2]} failed tries" if failure else "")

        def stored_here(_: Any) -> None:
            if self.holding.get(origin) == wire.HELD:
                self.holding[origin] = wire.ADOPTED
                self.announce()
                self.arbiter.adopted(origin, epoch)

        if stored is None:
            stored_here(None)
        else:
            stored.addBoth(lambda r: stored_here(None) if not isinstance(r, Failure) else None)
        return total, stored

    def take_handoff(self, origin: int, epoch: int) -> defer.Deferred[tuple[bool, bytes, int, str]]:
        """A draining origin hands its backlog over (HANDOFF): adopt its shadow now, with its
        consent, whatever the policy says; fires with ``(adopted, highest ID adopted, messages,
        why not)`` once this node's own peers stored what it adopted (or could not)."""
        state = self.files.states.get(origin)
        if state is None:
            return defer.succeed((False, wire.NO_ID, 0, f"this node holds no shadow of node {origin}"))
        if state.catching_up:
            return defer.succeed((False, wire.NO_ID, 0, "its shadow here is still catching up"))
        if state.epoch != epoch:
            return defer.succeed((False, wire.NO_ID, 0, f"the shadow here is of epoch {state.epoch}, "
                                                         f"not {epoch}"))
        top = state.max_id
        try:
            total, stored = self._adopt_now(origin, self.reactor.seconds(), handoff=True)
        except Exception as e:  # what was republished stays (a later adoption skips it)
            return defer.succeed((False, wire.NO_ID, 0, f"adopting failed: {e}"))
        result = (True, top, total, "")
        if stored is None:
            return defer.succeed(result)
        out: defer.Deferred[tuple[bool, bytes, int, str]] = defer.Deferred()
        stored.addBoth(lambda _: out.callback(result))
        return out

    def _failed(self, origin: int, now: float, why: str) -> None:
        prev = self.failures.get(origin)
        tries = prev[2] + 1 if prev else 1
        self.failures[origin] = (why, prev[1] if prev else now, tries)
        if prev is None or prev[0] != why:
            log.error("REPLICATION: adopting node {id} failed: {why}; trying again every {t}s for what is "
                      "left", id=origin, why=why, t=self.interval)

    def stats(self) -> list[dict[str, Any]]:
        return [{"origin_node_id": o, "epoch": int(when * 1e9), "messages": n, "refused": r, "at": when}
                for o, n, r, when in self.adopted]

    def status(self) -> dict[str, Any]:
        """Adoptions failing, standing by and dropped for a peer (for /stats and /metrics)."""
        now = self.reactor.seconds()
        return {
            "failing": [{"origin_node_id": o, "error": why, "since_seconds": round(now - since, 3),
                         "tries": tries, "adopted_so_far": len(self._done.get(o, ()))}
                        for o, (why, since, tries) in sorted(self.failures.items())],
            "standing_by": [{"origin_node_id": o, "for_node_id": p} for o, p in sorted(self.standing_by.items())],
            "adopted_by_peer": [{"origin_node_id": o, "peer_node_id": p, "at": when}
                                for o, (p, when) in sorted(self.forgotten.items())],
            **({"arbiter": waiting} if (waiting := self.arbiter.status()) else {}),
        }


# --- the origin side ----------------------------------------------------------------


class _PeerLink(Protocol):
    #: the reactor's TCP transport
    transport: Any

    def __init__(self, service: ReplicationService, address: str) -> None:
        self.service = service
        self.address = address
        node_id, instance, name = service.origin_identity
        self.link = OriginLink(node_id, instance, name, service.epoch, service.secret)
        self.up = False
        #: what the peer last said it holds (HOLDS): origin node id -> HELD or ADOPTED
        self.holds: dict[int, int] = {}
        #: when the peer was last heard (see ReplicationService._check_stalled)
        self._seconds = service.reactor.seconds
        self.heard = self._seconds()
        self._seam: seam.SocketSeam | None = None
        self.write: Callable[[bytes], None] = lambda data: None
        self.writev: Callable[[list[Any]], None] = lambda parts: None

    def connectionMade(self) -> None:
        tune_link_socket(self.transport, self.service.options.replication_timeout)
        # a batch goes out at once (an eager send) rather than at the next reactor iteration,
        # its parts gathered by the kernel (one sendmsg) rather than joined here first
        self._seam = seam.attach_client(self.transport, self.dataReceived)
        if self._seam is not None:
            self.write, self.writev = self._seam.write, self._seam.writev
        else:
            self.write, self.writev = self.transport.write, self.transport.writeSequence
        self.write(self.link.start())

    def send(self, frame: bytes) -> None:
        """One batch frame (shared by every peer), sealed for this link when it has a secret."""
        if self.link.sealer is None:
            self.write(frame)
        elif len(frame) <= SMALL_SEALED_BYTES:
            self.write(b"".join(self.link.seal(frame)))
        else:
            self.writev(self.link.seal(frame))

    def send_parts(self, parts: list[bytes]) -> None:
        self.writev(parts if self.link.sealer is None else self.link.seal_parts(parts))

    def beat(self) -> None:
        self.writev(self.link.beat())

    def dataReceived(self, data: bytes) -> None:
        self.heard = self._seconds()
        try:
            seq = self.link.ack(data)
            if seq is not None:  # one ACK: the commonest read
                self.service.acked(self.address, seq)
                return
            ev = self.link.feed(data)
        except LinkError as e:
            self.service.link_failed(self, str(e))
            self.transport.abortConnection()
            return
        if ev.out:
            self.write(ev.out)  # the AUTH, before anything else goes out
        if ev.hello is not None:
            self.up = True
            self.service.link_up(self, ev.hello)
        if ev.holds is not None:
            self.holds = ev.holds
        for seq in ev.acks:
            self.service.acked(self.address, seq)
        for handed in ev.handed:
            self.service.handed(self.address, handed)

    def connectionLost(self, reason: Failure | None = None) -> None:
        if self._seam is not None:
            self._seam.detach()
            self._seam = None
        self.service.link_lost(self, reason.getErrorMessage() if reason is not None else "closed")


#: a sealed batch this small is joined with its new head (one copy, one send); a larger one
#: goes as parts (the head, then the batch's body uncopied)
SMALL_SEALED_BYTES = 64 * 1024


#: how long a replication peer's reactor may spin for its origin's next batch (see
#: nsqtw.runtime.spinreactor): a batch comes once the origin has answered a publisher and
#: read its next PUB, often later than the default 50 µs (so those spins mostly missed, the
#: reactor stopped spinning, and every batch woke a sleeping peer); with the spin policy
#: judging by messages stored rather than events, 200 µs and the policy pay.  The spin yields
#: the CPU between its polls (``sched_yield``): while it waits, the publisher and the origin
#: it waits for may need this CPU, and the peer's spin then gives it to them at once
PEER_SPIN_SECONDS = 200e-6


class ReplicationService(Service):
    """The origin's links to its peers and its publish barrier."""

    def __init__(self, options: NsqdOptions, reactor: Any, *, instance: bytes, name: str,
                 turn: Any, data_path: str, secret: bytes | None = None, tls: Any = None) -> None:
        self.setName("replication")
        #: the client TLS context of the links (--replication-tls), or None
        self.tls = tls
        #: the shared secret links prove (None: --replication-insecure)
        self.secret = secret
        #: the broker it replicates (:meth:`attach`)
        self.broker: Broker = cast(Broker, None)
        self.data_path = data_path
        #: this node's epoch as an origin (kept in its data path; renewed when a peer reports
        #: it adopted it)
        self.epoch = 0
        #: (peer address, messages dropped, kept) of every adoption a peer reported
        self.adoptions_reported: list[tuple[str, int, int]] = []
        self._state_loop: task.LoopingCall | None = None
        self.options = options
        self.reactor = reactor
        self.turn = turn
        self.origin = ReplicationOrigin(list(options.replica_peers), options.replication_min_acks,
                                        options.replication_degraded == "accept")
        self.origin_identity = (options.node_id, instance, name)
        #: each peer's lag in messages and seconds (for /stats, /metrics and nsqadmin)
        self.lag = PeerLag(reactor.seconds())
        self.links: dict[str, _PeerLink] = {}
        #: snapshots sent after an adoption, each waiting to be stored by enough peers:
        #: (the peers sent one, fired when stored)
        self._restreams: list[tuple[list[str], defer.Deferred[None]]] = []
        #: fired once --replication-min-acks peers are in sync (see when_in_sync)
        self._in_sync_waiters: list[defer.Deferred[None]] = []
        self._retries: dict[str, Any] = {}
        self._connecting: dict[str, Any] = {}
        self._loop: task.LoopingCall | None = None
        self._flush = self.flush
        #: the origin's last batch sequence at the previous check (a link idle since gets a BEAT)
        self._sent_at_check = 0
        #: when the last check ran (a check that comes late judges no link silent), and when a
        #: batch or a BEAT last went out
        self._checked = self._sent_at = reactor.seconds()
        #: peers not yet heard from since the start while delivery is held (see _hold)
        self._unanswered: set[str] = set()
        self._hold_call: Any = None
        #: hand-offs waiting for the peer's HANDED: (peer address, counter) -> fired with it
        self._handoffs: dict[tuple[str, int], defer.Deferred[wire.Handed]] = {}
        #: until when (this node's clock) its peers were asked not to adopt it (0: no window)
        self.maintenance_until = 0.0
        #: the peers told of the window now running
        self.maintenance_told: set[str] = set()
        #: called with the seconds left of a maintenance window when one is set or ended (0)
        self.maintenance_listeners: list[Callable[[float], None]] = []

    @property
    def hooks(self) -> StoreHooks:
        """What the replicated broker is built with: its publishes, FINs and REQs come here."""
        return StoreHooks(record=self.record, fin=self.origin.fin, req=self.origin.req,
                          policy=self._policy, dead=self._dead)

    def attach(self, broker: Broker) -> None:
        """The broker built with :attr:`hooks`: its topic and channel changes go on the link
        in order with its publishes, and snapshots are made of its queues."""
        self.broker = broker
        broker.listeners.append(self.on_event)

    # --- what the broker and the glue call -------------------------------------------

    def record(self, topic: str, due_ns: int, frames: bytes, count: int) -> None:
        origin = self.origin
        origin.record(topic, due_ns, frames, count)
        if origin.pending_count >= EARLY_FLUSH_MESSAGES:
            # a big batch goes at once: the peer stores it while this node handles the next
            self.flush()
        else:
            self.turn.soon(self._flush)

    def _policy(self, topic: str, channel: str, record: bytes) -> None:
        self.origin.policy(topic, channel, record)
        self.turn.soon(self._flush)

    def _dead(self, topic: str, channel: str, frames: list[bytes], why: int) -> None:
        self.origin.dead(topic, channel, frames, why)
        self.turn.soon(self._flush)

    def on_event(self, event: str, topic: str, channel: str | None) -> None:
        """The broker's topic and channel creations and deletions, in order on the link."""
        if is_ephemeral(topic) or (channel is not None and is_ephemeral(channel)):
            return
        kind = _EVENT_KINDS.get(event)
        if kind is None:
            if event != Event.PAUSED:
                return
            t = self.broker.topics.get(topic)
            target = t if channel is None or t is None else t.channels.get(channel)
            kind = wire.PAUSE if target is not None and target.paused else wire.UNPAUSE
        self.origin.op(kind, topic, channel or "")
        self.turn.soon(self._flush)

    def _consumer_state(self) -> None:
        if self.origin.move_consumer_state():
            self.flush()

    def hold(self, done: Callable[[str | None], None]) -> None:
        """Call ``done(None)`` once ``--replication-min-acks`` peers stored everything recorded
        so far (at once if they have), or ``done(reason)`` when the publish is refused (too few
        peers in sync, now or before they answered).  A plain callable, not a Deferred: this
        runs for every replicated publish (see :meth:`barrier` for the Deferred)."""
        try:
            if self.origin.barrier(done):
                done(None)
        except PublishRefused as e:
            done(str(e))

    def barrier(self) -> defer.Deferred[Any]:
        """:meth:`hold` as a Deferred: fails with :class:`PublishRefused`."""
        d: defer.Deferred[Any] = defer.Deferred()

        def done(reason: str | None) -> None:
            if reason is None:
                d.callback(None)
            else:
                d.errback(Failure(PublishRefused(reason)))

        self.hold(done)
        return d

    def restream(self) -> defer.Deferred[None]:
        """After an adoption: a new snapshot of everything outstanding here (the adopted
        messages included) to every linked peer, a window at a time (see
        ``ReplicationOrigin.restream``).  Fires once ``--replication-min-acks`` of them stored
        theirs (fewer, with degraded=accept); fails with :class:`PublishRefused` once too few
        are left to store it (those in sync get it anyway)."""
        self.flush()  # what was recorded before goes first
        now = self.reactor.seconds()
        sent = []
        for address, link in list(self.links.items()):
            if not link.up or link.transport is None:
                continue
            frames = self.origin.restream(address, now, outstanding(self.broker, self.epoch))
            for frame in frames:
                link.send(frame)
            if frames:
                sent.append(address)
        d: defer.Deferred[None] = defer.Deferred()
        self._restreams.append((sent, d))
        self._check_restreams()
        return d

    def when_in_sync(self) -> defer.Deferred[None]:
        """Fires once ``--replication-min-acks`` peers are in sync (caught up with everything
        here): at once if they are.  An adoption whose onward snapshot could not be stored (too
        few peers then, say a partition) is known stored from then on: a peer in sync was sent
        the whole of this node's state when it linked again."""
        d: defer.Deferred[None] = defer.Deferred()
        if self.origin.in_sync() >= self.origin.min_acks:
            d.callback(None)
        else:
            self._in_sync_waiters.append(d)
        return d

    def _check_restreams(self) -> None:
        if self._in_sync_waiters and self.origin.in_sync() >= self.origin.min_acks:
            waiters, self._in_sync_waiters = self._in_sync_waiters, []
            for w in waiters:
                w.callback(None)
        if not self._restreams:
            return
        required = self.origin.required()
        waiting = []
        for addresses, d in self._restreams:
            stored = sum(1 for a in addresses if self.origin.stored_through(a))
            storing = sum(1 for a in addresses if self.origin.peers[a].state == IN_SYNC)
            if required is not None and stored >= required:
                d.callback(None)
            elif required is None or storing < required:
                d.errback(Failure(PublishRefused(self.origin.refusal())))
            else:
                waiting.append((addresses, d))
        self._restreams = waiting

    def flush(self) -> None:
        """Send what was recorded this turn to every peer in sync, as one batch."""
        count = self.origin.pending_count
        batch = self.origin.take_batch(self.reactor.seconds())
        if batch is None:
            return
        self.lag.sent(count)
        parts, peers = batch
        if len(parts) == 1:  # a few publishes, joined (cheaper than gathering the parts)
            data = parts[0]
            for p in peers:
                link = self.links.get(p.address)
                if link is not None and link.transport is not None:
                    link.send(data)
            return
        for p in peers:
            link = self.links.get(p.address)
            if link is not None and link.transport is not None:
                link.send_parts(parts)

    def health(self) -> tuple[bool, str]:
        """``(ok, text)`` for /ping: not ok while publishes are refused; the text says why
        each peer out of sync is (a refused link: the same --node-id, another protocol
        version, a wrong secret...)."""
        origin = self.origin
        if not origin.degraded:
            return True, "OK"
        text = origin.refusal()
        why = "; ".join(f"{p.address}: {p.reason}" for p in origin.peers.values()
                        if p.state != IN_SYNC and p.reason)
        if why:
            text = f"{text} ({why})"
        if origin.accept_degraded:
            return True, f"OK - degraded ({text}; publishes accepted, stored on this node only)"
        return False, f"NOK - {text}; publishes refused until a peer is in sync"

    def stats(self) -> dict[str, Any]:
        now = self.reactor.seconds()
        doc = self.origin.stats(now)
        # the operator's view (sync_state; a peer that is down lags by what was accepted since)
        doc["peers"] = peer_stats(self.origin, self.lag, now)
        doc["epoch"] = self.epoch
        doc["delivery_held"] = self.broker.delivery_held
        if self.maintenance_until > now:
            doc["maintenance"] = self.maintenance_stats(now)
        if self.adoptions_reported:
            doc["adoptions_reported"] = [{"peer": a, "dropped": d, "kept": k}
                                         for a, d, k in self.adoptions_reported]
        return doc

    # --- links ------------------------------------------------------------------

    def startService(self) -> None:
        super().startService()
        old_epoch = read_epoch(self.data_path)
        self.epoch = old_epoch or new_epoch(self.data_path, int(self.reactor.seconds() * 1e9))
        if old_epoch and self.origin.peers:
            self._hold()
        for address in self.origin.peers:
            self._connect(address)
        timeout = self.options.replication_timeout
        self._loop = task.LoopingCall(self._check_stalled)
        self._loop.clock = self.reactor
        self._loop.start(check_interval(timeout), now=False)
        self._state_loop = task.LoopingCall(self._consumer_state)
        self._state_loop.clock = self.reactor
        self._state_loop.start(CONSUMER_STATE_INTERVAL, now=False)

    def _hold(self) -> None:
        """A restart with messages restored from the data path: one of the peers may have
        adopted them while this node was down.  Nothing is delivered until every peer answered
        HELLO (saying whether it adopted this epoch; then the backlog is dropped or kept, see
        :meth:`_adopted_by`) or could not be reached, at most ``--replication-timeout``, so
        consumers connecting early do not get what an adopter delivered already."""
        backlog = sum(t.depth() + sum(c.depth() + len(c.deferred) + len(c.inflight) for c in t.channels.values()
                          if not c.ephemeral)
                      for t in self.broker.topics.values() if not t.ephemeral)
        if not backlog:
            return
        self.broker.delivery_held = True
        self._unanswered = set(self.origin.peers)
        self._hold_call = self.reactor.callLater(self.options.replication_timeout, self._release_delivery,
                                                 "no answer within --replication-timeout")
        log.info("REPLICATION: holding delivery of the {n} messages restored from the data path until "
                 "the peers say whether one adopted them (at most {t}s)", n=backlog,
                 t=self.options.replication_timeout)

    def _answered(self, address: str) -> None:
        if self._unanswered:
            self._unanswered.discard(address)
            if not self._unanswered:
                self._release_delivery("every peer answered")

    def _release_delivery(self, why: str) -> None:
        call, self._hold_call = self._hold_call, None
        if call is not None and call.active():
            call.cancel()
        self._unanswered = set()
        if self.broker.delivery_held:
            self.broker.delivery_held = False
            log.info("REPLICATION: delivering the restored messages ({why})", why=why)
            self.broker.settle(self.reactor.seconds())

    def stopService(self) -> None:
        super().stopService()
        if self.options.maintenance_on_stop > 0:  # before the links close (their last frames)
            self.maintenance(self.options.maintenance_on_stop)
        self._release_delivery("exiting")
        for loop in (self._loop, self._state_loop):
            if loop is not None and loop.running:
                loop.stop()
        self._loop = self._state_loop = None
        self._consumer_state()  # the last FINs go out with the links' close
        for call in self._retries.values():
            if call.active():
                call.cancel()
        self._retries.clear()
        for d in list(self._connecting.values()):
            d.cancel()
        self._connecting.clear()
        for link in list(self.links.values()):
            link.transport.loseConnection()
        self._refuse(self.origin.fail_all(), "exiting")

    def _connect(self, address: str) -> None:
        self._retries.pop(address, None)
        if not self.running:
            return
        host, port = split_host_port(address, "replica-peer")
        self.origin.connecting(address, self.reactor.seconds())
        endpoint = HostnameEndpoint(self.reactor, host, port, timeout=self.options.replication_timeout)
        factory: Any = _LinkFactory(self, address)
        if self.tls is not None:
            from twisted.protocols.tls import TLSMemoryBIOFactory
            factory = TLSMemoryBIOFactory(self.tls, True, factory)
        d = endpoint.connect(factory)
        self._connecting[address] = d

        def connected(proto: Any) -> None:
            self._connecting.pop(address, None)
            link = getattr(proto, "wrappedProtocol", proto)  # under TLS: the link inside it
            self.links[address] = link

        def failed(f: Failure) -> None:
            self._connecting.pop(address, None)
            self._down(address, f"connect failed: {f.getErrorMessage()}")

        d.addCallbacks(connected, failed)

    def _down(self, address: str, reason: str) -> None:
        peer = self.origin.peers[address]
        was, last = peer.state, peer.reason
        released, refused = self.origin.unlinked(address, self.reactor.seconds(), reason)
        self.lag.down(address, self.reactor.seconds())
        if was == IN_SYNC or reason != last:  # once per outage and reason, not at every retry
            log.warn("REPLICATION: peer {peer} out of sync: {why}", peer=address, why=reason)
        self._release(released)
        self._refuse(refused, self.origin.refusal())
        self._check_restreams()
        if self.running and address not in self._retries:
            self._retries[address] = self.reactor.callLater(RECONNECT_INTERVAL, self._connect, address)
        self._answered(address)  # unreachable (or refused): it cannot say it adopted this node

    def link_up(self, link: _PeerLink, hello: wire.Hello) -> None:
        """The peer answered HELLO: if it adopted this node's epoch, drop what it adopted;
        then it catches up: a snapshot of everything outstanding, then the live stream."""
        if hello.adopted != wire.NO_ID:
            self._adopted_by(link.address, hello.adopted)
        self.flush()  # what was recorded before the snapshot goes to the others first
        now = self.reactor.seconds()
        self.lag.up(link.address)
        frames = self.origin.linked(link.address, hello.node_id, now, outstanding(self.broker, self.epoch))
        for frame in frames:
            link.send(frame)
        log.info("REPLICATION: peer {peer} ({name}, node {id}) linked, catching up from a snapshot",
                 peer=link.address, name=hello.name, id=hello.node_id)
        left = self.maintenance_until - now
        if left > 0 and link.link.speaks_handoff:  # a window asked for while this peer was away
            link.writev(link.link.maintenance(left))
            self.maintenance_told.add(link.address)
        self._answered(link.address)

    def _adopted_by(self, address: str, adopted_id: bytes) -> None:
        """A peer adopted this node's epoch up to message ``adopted_id``: the backlog here is
        dropped if every message of it is one the peer adopted (IDs up to ``adopted_id``);
        if any is newer (published after the peer's shadow stopped), everything is kept and
        delivered (duplicates, never loss).  A new epoch starts either way."""
        top, count = wire.NO_ID, 0
        for e in outstanding(self.broker, 0):  # read as it goes: the backlog is not held whole
            if e[0] == wire.SNAP_MSG:
                for f in wire.split_frames(e[4]):
                    count += 1
                    if f[18:34] > top:
                        top = f[18:34]
        if top <= adopted_id:
            for t in list(self.broker.topics.values()):
                if t.ephemeral:
                    continue
                self.broker.empty(t.name)
                for name in [c for c in t.channels if not is_ephemeral(c)]:
                    self.broker.empty(t.name, name)
            self.adoptions_reported.append((address, count, 0))
            log.warn("REPLICATION: peer {peer} adopted this node's messages (epoch {epoch}): "
                     "dropped the {n} it had adopted", peer=address, epoch=self.epoch, n=count)
        else:
            self.adoptions_reported.append((address, 0, count))
            log.warn("REPLICATION: peer {peer} adopted this node's epoch {epoch}, but some of the {n} "
                     "messages here are newer than what it adopted: delivering them all "
                     "(duplicates possible)", peer=address, epoch=self.epoch, n=count)
        self.epoch = new_epoch(self.data_path, int(self.reactor.seconds() * 1e9), self.epoch)

    def _handoffs_lost(self, address: str, reason: str) -> None:
        for key in [k for k in self._handoffs if k[0] == address]:
            self._handoffs.pop(key).callback(wire.Handed(key[1], False, wire.NO_ID, 0, f"link lost: {reason}"))

    def link_failed(self, link: _PeerLink, reason: str) -> None:
        self._handoffs_lost(link.address, reason)
        link.up = False
        self.links.pop(link.address, None)
        self._down(link.address, reason)

    def link_lost(self, link: _PeerLink, reason: str) -> None:
        if self.links.get(link.address) is link:
            self._handoffs_lost(link.address, reason)
            del self.links[link.address]
            self._down(link.address, f"link lost: {reason}")

    def acked(self, address: str, seq: int) -> None:
        peer = self.origin.peers[address]
        was = peer.state
        now = self.reactor.seconds()
        for done in self.origin.acked(address, seq, now):
            done(None)
        if peer.catchup is not None:  # a snapshot going out: its next batches
            link = self.links.get(address)
            if link is not None and link.transport is not None:
                for frame in self.origin.catch_up(address, now):
                    link.send(frame)
        if peer.state != was and peer.state == IN_SYNC:
            log.info("REPLICATION: peer {peer} caught up, in sync", peer=address)
        if self._restreams or self._in_sync_waiters:
            self._check_restreams()

    def _check_stalled(self) -> None:
        """Every second or so: drop a link that left a batch (or its HELLO) unanswered, fell
        behind, or has been silent (no ACK, no BEAT) for ``--replication-timeout``; send a BEAT
        on every link when nothing was sent since the last check."""
        now = self.reactor.seconds()
        timeout = self.options.replication_timeout
        behind = self.origin.behind()
        reasons: dict[str, str] = {}
        for address in self.origin.overdue(now, timeout):
            reasons[address] = "stalled: no answer within --replication-timeout"
        for address in behind:
            reasons[address] = f"fell behind: over {self.origin.max_lag} messages unacknowledged"
        if self.origin.last_sent != self._sent_at_check:
            self._sent_at_check = self.origin.last_sent
            self._sent_at = now
        idle = now - self._sent_at >= beat_interval(timeout)
        if idle:
            self._sent_at = now
        late = now - self._checked > 2 * check_interval(timeout)  # this node was busy: no silence to judge
        self._checked = now
        for address, link in list(self.links.items()):
            if late:
                link.heard = now
            if not link.up or address in reasons:
                continue
            if now - link.heard >= timeout:
                reasons[address] = f"silent: nothing heard for {round(now - link.heard, 1)}s (--replication-timeout)"
            elif idle and link.transport is not None:
                link.beat()
        for address, reason in reasons.items():
            dropped = self.links.pop(address, None)
            pending = self._connecting.pop(address, None)
            self._down(address, reason)
            if dropped is not None:
                dropped.transport.abortConnection()
            if pending is not None:
                pending.cancel()

    # --- drain and maintenance ---------------------------------------------------

    def handoff_peer(self, exclude: set[str] | frozenset[str] = frozenset()) -> str | None:
        """A peer this node can hand its backlog to now: linked, in sync (its shadow of this
        node is whole), speaking HANDOFF and not in ``exclude``; None when there is none."""
        for address, link in sorted(self.links.items()):
            if address in exclude:
                continue
            peer = self.origin.peers.get(address)
            if (link.up and link.transport is not None and peer is not None and peer.state == IN_SYNC
                    and peer.catchup is None and link.link.speaks_handoff):
                return address
        return None

    def hand_off(self, address: str) -> defer.Deferred[wire.Handed]:
        """Ask the peer at ``address`` to adopt this node's backlog now (a drain): what was
        recorded and finished so far goes first, then HANDOFF; fires with the peer's answer
        (refused when the link is lost first).  When it adopted, the backlog here is dropped
        (as after an adoption reported at link set-up) and a new epoch starts."""
        link = self.links.get(address)
        if link is None or not link.up or link.transport is None or not link.link.speaks_handoff:
            return defer.succeed(wire.Handed(0, False, wire.NO_ID, 0, "the peer is not linked"))
        self._consumer_state()
        self.flush()
        counter, parts = link.link.handoff(self.epoch)
        d: defer.Deferred[wire.Handed] = defer.Deferred()
        self._handoffs[(address, counter)] = d
        link.writev(parts)
        log.info("REPLICATION: handing this node's messages to peer {peer} (epoch {epoch})", peer=address,
                 epoch=self.epoch)
        return d

    def handed(self, address: str, handed: wire.Handed) -> None:
        """The peer's HANDED: drop what it adopted, then fire the hand-off's Deferred."""
        d = self._handoffs.pop((address, handed.counter), None)
        if d is None:
            return
        if handed.ok:
            log.info("REPLICATION: peer {peer} adopted {n} messages of this node", peer=address, n=handed.count)
            self._adopted_by(address, handed.adopted)
            self.settle()
            # every peer's shadow of this node: what is left here (nothing, unless some was kept),
            # of the new epoch (a later hand-off names it)
            self.restream().addErrback(lambda f: None)
        d.callback(handed)

    def settle(self) -> None:
        self.broker.settle(self.reactor.seconds())

    def maintenance(self, seconds: float) -> dict[str, Any]:
        """Ask every peer not to adopt this node for ``seconds`` (0: the window is over), on
        their own clocks: the window outlives the links (a restart); a peer not linked now is
        told when it links, if the window still runs."""
        now = self.reactor.seconds()
        self.maintenance_until = now + seconds if seconds > 0 else 0.0
        self.maintenance_told = set()
        for address, link in sorted(self.links.items()):
            if link.up and link.transport is not None and link.link.speaks_handoff:
                link.writev(link.link.maintenance(seconds))
                self.maintenance_told.add(address)
        if seconds > 0:
            log.info("REPLICATION: maintenance: peers asked not to adopt this node for {s}s (told: {told})",
                     s=seconds, told=", ".join(sorted(self.maintenance_told)) or "none")
        else:
            log.info("REPLICATION: maintenance window over (peers told: {told})",
                     told=", ".join(sorted(self.maintenance_told)) or "none")
        for listener in list(self.maintenance_listeners):
            listener(seconds if seconds > 0 else 0.0)
        return self.maintenance_stats(now)

    def maintenance_stats(self, now: float | None = None) -> dict[str, Any]:
        now = self.reactor.seconds() if now is None else now
        left = max(0.0, self.maintenance_until - now)
        return {"active": left > 0, "remaining_seconds": round(left, 3),
                "until": self.maintenance_until if left > 0 else None,
                "peers_told": sorted(self.maintenance_told) if left > 0 else [],
                "peers_not_told": sorted(set(self.origin.peers) - self.maintenance_told) if left > 0 else []}

    def peers_holding(self, origin: int) -> list[tuple[int, int]]:
        """``(node id, HELD or ADOPTED)`` of each peer linked and live (in sync or catching
        up) that says it holds ``origin``'s shadow: who :func:`choose` weighs when this node
        considers adopting ``origin``."""
        out = []
        for address, link in self.links.items():
            peer = self.origin.peers.get(address)
            if (link.up and peer is not None and peer.node_id is not None
                    and (peer.state == IN_SYNC or peer.state == CATCHING_UP) and origin in link.holds):
                out.append((peer.node_id, link.holds[origin]))
        return out

    @staticmethod
    def _release(tokens: list[Any]) -> None:
        for done in tokens:
            done(None)

    @staticmethod
    def _refuse(tokens: list[Any], reason: str) -> None:
        for done in tokens:
            done(reason)


_EVENT_KINDS = {Event.TOPIC_CREATED: wire.TOPIC_NEW, Event.TOPIC_DELETED: wire.TOPIC_DEL,
                Event.CHANNEL_CREATED: wire.CHANNEL_NEW, Event.CHANNEL_DELETED: wire.CHANNEL_DEL,
                Event.EMPTIED: wire.EMPTY}


class _LinkFactory(Factory):
    noisy = False

    def __init__(self, service: ReplicationService, address: str) -> None:
        self.service = service
        self.address = address

    def buildProtocol(self, addr: Any) -> Protocol:
        p = _PeerLink(self.service, self.address)
        p.factory = self
        return p

