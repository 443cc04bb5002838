"""Building the SparkSession for nsqtw's jobs: ``--master`` (default ``local[*]``), UTC, quiet."""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any

from .cli import UsageError

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


_QUIET_LOG4J = """\
rootLogger.level = off
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
"""


def _quiet_log4j() -> str:
    """A log4j2 configuration that keeps the driver JVM silent (the job tells what went wrong)."""
    path = os.path.join(tempfile.gettempdir(), f"nsqtw-spark-log4j2-quiet-{os.getuid()}.properties")
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(_QUIET_LOG4J)
        os.replace(tmp, path)
    return path


def get_session(app_name: str, master: str = DEFAULT_MASTER, conf: dict[str, str] | None = None,
                progress: bool = False, verbose: bool = True) -> Any:
    """A SparkSession; in local mode the workers run this interpreter and stay on loopback.

    ``progress`` shows Spark's console progress bar on stderr; ``verbose=False`` silences the
    driver's log (the CLI jobs say what failed in one line instead of Spark's stack traces).
    """
    require_pyspark()
    from pyspark.sql import SparkSession

    if master.startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.appName(app_name).master(master)
    builder = builder.config("spark.sql.session.timeZone", "UTC")
    builder = builder.config("spark.sql.sources.partitionOverwriteMode", "dynamic")
    builder = builder.config("spark.ui.showConsoleProgress", "true" if progress else "false")
    if not verbose:
        builder = builder.config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{_quiet_log4j()}")
    if master.startswith("local"):
        builder = builder.config("spark.driver.host", "127.0.0.1")
        builder = builder.config("spark.driver.bindAddress", "127.0.0.1")
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN" if verbose else "OFF")
    return spark


def parse_conf(pairs: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep:
            raise UsageError(f"--conf {pair!r}: expected KEY=VALUE")
        out[key.strip()] = value
    return out
