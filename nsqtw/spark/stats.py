"""
``nsqtw-stats``: rates, depths and latencies over time from ``--stats-export-path`` snapshots.

Reads the JSON Lines snapshots that nsqd nodes write (local paths or any
Hadoop-compatible URI, handed to Spark's reader as they are) and computes,
per node, topic, channel and time window (default 1 minute):

* ``publish_rate``: messages/s into the topic (topic rows) or channel (channel
  rows), from ``message_count`` deltas; ``publish_bytes_rate`` for topics.
* ``finish_rate``: messages/s that left the channel for good.  nsqd has no
  channel finish counter, and the clients' ``finish_count`` disappears with
  each disconnecting client (and is absent with ``include_clients=false``), so
  the rate comes from conservation of the channel's messages: every message put
  to the channel (``message_count``) is still queued (``depth``), in flight,
  deferred, or gone::

      finished = Δmessage_count − Δ(depth + in_flight_count + deferred_count)

  "Gone" is FIN, but also messages dropped by ``/channel/empty``, by
  ``sample_rate`` or by an ephemeral channel's overflow (and, across an unclean
  restart, messages lost with the process).  Requeues and timeouts move
  messages between in-flight and depth, so they cancel out.
* ``requeue_rate``, ``timeout_rate``: ``requeue_count``/``timeout_count`` deltas.
* ``depth_max``, ``depth_mean`` (over the window's snapshots), ``depth_last``,
  ``backlog_last`` (depth + in-flight + deferred; the topic's depth for topic
  rows), ``backlog_growth_rate`` (Δbacklog/s, = publish_rate − finish_rate),
  ``drain_state`` and ``time_to_drain_s``: "empty" (0 s); "keeping up" when
  nothing waits in the queue (depth 0: the backlog is what is in flight or
  deferred) or the backlog did not change (by less than half a message over
  the window), drain time = backlog / finish rate; "draining" when it shrinks,
  backlog / shrink rate; "growing" when it grows (null: it never drains at
  this rate).
* ``e2e_ms``: for each configured percentile, the worst value (ms) that nsqd
  reported in the window (nsqd's percentiles are already windowed).
* ``clients_max``, ``clients_mean``; ``restarts`` (counter resets seen).

Counters are differenced with ``lag`` over (node, topic, channel) ordered by
time.  A broker restart (``start_time`` changes) or a counter that decreases
(topic deleted and re-created) is a reset: the delta is the new value, and
after a restart only the time since ``start_time`` counts (``restarts``
counts it in the window holding ``start_time``).  A series first seen in a
node's snapshot was created since the node's previous snapshot: that first
interval counts from zero (a new channel's taken-over backlog is arrivals).  A gap (missing
snapshots) is fine: each delta is spread over the windows its interval
overlaps, in proportion to the overlap, so rates stay right; intervals longer
than ``--max-gap`` (default 1h) are not trusted for rates.  Topic-level rows
have ``channel`` null and ``level`` "topic".  Output: Parquet partitioned by
``date`` (dynamic partition overwrite), a summary table on stdout, and with
``--html`` a one-page report with inline SVG charts.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any
from collections.abc import Sequence

from ..options import OptionError, parse_duration
from .cli import InputError, Progress, UsageError, add_common_arguments, check_local_inputs, describe_error, error_class, run_main
from .report import SUMMARY_COLUMNS, format_summary, render_report, summary_table, utc_text
from .session import add_spark_arguments, get_session, parse_conf

__all__ = ["SNAPSHOT_SCHEMA", "read_snapshots", "snapshot_rows", "compute_stats", "summarize",
           "format_summary", "summary_table", "SUMMARY_COLUMNS", "chart_series", "chart_marks", "main"]

_E2E = "STRUCT<count: BIGINT, percentiles: ARRAY<STRUCT<quantile: DOUBLE, value: DOUBLE>>>"
_CHANNEL = ("STRUCT<channel_name: STRING, depth: BIGINT, backend_depth: BIGINT, in_flight_count: BIGINT, "
            "deferred_count: BIGINT, message_count: BIGINT, requeue_count: BIGINT, timeout_count: BIGINT, "
            f"client_count: BIGINT, paused: BOOLEAN, e2e_processing_latency: {_E2E}>")
_TOPIC = ("STRUCT<topic_name: STRING, depth: BIGINT, backend_depth: BIGINT, message_count: BIGINT, "
          f"message_bytes: BIGINT, paused: BOOLEAN, e2e_processing_latency: {_E2E}, channels: ARRAY<{_CHANNEL}>>")
#: The parts of an export line the job reads (Spark prunes the rest while parsing).
SNAPSHOT_SCHEMA = ("timestamp DOUBLE, node STRUCT<broadcast_address: STRING, hostname: STRING, tcp_port: INT, "
                   f"http_port: INT>, stats STRUCT<start_time: BIGINT, health: STRING, topics: ARRAY<{_TOPIC}>>")

KEYS = ["node", "topic", "channel"]
DEFAULT_PATTERN = "nsqd-stats.*"


def read_snapshots(spark: Any, paths: Sequence[str], pattern: str | None = DEFAULT_PATTERN) -> Any:
    """Export lines from files or directories (any Hadoop URI); a torn last line is dropped."""
    reader = spark.read.schema(SNAPSHOT_SCHEMA).option("mode", "DROPMALFORMED")
    if pattern:
        reader = reader.option("pathGlobFilter", pattern)
    return reader.json(list(paths))


def snapshot_rows(snapshots: Any) -> Any:
    """One row per snapshot and topic (channel ``""``) or channel, with counters and gauges (one scan).

    Each row also carries its node's previous snapshot (``node_p_t``, ``node_p_start_time``): a topic
    or channel first seen in a snapshot was created since then, so its first counts are not lost.
    The node window partitions by node, which the per-series window then reuses (no second shuffle).
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    snaps = snapshots.where(F.col("timestamp").isNotNull() & F.col("stats").isNotNull()).select(
        F.col("timestamp").alias("t"),
        F.concat_ws(":", F.col("node.broadcast_address"), F.col("node.http_port").cast("string")).alias("node"),
        F.col("node.hostname").alias("hostname"),
        F.col("stats.start_time").cast("double").alias("start_time"),
        F.col("stats.topics").alias("topics"),
    )
    # the node's previous snapshot strictly before this one (a duplicated line is not "previous")
    before = (Window.partitionBy("node").orderBy(F.round(F.col("t") * 1000).cast("long"))
              .rangeBetween(Window.unboundedPreceding, -1))
    base = snaps.select(
        "t", "node", "hostname", "start_time",
        F.max("t").over(before).alias("node_p_t"),
        F.last("start_time").over(before).alias("node_p_start_time"),
        F.explode("topics").alias("tp"),
    )
    null_long = F.lit(None).cast("long")

    def entry(channel: Any, msg: Any, nbytes: Any, req: Any, tmo: Any, depth: Any, backlog: Any,
              clients: Any, e2e: Any) -> Any:
        return F.struct(channel.alias("channel"), msg.alias("msg"), nbytes.alias("bytes"), req.alias("req"),
                        tmo.alias("tmo"), depth.alias("depth"), backlog.alias("backlog"),
                        clients.alias("clients"), e2e.alias("e2e"))

    tp = F.col("tp")
    topic_entry = entry(F.lit(""), tp["message_count"], tp["message_bytes"], null_long, null_long,
                        tp["depth"], tp["depth"], null_long, tp["e2e_processing_latency"]["percentiles"])
    channel_entries = F.transform(F.coalesce(tp["channels"], F.array()), lambda c: entry(
        c["channel_name"], c["message_count"], null_long, c["requeue_count"], c["timeout_count"], c["depth"],
        c["depth"] + c["in_flight_count"] + c["deferred_count"], c["client_count"],
        c["e2e_processing_latency"]["percentiles"]))
    rows = base.select("t", "node", "hostname", "start_time", "node_p_t", "node_p_start_time",
                       tp["topic_name"].alias("topic"),
                       F.explode(F.concat(F.array(topic_entry), channel_entries)).alias("e"))
    return rows.select("t", "node", "hostname", "start_time", "node_p_t", "node_p_start_time", "topic", "e.*")


