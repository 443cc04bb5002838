"""
Option types for every daemon, carrying NSQ's flag names, defaults and rules.

One frozen attrs class per daemon is the single source of truth: the twistd
plugins, the drop-in CLIs and the embedding API all build one from strings or
keyword arguments and hand it to the service builder.  Each field's metadata
holds the flag name (``--mem-queue-size``), the config-file name
(``mem_queue_size`` unless NSQ renames it with a ``cfg`` tag), the kind that
says how to parse a string, and the help text NSQ prints.

Durations are stored as float seconds and parsed from Go's syntax (``60s``,
``1m30s``, ``250ms``); ``/config/:opt`` reports them as nanoseconds as Go's
JSON does.
"""

from __future__ import annotations

import hashlib
import re
import socket
import sys
import zlib
from typing import Any, TypeVar, cast
from collections.abc import Callable, Mapping

import attr

if sys.version_info >= (3, 11):
    from typing import dataclass_transform
else:
    from typing_extensions import dataclass_transform

__all__ = [
    "OptionError",
    "NsqdOptions",
    "parse_duration",
    "format_duration",
    "option_fields",
    "nsq_default",
    "with_embedding_defaults",
    "options_from_strings",
    "config_value",
    "LOG_LEVELS",
]


class OptionError(ValueError):
    """A bad option value; the message names the flag, as nsqd's do."""


# --- kinds -------------------------------------------------------------------

STR = "str"
INT = "int"
BOOL = "bool"
DURATION = "duration"
STRLIST = "strlist"
FLOATLIST = "floatlist"
TLS_REQUIRED_KIND = "tls_required"
FLOAT = "float"
TLS_MIN_VERSION = "tls_min_version"
LOG_LEVEL = "log_level"
NODE_ID = "node_id"

LOG_LEVELS = {"debug": 1, "info": 2, "warn": 3, "error": 4, "fatal": 5}
_LOG_LEVEL_NAMES = {v: k for k, v in LOG_LEVELS.items()}

TLS_NOT_REQUIRED = 0
TLS_REQUIRED_EXCEPT_HTTP = 1
TLS_REQUIRED = 2

TLS_VERSIONS = {"tls1.0": 0x0301, "tls1.1": 0x0302, "tls1.2": 0x0303, "tls1.3": 0x0304}

_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "\u00b5s": 1e-6,
    "\u03bcs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_DURATION_PART = re.compile(r"([0-9]*(?:\.[0-9]*)?)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")


def parse_duration(text: str, flag: str = "duration") -> float:
    """Parse a Go duration (``"1m30s"``, ``"-1.5h"``, ``"0"``) into seconds."""
    s = text.strip()
    if s in ("0", "+0", "-0"):
        return 0.0
    sign = 1.0
    if s[:1] in "+-":
        sign = -1.0 if s[0] == "-" else 1.0
        s = s[1:]
    if not s:
        raise OptionError(f'invalid value "{text}" for flag --{flag}: invalid duration')
    total = 0.0
    pos = 0
    while pos < len(s):
        m = _DURATION_PART.match(s, pos)
        if m is None or m.group(1) in ("", "."):
            raise OptionError(f'invalid value "{text}" for flag --{flag}: invalid duration')
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    return sign * total


def format_duration(seconds: float) -> str:
    """Render seconds the way Go's ``time.Duration.String`` does."""
    ns = int(round(seconds * 1e9))
    if ns == 0:
        return "0s"
    neg = ns < 0
    ns = abs(ns)
    if ns < 1_000_000_000:
        for unit, size in (("ms", 1_000_000), ("\u00b5s", 1_000), ("ns", 1)):
            if ns >= size:
                out = _trim(ns / size) + unit
                break
    else:
        h, rem = divmod(ns, 3_600_000_000_000)
        m, rem = divmod(rem, 60_000_000_000)
        s = _trim(rem / 1e9)
        out = (f"{h}h{m}m{s}s" if h else f"{m}m{s}s" if m else f"{s}s")
    return ("-" + out) if neg else out


def _trim(value: float) -> str:
    text = f"{value:.9f}".rstrip("0").rstrip(".")
    return text or "0"


def _parse_bool(text: str, flag: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "t", "true"):
        return True
    if low in ("0", "f", "false"):
        return False
    raise OptionError(f'invalid boolean value "{text}" for -{flag}: parse error')


def _parse_int(text: str, flag: str) -> int:
    try:
        return int(text.strip(), 0) if text.strip().lower().startswith(("0x", "0o", "0b")) else int(text.strip())
    except ValueError:
        raise OptionError(f'invalid value "{text}" for flag -{flag}: parse error') from None


def _parse_float(text: str, flag: str) -> float:
    try:
        return float(text.strip())
    except ValueError:
        raise OptionError(f'invalid value "{text}" for flag -{flag}: parse error') from None


def _parse_node_id(text: str, flag: str) -> int:
    """``--node-id``: an integer, or ``auto`` (claimed in etcd, see :class:`AutoNodeId`)."""
    if text.strip().lower() == "auto":
        return AUTO_NODE_ID
    return _parse_int(text, flag)


def _parse_tls_required(text: str, flag: str) -> int:
    low = text.strip().lower()
    if low == "tcp-https":
        return TLS_REQUIRED_EXCEPT_HTTP
    try:
        return TLS_REQUIRED if _parse_bool(low, flag) else TLS_NOT_REQUIRED
    except OptionError:
        raise OptionError(
            f'invalid value "{text}" for flag -{flag}: expected true, false or tcp-https'
        ) from None


