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


def _records(**columns: tuple[str, list]) -> Records:
    return Records(tuple(column(name, t, values) for name, (t, values) in columns.items()), rate=1024.0)


def _filter(expr: str) -> Branch:
    return Branch((Stage("filter", expr=expr),))


def _aggregate(keys: tuple[str, ...], *aggregations: str) -> Branch:
    return Branch((Stage("aggregate", key_by=keys, window=(1, 1), aggregations=aggregations),))


NAN = _records(d=("double", [math.nan, 1.0, None]), f=("boolean", [True, True, True]))
MINIMAL: dict[str, Case] = {
    "nan-compares-equal-and-greatest": Case(
        NAN, (_filter("d = d"), _filter("d > 0"), _filter("NOT (d < 2)"))
    ),
    "nan-in-aggregates": Case(
        NAN,
        (_aggregate(("f",), "count(d) AS n", "sum(d) AS s", "max(d) AS x", "min(d) AS m"), _filter("true")),
    ),
    "nan-and-null-keys": Case(NAN, (_aggregate(("d",), "count(*) AS n"), _filter("true"))),
    "nullable-bigint-above-2^53": Case(
        _records(b=("bigint", [9007199254741025, None]), i=("int", [1, None])),
        (_filter("true"), Branch((Stage("map", select=("seq", "b + 1 AS c", "i AS j")),))),
    ),
    "decimal-in-a-file-sink": Case(
        _records(m=("decimal(10,2)", [Decimal("1.10"), Decimal("-0.01")])),
        (_filter("true"), _filter("m > 0")),
    ),
    "decimal-average": Case(
        _records(m=("decimal(10,2)", [Decimal("1.10"), Decimal("2.05")]), f=("boolean", [True, True])),
        (_aggregate(("f",), "avg(m) AS a", "sum(m) AS s"), _filter("false")),
    ),
    "date-and-timestamp-in-a-file-sink": Case(
        _records(t=("timestamp", [ts(2024, 2, 29, 12, 34, 56, 789012)]), dt=("date", [dt.date(2024, 1, 2)])),
        (_filter("true"), _filter("dt IS NOT NULL")),
    ),
    "timestamp-notation": Case(
        _records(t=("timestamp", [ts(2024, 2, 29, 12, 34, 56, 789012), ts(1970, 1, 1), None])),
        (_filter("true"), Branch((Stage("map", select=("seq", "t", "CAST(t AS STRING) AS text")),))),
    ),
    "timestamp-outside-pandas-range": Case(
        _records(t=("timestamp", [ts(2262, 4, 12), ts(1000, 1, 1)]), s=("string", ["a", "b"])),
        (Branch((Stage("map", select=("seq", "CAST(t AS STRING) AS c")),)), _filter("t IS NOT NULL")),
    ),
    "datetime-and-interval-arithmetic": Case(
        _records(
            t=("timestamp", [ts(2024, 2, 29, 23, 30, 0, 123456), ts(1970, 1, 1), None]),
            dt=("date", [dt.date(2024, 1, 31), dt.date(1999, 12, 31), None]),
            m=("decimal(10,2)", [Decimal("1.25"), Decimal("-0.05"), None]),
        ),
        (
            Branch(
                (
                    Stage(
                        "map",
                        select=(
                            "seq",
                            "t + INTERVAL 90 MINUTES AS later",
                            "dt + INTERVAL 1 MONTH AS next",
                            "date_part('HOUR', t - TIMESTAMP'2024-01-01 00:00:00') AS hours",
                            "ceil(m, 1) AS up",
                            "floor(m, 0) AS down",
                        ),
                    ),
                )
            ),
            _filter("dt - DATE'2000-01-01' > INTERVAL 0 DAYS"),
        ),
    ),
    "user-column-named-ts": Case(
        _records(s=("string", ["a", "b"])),
        (Branch((Stage("map", select=("seq", "seq + 7 AS ts")),)), _filter("true")),
    ),
    "double-notation": Case(
        _records(e=("double", [1e-7, 1e301, math.inf, 5e-324, 1e7])), (_filter("true"), _filter("e > 0"))
    ),
    "null-fields": Case(
        _records(s=("string", [None, "a"]), i=("int", [None, 2])), (_filter("true"), _filter("i IS NULL"))
    ),
    "all-null-boolean-column": Case(
        _records(f=("boolean", [None, None]), s=("string", ["a", "b"])),
        (_filter("f IS NULL"), _filter("f")),
    ),
    "nan-and-signed-zero-join-keys": Case(
        _records(d=("double", [math.nan, -0.0, 0.0, None, 1.0])),
        (Join((_filter("true").stages[0],), (Stage("map", select=("d", "seq")),), "d", (1, 1)),),
    ),
    "join-side-with-an-all-null-column": Case(
        _records(f=("boolean", [True, False]), s=("string", [None, None])),
        (
            Join(
                (Stage("map", select=("f", "seq", "s AS c")),),
                (Stage("map", select=("f", "seq", "'x' AS c")),),
                "f",
                (1, 1),
            ),
        ),
    ),
    "keyed-map-key-not-in-output": Case(
        _records(i=("int", [1, 2]), s=("string", ["a", "b"])),
        (Branch((Stage("map", select=("seq", "s"), key_by=("i",)),)), _filter("true")),
    ),
    "division-by-zero-dead-letters": Case(
        _records(i=("int", [0, 1, 2]), f=("boolean", [True, True, True])),
        (Branch((Stage("map", select=("seq", "10 / i AS q")),)), _aggregate(("f",), "sum(10 % i) AS r")),
    ),
    "sliding-window-double-keys": Case(
        _records(d=("double", [-363.0, 51051003037.0, -363.0, 51051003037.0])),
        (
            Branch((Stage("aggregate", key_by=("d",), window=(2, 1), aggregations=("sum(d) AS s",)),)),
            _filter("true"),
        ),
    ),
    "aggregate-argument-raising-before-the-wire": Case(
        _records(i=("int", [-(2**31), 1, -(2**31), 2]), f=("boolean", [True, True, False, False])),
        (_aggregate(("f",), "sum(i + i) AS s"), _filter("true")),
        key_groups=2,
    ),
    "date-past-9999-in-a-join": Case(
        _records(dt=("date", [dt.date(9999, 12, 31), dt.date(2024, 1, 2)]), i=("int", [1, 1])),
        (
            Join(
                (Stage("map", select=("i", "seq", "date_add(dt, 1) AS c")),),
                (_filter("true").stages[0],),
                "i",
                (1, 1),
            ),
        ),
    ),
    "timestamp-past-9999": Case(
        _records(t=("timestamp", [ts(9999, 12, 31, 23, 59, 59, 999999), ts(2024, 1, 2)]), i=("int", [1, 1])),
        (
            Join(
                (
                    Stage(
                        "map",
                        select=("i", "seq", "timestamp_seconds(CAST(i AS BIGINT) + 253402300800L) AS c"),
                    ),
                ),
                (_filter("true").stages[0],),
                "i",
                (1, 1),
            ),
            Branch(
                (
                    Stage(
                        "aggregate",
                        key_by=("i",),
                        window=(1, 1),
                        aggregations=("max(timestamp_seconds(CAST(i AS BIGINT) + 253402300800L)) AS m",),
                    ),
                )
            ),
        ),
    ),
}
"""One case per failure the harness found on main (2026-11-27), each as small as it shows: the report's
list, kept so each fix can be checked on its own (``test_minimal_cases``); and ``timestamp-past-9999``,
beside the date past 9999 that crashed an executor (2026-11-28): a timestamp Python cannot hold either,
through a join and an aggregate, which pass."""

