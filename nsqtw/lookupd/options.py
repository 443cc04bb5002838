"""
nsqlookupd's options with NSQ's flag names, defaults and help texts.

Built like :class:`~nsqtw.options.NsqdOptions` (one attrs field per flag,
parsed by :mod:`nsqtw.runtime.flags`), so ``twistd nsqlookupd``, the drop-in CLI
and :func:`~nsqtw.embed.start_nsqlookupd` all accept nsqlookupd's
command line as written.
"""

from __future__ import annotations

from typing import Any


from ..options import (
    DURATION, LOG_LEVELS, STR, OptionError, default_hostname, evolve, format_duration, log_level_opt,
    log_prefix_opt, opt, options_class, split_host_port, verbose_opt,
)

__all__ = ["LookupdOptions"]


def _check_tcp_address(flag: str, value: str) -> None:
    """nsqlookupd listens on TCP only (no unix sockets): ``<addr>:<port>``."""
    if not value:
        raise OptionError(f"--{flag} must be <addr>:<port>")
    split_host_port(value, flag)


@options_class
class LookupdOptions:
    """nsqlookupd's options; refused at construction if invalid, naming the flag."""

    log_level: int = log_level_opt()
    log_prefix: str = log_prefix_opt("nsqlookupd")
    verbose: bool = verbose_opt()
    tcp_address: str = opt(default="0.0.0.0:4160", flag="tcp-address", kind=STR,
                           help="<addr>:<port> to listen on for TCP clients")
    http_address: str = opt(default="0.0.0.0:4161", flag="http-address", kind=STR,
                            help="<addr>:<port> to listen on for HTTP clients")
    broadcast_address: str = opt(flag="broadcast-address", kind=STR, factory=default_hostname,
                                 help="address of this lookupd node, (default to the OS hostname)")
    inactive_producer_timeout: float = opt(
        default=300.0, flag="inactive-producer-timeout", kind=DURATION,
        help="duration of time a producer will remain in the active list since its last ping")
    tombstone_lifetime: float = opt(
        default=45.0, flag="tombstone-lifetime", kind=DURATION,
        help="duration of time a producer will remain tombstoned if registration remains")

    def __attrs_post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Refuse what cannot work, with messages that name the flag."""
        _check_tcp_address("tcp-address", self.tcp_address)
        _check_tcp_address("http-address", self.http_address)
        for name, value in (("inactive-producer-timeout", self.inactive_producer_timeout),
                            ("tombstone-lifetime", self.tombstone_lifetime)):
            if value < 0:
                raise OptionError(f"--{name} must not be negative (got {format_duration(value)})")
        if self.log_level not in LOG_LEVELS.values():
            raise OptionError(f"--log-level must be one of {', '.join(LOG_LEVELS)}")

    def replace(self, **changes: Any) -> LookupdOptions:
        """A copy with ``changes`` (attribute names) applied, validated again."""
        return evolve(self, **changes)
