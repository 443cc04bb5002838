#!/usr/bin/env python
"""
The ``nsqtw-stats`` job against DuckDB computing the same per-window rates on the same snapshots.

Generates (or reuses) the export files of ``bench/bench_spark_stats.py``, then, back to back:

* ``nsqtw-stats DATA -q -o OUT --master local[2]`` (and again with ``--html``), as a user runs it;
* the same table with DuckDB (``duckdb`` is a bench-only tool: ``pip install '.[bench]'``), with as
  many threads as the Spark master has cores, written to Parquet too;

each in its own process, timed by wall clock and by the CPU seconds of its whole process tree
(Python driver, JVM, Python workers; sampled from /proc every 0.1 s).  Then it checks that the two
tables agree row for row (every node/topic/channel/window: the rates, depths, backlogs, restarts,
drain states and e2e p99/p50) and prints the figures and the ratio.

    python bench/spark_vs_duckdb.py                                 # 4 nodes x 6 h (734 MB)
    python bench/spark_vs_duckdb.py --nodes 14 --data /tmp/stats-2g # 2.57 GB, the issue's size
    python bench/spark_vs_duckdb.py --duckdb-only DATA OUT          # just the DuckDB side
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))

# The job's semantics (nsqtw/spark/stats.py's compute_stats) in DuckDB's SQL: the node's previous
# snapshot, lag per series, resets and restarts, the interval spread over the windows it overlaps.
_E2E = "STRUCT(count BIGINT, percentiles STRUCT(quantile DOUBLE, value DOUBLE)[])"
_CHANNEL = ("STRUCT(channel_name VARCHAR, depth BIGINT, in_flight_count BIGINT, deferred_count BIGINT, "
            f"message_count BIGINT, requeue_count BIGINT, timeout_count BIGINT, client_count BIGINT, e2e_processing_latency {_E2E})")
_TOPIC = (f"STRUCT(topic_name VARCHAR, depth BIGINT, message_count BIGINT, message_bytes BIGINT, "
          f"e2e_processing_latency {_E2E}, channels {_CHANNEL}[])")
COLUMNS = {"timestamp": "DOUBLE", "node": "STRUCT(broadcast_address VARCHAR, hostname VARCHAR, http_port INTEGER)",
           "stats": f"STRUCT(start_time BIGINT, topics {_TOPIC}[])"}

SQL = """
WITH snaps AS (
  SELECT timestamp AS t, node.broadcast_address || ':' || CAST(node.http_port AS VARCHAR) AS node,
         node.hostname AS hostname, CAST(stats.start_time AS DOUBLE) AS start_time, stats.topics AS topics
  FROM read_json({files}, format = 'newline_delimited', columns = {columns}, maximum_object_size = 1073741824)
  WHERE timestamp IS NOT NULL AND stats IS NOT NULL
), base AS (
  SELECT t, node, hostname, start_time,
         max(t) OVER nw AS node_p_t, last(start_time) OVER nw AS node_p_start_time,
         unnest(topics) AS tp
  FROM snaps
  WINDOW nw AS (PARTITION BY node ORDER BY CAST(round(t * 1000) AS BIGINT)
                RANGE BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
), rows AS (
  SELECT t, node, hostname, start_time, node_p_t, node_p_start_time, tp.topic_name AS topic,
         unnest(list_concat(
           [{{'channel': '', 'msg': tp.message_count, 'bytes': tp.message_bytes, 'req': NULL::BIGINT,
             'tmo': NULL::BIGINT, 'depth': tp.depth, 'backlog': tp.depth, 'clients': NULL::BIGINT,
             'e2e': tp.e2e_processing_latency.percentiles}}],
           list_transform(coalesce(tp.channels, []), lambda c: {{'channel': c.channel_name, 'msg': c.message_count,
             'bytes': NULL::BIGINT, 'req': c.requeue_count, 'tmo': c.timeout_count, 'depth': c.depth,
             'backlog': c.depth + c.in_flight_count + c.deferred_count, 'clients': c.client_count,
             'e2e': c.e2e_processing_latency.percentiles}})), recursive := true)
  FROM base
), lagged AS (
  SELECT *, lag(t) OVER w AS l_t, lag(start_time) OVER w AS l_start_time, lag(msg) OVER w AS l_msg,
         lag(bytes) OVER w AS l_bytes, lag(req) OVER w AS l_req, lag(tmo) OVER w AS l_tmo,
         lag(backlog) OVER w AS l_backlog
  FROM rows WINDOW w AS (PARTITION BY node, topic, channel ORDER BY t)
), x AS (
  SELECT *, (l_t IS NULL AND node_p_t IS NOT NULL) AS new FROM lagged WHERE l_t IS NULL OR t > l_t
), x2 AS (
  SELECT * EXCLUDE (l_t, l_start_time, l_msg, l_bytes, l_req, l_tmo, l_backlog),
    CASE WHEN new THEN (CASE WHEN msg IS NOT NULL THEN 0 END) ELSE l_msg END AS p_msg,
    CASE WHEN new THEN (CASE WHEN bytes IS NOT NULL THEN 0 END) ELSE l_bytes END AS p_bytes,
    CASE WHEN new THEN (CASE WHEN req IS NOT NULL THEN 0 END) ELSE l_req END AS p_req,
    CASE WHEN new THEN (CASE WHEN tmo IS NOT NULL THEN 0 END) ELSE l_tmo END AS p_tmo,
    CASE WHEN new THEN (CASE WHEN backlog IS NOT NULL THEN 0 END) ELSE l_backlog END AS p_backlog,
    CASE WHEN new THEN node_p_start_time ELSE l_start_time END AS p_start_time,
    CASE WHEN new THEN node_p_t ELSE l_t END AS p_t
  FROM x
), f AS (
  SELECT *,
    start_time != p_start_time AS restart,
    (msg < p_msg) OR coalesce(bytes < p_bytes, false) OR coalesce(req < p_req, false)
      OR coalesce(tmo < p_tmo, false) AS decreased,
    coalesce((msg < 0) OR (bytes < 0) OR (req < 0) OR (tmo < 0) OR (depth < 0) OR (backlog < 0), false) AS negative,
    coalesce((p_msg < 0) OR (p_bytes < 0) OR (p_req < 0) OR (p_tmo < 0) OR (p_backlog < 0), false) AS p_negative
  FROM x2
), g AS (
  SELECT *, coalesce(restart OR decreased, false) AS reset,
    negative OR (p_t IS NOT NULL AND coalesce(decreased AND NOT restart, false)) AS anomaly,
    p_t IS NOT NULL AND NOT negative AND NOT p_negative {gap_clause} AS usable,
    restart AND start_time > p_t AND start_time < t AS restarted_inside
  FROM f
), y AS (
  SELECT node, topic, channel, t, hostname, depth, backlog, clients, e2e,
    CASE WHEN usable THEN (CASE WHEN restarted_inside THEN start_time ELSE p_t END) END AS a,
    floor(t / {w}) AS own,
    CASE WHEN usable THEN CAST(CASE WHEN reset THEN msg ELSE msg - p_msg END AS DOUBLE) END AS d_msg,
    CASE WHEN usable THEN CAST(CASE WHEN reset THEN bytes ELSE bytes - p_bytes END AS DOUBLE) END AS d_bytes,
    CASE WHEN usable THEN CAST(CASE WHEN reset THEN req ELSE req - p_req END AS DOUBLE) END AS d_req,
    CASE WHEN usable THEN CAST(CASE WHEN reset THEN tmo ELSE tmo - p_tmo END AS DOUBLE) END AS d_tmo,
    CASE WHEN usable THEN CAST(backlog - p_backlog AS DOUBLE) END AS d_backlog,
    CASE WHEN usable AND reset THEN 1 ELSE 0 END AS reset_n,
    CASE WHEN anomaly THEN 1 ELSE 0 END AS anomaly_n,
    CASE WHEN usable AND coalesce(restarted_inside, false) THEN floor(start_time / {w}) ELSE floor(t / {w}) END AS reset_k
  FROM g
), y2 AS (
  SELECT *, CASE WHEN channel != '' THEN greatest(d_msg - d_backlog, 0.0) END AS d_fin,
    unnest(range(CAST(least(CASE WHEN a IS NOT NULL THEN floor(a / {w}) ELSE own END, own) AS BIGINT),
                 CAST(own AS BIGINT) + 1)) AS k
  FROM y
), z AS (
  SELECT *, k = own AS sample,
    CASE WHEN a IS NOT NULL THEN greatest(least(t, (k + 1) * {w}) - greatest(a, k * {w}), 0.0) ELSE 0.0 END AS ov
  FROM y2
), z2 AS (
  SELECT *, CASE WHEN a IS NOT NULL THEN ov / (t - a) END AS wgt FROM z
), agg AS (
  SELECT node, topic, channel, k,
    count(CASE WHEN sample THEN 1 END) AS samples,
    arg_max(hostname, CASE WHEN sample THEN t END) AS hostname,
    max(CASE WHEN sample THEN depth END) AS depth_max,
    avg(CASE WHEN sample THEN depth END) AS depth_mean,
    arg_max(backlog, CASE WHEN sample THEN t END) AS backlog_last,
    arg_max(depth, CASE WHEN sample THEN t END) AS depth_last,
    max(CASE WHEN sample THEN clients END) AS clients_max,
    avg(CASE WHEN sample THEN clients END) AS clients_mean,
    max(CASE WHEN sample THEN list_max(list_transform(list_filter(e2e, lambda p: p.quantile = 0.99), lambda p: p.value)) END) / 1e6 AS e2e_p99_ms,
    max(CASE WHEN sample THEN list_max(list_transform(list_filter(e2e, lambda p: p.quantile = 0.5), lambda p: p.value)) END) / 1e6 AS e2e_p50_ms,
    sum(ov) AS covered_s,
    sum(d_msg * wgt) AS published, sum(d_bytes * wgt) AS published_bytes, sum(d_fin * wgt) AS finished,
    sum(d_req * wgt) AS requeued, sum(d_tmo * wgt) AS timed_out, sum(d_backlog * wgt) AS backlog_change,
    sum(CASE WHEN k = reset_k THEN reset_n ELSE 0 END) AS restarts,
    sum(CASE WHEN sample THEN anomaly_n ELSE 0 END) AS counter_anomalies
  FROM z2 GROUP BY node, topic, channel, k
), s AS (
  SELECT *, CASE WHEN covered_s > 0 THEN backlog_change / covered_s END AS backlog_growth_rate,
    CASE WHEN backlog_last IS NULL THEN NULL WHEN backlog_last = 0 THEN 'empty'
         WHEN depth_last = 0 THEN 'keeping up' WHEN NOT covered_s > 0 THEN NULL
         WHEN abs(backlog_change) < 0.5 THEN 'keeping up' WHEN backlog_change < 0 THEN 'draining'
         ELSE 'growing' END AS drain_state,
    CASE WHEN covered_s > 0 THEN finished / covered_s END AS finish_rate
  FROM agg
)
SELECT CAST(to_timestamp(k * {w}) AS DATE) AS date, to_timestamp(k * {w}) AS window_start,
  to_timestamp((k + 1) * {w}) AS window_end, node, hostname, topic,
  CASE WHEN channel = '' THEN NULL ELSE channel END AS channel,
  CASE WHEN channel = '' THEN 'topic' ELSE 'channel' END AS level, samples, covered_s,
  CASE WHEN covered_s > 0 THEN published END AS published,
  CASE WHEN covered_s > 0 THEN published / covered_s END AS publish_rate,
  CASE WHEN channel = '' AND covered_s > 0 THEN published_bytes / covered_s END AS publish_bytes_rate,
  CASE WHEN covered_s > 0 THEN finished END AS finished, finish_rate,
  CASE WHEN covered_s > 0 THEN requeued END AS requeued,
  CASE WHEN covered_s > 0 THEN requeued / covered_s END AS requeue_rate,
  CASE WHEN covered_s > 0 THEN timed_out END AS timed_out,
  CASE WHEN covered_s > 0 THEN timed_out / covered_s END AS timeout_rate,
  depth_max, depth_mean, depth_last, backlog_last, backlog_growth_rate, drain_state,
  CASE WHEN drain_state = 'empty' THEN 0.0
       WHEN drain_state = 'draining' THEN backlog_last / -backlog_growth_rate
       WHEN drain_state = 'keeping up' AND finish_rate > 0 THEN backlog_last / finish_rate END AS time_to_drain_s,
  clients_max, clients_mean, e2e_p99_ms, e2e_p50_ms, restarts, counter_anomalies
FROM s
"""


def _files(data: str, pattern: str = "nsqd-stats.*") -> list[str]:
    import fnmatch

    return sorted(os.path.join(data, n) for n in os.listdir(data) if fnmatch.fnmatchcase(n, pattern))


def duckdb_stats(data: str, out: str, window: float = 60.0, max_gap: float = 3600.0, threads: int = 2) -> int:
    """The job's table with DuckDB, written to ``out`` (one Parquet file); returns its rows."""
    import duckdb

    con = duckdb.connect()
    con.execute(f"SET threads = {int(threads)}")
    con.execute("SET TimeZone = 'UTC'")
    columns = "{" + ", ".join(f"'{k}': '{v}'" for k, v in COLUMNS.items()) + "}"
    files = "[" + ", ".join("'" + f.replace("'", "''") + "'" for f in _files(data)) + "]"
    gap = f"AND (t - p_t) <= {float(max_gap)}" if max_gap > 0 else ""
    query = SQL.format(files=files, columns=columns, w=float(window), gap_clause=gap)
    con.execute(f"COPY ({query}) TO '{out}' (FORMAT parquet)")
    return int(con.execute(f"SELECT count(*) FROM read_parquet('{out}')").fetchone()[0])


class TreeCPU:
    """CPU seconds (user + system) of a process and all its descendants, sampled from /proc."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.seen: dict[tuple[int, int], float] = {}  # (pid, start time) -> latest CPU seconds
        self.tick = os.sysconf("SC_CLK_TCK")

    def sample(self) -> None:
        parent: dict[int, int] = {}
        stat: dict[int, list[str]] = {}
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/stat") as f:
                    parts = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parent[int(pid)] = int(parts[1])
            stat[int(pid)] = parts
        tree = {self.root}
        grew = True
        while grew:
            grew = False
            for pid, ppid in parent.items():
                if ppid in tree and pid not in tree:
                    tree.add(pid)
                    grew = True
        for pid in tree:
            parts = stat.get(pid)
            if parts:  # fields after the name: 11 utime, 12 stime, 19 starttime (0-based)
                self.seen[(pid, int(parts[19]))] = (int(parts[11]) + int(parts[12])) / self.tick

    @property
    def total(self) -> float:
        return sum(self.seen.values())


def timed(cmd: list[str], env: dict[str, str] | None = None) -> dict[str, float]:
    """Run ``cmd``; its wall time and the CPU seconds of its process tree."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    cpu = TreeCPU(proc.pid)
    while proc.poll() is None:
        cpu.sample()
        time.sleep(0.1)
    wall = time.monotonic() - t0
    out, err = proc.stdout.read(), proc.stderr.read()  # type: ignore[union-attr]  # both are pipes
    if proc.returncode:
        raise SystemExit(f"{cmd[0]} failed ({proc.returncode}):\n{err.decode()[-3000:]}\n{out.decode()[-2000:]}")
    return {"wall_s": round(wall, 1), "cpu_s": round(cpu.total, 1)}


def warm_up(stats_cmd: list[str], env: dict[str, str]) -> None:
    """The class archive of ``stats_cmd``'s tree built before the timed runs (untimed; a tree without
    the warm-up command, an older one, is left as it is): without it the first run would build it in
    the background while the next runs are timed."""
    if stats_cmd[-1] == "stats" and "nsqtw.spark" in stats_cmd:
        cmd = stats_cmd[:-1] + ["warm-up"]
    elif os.path.basename(stats_cmd[-1]) == "nsqtw-stats":
        cmd = [os.path.join(os.path.dirname(stats_cmd[-1]), "python"), "-m", "nsqtw.spark", "warm-up"]
    else:
        return
    subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


COMPARED = ("samples", "covered_s", "published", "publish_rate", "publish_bytes_rate", "finished", "finish_rate",
            "requeue_rate", "timeout_rate", "depth_max", "depth_mean", "depth_last", "backlog_last",
            "backlog_growth_rate", "time_to_drain_s", "clients_max", "clients_mean", "restarts", "counter_anomalies")


def compare(spark_out: str, duck_out: str) -> dict[str, int]:
    """Row-for-row agreement of the two tables (relative tolerance 1e-9); returns the counts."""
    import duckdb

    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    con.execute(f"CREATE VIEW sp AS SELECT * FROM read_parquet('{spark_out}/**/*.parquet', hive_partitioning = true)")
    con.execute(f"CREATE VIEW dk AS SELECT * FROM read_parquet('{duck_out}')")
    key = "sp.node = dk.node AND sp.topic = dk.topic AND sp.channel IS NOT DISTINCT FROM dk.channel " \
          "AND sp.window_start = dk.window_start"

    def differs(c: str) -> str:
        return (f"(sp.{c} IS DISTINCT FROM dk.{c} AND NOT (abs(sp.{c} - dk.{c}) "
                f"<= 1e-9 * greatest(abs(sp.{c}), abs(dk.{c}), 1e-300)))")

    checks = [differs(c) for c in COMPARED] + [
        "sp.drain_state IS DISTINCT FROM dk.drain_state", "sp.hostname IS DISTINCT FROM dk.hostname",
        "sp.e2e_ms['0.99'] IS DISTINCT FROM dk.e2e_p99_ms", "sp.e2e_ms['0.5'] IS DISTINCT FROM dk.e2e_p50_ms"]
    n_sp = con.execute("SELECT count(*) FROM sp").fetchone()[0]  # type: ignore[index]  # count(*) is one row
    n_dk = con.execute("SELECT count(*) FROM dk").fetchone()[0]  # type: ignore[index]  # count(*) is one row
    matched = con.execute(f"SELECT count(*) FROM sp JOIN dk ON {key}").fetchone()[0]  # type: ignore[index]  # one row
    bad = con.execute(f"SELECT count(*) FROM sp JOIN dk ON {key} WHERE {' OR '.join(checks)}").fetchone()[0]  # type: ignore[index]  # one row
    if bad:
        sample = con.execute(f"SELECT sp.node, sp.topic, sp.channel, sp.window_start FROM sp JOIN dk ON {key} "
                             f"WHERE {' OR '.join(checks)} LIMIT 5").fetchall()
        print("differing rows, e.g.:", sample, file=sys.stderr)
    return {"spark_rows": int(n_sp), "duckdb_rows": int(n_dk), "matched": int(matched), "differing": int(bad)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "nsqtw-bench-stats-734"))
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--topics", type=int, default=50)
    p.add_argument("--channels", type=int, default=2)
    p.add_argument("--hours", type=int, default=6)
    p.add_argument("--interval", type=int, default=10)
    p.add_argument("--cores", type=int, default=2, help="local[N] for Spark, threads for DuckDB (default 2)")
    p.add_argument("--no-html", action="store_true", help="skip the --html run")
    p.add_argument("--stats", default=os.path.join(os.path.dirname(sys.executable), "nsqtw-stats"),
                   help="the nsqtw-stats command to run, split as a shell would (default: the one beside this Python)")
    p.add_argument("--before", default="", metavar="COMMAND",
                   help="another nsqtw-stats command (an older tree: 'env PYTHONPATH=/tmp/old python -m nsqtw.spark "
                        "stats'), run back to back with --stats on the same input: before/after figures")
    p.add_argument("--cold", action="store_true",
                   help="no class archive (NSQTW_SPARK_CLASS_ARCHIVE=off): every run as a first run on a fresh "
                        "machine; by default each command's warm-up (python -m nsqtw.spark warm-up) runs first, "
                        "untimed, so that the runs measured start as every run after the first does")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--duckdb-only", nargs=2, metavar=("DATA", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.duckdb_only:
        print(duckdb_stats(args.duckdb_only[0], args.duckdb_only[1], threads=args.cores))
        return
    from bench_spark_stats import generate

    gen = generate(args.data, args.nodes, args.topics, args.channels, args.hours, args.interval)
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    work = tempfile.mkdtemp(prefix="nsqtw-spark-vs-duckdb-")
    figures: dict[str, object] = {"input_mb": round(gen["bytes"] / 1e6), "cores": args.cores}
    try:
        duck_out = os.path.join(work, "duck.parquet")
        figures["duckdb"] = timed([sys.executable, __file__, "--cores", str(args.cores),
                                   "--duckdb-only", args.data, duck_out], env)
        runs = [("stats", shlex.split(args.stats))]
        if args.before:
            runs.insert(0, ("before_stats", shlex.split(args.before)))
        if args.cold:
            env["NSQTW_SPARK_CLASS_ARCHIVE"] = "off"
        else:
            for _name, cmd in runs:
                warm_up(cmd, env)
        for suffix, extra in [("", [])] + ([] if args.no_html else [("_html", ["--html"])]):
            for name, cmd in runs:
                out_dir = os.path.join(work, name + suffix)
                more = [extra[0], out_dir + ".html"] if extra else []
                figures[name + suffix] = timed(cmd + [args.data, "-q", "--master", f"local[{args.cores}]",
                                                      "-o", out_dir] + more, env)
        spark_out = os.path.join(work, "stats")
        figures["agreement"] = compare(spark_out, duck_out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    d, s = figures["duckdb"], figures["stats"]
    figures["stats_over_duckdb_wall"] = round(s["wall_s"] / d["wall_s"], 2)  # type: ignore[index]  # dicts above
    if "before_stats" in figures:
        figures["before_over_duckdb_wall"] = round(figures["before_stats"]["wall_s"] / d["wall_s"], 2)  # type: ignore[index]  # dicts above
    if "stats_html" in figures:
        figures["html_extra_wall_pct"] = round(100 * (figures["stats_html"]["wall_s"] / s["wall_s"] - 1))  # type: ignore[index]  # dicts above
        figures["html_extra_cpu_pct"] = round(100 * (figures["stats_html"]["cpu_s"] / s["cpu_s"] - 1))  # type: ignore[index]  # dicts above
    if args.json:
        print(json.dumps(figures))
    else:
        for k, v in figures.items():
            print(f"{k:>24}: {v}")
    agreement = figures["agreement"]
    if agreement["differing"] or agreement["matched"] != agreement["spark_rows"]:  # type: ignore[index]  # dict above
        raise SystemExit("the two tables do not agree")


if __name__ == "__main__":
    main()
