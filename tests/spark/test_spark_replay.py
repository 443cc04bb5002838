"""nsqtw-replay: jsonl and raw archives (plain and concatenated gzip) de-duplicated exactly, republished."""

from __future__ import annotations

import base64
import gzip
import io
import json
import os
import time

import pytest

pytestmark = pytest.mark.spark

# without pyspark every test here is skipped, saying why (not failed at its first import)
pytest.importorskip("pyspark", reason="the Spark tests need the nsqtw[spark] extra (pyspark, pyarrow; make test installs it)")


T = 1_700_000_000  # message times are T + i seconds


def _rec(topic: str, i: int, attempts: int = 1, channel: str = "archive") -> bytes:
    body = f"{topic}-message-{i}".encode() + (b"\n\x00\xff" if i == 4 else b"")
    return json.dumps({"topic": topic, "channel": channel, "id": "%016x" % (0xabc000 + i),
                       "timestamp": (T + i) * 1_000_000_000, "attempts": attempts,
                       "body": base64.b64encode(body).decode()}).encode() + b"\n"


def _gzip_members(*chunks: bytes) -> bytes:
    """As nsq_to_file --gzip writes: one gzip member per sync, concatenated."""
    return b"".join(gzip.compress(c) for c in chunks)


@pytest.fixture(scope="module")
def archive_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("archives")
    (d / "events.host1.2023-11-14_22.log").write_bytes(
        _rec("events", 1) + _rec("events", 2) + _rec("events", 3) + _rec("events", 4) + _rec("events", 5)
        + _rec("events", 2, attempts=2))
    (d / "events.host2.2023-11-14_22.log.gz").write_bytes(_gzip_members(
        _rec("events", 3, attempts=3, channel="other"), _rec("events", 6) + _rec("events", 7),
        _rec("audit", 1)))  # same id as events-1, another topic: not a duplicate
    raw1 = d / "clicks.host1.2023-11-14_22.log"
    raw1.write_bytes(b"a\nb\na\n\xff\x00\nx\ry\n")
    raw2 = d / "clicks.host2.2023-11-14_22.log.gz"
    raw2.write_bytes(_gzip_members(b"b\n", b"c\n"))
    os.utime(raw1, (T + 3, T + 3))
    os.utime(raw2, (T + 100, T + 100))
    return d


def _args(*argv):
    from nsqtw.spark.replay import build_parser
    return build_parser().parse_args(list(argv))


def test_reads_both_formats_and_gzip_members(spark, archive_dir) -> None:
    """Every line of every file is read: jsonl decoded, raw kept as bytes, all gzip members."""
    from nsqtw.spark.replay import read_archives

    rows = read_archives(spark, [str(archive_dir)]).collect()
    assert len(rows) == 6 + 4 + 5 + 2
    by_topic = {}
    for r in rows:
        by_topic.setdefault(r["topic"], []).append(r)
    assert len(by_topic["events"]) == 9 and len(by_topic["audit"]) == 1 and len(by_topic["clicks"]) == 7
    raw_bodies = sorted(bytes(r["body"]) for r in by_topic["clicks"])
    assert raw_bodies == sorted([b"a", b"b", b"a", b"\xff\x00", b"x\ry", b"b", b"c"])
    four = [r for r in by_topic["events"] if r["id"] == "%016x" % (0xabc000 + 4)][0]
    assert bytes(four["body"]) == b"events-message-4\n\x00\xff" and four["timestamp"] == (T + 4) * 10**9


