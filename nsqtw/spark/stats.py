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
  ``drain_state`` and ``time_to_drain_s``: "empty" (0 s); "no consumer" when a
  channel holds messages, has no client at the window's last snapshot and
  nothing was finished (null: nothing drains it); "keeping up" when
  nothing waits in the queue (depth 0: the backlog is what is in flight or
  deferred) or the backlog did not change (by less than half a message over
  the window) while messages were finished, drain time = backlog / finish
  rate; "stalled" when messages wait, nothing was finished and the backlog
  did not change (a topic whose channels take nothing, consumers that finish
  nothing: null); "draining" when it shrinks,
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
import fnmatch
import glob
import math
import os
import sys
from typing import Any
from collections.abc import Sequence

from ..options import OptionError, parse_duration
from .cli import (InputError, Progress, UsageError, add_common_arguments, add_rejected_arguments, check_local_inputs,
                  describe_error, error_class, first_line_where, local_path, progress_bar, report_rejected, run_main)
from .report import SUMMARY_COLUMNS, format_summary, render_report, summary_table, utc_text
from . import classcache
from .session import add_spark_arguments, check_master, class_archive_applies, get_session, parse_conf, reach_master

__all__ = ["SNAPSHOT_SCHEMA", "read_snapshots", "read_snapshot_records", "read_snapshot_lines", "shuffle_partitions", "local_settings", "summary_document", "snapshot_rows", "compute_stats", "summarize",
           "format_summary", "summary_table", "SUMMARY_COLUMNS", "chart_series", "chart_marks", "chart_data", "main"]

_E2E = "STRUCT<percentiles: ARRAY<STRUCT<quantile: DOUBLE, value: DOUBLE>>>"
_CHANNEL = ("STRUCT<channel_name: STRING, depth: BIGINT, in_flight_count: BIGINT, deferred_count: BIGINT, "
            "message_count: BIGINT, requeue_count: BIGINT, timeout_count: BIGINT, client_count: BIGINT, "
            f"e2e_processing_latency: {_E2E}>")
_TOPIC = ("STRUCT<topic_name: STRING, depth: BIGINT, message_count: BIGINT, message_bytes: BIGINT, "
          f"e2e_processing_latency: {_E2E}, channels: ARRAY<{_CHANNEL}>>")
#: The parts of an export line the job reads, and no more: the parser converts only these fields (the
#: rest, clients and memory included, it skips), so a field the job does not read cannot reject a line.
SNAPSHOT_SCHEMA = ("timestamp DOUBLE, node STRUCT<broadcast_address: STRING, hostname: STRING, http_port: INT>, "
                   f"stats STRUCT<start_time: BIGINT, topics: ARRAY<{_TOPIC}>>")

KEYS = ["node", "topic", "channel"]
DEFAULT_PATTERN = "nsqd-stats.*"


#: Why a line was rejected (the ``reason`` of ``_rejected`` records).
MALFORMED = "malformed JSON, or a field of the wrong type"
NOT_A_SNAPSHOT = "not an export record (no timestamp or stats)"


#: A blank line (white space only, a CR too), skipped as Spark's JSON reader skips it.
_BLANK = r"^\s*$"


