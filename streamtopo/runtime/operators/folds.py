"""Spark's aggregate functions over records in the driver: grouping, sums, counts, minima, maxima, averages.

An aggregate's partials are computed by Spark (a lazy batch) or here (a batch already in the driver), and
they are always merged with the key group's state here; every one of these must give what Spark's batch
aggregation gives over the same records, with ANSI on (docs/runtime.md, "One semantics"):

- groups: null is a group of its own, NaN equals NaN, -0.0 equals 0.0 (Spark normalises both in keys);
- ``sum``: nulls are skipped, all-null is null; integers sum as bigint and a total outside bigint fails
  with ``ARITHMETIC_OVERFLOW``; floats sum as double (NaN and infinities propagate, IEEE); a decimal(p, s)
  sums as decimal(min(38, p + 10), s) exactly, and a total that does not fit fails as Spark's
  ``Overflow in sum of decimals``. Merging partial sums keeps their type;
- ``count``: the non-null values (NaN is a value), a bigint; merging sums the counts;
- ``min``/``max``: any orderable type, nulls skipped; doubles order NaN above everything, so ``max`` is
  NaN as soon as one value is and ``min`` only when all are; strings by their UTF-8 bytes (which is code
  point order);
- ``avg``: Spark's Average: a double sum (of the values cast to double) over the count, or for a
  decimal(p, s) the exact decimal sum divided by the count, truncated at 39 decimal places and rounded
  half-up to decimal(min(38, p + 4), min(38, s + 4)), failing with ``NUMERIC_VALUE_OUT_OF_RANGE`` where
  Spark's does (:func:`average`; tests/runtime/test_folds.py holds each against Spark).

Spark's own result can depend on the order it adds in: an integer sum whose running total leaves bigint
and comes back raises in Spark (and here only when a partial's or the merged total is outside), a double
sum rounds differently in another order, and a ``min``/``max`` over ``0.0`` and ``-0.0`` keeps whichever
came first (here too: the first in row order, state before a step's new rows). Every answer given here is
one Spark can give.
"""

from __future__ import annotations

import math
from decimal import ROUND_DOWN, ROUND_HALF_UP, Context, Decimal, localcontext

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from streamtopo.runtime.operators.records import column, values

_BIG = 2**62
"""A float sum below this in magnitude leaves an int64 sum of the same values exact (no overflow)."""
_WIDE = Context(prec=200)
"""Decimal arithmetic without rounding: 38-digit values, thousands of them, never need 200 digits."""


class SparkArithmeticError(ArithmeticError):
    """What Spark's ANSI mode raises (its error class leads the message, as in Spark's own)."""


def _overflow(what: str, suggestion: str) -> SparkArithmeticError:
    return SparkArithmeticError(
        f"[ARITHMETIC_OVERFLOW] {what}. Use '{suggestion}' to tolerate overflow and return NULL instead. "
        'If necessary set "spark.sql.ansi.enabled" to "false" to bypass this error. SQLSTATE: 22003'
    )


# -------------------------------------------------------------------------------------------- groups


