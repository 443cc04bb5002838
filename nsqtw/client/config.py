"""
Client options: every go-nsq ``Config`` option, with its name, default and bounds.

Two ways in, as in go-nsq:

* Python code builds ``Config(max_in_flight=10, msg_timeout=30.0)``.  Durations
  are float **seconds** here (a Go duration string such as ``"1m30s"`` or a
  ``timedelta`` also works).
* Strings from a command line or a file go through :meth:`Config.set`, which
  coerces exactly as go-nsq's ``cfg.Set`` does: a duration is ``"1s"``, an int
  of **milliseconds** or a ``timedelta``; a bool is a bool, a
  ``strconv.ParseBool`` string or an int; ``-`` in a name means ``_``.
  :meth:`Config.set_flag` parses ``--consumer-opt=k,v`` / ``--producer-opt=k,v``
  values (a bare ``k`` means true).

Every refused value raises :class:`~nsqtw.client.errors.ConfigError` naming the
option, in go-nsq's words (``invalid read_timeout ! 50ms < 100ms``).
"""

from __future__ import annotations

import datetime
import os
import random
import socket
import sys
from typing import Any, TypeVar
from collections.abc import Callable, Iterable

import attr

if sys.version_info >= (3, 11):
    from typing import dataclass_transform
else:
    from typing_extensions import dataclass_transform

from .. import __version__
from ..options import OptionError, evolve, format_duration, parse_duration
from .errors import ConfigError

__all__ = [
    "Config",
    "BackoffStrategy",
    "ExponentialStrategy",
    "FullJitterStrategy",
    "apply_flags",
    "TLS_MIN_VERSIONS",
]

# --- kinds ------------------------------------------------------------------------

DURATION = "duration"
INT = "int"
UINT = "uint"
FLOAT = "float"
BOOL = "bool"
STR = "str"
STRATEGY = "strategy"
ADDR = "addr"
OBJECT = "object"
TLS_VERSION = "tls_version"
PATH = "path"

_INT32_MAX = 2 ** 31 - 1
_INT64_MAX = 2 ** 63 - 1

#: go-nsq's tls_min_version names (ssl3.0 kept for flag compatibility; OpenSSL may refuse it)
TLS_MIN_VERSIONS = ("ssl3.0", "tls1.0", "tls1.1", "tls1.2", "tls1.3")


class BackoffStrategy:
    """How long a consumer sleeps at backoff level ``attempt`` (seconds).

    Subclass and pass an instance as ``backoff_strategy`` for a custom curve;
    ``multiplier`` is ``backoff_multiplier`` and ``rng`` the consumer's random source.
    """

    def calculate(self, attempt: int, multiplier: float, rng: random.Random) -> float:
        """The backoff, in seconds, after ``attempt`` consecutive failures (``rng`` for strategies that
        jitter)."""
        raise NotImplementedError


class ExponentialStrategy(BackoffStrategy):
    """``multiplier × 2^attempt``: 2 s, 4 s, 8 s ... with the default 1 s multiplier."""

    name = "exponential"

    def calculate(self, attempt: int, multiplier: float, rng: random.Random) -> float:
        """``multiplier * 2 ** attempt`` seconds (go-nsq's ``ExponentialStrategy``; capped by
        ``max_backoff_duration``)."""
        return multiplier * (2.0 ** attempt)

    def __repr__(self) -> str:
        return "ExponentialStrategy()"


class FullJitterStrategy(BackoffStrategy):
    """Uniform in ``[0, multiplier × 2^attempt)`` (AWS "full jitter")."""

    name = "full_jitter"

    def calculate(self, attempt: int, multiplier: float, rng: random.Random) -> float:
        """A random duration between 0 and ``multiplier * 2 ** attempt`` seconds (go-nsq's
        ``FullJitterStrategy``)."""
        ceiling = multiplier * (2.0 ** attempt)
        if ceiling <= 0:
            return 0.0
        return rng.random() * ceiling

    def __repr__(self) -> str:
        return "FullJitterStrategy()"


_STRATEGIES = {"": ExponentialStrategy, "exponential": ExponentialStrategy,
               "full_jitter": FullJitterStrategy}


# --- go-nsq coercion (Config.set) ------------------------------------------------------