def compute_stats(snapshots: Any, window: float = 60.0, max_gap: float = 3600.0) -> Any:
    """The per-window table (see the module docstring) from :func:`read_snapshots`' DataFrame.

    One scan of the input, one shuffle for the ``lag`` window and one for the aggregation: every
    snapshot row is exploded into the pieces of its interval (since the previous snapshot), one per
    window the interval overlaps, plus the piece of its own window that carries its gauges.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if window <= 0:
        raise ValueError("window must be positive")
    W = float(window)
    rows = snapshot_rows(snapshots)
    w = Window.partitionBy(*KEYS).orderBy("t")
    lagged = ["t", "start_time", "msg", "bytes", "req", "tmo", "backlog"]
    x = rows.select("*", *[F.lag(c).over(w).alias("p_" + c) for c in lagged])
    # the same snapshot read twice (or two lines with one timestamp) counts once
    x = x.where(F.col("p_t").isNull() | (F.col("t") > F.col("p_t")))

    col = F.col
    # A series first seen here (no previous row) while its node has an earlier snapshot was created
    # in between: its counters and backlog started from zero then (messages a new channel took over
    # from its topic's backlog are in its message_count: arrivals, like any other).
    new = col("p_t").isNull() & col("node_p_t").isNotNull()
    for c in ("msg", "bytes", "req", "tmo", "backlog"):
        x = x.withColumn("p_" + c, F.when(new, F.when(col(c).isNotNull(), F.lit(0))).otherwise(col("p_" + c)))
    x = (x.withColumn("p_start_time", F.when(new, col("node_p_start_time")).otherwise(col("p_start_time")))
         .withColumn("p_t", F.when(new, col("node_p_t")).otherwise(col("p_t"))))
    restart = col("start_time") != col("p_start_time")
    decreased = ((col("msg") < col("p_msg")) | F.coalesce(col("bytes") < col("p_bytes"), F.lit(False))
                 | F.coalesce(col("req") < col("p_req"), F.lit(False))
                 | F.coalesce(col("tmo") < col("p_tmo"), F.lit(False)))
    reset = F.coalesce(restart | decreased, F.lit(False))

    usable = col("p_t").isNotNull()
    if max_gap and max_gap > 0:
        usable = usable & ((col("t") - col("p_t")) <= F.lit(float(max_gap)))

    def delta(c: str) -> Any:
        return F.when(usable, F.when(reset, col(c)).otherwise(col(c) - col("p_" + c)).cast("double"))

    # after a restart only the time since start_time produced the new counts
    restarted_inside = restart & (col("start_time") > col("p_t")) & (col("start_time") < col("t"))
    begin = F.when(restarted_inside, col("start_time")).otherwise(col("p_t"))
    d_backlog = F.when(usable, (col("backlog") - col("p_backlog")).cast("double"))
    finished = F.when(col("channel") != "", F.greatest(delta("msg") - d_backlog, F.lit(0.0)))
    own = F.floor(col("t") / W)
    y = x.select(
        *KEYS, "t", "hostname", "depth", "backlog", "clients", "e2e",
        F.when(usable, begin).alias("a"), own.alias("own"),
        delta("msg").alias("d_msg"), delta("bytes").alias("d_bytes"), delta("req").alias("d_req"),
        delta("tmo").alias("d_tmo"), finished.alias("d_fin"), d_backlog.alias("d_backlog"),
        F.when(usable & reset, 1).otherwise(0).alias("reset"),
        # a restart counts in the window holding its start_time, other resets in the snapshot's own
        F.when(usable & F.coalesce(restarted_inside, F.lit(False)), F.floor(col("start_time") / W))
        .otherwise(own).alias("reset_k"),
    )
    # the windows the interval (a, t] overlaps, and always the snapshot's own window
    k0 = F.when(col("a").isNotNull(), F.floor(col("a") / W)).otherwise(col("own"))
    y = y.withColumn("k", F.explode(F.sequence(F.least(k0, col("own")), col("own"))))
    overlap = F.greatest(F.least(col("t"), (col("k") + 1) * W) - F.greatest(col("a"), col("k") * W), F.lit(0.0))
    y = (y.withColumn("ov", F.when(col("a").isNotNull(), overlap).otherwise(0.0))
         .withColumn("wgt", F.when(col("a").isNotNull(), col("ov") / (col("t") - col("a"))))
         .withColumn("sample", col("k") == col("own")))
    sample = col("sample")

    def g(c: str) -> Any:
        return F.when(sample, col(c))

    agg = y.groupBy(*KEYS, "k").agg(
        F.count(F.when(sample, 1)).alias("samples"),
        F.max_by("hostname", g("t")).alias("hostname"),
        F.max(g("depth")).alias("depth_max"),
        F.avg(g("depth")).alias("depth_mean"),
        F.max_by("backlog", g("t")).alias("backlog_last"),
        F.max_by("depth", g("t")).alias("depth_last"),
        F.max(g("clients")).alias("clients_max"),
        F.avg(g("clients")).alias("clients_mean"),
        F.flatten(F.collect_list(F.when(sample & col("e2e").isNotNull(), col("e2e")))).alias("e2e_all"),
        F.sum("ov").alias("covered_s"),
        F.sum(col("d_msg") * col("wgt")).alias("published"),
        F.sum(col("d_bytes") * col("wgt")).alias("published_bytes"),
        F.sum(col("d_fin") * col("wgt")).alias("finished"),
        F.sum(col("d_req") * col("wgt")).alias("requeued"),
        F.sum(col("d_tmo") * col("wgt")).alias("timed_out"),
        F.sum(col("d_backlog") * col("wgt")).alias("backlog_change"),
        F.sum(F.when(col("k") == col("reset_k"), col("reset")).otherwise(0)).alias("restarts"),
    )
    quantiles = F.array_distinct(F.transform("e2e_all", lambda p: p["quantile"]))
    e2e_ms = F.when(F.size("e2e_all") > 0, F.map_from_arrays(
        F.transform(quantiles, lambda q: q.cast("string")),
        F.transform(quantiles, lambda q: F.array_max(F.transform(
            F.filter("e2e_all", lambda p: p["quantile"] == q), lambda p: p["value"])) / 1e6)))

    covered = col("covered_s") > 0

    def per_s(c: str) -> Any:
        return F.when(covered, col(c) / col("covered_s"))

    growth = per_s("backlog_change")
    # Less than half a message of change over the window is no change (the deltas are spread
    # over windows in proportion, so a steady backlog can sum to 1e-13 instead of 0).
    steady = F.abs(col("backlog_change")) < 0.5
    state = (F.when(col("backlog_last").isNull(), F.lit(None).cast("string"))
             .when(col("backlog_last") == 0, F.lit("empty"))
             .when(col("depth_last") == 0, F.lit("keeping up"))  # everything left is in flight or deferred
             .when(~covered, F.lit(None).cast("string"))
             .when(steady, F.lit("keeping up"))
             .when(col("backlog_change") < 0, F.lit("draining"))
             .otherwise(F.lit("growing")))
    finish_rate = per_s("finished")
    drain = (F.when(col("drain_state") == "empty", F.lit(0.0))
             .when(col("drain_state") == "draining", col("backlog_last") / -col("backlog_growth_rate"))
             .when((col("drain_state") == "keeping up") & (finish_rate > 0), col("backlog_last") / finish_rate))
    is_topic = col("channel") == ""
    window_start = F.timestamp_seconds(col("k") * W)
    return (agg
            .withColumn("backlog_growth_rate", growth)
            .withColumn("drain_state", state)
            .select(
                F.to_date(window_start).alias("date"),
                window_start.alias("window_start"),
                F.timestamp_seconds((col("k") + 1) * W).alias("window_end"),
                "node", "hostname", "topic",
                F.when(is_topic, F.lit(None).cast("string")).otherwise(col("channel")).alias("channel"),
                F.when(is_topic, F.lit("topic")).otherwise(F.lit("channel")).alias("level"),
                "samples", "covered_s",
                F.when(covered, col("published")).alias("published"), per_s("published").alias("publish_rate"),
                F.when(is_topic, per_s("published_bytes")).alias("publish_bytes_rate"),
                F.when(covered, col("finished")).alias("finished"), per_s("finished").alias("finish_rate"),
                F.when(covered, col("requeued")).alias("requeued"), per_s("requeued").alias("requeue_rate"),
                F.when(covered, col("timed_out")).alias("timed_out"), per_s("timed_out").alias("timeout_rate"),
                "depth_max", "depth_mean", "depth_last", "backlog_last", "backlog_growth_rate",
                "drain_state", drain.alias("time_to_drain_s"),
                "clients_max", "clients_mean", e2e_ms.alias("e2e_ms"),
                "restarts",
            ))


def summarize(result: Any) -> Any:
    """One row per node, topic and channel over the whole input (for the printed table)."""
    from pyspark.sql import functions as F

    col = F.col
    return (result.groupBy("node", "topic", "channel", "level").agg(
        F.min("window_start").alias("first"), F.max("window_end").alias("last"),
        F.sum("covered_s").alias("covered_s"),
        F.sum("published").alias("published"), F.sum("finished").alias("finished"),
        F.sum("requeued").alias("requeued"), F.sum("timed_out").alias("timed_out"),
        F.max("depth_max").alias("depth_max"),
        F.max_by("backlog_last", F.when(col("backlog_last").isNotNull(), col("window_start"))).alias("backlog_last"),
        # the state of the last window that has one (a window with a single snapshot has no rates)
        F.max_by("drain_state", F.when(col("drain_state").isNotNull(), col("window_start"))).alias("drain_state"),
        F.max_by("time_to_drain_s", F.when(col("drain_state").isNotNull(), col("window_start")))
        .alias("time_to_drain_s"),
        F.max("clients_max").alias("clients_max"),
        F.max(F.col("e2e_ms").getItem("0.99")).alias("e2e_p99_ms"),
        F.sum("restarts").alias("restarts"),
    ).withColumn("publish_rate", F.when(col("covered_s") > 0, col("published") / col("covered_s")))
        .withColumn("finish_rate", F.when(col("covered_s") > 0, col("finished") / col("covered_s")))
        .orderBy("topic", F.col("channel").asc_nulls_first(), "node"))


def chart_series(result: Any, top: int = 8) -> dict[str, dict[str, list[Any]]]:
    """Cluster-wide series (summed over nodes) for the report: the busiest topics and channels."""
    from pyspark.sql import functions as F

    col = F.col
    named = result.withColumn("series", F.when(col("channel").isNull(), col("topic"))
                              .otherwise(F.concat_ws("/", "topic", "channel")))
    per_t = named.groupBy("level", "series", "window_start").agg(
        F.sum("publish_rate").alias("publish_rate"), F.sum("finish_rate").alias("finish_rate"),
        F.sum("depth_mean").alias("depth"), F.sum("requeue_rate").alias("requeue_rate"),
        F.sum("timeout_rate").alias("timeout_rate"))
    out: dict[str, dict[str, list[Any]]] = {}
    plan = (("publish_rate", "topic", "publish_rate"), ("finish_rate", "channel", "finish_rate"),
            ("depth", "channel", "depth"), ("requeue_rate", "channel", "requeue_rate"),
            ("timeout_rate", "channel", "timeout_rate"), ("topic_depth", "topic", "depth"))
    for key, level, metric in plan:
        ranked = (per_t.where(col("level") == level).groupBy("series")
                  .agg(F.sum(metric).alias("total")).where(col("total") > 0)
                  .orderBy(col("total").desc()).limit(top).collect())
        names = [r["series"] for r in ranked]
        series: dict[str, list[Any]] = {n: [] for n in names}
        if names:
            for r in (per_t.where((col("level") == level) & col("series").isin(names))
                      .select("series", "window_start", metric).orderBy("window_start").collect()):
                if r[metric] is not None:
                    series[r["series"]].append((r["window_start"], float(r[metric])))
        out[key] = series
    return out


def chart_marks(result: Any, limit: int = 200) -> dict[str, list[Any]]:
    """What the report's charts mark: ``restarts`` [(window_start, node)] (counter resets) and ``gaps``
    [(start, end, node)]: runs of windows inside a node's time span with no snapshot of that node."""
    from pyspark.sql import functions as F

    per_node = (result.groupBy("node", "window_start", "window_end")
                .agg(F.max("samples").alias("samples"), F.max("restarts").alias("restarts"))
                .orderBy("node", "window_start").collect())
    restarts: list[Any] = []
    gaps: list[Any] = []
    by_node: dict[str, list[Any]] = {}
    for r in per_node:
        by_node.setdefault(r["node"], []).append(r)
    for node, rows in by_node.items():
        with_data = [r for r in rows if r["samples"]]
        if not with_data:
            continue
        first, last = with_data[0]["window_start"], with_data[-1]["window_start"]
        gap_start = None
        prev_end = None
        for r in rows:
            if r["restarts"]:
                restarts.append((r["window_start"], node))
            if r["window_start"] < first or r["window_start"] > last:
                continue
            if prev_end is not None and r["window_start"] > prev_end and gap_start is None:
                gap_start = prev_end  # windows missing altogether (an interval longer than --max-gap)
            if not r["samples"]:
                gap_start = gap_start if gap_start is not None else r["window_start"]
            elif gap_start is not None:
                gaps.append((gap_start, r["window_start"], node))
                gap_start = None
            prev_end = r["window_end"]
    return {"restarts": restarts[:limit], "gaps": gaps[:limit]}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nsqtw-stats",
        description="Rates, depths and latencies per node/topic/channel/window from nsqd "
                    "--stats-export-path snapshots (JSON Lines), with Spark. Exit status: 0 done, "
                    "1 the Spark job failed, 2 bad arguments, 3 input missing or empty.")
    p.add_argument("paths", nargs="+", help="snapshot files or directories: local paths or Hadoop URIs "
                                            "(file:///, hdfs://, s3a://...)")
    p.add_argument("--window", default="1m", help="window length, a Go duration (default 1m)")
    p.add_argument("--max-gap", default="1h",
                   help="longest interval between two snapshots still used for rates (default 1h; 0 = any)")
    p.add_argument("-o", "--output", default="nsq-stats.parquet",
                   help="Parquet output directory, partitioned by date (default ./nsq-stats.parquet; '' = none)")
    p.add_argument("--mode", choices=("overwrite", "append"), default="overwrite",
                   help="overwrite replaces only the dates present in the input (default)")
    p.add_argument("--pattern", default=DEFAULT_PATTERN,
                   help=f"file name glob inside directories (default {DEFAULT_PATTERN!r}; '' = every file)")
    p.add_argument("--html", default="", help="also write a one-page HTML report with SVG charts to this file")
    p.add_argument("--limit", type=int, default=50, help="rows of the printed summary (default 50)")
    p.add_argument("--top", type=int, default=8, help="series per chart in the HTML report (default 8)")
    add_common_arguments(p)
    add_spark_arguments(p)
    return p


