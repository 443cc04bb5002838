"""
``nsqtw-replay``: read ``nsq_to_file`` archives with Spark, de-duplicate, and republish or rewrite them.

Archives (agreed project-wide), plain or gzip (``.gz``, concatenated members
as ``nsq_to_file --gzip`` writes them; Hadoop's codec reads them all):

* **jsonl** (nsqtw's ``nsq_to_file --output-format=jsonl``), one object a line::

      {"topic": "t", "channel": "c", "node": "host:4150", "id": "<16 hex>", "timestamp": <ns>,
       "attempts": 1, "body": "<base64>"}

  ``node`` is the nsqd (TCP address) the message was read from; archives
  written before it existed have none and are still read (``node`` null).
  De-duplicated by ``(topic, node, id)``: nsqd message IDs are unique per node
  only, so two nodes' messages with one id are both kept.  Of the copies, the
  one with the fewest attempts is kept.  A record without ``node`` and one
  with it are different keys (an old archive and a new one of the same
  messages are not de-duplicated against each other).
* **raw** (Go's ``nsq_to_file``): the body, one per line, no IDs.  Fallback:
  de-duplicated by the exact body per topic (so identical bodies published
  twice on purpose collapse to one).  The topic is the file name up to its
  first ``.`` (``<TOPIC>.<HOST><REV>.<DATETIME>.log``), or ``--topic`` when
  topic names contain dots.  Lines split on ``\\n`` only; bodies are kept as
  bytes (not decoded).  A body that itself contains ``\\n`` was already split
  by ``nsq_to_file``; nothing can rejoin it.

The two formats never de-duplicate against each other: a raw line has no id
and a jsonl record's key is its id, so the same messages archived once raw
and once as jsonl are all kept (twice).  Replay one format (``--format``).

``--format auto`` (the default) decides per line: a JSON object with a 16-hex
``id``, a ``topic`` and a base64 ``body`` is a jsonl record, anything else a
raw body.  ``--since``/``--until`` filter jsonl records by message timestamp
and raw lines by their file's modification time (coarse: raw lines carry no
time).  The result is republished in timestamp order (raw: file order) through
nsqd's HTTP ``/mpub?binary=true`` in batches from the driver, or written as a
de-duplicated archive (jsonl, gzip by default, partitioned by topic).
"""

from __future__ import annotations

import argparse
import http.client
import os
import struct
import sys
import time
from datetime import datetime, timezone
from typing import Any
from collections.abc import Iterable, Iterator, Sequence
from urllib.parse import quote, urlsplit

from .cli import (InputError, JobError, Progress, UsageError, add_common_arguments, add_rejected_arguments,
                  check_local_inputs, describe_error, error_class, first_line_where, local_path, progress_bar,
                  report_rejected, run_main)
from .session import add_spark_arguments, check_master, get_session, parse_conf, reach_master

__all__ = ["read_archives", "read_archive_lines", "split_archive_lines", "jsonl_files", "ping_nsqd", "deduplicate", "filter_time", "encode_mpub", "HttpPublisher", "publish_rows",
           "write_archive", "parse_time", "main"]

JSONL_SCHEMA = "topic STRING, channel STRING, node STRING, id STRING, timestamp BIGINT, attempts INT, body STRING"
COLUMNS = ["topic", "channel", "node", "id", "timestamp", "attempts", "body", "source", "source_mtime", "line"]


#: Why a line of a jsonl archive was rejected (``reason`` in the rejected output).
REJECT_MALFORMED = "malformed JSON (a torn or garbled line)"
REJECT_ID = "id is not 16 hex digits"
REJECT_TOPIC = "no topic"
REJECT_BODY = "body is missing or not base64"


