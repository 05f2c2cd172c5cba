"""Logical and unit graphs from a spec, checked against rates and costs computed by hand."""

from __future__ import annotations

import pytest

from streamtopo.documents import load_topology
from streamtopo.planner.graph import (
    CommCostModel,
    OperatorCostModel,
    logical_graph,
    partition_key,
    rates,
    routing_key,
    unit_graph,
)

COMM = CommCostModel(per_record=1e-6, per_byte=1e-8)
OPS = OperatorCostModel(
    per_record={
        "source": 1e-6,
        "map": 2e-6,
        "filter": 3e-6,
        "aggregate": 4e-6,
        "join": 5e-6,
        "udf": 6e-6,
        "sink": 7e-6,
    },
    selectivity={
        "source": 1.0,
        "map": 1.0,
        "filter": 0.5,
        "aggregate": 0.1,
        "join": 0.5,
        "udf": 1.0,
        "sink": 0.0,
    },
)


def spec_of(operators: list[dict], **extra) -> object:
    return load_topology({"metadata": {"name": "t"}, "spec": {"operators": operators, **extra}}).spec


SRC = {"name": "src", "kind": "source", "source": {"generator": "trades", "ratePerSecond": 1000}}
QUOTES = {"name": "q", "kind": "source", "source": {"generator": "quotes", "ratePerSecond": 500}}


def chain_spec(**extra):
    return spec_of(
        [
            SRC,
            QUOTES,
            {"name": "f", "kind": "filter", "inputs": ["src"], "expr": "price > 0", "selectivity": 0.4},
            {"name": "m", "kind": "map", "inputs": ["f"], "select": ["symbol"], "recordBytes": 100},
            {
                "name": "j",
                "kind": "join",
                "inputs": ["m", "q"],
                "keyBy": ["symbol"],
                "window": {"size": "5s"},
            },
            {"name": "out", "kind": "sink", "inputs": ["j"], "sink": {"console": {}}, "cost": {"cpu": 0.25}},
        ],
        **extra,
    )


def test_rates_propagate_through_selectivities():
    input_rate, edge_rate = rates(chain_spec(), OPS)
    # by hand: src emits 1000/s; f keeps 40 % -> 400; m keeps all; j reads 400 + 500, emits half.
    assert edge_rate[("src", "f")] == pytest.approx(1000)
    assert edge_rate[("f", "m")] == pytest.approx(400)
    assert edge_rate[("m", "j")] == pytest.approx(400)
    assert edge_rate[("q", "j")] == pytest.approx(500)
    assert input_rate["j"] == pytest.approx(900)
    assert edge_rate[("j", "out")] == pytest.approx(450)


def test_costs_of_operators_and_streams():
    graph = logical_graph(chain_spec(), COMM, OPS)
    # operator cost = input rate x per-record cost of the kind, unless profiled
    assert graph.nodes["f"]["w"] == pytest.approx(1000 * 3e-6)
    assert graph.nodes["j"]["w"] == pytest.approx(900 * 5e-6)
    assert graph.nodes["out"]["w"] == pytest.approx(0.25)
    # stream cost = rate x (per record + bytes x per byte); m declares 100-byte records, f the default 64
    assert graph.edges["f", "m"]["w"] == pytest.approx(400 * (1e-6 + 64 * 1e-8))
    assert graph.edges["m", "j"]["w"] == pytest.approx(400 * (1e-6 + 100 * 1e-8))


def test_stream_overrides_win_and_propagate():
    spec = chain_spec(streams=[{"from": "f", "to": "m", "rate": 100, "recordBytes": 10}])
    graph = logical_graph(spec, COMM, OPS)
    assert graph.edges["f", "m"]["rate"] == pytest.approx(100)
    assert graph.edges["f", "m"]["w"] == pytest.approx(100 * (1e-6 + 10 * 1e-8))
    # m now reads 100/s, so the join reads 100 + 500
    assert graph.nodes["j"]["rate"] == pytest.approx(600)
    assert graph.edges["m", "j"]["rate"] == pytest.approx(100)


def unit_spec(k_src: int, k_a: int, k_b: int, key_b: list[str] | None):
    b = {"name": "b", "kind": "map", "inputs": ["a"], "select": ["symbol", "n"], "keyGroups": k_b}
    if key_b is not None:
        b["keyBy"] = key_b
    return spec_of(
        [
            {**SRC, "keyGroups": k_src},
            {
                "name": "a",
                "kind": "aggregate",
                "inputs": ["src"],
                "keyBy": ["symbol"],
                "keyGroups": k_a,
                "aggregations": ["count(*) AS n"],
            },
            b,
            {"name": "out", "kind": "sink", "inputs": ["b"], "sink": {"console": {}}, "keyGroups": 2},
        ]
    )


def edges_between(graph, u: str, v: str) -> set[tuple[int, int]]:
    return {(x[1], y[1]) for x, y in graph.edges if x[0] == u and y[0] == v}


