"""
``nsq_to_file``: archive topics to files, FINing messages only once they are on disk (NSQ's ``apps/nsq_to_file``).

::

    nsq_to_file --topic=events --lookupd-http-address=127.0.0.1:4161 \\
        --output-dir=/var/archive --gzip --rotate-size=104857600

One :class:`FileLogger` per topic (a consumer on ``--channel``, default
``nsq_to_file``) writes each body and a newline to a file named by
``--filename-format`` (tokens ``<TOPIC>``, ``<HOST>`` from
``--host-identifier``, ``<PID>``, ``<DATETIME>`` by ``--datetime-format``
(strftime), ``<REV>`` as ``-000000``, bumped when a name is taken).  The file
changes when ``<DATETIME>`` changes, after ``--rotate-interval``, or once it
is bigger than ``--rotate-size`` bytes.  In-progress files live in
``--work-dir`` and are moved into ``--output-dir`` when closed, never over an
existing file.  ``--gzip`` compresses (``--gzip-level``); every sync closes a
gzip member, so a file is a series of concatenated gzip streams and a crash
loses at most the unsynced tail.

At least once: a message is FINed only after its batch was fsynced.  A batch
is ``--max-in-flight`` messages; it is synced when full, when the consumer is
starved (85% of its RDY in flight), every ``--sync-interval`` and on SIGHUP
(which also closes the file).  SIGINT/SIGTERM stop the consumers gracefully,
sync, close and move the files.

Topics are ``--topic`` (repeatable), or discovered: with ``--topic-pattern``
(a regular expression, searched as Go's ``regexp.MatchString`` does) and no
``--topic``, nsqlookupd's ``/topics`` is asked at start and every
``--topic-refresh`` (Go waits one interval before the first query).

nsqtw extension: ``--output-format=jsonl`` writes one JSON object per
message instead of the raw body (what ``nsqtw-replay`` reads)::

    {"topic": "t", "channel": "c", "node": "host:4150", "id": "<16 hex>", "timestamp": <ns>,
     "attempts": 1, "body": "<base64>"}

``node`` is the nsqd (its TCP address) the message came from: message IDs are
unique per nsqd only, so ``nsqtw-replay`` de-duplicates by (topic, node, id).

Differences from Go, on purpose: a ``--filename-format`` without ``<REV>``
where one is needed is refused at start (Go logs it per topic and writes
nothing); file I/O runs on the reactor thread, as Go's router goroutine
blocks on it.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import re
import socket
import sys
import time
from typing import Any, BinaryIO
from collections.abc import Callable

import attr
from twisted.internet import defer, task
from twisted.logger import Logger
from twisted.python.failure import Failure

from ..options import BOOL, DURATION, INT, LOG_LEVEL, LOG_LEVELS, STR, STRLIST, OptionError, opt
from ..protocol.names import is_valid_name
from ._app import ConsumerApp, require_sources
from ._runtime import client_config, run_app

__all__ = ["ToFileOptions", "ToFile", "FileLogger", "strftime", "compute_filename_format", "main",
           "jsonl_record"]

log = Logger(namespace="nsqtw.tools.nsq_to_file")

_ACCEPT = b"application/vnd.nsq; version=1.0"


@attr.s(frozen=True, slots=True)
class ToFileOptions:
    """nsq_to_file's flags (Go's names and defaults), plus ``--output-format``."""

    log_level: int = opt(LOG_LEVELS["info"], flag="log-level", kind=LOG_LEVEL,
                         help="set log verbosity: debug, info, warn, error, or fatal")
    log_prefix: str = opt("[nsq_to_file] ", flag="log-prefix", kind=STR, help="log message prefix")
    channel: str = opt("nsq_to_file", flag="channel", kind=STR, help="nsq channel")
    max_in_flight: int = opt(200, flag="max-in-flight", kind=INT, help="max number of messages to allow in flight")
    output_dir: str = opt("/tmp", flag="output-dir", kind=STR, help="directory to write output files to")
    work_dir: str = opt("", flag="work-dir", kind=STR,
                        help="directory for in-progress files before moving to output-dir")
    datetime_format: str = opt("%Y-%m-%d_%H", flag="datetime-format", kind=STR,
                               help="strftime compatible format for <DATETIME> in filename format")
    filename_format: str = opt("<TOPIC>.<HOST><REV>.<DATETIME>.log", flag="filename-format", kind=STR,
                               help="output filename format (<TOPIC>, <HOST>, <PID>, <DATETIME>, <REV> are replaced. "
                                    "<REV> is increased when file already exists)")
    host_identifier: str = opt("", flag="host-identifier", kind=STR,
                               help="value to output in log filename in place of hostname. "
                                    "<SHORT_HOST> and <HOSTNAME> are valid replacement tokens")
    gzip_level: int = opt(6, flag="gzip-level", kind=INT,
                          help="gzip compression level (1-9, 1=BestSpeed, 9=BestCompression)")
    gzip: bool = opt(False, flag="gzip", kind=BOOL, help="gzip output files.")
    skip_empty_files: bool = opt(False, flag="skip-empty-files", kind=BOOL, help="skip writing empty files")
    topic_refresh: float = opt(60.0, flag="topic-refresh", kind=DURATION,
                               help="how frequently the topic list should be refreshed")
    topic_pattern: str = opt("", flag="topic-pattern", kind=STR, help="only log topics matching the following pattern")
    rotate_size: int = opt(0, flag="rotate-size", kind=INT,
                           help="rotate the file when it grows bigger than `rotate-size` bytes")
    rotate_interval: float = opt(0.0, flag="rotate-interval", kind=DURATION, help="rotate the file every duration")
    sync_interval: float = opt(30.0, flag="sync-interval", kind=DURATION, help="sync file to disk every duration")
    http_client_connect_timeout: float = opt(2.0, flag="http-client-connect-timeout", kind=DURATION,
                                             help="timeout for HTTP connect")
    http_client_request_timeout: float = opt(5.0, flag="http-client-request-timeout", kind=DURATION,
                                             help="timeout for HTTP request")
    nsqd_tcp_addresses: list[str] = opt(flag="nsqd-tcp-address", kind=STRLIST, factory=list,
                                        help="nsqd TCP address (may be given multiple times)")
    lookupd_http_addresses: list[str] = opt(flag="lookupd-http-address", kind=STRLIST, factory=list,
                                            help="lookupd HTTP address (may be given multiple times)")
    topics: list[str] = opt(flag="topic", kind=STRLIST, factory=list, help="nsq topic (may be given multiple times)")
    consumer_opts: list[str] = opt(flag="consumer-opt", kind=STRLIST, factory=list,
                                   help="option to passthrough to nsq.Consumer (may be given multiple times, "
                                        "http://godoc.org/github.com/nsqio/go-nsq#Config)")
    output_format: str = opt("raw", flag="output-format", kind=STR,
                             help="[nsqtw] raw (the body and a newline, as NSQ) or jsonl (one JSON object per "
                                  "message: topic, channel, id, timestamp, attempts, base64 body)")

    def __attrs_post_init__(self) -> None:
        if not self.channel:
            raise OptionError("--channel is required")
        if not is_valid_name(self.channel):
            raise OptionError(f"--channel {self.channel!r} is not a valid channel name")
        if self.http_client_connect_timeout <= 0:
            raise OptionError("--http-client-connect-timeout should be positive")
        if self.http_client_request_timeout <= 0:
            raise OptionError("--http-client-request-timeout should be positive")
        require_sources(self.nsqd_tcp_addresses, self.lookupd_http_addresses)
        if not 1 <= self.gzip_level <= 9:
            raise OptionError(f"invalid --gzip-level value ({self.gzip_level}), should be 1-9")
        if not self.topics and not self.topic_pattern:
            raise OptionError("--topic or --topic-pattern required")
        if not self.topics and not self.lookupd_http_addresses:
            raise OptionError("--lookupd-http-address must be specified when no --topic specified")
        if self.topic_pattern:
            try:
                re.compile(self.topic_pattern)
            except re.error as e:
                raise OptionError(f"--topic-pattern is invalid - {e}") from None
        if self.output_format not in ("raw", "jsonl"):
            raise OptionError(f"--output-format must be raw or jsonl, not {self.output_format!r}")
        if self.max_in_flight < 1:
            raise OptionError("--max-in-flight must be > 0")
        if self.sync_interval <= 0:
            raise OptionError("--sync-interval should be positive")
        if not self.topics and self.topic_refresh <= 0:
            raise OptionError("--topic-refresh should be positive")
        needs_rev(self)  # refuse a format without <REV> where Go's logger creation would fail

    @property
    def effective_work_dir(self) -> str:
        return self.work_dir or self.output_dir


# --- names ------------------------------------------------------------------------------------

_STRFTIME = {
    "B": "%B", "b": "%b", "m": "%m", "A": "%A", "a": "%a", "d": "%d", "H": "%H", "I": "%I",
    "M": "%M", "S": "%S", "Y": "%Y", "y": "%y", "p": "%p", "Z": "%Z", "z": "%z", "%": "%%",
}


def strftime(fmt: str, t: time.struct_time) -> str:
    """NSQ's strftime: exactly the directives of jehiah/go-strftime; any other ``%x`` stays as written."""
    out: list[str] = []
    i = 0
    n = len(fmt)
    while i < n:
        c = fmt[i]
        if c == "%" and i + 1 < n and fmt[i + 1] in _STRFTIME:
            out.append(time.strftime(_STRFTIME[fmt[i + 1]], t))
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def needs_rev(options: ToFileOptions) -> bool:
    """<REV> is needed with gzip, rotation or a work dir; its absence is then an error."""
    needed = bool(options.gzip or options.rotate_size > 0 or options.rotate_interval > 0
                  or options.effective_work_dir != options.output_dir)
    if needed and "<REV>" not in options.filename_format:
        raise OptionError("missing <REV> in --filename-format when gzip, rotation, or work dir enabled")
    return needed


