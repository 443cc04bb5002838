"""
What a test's nsqd saw: every publish, delivery, FIN, REQ and timeout, in order.

::

    @pytest_twisted.ensureDeferred
    async def test_checkout_publishes_an_order(nsqtw_nsqd):
        await checkout(nsqtw_nsqd.tcp_address)
        nsqtw_nsqd.assert_published("orders", body=b'{"id": 1}')
        nsqtw_nsqd.assert_nothing_published("audit")

A :class:`TrafficRecorder` watches one broker from the outside: it wraps the
broker object's three publish methods, gives it a channel class that notes what its
channels hand out and get back (the broker's ``channel_class`` seam), and counts
publishes per connection through each client's ``pub_counts``.  The broker's code
is unchanged; a broker no recorder watches pays nothing.

Times are the broker's (``reactor.seconds()``: the virtual clock's under
``nsqtw_clock``).  ``client`` names the connection that published or received a
message (its IDENTIFY ``client_id``, by default the host); an HTTP publish has
``client=None``.
"""

from __future__ import annotations

import difflib
import struct
from typing import TYPE_CHECKING, Any
from collections.abc import Callable, Sequence

import attr

from ..backend.runs import Run, frames_and_ids
from ..errors import BackendError, FinFailed
from ..nsqd.core.channel import Channel
from ..nsqd.core.client import ClientState
from ..protocol.message import BODY_OFFSET, ID_SLICE

if TYPE_CHECKING:
    from ..nsqd.core.broker import Broker
    from ..nsqd.core.topic import Topic

__all__ = ["Published", "Handled", "TrafficRecorder", "DELIVERED", "FINISHED", "REQUEUED", "TIMED_OUT",
           "REFUSED_BY_TEST"]

#: kinds of :class:`Handled` records
DELIVERED = "delivered"
FINISHED = "finished"
REQUEUED = "requeued"
TIMED_OUT = "timed_out"

#: the reason a publish refused by :meth:`nsqtw.testing.faults.NsqdFaults.refuse_publishes` gives
#: (``E_PUB_FAILED PUB failed refused by the test``)
REFUSED_BY_TEST = "refused by the test"

_ATTEMPTS = struct.Struct(">H").unpack_from


@attr.s(frozen=True, auto_attribs=True)
class Published:
    """One message the broker stored (an MPUB is one record per body).

    Stored is not always acknowledged: with ``--sync-every=1`` or replication the publisher's
    answer waits for the fsync or the replicas, and when that fails it gets ``E_PUB_FAILED``
    although the message stays queued (a retry makes a duplicate)."""

    topic: str
    body: bytes
    #: the broker's time of the publish (seconds)
    time: float
    #: the publishing connection's client_id; None for an HTTP publish
    client: str | None = None
    #: a DPUB's delay (seconds), 0 otherwise
    delay: float = 0.0

    def __str__(self) -> str:
        by = f" by {self.client}" if self.client is not None else " over HTTP"
        later = f" deferred {self.delay:g}s" if self.delay else ""
        return f"t={self.time:.3f} {self.body!r}{by}{later}"


@attr.s(frozen=True, auto_attribs=True)
class Handled:
    """What a channel did with a message: ``kind`` is delivered, finished, requeued or timed_out."""

    kind: str
    topic: str
    channel: str
    #: the message ID (16 hex digits, as on the wire)
    id: bytes
    body: bytes
    #: the delivery attempt this record is about (1 for the first delivery)
    attempts: int
    time: float
    #: the connection's client_id
    client: str | None = None
    #: a REQ's delay (seconds)
    delay: float = 0.0

    def __str__(self) -> str:
        return (f"t={self.time:.3f} {self.kind} {self.topic}/{self.channel} {self.id.decode('latin-1')} "
                f"attempt {self.attempts} {self.body!r}" + (f" to {self.client}" if self.client else ""))


class _CountingDict(dict[str, int]):
    """A client's ``pub_counts`` that tells the recorder which connection published."""

    def __init__(self, notify: Callable[[str, int], None]) -> None:
        super().__init__()
        self._notify = notify

    def __setitem__(self, topic: str, value: int) -> None:
        added = value - self.get(topic, 0)
        super().__setitem__(topic, value)
        if added > 0:
            self._notify(topic, added)


