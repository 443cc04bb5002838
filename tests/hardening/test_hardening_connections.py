"""
Many concurrent connections with heartbeats held by one broker process, measured by
``bench/bench_connections.py`` (nsqd as a subprocess, one selectors-based client process):
every connection stays subscribed, answers heartbeats, and receives exactly one message;
the broker's RSS per connection and its idle CPU stay small.  The default run holds 300
connections; the ``slow`` run holds 1,000 (the figures in the report).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from hardening_support import REPO

pytestmark = pytest.mark.e2e

BENCH = os.path.join(REPO, "bench", "bench_connections.py")


def run_bench(connections: int, idle: float, *extra: str) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    out = subprocess.run([sys.executable, BENCH, f"--connections={connections}", "--heartbeat-ms=1000",
                          f"--idle={idle}", "--json", *extra], capture_output=True, text=True, timeout=300, env=env)
    assert out.stdout.strip(), out.stderr[-3000:]
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    print("CONNECTIONS", json.dumps(figures, sort_keys=True))
    return figures




def check_held(fig: dict[str, Any], n: int) -> None:
    assert fig["subscribed"] == n and fig["closed_by_broker"] == 0 and fig["errors"] == []
    assert fig["heartbeats_per_connection_per_second"] >= 0.8  # 1 s heartbeats, each answered with NOP
    assert fig["all_delivered"] and fig["bodies_ok"] and fig["max_messages_on_one_connection"] == 1
    assert fig["channel_finish_in_flight"] == 0 and fig["channel_depth"] == 0
    assert fig["rss_kib_per_connection"] < 64
    assert fig["cpu_percent_idle"] < 60


def test_300_connections_with_heartbeats():
    """300 connections with 1 s heartbeats: all answered, each gets exactly one message; RSS and CPU small."""
    check_held(run_bench(300, 2.0), 300)


def test_connection_burst_is_accepted_promptly():
    """300 clients connecting at once are all accepted and subscribed (none refused by a full
    accept queue); how fast is printed, not asserted (a loaded machine would fail a time bar)."""
    fig = run_bench(300, 0.5, "--wave=0", "--connect-timeout=5")
    print("CONNECTION_BURST", fig["connect_latency_ms"])
    assert fig["subscribed"] == 300 and fig["errors"] == []


@pytest.mark.slow
def test_1000_connections_with_heartbeats():
    """1,000 connections with 1 s heartbeats held by one nsqd process, 5 s idle, then one message each."""
    fig = run_bench(1000, 5.0)
    check_held(fig, 1000)
