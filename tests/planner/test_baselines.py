"""Baselines (NONE, SINGLE, FINT, METIS) and the exact CP-SAT optimum, against independent references."""

from __future__ import annotations

from itertools import product

import networkx as nx
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from streamtopo.documents import load_topology
from streamtopo.planner.cluster import Cluster, Host
from streamtopo.planner.placement.baselines import BASELINES, fint_plan, metis_plan, none_plan, single_plan
from streamtopo.planner.placement.cola import ColaOptions
from streamtopo.planner.placement.constraints import GraphConstraints, HAGroup, violations
from streamtopo.planner.placement.exact import NoFeasiblePlan, capacity_units, exact_plan, units
from streamtopo.planner.placement.fusion import plan_topology


@st.composite
def layered_dags(draw, max_layers: int = 5, max_width: int = 4) -> nx.DiGraph:
    """A random layered DAG: every node of layer i > 0 reads from 1-2 nodes of layer i - 1."""
    graph = nx.DiGraph(name="logical")
    layers = []
    for depth in range(draw(st.integers(2, max_layers))):
        layer = [f"n{depth}_{i}" for i in range(draw(st.integers(1, max_width)))]
        for node in layer:
            graph.add_node(node, w=draw(st.floats(0.01, 1.0)))
            if layers:
                parents = draw(st.lists(st.sampled_from(layers[-1]), min_size=1, max_size=2, unique=True))
                for parent in parents:
                    graph.add_edge(parent, node, w=draw(st.floats(0.0, 0.5)))
        layers.append(layer)
    return graph


clusters = st.builds(lambda n, cpu: Cluster.uniform(n, cpu), st.integers(1, 4), st.floats(0.5, 4.0))


def size_by_hand(graph: nx.DiGraph, members) -> float:
    """SIZE(S) = w(S) + w(delta(S)), written out independently of plan.pe_size."""
    inside = set(members)
    total = sum(graph.nodes[n]["w"] for n in inside)
    for u, v, w in graph.edges(data="w"):
        if (u in inside) != (v in inside):
            total += w
    return total


def check_scores(graph: nx.DiGraph, cluster: Cluster, plan) -> None:
    members = [m for pe in plan.pes for m in pe.members]
    assert sorted(members) == sorted(graph.nodes), "every node in exactly one PE"
    pe_of = {m: pe.name for pe in plan.pes for m in pe.members}
    assert plan.communication_cost == pytest.approx(
        sum(w for u, v, w in graph.edges(data="w") if pe_of[u] != pe_of[v]), abs=1e-9
    )
    load = dict.fromkeys(cluster.capacity, 0.0)
    for pe in plan.pes:
        assert pe.host in cluster.capacity
        assert pe.size == pytest.approx(size_by_hand(graph, pe.members))
        load[pe.host] += pe.size
    assert plan.max_utilization == pytest.approx(max(load[h] / c for h, c in cluster.capacity.items()))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=layered_dags(), cluster=clusters, algorithm=st.sampled_from(sorted(BASELINES)))
def test_every_baseline_covers_each_node_once_and_scores_right(graph, cluster, algorithm):
    plan = BASELINES[algorithm](graph, cluster, GraphConstraints(), seed=1)
    assert plan.algorithm == algorithm
    check_scores(graph, cluster, plan)
    if algorithm == "none":
        assert all(len(pe.members) == 1 for pe in plan.pes)
    if algorithm == "single":
        assert len(plan.pes) == 1 and plan.communication_cost == 0


@settings(max_examples=25, deadline=None)
@given(graph=layered_dags(), cluster=clusters, gamma=st.sampled_from([0.5, 0.8, 1.0]))
def test_fint_fuses_within_the_size_limit_until_no_adjacent_pair_fits(graph, cluster, gamma):
    plan = fint_plan(graph, cluster, GraphConstraints(), gamma=gamma)
    limit = gamma * max(cluster.capacity.values())
    for pe in plan.pes:
        if len(pe.members) > 1:
            assert size_by_hand(graph, pe.members) <= limit + 1e-9
    # greedy termination: no two adjacent PEs can still be fused within the limit
    pe_of = {m: pe for pe in plan.pes for m in pe.members}
    for u, v in graph.edges:
        a, b = pe_of[u], pe_of[v]
        if a is not b:
            assert size_by_hand(graph, [*a.members, *b.members]) > limit - 1e-9