class TrafficRecorder:
    """Records one broker's traffic; also the seam the fault injection refuses publishes at."""

    def __init__(self) -> None:
        self.published: list[Published] = []
        self.handled: list[Handled] = []
        #: the next this many publish commands are refused (``E_PUB_FAILED``)
        self.refuse_next = 0
        #: records not yet attributed to a connection, by topic: indexes into ``published``
        self._unclaimed: dict[str, list[int]] = {}
        self._in_many = False

    # --- attaching ----------------------------------------------------------------------

    def attach(self, broker: Broker) -> None:
        """Watch ``broker`` (before its service starts, so every channel is watched)."""
        broker_any: Any = broker  # instance attributes shadow the methods: the broker's class is untouched
        publish, publish_one, publish_deferred = broker.publish, broker.publish_one, broker.publish_deferred
        new_client = broker.new_client

        def recorded_publish(topic_name: str, bodies: Sequence[bytes], now: float,
                             uniform: int | None = None) -> Topic:
            self._gate()
            topic = publish(topic_name, bodies, now, uniform)
            for body in bodies:
                self._add(Published(topic_name, bytes(body), now))
            return topic

        def recorded_publish_one(topic_name: str, body: bytes, now: float) -> Topic:
            self._gate()
            topic = publish_one(topic_name, body, now)
            self._add(Published(topic_name, bytes(body), now))
            return topic

        def recorded_publish_deferred(topic_name: str, body: bytes, delay: float, now: float) -> Topic:
            self._gate()
            topic = publish_deferred(topic_name, body, delay, now)
            self._add(Published(topic_name, bytes(body), now, delay=delay))
            return topic

        def recorded_new_client(remote_address: str, now: float) -> ClientState:
            client = new_client(remote_address, now)
            client.pub_counts = _CountingDict(lambda topic, n: self._claim(client, topic, n))
            return client

        broker_any.publish = recorded_publish
        broker_any.publish_one = recorded_publish_one
        broker_any.publish_deferred = recorded_publish_deferred
        broker_any.new_client = recorded_new_client
        base: type[Channel] = broker.channel_class
        broker_any.channel_class = type(f"Recording{base.__name__}", (_RecordingChannel, base),
                                        {"__slots__": (), "_recorder": self})

    def _gate(self) -> None:
        if self.refuse_next > 0:
            self.refuse_next -= 1
            raise BackendError(REFUSED_BY_TEST)

    def _add(self, record: Published) -> None:
        self._unclaimed.setdefault(record.topic, []).append(len(self.published))
        self.published.append(record)

    def _claim(self, client: ClientState, topic: str, n: int) -> None:
        """``client`` just published ``n`` messages on ``topic``: the latest unattributed ones."""
        waiting = self._unclaimed.get(topic)
        if not waiting:
            return
        mine, waiting[-n:] = waiting[-n:], []
        for i in mine:
            self.published[i] = attr.evolve(self.published[i], client=client.client_id)

    def note(self, kind: str, channel: Channel, frame: bytes, now: float, client: ClientState | None,
             delay: float = 0.0) -> None:
        self.handled.append(Handled(kind, channel.topic.name, channel.name, bytes(frame[ID_SLICE]),
                                    bytes(frame[BODY_OFFSET:]), _ATTEMPTS(frame, 16)[0], now,
                                    client.client_id if client is not None else None, delay))

    # --- reading ------------------------------------------------------------------------

    def clear(self) -> None:
        """Forget everything recorded so far."""
        self.published.clear()
        self.handled.clear()
        self._unclaimed.clear()

    def published_on(self, topic: str) -> list[Published]:
        return [p for p in self.published if p.topic == topic]

    def handled_as(self, kind: str | None = None, topic: str | None = None,
                   channel: str | None = None) -> list[Handled]:
        return [h for h in self.handled if (kind is None or h.kind == kind)
                and (topic is None or h.topic == topic) and (channel is None or h.channel == channel)]

    # --- assertions ---------------------------------------------------------------------

    def assert_published(self, topic: str, body: bytes | str | None = None, *, count: int | None = None) -> None:
        """At least one message on ``topic`` (with ``body`` when given); exactly ``count`` of
        them when given.  On failure, the message lists what was published there and, for a
        body, a diff against the closest one."""
        want = body.encode() if isinstance(body, str) else body
        there = self.published_on(topic)
        matching = there if want is None else [p for p in there if p.body == want]
        if (count is None and matching) or (count is not None and len(matching) == count):
            return
        what = f"body {want!r}" if want is not None else "any body"
        expected = f"{count} message(s)" if count is not None else "a message"
        lines = [f"expected {expected} on {topic!r} with {what}; got {len(matching)}",
                 self._listing(topic)]
        if want is not None and there and not matching:
            closest = max(there, key=lambda p: difflib.SequenceMatcher(None, p.body, want).ratio())
            lines.append("closest body, diff (- expected, + published):")
            lines.extend("  " + line for line in difflib.ndiff([repr(want)], [repr(closest.body)]))
        raise AssertionError("\n".join(lines))

    def assert_nothing_published(self, topic: str) -> None:
        """No message was published on ``topic``; on failure, lists what was."""
        if self.published_on(topic):
            raise AssertionError(f"expected nothing published on {topic!r}\n{self._listing(topic)}")

    def _listing(self, topic: str) -> str:
        there = self.published_on(topic)
        lines = [f"published on {topic!r} ({len(there)}):"]
        lines.extend(f"  {i}. {p}" for i, p in enumerate(there, 1))
        others = sorted({p.topic for p in self.published} - {topic})
        if others:
            counts = ", ".join(f"{t} ({len(self.published_on(t))})" for t in others)
            lines.append(f"other topics: {counts}")
        return "\n".join(lines)


