"""The Spark side of the jobs' failures: inputs that hold nothing, and a Spark job that fails."""

from __future__ import annotations

import io

import pytest

pytestmark = pytest.mark.spark


def test_stats_files_without_records_is_an_input_error(spark, tmp_path) -> None:
    """Files match --pattern but hold no export record: exit 3, no output directory created."""
    from nsqtw.spark import cli, stats

    (tmp_path / "nsqd-stats.2024-01-01_00.a_4151.jsonl").write_bytes(b"")
    (tmp_path / "nsqd-stats.2024-01-01_01.a_4151.jsonl").write_bytes(b'{"timestamp":17')  # torn line only
    out_dir = tmp_path / "out.parquet"
    args = stats.build_parser().parse_args([str(tmp_path), "-o", str(out_dir), "--quiet"])
    with pytest.raises(cli.InputError) as e:
        stats.run(args, spark=spark, out=io.StringIO())
    assert e.value.code == 3 and "no snapshots in" in str(e.value) and "--allow-empty" in str(e.value)
    assert not out_dir.exists()


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
