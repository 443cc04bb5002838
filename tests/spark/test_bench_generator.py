"""bench/bench_spark_stats.py writes what nsqd writes: counters never below zero, and never going
down except across the node's restart (it once wrote -700 msg/s windows into the HTML report)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_counters_are_monotonic_between_restarts(tmp_path) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import bench_spark_stats as bench
    finally:
        sys.path.remove(str(ROOT / "bench"))
    # node 0's restart is in hour 0 (restart_hour 0, at :30): the hour the old formula went negative in
    bench._write_hour((str(tmp_path), 0, 0, 12, 1, 10, 0))
    last: dict[str, tuple[int, int]] = {}
    lines = (tmp_path / next(p.name for p in tmp_path.iterdir())).read_text().splitlines()
    assert len(lines) > 300
    for ln in lines:
        doc = json.loads(ln)
        start = doc["stats"]["start_time"]
        for t in doc["stats"]["topics"]:
            msg = t["message_count"]
            assert msg >= 0, (t["topic_name"], msg)
            prev = last.get(t["topic_name"])
            if prev is not None and prev[0] == start:
                assert msg >= prev[1], (t["topic_name"], prev, msg)
            last[t["topic_name"]] = (start, msg)
