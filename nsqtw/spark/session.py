"""Building the SparkSession for nsqtw's jobs: the master, UTC, quiet.

The master is the job's ``--master`` when given; otherwise whatever ``spark-submit --master`` (or
``spark.master`` in ``spark-defaults.conf``, or ``MASTER``) says, else ``local[*]``: nothing set in
code overrides a scheduler's ``spark-submit``.  A master URL that is not one is a usage error before
Spark starts, and a ``spark://`` or ``k8s://`` master that does not answer fails in seconds with one
line naming it (Spark itself retries for over a minute, then says "Cannot call methods on a stopped
SparkContext").
"""

from __future__ import annotations

import os
import re
import socket
import sys
import tempfile
from typing import Any
from urllib.parse import urlsplit

from .cli import JobError, UsageError

__all__ = ["get_session", "add_spark_arguments", "require_pyspark", "check_master", "reach_master",
           "class_archive_applies", "DEFAULT_MASTER"]

DEFAULT_MASTER = "local[*]"

_MASTER = re.compile(r"local(\[(\*|[1-9]\d*)(,[1-9]\d*)?\])?|local-cluster\[[1-9]\d*,[1-9]\d*,[1-9]\d*\]"
                     r"|spark://.+|yarn|k8s://.+")
_MASTER_HELP = "local, local[N], local[*], spark://host:7077, yarn or k8s://https://host:port"


def require_pyspark() -> None:
    """Fail with an install hint instead of an ImportError deep inside a job."""
    try:
        import pyspark  # noqa: F401
    except ImportError:  # pragma: no cover - depends on the install
        raise SystemExit("nsqtw's Spark jobs need pyspark: pip install 'nsqtw[spark]'") from None


def add_spark_arguments(parser: Any) -> None:
    parser.add_argument("--master", default=None,
                        help="Spark master URL (e.g. local[2], spark://host:7077, yarn, k8s://...); default: "
                             "spark-submit's --master or spark.master in spark-defaults.conf, else local[*]")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="extra Spark configuration (repeatable)")


def _endpoints(master: str) -> list[tuple[str, int]]:
    """The host:port pairs a ``spark://`` (HA: comma-separated) or ``k8s://`` master URL names."""
    if master.startswith("spark://"):
        out: list[tuple[str, int]] = []
        for part in master[len("spark://"):].split(","):
            host, sep, port = part.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise UsageError(f"--master {master}: expected spark://host:port[,host:port...]")
            out.append((host.strip("[]"), int(port)))
        return out
    if master.startswith("k8s://"):
        rest = master[len("k8s://"):]
        url = urlsplit(rest if "://" in rest else "https://" + rest)
        try:
            k8s_port = url.port or (80 if url.scheme == "http" else 443)
        except ValueError:
            raise UsageError(f"--master {master}: bad port") from None
        if not url.hostname:
            raise UsageError(f"--master {master}: expected k8s://https://host:port")
        return [(url.hostname, k8s_port)]
    return []


def check_master(master: str | None) -> None:
    """A ``--master`` that is not a Spark master URL: :class:`UsageError` (before Spark starts)."""
    if master is None:
        return
    if not _MASTER.fullmatch(master):
        raise UsageError(f"--master {master!r}: not a Spark master URL ({_MASTER_HELP})")
    _endpoints(master)


def reach_master(master: str, timeout: float = 5.0) -> None:
    """A TCP connect to the master (any of an HA list): :class:`JobError` naming it when none answers."""
    endpoints = _endpoints(master)
    if not endpoints:
        return
    reasons = []
    for host, port in endpoints:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                return
        except OSError as e:
            reasons.append(f"{host}:{port}: {e.strerror or e}")
    raise JobError(f"cannot reach the Spark master {master} ({'; '.join(reasons)})")


_QUIET_LOG4J = """\
# everything goes to log4j's Null appender. The root level is WARN, the level Spark gives a shell,
# so that Spark prints no "Setting default log level" banner either (and one appender, so that
# Spark does not take this for log4j's default configuration and load its own).
rootLogger.level = warn
rootLogger.appenderRef.null.ref = null
appender.null.type = Null
appender.null.name = null
"""