def _parse_tls_min_version(text: str, flag: str) -> int:
    low = text.strip().lower()
    if low in TLS_VERSIONS:
        return TLS_VERSIONS[low]
    if low.isdigit() and int(low) in TLS_VERSIONS.values():
        return int(low)
    raise OptionError(f'invalid value "{text}" for flag -{flag}: unknown tlsVersionOption "{text}"')


def _parse_log_level(text: str, flag: str) -> int:
    low = text.strip().lower()
    if low in LOG_LEVELS:
        return LOG_LEVELS[low]
    if low.isdigit() and int(low) in _LOG_LEVEL_NAMES:
        return int(low)
    raise OptionError(f'invalid value "{text}" for flag -{flag}: invalid log-level "{text}"')


def _parse_float_list(text: str, flag: str) -> list[float]:
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            out.append(float(part))
        except ValueError:
            raise OptionError(f'invalid value "{text}" for flag -{flag}: parse error') from None
    return out


_PARSERS: dict[str, Callable[[str, str], Any]] = {
    STR: lambda text, flag: text,
    INT: _parse_int,
    BOOL: _parse_bool,
    DURATION: lambda text, flag: parse_duration(text, flag),
    TLS_REQUIRED_KIND: _parse_tls_required,
    FLOAT: lambda text, flag: _parse_float(text, flag),
    TLS_MIN_VERSION: _parse_tls_min_version,
    LOG_LEVEL: _parse_log_level,
    NODE_ID: _parse_node_id,
}


def opt(
    default: Any = attr.NOTHING,
    *,
    flag: str | None,
    kind: str,
    help: str = "",
    cfg: str | None = None,
    factory: Callable[[], Any] | None = None,
    unsupported: str | None = None,
) -> Any:
    """An attrs field that knows its NSQ flag, config name, parser and help."""
    meta = {
        "flag": flag,
        "kind": kind,
        "help": help,
        "cfg": cfg or (flag.replace("-", "_") if flag else None),
        "unsupported": unsupported,
    }
    if factory is not None:
        return attr.ib(factory=factory, metadata=meta, kw_only=True)
    return attr.ib(default=default, metadata=meta, kw_only=True)


# --- the options every daemon has: one definition each ------------------------------------


def log_level_opt() -> Any:
    """``--log-level`` (nsqd, nsqlookupd, nsqadmin)."""
    return opt(default=LOG_LEVELS["info"], flag="log-level", kind=LOG_LEVEL,
               help="set log verbosity: debug, info, warn, error, or fatal")


def log_prefix_opt(daemon: str) -> Any:
    """``--log-prefix``, ``"[<daemon>] "`` by default."""
    return opt(default=f"[{daemon}] ", flag="log-prefix", kind=STR, help="log message prefix")


def verbose_opt() -> Any:
    """``--verbose``, accepted and ignored as in NSQ 1.x."""
    return opt(default=False, flag="verbose", kind=BOOL, help="[deprecated] has no effect, use --log-level")


def http_client_connect_timeout_opt() -> Any:
    """``--http-client-connect-timeout`` (nsqd and nsqadmin)."""
    return opt(default=2.0, flag="http-client-connect-timeout", kind=DURATION, help="timeout for HTTP connect")


def http_client_request_timeout_opt() -> Any:
    """``--http-client-request-timeout`` (nsqd and nsqadmin)."""
    return opt(default=5.0, flag="http-client-request-timeout", kind=DURATION, help="timeout for HTTP request")


@dataclass_transform(frozen_default=True, kw_only_default=True, field_specifiers=(opt,))
def options_class(cls: type[T]) -> type[T]:
    """``attr.s(frozen=True, slots=True)`` for a class of :func:`opt` fields, declared so that
    type checkers see its keyword-only ``__init__`` (mypy's attrs plugin knows only ``attr.ib``)."""
    return attr.s(frozen=True, slots=True, auto_attribs=False)(cls)


def evolve(inst: T, **changes: Any) -> T:
    """``attr.evolve`` for option objects, typed (see :func:`options_class`)."""
    untyped: Any = inst
    new: T = attr.evolve(untyped, **changes)
    return new


def option_fields(cls: type) -> list[attr.Attribute[Any]]:
    """The fields of an options class that have an NSQ flag, in flag order."""
    return [f for f in attr.fields(cls) if f.metadata.get("flag")]


T = TypeVar("T")


def nsq_default(cls: type, name: str) -> Any:
    """The value field ``name`` of options class ``cls`` has when nobody set it (NSQ's default)."""
    default = attr.fields_dict(cls)[name].default
    # attrs' stubs make Factory a function; at run time it is the class of the default
    return default.factory() if isinstance(default, attr.Factory) else default  # type: ignore[arg-type,union-attr]  # see above


def with_embedding_defaults(cls: type[T], defaults: Mapping[str, Any], options: T | None,
                            changes: dict[str, Any]) -> T:
    """An embedded daemon's options: ``defaults`` (loopback, port 0, ...) for every field the
    caller left at NSQ's default, the caller's ``changes`` (keyword arguments) on top.

    With ``options`` None the options are built from ``changes``; with an options object, a
    field still equal to NSQ's default takes the embedding default, unless ``changes`` names it
    (so ``start_nsqd(options=o, tcp_address="0.0.0.0:4150")`` still binds NSQ's own port)."""
    if options is None:
        return cls(**{**defaults, **changes})
    updates = {name: value for name, value in defaults.items()
               if name not in changes and getattr(options, name) == nsq_default(cls, name)}
    updates.update(changes)
    if not updates:
        return options
    changed: T = attr.evolve(cast(Any, options), **updates)
    return changed


