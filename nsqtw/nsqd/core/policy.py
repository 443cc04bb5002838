"""
A channel's policy: dead letters, a maximum age, a bounded depth and a delivery rate.

NSQ leaves all four to its clients (a client's ``max_attempts`` FINs a message and it is gone;
"put an expires-at in the body"); nsqtw keeps them on the server, per channel, so stock
producers and consumers work unchanged:

* ``max_attempts``: a message whose next delivery would be its ``max_attempts + 1``-th is not
  delivered again: it becomes *dead* on that channel (kept, counted, peekable, redrivable).
* ``max_age``: a message older than this (from its publish time) is not delivered: dead
  (counted as expired) when the channel keeps dead letters, else dropped and counted.
* ``max_depth`` with ``overflow``: at the bound, ``drop-oldest`` drops the oldest queued
  message for each new one (dead-lettered when the channel keeps dead letters);
  ``refuse`` refuses publishes to the topic (``E_PUB_FAILED``, HTTP 503) while it is full.
* ``max_rate``: deliveries to all of the channel's clients together, per second (a token
  bucket on the reactor's clock; a client's RDY still bounds what it has in flight).
* ``dead_letter_topic``: each dead message is also published to this topic (body unchanged).

A channel keeps dead letters when it has ``max_attempts`` or a ``dead_letter_topic``.

This module is sans-IO: values, parsing and the bucket arithmetic only.
"""

from __future__ import annotations

import math
import re
from typing import Any
from collections.abc import Mapping

import attrs

from ...options import OptionError, format_duration, parse_duration
from ...protocol.names import is_valid_name

__all__ = ["ChannelPolicy", "PolicyError", "TokenBucket", "default_policy", "OVERFLOWS", "DROP_OLDEST", "REFUSE",
           "REASON_ATTEMPTS", "REASON_AGE", "REASON_OVERFLOW", "REASONS", "POLICY_PARAMS"]

DROP_OLDEST = "drop-oldest"
REFUSE = "refuse"
OVERFLOWS = (DROP_OLDEST, REFUSE)

#: why a message died (peek's ``reason``)
REASON_ATTEMPTS = "max_attempts"
REASON_AGE = "max_age"
REASON_OVERFLOW = "max_depth"
#: the reasons in the order their codes go on the wire and to disk
REASONS = (REASON_ATTEMPTS, REASON_AGE, REASON_OVERFLOW)

#: the query parameters ``POST /channel/config`` reads
POLICY_PARAMS = ("max_attempts", "max_age", "max_depth", "overflow", "max_rate", "dead_letter_topic")

_UINT = re.compile(r"^[0-9]{1,9}$")
_RATE = re.compile(r"^[0-9]{1,9}(\.[0-9]{1,6})?$")