def _quiet_log4j() -> str:
    """A log4j2 configuration that keeps the driver JVM silent (the job tells what went wrong)."""
    path = os.path.join(tempfile.gettempdir(), f"nsqtw-spark-log4j2-quiet-4-{os.getuid()}.properties")
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(_QUIET_LOG4J)
        os.replace(tmp, path)
    return path


def _launch_quietly(conf: Any) -> None:
    """Start Spark's JVM with its stderr in an unlinked file (the JVM's own start-up notes, such as
    "WARNING: Using incubator modules", are not ours to print); if it fails to start, that file
    says why, in one line."""
    from pyspark import SparkContext
    from pyspark.java_gateway import launch_gateway

    with tempfile.TemporaryFile() as jvm_stderr:  # the JVM keeps its own descriptor of the file
        try:
            gateway = launch_gateway(conf, popen_kwargs={"stderr": jvm_stderr})
        except Exception as e:
            jvm_stderr.seek(0)
            said = [ln.strip() for ln in jvm_stderr.read().decode(errors="replace").splitlines() if ln.strip()]
            raise JobError(f"Spark's JVM did not start: {said[-1] if said else e}") from e
    SparkContext._ensure_initialized(gateway=gateway)


def _is_local(master: str) -> bool:
    """Everything on this host (local, or local-cluster's worker processes): bind loopback."""
    return master == "local" or master.startswith(("local[", "local-cluster["))


def _defaults_file() -> dict[str, str]:
    """``spark-defaults.conf`` (``$SPARK_CONF_DIR``, else ``$SPARK_HOME/conf`` or pyspark's), as the
    launcher will read it; empty when there is none."""
    conf_dir = os.environ.get("SPARK_CONF_DIR")
    if not conf_dir:
        home = os.environ.get("SPARK_HOME")
        if not home:
            try:
                import pyspark
            except ImportError:  # pragma: no cover - require_pyspark() said so already
                return {}
            home = os.path.dirname(pyspark.__file__)
        conf_dir = os.path.join(home, "conf")
    out: dict[str, str] = {}
    try:
        with open(os.path.join(conf_dir, "spark-defaults.conf"), encoding="utf-8") as f:
            for raw in f:
                text = raw.strip()
                if text and not text.startswith("#"):
                    key, _sep, value = text.replace("=", " ", 1).partition(" ")
                    out[key.strip()] = value.strip()
    except OSError:
        pass
    return out


def _launches_local(master: str | None) -> bool:
    """This process starts the JVM (not spark-submit) and the master will be a local one."""
    if "PYSPARK_GATEWAY_PORT" in os.environ:
        return False
    if master is not None:
        return _is_local(master)
    effective = os.environ.get("MASTER") or _defaults_file().get("spark.master") or DEFAULT_MASTER
    return _is_local(effective)


#: The class-data-sharing archive among a JVM's options (:mod:`nsqtw.spark.classcache`).
_ARCHIVE = re.compile(r"-XX:SharedArchiveFile=(\S+)")


def _start_jvm(settings: dict[str, str], verbose: bool) -> None:
    """Start Spark's JVM with ``settings`` (unless one runs already: spark-submit's, or an earlier session's)."""
    from pyspark import SparkConf, SparkContext

    launch = SparkConf(loadDefaults=False)
    for key, value in settings.items():
        launch.set(key, value)
    # plain `python`: starts the JVM with these settings (the log4j file must be there from the start);
    # under spark-submit the JVM is already running with spark-submit's
    if SparkContext._gateway is None and not verbose and "PYSPARK_GATEWAY_PORT" not in os.environ:
        _launch_quietly(launch)
    SparkContext._ensure_initialized(conf=launch)


