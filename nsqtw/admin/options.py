"""
nsqadmin's options: NSQ's flag names, defaults and start-up checks, plus nsqtw's history knobs.

Graphite is not needed by nsqtw: the graphs are drawn from a short history the
admin keeps by polling every nsqd's ``/stats``.  ``--graphite-url`` and
``--proxy-graphite`` are therefore refused with a message saying so (a flag
that silently did nothing would surprise an operator who copied an NSQ command
line); the ``--statsd-*`` flags are accepted, since they only described how
nsqd's statsd keys look to graphite and change nothing here.
"""

from __future__ import annotations

import ipaddress
import posixpath
from typing import Any


from ..options import (
    BOOL, DURATION, INT, STR, STRLIST, OptionError, http_client_connect_timeout_opt,
    evolve, http_client_request_timeout_opt, log_level_opt, log_prefix_opt, option_fields, opt, options_class,
    require_positive_durations, split_host_port, verbose_opt,
)

__all__ = ["AdminOptions", "normalize_base_path", "split_upstream"]

_NO_GRAPHITE = ("nsqtw does not talk to graphite; nsqadmin's graphs are drawn from its own "
                "/stats history (see --history-interval and --history-size)")


def normalize_base_path(path: str) -> str:
    """nsqadmin's ``normalizeBasePath``: a leading slash, cleaned, ``/`` when empty."""
    if not path:
        return "/"
    if not path.startswith("/"):
        path = "/" + path
    cleaned = posixpath.normpath(path)
    # normpath keeps a leading "//" (POSIX allows it to mean something); path.Clean does not
    while cleaned.startswith("//"):
        cleaned = cleaned[1:]
    return cleaned


def split_upstream(address: str, flag: str) -> tuple[str, str]:
    """``host:port`` or ``http(s)://host:port`` -> (scheme, ``host:port``), checked."""
    scheme = "http"
    rest = address
    for prefix in ("http://", "https://"):
        if address.lower().startswith(prefix):
            scheme = prefix[:-3]
            rest = address[len(prefix):].rstrip("/")
            break
    if "/" in rest:
        raise OptionError(f"--{flag} {address!r}: expected <addr>:<port> (a path is not allowed)")
    host, _ = split_host_port(rest, flag)
    if not host:
        raise OptionError(f"--{flag} {address!r}: missing host")
    return scheme, rest


