#!/usr/bin/env python
"""
What an embedded broker costs its host's reactor: the lateness of a 10 ms LoopingCall.

The host runs a ``LoopingCall`` every 10 ms for ``--seconds`` alone (the baseline: the
machine's own noise), then starts one embedded broker (``start_nsqd()``, ``start_nsqlookupd()``
or ``start_nsqadmin()``, or all three), and watches the same loop for ``--seconds`` more.
Prints, for each phase, the worst lateness and the 99th percentile in milliseconds, how long the
start itself took (the start's cost belongs inside it: the loop cannot tick while it runs), the
threads the start left alive, and whether the collector's settings changed.

    python bench/bench_embed_stall.py                    # nsqd, 3 s each phase
    python bench/bench_embed_stall.py --broker all --seconds 5 --rounds 3

The tests never assert a time; they assert what this figure depends on (no thread, no trim loop,
no collector change, the HTTP site built inside the start: tests/process/).
"""

from __future__ import annotations

import argparse
import gc
import sys
import threading
import time
from typing import Any

from twisted.internet import defer, task

sys.path.insert(0, ".")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


async def start(broker: str) -> list[Any]:
    from nsqtw.embed import start_nsqd, start_nsqlookupd
    from nsqtw.embed import start_nsqadmin

    handles: list[Any] = []
    if broker in ("nsqd", "all"):
        handles.append(await start_nsqd())
    if broker in ("nsqlookupd", "all"):
        handles.append(await start_nsqlookupd())
    if broker in ("nsqadmin", "all"):
        handles.append(await start_nsqadmin(nsqd_http_addresses=["127.0.0.1:1"]))
    return handles


async def one_round(reactor: Any, broker: str, seconds: float) -> dict[str, Any]:
    late: list[float] = []
    last = [time.perf_counter()]

    def tick() -> None:
        now = time.perf_counter()
        late.append(now - last[0] - 0.01)
        last[0] = now

    loop = task.LoopingCall(tick)
    loop.start(0.01)
    await task.deferLater(reactor, seconds, lambda: None)
    baseline = list(late)
    gc_before = (gc.get_threshold(), gc.get_freeze_count(), list(gc.callbacks))
    threads_before = set(threading.enumerate())
    t0 = time.perf_counter()
    handles = await start(broker)
    start_ms = (time.perf_counter() - t0) * 1000
    late.clear()
    last[0] = time.perf_counter()
    await task.deferLater(reactor, seconds, lambda: None)
    loop.stop()
    after = list(late)
    added = sorted(t.name for t in set(threading.enumerate()) - threads_before if t.is_alive())
    gc_changed = (gc.get_threshold(), gc.get_freeze_count(), list(gc.callbacks)) != gc_before
    for h in handles:
        await h.stop()
    return {"baseline_ms": max(baseline) * 1000, "baseline_p99_ms": percentile(baseline, 0.99) * 1000,
            "start_ms": start_ms, "stall_ms": max(after) * 1000, "stall_p99_ms": percentile(after, 0.99) * 1000,
            "threads_added": added, "gc_changed": gc_changed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--broker", choices=("nsqd", "nsqlookupd", "nsqadmin", "all"), default="nsqd")
    parser.add_argument("--seconds", type=float, default=3.0, help="each phase (default 3)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds in one process (the first imports)")
    args = parser.parse_args()
    from twisted.internet import reactor

    async def run() -> None:
        try:
            for i in range(args.rounds):
                r = await one_round(reactor, args.broker, args.seconds)
                print(f"round {i + 1} {args.broker}: baseline max {r['baseline_ms']:.1f} ms "
                      f"(p99 {r['baseline_p99_ms']:.1f}); start {r['start_ms']:.1f} ms; after start max "
                      f"{r['stall_ms']:.1f} ms (p99 {r['stall_p99_ms']:.1f}); threads added "
                      f"{r['threads_added'] or 'none'}; gc changed {r['gc_changed']}")
        finally:
            reactor.stop()

    reactor.callWhenRunning(lambda: defer.ensureDeferred(run()))
    reactor.run()


if __name__ == "__main__":
    main()
