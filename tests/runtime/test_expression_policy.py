"""The expression allow-list (planner/expressions.py) against the Spark the executors run: every allowed name
is one of Spark's functions, and the names it refuses exist in Spark (refusing them is what keeps a tenant
out of the JVM), and an allowed expression of each family runs."""

from __future__ import annotations

from typing import Any

import pytest

from streamtopo.planner.expressions import ALLOWED_FUNCTIONS, expression_problem

pytestmark = [pytest.mark.spark]

DENIED = [
    "reflect",
    "java_method",
    "try_reflect",
    "xpath",
    "xpath_string",
    "raise_error",
    "assert_true",
    "current_user",
    "input_file_name",
    "version",
]


@pytest.fixture(scope="module")
def spark_functions(spark) -> set[str]:
    return {row[0].lower() for row in spark.sql("SHOW FUNCTIONS").collect()}


def test_every_allowed_function_is_a_spark_function(spark_functions: set[str]) -> None:
    assert sorted(ALLOWED_FUNCTIONS - spark_functions) == []


def test_the_refused_functions_exist_in_spark_and_are_refused(spark_functions: set[str]) -> None:
    assert set(DENIED) <= spark_functions
    assert not set(DENIED) & ALLOWED_FUNCTIONS
    for name in DENIED:
        assert expression_problem(f"{name}('a', 'b')") is not None


def test_allowed_expressions_run(spark) -> None:
    expressions = [
        "upper(concat_ws('-', 'a', 'b'))",
        "round(sqrt(16.0) + pmod(7, 3), 2)",
        "date_format(to_timestamp('2026-11-25 10:00:00'), 'HH')",
        "coalesce(NULL, 1)",
        "size(transform(array(1, 2), x -> x * 2))",
        "get_json_object('{\"a\": 1}', '$.a')",
        "xxhash64('k')",
        "CASE WHEN 1 > 0 THEN 'y' ELSE 'n' END",
        "CAST('3' AS INT) IN (1, 3)",
    ]
    for text in expressions:
        assert expression_problem(text) is None, text
        spark.sql(f"SELECT {text} AS v").collect()


# ------------------------------------------------------------------------- the second line: Spark's plan

HOSTILE = [
    ("reflect('java.lang.System', 'getenv', 'HOME') AS x", "CallMethodViaReflection"),
    ("java_method('java.lang.System', 'getenv', 'HOME') AS x", "CallMethodViaReflection"),
    ("try_reflect('java.lang.System', 'getenv', 'HOME') AS x", "Reflect"),
    ("array(reflect('java.lang.System', 'getenv', 'HOME'))[0] AS x", "CallMethodViaReflection"),
    ("(SELECT max(value) FROM text.`/etc/hostname`) AS f", "ScalarSubquery"),
    ("exists(SELECT 1) AS e", "Exists"),
    ("key IN (SELECT 1) AS k", "ListQuery"),
    ("current_user() AS u", "CurrentUser"),
    ("user AS u", "CurrentUser"),
    ("input_file_name() AS f", "InputFileName"),
]
"""Expressions the door refuses, given to the operators directly (as a door miss would): the guard must
refuse each from Spark's analysed plan, naming the field."""


def _operator(kind: str, **fields):
    """A map or filter over a sequence source, built without the model's validation (a door miss)."""
    from streamtopo.planner.model import Operator, StreamTopologySpec

    source = Operator(name="s", kind="source", source={"generator": "sequence"})
    op = Operator.model_construct(name="m", kind=kind, inputs=["s"], **fields)
    return op, StreamTopologySpec.model_construct(operators=[source, op], key_groups=2)


def _records(spark):
    import pandas as pd

    from streamtopo.runtime.operators.records import to_spark

    frame = pd.DataFrame({"seq": [1, 2], "key": [1, 2], "value": [3, 4], "_ts": [0.0, 1.0], "_kg": [0, 1]})
    return frame.astype({"_kg": "int32"}), to_spark(spark, frame.astype({"_kg": "int32"}))


