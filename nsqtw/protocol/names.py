"""Topic and channel name rules (NSQ's ``internal/protocol/names.go``)."""

from __future__ import annotations

import re

__all__ = ["is_valid_name", "is_valid_topic_name", "is_valid_channel_name", "is_ephemeral", "EPHEMERAL"]

EPHEMERAL = "#ephemeral"
_VALID = re.compile(r"[.a-zA-Z0-9_-]+(?:#ephemeral)?\Z")


def is_valid_name(name: str) -> bool:
    """1-64 characters of ``[.a-zA-Z0-9_-]``, optionally ending in ``#ephemeral``."""
    return 0 < len(name) <= 64 and _VALID.match(name) is not None


is_valid_topic_name = is_valid_name
is_valid_channel_name = is_valid_name


def is_ephemeral(name: str) -> bool:
    return name.endswith(EPHEMERAL)
