"""Hypothesis strategies for records with the values ordinary data brings: NaN, signed zeros, infinities,
nulls in every type, bigints at the edges of their range and above 2**53, decimals of several precisions,
microsecond timestamps from year 1 to 9999, dates, empty and non-ASCII strings. Records are Arrow tables
(the executor's own representation, records.py), so every value keeps the type Spark gives it."""

from __future__ import annotations

import datetime
import math
from decimal import Context, Decimal

import pyarrow as pa
from hypothesis import strategies as st

UTC = datetime.UTC
WIDE = Context(prec=100)
"""Decimal's default context rounds to 28 digits: a decimal(38, s) needs more."""

INTS = st.one_of(st.sampled_from([0, 1, -1, 2**31 - 1, -(2**31)]), st.integers(-(2**31), 2**31 - 1))
BIGINTS = st.one_of(
    st.sampled_from([0, -1, 2**53 + 1, -(2**53) - 1, 9007199254741025, 2**63 - 1, -(2**63)]),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-1000, 1000),
)
EXACT_DOUBLES = st.one_of(
    st.sampled_from([0.0, -0.0, math.nan, math.inf, -math.inf, 0.25, -1.5, 5e-324, 1e300]),
    st.integers(-(2**20), 2**20).map(lambda n: n / 4),
)
"""Doubles whose sums are exact in any order (quarters below 2**40) plus the IEEE edge values: a sum's
value does not depend on the order Spark happens to add in, so comparisons can be exact."""
STRINGS = st.one_of(st.sampled_from(["", "a", "ü", "Ä", "a\x00b", '"\\']), st.text(max_size=6))
BOOLS = st.booleans()
TIMESTAMPS = st.one_of(
    st.sampled_from(
        [
            datetime.datetime(1, 1, 1, tzinfo=UTC),
            datetime.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
            datetime.datetime(1970, 1, 1, tzinfo=UTC),
            datetime.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        ]
    ),
    st.datetimes(min_value=datetime.datetime(1, 1, 1), max_value=datetime.datetime(9999, 12, 31)).map(
        lambda d: d.replace(tzinfo=UTC)
    ),
)
DATES = st.dates()


def decimals(precision: int, scale: int) -> st.SearchStrategy[Decimal]:
    bound = 10**precision - 1
    return st.one_of(st.sampled_from([0, bound, -bound, 1, -1]), st.integers(-bound, bound)).map(
        lambda unscaled: Decimal(unscaled).scaleb(-scale, context=WIDE)
    )


DECIMAL_TYPES = [(38, 0), (38, 10), (20, 2), (10, 4), (7, 2), (5, 5)]

TYPES: dict[str, tuple[pa.DataType, st.SearchStrategy]] = {
    "i": (pa.int32(), INTS),
    "b": (pa.int64(), BIGINTS),
    "d": (pa.float64(), EXACT_DOUBLES),
    "s": (pa.string(), STRINGS),
    "f": (pa.bool_(), BOOLS),
    "t": (pa.timestamp("us", tz="UTC"), TIMESTAMPS),
    "day": (pa.date32(), DATES),
    **{f"m{p}_{s}": (pa.decimal128(p, s), decimals(p, s)) for p, s in DECIMAL_TYPES},
}
"""Column name -> (its Arrow type, its values)."""


def nullable(values: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(st.none(), values, values, values)


@st.composite
def tables(draw, columns: list[str] | None = None, min_rows: int = 0, max_rows: int = 40) -> pa.Table:
    """A batch with ``_kg``, ``_ts`` and the named columns of :data:`TYPES` (all by default), nulls in each."""
    names = list(TYPES) if columns is None else columns
    n = draw(st.integers(min_rows, max_rows))
    data = {
        "_kg": pa.array(draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)), pa.int32()),
        "_ts": pa.array(draw(st.lists(st.integers(0, 400), min_size=n, max_size=n)), pa.float64()),
    }
    for name in names:
        kind, values = TYPES[name]
        data[name] = pa.array(draw(st.lists(nullable(values), min_size=n, max_size=n)), kind)
    return pa.table(data)
