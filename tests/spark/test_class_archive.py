"""The class-data-sharing archive of Spark's classes (nsqtw.spark.classcache, issue 29 item 7: start-up).

Built by a warm-up run of its own, never by a user's job; used by a CLI job on a local master whose
JVM it launches, only when its manifest matches it; a corrupt one never fails a job.
"""

from __future__ import annotations

import fcntl
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spark_data import channel, line, topic

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_700_000_040

#: The CLI job, then the class-data-sharing options of the JVM it ran in (the gateway outlives spark.stop()).
CLI = """
import sys
from nsqtw.spark.stats import main
rc = main(sys.argv[1:])
from pyspark import SparkContext
bean = SparkContext._gateway.jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
print("JVM-CDS", " ".join(a for a in bean.getInputArguments() if "Archive" in a) or "-")
sys.exit(rc)
"""


def _fresh(monkeypatch, tmp_path) -> None:
    """As in a fresh CLI process of a user with an empty cache: no JVM, no spark-submit, no
    spark-defaults.conf, the archive on."""
    from pyspark import SparkContext

    monkeypatch.setattr(SparkContext, "_gateway", None)
    for name in ("PYSPARK_GATEWAY_PORT", "MASTER", "SPARK_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path / "conf"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("NSQTW_SPARK_CLASS_ARCHIVE", "on")


def _env(tmp_path) -> dict[str, str]:
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", SPARK_CONF_DIR=str(tmp_path / "conf"),
               XDG_CACHE_HOME=str(tmp_path / "cache"), NSQTW_SPARK_CLASS_ARCHIVE="on",
               PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    for name in ("PYSPARK_GATEWAY_PORT", "MASTER", "SPARK_HOME"):
        env.pop(name, None)
    return env


def _snapshots(directory: Path) -> Path:
    directory.mkdir()
    lines = []
    for node in ("a.example", "b.example"):
        for i in range(6):
            tps = [topic(f"t{n}", msgs=10 * i, channels=[channel("c", msgs=10 * i, depth=i, pct={0.99: 5e6})])
                   for n in range(2)]
            lines.append(line(T0 + 10 * i, node, 4151, T0 - 100, tps))
    (directory / "nsqd-stats.2023-11-14_22.x_4151.jsonl").write_bytes(b"".join(lines))
    return directory


def _run_cli(tmp_path, data: Path, name: str) -> tuple[subprocess.CompletedProcess[str], str]:
    cmd = [sys.executable, "-c", CLI, str(data), "-q", "--master", "local[1]", "-o", str(tmp_path / name)]
    done = subprocess.run(cmd, env=_env(tmp_path), capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    cds = [ln for ln in done.stdout.splitlines() if ln.startswith("JVM-CDS ")]
    return done, (cds[-1][len("JVM-CDS "):] if cds else "")


def test_the_archive_applies_only_to_a_local_jvm_the_cli_launches(tmp_path, monkeypatch) -> None:
    """Never under spark-submit, for a cluster master, when --conf or spark-defaults.conf set the
    driver's Java options (theirs win), or when NSQTW_SPARK_CLASS_ARCHIVE=off."""
    pytest.importorskip("pyspark")
    from nsqtw.spark import session

    _fresh(monkeypatch, tmp_path)
    assert session.class_archive_applies("local[2]", {}) and session.class_archive_applies(None, {})  # no master: local[*]
    assert not session.class_archive_applies("local[2]", {"spark.driver.extraJavaOptions": "-Xss4m"})
    assert not session.class_archive_applies("spark://10.0.0.5:7077", {}) and not session.class_archive_applies("yarn", {})
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "spark-defaults.conf").write_text("spark.driver.extraJavaOptions -Xss4m\n")
    assert not session.class_archive_applies("local[2]", {})
    (tmp_path / "conf" / "spark-defaults.conf").write_text("spark.master yarn\n")
    assert not session.class_archive_applies(None, {}) and session.class_archive_applies("local[2]", {})
    monkeypatch.setenv("NSQTW_SPARK_CLASS_ARCHIVE", "off")
    assert not session.class_archive_applies("local[2]", {})
    monkeypatch.setenv("NSQTW_SPARK_CLASS_ARCHIVE", "on")
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "1")  # spark-submit's JVM runs already
    assert not session.class_archive_applies("local[2]", {})


def test_an_archive_is_used_only_as_the_warm_up_left_it(tmp_path, monkeypatch) -> None:
    """share_options() names the archive only when its manifest (size, time) matches the file: a
    torn or replaced archive, or one without a manifest (being written), is not used."""
    pytest.importorskip("pyspark")
    from nsqtw.spark import classcache

    _fresh(monkeypatch, tmp_path)
    path = classcache.archive_path()
    assert path is not None and path.startswith(str(tmp_path / "cache" / "nsqtw") + os.sep) and path.endswith(".jsa")
    assert classcache.share_options() == ""
    os.makedirs(os.path.dirname(path))
    with open(path, "wb") as f:
        f.write(b"x" * 1000)
    assert classcache.share_options() == ""  # no manifest
    st = os.stat(path)
    with open(path + ".ok", "w") as f:
        json.dump({"size": st.st_size, "mtime_ns": st.st_mtime_ns}, f)
    monkeypatch.setattr(classcache, "_check", lambda java, archive, cwd: archive == path)  # maps
    assert classcache.share_options() == classcache.options(path)
    assert classcache.options(path).startswith(f"-XX:SharedArchiveFile={path} ")
    with open(path, "r+b") as f:
        f.truncate(300)  # torn
    assert classcache.share_options() == ""
    monkeypatch.setenv("SPARK_DIST_CLASSPATH", "/opt/extra.jar")  # another class path: another archive
    assert classcache.archive_path() != path


