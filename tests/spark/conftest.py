"""One local SparkSession for every Spark test (workers run this venv's Python, on loopback)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def spark():
    """A local[2] SparkSession shared by the whole test session; skipped without Java or pyspark."""
    if shutil.which("java") is None:
        pytest.skip("Spark tests need a Java runtime: 'java' is not on PATH (apt-get install default-jre-headless)")
    pytest.importorskip("pyspark", reason="Spark tests need the nsqtw[spark] extra (pyspark, pyarrow)")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    paths = [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    from nsqtw.spark.session import get_session

    session = get_session("nsqtw-tests", "local[2]", {
        "spark.sql.shuffle.partitions": "4",
        "spark.default.parallelism": "2",
        "spark.ui.enabled": "false",
        "spark.sql.streaming.stopTimeout": "30s",
    })
    yield session
    session.stop()
