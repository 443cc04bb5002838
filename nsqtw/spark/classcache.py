"""A class-data-sharing archive of Spark's classes for the JVM a CLI job launches on a local master.

Spark's JVM loads and verifies the same tens of thousands of classes (Spark's core, the SQL engine,
the JSON reader, the Parquet writer, Jackson, Hadoop's file system) at every start.  JDK 13 and later
can map them from an archive instead (``-XX:SharedArchiveFile``), so a ``nsqtw-stats`` run starts
its session and its first task seconds sooner.

The archive is never written by a user's job: a separate warm-up run builds it, a child process
(``python -m nsqtw.spark warm-up``) that runs ``nsqtw-stats`` on a few generated snapshots, with
``--html`` and Parquet output, in a JVM started with ``-XX:ArchiveClassesAtExit``; the warm-up waits
for that JVM to exit cleanly, checks the archive with a ``java -version`` that maps it (a torn
archive makes the JVM abort), and only then renames it into place and writes its manifest (its size
and modification time).  A job uses the archive only when the manifest matches the file, and when
the JVM does not start with it anyway the job forgets it and starts again without: a missing,
mismatched or corrupt archive never fails a job, it only makes it start as it would without one.

The archive lives in the user's cache directory (``$XDG_CACHE_HOME/nsqtw``, else ``~/.cache/nsqtw``),
one per Java runtime, Spark install and class path (the name holds a digest of the java binary, of
pyspark's version and jars and of the settings that add to Spark's class path), so an upgrade starts
a new one.  It is built after the first CLI run on a local master that finds none, in the background
(a detached, ``nice``\\d child, after the job is done: the run itself is not slowed and cannot fail
because of it), or on demand with ``python -m nsqtw.spark warm-up`` (an image build, a benchmark).
``NSQTW_SPARK_CLASS_ARCHIVE=off`` turns both the use and the building off.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["ENV", "QUIET", "enabled", "cache_dir", "archive_path", "usable", "options", "share_options", "forget",
           "write_snapshots", "build", "build_in_background", "main"]

#: ``off`` (or ``0``, ``no``, ``false``): no archive is used or built.
ENV = "NSQTW_SPARK_CLASS_ARCHIVE"

#: The JVM's notes about class data sharing (a stale archive is a warning on the JVM's stdout, which
#: is the job's) silenced.
QUIET = "-Xlog:cds*=off -Xlog:class+path*=off"

#: The environment that adds to the class path Spark's launcher builds (the archive is valid for one).
_CLASSPATH_ENV = ("SPARK_HOME", "SPARK_CONF_DIR", "SPARK_DIST_CLASSPATH", "SPARK_CLASSPATH", "HADOOP_CONF_DIR",
                  "YARN_CONF_DIR", "SPARK_PREPEND_CLASSES")


def enabled() -> bool:
    return os.environ.get(ENV, "").strip().lower() not in ("off", "0", "no", "false")


def cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "nsqtw")


def _java() -> str | None:
    """The java binary Spark's launcher runs (``$JAVA_HOME/bin/java``, else the one on PATH)."""
    home = os.environ.get("JAVA_HOME")
    found = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return os.path.realpath(found) if found and os.path.isfile(found) else None


def archive_path() -> str | None:
    """Where the archive for this Java, Spark and class path is (or would be); None without a java
    binary or pyspark's jars."""
    java = _java()
    if java is None:
        return None
    try:
        import pyspark

        digest = hashlib.sha256()
        st = os.stat(java)
        digest.update(f"{java} {st.st_size} {st.st_mtime_ns} {pyspark.__version__}\n".encode())
        for name in _CLASSPATH_ENV:
            digest.update(f"{name}={os.environ.get(name, '')}\n".encode())
        jars = os.path.join(os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__), "jars")
        for name in sorted(os.listdir(jars)):
            jst = os.stat(os.path.join(jars, name))
            digest.update(f"{name} {jst.st_size} {jst.st_mtime_ns}\n".encode())
    except (ImportError, OSError):
        return None
    return os.path.join(cache_dir(), f"spark-classes-{digest.hexdigest()[:16]}.jsa")


