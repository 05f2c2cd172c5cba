"""Comparing batches as Spark's semantics has it: same columns, same Spark types, same values, where NaN
equals NaN, null equals only null and -0.0 is not 0.0 (Spark keeps the sign of a zero it computes)."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import pyarrow as pa

from streamtopo.runtime.operators.records import to_arrow


def cell(value: Any, signed_zero: bool = True) -> Any:
    """A hashable, comparable stand-in for one value: NaN as a marker, floats with their zero's sign."""
    if isinstance(value, float):
        if math.isnan(value):
            return ("nan",)
        if value == 0 and signed_zero:
            return ("zero", math.copysign(1.0, value))
    return value


def rows_of(table: pa.Table, signed_zero: bool = True) -> list[tuple[Any, ...]]:
    columns = [[cell(v, signed_zero) for v in table.column(i).to_pylist()] for i in range(table.num_columns)]
    return list(zip(*columns))


def difference(
    ours: pd.DataFrame, spark: pd.DataFrame, ordered: bool = False, signed_zero: bool = True
) -> str:
    """Why two batches differ ('' when they do not): columns, types, then rows (as multisets unless
    ``ordered``)."""
    a, b = to_arrow(ours), to_arrow(spark)
    if a.column_names != b.column_names:
        return f"columns {a.column_names} != {b.column_names}"
    types = [(n, x, y) for n, x, y in zip(a.column_names, a.schema.types, b.schema.types) if x != y]
    if types:
        return f"types (column, ours, Spark's) {types}"
    ra, rb = rows_of(a, signed_zero), rows_of(b, signed_zero)
    if not ordered:
        ra, rb = sorted(ra, key=repr), sorted(rb, key=repr)
    if ra != rb:
        wrong = [(x, y) for x, y in zip(ra, rb) if x != y][:3]
        return f"{len(ra)} rows vs {len(rb)}; first differences (ours, Spark's): {wrong}"
    return ""


def same_rows(
    ours: pd.DataFrame, spark: pd.DataFrame, ordered: bool = False, signed_zero: bool = True
) -> bool:
    """:func:`difference` as an assertion helper: raises with the reason, so a failure says what differs."""
    reason = difference(ours, spark, ordered, signed_zero)
    assert not reason, reason
    return True
