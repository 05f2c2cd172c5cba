"""Sinks: the last operator of a branch. Writing (exactly once, per key group) is the executor's job.

``process`` passes records through; for a file sink it adds each record's line: JSON exactly as Spark's
JSON writer writes it (json_writer.py, checked against Spark's ``to_json``): the user's columns in order,
null fields left out, NaN and infinities as ``"NaN"``/``"Infinity"``, doubles in Java's notation, bigints
and decimals exact (a decimal with its scale), dates ``2024-01-02``, timestamps ISO-8601 in UTC with
their microseconds (``timestampFormat`` keeps them; Spark's default would cut them to milliseconds); then
the event time as ``_ts`` (seconds). A stream sink's executor writes the records themselves (Arrow, every
type kept); a console sink prints a readable line per record.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import SparkSession

from streamtopo.runtime.operators.base import KG, TS, OperatorResult, UnitOperator, ensure_reserved
from streamtopo.runtime.operators.json_writer import json_lines
from streamtopo.runtime.operators.records import LINE, is_internal


def user_columns(df: pd.DataFrame) -> list[str]:
    """The record's own columns (the executor's, ``_kg``, ``_ts`` ..., left out)."""
    return [c for c in df.columns if not is_internal(str(c))]


def file_lines(spark: SparkSession, batch: pd.DataFrame) -> np.ndarray:
    """Each record's line in a file sink: its own columns, then the event time as ``_ts``."""
    return json_lines(spark, batch, [*user_columns(batch), TS])


class SinkOperator(UnitOperator):
    def process(
        self, spark: SparkSession, batch: pd.DataFrame, states: dict[int, Any], watermarks: dict[int, float]
    ) -> OperatorResult:
        if self.op.sink is not None and self.op.sink.file is not None and len(batch):
            batch = ensure_reserved(batch, self.name)
            batch = batch.assign(**{LINE: file_lines(spark, batch)})
        return OperatorResult(batch)

    def format_console(self, df: pd.DataFrame) -> list[str]:
        """Human-readable lines: ``name[kg] key=value ...`` (safe to print through rich)."""
        columns = user_columns(df)
        rows = df[columns].astype(object).where(df[columns].notna(), None).itertuples(index=False)
        return [
            f"{self.name}[{kg}] " + " ".join(f"{k}={_short(v)}" for k, v in zip(columns, row))
            for kg, row in zip(df[KG].tolist(), rows)
        ]


def _short(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)