def compute_filename_format(options: ToFileOptions, topic: str, hostname: str | None = None,
                            pid: int | None = None) -> str:
    """The format with everything but ``<DATETIME>`` (and ``<REV>`` when used) filled in."""
    host = hostname if hostname is not None else socket.gethostname()
    short = host.split(".")[0]
    identifier = short
    if options.host_identifier:
        identifier = options.host_identifier.replace("<SHORT_HOST>", short).replace("<HOSTNAME>", host)
    fmt = options.filename_format
    if not needs_rev(options):
        fmt = fmt.replace("<REV>", "")
    fmt = fmt.replace("<TOPIC>", topic).replace("<HOST>", identifier)
    fmt = fmt.replace("<PID>", str(os.getpid() if pid is None else pid))
    if options.gzip and not fmt.endswith(".gz"):
        fmt += ".gz"
    return fmt


def jsonl_record(topic: str, channel: str, msg: Any) -> bytes:
    """One ``--output-format=jsonl`` line (the format nsqtw-replay reads; keep it exactly)."""
    mid = msg.id.decode("ascii") if isinstance(msg.id, bytes) else str(msg.id)
    node = getattr(msg, "nsqd_address", "") or None
    doc = {"topic": topic, "channel": channel, "node": node, "id": mid, "timestamp": int(msg.timestamp),
           "attempts": int(msg.attempts), "body": base64.b64encode(msg.body).decode("ascii")}
    return json.dumps(doc).encode("ascii") + b"\n"


