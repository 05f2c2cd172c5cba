"""The shared constraint checker and plan scoring, on hand-built plans whose answers are worked out here."""

from __future__ import annotations

import pytest

from streamtopo.documents import load_topology
from streamtopo.planner.cluster import Cluster, Host
from streamtopo.planner.graph import logical_graph, unit_graph
from streamtopo.planner.placement.constraints import expand_constraints, violations
from streamtopo.planner.plan import evaluate, pe_size


def topology(constraints: dict, key_groups: int = 2) -> dict:
    """source -> a -> b -> sink, with explicit costs so sizes are easy to compute by hand."""
    ops = [
        {
            "name": "src",
            "kind": "source",
            "source": {"generator": "sequence", "ratePerSecond": 1000},
            "cost": {"cpu": 1.0},
        },
        {
            "name": "a",
            "kind": "map",
            "inputs": ["src"],
            "select": ["key"],
            "cost": {"cpu": 2.0},
            "keyBy": ["key"],
        },
        {
            "name": "b",
            "kind": "filter",
            "inputs": ["a"],
            "expr": "key > 0",
            "cost": {"cpu": 3.0},
            "requires": {"nodeSelector": {"disk": "ssd"}},
        },
        {"name": "out", "kind": "sink", "inputs": ["b"], "sink": {"console": {}}, "cost": {"cpu": 0.5}},
    ]
    spec = {
        "keyGroups": key_groups,
        "operators": ops,
        "constraints": constraints,
        "streams": [
            {"from": "src", "to": "a", "rate": 1000, "recordBytes": 100},
            {"from": "a", "to": "b", "rate": 1000, "recordBytes": 100},
            {"from": "b", "to": "out", "rate": 500, "recordBytes": 100},
        ],
    }
    return load_topology(spec).spec


CLUSTER = Cluster(hosts=[Host(name="h1", cpu=8, labels={"disk": "ssd"}), Host(name="h2", cpu=8)])


def test_sizes_and_cut_follow_cola_definitions():
    spec = topology({})
    graph = logical_graph(spec)
    # w_e = rate * (2e-6 + bytes * 5e-9): 1000 * (2e-6 + 5e-7) = 0.0025 cores; the last edge half that.
    assert graph.edges["src", "a"]["w"] == pytest.approx(0.0025)
    assert graph.edges["b", "out"]["w"] == pytest.approx(0.00125)
    plan = evaluate(graph, CLUSTER, [["src", "a"], ["b", "out"]], ["h1", "h2"], "hand")
    # SIZE({src,a}) = 1 + 2 + w(a,b); SIZE({b,out}) = 3 + 0.5 + w(a,b)
    assert plan.pes[0].size == pytest.approx(3.0025)
    assert plan.pes[1].size == pytest.approx(3.5025)
    assert plan.communication_cost == pytest.approx(0.0025)
    assert plan.max_utilization == pytest.approx(3.5025 / 8)
    assert pe_size(graph, graph.nodes) == pytest.approx(6.5)


def test_plan_must_cover_every_node_once():
    graph = logical_graph(topology({}))
    with pytest.raises(ValueError, match="exactly once"):
        evaluate(graph, CLUSTER, [["src", "a"], ["a", "b", "out"]], ["h1", "h2"], "hand")
    with pytest.raises(ValueError, match="exactly once"):
        evaluate(graph, CLUSTER, [["src", "a"], ["b"]], ["h1", "h2"], "hand")