def _manifest(path: str) -> str:
    return path + ".ok"


def usable(path: str) -> bool:
    """The archive is there and is the file the warm-up checked (its manifest's size and time)."""
    try:
        with open(_manifest(path), encoding="utf-8") as f:
            expected = json.load(f)
        st = os.stat(path)
        return bool(expected == {"size": st.st_size, "mtime_ns": st.st_mtime_ns})
    except (OSError, ValueError):
        return False


def forget(path: str) -> None:
    """Delete an archive (and its manifest) that a JVM would not start with."""
    for name in (_manifest(path), path):
        try:
            os.unlink(name)
        except OSError:
            pass


def options(path: str) -> str:
    """The JVM options that map the archive at ``path``: its notes silenced, and should it make the JVM
    abort after all, the crash file in the cache directory, not in the user's working directory."""
    return f"-XX:SharedArchiveFile={path} -XX:ErrorFile={os.path.join(os.path.dirname(path), 'hs_err_pid%p.log')} {QUIET}"


def share_options() -> str:
    """The JVM options that map the archive, or "" when there is none to use."""
    if not enabled():
        return ""
    path, java = archive_path(), _java()
    if path is None or java is None or not usable(path) or len(path.split()) != 1:  # Spark splits at spaces
        return ""
    if not _check(java, path, os.path.dirname(path)):  # 0.1 s; corrupt in place: the JVM would abort
        forget(path)
        return ""
    return options(path)


# --- building ----------------------------------------------------------------------------------------

def write_snapshots(directory: str) -> None:
    """A few export lines in the format of ``nsqd --stats-export-path`` (two nodes, a restart, e2e
    percentiles): enough for the job to run every operator it runs on real input."""
    for node in ("warm-0", "warm-1"):
        name = os.path.join(directory, f"nsqd-stats.2024-01-01_00.{node}_4151.jsonl")
        with open(name, "w", encoding="utf-8") as f:
            for i in range(12):
                ts = 1704067200 + 20 * i
                start = 1704060000 if i < 8 else ts - 5  # a restart
                count = (i if i < 8 else i - 8) * 100
                pct = {"count": 10, "percentiles": [{"quantile": 0.99, "value": 5000000 + i},
                                                    {"quantile": 0.5, "value": 1000000}]}
                channels: list[dict[str, Any]] = [{"channel_name": ch, "depth": i, "backend_depth": 0, "in_flight_count": 1,
                             "deferred_count": 0, "message_count": count, "requeue_count": i, "timeout_count": 0,
                             "client_count": 1, "clients": [], "paused": False, "e2e_processing_latency": pct}
                            for ch in ("ch0", "ch1")]
                topics = [{"topic_name": t, "channels": channels, "depth": 0, "backend_depth": 0,
                           "message_count": count, "message_bytes": count * 10, "paused": False,
                           "e2e_processing_latency": pct} for t in ("t0", "t1")]
                doc = {"timestamp": ts, "node": {"broadcast_address": node, "hostname": node, "tcp_port": 4150,
                                                 "http_port": 4151},
                       "stats": {"version": "1.3.0", "health": "OK", "start_time": start, "topics": topics}}
                f.write(json.dumps(doc) + "\n")


