"""
The Twisted client library for NSQ, with go-nsq's semantics.

Works against any nsqd (Go's or nsqtw's) over TCP, and against a broker in
the same reactor over the in-process bus (``"inprocess:"`` addresses or the
handle of :func:`nsqtw.embed.start_nsqd`).  Everything returns Deferreds;
every timer runs on an injected clock.

* :class:`~nsqtw.client.config.Config`: go-nsq's options (``Config.set`` / ``set_flag`` for strings).
* :class:`~nsqtw.client.producer.Producer`: pipelined ``publish`` / ``multi_publish`` / ``deferred_publish``.
* :class:`~nsqtw.client.http.HTTPProducer`: the same over nsqd's HTTP ``/pub`` and ``/mpub``.
* :class:`~nsqtw.client.consumer.Consumer`: handlers, RDY control, backoff, lookupd discovery, graceful stop.
* :class:`~nsqtw.client.message.Message`: ``finish`` / ``requeue`` / ``touch`` / ``disable_auto_response``.
* :class:`~nsqtw.client.connection.NSQConnection` / :func:`~nsqtw.client.connection.connect`: one raw V2 connection, for tools.
"""

from ..errors import NSQError
from .config import BackoffStrategy, Config, ExponentialStrategy, FullJitterStrategy, apply_flags
from .connection import ConnectionDelegate, NSQConnection, connect
from .consumer import Consumer, ConsumerStats
from .errors import (
    AlreadyConnected, AuthRequired, ClientError, Closing, ConfigError, IdentifyError, NotConnected,
    OverMaxInFlight, ProtocolError, Stopped,
)
from .http import HTTPProducer
from .inprocess import register as register_inprocess
from .message import Message
from .producer import Producer

__all__ = [
    "Config",
    "apply_flags",
    "BackoffStrategy",
    "ExponentialStrategy",
    "FullJitterStrategy",
    "Producer",
    "HTTPProducer",
    "Consumer",
    "ConsumerStats",
    "Message",
    "NSQConnection",
    "ConnectionDelegate",
    "connect",
    "register_inprocess",
    "NSQError",
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