def read_archive_lines(spark: Any, paths: Sequence[str], pattern: str | None = None, recursive: bool = False) -> Any:
    """Every non-empty archive line: ``value``, ``source``, ``source_mtime``, ``line`` (an ordering
    key), ``j`` (parsed as jsonl), ``body_bin`` and ``reject`` (null for a valid jsonl record, else why not)."""
    from pyspark.sql import functions as F

    reader = spark.read.option("lineSep", "\n")
    if pattern:
        reader = reader.option("pathGlobFilter", pattern)
    if recursive:
        reader = reader.option("recursiveFileLookup", "true")
    lines = reader.text(list(paths)).select(
        "value",
        F.col("_metadata.file_path").alias("source"),
        F.col("_metadata.file_modification_time").alias("source_mtime"),
        F.monotonically_increasing_id().alias("line"),
    ).where(F.length("value") > 0)
    parsed = F.from_json(F.col("value"), JSONL_SCHEMA + ", _corrupt_record STRING",
                         {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_corrupt_record"})
    lines = lines.withColumn("j", parsed)
    lines = lines.withColumn("body_bin", F.try_to_binary(F.col("j.body"), F.lit("base64")))
    reject = (F.when(F.col("j").isNull() | F.col("j._corrupt_record").isNotNull(), F.lit(REJECT_MALFORMED))
              .when(~F.coalesce(F.col("j.id").rlike("^[0-9a-f]{16}$"), F.lit(False)), F.lit(REJECT_ID))
              .when(F.col("j.topic").isNull(), F.lit(REJECT_TOPIC))
              .when(F.col("body_bin").isNull(), F.lit(REJECT_BODY)))
    return lines.withColumn("reject", reject)


def jsonl_files(lines: Any) -> list[str]:
    """The files holding at least one valid jsonl record (``--format auto`` reads them as jsonl)."""
    from pyspark.sql import functions as F

    return sorted(r["source"] for r in lines.where(F.col("reject").isNull()).select("source").distinct().collect())


def _as_jsonl(lines: Any) -> Any:
    from pyspark.sql import functions as F

    return lines.select(
        F.col("j.topic").alias("topic"), F.col("j.channel").alias("channel"), F.col("j.node").alias("node"),
        F.col("j.id").alias("id"), F.col("j.timestamp").alias("timestamp"), F.col("j.attempts").alias("attempts"),
        F.col("body_bin").alias("body"), "source", "source_mtime", "line")


def _as_raw(lines: Any, raw_topic: str | None) -> Any:
    from pyspark.sql import functions as F

    name = F.regexp_extract(F.col("source"), r"([^/]+)$", 1)
    topic = F.lit(raw_topic) if raw_topic else F.split(name, r"\.").getItem(0)
    return lines.select(
        topic.alias("topic"), F.lit(None).cast("string").alias("channel"), F.lit(None).cast("string").alias("node"),
        F.lit(None).cast("string").alias("id"),
        F.lit(None).cast("long").alias("timestamp"), F.lit(None).cast("int").alias("attempts"),
        F.col("value").cast("binary").alias("body"), "source", "source_mtime", "line")


def split_archive_lines(lines: Any, fmt: str = "auto", raw_topic: str | None = None,
                        jsonl_sources: Sequence[str] | None = None) -> tuple[Any, Any]:
    """(records, rejected lines) from :func:`read_archive_lines`.

    ``jsonl``: valid records; any other line is rejected.  ``raw``: every line is a body.  ``auto``:
    decided per file: a file with a valid jsonl record (``jsonl_sources``) is a jsonl archive, and its
    other lines are rejected (a torn record never becomes a message body); any other file is raw.
    """
    from pyspark.sql import functions as F

    if fmt not in ("auto", "jsonl", "raw"):
        raise ValueError(f"unknown archive format {fmt!r}")
    valid = F.col("reject").isNull()
    rejected_cols = [F.col("source").alias("file"), F.col("reject").alias("reason"), F.col("value")]
    if fmt == "raw":
        return _as_raw(lines, raw_topic), lines.where(F.lit(False)).select(*rejected_cols)
    if fmt == "jsonl":
        return _as_jsonl(lines.where(valid)), lines.where(~valid).select(*rejected_cols)
    in_jsonl = F.col("source").isin(list(jsonl_sources or []))
    records = _as_jsonl(lines.where(in_jsonl & valid)).unionByName(_as_raw(lines.where(~in_jsonl), raw_topic))
    return records, lines.where(in_jsonl & ~valid).select(*rejected_cols)


def read_archives(spark: Any, paths: Sequence[str], fmt: str = "auto", raw_topic: str | None = None,
                  pattern: str | None = None, recursive: bool = False) -> Any:
    """Archive lines as rows: topic, channel, id, timestamp (ns), attempts, body (bytes), source...

    Rejected lines (see :func:`split_archive_lines`) are left out: the CLI counts and reports them.
    """
    if fmt not in ("auto", "jsonl", "raw"):
        raise ValueError(f"unknown archive format {fmt!r}")
    lines = read_archive_lines(spark, paths, pattern, recursive)
    sources = jsonl_files(lines) if fmt == "auto" else None
    return split_archive_lines(lines, fmt, raw_topic, sources)[0]


def _flag_rejected_jsonl(value: Any) -> Any:
    """A jsonl line that :func:`read_archive_lines` rejects (for numbering the first one)."""
    from pyspark.sql import functions as F

    j = F.from_json(value, JSONL_SCHEMA + ", _corrupt_record STRING",
                    {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_corrupt_record"})
    body = F.try_to_binary(j["body"], F.lit("base64"))
    return (F.length(value) > 0) & (j.isNull() | j["_corrupt_record"].isNotNull()
                                    | ~F.coalesce(j["id"].rlike("^[0-9a-f]{16}$"), F.lit(False))
                                    | j["topic"].isNull() | body.isNull())


def parse_time(text: str) -> int:
    """``--since``/``--until``: unix seconds or ISO 8601 (``Z`` or offset; naive means UTC) -> ns."""
    t = text.strip()
    try:
        return int(float(t) * 1_000_000_000)
    except ValueError:
        pass
    if t.endswith("Z"):
        t = t[:-1] + "+00:00"
    dt = datetime.fromisoformat(t)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return int(dt.timestamp() * 1_000_000) * 1000


def filter_time(df: Any, since_ns: int | None = None, until_ns: int | None = None) -> Any:
    """[since, until): message timestamp for jsonl rows, file modification time for raw rows."""
    from pyspark.sql import functions as F

    mtime_ns = F.unix_micros(F.col("source_mtime")) * 1000
    when = F.coalesce(F.col("timestamp"), mtime_ns)
    if since_ns is not None:
        df = df.where(when >= F.lit(since_ns))
    if until_ns is not None:
        df = df.where(when < F.lit(until_ns))
    return df


def deduplicate(df: Any) -> Any:
    """One row per (topic, node, id) for jsonl rows, per (topic, body) for raw rows.

    A jsonl record without ``node`` (an archive from before it) has the key (topic, no node, id).
    """
    from pyspark.sql import functions as F

    cols = COLUMNS
    node = F.when(F.col("node").isNull(), F.lit(b"-")).otherwise(F.concat(F.lit(b"n"), F.col("node").cast("binary")))
    keyed = df.withColumn("_key", F.when(F.col("id").isNotNull(),
                                         F.concat(F.lit(b"i"), F.col("id").cast("binary"), node))
                          .otherwise(F.concat(F.lit(b"b"), F.col("body"))))
    order = F.struct(F.coalesce("attempts", F.lit(0)), F.coalesce("timestamp", F.lit(0)), "source_mtime", "source",
                     "line")
    picked = keyed.groupBy("topic", "_key").agg(F.min_by(F.struct(*cols), order).alias("r"))
    return picked.select("r.*")


def ordered(df: Any) -> Any:
    """Timestamp order (jsonl); raw rows by file time, file and line, after the jsonl of the same time."""
    from pyspark.sql import functions as F

    when = F.coalesce(F.col("timestamp"), F.unix_micros(F.col("source_mtime")) * 1000)
    return df.orderBy(when, "source", "line")


def encode_mpub(bodies: Sequence[bytes]) -> bytes:
    """``/mpub?binary=true``: [4-byte count] then [4-byte size][body] per message."""
    parts = [struct.pack(">i", len(bodies))]
    for b in bodies:
        parts.append(struct.pack(">i", len(b)))
        parts.append(b)
    return b"".join(parts)


class PublishError(Exception):
    """nsqd refused a batch (4xx) or kept failing (5xx, connection errors) past the retries."""


class HttpPublisher:
    """Batches to one or more nsqd HTTP addresses (round robin), keep-alive, retries with backoff."""

    def __init__(self, addresses: Sequence[str], timeout: float = 10.0, retries: int = 5,
                 backoff: float = 0.5, sleep: Any = time.sleep) -> None:
        if not addresses:
            raise ValueError("at least one nsqd HTTP address is needed")
        self.targets = [self._split(a) for a in addresses]
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.sleep = sleep
        self._conns: dict[int, http.client.HTTPConnection] = {}
        self._next = 0
        self.batches = 0
        self.messages = 0

    @staticmethod
    def _split(address: str) -> tuple[str, int, str]:
        url = urlsplit(address if "://" in address else "http://" + address)
        if url.scheme not in ("http", "https"):
            raise ValueError(f"unsupported scheme in {address!r}")
        return url.scheme, url.port or (443 if url.scheme == "https" else 4151), url.hostname or "127.0.0.1"

    def _conn(self, i: int) -> http.client.HTTPConnection:
        conn = self._conns.get(i)
        if conn is None:
            scheme, port, host = self.targets[i]
            cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
            conn = cls(host, port, timeout=self.timeout)
            self._conns[i] = conn
        return conn

    def publish(self, topic: str, bodies: Sequence[bytes]) -> None:
        if not bodies:
            return
        payload = encode_mpub(bodies)
        path = f"/mpub?topic={quote(topic, safe='')}&binary=true"
        delay = self.backoff
        last: Any = None
        for attempt in range(self.retries + 1):
            i = self._next % len(self.targets)
            self._next += 1
            try:
                conn = self._conn(i)
                conn.request("POST", path, body=payload, headers={"Content-Type": "application/octet-stream"})
                resp = conn.getresponse()
                text = resp.read()
                if resp.status == 200:
                    self.batches += 1
                    self.messages += len(bodies)
                    return
                if 400 <= resp.status < 500:
                    raise PublishError(f"nsqd refused /mpub to {topic!r}: {resp.status} {text[:200]!r}")
                last = f"{resp.status} {text[:200]!r}"
            except PublishError:
                raise
            except (OSError, http.client.HTTPException) as e:
                last = e
                self._drop(i)
            if attempt < self.retries:
                self.sleep(delay)
                delay = min(delay * 2, 10.0)
        raise PublishError(f"publishing to {topic!r} failed after {self.retries + 1} attempts: {last}")

    def _drop(self, i: int) -> None:
        conn = self._conns.pop(i, None)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        for i in list(self._conns):
            self._drop(i)


def publish_rows(rows: Iterable[Any], publisher: Any, topic: str | None = None, batch_size: int = 100,
                 max_batch_bytes: int = 4 * 1024 * 1024, rate: float = 0.0, clock: Any = time) -> int:
    """Publish rows in order, batched per destination topic; returns the number published."""
    pending: dict[str, list[bytes]] = {}
    sizes: dict[str, int] = {}
    sent = 0
    started = clock.monotonic()

    def flush(t: str) -> None:
        nonlocal sent
        bodies = pending.pop(t, [])
        sizes.pop(t, None)
        if not bodies:
            return
        if rate > 0:
            due = started + (sent + len(bodies)) / rate
            wait = due - clock.monotonic()
            if wait > 0:
                clock.sleep(wait)
        publisher.publish(t, bodies)
        sent += len(bodies)

    for row in rows:
        dest = topic or row["topic"]
        body = bytes(row["body"])
        if not body:
            continue
        if pending.get(dest) and (len(pending[dest]) >= batch_size or sizes[dest] + len(body) + 4 > max_batch_bytes):
            flush(dest)
        pending.setdefault(dest, []).append(body)
        sizes[dest] = sizes.get(dest, 4) + len(body) + 4
    for t in list(pending):
        flush(t)
    return sent


def write_archive(df: Any, output: str, output_format: str = "jsonl", compression: str = "gzip",
                  mode: str = "errorifexists") -> None:
    """A de-duplicated archive under ``output/topic=<t>/``: jsonl records, or raw bodies one a line."""
    from pyspark.sql import functions as F

    if output_format == "jsonl":
        value = F.to_json(F.struct("topic", "channel", "node", "id", "timestamp", "attempts",
                                   F.base64("body").alias("body")), {"ignoreNullFields": "false"})
    else:
        value = F.col("body").cast("string")
    when = F.coalesce(F.col("timestamp"), F.unix_micros(F.col("source_mtime")) * 1000)
    out = (df.withColumn("_when", when).repartition("topic")
           .sortWithinPartitions("topic", "_when", "source", "line")
           .select("topic", value.alias("value")))
    writer = out.write.mode(mode).partitionBy("topic").option("lineSep", "\n")
    if compression and compression != "none":
        writer = writer.option("compression", compression)
    writer.text(output)


def ping_nsqd(address: str, timeout: float = 5.0) -> None:
    """``GET /ping`` on an nsqd HTTP address: :class:`JobError` (one line) unless it answers 200 OK."""
    scheme, port, host = HttpPublisher._split(address)
    cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
    conn = cls(host, port, timeout=timeout)
    try:
        conn.request("GET", "/ping")
        resp = conn.getresponse()
        resp.read()
        if resp.status != 200:
            raise JobError(f"--nsqd-http-address {address}: GET /ping answered {resp.status} {resp.reason}; "
                           "nothing read or published")
    except (OSError, http.client.HTTPException) as e:
        raise JobError(f"--nsqd-http-address {address}: nsqd not reachable ({getattr(e, 'strerror', None) or e}); "
                       "nothing read or published") from None
    finally:
        conn.close()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nsqtw-replay",
        description="De-duplicate nsq_to_file archives with Spark and republish them to nsqd over HTTP "
                    "(/mpub) or write a clean archive.")
    p.add_argument("paths", nargs="+", help="archive files or directories (local paths or Hadoop URIs)")
    p.add_argument("--format", choices=("auto", "jsonl", "raw"), default="auto",
                   help="archive format (default auto: decided per line)")
    p.add_argument("--topic", default="", help="topic of raw archives (default: the file name up to its first '.')")
    p.add_argument("--pattern", default="", help="file name glob inside directories (e.g. '*.log*')")
    p.add_argument("--recursive", action="store_true", help="descend into sub-directories")
    p.add_argument("--since", default="", help="keep messages at or after this time (unix seconds or ISO 8601)")
    p.add_argument("--until", default="", help="keep messages before this time (unix seconds or ISO 8601)")
    p.add_argument("--no-dedupe", action="store_true", help="keep duplicates")
    p.add_argument("--nsqd-http-address", action="append", default=[],
                   help="republish to this nsqd (host:port or http(s)://host:port; repeatable: round robin)")
    p.add_argument("--destination-topic", default="", help="republish everything to this topic (default: each "
                                                          "message to its own topic)")
    p.add_argument("--batch-size", type=int, default=100, help="messages per /mpub (default 100)")
    p.add_argument("--max-batch-bytes", type=int, default=4 * 1024 * 1024,
                   help="bytes per /mpub body, below nsqd's --max-body-size (default 4 MiB)")
    p.add_argument("--rate", type=float, default=0.0, help="messages per second (default 0: unthrottled)")
    p.add_argument("-o", "--output", default="", help="write the de-duplicated archive to this directory")
    p.add_argument("--output-format", choices=("jsonl", "raw"), default="jsonl")
    p.add_argument("--compression", default="gzip", help="gzip (default), none, or any Spark text codec")
    p.add_argument("--dry-run", action="store_true", help="count only")
    add_rejected_arguments(p, "<output>/_rejected when the archive is written; otherwise not kept")
    add_common_arguments(p)
    add_spark_arguments(p)
    return p


def check_args(args: argparse.Namespace) -> dict[str, Any]:
    """Everything that can be wrong before Spark starts: values, and local inputs that are not there."""
    if not (args.nsqd_http_address or args.output or args.dry_run):
        raise UsageError("nothing to do: give --nsqd-http-address, --output or --dry-run")
    times: dict[str, int | None] = {}
    for name in ("since", "until"):
        text = getattr(args, name)
        try:
            times[name] = parse_time(text) if text else None
        except ValueError:
            raise UsageError(f"--{name} {text!r}: not a time (give unix seconds or ISO 8601, "
                             "e.g. 2024-05-01T10:00:00Z)") from None
    since, until = times["since"], times["until"]
    if since is not None and until is not None and since >= until:
        raise UsageError(f"--since {args.since} is not before --until {args.until}")
    if args.batch_size < 1:
        raise UsageError(f"--batch-size must be at least 1, not {args.batch_size}")
    if args.max_batch_bytes < 8:
        raise UsageError(f"--max-batch-bytes must be at least 8, not {args.max_batch_bytes}")
    if args.max_bad_records < 0:
        raise UsageError(f"--max-bad-records must not be negative, not {args.max_bad_records}")
    if args.rate < 0:
        raise UsageError(f"--rate must not be negative, not {args.rate}")
    for address in args.nsqd_http_address:
        try:
            HttpPublisher._split(address)
        except ValueError as e:
            raise UsageError(f"--nsqd-http-address {address!r}: {e}") from None
    if args.output and not args.dry_run:
        local = local_path(args.output)
        if local is not None and os.path.exists(local):
            raise UsageError(f"--output {args.output} already exists (a clean archive goes to a new directory)")
    check_master(args.master)
    conf = parse_conf(args.conf)
    files = check_local_inputs(args.paths, args.pattern or None, args.recursive, args.allow_empty)
    return {"since": since, "until": until, "conf": conf, "files": files}


def run(args: argparse.Namespace, spark: Any = None, out: Any = None, err: Any = None) -> dict[str, int]:
    """The job behind the CLI; raises :class:`~nsqtw.spark.cli.JobError` (one line) for bad arguments
    and missing or empty input."""
    out = out or sys.stdout
    checked = check_args(args)
    if args.nsqd_http_address and not args.dry_run:
        for address in args.nsqd_http_address:
            ping_nsqd(address)  # before any Spark work: an unreachable nsqd fails in seconds, not after the job
    from pyspark.sql import functions as F

    progress = Progress("nsqtw-replay", getattr(args, "quiet", False), err)
    own = spark is None
    if own and args.master:
        reach_master(args.master)  # a spark:// or k8s:// master that does not answer: seconds, one line
    if own:
        progress(f"starting Spark ({args.master or 'the master of spark-submit or spark-defaults.conf, else local[*]'})")
        spark = get_session("nsqtw-replay", args.master, checked["conf"], progress=progress_bar(args),
                            verbose=args.verbose)
        progress(f"Spark {spark.version} on {spark.sparkContext.master}")
    df = result = lines = None
    try:
        found = "" if checked["files"] is None else f" ({checked['files']} files)"
        progress(f"reading archives from {', '.join(args.paths)}{found}")
        try:
            lines = read_archive_lines(spark, args.paths, args.pattern or None, args.recursive).cache()
            sources = jsonl_files(lines) if args.format == "auto" else None
        except Exception as e:
            if error_class(e) == "PATH_NOT_FOUND":
                raise InputError("input not found: " + describe_error(e)) from e
            raise
        df, rejected = split_archive_lines(lines, args.format, args.topic or None, sources)
        bad = rejected.count()
        deferred = None
        if bad:
            total_lines = lines.count()
            first = rejected.agg(F.min("file")).collect()[0][0]
            line = first_line_where(spark, first, _flag_rejected_jsonl)
            rejected_info = (rejected, bad, total_lines, first, line)
            if args.output and not args.dry_run and not args.rejected_path and bad <= args.max_bad_records:
                deferred = rejected_info  # written beside the archive once it is written
            else:
                report_rejected("nsqtw-replay", rejected, bad, total_lines, first, line, args.rejected_path or None,
                                args.max_bad_records, err)
        df = filter_time(df, checked["since"], checked["until"]).cache()
        read = df.count()
        if read == 0:
            what = f"no messages in {', '.join(args.paths)}" + (
                " between --since and --until" if args.since or args.until else "")
            if not args.allow_empty:
                raise InputError(what + " (--allow-empty to accept that)")
            out.write(f"nsqtw-replay: 0 messages read: {what}; nothing written or published\n")
            return {"read": 0, "kept": 0, "duplicates": 0, "published": 0}
        progress(f"{read} messages read; de-duplicating" if not args.no_dedupe else f"{read} messages read")
        result = df if args.no_dedupe else deduplicate(df).cache()
        kept = result.count()
        figures = {"read": read, "kept": kept, "duplicates": read - kept, "published": 0}
        out.write(f"nsqtw-replay: {read} messages read, {read - kept} duplicates dropped, {kept} kept\n")
        if args.output and not args.dry_run:
            progress(f"writing the archive to {args.output}")
            write_archive(result, args.output, args.output_format, args.compression)
            out.write(f"archive written to {args.output}\n")
        if deferred is not None:
            report_rejected("nsqtw-replay", *deferred, args.output.rstrip("/") + "/_rejected", args.max_bad_records,
                            err)
        figures["rejected"] = bad
        if args.nsqd_http_address and not args.dry_run:
            progress(f"publishing {kept} messages to {', '.join(args.nsqd_http_address)}")
            publisher = HttpPublisher(args.nsqd_http_address)
            try:
                rows: Iterator[Any] = ordered(result).select("topic", "body").toLocalIterator()
                figures["published"] = publish_rows(rows, publisher, args.destination_topic or None,
                                                    args.batch_size, args.max_batch_bytes, args.rate)
            finally:
                publisher.close()
            out.write(f"published {figures['published']} messages in {publisher.batches} batches\n")
        progress("done")
        return figures
    finally:
        for frame in (lines, df, result):
            if frame is not None:
                frame.unpersist()
        if own:
            spark.stop()


def main(argv: Sequence[str] | None = None) -> int:
    return run_main("nsqtw-replay", build_parser(), run, argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
