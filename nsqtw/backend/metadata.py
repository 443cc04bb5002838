"""
``nsqd.dat``: which topics and channels exist and which are paused.

The file is nsqd's ``Metadata`` struct as Go's ``encoding/json`` writes it,
so a data directory moves freely between nsqtw and Go's nsqd::

    {"topics":[{"name":"t","paused":false,"channels":[{"name":"c","paused":true}]},
               {"name":"u","paused":false,"channels":null}],"version":"1.3.0"}

Ephemeral topics, and ephemeral channels of durable topics, are left out.
Writes are atomic (``nsqd.dat.<rand>.tmp``, fsync, rename; like nsqd the
directory is not fsynced).  Loading follows ``NSQD.LoadMetadata``: a missing
file is a fresh start, unparsable JSON is fatal (:class:`MetadataError`),
invalid names are skipped with a warning.  Field names match Go's decoder
(case-insensitively); a value of the wrong type is fatal, as in Go.
"""

from __future__ import annotations

import json
import os
import random
import re
from typing import Any
from collections.abc import Callable, Iterable, Mapping

import attr
from twisted.logger import Logger

from .. import NSQ_VERSION
from ..protocol.names import is_ephemeral, is_valid_channel_name, is_valid_topic_name
from .durability import fsync

__all__ = [
    "METADATA_FILE",
    "ChannelMetadata",
    "TopicMetadata",
    "Metadata",
    "MetadataError",
    "encode_metadata",
    "decode_metadata",
    "load_metadata",
    "write_metadata",
    "metadata_from_broker",
    "write_file_atomically",
    "metadata_snapshot",
    "write_snapshot",
    "TopicFragments",
    "encode_fragments",
    "write_fragments",
    "MetadataWriter",
]

METADATA_FILE = "nsqd.dat"

log = Logger(namespace="nsqtw.nsqd")


class MetadataError(Exception):
    """``nsqd.dat`` exists but cannot be used; nsqd refuses to start."""


@attr.s(frozen=True, slots=True, auto_attribs=True)
class ChannelMetadata:
    name: str
    paused: bool = False


@attr.s(frozen=True, slots=True, auto_attribs=True)
class TopicMetadata:
    name: str
    paused: bool = False
    channels: tuple[ChannelMetadata, ...] = ()


@attr.s(frozen=True, slots=True, auto_attribs=True)
class Metadata:
    topics: tuple[TopicMetadata, ...] = ()
    version: str = NSQ_VERSION


# --- encoding ----------------------------------------------------------------

def _str(s: str) -> str:
    # Go escapes <, > and & in strings; valid names never contain them, other text might.
    return json.dumps(s, ensure_ascii=False).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _bool(b: bool) -> str:
    return "true" if b else "false"


def encode_metadata(md: Metadata) -> bytes:
    """The exact bytes Go's ``json.Marshal(Metadata)`` produces (nil slices as ``null``)."""
    topics: list[str] = []
    for t in md.topics:
        if t.channels:
            chans = "[" + ",".join(
                f'{{"name":{_str(c.name)},"paused":{_bool(c.paused)}}}' for c in t.channels) + "]"
        else:
            chans = "null"
        topics.append(f'{{"name":{_str(t.name)},"paused":{_bool(t.paused)},"channels":{chans}}}')
    body = "[" + ",".join(topics) + "]" if topics else "null"
    return f'{{"topics":{body},"version":{_str(md.version)}}}'.encode()


def metadata_from_broker(broker: Any) -> Metadata:
    """What ``PersistMetadata`` would write for a :class:`~nsqtw.nsqd.core.broker.Broker`.

    Reads ``broker.topics`` (name -> topic with ``name``, ``paused``, ``channels``);
    ephemeral names are recognised by their ``#ephemeral`` suffix.
    """
    topics: list[TopicMetadata] = []
    for topic in list(broker.topics.values()):
        if is_ephemeral(topic.name):
            continue
        chans = tuple(ChannelMetadata(ch.name, bool(ch.paused))
                      for ch in list(topic.channels.values()) if not is_ephemeral(ch.name))
        topics.append(TopicMetadata(topic.name, bool(topic.paused), chans))
    return Metadata(tuple(topics))


