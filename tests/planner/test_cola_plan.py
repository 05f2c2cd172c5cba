"""Advanced and Basic COLA end to end: coverage, constraints, "no valid plan", isomorphic HA, profiling."""

from __future__ import annotations

from itertools import product

import networkx as nx
import pytest
from cola_reference import set_partitions
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtopo.documents import load_topology
from streamtopo.planner.cluster import Cluster, Host
from streamtopo.planner.graph import logical_graph, operator_of, unit_graph
from streamtopo.planner.placement.cola import (
    ColaOptions,
    NoValidPlan,
    cola_plan,
    gamma_schedule,
    profile_iterations,
)
from streamtopo.planner.placement.cola.profiling import MeasuredCosts
from streamtopo.planner.placement.constraints import GraphConstraints, HAGroup, expand_constraints, violations

NAMES = ["a", "b", "c", "d", "e"]


@st.composite
def instances(draw, max_nodes: int = 5):
    """A small weighted DAG, a labelled cluster and random constraints of every kind."""
    n = draw(st.integers(2, max_nodes))
    nodes = NAMES[:n]
    graph = nx.DiGraph(name="logical")
    for v in nodes:
        graph.add_node(v, w=draw(st.floats(0.05, 1.0)))
    for i in range(1, n):
        for j in draw(st.sets(st.integers(0, i - 1), min_size=1, max_size=2)):
            graph.add_edge(nodes[j], nodes[i], w=draw(st.floats(0.0, 0.5)))
    hosts = draw(st.integers(1, 3))
    cluster = Cluster(
        hosts=[
            Host(
                name=f"h{k}",
                cpu=draw(st.sampled_from([1.0, 2.0, 4.0])),
                labels={"zone": draw(st.sampled_from(["x", "y"]))},
            )
            for k in range(hosts)
        ]
    )
    host_names = [h.name for h in cluster.hosts]

    def pairs(label: str) -> list:
        out = []
        for i in range(draw(st.integers(0, 1))):
            u, v = draw(st.lists(st.sampled_from(nodes), min_size=2, max_size=2, unique=True))
            out.append((f"{label}[{i}]", u, v))
        return out

    def dedicated(candidates: list) -> set:
        return draw(st.sets(st.sampled_from(candidates), max_size=1)) if candidates else set()

    free = list(nodes)
    ha = []
    if n >= 2 and draw(st.booleans()):
        k = draw(st.integers(1, n // 2))
        chosen = draw(st.permutations(nodes))[: 2 * k]
        ha.append(
            HAGroup(
                replicas=(tuple(sorted(chosen[:k])), tuple(sorted(chosen[k:]))),
                isomorphic=draw(st.booleans()),
                name="highAvailability[0]",
            )
        )
        free = [v for v in nodes if v not in chosen]
    constraints = GraphConstraints(
        pe_colocation=[(label, frozenset({u, v})) for label, u, v in pairs("peColocation")],
        host_colocation=[(label, frozenset({u, v})) for label, u, v in pairs("hostColocation")],
        pe_exlocation=[(label, (frozenset({u}), frozenset({v}))) for label, u, v in pairs("peExlocation")],
        host_exlocation=[
            (label, (frozenset({u}), frozenset({v}))) for label, u, v in pairs("hostExlocation")
        ],
        allowed_hosts={
            v: frozenset(draw(st.sets(st.sampled_from(host_names), max_size=len(host_names))))
            for v in draw(st.sets(st.sampled_from(nodes), max_size=2))
        },
        high_availability=ha,
        pe_dedication=[("peDedication[0]", frozenset({v})) for v in dedicated(free)],
        host_dedication=[("hostDedication[0]", frozenset({v})) for v in dedicated(free)],
    )
    return graph, cluster, constraints


def some_valid_plan_exists(graph, cluster, constraints) -> bool:
    """Exhaustive: any partition and any host assignment the shared checker accepts."""
    hosts = [h.name for h in cluster.hosts]
    for blocks in set_partitions(list(graph.nodes)):
        if violations(blocks, [None] * len(blocks), constraints):
            continue  # PE-level constraints already fail; no placement can fix them
        for assign in product(hosts, repeat=len(blocks)):
            if not violations(blocks, list(assign), constraints):
                return True
    return False


def assert_covers_once(plan, graph):
    members = [m for pe in plan.pes for m in pe.members]
    assert sorted(members, key=str) == sorted(graph.nodes, key=str)


@settings(max_examples=40, deadline=None)
@given(instances())
def test_plans_cover_every_node_once_and_meet_every_constraint(instance):
    graph, cluster, constraints = instance
    exists = some_valid_plan_exists(graph, cluster, constraints)
    try:
        plan = cola_plan(graph, cluster, constraints, seed=1)
    except NoValidPlan as error:
        assert not exists, f"COLA said no valid plan, brute force found one: {error}"
        assert error.reasons and all(isinstance(r, str) and r for r in error.reasons)
        return
    assert exists
    assert_covers_once(plan, graph)
    assert plan.valid, plan.violations
    assert not violations([pe.members for pe in plan.pes], [pe.host for pe in plan.pes], constraints)
    # Loads add up to the PE sizes on each host, and U is the largest utilisation.
    for host in plan.capacity:
        assert plan.load[host] == pytest.approx(sum(pe.size for pe in plan.pes if pe.host == host))
    assert plan.max_utilization == pytest.approx(max(plan.load[h] / c for h, c in plan.capacity.items()))


@settings(max_examples=15, deadline=None)
@given(instances(max_nodes=5))
def test_basic_cola_covers_and_fits_when_singletons_fit(instance):
    graph, cluster, _ = instance
    plan = cola_plan(graph, cluster, options=ColaOptions(advanced=False))
    assert_covers_once(plan, graph)
    # Basic COLA stops at the first LPT-feasible partition; if even LPT on singletons fails it may
    # be infeasible, otherwise it must be feasible (it splits down to singletons at worst).
    from streamtopo.planner.placement.lpt import lpt_schedule
    from streamtopo.planner.plan import pe_size

    sizes = [pe_size(graph, [v]) for v in graph.nodes]
    hosts = lpt_schedule(sizes, cluster.capacity)
    load = {h: sum(s for s, x in zip(sizes, hosts) if x == h) for h in cluster.capacity}
    if all(load[h] <= cluster.capacity[h] for h in load):
        assert plan.feasible


HA_TOPOLOGY = {
    "metadata": {"name": "ha"},
    "spec": {
        "keyGroups": 4,
        "operators": [
            {"name": "src", "kind": "source", "source": {"generator": "trades", "ratePerSecond": 40000}},
            {"name": "clean", "kind": "filter", "inputs": ["src"], "expr": "price > 0"},
            {"name": "score", "kind": "map", "inputs": ["clean"], "keyBy": ["symbol"], "select": ["symbol"]},
            {
                "name": "total",
                "kind": "aggregate",
                "inputs": ["score"],
                "keyBy": ["symbol"],
                "aggregations": ["count(*) AS n"],
            },
            {"name": "out", "kind": "sink", "inputs": ["total"], "sink": {"console": {}}},
        ],
        "constraints": {
            "highAvailability": [{"operators": ["score", "total"], "replicas": 3, "isomorphic": True}]
        },
    },
}


@pytest.mark.parametrize("build", [logical_graph, unit_graph])
def test_isomorphic_ha_replicas_get_identical_pe_structures_on_disjoint_hosts(build):
    spec = load_topology(HA_TOPOLOGY).spec
    graph = build(spec)
    cluster = Cluster.uniform(4, cpu=1.0)
    plan = cola_plan(graph, cluster, expand_constraints(spec, graph, cluster))
    assert plan.valid and plan.feasible
    replica_of = {n: graph.nodes[n]["replica"] for n in graph.nodes if operator_of(n) in ("score", "total")}

    def key(node):  # the node's identity inside its replica: operator and key group
        return operator_of(node), node[1] if isinstance(node, tuple) else 0

    structures, hosts = {}, {}
    for pe in plan.pes:
        replicas = {replica_of.get(m) for m in pe.members}
        if replicas == {None}:
            continue
        assert len(replicas) == 1, "a PE mixes replicas (or a replica with other operators)"
        r = replicas.pop()
        structures.setdefault(r, set()).add(frozenset(key(m) for m in pe.members))
        hosts.setdefault(r, set()).add(pe.host)
    assert len(structures) == 3
    assert structures[0] == structures[1] == structures[2]
    assert not (hosts[0] & hosts[1] or hosts[0] & hosts[2] or hosts[1] & hosts[2])


def test_no_valid_plan_names_the_constraint():
    graph = nx.DiGraph(name="logical")
    graph.add_nodes_from("abc", w=0.1)
    graph.add_edges_from([("a", "b"), ("b", "c")], w=0.01)
    constraints = GraphConstraints(
        host_exlocation=[("hostExlocation[0]", tuple(frozenset(x) for x in "abc"))]
    )
    with pytest.raises(NoValidPlan, match=r"hostExlocation\[0\] needs 3 hosts, the cluster has 2"):
        cola_plan(graph, Cluster.uniform(2, cpu=1.0), constraints)
    selectors = GraphConstraints(
        allowed_hosts={"a": frozenset({"host-1"}), "b": frozenset({"host-1"})},
        host_exlocation=[("hostExlocation[0]", (frozenset("a"), frozenset("b")))],
    )
    with pytest.raises(NoValidPlan, match=r"hostExlocation\[0\].*requires\.nodeSelector"):
        cola_plan(graph, Cluster.uniform(3, cpu=1.0), selectors)


def test_infeasible_but_valid_plan_is_returned_with_feasible_false():
    graph = nx.DiGraph(name="logical")
    graph.add_node("big", w=5.0)
    graph.add_node("small", w=0.1)
    graph.add_edge("big", "small", w=0.01)
    plan = cola_plan(graph, Cluster.uniform(2, cpu=1.0))
    assert plan.valid and not plan.feasible
    assert plan.max_utilization == pytest.approx(5.01)  # "big" alone with its outgoing stream


SYMMETRIC_TOPOLOGY = {
    "metadata": {"name": "symmetric"},
    "spec": {
        "keyGroups": 40,
        "operators": [
            {"name": "src", "kind": "source", "source": {"generator": "trades", "ratePerSecond": 80000}},
            {
                "name": "by-symbol",
                "kind": "map",
                "inputs": ["src"],
                "keyBy": ["symbol"],
                "select": ["symbol"],
            },
            {
                "name": "total",
                "kind": "aggregate",
                "inputs": ["by-symbol"],
                "keyBy": ["symbol"],
                "aggregations": ["count(*) AS n"],
            },
            {
                "name": "by-venue",
                "kind": "map",
                "inputs": ["total"],
                "keyBy": ["n"],
                "select": ["n", "n AS venue"],
            },
            {"name": "out", "kind": "sink", "inputs": ["by-venue"], "sink": {"console": {}}},
        ],
    },
}


def test_plans_are_deterministic_under_a_seed():
    """A 200-unit graph whose key groups are interchangeable: many cuts tie, and the sparse
    eigen-solver path (> 120 super operators) runs; the same seed must give the same plan."""
    spec = load_topology(SYMMETRIC_TOPOLOGY).spec
    graph = unit_graph(spec)
    assert graph.number_of_nodes() == 200
    cluster = Cluster.uniform(5, cpu=1.0)
    first = cola_plan(graph, cluster, seed=3)
    assert first.feasible and first.details["cut_methods"].get("spectral")
    assert cola_plan(graph, cluster, seed=3).to_dict() == first.to_dict()


def test_phase4_never_returns_a_worse_objective_than_phase3():
    """T = 0 stops at the first feasible plan (phase 3); any T > 0 may only improve f(U, C)."""
    graph = nx.gnm_random_graph(24, 50, seed=5, directed=True)
    dag = nx.DiGraph(name="logical")
    dag.add_nodes_from((f"o{v}" for v in graph.nodes), w=0.3)
    dag.add_edges_from(((f"o{u}", f"o{v}") for u, v in graph.edges if u < v), w=0.05)
    cluster = Cluster.uniform(4, cpu=2.5)
    plain = ColaOptions(threshold=0.0, postprocess=False)
    deeper = ColaOptions(threshold=1.0, postprocess=False)
    f0 = cola_plan(dag, cluster, options=plain).details["objective"]
    f1 = cola_plan(dag, cluster, options=deeper).details["objective"]
    assert f1 <= f0 + 1e-12


def test_profiling_iterations_raise_gamma_and_replan_from_measurements():
    spec = load_topology(HA_TOPOLOGY).spec
    graph = logical_graph(spec)
    cluster = Cluster.uniform(4, cpu=1.0)
    constraints = expand_constraints(spec, graph, cluster)
    seen = []

    def measure(plan):
        seen.append(plan)
        return MeasuredCosts(operators={v: graph.nodes[v]["w"] * 1.1 for v in graph.nodes})

    runs = profile_iterations(graph, cluster, constraints, measure=measure)
    assert gamma_schedule() == [0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    assert [r.gamma for r in runs] == [None, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    assert runs[0].plan.algorithm == "none" and len(runs[0].plan.pes) == graph.number_of_nodes()
    assert seen == [r.plan for r in runs[:-1]]  # each run's profile feeds the next plan
    for run in runs[1:]:
        assert run.graph.nodes["src"]["w"] == pytest.approx(graph.nodes["src"]["w"] * 1.1)
        assert run.plan.valid
        if run.plan.details.get("phase") != "infeasible":
            # The planner saw gamma * B: every host's load fits in that share of its capacity.
            assert all(run.plan.load[h] <= run.gamma * c + 1e-9 for h, c in run.plan.capacity.items())


CONSTRAINED_TOPOLOGY = {
    "metadata": {"name": "constrained"},
    "spec": {
        "keyGroups": 2,
        "operators": [
            {"name": "src", "kind": "source", "source": {"generator": "trades", "ratePerSecond": 20000}},
            {"name": "clean", "kind": "filter", "inputs": ["src"], "expr": "price > 0"},
            {"name": "score", "kind": "map", "inputs": ["clean"], "keyBy": ["symbol"], "select": ["symbol"]},
            {
                "name": "total",
                "kind": "aggregate",
                "inputs": ["score"],
                "keyBy": ["symbol"],
                "aggregations": ["count(*) AS n"],
                "requires": {"nodeSelector": {"disk": "ssd"}},
            },
            {"name": "side", "kind": "map", "inputs": ["clean"], "select": ["price"]},
            {"name": "out", "kind": "sink", "inputs": ["total"], "sink": {"console": {}}},
            {"name": "out2", "kind": "sink", "inputs": ["side"], "sink": {"console": {}}},
        ],
        "constraints": {
            "peColocation": [["side", "out2"]],
            "hostColocation": [["src", "out2"]],
            "peExlocation": [["src", "clean"]],
            "hostExlocation": [["side", "total"]],
            "highAvailability": [{"operators": ["score", "total"], "replicas": 2, "isomorphic": True}],
            "peDedication": ["total"],
            "hostDedication": ["out"],
        },
    },
}


@pytest.mark.parametrize("build", [logical_graph, unit_graph])
def test_every_constraint_kind_of_a_spec_holds(build):
    """All six kinds plus dedication, through the spec path (expand_constraints), on both graphs."""
    spec = load_topology(CONSTRAINED_TOPOLOGY).spec
    graph = build(spec)
    cluster = Cluster(
        hosts=[Host(name=f"h{i}", cpu=0.5, labels={"disk": "ssd"} if i < 3 else {}) for i in range(5)]
    )
    plan = cola_plan(graph, cluster, expand_constraints(spec, graph, cluster))
    assert_covers_once(plan, graph)
    assert plan.valid, plan.violations
    pe_of, host_of = plan.pe_of(), plan.host_of()
    nodes = {
        op: [n for n in graph.nodes if operator_of(n) == op and graph.nodes[n]["replica"] == 0]
        for op in ("src", "clean", "side", "out", "out2", "total")
    }

    def kg(node) -> int:
        return node[1] if isinstance(node, tuple) else 0

    # Written out independently of the shared checker (colocation pairs key group i with key group i):
    assert all(pe_of[a] == pe_of[b] for a in nodes["side"] for b in nodes["out2"] if kg(a) == kg(b))
    assert all(host_of[a] == host_of[b] for a in nodes["src"] for b in nodes["out2"] if kg(a) == kg(b))
    assert not {pe_of[n] for n in nodes["src"]} & {pe_of[n] for n in nodes["clean"]}
    assert not {host_of[n] for n in nodes["side"]} & {host_of[n] for n in nodes["total"]}
    total_all = [n for n in graph.nodes if operator_of(n) == "total"]
    assert all(host_of[n] in {"h0", "h1", "h2"} for n in total_all)
    assert all(
        operator_of(m) == "total" for pe in plan.pes if set(pe.members) & set(total_all) for m in pe.members
    )
    out_hosts = {host_of[n] for n in nodes["out"]}
    assert all(operator_of(m) == "out" for pe in plan.pes if pe.host in out_hosts for m in pe.members)