def parse_value(field: attr.Attribute[Any], value: Any) -> Any:
    """Turn a flag string (or list of strings, or a TOML value) into the field's type."""
    kind = field.metadata["kind"]
    flag = field.metadata["flag"] or field.name
    if kind == STRLIST:
        if isinstance(value, str):
            return [value]
        return [str(v) for v in value]
    if kind == FLOATLIST:
        if isinstance(value, (int, float)):
            return [float(value)]
        if isinstance(value, str):
            return _parse_float_list(value, flag)
        out: list[float] = []
        for v in value:
            out.extend(_parse_float_list(v, flag) if isinstance(v, str) else [float(v)])
        return out
    if isinstance(value, list):
        value = value[-1]
    if kind == BOOL and isinstance(value, bool):
        return value
    if kind in (INT, NODE_ID) and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind == FLOAT and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if kind == DURATION and isinstance(value, (int, float)) and not isinstance(value, bool):
        # TOML integers are nanoseconds, as Go's config loader reads them
        return value / 1e9
    return _PARSERS[kind](str(value) if not isinstance(value, str) else value, flag)


def options_from_strings(cls: type[T], values: Mapping[str, Any], **overrides: Any) -> T:
    """
    Build an options object from ``{flag-or-cfg-name: value}``.

    Keys may be flag names (``mem-queue-size``), config names
    (``mem_queue_size``, ``nsqlookupd_tcp_addresses``) or attribute names.
    Values are strings or lists of strings as a command line gives them, or
    TOML values.  Unknown keys are refused with a message naming them.
    """
    by_key: dict[str, attr.Attribute[Any]] = {}
    for f in attr.fields(cls):  # type: ignore[arg-type]  # any options class (attrs at run time)
        by_key[f.name] = f
        if f.metadata.get("flag"):
            by_key[f.metadata["flag"]] = f
            by_key[f.metadata["flag"].replace("-", "_")] = f
        if f.metadata.get("cfg"):
            by_key[f.metadata["cfg"]] = f
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        f = by_key.get(key) or by_key.get(key.replace("-", "_"))
        if f is None:
            raise OptionError(f"flag provided but not defined: -{key}")
        kwargs[f.name] = parse_value(f, value)
    kwargs.update(overrides)
    return cls(**kwargs)


def config_value(options: Any, name: str) -> Any:
    """An option as ``GET /config/:opt`` reports it (Go's JSON of the value)."""
    for f in attr.fields(type(options)):
        if f.metadata.get("cfg") == name:
            value = getattr(options, f.name)
            kind = f.metadata["kind"]
            if kind == DURATION:
                return int(round(value * 1e9))
            return value
    raise KeyError(name)


def display_default(field: attr.Attribute[Any], value: Any) -> str:
    """A default as Go's flag package prints it in ``--help``."""
    kind = field.metadata["kind"]
    if kind == DURATION:
        return format_duration(value)
    if kind == LOG_LEVEL:
        return _LOG_LEVEL_NAMES.get(value, str(value))
    if kind in (STRLIST, FLOATLIST):
        return ",".join(str(v) for v in value)
    if kind == BOOL:
        return "true" if value else "false"
    if kind == TLS_REQUIRED_KIND:
        return {0: "false", 1: "tcp-https", 2: "true"}[value]
    return str(value)


# --- helpers shared by the daemons --------------------------------------------


def split_host_port(address: str, flag: str) -> tuple[str, int]:
    """``"host:port"`` -> (host, port); ``[v6]:port`` is allowed."""
    host, sep, port = address.rpartition(":")
    if not sep:
        raise OptionError(f"--{flag} {address!r}: missing port in address")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        number = int(port)
    except ValueError:
        raise OptionError(f"--{flag} {address!r}: invalid port") from None
    if not 0 <= number <= 65535:
        raise OptionError(f"--{flag} {address!r}: invalid port")
    return host, number


_LOCAL_HOSTS = ("", "0.0.0.0", "::", "127.0.0.1", "::1", "localhost")


def _self_addresses(listen: str, hostname: str) -> set[tuple[str, int]]:
    """``(host, port)`` pairs that reach a listener on ``listen`` from this machine."""
    if not listen:
        return set()
    host, port = split_host_port(listen, "replication-address")
    hosts = {host.lower()}
    if host in ("", "0.0.0.0", "::"):
        hosts.update(_LOCAL_HOSTS)
        hosts.add(hostname.lower())
        hosts.add(default_hostname().lower())
    elif host in ("127.0.0.1", "localhost"):
        hosts.update(("127.0.0.1", "localhost"))
    return {(h, port) for h in hosts}


class HostNodeId(int):
    """A ``--node-id`` nobody gave: NSQ's hash of the host name (an ``int`` like any other,
    which replication refuses: two nodes on one host, or two containers with the same name,
    would share it)."""


class AutoNodeId(int):
    """``--node-id=auto``: a node id no other live node holds, claimed in etcd at start
    (``--etcd-endpoints``) and kept under a lease; the service runs with the id it claimed."""

    def __str__(self) -> str:
        return "auto"

    def __format__(self, spec: str) -> str:
        return "auto"