class _RecordingChannel(Channel):
    """A channel that tells its broker's recorder what it hands out and gets back."""

    __slots__ = ()
    _recorder: TrafficRecorder  # set on each recorder's own subclass

    def _send(self, client: ClientState, runs: list[Run], now: float) -> None:
        before = set(self.inflight)
        super()._send(client, runs, now)
        rec = self._recorder
        inflight = self.inflight
        for run in runs:
            frames, ids = frames_and_ids(run)
            for frame, mid in zip(frames, ids, strict=True):
                if mid in inflight and mid not in before:
                    rec.note(DELIVERED, self, frame, now, client)

    def finish(self, client: ClientState, mid: bytes, now: float) -> None:
        ep = self.inflight.get(mid)
        frame = ep.msgs.get(mid) if ep is not None else None
        super().finish(client, mid, now)
        if frame is not None and not self._recorder._in_many:
            self._recorder.note(FINISHED, self, frame, now, client)

    def finish_many(self, client: ClientState, ids: list[bytes], now: float) -> list[FinFailed]:
        inflight = self.inflight
        frames = {mid: ep.msgs.get(mid) for mid in ids if (ep := inflight.get(mid)) is not None}
        rec = self._recorder
        rec._in_many = True
        try:
            errors = super().finish_many(client, ids, now)
        finally:
            rec._in_many = False
        for mid in ids:
            frame = frames.get(mid)
            if frame is not None and mid not in inflight:
                rec.note(FINISHED, self, frame, now, client)
        return errors

    def requeue(self, client: ClientState, mid: bytes, delay: float, now: float) -> None:
        ep = self.inflight.get(mid)
        frame = ep.msgs.get(mid) if ep is not None else None
        super().requeue(client, mid, delay, now)
        if frame is not None:
            self._recorder.note(REQUEUED, self, frame, now, client, delay)

    def process_in_flight(self, now: float) -> bool:
        frames = {mid: (ep.msgs.get(mid), ep.client) for mid, ep in self.inflight.items()}
        dirty = super().process_in_flight(now)
        if dirty:
            inflight = self.inflight
            for mid, (frame, client) in frames.items():
                if frame is not None and mid not in inflight:
                    self._recorder.note(TIMED_OUT, self, frame, now, client)
        return dirty
