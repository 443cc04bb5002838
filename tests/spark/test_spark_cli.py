"""The Spark side of the jobs' failures: inputs that hold nothing, and a Spark job that fails."""

from __future__ import annotations

import io
import os

import pytest

pytestmark = pytest.mark.spark

# without pyspark every test here is skipped, saying why (not failed at its first import)
pytest.importorskip("pyspark", reason="the Spark tests need the nsqtw[spark] extra (pyspark, pyarrow; make test installs it)")



def test_stats_files_without_records_is_an_input_error(spark, tmp_path) -> None:
    """Files match --pattern but hold no export record: exit 3, no output directory created."""
    from nsqtw.spark import cli, stats

    (tmp_path / "nsqd-stats.2024-01-01_00.a_4151.jsonl").write_bytes(b"")
    (tmp_path / "nsqd-stats.2024-01-01_01.a_4151.jsonl").write_bytes(b"\n")
    out_dir = tmp_path / "out.parquet"
    args = stats.build_parser().parse_args([str(tmp_path), "-o", str(out_dir), "--quiet"])
    with pytest.raises(cli.InputError) as e:
        stats.run(args, spark=spark, out=io.StringIO())
    assert e.value.code == 3 and "no snapshots in" in str(e.value) and "--allow-empty" in str(e.value)
    assert not out_dir.exists()


def _good_line(t: float) -> bytes:
    from spark_data import line, topic

    return line(1_700_000_040 + t, "n", 4151, 1_699_000_000, [topic("t", msgs=int(t))])


def test_stats_malformed_lines_counted_rejected_and_failing(spark, tmp_path) -> None:
    """Garbage lines, a torn line and a string message_count are rejected, counted, located (first
    file and line), written to <output>/_rejected; past --max-bad-records (0) exit 4, no table written."""
    from nsqtw.spark import cli, stats

    src = tmp_path / "in"
    src.mkdir()
    (src / "nsqd-stats.2024-01-01_00.n_4151.jsonl").write_bytes(b"".join(_good_line(t) for t in range(0, 120, 10)))
    (src / "nsqd-stats.2024-01-01_01.n_4151.jsonl").write_bytes(
        _good_line(130) + b"garbage line\n\n" + _good_line(140).replace(b'"message_count":140', b'"message_count":"140"')
        + b'{"node":{}}\n' + b'{"timestamp":17')
    out_dir = tmp_path / "out"
    args = stats.build_parser().parse_args([str(src), "-o", str(out_dir), "--quiet"])
    with pytest.raises(cli.BadRecordsError) as e:
        stats.run(args, spark=spark, out=io.StringIO())
    text = str(e.value)
    assert e.value.code == cli.EXIT_BAD_RECORDS == 4
    assert text.startswith("4 of 17 input lines rejected (first: ") and "nsqd-stats.2024-01-01_01.n_4151.jsonl line 2)" in text
    assert "--max-bad-records 0" in text
    assert sorted(os.listdir(out_dir)) == ["_rejected"]  # the table itself is not written
    rejected = spark.read.json(str(out_dir / "_rejected"))
    assert sorted((r["reason"][:9], r["value"][:12]) for r in rejected.collect()) == [
        ("malformed", "garbage line"), ("malformed", '{"timestamp"'), ("malformed", '{"timestamp"'),
        ("not an ex", '{"node":{}}')]
    # accepted up to the threshold: the rates come from the good lines only, and stderr says so
    err = io.StringIO()
    args = stats.build_parser().parse_args([str(src), "-o", str(out_dir), "--quiet", "--max-bad-records", "4"])
    res = stats.run(args, spark=spark, out=io.StringIO(), err=err)
    assert res["rejected_lines"] == 4 and res["series"] == 1
    assert err.getvalue().startswith("nsqtw-stats: warning: 4 of 17 input lines rejected")
    # a clean run removes the stale _rejected
    (src / "nsqd-stats.2024-01-01_01.n_4151.jsonl").unlink()
    stats.run(stats.build_parser().parse_args([str(src), "-o", str(out_dir), "--quiet"]), spark=spark,
              out=io.StringIO(), err=io.StringIO())
    assert "_rejected" not in os.listdir(out_dir)


