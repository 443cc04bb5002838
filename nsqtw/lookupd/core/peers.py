"""
What nsqlookupd knows about one nsqd: its IDENTIFY fields and when it last spoke.

:class:`PeerInfo` is nsqlookupd's ``PeerInfo``: the JSON field names are
NSQ's (``remote_address``, ``broadcast_address``, ``tcp_port`` ...), the id is
the connection's remote ``ip:port``, and ``last_update`` is refreshed by
IDENTIFY and PING.  :func:`peer_from_identify` reads nsqd's IDENTIFY body with
Go's ``encoding/json`` rules (case-insensitive keys, unknown keys ignored,
``null`` leaves a field alone, a value of the wrong type is an error) and
enforces the four fields nsqlookupd requires.
"""

from __future__ import annotations

import json
from typing import Any

import attr

from ...errors import BadBody

__all__ = ["PeerInfo", "peer_from_identify", "GO_ZERO_TIME_NS"]

#: ``time.Time{}.UnixNano()`` in Go (an int64 overflow Go does not check): what
#: ``/debug`` shows as ``tombstoned_at`` for a producer never tombstoned
GO_ZERO_TIME_NS = -6795364578871345152

_INT64 = (-(1 << 63), (1 << 63) - 1)

#: IDENTIFY keys nsqlookupd decodes, with their Go types (topology_* exist since NSQ's
#: unreleased topology-aware consumption; decoding them costs nothing)
_FIELDS: dict[str, Any] = {
    "remote_address": str,
    "hostname": str,
    "broadcast_address": str,
    "tcp_port": int,
    "http_port": int,
    "version": str,
    "topology_zone": str,
    "topology_region": str,
}


@attr.s(slots=True, eq=False, auto_attribs=True)
class PeerInfo:
    """One identified nsqd; mutable because PING moves ``last_update``."""

    id: str
    remote_address: str = ""
    hostname: str = ""
    broadcast_address: str = ""
    tcp_port: int = 0
    http_port: int = 0
    version: str = ""
    topology_zone: str = ""
    topology_region: str = ""
    #: seconds (the reactor's clock) of the last IDENTIFY or PING
    last_update: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """The ``/lookup`` producer object, in Go's struct field order."""
        return {
            "remote_address": self.remote_address,
            "hostname": self.hostname,
            "broadcast_address": self.broadcast_address,
            "tcp_port": self.tcp_port,
            "http_port": self.http_port,
            "version": self.version,
            "topology_zone": self.topology_zone,
            "topology_region": self.topology_region,
        }

    @property
    def http_node(self) -> str:
        """``broadcast_address:http_port``: how ``/topic/tombstone?node=`` names this nsqd."""
        return f"{self.broadcast_address}:{self.http_port}"

    def __str__(self) -> str:
        return f"{self.broadcast_address} [{self.tcp_port}, {self.http_port}]"


def _decode(body: bytes) -> Any:
    def no_constants(name: str) -> Any:
        raise ValueError(f"invalid character {name!r} looking for beginning of value")

    return json.loads(body.decode("utf-8", "replace"), parse_constant=no_constants)


def peer_from_identify(body: bytes, remote_address: str, now: float) -> PeerInfo:
    """
    The PeerInfo an IDENTIFY body describes, as nsqlookupd builds it.

    Raises :class:`~nsqtw.errors.BadBody` with nsqlookupd's texts:
    ``IDENTIFY failed to decode JSON body`` or ``IDENTIFY missing fields``
    (``broadcast_address``, ``tcp_port``, ``http_port`` and ``version`` must be
    present and non-zero).
    """
    try:
        data = _decode(body)
    except (ValueError, RecursionError):
        raise BadBody("IDENTIFY failed to decode JSON body") from None
    values: dict[str, Any] = {}
    if data is not None:
        if not isinstance(data, dict):
            raise BadBody("IDENTIFY failed to decode JSON body")
        for key, value in data.items():
            name = key if key in _FIELDS else key.lower()
            kind = _FIELDS.get(name)
            if kind is None or value is None:
                continue
            if kind is str:
                if not isinstance(value, str):
                    raise BadBody("IDENTIFY failed to decode JSON body")
            elif isinstance(value, bool) or not isinstance(value, int) or not (
                    _INT64[0] <= value <= _INT64[1]):
                raise BadBody("IDENTIFY failed to decode JSON body")
            values[name] = value
    # the socket's address wins over anything the body claims
    values["remote_address"] = remote_address
    peer = PeerInfo(id=remote_address, last_update=now, **values)
    if not peer.broadcast_address or not peer.tcp_port or not peer.http_port or not peer.version:
        raise BadBody("IDENTIFY missing fields")
    return peer
