"""Building the SparkSession for nsqtw's jobs: ``--master`` (default ``local[*]``), UTC, quiet."""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["get_session", "add_spark_arguments", "require_pyspark"]

DEFAULT_MASTER = "local[*]"


def require_pyspark() -> None:
    """Fail with an install hint instead of an ImportError deep inside a job."""
    try:
        import pyspark  # noqa: F401
    except ImportError:  # pragma: no cover - depends on the install
        raise SystemExit("nsqtw's Spark jobs need pyspark: pip install 'nsqtw[spark]'") from None


def add_spark_arguments(parser: Any) -> None:
    parser.add_argument("--master", default=DEFAULT_MASTER,
                        help="Spark master URL (default local[*]; e.g. spark://host:7077, yarn, k8s://...)")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="extra Spark configuration (repeatable)")


def get_session(app_name: str, master: str = DEFAULT_MASTER,
                conf: dict[str, str] | None = None) -> Any:
    """A SparkSession; in local mode the workers run this interpreter and stay on loopback."""
    require_pyspark()
    from pyspark.sql import SparkSession

    if master.startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.appName(app_name).master(master)
    builder = builder.config("spark.sql.session.timeZone", "UTC")
    builder = builder.config("spark.sql.sources.partitionOverwriteMode", "dynamic")
    if master.startswith("local"):
        builder = builder.config("spark.ui.showConsoleProgress", "false")
        builder = builder.config("spark.driver.host", "127.0.0.1")
        builder = builder.config("spark.driver.bindAddress", "127.0.0.1")
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def parse_conf(pairs: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--conf {pair!r}: expected KEY=VALUE")
        out[key.strip()] = value
    return out
