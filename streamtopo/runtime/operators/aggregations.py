"""Decomposable aggregations: ``sum(price * volume) AS pv`` split into partials that merge.

Windows fire long after their records arrive, and sliding windows overlap, so an aggregate keeps
*partials* (one row per key and pane or window) rather than records: Spark computes a batch's partials,
the driver merges them into state, and firing turns merged partials into final values. That requires
each aggregation to be decomposable (C-MR's Combine has the same requirement):

    sum(e)   -> partial sum(e)               merge: sum       final: the sum
    count(e) -> partial count(e)             merge: sum       final: the count   (count(*) counts rows)
    avg(e)   -> partials sum(e), count(e)    merge: sums      final: sum / count
    min(e)   -> partial min(e)               merge: min       final: the min
    max(e)   -> partial max(e)               merge: max       final: the max

``e`` is any Spark SQL expression over the input columns. Nulls are ignored as in SQL (a sum over only
nulls is null).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pandas as pd

from streamtopo.planner.expressions import AGGREGATION_FORM

_AGG = AGGREGATION_FORM  # the door reads an aggregation as this splits it (planner/expressions.py)
_PARTIALS = {
    "sum": ("s",),
    "count": ("c",),
    "avg": ("s", "c"),
    "mean": ("s", "c"),
    "min": ("min",),
    "max": ("max",),
}
_PARTIAL_SQL = {"s": "sum({})", "c": "count({})", "min": "min({})", "max": "max({})"}


@dataclass(frozen=True)
class Aggregation:
    fn: str
    arg: str
    alias: str
    index: int

    def partial_columns(self) -> dict[str, str]:
        """Partial column name -> its merge kind (s, c, min, max)."""
        return {f"__a{self.index}_{kind}": kind for kind in _PARTIALS[self.fn]}

    def partial_sql(self) -> list[str]:
        return [
            f"{_PARTIAL_SQL[kind].format(self.arg)} AS {column}"
            for column, kind in self.partial_columns().items()
        ]


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
    """The aggregation that computes one partial (kind ``s``, ``c``, ``min`` or ``max`` of ``arg``) alone,
    its column ``__a<index>_<kind>``: aggregates sharing sub-windows compute each distinct partial once."""
    fn = {"s": "sum", "c": "count"}.get(kind, kind)
    return Aggregation(fn, arg, f"__partial{index}", index)


def partial_kinds(aggs: list[Aggregation]) -> dict[str, str]:
    return {column: kind for agg in aggs for column, kind in agg.partial_columns().items()}


def merge_partials(
    df: pd.DataFrame, by: list[str], kinds: dict[str, str], extra_max: tuple[str, ...] = ()
) -> pd.DataFrame:
    """Merge partial rows that share ``by`` (and take the max of ``extra_max`` columns, e.g. ``_ts``)."""
    if df.empty:
        return df.reset_index(drop=True)
    groups = df.groupby(by, dropna=False, sort=True)
    parts = []
    sums = [c for c, k in kinds.items() if k == "s"]
    counts = [c for c, k in kinds.items() if k == "c"]
    mins = [c for c, k in kinds.items() if k == "min"]
    maxes = [c for c, k in kinds.items() if k == "max"] + list(extra_max)
    if sums:
        parts.append(groups[sums].sum(min_count=1))
    if counts:
        parts.append(groups[counts].sum())
    if mins:
        parts.append(groups[mins].min())
    if maxes:
        parts.append(groups[maxes].max())
    return pd.concat(parts, axis=1).reset_index()


def finalize(df: pd.DataFrame, aggs: list[Aggregation]) -> pd.DataFrame:
    """Final aggregate values from merged partials (partial columns replaced by the aliases)."""
    out = df.drop(columns=list(partial_kinds(aggs)))
    for agg in aggs:
        cols = agg.partial_columns()
        if agg.fn in ("avg", "mean"):
            s, c = list(cols)
            out[agg.alias] = df[s].astype("float64") / df[c].where(df[c] > 0)
        else:
            out[agg.alias] = df[next(iter(cols))]
    return out
