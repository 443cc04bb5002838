"""The streaming source on a separate-process master whose Python workers do not have nsqtw.

``spark-submit --master local-cluster[1,1,1024]`` starts a worker and an executor in JVMs of their
own; ``spark.pyspark.python`` names a bare Python (a venv holding only pyspark, py4j and pyarrow),
so the driver-side planner and the executor run without nsqtw; the driver program (README's
``examples/stream_events.py``, as shipped) runs with it.  Slow: a cluster takes ~20 s to start.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def bare_python(where: Path) -> str:
    """A venv without nsqtw: only links to this venv's pyspark, py4j and pyarrow."""
    import pyarrow
    import pyspark

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=120,
                   env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    python = str(where / "bin" / "python")
    site = subprocess.run([python, "-c", "import site; print(site.getsitepackages()[0])"], check=True,
                          capture_output=True, text=True).stdout.strip()
    for mod in (pyspark, pyarrow):
        os.symlink(os.path.dirname(mod.__file__), os.path.join(site, mod.__name__))
    import py4j
    os.symlink(os.path.dirname(py4j.__file__), os.path.join(site, "py4j"))
    return python


def clean_env() -> dict[str, str]:
    """This environment without anything that would put nsqtw on the workers' path."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV", "SPARK_HOME")}
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    import pyspark
    env["SPARK_HOME"] = os.path.dirname(pyspark.__file__)  # pip's pyspark is a whole Spark home
    return env


def driver_python(tmp_path: Path) -> str:
    """The driver's Python: this venv's, with this checkout first on its path (and on nothing else's)."""
    wrapper = tmp_path / "driver-python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} "$@"\n', encoding="utf-8")
    wrapper.chmod(0o755)
    return str(wrapper)


def spark_submit() -> str:
    path = os.path.join(os.path.dirname(sys.executable), "spark-submit")
    if not os.path.exists(path):
        pytest.skip("spark-submit is not in this venv (pip install pyspark)")
    if shutil.which("java") is None:
        pytest.skip("needs java")
    return path


def _bodies(path: Path) -> set[bytes]:
    import pyarrow.dataset as ds

    if not path.exists() or not any(p.suffix == ".parquet" for p in path.iterdir()):
        return set()
    try:
        return {bytes(b) for b in ds.dataset(str(path), format="parquet").to_table(columns=["body"])
                .column("body").to_pylist()}
    except Exception:
        return set()


def test_stream_events_on_local_cluster_with_workers_lacking_nsqtw(tmp_path) -> None:
    from live_nsqd import LiveNsqd

    submit = spark_submit()
    worker_python = bare_python(tmp_path / "bare")
    env = clean_env()
    probe = subprocess.run([worker_python, "-c", "import nsqtw"], env=env, cwd=tmp_path, capture_output=True,
                           text=True)
    assert "No module named 'nsqtw'" in probe.stderr  # the workers' Python really lacks it
    base = tmp_path / "events"
    nsqd = LiveNsqd()
    proc = None
    log_path = tmp_path / "submit.log"
    try:
        expected = {b"cluster-%02d" % i for i in range(20)}
        nsqd.mpub("events", sorted(expected))
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [submit, "--master", "local-cluster[1,1,1024]",
                 "--conf", f"spark.pyspark.python={worker_python}",
                 "--conf", f"spark.pyspark.driver.python={driver_python(tmp_path)}",
                 "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=1",
                 "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1",
                 str(ROOT / "examples" / "stream_events.py"), nsqd.tcp_address, str(base)],
                cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 240
        while _bodies(base / "parquet") < expected:
            text = log_path.read_text(errors="replace")
            if proc.poll() is not None:
                raise AssertionError(f"spark-submit ended ({proc.returncode}): {text[-4000:]}")
            if time.monotonic() > deadline:
                raise AssertionError("timed out: " + text[-4000:])
            time.sleep(1.0)
        text = log_path.read_text(errors="replace")
        assert "PYTHON_DATA_SOURCE_ERROR" not in text and "No module named 'nsqtw'" not in text
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        nsqd.stop()