def group_codes(frame: pd.DataFrame, by: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Each row's group (0.. in order of first appearance) under Spark's grouping semantics, and the first
    row of each group. -0.0 and 0.0 are one group, shown as 0.0 (:func:`normalized_keys`)."""
    if not len(frame):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    if not by:
        return np.zeros(len(frame), dtype=np.int64), np.zeros(1, dtype=np.int64)
    keys = normalized_keys(frame[by])
    codes = keys.groupby(by, dropna=False, sort=False).ngroup().to_numpy(dtype=np.int64)
    return codes, first_rows(codes)


def first_rows(codes: np.ndarray) -> np.ndarray:
    """The first row of each group of ``codes`` (0..g-1), in one pass where the groups are numbered in
    order of first appearance (a row whose code exceeds every code before it is its group's first), as
    ``ngroup(sort=False)`` numbers them; ``np.unique``'s sort otherwise. The sort cost as much as the
    grouping itself at a million distinct keys (bench/peers.py's highcard shape)."""
    new = np.ones(len(codes), dtype=bool)
    new[1:] = codes[1:] > np.maximum.accumulate(codes)[:-1]
    first = np.flatnonzero(new)
    if np.array_equal(codes[first], np.arange(len(first))):  # each new maximum was the next code
        return first
    return np.unique(codes, return_index=True)[1]


def normalized_keys(keys: pd.DataFrame) -> pd.DataFrame:
    """Keys as Spark groups and shows them: a floating-point -0.0 becomes 0.0 and every NaN the one NaN
    (Spark's NormalizeFloatingNumbers; null stays). The rows keep their index (a sliding window's panes
    repeat it), so the keys stay on their rows."""
    out = keys.copy(deep=False)
    for name in keys.columns:
        series = keys[name]
        if isinstance(series.dtype, pd.ArrowDtype) and pa.types.is_floating(series.dtype.pyarrow_dtype):
            added = pc.add(series.array._pa_array, 0.0)  # noqa: SLF001
            nan = pa.scalar(math.nan, added.type)
            # Arrow compares NaNs by their bits: a NaN with another payload would be a group of its own.
            added = pc.if_else(pc.is_nan(added), nan, added)
            out[name] = pd.Series(pd.arrays.ArrowExtensionArray(added), index=series.index)
        elif series.dtype.kind == "f":
            data = series.to_numpy() + 0.0
            out[name] = pd.Series(np.where(np.isnan(data), math.nan, data), index=series.index)
    return out


def key_hashes(frame: pd.DataFrame, by: list[str]) -> np.ndarray:
    """A 64-bit hash of each row's ``by`` under :func:`group_codes`' semantics: the rows of one group hash
    alike (rows of two groups may collide: grouping them resolves it). What lets an aggregate find the
    state rows of a step's keys without grouping its whole state (aggregate.py, ``_running``)."""
    if not by:
        return np.zeros(len(frame), dtype=np.uint64)
    hashes = pd.util.hash_pandas_object(normalized_keys(frame[by]), index=False)
    return hashes.to_numpy(dtype=np.uint64)


# --------------------------------------------------------------------------------------------- folds


def _arrow_type(series: pd.Series) -> pa.DataType:
    if isinstance(series.dtype, pd.ArrowDtype):
        return series.dtype.pyarrow_dtype
    return pa.from_numpy_dtype(series.dtype)


def count(series: pd.Series, codes: np.ndarray, groups: int) -> pd.Series:
    """``count(x)``: non-null values per group, a bigint."""
    _, nulls = values(series)
    return column(np.bincount(codes[~nulls], minlength=groups).astype(np.int64), None, pa.int64())


def total(series: pd.Series, codes: np.ndarray, groups: int, merging: bool = False) -> pd.Series:
    """``sum(x)`` per group with Spark's result type; ``merging`` folds partial sums (their type kept)."""
    kind = _arrow_type(series)
    data, nulls = values(series)
    present = np.bincount(codes[~nulls], minlength=groups) > 0
    if pa.types.is_integer(kind):
        return column(_integer_sum(data.astype(np.int64), nulls, codes, groups), ~present, pa.int64())
    if pa.types.is_floating(kind):
        sums = np.zeros(groups, dtype=np.float64)
        np.add.at(sums, codes[~nulls], data[~nulls].astype(np.float64))
        return column(sums, ~present, pa.float64())
    if pa.types.is_decimal(kind):
        precision = kind.precision if merging else min(38, kind.precision + 10)
        result = pa.decimal128(precision, kind.scale)
        exact = _decimal_fold(data, nulls, codes, groups)
        bound = Decimal(10) ** (precision - kind.scale)
        if any(abs(s) >= bound for s, p in zip(exact, present) if p):
            raise _overflow("Overflow in sum of decimals", "try_sum")
        return column(np.array(exact, dtype=object), ~present, result)
    raise TypeError(f"sum of {kind} is not defined")  # the analyzer refuses it before anything runs


def _integer_sum(data: np.ndarray, nulls: np.ndarray, codes: np.ndarray, groups: int) -> np.ndarray:
    """Exact int64 sums; a total outside bigint raises Spark's overflow. int64 addition wraps modulo 2**64,
    so its total is exact whenever the true one fits, which the float sums tell."""
    live = ~nulls
    sums = np.zeros(groups, dtype=np.int64)
    np.add.at(sums, codes[live], data[live])
    rough = np.zeros(groups, dtype=np.float64)
    np.add.at(rough, codes[live], data[live].astype(np.float64))
    for group in np.flatnonzero(np.abs(rough) >= _BIG):
        exact = sum(int(v) for v in data[live & (codes == group)])
        if not -(2**63) <= exact < 2**63:
            raise _overflow("overflow", "try_add")
        sums[group] = exact
    return sums


def _decimal_fold(data: np.ndarray, nulls: np.ndarray, codes: np.ndarray, groups: int) -> list[Decimal]:
    sums = [Decimal(0)] * groups
    with localcontext(_WIDE):
        for group, value, null in zip(codes.tolist(), data.tolist(), nulls.tolist()):
            if not null:
                sums[group] += value
    return sums


def extreme(series: pd.Series, codes: np.ndarray, groups: int, largest: bool) -> pd.Series:
    """``max(x)`` (``largest``) or ``min(x)`` per group, of ``x``'s type; NaN above every double."""
    kind = _arrow_type(series)
    data, nulls = values(series)
    present = np.bincount(codes[~nulls], minlength=groups) > 0
    live = ~nulls
    if pa.types.is_floating(kind):
        numbers = data.astype(np.float64)
        nan = np.isnan(numbers)
        out = np.full(groups, -np.inf if largest else np.inf)
        (np.fmax if largest else np.fmin).at(out, codes[live & ~nan], numbers[live & ~nan])
        nans = np.bincount(codes[live & nan], minlength=groups)
        numbers_seen = np.bincount(codes[live & ~nan], minlength=groups)
        out[(nans > 0) & (largest | (numbers_seen == 0))] = np.nan
        # 0.0 and -0.0 tie: Spark keeps the one it saw first, so the result's sign is the first zero's.
        zeros = live & (numbers == 0)
        groups_with_zero, first_zero = np.unique(codes[zeros], return_index=True)
        tied = out[groups_with_zero] == 0
        out[groups_with_zero[tied]] = numbers[np.flatnonzero(zeros)[first_zero[tied]]]
        return _typed(series, out.astype(data.dtype), ~present, kind)
    if data.dtype != object:  # integers, booleans, dates and timestamps: their numbers order them
        ordinals = data.view(np.int64) if data.dtype.kind == "M" else data
        start: object = not largest  # booleans
        if ordinals.dtype.kind in "iu":
            info = np.iinfo(ordinals.dtype)
            start = info.min if largest else info.max
        out = np.full(groups, start, dtype=ordinals.dtype)
        (np.maximum if largest else np.minimum).at(out, codes[live], ordinals[live])
        return _typed(series, out.view(data.dtype) if data.dtype.kind == "M" else out, ~present, kind)
    best: list[object] = [None] * groups  # strings, decimals, binary: Python orders them as Spark does
    for group, value, null in zip(codes.tolist(), data.tolist(), nulls.tolist()):
        if not null and (best[group] is None or (value > best[group] if largest else value < best[group])):
            best[group] = value
    return _typed(series, np.array(best, dtype=object), ~present, kind)


def _typed(series: pd.Series, data: np.ndarray, nulls: np.ndarray, kind: pa.DataType) -> pd.Series:
    if isinstance(series.dtype, pd.ArrowDtype):
        return column(data, nulls, kind)
    return pd.Series(data)  # the executor's own numpy columns (``_ts``) keep their dtype


# ------------------------------------------------------------------------------------------- average


def average(sums: pd.Series, counts: pd.Series, argument: pa.DataType) -> pd.Series:
    """Spark's ``avg`` from a group's sum and count (null when the count is 0). ``argument`` is the
    averaged expression's type: a double sum over the count, or for a decimal Spark's decimal division."""
    data, nulls = values(sums)
    n = values(counts)[0].astype(np.int64)
    empty = nulls | (n == 0)
    if not pa.types.is_decimal(argument):
        with np.errstate(all="ignore"):
            out = data.astype(np.float64) / np.where(empty, 1, n)
        return column(out, empty, pa.float64())
    precision, scale = min(38, argument.precision + 4), min(38, argument.scale + 4)
    result = [None if e else _decimal_average(s, int(c), precision, scale) for s, c, e in zip(data, n, empty)]
    return column(np.array(result, dtype=object), empty, pa.decimal128(precision, scale))


def _decimal_average(total: Decimal, n: int, precision: int, scale: int) -> Decimal:
    """Spark's decimal division sum / count: the quotient truncated at 39 decimal places, then rounded
    half-up to the result's scale, which must hold it."""
    with localcontext(_WIDE):
        quotient = (total / Decimal(n)).quantize(Decimal(1).scaleb(-39), rounding=ROUND_DOWN)
        rounded = quotient.quantize(Decimal(1).scaleb(-scale), rounding=ROUND_HALF_UP)
    if abs(rounded) >= Decimal(10) ** (precision - scale):
        raise SparkArithmeticError(
            f"[NUMERIC_VALUE_OUT_OF_RANGE.WITH_SUGGESTION]  {quotient:f} cannot be represented as "
            f'Decimal({precision}, {scale}). If necessary set "spark.sql.ansi.enabled" to "false" to bypass '
            "this error, and return NULL instead. SQLSTATE: 22003"
        )
    return rounded
