"""
End-to-end processing latency percentiles (``--e2e-processing-latency-percentile``).

NSQ keeps two perks streams, each covering half of the window, and resets the
older one every half window.  This keeps the same two-halves rotation with a
bounded reservoir sample per half, so memory is fixed whatever the rate and
the hot path (one insert per FIN) is a few integer operations.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

__all__ = ["Quantile", "merge_quantiles"]

RESERVOIR = 1024


class _Half:
    __slots__ = ("samples", "count", "started")

    def __init__(self, started: float) -> None:
        self.samples: list[int] = []
        self.count = 0
        self.started = started


class Quantile:
    """A rolling-window latency estimator answering NSQ's ``e2e_processing_latency``."""

    __slots__ = ("percentiles", "half_window", "_halves", "_rng")

    def __init__(self, window: float, percentiles: Sequence[float], now: float,
                 rng: random.Random | None = None) -> None:
        self.percentiles = list(percentiles)
        self.half_window = window / 2
        self._halves = [_Half(now), _Half(now)]
        self._rng = rng or random.Random()

    def _rotate(self, now: float) -> None:
        cur = self._halves[-1]
        if now - cur.started >= self.half_window:
            self._halves = [cur, _Half(now)] if now - cur.started < 2 * self.half_window else [_Half(now), _Half(now)]

    def insert(self, value_ns: int, now: float) -> None:
        self._rotate(now)
        half = self._halves[-1]
        half.count += 1
        if len(half.samples) < RESERVOIR:
            half.samples.append(value_ns)
        else:
            j = self._rng.randrange(half.count)
            if j < RESERVOIR:
                half.samples[j] = value_ns

    def snapshot(self, now: float) -> tuple[int, list[int]]:
        self._rotate(now)
        samples: list[int] = []
        count = 0
        for half in self._halves:
            samples.extend(half.samples)
            count += half.count
        return count, samples

    def result(self, now: float) -> dict[str, object]:
        """NSQ's JSON: ``{"count": N, "percentiles": [{"quantile": q, "value": ns}, ...]}``."""
        count, samples = self.snapshot(now)
        return _result(count, samples, self.percentiles)


def _result(count: int, samples: list[int], percentiles: Sequence[float]) -> dict[str, object]:
    if not percentiles:
        return {"count": 0, "percentiles": None}
    if not samples:
        return {"count": count, "percentiles": [{"quantile": q, "value": 0} for q in percentiles]}
    ordered = sorted(samples)
    n = len(ordered)
    out = []
    for q in percentiles:
        idx = min(n - 1, max(0, int(q * n + 0.5) - 1))
        out.append({"quantile": q, "value": ordered[idx]})
    return {"count": count, "percentiles": out}


def merge_quantiles(quantiles: Sequence[Quantile], percentiles: Sequence[float], now: float) -> dict[str, object]:
    """A topic's latency: its channels' streams merged."""
    count = 0
    samples: list[int] = []
    for q in quantiles:
        c, s = q.snapshot(now)
        count += c
        samples.extend(s)
    return _result(count, samples, percentiles)
