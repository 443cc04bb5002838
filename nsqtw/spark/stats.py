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
* ``depth_max``, ``depth_mean`` (over the window's snapshots), ``backlog_last``
  (depth + in-flight + deferred; the topic's depth for topic rows),
  ``backlog_growth_rate`` (Δbacklog/s, = publish_rate − finish_rate) and
  ``time_to_drain_s`` (backlog_last / drain rate when the backlog shrinks, 0
  when empty, null when it does not shrink).
* ``e2e_ms``: for each configured percentile, the worst value (ms) that nsqd
  reported in the window (nsqd's percentiles are already windowed).
* ``clients_max``, ``clients_mean``; ``restarts`` (counter resets seen).

Counters are differenced with ``lag`` over (node, topic, channel) ordered by
time.  A broker restart (``start_time`` changes) or a counter that decreases
(topic deleted and re-created) is a reset: the delta is the new value, and
after a restart only the time since ``start_time`` counts.  A gap (missing
snapshots) is fine: each delta is spread over the windows its interval
overlaps, in proportion to the overlap, so rates stay right; intervals longer
than ``--max-gap`` (default 1h) are not trusted for rates.  Topic-level rows
have ``channel`` null and ``level`` "topic".  Output: Parquet partitioned by
``date`` (dynamic partition overwrite), a summary table on stdout, and with
``--html`` a one-page report with inline SVG charts.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any
from collections.abc import Sequence

from ..options import OptionError, parse_duration
from .session import add_spark_arguments, get_session, parse_conf

__all__ = ["SNAPSHOT_SCHEMA", "read_snapshots", "snapshot_rows", "compute_stats", "summarize",
           "format_summary", "chart_series", "main"]

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
    """One row per snapshot and topic (channel ``""``) or channel, with counters and gauges (one scan)."""
    from pyspark.sql import functions as F

    base = snapshots.where(F.col("timestamp").isNotNull() & F.col("stats").isNotNull()).select(
        F.col("timestamp").alias("t"),
        F.concat_ws(":", F.col("node.broadcast_address"), F.col("node.http_port").cast("string")).alias("node"),
        F.col("node.hostname").alias("hostname"),
        F.col("stats.start_time").cast("double").alias("start_time"),
        F.explode("stats.topics").alias("tp"),
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
    rows = base.select("t", "node", "hostname", "start_time", tp["topic_name"].alias("topic"),
                       F.explode(F.concat(F.array(topic_entry), channel_entries)).alias("e"))
    return rows.select("t", "node", "hostname", "start_time", "topic", "e.*")


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
    begin = F.when(restart & (col("start_time") > col("p_t")) & (col("start_time") < col("t")),
                   col("start_time")).otherwise(col("p_t"))
    d_backlog = F.when(usable, (col("backlog") - col("p_backlog")).cast("double"))
    finished = F.when(col("channel") != "", F.greatest(delta("msg") - d_backlog, F.lit(0.0)))
    own = F.floor(col("t") / W)
    y = x.select(
        *KEYS, "t", "hostname", "depth", "backlog", "clients", "e2e",
        F.when(usable, begin).alias("a"), own.alias("own"),
        delta("msg").alias("d_msg"), delta("bytes").alias("d_bytes"), delta("req").alias("d_req"),
        delta("tmo").alias("d_tmo"), finished.alias("d_fin"), d_backlog.alias("d_backlog"),
        F.when(usable & reset, 1).otherwise(0).alias("reset"),
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
        F.sum(F.when(sample, col("reset")).otherwise(0)).alias("restarts"),
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
    drain = (F.when(col("backlog_last") == 0, F.lit(0.0))
             .when(col("backlog_growth_rate") < 0, col("backlog_last") / -col("backlog_growth_rate")))
    is_topic = col("channel") == ""
    window_start = F.timestamp_seconds(col("k") * W)
    return (agg
            .withColumn("backlog_growth_rate", growth)
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
                "depth_max", "depth_mean", "backlog_last", "backlog_growth_rate",
                drain.alias("time_to_drain_s"),
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
        F.max_by("time_to_drain_s", F.when(col("backlog_last").isNotNull(), col("window_start")))
        .alias("time_to_drain_s"),
        F.max("clients_max").alias("clients_max"),
        F.max(F.col("e2e_ms").getItem("0.99")).alias("e2e_p99_ms"),
        F.sum("restarts").alias("restarts"),
    ).withColumn("publish_rate", F.when(col("covered_s") > 0, col("published") / col("covered_s")))
        .withColumn("finish_rate", F.when(col("covered_s") > 0, col("finished") / col("covered_s")))
        .orderBy("topic", F.col("channel").asc_nulls_first(), "node"))


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:,.{digits}f}"
    return f"{value:,}"


def _fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


SUMMARY_COLUMNS = ("node", "topic", "channel", "pub/s", "fin/s", "requeued", "timed out", "depth max",
                   "backlog", "drain in", "clients", "e2e p99 ms", "restarts")


def summary_table(rows: Sequence[Any]) -> list[list[str]]:
    table = []
    for r in rows:
        table.append([
            r["node"], r["topic"], r["channel"] if r["channel"] is not None else "(topic)",
            _fmt(r["publish_rate"]), _fmt(r["finish_rate"]),
            _fmt(r["requeued"], 0), _fmt(r["timed_out"], 0), _fmt(r["depth_max"]),
            _fmt(r["backlog_last"]),
            _fmt_duration(r["time_to_drain_s"]) if r["channel"] is not None or r["backlog_last"] else "-",
            _fmt(r["clients_max"]), _fmt(r["e2e_p99_ms"]), _fmt(r["restarts"]),
        ])
    return table


def format_summary(rows: Sequence[Any], total: int | None = None) -> str:
    """A plain-text table with aligned columns."""
    table = summary_table(rows)
    widths = [len(h) for h in SUMMARY_COLUMNS]
    for line in table:
        widths = [max(w, len(cell)) for w, cell in zip(widths, line)]
    left = {0, 1, 2}

    def fmt_line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    out = [fmt_line(SUMMARY_COLUMNS), "  ".join("-" * w for w in widths)]
    out.extend(fmt_line(line) for line in table)
    if total is not None and total > len(rows):
        out.append(f"... {total - len(rows)} more rows in the Parquet output")
    return "\n".join(out) + "\n"


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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nsqtw-stats",
        description="Rates, depths and latencies per node/topic/channel/window from nsqd "
                    "--stats-export-path snapshots (JSON Lines), with Spark.")
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
    add_spark_arguments(p)
    return p


def run(args: argparse.Namespace, spark: Any = None, out: Any = None) -> dict[str, Any]:
    """The job behind the CLI; returns figures for callers and tests."""
    out = out or sys.stdout
    try:
        window = parse_duration(args.window, "window")
        max_gap = parse_duration(args.max_gap, "max-gap")
    except OptionError as e:
        raise SystemExit(str(e)) from None
    if window <= 0:
        raise SystemExit("--window must be positive")
    own = spark is None
    if own:
        spark = get_session("nsqtw-stats", args.master, parse_conf(args.conf))
    try:
        snapshots = read_snapshots(spark, args.paths, args.pattern or None)
        result = compute_stats(snapshots, window, max_gap).cache()
        if args.output:
            result.write.mode(args.mode).partitionBy("date").parquet(args.output)
        summary = summarize(result)
        total = summary.count()
        rows = summary.limit(args.limit).collect()
        from pyspark.sql import functions as F
        span = result.agg(F.min("window_start"), F.max("window_end")).collect()[0]
        from .report import utc_text
        out.write(f"nsqtw-stats: {total} node/topic/channel series, windows of {args.window}, "
                  f"{utc_text(span[0])} .. {utc_text(span[1])}\n\n")
        out.write(format_summary(rows, total))
        if args.html:
            from .report import render_report
            html = render_report(summary_rows=summary.limit(max(args.limit, 200)).collect(),
                                 series=chart_series(result, args.top), window=args.window,
                                 span=(span[0], span[1]), total=total)
            with open(args.html, "w", encoding="utf-8") as f:
                f.write(html)
            out.write(f"\nreport written to {args.html}\n")
        return {"series": total, "rows": rows}
    finally:
        if "result" in locals():
            result.unpersist()
        if own:
            spark.stop()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run(args)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
