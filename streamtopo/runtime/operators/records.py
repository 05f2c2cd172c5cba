"""Records in the driver keep Spark's types: one representation, and exact conversions to and from it.

An edge's schema is Spark's analysed schema, and it must survive every hop a batch takes: out of the JVM,
across the wire, into state, back into Spark. pandas' own dtypes cannot carry it: a nullable bigint becomes
float64 (9007199254741025 turns into ...024.0), NaN and null become one value, a decimal forgets its
precision and scale, a timestamp becomes a zone-less nanosecond. So in the driver every user column is a
pandas column backed by Arrow (``pd.ArrowDtype``): the Arrow type *is* the Spark type (bigint with a
validity bitmap, double whose NaN is a value and whose null is not, decimal128(p, s), timestamp[us, UTC],
date32, string), and it travels with the values through concatenation, slicing and state.

Only the executor's own columns are plain numpy, because nothing in them is ever null and every step
computes on them: ``_kg`` (int32), ``_ts`` (float64 seconds) and the bookkeeping columns named ``__*``.

The conversions here are the only ones the data plane uses:

- :func:`to_pandas` (a Spark frame into the driver: ``toArrow``, then :func:`from_arrow`);
- :func:`to_arrow` / :func:`from_arrow` (the wire, state, Arrow IPC);
- :func:`to_spark` (a batch back into Spark: an Arrow table, or above :data:`PARQUET_ROWS` a Parquet file
  written from that table, whose types Spark reads back unchanged: timestamps as UTC microseconds,
  decimals with their precision and scale, NaN as NaN).

pandas operations on these columns are not Spark's semantics (pandas' sum skips NaN, its merge matches
nulls): code that computes on records reads values and null masks (:func:`values`) and builds results
with :func:`column`, under the rules of docs/runtime.md, "One semantics"; anything it cannot do exactly
goes to Spark.
"""

from __future__ import annotations

import os
import shutil
import threading
import uuid
import warnings
from collections.abc import Iterable
from decimal import Decimal
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame as SparkFrame
from pyspark.sql import SparkSession
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

from streamtopo.planner.expressions import INPUT, KG, TS
from streamtopo.runtime.spark import temp_dir

# The record fields the runtime adds, one definition with the door that keeps tenants' columns off them
# (planner/expressions.py): ``_kg`` the key group (int32: the consuming unit on input, the producing one
# on output), ``_ts`` event time in seconds (float64), ``_input`` which input of a join a record came
# from. Every other column of the executor's own starts with ``__`` (expressions.INTERNAL_PREFIX).
SRC = "__src"
"""The producing unit of a record or partial row, where a consumer counts what each unit sent."""
DST = "__dst"
"""The consuming key group a lazy flow routes each record to."""
COUNT = "__n"
"""The records a partial aggregate row stands for."""
BUCKET = "__bucket"
"""The pane or window of a partial aggregate row."""
POS = "__pos"
"""A record's position among the windows it was exploded into."""
EDGE = "__edge"
"""The flow of each row in a step's one count job."""
WINDOW = "__win"
"""A join's window index."""
LINE = "__line"
"""A file sink's line for each record (JSON, as Spark's writer writes it)."""
INTERNAL = frozenset({KG, TS, INPUT, SRC, DST, COUNT, BUCKET, POS, EDGE, WINDOW, LINE})
"""The executor's own columns: plain numpy in the driver, never null. Everything else is user data."""


def is_internal(name: str) -> bool:
    """Whether column ``name`` is the executor's own rather than user data (partial aggregates are user
    data: they hold the user's types, a decimal sum say)."""
    return name in INTERNAL


# ------------------------------------------------------------------------------------------ Arrow


def from_arrow(table: pa.Table) -> pd.DataFrame:
    """A pandas frame of ``table``: user columns Arrow-backed (types exact), internal ones numpy."""
    columns = [_series(name, chunked) for name, chunked in zip(table.column_names, table.columns)]
    frame = pd.DataFrame(dict(enumerate(columns)), index=pd.RangeIndex(table.num_rows))
    frame.columns = table.column_names  # a query may name two columns alike, as Spark's may
    return frame