def read_snapshot_lines(spark: Any, paths: Sequence[str], pattern: str | None = DEFAULT_PATTERN) -> Any:
    """Every export line, parsed: the snapshot's columns plus ``_file``, ``_value`` (the line) and
    ``_bad`` (null for a good record, else why it is rejected: :data:`MALFORMED`, :data:`NOT_A_SNAPSHOT`).

    A record with one field of the wrong type (a string ``message_count``) is rejected whole, never
    half used.
    """
    from pyspark.sql import functions as F

    reader = spark.read.option("lineSep", "\n")
    if pattern:
        reader = reader.option("pathGlobFilter", pattern)
    lines = reader.text(list(paths)).where(~F.col("value").rlike(_BLANK))
    parsed = F.from_json("value", SNAPSHOT_SCHEMA + ", _corrupt_record STRING",
                         {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_corrupt_record"})
    rows = lines.select(F.col("value").alias("_value"), F.col("_metadata.file_path").alias("_file"),
                        parsed.alias("j"))
    bad = (F.when(F.col("j").isNull() | F.col("j._corrupt_record").isNotNull(), F.lit(MALFORMED))
           .when(F.col("j.timestamp").isNull() | F.col("j.stats").isNull(), F.lit(NOT_A_SNAPSHOT)))
    return rows.select("j.timestamp", "j.node", "j.stats", "_file", "_value", bad.alias("_bad"))


def read_snapshot_records(spark: Any, paths: Sequence[str], pattern: str | None = DEFAULT_PATTERN) -> Any:
    """Every export line (blank lines aside), parsed once by Spark's JSON reader: the snapshot's
    columns plus ``_file`` and ``_bad`` (null for a good record, else :data:`MALFORMED` or
    :data:`NOT_A_SNAPSHOT`), as :func:`read_snapshot_lines` says, without the line itself.

    The cheap way in: the JSON source parses the bytes it reads (about 40% less CPU than a text
    line handed to ``from_json``), and a filter on ``_bad`` cannot make Spark parse a line twice
    (``from_json`` in a projection under a filter is copied into the filter by the optimizer).
    """
    from pyspark.sql import functions as F

    reader = (spark.read.schema(SNAPSHOT_SCHEMA + ", _corrupt_record STRING").option("lineSep", "\n")
              .option("mode", "PERMISSIVE").option("columnNameOfCorruptRecord", "_corrupt_record"))
    if pattern:
        reader = reader.option("pathGlobFilter", pattern)
    records = reader.json(list(paths))
    bad = (F.when(F.col("_corrupt_record").isNotNull(), F.lit(MALFORMED))
           .when(F.col("timestamp").isNull() | F.col("stats").isNull(), F.lit(NOT_A_SNAPSHOT)))
    return records.select("timestamp", "node", "stats", F.col("_metadata.file_path").alias("_file"),
                          bad.alias("_bad"))


def read_snapshots(spark: Any, paths: Sequence[str], pattern: str | None = DEFAULT_PATTERN) -> Any:
    """The good export records (files or directories, any Hadoop URI): :func:`read_snapshot_records`
    without the rejected ones, each line parsed once."""
    from pyspark.sql import functions as F

    return read_snapshot_records(spark, paths, pattern).where(F.col("_bad").isNull())


def snapshot_rows(snapshots: Any) -> Any:
    """One row per snapshot and topic (channel ``""``) or channel, with counters and gauges (one scan).

    Each row also carries its node's previous snapshot (``node_p_t``, ``node_p_start_time``): a topic
    or channel first seen in a snapshot was created since then, so its first counts are not lost.
    The node window sorts one row per snapshot (partitioned by node); the topic rows are then
    repartitioned by (node, topic), which the per-series window and the aggregation reuse.
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
    # the window over the snapshots themselves, then the explode (in one select Spark explodes first
    # and sorts every topic row, each carrying its channels, instead of one row per snapshot)
    base = snaps.select(
        "t", "node", "hostname", "start_time", "topics",
        F.max("t").over(before).alias("node_p_t"),
        F.last("start_time").over(before).alias("node_p_start_time"),
    ).select("t", "node", "hostname", "start_time", "node_p_t", "node_p_start_time", F.explode("topics").alias("tp"))
    # spread the series over every shuffle partition: partitioned by node alone (what the node window
    # needs), one task sorts and aggregates all of a node's series (or of two nodes that hash alike)
    # while the other cores wait; (node, topic) clusters each series for its window and aggregation
    base = base.repartition("node", F.col("tp.topic_name"))
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

    One scan of the input, a shuffle of the snapshots by node (their previous snapshot) and one of the
    topic rows by (node, topic), which the ``lag`` window and the aggregation share: every
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
    x = x.withColumns({
        **{"p_" + c: F.when(new, F.when(col(c).isNotNull(), F.lit(0))).otherwise(col("p_" + c))
           for c in ("msg", "bytes", "req", "tmo", "backlog")},
        "p_start_time": F.when(new, col("node_p_start_time")).otherwise(col("p_start_time")),
        "p_t": F.when(new, col("node_p_t")).otherwise(col("p_t"))})
    restart = col("start_time") != col("p_start_time")
    decreased = ((col("msg") < col("p_msg")) | F.coalesce(col("bytes") < col("p_bytes"), F.lit(False))
                 | F.coalesce(col("req") < col("p_req"), F.lit(False))
                 | F.coalesce(col("tmo") < col("p_tmo"), F.lit(False)))
    reset = F.coalesce(restart | decreased, F.lit(False))
    # nsqd's counters never go below zero: such a snapshot is not used for rates, and flagged
    negative = F.coalesce((col("msg") < 0) | (col("bytes") < 0) | (col("req") < 0) | (col("tmo") < 0)
                          | (col("depth") < 0) | (col("backlog") < 0), F.lit(False))
    p_negative = F.coalesce((col("p_msg") < 0) | (col("p_bytes") < 0) | (col("p_req") < 0) | (col("p_tmo") < 0)
                            | (col("p_backlog") < 0), F.lit(False))
    # a counter that went down without a restart: a topic or channel deleted and re-created (a
    # reset), or a broken exporter; counted as a reset and flagged
    anomaly = negative | (col("p_t").isNotNull() & F.coalesce(decreased & ~restart, F.lit(False)))

    usable = col("p_t").isNotNull() & ~negative & ~p_negative
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
        F.when(anomaly, 1).otherwise(0).alias("anomaly"),
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

    # each quantile's worst value: the greatest of its entries' values (keys in the order they first
    # appear).  A filter per quantile over the window's few entries, not a sort of them: sort_array
    # compares the (quantile, value) structs with an interpreted ordering (boxing every double), and
    # each lambda referring to the sorted array sorted it again; on 2.7 GB of snapshots (local[2], back
    # to back) 39.0 and 39.0 s, 68-70 CPU-s against 41.7 and 39.9 s, 71-73 CPU-s.  The map is still
    # built in the aggregate's result projection (small generated methods, no whole-stage Project).
    e2e_all = F.flatten(F.collect_list(F.when(sample & col("e2e").isNotNull(), col("e2e"))))
    quantiles = F.array_distinct(e2e_all["quantile"])
    e2e_ms = F.when(F.size(e2e_all) > 0, F.map_from_arrays(
        quantiles.cast("array<string>"),
        F.transform(quantiles, lambda q: F.array_max(F.filter(e2e_all, lambda e: e["quantile"] == q)["value"]) / 1e6)))

    def wsum(c: str) -> Any:  # the window's share of the deltas
        return F.sum(col(c) * col("wgt"))

    covered_s = F.sum("ov")
    backlog_last, depth_last = F.max_by("backlog", g("t")), F.max_by("depth", g("t"))
    backlog_change = wsum("d_backlog")
    covered = covered_s > 0

    def per_s(total: Any) -> Any:
        return F.when(covered, total / covered_s)

    growth = per_s(backlog_change)
    # Less than half a message of change over the window is no change (the deltas are spread
    # over windows in proportion, so a steady backlog can sum to 1e-13 instead of 0).
    steady = F.abs(backlog_change) < 0.5
    # nothing finished (on a topic row, which finishes nothing itself: a steady depth is one
    # nothing takes)
    finish_none = F.coalesce(F.abs(wsum("d_fin")) < 0.5, F.lit(True))
    clients_last = F.max_by("clients", g("t"))  # null on topic rows
    state = (F.when(backlog_last.isNull(), F.lit(None).cast("string"))
             .when(backlog_last == 0, F.lit("empty"))
             .when(covered & steady & finish_none & (clients_last == 0), F.lit("no consumer"))
             .when(depth_last == 0, F.lit("keeping up"))  # everything left is in flight or deferred
             .when(~covered, F.lit(None).cast("string"))
             .when(steady & finish_none, F.lit("stalled"))
             .when(steady, F.lit("keeping up"))
             .when(backlog_change < 0, F.lit("draining"))
             .otherwise(F.lit("growing")))
    finish_rate = per_s(wsum("d_fin"))
    drain = (F.when(state == "empty", F.lit(0.0))
             .when(state == "draining", backlog_last / -growth)
             .when((state == "keeping up") & (finish_rate > 0), backlog_last / finish_rate))
    is_topic = col("channel") == ""
    window_start = F.timestamp_seconds(col("k") * W)
    # Every output column is an expression of the aggregate (over its grouping keys and aggregate
    # functions): Spark evaluates them in the aggregate's own result projection, generated as many
    # small methods, instead of one whole-stage method after it (~5 CPU-s of C2 compiling, recompiled
    # four times, on 2.7 GB).
    out = [
        F.to_date(window_start).alias("date"),
        window_start.alias("window_start"),
        F.timestamp_seconds((col("k") + 1) * W).alias("window_end"),
        F.max_by("hostname", g("t")).alias("hostname"),
        F.when(is_topic, F.lit(None).cast("string")).otherwise(col("channel")).alias("_channel"),
        F.when(is_topic, F.lit("topic")).otherwise(F.lit("channel")).alias("level"),
        F.count(F.when(sample, 1)).alias("samples"),
        covered_s.alias("covered_s"),
    ]
    for name, rate, c in (("published", "publish_rate", "d_msg"), ("finished", "finish_rate", "d_fin"),
                          ("requeued", "requeue_rate", "d_req"), ("timed_out", "timeout_rate", "d_tmo")):
        out += [F.when(covered, wsum(c)).alias(name), per_s(wsum(c)).alias(rate)]
        if name == "published":
            out.append(F.when(is_topic, per_s(wsum("d_bytes"))).alias("publish_bytes_rate"))
    out += [
        F.max(g("depth")).alias("depth_max"),
        F.avg(g("depth")).alias("depth_mean"),
        depth_last.alias("depth_last"),
        backlog_last.alias("backlog_last"),
        growth.alias("backlog_growth_rate"),
        state.alias("drain_state"),
        drain.alias("time_to_drain_s"),
        F.max(g("clients")).alias("clients_max"),
        F.avg(g("clients")).alias("clients_mean"),
        e2e_ms.alias("e2e_ms"),
        F.sum(F.when(col("k") == col("reset_k"), col("reset")).otherwise(0)).alias("restarts"),
        F.sum(F.when(sample, col("anomaly")).otherwise(0)).alias("counter_anomalies"),
    ]
    return y.groupBy(*KEYS, "k").agg(*out).select(
        "date", "window_start", "window_end", "node", "hostname", "topic", col("_channel").alias("channel"), "level",
        "samples", "covered_s", "published", "publish_rate", "publish_bytes_rate", "finished", "finish_rate",
        "requeued", "requeue_rate", "timed_out", "timeout_rate", "depth_max", "depth_mean", "depth_last",
        "backlog_last", "backlog_growth_rate", "drain_state", "time_to_drain_s", "clients_max", "clients_mean",
        "e2e_ms", "restarts", "counter_anomalies")


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
        F.max_by("backlog_growth_rate", F.when(col("drain_state").isNotNull(), col("window_start")))
        .alias("backlog_growth_rate"),
        F.max(F.when(col("drain_state").isNotNull(), col("window_start"))).alias("drain_window_start"),
        F.max(F.when(col("drain_state").isNotNull(), col("window_end"))).alias("drain_window_end"),
        F.sum("depth_mean").alias("depth_sum"),
        F.sum("counter_anomalies").alias("counter_anomalies"),
        F.max("clients_max").alias("clients_max"),
        F.max(F.col("e2e_ms").getItem("0.99")).alias("e2e_p99_ms"),
        F.sum("restarts").alias("restarts"),
    ).withColumns({"publish_rate": F.when(col("covered_s") > 0, col("published") / col("covered_s")),
                    "finish_rate": F.when(col("covered_s") > 0, col("finished") / col("covered_s"))})
        # one sorted partition of a few thousand rows: a global orderBy would sample its input first,
        # a second pass over the whole result (1.7 CPU-s on 2.7 GB of snapshots)
        .repartition(1).sortWithinPartitions("topic", F.col("channel").asc_nulls_first(), "node"))


def _series_name(row: Any) -> str:
    return row["topic"] if row["channel"] is None else f"{row['topic']}/{row['channel']}"


_CHARTS = (("publish_rate", "topic", "publish_rate", "published"), ("finish_rate", "channel", "finish_rate", "finished"),
           ("depth", "channel", "depth", "depth_sum"), ("requeue_rate", "channel", "requeue_rate", "requeued"),
           ("timeout_rate", "channel", "timeout_rate", "timed_out"), ("topic_depth", "topic", "depth", "depth_sum"))


def _chosen_series(summary_rows: Sequence[Any], top: int) -> dict[str, list[str]]:
    """Each chart's busiest series (by their totals in the summary rows)."""
    totals: dict[tuple[str, str], dict[str, float]] = {}
    for r in summary_rows:
        t = totals.setdefault((r["level"], _series_name(r)), {})
        for field in ("published", "finished", "requeued", "timed_out", "depth_sum"):
            t[field] = t.get(field, 0.0) + float(r[field] or 0.0)
    chosen: dict[str, list[str]] = {}
    for key, level, _metric, total in _CHARTS:
        ranked = sorted((-v[total], name) for (lv, name), v in totals.items() if lv == level and v[total] > 0)
        chosen[key] = [name for _neg, name in ranked[:top]]
    return chosen


def _series_windows(result: Any, wanted: Sequence[str]) -> Any:
    """The windows of the wanted series, summed over nodes."""
    from pyspark.sql import functions as F

    col = F.col
    named = result.withColumn("series", F.when(col("channel").isNull(), col("topic"))
                              .otherwise(F.concat_ws("/", "topic", "channel")))
    return named.where(col("series").isin(list(wanted))).groupBy("level", "series", "window_start").agg(
        F.sum("publish_rate").alias("publish_rate"), F.sum("finish_rate").alias("finish_rate"),
        F.sum("depth_mean").alias("depth"), F.sum("requeue_rate").alias("requeue_rate"),
        F.sum("timeout_rate").alias("timeout_rate"))


def _series_points(rows: Sequence[Any], chosen: dict[str, list[str]]) -> dict[str, dict[str, list[Any]]]:
    out: dict[str, dict[str, list[Any]]] = {key: {n: [] for n in names} for key, names in chosen.items()}
    for r in rows:
        for key, level, metric, _total in _CHARTS:
            if r["level"] == level and r["series"] in out[key] and r[metric] is not None:
                out[key][r["series"]].append((r["window_start"], float(r[metric])))
    for series in out.values():
        for points in series.values():
            points.sort()
    return out


def chart_series(result: Any, top: int = 8, summary_rows: Sequence[Any] | None = None) -> dict[str, dict[str, list[Any]]]:
    """Cluster-wide series (summed over nodes) for the report: the busiest topics and channels.

    The busiest are ranked from the summary (``summary_rows``, :func:`summarize`'s rows; computed when
    not given), then one job collects the windows of just those series.
    """
    if summary_rows is None:
        summary_rows = summarize(result).collect()
    chosen = _chosen_series(summary_rows, top)
    wanted = sorted({n for names in chosen.values() for n in names})
    return _series_points(_series_windows(result, wanted).collect() if wanted else [], chosen)


def _node_windows(result: Any) -> Any:
    """Each node's windows: whether it had a snapshot there (samples), and restarts."""
    from pyspark.sql import functions as F

    return (result.groupBy("node", "window_start", "window_end")
            .agg(F.max("samples").alias("samples"), F.max("restarts").alias("restarts")))


def chart_marks(result: Any, limit: int = 200) -> dict[str, list[Any]]:
    """What the report's charts mark: ``restarts`` [(window_start, node)] (counter resets) and ``gaps``
    [(start, end, node)]: runs of windows inside a node's time span with no snapshot of that node."""
    return _marks(_node_windows(result).collect(), limit)


def chart_data(result: Any, top: int = 8, summary_rows: Sequence[Any] | None = None,
               limit: int = 200) -> tuple[dict[str, dict[str, list[Any]]], dict[str, list[Any]]]:
    """:func:`chart_series` and :func:`chart_marks` in one query (one plan and one job over the cached
    result instead of two)."""
    from pyspark.sql import functions as F

    if summary_rows is None:
        summary_rows = summarize(result).collect()
    chosen = _chosen_series(summary_rows, top)
    wanted = sorted({n for names in chosen.values() for n in names})
    query = _node_windows(result).select(F.lit(True).alias("_mark"), "*")
    if wanted:
        query = query.unionByName(_series_windows(result, wanted).select(F.lit(False).alias("_mark"), "*"),
                                  allowMissingColumns=True)
    rows = query.collect()
    return (_series_points([r for r in rows if not r["_mark"]], chosen),
            _marks([r for r in rows if r["_mark"]], limit))


def _marks(windows: Sequence[Any], limit: int) -> dict[str, list[Any]]:
    # sorted here: Spark's orderBy would sample its input first (a pass over the whole result)
    per_node = sorted(windows, key=lambda r: (r["node"], r["window_start"]))
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
                    "1 the Spark job failed, 2 bad arguments, 3 input missing or empty, "
                    "4 more malformed input lines than --max-bad-records.")
    p.add_argument("paths", nargs="+", help="snapshot files or directories: local paths or Hadoop URIs "
                                            "(file:///, hdfs://, s3a://...)")
    p.add_argument("--window", default="1m", help="window length, a Go duration (default 1m)")
    p.add_argument("--max-gap", default="1h",
                   help="longest interval between two snapshots still used for rates (default 1h; 0 = any)")
    p.add_argument("-o", "--output", default="nsq-stats.parquet",
                   help="output directory, partitioned by date (default ./nsq-stats.parquet; '' = none)")
    p.add_argument("--format", choices=OUTPUT_FORMATS, default="parquet",
                   help="output format (default parquet; csv has a header and e2e_ms as a JSON object)")
    p.add_argument("--mode", choices=("overwrite", "append"), default="overwrite",
                   help="overwrite replaces only the dates present in the input (default)")
    p.add_argument("--pattern", default=DEFAULT_PATTERN,
                   help=f"file name glob inside directories (default {DEFAULT_PATTERN!r}; '' = every file)")
    add_rejected_arguments(p, "<output>/_rejected; none without an output")
    p.add_argument("--html", default="", help="also write a one-page HTML report with SVG charts to this file")
    p.add_argument("--summary-json", default="", metavar="FILE",
                   help="also write the summary as JSON (figures for a scheduler: series, rows, rejected "
                        "lines, every series' totals)")
    p.add_argument("--limit", type=int, default=50, help="rows of the printed summary (default 50)")
    p.add_argument("--top", type=int, default=8, help="series per chart in the HTML report (default 8)")
    add_common_arguments(p)
    add_spark_arguments(p)
    return p


OUTPUT_FORMATS = ("parquet", "csv", "json")


def _parent_must_exist(flag: str, path: str) -> None:
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UsageError(f"{flag} {path}: directory {parent} does not exist")
    if os.path.isdir(path):
        raise UsageError(f"{flag} {path}: is a directory")


def _output_must_be_a_directory(flag: str, path: str) -> None:
    local = local_path(path)
    if local is not None and os.path.exists(local) and not os.path.isdir(local):
        raise UsageError(f"{flag} {path}: exists and is not a directory")


def _local_bytes(paths: Sequence[str], pattern: str | None) -> int | None:
    """The size of the local input (for sizing shuffles), None when some of it is not local."""
    total = 0
    for path in paths:
        local = local_path(path)
        if local is None:
            return None
        for found in glob.glob(local) if glob.has_magic(local) else [local]:
            for root, _dirs, files in os.walk(found) if os.path.isdir(found) else [("", [], [found])]:
                for name in files:
                    if pattern and root and not fnmatch.fnmatchcase(name, pattern):
                        continue
                    try:
                        total += os.path.getsize(os.path.join(root, name))
                    except OSError:
                        pass
    return total


def shuffle_partitions(input_bytes: int | None, cores: int | None = None) -> int:
    """Shuffle partitions for a local master: two per core, more for a big input (one per 128 MiB),
    at most Spark's default 200.  Spark's 200 cost ~75 CPU-s of fixed work on small inputs."""
    cores = cores or os.cpu_count() or 2
    wanted = 2 * cores
    if input_bytes:
        wanted = max(wanted, math.ceil(input_bytes / (128 << 20)))
    return max(1, min(200, wanted))


#: The window aggregation as a sort aggregate, not Spark's object hash aggregate (its ``collect_list``
#: of e2e percentiles and the ``max_by`` of a string keep object buffers, so a plain hash aggregate is
#: not possible): its input comes out of the ``lag`` window sorted by series and time, and each
#: series' windows follow one another in that order, so the sort before it finds its input in order
#: (TimSort: one pass) and the aggregate keeps one group's buffer at a time, no hash map of 65,536
#: object buffers per task.  On 2.7 GB of snapshots (local[2], back to back): 53.5 and 55.0 s, 93 and
#: 96 CPU-s, against 58.6 and 58.4 s, 102 CPU-s.
SORT_AGGREGATE = {"spark.sql.execution.useObjectHashAggregateExec": "false"}


#: The driver's heap on a local master, where it is also the executor's (Spark's default 1g: on 2.7 GB of
#: snapshots the window's sort spilled and the JVM spent 14 CPU-s in GC instead of 5; -14% CPU-s in all).
LOCAL_DRIVER_MEMORY = "2g"


#: The JIT of the JVM a local job starts: HotSpot's optimizing compiler (C2) takes a method ten times
#: later than by default (50,000 calls instead of 5,000; loops likewise).  The job's per-row code
#: gets there in the first second anyway; the tens of thousands of methods of Spark's planner,
#: code generator and task set-up that run a few thousand times each stay with the quick compiler
#: (C1), which costs less CPU in all (the figures are in the changelog).
LOCAL_JIT_OPTIONS = ("-XX:Tier4InvocationThreshold=50000 -XX:Tier4MinInvocationThreshold=6000 "
                     "-XX:Tier4CompileThreshold=150000 -XX:Tier4BackEdgeThreshold=400000")


def local_settings(input_bytes: int | None, cores: int | None = None) -> dict[str, str]:
    """The session settings the job sizes for a local master (a cluster's own settings are left alone;
    any of them set by ``--conf`` or ``spark-defaults.conf`` wins)."""
    return {"spark.sql.shuffle.partitions": str(shuffle_partitions(input_bytes, cores)),
            **SORT_AGGREGATE,
            "spark.driver.memory": LOCAL_DRIVER_MEMORY,
            "spark.driver.extraJavaOptions": LOCAL_JIT_OPTIONS}


def check_args(args: argparse.Namespace) -> dict[str, Any]:
    """Everything that can be wrong before Spark starts: values, outputs, and local inputs that are not there."""
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
    if args.max_bad_records < 0:
        raise UsageError(f"--max-bad-records must not be negative, not {args.max_bad_records}")
    if args.html:
        _parent_must_exist("--html", args.html)
    if args.summary_json:
        _parent_must_exist("--summary-json", args.summary_json)
    if args.output:
        _output_must_be_a_directory("--output", args.output)
    if args.rejected_path:
        _output_must_be_a_directory("--rejected-path", args.rejected_path)
    check_master(args.master)
    conf = parse_conf(args.conf)
    files = check_local_inputs(args.paths, args.pattern or None, allow_empty=args.allow_empty)
    return {"window": window, "max_gap": max_gap, "conf": conf, "files": files,
            "bytes": _local_bytes(args.paths, args.pattern or None)}


def _flag_bad(value: Any) -> Any:
    """The parse of :func:`read_snapshot_lines` as a flag on a line (blank lines are not rejected)."""
    from pyspark.sql import functions as F

    parsed = F.from_json(value, SNAPSHOT_SCHEMA + ", _corrupt_record STRING",
                         {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_corrupt_record"})
    return ~value.rlike(_BLANK) & (parsed.isNull() | parsed["_corrupt_record"].isNotNull()
                                            | parsed["timestamp"].isNull() | parsed["stats"].isNull())


def _handle_rejected(spark: Any, args: argparse.Namespace, figures: dict[str, Any], err: Any) -> None:
    """Say how many lines were rejected and where the first one is; write them out; fail past the threshold.

    The job's pass counted them (:func:`read_snapshot_records`); the lines themselves come from a
    second read, as text, only now that there are some."""
    from pyspark.sql import functions as F

    first = figures["first_rejected_file"]
    line = first_line_where(spark, first, _flag_bad) if first else None
    figures["first_rejected_line"] = line
    target = args.rejected_path or (args.output.rstrip("/") + "/_rejected" if args.output else "")
    lines = read_snapshot_lines(spark, args.paths, args.pattern or None)
    rejected = lines.where(F.col("_bad").isNotNull()).select(
        F.col("_file").alias("file"), F.col("_bad").alias("reason"), F.col("_value").alias("value"))
    figures["rejected_path"] = report_rejected("nsqtw-stats", rejected, figures["rejected_lines"],
                                               figures["input_lines"], first, line, target or None,
                                               args.max_bad_records, err)


def _delete_path(spark: Any, path: str) -> None:
    """Delete a directory through Hadoop's FileSystem (any URI Spark reads)."""
    jvm = spark.sparkContext._jvm
    target = jvm.org.apache.hadoop.fs.Path(path)
    fs = target.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    if fs.exists(target):
        fs.delete(target, True)


def _write_result(result: Any, output: str, fmt: str, mode: str) -> None:
    from pyspark.sql import functions as F

    writer_df = result
    if fmt == "csv":  # CSV has no map type: e2e_ms as a JSON object
        writer_df = result.withColumn("e2e_ms", F.to_json("e2e_ms"))
    writer = writer_df.write.mode(mode).partitionBy("date")
    if fmt == "csv":
        writer.option("header", "true").csv(output)
    elif fmt == "json":
        writer.json(output)
    else:
        writer.parquet(output)


def _json_value(value: Any) -> Any:
    from datetime import datetime

    if isinstance(value, datetime):
        return utc_text(value).replace(" ", "T")
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def summary_document(rows: Sequence[Any], figures: dict[str, Any]) -> dict[str, Any]:
    """``--summary-json``: the run's figures and every series' summary row."""
    return {**{k: _json_value(v) for k, v in figures.items()},
            "series": [{k: _json_value(v) for k, v in r.asDict().items()} for r in rows]}


def run(args: argparse.Namespace, spark: Any = None, out: Any = None, err: Any = None) -> dict[str, Any]:
    """The job behind the CLI; returns figures for callers and tests.

    Raises :class:`~nsqtw.spark.cli.JobError` (one line) for bad arguments, missing or empty input and
    more malformed lines than ``--max-bad-records``.
    """
    out = out or sys.stdout
    checked = check_args(args)
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    window, max_gap = checked["window"], checked["max_gap"]
    progress = Progress("nsqtw-stats", getattr(args, "quiet", False), err)
    own = spark is None
    archive_applies, archive = False, ""
    if own and args.master:
        reach_master(args.master)  # a spark:// or k8s:// master that does not answer: seconds, one line
    if own:
        progress(f"starting Spark ({args.master or 'the master of spark-submit or spark-defaults.conf, else local[*]'})")
        local = local_settings(checked["bytes"])
        archive_applies = class_archive_applies(args.master, checked["conf"])
        archive = classcache.share_options() if archive_applies else ""
        if archive:  # Spark's classes mapped, not loaded: seconds off the start
            local["spark.driver.extraJavaOptions"] += " " + archive
        spark = get_session("nsqtw-stats", args.master, checked["conf"], progress=progress_bar(args),
                            verbose=args.verbose, local_conf=local)
        progress(f"Spark {spark.version} on {spark.sparkContext.master}")
    result = None
    try:
        found = "" if checked["files"] is None else f" ({checked['files']} files)"
        progress(f"reading snapshots from {', '.join(args.paths)}{found}")
        lines = _read_or_fail(spark, args.paths, args.pattern or None)
        observed = Observation("nsqtw_stats_input")
        counted = lines.observe(observed, F.count(F.lit(1)).alias("lines"), F.count("_bad").alias("bad"),
                                F.min(F.when(F.col("_bad").isNotNull(), F.col("_file"))).alias("first_bad_file"))
        progress(f"computing {args.window} windows")
        computed = compute_stats(counted.where(F.col("_bad").isNull()), window, max_gap)
        computed = _local_coalesce(spark, computed)
        # the table's rows, counted as the cache fills (no job of their own)
        written = Observation("nsqtw_stats_output")
        result = computed.observe(written, F.count(F.lit(1)).alias("rows")).cache()
        # the one pass over the input: it fills the cache, the rest reads the (small) result
        all_rows = summarize(result).collect()
        try:
            metrics = observed.get
        except Exception:  # no metrics when Spark optimized the (empty) plan away: count again, cheaply
            metrics = lines.agg(F.count(F.lit(1)).alias("lines"), F.count("_bad").alias("bad"), F.min(
                F.when(F.col("_bad").isNotNull(), F.col("_file"))).alias("first_bad_file")).collect()[0].asDict()
        figures: dict[str, Any] = {
            "window": args.window, "input_lines": int(metrics.get("lines") or 0),
            "rejected_lines": int(metrics.get("bad") or 0), "first_rejected_file": metrics.get("first_bad_file"),
            "first_rejected_line": None, "rejected_path": None,
        }
        if figures["rejected_lines"]:
            _handle_rejected(spark, args, figures, err)
        elif args.output and not args.rejected_path:
            _delete_path(spark, args.output.rstrip("/") + "/_rejected")  # a previous run's, now stale
        total = len(all_rows)
        if total == 0:
            what = f"no snapshots in {', '.join(args.paths)}" + (
                f" (files matching --pattern {args.pattern!r} hold no export records)" if args.pattern else "")
            if not args.allow_empty:
                raise InputError(what + " (--allow-empty to accept that)")
            out.write(f"nsqtw-stats: 0 node/topic/channel series: {what}; nothing written\n")
            return {"series": 0, "rows": [], **figures, "class_archive_wanted": archive_applies and not archive}
        first = min(r["first"] for r in all_rows)
        last = max(r["last"] for r in all_rows)
        anomalies = sum(int(r["counter_anomalies"] or 0) for r in all_rows)
        figures.update({"master": spark.sparkContext.master, "series_count": total, "first": first, "last": last, "counter_anomalies": anomalies,
                        "output": args.output or None, "format": args.format, "rows_written": 0})
        if anomalies:
            (err or sys.stderr).write(
                f"nsqtw-stats: warning: {anomalies} snapshots with a counter that went down without a restart "
                "(a topic or channel re-created, or a broken exporter) or below zero; negative counters are not "
                "used for rates (column counter_anomalies)\n")
        if args.output:
            try:
                rows_total = int(written.get["rows"])
            except Exception:  # as above: no metrics from a plan Spark optimized away
                rows_total = result.count()
            progress(f"writing {rows_total} rows to {args.output} ({args.format})")
            _write_result(result, args.output, args.format, args.mode)
            figures["rows_written"] = rows_total
        progress("summarizing")
        rows = all_rows[:args.limit]
        out.write(f"nsqtw-stats: {total} node/topic/channel series, windows of {args.window}, "
                  f"{utc_text(first)} .. {utc_text(last)}\n")
        out.write(f"pub/s and fin/s: means over each series' snapshots in {utc_text(first)} .. {utc_text(last)}; "
                  "drain in: the backlog's trend in the series' last window with rates (drain at)\n\n")
        out.write(format_summary(rows, total))
        if args.summary_json:
            import json
            with open(args.summary_json, "w", encoding="utf-8") as f:
                json.dump(summary_document(all_rows, figures), f, indent=1)
                f.write("\n")
        if args.html:
            progress(f"writing the report to {args.html}")
            series, marks = chart_data(result, args.top, all_rows)
            html = render_report(summary_rows=all_rows[:max(args.limit, 200)], series=series,
                                 window=args.window, span=(first, last), total=total, marks=marks)
            with open(args.html, "w", encoding="utf-8") as f:
                f.write(html)
            out.write(f"\nreport written to {args.html}\n")
        progress("done")
        # the CLI (main) builds the class archive for the next run once this one is done
        return {"series": total, "rows": rows, **figures, "class_archive_wanted": archive_applies and not archive}
    finally:
        if result is not None:
            result.unpersist()
        if own:
            spark.stop()


def _local_coalesce(spark: Any, table: Any) -> Any:
    """On a local master, the table in one partition per core (``spark.default.parallelism``): the
    aggregation's tasks each take several of its shuffle's partitions in turn, and the summary, the
    charts and the output (one file per task and date) pass over a few partitions, not one per 128 MiB
    of input.  A cluster's partitions are left alone
    (its parallelism can be small while executors are still being added)."""
    sc = spark.sparkContext
    if sc.master == "local" or sc.master.startswith("local["):
        return table.coalesce(max(1, sc.defaultParallelism))
    return table


def _read_or_fail(spark: Any, paths: Sequence[str], pattern: str | None) -> Any:
    """:func:`read_snapshot_records`, with Spark's "path does not exist" as one :class:`InputError` line."""
    try:
        return read_snapshot_records(spark, paths, pattern)
    except Exception as e:
        if error_class(e) == "PATH_NOT_FOUND":
            raise InputError("input not found: " + describe_error(e)) from e
        raise


def warm_up_job(options: str) -> Any:
    """The job that fills the class archive (:func:`nsqtw.spark.classcache.build`): this job, with
    ``--html``, ``--summary-json`` and Parquet output, on a few generated snapshots, in a local JVM
    started with this job's own options plus ``options``; returns that JVM's process."""
    import io
    import shutil
    import tempfile

    from pyspark import SparkContext

    work = tempfile.mkdtemp(prefix="nsqtw-warm-up-")
    try:
        data = os.path.join(work, "in")
        os.mkdir(data)
        classcache.write_snapshots(data)
        local = local_settings(sum(os.path.getsize(os.path.join(data, n)) for n in os.listdir(data)), cores=2)
        local["spark.driver.extraJavaOptions"] += " " + options
        spark = get_session("nsqtw-warm-up", "local[2]", {"spark.ui.enabled": "false"}, verbose=False,
                            local_conf=local)
        try:
            args = build_parser().parse_args(
                [data, "-q", "-o", os.path.join(work, "out"), "--html", os.path.join(work, "report.html"),
                 "--summary-json", os.path.join(work, "summary.json")])
            run(args, spark=spark, out=io.StringIO(), err=io.StringIO())
        finally:
            spark.stop()
        return getattr(SparkContext._gateway, "proc", None)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _cli_job(args: argparse.Namespace) -> dict[str, Any]:
    """:func:`run`, then (the command only: a library caller of :func:`run` never leaves a process
    behind) the class archive's warm-up in the background when this run wanted one and found none."""
    figures = run(args)
    if figures.get("class_archive_wanted"):
        classcache.build_in_background()  # for the next run, now that this one's work is done
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    return run_main("nsqtw-stats", build_parser(), _cli_job, argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
