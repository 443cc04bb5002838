"""
Messages the disk refused, held in memory until it accepts writes again.

Every path that puts an *already acknowledged* message back into a channel
(a timeout, a client leaving, a deferred message coming due, a topic's
backlog copied to a new channel) must not lose it when the disk queue
raises :class:`~nsqtw.errors.BackendError` (a full or failing disk).  Go's
nsqd drops such a message; nsqtw keeps it in the channel's memory queue
beyond ``--mem-queue-size`` and remembers the channel here.  From there:

* the held messages are delivered like any other queued message (the memory
  queue is read first), so consumers keep working through the outage;
* :meth:`HeldBacklog.retry`, run on a timer by the service, writes whatever
  is still above ``--mem-queue-size`` to the disk queue once it accepts
  writes again;
* :meth:`HeldBacklog.count` is the number of messages held (``held_count``
  of each channel in ``/stats``), and :meth:`HeldBacklog.health` nsqd's
  ``NOK - ...`` answer for ``/ping`` until it is zero.

A ``REQ`` is different: its client is still there, so a requeue the disk
cannot take is refused (``E_REQ_FAILED``) and the message stays in flight
(see :meth:`HeldBacklog.put_back` with ``hold=False``).

New publishes are not held: they fail with ``E_PUB_FAILED`` while the disk
refuses writes, which is the back-pressure a publisher needs.  And while
anything is held, every new publish that would need a disk queue is refused
*before* it is written (:meth:`HeldBacklog.refusal`): otherwise the space a
delivery frees would go to new messages, the held ones would never get it
back, and the held backlog would grow without bound.  The held messages are
therefore written back before anything new.

Held memory is bounded: ``--max-held-bytes`` (:meth:`HeldBacklog.at_cap`).
At the cap, a message whose timeout expires stays in flight with its
deadline extended (``Channel.timeout_extended_count``) and a deferred message
coming due stays deferred, so memory stays flat however long the disk stays
full.  (A client that disconnects cannot keep its messages in flight: those
are held even at the cap, bounded by the client's RDY window.)

This module is sans-IO (no reactor, no clock): the service decides when to
retry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.logger import Logger

from ...backend.runs import Run, split_run
from ...errors import BackendError

if TYPE_CHECKING:
    from .channel import Channel

__all__ = ["HeldBacklog", "spill_runs"]

log = Logger(namespace="nsqtw.nsqd")


def _stored_by(backend: Any, before: int | None) -> int:
    """How many messages of a failed ``put`` the backend stored anyway (a run that spanned a
    file roll may be stored in part); 0 when the backend cannot tell."""
    after: int | None = getattr(backend, "put_count", None)
    if before is None or after is None:
        return 0
    return max(0, after - before)


def spill_runs(backend: Any, runs: list[Run], mem: Any) -> tuple[str | None, int]:
    """Write ``runs`` to ``backend`` in order; what it does not take stays in the memory queue
    ``mem`` (``force_put``): the part of a run it refused (after the part it stored anyway), and
    every run after it.  Returns (the refusal's text, or None when all were written; how many
    messages were written)."""
    written = 0
    for i, run in enumerate(runs):
        before = getattr(backend, "put_count", None)
        try:
            rest = backend.put(run)
        except BackendError as e:
            stored = _stored_by(backend, before)
            written += stored
            if stored < len(run[1]):
                mem.force_put(split_run(run, stored)[1] if stored else run)
            for later in runs[i + 1:]:
                mem.force_put(later)
            return str(e), written
        if rest is not None:  # a backend that refuses without raising: keep in memory
            mem.force_put(rest)
        else:
            written += len(run[1])
    return None, written


class HeldBacklog:
    """The channels whose memory queue holds messages their disk queue refused."""

    __slots__ = ("channels", "error", "_logged", "limit", "_bytes", "extended")

    def __init__(self, limit: int = 0) -> None:
        #: channel -> None (an ordered set)
        self.channels: dict[Channel, None] = {}
        #: the last disk error seen (for /ping and the log)
        self.error = ""
        self._logged = False
        #: --max-held-bytes: the most message bytes held before timeouts are extended instead
        self.limit = limit
        #: held bytes as last counted (exact after each hold and each retry; delivery from
        #: memory only lowers the real figure, so it never undercounts)
        self._bytes = 0
        #: timeouts extended because held memory was at its cap (all channels)
        self.extended = 0

    # --- putting back ---------------------------------------------------------

    def put_back(self, ch: Channel, run: Run, hold: bool = True) -> None:
        """Store ``run`` (what ``ch``'s memory queue had no room for) in ``ch``'s backend.

        If the backend raises :class:`BackendError`, what it did not store is held in
        ``ch``'s memory queue (``hold=True``) or the error is raised with nothing held
        (``hold=False``; only for a single message, which is never stored in part).
        A backend that refuses without raising (no disk configured) gets the run
        forced into memory, as before.
        """
        backend = ch.backend
        before = getattr(backend, "put_count", None)
        try:
            rest = backend.put(run)
        except BackendError as e:
            if not hold:
                raise
            stored = _stored_by(backend, before)
            n = len(run[1])
            if stored >= n:
                return
            self.hold(ch, split_run(run, stored)[1] if stored else run, e)
            return
        if rest is not None:
            ch.mem.force_put(rest)

    def hold(self, ch: Channel, run: Run, err: BaseException) -> None:
        ch.mem.force_put(run)
        self._bytes += run[2] - run[1][0]
        self.error = str(err)
        if ch not in self.channels:
            self.channels[ch] = None
        if not self._logged:
            self._logged = True
            log.error("disk refused writes ({err}); holding messages in memory until it accepts "
                      "them again; new publishes that need the disk are refused meanwhile",
                      err=self.error)

    # --- the bounds --------------------------------------------------------------

    @property
    def holding(self) -> bool:
        """True while any message is held for a disk (cheap: the hot paths ask)."""
        return bool(self.channels)

    def refusal(self, backends: list[Any]) -> str | None:
        """Why a new publish that must be written to one of ``backends`` is refused while
        messages are held (None: it is not; a backend that keeps nothing, an ephemeral
        queue's, is no disk)."""
        if not self.channels:
            return None
        for b in backends:
            if getattr(b, "durable", True):
                n = self.count()
                if not n:
                    return None
                return (f"disk full: {n} acknowledged messages are held in memory until the disk "
                        f"accepts them - {self.error}")
        return None

    def held_bytes(self) -> int:
        """Bytes of the messages held in memory (counted exactly)."""
        self._bytes = sum(self._held_bytes(ch) for ch in self.channels) if self.channels else 0
        return self._bytes

    def at_cap(self) -> bool:
        """True while held messages fill ``--max-held-bytes`` (nothing more may be held, except
        what a disconnecting client leaves)."""
        if not self.channels:
            return False
        if self._bytes < self.limit:
            return False
        return self.held_bytes() >= self.limit

    @classmethod
    def _held_bytes(cls, ch: Channel) -> int:
        n = cls.held(ch)
        if not n:
            return 0
        total = 0
        for run in reversed(ch.mem):
            offs = run[1]
            k = len(offs)
            if k <= n:
                total += run[2] - offs[0]
                n -= k
                if not n:
                    break
            else:
                total += run[2] - offs[k - n]
                break
        return total

    # --- state ------------------------------------------------------------------

    @staticmethod
    def held(ch: Channel) -> int:
        """Messages of ``ch`` above ``--mem-queue-size`` (the part that belongs on disk)."""
        over = ch.mem.depth() - ch.mem.capacity
        return over if over > 0 else 0

    def held_count(self, ch: Channel) -> int:
        return self.held(ch) if ch in self.channels else 0

    def count(self) -> int:
        """Messages held in memory, in every channel, that the disk refused."""
        return sum(self.held(ch) for ch in self.channels) if self.channels else 0

    def health(self) -> str | None:
        """nsqd's unhealthy ``/ping`` answer while anything is held, else None."""
        n = self.count()
        if not n:
            return None
        return f"NOK - {n} messages held in memory because the disk refused them - {self.error}"

    def forget(self, ch: Channel) -> None:
        """``ch`` was deleted or emptied (what it held went with it)."""
        self.channels.pop(ch, None)

    # --- writing out -----------------------------------------------------------

    def retry(self) -> int:
        """Write held messages to their disk queues; returns how many are still held."""
        if not self.channels:
            return 0
        wrote = False
        for ch in list(self.channels):
            if ch.exiting:
                self.channels.pop(ch, None)
                continue
            still, n = self._write_out(ch)
            wrote = wrote or n > 0
            if not still:
                # nothing above --mem-queue-size any more (written or delivered)
                self.channels.pop(ch, None)
        left = self.count()
        self.held_bytes()
        if not self.channels and self._logged and wrote:
            # said once per outage, and only when a write really succeeded: a backlog that
            # emptied by delivery alone proves nothing about the disk (the next hold would
            # log the refusal again, once a second while the disk stays full)
            self._logged = False
            log.info("disk accepts writes again; every held message is written out")
        return left

    def _write_out(self, ch: Channel) -> tuple[bool, int]:
        """Move ``ch``'s messages above ``--mem-queue-size`` to its backend: (True if some
        remain held (the disk still refuses), how many were written)."""
        if not self.held(ch):
            return False, 0
        mem = ch.mem
        runs = mem.drain()
        spill = []
        for run in runs:
            rest = mem.put(run)
            if rest is not None:
                spill.append(rest)
        refused, written = spill_runs(ch.backend, spill, mem)
        if refused is not None:
            self.error = refused
            return True, written
        if ch.clients:
            ch.broker.dirty.add(ch)
        return False, written

    # --- shutdown --------------------------------------------------------------

    def store_all(self, backend: Any, run: Run) -> int:
        """Put ``run`` in ``backend`` at shutdown; returns how many messages it could not store."""
        before = getattr(backend, "put_count", None)
        try:
            rest = backend.put(run)
        except BackendError as e:
            self.error = str(e)
            return len(run[1]) - _stored_by(backend, before)
        return len(rest[1]) if rest is not None else 0