@pytest.mark.parametrize(
    ("constraints", "groups", "hosts", "expected"),
    [
        ({"peColocation": [["a", "b"]]}, [["src", "a"], ["b", "out"]], ["h1", "h1"], ["peColocation[0]"]),
        ({"peColocation": [["a", "b"]]}, [["src", "a", "b"], ["out"]], ["h1", "h1"], []),
        ({"peExlocation": [["a", "b"]]}, [["src", "a", "b"], ["out"]], ["h1", "h1"], ["peExlocation[0]"]),
        (
            {"hostColocation": [["src", "out"]]},
            [["src", "a", "b"], ["out"]],
            ["h1", "h2"],
            ["hostColocation[0]"],
        ),
        ({"hostExlocation": [["a", "b"]]}, [["src", "a"], ["b", "out"]], ["h1", "h1"], ["hostExlocation[0]"]),
        ({"hostExlocation": [["a", "b"]]}, [["src", "a"], ["b", "out"]], ["h2", "h1"], []),
        ({"peDedication": ["a"]}, [["src", "a"], ["b", "out"]], ["h1", "h1"], ["peDedication[0]"]),
        ({"hostDedication": ["a"]}, [["src"], ["a"], ["b", "out"]], ["h1", "h2", "h1"], []),
        (
            {"hostDedication": ["a"]},
            [["src"], ["a"], ["b", "out"]],
            ["h2", "h2", "h1"],
            ["hostDedication[0]"],
        ),
        ({}, [["src", "a"], ["b", "out"]], ["h2", "h2"], ["requires.nodeSelector"]),
    ],
)
def test_each_constraint_kind_is_checked(constraints, groups, hosts, expected):
    spec = topology(constraints)
    graph = logical_graph(spec)
    found = violations(groups, hosts, expand_constraints(spec, graph, CLUSTER))
    assert [p.split(":")[0] for p in found] == expected


def test_high_availability_replicas_are_expanded_and_checked():
    spec = topology({"highAvailability": [{"operators": ["a", "b"], "replicas": 2, "isomorphic": True}]})
    graph = logical_graph(spec)
    assert {"a", "b", "a~r1", "b~r1"} <= set(graph.nodes)
    # Replica pairs: a->b and a~r1->b~r1 inside, src feeds both replicas, both feed out.
    assert graph.has_edge("a", "b") and graph.has_edge("a~r1", "b~r1") and not graph.has_edge("a", "b~r1")
    assert graph.has_edge("src", "a~r1") and graph.has_edge("b~r1", "out")
    c = expand_constraints(spec, graph, CLUSTER)
    same_shape = [["src", "out"], ["a", "b"], ["a~r1", "b~r1"]]
    assert violations(same_shape, ["h1", "h1", "h2"], c) == [
        "requires.nodeSelector: b placed on a host whose labels do not match"
    ]
    assert violations(same_shape, ["h1", "h1", "h1"], c) == ["highAvailability[0]: replicas share a host"]
    other_shape = [["src", "out"], ["a", "b"], ["a~r1"], ["b~r1"]]
    assert violations(other_shape, [None] * 4, c) == [
        "highAvailability[0]: replicas do not have identical PE structures"
    ]


def test_unit_graph_colocation_pairs_key_groups():
    spec = topology({"peColocation": [["a", "b"]]}, key_groups=2)
    graph = unit_graph(spec)
    c = expand_constraints(spec, graph, CLUSTER)
    assert sorted(sorted(map(str, members)) for _, members in c.pe_colocation) == [
        ["('a', 0)", "('b', 0)"],
        ["('a', 1)", "('b', 1)"],
    ]
    groups = [[("src", 0), ("src", 1)], [("a", 0), ("b", 0)], [("a", 1), ("b", 1)], [("out", 0), ("out", 1)]]
    assert violations(groups, [None] * 4, c) == []
    swapped = [[("src", 0), ("src", 1)], [("a", 0), ("b", 1)], [("a", 1), ("b", 0)], [("out", 0), ("out", 1)]]
    assert len(violations(swapped, [None] * 4, c)) == 2


def test_isomorphic_replicas_pair_nodes_by_operator_not_by_spelling():
    """'a' and 'ab' sort differently once suffixed ('ab~r1' < 'a~r1'); pairing must not depend on it."""
    spec = load_topology(
        {
            "operators": [
                {"name": "src", "kind": "source", "source": {"generator": "sequence"}},
                {"name": "a", "kind": "map", "inputs": ["src"], "select": ["key"]},
                {"name": "ab", "kind": "map", "inputs": ["a"], "select": ["key"]},
                {"name": "out", "kind": "sink", "inputs": ["ab"], "sink": {"console": {}}},
            ],
            "constraints": {"highAvailability": [{"operators": ["a", "ab"], "replicas": 2}]},
        }
    ).spec
    graph = logical_graph(spec)
    (ha,) = expand_constraints(spec, graph, CLUSTER).high_availability
    assert ha.replicas == (("a", "ab"), ("a~r1", "ab~r1"))
