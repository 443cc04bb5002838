"""
``spark.readStream.format("nsq")``: NSQ as a Structured Streaming source with replayable offsets.

::

    from nsqtw.spark.source import register
    register(spark)
    stream = (spark.readStream.format("nsq")
              .option("nsqd", "127.0.0.1:4150")          # or .option("lookupd", "127.0.0.1:4161")
              .option("topic", "events").option("channel", "spark")
              .option("spoolDir", "/data/checkpoints/events-spool")
              .load())                                   # id, timestamp, attempts, body, topic, channel

Why a spool: Spark commits batch N only when it plans batch N+1, so a source
that FINs on ``commit`` keeps every message of a batch in flight for a whole
trigger, starves nsqd's RDY window (``max_in_flight``), stalls the stream and
gets everything redelivered on ``--msg-timeout``.  Here a consumer thread in
the driver's Python source process reads from nsqd with its own RDY window,
appends messages to a durable spool (:mod:`nsqtw.spark.spool`), fsyncs, and
only then FINs.  Offsets are spool positions (``{"seq": n, "spool": id}``),
so any batch can be re-read exactly; ``commit(end)`` deletes spooled data
below ``end``.  nsqd's window never waits for Spark.

Guarantees (documented in the README too):

* A message FINed to nsqd is on disk in the spool (fsync before FIN).
* Driver crash or restart: messages not yet fsynced were never FINed and nsqd
  redelivers them (at once, since the connection drops); spooled messages
  that Spark had not committed are re-read from the spool with the offsets of
  the checkpoint's offset log, so replayed batches are identical.  No message
  is lost as long as the spool directory survives with the checkpoint.
* Duplicates are possible (at-least-once into Spark): a crash between fsync
  and FIN spools a message that nsqd then redelivers (``attempts`` > 1), and
  nsqd itself redelivers on timeouts/requeues elsewhere.  De-duplicate on
  ``id`` (unique per nsqd) downstream if needed; with an idempotent sink (file
  sink, ``foreachBatch`` keyed by batch id) replays add nothing else.
* Losing the spool while keeping the checkpoint loses its uncommitted
  messages; with ``failOnDataLoss=true`` (default) the query stops with an
  error instead of skipping them.
* Backpressure: when ``maxSpoolMessages`` are spooled and uncommitted the
  consumer sends ``RDY 0`` until Spark catches up.

Options: ``nsqd`` (comma-separated host:port) or ``lookupd`` (comma-separated
HTTP addresses), ``topic``, ``channel`` (default ``spark``), ``spoolDir``
(required: a durable POSIX path, one per query), ``maxInFlight`` (200),
``maxRecordsPerBatch`` (0 = all available), ``maxSpoolMessages`` (1000000),
``partitionSize`` (10000 records per Spark partition), ``inline`` (true: the
records travel inside the partitions, which works on any cluster; false: the
executors read the spool files, which needs ``spoolDir`` on storage they see,
always true in local mode), ``failOnDataLoss`` (true), ``msgTimeout``,
``heartbeatInterval`` (seconds), ``lookupdPollInterval`` (60), ``authSecret``.
"""

from __future__ import annotations

import contextlib
import copyreg
import fcntl
import json
import logging
import os
import re
import struct
import sys
import threading
from datetime import datetime, timedelta, timezone
from typing import Any
from collections.abc import Iterator, Sequence

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition

from .consumer import BlockingConsumer
from .spool import DataLossError, Spool, read_range

__all__ = ["NsqDataSource", "NsqStreamReader", "SpoolPartition", "register", "check_workers", "WorkerImportError",
           "explain_failure", "await_termination", "SourceProcessDied", "SCHEMA"]

log = logging.getLogger("nsqtw.spark.source")

SCHEMA = "id STRING, timestamp TIMESTAMP, attempts INT, body BINARY, topic STRING, channel STRING"

_TRUE = ("true", "1", "yes", "on")