def test_dedupe_exact(spark, archive_dir) -> None:
    """(topic, id) for jsonl keeping the fewest attempts; exact body per topic for raw."""
    from nsqtw.spark.replay import deduplicate, read_archives

    rows = deduplicate(read_archives(spark, [str(archive_dir)])).collect()
    keys = sorted((r["topic"], r["id"] or bytes(r["body"]).decode("latin-1")) for r in rows)
    assert keys == sorted(
        [("events", "%016x" % (0xabc000 + i)) for i in range(1, 8)] + [("audit", "%016x" % (0xabc000 + 1))]
        + [("clicks", b.decode("latin-1")) for b in (b"a", b"b", b"\xff\x00", b"x\ry", b"c")])
    two = [r for r in rows if r["id"] == "%016x" % (0xabc000 + 2)][0]
    three = [r for r in rows if r["id"] == "%016x" % (0xabc000 + 3)][0]
    assert two["attempts"] == 1 and three["attempts"] == 1 and three["channel"] == "archive"


def test_time_filter(spark, archive_dir) -> None:
    """--since/--until: jsonl by message time, raw by the file's modification time."""
    from nsqtw.spark.replay import deduplicate, filter_time, parse_time, read_archives

    df = filter_time(read_archives(spark, [str(archive_dir)]), parse_time(str(T + 2)),
                     parse_time("2023-11-14T22:13:26Z"))
    rows = deduplicate(df).collect()
    ids = sorted(r["id"] for r in rows if r["id"])
    assert ids == ["%016x" % (0xabc000 + i) for i in (2, 3, 4, 5)]
    assert sorted(bytes(r["body"]) for r in rows if not r["id"]) == sorted([b"a", b"b", b"\xff\x00", b"x\ry"])
    assert parse_time("2023-11-14T22:13:20") == T * 10**9


def test_cli_writes_deduplicated_archive(spark, archive_dir, tmp_path) -> None:
    """--output writes gzip jsonl partitioned by topic; reading it back gives each message once."""
    from nsqtw.spark.replay import run

    out = tmp_path / "clean"
    buf = io.StringIO()
    figures = run(_args(str(archive_dir), "--output", str(out)), spark=spark, out=buf)
    assert figures == {"read": 17, "kept": 13, "duplicates": 4, "published": 0, "rejected": 0}
    records = {}
    for root, _dirs, files in os.walk(out):
        for name in files:
            if name.endswith(".gz"):
                with gzip.open(os.path.join(root, name)) as f:
                    for line in f:
                        rec = json.loads(line)
                        records.setdefault(os.path.basename(root), []).append(rec)
    assert sorted(records) == ["topic=audit", "topic=clicks", "topic=events"]
    events = records["topic=events"]
    assert [r["id"] for r in events] == ["%016x" % (0xabc000 + i) for i in range(1, 8)]  # time order
    assert list(events[0]) == ["topic", "channel", "node", "id", "timestamp", "attempts", "body"]
    assert base64.b64decode(events[3]["body"]) == b"events-message-4\n\x00\xff"
    assert len(records["topic=clicks"]) == 5 and records["topic=clicks"][0]["id"] is None


@pytest.fixture(scope="module")
def live_nsqd():
    from live_nsqd import LiveNsqd
    n = LiveNsqd()
    yield n
    n.stop()


def test_cli_republishes_through_mpub(spark, archive_dir, live_nsqd) -> None:
    """Republishing sends each kept message once, in batches, bodies byte for byte."""
    from nsqtw.spark.consumer import BlockingConsumer
    from nsqtw.spark.replay import run

    figures = run(_args(str(archive_dir), "--nsqd-http-address", live_nsqd.http_address,
                        "--destination-topic", "replayed", "--batch-size", "4"), spark=spark, out=io.StringIO())
    assert figures["published"] == 13
    stats = live_nsqd.stats("replayed")["topics"][0]
    assert stats["message_count"] == 13
    consumer = BlockingConsumer("replayed", "check", nsqd_tcp_addresses=[live_nsqd.tcp_address], max_in_flight=50)
    got = []
    deadline = time.monotonic() + 20
    while len(got) < 13 and time.monotonic() < deadline:
        for conn, m in consumer.poll(0.2):
            got.append(m.body)
            consumer.finish(conn, m.id)
    consumer.close()
    expected = [f"events-message-{i}".encode() + (b"\n\x00\xff" if i == 4 else b"") for i in range(1, 8)]
    expected += [b"audit-message-1", b"a", b"b", b"\xff\x00", b"x\ry", b"c"]
    assert sorted(got) == sorted(expected)


