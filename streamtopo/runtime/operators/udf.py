"""User functions: ``module:function``, a pandas DataFrame in, a pandas DataFrame out.

The function is called as Spark's ``mapInPandas`` calls a pandas function, once per key group per Arrow
chunk (``spark.sql.execution.arrow.maxRecordsPerBatch`` records, in order), so it never sees two key
groups at once. The batch is in the driver already, so it runs there, with PySpark's own worker code for
the conversions on both sides: what Spark would return, without a job, the JVM or a Python worker. It
receives the records with their reserved columns; if its result lacks ``_kg`` the key group is filled
in, if it lacks ``_ts`` the latest event time of the records it was given (the time by which the output
was known).

The output schema is inferred by calling the function on a few records of the batch (the first 32 of one
key group); a decimal column keeps its input column's type, or is decimal(38, 18)
(:meth:`UdfOperator.output_schema`). Functions whose output columns depend on the data beyond that
sample must keep their columns stable.

Modules are found on the import path, then in the directories of :func:`extend_import_path`: ``streamtopo
run`` adds the topology file's directory (its executors get it through ``STREAMTOPO_UDF_PATH``), so
``function: mypkg.enrich:apply`` next to the file works without PYTHONPATH. Appended, not prepended: a
file of the user's named like an installed package (``yaml.py``) must not shadow it.

A function that does not import fails at build time (:class:`OperatorError` naming the operator and the
path); one that raises on some records raises :class:`RecordError` with exactly those records, found by
bisection in plain pandas (no Spark jobs on the error path). A function returning something other
than a DataFrame, or output whose columns change beyond the sample, is an :class:`OperatorError`.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql import DataFrame as SparkFrame
from pyspark.sql import SparkSession
from pyspark.sql.conversion import ArrowBatchTransformer, PandasToArrowConversion
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import DataType, DecimalType, StructField, StructType
from pyspark.worker import verify_pandas_result

from streamtopo.planner.model import Operator, StreamTopologySpec
from streamtopo.runtime.operators.base import (
    KG,
    TS,
    OperatorError,
    OperatorResult,
    UnitOperator,
    ensure_reserved,
    guarded,
)
from streamtopo.runtime.operators.records import (
    arrow_schema,
    from_arrow,
    spark_schema,
    to_arrow,
)

SAMPLE_ROWS = 32
UDF_PATH_ENV = "STREAMTOPO_UDF_PATH"
"""Directories (``os.pathsep``-separated) the executor searches for UDF modules after the import path."""

UserFunction = Callable[[pd.DataFrame], pd.DataFrame]


def extend_import_path(directories: Iterable[str | Path]) -> None:
    """Search ``directories`` for UDF modules too, after the import path (empty entries are skipped)."""
    for directory in directories:
        if str(directory):
            resolved = str(Path(directory).resolve())
            if resolved not in sys.path:
                sys.path.append(resolved)


def load_function(path: str, operator: str) -> UserFunction:
    """Import ``module:function``; any failure becomes an OperatorError naming operator and path."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise OperatorError(operator, "function", f"{path!r} is not of the form 'module:function'")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # noqa: BLE001 - any import-time failure of user code is reported
        raise OperatorError(
            operator, "function", f"cannot import {path!r}: {type(error).__name__}: {error}"
        ) from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise OperatorError(
            operator, "function", f"{path!r}: module {module_name!r} has no function {attr!r}"
        )
    return fn


def as_spark_hands_it(frame: pd.DataFrame) -> pd.DataFrame:
    """The records as Spark hands them to a pandas function (``mapInPandas``): PySpark's own conversion of
    their Arrow data, so a function called in the driver (a probe, the sample) sees what it sees in Spark:
    nullable integers as Int64, NaN and null both NaN in a double, timestamps as naive datetime64, decimals
    and dates as Python objects."""
    table = to_arrow(frame).combine_chunks()
    arrays = [c.chunk(0) if c.num_chunks else pa.array([], c.type) for c in table.columns]
    nested = pa.table({"_0": pa.StructArray.from_arrays(arrays, names=table.column_names)})
    converted: pd.DataFrame = ArrowBatchTransformer.to_pandas(
        nested, timezone="UTC", prefer_int_ext_dtype=False, df_for_struct=True
    )[0]
    converted.index = frame.index
    return converted


