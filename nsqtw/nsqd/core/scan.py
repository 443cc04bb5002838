"""
The queue scan: NSQ's probabilistic expiry of in-flight and deferred messages.

Borrowed by NSQ from Redis: every ``QueueScanInterval`` (100 ms), pick up to
``--queue-scan-selection-count`` channels at random, process their in-flight
and deferred queues, and if more than ``QueueScanDirtyPercent`` (25%) of them
had something expire, go again at once.  The cost of a tick depends on the
selection count, not on how many idle channels exist.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from .channel import Channel

__all__ = ["scan_channels", "ChannelSampler"]


def scan_channels(channels: Sequence[Channel], now: float, rng: random.Random,
                  selection_count: int, dirty_percent: float, max_rounds: int = 1000) -> int:
    """One scan tick; returns how many rounds ran (more than one when the system was dirty)."""
    rounds = 0
    while channels and rounds < max_rounds:
        rounds += 1
        num = min(selection_count, len(channels))
        picked = rng.sample(channels, num) if num < len(channels) else list(channels)
        dirty = 0
        for ch in picked:
            expired = ch.process_in_flight(now)
            matured = ch.process_deferred(now)
            if expired or matured:
                dirty += 1
        if dirty / num <= dirty_percent:
            break
    return rounds


class ChannelSampler:
    """The cached channel list NSQ refreshes every ``QueueScanRefreshInterval``."""

    def __init__(self, source: Callable[[], list[Channel]], refresh_interval: float) -> None:
        self._source = source
        self._refresh_interval = refresh_interval
        self._cached: list[Channel] = []
        self._refreshed_at = float("-inf")
        self.stale = True

    def channels(self, now: float) -> list[Channel]:
        if self.stale or now - self._refreshed_at >= self._refresh_interval:
            self._cached = self._source()
            self._refreshed_at = now
            self.stale = False
        return self._cached
