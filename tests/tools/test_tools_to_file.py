"""nsq_to_file against a live nsqd: FIN only after fsync (batch full, ticker, starvation), file names
from NSQ's tokens, rotation by size, interval and date, gzip as concatenated members read back,
work-dir to output-dir moves, SIGHUP, --skip-empty-files, jsonl output, lookupd topic discovery."""

from __future__ import annotations

import base64
import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time
import zlib

import pytest
import pytest_twisted
from twisted.internet import task, threads

from nsqtw.options import OptionError
from nsqtw.tools.to_file import ToFile, ToFileOptions, compute_filename_format, strftime

from tools_support import tool_options, wait_for, within

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def opts(*argv: str):
    return tool_options(ToFileOptions, *argv)


def publish(nsqd, topic: str, bodies) -> None:
    nsqd._broker.publish(topic, list(bodies), nsqd._service.now())
    nsqd._service.settle()


def in_flight(nsqd, topic: str, channel: str = "nsq_to_file") -> int:
    t = nsqd._broker.topics.get(topic)
    ch = t.channels.get(channel) if t else None
    return len(ch.inflight) if ch else 0


def gzip_members(path: str) -> int:
    """How many concatenated gzip members a file holds."""
    data = open(path, "rb").read()
    count = 0
    while data:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        d.decompress(data)
        data = d.unused_data
        count += 1
    return count


# --- pure parts -----------------------------------------------------------------------------------


def test_strftime_go_directives_only():
    """The directives of go-strftime are replaced; unknown ones stay as written."""
    t = time.struct_time((2024, 3, 9, 7, 5, 2, 5, 69, 0))
    assert strftime("%Y-%m-%d_%H", t) == "2024-03-09_07"
    assert strftime("%y%b%B %a %A %I%p %M:%S %%", t) == "24MarMarch Sat Saturday 07AM 05:02 %"
    assert strftime("%j %Q trailing%", t) == "%j %Q trailing%"


def test_filename_tokens_and_rev_rules():
    """<TOPIC> <HOST> <PID> filled; <REV> dropped unless gzip/rotation/work-dir, then required; .gz added."""
    o = opts("--topic=t", "--nsqd-tcp-address=a:1", "--filename-format=<TOPIC>.<HOST><REV>.<PID>.<DATETIME>.log")
    assert compute_filename_format(o, "t", "box.example.com", 42) == "t.box.42.<DATETIME>.log"
    o = opts("--topic=t", "--nsqd-tcp-address=a:1", "--gzip", "--host-identifier=<HOSTNAME>-x")
    assert compute_filename_format(o, "t", "box.example.com", 1) == "t.box.example.com-x<REV>.<DATETIME>.log.gz"
    with pytest.raises(OptionError, match="missing <REV>"):
        opts("--topic=t", "--nsqd-tcp-address=a:1", "--rotate-size=10", "--filename-format=<TOPIC>.log")


@pytest.mark.parametrize("argv,message", [
    (["--nsqd-tcp-address=a:1"], "--topic or --topic-pattern required"),
    (["--topic-pattern=x", "--nsqd-tcp-address=a:1"], "--lookupd-http-address must be specified"),
    (["--topic=t", "--nsqd-tcp-address=a:1", "--gzip-level=0"], r"invalid --gzip-level value \(0\)"),
    (["--topic=t"], "--nsqd-tcp-address or --lookupd-http-address required"),
    (["--topic=t", "--nsqd-tcp-address=a:1", "--output-format=csv"], "--output-format must be raw or jsonl"),
])
def test_flag_checks(argv, message):
    """Go's refusals (plus nsqtw's --output-format check)."""
    with pytest.raises(OptionError, match=message):
        opts(*argv)