def test_stats_negative_counters_flagged_not_negative_rates(spark, tmp_path) -> None:
    """A counter below zero (what the bench generator wrote after a restart) gives no negative rate;
    the window is flagged (counter_anomalies) and stderr says so."""
    from spark_data import line, topic

    from nsqtw.spark import stats

    src = tmp_path / "in"
    src.mkdir()
    start2 = 1_700_000_040 + 25
    rows = [line(1_700_000_040 + t, "n", 4151, 1_699_000_000, [topic("t", msgs=1000 + t)]) for t in (0, 10, 20)]
    rows += [line(1_700_000_040 + t, "n", 4151, start2, [topic("t", msgs=-700 + t)]) for t in (30, 40, 50)]
    (src / "nsqd-stats.2024-01-01_00.n_4151.jsonl").write_bytes(b"".join(rows))
    out_dir = tmp_path / "out"
    err = io.StringIO()
    res = stats.run(stats.build_parser().parse_args([str(src), "-o", str(out_dir), "--quiet"]), spark=spark,
                    out=io.StringIO(), err=err)
    assert res["counter_anomalies"] == 3
    back = spark.read.parquet(str(out_dir)).collect()
    assert all(r["publish_rate"] is None or r["publish_rate"] >= 0 for r in back)
    assert sum(r["counter_anomalies"] for r in back) == 3
    assert "3 snapshots with a counter that went down without a restart" in err.getvalue()


def test_stats_allow_empty(spark, tmp_path) -> None:
    from nsqtw.spark import stats

    out_dir = tmp_path / "out.parquet"
    args = stats.build_parser().parse_args([str(tmp_path), "-o", str(out_dir), "--allow-empty", "--quiet"])
    buf = io.StringIO()
    assert stats.run(args, spark=spark, out=buf)["series"] == 0
    assert "0 node/topic/channel series" in buf.getvalue() and not out_dir.exists()


def test_replay_nothing_in_the_time_range(spark, tmp_path) -> None:
    from nsqtw.spark import cli, replay

    (tmp_path / "events.h.log").write_bytes(b"a\nb\n")
    args = replay.build_parser().parse_args([str(tmp_path), "--dry-run", "--quiet", "--since", "4000000000"])
    with pytest.raises(cli.InputError) as e:
        replay.run(args, spark=spark, out=io.StringIO())
    assert "no messages in" in str(e.value) and "between --since and --until" in str(e.value)
    args = replay.build_parser().parse_args([str(tmp_path), "--dry-run", "--quiet", "--since", "4000000000",
                                             "--allow-empty"])
    assert replay.run(args, spark=spark, out=io.StringIO())["read"] == 0


