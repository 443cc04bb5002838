"""
One connected V2 client as the broker sees it: identity, negotiated settings,
RDY and in-flight accounting, counters for ``/stats``, and its output buffer.

In-flight messages are tracked in *epochs*: every message delivered to a
client within a short span shares one :class:`Epoch`, whose ``msgs`` dict
maps message ID to the frame as sent and whose ``deadline`` is the latest
``delivery + msg_timeout`` in it.  A client's epochs are created in deadline
order (its ``msg_timeout`` is fixed after IDENTIFY), so the queue scan only
looks at the head of a deque, and FIN deletes one dict entry, freeing the
message at once: nothing a finished message owned stays referenced by the
timeout bookkeeping.  TOUCHed messages move to an epoch of their own in a
small heap, because their deadline no longer follows delivery order.
"""

from __future__ import annotations

import heapq
from collections import deque
from itertools import count
from typing import Any
from collections.abc import Callable

from zope.interface import Attribute, Interface, implementer

__all__ = ["ClientState", "Epoch", "IConsumer", "STATE_INIT", "STATE_SUBSCRIBED", "STATE_CLOSING"]

# NSQ's client states, as /stats reports them (1 and 2, disconnected and connected, are never set)
STATE_INIT = 0
STATE_SUBSCRIBED = 3
STATE_CLOSING = 4

#: deliveries closer together than this share an epoch (and so a deadline,
#: which is the latest of theirs: a timeout may fire up to this late, never early)
EPOCH_SPAN = 0.05

_touch_seq = count()


class Epoch:
    """Messages delivered to one client close together in time."""

    __slots__ = ("client", "started", "deadline", "msgs")

    def __init__(self, client: ClientState, started: float, deadline: float) -> None:
        self.client = client
        self.started = started
        self.deadline = deadline
        self.msgs: dict[bytes, bytes] = {}


class IConsumer(Interface):
    """What a Channel needs of a subscribed connection."""

    rdy = Attribute("The client's RDY window.")
    in_flight = Attribute("Messages delivered and not yet FIN/REQ'd or timed out.")
    state = Attribute("NSQ's numeric client state.")
    msg_timeout = Attribute("Seconds before an in-flight message is requeued.")
    sample_rate = Attribute("0 (all) or 1-99: deliver with probability (rate+1)/100.")

    def close() -> None:
        """Drop the connection (the channel or topic is going away)."""


@implementer(IConsumer)
class ClientState:
    """The sans-IO state of one V2 connection."""

    __slots__ = (
        "id", "remote_address", "client_id", "hostname", "user_agent", "state", "connect_ts",
        "rdy", "in_flight", "message_count", "finish_count", "requeue_count", "pub_counts",
        "heartbeat_interval", "output_buffer_size", "output_buffer_timeout", "sample_rate",
        "msg_timeout", "identified", "tls", "tls_details", "snappy", "deflate", "deflate_level",
        "auth", "channel", "epochs", "touched", "_cur", "out", "_outbox", "writer", "closer", "blocked",
        "__weakref__",
    )

    def __init__(self, client_id: int, remote_address: str, connect_ts: float,
                 outbox: list[ClientState], *, heartbeat_interval: float, msg_timeout: float,
                 output_buffer_timeout: float) -> None:
        self.id = client_id
        self.remote_address = remote_address
        host = remote_address.rsplit(":", 1)[0] if ":" in remote_address else remote_address
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        self.client_id = host
        self.hostname = host
        self.user_agent = ""
        self.state = STATE_INIT
        self.connect_ts = connect_ts
        self.rdy = 0
        self.in_flight = 0
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.pub_counts: dict[str, int] = {}
        self.heartbeat_interval = heartbeat_interval
        self.output_buffer_size = 16 * 1024
        self.output_buffer_timeout = output_buffer_timeout
        self.sample_rate = 0
        self.msg_timeout = msg_timeout
        self.identified = False
        self.tls = False
        #: () -> (version, cipher, peer common name) once TLS is negotiated
        self.tls_details: Callable[[], tuple[str, str, str]] = lambda: ("", "", "")
        self.snappy = False
        self.deflate = False
        self.deflate_level = 0
        self.auth: Any = None
        self.channel: Any = None
        self.epochs: deque[Epoch] = deque()
        self.touched: list[tuple[float, int, Epoch]] = []
        self._cur: Epoch | None = None
        self.out: list[bytes] = []
        self._outbox = outbox
        #: its transport's buffer is full (the client is not reading): deliver nothing more
        self.blocked = False
        self.writer: Callable[[bytes], None] = lambda data: None
        self.closer: Callable[[], None] = lambda: None

    # --- output -------------------------------------------------------------

    def send(self, data: bytes) -> None:
        """Queue bytes for this client's next write (one write per reactor turn)."""
        if not self.out:
            self._outbox.append(self)
        self.out.append(data)

    def write(self, data: bytes) -> None:
        """Write bytes now, behind anything already queued for this client (its connection's
        answers and heartbeats; the broker's deliveries go through :meth:`send`)."""
        if self.out:
            self.out.append(data)
            self.flush()
        else:
            self.writer(data)

    def flush(self) -> None:
        out = self.out
        if out:
            data = out[0] if len(out) == 1 else b"".join(out)
            out.clear()
            self.writer(data)

    def close(self) -> None:
        self.flush()
        self.closer()

    # --- delivery -----------------------------------------------------------

    def epoch(self, now: float) -> Epoch:
        ep = self._cur
        deadline = now + self.msg_timeout
        if ep is not None and now - ep.started < EPOCH_SPAN:
            if deadline > ep.deadline:
                ep.deadline = deadline
            return ep
        ep = Epoch(self, now, deadline)
        self.epochs.append(ep)
        self._cur = ep
        return ep

    def touch_epoch(self, started: float, deadline: float) -> Epoch:
        ep = Epoch(self, started, deadline)
        heapq.heappush(self.touched, (deadline, next(_touch_seq), ep))
        return ep

    def expired_epochs(self, now: float) -> list[Epoch]:
        """Pop every epoch whose deadline has passed (those with messages left)."""
        out = []
        eps = self.epochs
        while eps and eps[0].deadline <= now:
            ep = eps.popleft()
            if ep.msgs:
                out.append(ep)
        th = self.touched
        while th and th[0][0] <= now:
            ep = heapq.heappop(th)[2]
            if ep.msgs:
                out.append(ep)
        return out

    def all_epochs(self) -> list[Epoch]:
        """Every epoch still holding messages, leaving none behind."""
        out = [ep for ep in self.epochs if ep.msgs]
        out.extend(ep for _, _, ep in self.touched if ep.msgs)
        self.epochs.clear()
        self.touched.clear()
        self._cur = None
        return out

    def reset_in_flight(self) -> None:
        """The channel was emptied: nothing of this client's is in flight any more."""
        self.epochs.clear()
        self.touched.clear()
        self._cur = None
        self.in_flight = 0

    def published(self, topic: str, n: int) -> None:
        counts = self.pub_counts
        counts[topic] = counts.get(topic, 0) + n

    def __repr__(self) -> str:
        return f"<ClientState {self.id} {self.remote_address} state={self.state}>"