# --- against nsqd -------------------------------------------------------------------------------


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_fin_only_after_the_ticker_sync(nsqd, tmp_path):
    """A small batch stays in flight (unFINed) until the --sync-interval ticker fsyncs it (the first
    message opens the file, which syncs at once, as in Go)."""
    clock = task.Clock()
    clock.advance(1_700_000_000)
    app = ToFile(opts("--topic=ev", f"--nsqd-tcp-address={nsqd.tcp_address}", f"--output-dir={tmp_path}",
                      "--sync-interval=10s"), clock=clock, hostname="host.example")
    await within(app.start())
    logger = app.loggers["ev"]
    publish(nsqd, "ev", [b"first"])
    await wait_for(lambda: logger.synced_batches == 1, what="the first message, synced as the file opened")
    publish(nsqd, "ev", [b"a", b"b", b"c"])
    await wait_for(lambda: len(logger.batch) == 3, what="three messages written")
    assert in_flight(nsqd, "ev") == 3 and logger.synced_batches == 1
    clock.advance(10)
    assert logger.synced_batches == 2
    await wait_for(lambda: in_flight(nsqd, "ev") == 0, what="FINs after the sync")
    assert await within(app.stop()) == 0
    [path] = logger.closed_files
    stamp = time.strftime("%Y-%m-%d_%H", time.localtime(1_700_000_000))
    assert os.path.basename(path) == f"ev.host.{stamp}.log"
    assert open(path, "rb").read() == b"first\na\nb\nc\n"


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_full_batch_syncs_at_once(nsqd, tmp_path):
    """--max-in-flight=4 and an hour's ticker: full batches and starvation (85% of RDY in flight) sync and
    FIN without the ticker; only the unsynced tail (< 4) stays in flight, and stop() FINs it after a sync."""
    app = ToFile(opts("--topic=full", f"--nsqd-tcp-address={nsqd.tcp_address}", f"--output-dir={tmp_path}",
                      "--max-in-flight=4", "--sync-interval=1h"))
    await within(app.start())
    publish(nsqd, "full", [b"%d" % i for i in range(12)])
    logger = app.loggers["full"]
    channel = lambda: nsqd._broker.topics["full"].channels["nsq_to_file"]  # noqa: E731
    await wait_for(lambda: channel().depth() == 0 and in_flight(nsqd, "full") == len(logger.batch) < 4
                   and logger.filesize == len(b"".join(b"%d\n" % i for i in range(12))), what="all written")
    assert logger.synced_batches >= 2
    await within(app.stop())
    assert in_flight(nsqd, "full") == 0
    assert open(logger.closed_files[0], "rb").read() == b"".join(b"%d\n" % i for i in range(12))


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_gzip_rotate_size_concatenated_members(nsqd, tmp_path):
    """--gzip --rotate-size: several .gz files, each of several members; reading them back gives every body once, in order."""
    app = ToFile(opts("--topic=gz", f"--nsqd-tcp-address={nsqd.tcp_address}", f"--output-dir={tmp_path}",
                      "--gzip", "--gzip-level=9", "--rotate-size=60", "--max-in-flight=3", "--sync-interval=1h"),
                 hostname="h")
    await within(app.start())
    bodies = [b"message number %02d" % i for i in range(12)]  # 20 bytes a line: 3 lines pass 60 bytes
    publish(nsqd, "gz", bodies)
    logger = app.loggers["gz"]
    await wait_for(lambda: logger.written == 12, what="all written")
    await within(app.stop())
    files = sorted(logger.closed_files)
    assert len(files) >= 3
    assert all(re.search(r"gz\.h-\d{6}\.\d{4}-\d\d-\d\d_\d\d\.log\.gz$", f) for f in files)
    assert [os.path.basename(f).split(".")[1] for f in files] == [f"h-{i:06d}" for i in range(len(files))]
    read_back = b"".join(gzip.open(f).read() for f in files)
    assert read_back.splitlines() == bodies
    assert max(gzip_members(f) for f in files) >= 2  # a sync ends a member, the file goes on


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_work_dir_moves_into_output_dir_without_overwriting(nsqd, tmp_path):
    """In-progress files live in --work-dir; closing moves them to --output-dir, bumping <REV> past a taken name."""
    work, out = tmp_path / "work", tmp_path / "out"
    clock = task.Clock()
    clock.advance(1_700_000_000)
    stamp = time.strftime("%Y-%m-%d_%H", time.localtime(1_700_000_000))
    out.mkdir()
    (out / f"wd.h-000000.{stamp}.log").write_bytes(b"already here\n")
    app = ToFile(opts("--topic=wd", f"--nsqd-tcp-address={nsqd.tcp_address}", f"--output-dir={out}",
                      f"--work-dir={work}", "--sync-interval=1s"), clock=clock, hostname="h")
    await within(app.start())
    publish(nsqd, "wd", [b"x", b"y"])
    logger = app.loggers["wd"]
    await wait_for(lambda: logger.written == 2, what="written")
    assert os.path.dirname(logger.out_path) == str(work)
    assert logger.out_path.endswith(f"wd.h-000001.{stamp}.log")  # -000000 is taken in the output dir
    await within(app.stop())
    assert os.listdir(work) == []
    assert (out / f"wd.h-000001.{stamp}.log").read_bytes() == b"x\ny\n"
    assert (out / f"wd.h-000000.{stamp}.log").read_bytes() == b"already here\n"


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_rotate_interval_datetime_change_skip_empty_and_hup(nsqd, tmp_path):
    """A new file after --rotate-interval and when <DATETIME> changes; --skip-empty-files closes without
    reopening on the ticker; SIGHUP (hup()) syncs, FINs and closes."""
    clock = task.Clock()
    clock.advance(1_700_000_000)
    app = ToFile(opts("--topic=rot", f"--nsqd-tcp-address={nsqd.tcp_address}", f"--output-dir={tmp_path}",
                      "--rotate-interval=30s", "--datetime-format=%M", "--sync-interval=100s", "--skip-empty-files"),
                 clock=clock, hostname="h")
    await within(app.start())
    logger = app.loggers["rot"]
    publish(nsqd, "rot", [b"1"])
    await wait_for(lambda: logger.written == 1, what="first")
    first = logger.out_path
    clock.advance(31)  # interval passed; the next message rotates
    publish(nsqd, "rot", [b"2"])
    await wait_for(lambda: logger.out_path != first, what="rotation by interval")
    assert logger.rev == 1 or logger.filename != os.path.basename(first)
    clock.advance(61)  # new minute: the ticker fires at 100 s, rotation is due, skip-empty closes
    clock.advance(8)
    assert logger.out is None and len(logger.closed_files) == 2
    publish(nsqd, "rot", [b"3"])
    await wait_for(lambda: logger.written == 3, what="reopened by a message")
    app.hup()
    assert logger.out is None and logger.batch == []
    await wait_for(lambda: in_flight(nsqd, "rot") == 0, what="FINed after hup")
    await within(app.stop())
    contents = [open(p, "rb").read() for p in logger.closed_files]
    assert contents == [b"1\n", b"2\n", b"3\n"]


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_jsonl_output_format(nsqd, tmp_path):
    """--output-format=jsonl: one object per message, exactly the keys nsqtw-replay reads."""
    app = ToFile(opts("--topic=js", "--channel=arch", f"--nsqd-tcp-address={nsqd.tcp_address}",
                      f"--output-dir={tmp_path}", "--output-format=jsonl", "--max-in-flight=2"))
    await within(app.start())
    publish(nsqd, "js", [b"\x00binary\n", b"{\"x\": 1}"])
    logger = app.loggers["js"]
    await wait_for(lambda: logger.written == 2, what="written")
    await within(app.stop())
    lines = open(logger.closed_files[0], "rb").read().splitlines()
    docs = [json.loads(line) for line in lines]
    assert [list(d) for d in docs] == [["topic", "channel", "node", "id", "timestamp", "attempts", "body"]] * 2
    assert all(d["node"] == nsqd.tcp_address for d in docs)  # message IDs are unique per nsqd only
    assert [base64.b64decode(d["body"]) for d in docs] == [b"\x00binary\n", b"{\"x\": 1}"]
    assert all(d["topic"] == "js" and d["channel"] == "arch" and d["attempts"] == 1 for d in docs)
    assert all(re.fullmatch(r"[0-9a-f]{16}", d["id"]) and isinstance(d["timestamp"], int) for d in docs)
    assert abs(docs[0]["timestamp"] - time.time_ns()) < 60 * 10**9


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_topic_pattern_discovery_through_lookupd(nsqtw_cluster, tmp_path):
    """No --topic: lookupd's /topics is asked; topics matching --topic-pattern get a file each."""
    nsqd = nsqtw_cluster.nsqds[0]
    for topic in ("disc_a", "disc_b", "other"):
        await nsqd.publish(topic, f"{topic} body".encode())
    await nsqtw_cluster.lookupd.wait_for_producers(1, topic="disc_b")
    await nsqtw_cluster.lookupd.wait_for_producers(1, topic="other")
    app = ToFile(opts("--topic-pattern=^disc_", f"--lookupd-http-address={nsqtw_cluster.lookupd_http_address}",
                      f"--output-dir={tmp_path}", "--topic-refresh=1s", "--max-in-flight=1"))
    await within(app.start())
    await wait_for(lambda: sorted(app.loggers) == ["disc_a", "disc_b"], what="two topics found")
    await wait_for(lambda: all(lg.written == 1 for lg in app.loggers.values()), what="both written")
    await within(app.stop())
    names = sorted(os.listdir(tmp_path))
    assert [n.split(".")[0] for n in names] == ["disc_a", "disc_b"]
    assert open(tmp_path / names[0], "rb").read() == b"disc_a body\n"


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_command_sigterm_closes_files(nsqd, tmp_path):
    """`python -m nsqtw.tools.to_file`: SIGTERM syncs, FINs, closes and moves the file; exit 0."""
    publish(nsqd, "cmd", [b"one", b"two"])
    work, out = tmp_path / "w", tmp_path / "o"
    env = dict(os.environ, PYTHONPATH=ROOT)
    argv = [sys.executable, "-m", "nsqtw.tools.to_file", "--topic=cmd", f"--nsqd-tcp-address={nsqd.tcp_address}",
            f"--output-dir={out}", f"--work-dir={work}", "--filename-format=<TOPIC><REV>.log"]
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE)
    try:
        await wait_for(lambda: work.is_dir() and len(os.listdir(work)) == 1, timeout=20, what="work file")
        await wait_for(lambda: open(work / os.listdir(work)[0], "rb").read() == b"one\ntwo\n", what="written")
        proc.send_signal(signal.SIGTERM)
        code = await threads.deferToThread(proc.wait, 20)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read().decode()
    assert code == 0, err
    assert os.listdir(work) == [] and (out / "cmd-000000.log").read_bytes() == b"one\ntwo\n"
    assert re.search(r"^\[nsq_to_file\] \d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d{6} INFO: \[cmd/nsq_to_file\] syncing \d+ records to disk$", err, re.M), err
    await wait_for(lambda: in_flight(nsqd, "cmd") == 0 and nsqd._broker.topics["cmd"].channels["nsq_to_file"].depth() == 0,
                   what="FINed")
