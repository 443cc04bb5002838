"""
The client library's own errors (go-nsq's ``errors.go``).

Errors the *server* reports arrive as :class:`nsqtw.errors.NSQError` subclasses
built by :func:`nsqtw.errors.from_wire` (``BadTopic``, ``PubFailed`` ...), each
with NSQ's ``code``.  The classes here are what the client itself concludes:
no connection, stopped, a peer that broke the protocol, a refused option.
"""

from __future__ import annotations

__all__ = [
    "ClientError",
    "NotConnected",
    "Stopped",
    "ProtocolError",
    "IdentifyError",
    "AuthRequired",
    "AlreadyConnected",
    "OverMaxInFlight",
    "Closing",
    "ConfigError",
]


class ClientError(Exception):
    """Something the client decided, as opposed to an error frame from nsqd."""


class NotConnected(ClientError):
    """No usable connection: it failed, was lost or closed before the answer came
    (go-nsq ``ErrNotConnected``)."""

    def __init__(self, reason: str = "not connected") -> None:
        super().__init__(reason)
        self.reason = reason


class Stopped(ClientError):
    """The producer or consumer was stopped (go-nsq ``ErrStopped``)."""

    def __init__(self, reason: str = "stopped") -> None:
        super().__init__(reason)


class ProtocolError(ClientError):
    """The peer sent bytes that break TCP protocol V2 (an unknown frame type, a
    short message, an answer nobody asked for, an HTTP reply on the TCP port)."""


class IdentifyError(NotConnected):
    """The IDENTIFY handshake (or a negotiated upgrade) failed (go-nsq ``ErrIdentify``)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"failed to IDENTIFY - {reason}")


class AuthRequired(NotConnected):
    """nsqd asked for AUTH and no ``auth_secret`` is configured."""

    def __init__(self) -> None:
        super().__init__("Auth Required")


class AlreadyConnected(ClientError):
    """``connect_to_nsqd`` for an address that is connected or connecting."""

    def __init__(self, address: str = "") -> None:
        super().__init__(f"already connected to {address}" if address else "already connected")


class OverMaxInFlight(ClientError):
    """A RDY update would exceed ``max_in_flight`` (go-nsq ``ErrOverMaxInFlight``)."""


class Closing(ClientError):
    """The connection is closing; no RDY may be sent on it (go-nsq ``ErrClosing``)."""


class ConfigError(ClientError, ValueError):
    """An option name or value go-nsq's ``Config.Set`` would refuse; the text names the option."""