def _check(java: str, archive: str, cwd: str) -> bool:
    """A JVM starts with the archive mapped (a torn one aborts it)."""
    try:
        done = subprocess.run([java, f"-XX:SharedArchiveFile={archive}", "-Xint", *QUIET.split(), "-version"], cwd=cwd,
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=120)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def _lock(path: str) -> int | None:
    """An exclusive lock on the archive's lock file, or None when another process builds it (the
    lock goes with the process, whatever way it ends)."""
    import fcntl

    fd = os.open(path + ".lock", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def build(job: Callable[[str], Any], force: bool = False, err: Any = None, lock_fd: int | None = None) -> str | None:
    """Build the archive: ``job(options)`` runs the warm-up job in this process, in a JVM it starts
    with ``options`` added to its own (so not in a process whose JVM runs already), and returns that
    JVM's process (pyspark's gateway's); this waits for it to exit, checks what it wrote and puts it
    in place.  The path of the archive, or None (said on ``err``) when there is none."""
    err = err or sys.stderr
    if not enabled():
        err.write(f"nsqtw: the class archive is turned off ({ENV}={os.environ.get(ENV)})\n")
        return None
    path, java = archive_path(), _java()
    if path is None or java is None:
        err.write("nsqtw: no class archive: java or pyspark's jars not found\n")
        return None
    if usable(path) and not force:
        return path
    forget(_failed(path))
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    fd = _lock(path) if lock_fd is None else lock_fd  # the background build's lock: its parent took it
    if fd is None:
        err.write(f"nsqtw: another process is building {path}\n")
        return None
    pending = f"{path}.{os.getpid()}.tmp"
    manifest = f"{_manifest(path)}.{os.getpid()}.tmp"
    try:
        if usable(path) and not force:  # built while we waited for the lock
            return path
        proc = job(f"-XX:ArchiveClassesAtExit={pending} {QUIET}")
        if proc is None:
            err.write("nsqtw: no class archive: the JVM was not this process's\n")
            return None
        if proc.stdin:
            proc.stdin.close()  # the JVM exits on its stdin's end, writing the archive
        if (proc.wait(timeout=600) != 0 or not os.path.isfile(pending)
                or not _check(java, pending, os.path.dirname(path))):
            err.write("nsqtw: no class archive: the warm-up JVM did not write one that maps\n")
            _mark_failed(path)
            return None
        os.replace(pending, path)
        st = os.stat(path)
        with open(manifest, "w", encoding="utf-8") as f:
            json.dump({"size": st.st_size, "mtime_ns": st.st_mtime_ns}, f)
        os.replace(manifest, _manifest(path))
        return path
    finally:
        for name in (pending, manifest):
            try:
                os.unlink(name)
            except OSError:
                pass
        os.close(fd)


def _failed(path: str) -> str:
    return path + ".failed"


def _mark_failed(path: str) -> None:
    """A build that produced nothing: runs do not start another in the background (``warm-up`` does)."""
    try:
        with open(_failed(path), "w", encoding="utf-8"):
            pass
    except OSError:
        pass


def build_in_background() -> subprocess.Popen[bytes] | None:
    """Start ``python -m nsqtw.spark warm-up`` detached (its own session, no terminal,
    output discarded): the archive for the next run.  None when it was not started (a build failed
    here before: ``python -m nsqtw.spark warm-up`` says why)."""
    path = archive_path()
    if path is None or os.path.exists(_failed(path)):
        return None
    try:
        os.makedirs(cache_dir(), mode=0o700, exist_ok=True)
        fd = _lock(path)  # taken here and handed to the child: one builder, and the lock held from now on
    except OSError:
        return None
    if fd is None:
        return None
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([package_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    try:
        return subprocess.Popen([sys.executable, "-m", "nsqtw.spark", "warm-up", "--background", str(fd)], env=env,
                                cwd=cache_dir(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True, pass_fds=(fd,))
    except OSError:
        return None
    finally:
        os.close(fd)  # the child's copy holds the lock


def main(argv: Sequence[str] | None, job: Callable[[str], Any]) -> int:
    """``python -m nsqtw.spark warm-up``: build the class archive now with ``job`` (see :func:`build`);
    prints its path."""
    p = argparse.ArgumentParser(prog="python -m nsqtw.spark warm-up",
                                description="Build the class-data-sharing archive of Spark's classes that "
                                            "nsqtw's Spark jobs map on a local master (in the user's cache).")
    p.add_argument("--force", action="store_true", help="build it again even if there is one")
    p.add_argument("--background", type=int, default=None, metavar="LOCK_FD", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.background is not None:
        try:
            os.nice(10)  # others' work first: this one only saves the next run's start-up
        except OSError:  # pragma: no cover - a nice level is a wish
            pass
    path = build(job, force=args.force, lock_fd=args.background)
    if path is None:
        return 1
    sys.stdout.write(path + "\n")
    return 0