class WorkerImportError(RuntimeError):
    """Spark's Python processes cannot run ``format("nsq")`` (the planner on the driver or a worker)."""


@contextlib.contextmanager
def _shipped_by_value() -> Iterator[None]:
    """While registering: pickle nsqtw's classes and functions by value, not by module reference.

    Spark runs a Python data source in Python processes of its own: the planner (``schema``,
    ``streamReader``, the offsets and the consumer thread) is a Python worker that the driver's JVM
    spawns with ``spark.pyspark.python``, and ``read`` runs on the executors.  ``--py-files`` does not
    reach the planner, and a packed environment (``--archives``) is not unpacked on the driver in
    client mode.  Shipped by value, the source needs nsqtw only in the driver program; Spark's other
    Python processes need only pyspark and pyarrow, as any PySpark job does.  Scoped: the registry
    is restored afterwards, so nothing else pickles differently.
    """
    from pyspark import cloudpickle

    import nsqtw

    already = nsqtw.__name__ in cloudpickle.list_registry_pickle_by_value()
    if not already:
        cloudpickle.register_pickle_by_value(nsqtw)
    # module-level struct.Struct objects (the codecs') do not pickle: rebuilt from their format
    saved = copyreg.dispatch_table.get(struct.Struct)
    copyreg.dispatch_table[struct.Struct] = _reduce_struct
    try:
        yield
    finally:
        if saved is None:
            copyreg.dispatch_table.pop(struct.Struct, None)
        else:
            copyreg.dispatch_table[struct.Struct] = saved
        if not already:
            cloudpickle.unregister_pickle_by_value(nsqtw)


class _Struct(struct.Struct):
    """A ``struct.Struct`` that pickles (by its format): what a shipped codec's Struct becomes, so the
    planner process can ship the reader on to the executors in turn."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Struct, (self.format,))


def _reduce_struct(s: struct.Struct) -> tuple[Any, ...]:
    return (_Struct, (s.format,))


class _ProbeReader(DataSourceReader):
    def read(self, partition: Any) -> Iterator[tuple[str, str]]:
        import sys as worker_sys
        yield (worker_sys.executable, f"{worker_sys.version_info[0]}.{worker_sys.version_info[1]}")


class _ProbeDataSource(DataSource):
    """``format("nsqtw_probe")``: one row through the path ``format("nsq")`` takes (planner, executor)."""

    @classmethod
    def name(cls) -> str:
        return "nsqtw_probe"

    def schema(self) -> str:
        return "python STRING, version STRING"

    def reader(self, schema: Any) -> _ProbeReader:
        return _ProbeReader()


def check_workers(spark: Any) -> str:
    """Fail at once, with the fix, when Spark's Python processes cannot run the source.

    Reads one row through a probe data source registered exactly as :func:`register` registers
    ``format("nsq")``: planned by the driver-side Python worker (``spark.pyspark.python``), read on
    an executor.  Returns the executor's interpreter.
    """
    with _shipped_by_value():
        spark.dataSource.register(_ProbeDataSource)
    try:
        row = spark.read.format("nsqtw_probe").load().collect()[0]
    except Exception as e:  # a worker that does not start (a wrong spark.pyspark.python, no pyarrow...)
        from .cli import describe_error
        worker = getattr(spark.sparkContext, "pythonExec", None) or os.environ.get("PYSPARK_PYTHON", "python3")
        raise WorkerImportError(
            f"nsq source: Spark's Python workers cannot run a Python data source ({describe_error(e)}; "
            f"worker Python: {worker}, from spark.pyspark.python or PYSPARK_PYTHON, default python3). They "
            f"need this driver's Python version ({sys.version_info[0]}.{sys.version_info[1]}) with pyspark and "
            "pyarrow; nsqtw itself is shipped with the query. In local mode set PYSPARK_PYTHON to this "
            f"interpreter ({sys.executable}) before the SparkSession is created; on a cluster set "
            "spark.pyspark.python to such a Python on every node") from e
    return str(row["python"])


class SourceProcessDied(RuntimeError):
    """The query stopped because the process running ``format("nsq")`` died (Spark: "no cause message")."""


def _holder_gone(directory: str) -> tuple[bool, str]:
    """Whether the process that held the spool's lock is gone (its flock released), and its pid."""
    path = os.path.join(directory, "lock")
    try:
        with open(path, "rb") as f:
            pid = f.read().split(b"\n", 1)[0].decode("ascii", "replace").strip() or "?"
        with open(path, "ab") as f:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return False, pid
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
            return True, pid
    except OSError:
        return False, "?"


