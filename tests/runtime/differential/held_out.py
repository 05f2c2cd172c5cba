"""Hand-written cases, as a user would write them: every edge value the issue names in one small topology,
a sum that overflows, and records enough for one batch to reach Spark through a Parquet file.

They are :class:`~strategies.Case` objects like the generated ones (same plan, reference and comparison),
run in-process and through ``streamtopo run``.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from decimal import Decimal

import pyarrow as pa
from strategies import UTC, Branch, Case, Column, Join, Records, Stage, kind_of


def column(name: str, spark_type: str, values: list) -> Column:
    """A column of these values (its pool the distinct ones: -0.0 apart from 0.0, NaN once)."""
    keys = [(type(v).__name__, repr(v)) for v in values]
    pool = list(dict.fromkeys(keys))
    picks = tuple(pool.index(key) for key in keys)
    first = {key: v for key, v in zip(keys, values)}
    return Column(name, spark_type, kind_of(spark_type), tuple(first[key] for key in pool), picks)


def ts(*args: int) -> dt.datetime:
    return dt.datetime(*args, tzinfo=UTC)


EDGES = Records(
    (
        column("d", "double", [1.5, math.nan, None, -0.0, math.inf, 0.0, math.nan, 0.25]),
        column("e", "double", [1e301, 5e-324, 1e-7, None, 0.1, 1e7, 123456789.125, -1.5e-300]),
        column("b", "bigint", [9007199254741025, None, 2**63 - 1, -(2**63), 0, 2**53 + 1, 7, None]),
        column("i", "int", [1, None, -1, 2**31 - 1, 0, 5, 7, 3]),
        column(
            "m",
            "decimal(38,2)",
            [
                Decimal("1.10"),
                None,
                Decimal("9" * 30 + ".99"),
                Decimal("-0.01"),
                Decimal("0.00"),
                Decimal("3.33"),
                Decimal("1.10"),
                Decimal("2.50"),
            ],
        ),
        column(
            "t",
            "timestamp",
            [
                ts(1969, 12, 31, 23, 59, 59, 999999),
                None,
                ts(2262, 4, 12),
                ts(9999, 12, 31, 23, 59, 59, 999999),
                ts(1970, 1, 1),
                ts(2024, 2, 29, 12, 34, 56, 789012),
                ts(1000, 1, 1),
                ts(1677, 9, 21, 0, 12, 43, 145224),
            ],
        ),
        column(
            "dt",
            "date",
            [
                dt.date(2024, 1, 2),
                None,
                dt.date(1000, 1, 1),
                dt.date(9999, 12, 31),
                dt.date(1969, 12, 31),
                dt.date(1970, 1, 1),
                dt.date(2024, 1, 2),
                None,
            ],
        ),
        column("f", "boolean", [True, None, False, True, None, False, True, True]),
        column("s", "string", ["", "é☃", None, "😀x", 'q"uote\\', "line\nbreak", "NaN", "ts"]),
    ),
    rate=1024.0,
)
"""Eight records with the values the issue reports wrong (decimals, timestamps past pandas' range, a
nullable bigint above 2**53, NaN in a group, -0.0 and NaN join keys, unicode strings)."""

EVERY_EDGE = Case(
    EDGES,
    (
        Branch((Stage("filter", expr="true"),)),
        Branch((Stage("map", select=("s", "seq", "d", "b", "m", "t", "dt"), key_by=("s",)),)),
        Branch(
            (
                Stage(
                    "aggregate",
                    key_by=("f",),
                    window=(1, 1),
                    aggregations=(
                        "count(*) AS n",
                        "count(d) AS nd",
                        "sum(d) AS sd",
                        "max(d) AS xd",
                        "min(d) AS md",
                        "avg(d) AS ad",
                        "sum(i) AS si",
                        "max(b) AS xb",
                        "sum(m) AS sm",
                        "avg(m) AS am",
                        "max(t) AS xt",
                        "min(dt) AS mdt",
                        "max(s) AS xs",
                    ),
                ),
            )
        ),
        Branch((Stage("map", select=("seq", "seq * 10 AS ts", "d AS x")),)),
        Join((Stage("filter", expr="true"),), (Stage("map", select=("d", "seq", "s AS r")),), "d", (1, 1)),
    ),
    key_groups=2,
)
"""The issue's reports as one topology: every type written by a file sink, records crossing to a keyed
map, NaN in sums and maxima, decimal sums and averages, a user column named ``ts``, NaN and -0.0 keys."""

OVERFLOW = Case(
    Records(
        (
            column("b", "bigint", [2**62, 2**62, 2**62, 1, 5, 2**62]),
            column("f", "boolean", [True, True, False, True, False, False]),
        ),
        rate=1024.0,
    ),
    (
        Branch((Stage("aggregate", key_by=("f",), window=(1, 1), aggregations=("sum(b) AS total",)),)),
        Branch((Stage("filter", expr="b > 1"),)),
    ),
    key_groups=2,
)
"""Two groups whose sums pass 2**63 (Spark: ARITHMETIC_OVERFLOW, the step fails); each key group's records
alone do not, so only a merge of partials can tell."""


@dataclass(frozen=True)
class Formula:
    """Records computed from ``seq`` by SQL (too many to list): ``select`` is the map after the generator,
    and the reference's records are the same SQL in Spark batch."""

    n: int
    rate: float
    select: tuple[str, ...]
    unit: float
    """Seconds of one window unit."""

    def build_select(self) -> list[str]:
        return ["seq", *self.select]

    def arrow(self) -> pa.Table:
        from streamtopo.runtime.spark import get_spark

        return (
            get_spark()
            .range(self.n)
            .selectExpr("id AS seq")
            .selectExpr(*self.build_select(), f"seq / {self.rate!r}D AS _ts")
            .toArrow()
        )


MANY = Case(
    Formula(  # type: ignore[arg-type] - duck-typed Records: n, rate, unit, arrow, build_select
        50_000,
        rate=float(2**20),
        select=(
            "CAST(seq % 7 AS INT) AS i",
            "timestamp_micros(seq * 1000001L - 25000000000L) AS t",
            "CASE WHEN seq % 5 = 0 THEN NULL ELSE 9007199254740993L + seq END AS b",
            "CASE WHEN seq % 11 = 0 THEN CAST('NaN' AS DOUBLE) ELSE seq * 0.25D END AS d",
            "CAST(seq AS DECIMAL(12,0)) * CAST('0.01' AS DECIMAL(3,2)) AS m",
        ),
        unit=1 / 64,
    ),
    (
        Branch(
            (
                Stage("map", select=("i", "seq", "t", "b", "d", "m"), key_by=("i",)),
                Stage("filter", expr="t IS NOT NULL"),
            )
        ),
        Branch(
            (
                Stage(
                    "aggregate",
                    key_by=("i",),
                    window=(1, 1),
                    aggregations=(
                        "count(b) AS nb",
                        "sum(d) AS sd",
                        "max(d) AS xd",
                        "sum(m) AS sm",
                        "max(t) AS xt",
                    ),
                ),
            )
        ),
    ),
    key_groups=2,
)
"""50,000 records with timestamps, nullable bigints above 2**53, NaN and decimals: a keyed map's input
crosses whole (about 25,000 records reach the other executor in one batch, which enters Spark through a
Parquet file, base.PARQUET_ROWS), and a windowed aggregate over all of them."""