class PolicyError(ValueError):
    """A value ``POST /channel/config`` refuses: ``code`` is the HTTP 400 message
    (``INVALID_MAX_AGE``...)."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


@attrs.frozen
class ChannelPolicy:
    """What a channel enforces; 0 or ``""`` turns a setting off (the default: NSQ's behaviour)."""

    #: the most deliveries of one message; 0: unlimited
    max_attempts: int = 0
    #: seconds after its publish time a message is no longer delivered; 0: no limit
    max_age: float = 0.0
    #: the most messages queued (memory and disk); 0: unbounded
    max_depth: int = 0
    #: what ``max_depth`` does to a new message when the channel is full
    overflow: str = DROP_OLDEST
    #: deliveries per second to all clients of the channel together; 0: no limit
    max_rate: float = 0.0
    #: a topic each dead message is also published to; "": none
    dead_letter_topic: str = ""

    @property
    def active(self) -> bool:
        """True when any setting is on (a channel without one pays nothing on its hot paths)."""
        return bool(self.max_attempts or self.max_age or self.max_depth or self.max_rate
                    or self.dead_letter_topic)

    @property
    def keeps_dead(self) -> bool:
        """True when messages it gives up on are kept as dead letters (not dropped)."""
        return bool(self.max_attempts or self.dead_letter_topic)

    @property
    def refuses(self) -> bool:
        """True when a full channel refuses publishes to its topic."""
        return bool(self.max_depth) and self.overflow == REFUSE

    def to_json(self) -> dict[str, Any]:
        """The policy as ``GET /channel/config`` answers it (null for a setting that is off)."""
        return {
            "max_attempts": self.max_attempts or None,
            "max_age": format_duration(self.max_age) if self.max_age else None,
            "max_depth": self.max_depth or None,
            "overflow": self.overflow,
            "max_rate": _number(self.max_rate) if self.max_rate else None,
            "dead_letter_topic": self.dead_letter_topic or None,
        }

    def to_record(self) -> dict[str, Any]:
        """The policy as it is stored (plain numbers; :meth:`from_record` reads it back)."""
        return attrs.asdict(self)

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> ChannelPolicy:
        """A stored policy (unknown keys ignored, bad values refused with :class:`PolicyError`)."""
        fields = {f.name for f in attrs.fields(cls)}
        policy = cls(**{k: v for k, v in record.items() if k in fields})
        policy.check()
        return policy

    def check(self, topic: str | None = None) -> None:
        """Raise :class:`PolicyError` for a value nsqd would not enforce."""
        if not isinstance(self.max_attempts, int) or not 0 <= self.max_attempts <= 65535:
            raise PolicyError("INVALID_MAX_ATTEMPTS")
        if not isinstance(self.max_age, (int, float)) or not 0 <= self.max_age < 1e9 or math.isnan(self.max_age):
            raise PolicyError("INVALID_MAX_AGE")
        if not isinstance(self.max_depth, int) or self.max_depth < 0:
            raise PolicyError("INVALID_MAX_DEPTH")
        if self.overflow not in OVERFLOWS:
            raise PolicyError("INVALID_OVERFLOW")
        if not isinstance(self.max_rate, (int, float)) or not 0 <= self.max_rate < 1e9 or math.isnan(self.max_rate):
            raise PolicyError("INVALID_MAX_RATE")
        dlt = self.dead_letter_topic
        if dlt and (not is_valid_name(dlt) or dlt == topic):
            raise PolicyError("INVALID_DEAD_LETTER_TOPIC")

    def updated(self, params: Mapping[str, str], topic: str | None = None) -> ChannelPolicy:
        """This policy with the settings named in ``params`` changed (an empty value turns a
        setting off; one not named is kept); :class:`PolicyError` for a bad value."""
        changes: dict[str, Any] = {}
        for name in POLICY_PARAMS:
            if name not in params:
                continue
            raw = params[name].strip()
            changes[name] = _parse(name, raw)
        policy = attrs.evolve(self, **changes)
        policy.check(topic)
        return policy


def _number(value: float) -> float | int:
    return int(value) if value == int(value) else value


def _parse(name: str, raw: str) -> Any:
    code = "INVALID_" + name.upper()
    if name == "overflow":
        if raw == "":
            return DROP_OLDEST
        if raw not in OVERFLOWS:
            raise PolicyError(code)
        return raw
    if name == "dead_letter_topic":
        if raw and not is_valid_name(raw):
            raise PolicyError(code)
        return raw
    if raw == "":
        return 0.0 if name in ("max_age", "max_rate") else 0
    if name == "max_age":
        try:
            seconds = parse_duration(raw, "max_age")
        except OptionError:
            raise PolicyError(code) from None
        if seconds < 0:
            raise PolicyError(code)
        return seconds
    if name == "max_rate":
        if _RATE.match(raw) is None:
            raise PolicyError(code)
        return float(raw)
    if _UINT.match(raw) is None:
        raise PolicyError(code)
    return int(raw)


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved up; time comes in as ``now``."""

    __slots__ = ("rate", "burst", "tokens", "stamp")

    def __init__(self, rate: float, now: float) -> None:
        self.rate = rate
        #: a quarter second's worth (at least one): a queue scan that runs a little late loses
        #: no tokens, and a channel idle for long gets no more than a short burst
        self.burst = max(1.0, rate / 4)
        self.tokens = self.burst
        self.stamp = now

    def available(self, now: float) -> int:
        """Whole tokens that may be spent now."""
        elapsed = now - self.stamp
        if elapsed > 0:
            self.tokens = min(self.burst, self.tokens + elapsed * self.rate)
            self.stamp = now
        return int(self.tokens)

    def spend(self, n: int) -> None:
        self.tokens -= n

    def due(self) -> float:
        """Seconds until the next whole token (0 when one is there)."""
        missing = 1.0 - self.tokens
        return missing / self.rate if missing > 0 else 0.0


def default_policy(options: Any) -> ChannelPolicy | None:
    """The policy nsqd gives each new channel (``--max-attempts``, ``--max-msg-age``,
    ``--max-channel-depth`` with ``--channel-overflow``, ``--max-channel-rate``); None when
    they are all off (NSQ's behaviour)."""
    policy = ChannelPolicy(max_attempts=options.max_attempts, max_age=options.max_msg_age,
                           max_depth=options.max_channel_depth, overflow=options.channel_overflow,
                           max_rate=options.max_channel_rate)
    return policy if policy.active else None