def test_unit_edges_one_to_one_forward_and_all_to_all():
    spec = unit_spec(k_src=4, k_a=4, k_b=4, key_b=["symbol"])
    graph = unit_graph(spec, COMM, OPS)
    # unkeyed source into a keyed aggregate: hash partitioning, every kg to every kg
    assert edges_between(graph, "src", "a") == {(i, j) for i in range(4) for j in range(4)}
    # same key, same K: one-to-one
    assert edges_between(graph, "a", "b") == {(i, i) for i in range(4)}
    # b (keyed, 4 kgs) into an unkeyed sink with 2 kgs that inherits b's key but not its K: all-to-all
    assert edges_between(graph, "b", "out") == {(i, j) for i in range(4) for j in range(2)}

    forward = unit_graph(unit_spec(k_src=4, k_a=4, k_b=4, key_b=None), COMM, OPS)
    # b without keyBy inherits a's key (single keyed input): still one-to-one
    assert edges_between(forward, "a", "b") == {(i, i) for i in range(4)}

    different_key = unit_graph(unit_spec(k_src=4, k_a=4, k_b=4, key_b=["n"]), COMM, OPS)
    assert edges_between(different_key, "a", "b") == {(i, j) for i in range(4) for j in range(4)}


def test_unit_edges_forward_into_unkeyed_operator():
    spec = spec_of(
        [
            {**SRC, "keyGroups": 4},
            {"name": "m", "kind": "map", "inputs": ["src"], "select": ["symbol"], "keyGroups": 2},
            {"name": "out", "kind": "sink", "inputs": ["m"], "sink": {"console": {}}, "keyGroups": 2},
        ]
    )
    graph = unit_graph(spec, COMM, OPS)
    # a map fed by a source has no partition key: kg i goes to kg i mod 2
    assert edges_between(graph, "src", "m") == {(0, 0), (1, 1), (2, 0), (3, 1)}


def test_a_keyed_stateless_map_feeding_only_aggregates_runs_where_its_input_is():
    """A map or filter keyed by ``symbol`` whose consumers are all aggregates with keyBy of their own is
    routed forward, so the aggregates' partials cross instead of whole records; a sink or UDF consumer
    (which would inherit its partitioning) or a keyed UDF keeps the keyBy's hash routing."""

    def rekey(kind: str, *consumers: dict) -> object:
        keyed = {"name": "m", "kind": kind, "inputs": ["src"], "keyBy": ["symbol"], "keyGroups": 4}
        keyed |= {
            "map": {"select": ["*"]},
            "filter": {"expr": "price > 0"},
            "udf": {"function": "mypkg.f:g"},
        }[kind]
        return spec_of([{**SRC, "keyGroups": 4}, keyed, *consumers])

    totals = {"name": "t", "kind": "aggregate", "inputs": ["m"], "keyBy": ["symbol"], "keyGroups": 4}
    totals |= {"aggregations": ["count(*) AS n"]}
    by_volume = {**totals, "name": "s", "keyBy": ["volume"]}
    every = {(i, j) for i in range(4) for j in range(4)}
    for kind in ("map", "filter"):
        spec = rekey(kind, totals, by_volume)
        assert routing_key(spec, "m") is None and partition_key(spec, "m") == ("symbol",)
        graph = unit_graph(spec, COMM, OPS)
        assert edges_between(graph, "src", "m") == {(i, i) for i in range(4)}
        assert edges_between(graph, "m", "t") == every and edges_between(graph, "m", "s") == every
    sink = {"name": "out", "kind": "sink", "inputs": ["m"], "sink": {"console": {}}, "keyGroups": 4}
    unkeyed = {**totals, "keyBy": None}
    for spec in (rekey("map", totals, sink), rekey("map", unkeyed), rekey("udf", totals)):
        assert routing_key(spec, "m") == ("symbol",)
        assert edges_between(unit_graph(spec, COMM, OPS), "src", "m") == every


def test_unit_graph_preserves_logical_weights():
    spec = unit_spec(k_src=4, k_a=8, k_b=8, key_b=["symbol"])
    logical = logical_graph(spec, COMM, OPS)
    units = unit_graph(spec, COMM, OPS)
    assert units.number_of_nodes() == 4 + 8 + 8 + 2
    for node, w in logical.nodes(data="w"):
        assert sum(d["w"] for n, d in units.nodes(data=True) if n[0] == node) == pytest.approx(w)
    for u, v, w in logical.edges(data="w"):
        assert sum(d["w"] for x, y, d in units.edges(data=True) if x[0] == u and y[0] == v) == pytest.approx(
            w
        )


def test_high_availability_replicas_are_expanded():
    spec = spec_of(
        [
            SRC,
            {"name": "f", "kind": "filter", "inputs": ["src"], "expr": "price > 0"},
            {"name": "m", "kind": "map", "inputs": ["f"], "select": ["symbol"]},
            {"name": "out", "kind": "sink", "inputs": ["m"], "sink": {"console": {}}},
        ],
        constraints={"highAvailability": [{"operators": ["f", "m"], "replicas": 3}]},
    )
    graph = logical_graph(spec, COMM, OPS)
    replicated = {"f", "f~r1", "f~r2", "m", "m~r1", "m~r2"}
    assert set(graph.nodes) == replicated | {"src", "out"}
    # inside the replicated sub-graph replica r feeds replica r; entering and leaving connects all
    assert {(u, v) for u, v in graph.edges if u.startswith("f")} == {
        ("f", "m"),
        ("f~r1", "m~r1"),
        ("f~r2", "m~r2"),
    }
    assert {v for u, v in graph.edges if u == "src"} == {"f", "f~r1", "f~r2"}
    assert {u for u, v in graph.edges if v == "out"} == {"m", "m~r1", "m~r2"}
    assert {graph.nodes[n]["replica"] for n in replicated} == {0, 1, 2}
    assert graph.nodes["f~r2"]["w"] == graph.nodes["f"]["w"]
