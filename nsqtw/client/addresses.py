"""
nsqd addresses as users write them, and how each is dialed.

``"host:port"`` (``[v6]:port`` too) is TCP, dialed with ``dial_timeout`` and
``local_addr``; ``"inprocess:"`` / ``"inprocess:<name>"`` and broker objects
(the handle of ``nsqtw.embed.start_nsqd``, an ``NsqdService``) use the
in-process bus of :mod:`nsqtw.client.inprocess`.
"""

from __future__ import annotations

import ipaddress
from typing import Any
from collections.abc import Callable

from twisted.internet import defer
from twisted.internet.endpoints import HostnameEndpoint, TCP4ClientEndpoint, TCP6ClientEndpoint, connectProtocol
from twisted.internet.protocol import Protocol

from .config import Config
from .errors import ConfigError
from .inprocess import PREFIX, address_name, connect_inprocess, is_inprocess

__all__ = ["NsqdAddress", "address_key", "split_address", "join_host_port", "tls_host", "default_connector"]


#: where a client finds an nsqd: ``"host:port"`` (``"[v6]:port"``), ``"inprocess:"`` /
#: ``"inprocess:<name>"``, or an in-process broker object (the handle of
#: ``nsqtw.embed.start_nsqd``); anything else is refused when dialed
NsqdAddress = object


def split_address(address: str) -> tuple[str, int]:
    """``"host:port"`` -> ``(host, port)`` (brackets removed from IPv6 hosts)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"address {address}: missing port in address")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    number = int(port)
    if number > 65535:
        raise ConfigError(f"address {address}: invalid port")
    return host, number


def join_host_port(host: str, port: int) -> str:
    """Go's ``net.JoinHostPort``."""
    if ":" in host:
        return f"[{host}]:{port}"
    return f"{host}:{port}"


def address_key(address: NsqdAddress) -> str:
    """The string an address is known by (connection maps, logs, ``Message.nsqd_address``)."""
    if isinstance(address, str):
        if not address.startswith(PREFIX):
            split_address(address)  # refuse a malformed address early
        return address
    return address_name(address)


def tls_host(address: NsqdAddress) -> str:
    """The host name TLS verifies (go-nsq sets ``ServerName`` to it)."""
    if isinstance(address, str) and not address.startswith(PREFIX):
        return split_address(address)[0]
    return ""


def _ip_version(host: str) -> int:
    try:
        return ipaddress.ip_address(host).version
    except ValueError:
        return 0


def default_connector(reactor: Any, config: Config) -> Callable[[Any, Protocol], defer.Deferred[Any]]:
    """Dial TCP (or the in-process bus) for ``address`` and attach ``protocol``."""

    def dial(address: Any, protocol: Protocol) -> defer.Deferred[Any]:
        if is_inprocess(address):
            return connect_inprocess(address, protocol, reactor)
        host, port = split_address(address)
        bind = config.local_addr
        timeout = config.dial_timeout if config.dial_timeout > 0 else 30
        version = _ip_version(host)
        endpoint: Any
        if version == 4:
            endpoint = TCP4ClientEndpoint(reactor, host, port, timeout=timeout, bindAddress=bind)
        elif version == 6:
            endpoint = TCP6ClientEndpoint(reactor, host, port, timeout=timeout, bindAddress=bind)
        else:
            endpoint = HostnameEndpoint(reactor, host, port, timeout=timeout, bindAddress=bind)
        connected: defer.Deferred[Any] = connectProtocol(endpoint, protocol)
        return connected

    return dial
