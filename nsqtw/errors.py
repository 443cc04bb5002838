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
    """``E_INVALID``: a command not valid in the connection's state, or with invalid parameters (a second
    SUB, RDY out of range, ...); fatal."""
    code = b"E_INVALID"


class BadProtocol(NSQError):
    """``E_BAD_PROTOCOL``: an unknown command or the wrong number of parameters; fatal."""
    code = b"E_BAD_PROTOCOL"


class BadBody(NSQError):
    """``E_BAD_BODY``: a body whose size field is invalid or too large, or an IDENTIFY body that is not
    JSON; fatal."""
    code = b"E_BAD_BODY"


class BadTopic(NSQError):
    """``E_BAD_TOPIC``: a topic name that is not valid (1-64 characters of ``[.a-zA-Z0-9_-]``, optionally
    ending ``#ephemeral``); fatal."""
    code = b"E_BAD_TOPIC"


class BadChannel(NSQError):
    """``E_BAD_CHANNEL``: a channel name that is not valid (the same rules as a topic's); fatal."""
    code = b"E_BAD_CHANNEL"


class BadMessage(NSQError):
    """``E_BAD_MESSAGE``: a message body that is empty or larger than ``--max-msg-size`` (or a batch
    larger than ``--max-body-size``); fatal."""
    code = b"E_BAD_MESSAGE"


class PubFailed(NSQError):
    """``E_PUB_FAILED``: nsqd could not store a PUB (the topic is exiting, the disk refused it, or
    replication could not reach enough peers); fatal."""
    code = b"E_PUB_FAILED"


class MPubFailed(NSQError):
    """``E_MPUB_FAILED``: nsqd could not store an MPUB; fatal."""
    code = b"E_MPUB_FAILED"


class DPubFailed(NSQError):
    """``E_DPUB_FAILED``: nsqd could not store a DPUB (or its delay is out of range); fatal."""
    code = b"E_DPUB_FAILED"


class FinFailed(NSQError):
    """``E_FIN_FAILED``: FIN of a message ID this connection does not hold in flight (already finished,
    timed out or unknown); not fatal."""
    code = b"E_FIN_FAILED"
    fatal = False


class ReqFailed(NSQError):
    """``E_REQ_FAILED``: REQ of a message ID this connection does not hold in flight, or a delay out of
    range; not fatal."""
    code = b"E_REQ_FAILED"
    fatal = False


class TouchFailed(NSQError):
    """``E_TOUCH_FAILED``: TOUCH of a message ID this connection does not hold in flight; not fatal."""
    code = b"E_TOUCH_FAILED"
    fatal = False


class SubFailed(NSQError):
    """``E_SUB_FAILED``: SUB refused (the topic or channel is exiting or was deleted, or the channel
    already has ``--max-channel-consumers`` consumers); fatal."""
    code = b"E_SUB_FAILED"


class IdentifyFailed(NSQError):
    """``E_IDENTIFY_FAILED``: IDENTIFY asked for what cannot be given (deflate and snappy together,
    or a TLS upgrade that failed); fatal."""
    code = b"E_IDENTIFY_FAILED"


class AuthFirst(NSQError):
    """``E_AUTH_FIRST``: a command before AUTH on an nsqd that requires authorization; fatal."""
    code = b"E_AUTH_FIRST"


class AuthFailed(NSQError):
    """``E_AUTH_FAILED``: the auth server refused the secret or could not be asked, or the
    authorization expired and could not be renewed; fatal."""
    code = b"E_AUTH_FAILED"


class Unauthorized(NSQError):
    """``E_UNAUTHORIZED``: the secret does not grant this topic or channel (or the permission expired);
    fatal."""
    code = b"E_UNAUTHORIZED"


class AuthDisabled(NSQError):
    """``E_AUTH_DISABLED``: AUTH sent to an nsqd without ``--auth-http-address``; fatal."""
    code = b"E_AUTH_DISABLED"


class AuthError(NSQError):
    """``E_AUTH_ERROR``: an authorization error of NSQ's protocol, typed so a client recognises it
    (nsqtw's nsqd answers a failed AUTH with ``E_AUTH_FAILED`` or ``E_UNAUTHORIZED``); fatal."""
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
    """The topic does not exist: HTTP 404 ``TOPIC_NOT_FOUND``."""


class ChannelNotFound(BrokerError):
    """The channel does not exist: HTTP 404 ``CHANNEL_NOT_FOUND``."""


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
