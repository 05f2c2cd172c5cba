"""How a receiver's records get from the wire into Spark (issue 33, item 1): the routes side by side.

A receiving unit whose operator runs in Spark and whose input is partly remote unions the remote records
with its local lazy flows (runtime/dataflow.py). The remote share arrives as Arrow IPC in Valkey stream
entries. Every route here starts from those entries and ends with the consumer's result in the driver (a
partial aggregate per key group and key: ``count(*)``, ``sum(value)``, ``max(ts)``, as an aggregate's map
side computes it), so each one pays the whole way:

- ``parquet``: what a step does from :data:`records.PARQUET_ROWS` rows on: XRANGE, IPC -> Arrow ->
  pandas (one ``from_arrow`` per unit), then :func:`records.to_spark`: Arrow -> a Parquet file in the
  step's scratch directory -> Spark's vectorised reader;
- ``arrow``: what a step does below that: the same, but ``createDataFrame`` from the Arrow table (Spark 4
  turns a table under ``spark.sql.execution.arrow.localRelationThreshold`` into a LocalRelation of rows,
  in the driver's JVM);
- ``arrow-rdd``: ``createDataFrame`` with the threshold at 0, so the batches become an RDD and tasks turn
  them into rows;
- ``datasource``: a Spark 4 Python data source that reads the step's stream range itself (XRANGE and IPC
  decode in Spark's Python worker, Arrow batches straight to the JVM): the route issue 33 names, where
  the driver never decodes the remote share.

Each route runs steps of several sizes (rows per step, in entries of 512 records, Aeolus' default batch),
after warm-up steps, ``--repeats`` times each, interleaved; it reports the median CPU-seconds per step of
the whole process tree (Python, JVM, Python workers, Valkey) as microseconds per record, and its ratio to
the ``parquet`` route at the same size. Every route's result must equal the others' (the bench stops
otherwise).

    .venv/bin/python bench/handoff.py [--sizes 2000,10000,20000,50000,200000] [--repeats 7] [--no-write]

Writes the "Hand-off into Spark" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pyspark.sql import DataFrame as SparkFrame  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition  # noqa: E402
from pyspark.sql.types import StructType  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import Progress  # noqa: E402

from bench.report import header, markdown, spread_cells, write_section  # noqa: E402
from bench.runtime import cpu_seconds  # noqa: E402
from streamtopo.runtime.embedded import EmbeddedValkey  # noqa: E402
from streamtopo.runtime.operators import records  # noqa: E402
from streamtopo.runtime.operators.state import ipc_to_table  # noqa: E402
from streamtopo.runtime.spark import get_spark  # noqa: E402
from streamtopo.runtime.transport import Entry, connect, entry_fields  # noqa: E402

ENTRY_RECORDS = 512
"""Records per stream entry: Aeolus' default batch (planner/scaling/aeolus.py)."""
STREAM = "handoff"
LOCAL_RELATION = "spark.sql.execution.arrow.localRelationThreshold"
TITLE = "Hand-off into Spark (issue 33)"


def batch(rows: int, seed: int = 0) -> pa.Table:
    """A step's remote records as a producer writes them: the executor's ``_kg`` and ``_ts``, a key, a
    value, a decimal price and a timestamp, with some nulls (Spark's types: docs/runtime.md)."""
    rng = np.random.default_rng(seed)
    seq = np.arange(rows, dtype=np.int64)
    cents = pa.array(rng.integers(1, 10**6, rows), type=pa.int64()).cast(pa.decimal128(19, 0))
    price = cents.cast(pa.decimal128(12, 2), safe=False)
    return pa.table(
        {
            "_kg": pa.array((seq % 32).astype(np.int32)),
            "_ts": pa.array(seq / 1e5),
            "key": pa.array(seq % 1009, mask=seq % 97 == 0),
            "value": pa.array(seq),
            "price": price,
            "at": pa.array(seq * 10, type=pa.timestamp("us", tz="UTC")),
        }
    )


def write_stream(client: Any, table: pa.Table) -> None:
    client.delete(STREAM)
    for start in range(0, table.num_rows, ENTRY_RECORDS):
        part = table.slice(start, ENTRY_RECORDS)
        client.xadd(STREAM, dict(zip(*[iter(entry_fields("p", start, 0.0, part))] * 2)))


def entries(client: Any, stream: str = STREAM, start: str = "-", end: str = "+") -> list[Entry]:
    """A stream's entries from ``start`` to ``end``, as a receiver parses them."""
    return [Entry.parse(i, f) for i, f in client.xrange(stream, start, end)]


def wire_table(client: Any) -> pa.Table:
    """What a receiver reads and decodes in the driver: the entries' tables, concatenated."""
    return pa.concat_tables([e.table() for e in entries(client) if e.data], promote_options="default")


