"""nsqtw-stats and nsqtw-replay as a scheduler runs them: one line and a non-zero exit for every problem
found before Spark starts (no Spark here: starting it is itself a failure of these tests)."""

from __future__ import annotations

import io

import pytest

from nsqtw.spark import cli, replay, stats


@pytest.fixture(autouse=True)
def no_spark(monkeypatch):
    """Any attempt to start Spark fails the test: these checks must come first."""
    def refuse(*_args, **_kwargs):
        raise AssertionError("Spark was started before the arguments were checked")
    monkeypatch.setattr(stats, "get_session", refuse)
    monkeypatch.setattr(replay, "get_session", refuse)


def _run(main, argv):
    """The console script's main with its stderr captured: (exit status, stderr)."""
    module = stats if main is stats.main else replay
    err = io.StringIO()
    code = cli.run_main(module.build_parser().prog, module.build_parser(), module.run, argv, stderr=err)
    return code, err.getvalue()


def _one_line(text: str, *parts: str) -> None:
    assert text.count("\n") == 1 and text.endswith("\n"), text
    assert "Traceback" not in text
    for p in parts:
        assert p in text, text


def test_stats_missing_input(tmp_path) -> None:
    code, err = _run(stats.main, [str(tmp_path / "nope"), "-o", ""])
    assert code == cli.EXIT_INPUT == 3
    _one_line(err, "error: input not found:", str(tmp_path / "nope"))


def test_stats_missing_input_as_file_uri(tmp_path) -> None:
    code, err = _run(stats.main, [f"file://{tmp_path}/nope", "-o", ""])
    assert code == 3
    _one_line(err, "input not found")


def test_stats_empty_directory(tmp_path) -> None:
    code, err = _run(stats.main, [str(tmp_path), "-o", str(tmp_path / "out")])
    assert code == 3
    _one_line(err, "no input", "--pattern 'nsqd-stats.*'", "--allow-empty")
    assert not (tmp_path / "out").exists()


def test_stats_files_not_matching_pattern(tmp_path) -> None:
    (tmp_path / "other.jsonl").write_text("{}\n")
    (tmp_path / "_SUCCESS").write_text("")
    (tmp_path / "nsqd-stats.hidden").mkdir()
    code, err = _run(stats.main, [str(tmp_path), "--pattern", "nsqd-stats.*"])
    assert code == 3
    _one_line(err, "no file in", "matches --pattern")


def test_stats_glob_matching_nothing(tmp_path) -> None:
    code, err = _run(stats.main, [str(tmp_path / "nsqd-stats.2024-*")])
    assert code == 3
    _one_line(err, "nothing matches")


@pytest.mark.parametrize("argv, words", [
    (["--window", "0"], "--window must be positive"),
    (["--window", "soon"], "invalid value \"soon\" for flag --window"),
    (["--max-gap=-1m"], "--max-gap must not be negative"),
    (["--top", "0"], "--top must be at least 1"),
    (["--conf", "novalue"], "--conf 'novalue': expected KEY=VALUE"),
    (["--html", "/nonexistent-dir/r.html"], "directory /nonexistent-dir does not exist"),
])
def test_stats_bad_arguments(tmp_path, argv, words) -> None:
    (tmp_path / "nsqd-stats.x.jsonl").write_text("")
    code, err = _run(stats.main, [str(tmp_path), *argv])
    assert code == cli.EXIT_USAGE == 2
    _one_line(err, "nsqtw-stats: error:", words)


@pytest.mark.parametrize("argv, words", [
    (["--dry-run", "--since", "yesterday"], "--since 'yesterday': not a time"),
    (["--dry-run", "--until", "2024-13-01"], "--until '2024-13-01': not a time"),
    (["--dry-run", "--since", "200", "--until", "100"], "is not before --until"),
    ([], "nothing to do"),
    (["--dry-run", "--batch-size", "0"], "--batch-size must be at least 1"),
    (["--nsqd-http-address", "ftp://x:1"], "unsupported scheme"),
    (["--dry-run", "--rate", "-1"], "--rate must not be negative"),
])
def test_replay_bad_arguments(tmp_path, argv, words) -> None:
    (tmp_path / "events.log").write_text("a\n")
    code, err = _run(replay.main, [str(tmp_path), *argv])
    assert code == 2
    _one_line(err, "nsqtw-replay: error:", words)


def test_replay_existing_output(tmp_path) -> None:
    (tmp_path / "events.log").write_text("a\n")
    (tmp_path / "clean").mkdir()
    code, err = _run(replay.main, [str(tmp_path / "events.log"), "-o", str(tmp_path / "clean")])
    assert code == 2
    _one_line(err, "already exists")


def test_replay_missing_and_empty_input(tmp_path) -> None:
    code, err = _run(replay.main, [str(tmp_path / "gone"), "--dry-run"])
    assert code == 3
    _one_line(err, "input not found")
    (tmp_path / "events.log").write_text("a\n")
    code, err = _run(replay.main, [str(tmp_path), "--dry-run", "--pattern", "*.gz"])
    assert code == 3
    _one_line(err, "matches --pattern '*.gz'")


