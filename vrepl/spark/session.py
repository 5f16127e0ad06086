"""A quiet SparkSession for the validation job, and Spark errors turned into one line.

Owns: the session settings the job relies on (UTC session time zone, no UI, bounded shuffle
partitions on local masters, everything bound to 127.0.0.1 unless told otherwise), a
log4j2 configuration at the chosen level, the JVM's console output sent to a log file
instead of the terminal, and `spark_error_line()`. Must not: decide what is checked.

Why the JVM's output goes to a file: the JVM inherits the terminal's file descriptors when
PySpark launches it, and Spark prints start-up banners and, when a task fails, Java stack
traces. The operator must see one clear line instead (issue 6, "Bad input"); the log file
keeps the details. Under spark-submit the JVM is already running: Spark's own logging is
then configured by spark-submit (docs/validation.md §spark-submit).
"""
from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Iterable, Mapping

from vrepl.errors import SparkJobError

DEFAULT_LOG_LEVEL = "WARN"
LOCAL_SHUFFLE_PARTITIONS = 8     # local[N]: the data fits one machine; 200 tasks cost seconds

LOG4J2_TEMPLATE = """\
# vrepl validate: Spark's log at {level}, on the JVM's stderr (a log file, see session.py)
rootLogger.level = {level}
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
logger.jetty.name = org.sparkproject.jetty
logger.jetty.level = warn
logger.native.name = org.apache.hadoop.util.NativeCodeLoader
logger.native.level = error
"""

BASE_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    # Parquet timestamps written by the vnode are not UTC-adjusted; read them as plain
    # instants (unix_micros gives the stored value exactly with the UTC time zone).
    "spark.sql.parquet.inferTimestampNTZ.enabled": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.sql.pyspark.jvmStacktrace.enabled": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # The job names every archived file explicitly (only the manifest's files are data);
    # above this many paths Spark would run a distributed listing job per read (seconds).
    "spark.sql.sources.parallelPartitionDiscovery.threshold": "100000",
    # Python workers run `python -m pyspark.daemon` in Spark's working directory: no current
    # directory on their sys.path either (vrepl.child), so a source tree there is not imported.
    "spark.executorEnv.PYTHONSAFEPATH": "1",
}


def log4j2_config_path(level: str = DEFAULT_LOG_LEVEL, directory: str | None = None) -> str:
    """Write the log4j2 properties for `level` and return the file's path."""
    directory = directory or os.path.join(tempfile.gettempdir(), f"vrepl-spark-{os.getuid()}")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"log4j2-{level.lower()}.properties")
    text = LOG4J2_TEMPLATE.format(level=level.lower())
    try:
        with open(path) as fh:
            if fh.read() == text:
                return path
    except OSError:
        pass
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)
    return path


JAVA_PACKAGE = "openjdk-17-jre-headless"   # Debian/Ubuntu; tools/install_system_deps.sh


def _java_major(java: str) -> int | None:
    """The major version `java -version` reports (8 for "1.8.0_x"), None if unreadable."""
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if m is None:
        return None
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major


def _java_needed() -> int:
    """Java major version the installed pyspark needs: 17 from Spark 4, 8 before."""
    try:
        return 17 if int(importlib.metadata.version("pyspark").split(".")[0]) >= 4 else 8
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return 17


def java_missing() -> str | None:
    """Why Spark cannot start here (no Java, or one too old for this pyspark), or None."""
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    need = _java_needed()
    if java is None or not os.path.exists(java):
        where = f"JAVA_HOME={java_home} has no bin/java" if java_home else "java is not on PATH"
        return (f"Java is not installed ({where}; Spark needs Java {need} or newer:"
                f" apt-get install {JAVA_PACKAGE}, or set JAVA_HOME)")
    have = _java_major(java)
    if have is not None and have < need:
        return (f"{java} is Java {have}; this Spark needs Java {need} or newer"
                f" (apt-get install {JAVA_PACKAGE}, or set JAVA_HOME)")
    return None


def session_conf(master: str | None, log_level: str, extra: Mapping[str, str] | None,
                 log4j_path: str) -> dict[str, str]:
    conf = dict(BASE_CONF)
    # The JVM's temporary files (Spark's local dirs, native libraries it unpacks) follow
    # TMPDIR like Python's instead of /tmp, and no /tmp/hsperfdata_<user> (jstat's files).
    java_opts = (f"-Dlog4j2.configurationFile=file:{log4j_path}"
                 f" -Djava.io.tmpdir={tempfile.gettempdir()} -XX:-UsePerfData")
    conf["spark.driver.extraJavaOptions"] = java_opts
    conf["spark.executor.extraJavaOptions"] = java_opts
    if master is None or master.startswith("local"):
        conf["spark.sql.shuffle.partitions"] = str(LOCAL_SHUFFLE_PARTITIONS)
    conf.update(extra or {})
    return conf


