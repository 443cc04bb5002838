"""
``nsq_to_nsq``: copy a channel's messages to other nsqd, optionally filtered (NSQ's ``apps/nsq_to_nsq``).

::

    nsq_to_nsq --topic=events --nsqd-tcp-address=10.0.0.1:4150 \\
        --destination-nsqd-tcp-address=10.0.0.2:4150 --destination-topic=events_copy

One consumer per ``--topic`` on ``--channel`` (default ``nsq_to_nsq``); each
message is published asynchronously to one ``--destination-nsqd-tcp-address``
(``--mode``: ``round-robin``, or ``hostpool`` / ``epsilon-greedy``, both the
healthy-first :class:`~nsqtw.tools.to_http.HostPool`) on
``--destination-topic`` (default: the same topic).  It is FINed once the
destination said OK and REQueued (go-nsq's ``Requeue(-1)``, with backoff)
when it did not.

JSON filtering, as Go does it: with ``--require-json-field`` or
``--whitelist-json-field`` a body must be a JSON object, else it is logged
and dropped (FIN).  ``--require-json-field F`` passes only objects with F;
with ``--require-json-value V`` F must also equal V (a string compared as a
string, a number as a number); a missing F when a value is required means
backoff (REQ), a mismatch means drop.  ``--whitelist-json-field`` (repeatable)
re-marshals the object with only those fields, as Go's ``json.Marshal`` of a
map writes it (sorted keys, integral numbers without a fraction).
"""

from __future__ import annotations

import json
import math
from decimal import Decimal
import sys
import time
from typing import Any
from collections.abc import Iterable

import attr
from twisted.internet import defer
from twisted.logger import Logger

from ..options import INT, STR, STRLIST, OptionError, opt
from ..protocol.names import is_valid_name
from ._app import ConsumerApp, require_sources
from ._runtime import client_config, run_app
from .to_http import MODES, HostPool, TimerMetrics

__all__ = ["ToNsqdOptions", "NsqToNsq", "JsonFilter", "go_json_marshal", "main"]

log = Logger(namespace="nsqtw.tools.nsq_to_nsq")


@attr.s(frozen=True, slots=True)
class ToNsqdOptions:
    """nsq_to_nsq's flags (Go's names and defaults)."""

    channel: str = opt("nsq_to_nsq", flag="channel", kind=STR, help="nsq channel")
    destination_topic: str = opt("", flag="destination-topic", kind=STR,
                                 help="use this destination topic for all consumed topics "
                                      "(default is consumed topic name)")
    max_in_flight: int = opt(200, flag="max-in-flight", kind=INT, help="max number of messages to allow in flight")
    status_every: int = opt(250, flag="status-every", kind=INT,
                            help="the # of requests between logging status (per destination), 0 disables")
    mode: str = opt("hostpool", flag="mode", kind=STR,
                    help="the upstream request mode options: round-robin, hostpool (default), epsilon-greedy")
    nsqd_tcp_addresses: list[str] = opt(flag="nsqd-tcp-address", kind=STRLIST, factory=list,
                                        help="nsqd TCP address (may be given multiple times)")
    destination_nsqd_tcp_addresses: list[str] = opt(flag="destination-nsqd-tcp-address", kind=STRLIST, factory=list,
                                                    help="destination nsqd TCP address (may be given multiple times)")
    lookupd_http_addresses: list[str] = opt(flag="lookupd-http-address", kind=STRLIST, factory=list,
                                            help="lookupd HTTP address (may be given multiple times)")
    topics: list[str] = opt(flag="topic", kind=STRLIST, factory=list, help="nsq topic (may be given multiple times)")
    whitelist_json_fields: list[str] = opt(flag="whitelist-json-field", kind=STRLIST, factory=list,
                                           help="for JSON messages: pass this field (may be given multiple times)")
    require_json_field: str = opt("", flag="require-json-field", kind=STR,
                                  help="for JSON messages: only pass messages that contain this field")
    require_json_value: str = opt("", flag="require-json-value", kind=STR,
                                  help="for JSON messages: only pass messages in which the required field has this value")
    consumer_opts: list[str] = opt(flag="consumer-opt", kind=STRLIST, factory=list,
                                   help="option to passthrough to nsq.Consumer (may be given multiple times, "
                                        "see http://godoc.org/github.com/nsqio/go-nsq#Config)")
    producer_opts: list[str] = opt(flag="producer-opt", kind=STRLIST, factory=list,
                                   help="option to passthrough to nsq.Producer (may be given multiple times, "
                                        "see http://godoc.org/github.com/nsqio/go-nsq#Config)")

    def __attrs_post_init__(self) -> None:
        if not self.topics or not self.channel:
            raise OptionError("--topic and --channel are required")
        for topic in self.topics:
            if not is_valid_name(topic):
                raise OptionError("--topic is invalid")
        if self.destination_topic and not is_valid_name(self.destination_topic):
            raise OptionError("--destination-topic is invalid")
        if not is_valid_name(self.channel):
            raise OptionError("--channel is invalid")
        require_sources(self.nsqd_tcp_addresses, self.lookupd_http_addresses)
        if not self.destination_nsqd_tcp_addresses:
            raise OptionError("--destination-nsqd-tcp-address required")
        if self.mode not in MODES:
            raise OptionError(f"invalid --mode {self.mode!r} (round-robin, hostpool or epsilon-greedy)")
        if self.max_in_flight < 1:
            raise OptionError("--max-in-flight must be > 0")


