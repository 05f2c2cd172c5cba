"""User functions: ``module:function``, a pandas DataFrame in, a pandas DataFrame out.

The function runs inside Spark as a pandas function (``mapInPandas``), called once per key group per
Arrow chunk, so it never sees two key groups at once. It receives the records with their reserved
columns; if its result lacks ``_kg`` the key group is filled in, if it lacks ``_ts`` the latest event
time of the records it was given (the time by which the output was known).

Spark needs the output schema before running; it is inferred by calling the function on a few records
of the batch in the driver (the first 32 of one key group). Functions whose output columns depend on
the data beyond that sample must keep their columns stable.

A function that does not import fails at build time (:class:`OperatorError` naming the operator and the
path); one that raises on some records raises :class:`RecordError` with exactly those records, found by
bisection in plain pandas (no Spark jobs on the error path). A function returning something other
than a DataFrame, or output whose columns change beyond the sample, is an :class:`OperatorError`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any

import pandas as pd
from pyspark import cloudpickle
from pyspark.sql import SparkSession

from streamtopo.planner.model import Operator, StreamTopologySpec
from streamtopo.runtime.operators.base import (
    KG,
    TS,
    OperatorError,
    OperatorResult,
    UnitOperator,
    ensure_reserved,
    guarded,
    spark_schema,
    to_pandas,
    to_spark,
)

SAMPLE_ROWS = 32

UserFunction = Callable[[pd.DataFrame], pd.DataFrame]


def load_function(path: str, operator: str) -> UserFunction:
    """Import ``module:function``; any failure becomes an OperatorError naming operator and path."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise OperatorError(operator, "function", f"{path!r} is not of the form 'module:function'")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # noqa: BLE001 - any import-time failure of user code is reported
        raise OperatorError(operator, "function", f"cannot import {path!r}: {type(error).__name__}: {error}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise OperatorError(operator, "function", f"{path!r}: module {module_name!r} has no function {attr!r}")
    # Spark's Python workers may not have the user's directory on their path: ship the module by value.
    if module_name != "__main__" and not module_name.startswith(("pandas", "numpy")):
        cloudpickle.register_pickle_by_value(module)
    return fn


def apply_per_key_group(fn: UserFunction, frame: pd.DataFrame, operator: str) -> pd.DataFrame:
    """Call ``fn`` once per key group of ``frame`` and restore the reserved columns it dropped."""
    outputs = []
    for kg, part in frame.groupby(KG, sort=True):
        result = fn(part.reset_index(drop=True))
        if not isinstance(result, pd.DataFrame):
            raise OperatorError(operator, "function",
                                f"returned {type(result).__name__}, expected a pandas DataFrame")
        result = result.copy()
        if KG not in result.columns:
            result[KG] = kg
        if TS not in result.columns:
            result[TS] = part[TS].max()
        outputs.append(result.astype({KG: "int32", TS: "float64"}))
    return pd.concat(outputs, ignore_index=True) if outputs else frame.iloc[:0]


class UdfOperator(UnitOperator):
    def __init__(self, op: Operator, spec: StreamTopologySpec):
        super().__init__(op, spec)
        self.fn = load_function(op.function, op.name)

    def process(self, spark: SparkSession, batch: pd.DataFrame, states: dict[int, Any],
                watermarks: dict[int, float]) -> OperatorResult:
        if not len(batch):
            return OperatorResult(batch)
        batch = ensure_reserved(batch, self.name)
        output = guarded(self.name, "function", lambda b: self._run(spark, b), batch, probe=self._call)
        return OperatorResult(output)

    def _call(self, batch: pd.DataFrame) -> pd.DataFrame:
        return apply_per_key_group(self.fn, batch, self.name)

    def _run(self, spark: SparkSession, batch: pd.DataFrame) -> pd.DataFrame:
        sample = self._call(batch[batch[KG] == batch[KG].iloc[0]].head(SAMPLE_ROWS))
        try:
            schema = spark_schema(sample)
        except Exception as error:  # noqa: BLE001 - unconvertible output types are the function's fault
            raise OperatorError(self.name, "function", f"output is not convertible to Arrow: {error}") from None
        columns, fn, name = list(sample.columns), self.fn, self.name

        def run(chunks: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
            for chunk in chunks:
                yield apply_per_key_group(fn, chunk, name)[columns]

        return to_pandas(to_spark(spark, batch).mapInPandas(run, schema))
