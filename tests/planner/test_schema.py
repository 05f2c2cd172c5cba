"""The typed view at the door (planner/schema.py): columns and Spark types propagated from the sources
through every operator's expressions, and the refusals they allow, each naming its field."""

from __future__ import annotations

import copy

import pytest

from streamtopo.documents import load_topology
from streamtopo.planner.expressions import parse_expression
from streamtopo.planner.model import StreamTopologySpec, TopologyError
from streamtopo.planner.schema import Schema, expression_type, infer_schemas, key_kind, schema_problems

SOURCE = {"name": "s", "kind": "source", "source": {"generator": "trades"}}


def spec(*operators: dict) -> StreamTopologySpec:
    return StreamTopologySpec.model_validate({"keyGroups": 2, "operators": [SOURCE, *operators]})


def problems(*operators: dict) -> list[tuple[str, str]]:
    return schema_problems(spec(*operators))


def test_columns_and_types_flow_from_the_generator_through_the_expressions():
    schemas = infer_schemas(
        spec(
            {"name": "f", "kind": "filter", "inputs": ["s"], "expr": "price > 0"},
            {
                "name": "m",
                "kind": "map",
                "inputs": ["f"],
                "select": ["symbol", "price * volume AS notional", "volume DIV 10 AS lots", "upper(symbol)"],
            },
            {
                "name": "a",
                "kind": "aggregate",
                "inputs": ["f"],
                "keyBy": ["symbol"],
                "window": {"size": 10},
                "aggregations": ["sum(volume) AS v", "avg(price) AS p", "count(*) AS n", "max(price) AS hi"],
            },
        )
    )
    assert schemas["f"] == schemas["s"]
    assert schemas["s"].columns == {
        "symbol": "string",
        "price": "double",
        "volume": "bigint",
        "_ts": "double",
        "_kg": "int",
    }
    mapped = schemas["m"]
    assert mapped.columns["notional"] == "double" and mapped.columns["lots"] == "bigint"
    assert mapped.open  # upper(symbol) has a name only Spark gives
    assert schemas["a"].columns == {
        "window_start": "double",
        "window_end": "double",
        "symbol": "string",
        "v": "bigint",
        "p": "double",
        "n": "bigint",
        "hi": "double",
        "_ts": "double",
        "_kg": "int",
    }


def test_a_stream_source_or_a_udf_leaves_the_schema_unknown_and_unchecked():
    schemas = infer_schemas(
        StreamTopologySpec.model_validate(
            {
                "operators": [
                    {"name": "s", "kind": "source", "source": {"stream": "orders"}},
                    {"name": "f", "kind": "filter", "inputs": ["s"], "expr": "anything > 0"},
                    {"name": "t", "kind": "source", "source": {"generator": "trades"}},
                    {"name": "u", "kind": "udf", "inputs": ["t"], "function": "mypkg.f:g"},
                    {"name": "g", "kind": "filter", "inputs": ["u"], "expr": "made_up > 0"},
                ]
            }
        )
    )
    assert schemas["s"] is None and schemas["f"] is None and schemas["u"] is None and schemas["g"] is None


@pytest.mark.parametrize(
    "operator,field,words",
    [
        ({"name": "f", "kind": "filter", "inputs": ["s"], "expr": "prise > 0"}, "expr", "'prise'"),
        ({"name": "f", "kind": "filter", "inputs": ["s"], "expr": "price + 1"}, "expr", "not a predicate"),
        (
            {"name": "m", "kind": "map", "inputs": ["s"], "select": ["symbol", "vol * 2 AS v"]},
            "select[1]",
            "'vol'",
        ),
        (
            {
                "name": "a",
                "kind": "aggregate",
                "inputs": ["s"],
                "keyBy": ["sym"],
                "aggregations": ["count(*) AS n"],
            },
            "keyBy",
            "no column 'sym'",
        ),
        (
            {
                "name": "a",
                "kind": "aggregate",
                "inputs": ["s"],
                "keyBy": ["symbol"],
                "aggregations": ["sum(x) AS n"],
            },
            "aggregations[0]",
            "'x'",
        ),
        (
            {
                "name": "a",
                "kind": "aggregate",
                "inputs": ["s"],
                "keyBy": ["symbol"],
                "window": {"size": 1},
                "aggregations": ["count(*) AS symbol"],
            },
            "aggregations[0]",
            "already an output column",
        ),
    ],
)
def test_what_would_fail_in_the_executors_is_refused_naming_the_field(operator, field, words):
    found = problems(
        operator, {"name": "out", "kind": "sink", "inputs": [operator["name"]], "sink": {"console": {}}}
    )
    assert [p for p, _ in found] == [f"spec.operators[1].{field}"], found
    assert words in found[0][1]


