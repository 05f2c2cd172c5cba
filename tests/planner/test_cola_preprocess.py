"""Lemma 1 (Khandekar et al., Section 2.2): the pre-processor's fusions never worsen the optimum.

Checked by exhaustive search over every partition of graphs with at most 7 operators and every
placement on two hosts, for two objectives: f(U, C) = U + C / B (Advanced COLA's weighted sum) and
Basic COLA's "minimum C subject to U <= 1".
"""

from __future__ import annotations

import math

import networkx as nx
from cola_reference import cut, min_max_utilization, set_partitions, size
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtopo.planner.placement.cola.preprocess import preprocess
from streamtopo.planner.placement.constraints import GraphConstraints

CAPACITY = {"h1": 2.0, "h2": 2.0}


@st.composite
def heavy_edge_graphs(draw):
    n = draw(st.integers(2, 7))
    graph = nx.DiGraph(name="logical")
    for i in range(n):
        graph.add_node(f"o{i}", w=draw(st.floats(0.0, 1.0)))
    for i in range(1, n):
        for j in draw(st.sets(st.integers(0, i - 1), min_size=1, max_size=2)):
            heavy = draw(st.booleans())
            graph.add_edge(f"o{j}", f"o{i}", w=draw(st.floats(1.0, 3.0) if heavy else st.floats(0.0, 0.4)))
    return graph


def optima(graph: nx.DiGraph, together: list[set]) -> tuple[float, float]:
    """(min f(U, C), min C with U <= 1) over partitions keeping each set of ``together`` in one block."""
    best_f, best_c = math.inf, math.inf
    for blocks in set_partitions(list(graph.nodes)):
        if any(len({i for i, b in enumerate(blocks) for n in b if n in s}) > 1 for s in together):
            continue
        u = min_max_utilization([size(graph, b) for b in blocks], CAPACITY)
        c = cut(graph, blocks)
        best_f = min(best_f, u + c / 2.0)
        if u <= 1.0 + 1e-12:
            best_c = min(best_c, c)
    return best_f, best_c


def lemma_holds(graph: nx.DiGraph, u: str, v: str) -> bool:
    """The condition of Lemma 1 on the original graph, written out from its statement."""
    e = sum(d["w"] for a, b, d in graph.edges(data=True) if {a, b} == {u, v})

    def rest(x: str) -> float:
        return graph.nodes[x]["w"] + sum(d["w"] for a, b, d in graph.edges(data=True) if x in (a, b)) - e

    return e >= min(rest(u), rest(v))


@settings(max_examples=20, deadline=None)
@given(heavy_edge_graphs())
def test_lemma1_fusions_keep_the_optimum(graph):
    atoms = preprocess(graph, GraphConstraints())
    free_f, free_c = optima(graph, [])
    fused_f, fused_c = optima(graph, [set(m) for m in atoms.members if len(m) > 1])
    assert math.isclose(fused_f, free_f, rel_tol=1e-9, abs_tol=1e-12)
    assert math.isclose(fused_c, free_c, rel_tol=1e-9, abs_tol=1e-12) or free_c == fused_c == math.inf
    if atoms.fusions:
        u, v = atoms.fusions[0]
        assert lemma_holds(graph, u, v)  # the first fusion is a Lemma 1 edge of the input graph
        pair_f, _ = optima(graph, [{u, v}])
        assert math.isclose(pair_f, free_f, rel_tol=1e-9, abs_tol=1e-12)


def test_preprocessor_fuses_every_qualifying_edge_of_a_chain():
    """a -(5)-> b -(0.1)-> c: w_ab = 5 >= w_a + 0 = 1, so a and b fuse; then b-c (0.1) does not qualify
    (0.1 < w_c = 1 and 0.1 < w_ab-super + 0 = 2)."""
    graph = nx.DiGraph(name="logical")
    graph.add_nodes_from(["a", "b", "c"], w=1.0)
    graph.add_edge("a", "b", w=5.0)
    graph.add_edge("b", "c", w=0.1)
    atoms = preprocess(graph, GraphConstraints())
    assert sorted(atoms.members) == [("a", "b"), ("c",)]
    assert atoms.w.tolist() == [2.0, 1.0]
    assert atoms.adj[0, 1] == 0.1


def test_constrained_operators_are_not_fused_by_lemma1():
    graph = nx.DiGraph(name="logical")
    graph.add_nodes_from(["a", "b"], w=1.0)
    graph.add_edge("a", "b", w=5.0)
    constraints = GraphConstraints(pe_exlocation=[("peExlocation[0]", (frozenset({"a"}), frozenset({"b"})))])
    assert preprocess(graph, constraints).n == 2
    colocated = GraphConstraints(pe_colocation=[("peColocation[0]", frozenset({"a", "b"}))])
    graph.edges["a", "b"]["w"] = 0.0
    assert preprocess(graph, colocated).members == [("a", "b")]