REGRESSIONS = {
    "sliding-window-double-keys": ("driver-batch",),
    "aggregate-argument-raising-before-the-wire": ("named-stream-crossing-2", "crossing-2-small-steps"),
    "date-past-9999-in-a-join": ("driver-batch",),
    "keyed-map-key-not-in-output": ("driver-batch", "crossing-2-small-steps"),
    "datetime-and-interval-arithmetic": ("lazy-jvm", "driver-batch", "crossing-2-small-steps"),
}
"""Failures found on merged main (issue 30 items 1-3) and fixed with it, run in every profile: a sliding
window's panes merged under the first double key's group (folds.normalized_keys lost the rows' labels),
and records whose aggregation argument raises while a producer combines them before the wire ending the
run instead of going to the dead-letter stream (Dataflow._without_failing); and (2026-11-28) a join's
batch whose first record holds a date Spark has and Python has not (``date_add(DATE'9999-12-31', 1)``),
which pandas' concatenation read as a Python date and the executor crashed on; and (2026-11-28) a
sink after a keyed map that leaves its key out, which inherited the key and was routed by a column its
records no longer had (planner.graph.partition_key now stops at such a map)."""

MINIMAL_PATHS = {
    **REGRESSIONS,
    "nan-in-aggregates": ("lazy-jvm", "driver-batch"),
    "nan-and-signed-zero-join-keys": ("driver-batch", "crossing-2-small-steps"),
    "division-by-zero-dead-letters": ("driver-batch", "crossing-2-small-steps"),
}
"""Where a minimal case shows on more paths than the driver batch (every other one runs there)."""