def class_archive_applies(master: str | None, conf: dict[str, str] | None = None) -> bool:
    """The job's JVM may map the class archive (:mod:`nsqtw.spark.classcache`): this process launches
    it (not spark-submit, none runs yet), for a local master, with Java options that are the job's own
    (none set by ``--conf`` or ``spark-defaults.conf``: theirs win), and the archive is not turned off."""
    from pyspark import SparkContext

    from .classcache import enabled

    key = "spark.driver.extraJavaOptions"
    if not enabled() or SparkContext._gateway is not None or not _launches_local(master):
        return False
    return key not in (conf or {}) and key not in _defaults_file()


def get_session(app_name: str, master: str | None = None, conf: dict[str, str] | None = None,
                progress: bool = False, verbose: bool = True, local_conf: dict[str, str] | None = None) -> Any:
    """A SparkSession on ``master`` if given, else on spark-submit's (or the defaults') master.

    Local masters: the workers run this interpreter and the driver binds loopback.  ``progress``
    shows Spark's console progress bar on stderr; ``verbose=False`` silences the driver's log,
    under spark-submit too (the CLI jobs say what failed in one line instead of Spark's stack traces).
    ``local_conf``: settings for a local master only (sizing to this machine), unless ``conf`` sets them
    (or ``spark-defaults.conf``); its ``spark.driver.*`` settings (the heap) are given to the JVM this
    process starts, never to spark-submit's.
    """
    require_pyspark()
    check_master(master)
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    user = dict(conf or {})
    settings = {
        "spark.app.name": app_name,
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.sources.partitionOverwriteMode": "dynamic",
        "spark.ui.showConsoleProgress": "true" if progress else "false",
    }
    if master is not None:
        settings["spark.master"] = master
    if not verbose:
        quiet = f"-Dlog4j2.configurationFile=file:{_quiet_log4j()}"
        extra = user.pop("spark.driver.extraJavaOptions", "")
        settings["spark.driver.extraJavaOptions"] = f"{quiet} {extra}".strip()
        if "PYSPARK_GATEWAY_PORT" in os.environ:  # under spark-submit its JVM runs already: quiet it
            settings["spark.log.level"] = "OFF"     # this early (the first lines of SparkContext)
    settings.update(user)
    if SparkContext._gateway is None and local_conf and _launches_local(master):
        defaults_file = _defaults_file()
        for key, value in local_conf.items():
            if key.startswith("spark.driver.") and key not in (conf or {}) and key not in defaults_file:
                if key == "spark.driver.extraJavaOptions":  # beside the quiet log file's
                    value = f"{settings.get(key, '')} {value}".strip()
                settings[key] = value  # the JVM's own settings: only at its launch
    if SparkContext._gateway is None and master is not None and not _is_local(master):
        reach_master(master)  # before a JVM starts: seconds, not Spark's minute of retries
    try:
        _start_jvm(settings, verbose)
    except Exception:
        # a class archive the JVM would not start with (corrupt in place): forget it, start without
        archive = _ARCHIVE.search(settings.get("spark.driver.extraJavaOptions", ""))
        if archive is None or SparkContext._gateway is not None:
            raise
        from .classcache import forget
        from .classcache import options as archive_options

        forget(archive.group(1))
        without = settings["spark.driver.extraJavaOptions"].replace(archive_options(archive.group(1)), "")
        settings["spark.driver.extraJavaOptions"] = " ".join(without.split())
        _start_jvm(settings, verbose)
    defaults = SparkConf()  # spark-submit's settings and spark-defaults.conf, now that the JVM runs
    effective = master or defaults.get("spark.master", None) or DEFAULT_MASTER
    if master is None and not _is_local(effective):
        reach_master(effective)
    builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    if _is_local(effective):
        for key, value in (local_conf or {}).items():
            if key not in user and not defaults.contains(key):
                builder = builder.config(key, value)
        for key in ("spark.driver.host", "spark.driver.bindAddress"):
            if key not in user:
                builder = builder.config(key, "127.0.0.1")
    created = SparkContext._active_spark_context is None
    spark = builder.getOrCreate()
    if created and _is_local(effective) and "PYSPARK_PYTHON" not in os.environ:
        # the workers run this interpreter (its packages), as PYSPARK_PYTHON would say; set on the
        # context, not in the process's environment
        spark.sparkContext.pythonExec = sys.executable
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