def test_fint_fuses_the_heaviest_stream_first():
    # chain a -> b -> c, by hand: SIZE(a, b) = 0.4 + 0.1 + 0.2 (b->c cut) = 0.7,
    # SIZE(b, c) = 0.1 + 0.3 + 0.3 (a->b cut) = 0.7, SIZE(a, b, c) = 0.8. With a limit of 0.75 either pair
    # fits but not all three; a->b saves 0.3 > 0.2, so FINT fuses a with b and leaves c alone.
    graph = nx.DiGraph(name="logical")
    graph.add_nodes_from([("a", {"w": 0.4}), ("b", {"w": 0.1}), ("c", {"w": 0.3})])
    graph.add_edge("a", "b", w=0.3)
    graph.add_edge("b", "c", w=0.2)
    plan = fint_plan(graph, Cluster.uniform(2, 0.75), GraphConstraints())
    assert sorted(sorted(pe.members) for pe in plan.pes) == [["a", "b"], ["c"]]


@settings(max_examples=20, deadline=None)
@given(graph=layered_dags(), cluster=clusters)
def test_metis_is_feasible_whenever_none_is(graph, cluster):
    none = none_plan(graph, cluster)
    metis = metis_plan(graph, cluster, seed=3)
    check_scores(graph, cluster, metis)
    if none.feasible:
        assert metis.feasible


def test_metis_picks_the_smallest_feasible_k():
    # two heavy cliques joined by a light arc: one host cannot hold both, two hosts can hold one each
    graph = nx.DiGraph(name="logical")
    for side in "xy":
        graph.add_nodes_from((f"{side}{i}" for i in range(3)), w=0.3)
        graph.add_edges_from(
            ((f"{side}{i}", f"{side}{j}") for i in range(3) for j in range(3) if i < j), w=0.2
        )
    graph.add_edge("x2", "y0", w=0.01)
    plan = metis_plan(graph, Cluster.uniform(2, 1.0))
    assert plan.details["k"] == 2 and plan.feasible
    assert sorted(sorted(pe.members) for pe in plan.pes) == [["x0", "x1", "x2"], ["y0", "y1", "y2"]]


def labelled_cluster() -> Cluster:
    return Cluster(hosts=[Host(name="plain", cpu=4.0), Host(name="gpu", cpu=1.0, labels={"gpu": "yes"})])


def test_resource_matching_is_honoured_where_possible():
    graph = nx.DiGraph(name="logical")
    graph.add_nodes_from(["a", "b", "c"], w=0.2)
    graph.add_edges_from([("a", "b"), ("b", "c")], w=0.05)
    constraints = GraphConstraints(allowed_hosts={"b": frozenset({"gpu"})})
    cluster = labelled_cluster()
    for algorithm, planner in BASELINES.items():
        plan = planner(graph, cluster, constraints)
        assert plan.host_of()["b"] == "gpu", algorithm
        assert plan.valid, algorithm


def test_unmatched_resources_are_reported_not_hidden():
    graph = nx.DiGraph(name="logical")
    graph.add_nodes_from(["a", "b"], w=0.2)
    graph.add_edge("a", "b", w=0.05)
    constraints = GraphConstraints(allowed_hosts={"a": frozenset({"gpu"}), "b": frozenset({"plain"})})
    plan = single_plan(graph, labelled_cluster(), constraints)
    assert not plan.valid
    assert any("requires.nodeSelector" in v for v in plan.violations)


def test_fint_respects_pe_level_constraints():
    graph = nx.DiGraph(name="logical")
    graph.add_nodes_from(["a", "b", "c", "d"], w=0.1)
    graph.add_edges_from([("a", "b"), ("b", "c"), ("c", "d")], w=0.3)
    constraints = GraphConstraints(
        pe_exlocation=[("peExlocation[0]", (frozenset({"b"}), frozenset({"c"})))],
        pe_colocation=[("peColocation[0]", frozenset({"a", "d"}))],
    )
    plan = fint_plan(graph, Cluster.uniform(1, 10.0), constraints)
    assert plan.valid, plan.violations
    pe_of = plan.pe_of()
    assert pe_of["a"] == pe_of["d"] and pe_of["b"] != pe_of["c"]


