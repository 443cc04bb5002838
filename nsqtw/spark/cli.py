"""
What ``nsqtw-stats`` and ``nsqtw-replay`` share as command-line programs run by a scheduler.

* Every problem ends in one line on stderr, ``<prog>: error: <what>``, and a non-zero exit
  status: :data:`EXIT_FAILED` (1) when the Spark job failed, :data:`EXIT_USAGE` (2) for bad
  arguments, :data:`EXIT_INPUT` (3) when the input is missing or holds nothing (unless
  ``--allow-empty``).  ``--verbose`` adds the traceback and Spark's own log.
* Arguments and local inputs are checked before Spark starts (a JVM takes seconds).
* Progress: one line per stage on stderr (and Spark's console progress bar), ``--quiet`` for none.

No pyspark import at module level: the checks must run (and fail) without starting Spark.
"""

from __future__ import annotations

import argparse
import fnmatch
import glob
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any, TextIO
from urllib.parse import unquote, urlsplit

__all__ = ["EXIT_OK", "EXIT_FAILED", "EXIT_USAGE", "EXIT_INPUT", "EXIT_BAD_RECORDS", "BadRecordsError", "progress_bar", "JobError", "UsageError", "InputError",
           "add_common_arguments", "check_local_inputs", "describe_error", "error_class", "local_path", "Progress", "run_main"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INPUT = 3
EXIT_BAD_RECORDS = 4


class JobError(Exception):
    """A failure told in one line, with the exit status to end on."""

    code = EXIT_FAILED

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class UsageError(JobError):
    """A bad argument (found before Spark starts)."""

    code = EXIT_USAGE


class InputError(JobError):
    """The input is missing, or holds nothing to work on."""

    code = EXIT_INPUT


class BadRecordsError(JobError):
    """More malformed input lines than ``--max-bad-records``."""

    code = EXIT_BAD_RECORDS


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--allow-empty", action="store_true",
                        help="no input files or no records is not an error (exit 0 and write nothing)")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no progress on stderr (stage lines and Spark's progress bar)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="on failure, the whole traceback; and Spark's own log (WARN and above)")


# --- inputs ------------------------------------------------------------------------------------------

def local_path(path: str) -> str | None:
    """The local file system path of ``path`` (plain or ``file:``), or None for other Hadoop URIs."""
    if len(path) > 1 and path[1] == ":" and path[0].isalpha():  # C:\... is a path, not a scheme
        return path
    url = urlsplit(path)
    if not url.scheme:
        return path
    if url.scheme == "file":
        return unquote(url.path) or "/"
    return None


def _hidden(name: str) -> bool:
    """Spark's file index skips names starting with ``_`` or ``.``."""
    return name.startswith(("_", "."))


def _matching_files(path: str, pattern: str | None, recursive: bool) -> list[str]:
    def wanted(name: str) -> bool:
        return not _hidden(name) and (not pattern or fnmatch.fnmatchcase(name, pattern))

    if os.path.isdir(path):
        found: list[str] = []
        if recursive:
            for root, dirs, files in os.walk(path):
                dirs[:] = [d for d in dirs if not _hidden(d)]
                found.extend(os.path.join(root, f) for f in files if wanted(f))
        else:
            for entry in sorted(os.listdir(path)):
                full = os.path.join(path, entry)
                if os.path.isfile(full) and wanted(entry):
                    found.append(full)
                elif os.path.isdir(full) and "=" in entry:  # a partition directory (key=value): read too
                    found.extend(_matching_files(full, pattern, recursive))
        return found
    return [path] if os.path.isfile(path) and (not pattern or fnmatch.fnmatchcase(os.path.basename(path), pattern)) \
        else []


def check_local_inputs(paths: Sequence[str], pattern: str | None = None, recursive: bool = False,
                       allow_empty: bool = False) -> int | None:
    """Check what can be checked without Spark; the number of matching local files (None: not all local).

    A local path (or glob) that does not exist is an :class:`InputError`; so is an input made only of
    local paths where no file matches ``pattern`` (unless ``allow_empty``).  Other URIs (``hdfs://``,
    ``s3a://``...) are left to Spark.
    """
    total = 0
    all_local = True
    for path in paths:
        local = local_path(path)
        if local is None:
            all_local = False
            continue
        if glob.has_magic(local):
            matches = sorted(glob.glob(local))
            if not matches:
                raise InputError(f"input not found: nothing matches {path}")
        elif not os.path.exists(local):
            raise InputError(f"input not found: {path}")
        else:
            matches = [local]
        for m in matches:
            if os.path.isdir(m) and not os.access(m, os.R_OK | os.X_OK):
                raise InputError(f"input not readable: {m}")
            total += len(_matching_files(m, pattern, recursive))
    if all_local and total == 0 and not allow_empty:
        where = ", ".join(paths)
        if pattern:
            raise InputError(f"no input: no file in {where} matches --pattern {pattern!r} "
                             "(--allow-empty to accept that)")
        raise InputError(f"no input: no file in {where} (--allow-empty to accept that)")
    return total if all_local else None


# --- rejected input lines ------------------------------------------------------------------------------

def first_line_where(spark: Any, path: str, flag: Callable[[Any], Any]) -> int | None:
    """The number (from 1) of the first line of one file for which ``flag(value column)`` is true.

    A second look at one file, only when lines were rejected: Spark's readers do not number lines.
    """
    from pyspark.sql import functions as F

    text = spark.read.option("lineSep", "\n").text(path)
    flagged = text.select(F.coalesce(flag(F.col("value")), F.lit(False)))
    found = flagged.rdd.zipWithIndex().filter(lambda pair: bool(pair[0][0])).map(lambda pair: pair[1]).take(1)
    return found[0] + 1 if found else None


def report_rejected(prog: str, rejected: Any, count: int, total: int, first: str, line: int | None,
                    target: str | None, max_bad: int, err: TextIO | None = None) -> str | None:
    """Rejected input lines: written to ``target`` as JSON Lines (``file``, ``reason``, ``value``), a
    warning on stderr, or :class:`BadRecordsError` (exit 4) past ``max_bad``.  Returns where they went."""
    where = f"{first}" + (f" line {line}" if line else "")
    if target:
        rejected.coalesce(1).write.mode("overwrite").json(target)
    said = f"{count} of {total} input lines rejected (first: {where})" + (
        f"; written to {target}" if target else "; give --rejected-path DIR to keep them")
    if count > max_bad:
        raise BadRecordsError(f"{said}; more than --max-bad-records {max_bad}, nothing else written")
    (err or sys.stderr).write(f"{prog}: warning: {said}\n")
    return target


def add_rejected_arguments(parser: argparse.ArgumentParser, default_where: str) -> None:
    parser.add_argument("--max-bad-records", type=int, default=0, metavar="N",
                        help="malformed input lines accepted (counted, reported and written to the rejected "
                             "output) before the job fails with exit status 4 (default 0)")
    parser.add_argument("--rejected-path", default="", metavar="DIR",
                        help="where rejected lines go, as JSON Lines {file, reason, value} (default "
                             f"{default_where})")


# --- failures ------------------------------------------------------------------------------------------

def _java_root_cause(java_exc: Any) -> str:
    """The innermost cause of a Java exception (through py4j), as ``Class: message``."""
    seen = 0
    exc = java_exc
    while seen < 20:
        cause = exc.getCause()
        if cause is None or cause.equals(exc):
            break
        exc = cause
        seen += 1
    return str(exc.toString())


def _last_python_error(text: str) -> str | None:
    """The ``Error: message`` line that ends a Python traceback quoted inside a Spark error."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        head = ln.split(":", 1)[0]
        if head.endswith(("Error", "Exception", "Exit", "Interrupt")) and " " not in head and ":" in ln:
            return ln
    return None


def describe_error(exc: BaseException) -> str:
    """One line saying why a job failed: Spark's error class and message, not its stack trace."""
    name = type(exc).__name__
    if isinstance(exc, JobError):
        return str(exc)
    text = str(exc)
    if name == "Py4JJavaError":
        java_exc = getattr(exc, "java_exception", None)
        if java_exc is not None:
            try:
                root = _java_root_cause(java_exc)
            except Exception:  # the gateway may be gone
                root = ""
            if root:
                python_error = _last_python_error(root) if "Traceback" in root else None
                return python_error or root.splitlines()[0]
    if name == "PythonException" or "Traceback (most recent call last)" in text:
        python_error = _last_python_error(text)
        if python_error:
            return python_error
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if "JVM stacktrace:" in first:
        first = first.split("JVM stacktrace:", 1)[0].strip()
    return f"{name}: {first}" if first and not first.startswith("[") else (first or name)


def error_class(exc: BaseException) -> str | None:
    """Spark's error class of a captured exception (``PATH_NOT_FOUND``...), if it has one."""
    get = getattr(exc, "getCondition", None) or getattr(exc, "getErrorClass", None)
    try:
        return get() if get is not None else None
    except Exception:
        return None


def progress_bar(args: argparse.Namespace, stream: TextIO | None = None) -> bool:
    """Spark's console progress bar: only on a terminal (in a captured log it is a run of ``\\r``
    redraws that the next line would be glued to), and never with ``--quiet``."""
    if getattr(args, "quiet", False):
        return False
    stream = stream or sys.stderr
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _write_error(prog: str, message: str, stream: TextIO) -> None:
    try:
        tty = bool(stream.isatty())
    except (AttributeError, ValueError):
        tty = False
    # on a terminal a progress bar may be half drawn: clear its line, so the error starts one
    stream.write(("\r\x1b[K" if tty else "") + f"{prog}: error: {message}\n")
    stream.flush()


def entry_environment(master: str | None) -> None:
    """The process environment of a job run from the command line (entry points only: library
    code sets no environment variable): on a local master, Spark's JVM and its workers bind
    loopback (``SPARK_LOCAL_IP``, which Spark reads from the environment only), unless set."""
    if master is not None and (master == "local" or master.startswith(("local[", "local-cluster["))):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def run_main(prog: str, parser: argparse.ArgumentParser, job: Callable[[argparse.Namespace], Any],
             argv: Sequence[str] | None = None, stderr: TextIO | None = None) -> int:
    """Parse, run ``job``, and turn every failure into one line and an exit status."""
    err = stderr or sys.stderr
    args = parser.parse_args(argv)  # argparse's own errors: usage + one line, exit 2
    entry_environment(getattr(args, "master", None))
    verbose = bool(getattr(args, "verbose", False))
    try:
        job(args)
    except JobError as e:
        if verbose:
            traceback.print_exc(file=err)
        _write_error(prog, str(e), err)
        return e.code
    except KeyboardInterrupt:
        _write_error(prog, "interrupted", err)
        return 130
    except Exception as e:
        if verbose:
            traceback.print_exc(file=err)
        _write_error(prog, describe_error(e) + ("" if verbose else " (--verbose for the traceback)"), err)
        return EXIT_FAILED
    return EXIT_OK


# --- progress ------------------------------------------------------------------------------------------

class Progress:
    """``<prog>: <stage>`` lines on stderr with the time since start; silent with ``quiet``."""

    def __init__(self, prog: str, quiet: bool = False, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.prog = prog
        self.quiet = quiet
        self.stream = stream
        self.clock = clock
        self.started = clock()

    def __call__(self, stage: str) -> None:
        if self.quiet:
            return
        stream = self.stream or sys.stderr
        stream.write(f"{self.prog}: [{self.clock() - self.started:6.1f}s] {stage}\n")
        stream.flush()
