"""COLA's refinement (streamtopo/planner/placement/cola/refine.py): single-operator FM moves between PEs."""

from __future__ import annotations

import networkx as nx
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtopo.planner.cluster import Cluster
from streamtopo.planner.placement.cola import ColaOptions, cola_plan
from streamtopo.planner.placement.cola.partition import Partition, restate
from streamtopo.planner.placement.cola.placement import Schedule
from streamtopo.planner.placement.cola.preprocess import preprocess
from streamtopo.planner.placement.cola.refine import refine_moves
from streamtopo.planner.placement.constraints import GraphConstraints


def score_from_scratch(
    graph: nx.DiGraph,
    groups: list[list],
    hosts: list[str],
    capacity: dict[str, float],
    weights: tuple[float, float],
) -> tuple[float, float, float]:
    """(objective, U, C) by equation (1) on the node graph, independent of COLA's atom arrays."""
    pe = {v: i for i, g in enumerate(groups) for v in g}
    load = dict.fromkeys(capacity, 0.0)
    for i, g in enumerate(groups):
        size = sum(graph.nodes[v]["w"] for v in g)
        size += sum(d["w"] for u, v, d in graph.edges(data=True) if (pe[u] == i) != (pe[v] == i))
        load[hosts[i]] += size
    u = max(load[h] / capacity[h] for h in capacity)
    c = sum(d["w"] for a, b, d in graph.edges(data=True) if pe[a] != pe[b])
    mean = sum(capacity.values()) / len(capacity)
    return weights[0] * u + weights[1] * c / mean, u, c


def chain_partition():
    """src -> t -> a -> p -> k with a feed (src) cut off from its chain t, a."""
    graph = nx.DiGraph()
    for v, w in {"src": 1.0, "t": 0.3, "a": 0.3, "p": 0.2, "k": 0.5}.items():
        graph.add_node(v, w=w)
    for u, v, w in [("src", "t", 0.4), ("t", "a", 0.4), ("a", "p", 0.01), ("p", "k", 0.3)]:
        graph.add_edge(u, v, w=w)
    atoms = preprocess(graph, GraphConstraints(), lemma1=False)
    cons = restate(atoms, GraphConstraints())
    pes = [np.array([atoms.atom_of["src"]]), np.array([atoms.atom_of[v] for v in "tapk"])]
    return graph, Partition(atoms, cons, pes)


def test_a_two_operator_chain_follows_its_feed():
    # Cut-only objective (Basic COLA's), hosts of 2 cores. By hand: moving t alone changes the cut by
    # 0.4 - 0.4 = 0 (no single move helps: a alone +0.41, p +0.31, k +0.3, src to the chain's PE
    # needs 1.0 + 0.3 + 0.3 + 0.2 + 0.5 = 2.3 > 2 cores). Moving t, then a, leaves only a -> p (0.01)
    # cut, the smallest arc, and the feed's PE holds 1.6 + 0.01 <= 2 cores: the optimum.
    graph, partition = chain_partition()
    capacity = {"h0": 2.0, "h1": 2.0}
    start = Schedule(["h0", "h1"], partition.placement_problem(capacity).utilization(["h0", "h1"]), "lpt")
    refined, found, moves = refine_moves(partition, start, capacity, (0.0, 1.0))
    groups = sorted(sorted(g) for g in refined.node_groups())
    assert groups == [["a", "src", "t"], ["k", "p"]]
    assert moves == 2
    _, u, c = score_from_scratch(graph, refined.node_groups(), found.hosts, capacity, (0.0, 1.0))
    assert abs(c - 0.01) < 1e-12 and abs(found.utilization - u) < 1e-9 and u <= 1.0


@st.composite
def weighted_dags(draw):
    n = draw(st.integers(3, 9))
    graph = nx.DiGraph()
    for v in range(n):
        graph.add_node(f"n{v}", w=draw(st.floats(0.05, 1.0)))
    for v in range(1, n):
        for u in draw(st.sets(st.integers(0, v - 1), min_size=1, max_size=2)):
            graph.add_edge(f"n{u}", f"n{v}", w=draw(st.floats(0.0, 0.6)))
    labels = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    weights = draw(st.sampled_from([(1.0, 1.0), (0.0, 1.0), (1.0, 0.2)]))
    return graph, labels, weights


@settings(max_examples=40, deadline=None)
@given(weighted_dags())
def test_refinement_never_worsens_the_objective_and_keeps_hosts_within_capacity(case):
    graph, labels, weights = case
    atoms = preprocess(graph, GraphConstraints(), lemma1=False)
    cons = restate(atoms, GraphConstraints())
    pes = [np.array([atoms.atom_of[f"n{v}"] for v in range(len(labels)) if labels[v] == k]) for k in range(3)]
    partition = Partition(atoms, cons, [p for p in pes if len(p)])
    hosts = [f"h{k % 2}" for k in range(len(partition.pes))]
    total = sum(partition.sizes)
    capacity = {"h0": max(total, 0.1), "h1": max(total, 0.1)}  # any placement fits
    before, _, _ = score_from_scratch(graph, partition.node_groups(), hosts, capacity, weights)
    start = Schedule(hosts, partition.placement_problem(capacity).utilization(hosts), "lpt")
    refined, found, _ = refine_moves(partition, start, capacity, weights)
    after, u, _ = score_from_scratch(graph, refined.node_groups(), found.hosts, capacity, weights)
    assert sorted(v for g in refined.node_groups() for v in g) == sorted(graph.nodes)
    assert after <= before + 1e-9
    assert u <= 1.0 + 1e-9 and abs(found.utilization - u) < 1e-9


@settings(max_examples=25, deadline=None)
@given(weighted_dags(), st.integers(1, 3))
def test_cola_with_refinement_is_never_worse_than_without(case, hosts):
    graph, _, _ = case
    cluster = Cluster.uniform(hosts, max(1.0, sum(w for _, w in graph.nodes(data="w")) / hosts * 1.3))
    options = ColaOptions()
    for advanced in (True, False):
        on = cola_plan(graph, cluster, options=ColaOptions(advanced=advanced), seed=0)
        off = cola_plan(graph, cluster, options=ColaOptions(advanced=advanced, refine_moves=False), seed=0)
        if not off.feasible:
            continue
        assert on.feasible
        if advanced:
            f_on = options.objective(on.max_utilization, on.communication_cost, on.capacity)
            f_off = options.objective(off.max_utilization, off.communication_cost, off.capacity)
            assert f_on <= f_off + 1e-9
        else:
            assert on.communication_cost <= off.communication_cost + 1e-9