def test_failing_spark_job_one_line_cause_first(spark) -> None:
    """An exception inside a Spark task: the Python error line first, the traceback only with --verbose."""
    import argparse

    from nsqtw.spark import cli

    parser = argparse.ArgumentParser(prog="job")
    cli.add_common_arguments(parser)

    def job(_args):
        spark.sparkContext.parallelize([1], 1).map(lambda x: x // 0).collect()

    err = io.StringIO()
    assert cli.run_main("job", parser, job, [], stderr=err) == 1
    text = err.getvalue()
    assert text.startswith("job: error: ZeroDivisionError: integer division or modulo by zero")
    assert text.count("\n") == 1
    err = io.StringIO()
    assert cli.run_main("job", parser, job, ["--verbose"], stderr=err) == 1
    text = err.getvalue()
    assert "Traceback" in text and text.splitlines()[-1].startswith("job: error: ZeroDivisionError")


def test_failing_sql_error_class(spark) -> None:
    import argparse

    from nsqtw.spark import cli

    parser = argparse.ArgumentParser(prog="job")
    cli.add_common_arguments(parser)
    err = io.StringIO()
    assert cli.run_main("job", parser, lambda _a: spark.sql("SELECT raise_error('boom')").collect(), [],
                        stderr=err) == 1
    assert err.getvalue().count("\n") == 1 and "boom" in err.getvalue()


def test_progress_stage_lines_on_stderr_and_quiet(spark, tmp_path) -> None:
    """A run prints its stages on stderr (stdout keeps only the results); --quiet prints none."""
    from spark_data import line, topic

    from nsqtw.spark import stats

    src = tmp_path / "in"
    src.mkdir()
    (src / "nsqd-stats.2024-01-01_00.n_4151.jsonl").write_bytes(b"".join(
        line(1_700_000_040 + s, "n", 4151, 1_699_000_000, [topic("t", msgs=s)]) for s in range(0, 60, 10)))
    out, err = io.StringIO(), io.StringIO()
    stats.run(stats.build_parser().parse_args([str(src), "-o", str(tmp_path / "o.parquet")]), spark=spark,
              out=out, err=err)
    stages = [ln.split("] ", 1)[1] for ln in err.getvalue().splitlines()]
    assert [s.split(" ")[0] for s in stages] == ["reading", "computing", "writing", "summarizing", "done"], stages
    assert all(ln.startswith("nsqtw-stats: [") for ln in err.getvalue().splitlines())
    assert "reading" not in out.getvalue() and "1 node/topic/channel series" in out.getvalue()
    quiet = io.StringIO()
    stats.run(stats.build_parser().parse_args([str(src), "-o", "", "--quiet"]), spark=spark,
              out=io.StringIO(), err=quiet)
    assert quiet.getvalue() == ""


def _tiny_input(d):
    from spark_data import line, topic

    d.mkdir()
    (d / "nsqd-stats.2024-01-01_00.n_4151.jsonl").write_bytes(b"".join(
        line(1_700_000_040 + s, "n", 4151, 1_699_000_000, [topic("t", msgs=s)]) for s in range(0, 60, 10)))
    return d


def test_cli_spark_failure_is_one_line_not_a_java_traceback(tmp_path) -> None:
    """The real command, Spark started, its read failing, stderr captured as a scheduler does (not a
    terminal): exit 1, the cause on a line of its own that grep finds, no progress bar's carriage
    returns, no traceback, and no line that is not the job's own (Spark's log and the JVM's notes)."""
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root), SPARK_LOCAL_IP="127.0.0.1")
    proc = subprocess.run([sys.executable, "-m", "nsqtw.spark", "stats", "nosuchfs://bucket/stats", "-o", "",
                           "--master", "local[1]"], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert re.search(r'^nsqtw-stats: error: .*No FileSystem for scheme "nosuchfs"', proc.stderr, re.M), proc.stderr
    assert "\r" not in proc.stderr and "Traceback" not in proc.stderr
    assert all(ln.startswith("nsqtw-stats: ") for ln in proc.stderr.splitlines()), proc.stderr
    assert proc.stdout == ""


def test_spark_submit_master_is_respected_and_quiet(tmp_path) -> None:
    """`spark-submit --master local[1] <submit file> stats ...`: the job runs on spark-submit's master
    (nothing in code overrides it), from the shipped file, and -q leaves only what the spark-submit
    JVM prints before the job's code runs."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    import pyspark

    from nsqtw.spark import submit

    root = Path(__file__).resolve().parents[2]
    spark_submit = os.path.join(os.path.dirname(sys.executable), "spark-submit")
    if not os.path.exists(spark_submit):
        pytest.skip("no spark-submit in this venv")
    src = _tiny_input(tmp_path / "in")
    summary = tmp_path / "summary.json"
    env = dict(os.environ, PYTHONPATH=str(root), SPARK_LOCAL_IP="127.0.0.1",
               SPARK_HOME=os.path.dirname(pyspark.__file__), PYSPARK_PYTHON=sys.executable)
    env.pop("PYSPARK_DRIVER_PYTHON", None)
    proc = subprocess.run([spark_submit, "--master", "local[1]", "--conf", "spark.ui.enabled=false",
                           "--conf", f"spark.pyspark.driver.python={sys.executable}", submit.__file__, "stats",
                           str(src), "-o", "", "-q", "--summary-json", str(summary)],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(summary.read_text())
    assert doc["master"] == "local[1]" and doc["series_count"] == 1 and doc["rejected_lines"] == 0
    assert proc.stdout.startswith("nsqtw-stats: 1 node/topic/channel series")
    # Spark's start-up log (89 INFO lines before) is silenced from the SparkContext's first lines
    assert proc.stderr.count(" INFO ") <= 3 and len(proc.stderr.splitlines()) < 10, proc.stderr
