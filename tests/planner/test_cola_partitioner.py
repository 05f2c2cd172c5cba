"""COLA's minimum-ratio-cut partitioner against the exact sparsest cut (enumeration)."""

from __future__ import annotations

import networkx as nx
import numpy as np
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtopo.planner.placement.cola.exact_cut import exact_sparsest_cut
from streamtopo.planner.placement.cola.multicommodity import concurrent_flow_metric
from streamtopo.planner.placement.cola.options import ColaOptions
from streamtopo.planner.placement.cola.ratio_cut import min_ratio_cut, sparsity


@st.composite
def weighted_graphs(draw, min_nodes=3, max_nodes=12):
    n = draw(st.integers(min_nodes, max_nodes))
    seed = draw(st.integers(0, 10_000))
    rng = np.random.default_rng(seed)
    graph = nx.connected_watts_strogatz_graph(n, 2 if n < 5 else 4, 0.3, seed=seed)
    adj = sp.lil_matrix((n, n))
    for u, v in graph.edges:
        adj[u, v] = adj[v, u] = rng.uniform(0.05, 1.0)
    return sp.csr_matrix(adj), rng.uniform(0.05, 1.0, n)


def brute_sparsity(adj, w) -> float:
    """Ratio (2) minimised by plain Python enumeration (independent of exact_cut's bit tricks)."""
    n = len(w)
    dense = adj.toarray()
    best = np.inf
    for mask in range(1, 2 ** (n - 1)):
        side = [(mask >> i) & 1 == 1 for i in range(n)]
        cut = sum(dense[i, j] for i in range(n) for j in range(i + 1, n) if side[i] != side[j])
        lighter = min(sum(w[i] for i in range(n) if side[i]), sum(w[i] for i in range(n) if not side[i]))
        best = min(best, cut / lighter)
    return best


@settings(max_examples=20, deadline=None)
@given(weighted_graphs(max_nodes=9))
def test_exact_cut_matches_plain_enumeration(graph):
    adj, w = graph
    value, side = exact_sparsest_cut(adj, w)
    assert np.isclose(value, brute_sparsity(adj, w))
    assert np.isclose(sparsity(adj, w, side), value)


@settings(max_examples=25, deadline=None)
@given(weighted_graphs())
def test_leighton_rao_within_3x_of_exact_and_never_below(graph):
    adj, w = graph
    exact, _ = exact_sparsest_cut(adj, w)
    cut = min_ratio_cut(adj, w, ColaOptions(cut_methods=("lr",)))
    assert cut.method == "lr"
    assert sparsity(adj, w, cut.side) == cut.sparsity
    assert exact - 1e-9 <= cut.sparsity <= 3 * exact + 1e-9


@settings(max_examples=25, deadline=None)
@given(weighted_graphs())
def test_every_method_is_a_real_cut_no_sparser_than_exact(graph):
    adj, w = graph
    exact, _ = exact_sparsest_cut(adj, w)
    cut = min_ratio_cut(adj, w, ColaOptions(cut_methods=("lr", "spectral", "metis")))
    assert set(cut.by_method) == {"lr", "spectral", "metis"}
    assert 0 < cut.side.sum() < len(w)
    assert all(value >= exact - 1e-9 for value in cut.by_method.values())
    # The kept cut is the best method's, polished by moves that only ever lower the ratio.
    assert exact - 1e-9 <= cut.sparsity <= min(cut.by_method.values()) + 1e-12
    assert cut.sparsity == sparsity(adj, w, cut.side)
    # On small PEs the default enumerates: the optimum itself.
    assert np.isclose(min_ratio_cut(adj, w, ColaOptions()).sparsity, exact)


@settings(max_examples=15, deadline=None)
@given(weighted_graphs())
def test_flow_bounds_bracket_the_concurrent_flow(graph):
    """Weak duality: the routed concurrent flow lambda is at most the dual bound, and at most
    cut(S) / D(S) for every cut S (all demand crossing S uses its edges), here the exact sparsest."""
    adj, w = graph
    demand = np.outer(w, w)
    np.fill_diagonal(demand, 0)
    metric = concurrent_flow_metric(adj, demand, epsilon=0.2, max_steps=80)
    assert 0 < metric.primal <= metric.dual_bound * (1 + 1e-9)
    _, side = exact_sparsest_cut(adj, w)
    coo = sp.triu(adj, 1).tocoo()
    cut_weight = coo.data[side[coo.row] != side[coo.col]].sum()
    crossing = metric.demand_scale * w[side].sum() * w[~side].sum()
    assert metric.primal <= cut_weight / crossing * (1 + 1e-9)


def test_phase1_cut_separates_an_exlocated_pair():
    """A path a-b-c-d with a heavy middle: the sparsest cut keeps b, c together; the phase-1 demand
    between b and c must make the partitioner separate them anyway."""
    adj = sp.csr_matrix(np.array([[0, 1, 0, 0], [1, 0, 9, 0], [0, 9, 0, 1], [0, 0, 1, 0]], dtype=float))
    w = np.ones(4)
    plain = min_ratio_cut(adj, w, ColaOptions())
    assert plain.side[1] == plain.side[2]
    cut = min_ratio_cut(adj, w, ColaOptions(), separate=np.array([[1, 2]]))
    assert cut.side[1] != cut.side[2]


def test_disconnected_pe_splits_between_components_for_free():
    adj = sp.csr_matrix(np.array([[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 2], [0, 0, 2, 0]], dtype=float))
    cut = min_ratio_cut(adj, np.ones(4), ColaOptions())
    assert cut.sparsity == 0.0 and cut.side[0] == cut.side[1] and cut.side[2] == cut.side[3]
    assert cut.side[0] != cut.side[2]