@pytest.mark.parametrize("text,what", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_the_plan_guard_refuses_what_the_door_would_have(spark, text, what) -> None:
    from streamtopo.runtime.operators import OperatorError
    from streamtopo.runtime.operators.stateless import FilterOperator, MapOperator

    assert expression_problem(text, "select") is not None  # the door refuses it
    records, lazy = _records(spark)
    op, spec = _operator("map", select=["key", text])
    for batch in (lazy, records):  # a lazy step, and a batch in the driver (numpy_eval's plan)
        with pytest.raises(OperatorError) as error:
            MapOperator(op, spec).process(spark, batch, {}, {})
        assert error.value.field == "select" and what in error.value.message, error.value.message
    predicate = text.rsplit(" AS ", 1)[0]
    op, spec = _operator("filter", expr=f"({predicate}) IS NOT NULL")
    with pytest.raises(OperatorError) as error:
        FilterOperator(op, spec).process(spark, lazy, {}, {})
    assert error.value.field == "expr" and what in error.value.message


def _refused(spark, query, text: str) -> dict[str, str]:
    """The classes of ``query``'s analysed plan outside the guard's allow-list, each mapped to ``text``.
    A FROM-less SELECT's leaf, OneRowRelation, is accepted here: a step's leaves are its inputs."""
    import json

    from streamtopo.runtime import plan_guard

    allowed = plan_guard.EXPRESSIONS | plan_guard.PLAN_NODES | plan_guard.LEAVES | plan_guard.registry(spark)
    plan = json.loads(query._jdf.queryExecution().analyzed().toJSON())
    return {c: text for c in plan_guard._classes(plan) if c not in allowed | {"OneRowRelation"}}


def _analysed(build):
    """``build()`` if Spark analyses it, else None (this call does not fit the function)."""
    try:
        return build()
    except Exception:  # noqa: BLE001 - Spark's AnalysisException, or a parse error of an example's dialect
        return None


def test_every_documented_call_of_an_allowed_function_passes_the_plan_guard(spark) -> None:
    """Every example Spark documents for each allowed function (its ExpressionInfo: ceil with a scale,
    binary pads, interval extracts, the k of max_by) passes the guard wherever Spark analyses it; the door
    allowed them all, so a refusal here is a tenant's valid expression failing at its first step. A
    function whose examples do not analyse (the casts have none) gets the first argument list that fits."""
    import re

    from pyspark.sql import functions as F

    expressions = spark._jvm.org.apache.spark.sql.catalyst.analysis.FunctionRegistry.expressions()
    frame = spark.createDataFrame(
        [(1, 2.5, "a", [1, 2], {"k": 1})], "i int, d double, s string, xs array<int>, m map<string,int>"
    )
    arguments = [["i"], ["d"], ["s"], ["'2026-01-01'"], ["'2026-01-01'", "1"], ["i", "1", "1"]]

    def documented(name: str) -> list[tuple[str, Any]]:
        """Spark's examples of ``name`` that it analyses, with their queries."""
        examples = re.findall(r">\s*(SELECT.*?);", str(expressions.get(name).get()._1().getExamples()), re.S)
        found = [(e, _analysed(lambda e=e: spark.sql(e))) for e in examples]
        return [(e, query) for e, query in found if query is not None]

    def first_fitting(name: str) -> list[tuple[str, Any]]:
        """The first argument list ``name`` analyses with, as a projection or an aggregate."""
        for text in (f"{name}({', '.join(args)})" for args in arguments):
            for build in (lambda t=text: frame.selectExpr(t), lambda t=text: frame.groupBy().agg(F.expr(t))):
                if (query := _analysed(build)) is not None:
                    return [(text, query)]
        return []

    refused: dict[str, str] = {}
    checked = set()
    for name in sorted(ALLOWED_FUNCTIONS - {"window_time"}):  # window_time needs a window() column
        calls = documented(name) or first_fitting(name)
        for text, query in calls:
            refused.update(_refused(spark, query, text))
        if calls:
            checked.add(name)
    assert refused == {}
    assert sorted(ALLOWED_FUNCTIONS - checked) == ["window_time"]


def test_arithmetic_over_dates_timestamps_and_intervals_passes_the_plan_guard(spark) -> None:
    """`a + b`, `a - b`, `a * b`, `a / b` and `-a` over numbers, dates, timestamps and intervals: every
    combination Spark analyses passes the guard (timestamp + interval and date - date are how event-time
    expressions are written), and the ones it types are a real spread of them."""
    values = {
        "i": "7",
        "dec": "CAST(2.50 AS DECIMAL(4, 2))",
        "dbl": "2.5D",
        "date": "DATE'2026-01-01'",
        "ts": "TIMESTAMP'2026-01-01 00:00:00'",
        "ntz": "TIMESTAMP_NTZ'2026-01-01 00:00:00'",
        "days": "INTERVAL '1 02:03:04' DAY TO SECOND",
        "months": "INTERVAL '1-2' YEAR TO MONTH",
    }
    refused: dict[str, str] = {}
    typed = 0
    for left in values.values():
        texts = [f"-{left}"] + [f"{left} {op} {right}" for op in "+-*/" for right in values.values()]
        for text in texts:
            if (query := _analysed(lambda t=text: spark.sql(f"SELECT {t} AS v"))) is not None:
                assert expression_problem(f"{text} AS v", "select") is None, text
                refused.update(_refused(spark, query, text))
                typed += 1
    assert refused == {}
    assert typed >= 80, typed


def test_the_door_reserves_every_column_of_the_executor() -> None:
    """Each internal column of the runtime (records.INTERNAL) is refused as a tenant's output name except
    ``_ts`` in a select list (it re-timestamps records), and a name not among them is allowed."""
    from streamtopo.planner.expressions import output_name_problem
    from streamtopo.runtime.operators.records import INTERNAL, TS

    for name in INTERNAL:
        assert output_name_problem(name, event_time=False), name
        assert (output_name_problem(name, event_time=True) is None) == (name == TS), name
    assert output_name_problem("ts", event_time=False) is None
    assert output_name_problem("_kgx", event_time=False) is None