class _Fatal(Exception):
    """A file error Go treats with os.Exit(1)."""


def _make_dirs_for(path: str) -> None:
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, mode=0o770, exist_ok=True)


def _exclusive_rename(src: str, dst: str) -> None:
    """Move without ever replacing: link, then unlink (FileExistsError if dst exists)."""
    os.link(src, dst)
    os.unlink(src)


def _relative(path: str, base: str) -> str:
    """Go's ``strings.TrimPrefix(src, WorkDir)`` joined onto the output dir."""
    if path.startswith(base):
        return path[len(base):].lstrip(os.sep)
    return os.path.basename(path)


# --- one topic -------------------------------------------------------------------------------------


class FileLogger:
    """One topic's consumer and file: the router of Go's ``file_logger.go`` as reactor events."""

    def __init__(self, app: ToFile, topic: str, filename_format: str) -> None:
        self.app = app
        self.options = app.options
        self.topic = topic
        self.channel = app.options.channel
        self.clock = app.clock
        self.filename_format = filename_format
        self.work_dir = app.options.effective_work_dir
        self.output_dir = app.options.output_dir
        self.jsonl = app.options.output_format == "jsonl"
        self.consumer: Any = None
        self.batch: list[Any] = []
        self.out: BinaryIO | None = None
        self.out_path = ""
        self.gz: gzip.GzipFile | None = None
        self.filename = ""
        self.open_time = 0.0
        self.filesize = 0
        self.rev = 0
        self.synced_batches = 0
        self.written = 0  # messages written (synced or not)
        self.closed_files: list[str] = []  # final paths, in the order they were closed
        self._ticker: task.LoopingCall | None = None
        self._stopping = False

    # --- wiring ------------------------------------------------------------------------------------

    def start(self) -> defer.Deferred:
        from ..client import Consumer

        self.consumer = Consumer(self.topic, self.channel, self.handle, self.app.config, reactor=self.app.reactor)
        ticker = task.LoopingCall(self._guard, self.tick)
        ticker.clock = self.clock
        self._ticker = ticker
        ticker.start(self.options.sync_interval, now=False)
        return self.app.connect(self.consumer, self.options.nsqd_tcp_addresses, self.options.lookupd_http_addresses)

    def handle(self, msg: Any) -> None:
        msg.disable_auto_response()
        self._guard(self.on_message, msg)

    def _guard(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except (OSError, _Fatal) as e:
            log.critical("[{t}/{c}] {err}", t=self.topic, c=self.channel, err=e)
            self.app.fatal()

    # --- the router ------------------------------------------------------------------------------

    def on_message(self, msg: Any) -> None:
        sync = False
        if self.needs_rotation():
            self.update_file()
            sync = True
        self.write(jsonl_record(self.topic, self.channel, msg) if self.jsonl else msg.body + b"\n")
        self.batch.append(msg)
        self.written += 1
        if len(self.batch) >= self.options.max_in_flight:
            sync = True
        self.after(sync)

    def tick(self) -> None:
        close = False
        if self.needs_rotation():
            if self.options.skip_empty_files:
                close = True
            else:
                self.update_file()
        self.after(True, close)

    def hup(self) -> None:
        self._guard(self.after, True, True)

    def after(self, sync: bool, close_file: bool = False) -> None:
        consumer = self.consumer
        if sync or (consumer is not None and consumer.is_starved()):
            if self.batch:
                log.info("[{t}/{c}] syncing {n} records to disk", t=self.topic, c=self.channel, n=len(self.batch))
                self.sync()
                batch, self.batch = self.batch, []
                for m in reversed(batch):
                    m.finish()
                self.synced_batches += 1
        if close_file:
            self.close()

    def stop(self) -> defer.Deferred:
        """Stop the ticker and the consumer, syncing (and FINing) the batch at once so the
        consumer's graceful close can complete; once it has, sync, close and move the file."""
        if self._ticker is not None and self._ticker.running:
            self._ticker.stop()
        self._stopping = True
        d = self.consumer.stop() if self.consumer is not None else defer.succeed(None)
        self._guard(self.after, True)

        def final(_: Any) -> None:
            self._guard(self.after, True, True)

        return d.addBoth(final)

    # --- files -------------------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if self.gz is not None:
            self.gz.write(data)
        else:
            assert self.out is not None
            self.out.write(data)
        self.filesize += len(data)

    def sync(self) -> None:
        """fsync what was written; with gzip, end the member first (concatenated gzip streams)."""
        if self.out is None:
            return
        if self.gz is not None:
            self.gz.close()
            self._fsync()
            self.gz = self._gzip()
        else:
            self._fsync()

    def _fsync(self) -> None:
        assert self.out is not None
        self.out.flush()
        os.fsync(self.out.fileno())

    def _gzip(self) -> gzip.GzipFile:
        return gzip.GzipFile(filename="", mode="wb", fileobj=self.out, compresslevel=self.options.gzip_level, mtime=0)

    def current_filename(self) -> str:
        stamp = strftime(self.options.datetime_format, time.localtime(self.clock.seconds()))
        return self.filename_format.replace("<DATETIME>", stamp)

    def needs_rotation(self) -> bool:
        if self.out is None:
            return True
        name = self.current_filename()
        if name != self.filename:
            log.info("[{t}/{c}] new filename {name}, rotating...", t=self.topic, c=self.channel, name=name)
            return True
        interval = self.options.rotate_interval
        if interval > 0:
            since = self.clock.seconds() - self.open_time
            if since > interval:
                log.info("[{t}/{c}] {s:.3f}s since last open, rotating...", t=self.topic, c=self.channel, s=since)
                return True
        size = self.options.rotate_size
        if size > 0 and self.filesize > size:
            log.info("[{t}/{c}] {p} currently {n} bytes (> {m}), rotating...", t=self.topic, c=self.channel,
                     p=self.out_path, n=self.filesize, m=size)
            return True
        return False

    def close(self) -> None:
        if self.out is None:
            return
        if self.gz is not None:
            self.gz.close()
            self.gz = None
        self._fsync()
        self.out.close()
        src = self.out_path
        self.out = None
        final = src
        if self.work_dir != self.output_dir:
            final = self._move(src)
        self.closed_files.append(final)

    def _move(self, src: str) -> str:
        dst = os.path.join(self.output_dir, _relative(src, self.work_dir))
        log.info("[{t}/{c}] moving finished file {src} to {dst}", t=self.topic, c=self.channel, src=src, dst=dst)
        try:
            _exclusive_rename(src, dst)
            return dst
        except FileExistsError:
            pass
        template = os.path.join(os.path.dirname(dst), os.path.basename(self.filename))
        rev = self.rev + 1
        while True:
            log.warn("[{t}/{c}] destination file already exists: {dst}", t=self.topic, c=self.channel, dst=dst)
            dst = template.replace("<REV>", f"-{rev:06d}")
            try:
                _exclusive_rename(src, dst)
            except FileExistsError:
                rev += 1
                continue
            log.info("[{t}/{c}] renamed finished file {src} to {dst} to avoid overwrite",
                     t=self.topic, c=self.channel, src=src, dst=dst)
            return dst

    def update_file(self) -> None:
        self.close()
        name = self.current_filename()
        if name != self.filename:
            self.rev = 0
        else:
            self.rev += 1
        self.filename = name
        self.open_time = self.clock.seconds()
        full = os.path.join(self.work_dir, name)
        _make_dirs_for(full)
        exclusive = self.options.gzip or self.options.rotate_interval > 0
        flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_APPEND)
        while True:
            path = full.replace("<REV>", f"-{self.rev:06d}")
            if self.work_dir != self.output_dir:
                target = os.path.join(self.output_dir, _relative(path, self.work_dir))
                _make_dirs_for(target)
                if os.path.exists(target):
                    log.warn("[{t}/{c}] output file already exists: {p}", t=self.topic, c=self.channel, p=target)
                    self.rev += 1
                    continue
            try:
                fd = os.open(path, flags, 0o666)
            except FileExistsError:
                log.warn("[{t}/{c}] working file already exists: {p}", t=self.topic, c=self.channel, p=path)
                self.rev += 1
                continue
            size = os.fstat(fd).st_size
            if self.options.rotate_size > 0 and size > self.options.rotate_size:
                os.close(fd)
                log.info("[{t}/{c}] {p} currently {n} bytes (> {m}), rotating...", t=self.topic, c=self.channel,
                         p=path, n=size, m=self.options.rotate_size)
                self.rev += 1
                continue
            break
        log.info("[{t}/{c}] opening {p}", t=self.topic, c=self.channel, p=path)
        self.out = os.fdopen(fd, "ab" if not exclusive else "wb", buffering=0)  # unbuffered, as Go's os.File
        self.out_path = path
        self.filesize = size
        self.gz = self._gzip() if self.options.gzip else None


