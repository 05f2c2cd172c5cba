"""One local SparkSession per process, tuned for small micro-batches.

Every operator runs its record-level work through Spark. Executors process batches of a few hundred to a
few thousand records, so what matters is the fixed per-job cost, not parallel throughput: one or two local
cores, one or two shuffle partitions (the default 200 would schedule 200 empty tasks per aggregation),
no adaptive re-planning, Arrow for pandas <-> Spark conversion, no UI, quiet logs, a small driver heap.
"""

from __future__ import annotations

import os
import sys
import threading

from pyspark.sql import SparkSession

_LOCK = threading.Lock()
_SESSION: SparkSession | None = None

DEFAULT_CORES = 1
DEFAULT_MEMORY = "512m"


def spark_conf(cores: int = DEFAULT_CORES, memory: str = DEFAULT_MEMORY) -> dict[str, str]:
    """The configuration of :func:`get_spark`, exposed so benchmarks can report it."""
    return {
        "spark.master": f"local[{cores}]",
        "spark.app.name": "streamtopo",
        "spark.driver.memory": memory,
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(max(1, min(cores, 2))),
        "spark.default.parallelism": str(max(1, min(cores, 2))),
        "spark.sql.adaptive.enabled": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.execution.arrow.pyspark.fallback.enabled": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.python.worker.reuse": "true",
        "spark.sql.codegen.wholeStage": "true",
        # Small batches: skip the broadcast-size estimation dance in joins.
        "spark.sql.autoBroadcastJoinThreshold": "-1",
        "spark.driver.extraJavaOptions": "-XX:+UseSerialGC -Dlog4j2.level=ERROR",
    }


def get_spark(cores: int | None = None, memory: str | None = None) -> SparkSession:
    """The process-wide SparkSession, created on first use.

    ``cores``/``memory`` default to ``STREAMTOPO_SPARK_CORES`` / ``STREAMTOPO_SPARK_MEMORY`` or 1 core /
    512m; they only matter on the first call (a JVM is started once per process).
    """
    global _SESSION
    with _LOCK:
        if _SESSION is None:
            cores = cores or int(os.environ.get("STREAMTOPO_SPARK_CORES", DEFAULT_CORES))
            memory = memory or os.environ.get("STREAMTOPO_SPARK_MEMORY", DEFAULT_MEMORY)
            # The JVM otherwise resolves the hostname and warns when it maps to loopback.
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            # Python workers (pandas UDFs) must run this interpreter, with its packages (pandas, pyarrow).
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
            builder = SparkSession.builder
            for key, value in spark_conf(cores, memory).items():
                builder = builder.config(key, value)
            _SESSION = builder.getOrCreate()
            _SESSION.sparkContext.setLogLevel("ERROR")
        return _SESSION


def stop_spark() -> None:
    """Stop the session (end of process or tests); the next :func:`get_spark` starts a new one."""
    global _SESSION
    with _LOCK:
        if _SESSION is not None:
            _SESSION.stop()
            _SESSION = None
