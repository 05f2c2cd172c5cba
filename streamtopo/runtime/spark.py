"""One local SparkSession per process, tuned for small micro-batches.

Every operator runs its record-level work through Spark. Executors process batches of a few hundred to a
few thousand records, so what matters is the fixed per-job cost, not parallel throughput: one or two local
cores, one or two shuffle partitions (the default 200 would schedule 200 empty tasks per aggregation),
no adaptive re-planning, Arrow for pandas <-> Spark conversion, no UI, quiet logs, a small driver heap.

Quiet means: a log4j2 configuration of our own (ERROR, so Spark's banner and its WARN lines stay away),
PySpark's Python-side query-context loggers off (they print every analysis error as a JSON record before
it is raised, and we report the error ourselves) and py4j at ERROR; ``STREAMTOPO_VERBOSE=1`` (``streamtopo
run --verbose``) keeps Spark's WARN level and those loggers. Everything Spark writes to disk (local dirs:
spark-*, blockmgr-*; java.io.tmpdir: liblz4*, snappy*; our Parquet hand-offs) goes to one directory per
process, removed when the process exits, so nothing is left in /tmp.

The JVM is a child process that can die on its own (the kernel's OOM killer, a crash, ``kill -9``); every
later py4j call then fails, with errors that look like a lost connection or a failing record.
:func:`jvm_lost` is the one test of "the JVM is gone", which callers ask before they blame records, an
operator or the transport for a failure and retry: it turns such a failure into :class:`JvmLost`, which
the executor does not retry (it exits for a restart, runtime/executor.py).
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import py4j
from py4j.protocol import Py4JError, Py4JJavaError
from pyspark.sql import SparkSession

from streamtopo.runtime import class_archive
from streamtopo.runtime.memory import memory_limit

_LOCK = threading.Lock()
_SESSION: SparkSession | None = None

DEFAULT_CORES = 1
MIN_HEAP = 512 * 2**20
HEAP_SHARE = 0.25
"""Without ``STREAMTOPO_SPARK_MEMORY``, the JVM's heap is this share of the memory the process may use
(runtime/memory.py: the machine's, or the pod's limit), at least :data:`MIN_HEAP`: the JVM's own default
rule (``MaxRAMPercentage``), which Spark overrides with a fixed 1g. A fixed 512m ran out under a
million-key running aggregate (bench/peers.py's high-cardinality shape); the heap grows only as needed."""
MEMORY_ENV = "STREAMTOPO_SPARK_MEMORY"
"""The JVM's heap (``spark.driver.memory``) when set."""
JVM_OUT_OF_HEAP = 3
"""The JVM's exit code under ``-XX:+ExitOnOutOfMemoryError``."""
_memory: str | None = None
"""The heap this process's JVM was started with."""
REAP_WAIT = 2.0
"""Seconds to wait for the JVM to be seen as exited after a py4j connection error: its sockets close
before its parent can reap it, so the error can come first."""
JIT_SCALING = 10.0
"""HotSpot's ``-XX:CompileThresholdScaling``: a method is compiled after this many times the invocations
and loop iterations it would be by default. Measured (docs/benchmarks.md, "The JIT's share of an
executor"): an executor's JVM spent half its CPU in the JIT compilers over a 40M-record run and still a
third in the steady state, compiling the long tail of Spark's planner (analysis, optimizer, tree nodes:
6,431 compilations after 20 s, none large) that each step runs a little of. At 10 the compilers took
8.0 CPU-s instead of 20.5, the code they no longer compile 4.7 CPU-s more, the whole run 0.88x the CPU;
hot loops (generated code, aggregation) are still compiled, only later."""
JIT_SCALING_ENV = "STREAMTOPO_JIT_SCALING"
"""Overrides :data:`JIT_SCALING` (a positive number; 1 is HotSpot's default), for benchmarks comparing values."""
VERBOSE_ENV = "STREAMTOPO_VERBOSE"
"""Set to 1: Spark logs at WARN and PySpark's own loggers stay on (``streamtopo run --verbose``)."""

_ARCHIVE_BUILD: class_archive.ArchiveBuild | None = None
"""The class archive this process's JVM writes at its exit, published when :func:`stop_spark` ends it."""
ARCHIVE_EXIT_WAIT = 120.0
"""Seconds to wait for a JVM writing the class archive to exit (about 13 s on 2 cores; 30 s otherwise)."""
_TEMP: Path | None = None
_TEMP_LOCK = threading.Lock()
_LOG4J2 = """\
rootLogger.level = {level}
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
logger.spark.name = org.apache.spark
logger.spark.level = {level}
"""
"""Spark prints a banner unless log4j2 has a configuration of the user's, and a shell's "Setting default log
level" lines (PySpark counts as a shell) unless Spark's own loggers have a level of their own."""


def temp_dir() -> Path:
    """This process's directory for everything Spark and the operators write to disk, created on first use
    (under ``TMPDIR``) and removed at exit."""
    global _TEMP
    with _TEMP_LOCK:
        if _TEMP is None:
            _TEMP = Path(tempfile.mkdtemp(prefix="streamtopo-spark-"))
            atexit.register(shutil.rmtree, _TEMP, ignore_errors=True)
        return _TEMP


def default_heap(limit: float) -> str:
    """The heap for a process that may use ``limit`` bytes (see :data:`HEAP_SHARE`), in Spark's notation."""
    return f"{int(max(MIN_HEAP, limit * HEAP_SHARE)) // 2**20}m"


def jit_scaling() -> float:
    """:data:`JIT_SCALING`, or ``STREAMTOPO_JIT_SCALING`` when set (ValueError naming it if it is not a
    positive number)."""
    text = os.environ.get(JIT_SCALING_ENV, "")
    if not text:
        return JIT_SCALING
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise ValueError(f"{JIT_SCALING_ENV}: a positive number, not {text!r}")
    return value


def spark_conf(
    cores: int = DEFAULT_CORES,
    memory: str | None = None,
    local_dir: Path | None = None,
    log_config: Path | None = None,
    java_extra: str = "",
) -> dict[str, str]:
    """The configuration of :func:`get_spark`, exposed so benchmarks can report it. ``local_dir`` holds
    Spark's local dirs and the JVM's temporary files, ``log_config`` is a log4j2 properties file,
    ``java_extra`` more JVM options (the class archive's, runtime/class_archive.py). ``memory``, the
    heap, defaults to ``STREAMTOPO_SPARK_MEMORY`` or :func:`default_heap` of the process's memory."""
    # Out of heap, the JVM exits (code 3) instead of living on: Spark catches an OutOfMemoryError in some
    # driver threads (task-result-getter) and the job waits forever for the result it lost, so an executor
    # hung mid-step with an idle JVM (a million-key running aggregate at 512m). An exit is JvmLost: the
    # executor exits for a restart that resumes from its last commit, and says why.
    java = f"-XX:+UseSerialGC -XX:+ExitOnOutOfMemoryError -XX:CompileThresholdScaling={jit_scaling():g}"
    if java_extra:
        java += f" {java_extra}"
    if local_dir is not None:
        java += f" -Djava.io.tmpdir={local_dir}"
    if log_config is not None:
        java += f" -Dlog4j2.configurationFile={log_config.as_uri()}"
    conf = {
        "spark.master": f"local[{cores}]",
        "spark.app.name": "streamtopo",
        "spark.driver.memory": memory or os.environ.get(MEMORY_ENV) or default_heap(memory_limit()),
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(max(1, min(cores, 2))),
        "spark.default.parallelism": str(max(1, min(cores, 2))),
        "spark.sql.adaptive.enabled": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.execution.arrow.pyspark.fallback.enabled": "false",
        # One semantics (docs/runtime.md): Spark SQL's with ANSI on and UTC, set here, not left to defaults.
        "spark.sql.ansi.enabled": "true",
        "spark.sql.session.timeZone": "UTC",
        "spark.python.worker.reuse": "true",
        "spark.sql.codegen.wholeStage": "true",
        # Classes named without their stage number: the same pipeline in another plan (a step's count job
        # unions its flows in the step's order) is the same code, compiled once per process, not per step.
        "spark.sql.codegen.useIdInClassName": "false",
        # Small batches: skip the broadcast-size estimation dance in joins.
        "spark.sql.autoBroadcastJoinThreshold": "-1",
        "spark.driver.extraJavaOptions": java,
    }
    if local_dir is not None:
        conf["spark.local.dir"] = str(local_dir)
    return conf


def get_spark(
    cores: int | None = None,
    memory: str | None = None,
    jvm_output: Path | None = None,
    verbose: bool | None = None,
    build_archive: bool = False,
) -> SparkSession:
    """The process-wide SparkSession, created on first use.

    ``cores``/``memory`` default to ``STREAMTOPO_SPARK_CORES`` / ``STREAMTOPO_SPARK_MEMORY`` or 1 core /
    a share of the memory the process may use (:func:`default_heap`), ``verbose`` to
    ``STREAMTOPO_VERBOSE``; they only matter on the first call (a JVM is started once per process), as
    does ``jvm_output``: a file the JVM's stdout and stderr go to instead of this process's (the JVM
    prints a line that no log level silences, its incubator-module warning).
    The JVM maps Spark's classes from the class archive when there is one; ``build_archive`` has this JVM
    write it at its exit when there is none (runtime/class_archive.py).
    """
    global _SESSION, _ARCHIVE_BUILD, _memory
    with _LOCK:
        if _SESSION is None:
            cores = cores or int(os.environ.get("STREAMTOPO_SPARK_CORES", DEFAULT_CORES))
            # The JVM otherwise resolves the hostname and warns when it maps to loopback.
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            # Python workers (pandas UDFs) must run this interpreter, with its packages (pandas, pyarrow).
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
            if verbose is None:
                verbose = os.environ.get(VERBOSE_ENV, "") not in ("", "0")
            level = "WARN" if verbose else "ERROR"
            log_config = temp_dir() / "log4j2.properties"
            log_config.write_text(_LOG4J2.format(level=level.lower()))
            java_extra, _ARCHIVE_BUILD = class_archive.java_options(build_archive)
            conf = spark_conf(cores, memory, temp_dir(), log_config, java_extra)
            _memory = conf["spark.driver.memory"]
            builder = SparkSession.builder
            for key, value in conf.items():
                builder = builder.config(key, value)
            with _output_to(jvm_output):
                _SESSION = builder.getOrCreate()
            atexit.unregister(_stop_at_exit)  # once, and before the removal of temp_dir (handlers run LIFO)
            atexit.register(_stop_at_exit)
            _SESSION.sparkContext.setLogLevel(level)
            if not verbose:
                _quiet_python_loggers()
        return _SESSION


def warm_up(session: SparkSession) -> None:
    """One small aggregation into and out of the JVM through Arrow, as a step runs one: the first job
    loads and compiles classes for seconds. An executor pays that before it takes units (a unit should not
    pause for it after a hand-over), and a JVM writing the class archive runs it so the archive has them."""
    import pyarrow as pa

    table = pa.table({"kg": pa.array([0, 1], pa.int32()), "ts": [0.0, 1.0], "v": [1, 2]})
    session.createDataFrame(table).groupBy("kg").agg({"v": "sum", "ts": "max"}).toArrow()


_REPLIES = threading.local()
"""A weak reference to the py4j connection whose JVM end this thread has set to reply without delay."""


def without_reply_delay(session: SparkSession) -> None:
    """Turn off Nagle's algorithm on the JVM's end of this thread's py4j connection (once per connection).

    Why: py4j's JVM side writes a reply through an 8 KB buffer, so a longer reply leaves in two writes, and
    Nagle's algorithm holds the second until this end acknowledges the first, which Linux delays by up to
    40 ms. Measured on this machine: a reply of 8,180 bytes took 0.8 ms, one of 8,200 bytes to 40 kB
    44-48 ms; the file sink's number formatting (1,000 doubles, 19 kB) paid it twice a step
    (docs/runtime.md, "Replies from the JVM"). py4j has no setting for it, so the connection's socket is
    reached through the JVM thread that serves this one (pinned threads: each Python thread has its own
    connection and JVM thread, whose ``Runnable`` is that connection). Where the JVM's ``Thread`` keeps
    it elsewhere (a JDK other than 17-21), replies keep their delay: nothing else changes."""
    client = session.sparkContext._gateway._gateway_client  # type: ignore[union-attr]  # noqa: SLF001
    jvm = session._jvm  # noqa: SLF001 - PySpark's JVM handle
    assert jvm is not None
    done = getattr(_REPLIES, "connection", None)
    if done is not None and done() is client.get_thread_connection():
        return
    thread = jvm.java.lang.Thread.currentThread()  # opens this thread's connection if it had none
    _REPLIES.connection = weakref.ref(client.get_thread_connection())
    serving = serving_connection(jvm, thread)
    if serving is not None:
        serving.getSocket().setTcpNoDelay(True)


def serving_connection(jvm: Any, thread: Any) -> Any:
    """The py4j connection (a JVM object) that JVM ``thread`` serves, or None when the JVM's ``Thread``
    keeps its ``Runnable`` where this does not look or the thread serves none."""
    serving = _field(jvm, "java.lang.Thread", "target", thread)  # JDK 17
    if serving is None:  # JDK 19-21: the Runnable moved into Thread.FieldHolder
        holder = _field(jvm, "java.lang.Thread", "holder", thread)
        serving = None if holder is None else _field(jvm, "java.lang.Thread$FieldHolder", "task", holder)
    if serving is None or serving.getClass().getName() != "py4j.ClientServerConnection":
        return None
    return serving


def _field(jvm: Any, owner: str, name: str, instance: Any) -> Any:
    """``instance``'s private field ``name`` of class ``owner`` through reflection, or None when the JVM
    has no such field (Spark's launcher opens ``java.lang`` to reflection)."""
    try:
        field = jvm.java.lang.Class.forName(owner).getDeclaredField(name)
        field.setAccessible(True)
        return field.get(instance)
    except Py4JJavaError:
        return None


def building_archive() -> bool:
    """Whether this process's JVM writes the class archive at its exit (runtime/class_archive.py)."""
    return _ARCHIVE_BUILD is not None


class JvmLost(RuntimeError):
    """This process's JVM (PySpark's py4j gateway) has exited or its SparkContext has stopped: nothing
    that needs Spark can run in this process any more; only a new process can."""


def jvm_lost(error: BaseException | None = None) -> JvmLost | None:
    """Why this process's JVM is gone, or None while it runs (or was never started).

    ``error``, the failure that prompted the question, may say so itself (a stopped SparkContext), and a
    connection error gives the JVM :data:`REAP_WAIT` seconds to be seen as exited."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    if proc is None:
        return None
    status = proc.poll()
    if status is None and error is not None and _connection_failure(error):
        with suppress(subprocess.TimeoutExpired):
            status = proc.wait(REAP_WAIT)
    if status is not None:
        how = f"killed by {_signal_name(-status)}" if status < 0 else f"exit code {status}"
        if status == JVM_OUT_OF_HEAP:
            how += f": out of heap, raise {MEMORY_ENV} (now {_memory})"
        return JvmLost(f"the JVM (pid {proc.pid}, PySpark's py4j gateway) has exited ({how})")
    if error is not None and "stopped SparkContext" in str(error):
        return JvmLost(f"the SparkContext has stopped: {str(error).strip().splitlines()[0]}")
    return None


def check_jvm(error: BaseException | None = None) -> None:
    """Raise :class:`JvmLost` (from ``error``) if this process's JVM is gone (:func:`jvm_lost`)."""
    lost = jvm_lost(error)
    if lost is not None:
        raise lost from error


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _connection_failure(error: BaseException) -> bool:
    """Whether ``error`` or an error it was raised from may be a lost py4j connection: any py4j error but
    a Java exception (the JVM answered). A dead gateway does not always say "network": a name lookup
    whose answer never came reads "java does not exist in the JVM"."""
    seen: BaseException | None = error
    for _ in range(8):  # a cause chain is short; a cycle must not loop
        if seen is None:
            return False
        if isinstance(seen, (ConnectionError, EOFError)):
            return True
        if isinstance(seen, Py4JError) and not isinstance(seen, Py4JJavaError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def running() -> bool:
    """Whether this process has a SparkSession (a caller that starts one for a moment stops it after)."""
    return _SESSION is not None


@contextmanager
def _output_to(path: Path | None) -> Iterator[None]:
    """Point this process's stdout and stderr at ``path`` while a child (the JVM) is started: the child
    keeps them, this process gets its own back."""
    if path is None:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(target, 1)
        os.dup2(target, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, target):
            os.close(fd)


class _NotFromPy4j(logging.Filter):
    """py4j reports a lost gateway through the root logger, traceback included (``logging.exception``), so
    no logger name can quiet it; the executor says once, in its own words, that the JVM has gone."""

    _DIR = os.path.dirname(py4j.__file__) + os.sep

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.pathname.startswith(self._DIR)


def _quiet_python_loggers() -> None:
    """PySpark 4 logs every analysis error as JSON before raising it; py4j chats on shutdown and on a lost
    JVM."""
    logging.getLogger("py4j").setLevel(logging.ERROR)
    root = logging.getLogger()
    if not any(isinstance(f, _NotFromPy4j) for f in root.filters):
        root.addFilter(_NotFromPy4j())
    try:
        from pyspark.logger import PySparkLogger
    except ImportError:  # PySpark 3.5 has neither the loggers nor the JSON records
        return
    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        PySparkLogger.getLogger(name).setLevel(logging.CRITICAL + 1)


def _stop_at_exit() -> None:
    """Stop Spark, JVM included, before the interpreter's last garbage collection: otherwise the collected
    py4j objects talk to a JVM that their own process's exit is ending, and py4j logs every failure."""
    with suppress(Exception):  # the JVM is gone already (killed, crashed): nothing left to stop
        stop_spark(jvm=True)


def stop_spark(jvm: bool = False) -> None:
    """Stop the session (end of process or tests); the next :func:`get_spark` starts a new one.

    ``jvm`` ends the JVM too: a process that needed Spark for a moment (``streamtopo run``'s check) should
    not keep an idle JVM through a run, nor a gateway that the garbage collector would later talk to
    after the JVM went away (py4j logs each such failure with a traceback).
    """
    from pyspark import SparkContext

    global _SESSION, _ARCHIVE_BUILD
    with _LOCK:
        try:
            if _SESSION is not None:
                _SESSION.stop()
        finally:
            _SESSION = None
            gateway = SparkContext._gateway
            if jvm and gateway is not None:
                gateway.shutdown()
                gateway.proc.stdin.close()  # PySpark's JVM exits when its stdin ends
                try:
                    gateway.proc.wait(timeout=ARCHIVE_EXIT_WAIT if _ARCHIVE_BUILD else 30)
                except subprocess.TimeoutExpired:
                    gateway.proc.kill()
                    gateway.proc.wait()
                if _ARCHIVE_BUILD is not None:
                    _ARCHIVE_BUILD.publish(gateway.proc.returncode)
                    _ARCHIVE_BUILD = None
                SparkContext._gateway = SparkContext._jvm = None


if __name__ == "__main__":  # the runtime image's build step: python -m streamtopo.runtime.spark
    warm_up(get_spark(build_archive=True))
    stop_spark(jvm=True)