# --- the app ----------------------------------------------------------------------------------------


class ToFile(ConsumerApp):
    """The running nsq_to_file: a FileLogger per topic, plus discovery when topics are not given."""

    def __init__(self, options: ToFileOptions, reactor: Any = None, *, clock: Any = None,
                 http_client: Any = None, hostname: str | None = None) -> None:
        super().__init__(reactor)
        self.options = options
        self.clock = clock if clock is not None else self.reactor
        self.config = client_config("nsq_to_file", options.consumer_opts, options.max_in_flight)
        self.loggers: dict[str, FileLogger] = {}
        self.hostname = hostname
        self._pattern = re.compile(options.topic_pattern) if options.topic_pattern else None
        self._http_client = http_client
        self._refresh: task.LoopingCall | None = None

    def start(self) -> defer.Deferred:
        d = self.update_topics(self.options.topics)
        if not self.options.topics:
            loop = task.LoopingCall(self.refresh_topics)
            loop.clock = self.clock
            self._refresh = loop
            loop.start(self.options.topic_refresh, now=True)
        return d

    def topic_allowed(self, topic: str) -> bool:
        return self._pattern is None or self._pattern.search(topic) is not None

    def update_topics(self, topics: list[str]) -> defer.Deferred:
        waits = []
        for topic in topics:
            if topic in self.loggers or self._stopping is not None:
                continue
            if not self.topic_allowed(topic):
                log.warn("skipping topic {t} (doesn't match pattern {p})", t=topic, p=self.options.topic_pattern)
                continue
            fmt = compute_filename_format(self.options, topic, self.hostname)
            logger = FileLogger(self, topic, fmt)
            self.loggers[topic] = logger
            waits.append(logger.start())
        d = defer.gatherResults(waits, consumeErrors=True)
        return d.addErrback(lambda f: f.value.subFailure if f.check(defer.FirstError) else f)

    # --- discovery --------------------------------------------------------------------------------

    def _http(self) -> Any:
        if self._http_client is None:
            from treq.client import HTTPClient
            from twisted.web.client import Agent, HTTPConnectionPool
            pool = HTTPConnectionPool(self.reactor, persistent=False)
            agent = Agent(self.reactor, connectTimeout=self.options.http_client_connect_timeout, pool=pool)
            self._http_client = HTTPClient(agent)
        return self._http_client

    def lookupd_topics(self) -> defer.Deferred:
        """Every lookupd's ``/topics``, merged and sorted (fails only when no lookupd answered)."""
        import treq

        client = self._http()

        def one(addr: str) -> defer.Deferred:
            url = addr if "://" in addr else f"http://{addr}"
            d = client.get(url.rstrip("/") + "/topics", headers={b"Accept": [_ACCEPT]})
            d.addTimeout(self.options.http_client_request_timeout, self.clock)

            def got(response: Any) -> defer.Deferred:
                def parse(body: bytes) -> list[str]:
                    if response.code != 200:
                        raise ValueError(f"{url}/topics answered {response.code}")
                    doc = json.loads(body)
                    if isinstance(doc, dict) and "topics" not in doc and isinstance(doc.get("data"), dict):
                        doc = doc["data"]
                    topics = doc.get("topics") if isinstance(doc, dict) else None
                    return [t for t in (topics or []) if isinstance(t, str)]
                return treq.content(response).addCallback(parse)

            return d.addCallback(got)

        addresses = self.options.lookupd_http_addresses
        d = defer.DeferredList([one(a) for a in addresses], consumeErrors=True)

        def merge(results: list[Any]) -> list[str]:
            topics: set = set()
            errors = []
            for ok, value in results:
                if ok:
                    topics.update(value)
                else:
                    errors.append(value.getErrorMessage())
            if errors and len(errors) == len(addresses):
                raise RuntimeError(f"failed to query any nsqlookupd: {'; '.join(errors)}")
            for e in errors:
                log.warn("could not query an nsqlookupd: {e}", e=e)
            return sorted(topics)

        return d.addCallback(merge)

    def refresh_topics(self) -> defer.Deferred:
        d = self.lookupd_topics()
        d.addCallback(self.update_topics)

        def failed(f: Failure) -> None:
            log.error("could not retrieve topic list: {err}", err=f.getErrorMessage())

        return d.addErrback(failed)

    # --- signals and stopping --------------------------------------------------------------

    def hup(self) -> None:
        for logger in list(self.loggers.values()):
            logger.hup()

    def fatal(self) -> None:
        self.finish(1)
        self.stop()

    def _stop(self) -> Any:
        if self._refresh is not None and self._refresh.running:
            self._refresh.stop()
        return defer.DeferredList([lg.stop() for lg in list(self.loggers.values())], consumeErrors=True)


def main(argv: list[str] | None = None) -> int:
    """The ``nsq_to_file`` command (SIGHUP syncs and closes the files)."""
    return run_app("nsq_to_file", argv, ToFileOptions, lambda options, reactor: ToFile(options, reactor), hup=True)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