def explain_failure(error: Any) -> str | None:
    """Why a query reading ``format("nsq")`` stopped when Spark cannot say.

    When the Python process that runs the source (a Spark Python worker on the driver) dies, from
    a signal (``kill -9``, the OOM killer) or a crash, Spark ends the query with ``STREAM_FAILED
    ... (no cause message)``, or (when it was reading from the worker just then) with the
    worker's socket's ``Connection reset``.  Spark's error lists the source's offsets, which
    name the spool directory; a spool whose lock is free lost its process.  Returns one line, or
    None when the error is not that.
    """
    text = str(error or "")
    first = text.lstrip().split("\n", 1)[0]
    if "(no cause message)" not in text and not first.startswith("Connection reset"):
        return None
    dirs = list(dict.fromkeys(json.loads('"' + d + '"') for d in re.findall(r'"dir": "((?:[^"\\]|\\.)*)"', text)))
    for directory in dirs:
        gone, pid = _holder_gone(directory)
        if gone:
            return (f"the nsq source's process (pid {pid}, the Spark Python worker that ran format('nsq') with "
                    f"spoolDir {directory}) died without an error: killed by a signal (kill -9, the OOM killer) "
                    "or crashed. Nothing spooled is lost: start the query again with the same checkpoint and "
                    "spoolDir")
    if dirs or "] nsq" in text:
        return ("a Spark Python worker of the query died without an error (killed by a signal, e.g. the OOM "
                "killer, or crashed); with format('nsq') start the query again with the same checkpoint and spoolDir")
    return None


def await_termination(query: Any, timeout: float | None = None) -> Any:
    """``query.awaitTermination()``, raising :class:`SourceProcessDied` with the cause when the nsq
    source's process died and Spark only says "(no cause message)"."""
    try:
        return query.awaitTermination(timeout) if timeout is not None else query.awaitTermination()
    except Exception as e:
        why = explain_failure(e)
        if why is None:
            raise
        first = next((ln for ln in str(e).splitlines() if ln.strip()), "")
        raise SourceProcessDied(f"{why} (Spark: {first.strip()})") from e


def register(spark: Any, check: bool = True) -> None:
    """Make ``format("nsq")`` known to this SparkSession, its code shipped with it (Spark's Python
    processes need pyspark, not nsqtw); first check (``check``) that they can run a Python data source,
    and raise :class:`WorkerImportError` with the fix when they cannot."""
    if check:
        check_workers(spark)
    with _shipped_by_value():
        spark.dataSource.register(NsqDataSource)


class SpoolPartition(InputPartition):
    """A slice of the spool: file pieces for executors, or the records themselves (``inline``)."""

    def __init__(self, topic: str, channel: str, pieces: Sequence[tuple[str, int, int]],
                 records: list[tuple[bytes, int, int, bytes]] | None = None) -> None:
        super().__init__(None)
        self.topic = topic
        self.channel = channel
        self.pieces = list(pieces)
        self.records = records


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _row(topic: str, channel: str, mid: bytes, ts: int, attempts: int, body: bytes) -> tuple[Any, ...]:
    when = _EPOCH + timedelta(microseconds=ts // 1000)
    return (mid.decode("ascii", "replace"), when, attempts, body, topic, channel)


class NsqDataSource(DataSource):
    """``format("nsq")`` (streaming only)."""

    @classmethod
    def name(cls) -> str:
        return "nsq"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: Any) -> NsqStreamReader:
        return NsqStreamReader(dict(self.options))