def _torn_archive(monkeypatch, tmp_path):
    """An archive with a manifest that matches it, torn in place: a JVM aborts with it (SIGBUS)."""
    from nsqtw.spark import classcache

    _fresh(monkeypatch, tmp_path)
    path, java = classcache.archive_path(), classcache._java()
    assert path is not None and java is not None
    os.makedirs(os.path.dirname(path))
    subprocess.run([java, f"-XX:ArchiveClassesAtExit={path}", "-Xlog:disable", "-version"], check=True,
                   capture_output=True, timeout=120, cwd=str(tmp_path))
    good = Path(path).read_bytes()
    os.chmod(path, 0o600)
    Path(path).write_bytes(good[:len(good) // 3])
    st = os.stat(path)
    Path(path + ".ok").write_text(json.dumps({"size": st.st_size, "mtime_ns": st.st_mtime_ns}))
    assert classcache.usable(path)  # its manifest matches
    check = subprocess.run([java, f"-XX:SharedArchiveFile={path}", "-Xlog:disable", "-version"],
                           capture_output=True, timeout=120, cwd=os.path.dirname(path))
    assert check.returncode != 0  # and a JVM does not start with it
    return path


def _wait_for_builder(path: str) -> None:
    """Until the background warm-up (which holds the archive's lock while it builds) is done."""
    fd = os.open(path + ".lock", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # blocks while the builder holds it
    finally:
        os.close(fd)


@pytest.mark.slow  # a fault run: two Spark jobs and a warm-up building an archive (about a minute)
def test_a_corrupt_archive_never_fails_a_job_and_a_warm_up_apart_builds_the_next(tmp_path, monkeypatch) -> None:
    """An archive that passes the manifest check but makes the JVM abort (torn in place): the job runs
    without it, with its usual output (none of the JVM's crash report, no crash file where it runs),
    and its JVM writes no archive (no -XX:ArchiveClassesAtExit: a job never writes one); the archive
    is forgotten, a detached warm-up builds a new one after the job, and the next run's JVM maps it,
    with the same output."""
    pytest.importorskip("pyspark")
    from nsqtw.spark import classcache

    path = _torn_archive(monkeypatch, tmp_path)
    data = _snapshots(tmp_path / "in")
    first, cds = _run_cli(tmp_path, data, "out1")
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.stdout.startswith("nsqtw-stats: 8 node/topic/channel series"), first.stdout[:500]
    assert first.stderr == "" and cds == "-"
    assert not [n for n in os.listdir(tmp_path) if n.startswith("hs_err")]  # the JVM's crash file: not here
    assert os.path.exists(path + ".lock") and not classcache.usable(path)  # the builder holds the lock
    _wait_for_builder(path)
    assert classcache.usable(path), os.listdir(tmp_path / "cache" / "nsqtw")
    second, cds = _run_cli(tmp_path, data, "out2")
    assert second.returncode == 0, second.stderr[-3000:]
    assert cds == f"-XX:SharedArchiveFile={path}" and second.stderr == ""

    def summary(done):
        return [ln for ln in done.stdout.replace("out2", "out1").splitlines() if not ln.startswith("JVM-CDS ")]

    assert summary(second) == summary(first)


#: A session started with a class archive's options, whatever the archive's state.
SESSION = """
import sys
from nsqtw.spark import classcache
from nsqtw.spark.session import get_session
from nsqtw.spark.stats import LOCAL_JIT_OPTIONS
s = get_session("archive", "local[1]", {"spark.ui.enabled": "false"}, verbose=False,
                local_conf={"spark.driver.extraJavaOptions": LOCAL_JIT_OPTIONS + " " + classcache.options(sys.argv[1])})
bean = s.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
print("JVM-CDS", " ".join(a for a in bean.getInputArguments() if "Archive" in a) or "-",
      s.range(3).count(), all(o in list(bean.getInputArguments()) for o in LOCAL_JIT_OPTIONS.split()))
s.stop()
"""


def test_a_jvm_that_does_not_start_with_the_archive_starts_again_without_it(tmp_path, monkeypatch) -> None:
    """The last resort, should an archive pass the check and still make the JVM abort: the session
    starts a JVM without it (the job's other options kept) and forgets it."""
    pytest.importorskip("pyspark")
    path = _torn_archive(monkeypatch, tmp_path)
    done = subprocess.run([sys.executable, "-c", SESSION, path], env=_env(tmp_path), capture_output=True,
                          text=True, timeout=300, cwd=str(tmp_path / "cache"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "JVM-CDS - 3 True", done.stdout[-2000:]
    assert not os.path.exists(path) and not os.path.exists(path + ".ok")


def test_only_the_command_starts_the_warm_up_never_a_library_call_of_run(monkeypatch) -> None:
    """``run()`` says whether its run wanted an archive it did not find; the command (``main``)
    alone starts the warm-up then, so a program calling ``run()`` never leaves a process behind."""
    pytest.importorskip("pyspark")
    from nsqtw.spark import classcache, stats

    started: list[int] = []
    monkeypatch.setattr(classcache, "build_in_background", lambda: started.append(1))
    for wanted in (True, False):
        monkeypatch.setattr(stats, "run", lambda args, wanted=wanted: {"series": 0, "class_archive_wanted": wanted})
        stats._cli_job(None)  # type: ignore[arg-type]  # run is replaced: its args are not read
    assert started == [1]
    src = inspect.getsource(stats.run)
    assert "build_in_background" not in src  # run() itself never starts it