def go_parse_bool(text: str) -> bool:
    """``strconv.ParseBool``: exactly these spellings."""
    if text in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if text in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    raise ValueError(f'strconv.ParseBool: parsing "{text}": invalid syntax')


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _coerce_set(kind: str, value: Any) -> Any:
    """go-nsq's ``coerce`` for one kind; raises ValueError/TypeError with Go's reason."""
    if kind == DURATION:
        if isinstance(value, str):
            try:
                return parse_duration(value)
            except OptionError:
                raise ValueError(f'time: invalid duration "{value}"') from None
        if _is_int(value):
            return value / 1000.0  # go-nsq: an integer is milliseconds
        if isinstance(value, datetime.timedelta):
            return value.total_seconds()
        raise TypeError("invalid value type (a duration is a string such as '1s', "
                        "an int of milliseconds or a timedelta)")
    if kind in (INT, UINT):
        if isinstance(value, str):
            text = value
            if kind == UINT and text.startswith(("-", "+")):
                raise ValueError(f'strconv.ParseUint: parsing "{value}": invalid syntax')
            if not text or not (text.lstrip("+-").isdigit()) or text.count("-") + text.count("+") > 1:
                raise ValueError(f'strconv.ParseInt: parsing "{value}": invalid syntax')
            return int(text)
        if _is_int(value):
            return value
        raise TypeError("invalid value type")
    if kind == FLOAT:
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                raise ValueError(f'strconv.ParseFloat: parsing "{value}": invalid syntax') from None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise TypeError("invalid value type")
    if kind == BOOL:
        if isinstance(value, bool):
            return value
        if isinstance(value, str):
            return go_parse_bool(value)
        if _is_int(value):
            return value != 0
        raise TypeError("invalid value type")
    if kind in (STR, PATH):
        if isinstance(value, str):
            return value
        if _is_int(value):
            return f"{value:d}"
        if isinstance(value, float):
            return f"{value:f}"
        return str(value)
    return value  # STRATEGY, ADDR, OBJECT, TLS_VERSION: the field converter decides


# --- field converters (constructor and set both end here) ---------------------------------


def _to_seconds(value: Any) -> float:
    """Python-side durations: float/int seconds, a Go duration string or a timedelta."""
    if isinstance(value, bool):
        raise TypeError("a duration cannot be a bool")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, str):
        try:
            return parse_duration(value)
        except OptionError:
            raise ValueError(f'time: invalid duration "{value}"') from None
    raise TypeError(f"invalid duration {value!r}")


def _to_strategy(value: Any) -> Any:
    if isinstance(value, str):
        cls = _STRATEGIES.get(value)
        if cls is None:
            raise ValueError(f"invalid value type (backoff_strategy is 'exponential' or 'full_jitter', not {value!r})")
        return cls()
    if isinstance(value, BackoffStrategy) or callable(getattr(value, "calculate", None)):
        return value
    raise TypeError("invalid value type")


def _to_addr(value: Any) -> tuple[str, int] | None:
    """``local_addr``: ``"host:port"`` (Go's ``ResolveTCPAddr``) or a ``(host, port)`` tuple."""
    if value is None or value == "":
        return None
    if isinstance(value, tuple) and len(value) == 2:
        return (str(value[0]), int(value[1]))
    if isinstance(value, str):
        host, sep, port = value.rpartition(":")
        if not sep:
            raise ValueError(f"address {value}: missing port in address")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        if not port.isdigit() or int(port) > 65535:
            raise ValueError(f'lookup tcp/{port}: unknown port')
        return (host, int(port))
    raise TypeError("invalid value type")


def _to_tls_version(value: Any) -> str:
    if value in (None, ""):
        return ""
    if isinstance(value, str) and value in TLS_MIN_VERSIONS:
        return value
    raise ValueError(f"ERROR: {value} is not a tls version")


T = TypeVar("T")

_CONVERTERS: dict[str, Callable[[Any], Any]] = {
    DURATION: _to_seconds,
    STRATEGY: _to_strategy,
    ADDR: _to_addr,
    TLS_VERSION: _to_tls_version,
}


def _format(kind: str, value: Any) -> str:
    if kind == DURATION:
        return format_duration(value)
    return str(value)


