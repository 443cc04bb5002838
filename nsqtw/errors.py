"""
NSQ's two error vocabularies as Python values.

TCP errors are one class per ``E_*`` code; each knows whether NSQ treats it as
fatal (error frame, then close) or not (error frame, connection stays).  HTTP
errors carry a status and NSQ's upper-case text, rendered as
``{"message": TEXT}``.  Domain code raises these; each daemon's TCP and HTTP glue
(``nsqtw.nsqd.tcp``, ``nsqtw.nsqd.http``...) turns them into bytes, and so does the V2 session
(:mod:`nsqtw.nsqd.core.v2`), which writes its error frames to the client's output
itself.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "NSQError",
    "Invalid",
    "BadProtocol",
    "BadBody",
    "BadTopic",
    "BadChannel",
    "BadMessage",
    "PubFailed",
    "MPubFailed",
    "DPubFailed",
    "FinFailed",
    "ReqFailed",
    "TouchFailed",
    "SubFailed",
    "IdentifyFailed",
    "AuthFirst",
    "AuthFailed",
    "Unauthorized",
    "AuthDisabled",
    "AuthError",
    "from_wire",
    "BrokerError",
    "TopicNotFound",
    "ChannelNotFound",
    "Exiting",
    "QueueFull",
    "BackendError",
    "HTTPAPIError",
]


class NSQError(Exception):
    """A TCP protocol error reported to one client; fatal ones close it."""

    code: ClassVar[bytes] = b"E_INVALID"
    fatal: ClassVar[bool] = True

    def __init__(self, description: str = "") -> None:
        super().__init__(description)
        self.description = description

    def wire(self) -> bytes:
        """The error frame body: ``<CODE> <description>``."""
        if self.description:
            return self.code + b" " + self.description.encode("utf-8", "surrogateescape")
        return self.code


class Invalid(NSQError):
    code = b"E_INVALID"


class BadProtocol(NSQError):
    code = b"E_BAD_PROTOCOL"


class BadBody(NSQError):
    code = b"E_BAD_BODY"


class BadTopic(NSQError):
    code = b"E_BAD_TOPIC"


class BadChannel(NSQError):
    code = b"E_BAD_CHANNEL"


class BadMessage(NSQError):
    code = b"E_BAD_MESSAGE"


class PubFailed(NSQError):
    code = b"E_PUB_FAILED"


class MPubFailed(NSQError):
    code = b"E_MPUB_FAILED"


class DPubFailed(NSQError):
    code = b"E_DPUB_FAILED"


class FinFailed(NSQError):
    code = b"E_FIN_FAILED"
    fatal = False


class ReqFailed(NSQError):
    code = b"E_REQ_FAILED"
    fatal = False


class TouchFailed(NSQError):
    code = b"E_TOUCH_FAILED"
    fatal = False


class SubFailed(NSQError):
    code = b"E_SUB_FAILED"


class IdentifyFailed(NSQError):
    code = b"E_IDENTIFY_FAILED"


class AuthFirst(NSQError):
    code = b"E_AUTH_FIRST"


class AuthFailed(NSQError):
    code = b"E_AUTH_FAILED"


class Unauthorized(NSQError):
    code = b"E_UNAUTHORIZED"


class AuthDisabled(NSQError):
    code = b"E_AUTH_DISABLED"


class AuthError(NSQError):
    code = b"E_AUTH_ERROR"


def _all_subclasses(cls: type[Any]) -> list[Any]:
    out: list[Any] = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_all_subclasses(sub))
    return out


#: Error class by wire code, for decoders and the client library.
BY_CODE: dict[bytes, type[NSQError]] = {c.code: c for c in _all_subclasses(NSQError)}


def from_wire(body: bytes) -> NSQError:
    """Rebuild the typed error an error frame carries (clients use this)."""
    code, _, text = body.partition(b" ")
    cls = BY_CODE.get(code)
    if cls is None:
        err = NSQError(body.decode("utf-8", "replace"))
        return err
    return cls(text.decode("utf-8", "replace"))


# --- broker (domain) errors: raised by nsqtw.nsqd, translated by the glue ----


class BrokerError(Exception):
    """A broker operation that cannot be done; the glue picks the wire form."""


class TopicNotFound(BrokerError):
    pass


class ChannelNotFound(BrokerError):
    pass


class Exiting(BrokerError):
    """The topic or channel is being deleted or the broker is stopping."""

    def __init__(self, text: str = "exiting") -> None:
        super().__init__(text)


class QueueFull(BrokerError):
    """A queue that must not drop what it acknowledged has no room."""

    def __init__(self, text: str = "queue full") -> None:
        super().__init__(text)


class BackendError(BrokerError):
    """The overflow backend (disk) failed to store a message."""


class HTTPAPIError(Exception):
    """An HTTP API error: ``{"message": text}`` with this status."""

    def __init__(self, status: int, text: str, extra: dict[str, Any] | None = None) -> None:
        super().__init__(text)
        self.status = status
        self.text = text
        self.extra = extra or {}