def consume(frame: SparkFrame) -> pa.Table:
    """The consumer: an aggregate's map side, partials per key group and key, into the driver."""
    out = frame.groupBy("_kg", "key").agg(
        F.count(F.lit(1)).alias("n"), F.sum("value").alias("s"), F.max("price").alias("p"), F.max("at")
    )
    table = out.toArrow()
    return table.sort_by([("_kg", "ascending"), ("key", "ascending")])


class _Whole(InputPartition):
    def __init__(self) -> None:
        super().__init__(0)


class StepReader(DataSourceReader):
    """Reads the step's range of one stream in Spark's Python worker and yields its Arrow batches."""

    def __init__(self, options: dict[str, str]):
        self.url, self.stream = options["url"], options["stream"]
        self.start, self.end = options.get("start", "-"), options.get("end", "+")

    def partitions(self) -> list[InputPartition]:
        return [_Whole()]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        client = connect(self.url)
        for entry in entries(client, self.stream, self.start, self.end):
            if entry.data:
                yield from ipc_to_table(entry.data).to_batches()


class StepSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "streamtopo_step"

    def schema(self) -> StructType:
        raise ValueError("the reader is given its schema")

    def reader(self, schema: StructType) -> DataSourceReader:
        return StepReader(dict(self.options))


@contextmanager
def handed_off(rows_from: float, threshold: str | None = None) -> Iterator[None]:
    """:func:`records.to_spark` as a step calls it, with its Parquet hand-off from ``rows_from`` rows
    and, when given, Spark's local-relation threshold (bytes) for ``createDataFrame``."""
    spark, kept = get_spark(), records.PARQUET_ROWS
    records.PARQUET_ROWS = rows_from  # type: ignore[assignment]
    if threshold is not None:
        spark.conf.set(LOCAL_RELATION, threshold)
    try:
        yield
    finally:
        records.PARQUET_ROWS = kept
        if threshold is not None:
            spark.conf.unset(LOCAL_RELATION)


def routes(
    spark: SparkSession, client: Any, url: str, schema: StructType
) -> dict[str, Callable[[], pa.Table]]:
    def driver(rows_from: float, threshold: str | None = None) -> Callable[[], pa.Table]:
        def run() -> pa.Table:
            with handed_off(rows_from, threshold):
                return consume(records.to_spark(spark, records.from_arrow(wire_table(client))))

        return run

    def datasource() -> pa.Table:
        frame = spark.read.format(StepSource.name()).schema(schema).option("url", url)
        return consume(frame.option("stream", STREAM).load())

    return {
        "parquet": driver(0),
        "arrow": driver(math.inf),
        "arrow-rdd": driver(math.inf, "0"),
        "datasource": datasource,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="2000,10000,20000,50000,200000", help="rows per step")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=4, help="steps per route and size before measuring")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    console = Console()
    spark = get_spark()
    spark.dataSource.register(StepSource)
    cpu: dict[tuple[str, int], list[float]] = {}
    with EmbeddedValkey() as valkey:
        client = connect(valkey.url)
        names: list[str] = []
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("hand-off", total=len(sizes))
            for rows in sizes:
                table = batch(rows)
                schema = records.from_arrow_schema(records.to_arrow(records.from_arrow(table)).schema)
                write_stream(client, table)
                ways = routes(spark, client, valkey.url, schema)
                names = list(ways)
                expected = ways["parquet"]()
                for name, way in ways.items():
                    got = way()
                    if not got.equals(expected):
                        raise SystemExit(f"{name} at {rows} rows differs from parquet:\n{got}\n{expected}")
                    for _ in range(args.warmup):
                        way()
                    records.clear_scratch()
                for _ in range(args.repeats):
                    for name, way in ways.items():  # interleaved: drift falls on every route alike
                        before = cpu_seconds()
                        way()
                        cpu.setdefault((name, rows), []).append(cpu_seconds() - before)
                        records.clear_scratch()
                progress.advance(task)
    rows_out = []
    for rows in sizes:
        base = statistics.median(cpu[("parquet", rows)])
        for name in names:
            rows_out.append((f"{rows:,}", name, *spread_cells(cpu[(name, rows)], base, 1e6 / rows, ".2f")))
    columns = ["rows per step", "route", "CPU µs per record (median)", "min-max", "vs parquet"]
    lines = markdown(columns, rows_out)
    console.print("\n".join(lines))
    if args.no_write:
        return
    command = "python bench/handoff.py" + (" " + " ".join(sys.argv[1:]) if sys.argv[1:] else "")
    write_section(
        TITLE,
        [
            *header(command, f"{os.cpu_count()} cores, Spark local[1] as in an executor"),
            "",
            *lines,
            "",
            "Reading: every route starts from the step's Valkey entries (Arrow IPC, 512 records each) and ends"
            " with the consumer's partials in the driver, all routes giving the same table; CPU of the whole"
            " process tree (Python, JVM, Python workers, Valkey), the median of the repeats, interleaved."
            " Routes are this module's docstring's (bench/handoff.py).",
        ],
    )


if __name__ == "__main__":
    main()