@options_class
class AdminOptions:
    """nsqadmin's options with NSQ's flag names and defaults; refused at start if invalid."""

    log_level: int = log_level_opt()
    log_prefix: str = log_prefix_opt("nsqadmin")
    verbose: bool = verbose_opt()
    http_address: str = opt(default="0.0.0.0:4171", flag="http-address", kind=STR,
                            help="<addr>:<port> to listen on for HTTP clients")
    base_path: str = opt(default="/", flag="base-path", kind=STR, help="URL base path")
    dev_static_dir: str = opt(default="", flag="dev-static-dir", kind=STR,
                              help="(development use only) serve /static/ from this directory")
    graphite_url: str = opt(default="", flag="graphite-url", kind=STR, unsupported=_NO_GRAPHITE,
                            help="[not supported by nsqtw: graphs come from nsqadmin's own history] graphite HTTP address")
    proxy_graphite: bool = opt(default=False, flag="proxy-graphite", kind=BOOL, unsupported=_NO_GRAPHITE,
                               help="[not supported by nsqtw: graphs come from nsqadmin's own history] proxy HTTP requests to graphite")
    statsd_counter_format: str = opt(default="stats.counters.%s.count", flag="statsd-counter-format", kind=STR,
                                     help="[accepted; only used with graphite] the counter stats key formatting applied by the implementation of statsd")
    statsd_gauge_format: str = opt(default="stats.gauges.%s", flag="statsd-gauge-format", kind=STR,
                                   help="[accepted; only used with graphite] the gauge stats key formatting applied by the implementation of statsd")
    statsd_prefix: str = opt(default="nsq.%s", flag="statsd-prefix", kind=STR,
                             help="[accepted; only used with graphite] prefix used for keys sent to statsd (%s for host replacement, must match nsqd)")
    statsd_interval: float = opt(default=60.0, flag="statsd-interval", kind=DURATION,
                                 help="[accepted; only used with graphite] time interval nsqd is configured to push to statsd (must match nsqd)")
    notification_http_endpoint: str = opt(default="", flag="notification-http-endpoint", kind=STR,
                                          help="HTTP endpoint (fully qualified) to which POST notifications of admin actions will be sent")
    http_client_connect_timeout: float = http_client_connect_timeout_opt()
    http_client_request_timeout: float = http_client_request_timeout_opt()
    http_client_tls_insecure_skip_verify: bool = opt(default=False, flag="http-client-tls-insecure-skip-verify", kind=BOOL,
                                                     help="configure the HTTP client to skip verification of TLS certificates")
    http_client_tls_root_ca_file: str = opt(default="", flag="http-client-tls-root-ca-file", kind=STR,
                                            help="path to CA file for the HTTP client")
    http_client_tls_cert: str = opt(default="", flag="http-client-tls-cert", kind=STR,
                                    help="path to certificate file for the HTTP client")
    http_client_tls_key: str = opt(default="", flag="http-client-tls-key", kind=STR,
                                   help="path to key file for the HTTP client")
    allow_config_from_cidr: str = opt(default="127.0.0.1/8", flag="allow-config-from-cidr", kind=STR,
                                      help="A CIDR from which to allow HTTP requests to the /config endpoint")
    acl_http_header: str = opt(default="X-Forwarded-User", flag="acl-http-header", kind=STR,
                               help="HTTP header to check for authenticated admin users")
    lookupd_http_addresses: list[str] = opt(flag="lookupd-http-address", cfg="nsqlookupd_http_addresses",
                                            kind=STRLIST, factory=list,
                                            help="lookupd HTTP address (may be given multiple times)")
    nsqd_http_addresses: list[str] = opt(flag="nsqd-http-address", cfg="nsqd_http_addresses",
                                         kind=STRLIST, factory=list,
                                         help="nsqd HTTP address (may be given multiple times)")
    admin_users: list[str] = opt(flag="admin-user", cfg="admin_users", kind=STRLIST, factory=list,
                                 help="admin user (may be given multiple times; if specified, only these users will be able to perform privileged actions; acl-http-header is used to determine the authenticated user)")
    # nsqtw additions (not in NSQ) -------------------------------------------------
    history_interval: float = opt(default=5.0, flag="history-interval", kind=DURATION,
                                  help="[nsqtw] how often nsqadmin polls every nsqd's /stats for its graphs")
    history_size: int = opt(default=120, flag="history-size", kind=INT,
                            help="[nsqtw] how many recent /stats samples nsqadmin keeps at full resolution")
    history_retention: float = opt(default=21600.0, flag="history-retention", kind=DURATION,
                                   help="[nsqtw] how far back the charts go (e.g. 6h); samples older than the "
                                        "--history-size newest are thinned to at most 720 over this span, so "
                                        "memory stays bounded")
    history_path: str = opt(default="", flag="history-path", kind=STR,
                            help="[nsqtw] a directory where nsqadmin keeps its history (nsqadmin.history.json, "
                                 "written every 30s and at exit, off the reactor) so a restart does not blank "
                                 "every chart; empty: memory only")
    refresh_interval: float = opt(default=5.0, flag="refresh-interval", kind=DURATION,
                                  help="[nsqtw] how often the pages poll the JSON API for fresh numbers")

    def __attrs_post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Refuse what nsqadmin refuses, with messages that name the flag."""
        for f in option_fields(type(self)):
            reason = f.metadata.get("unsupported")
            if reason and getattr(self, f.name) != f.default:
                raise OptionError(f"--{f.metadata['flag']} is not supported: {reason}")
        if not self.nsqd_http_addresses and not self.lookupd_http_addresses:
            raise OptionError("--nsqd-http-address or --lookupd-http-address required")
        if self.nsqd_http_addresses and self.lookupd_http_addresses:
            raise OptionError("use --nsqd-http-address or --lookupd-http-address not both")
        for a in self.lookupd_http_addresses:
            split_upstream(a, "lookupd-http-address")
        for a in self.nsqd_http_addresses:
            split_upstream(a, "nsqd-http-address")
        if self.http_client_tls_cert and not self.http_client_tls_key:
            raise OptionError("--http-client-tls-key must be specified with --http-client-tls-cert")
        if self.http_client_tls_key and not self.http_client_tls_cert:
            raise OptionError("--http-client-tls-cert must be specified with --http-client-tls-key")
        if self.allow_config_from_cidr:
            try:
                ipaddress.ip_network(self.allow_config_from_cidr, strict=False)
            except ValueError as e:
                raise OptionError(
                    f"failed to parse --allow-config-from-cidr ({self.allow_config_from_cidr}) - {e}") from None
            if "/" not in self.allow_config_from_cidr:
                raise OptionError(
                    f"failed to parse --allow-config-from-cidr ({self.allow_config_from_cidr}) - "
                    "invalid CIDR address")
        if self.notification_http_endpoint and not self.notification_http_endpoint.lower().startswith(
                ("http://", "https://")):
            raise OptionError(
                f"--notification-http-endpoint {self.notification_http_endpoint!r}: expected a full "
                "http:// or https:// URL")
        if self.http_address and ":" in self.http_address:
            split_host_port(self.http_address, "http-address")
        elif not (self.http_address and "/" in self.http_address):
            raise OptionError(f"--http-address {self.http_address!r}: expected <addr>:<port> or a unix socket path")
        require_positive_durations(
            ("http-client-connect-timeout", self.http_client_connect_timeout),
            ("http-client-request-timeout", self.http_client_request_timeout),
            ("history-interval", self.history_interval),
            ("history-retention", self.history_retention),
            ("refresh-interval", self.refresh_interval),
        )
        if self.history_size < 2:
            raise OptionError(f"--history-size must be >= 2 (got {self.history_size})")
        if not self.acl_http_header:
            raise OptionError("--acl-http-header must not be empty")

    @property
    def base(self) -> str:
        """The normalised base path (``/`` or ``/prefix`` without a trailing slash)."""
        return normalize_base_path(self.base_path)

    @property
    def lookupd_mode(self) -> bool:
        """Whether nsqadmin finds nsqd through nsqlookupd (``--lookupd-http-address`` given) rather than
        from ``--nsqd-http-address``."""
        return bool(self.lookupd_http_addresses)

    def replace(self, **changes: Any) -> AdminOptions:
        """A copy with ``changes`` (attribute names) applied, validated again."""
        return evolve(self, **changes)
