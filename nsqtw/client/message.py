"""
A message delivered to a consumer, and the responses it allows (go-nsq ``message.go``).

Each message is answered once: :meth:`Message.finish` (FIN) or
:meth:`Message.requeue` (REQ); later answers are ignored.  :meth:`Message.touch`
(TOUCH) may be sent any number of times before that.  By default the consumer
answers for the handler (FIN on success, REQ on failure); a handler that calls
:meth:`Message.disable_auto_response` answers itself, possibly much later.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Message"]


class Message:
    """One delivery: ``id`` (16 ASCII hex bytes), ``body``, ``timestamp`` (ns), ``attempts``."""

    __slots__ = ("id", "body", "timestamp", "attempts", "nsqd_address", "_conn", "_auto", "_responded")

    def __init__(self, id: bytes, body: bytes, timestamp: int, attempts: int,
                 conn: Any = None, nsqd_address: str = "") -> None:
        self.id = id
        self.body = body
        self.timestamp = timestamp
        self.attempts = attempts
        self.nsqd_address = nsqd_address
        self._conn = conn
        self._auto = True
        self._responded = False

    def disable_auto_response(self) -> None:
        """The handler answers this message itself (FIN/REQ), now or later."""
        self._auto = False

    @property
    def auto_response(self) -> bool:
        """Whether the consumer finishes or requeues this message from the handler's result."""
        return self._auto

    def is_auto_response_disabled(self) -> bool:
        """Whether :meth:`disable_auto_response` was called (go-nsq's name)."""
        return not self._auto

    def has_responded(self) -> bool:
        """Whether the message was finished or requeued already."""
        return self._responded

    def finish(self) -> None:
        """FIN: processed; nsqd forgets it."""
        if self._responded:
            return
        self._responded = True
        if self._conn is not None:
            self._conn.on_message_finish(self)

    def requeue(self, delay: float | None = None, backoff: bool = True) -> None:
        """REQ: deliver again after ``delay`` seconds.

        ``None`` means go-nsq's ``Requeue(-1)``: ``default_requeue_delay ×
        attempts``, capped by ``max_requeue_delay``.  With ``backoff`` (the
        default) the consumer also backs off, as a handler failure does.
        """
        if self._responded:
            return
        self._responded = True
        if self._conn is not None:
            self._conn.on_message_requeue(self, delay, backoff)

    def requeue_without_backoff(self, delay: float | None = None) -> None:
        """REQ without a backoff signal (go-nsq ``RequeueWithoutBackoff``)."""
        self.requeue(delay, backoff=False)

    def touch(self) -> None:
        """TOUCH: reset nsqd's timeout for this message (ignored once answered)."""
        if self._responded:
            return
        if self._conn is not None:
            self._conn.on_message_touch(self)

    def __repr__(self) -> str:
        return (f"<Message {self.id.decode('ascii', 'replace')} attempts={self.attempts} "
                f"len={len(self.body)} from {self.nsqd_address}>")
