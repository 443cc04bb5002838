"""
``nsq_tail``: print a topic's messages to stdout, one body per line (NSQ's ``apps/nsq_tail``).

::

    nsq_tail --topic=events --nsqd-tcp-address=127.0.0.1:4150 -n 10 --print-topic

One consumer per ``--topic`` on one channel (default ``tail<6 digits>#ephemeral``,
so tailing leaves nothing behind).  ``-n N`` stops after N messages in all
(Go counts per topic and exits at once; nsqtw counts across topics and stops
gracefully, so the N-th message is FINed): ``--max-in-flight`` is lowered to
N so no more are asked for, and any that arrive while stopping are requeued
unprinted.
"""

from __future__ import annotations

import random
import sys
from typing import Any, BinaryIO

import attr
from twisted.internet import defer
from twisted.logger import Logger

from ..options import BOOL, INT, STR, STRLIST, OptionError, opt
from ..protocol.names import is_valid_name
from ._app import ConsumerApp, require_sources
from ._runtime import client_config, run_app

__all__ = ["TailOptions", "Tail", "main"]

log = Logger(namespace="nsqtw.tools.nsq_tail")


@attr.s(frozen=True, slots=True)
class TailOptions:
    """nsq_tail's flags (Go's names and defaults)."""

    channel: str = opt("", flag="channel", kind=STR, help="NSQ channel")
    max_in_flight: int = opt(200, flag="max-in-flight", kind=INT, help="max number of messages to allow in flight")
    total_messages: int = opt(0, flag="n", kind=INT, help="total messages to show (will wait if starved)")
    print_topic: bool = opt(False, flag="print-topic", kind=BOOL,
                            help="print topic name where message was received")
    nsqd_tcp_addresses: list[str] = opt(flag="nsqd-tcp-address", kind=STRLIST, factory=list,
                                        help="nsqd TCP address (may be given multiple times)")
    lookupd_http_addresses: list[str] = opt(flag="lookupd-http-address", kind=STRLIST, factory=list,
                                            help="lookupd HTTP address (may be given multiple times)")
    topics: list[str] = opt(flag="topic", kind=STRLIST, factory=list, help="NSQ topic (may be given multiple times)")
    consumer_opts: list[str] = opt(flag="consumer-opt", kind=STRLIST, factory=list,
                                   help="option to passthrough to nsq.Consumer (may be given multiple times, "
                                        "http://godoc.org/github.com/nsqio/go-nsq#Config)")

    def __attrs_post_init__(self) -> None:
        require_sources(self.nsqd_tcp_addresses, self.lookupd_http_addresses)
        if not self.topics:
            raise OptionError("--topic required")
        for t in self.topics:
            if not is_valid_name(t):
                raise OptionError(f"--topic {t!r} is not a valid topic name")
        if self.channel and not is_valid_name(self.channel):
            raise OptionError(f"--channel {self.channel!r} is not a valid channel name")
        if self.max_in_flight < 1:
            raise OptionError("--max-in-flight must be > 0")
        if self.total_messages < 0:
            raise OptionError("-n must be >= 0")


def random_channel(rng: random.Random | None = None) -> str:
    """Go: ``fmt.Sprintf("tail%06d#ephemeral", rand.Int()%999999)``."""
    return f"tail{(rng or random.Random()).randrange(1 << 62) % 999999:06d}#ephemeral"


class Tail(ConsumerApp):
    """The running nsq_tail; ``shown`` counts the messages printed."""

    def __init__(self, options: TailOptions, reactor: Any = None, *, out: BinaryIO | None = None,
                 rng: random.Random | None = None) -> None:
        super().__init__(reactor)
        self.options = options
        self.out: BinaryIO = out if out is not None else sys.stdout.buffer
        self.channel = options.channel or random_channel(rng)
        total = options.total_messages
        self.max_in_flight = min(total, options.max_in_flight) if 0 < total < options.max_in_flight \
            else options.max_in_flight
        self.config = client_config("nsq_tail", options.consumer_opts, self.max_in_flight)
        self.shown = 0

    def start(self) -> defer.Deferred:
        from ..client import Consumer

        waits = []
        for topic in self.options.topics:
            log.info("Adding consumer for topic: {topic}", topic=topic)
            consumer = Consumer(topic, self.channel, self._handler(topic), self.config, reactor=self.reactor)
            waits.append(self.connect(consumer, self.options.nsqd_tcp_addresses,
                                      self.options.lookupd_http_addresses))
        return defer.gatherResults(waits, consumeErrors=True).addErrback(
            lambda f: f.value.subFailure if f.check(defer.FirstError) else f)

    def _handler(self, topic: str) -> Any:
        prefix = (topic + " | ").encode() if self.options.print_topic else b""
        total = self.options.total_messages

        def handle(msg: Any) -> None:
            if (total and self.shown >= total) or self.finished:
                # over the limit while stopping: hand it back for someone else
                msg.disable_auto_response()
                msg.requeue_without_backoff(0)
                return
            self.shown += 1
            try:
                self.out.write(prefix + msg.body + b"\n")
                self.out.flush()
            except (OSError, ValueError) as e:
                log.error("ERROR: failed to write to os.Stdout - {err}", err=e)
                self.reactor.callLater(0, self._fail)
                raise
            if total and self.shown >= total:
                self.reactor.callLater(0, self.stop)

        return handle

    def _fail(self) -> None:
        self.stop()
        self.finish(1)

    def _stop(self) -> Any:
        return self.stop_consumers()


def main(argv: list[str] | None = None) -> int:
    """The ``nsq_tail`` command."""
    return run_app("nsq_tail", argv, TailOptions, lambda options, reactor: Tail(options, reactor))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