def test_main_exit_status_and_one_line(tmp_path, capsys) -> None:
    """The console scripts' main(): the same line on the real stderr, the status returned."""
    assert stats.main([str(tmp_path / "nope")]) == 3
    assert replay.main([str(tmp_path), "--since", "yesterday", "--dry-run"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("nsqtw-stats: error: input not found")
    assert err[1].startswith("nsqtw-replay: error: --since 'yesterday'")
    assert len(err) == 2


def test_describe_error_picks_the_cause() -> None:
    """A Python traceback quoted inside a Spark error is reduced to its last line."""
    class PythonException(Exception):
        pass

    text = ("\n  An exception was thrown from the Python worker. Please see the stack trace below.\n"
            "Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n"
            "ModuleNotFoundError: No module named 'nsqtw'\n")
    assert cli.describe_error(PythonException(text)) == "ModuleNotFoundError: No module named 'nsqtw'"
    assert cli.describe_error(cli.InputError("input not found: x")) == "input not found: x"
    assert cli.describe_error(ValueError("bad\nmore")) == "ValueError: bad"


def test_progress_lines_and_quiet() -> None:
    ticks = iter([0.0, 1.5, 3.0])
    buf = io.StringIO()
    p = cli.Progress("nsqtw-stats", stream=buf, clock=lambda: next(ticks))
    p("reading")
    p("done")
    assert buf.getvalue() == "nsqtw-stats: [   1.5s] reading\nnsqtw-stats: [   3.0s] done\n"
    quiet = io.StringIO()
    q = cli.Progress("nsqtw-stats", quiet=True, stream=quiet, clock=lambda: 0.0)
    q("reading")
    assert quiet.getvalue() == ""


def test_progress_goes_to_stderr_quiet_silences_it(tmp_path, capsys) -> None:
    """Stage lines of a run that fails early go to stderr, never stdout; --quiet leaves only the error."""
    (tmp_path / "nsqd-stats.a.jsonl").write_text("")
    assert stats.main([str(tmp_path), "--window", "0"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert stats.main([str(tmp_path), "--quiet", "--window", "0"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.parametrize("master,words", [
    ("bogus://x", "--master 'bogus://x': not a Spark master URL"),
    ("local[0]", "--master 'local[0]': not a Spark master URL"),
    ("yarn-client", "--master 'yarn-client': not a Spark master URL"),
    ("spark://host-without-port", "--master spark://host-without-port: expected spark://host:port"),
])
def test_bad_master_is_a_usage_error_before_spark(tmp_path, master, words) -> None:
    (tmp_path / "nsqd-stats.2024-01-01_00.a_4151.jsonl").write_bytes(b"{}\n")
    code, err = _run(stats.main, [str(tmp_path), "-o", "", "--master", master])
    assert code == cli.EXIT_USAGE
    _one_line(err, "nsqtw-stats: error: " + words)


def test_unreachable_master_fails_at_once_naming_it(tmp_path) -> None:
    """spark://127.0.0.1:<closed>: one line naming the master and the reason, no JVM (Spark itself
    retries for over a minute, then says 'Cannot call methods on a stopped SparkContext')."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "nsqd-stats.2024-01-01_00.a_4151.jsonl").write_bytes(b"{}\n")
    for main in (stats.main, replay.main):
        argv = [str(tmp_path), "--master", f"spark://127.0.0.1:{port}"] + (["-o", ""] if main is stats.main
                                                                            else ["--dry-run"])
        code, err = _run(main, argv)
        assert code == cli.EXIT_FAILED
        _one_line(err, f"error: cannot reach the Spark master spark://127.0.0.1:{port} (127.0.0.1:{port}: ",
                  "refused")


def test_stats_output_that_is_a_file_fails_before_spark(tmp_path) -> None:
    (tmp_path / "nsqd-stats.2024-01-01_00.a_4151.jsonl").write_bytes(b"{}\n")
    target = tmp_path / "out"
    target.write_bytes(b"not a directory")
    code, err = _run(stats.main, [str(tmp_path), "-o", str(target)])
    assert code == cli.EXIT_USAGE
    _one_line(err, f"--output {target}: exists and is not a directory")


def test_module_without_a_command_prints_usage_on_stderr(capsys) -> None:
    from nsqtw.spark.__main__ import main

    assert main([]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("usage: python -m nsqtw.spark {stats,replay,submit-file,warm-up}")
    assert main(["submit-file"]) == 0
    path = capsys.readouterr().out.strip()
    assert path.endswith("nsqtw/spark/submit.py")
    import os
    assert os.path.isfile(path)


def test_submit_file_runs_as_a_script_without_relative_imports(tmp_path) -> None:
    """What spark-submit does with it: run it as a file (no package context)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from nsqtw.spark import submit

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, submit.__file__, "stats", str(tmp_path / "missing"), "-o", ""],
                          capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(root)))
    assert proc.returncode == cli.EXIT_INPUT, proc.stderr
    assert proc.stderr.startswith("nsqtw-stats: error: input not found") and "relative import" not in proc.stderr


def test_progress_bar_only_on_a_terminal() -> None:
    import argparse

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert cli.progress_bar(argparse.Namespace(quiet=False), Tty()) is True
    assert cli.progress_bar(argparse.Namespace(quiet=True), Tty()) is False
    assert cli.progress_bar(argparse.Namespace(quiet=False), io.StringIO()) is False


def test_error_line_starts_a_line_on_a_terminal() -> None:
    """A half-drawn progress bar is cleared first; in a log (no terminal) the line is plain."""
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    err = Tty()
    err.write("[Stage 0:>   (0 + 1) / 1]")
    cli._write_error("nsqtw-stats", "boom", err)
    assert err.getvalue().endswith("\r\x1b[Knsqtw-stats: error: boom\n")
    plain = io.StringIO()
    cli._write_error("nsqtw-stats", "boom", plain)
    assert plain.getvalue() == "nsqtw-stats: error: boom\n"