# ------------------------------------------------------------------------------------ plan_topology


def heavy_spec(cpu: float):
    return load_topology(
        {
            "metadata": {"name": "t"},
            "spec": {
                "keyGroups": 4,
                "operators": [
                    {
                        "name": "src",
                        "kind": "source",
                        "source": {"generator": "trades"},
                        "cost": {"cpu": 0.5},
                    },
                    {
                        "name": "agg",
                        "kind": "aggregate",
                        "inputs": ["src"],
                        "keyBy": ["symbol"],
                        "aggregations": ["count(*) AS n"],
                        "cost": {"cpu": cpu},
                    },
                    {
                        "name": "out",
                        "kind": "sink",
                        "inputs": ["agg"],
                        "sink": {"console": {}},
                        "cost": {"cpu": 0.1},
                    },
                ],
            },
        }
    ).spec


def test_auto_graph_is_logical_while_every_operator_fits_the_smallest_host():
    cluster = Cluster(hosts=[Host(name="big", cpu=8.0), Host(name="small", cpu=2.0)])
    assert plan_topology(heavy_spec(2.0), cluster, "none").graph_kind == "logical"
    # 3 cores do not fit on the 2-core host: the operator is split into its 4 key groups
    plan = plan_topology(heavy_spec(3.0), cluster, "none")
    assert plan.graph_kind == "unit"
    assert len(plan.pes) == 3 * 4
    assert plan_topology(heavy_spec(3.0), cluster, "none", graph_kind="logical").graph_kind == "logical"


def test_unknown_algorithm_is_refused():
    with pytest.raises(ValueError, match="unknown fusion algorithm"):
        plan_topology(heavy_spec(1.0), Cluster.uniform(2, 4.0), "greedy")


# ------------------------------------------------------------------------------- exact vs brute force


def set_partitions(items: list):
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for partition in set_partitions(rest):
        for i in range(len(partition)):
            yield [*partition[:i], [first, *partition[i]], *partition[i + 1 :]]
        yield [[first], *partition]


def brute_force(
    graph: nx.DiGraph, cluster: Cluster, constraints: GraphConstraints, options: ColaOptions
) -> float | None:
    """min f(U, C) over every partition and every host assignment, U <= 1 and no violation. Fitting is
    judged at the exact planner's resolution (micro-cores, loads rounded up: exact.units), so an arc of
    5e-9 cores cannot decide it either way."""
    best = None
    hosts = list(cluster.capacity)
    micro = nx.DiGraph()
    micro.add_nodes_from((n, {"w": units(w)}) for n, w in graph.nodes(data="w"))
    micro.add_edges_from((u, v, {"w": units(w)}) for u, v, w in graph.edges(data="w"))
    for groups in set_partitions(list(graph.nodes)):
        sizes = [size_by_hand(graph, g) for g in groups]
        sizes_micro = [size_by_hand(micro, g) for g in groups]
        cut = sum(w for u, v, w in graph.edges(data="w") if not any(u in g and v in g for g in groups))
        for assignment in product(hosts, repeat=len(groups)):
            load = dict.fromkeys(hosts, 0.0)
            load_micro = dict.fromkeys(hosts, 0)
            for size, size_micro, host in zip(sizes, sizes_micro, assignment):
                load[host] += size
                load_micro[host] += size_micro
            utilization = max(load[h] / cluster.capacity[h] for h in hosts)
            fits = all(load_micro[h] <= capacity_units(cluster.capacity[h]) for h in hosts)
            if not fits or violations(groups, list(assignment), constraints):
                continue
            value = options.objective(utilization, cut, cluster.capacity)
            best = value if best is None else min(best, value)
    return best


@st.composite
def tiny_instances(draw):
    graph = draw(layered_dags(max_layers=3, max_width=2))
    cpu = draw(st.floats(0.4, 2.0))
    return graph, Cluster(hosts=[Host(name="h1", cpu=cpu), Host(name="h2", cpu=draw(st.floats(0.4, 2.0)))])