def test_publish_rows_batching() -> None:
    """Batches split by count and bytes, per destination topic, in row order."""
    from nsqtw.spark.replay import encode_mpub, publish_rows

    class Rec:
        def __init__(self):
            self.calls = []

        def publish(self, topic, bodies):
            self.calls.append((topic, list(bodies)))

    rec = Rec()
    rows = [{"topic": "a", "body": b"x" * 10}] * 5 + [{"topic": "b", "body": b"y"}] + [{"topic": "a", "body": b""}]
    assert publish_rows(rows, rec, batch_size=2, max_batch_bytes=1000) == 6
    assert [(t, len(b)) for t, b in rec.calls] == [("a", 2), ("a", 2), ("a", 1), ("b", 1)]
    rec2 = Rec()
    publish_rows(rows[:5], rec2, batch_size=100, max_batch_bytes=4 + 3 * 14)
    assert [len(b) for _t, b in rec2.calls] == [3, 2]
    assert encode_mpub([b"ab", b"c"]) == b"\x00\x00\x00\x02\x00\x00\x00\x02ab\x00\x00\x00\x01c"


def _node_rec(topic: str, node, i: int, body: bytes, attempts: int = 1) -> bytes:
    doc = {"topic": topic, "channel": "archive", "node": node, "id": "%016x" % (0xdef000 + i),
           "timestamp": (T + i) * 1_000_000_000, "attempts": attempts, "body": base64.b64encode(body).decode()}
    if node is None:
        del doc["node"]  # an archive written before the format had the node
    return json.dumps(doc).encode() + b"\n"


def test_node_in_the_dedupe_key_and_old_archives_still_read(spark, tmp_path) -> None:
    """Message IDs are unique per nsqd only: one id from two nodes is two messages; the same node's
    copies are one (fewest attempts kept); records without a node are read, keyed without one."""
    from nsqtw.spark.replay import deduplicate, read_archives, run

    d = tmp_path / "archives"
    d.mkdir()
    (d / "orders.h1.log").write_bytes(
        _node_rec("orders", "nsqd-1:4150", 1, b"from node 1")
        + _node_rec("orders", "nsqd-2:4150", 1, b"from node 2")          # same id, another node: kept
        + _node_rec("orders", "nsqd-1:4150", 1, b"from node 1", attempts=2)  # a redelivery: dropped
        + _node_rec("orders", None, 2, b"old archive")
        + _node_rec("orders", None, 2, b"old archive", attempts=3))
    rows = read_archives(spark, [str(d)]).collect()
    assert sorted((r["node"] or "-") for r in rows) == ["-", "-", "nsqd-1:4150", "nsqd-1:4150", "nsqd-2:4150"]
    kept = deduplicate(read_archives(spark, [str(d)])).collect()
    assert sorted((r["node"] or "-", bytes(r["body"]), r["attempts"]) for r in kept) == [
        ("-", b"old archive", 1), ("nsqd-1:4150", b"from node 1", 1), ("nsqd-2:4150", b"from node 2", 1)]
    out = tmp_path / "clean"
    figures = run(_args(str(d), "--output", str(out), "--compression", "none", "--quiet"), spark=spark,
                  out=io.StringIO())
    assert figures["kept"] == 3
    written = [json.loads(ln) for p in sorted((out / "topic=orders").iterdir()) if not p.name.startswith((".", "_"))
               for ln in p.read_bytes().splitlines()]
    assert sorted((w["node"] or "-") for w in written) == ["-", "nsqd-1:4150", "nsqd-2:4150"]