#: the value ``--node-id=auto`` parses to
AUTO_NODE_ID = AutoNodeId(0)


def default_node_id(hostname: str | None = None) -> int:
    """NSQ's default: ``crc32(md5(hostname)) % 1024``."""
    name = hostname if hostname is not None else socket.gethostname()
    return HostNodeId(zlib.crc32(hashlib.md5(name.encode()).digest()) % 1024)


def default_hostname() -> str:
    return socket.gethostname()


def require_positive_durations(*pairs: tuple[str, float]) -> None:
    """Refuse a zero or negative duration, naming its flag."""
    for name, value in pairs:
        if value <= 0:
            raise OptionError(f"--{name} must be a positive duration (got {format_duration(value)})")


def require_at_least(minimum: int, *pairs: tuple[str, int]) -> None:
    """Refuse a count below ``minimum`` (0 or 1), naming its flag."""
    for name, value in pairs:
        if value < minimum:
            raise OptionError(f"--{name} must be {'>= 0' if minimum == 0 else '> 0'} (got {value})")


def _check_address(flag: str, value: str, allow_empty: bool = True, allow_unix: bool = True) -> None:
    if value == "" and allow_empty:
        return
    if allow_unix and ":" not in value and "/" in value:
        return
    split_host_port(value, flag)


# --- nsqd ----------------------------------------------------------------------