def _check(instance: Any, attribute: attr.Attribute[Any], value: Any) -> None:
    """Type and bound checks with go-nsq's wording (``invalid <opt> ! <v> < <min>``)."""
    meta = attribute.metadata
    kind = meta["kind"]
    name = attribute.name
    if kind in (INT, UINT):
        if not _is_int(value):
            raise ConfigError(f"failed to coerce option {name} ({value!r}) - invalid value type")
    elif kind == FLOAT:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"failed to coerce option {name} ({value!r}) - invalid value type")
    elif kind == BOOL:
        if not isinstance(value, bool):
            raise ConfigError(f"failed to coerce option {name} ({value!r}) - invalid value type")
    elif kind in (STR, PATH):
        if not isinstance(value, str):
            raise ConfigError(f"failed to coerce option {name} ({value!r}) - invalid value type")
    lo = meta.get("min")
    hi = meta.get("max")
    if lo is not None and value < lo:
        raise ConfigError(f"invalid {name} ! {_format(kind, value)} < {_format(kind, lo)}")
    if hi is not None and value > hi:
        raise ConfigError(f"invalid {name} ! {_format(kind, value)} > {_format(kind, hi)}")


def _opt(*, default: Any, kind: str, min: Any = None, max: Any = None, factory: Any = None,
         doc: str = "") -> Any:
    metadata = {"kind": kind, "min": min, "max": max, "doc": doc}
    if factory is not None:
        return attr.ib(factory=factory, validator=_check, metadata=metadata)
    return attr.ib(default=default, validator=_check, metadata=metadata)


def _named_converters(cls: type, fields: list[attr.Attribute[Any]]) -> list[attr.Attribute[Any]]:
    """Give each option a converter whose errors name the option."""
    out = []
    for field in fields:
        conv = _CONVERTERS.get(field.metadata["kind"])
        if conv is None:
            out.append(field)
            continue

        def convert(value: Any, _conv: Callable[[Any], Any] = conv, _name: str = field.name) -> Any:
            try:
                return _conv(value)
            except (TypeError, ValueError) as e:
                raise ConfigError(f"failed to coerce option {_name} ({value!r}) - {e}") from None

        out.append(field.evolve(converter=convert))
    return out


def _hostname() -> str:
    return socket.gethostname()


def _short_hostname() -> str:
    return socket.gethostname().split(".")[0]


def _user_agent() -> str:
    return f"nsqtw/{__version__}"


def _fields(cls: type[Any]) -> Any:
    """``attr.fields`` of Config (the dataclass_transform declaration hides its attrs-ness from mypy)."""
    untyped: Any = cls
    return attr.fields(untyped)


@dataclass_transform(field_specifiers=(_opt,))
def _config_class(cls: type[T]) -> type[T]:
    # attr.s, declared so that type checkers see Config's fields (mypy's attrs plugin knows only attr.ib)
    return attr.s(slots=True, on_setattr=[attr.setters.convert, attr.setters.validate],
                  field_transformer=_named_converters)(cls)


