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


def records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """User-facing records: reserved columns dropped, except event time kept as ``ts``."""
    columns = [c for c in df.columns if c not in (KG, TS, INPUT)]
    out = []
    for row in df.itertuples(index=False, name=None):
        values = dict(zip(df.columns, row))
        record = {c: _plain(values[c]) for c in columns}
        if TS in values:
            record["ts"] = _plain(values[TS])
        out.append(record)
    return out


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