def _split_list(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


class NsqStreamReader(DataSourceStreamReader):
    """Driver side: the consumer thread, the spool and the offsets."""

    def __init__(self, options: dict[str, str]) -> None:
        opts = {k.lower(): v for k, v in options.items()}
        self.topic = opts.get("topic", "")
        self.channel = opts.get("channel", "spark")
        if not self.topic:
            raise ValueError("format('nsq') needs option('topic', ...)")
        self.nsqd = _split_list(opts.get("nsqd"))
        self.lookupd = _split_list(opts.get("lookupd"))
        if not self.nsqd and not self.lookupd:
            raise ValueError("format('nsq') needs option('nsqd', 'host:port') or option('lookupd', 'host:port')")
        spool_dir = opts.get("spooldir", "")
        if not spool_dir:
            raise ValueError("format('nsq') needs option('spoolDir', path): a durable directory beside the "
                             "query's checkpoint, where messages wait (fsynced) until Spark commits them")
        self.max_in_flight = int(opts.get("maxinflight", "200"))
        self.max_records = int(opts.get("maxrecordsperbatch", "0"))
        self.max_spool = int(opts.get("maxspoolmessages", "1000000"))
        self.partition_size = max(1, int(opts.get("partitionsize", "10000")))
        self.inline = opts.get("inline", "true").lower() in _TRUE
        self.fail_on_data_loss = opts.get("failondataloss", "true").lower() in _TRUE
        self.msg_timeout = float(opts["msgtimeout"]) if opts.get("msgtimeout") else None
        self.heartbeat_interval = float(opts.get("heartbeatinterval", "30"))
        self.lookupd_poll_interval = float(opts.get("lookupdpollinterval", "60"))
        self.auth_secret = opts.get("authsecret") or None
        self.spool_dir = spool_dir
        self._spool: Spool | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.consumer: BlockingConsumer | None = None
        self._last_seq: int | None = None

    _RUNTIME = ("_spool", "_stop", "_thread", "_error", "consumer", "_last_seq")

    def __getstate__(self) -> dict[str, Any]:
        """Spark pickles the reader to ship ``read`` to executors: only the options travel."""
        return {k: v for k, v in self.__dict__.items() if k not in self._RUNTIME}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._spool = None
        self._stop = threading.Event()
        self._thread = None
        self._error = None
        self.consumer = None
        self._last_seq = None

    @property
    def spool(self) -> Spool:
        """Opened (and locked) on first use: Spark builds readers it never calls."""
        if self._spool is None:
            self._spool = Spool(self.spool_dir, self.topic, self.channel)
        return self._spool

    # --- the consumer thread ------------------------------------------------------

    def _ensure_consumer(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"nsq source: spooling failed: {self._error!r}") from self._error
        if self._thread is None:
            spool = self.spool  # opened here, before the thread exists: one Spool per process
            self.consumer = BlockingConsumer(
                self.topic, self.channel, nsqd_tcp_addresses=self.nsqd, lookupd_http_addresses=self.lookupd,
                max_in_flight=self.max_in_flight, heartbeat_interval=self.heartbeat_interval,
                msg_timeout=self.msg_timeout, lookupd_poll_interval=self.lookupd_poll_interval,
                auth_secret=self.auth_secret)
            self._thread = threading.Thread(target=self._run, args=(spool,), name=f"nsq-spool-{self.topic}",
                                            daemon=True)
            self._thread.start()

    def _run(self, spool: Spool) -> None:
        consumer = self.consumer
        assert consumer is not None
        try:
            while not self._stop.is_set():
                backlog = spool.end - spool.committed
                if backlog >= self.max_spool:
                    consumer.pause(True)
                elif consumer.paused and backlog < self.max_spool // 2:
                    consumer.pause(False)
                batch = consumer.poll(0.1)
                while batch and len(batch) < self.max_in_flight:
                    more = consumer.poll(0)
                    if not more:
                        break
                    batch.extend(more)
                if not batch:
                    continue
                spool.append([m for _conn, m in batch])  # fsynced when this returns...
                consumer.finish_many(batch)              # ...and only then FINed
        except BaseException as e:  # surfaced to Spark by the next latestOffset
            log.exception("nsq source: consumer thread failed")
            self._error = e
        finally:
            consumer.close()

    # --- offsets --------------------------------------------------------------------

    def _offset(self, seq: int) -> dict[str, Any]:
        # "dir" is for people and explain_failure (Spark prints offsets in its errors); only
        # "seq" and "spool" are read back
        return {"seq": seq, "spool": self.spool.spool_id, "dir": self.spool.directory}

    def _check_spool(self, offset: dict[str, Any]) -> int:
        seq = int(offset.get("seq", 0))
        if offset.get("spool") not in (None, self.spool.spool_id):
            text = (f"nsq source: the checkpoint refers to spool {offset.get('spool')}, but {self.spool.directory} "
                    f"is spool {self.spool.spool_id}: messages spooled but not committed may be lost")
            if self.fail_on_data_loss:
                raise DataLossError(text + " (set failOnDataLoss=false to go on)")
            log.warning(text)
        return seq

    def initialOffset(self) -> dict[str, Any]:
        self._ensure_consumer()
        self._last_seq = self.spool.first
        return self._offset(self._last_seq)

    def getDefaultReadLimit(self) -> Any:
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
        return ReadMaxRows(self.max_records) if self.max_records > 0 else ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any] | None = None, limit: Any = None) -> dict[str, Any]:
        """Spark >= 4.2 passes the batch start and a read limit; 4.0/4.1 pass nothing."""
        if start is None:  # older Spark: the previous end is the start
            seq = self._last_seq if self._last_seq is not None else self.spool.first
            max_rows = self.max_records or None
        else:
            seq = self._check_spool(start)
            max_rows = getattr(limit, "max_rows", None)
        self.spool.advance_to(seq)
        self._ensure_consumer()
        end = self.spool.end
        if max_rows:
            end = min(end, seq + int(max_rows))
        self._last_seq = max(seq, end)
        return self._offset(self._last_seq)

    def reportLatestOffset(self) -> dict[str, Any]:
        return self._offset(self.spool.end)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        lo = self._check_spool(start)
        hi = int(end.get("seq", 0))
        if hi <= lo:
            return []
        missing = self.spool.missing(lo, hi)
        if missing:
            text = f"nsq source: {missing} of the messages {lo}..{hi} are not in the spool {self.spool.directory}"
            if self.fail_on_data_loss:
                raise DataLossError(text + " (set failOnDataLoss=false to skip them)")
            log.warning(text)
        parts: list[InputPartition] = []
        for a in range(lo, hi, self.partition_size):
            b = min(hi, a + self.partition_size)
            ranges = self.spool.ranges(a, b)
            if not ranges:
                continue
            if self.inline:
                records = [(m.id, m.timestamp, m.attempts, m.body) for _seq, m in self.spool.read(a, b)]
                parts.append(SpoolPartition(self.topic, self.channel, [], records))
            else:
                parts.append(SpoolPartition(self.topic, self.channel, [(p, x, y) for p, x, y, _l, _h in ranges]))
        return parts

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        # a SpoolPartition; its class arrives by value (a copy per pickle), so no isinstance here
        part: Any = partition
        topic, channel = part.topic, part.channel
        if part.records is not None:
            for mid, ts, attempts, body in part.records:
                yield _row(topic, channel, mid, ts, attempts, body)
            return
        for path, a, b in part.pieces:
            for m in read_range(path, a, b):
                yield _row(topic, channel, m.id, m.timestamp, m.attempts, m.body)

    def commit(self, end: dict[str, Any]) -> None:
        if end.get("spool") == self.spool.spool_id:
            self.spool.commit(int(end.get("seq", 0)))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._spool is not None:
            self._spool.close()