# --- Go's JSON ----------------------------------------------------------------------------------


def _go_float(f: float) -> str:
    """strconv.FormatFloat(f, 'f' or 'e', -1, 64) as encoding/json picks them."""
    if math.isnan(f) or math.isinf(f):
        raise ValueError(f"json: unsupported value: {f}")
    if f == 0:
        return "0"
    a = abs(f)
    if a < 1e21 and a >= 1e-6:
        if f.is_integer():
            return str(int(f))
        text = repr(f)
        return text if "e" not in text else format(Decimal(text), "f")
    text = repr(f)  # shortest round-trip, e.g. 1e+21 / 1e-07
    mantissa, _, exp = text.partition("e")
    digits = exp.lstrip("+-").lstrip("0") or "0"
    if exp.startswith("-"):
        return f"{mantissa}e-{digits}"  # Go cleans e-07 up to e-7
    return f"{mantissa}e+{digits.zfill(2)}"


def _go_string(s: str) -> str:
    text = json.dumps(s, ensure_ascii=False)
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def go_json_marshal(value: Any) -> str:
    """Go's ``json.Marshal`` of decoded JSON: sorted keys, compact, HTML-escaped strings."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _go_float(value)
    if isinstance(value, str):
        return _go_string(value)
    if isinstance(value, list):
        return "[" + ",".join(go_json_marshal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(_go_string(k) + ":" + go_json_marshal(value[k]) for k in sorted(value)) + "}"
    raise TypeError(f"cannot marshal {type(value).__name__}")


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _str_tuple(fields: Iterable[str]) -> tuple[str, ...]:
    return tuple(fields)


@attr.s(frozen=True, slots=True)
class JsonFilter:
    """``--require-json-field``, ``--require-json-value`` and ``--whitelist-json-field``."""

    field: str = attr.ib(default="")
    value: str = attr.ib(default="")
    whitelist: tuple[str, ...] = attr.ib(default=(), converter=_str_tuple)

    @property
    def active(self) -> bool:
        return bool(self.field or self.whitelist)

    def should_pass(self, doc: dict[str, Any]) -> tuple[bool, bool]:
        """(pass, backoff) as Go's ``shouldPassMessage``."""
        if not self.field:
            return True, False
        if self.field not in doc:
            if self.value:
                log.error("ERROR: missing field to check required value")
                return False, True
            return False, False
        if not self.value:
            return True, False
        v = doc[self.field]
        if isinstance(v, str):
            return v == self.value, False
        try:
            wanted = float(self.value)
        except ValueError:
            return False, False  # not a plain string and the argument is not a number
        return (_is_number(v) and float(v) == wanted), False

    def filter(self, doc: dict[str, Any], raw: bytes) -> bytes:
        """Only the whitelisted fields, re-marshalled; the body unchanged without a whitelist."""
        if not self.whitelist:
            return raw
        out: dict[str, Any] = {}
        for key in self.whitelist:
            if key in doc:
                v = doc[key]
                out[key] = int(v) if isinstance(v, float) and v.is_integer() and abs(v) < 2 ** 63 else v
        return go_json_marshal(out).encode("utf-8")

    def apply(self, body: bytes) -> tuple[bytes | None, bool]:
        """``(body to publish or None to drop, backoff)``."""
        if not self.active:
            return body, False
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            doc = None
        if not isinstance(doc, dict):
            log.error("ERROR: Unable to decode json: {body!r}", body=body[:200])
            return None, False
        passed, backoff = self.should_pass(doc)
        if not passed:
            return None, backoff
        return self.filter(doc, body), False


