"""Leighton-Rao sparsest cut on a Garg-Koenemann approximate maximum concurrent multicommodity flow.

COLA's graph partitioner (Khandekar et al., Section 2.2) routes a demand of w_u * w_v between every
pair of operators through edges of capacity w_e, maximising the common fraction lambda that can be
routed (equivalently, minimising the maximum congestion). Sparse cuts are where the congestion is; the
LP dual is a metric d (edge lengths) minimising sum_e w_e d_e / sum_{u,v} w_u w_v d(u, v), and
Leighton and Rao [24] round that metric to a cut by growing balls around vertices.

Garg and Koenemann [25], maximum concurrent flow: start with lengths l_e = delta / c_e, and route
commodities along shortest paths; routing f on an edge multiplies its length by (1 + eps * f / c_e);
stop when D(l) = sum_e c_e l_e >= 1. Our variant, documented in docs/cola.md:
 * commodities with the same source are routed together on one shortest-path tree (as Fleischer and
   GK do for single-source groups), and all sources in the same step, on trees computed from the same
   lengths; each step routes sigma = min(1, min_e c_e / load_e) of the remaining demand so no edge
   exceeds its capacity within a step (GK's "bottleneck" rule applied to the trees);
 * the number of steps is capped (``max_steps``); eps sets delta = (1+eps) / ((1+eps) m)^(1/eps)
   exactly as in GK, so smaller eps means more steps before D(l) reaches 1;
 * demands are scaled so the first step's routing has congestion 1 (GK assume lambda* >= 1).
Every step's lengths give a dual bound D(l) / alpha(l) >= lambda*; the lengths with the smallest bound
are the metric handed to the rounding. The rounding sweeps the vertices in order of distance from each
source (every ball radius, which includes the radius Leighton-Rao's region growing picks) and keeps the
sparsest prefix by ratio (2).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import dijkstra


@dataclass(frozen=True)
class FlowMetric:
    """Result of the flow computation: the best dual metric and the bounds that certify it."""

    distances: np.ndarray
    """All-pairs shortest-path distances under the best lengths (n x n)."""
    lengths: np.ndarray
    dual_bound: float
    """min over steps of D(l) / alpha(l): an upper bound on the max concurrent flow lambda*."""
    primal: float
    """A routed concurrent flow value: a lower bound on lambda* (for the scaled demands)."""
    steps: int
    demand_scale: float
    """The factor the demands were multiplied by before routing (bounds refer to scaled demands)."""


def concurrent_flow_metric(
    adj: sp.csr_matrix, demand: np.ndarray, epsilon: float = 0.25, max_steps: int = 60
) -> FlowMetric:
    """Approximate max concurrent flow for ``demand`` (n x n, symmetric) on the capacitated graph ``adj``.

    The graph must be connected. Complexity per step: one all-pairs Dijkstra (scipy, in C) and
    O(n) vectorised numpy passes to push the demand up each shortest-path tree.
    """
    n = adj.shape[0]
    upper = sp.triu(adj, 1).tocoo()
    keep = upper.data > 0
    ei, ej, cap = upper.row[keep], upper.col[keep], upper.data[keep].astype(float)
    m = len(cap)
    edge_id = np.full((n, n), -1, dtype=np.int64)
    edge_id[ei, ej] = np.arange(m)
    edge_id[ej, ei] = np.arange(m)
    pairs = np.triu(demand, 1)
    delta = (1 + epsilon) / ((1 + epsilon) * m) ** (1 / epsilon)
    lengths = delta / cap

    # One CSR structure for all steps; only its data (the lengths) changes.
    graph = sp.csr_matrix((np.arange(1, m + 1, dtype=float), (ei, ej)), shape=(n, n))
    slot = graph.data.astype(np.int64) - 1

    def tree_loads(length: np.ndarray, remaining: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        graph.data = length[slot]
        dist, pred = dijkstra(graph, directed=False, return_predecessors=True)
        acc = _push_up_trees(pred, remaining)
        has_parent = pred >= 0
        src, dst = np.nonzero(has_parent)
        ids = edge_id[pred[src, dst], dst]
        return dist, np.bincount(ids, weights=acc[src, dst], minlength=m)

    dist, load = tree_loads(lengths, pairs)
    scale = 1.0 / max(float((load / cap).max()), 1e-300)
    pairs, load = pairs * scale, load * scale
    remaining = pairs.copy()
    routed = np.zeros(m)
    routed_fraction = 0.0
    best = (np.inf, dist, lengths.copy())
    steps = 0
    while steps < max_steps:
        if steps:
            dist, load = tree_loads(lengths, remaining)
        alpha = float((pairs * dist).sum())
        bound = float(cap @ lengths) / alpha if alpha > 0 else np.inf
        if bound < best[0]:
            best = (bound, dist, lengths.copy())
        if cap @ lengths >= 1.0:
            break
        congestion = load / cap
        sigma = min(1.0, 1.0 / max(float(congestion.max()), 1e-300))
        routed += sigma * load
        lengths = lengths * (1 + epsilon * sigma * congestion)
        routed_fraction += sigma * float(remaining.sum() / pairs.sum())
        # A completed phase starts over with the full demand (GK's phases).
        remaining = pairs.copy() if sigma >= 1.0 - 1e-12 else remaining * (1 - sigma)
        steps += 1
    max_congestion = float((routed / cap).max()) if steps else np.inf
    primal = routed_fraction / max_congestion if max_congestion > 0 else 0.0
    return FlowMetric(
        distances=best[1], lengths=best[2], dual_bound=best[0], primal=primal, steps=steps, demand_scale=scale
    )


def _push_up_trees(pred: np.ndarray, demand: np.ndarray) -> np.ndarray:
    """acc[s, v] = demand from s to the whole subtree of v in s's shortest-path tree.

    Trees are processed level by level (deepest first), all sources at once, so the number of numpy
    passes is the tree depth rather than the number of vertices.
    """
    n = pred.shape[0]
    rows = np.repeat(np.arange(n), n).reshape(n, n)
    has_parent = pred >= 0
    parent = np.where(has_parent, pred, rows)
    depth = np.zeros((n, n), dtype=np.int64)
    while True:
        deeper = np.where(has_parent, depth[rows, parent] + 1, 0)
        if np.array_equal(deeper, depth):
            break
        depth = deeper
    acc = demand.copy()
    flat = acc.ravel()
    for level in range(int(depth.max()), 0, -1):
        s, v = np.nonzero(depth == level)
        flat += np.bincount(s * n + parent[s, v], weights=acc[s, v], minlength=n * n)
    return acc


def leighton_rao_orders(metric: FlowMetric) -> np.ndarray:
    """Vertex orders to sweep: by distance from each source (one row per source)."""
    return np.argsort(metric.distances, axis=1, kind="stable")