def check_args(args: argparse.Namespace) -> dict[str, Any]:
    """Everything that can be wrong before Spark starts: values, and local inputs that are not there."""
    try:
        window = parse_duration(args.window, "window")
        max_gap = parse_duration(args.max_gap, "max-gap")
    except OptionError as e:
        raise UsageError(str(e)) from None
    if window <= 0:
        raise UsageError(f"--window must be positive, not {args.window!r}")
    if max_gap < 0:
        raise UsageError(f"--max-gap must not be negative, not {args.max_gap!r}")
    if args.limit < 0:
        raise UsageError(f"--limit must not be negative, not {args.limit}")
    if args.top < 1:
        raise UsageError(f"--top must be at least 1, not {args.top}")
    if args.html:
        parent = os.path.dirname(os.path.abspath(args.html))
        if not os.path.isdir(parent):
            raise UsageError(f"--html {args.html}: directory {parent} does not exist")
    conf = parse_conf(args.conf)
    files = check_local_inputs(args.paths, args.pattern or None, allow_empty=args.allow_empty)
    return {"window": window, "max_gap": max_gap, "conf": conf, "files": files}


def run(args: argparse.Namespace, spark: Any = None, out: Any = None, err: Any = None) -> dict[str, Any]:
    """The job behind the CLI; returns figures for callers and tests.

    Raises :class:`~nsqtw.spark.cli.JobError` (one line) for bad arguments and missing or empty input.
    """
    out = out or sys.stdout
    checked = check_args(args)
    window, max_gap = checked["window"], checked["max_gap"]
    progress = Progress("nsqtw-stats", getattr(args, "quiet", False), err)
    own = spark is None
    if own:
        progress(f"starting Spark ({args.master})")
        spark = get_session("nsqtw-stats", args.master, checked["conf"], progress=not args.quiet,
                            verbose=args.verbose)
    result = None
    try:
        found = "" if checked["files"] is None else f" ({checked['files']} files)"
        progress(f"reading snapshots from {', '.join(args.paths)}{found}")
        snapshots = _read_or_fail(spark, args.paths, args.pattern or None)
        progress(f"computing {args.window} windows")
        result = compute_stats(snapshots, window, max_gap).cache()
        rows_total = result.count()
        if rows_total == 0:
            what = f"no snapshots in {', '.join(args.paths)}" + (
                f" (files matching --pattern {args.pattern!r} hold no export records)" if args.pattern else "")
            if not args.allow_empty:
                raise InputError(what + " (--allow-empty to accept that)")
            out.write(f"nsqtw-stats: 0 node/topic/channel series: {what}; nothing written\n")
            return {"series": 0, "rows": []}
        if args.output:
            progress(f"writing {rows_total} rows to {args.output}")
            result.write.mode(args.mode).partitionBy("date").parquet(args.output)
        progress("summarizing")
        summary = summarize(result)
        total = summary.count()
        rows = summary.limit(args.limit).collect()
        from pyspark.sql import functions as F
        span = result.agg(F.min("window_start"), F.max("window_end")).collect()[0]
        out.write(f"nsqtw-stats: {total} node/topic/channel series, windows of {args.window}, "
                  f"{utc_text(span[0])} .. {utc_text(span[1])}\n\n")
        out.write(format_summary(rows, total))
        if args.html:
            progress(f"writing the report to {args.html}")
            html = render_report(summary_rows=summary.limit(max(args.limit, 200)).collect(),
                                 series=chart_series(result, args.top), window=args.window,
                                 span=(span[0], span[1]), total=total, marks=chart_marks(result))
            with open(args.html, "w", encoding="utf-8") as f:
                f.write(html)
            out.write(f"\nreport written to {args.html}\n")
        progress("done")
        return {"series": total, "rows": rows}
    finally:
        if result is not None:
            result.unpersist()
        if own:
            spark.stop()


def _read_or_fail(spark: Any, paths: Sequence[str], pattern: str | None) -> Any:
    """:func:`read_snapshots`, with Spark's "path does not exist" as one :class:`InputError` line."""
    try:
        return read_snapshots(spark, paths, pattern)
    except Exception as e:
        if error_class(e) == "PATH_NOT_FOUND":
            raise InputError("input not found: " + describe_error(e)) from e
        raise


def main(argv: Sequence[str] | None = None) -> int:
    return run_main("nsqtw-stats", build_parser(), run, argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
