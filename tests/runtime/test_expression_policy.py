"""The expression allow-list (planner/expressions.py) against the Spark the executors run: every allowed name
is one of Spark's functions, and the names it refuses exist in Spark (refusing them is what keeps a tenant
out of the JVM), and an allowed expression of each family runs."""

from __future__ import annotations

import pytest

from streamtopo.planner.expressions import ALLOWED_FUNCTIONS, KEYWORDS, expression_problem

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
    assert not set(DENIED) & (ALLOWED_FUNCTIONS | KEYWORDS)
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