def _series(name: str, chunked: pa.ChunkedArray) -> pd.Series:
    if is_internal(name):
        return _numpy_column(name, chunked)
    return pd.Series(pd.arrays.ArrowExtensionArray(chunked), copy=False)


def _numpy_column(name: str, chunked: pa.ChunkedArray) -> pd.Series:
    if chunked.null_count:
        raise ValueError(f"column {name!r} has nulls (the executor's own columns never do)")
    values = chunked.to_numpy()
    if name == KG:
        values = values.astype(np.int32, copy=False)
    return pd.Series(values, copy=False)


def to_arrow(frame: pd.DataFrame) -> pa.Table:
    """``frame`` as an Arrow table with exactly its types: Arrow-backed columns as they are, numpy ones
    without reading NaN as null (what ``pa.Table.from_pandas`` would do)."""
    names = [str(c) for c in frame.columns]
    # items() by position (a name may repeat); iloc[:, i] per column cost 5x as much, per part of a batch
    arrays = [arrow_array(series, name) for name, (_, series) in zip(names, frame.items())]
    return pa.Table.from_arrays(arrays, names=names)


def arrow_array(series: pd.Series, name: str | None = None) -> pa.Array | pa.ChunkedArray:
    """One column (named ``name``, by default the series' name) as Arrow: an Arrow-backed column as it
    is; the executor's own numpy columns exactly; any other pandas column (a UDF's output, say) as Spark
    converts pandas data, NaN being null there."""
    if isinstance(series.dtype, pd.ArrowDtype):
        return series.array._pa_array  # noqa: SLF001 - the column's own Arrow data, no copy
    if is_internal(str(series.name) if name is None else name):
        return pa.array(series.to_numpy(), from_pandas=series.dtype == object)
    return pa.array(series, from_pandas=True)


