"""One peer engine, kept warm in its own process, running the queries of bench/peers.py on request.

    python bench/peers_worker.py flink --parallelism 2      # the bench extra's interpreter (.venv-flink)
    python bench/peers_worker.py spark --parallelism 2      # Structured Streaming, local[2]

Why a process of its own: the harness measures CPU over a process tree (psutil), and PyFlink pins
libraries that PySpark 4 refuses (py4j 0.10.9.7, pyarrow < 17), so it lives in another virtualenv. The
worker imports nothing of streamtopo or bench/ for the same reason. It reads one JSON request per line
on stdin and answers one JSON line on stdout:

- ``{"run": SHAPE, "records": N}``: runs the shape's query over records 0 .. N-1 of the sequence
  generator's definition to the end of the input and answers ``{"done": true}`` (the harness times the
  process tree around this request only);
- ``{"summary": true}``: the last run's output reduced to ``{"rows", "n", "total"}``: output groups (key,
  or window and key) and the sum over them of each group's final count and sum (an update stream's last
  value per group);
- ``{"latency": SHAPE, "paced": {"rate", "warmup", "seconds", "bounds"}}`` (bench/peers_latency.py):
  the shape over an endless source paced at ``rate`` records/s whose event time is the wall time a record
  is due, for ``warmup + seconds`` s; answers ``{"counts", "rows"}``, the latencies (wall time a row is
  emitted - the newest event time it reflects) of the rows emitted after the warm-up, per bucket of
  ``bounds`` (the last: beyond them);
- Flink only, a query the harness wrote (bench/vwap_flink.py): ``{"statements": [...], "inserts": [...]}``
  runs the statements, then the inserts as one job to its end (``{"done": true}``); ``{"printed": true}``
  answers ``{"rows": [[print identifier, row kind, fields], ...]}``, what that job's ``print`` tables
  wrote. ``--udf File.java`` compiles Java functions against PyFlink's jars first (``javac``: a JDK),
  runs its ``main`` (its self-check) and adds it to the job's jars.

Records are the sequence generator's: ``seq`` 0 .. N-1, ``key = seq % keys``, ``value = seq``, event time
``seq / 100,000`` s (streamtopo's ``_ts = seq / ratePerSecond``); :data:`SHAPES` are the queries. Flink
reads a bounded ``datagen`` sequence in a local mini-cluster (Flink SQL; one per job, in the warm JVM);
Structured Streaming reads the ``rate-micro-batch`` source with ``availableNow``, so a run is one
micro-batch of N records, as a backlogged streamtopo source generates everything due in one step.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

KEYS = 1009
"""Keys of every shape (bench/runtime.py's SCALE_KEYS, a prime: independent of the source's key group)."""
SOURCE_KEY_GROUPS = 4
"""streamtopo's source key groups: the re-keyed shape's account is (seq div 4) % KEYS."""
EVENT_RATE = 100_000
"""Records per event-time second (bench/runtime.py's EVENT_RATE)."""
HIGH_KEYS = 1_000_003
"""Keys of the high-cardinality shape (a prime): about one record per key and step, partials do not shrink."""
JOIN_KEYS = 100_003
"""Keys of the join (a prime above the records of a 1 s window): each record meets its twin only."""


@dataclass(frozen=True)
class Shape:
    """A query of the matrix: count(*) and sum(value) per key, running or per event-time window."""

    keys: int = KEYS
    kept: bool = True
    """Filtered by ``value % 10 <> 0`` first (streamtopo's running shapes: a map computing ``r`` first)."""
    window: tuple[int, int] | None = None
    """(size, slide) in seconds, or a running aggregate."""
    rekey: bool = False
    """Keyed by ``(seq div 4) % keys``, a column computed from the record, and whole records cross."""
    udf: bool = False
    """``r = value % 10`` computed by a pandas function of the engine's (streamtopo: a udf operator keyed
    by key, so whole records cross to it; Flink and Spark: a vectorised pandas UDF), then ``r <> 0``."""
    stream: bool = False
    """No aggregate: every record, keyed by key, into a named stream (streamtopo: a stream sink keyed by
    key, whole records cross to its units; Flink: a ``print`` sink with a primary key and a forced keyed
    shuffle; Spark: ``repartition(key)`` into the memory sink), summarised as one group per record."""
    join: bool = False
    """A stream-stream join instead of an aggregate: two inputs of N / 2 records each (the same sequence,
    ``lv`` and ``rv``), every pair of one key in one tumbling window, written as ``(window start, key, lv,
    rv, n = 1, total = lv + rv)`` so that the summary reads pairs as groups of one."""

    @property
    def key(self) -> str:
        return f"(seq div {SOURCE_KEY_GROUPS}) % {self.keys}" if self.rekey else f"seq % {self.keys}"


SHAPES = {
    "running": Shape(),
    "tumbling": Shape(window=(1, 1)),
    "rekey": Shape(kept=False, window=(1, 1), rekey=True),
    "sliding": Shape(window=(4, 1)),
    "highcard": Shape(keys=HIGH_KEYS),
    "udf": Shape(udf=True),
    "stream": Shape(kept=False, stream=True),
    "join": Shape(keys=JOIN_KEYS, kept=False, window=(1, 1), join=True),
}


def tenths(value):  # type: ignore[no-untyped-def]
    """The ``udf`` shape's function, as PyFlink and Spark call a pandas UDF: a Series of ``value``."""
    return value % 10


@dataclass(frozen=True)
class Paced:
    """A latency run (bench/peers_latency.py): the source paced at ``rate`` records/s, rows emitted in the
    ``seconds`` after ``warmup`` counted, their latencies counted into the harness' histogram ``bounds``."""

    rate: float
    warmup: float
    seconds: float
    bounds: tuple[float, ...]

    def histogram(self, lags: list[float]) -> dict[str, object]:
        """Rows per bucket (latency <= bound, the last one beyond every bound), negatives as 0 (a window
        that a final watermark closes early), as streamtopo's sink histogram counts them."""
        counts = [0] * (len(self.bounds) + 1)
        for lag in lags:
            counts[bisect.bisect_left(self.bounds, max(lag, 0.0))] += 1
        return {"counts": counts, "rows": len(lags)}


def moment(text: str) -> float:
    """Epoch seconds of a timestamp as Flink prints one in UTC (``2026-12-07 18:50:01.123``)."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


class Flink:
    """PyFlink's Table API in streaming mode, local mini-cluster, parallelism ``p``.

    Outputs go to the ``print`` connector on stdout, which this process points at a file before the JVM
    starts (the JVM inherits it; its stderr is a pipe PyFlink stops reading, so printing there blocks).
    Why print: the running aggregate is an update stream, which Flink's filesystem sink refuses and whose
    ``collect()`` crosses py4j row by row (10k rows took ~15 s)."""

    ROW = re.compile(r"^(?:(\w*)(?::\d+)?> )?([+-][IUD])\[(.*)\]$")
    """A ``print`` row: ``[identifier[:subtask]> ]+I[fields]``."""

    def __init__(self, parallelism: int, log: Path, udf: Path | None = None):
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 1)
        self.log = log
        from pyflink.table import EnvironmentSettings, TableEnvironment

        self.env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
        config = self.env.get_config()
        config.set("table.local-time-zone", "UTC")
        if udf is not None:
            config.set("pipeline.jars", compile_udf(udf).as_uri())
        config.set("parallelism.default", str(parallelism))
        config.set("pipeline.object-reuse", "true")
        # The udf shape's pandas UDF runs in Flink's Python worker: this interpreter, which has PyFlink.
        config.set("python.executable", sys.executable)
        config.set("python.client.executable", sys.executable)
        from pyflink.table import DataTypes
        from pyflink.table.udf import udf

        self.env.create_temporary_function(
            "tenths", udf(tenths, result_type=DataTypes.BIGINT(), func_type="pandas")
        )
        # Flink's own advice for aggregation throughput: mini-batches (one update per key and batch, not per
        # record) and local-global aggregation, the peer of streamtopo's partials (the re-keyed shape turns
        # the latter off so whole records cross, as a keyed map makes them in streamtopo).
        config.set("table.exec.mini-batch.enabled", "true")
        config.set("table.exec.mini-batch.allow-latency", "1 s")
        config.set("table.exec.mini-batch.size", "100000")
        self.config = config
        self.runs = 0
        self.offset = 0

    def run(self, name: str, records: int) -> None:
        shape = SHAPES[name]
        self.runs += 1
        self.insert(shape, self.runs, records=records).wait()

    def latency(self, name: str, paced: Paced) -> dict[str, object]:
        """The shape at ``paced.rate`` records/s for ``paced.warmup + paced.seconds`` s, then cancelled:
        each printed row's latency (``emitted - newest``) when emitted after the warm-up."""
        shape = SHAPES[name]
        self.runs += 1
        started = time.time()
        job = self.insert(shape, self.runs, rate=paced.rate)
        time.sleep(max(0.0, started + paced.warmup + paced.seconds - time.time()))
        client = job.get_job_client()
        assert client is not None  # an INSERT has a job
        client.cancel().result()
        lags = []
        for _, kind, fields in self.printed():
            if kind in ("+I", "+U"):
                *_, newest, emitted = fields.split(", ")
                at = moment(emitted)
                if started + paced.warmup <= at <= started + paced.warmup + paced.seconds:
                    lags.append(at - moment(newest))
        return paced.histogram(lags)

    def insert(self, shape: Shape, i: int, records: int | None = None, rate: float | None = None):  # type: ignore[no-untyped-def]
        """Submits the shape's INSERT (job ``i``) and returns its TableResult: over ``records`` of the
        sequence generator's definition (event time from ``seq``), or, with ``rate``, an endless source
        paced at ``rate`` records/s whose event time is the wall time of its generation (latency mode:
        the output carries the newest event time it reflects and the wall time it was computed at)."""
        self.config.set("table.optimizer.agg-phase-strategy", "ONE_PHASE" if shape.rekey else "AUTO")
        sql = self.env.execute_sql
        kept = " WHERE seq % 10 <> 0" if shape.kept and not shape.udf else ""
        key = shape.key.replace(" div ", " / ")  # Flink's integer division of BIGINTs truncates
        if rate is None:
            assert records is not None
            # rows-per-second: datagen's default paces at 10,000 records/s. The watermark trails by 1 ms:
            # 100 records share a millisecond, and a watermark equal to their time made the window that
            # ends after it fire while some were still to come (the re-keyed shape lost 50-99 of 1M).
            ts = f"TO_TIMESTAMP_LTZ(seq / {EVENT_RATE // 1000}, 3)"
            end, pace = (records // 2 if shape.join else records) - 1, 10**12
        else:  # datagen's sequence holds at most 2^31 values: ten minutes at the rate, never reached
            ts, end, pace = "CURRENT_TIMESTAMP", int(rate * 600), rate
        for side in ("", "r") if shape.join else ("",):
            sql(
                f"CREATE TEMPORARY TABLE src{side}{i} (seq BIGINT, ts AS {ts},"
                " WATERMARK FOR ts AS ts - INTERVAL '0.001' SECOND) WITH ('connector' = 'datagen',"
                " 'fields.seq.kind' = 'sequence', 'fields.seq.start' = '0', 'fields.seq.end' ="
                f" '{end}', 'rows-per-second' = '{pace:.0f}')"
            )
            source = (
                f"(SELECT *, tenths(seq) AS r FROM src{side}{i}) WHERE r <> 0"
                if shape.udf
                else f"src{side}{i}{kept}"
            )
            sql(f"CREATE TEMPORARY VIEW in{side}{i} AS SELECT {key} AS key, seq AS `value`, ts FROM {source}")

        # Latency mode: the newest event time a row reflects (a window's end, a running aggregate's latest
        # record, a record's own) and the wall time the row is computed at, just before the sink.
        def newest(column: str) -> str:
            return "" if rate is None else f", CAST({column} AS STRING) AS newest"

        if shape.join:
            sides = [
                f"(SELECT * FROM TABLE(TUMBLE(TABLE in{side}{i}, DESCRIPTOR(ts), INTERVAL '1' SECOND)))"
                for side in ("", "r")
            ]
            query = (
                "SELECT L.window_start AS ws, L.key AS k, L.`value` AS lv, R.`value` AS rv, CAST(1 AS BIGINT) AS n,"
                " L.`value` + R.`value` AS total"
                f"{newest('L.window_end')} FROM {sides[0]} L JOIN {sides[1]} R ON L.key = R.key AND L.window_start ="
                " R.window_start AND L.window_end = R.window_end"
            )
        elif shape.stream:
            query = f"SELECT key, `value`, CAST(1 AS BIGINT) AS n, `value` AS total{newest('ts')} FROM in{i}"
        elif shape.window is None:
            query = f"SELECT key, COUNT(*), SUM(`value`){newest('MAX(ts)')} FROM in{i} GROUP BY key"
        else:
            size, slide = shape.window
            windows = (
                f"TUMBLE(TABLE in{i}, DESCRIPTOR(ts), INTERVAL '{size}' SECOND)"
                if size == slide
                else f"HOP(TABLE in{i}, DESCRIPTOR(ts), INTERVAL '{slide}' SECOND, INTERVAL '{size}' SECOND)"
            )
            query = (
                f"SELECT window_start, key, COUNT(*), SUM(`value`){newest('window_end')} FROM TABLE({windows})"
                " GROUP BY window_start, window_end, key"
            )
        if rate is not None:
            query = f"SELECT *, CAST(CURRENT_TIMESTAMP AS STRING) FROM ({query})"
        columns = (
            ("" if shape.window is None else "ws TIMESTAMP(3), ")
            + (
                "k BIGINT, lv BIGINT, rv BIGINT, "
                if shape.join
                else "k BIGINT, v BIGINT, "
                if shape.stream
                else "k BIGINT, "
            )
            + "n BIGINT, total BIGINT"
            + ("" if rate is None else ", newest STRING, emitted STRING")
        )
        # The stream shape's records go to the sink's subtasks by key (Flink adds the keyed shuffle for a
        # sink with a primary key; FORCE adds it at any parallelism), as streamtopo's keyed stream sink.
        self.config.set("table.exec.sink.keyed-shuffle", "FORCE" if shape.stream else "AUTO")
        key = ", PRIMARY KEY (k) NOT ENFORCED" if shape.stream else ""
        sql(f"CREATE TEMPORARY TABLE out{i} ({columns}{key}) WITH ('connector' = 'print')")
        sys.stdout.flush()
        self.offset = self.log.stat().st_size
        return sql(f"INSERT INTO out{i} {query}")

    def statements(self, ddl: list[str], inserts: list[str]) -> None:
        """A query written by the harness: its statements, then its inserts as one job, to the end."""
        for statement in ddl:
            self.env.execute_sql(statement)
        job = self.env.create_statement_set()
        for insert in inserts:
            job.add_insert_sql(insert)
        sys.stdout.flush()
        self.offset = self.log.stat().st_size
        job.execute().wait()

    def printed(self) -> list[tuple[str, str, str]]:
        """(print identifier, row kind, fields) of every row the last job printed."""
        with self.log.open() as f:
            f.seek(self.offset)
            return [m.groups() for m in map(self.ROW.match, map(str.strip, f)) if m]  # type: ignore[misc]

    def summary(self) -> dict[str, int]:
        final: dict[str, tuple[int, int]] = {}
        for _, kind, fields in self.printed():
            if kind in ("+I", "+U"):
                *group, n, total = fields.split(", ")
                final[", ".join(group)] = max(final.get(", ".join(group), (0, 0)), (int(n), int(total)))
        return {
            "rows": len(final),
            "n": sum(n for n, _ in final.values()),
            "total": sum(t for _, t in final.values()),
        }


def compile_udf(source: Path) -> Path:
    """``source`` (Java functions for Flink SQL) compiled against PyFlink's jars into a jar, its ``main`` run
    as its self-check (it raises when it disagrees with the values it checks)."""
    import pyflink

    lib = Path(pyflink.__file__).parent / "lib" / "*"
    out = Path(tempfile.mkdtemp(prefix="peers-udf-"))
    subprocess.run(["javac", "-d", str(out / "classes"), "-cp", str(lib), str(source)], check=True)
    package = re.search(r"^package ([\w.]+);", source.read_text(), re.M)
    name = f"{package.group(1)}.{source.stem}" if package else source.stem
    subprocess.run(["java", "-cp", f"{out / 'classes'}{os.pathsep}{lib}", name], check=True)
    jar = out / f"{source.stem}.jar"
    subprocess.run(["jar", "cf", str(jar), "-C", str(out / "classes"), "."], check=True)
    return jar


class Spark:
    """Structured Streaming on ``local[p]`` (shuffle partitions = p), memory sink in update mode (the
    windows' results come out in the run's batch, not one batch later as append mode's would, and the
    last window would never close: a bounded input's watermark stays below its end)."""

    def __init__(self, parallelism: int):
        from pyspark.sql import SparkSession

        # The udf shape's pandas UDF runs in Spark's Python workers: this interpreter, which has pandas.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        self.parallelism = parallelism
        self.spark = (
            SparkSession.builder.master(f"local[{parallelism}]")
            .config("spark.sql.shuffle.partitions", str(parallelism))
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.session.timeZone", "UTC")
            # The memory sink keeps a run's output in the driver: 1g ended in a lost gateway after the
            # high-cardinality runs (a million groups a run).
            .config("spark.driver.memory", "4g")
            .getOrCreate()
        )
        self.spark.sparkContext.setLogLevel("ERROR")
        self.checkpoints = Path(tempfile.mkdtemp(prefix="peers-ss-"))
        self.runs = 0
        self.keys: list[str] = []

    def run(self, name: str, records: int) -> None:
        from pyspark.sql import functions as F

        shape = SHAPES[name]
        self.runs += 1

        def source(records: int) -> DataFrame:
            return (
                self.spark.readStream.format("rate-micro-batch")
                .option("rowsPerBatch", records)
                .option("numPartitions", self.parallelism)
                .load()
                .selectExpr("value AS seq", f"timestamp_micros(value * {1_000_000 // EVENT_RATE}) AS ts")
            )

        if shape.join:
            left, right = (
                source(records // 2)
                .selectExpr(f"{shape.key} AS {side}key", f"seq AS {side}v", f"ts AS {side}ts")
                .withWatermark(f"{side}ts", "0 seconds")
                .withColumn(f"{side}w", F.window(f"{side}ts", "1 second"))
                for side in ("l", "r")
            )
            frame = left.join(right, F.expr("lkey = rkey AND lw = rw")).selectExpr(
                "lw.start AS ws", "lkey AS key", "lv", "rv", "1L AS n", "lv + rv AS total"
            )
            self.keys = ["ws", "key", "lv", "rv"]
            self.start(frame, "append")
            return
        if shape.udf:
            from pyspark.sql.functions import pandas_udf

            rows = (
                source(records)
                .selectExpr(f"{shape.key} AS key", "seq AS value", "ts")
                .withColumn("r", pandas_udf(tenths, "long")("value"))  # type: ignore[call-overload]
                .where("r <> 0")
                .drop("r")
            )
        else:
            rows = (source(records).where("seq % 10 <> 0") if shape.kept else source(records)).selectExpr(
                f"{shape.key} AS key", "seq AS value", "ts"
            )
        if shape.rekey:  # whole records cross: partitioned by the computed column before the aggregate
            rows = rows.repartition("key")
        if shape.stream:  # every record, partitioned by key, into the sink
            self.keys = ["key", "value"]
            self.start(
                rows.repartition("key").selectExpr("key", "value", "1L AS n", "value AS total"), "append"
            )
            return
        aggregates = (F.count("*").alias("n"), F.sum("value").alias("total"))
        if shape.window is None:
            frame = rows.groupBy("key").agg(*aggregates)
            self.keys = ["key"]
        else:
            size, slide = shape.window
            window = F.window("ts", f"{size} seconds", f"{slide} seconds").start.alias("ws")
            frame = rows.withWatermark("ts", "0 seconds").groupBy(window, "key").agg(*aggregates)
            self.keys = ["ws", "key"]
        self.start(frame, "update")

    def latency(self, name: str, paced: Paced) -> dict[str, object]:
        """The shape over the ``rate`` source at ``paced.rate`` records/s (event time: the wall time each
        record is due), micro-batches back to back, for ``paced.warmup + paced.seconds`` s. Each batch's
        rows are timed when the driver has them (the sink's commit): latency = that moment - the newest
        event time a row reflects. Windows and join pairs come out final (append mode, once the watermark
        passes their end), running aggregates as updates (update mode, one per changed key and batch)."""
        from pyspark.sql import functions as F

        shape = SHAPES[name]
        self.runs += 1
        lags: list[float] = []
        started = time.time()

        def rows() -> DataFrame:
            return (
                self.spark.readStream.format("rate")
                .option("rowsPerSecond", int(paced.rate))
                .option("numPartitions", self.parallelism)
                .load()
                .selectExpr("value AS seq", "timestamp AS ts")
            )

        def timed(batch: DataFrame, _: int) -> None:
            # Newest event times in 10 ms buckets: what the driver holds is a few hundred rows a batch.
            buckets = batch.groupBy(F.expr("unix_millis(newest) div 10 AS b")).count().collect()
            now = time.time()
            if started + paced.warmup <= now <= started + paced.warmup + paced.seconds:
                for row in buckets:
                    lags.extend([now - (row["b"] + 0.5) / 100] * int(row["count"]))

        if shape.join:
            left, right = (
                rows()
                .selectExpr(f"{shape.key} AS {side}key", f"seq AS {side}v", f"ts AS {side}ts")
                .withWatermark(f"{side}ts", "0 seconds")
                .withColumn(f"{side}w", F.window(f"{side}ts", "1 second"))
                for side in ("l", "r")
            )
            frame = left.join(right, F.expr("lkey = rkey AND lw = rw")).selectExpr("lw.end AS newest")
            mode = "append"
        else:
            source = rows()
            if shape.udf:
                from pyspark.sql.functions import pandas_udf

                source = source.withColumn("r", pandas_udf(tenths, "long")("seq")).where("r <> 0")  # type: ignore[call-overload]
            elif shape.kept:
                source = source.where("seq % 10 <> 0")
            records = source.selectExpr(f"{shape.key} AS key", "seq AS value", "ts")
            if shape.rekey or shape.stream:
                records = records.repartition("key")
            aggregates = (F.count("*").alias("n"), F.sum("value").alias("total"))
            if shape.stream:
                frame, mode = records.selectExpr("key", "value", "ts AS newest"), "append"
            elif shape.window is None:
                frame = records.groupBy("key").agg(*aggregates, F.max("ts").alias("newest"))
                mode = "update"
            else:
                size, slide = shape.window
                window = F.window("ts", f"{size} seconds", f"{slide} seconds")
                frame = (
                    records.withWatermark("ts", "0 seconds")
                    .groupBy(window.alias("w"), "key")
                    .agg(*aggregates)
                    .selectExpr("w.end AS newest", "key", "n", "total")
                )
                mode = "append"
        query = (
            frame.writeStream.outputMode(mode)
            .foreachBatch(timed)
            .option("checkpointLocation", str(self.checkpoints / str(self.runs)))
            .start()
        )
        query.awaitTermination(max(0.0, started + paced.warmup + paced.seconds - time.time()))
        query.stop()
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()))
        shutil.rmtree(self.checkpoints / str(self.runs), ignore_errors=True)
        return paced.histogram(lags)

    def start(self, frame: DataFrame, mode: str) -> None:
        """Runs ``frame`` over the run's micro-batch into the memory table ``out<run>``."""
        query = (
            frame.writeStream.format("memory")
            .queryName(f"out{self.runs}")
            .outputMode(mode)
            .option("checkpointLocation", str(self.checkpoints / str(self.runs)))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()))

    def summary(self) -> dict[str, int]:
        table = f"out{self.runs}"
        keys = ", ".join(self.keys)
        [row] = self.spark.sql(
            f"SELECT count(*) AS rows, sum(n) AS n, sum(total) AS total FROM (SELECT {keys}, max(n) AS n,"
            f" max(total) AS total FROM {table} GROUP BY {keys})"
        ).collect()
        self.spark.sql(f"DROP VIEW IF EXISTS {table}")
        shutil.rmtree(self.checkpoints / str(self.runs), ignore_errors=True)
        return {"rows": int(row["rows"]), "n": int(row["n"] or 0), "total": int(row["total"] or 0)}

    def close(self) -> None:
        self.spark.stop()
        shutil.rmtree(self.checkpoints, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("engine", choices=("flink", "spark"))
    parser.add_argument("--parallelism", type=int, default=1)
    parser.add_argument("--log", type=Path, default=None, help="Flink: file for stdout (its print sink)")
    parser.add_argument("--udf", type=Path, default=None, help="Flink: Java functions to compile")
    args = parser.parse_args()
    # The protocol keeps the real stdin and stdout; the JVM (which inherits them) gets /dev/null to read
    # and stderr to write, so it can neither eat a request nor garble an answer.
    requests, out = os.fdopen(os.dup(0)), os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(2, 1)
    if args.engine == "flink":
        log = args.log or Path(tempfile.mkstemp(prefix="peers-flink-", suffix=".log")[1])
        engine: Flink | Spark = Flink(args.parallelism, log, args.udf)
    else:
        engine = Spark(args.parallelism)
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in requests:
        request = json.loads(line)
        try:
            if "run" in request:
                if request["run"] not in SHAPES:
                    raise ValueError(f"unknown shape {request['run']!r} (known: {', '.join(SHAPES)})")
                engine.run(request["run"], int(request["records"]))
                answer: dict[str, object] = {"done": True}
            elif "latency" in request:
                if request["latency"] not in SHAPES:
                    raise ValueError(f"unknown shape {request['latency']!r} (known: {', '.join(SHAPES)})")
                answer = engine.latency(request["latency"], Paced(**request["paced"]))
            elif "statements" in request and isinstance(engine, Flink):
                engine.statements(request["statements"], request["inserts"])
                answer = {"done": True}
            elif "printed" in request and isinstance(engine, Flink):
                answer = {"rows": engine.printed()}
            else:
                answer = engine.summary()
        except Exception as e:  # the harness reports it and goes on with the next configuration
            answer = {"error": f"{type(e).__name__}: {e}"[:2000]}
        out.write(json.dumps(answer) + "\n")
        out.flush()
    if isinstance(engine, Spark):
        engine.close()


if __name__ == "__main__":
    main()
