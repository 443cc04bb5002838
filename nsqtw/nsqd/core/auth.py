"""
Authorization state from an NSQ auth server (``--auth-http-address``), without I/O.

The auth server answers ``{"ttl", "identity", "identity_url", "authorizations":
[{"topic", "channels", "permissions"}]}``; :func:`parse_auth_response` applies
nsqd's validation (known permissions, compilable regexes, ``ttl > 0``) and
:meth:`AuthState.is_allowed` nsqd's matching: any authorization allows when it
has the permission (``subscribe`` for SUB, ``publish`` otherwise), its
unanchored topic regex matches, and one of its channel regexes matches the
channel (the empty string for publishes).  Go uses RE2; Python's ``re``
accepts the same patterns for the syntax auth servers use.
"""

from __future__ import annotations

import json
import re
from typing import Any
from re import Pattern

import attr

__all__ = ["AuthState", "Authorization", "AuthResponseError", "parse_auth_response"]


class AuthResponseError(ValueError):
    """The auth server's answer is unusable (nsqd then answers E_AUTH_FAILED)."""


@attr.s(frozen=True, slots=True)
class Authorization:
    topic: Pattern[str] = attr.ib()
    channels: tuple[Pattern[str], ...] = attr.ib()
    permissions: tuple[str, ...] = attr.ib()

    def is_allowed(self, topic: str, channel: str) -> bool:
        needed = "subscribe" if channel else "publish"
        if needed not in self.permissions:
            return False
        if self.topic.search(topic) is None:
            return False
        return any(c.search(channel) is not None for c in self.channels)


@attr.s(slots=True)
class AuthState:
    """What a connection may do, until ``expires`` (then nsqd asks the auth server again)."""

    secret: bytes = attr.ib(repr=False)
    identity: str = attr.ib(default="")
    identity_url: str = attr.ib(default="")
    authorizations: list[Authorization] = attr.ib(factory=list)
    expires: float = attr.ib(default=0.0)

    def expired(self, now: float) -> bool:
        return self.expires < now

    def is_allowed(self, topic: str, channel: str) -> bool:
        return any(a.is_allowed(topic, channel) for a in self.authorizations)

    def answer(self) -> bytes:
        """The AUTH command's JSON answer."""
        return json.dumps({"identity": self.identity, "identity_url": self.identity_url,
                           "permission_count": len(self.authorizations)}, separators=(",", ":")).encode()


def _compile(pattern: Any, what: str) -> Pattern[str]:
    if not isinstance(pattern, str):
        raise AuthResponseError(f"unable to compile {what} {pattern!r}")
    try:
        return re.compile(pattern)
    except re.error as e:
        raise AuthResponseError(f"unable to compile {what} {pattern!r} {e}") from None


def parse_auth_response(body: bytes, secret: bytes, now: float) -> AuthState:
    """An auth server's 200 answer as an :class:`AuthState`, validated as nsqd does."""
    try:
        doc = json.loads(body)
    except ValueError as e:
        raise AuthResponseError(f"invalid JSON from auth server: {e}") from None
    if isinstance(doc, dict) and "data" in doc and "status_code" in doc and isinstance(doc["data"], dict):
        doc = doc["data"]  # the pre-1.0 envelope some auth servers still use
    if not isinstance(doc, dict):
        raise AuthResponseError("auth server answer is not a JSON object")
    auths = []
    for item in doc.get("authorizations") or []:
        if not isinstance(item, dict):
            raise AuthResponseError("authorization is not an object")
        perms = item.get("permissions") or []
        for p in perms:
            if p not in ("subscribe", "publish"):
                raise AuthResponseError(f"unknown permission {p}")
        topic = _compile(item.get("topic", ""), "topic")
        channels = tuple(_compile(c, "channel") for c in item.get("channels") or [])
        auths.append(Authorization(topic, channels, tuple(perms)))
    ttl = doc.get("ttl", 0)
    if not isinstance(ttl, int) or isinstance(ttl, bool) or ttl <= 0:
        raise AuthResponseError(f"invalid TTL {ttl} (must be >0)")
    return AuthState(secret, str(doc.get("identity") or ""), str(doc.get("identity_url") or ""), auths,
                     now + ttl)