def test_an_aggregation_alias_of_the_event_time_is_refused_by_the_model():
    with pytest.raises(TopologyError) as error:
        load_topology(
            {
                "metadata": {"name": "t"},
                "spec": {
                    "operators": [
                        SOURCE,
                        {
                            "name": "a",
                            "kind": "aggregate",
                            "inputs": ["s"],
                            "keyBy": ["symbol"],
                            "aggregations": ["sum(price) AS _ts"],
                        },
                        {"name": "out", "kind": "sink", "inputs": ["a"], "sink": {"console": {}}},
                    ]
                },
            }
        )
    assert [p for p, _ in error.value.problems] == ["spec.operators[1].aggregations[0]"]
    assert "reserved" in error.value.problems[0][1]


def test_an_unhashable_key_and_join_keys_that_hash_differently_are_refused():
    unhashable = problems(
        {
            "name": "m",
            "kind": "map",
            "inputs": ["s"],
            "select": ["CAST(array(price) AS ARRAY<DOUBLE>) AS prices"],
        },
        {
            "name": "a",
            "kind": "aggregate",
            "inputs": ["m"],
            "keyBy": ["prices"],
            "aggregations": ["count(*) AS n"],
        },
    )
    assert [p for p, _ in unhashable] == ["spec.operators[2].keyBy"] and "array<double>" in unhashable[0][1]
    joined = problems(
        {
            "name": "t",
            "kind": "map",
            "inputs": ["s"],
            "select": ["CAST(volume AS STRING) AS volume", "price"],
        },
        {"name": "j", "kind": "join", "inputs": ["s", "t"], "keyBy": ["volume"], "window": {"size": 1}},
    )
    assert [p for p, _ in joined] == ["spec.operators[2].keyBy"]
    assert "bigint in 's' but string in 't'" in joined[0][1]
    numbers = problems(
        {"name": "t", "kind": "map", "inputs": ["s"], "select": ["CAST(volume AS INT) AS volume", "price"]},
        {"name": "j", "kind": "join", "inputs": ["s", "t"], "keyBy": ["volume"], "window": {"size": 1}},
    )
    assert numbers == []  # int and bigint hash alike (as doubles)


def test_every_example_is_admitted_and_a_missing_column_in_one_is_refused_by_load_topology():
    from pathlib import Path

    import yaml

    root = Path(__file__).parents[2] / "examples"
    for path in sorted(root.glob("*.yaml")):
        assert schema_problems(load_topology(path).spec) == []
    document = yaml.safe_load((root / "vwap.yaml").read_text())
    broken = copy.deepcopy(document)
    i = next(i for i, op in enumerate(broken["spec"]["operators"]) if op["kind"] == "filter")
    broken["spec"]["operators"][i]["expr"] = "prize > 0"
    with pytest.raises(TopologyError) as error:
        load_topology(broken)
    assert [p for p, _ in error.value.problems] == [f"spec.operators[{i}].expr"]


def test_expression_types_follow_spark_where_the_shape_fixes_them():
    schema = Schema({"i": "int", "l": "bigint", "d": "double", "s": "string"})
    cases = {
        "i + 1": "int",
        "i + l": "bigint",
        "i * d": "double",
        "i / i": "double",
        "l DIV 2": "bigint",
        "CAST(s AS DOUBLE)": "double",
        "CAST(i AS DECIMAL(10,2))": "decimal(10,2)",
        "s || 'x'": "string",
        "i > 0 AND s = 'a'": "boolean",
        "coalesce(i, 0)": "int",
        "CASE WHEN i > 0 THEN s ELSE 'n' END": "string",
        "2147483648": "bigint",
        "1.5": None,  # a decimal of its digits: not guessed
        "upper(s)": "string",
        "length(s)": "int",
        "xxhash64(s)": "bigint",
        "made_up_function_result": None,
    }
    for text, kind in cases.items():
        assert expression_type(parse_expression(text).node, schema) == kind, text
    assert key_kind("int") == key_kind("double") == "double" and key_kind("string") == "string"
    assert key_kind("array<int>") is None
