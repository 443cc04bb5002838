#!/usr/bin/env python
"""
Spark stats job benchmark: one day of 10-second /stats snapshots from 10 nodes, 50 topics each.

Generates the export files once (``nsqd-stats.<hour>.<node>.jsonl``, the exact
``--stats-export-path`` format: topics with 2 channels and 1 client each,
e2e percentiles, one broker restart per node at a random hour and 0.5% missing
snapshots), then runs the ``nsqtw-stats`` job on them (read, per-window rates
with lag over node/topic/channel, Parquet output partitioned by date) and
prints wall time, input size, rows and the peak resident memory of the whole
process tree (Python driver + JVM + Python workers, sampled every 0.25 s).

    python bench/bench_spark_stats.py                     # local[2], data in /tmp/nsqtw-bench-stats
    python bench/bench_spark_stats.py --master local[*] --nodes 2 --hours 2
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import random
import shutil
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

DAY0 = 1_700_006_400  # 2023-11-15T00:00:00Z

_CLIENT = ('{"client_id":"worker-%(n)d","hostname":"worker-%(n)d.example","version":"V2",'
           '"remote_address":"10.1.0.%(n)d:%(port)d","state":3,"ready_count":%(rdy)d,"in_flight_count":%(inf)d,'
           '"message_count":%(cmsg)d,"finish_count":%(cfin)d,"requeue_count":%(creq)d,"connect_ts":%(cts)d,'
           '"sample_rate":0,"deflate":false,"snappy":false,"user_agent":"go-nsq/1.1.0","tls":false,'
           '"tls_cipher_suite":"","tls_version":"","tls_negotiated_protocol":"",'
           '"tls_negotiated_protocol_is_mutual":false}')
_CHANNEL = ('{"channel_name":"%(name)s","depth":%(depth)d,"backend_depth":%(bdepth)d,"in_flight_count":%(inf)d,'
            '"deferred_count":%(deferred)d,"message_count":%(msg)d,"requeue_count":%(req)d,'
            '"timeout_count":%(tmo)d,"client_count":1,"clients":[%(client)s],"paused":false,'
            '"e2e_processing_latency":{"count":%(ecount)d,"percentiles":[{"quantile":0.99,"value":%(p99)d},'
            '{"quantile":0.5,"value":%(p50)d}]}}')
_TOPIC = ('{"topic_name":"%(name)s","channels":[%(channels)s],"depth":%(depth)d,"backend_depth":0,'
          '"message_count":%(msg)d,"message_bytes":%(bytes)d,"paused":false,'
          '"e2e_processing_latency":{"count":%(ecount)d,"percentiles":[{"quantile":0.99,"value":%(p99)d},'
          '{"quantile":0.5,"value":%(p50)d}]}}')
_HEAD = ('{"timestamp":%(ts)s,"time":"%(iso)s","node":{"broadcast_address":"%(addr)s","hostname":"%(host)s",'
         '"tcp_port":4150,"http_port":4151},"stats":{"version":"1.3.0","health":"OK","start_time":%(start)d,'
         '"topics":[%(topics)s],"memory":{"heap_objects":123456,"heap_idle_bytes":1048576,'
         '"heap_in_use_bytes":52428800,"heap_released_bytes":0,"gc_pause_usec_100":900,"gc_pause_usec_99":700,'
         '"gc_pause_usec_95":500,"next_gc_bytes":700,"gc_total_runs":%(gc)d},"producers":null}}\n')


def _write_hour(task: tuple[str, int, int, int, int, int, int]) -> tuple[int, int]:
    """Write one node-hour file; returns (lines, bytes)."""
    from datetime import datetime, timezone

    directory, node, hour, topics, channels, interval, restart_hour = task
    rng = random.Random(node * 1000 + hour)
    addr = f"nsqd-{node:02d}.example"
    name = f"nsqd-stats.{datetime.fromtimestamp(DAY0 + hour * 3600, timezone.utc):%Y-%m-%d_%H}.nsqd-{node:02d}_example_4151.jsonl"
    rates = [1 + ((node * 7 + t * 13) % 97) for t in range(topics)]
    restart_at = DAY0 + restart_hour * 3600 + 1800
    lines = []
    for step in range(3600 // interval):
        ts = DAY0 + hour * 3600 + step * interval
        if rng.random() < 0.005:
            continue  # a missing snapshot
        start = DAY0 - 86400 if ts < restart_at else restart_at
        up = ts - start
        topic_parts = []
        for t in range(topics):
            r = rates[t]
            # a monotonic counter whose rate swings between 5/6 and 7/6 of r over the day, counted
            # from the broker's start (so never below zero: it was, after a restart, by up to 1200 r)
            msg = int(r * up + r * 600 * (math.cos(start / 3600.0 + t) - math.cos(ts / 3600.0 + t)))
            chans = []
            for c in range(channels):
                depth = int(abs(r * 30 * math.sin(ts / 1800.0 + c + t)))
                fin = max(0, msg - depth - 5)
                client = _CLIENT % {"n": t * 10 + c, "port": 40000 + t * 10 + c, "rdy": 100, "inf": 5,
                                    "cmsg": fin + 5, "cfin": fin, "creq": up // 100, "cts": start + 5}
                chans.append(_CHANNEL % {"name": f"ch{c}", "depth": depth, "bdepth": depth // 2, "inf": 5,
                                         "deferred": 0, "msg": msg, "req": up // 100, "tmo": up // 1000,
                                         "client": client, "ecount": 100, "p99": 5_000_000 + t * 1000,
                                         "p50": 1_000_000})
            topic_parts.append(_TOPIC % {"name": f"topic{t:02d}", "channels": ",".join(chans), "depth": 0,
                                         "msg": msg, "bytes": msg * 200, "ecount": 200,
                                         "p99": 5_000_000 + t * 1000, "p50": 1_000_000})
        iso = datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")
        lines.append(_HEAD % {"ts": ts, "iso": iso, "addr": addr, "host": addr, "start": start,
                              "topics": ",".join(topic_parts), "gc": up})
    data = "".join(lines).encode()
    with open(os.path.join(directory, name), "wb") as f:
        f.write(data)
    return len(lines), len(data)


def generate(directory: str, nodes: int, topics: int, channels: int, hours: int, interval: int) -> dict[str, int]:
    marker = os.path.join(directory, "PARAMS.json")
    # "generator": bumped when the data changes (2: counters count from the broker's start)
    params = {"nodes": nodes, "topics": topics, "channels": channels, "hours": hours, "interval": interval,
              "generator": 2}
    if os.path.exists(marker):
        with open(marker) as f:
            if json.load(f) == params:
                size = sum(os.path.getsize(os.path.join(directory, n)) for n in os.listdir(directory)
                           if n.endswith(".jsonl"))
                return {"lines": -1, "bytes": size, "generated_s": 0}
        shutil.rmtree(directory)
    os.makedirs(directory, exist_ok=True)
    t0 = time.monotonic()
    tasks = [(directory, n, h, topics, channels, interval, (n * 5 + 3) % hours) for n in range(nodes)
             for h in range(hours)]
    with mp.Pool(os.cpu_count() or 2) as pool:
        results = pool.map(_write_hour, tasks, chunksize=1)
    with open(marker, "w") as f:
        json.dump(params, f)
    return {"lines": sum(r[0] for r in results), "bytes": sum(r[1] for r in results),
            "generated_s": round(time.monotonic() - t0, 1)}


def _tree_rss(root: int) -> tuple[int, int]:
    """(total RSS of root and its descendants, RSS of the biggest java process), bytes."""
    children: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                parts = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/comm") as f:
                names[int(pid)] = f.read().strip()
            children.setdefault(int(parts[1]), []).append(int(pid))
        except OSError:
            continue
    total = java = 0
    stack = [root]
    while stack:
        pid = stack.pop()
        stack.extend(children.get(pid, []))
        try:
            with open(f"/proc/{pid}/statm") as f:
                rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            continue
        total += rss
        if names.get(pid) == "java":
            java = max(java, rss)
    return total, java


class PeakSampler(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak_total = 0
        self.peak_java = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.25):
            total, java = _tree_rss(os.getpid())
            self.peak_total = max(self.peak_total, total)
            self.peak_java = max(self.peak_java, java)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "nsqtw-bench-stats"))
    p.add_argument("--nodes", type=int, default=10)
    p.add_argument("--topics", type=int, default=50)
    p.add_argument("--channels", type=int, default=2)
    p.add_argument("--hours", type=int, default=24)
    p.add_argument("--interval", type=int, default=10)
    p.add_argument("--window", default="1m")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--driver-memory", default="2g")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = p.parse_args()

    gen = generate(args.data, args.nodes, args.topics, args.channels, args.hours, args.interval)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from nsqtw.options import parse_duration
    from nsqtw.spark.session import get_session
    from nsqtw.spark.stats import compute_stats, read_snapshots, summarize

    sampler = PeakSampler()
    sampler.start()
    t0 = time.monotonic()
    spark = get_session("nsqtw-bench-stats", args.master, {"spark.driver.memory": args.driver_memory,
                                                          "spark.ui.enabled": "false"})
    t_session = time.monotonic() - t0
    out = tempfile.mkdtemp(prefix="nsqtw-bench-out-")
    try:
        t1 = time.monotonic()
        result = compute_stats(read_snapshots(spark, [args.data]), parse_duration(args.window))
        result.write.mode("overwrite").partitionBy("date").parquet(os.path.join(out, "stats.parquet"))
        t_job = time.monotonic() - t1
        back = spark.read.parquet(os.path.join(out, "stats.parquet"))
        rows = back.count()
        t2 = time.monotonic()
        series = summarize(back).count()
        t_summary = time.monotonic() - t2
    finally:
        spark.stop()
        sampler.done.set()
        sampler.join()
        shutil.rmtree(out, ignore_errors=True)
    figures = {
        "master": args.master, "nodes": args.nodes, "topics_per_node": args.topics,
        "channels_per_topic": args.channels, "hours": args.hours, "interval_s": args.interval,
        "input_gib": round(gen["bytes"] / 2**30, 2), "generated_s": gen["generated_s"],
        "session_start_s": round(t_session, 1), "job_s": round(t_job, 1), "summary_s": round(t_summary, 1),
        "output_rows": rows, "series": series,
        "peak_rss_tree_mib": sampler.peak_total // 2**20, "peak_rss_jvm_mib": sampler.peak_java // 2**20,
    }
    if args.json:
        print(json.dumps(figures))
    else:
        for k, v in figures.items():
            print(f"{k:>20}: {v}")


if __name__ == "__main__":
    main()