def start_session(master: str | None = None, *, app_name: str = "vrepl-validate",
                  log_level: str = DEFAULT_LOG_LEVEL, conf: Mapping[str, str] | None = None,
                  log_path: str | None = None) -> Any:
    """Start (or get) a SparkSession with the JVM's console output in `log_path`.

    master None = Spark's default (`local[*]`, or what spark-submit set). Raises
    SparkJobError with one line if Spark cannot start.
    """
    reason = java_missing()
    if reason is not None:
        raise SparkJobError(reason)
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise SparkJobError("pyspark is not installed (python3 -m pip install pyspark)") from None
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # Beside the log when there is one (the demo's directory, validate's --out), so nothing
    # is left behind in the temporary directory.
    log4j = log4j2_config_path(log_level, os.path.dirname(os.path.abspath(log_path))
                               if log_path else None)
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    for k, v in session_conf(master, log_level, conf, log4j).items():
        builder = builder.config(k, v)
    log_path = log_path or os.path.join(os.path.dirname(log4j), f"driver-{os.getpid()}.log")
    os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    with _jvm_output_to(log_path):
        try:
            spark = builder.getOrCreate()
        except Exception as exc:   # Py4J / Java gateway errors: one line, details in the log
            raise SparkJobError(f"Spark did not start (master {master or 'default'}):"
                                f" {spark_error_line(exc)}; see {log_path}") from None
    spark.sparkContext.setLogLevel(log_level)
    quiet_python_loggers()
    spark.vrepl_log_path = log_path      # where the JVM's console output went
    return spark


def stop_jvm(timeout_s: float = 30.0) -> None:
    """End the JVM PySpark launched for this process and wait for it. SparkSession.stop()
    keeps the JVM for a later session; a caller that is done with Spark (the demo) calls
    this so that nothing of Spark outlives its work: the JVM's shutdown hooks have removed
    its temporary directories when this returns. Not for a process spark-submit started
    (that JVM is spark-submit's; PySpark then holds no process of its own)."""
    try:
        from pyspark import SparkContext
    except ImportError:
        return
    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    if gateway is None or proc is None:
        return
    try:
        gateway.shutdown()
    except Exception:   # the connection is already gone: the JVM ends all the same
        pass
    SparkContext._gateway = None
    SparkContext._jvm = None
    # The JVM exits when its stdin (a pipe from this process) closes (PythonGatewayServer).
    try:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


class _jvm_output_to:
    """Point fds 1 and 2 at a log file while the JVM is launched (it inherits them), then
    restore them for Python."""

    def __init__(self, path: str):
        self.path = path

    def __enter__(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        self.saved = (os.dup(1), os.dup(2))
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)

    def __exit__(self, *exc: Any) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        for target, saved in zip((1, 2), self.saved):
            os.dup2(saved, target)
            os.close(saved)


PYSPARK_LOGGERS = ("SQLQueryContextLogger", "DataFrameQueryContextLogger")


def quiet_python_loggers() -> None:
    """PySpark logs a captured SQL error, with its Java stack trace, to stderr from Python
    (pyspark.errors.exceptions.base). The job turns errors into one line itself."""
    try:
        from pyspark.logger import PySparkLogger
    except ImportError:
        return
    for name in PYSPARK_LOGGERS:
        PySparkLogger.getLogger(name).disabled = True


def spark_error_line(exc: BaseException, known_paths: Iterable[tuple[str, str]] = ()) -> str:
    """One line for a Spark/Py4J error: the first line of the innermost Java message (no
    stack trace), with a known file's label when the message names one of `known_paths`
    (pairs of absolute path, label)."""
    text = ""
    java = getattr(exc, "java_exception", None)
    if java is not None:
        try:
            cause = java
            while cause.getCause() is not None and cause.getCause() is not cause:
                cause = cause.getCause()
            text = f"{cause.getClass().getSimpleName()}: {cause.getMessage()}"
        except Exception:   # the gateway itself may be gone
            text = ""
    if not text:
        getter = getattr(exc, "getMessage", None)
        try:
            text = getter() if callable(getter) else str(exc)
        except Exception:
            text = str(exc)
    full = f"{text}\n{exc}"
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    line = lines[0] if lines else type(exc).__name__
    if len(line) > 300:
        line = line[:297] + "..."
    for path, label in known_paths:
        if path in full:
            return f"{label}: {line}"
    return line