def apply_per_key_group(fn: UserFunction, frame: pd.DataFrame, operator: str) -> pd.DataFrame:
    """Call ``fn`` once per key group of ``frame``, in key group order, each with its records in their
    order, and restore the reserved columns it dropped."""
    outputs = []
    for kg, part in _key_groups(frame):
        result = fn(part)
        if not isinstance(result, pd.DataFrame):
            raise OperatorError(
                operator, "function", f"returned {type(result).__name__}, expected a pandas DataFrame"
            )
        result = result.copy(deep=False)  # columns set below leave the function's own frame alone
        if KG not in result.columns or result[KG].dtype != np.int32:
            result[KG] = np.int32(kg) if KG not in result.columns else result[KG].astype("int32")
        if TS not in result.columns:
            result[TS] = part[TS].max()
        elif result[TS].dtype != np.float64:
            result[TS] = result[TS].astype("float64")
        outputs.append(result)
    return pd.concat(outputs, ignore_index=True) if outputs else frame.iloc[:0]


def _key_groups(frame: pd.DataFrame) -> Iterator[tuple[int, pd.DataFrame]]:
    """(key group, its records) in key group order. A batch holding its key groups in runs (the usual
    case: one run per unit) is cut into slices, which copy; any other is split by ``groupby``."""
    kg = frame[KG].to_numpy()
    if not len(kg):
        return
    starts = np.flatnonzero(np.concatenate(([True], kg[1:] != kg[:-1])))
    firsts = kg[starts]
    if len(np.unique(firsts)) < len(firsts):  # a key group in several runs
        for group, part in frame.groupby(KG, sort=True):
            yield int(group), part.reset_index(drop=True)
        return
    ends = np.append(starts[1:], len(kg))
    for i in np.argsort(firsts, kind="stable"):
        yield int(firsts[i]), frame.iloc[starts[i] : ends[i]].reset_index(drop=True)


def _decimal(input_type: DataType | None) -> DecimalType:
    return input_type if isinstance(input_type, DecimalType) else DecimalType(38, 18)