# --- decoding ----------------------------------------------------------------

def _field(obj: dict[str, Any], key: str) -> Any:
    """Go's decoder: an exact key first, else a case-insensitive match."""
    if key in obj:
        return obj[key]
    low = key.lower()
    for k, v in obj.items():
        if k.lower() == low:
            return v
    return None


def _expect(value: Any, kind: type, what: str, source: str) -> Any:
    if value is None or isinstance(value, kind):
        return value
    raise MetadataError(f"failed to parse metadata in {source} - {what} has the wrong type "
                        f"({type(value).__name__}, want {kind.__name__})")


def decode_metadata(data: bytes, source: str = METADATA_FILE,
                    warn: Callable[[str], None] | None = None) -> Metadata:
    """Parse ``nsqd.dat``; invalid names are skipped and reported through ``warn``."""
    if warn is None:
        def warn(text: str) -> None:
            log.warn("{text}", text=text)
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise MetadataError(f"failed to parse metadata in {source} - {e}") from None
    if doc is None:
        return Metadata()
    _expect(doc, dict, "the document", source)
    raw_topics = _expect(_field(doc, "topics"), list, "topics", source) or []
    version = _expect(_field(doc, "version"), str, "version", source) or ""
    topics: list[TopicMetadata] = []
    for raw in raw_topics:
        if raw is None:
            raw = {}
        _expect(raw, dict, "a topic", source)
        name = _expect(_field(raw, "name"), str, "topic name", source) or ""
        paused = bool(_expect(_field(raw, "paused"), bool, "topic paused", source))
        raw_chans = _expect(_field(raw, "channels"), list, "channels", source) or []
        chans: list[ChannelMetadata] = []
        for rc in raw_chans:
            if rc is None:
                rc = {}
            _expect(rc, dict, "a channel", source)
            cname = _expect(_field(rc, "name"), str, "channel name", source) or ""
            cpaused = bool(_expect(_field(rc, "paused"), bool, "channel paused", source))
            chans.append(ChannelMetadata(cname, cpaused))
        if not is_valid_topic_name(name):
            warn(f"skipping creation of invalid topic {name}")
            continue
        good: list[ChannelMetadata] = []
        for c in chans:
            if not is_valid_channel_name(c.name):
                warn(f"skipping creation of invalid channel {c.name}")
                continue
            good.append(c)
        topics.append(TopicMetadata(name, paused, tuple(good)))
    return Metadata(tuple(topics), version)


