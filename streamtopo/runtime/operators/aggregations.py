"""Decomposable aggregations: ``sum(price * volume) AS pv`` split into partials that merge.

Windows fire long after their records arrive, and sliding windows overlap, so an aggregate keeps
*partials* (one row per key and pane or window) rather than records: Spark computes a batch's partials,
the driver merges them into state, and firing turns merged partials into final values. That requires
each aggregation to be decomposable (C-MR's Combine has the same requirement):

    sum(e)   -> partial sum(e)                       merge: sum      final: the sum
    count(e) -> partial count(e)                     merge: sum      final: the count (count(*) counts rows)
    avg(e)   -> partials sum(e), count(e), type(e)   merge: sums     final: Spark's average of sum and count
    min(e)   -> partial min(e)                       merge: min      final: the min
    max(e)   -> partial max(e)                       merge: max      final: the max

``e`` is any Spark SQL expression over the input columns. Every partial has Spark's own type (a sum of ints
is a bigint, of decimal(p, s) a decimal(p + 10, s)) and merges with Spark's semantics (folds.py). An
average's sum is Spark's Average buffer: the values cast to double, or the exact decimal sum of decimals;
its ``type`` partial is a null of ``e``'s type, so the rows say which (a decimal average's result type is
decimal(p + 4, s + 4), which the sum's type alone cannot tell for p >= 28).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from streamtopo.planner.expressions import AGGREGATION_FORM
from streamtopo.runtime.operators import folds
from streamtopo.runtime.operators.records import column, values

_AGG = AGGREGATION_FORM  # the door reads an aggregation as this splits it (planner/expressions.py)
_PARTIALS = {
    "sum": ("s",),
    "count": ("c",),
    "avg": ("as", "c", "t"),
    "mean": ("as", "c", "t"),
    "min": ("min",),
    "max": ("max",),
}
_ONE_PARTIAL = {"as": "avg_sum", "t": "arg_type"}
"""Functions computing one partial of an average alone (aggregates sharing sub-windows, shared_panes.py);
not parseable from a spec."""
_INTERNAL = {fn: (kind,) for kind, fn in _ONE_PARTIAL.items()}
_PARTIAL_SQL = {
    "s": "sum({})",
    "c": "count({})",
    "min": "min({})",
    "max": "max({})",
    "t": "max(IF(false, {}, NULL))",
}


def is_decimal(spark_type: str | None) -> bool:
    return bool(spark_type) and str(spark_type).startswith("decimal")


@dataclass(frozen=True)
class Aggregation:
    fn: str
    arg: str
    alias: str
    index: int

    def partial_columns(self) -> dict[str, str]:
        """Partial column name -> its kind (s, as, c, t, min, max)."""
        kinds = _PARTIALS.get(self.fn) or _INTERNAL[self.fn]
        return {f"__a{self.index}_{kind}": kind for kind in kinds}

    def partial_sql(self, arg_type: str | None = None) -> list[str]:
        """The partials as Spark SQL; ``arg_type`` (the argument's Spark type) decides an average's sum."""
        out = []
        for column_name, kind in self.partial_columns().items():
            if kind == "as":
                sql = f"sum({self.arg})" if is_decimal(arg_type) else f"sum(CAST(({self.arg}) AS DOUBLE))"
            else:
                sql = _PARTIAL_SQL[kind].format(self.arg)
            out.append(f"{sql} AS {column_name}")
        return out

    @property
    def averages(self) -> bool:
        return "as" in self.partial_columns().values()


def parse_aggregations(texts: list[str]) -> list[Aggregation]:
    """Parse ``fn(expr) AS alias``; raises ValueError naming ``aggregations[i]`` on anything else."""
    out: list[Aggregation] = []
    for i, text in enumerate(texts):
        match = _AGG.match(text)
        if not match:
            raise ValueError(f"aggregations[{i}]: {text!r} is not of the form 'fn(expression) AS alias'")
        fn, arg, alias = match.group("fn").lower(), match.group("arg").strip(), match.group("alias")
        if fn not in _PARTIALS:
            raise ValueError(
                f"aggregations[{i}]: {fn}() is not decomposable; use one of {', '.join(sorted(_PARTIALS))}"
            )
        if re.match(r"distinct\b", arg, re.IGNORECASE):
            raise ValueError(f"aggregations[{i}]: {fn}(DISTINCT ...) is not decomposable")
        if not arg:
            raise ValueError(f"aggregations[{i}]: {fn}() needs an argument")
        if arg == "*" and fn != "count":
            raise ValueError(f"aggregations[{i}]: only count accepts *")
        out.append(Aggregation(fn, "1" if arg == "*" else arg, alias, i))
    aliases = [a.alias for a in out]
    duplicates = sorted({a for a in aliases if aliases.count(a) > 1})
    if duplicates:
        raise ValueError(f"aggregations: alias(es) {', '.join(duplicates)} used twice")
    return out


def partial_aggregation(kind: str, arg: str, index: int) -> Aggregation:
    """The aggregation that computes one partial (kind ``s``, ``as``, ``c``, ``t``, ``min`` or ``max`` of
    ``arg``) alone, its column ``__a<index>_<kind>``: aggregates sharing sub-windows compute each distinct
    partial once."""
    fn = {"s": "sum", "c": "count", **_ONE_PARTIAL}.get(kind, kind)
    return Aggregation(fn, arg, f"__partial{index}", index)


def partial_kinds(aggs: list[Aggregation]) -> dict[str, str]:
    return {column: kind for agg in aggs for column, kind in agg.partial_columns().items()}


def fold(kind: str, series: pd.Series, codes: np.ndarray, groups: int, merging: bool) -> pd.Series:
    """One partial per group: of a batch's values (the argument, ``merging`` False), or of partial rows."""
    if kind == "t":
        kind_of = series.dtype.pyarrow_dtype if isinstance(series.dtype, pd.ArrowDtype) else pa.null()
        return column(np.zeros(groups, dtype=object), np.ones(groups, dtype=bool), kind_of)
    if kind == "c" and not merging:
        return folds.count(series, codes, groups)
    if kind in ("s", "as", "c"):
        if kind == "as" and not merging and not pa.types.is_decimal(series.dtype.pyarrow_dtype):
            data, nulls = values(series)
            series = column(data.astype(np.float64), nulls, pa.float64())
        return folds.total(series, codes, groups, merging=merging)
    return folds.extreme(series, codes, groups, largest=kind == "max")


def merge_partials(
    df: pd.DataFrame, by: list[str], kinds: dict[str, str], extra_max: tuple[str, ...] = ()
) -> pd.DataFrame:
    """Merge partial rows that share ``by`` (and take the max of ``extra_max`` columns, e.g. ``_ts``): one
    row per group, keys as Spark shows them, each partial folded with Spark's semantics. An overflow
    raises :class:`folds.SparkArithmeticError` naming the aggregation (``aggregations[i]: ...``)."""
    if df.empty:
        return df.reset_index(drop=True)
    return merge_grouped(df, *folds.group_codes(df, by), by, kinds, extra_max)


def merge_grouped(
    df: pd.DataFrame,
    codes: np.ndarray,
    first: np.ndarray,
    by: list[str],
    kinds: dict[str, str],
    extra_max: tuple[str, ...] = (),
) -> pd.DataFrame:
    """:func:`merge_partials` with the groups given (:func:`folds.group_codes` of ``df`` by ``by``), for a
    caller that needs them too (which group holds which rows)."""
    out = folds.normalized_keys(df[by]).iloc[first].reset_index(drop=True)
    for name, kind in kinds.items():
        with _naming(name):
            out[name] = fold(kind, df[name], codes, len(first), merging=True)
    for name in extra_max:
        out[name] = folds.extreme(df[name], codes, len(first), largest=True)
    return out


@contextmanager
def _naming(partial: str) -> Iterator[None]:
    """An overflow inside names the aggregation the partial column ``__a<i>_<kind>`` belongs to."""
    try:
        yield
    except folds.SparkArithmeticError as error:
        index = partial[len("__a") :].split("_", 1)[0]
        raise folds.SparkArithmeticError(f"aggregations[{index}]: {error}") from None


def finalize(df: pd.DataFrame, aggs: list[Aggregation]) -> pd.DataFrame:
    """Final aggregate values from merged partials (partial columns replaced by the aliases)."""
    out = df.drop(columns=list(partial_kinds(aggs)))
    for agg in aggs:
        cols = {kind: name for name, kind in agg.partial_columns().items()}
        if agg.averages:
            argument = df[cols["t"]].dtype.pyarrow_dtype
            with _naming(cols["as"]):
                out[agg.alias] = folds.average(df[cols["as"]], df[cols["c"]], argument)
        else:
            out[agg.alias] = df[next(iter(cols.values()))]
    return out