@_config_class
class Config:
    """go-nsq's ``Config``: one attribute per option, same names, defaults and bounds."""

    dial_timeout: float = _opt(default=1.0, kind=DURATION, doc="TCP dial timeout")
    read_timeout: float = _opt(default=60.0, kind=DURATION, min=0.1, max=300.0,
                               doc="silence on a connection longer than this closes it when heartbeats are off")
    write_timeout: float = _opt(default=1.0, kind=DURATION, min=0.1, max=300.0,
                                doc="a write stuck this long in the transport closes the connection")
    local_addr: tuple[str, int] | None = _opt(default=None, kind=ADDR, doc="source address for dialing")
    lookupd_poll_interval: float = _opt(default=60.0, kind=DURATION, min=0.01, max=300.0,
                                        doc="lookupd poll period; also the nsqd reconnect delay")
    lookupd_poll_jitter: float = _opt(default=0.3, kind=FLOAT, min=0.0, max=1.0, doc="initial poll delay fraction")
    lookupd_poll_timeout: float = _opt(default=60.0, kind=DURATION, doc="HTTP timeout of /lookup")
    max_requeue_delay: float = _opt(default=900.0, kind=DURATION, min=0.0, max=3600.0, doc="cap of the computed REQ delay")
    default_requeue_delay: float = _opt(default=90.0, kind=DURATION, min=0.0, max=3600.0,
                                        doc="REQ delay unit: × attempts")
    backoff_strategy: Any = _opt(default=None, kind=STRATEGY, factory=ExponentialStrategy,
                                 doc="'exponential' or 'full_jitter'")
    max_backoff_duration: float = _opt(default=120.0, kind=DURATION, min=0.0, max=3600.0, doc="0 disables backoff")
    backoff_multiplier: float = _opt(default=1.0, kind=DURATION, min=0.0, max=3600.0, doc="backoff time unit")
    max_attempts: int = _opt(default=5, kind=UINT, min=0, max=65535, doc="0 = unlimited; beyond it a message is given up")
    low_rdy_idle_timeout: float = _opt(default=10.0, kind=DURATION, min=1.0, max=300.0,
                                       doc="redistribution: idle connections give up RDY after this")
    low_rdy_timeout: float = _opt(default=30.0, kind=DURATION, min=1.0, max=300.0,
                                  doc="redistribution: RDY held this long is given up")
    rdy_redistribute_interval: float = _opt(default=5.0, kind=DURATION, min=0.001, max=5.0,
                                            doc="period of RDY redistribution")
    client_id: str = _opt(default=None, kind=STR, factory=_short_hostname, doc="IDENTIFY client_id")
    hostname: str = _opt(default=None, kind=STR, factory=_hostname, doc="IDENTIFY hostname")
    user_agent: str = _opt(default=None, kind=STR, factory=_user_agent, doc="IDENTIFY user_agent")
    topology_region: str = _opt(default="", kind=STR, doc="IDENTIFY topology_region")
    topology_zone: str = _opt(default="", kind=STR, doc="IDENTIFY topology_zone")
    heartbeat_interval: float = _opt(default=30.0, kind=DURATION, doc="IDENTIFY heartbeat_interval; negative disables")
    sample_rate: int = _opt(default=0, kind=INT, min=0, max=99, doc="IDENTIFY sample_rate")
    tls_v1: bool = _opt(default=False, kind=BOOL, doc="negotiate TLS")
    tls_config: Any = _opt(default=None, kind=OBJECT, doc="an IOpenSSLClientConnectionCreator (or callable(host) -> one)")
    tls_root_ca_file: str = _opt(default="", kind=PATH, doc="PEM file of the CA that signed nsqd's certificate")
    tls_insecure_skip_verify: bool = _opt(default=False, kind=BOOL, doc="do not verify nsqd's certificate")
    tls_cert: str = _opt(default="", kind=PATH, doc="client certificate (PEM)")
    tls_key: str = _opt(default="", kind=PATH, doc="client private key (PEM)")
    tls_min_version: str = _opt(default="", kind=TLS_VERSION, doc="ssl3.0, tls1.0 (default), tls1.1, tls1.2, tls1.3")
    deflate: bool = _opt(default=False, kind=BOOL, doc="negotiate raw DEFLATE")
    deflate_level: int = _opt(default=6, kind=INT, min=1, max=9, doc="DEFLATE level")
    snappy: bool = _opt(default=False, kind=BOOL, doc="negotiate snappy (framing format)")
    output_buffer_size: int = _opt(default=16384, kind=INT, min=-_INT64_MAX - 1, max=_INT64_MAX,
                                   doc="IDENTIFY output_buffer_size (-1 disables buffering)")
    output_buffer_timeout: float = _opt(default=0.25, kind=DURATION, doc="IDENTIFY output_buffer_timeout (negative disables)")
    max_in_flight: int = _opt(default=1, kind=INT, min=0, max=_INT32_MAX, doc="messages in flight across all connections")
    msg_timeout: float = _opt(default=0.0, kind=DURATION, min=0.0, doc="IDENTIFY msg_timeout (0 = nsqd's default)")
    max_msg_size: int = _opt(default=0, kind=INT, min=0, max=_INT32_MAX, doc="largest frame accepted (0 = no limit)")
    auth_secret: str = _opt(default="", kind=STR, doc="AUTH secret")
    skip_lookupd_authorization: bool = _opt(default=True, kind=BOOL,
                                            doc="despite the name: true sends 'Authorization: Bearer <auth_secret>' to lookupd")

    # --- go-nsq's API ----------------------------------------------------------------

    @classmethod
    def options(cls) -> list[str]:
        """Every option name, in go-nsq's order."""
        return [a.name for a in _fields(cls)]

    def set(self, option: str, value: Any) -> None:
        """go-nsq ``cfg.Set(option, value)``: coerce, check the bounds, store."""
        name = option.replace("-", "_")
        field = getattr(_fields(Config), name, None) if not name.startswith("_") else None
        if field is None:
            raise ConfigError(f"invalid option {option}")
        kind = field.metadata["kind"]
        try:
            coerced = _coerce_set(kind, value)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"failed to coerce option {name} ({value!r}) - {e}") from None
        if kind == PATH and coerced and name == "tls_root_ca_file" and not os.access(coerced, os.R_OK):
            raise ConfigError(f"ERROR: failed to read custom Certificate Authority file {coerced}")
        setattr(self, name, coerced)

    def set_flag(self, text: str) -> None:
        """One ``--consumer-opt`` / ``--producer-opt`` value: ``"k,v"``, or ``"k"`` for true."""
        key, sep, value = text.partition(",")
        if not sep:
            self.set(key, True)
        else:
            self.set(key, value)

    def validate(self) -> None:
        """go-nsq ``Validate``: bounds (checked on every set) and heartbeat ≤ read_timeout."""
        for field in _fields(Config):
            _check(self, field, getattr(self, field.name))
        if self.heartbeat_interval > self.read_timeout:
            raise ConfigError(
                f"HeartbeatInterval {format_duration(self.heartbeat_interval)} must be less than "
                f"ReadTimeout {format_duration(self.read_timeout)}")

    def copy(self, **changes: Any) -> Config:
        """An independent copy (producers and consumers keep their own, as go-nsq does)."""
        return evolve(self, **changes)

    # --- derived values ---------------------------------------------------------------

    def requeue_delay(self, attempts: int) -> float:
        """go-nsq's ``Requeue(-1)``: ``default_requeue_delay × attempts``, capped."""
        return min(self.default_requeue_delay * attempts, self.max_requeue_delay)

    def backoff_duration(self, attempt: int, rng: random.Random) -> float:
        """How long to back off after ``attempt`` consecutive failures: the backoff strategy's answer for
        ``backoff_multiplier``."""
        return float(self.backoff_strategy.calculate(attempt, self.backoff_multiplier, rng))

    def identify_body(self) -> dict[str, Any]:
        """The IDENTIFY JSON fields go-nsq sends (``conn.go identify``)."""
        hb = self.heartbeat_interval
        obt = self.output_buffer_timeout
        return {
            "client_id": self.client_id,
            "hostname": self.hostname,
            "user_agent": self.user_agent,
            "short_id": self.client_id,  # deprecated, still sent by go-nsq
            "long_id": self.hostname,    # deprecated, still sent by go-nsq
            "tls_v1": self.tls_v1,
            "deflate": self.deflate,
            "deflate_level": self.deflate_level,
            "snappy": self.snappy,
            "feature_negotiation": True,
            "heartbeat_interval": -1 if hb < 0 else _ms(hb),
            "sample_rate": self.sample_rate,
            "output_buffer_size": self.output_buffer_size,
            "output_buffer_timeout": -1 if obt < 0 else _ms(obt),
            "msg_timeout": _ms(self.msg_timeout),
            "topology_region": self.topology_region,
            "topology_zone": self.topology_zone,
        }

    def describe(self) -> dict[str, str]:
        """Option name -> value as text (for ``--help`` output and logs)."""
        out = {}
        for field in _fields(Config):
            value = getattr(self, field.name)
            if field.metadata["kind"] == DURATION:
                out[field.name] = format_duration(value)
            elif field.name == "auth_secret" and value:
                out[field.name] = "********"
            else:
                out[field.name] = repr(value) if field.metadata["kind"] == STRATEGY else str(value)
        return out


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))


def apply_flags(config: Config, flags: Iterable[str]) -> Config:
    """Apply every ``k,v`` string (the repeated ``--consumer-opt`` flag) to ``config``."""
    for text in flags:
        config.set_flag(text)
    config.validate()
    return config


ConfigValue = str | int | float | bool | datetime.timedelta