class BackoffRequested(Exception):
    """A required field is missing: REQ with backoff, as Go's handler error ``backoff``."""


class NsqToNsq(ConsumerApp):
    """The running nsq_to_nsq: consumers per topic, one producer per destination."""

    def __init__(self, options: ToNsqdOptions, reactor: Any = None, *, clock: Any = None) -> None:
        super().__init__(reactor)
        from ..client import Producer

        self.options = options
        self.clock = clock if clock is not None else self.reactor
        self.consumer_config = client_config("nsq_to_nsq", options.consumer_opts, options.max_in_flight)
        producer_config = client_config("nsq_to_nsq", options.producer_opts)
        self.destinations = list(dict.fromkeys(options.destination_nsqd_tcp_addresses))
        self.producers = {a: Producer(a, producer_config, reactor=self.reactor) for a in self.destinations}
        self.pool = HostPool(self.destinations, self.clock)
        self.filter = JsonFilter(options.require_json_field, options.require_json_value,
                                 options.whitelist_json_fields)
        self._counter = 0
        self.published: dict[str, int] = {a: 0 for a in self.destinations}
        self.dropped = 0
        self.failed = 0
        self.metrics = TimerMetrics(options.status_every, "[aggregate]:")
        self.per_address = {a: TimerMetrics(options.status_every if len(self.destinations) > 1 else 0, f"[{a}]:")
                            for a in self.destinations}

    def start(self) -> defer.Deferred:
        from ..client import Consumer

        waits = []
        for topic in self.options.topics:
            dest = self.options.destination_topic or topic
            consumer = Consumer(topic, self.options.channel, self._handler(dest), self.consumer_config,
                                concurrency=len(self.destinations), reactor=self.reactor)
            waits.append(self.connect(consumer, self.options.nsqd_tcp_addresses, self.options.lookupd_http_addresses))
        d = defer.gatherResults(waits, consumeErrors=True)
        return d.addErrback(lambda f: f.value.subFailure if f.check(defer.FirstError) else f)

    def choose(self) -> str:
        if self.options.mode == "round-robin":
            self._counter += 1
            return self.destinations[self._counter % len(self.destinations)]
        return self.pool.get()

    def _handler(self, destination_topic: str) -> Any:
        def handle(msg: Any) -> None:
            body, backoff = self.filter.apply(msg.body)
            if body is None:
                if backoff:
                    raise BackoffRequested("backoff")
                self.dropped += 1
                return  # FINed by the consumer
            started = time.monotonic()
            addr = self.choose()
            msg.disable_auto_response()
            d = self.producers[addr].publish(destination_topic, body)

            def ok(_: Any) -> None:
                if self.options.mode != "round-robin":
                    self.pool.mark(addr, False)
                self.published[addr] += 1
                msg.finish()
                self.per_address[addr].status(started)
                self.metrics.status(started)

            def failed(f: Any) -> None:
                if self.options.mode != "round-robin":
                    self.pool.mark(addr, True)
                self.failed += 1
                log.warn("publish to {addr} failed - {err}", addr=addr, err=f.getErrorMessage())
                msg.requeue(None)

            d.addCallbacks(ok, failed)

        return handle

    def _stop(self) -> Any:
        d = self.stop_consumers()
        d.addCallback(lambda _: defer.DeferredList([p.stop() for p in self.producers.values()], consumeErrors=True))
        return d


def main(argv: list[str] | None = None) -> int:
    """The ``nsq_to_nsq`` command."""
    return run_app("nsq_to_nsq", argv, ToNsqdOptions, lambda options, reactor: NsqToNsq(options, reactor))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