@options_class
class NsqdOptions:
    """nsqd's options with NSQ's flag names and defaults; refused at start if invalid."""

    log_level: int = log_level_opt()
    log_prefix: str = log_prefix_opt("nsqd")
    verbose: bool = verbose_opt()
    node_id: int = opt(flag="node-id", cfg="id", kind=NODE_ID, factory=default_node_id,
                       help="unique part for message IDs, (int) in range [0,1024) (default is hash of hostname)"
                            "; [nsqtw] auto: one no other live node holds, claimed in --etcd-endpoints")
    https_address: str = opt(default="0.0.0.0:4152", flag="https-address", kind=STR,
                             help="<addr>:<port> to listen on for HTTPS clients")
    http_address: str = opt(default="0.0.0.0:4151", flag="http-address", kind=STR,
                            help="address to listen on for HTTP clients (<addr>:<port> for TCP/IP or <path> for unix socket)")
    tcp_address: str = opt(default="0.0.0.0:4150", flag="tcp-address", kind=STR,
                           help="address to listen on for TCP clients (<addr>:<port> for TCP/IP or <path> for unix socket)")
    auth_http_addresses: list[str] = opt(flag="auth-http-address", cfg="auth_http_addresses", kind=STRLIST,
                                         factory=list,
                                         help="<addr>:<port> or a full url to query auth server (may be given multiple times)")
    auth_http_request_method: str = opt(default="get", flag="auth-http-request-method", kind=STR,
                                        help="HTTP method to use for auth server requests (get or post)")
    broadcast_address: str = opt(flag="broadcast-address", kind=STR, factory=default_hostname,
                                 help="address that will be registered with lookupd (defaults to the OS hostname)")
    broadcast_tcp_port: int = opt(default=0, flag="broadcast-tcp-port", kind=INT,
                                  help="TCP port that will be registered with lookupd (defaults to the TCP port that this nsqd is listening on)")
    broadcast_http_port: int = opt(default=0, flag="broadcast-http-port", kind=INT,
                                   help="HTTP port that will be registered with lookupd (defaults to the HTTP port that this nsqd is listening on)")
    lookupd_tcp_addresses: list[str] = opt(flag="lookupd-tcp-address", cfg="nsqlookupd_tcp_addresses",
                                           kind=STRLIST, factory=list,
                                           help="lookupd TCP address (may be given multiple times)")
    http_client_connect_timeout: float = http_client_connect_timeout_opt()
    http_client_request_timeout: float = http_client_request_timeout_opt()
    data_path: str = opt(default="", flag="data-path", kind=STR, help="path to store disk-backed messages")
    mem_queue_size: int = opt(default=10000, flag="mem-queue-size", kind=INT,
                              help="number of messages to keep in memory (per topic/channel)")
    max_bytes_per_file: int = opt(default=100 * 1024 * 1024, flag="max-bytes-per-file", kind=INT,
                                  help="number of bytes per diskqueue file before rolling")
    sync_every: int = opt(default=2500, flag="sync-every", kind=INT, help="number of messages per diskqueue fsync")
    sync_timeout: float = opt(default=2.0, flag="sync-timeout", kind=DURATION, help="duration of time per diskqueue fsync")
    queue_scan_worker_pool_max: int = opt(default=4, flag="queue-scan-worker-pool-max", kind=INT,
                                          help="max concurrency for checking in-flight and deferred message timeouts")
    queue_scan_selection_count: int = opt(default=20, flag="queue-scan-selection-count", kind=INT,
                                          help="number of channels to check per cycle (every 100ms) for in-flight and deferred timeouts")
    msg_timeout: float = opt(default=60.0, flag="msg-timeout", kind=DURATION,
                             help="default duration to wait before auto-requeing a message")
    max_msg_timeout: float = opt(default=15 * 60.0, flag="max-msg-timeout", kind=DURATION,
                                 help="maximum duration before a message will timeout")
    max_msg_size: int = opt(default=1024 * 1024, flag="max-msg-size", kind=INT,
                            help="maximum size of a single message in bytes")
    max_req_timeout: float = opt(default=3600.0, flag="max-req-timeout", kind=DURATION,
                                 help="maximum requeuing timeout for a message")
    max_body_size: int = opt(default=5 * 1024 * 1024, flag="max-body-size", kind=INT,
                             help="maximum size of a single command body")
    max_heartbeat_interval: float = opt(default=60.0, flag="max-heartbeat-interval", kind=DURATION,
                                        help="maximum client configurable duration of time between client heartbeats")
    max_rdy_count: int = opt(default=2500, flag="max-rdy-count", kind=INT, help="maximum RDY count for a client")
    max_output_buffer_size: int = opt(default=64 * 1024, flag="max-output-buffer-size", kind=INT,
                                      help="maximum client configurable size (in bytes) for a client output buffer")
    max_output_buffer_timeout: float = opt(default=30.0, flag="max-output-buffer-timeout", kind=DURATION,
                                           help="maximum client configurable duration of time between flushing to a client")
    min_output_buffer_timeout: float = opt(default=0.025, flag="min-output-buffer-timeout", kind=DURATION,
                                           help="minimum client configurable duration of time between flushing to a client")
    output_buffer_timeout: float = opt(default=0.25, flag="output-buffer-timeout", kind=DURATION,
                                       help="default duration of time between flushing data to clients")
    max_channel_consumers: int = opt(default=0, flag="max-channel-consumers", kind=INT,
                                     help="maximum channel consumer connection count per nsqd instance (default 0, i.e., unlimited)")
    statsd_address: str = opt(default="", flag="statsd-address", kind=STR,
                              help="UDP <addr>:<port> of a statsd daemon for pushing stats")
    statsd_interval: float = opt(default=60.0, flag="statsd-interval", kind=DURATION, help="duration between pushing to statsd")
    statsd_mem_stats: bool = opt(default=True, flag="statsd-mem-stats", kind=BOOL,
                                 help="toggle sending memory and GC stats to statsd")
    statsd_prefix: str = opt(default="nsq.%s", flag="statsd-prefix", kind=STR,
                             help="prefix used for keys sent to statsd (%s for host replacement)")
    statsd_udp_packet_size: int = opt(default=508, flag="statsd-udp-packet-size", kind=INT,
                                      help="the size in bytes of statsd UDP packets")
    statsd_exclude_ephemeral: bool = opt(default=False, flag="statsd-exclude-ephemeral", kind=BOOL,
                                         help="Skip ephemeral topics and channels when sending stats to statsd")
    e2e_processing_latency_percentiles: list[float] = opt(
        flag="e2e-processing-latency-percentile", cfg="e2e_processing_latency_percentiles", kind=FLOATLIST,
        factory=list,
        help="message processing time percentiles (as float (0, 1.0]) to track (can be specified multiple times or comma separated '1.0,0.99,0.95', default none)")
    e2e_processing_latency_window_time: float = opt(
        default=600.0, flag="e2e-processing-latency-window-time", kind=DURATION,
        help="calculate end to end latency quantiles for this duration of time (ie: 60s would only show quantile calculations from the past 60 seconds)")
    tls_cert: str = opt(default="", flag="tls-cert", kind=STR, help="path to certificate file")
    tls_key: str = opt(default="", flag="tls-key", kind=STR, help="path to key file")
    tls_client_auth_policy: str = opt(default="", flag="tls-client-auth-policy", kind=STR,
                                      help="client certificate auth policy ('require' or 'require-verify')")
    tls_root_ca_file: str = opt(default="", flag="tls-root-ca-file", kind=STR, help="path to certificate authority file")
    tls_required: int = opt(default=TLS_NOT_REQUIRED, flag="tls-required", kind=TLS_REQUIRED_KIND,
                            help="require TLS for client connections (true, false, tcp-https)")
    tls_min_version: int = opt(default=TLS_VERSIONS["tls1.0"], flag="tls-min-version", kind=TLS_MIN_VERSION,
                               help="minimum SSL/TLS version acceptable ('tls1.0', 'tls1.1', 'tls1.2' or 'tls1.3')")
    deflate: bool = opt(default=True, flag="deflate", cfg="deflate", kind=BOOL,
                        help="enable deflate feature negotiation (client compression)")
    max_deflate_level: int = opt(default=6, flag="max-deflate-level", kind=INT,
                                 help="max deflate compression level a client can negotiate (> values == > nsqd CPU usage)")
    snappy: bool = opt(default=True, flag="snappy", cfg="snappy", kind=BOOL,
                       help="enable snappy feature negotiation (client compression)")
    topology_region: str = opt(default="", flag="topology-region", kind=STR,
                               unsupported="topology-aware consumption is an unreleased NSQ experiment nsqtw does not implement",
                               help="[experimental, not supported by nsqtw] region for topology-aware consumption")
    topology_zone: str = opt(default="", flag="topology-zone", kind=STR,
                             unsupported="topology-aware consumption is an unreleased NSQ experiment nsqtw does not implement",
                             help="[experimental, not supported by nsqtw] zone for topology-aware consumption")
    enable_experiment: list[str] = opt(flag="enable-experiment", cfg="enable_experiment", kind=STRLIST, factory=list,
                                       unsupported="NSQ's experiments (topology-aware-consumption) are not implemented by nsqtw",
                                       help="[experimental, not supported by nsqtw] enable an experiment")
    # nsqtw additions (not in NSQ) -------------------------------------------------
    stats_export_path: str = opt(default="", flag="stats-export-path", kind=STR,
                                 help="[nsqtw] directory for hourly JSON Lines snapshots of /stats (empty disables)")
    stats_export_interval: float = opt(default=10.0, flag="stats-export-interval", kind=DURATION,
                                       help="[nsqtw] duration between /stats snapshots written to --stats-export-path")
    peek_enabled: bool = opt(default=False, flag="peek-enabled", kind=BOOL,
                             help="[nsqtw] serve GET /topic/peek and /channel/peek: queued, in-flight and "
                                  "deferred messages, bodies included, to whoever reaches the HTTP port")
    peek_max_body_size: int = opt(default=4096, flag="peek-max-body-size", kind=INT,
                                  help="[nsqtw] most body bytes /topic/peek and /channel/peek show of a message")
    max_held_bytes: int = opt(default=64 * 1024 * 1024, flag="max-held-bytes", kind=INT,
                              help="[nsqtw] most bytes of acknowledged messages held in memory while the disk "
                                   "refuses writes; at the cap a timed-out message stays in flight "
                                   "(its timeout extended) instead")
    max_attempts: int = opt(default=0, flag="max-attempts", kind=INT,
                            help="[nsqtw] new channels' policy: a message delivered this many times is not "
                                 "delivered again but kept as a dead letter (0 disables)")
    max_msg_age: float = opt(default=0.0, flag="max-msg-age", kind=DURATION,
                             help="[nsqtw] new channels' policy: a message older than this (from its publish "
                                  "time) is not delivered (0 disables)")
    max_channel_depth: int = opt(default=0, flag="max-channel-depth", kind=INT,
                                 help="[nsqtw] new channels' policy: the most messages a channel queues, "
                                      "see --channel-overflow (0 disables)")
    channel_overflow: str = opt(default="drop-oldest", flag="channel-overflow", kind=STR,
                                help="[nsqtw] what a channel at --max-channel-depth does: drop-oldest (drop its "
                                     "oldest queued message for each new one) or refuse (refuse publishes to "
                                     "its topic)")
    max_channel_rate: float = opt(default=0.0, flag="max-channel-rate", kind=FLOAT,
                                  help="[nsqtw] new channels' policy: the most messages a second delivered to a "
                                       "channel's clients together (0 disables)")
    stop_disk_wait: float = opt(default=20.0, flag="stop-disk-wait", kind=DURATION,
                                help="[nsqtw] how long a stop waits for disk space to write held "
                                     "messages before it gives up and reports them lost")
    replica_peers: list[str] = opt(flag="replica-peer", cfg="replica_peers", kind=STRLIST, factory=list,
                                   help="[nsqtw] <addr>:<port> of a peer's --replication-address: every accepted "
                                        "message is stored there too before its OK (may be given multiple times)")
    replication_address: str = opt(default="", flag="replication-address", kind=STR,
                                   help="[nsqtw] <addr>:<port> to listen on for replicating peers (empty disables)")
    replication_min_acks: int = opt(default=1, flag="replication-min-acks", kind=INT,
                                    help="[nsqtw] peers that must store a message before the publisher's OK")
    replication_degraded: str = opt(default="refuse", flag="replication-degraded", kind=STR,
                                    help="[nsqtw] with fewer peers in sync than --replication-min-acks: refuse "
                                         "publishes (E_PUB_FAILED) or accept them with the peers there are")
    replication_timeout: float = opt(default=5.0, flag="replication-timeout", kind=DURATION,
                                     help="[nsqtw] a peer that does not acknowledge a batch (or answer HELLO) "
                                          "within this is out of sync and its link is dropped")
    replication_secret_file: str = opt(default="", flag="replication-secret-file", kind=STR,
                                       help="[nsqtw] path to a file holding a secret shared by the replicated nodes "
                                            "(at least 16 bytes): links prove it both ways and are sealed with it")
    replication_insecure: bool = opt(default=False, flag="replication-insecure", kind=BOOL,
                                     help="[nsqtw] replicate without a --replication-secret-file: anyone who "
                                          "reaches --replication-address can feed or wipe its shadows (only "
                                          "on a private network)")
    replication_tls: bool = opt(default=False, flag="replication-tls", kind=BOOL,
                                help="[nsqtw] encrypt the replication links with TLS, this node's --tls-cert and "
                                     "--tls-key on both ends (mutual TLS, both certificates signed by "
                                     "--tls-root-ca-file, when it is given)")
    replication_allow: list[str] = opt(flag="replication-allow-node", cfg="replication_allow_nodes", kind=STRLIST,
                                       factory=list,
                                       help="[nsqtw] with a --replication-address: the --node-id of an origin "
                                            "whose links it takes (may be given multiple times; default: any "
                                            "node that proves the secret)")
    adopt_after: float = opt(default=10.0, flag="adopt-after", kind=DURATION,
                             help="[nsqtw] with a --replication-address: once every link from an origin has "
                                  "been down this long, deliver its unfinished messages from here")
    etcd_endpoints: list[str] = opt(flag="etcd-endpoints", cfg="etcd_endpoints", kind=STRLIST, factory=list,
                                    help="[nsqtw] URL[,URL...] of etcd's client endpoints (its v3 JSON gateway): "
                                         "the node's id is held there under a lease, an origin is adopted only "
                                         "by the peer holding its adoption lease, drain and maintenance states "
                                         "are recorded there")
    etcd_prefix: str = opt(default="/nsqtw", flag="etcd-prefix", kind=STR,
                           help="[nsqtw] the etcd key prefix of this cluster's keys (one per cluster sharing "
                                "an etcd)")
    drain_timeout: float = opt(default=0.0, flag="drain-timeout", kind=DURATION,
                               help="[nsqtw] a stop (SIGTERM) drains first for at most this long: publishes "
                                    "refused, topics unregistered from nsqlookupd, the backlog delivered or "
                                    "handed to a replica peer in sync (0: stop at once)")
    maintenance_on_stop: float = opt(default=0.0, flag="maintenance-on-stop", kind=DURATION,
                                     help="[nsqtw] with --replica-peer: a stop tells the peers not to adopt this "
                                          "node for this long (a planned restart keeps its messages here; 0: "
                                          "they adopt after their --adopt-after)")
    # internal knobs NSQ does not expose as flags ------------------------------------
    #: bytes kept free in ``--data-path`` for the final flush (nsqd.reserve, deleted at the stop)
    disk_reserve_bytes: int = opt(default=1024 * 1024, flag=None, kind=INT,
                                  help="bytes kept free in the data path (the file nsqd.reserve) for the final "
                                       "flush at stop")
    client_timeout: float = opt(default=60.0, flag=None, kind=DURATION,
                                help="NSQ's ClientTimeout: a client's default heartbeat interval is half of it")
    queue_scan_interval: float = opt(default=0.1, flag=None, kind=DURATION,
                                     help="NSQ's QueueScanInterval: how often in-flight and deferred messages "
                                          "are scanned for timeouts")
    queue_scan_refresh_interval: float = opt(default=5.0, flag=None, kind=DURATION,
                                             help="NSQ's QueueScanRefreshInterval: how often the set of "
                                                  "channels the scan samples from is refreshed")
    queue_scan_dirty_percent: float = opt(default=0.25, flag=None, kind=STR,
                                          help="NSQ's QueueScanDirtyPercent: the share of sampled channels with "
                                               "work above which the scan runs again at once")
    magic_timeout: float = opt(default=60.0, flag=None, kind=DURATION,
                               help="how long a new TCP connection may take to send the protocol's magic "
                                    "(``  V2``) before it is closed")

    def __attrs_post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Refuse values nsqd refuses, with messages that name the flag."""
        if not 0 <= self.node_id < 1024:
            raise OptionError("--node-id must be [0,1024)")
        if not 1 <= self.max_deflate_level <= 9:
            raise OptionError("--max-deflate-level must be [1,9]")
        for p in self.e2e_processing_latency_percentiles:
            if not 0 < p <= 1:
                raise OptionError(f"invalid E2E processing latency percentile: {p:g} (--e2e-processing-latency-percentile must be in (0,1])")
        if self.auth_http_request_method.lower() not in ("get", "post"):
            raise OptionError(f"--auth-http-request-method must be get or post, not {self.auth_http_request_method!r}")
        require_at_least(
            0,
            ("mem-queue-size", self.mem_queue_size),
            ("peek-max-body-size", self.peek_max_body_size),
            ("max-channel-consumers", self.max_channel_consumers),
            ("broadcast-tcp-port", self.broadcast_tcp_port),
            ("broadcast-http-port", self.broadcast_http_port),
            ("max-rdy-count", self.max_rdy_count),
            ("max-held-bytes", self.max_held_bytes),
        )
        require_at_least(
            1,
            ("max-msg-size", self.max_msg_size),
            ("max-body-size", self.max_body_size),
            ("max-bytes-per-file", self.max_bytes_per_file),
            ("sync-every", self.sync_every),
            ("queue-scan-selection-count", self.queue_scan_selection_count),
            ("queue-scan-worker-pool-max", self.queue_scan_worker_pool_max),
            ("max-output-buffer-size", self.max_output_buffer_size),
            ("statsd-udp-packet-size", self.statsd_udp_packet_size),
        )
        require_positive_durations(
            ("msg-timeout", self.msg_timeout),
            ("max-msg-timeout", self.max_msg_timeout),
            ("max-heartbeat-interval", self.max_heartbeat_interval),
            ("sync-timeout", self.sync_timeout),
            ("statsd-interval", self.statsd_interval),
            ("e2e-processing-latency-window-time", self.e2e_processing_latency_window_time),
            ("stats-export-interval", self.stats_export_interval),
        )
        if self.stop_disk_wait < 0:
            raise OptionError("--stop-disk-wait must not be negative")
        if not 0 <= self.max_attempts <= 65535:
            raise OptionError("--max-attempts must be [0,65535]")
        if self.max_msg_age < 0:
            raise OptionError("--max-msg-age must not be negative")
        if self.max_channel_depth < 0:
            raise OptionError("--max-channel-depth must not be negative")
        if self.channel_overflow not in ("drop-oldest", "refuse"):
            raise OptionError(f"--channel-overflow must be drop-oldest or refuse, not {self.channel_overflow!r}")
        if not 0 <= self.max_channel_rate < 1e9:
            raise OptionError("--max-channel-rate must not be negative")
        if self.drain_timeout < 0:
            raise OptionError("--drain-timeout must not be negative")
        if self.maintenance_on_stop < 0:
            raise OptionError("--maintenance-on-stop must not be negative")
        if self.max_req_timeout < 0:
            raise OptionError("--max-req-timeout must not be negative")
        if self.msg_timeout > self.max_msg_timeout:
            raise OptionError(
                f"--msg-timeout ({format_duration(self.msg_timeout)}) must not exceed "
                f"--max-msg-timeout ({format_duration(self.max_msg_timeout)})")
        if self.min_output_buffer_timeout > self.max_output_buffer_timeout:
            raise OptionError("--min-output-buffer-timeout must not exceed --max-output-buffer-timeout")
        if self.tls_client_auth_policy not in ("", "require", "require-verify"):
            raise OptionError(
                f"--tls-client-auth-policy must be 'require' or 'require-verify', not {self.tls_client_auth_policy!r}")
        if (self.tls_required != TLS_NOT_REQUIRED or self.tls_client_auth_policy) and not (
                self.tls_cert and self.tls_key):
            raise OptionError("cannot require TLS client connections without TLS key and cert (--tls-cert, --tls-key)")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise OptionError("--tls-cert and --tls-key must be given together")
        _check_address("tcp-address", self.tcp_address, allow_empty=False)
        _check_address("http-address", self.http_address)
        _check_address("https-address", self.https_address, allow_unix=False)
        for a in self.lookupd_tcp_addresses:
            _check_address("lookupd-tcp-address", a, allow_empty=False, allow_unix=False)
        if self.statsd_address:
            _check_address("statsd-address", self.statsd_address, allow_unix=False)
        self._validate_replication()
        for f in option_fields(type(self)):
            reason = f.metadata.get("unsupported")
            if reason and getattr(self, f.name) != f.default and not (
                    isinstance(f.default, attr.Factory)  # type: ignore[arg-type]  # attrs' stubs make Factory a function; it is a class
                    and not getattr(self, f.name)):
                raise OptionError(f"--{f.metadata['flag']} is not supported: {reason}")

    @property
    def etcd_urls(self) -> list[str]:
        """``--etcd-endpoints`` as URLs (each flag may hold several, comma-separated; a bare
        ``host:port`` is ``http://host:port``)."""
        out = []
        for value in self.etcd_endpoints:
            for part in value.split(","):
                part = part.strip().rstrip("/")
                if part:
                    out.append(part if "://" in part else f"http://{part}")
        return out

    def _validate_etcd(self) -> None:
        for url in self.etcd_urls:
            scheme, _, rest = url.partition("://")
            if scheme not in ("http", "https") or not rest:
                raise OptionError(f"--etcd-endpoints: {url!r} is not an http:// or https:// URL")
        if isinstance(self.node_id, AutoNodeId) and not self.etcd_urls:
            raise OptionError("--node-id=auto needs --etcd-endpoints (the ids are claimed there)")
        if self.etcd_urls and not self.etcd_prefix.startswith("/"):
            raise OptionError(f"--etcd-prefix must start with '/', not {self.etcd_prefix!r}")

    def _validate_replication(self) -> None:
        self._validate_etcd()
        replicated = bool(self.replica_peers or self.replication_address)
        if replicated and isinstance(self.node_id, HostNodeId):
            raise OptionError("--replica-peer and --replication-address need an explicit --node-id, "
                              "distinct on every node (the default, a hash of the host name, is the same "
                              "for nodes sharing a host name)")
        if self.replication_secret_file and self.replication_insecure:
            raise OptionError("--replication-secret-file and --replication-insecure exclude each other")
        if replicated and not (self.replication_secret_file or self.replication_insecure
                               or (self.replication_tls and self.tls_root_ca_file)):
            raise OptionError("replication needs --replication-secret-file=PATH (a secret shared by the "
                              "nodes), or --replication-tls with --tls-root-ca-file (mutual TLS), or "
                              "--replication-insecure on a private network where nobody else reaches "
                              "--replication-address")
        if self.replication_tls and not (self.tls_cert and self.tls_key):
            raise OptionError("--replication-tls needs --tls-cert and --tls-key")
        for n in self.replication_allow:
            if not n.isdigit() or not 0 <= int(n) < 1024:
                raise OptionError(f"--replication-allow-node must be a --node-id in [0,1024), not {n!r}")
        if self.replication_address:
            _check_address("replication-address", self.replication_address, allow_unix=False)
        own = _self_addresses(self.replication_address, self.broadcast_address)
        for a in self.replica_peers:
            _check_address("replica-peer", a, allow_empty=False, allow_unix=False)
            host, port = split_host_port(a, "replica-peer")
            if (host.lower(), port) in own:
                raise OptionError(f"--replica-peer {a} names this node itself (its --replication-address "
                                  f"{self.replication_address}); list the other nodes only")
        if len(set(self.replica_peers)) != len(self.replica_peers):
            raise OptionError("--replica-peer lists the same peer twice")
        if self.replication_degraded not in ("refuse", "accept"):
            raise OptionError(f"--replication-degraded must be refuse or accept, not {self.replication_degraded!r}")
        if self.replica_peers and not 1 <= self.replication_min_acks <= len(self.replica_peers):
            raise OptionError(f"--replication-min-acks must be [1,{len(self.replica_peers)}] with "
                              f"{len(self.replica_peers)} --replica-peer (got {self.replication_min_acks})")
        require_positive_durations(("replication-timeout", self.replication_timeout),
                                   ("adopt-after", self.adopt_after))

    @property
    def heartbeat_interval(self) -> float:
        """The default client heartbeat interval: half of ClientTimeout."""
        return self.client_timeout / 2

    def replace(self, **changes: Any) -> NsqdOptions:
        """A copy with ``changes`` (attribute names) applied, validated again."""
        return evolve(self, **changes)