def load_metadata(data_path: str, warn: Callable[[str], None] | None = None) -> Metadata | None:
    """``nsqd.dat`` of ``data_path``, or None for a fresh start (no file)."""
    fn = os.path.join(data_path, METADATA_FILE)
    try:
        with open(fn, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise MetadataError(f"failed to read metadata from {fn} - {e.strerror or e}") from None
    return decode_metadata(data, fn, warn)


# --- writing -----------------------------------------------------------------

def write_file_atomically(path: str, data: bytes, rng: random.Random | None = None) -> None:
    """``<path>.<rand>.tmp``, write, fsync, close, rename over ``path`` (as Go's nsqd)."""
    tmp = f"{path}.{(rng or random).getrandbits(63)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        fsync(fd)
    except BaseException:
        os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    os.close(fd)
    os.replace(tmp, path)


def write_metadata(data_path: str, md: Metadata) -> None:
    """Persist ``md`` as ``<data_path>/nsqd.dat`` (blocking: a write and an fsync)."""
    write_file_atomically(os.path.join(data_path, METADATA_FILE), encode_metadata(md))


def iter_queue_names(md: Metadata) -> Iterable[str]:
    """The diskqueue names the metadata implies: ``topic`` and ``topic:channel``."""
    for t in md.topics:
        yield t.name
        for c in t.channels:
            yield f"{t.name}:{c.name}"


# --- coalesced rewrites ----------------------------------------------------------

#: what :func:`metadata_snapshot` takes: ``[(topic, paused, [(channel, paused), ...]), ...]``
Snapshot = list[tuple[str, bool, list[tuple[str, bool]]]]


def metadata_snapshot(broker: Any) -> Snapshot:
    """The names and paused flags :func:`metadata_from_broker` needs, as plain tuples (cheap,
    taken on the reactor thread; :func:`write_snapshot` builds and encodes the rest)."""
    return [(t.name, t.paused, [(c.name, c.paused) for c in list(t.channels.values())])
            for t in list(broker.topics.values())]


def snapshot_metadata(snap: Snapshot) -> Metadata:
    topics = []
    for name, paused, chans in snap:
        if is_ephemeral(name):
            continue
        topics.append(TopicMetadata(name, bool(paused), tuple(
            ChannelMetadata(c, bool(p)) for c, p in chans if not is_ephemeral(c))))
    return Metadata(tuple(topics))


_PLAIN_NAME = re.compile(r"\A[.a-zA-Z0-9_-]+\Z")


def _name(s: str) -> str:
    # valid topic/channel names need no JSON escaping
    return f'"{s}"' if _PLAIN_NAME.match(s) else _str(s)


def encode_snapshot(snap: Snapshot) -> bytes:
    """:func:`encode_metadata` of :func:`snapshot_metadata` (the same bytes), without
    building the attrs objects first (a rewrite of 10,000 topics is mostly this)."""
    return encode_fragments([_topic_fragment(name, paused, chans)
                             for name, paused, chans in snap if not name.endswith("#ephemeral")])


def _topic_fragment(name: str, paused: bool, chans: list[tuple[str, bool]]) -> str:
    kept = [f'{{"name":{_name(c)},"paused":{"true" if p else "false"}}}'
            for c, p in chans if not c.endswith("#ephemeral")]
    listed = "[" + ",".join(kept) + "]" if kept else "null"
    return f'{{"name":{_name(name)},"paused":{"true" if paused else "false"},"channels":{listed}}}'


class TopicFragments:
    """:func:`metadata_snapshot` kept up to date topic by topic: the encoded JSON of each topic
    (with its channels) is cached and redone only for the topics :meth:`touch` names (created,
    deleted, paused, a channel added or removed). Taking a snapshot is then a copy of the
    cached strings (done in C) instead of a walk over every topic and channel in Python, so the
    reactor's share of an ``nsqd.dat`` rewrite no longer grows with the number of topics;
    joining the strings (:func:`encode_fragments`) runs on the sync thread.

    The content is :func:`encode_snapshot`'s for the same broker, ephemeral topics and
    channels left out; topics keep the order they were first written in (a topic deleted and
    created again between two rewrites may keep its old place: nsqd's own order is a Go map's,
    so no reader depends on it)."""

    def __init__(self, topics: Mapping[str, Any]) -> None:
        self._topics = topics
        self._fragments: dict[str, str] = {}
        self._dirty: dict[str, None] = {}  # ordered: new topics are added in creation order
        self._all = True

    def touch(self, topic: str | None = None) -> None:
        """``topic`` changed (None: assume everything did)."""
        if topic is None:
            self._all = True
        else:
            self._dirty[topic] = None

    def __call__(self) -> list[str]:
        topics = self._topics
        if self._all:
            self._all = False
            self._dirty.clear()
            self._fragments = {
                name: _topic_fragment(name, t.paused, [(c.name, c.paused) for c in list(t.channels.values())])
                for name, t in list(topics.items()) if not name.endswith("#ephemeral")}
        elif self._dirty:
            frags = self._fragments
            for name in self._dirty:
                t = topics.get(name)
                if t is None or name.endswith("#ephemeral"):
                    frags.pop(name, None)
                else:
                    frags[name] = _topic_fragment(name, t.paused,
                                                  [(c.name, c.paused) for c in list(t.channels.values())])
            self._dirty.clear()
        return list(self._fragments.values())


def encode_fragments(fragments: list[str]) -> bytes:
    """``nsqd.dat``'s bytes from :class:`TopicFragments` (runs on the sync thread)."""
    body = "[" + ",".join(fragments) + "]" if fragments else "null"
    return f'{{"topics":{body},"version":{_str(NSQ_VERSION)}}}'.encode()


def write_fragments(data_path: str, fragments: list[str]) -> None:
    """Encode and persist what :class:`TopicFragments` returned (blocking; sync thread)."""
    write_file_atomically(os.path.join(data_path, METADATA_FILE), encode_fragments(fragments))


def write_snapshot(data_path: str, snap: Snapshot) -> None:
    """Encode and persist a :func:`metadata_snapshot` (blocking; runs on the sync thread)."""
    write_file_atomically(os.path.join(data_path, METADATA_FILE), encode_snapshot(snap))


#: a rewrite waits at least this many times as long as the previous one took after it
#: finished (so rewriting nsqd.dat takes at most about a tenth of the sync thread's time
#: however many topics there are), but never longer than MAX_GAP seconds
GAP_FACTOR = 10.0
MAX_GAP = 1.0


class MetadataWriter:
    """``nsqd.dat`` rewrites, coalesced: at most one in flight, and every change made while
    one is in flight (or waiting, see below) is folded into the single next one.

    Creating N topics therefore costs as many rewrites as the disk can do meanwhile, not N
    (each rewrite is a snapshot of every topic, so one per change made creation O(count)).
    With a ``clock``, a rewrite also starts no sooner than ``GAP_FACTOR`` times the last
    one's duration after it (at most ``MAX_GAP``), so a big ``nsqd.dat`` is not rewritten
    back to back while topics are being created; ``request(urgent=True)`` (shutdown)
    skips that wait.  ``snapshot`` runs on the caller's thread when a rewrite starts,
    ``write(snapshot)`` is handed to ``submit`` (the sync worker).  Sans-IO: the clock is
    injected.
    """

    def __init__(self, snapshot: Callable[[], Any], write: Callable[[Any], None],
                 submit: Callable[[Callable[[], Any]], Any], clock: Any = None) -> None:
        self._snapshot = snapshot
        self._write = write
        self._submit = submit
        self._clock = clock
        self._in_flight = False
        self._pending: list[Any] = []
        self._wanted = False
        self._not_before = 0.0
        self._timer: Any = None
        self._started_at = 0.0
        self._urgent = False
        #: rewrites started so far
        self.writes = 0

    @property
    def in_flight(self) -> bool:
        return self._in_flight

    def request(self, urgent: bool = False) -> Any:
        """Ask for a rewrite covering every change made so far; returns a Deferred that fires
        (None, or the write's failure) once such a rewrite has finished."""
        from twisted.internet.defer import Deferred

        d: Deferred[Any] = Deferred()
        self._pending.append(d)
        self._wanted = True
        if urgent:
            self._urgent = True
            self._not_before = 0.0
        if not self._in_flight:
            self._maybe_start()
        return d

    def _maybe_start(self) -> None:
        clock = self._clock
        if clock is not None:
            wait = self._not_before - clock.seconds()
            if wait > 0:
                if self._timer is None:
                    self._timer = clock.callLater(wait, self._on_timer)
                return
        if self._timer is not None:
            if self._timer.active():
                self._timer.cancel()
            self._timer = None
        self._start()

    def _on_timer(self) -> None:
        self._timer = None
        if self._wanted and not self._in_flight:
            self._start()

    def _start(self) -> None:
        waiters, self._pending = self._pending, []
        self._wanted = False
        self._in_flight = True
        self._urgent = False
        self.writes += 1
        if self._clock is not None:
            self._started_at = self._clock.seconds()
        try:
            snap = self._snapshot()
        except Exception:
            from twisted.internet.defer import fail
            d = fail()
        else:
            d = self._submit(lambda: self._write(snap))
        d.addBoth(self._done, waiters)

    def _done(self, result: Any, waiters: list[Any]) -> None:
        from twisted.python.failure import Failure

        self._in_flight = False
        if self._clock is not None and not self._urgent:
            now = self._clock.seconds()
            self._not_before = now + min(MAX_GAP, GAP_FACTOR * max(0.0, now - self._started_at))
        if isinstance(result, Failure):
            if result.check(OSError):  # a full or failing disk: an error the node lives through, as Go's says
                log.error("failed to persist metadata - {err}", err=result.getErrorMessage())
            else:
                log.failure("failed to persist metadata", result)
        for d in waiters:
            if isinstance(result, Failure):
                d.errback(result)
            else:
                d.callback(None)
        if self._wanted:
            self._maybe_start()
