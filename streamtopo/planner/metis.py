"""METIS k-way partitioning (through pymetis) for every planner that needs a balanced min-cut split.

COLA's bisection, the METIS fusion baseline, ALBIC's collocation sets (Algorithm 2 splits them with
METIS 5.1, as the paper did) and COLA re-optimisation all partition a graph with float CPU costs and
directed traffic. METIS wants an undirected CSR graph with integer weights; this module is the one
place that converts, so every caller gets the same scaling and the same determinism under a seed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pymetis
import scipy.sparse as sp

EDGE_RESOLUTION = 1_000_000
VERTEX_RESOLUTION = 100_000
"""Largest integer weight: floats are scaled so the heaviest maps here (and the lightest to >= 1)."""


def weight_matrix(n: int, edges: Iterable[tuple[int, int, float]]) -> sp.csr_matrix:
    """Sparse n x n matrix of summed weights from (i, j, w) triples (repeated pairs add up)."""
    rows, cols, data = [], [], []
    for i, j, w in edges:
        rows.append(i)
        cols.append(j)
        data.append(w)
    return sp.csr_matrix((data, (rows, cols)), shape=(n, n))


def metis_labels(
    adjacency: sp.spmatrix,
    parts: int,
    vertex_weights: Sequence[float] | np.ndarray | None = None,
    *,
    target_fractions: Sequence[float] | None = None,
    ufactor: int | None = None,
    seed: int = 0,
) -> np.ndarray:
    """Part label of every vertex: a k-way METIS partition minimising the cut, balanced by weight.

    ``adjacency`` may be directed: u->v and v->u weights add up into one undirected edge; self loops
    are dropped. ``target_fractions`` asks for parts of unequal weight (heterogeneous capacities);
    ``ufactor`` is METIS' imbalance tolerance in thousandths.

    METIS is never asked for more parts than vertices (it would print "Cannot bisect a graph with 0
    vertices" and "You are trying to partition a graph into too many parts" to the console): every
    vertex then gets a part of its own, the heaviest the part with the largest target.
    """
    n = adjacency.shape[0]
    if parts <= 1 or n <= 1:
        return np.zeros(n, dtype=np.int64)
    if parts > n:
        return _one_per_part(n, parts, vertex_weights, target_fractions)
    sym = sp.csr_matrix(adjacency + adjacency.T)
    sym.setdiag(0)
    sym.eliminate_zeros()
    top = float(sym.data.max()) if sym.nnz else 1.0
    edge = np.maximum(1, np.round(sym.data / top * EDGE_RESOLUTION)).astype(np.int64)
    kwargs: dict[str, Any] = {}
    if vertex_weights is not None:
        w = np.asarray(vertex_weights, dtype=float)
        kwargs["vweights"] = np.maximum(
            1, np.round(w / max(float(w.max()), 1e-300) * VERTEX_RESOLUTION)
        ).astype(np.int64)
    if target_fractions is not None:
        kwargs["tpwgts"] = list(target_fractions)
    options = {"seed": seed} | ({"ufactor": ufactor} if ufactor is not None else {})
    result = pymetis.part_graph(
        parts,
        adjacency=pymetis.CSRAdjacency(sym.indptr.astype(np.int64), sym.indices.astype(np.int64)),
        eweights=edge,
        options=pymetis.Options(**options),
        **kwargs,
    )
    return np.asarray(result.vertex_part, dtype=np.int64)


def _one_per_part(
    n: int,
    parts: int,
    vertex_weights: Sequence[float] | np.ndarray | None,
    target_fractions: Sequence[float] | None,
) -> np.ndarray:
    """Each of the n < parts vertices alone in a part: by weight, onto the parts by target size."""
    weights = np.ones(n) if vertex_weights is None else np.asarray(vertex_weights, dtype=float)
    targets = np.ones(parts) if target_fractions is None else np.asarray(target_fractions, dtype=float)
    by_target = sorted(range(parts), key=lambda p: (-targets[p], p))
    labels = np.zeros(n, dtype=np.int64)
    for rank, vertex in enumerate(sorted(range(n), key=lambda v: (-weights[v], v))):
        labels[vertex] = by_target[rank]
    return labels
