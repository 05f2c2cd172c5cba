"""The door's typed view agrees with Spark's analyser (design.md section 3: where Spark is at hand its
analyser is the authority, and the grammar-level parser infers what it can): for every example and a few
pipelines of every operator kind, each column the grammar names is one Spark's analysed schema has, each
type the grammar gives is Spark's, and a schema the grammar calls closed has no other column."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamtopo.documents import load_topology
from streamtopo.planner.model import StreamTopologySpec
from streamtopo.planner.schema import infer_schemas
from streamtopo.runtime.analysis import analyze_pipeline

pytestmark = [pytest.mark.spark]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PIPELINE = {
    "keyGroups": 2,
    "operators": [
        {"name": "q", "kind": "source", "source": {"generator": "quotes"}},
        {"name": "t", "kind": "source", "source": {"generator": "trades"}},
        {"name": "w", "kind": "source", "source": {"generator": "words"}},
        {
            "name": "m",
            "kind": "map",
            "inputs": ["t"],
            "select": [
                "*",
                "price * volume AS notional",
                "volume DIV 7 AS lots",
                "CAST(volume AS INT) AS small",
                "upper(symbol) AS sym",
                "price > 100 AS dear",
                "coalesce(price, 0.0D) AS p0",
                "CASE WHEN volume > 10 THEN 'big' ELSE 'small' END AS size",
                "xxhash64(symbol) AS h",
                "length(symbol) AS n",
                "_ts + 1.0D AS later",
            ],
        },
        {"name": "f", "kind": "filter", "inputs": ["m"], "expr": "notional > 0 AND dear"},
        {
            "name": "a",
            "kind": "aggregate",
            "inputs": ["f"],
            "keyBy": ["symbol"],
            "window": {"size": 2},
            "aggregations": ["sum(volume) AS v", "sum(notional) AS pv", "avg(price) AS p", "count(*) AS k"]
            + ["min(small) AS lo", "max(lots) AS hi"],
        },
        {
            "name": "r",
            "kind": "aggregate",
            "inputs": ["t"],
            "keyBy": ["symbol"],
            "aggregations": ["sum(price) AS s"],
        },
        {"name": "j", "kind": "join", "inputs": ["t", "q"], "keyBy": ["symbol"], "window": {"size": 1}},
        {"name": "c", "kind": "map", "inputs": ["w"], "select": ["word", "length(word) AS len"]},
        {"name": "o1", "kind": "sink", "inputs": ["a"], "sink": {"console": {}}},
        {"name": "o2", "kind": "sink", "inputs": ["j"], "sink": {"console": {}}},
        {"name": "o3", "kind": "sink", "inputs": ["r"], "sink": {"console": {}}},
        {"name": "o4", "kind": "sink", "inputs": ["c"], "sink": {"console": {}}},
    ],
}


def specs() -> list[tuple[str, StreamTopologySpec]]:
    examples = [(p.name, load_topology(p).spec) for p in sorted(EXAMPLES.glob("*.yaml"))]
    return [*examples, ("every kind", StreamTopologySpec.model_validate(PIPELINE))]


@pytest.mark.parametrize("name,spec", specs(), ids=[n for n, _ in specs()])
def test_the_grammar_names_and_types_what_spark_analyses(spark, name, spec):
    sparks, grammar = analyze_pipeline(spec, spark), infer_schemas(spec)
    compared = 0
    for operator, schema in grammar.items():
        analysed = sparks[operator]
        if schema is None or analysed is None:
            continue
        types = {f.name: f.dataType.simpleString() for f in analysed.fields}
        for column, kind in schema.columns.items():
            assert column in types, (name, operator, column, sorted(types))
            assert kind is None or kind == types[column], (name, operator, column, kind, types[column])
            compared += kind is not None
        if not schema.open:
            assert set(types) == set(schema.columns), (name, operator, sorted(types), sorted(schema.columns))
    assert compared > 0 or all(s is None for s in grammar.values())  # a stream source: nothing known
