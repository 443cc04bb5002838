"""How nsqd writes a peer's address (the TCP glue and the listeners share it)."""

from __future__ import annotations

from typing import Any

__all__ = ["format_peer"]


def format_peer(addr: Any) -> str:
    """A remote address as Go's ``net.Addr.String()`` writes it (``ip:port``, ``[v6]:port``)."""
    host = getattr(addr, "host", None)
    port = getattr(addr, "port", None)
    if host is None:
        return str(getattr(addr, "name", "") or "unix")
    if ":" in host:
        return f"[{host}]:{port}"
    return f"{host}:{port}"
