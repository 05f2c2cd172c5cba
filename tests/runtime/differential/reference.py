"""The reference: Spark *batch* evaluation of a case's queries over the same records (the session the product
pins: ANSI on, UTC), operator by operator, and the JSON lines Spark's writer makes of the results.

Each operator reads its input as an Arrow table (``toArrow`` of the operator before it, so types are
Spark's own) turned into a DataFrame:

- filter -> ``.filter(expr)``, map -> ``.selectExpr(*select, "_ts")`` (the event time passes through, as
  in the product);
- a windowed aggregate -> the windows ``[n*slide, n*slide + size)`` containing each ``_ts`` (an explode),
  then ``groupBy(n, *keys).agg(...)``, output ``window_start, window_end, <keys>, <aliases>`` with the
  bounds as doubles in seconds (aggregate.py);
- a join -> both sides windowed alike and inner-joined on ``(key, n)`` as Spark's equi-join does it
  (``USING``: the key column once; null keys match nothing), output ``window_start, window_end, key``,
  the left side's other columns, the right's; a name on both sides prefixed ``<input>_`` (join.py).

Dead letters (docs/runtime.md): a record that makes an operator raise on its own (ANSI: division by
zero, a failing cast, an overflow in that record's arithmetic) belongs in the dead-letter stream under
that operator, and the operator processes the rest. They are found as the product finds them, by
bisection, each half a fresh DataFrame of its records (a filter over the whole input would let Spark's
optimizer decide which records are evaluated). An aggregate whose aggregation raises over the records
that remain (a sum overflowing) fails the run: :attr:`Expected.failures` names it with Spark's error class.
Operators are evaluated one at a time, never fused: an operator sees exactly the records its input
operator let through, as in a pipeline.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from strategies import Join, Records, Stage

TIMESTAMP_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX"
WINDOW_START, WINDOW_END, WINDOW = "window_start", "window_end", "__n"
RESERVED = ("_ts", "_kg")
ERROR_CLASS = re.compile(r"\[([A-Z_]+(?:\.[A-Z_]+)?)\]")

Line = tuple[tuple[str, Any], ...]
"""A JSON line parsed by :func:`parse_line`: its (key, value) pairs in order."""


def parse_line(text: str) -> Line:
    """A sink line as (key, value) pairs in order, ``_ts`` dropped. Number tokens are kept as their text,
    tagged so that a number never equals a string holding the same digits; NaN/Infinity tokens (not JSON)
    are tagged too."""
    value = json.loads(
        text,
        parse_float=lambda t: ("number", t),
        parse_int=lambda t: ("number", t),
        parse_constant=lambda t: ("constant", t),
        object_pairs_hook=lambda pairs: tuple((k, _freeze(v)) for k, v in pairs),
    )
    return tuple((k, v) for k, v in value if k != "_ts")


def event_time_last(text: str) -> bool:
    """Whether a sink line ends with the event time under its reserved name ``_ts``, a number."""
    pairs = json.loads(text, object_pairs_hook=list)
    return bool(pairs) and pairs[-1][0] == "_ts" and isinstance(pairs[-1][1], int | float)


def _scala(seq: Any) -> list[Any]:
    iterator = seq.iterator()
    out = []
    while iterator.hasNext():
        out.append(iterator.next())
    return out


def _freeze(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


@dataclass
class Expected:
    """What every path must give for one case."""

    lines: dict[str, Counter[Line]] = field(default_factory=dict)
    """Per sink: its lines (parsed, without ``_ts``) as a multiset."""
    types: dict[str, dict[str, str]] = field(default_factory=dict)
    """Per sink: each output column's Spark type (to say which type a difference is about)."""
    dead: dict[str, Counter[int]] = field(default_factory=dict)
    """Per operator: the ``seq`` of every record it must send to the dead-letter stream."""
    failures: dict[str, str] = field(default_factory=dict)
    """Operator -> Spark error class, for aggregates that must fail the run; any of them may be named."""