@dataclass(frozen=True)
class _WorkerSettings:
    """The session settings PySpark's worker converts a pandas function's batches with."""

    chunk: int
    safecheck: bool
    large_types: bool
    by_name: bool
    int_to_decimal: bool

    @classmethod
    def of(cls, spark: SparkSession) -> _WorkerSettings:
        def flag(key: str, default: str) -> bool:
            return (spark.conf.get(key, default) or default).lower() == "true"

        chunk = int(spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch", "10000") or 10000)
        return cls(
            chunk if chunk > 0 else 2**62,
            flag("spark.sql.execution.pandas.convertToArrowArraySafely", "false"),
            flag("spark.sql.execution.arrow.useLargeVarTypes", "false"),
            flag("spark.sql.legacy.execution.pandas.groupedMap.assignColumnsByName", "true"),
            flag("spark.sql.execution.pythonUDF.pandas.intToDecimalCoercionEnabled", "false"),
        )


class UdfOperator(UnitOperator):
    def __init__(self, op: Operator, spec: StreamTopologySpec):
        super().__init__(op, spec)
        assert op.function is not None  # a udf operator names its function (the model's validator)
        self.fn = load_function(op.function, op.name)
        self._worker: _WorkerSettings | None = None

    def process(
        self, spark: SparkSession, batch: pd.DataFrame, states: dict[int, Any], watermarks: dict[int, float]
    ) -> OperatorResult:
        if not len(batch):
            return OperatorResult(batch)
        batch = ensure_reserved(batch, self.name)
        output = guarded(self.name, "function", lambda b: self._run(spark, b), batch, probe=self._call)
        return OperatorResult(output)

    def output_frame(self, frame: SparkFrame) -> SparkFrame | None:
        """The output's columns over a lazy input, from the function called on no records of the input's
        columns and types (runtime/analysis.py), with the reserved columns it dropped restored. Columns
        whose type no record shows (object) are Spark's void type, which any expression accepts. None
        when the function fails or gives no columns of its own on no records (it may build its output
        row by row): downstream is then left to the run."""
        empty = as_spark_hands_it(from_arrow(arrow_schema(frame.schema).empty_table()))
        try:
            result = self.fn(empty)
        except Exception:  # noqa: BLE001 - user code may need records; the run checks what it returns
            return None
        if not isinstance(result, pd.DataFrame) or not set(result.columns) - {KG, TS}:
            return None
        result = result.assign(**{c: empty[c] for c in (KG, TS) if c not in result.columns})
        schema = from_arrow_schema(pa.Schema.from_pandas(result, preserve_index=False))
        return frame.sparkSession.createDataFrame([], schema)

    def _call(self, batch: pd.DataFrame) -> pd.DataFrame:
        return apply_per_key_group(self.fn, as_spark_hands_it(batch), self.name)

    def _run(self, spark: SparkSession, batch: pd.DataFrame) -> pd.DataFrame:
        sample = self._call(batch[batch[KG] == batch[KG].iloc[0]].head(SAMPLE_ROWS))
        return self._in_driver(spark, batch, self.output_schema(sample, batch), list(sample.columns))

    def output_schema(self, sample: pd.DataFrame, batch: pd.DataFrame) -> StructType:
        """The output's Spark schema, from the function's result on the sample. A decimal column's
        precision is not the sample's (Arrow infers it from the values seen: ``Decimal('1.25')`` is
        decimal(3, 2), and a larger value later would fail the batch): a column named as a decimal input
        column keeps that column's type, any other decimal is decimal(38, 18), Spark's type for a Python
        ``Decimal``."""
        try:
            schema = spark_schema(sample)
        except Exception as error:  # noqa: BLE001 - unconvertible output types are the function's fault
            raise OperatorError(
                self.name, "function", f"output is not convertible to Arrow: {error}"
            ) from None
        inputs = {f.name: f.dataType for f in spark_schema(batch.iloc[:0]).fields}
        return StructType(
            [
                StructField(f.name, _decimal(inputs.get(f.name)), f.nullable)
                if isinstance(f.dataType, DecimalType)
                else f
                for f in schema.fields
            ]
        )

    def _in_driver(
        self, spark: SparkSession, batch: pd.DataFrame, schema: StructType, columns: list[str]
    ) -> pd.DataFrame:
        """What ``mapInPandas(run, schema)`` over the batch returns, computed here: the records as Spark's
        worker hands them over (:func:`as_spark_hands_it`), the function per key group of each chunk of
        ``maxRecordsPerBatch`` records in order, its result checked and converted to Arrow by PySpark's own
        worker code with the worker's settings, then typed as ``toArrow`` gives it. No job, no JVM, no
        Python worker: the batch is in the driver already (tests/runtime/test_udf_driver.py compares both)."""
        settings = self._settings(spark)
        records = as_spark_hands_it(batch)
        output_schema = StructType([StructField("_0", schema)])
        batches = []
        for start in range(0, len(records), settings.chunk):
            chunk = records.iloc[start : start + settings.chunk].reset_index(drop=True)
            result = apply_per_key_group(self.fn, chunk, self.name)
            if list(result.columns) != columns:
                result = result[columns]
            verify_pandas_result(result, schema, assign_cols_by_name=True, truncate_return_schema=True)
            converted = PandasToArrowConversion.convert(
                [result],
                output_schema,
                timezone="UTC",
                safecheck=settings.safecheck,
                arrow_cast=True,
                prefers_large_types=settings.large_types,
                assign_cols_by_name=settings.by_name,
                int_to_decimal_coercion_enabled=settings.int_to_decimal,
            )
            batches.append(ArrowBatchTransformer.flatten_struct(converted))
        return from_arrow(pa.Table.from_batches(batches).cast(arrow_schema(schema)))

    def _settings(self, spark: SparkSession) -> _WorkerSettings:
        if self._worker is None:
            self._worker = _WorkerSettings.of(spark)
        return self._worker
