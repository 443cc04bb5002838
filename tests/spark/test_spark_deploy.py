"""The streaming source as the README deploys it: its example program run exactly as written, and
a worker that cannot import nsqtw found at once, with the fix in the error."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

# without pyspark every test here is skipped, saying why (not failed at its first import)
pytest.importorskip("pyspark", reason="the Spark tests need the nsqtw[spark] extra (pyspark, pyarrow; make test installs it)")


ROOT = Path(__file__).resolve().parents[2]
MARKER = "``stream_events.py``, a whole program"


def readme_example() -> str:
    """The literal block after the ``stream_events.py`` paragraph of the Spark guide (docs/guide/spark.rst), dedented."""
    lines = (ROOT / "docs" / "guide" / "spark.rst").read_text(encoding="utf-8").splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(MARKER))
    i = next(i for i in range(start, len(lines)) if lines[i].rstrip().endswith("::")) + 1
    block: list[str] = []
    while i < len(lines) and (not lines[i].strip() or lines[i].startswith("    ")):
        block.append(lines[i][4:])
        i += 1
    return "\n".join(block).strip() + "\n"


def test_readme_example_is_a_whole_program() -> None:
    src = readme_example()
    compile(src, "stream_events.py", "exec")
    assert "register(spark)" in src and "awaitTermination" in src


def _parquet_bodies(path: Path) -> list[bytes]:
    import pyarrow.dataset as ds

    if not path.exists() or not any(p.suffix == ".parquet" for p in path.iterdir()):
        return []
    try:
        table = ds.dataset(str(path), format="parquet").to_table(columns=["body"])
    except Exception:  # a file being written
        return []
    return [bytes(b) for b in table.column("body").to_pylist()]


@pytest.mark.e2e
def test_readme_streaming_example_runs_as_written(tmp_path) -> None:
    """`.venv/bin/python stream_events.py <nsqd> <dir>` with no PYSPARK_PYTHON set and a PATH whose
    python3 is not the venv's: every published message reaches the Parquet sink."""
    from live_nsqd import LiveNsqd

    script = tmp_path / "stream_events.py"
    script.write_text(readme_example(), encoding="utf-8")
    base = tmp_path / "events"
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV")}
    venv_bin = os.path.dirname(sys.executable)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin) or "/usr/bin"
    # this checkout's nsqtw (an installed copy may be older); the program itself is untouched
    env["PYTHONPATH"] = str(ROOT)
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    nsqd = LiveNsqd()
    proc = None
    try:
        expected = {b"event-%03d" % i for i in range(40)}
        nsqd.mpub("events", sorted(expected))
        log = open(tmp_path / "stream.log", "wb")
        proc = subprocess.Popen([sys.executable, str(script), nsqd.tcp_address, str(base)], cwd=tmp_path,
                                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 180
        while set(_parquet_bodies(base / "parquet")) < expected:
            if proc.poll() is not None:
                raise AssertionError("the README's program ended: "
                                     + (tmp_path / "stream.log").read_text(errors="replace")[-3000:])
            if time.monotonic() > deadline:
                raise AssertionError("timed out: " + (tmp_path / "stream.log").read_text(errors="replace")[-3000:])
            time.sleep(1.0)
        assert (base / "checkpoint" / "nsq-spool").is_dir()
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        nsqd.stop()


def test_readme_example_is_the_shipped_example() -> None:
    """README's program is examples/stream_events.py, and it leaves the master to spark-submit."""
    src = readme_example()
    assert src == (ROOT / "examples" / "stream_events.py").read_text(encoding="utf-8")
    assert "builder.master(" not in src and "SparkSession.builder.appName" in src


def test_worker_that_cannot_run_a_data_source_fails_with_the_fix(spark) -> None:
    """The probe goes through the planner's path: a worker Python that does not start (what
    spark.pyspark.python names) gives WorkerImportError naming it and the fix."""
    from nsqtw.spark.source import WorkerImportError, check_workers, register

    sc = spark.sparkContext
    saved = sc.pythonExec
    sc.pythonExec = "/nonexistent/bin/python3"
    try:
        with pytest.raises(WorkerImportError) as e:
            check_workers(spark)
    finally:
        sc.pythonExec = saved
    text = str(e.value)
    assert "/nonexistent/bin/python3" in text and "spark.pyspark.python" in text and "pyarrow" in text
    assert check_workers(spark)  # this session's workers do
    register(spark, check=False)


def test_source_is_shipped_by_value_and_the_registry_restored() -> None:
    """What register() hands Spark unpickles in a Python that has pyspark but not nsqtw, and pickles
    again there (the planner ships the reader on to the executors); nothing stays registered."""
    pytest.importorskip("pyspark")
    from pyspark import cloudpickle

    # pickled outside pytest: pytest rewrites the asserts of an installed plugin's whole package
    dump = ("import sys\nfrom pyspark import cloudpickle\nfrom nsqtw.spark import source\n"
            "with source._shipped_by_value():\n    blob = cloudpickle.dumps(source.NsqDataSource)\n"
            "assert 'nsqtw' not in cloudpickle.list_registry_pickle_by_value()\n"
            "sys.stdout.buffer.write(blob)\n")
    blob = subprocess.run([sys.executable, "-c", dump], capture_output=True, check=True, timeout=60, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT))).stdout
    code = ("import pickle, sys\n"
            f"sys.path = [p for p in sys.path if p not in ('', {str(ROOT)!r})]\n"
            "try:\n    import nsqtw\nexcept ImportError:\n    pass\nelse:\n    raise SystemExit('nsqtw importable')\n"
            "from pyspark import cloudpickle\n"
            "cls = pickle.loads(sys.stdin.buffer.read())\n"
            "reader = cls({'topic': 't', 'nsqd': '127.0.0.1:1', 'spoolDir': '/nonexistent'}).streamReader(None)\n"
            "again = pickle.loads(cloudpickle.dumps(reader))\n"
            "print(type(again).__name__, again.topic)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    site = os.path.dirname(os.path.dirname(os.path.dirname(cloudpickle.__file__)))
    env["PYTHONPATH"] = _isolated_site(site)
    proc = subprocess.run([sys.executable, "-S", "-c", code], input=blob, capture_output=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    assert proc.stdout.decode().split() == ["NsqStreamReader", "t"]


def _isolated_site(site: str) -> str:
    """A directory holding only pyspark and py4j from ``site`` (links), for a Python without nsqtw."""
    import tempfile

    d = tempfile.mkdtemp(prefix="nsqtw-nonsqtw-site-")
    for name in ("pyspark", "py4j"):
        os.symlink(os.path.join(site, name), os.path.join(d, name))
    return d