class Reference:
    """Spark batch evaluation of one case's plan (harness.Plan) over its records."""

    def __init__(self, spark: SparkSession, records: Records):
        self.spark = spark
        self.records = records
        self.source = records.arrow()

    def frame(self, table: pa.Table) -> DataFrame:
        return self.spark.createDataFrame(table)

    # ------------------------------------------------------------------------------------ operators

    def stage(self, stage: Stage, name: str, table: pa.Table, expected: Expected) -> pa.Table | None:
        """The output of one operator as an Arrow table, its dead letters booked; None when it must fail
        the run (booked in ``expected.failures``)."""
        if stage.kind == "filter":
            return self._per_record(name, table, lambda df: df.filter(stage.expr), expected)
        if stage.kind == "map":
            return self._per_record(name, table, lambda df: df.selectExpr(*stage.select, "_ts"), expected)
        return self._aggregate(stage, name, table, expected)

    def _per_record(
        self, name: str, table: pa.Table, query: Callable[[DataFrame], DataFrame], expected: Expected
    ) -> pa.Table:
        table = self._without_culprits(name, table, query, expected)
        return query(self.frame(table)).toArrow()

    def _without_culprits(
        self, name: str, table: pa.Table, query: Callable[[DataFrame], DataFrame], expected: Expected
    ) -> pa.Table:
        """``table`` without the records that make ``query`` raise on their own, booked as ``name``'s
        dead letters."""
        bad = self.culprits(self.frame(table), query)
        if bad:
            expected.dead.setdefault(name, Counter()).update(bad)
            table = table.filter(
                pa.compute.invert(pa.compute.is_in(table.column("seq"), pa.array(bad, pa.int64())))
            )
        return table

    def culprits(self, df: DataFrame, query: Callable[[DataFrame], DataFrame]) -> list[int]:
        """``seq`` of the records of ``df`` on which ``query`` (a filter or a projection) raises: Spark's
        own resolved expressions, each record's wrapped in ``TryEval`` (Catalyst's expression behind
        ``try_add`` and friends: null when evaluating the row throws), in one job. The harness's own test
        checks it finds what bisection finds."""
        jvm = self.spark._jvm
        E = jvm.org.apache.spark.sql.catalyst.expressions
        types = jvm.org.apache.spark.sql.types.DataTypes
        plan = query(df)._jdf.queryExecution().analyzed()
        if plan.nodeName() == "Filter":
            exprs = [plan.condition()]
        else:
            exprs = [e.child() if e.nodeName() == "Alias" else e for e in _scala(plan.projectList())]
        fields = jvm.java.util.ArrayList()
        fields.add(E.Literal.create("ok", types.StringType))
        fields.add(E.Literal.create(True, types.BooleanType))
        for i, e in enumerate(exprs):
            fields.add(E.Literal.create(f"v{i}", types.StringType))
            fields.add(e)
        struct = E.CreateNamedStruct(jvm.scala.jdk.javaapi.CollectionConverters.asScala(fields).toSeq())
        guarded = Column(jvm.org.apache.spark.sql.classic.ExpressionUtils.column(E.TryEval(struct)))
        rows = df.select(F.col("seq"), guarded.isNull().alias("raises")).collect()
        return [row.seq for row in rows if row.raises]

    def windowed(self, df: DataFrame, window: tuple[int, int]) -> DataFrame:
        """Each record once per window ``[n*slide, n*slide + size)`` containing its ``_ts``, ``n`` in ``__n``."""
        size, slide = (units * self.records.unit for units in window)
        first = f"CAST(FLOOR((_ts - {size!r}D) / {slide!r}D) AS BIGINT) + 1"
        last = f"CAST(FLOOR(_ts / {slide!r}D) AS BIGINT)"
        return df.withColumn(WINDOW, F.explode(F.expr(f"sequence({first}, {last})"))).where(
            f"CAST({WINDOW} AS DOUBLE) * {slide!r}D <= _ts AND _ts < CAST({WINDOW} AS DOUBLE) * {slide!r}D + {size!r}D"
        )

    def bounds(self, window: tuple[int, int]) -> list:
        size, slide = (units * self.records.unit for units in window)
        start = F.col(WINDOW).cast("double") * F.lit(slide)
        return [start.alias(WINDOW_START), (start + F.lit(size)).alias(WINDOW_END)]

    def _aggregate(self, stage: Stage, name: str, table: pa.Table, expected: Expected) -> pa.Table | None:
        assert stage.window is not None
        calls = [re.match(r"^(\w+)\((.*)\) AS (\w+)$", text, re.S) for text in stage.aggregations]
        args = [m.group(2) for m in calls if m and m.group(2) != "*"]
        if args:  # a record whose argument raises is a dead letter of the aggregate
            table = self._without_culprits(name, table, lambda df: df.selectExpr(*args), expected)
        grouped = (
            self.windowed(self.frame(table), stage.window)
            .groupBy(WINDOW, *stage.key_by)
            .agg(*[F.expr(text) for text in stage.aggregations])
        )
        out = grouped.select(*self.bounds(stage.window), *stage.key_by, *[m.group(3) for m in calls if m])
        try:
            return out.toArrow()
        except Exception as error:  # noqa: BLE001 - the aggregation itself raises (an overflowing sum)
            found = ERROR_CLASS.search(str(error))
            expected.failures[name] = found.group(1) if found else type(error).__name__
            return None

    def join(
        self, join: Join, name: str, names: tuple[str, str], left: pa.Table, right: pa.Table
    ) -> pa.Table:
        """``names``: the two inputs' operator names (the prefixes of clashing columns)."""
        key = join.key
        lcols, rcols = (
            [c for c in left.column_names if c != "_ts"],
            [c for c in right.column_names if c != "_ts"],
        )
        clash = (set(lcols) & set(rcols)) - {key}

        def side(table: pa.Table, prefix: str) -> DataFrame:
            df = self.windowed(self.frame(table), join.window).drop("_ts")
            return df.withColumnsRenamed({c: f"{prefix}_{c}" for c in clash})

        joined = side(left, names[0]).join(side(right, names[1]), [key, WINDOW], "inner")
        others = [f"{names[0]}_{c}" if c in clash else c for c in lcols if c != key]
        others += [f"{names[1]}_{c}" if c in clash else c for c in rcols if c != key]
        return joined.select(*self.bounds(join.window), key, *others).toArrow()


def spark_lines(spark: SparkSession, table: pa.Table) -> tuple[Counter[Line], dict[str, str]]:
    """What Spark's JSON writer makes of a sink's input: ``to_json(struct(<user columns>))`` with the
    product's timestamp format, parsed (:func:`parse_line`); and each user column's Spark type."""
    df = spark.createDataFrame(table)
    columns = [c for c in df.columns if c not in RESERVED]
    types = {f.name: f.dataType.simpleString() for f in df.schema.fields if f.name in columns}
    if not columns:
        return Counter({(): len(table)}), types
    text = F.to_json(F.struct(*[F.col(f"`{c}`") for c in columns]), {"timestampFormat": TIMESTAMP_FORMAT})
    return Counter(parse_line(row[0]) for row in df.select(text).collect()), types