@settings(max_examples=20, deadline=None)
@given(instance=tiny_instances(), weights=st.sampled_from([(1.0, 1.0), (1.0, 0.2), (0.3, 2.0)]))
def test_exact_agrees_with_brute_force(instance, weights):
    graph, cluster = instance
    note(f"nodes {list(graph.nodes(data='w'))} arcs {list(graph.edges(data='w'))}")
    options = ColaOptions(utilization_weight=weights[0], communication_weight=weights[1])
    expected = brute_force(graph, cluster, GraphConstraints(), options)
    if expected is None:
        with pytest.raises(NoFeasiblePlan):
            exact_plan(graph, cluster, options=options, time_limit=20)
        return
    plan = exact_plan(graph, cluster, options=options, time_limit=20)
    assert plan.feasible and plan.details["optimal"]
    assert options.objective(
        plan.max_utilization, plan.communication_cost, cluster.capacity
    ) == pytest.approx(expected, abs=1e-4)


def test_exact_with_pe_and_host_constraints_agrees_with_brute_force():
    graph = nx.DiGraph(name="logical")
    for name, w in zip("abcdef", [0.3, 0.2, 0.25, 0.2, 0.3, 0.1]):
        graph.add_node(name, w=w)
    graph.add_edges_from(
        [
            ("a", "b", {"w": 0.2}),
            ("b", "c", {"w": 0.15}),
            ("a", "d", {"w": 0.1}),
            ("d", "e", {"w": 0.2}),
            ("c", "f", {"w": 0.05}),
            ("e", "f", {"w": 0.1}),
        ]
    )
    cluster = Cluster(hosts=[Host(name="h1", cpu=1.2), Host(name="h2", cpu=1.0)])
    constraints = GraphConstraints(
        pe_exlocation=[("peExlocation[0]", (frozenset({"a"}), frozenset({"b"})))],
        host_exlocation=[("hostExlocation[0]", (frozenset({"c"}), frozenset({"e"})))],
        pe_colocation=[("peColocation[0]", frozenset({"d", "e"}))],
        allowed_hosts={"f": frozenset({"h2"})},
        high_availability=[HAGroup(replicas=(("b",), ("d",)), isomorphic=False, name="highAvailability[0]")],
    )
    options = ColaOptions()
    expected = brute_force(graph, cluster, constraints, options)
    assert expected is not None
    plan = exact_plan(graph, cluster, constraints)
    assert plan.valid, plan.violations
    assert options.objective(
        plan.max_utilization, plan.communication_cost, cluster.capacity
    ) == pytest.approx(expected, abs=1e-4)


def test_exact_with_isomorphic_replicas_and_dedication_agrees_with_brute_force():
    # src feeds two replicas (a, b) and (a~r1, b~r1) of one sub-graph; sink is PE-dedicated
    graph = nx.DiGraph(name="logical")
    for name, w in [("src", 0.3), ("a", 0.2), ("b", 0.3), ("a~r1", 0.2), ("b~r1", 0.3), ("sink", 0.1)]:
        graph.add_node(name, w=w)
    graph.add_edges_from(
        [
            ("src", "a", {"w": 0.1}),
            ("src", "a~r1", {"w": 0.1}),
            ("a", "b", {"w": 0.25}),
            ("a~r1", "b~r1", {"w": 0.25}),
            ("b", "sink", {"w": 0.05}),
            ("b~r1", "sink", {"w": 0.05}),
        ]
    )
    cluster = Cluster(hosts=[Host(name="h1", cpu=1.0), Host(name="h2", cpu=1.0)])
    constraints = GraphConstraints(
        high_availability=[
            HAGroup(replicas=(("a", "b"), ("a~r1", "b~r1")), isomorphic=True, name="highAvailability[0]")
        ],
        pe_dedication=[("peDedication[0]", frozenset({"sink"}))],
    )
    options = ColaOptions(utilization_weight=1.0, communication_weight=2.0)
    expected = brute_force(graph, cluster, constraints, options)
    assert expected is not None
    plan = exact_plan(graph, cluster, constraints, options)
    assert plan.valid, plan.violations
    assert options.objective(
        plan.max_utilization, plan.communication_cost, cluster.capacity
    ) == pytest.approx(expected, abs=1e-4)
