"""Sinks: the last operator of a branch. Writing (exactly once, per key group) is the executor's job.

``process`` passes records through unchanged: a stream sink's executor writes them to the transport as
they are; file and console sinks write :meth:`SinkOperator.format`'s lines. Formatting is plain Python
rather than Spark: it is I/O-side work on records already in the driver, and Python's ``json`` keeps
every float exactly (Spark's and pandas' JSON writers round).
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import SparkSession

from streamtopo.runtime.operators.base import INPUT, KG, TS, OperatorResult, UnitOperator


def _plain(value: Any) -> Any:
    """A JSON-safe Python value: numpy scalars unboxed, NaN/NaT/None -> null, inf -> string."""
    if hasattr(value, "item"):
        value = value.item()
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NaT:
        return None
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if isinstance(value, pd.Timestamp):
        return value.isoformat()
    return value


def _plain_column(column: pd.Series) -> list[Any]:
    """:func:`_plain` of every value, a column at a time where the dtype allows: per value it costs a few
    microseconds, and a sink step may write hundreds of thousands of records."""
    exact = pd.api.types.is_bool_dtype(column.dtype) or pd.api.types.is_integer_dtype(column.dtype)
    if exact and not column.hasnans:  # numpy ints and bools: tolist() gives Python's
        return column.tolist()
    if pd.api.types.is_float_dtype(column.dtype) and isinstance(column.dtype, np.dtype):
        values = column.to_numpy()
        plain = values.astype(object)
        plain[np.isnan(values)] = None
        plain[np.isposinf(values)] = "inf"
        plain[np.isneginf(values)] = "-inf"
        return plain.tolist()
    return [_plain(v) for v in column.tolist()]


def records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """User-facing records: reserved columns dropped, except event time kept as ``ts``."""
    columns = [c for c in df.columns if c not in (KG, TS, INPUT)]
    names, values = columns, [_plain_column(df[c]) for c in columns]
    if TS in df.columns:
        names, values = [*names, "ts"], [*values, _plain_column(df[TS])]
    return [dict(zip(names, row)) for row in zip(*values)] if names else [{} for _ in range(len(df))]


class SinkOperator(UnitOperator):
    def process(
        self, spark: SparkSession, batch: pd.DataFrame, states: dict[int, Any], watermarks: dict[int, float]
    ) -> OperatorResult:
        return OperatorResult(batch)

    def format(self, df: pd.DataFrame) -> list[str]:
        """JSON lines, one per record (the file sink's content)."""
        return [json.dumps(r, separators=(",", ":"), ensure_ascii=False) for r in records(df)]

    def format_console(self, df: pd.DataFrame) -> list[str]:
        """Human-readable lines: ``name[kg] key=value ...`` (safe to print through rich)."""
        kgs = df[KG].tolist() if KG in df.columns else [None] * len(df)
        return [
            f"{self.name}[{kg}] " + " ".join(f"{k}={_short(v)}" for k, v in record.items())
            for kg, record in zip(kgs, records(df))
        ]


def _short(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)