def test_raw_and_jsonl_copies_are_not_deduplicated_against_each_other(spark, tmp_path) -> None:
    """As the README says: a raw line has no id, so the same message archived raw and as jsonl is kept twice."""
    from nsqtw.spark.replay import deduplicate, read_archives

    (tmp_path / "orders.h1.log").write_bytes(_node_rec("orders", "nsqd-1:4150", 1, b"same"))
    (tmp_path / "orders.h2.log").write_bytes(b"same\n")
    assert len(deduplicate(read_archives(spark, [str(tmp_path)])).collect()) == 2


def test_torn_and_bad_id_records_are_rejected_not_replayed(spark, tmp_path) -> None:
    """In a jsonl archive (auto or jsonl), a torn record, a non-hex id and a non-base64 body are
    rejected, counted and located; never message bodies. Past --max-bad-records: exit 4, nothing
    written; under it: the archive, and its _rejected beside it."""
    from nsqtw.spark import cli
    from nsqtw.spark.replay import run

    src = tmp_path / "in"
    src.mkdir()
    bad_id = _rec("events", 9).replace(b'"%016x"' % (0xabc000 + 9), b'"not-a-hex-id-000"')
    bad_body = _rec("events", 8).replace(b'"body": "', b'"body": "***')
    (src / "events.h1.log").write_bytes(_rec("events", 1) + b'{"topic": "events", "id": "00000000' + b"\n"
                                        + bad_id + _rec("events", 2) + bad_body)
    (src / "clicks.h1.log").write_bytes(b'{"a": 1}\nplain\n')  # a raw archive of JSON bodies stays raw
    # auto: the raw file's lines are bodies; jsonl: they are rejected too
    for fmt, count, first in (("auto", 3, "events.h1.log line 2)"), ("jsonl", 5, "clicks.h1.log line 1)")):
        out = tmp_path / f"out-{fmt}"
        with pytest.raises(cli.BadRecordsError) as e:
            run(_args(str(src), "--format", fmt, "-o", str(out), "--quiet"), spark=spark, out=io.StringIO())
        assert e.value.code == 4 and str(e.value).startswith(f"{count} of 7 input lines rejected")
        assert first in str(e.value) and not out.exists()
    out = tmp_path / "out"
    err = io.StringIO()
    figures = run(_args(str(src), "-o", str(out), "--quiet", "--compression", "none", "--max-bad-records", "3"),
                  spark=spark, out=io.StringIO(), err=err)
    assert figures["rejected"] == 3 and figures["kept"] == 4  # events 1, 2; clicks {"a": 1}, plain
    assert err.getvalue().startswith("nsqtw-replay: warning: 3 of 7 input lines rejected (first: ")
    reasons = sorted(r["reason"] for r in spark.read.json(str(out / "_rejected")).collect())
    assert reasons == ["body is missing or not base64", "id is not 16 hex digits", "malformed JSON (a torn or garbled line)"]
    bodies = sorted(base64.b64decode(json.loads(ln)["body"]) for p in out.glob("topic=*/*")
                    if not p.name.startswith((".", "_")) for ln in p.read_bytes().splitlines())
    assert bodies == sorted([b"events-message-1", b"events-message-2", b'{"a": 1}', b"plain"])


def test_unreachable_nsqd_fails_before_spark(tmp_path, monkeypatch) -> None:
    """--nsqd-http-address that does not answer: exit 1 and one line, before Spark starts."""
    import socket

    from nsqtw.spark import cli, replay

    def no_spark(*_a, **_k):
        raise AssertionError("Spark was started")

    monkeypatch.setattr(replay, "get_session", no_spark)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "events.h.log").write_bytes(b"a\n")
    args = replay.build_parser().parse_args([str(tmp_path), "--nsqd-http-address", f"127.0.0.1:{port}", "--quiet"])
    with pytest.raises(cli.JobError) as e:
        replay.run(args, spark=None, out=io.StringIO())
    assert e.value.code == 1 and f"127.0.0.1:{port}: nsqd not reachable" in str(e.value)
    assert "nothing read or published" in str(e.value)