def canonical(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with every user column Arrow-backed (a frame that has them all is returned as it is)."""
    if all(is_internal(str(c)) or isinstance(t, pd.ArrowDtype) for c, t in frame.dtypes.items()):
        return frame
    canon = from_arrow(to_arrow(frame))
    canon.index, canon.attrs = frame.index, frame.attrs
    return canon


def empty_like(schema: pa.Schema) -> pd.DataFrame:
    """A frame of no records with ``schema``'s columns and types."""
    return from_arrow(schema.empty_table())


def concat(frames: Iterable[pd.DataFrame], contiguous: bool = False) -> pd.DataFrame:
    """Row-wise concatenation that keeps every column's type: through Arrow, whose type promotion is
    Spark's widening for the cases that arise (a column missing from one frame is null there; an
    all-null column takes the other frames' type). ``contiguous``: one chunk per column, for a frame
    that is concatenated again and again (state): its chunks would otherwise grow with every step."""
    parts = list(frames)
    if len(parts) == 1:
        return parts[0].reset_index(drop=True)
    table = pa.concat_tables([to_arrow(part) for part in parts], promote_options="default")
    return from_arrow(table.combine_chunks() if contiguous else table)


# ------------------------------------------------------------------------------- values and masks


def values(series: pd.Series, fill: object = None) -> tuple[np.ndarray, np.ndarray]:
    """A column's values (nulls replaced by ``fill``, by default the type's zero) and its null mask. NaN
    is a value, never null. Timestamps and dates come as numpy datetimes, decimals as Decimal objects."""
    if isinstance(series.dtype, pd.ArrowDtype):
        array = series.array._pa_array  # noqa: SLF001 - the column's own Arrow data
        kind = series.dtype.pyarrow_dtype
        data = pc.fill_null(array, pa.scalar(_zero(kind) if fill is None else fill, kind))
        return data.to_numpy(), array.is_null().to_numpy()
    data = series.to_numpy()
    if data.dtype == object:
        nulls = np.array([v is None for v in data], dtype=bool)
        filled = data.copy()
        filled[nulls] = 0 if fill is None else fill
        return filled, nulls
    return data, np.zeros(len(data), dtype=bool)


def _zero(kind: pa.DataType) -> object:
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return ""
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return b""
    if pa.types.is_boolean(kind):
        return False
    if pa.types.is_decimal(kind):
        return Decimal(0)
    if pa.types.is_null(kind):
        return None
    return 0


def column(data: np.ndarray, nulls: np.ndarray | None, kind: pa.DataType) -> pd.Series:
    """An Arrow-backed column of type ``kind`` from values and a null mask (NaN stays a value)."""
    mask = None if nulls is None or not np.any(nulls) else np.asarray(nulls, dtype=bool)
    return pd.Series(pd.arrays.ArrowExtensionArray(pa.array(data, type=kind, mask=mask, from_pandas=False)))


# ------------------------------------------------------------------------------------------ Spark


def spark_schema(frame: pd.DataFrame) -> T.StructType:
    """The Spark schema of a batch (its Arrow types; Arrow's null type, an all-None column, as string)."""
    return from_arrow_schema(_spark_arrow(to_arrow(frame).schema))  # zero-copy but for object columns


def _spark_arrow(schema: pa.Schema) -> pa.Schema:
    return pa.schema([f.with_type(pa.string()) if pa.types.is_null(f.type) else f for f in schema])


def arrow_schema(schema: T.StructType) -> pa.Schema:
    """The Arrow schema Spark's ``toArrow`` gives for ``schema`` (timestamps as UTC microseconds)."""
    return to_arrow_schema(schema, timezone="UTC", prefers_large_types=False)


def to_pandas(frame: SparkFrame) -> pd.DataFrame:
    """A Spark frame's records in the driver (runs its job), every type kept."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="toPandas attempted Arrow optimization")
        table = frame.toArrow()
    return from_arrow(table)


PARQUET_ROWS = 20_000
"""From this many rows on, a batch reaches Spark through a Parquet file written from its Arrow table:
PySpark 4's ``createDataFrame`` moves about 100k records per CPU-second into the JVM and holds them in the
driver's heap, Spark's vectorised Parquet reader about 800k."""


def to_spark(spark: SparkSession, frame: pd.DataFrame | pa.Table) -> SparkFrame:
    """A Spark DataFrame of a batch, its types exactly the batch's; large batches go through a Parquet
    file in the scratch directory, which must outlive every lazy frame built on it (the executor clears
    it after each step)."""
    table = frame if isinstance(frame, pa.Table) else to_arrow(frame.reset_index(drop=True))
    table = table.cast(_spark_arrow(table.schema))
    schema = from_arrow_schema(table.schema)
    if table.num_rows < PARQUET_ROWS:
        return spark.createDataFrame(table, schema=schema)
    path = scratch_dir() / f"{uuid.uuid4().hex}.parquet"
    # Microsecond timestamps stored as UTC-adjusted INT64: what Spark's reader maps to its TimestampType.
    # Plain pages without statistics: the file is read once, whole, so dictionaries and min/max buy
    # nothing, and building them was three quarters of the write (bench/handoff.py).
    pq.write_table(
        table,
        path,
        compression="none",
        use_dictionary=False,
        write_statistics=False,
        coerce_timestamps="us",
        allow_truncated_timestamps=False,
    )
    # The schema is ours: giving it saves the Spark job that would read it back from the file's footer.
    return spark.read.schema(schema).parquet(str(path))


def _scratch() -> Path:
    # Per thread: executors sharing a process (tests, benchmarks) each clear only their own hand-offs.
    # Inside the process's Spark directory, which is removed at exit whatever a step left behind.
    return temp_dir() / f"streamtopo-scratch-{os.getpid()}-{threading.get_ident()}"


def scratch_dir() -> Path:
    """This thread's directory for Parquet hand-offs to Spark (created on first use)."""
    path = _scratch()
    path.mkdir(exist_ok=True)
    return path


def clear_scratch() -> None:
    """Remove the Parquet hand-offs of finished steps (no lazy frame refers to them any more)."""
    shutil.rmtree(_scratch(), ignore_errors=True)
