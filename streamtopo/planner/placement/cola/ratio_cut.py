"""COLA's graph partitioner: split a PE by a minimum-ratio (sparsest) cut.

Khandekar et al., Section 2.2, ratio (2): sparsity(S1) = w(delta(S1)) / min{w(S1), w(S2)}. Several
methods propose cuts and the sparsest wins; each method's sparsity is returned so benchmarks can
report them separately:
 * ``exact``: enumeration of every bipartition, on PEs of at most ``exact_max_nodes`` super operators
   (cheaper than the flow there, and optimal; not in the paper, which needs an approximation because
   the problem is NP-hard in general); the other methods are then skipped;
 * ``lr``: Leighton-Rao rounding of the Garg-Koenemann flow metric (multicommodity.py), the paper's
   method; used while the PE has at most ``gk_max_nodes`` super operators;
 * ``spectral``: sweep over the Fiedler vector of L x = mu W x (W = diag of operator weights), the
   continuous relaxation of the same ratio; used up to ``spectral_max_nodes``;
 * ``metis``: a pymetis bisection balanced by operator weight.
A disconnected PE is split between its components (sparsity 0, the most balanced grouping).

Phase 1 of Advanced COLA adds demand between PE-exlocated pairs (Section 3.3, graph partitioner): the
flow routes it, and every sweep scores a prefix by cut / (min{w(S1), w(S2)} + W * separated pairs),
so a cut that separates an exlocated pair beats any cut that does not. If no method separates one,
a sweep from one member of the pair by flow distance guarantees it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.linalg
import scipy.sparse as sp
import scipy.sparse.linalg
from scipy.sparse.csgraph import connected_components, dijkstra

from streamtopo.planner.metis import metis_labels
from streamtopo.planner.placement.cola.exact_cut import exact_sparsest_cut
from streamtopo.planner.placement.cola.multicommodity import concurrent_flow_metric, leighton_rao_orders
from streamtopo.planner.placement.cola.options import ColaOptions

DENSE_EIGEN_MAX = 120


@dataclass(frozen=True)
class Cut:
    """A bipartition of a PE's super operators: ``side[i]`` is True for S1."""

    side: np.ndarray
    sparsity: float
    method: str
    by_method: dict[str, float] = field(default_factory=dict)
    """Sparsity (ratio (2)) of every method's best cut on this split."""


def sparsity(adj: sp.spmatrix, w: np.ndarray, side: np.ndarray) -> float:
    """Ratio (2): cut weight over the lighter side's operator weight (inf for an empty side)."""
    side = np.asarray(side, dtype=bool)
    lighter = min(w[side].sum(), w[~side].sum())
    if side.all() or not side.any():
        return np.inf
    coo = sp.triu(adj, 1).tocoo()
    cut = coo.data[side[coo.row] != side[coo.col]].sum()
    return float(cut / lighter) if lighter > 0 else (0.0 if cut == 0 else np.inf)


class Sweeper:
    """Scores every prefix of a vertex order in O(n + m) with difference arrays."""

    def __init__(self, adj: sp.spmatrix, w: np.ndarray, separate: np.ndarray | None = None):
        coo = sp.triu(adj, 1).tocoo()
        self.n = adj.shape[0]
        self.rows, self.cols, self.data = coo.row, coo.col, coo.data
        self.w = w
        self.total = float(w.sum())
        self.separate = separate if separate is not None and len(separate) else None
        self.bonus = max(self.total, 1e-12)

    def _interval_sum(self, rank: np.ndarray, a: np.ndarray, b: np.ndarray, weight: np.ndarray) -> np.ndarray:
        """For prefix sizes k = 1..n-1: total weight of pairs with exactly one end in the prefix."""
        ra, rb = rank[a], rank[b]
        lo, hi = np.minimum(ra, rb), np.maximum(ra, rb)
        diff = np.zeros(self.n + 1)
        np.add.at(diff, lo + 1, weight)
        np.add.at(diff, hi + 1, -weight)
        return np.cumsum(diff)[1 : self.n]

    def scores(self, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(score, plain sparsity) of prefixes of sizes 1..n-1."""
        rank = np.empty(self.n, dtype=np.int64)
        rank[order] = np.arange(self.n)
        cut = self._interval_sum(rank, self.rows, self.cols, self.data)
        left = np.cumsum(self.w[order])[:-1]
        lighter = np.minimum(left, self.total - left)
        with np.errstate(divide="ignore", invalid="ignore"):
            plain = np.where(
                lighter > 0, cut / np.where(lighter > 0, lighter, 1), np.where(cut > 0, np.inf, 0.0)
            )
            if self.separate is None:
                return plain, plain
            split = self._interval_sum(
                rank, self.separate[:, 0], self.separate[:, 1], np.ones(len(self.separate))
            )
            denominator = lighter + self.bonus * split
            score = np.where(
                denominator > 0,
                cut / np.where(denominator > 0, denominator, 1),
                np.where(cut > 0, np.inf, 0.0),
            )
        return score, plain

    def best(self, order: np.ndarray) -> tuple[float, np.ndarray]:
        """Best prefix of ``order``: (score, side mask); ties go to the more balanced prefix."""
        score, _ = self.scores(order)
        left = np.cumsum(self.w[order])[:-1]
        balance = -np.minimum(left, self.total - left)
        k = int(np.lexsort((balance, score))[0])
        side = np.zeros(self.n, dtype=bool)
        side[order[: k + 1]] = True
        return float(score[k]), side

    def score_of(self, side: np.ndarray) -> float:
        """The sweep score of an arbitrary bipartition (for METIS' answer)."""
        order = np.concatenate([np.flatnonzero(side), np.flatnonzero(~side)])
        k = int(side.sum())
        if k in (0, self.n):
            return np.inf
        return float(self.scores(order)[0][k - 1])


def min_ratio_cut(
    adj: sp.csr_matrix,
    w: np.ndarray,
    options: ColaOptions,
    separate: np.ndarray | None = None,
    seed: int = 0,
) -> Cut:
    """Split a PE (n >= 2 super operators) by the sparsest cut the enabled methods find.

    ``separate`` (k x 2 local indices) are the phase-1 pairs to encourage apart.
    """
    n = adj.shape[0]
    w = np.asarray(w, dtype=float)
    adj = sp.csr_matrix(adj)
    adj.eliminate_zeros()  # zero-cost streams connect nothing: cutting them is free
    count, labels = connected_components(adj, directed=False)
    if count > 1:
        side = _group_components(labels, count, w, separate)
        return Cut(side=side, sparsity=0.0, method="components", by_method={"components": 0.0})
    # Zero-weight operators would make ratio (2) undefined; a tiny weight keeps ties balanced.
    w_eff = w + 1e-9 * max(float(w.sum()), 1.0) / n
    sweeper = Sweeper(adj, w_eff, separate)
    candidates: dict[str, tuple[float, np.ndarray]] = {}
    if "exact" in options.cut_methods and n <= options.exact_max_nodes and separate is None:
        _, side = exact_sparsest_cut(adj, w_eff)
        return Cut(
            side=side,
            sparsity=sparsity(adj, w, side),
            method="exact",
            by_method={"exact": sparsity(adj, w, side)},
        )
    if "lr" in options.cut_methods and n <= options.gk_max_nodes:
        candidates["lr"] = lr_cut(adj, w_eff, sweeper, options, separate)
    if "spectral" in options.cut_methods and n <= options.spectral_max_nodes:
        order = fiedler_order(adj, w_eff, seed)
        if order is not None:
            candidates["spectral"] = sweeper.best(order)
    if "metis" in options.cut_methods or not candidates:
        side = metis_bisection(adj, w_eff, seed)
        candidates["metis"] = (sweeper.score_of(side), side)
    if separate is not None and len(separate):
        candidates = _ensure_separation(adj, sweeper, separate, candidates)
    method = min(candidates, key=lambda k: (candidates[k][0], list(candidates).index(k)))
    by_method = {k: sparsity(adj, w, side) for k, (_, side) in candidates.items()}
    side = candidates[method][1]
    if options.refine and separate is None:
        side = refine(adj, w_eff, side)
    return Cut(side=side, sparsity=sparsity(adj, w, side), method=method, by_method=by_method)


def refine(adj: sp.csr_matrix, w: np.ndarray, side: np.ndarray, max_moves: int | None = None) -> np.ndarray:
    """Greedy single-vertex moves while one lowers ratio (2) (a Fiduccia-Mattheyses-style polish).

    Gains of all moves are computed at once: moving v changes the cut by (edges of v to its own side)
    - (edges of v to the other side), and moves w_v between the sides.
    """
    side = side.copy()
    max_moves = max_moves if max_moves is not None else max(10, len(w) // 4)
    total = float(w.sum())
    degree = np.asarray(adj.sum(axis=1)).ravel()
    current = sparsity(adj, w, side)
    for _ in range(max_moves):
        to_first = adj @ side.astype(float)
        own = np.where(side, to_first, degree - to_first)
        cut = float((adj @ (~side).astype(float))[side].sum())
        new_cut = cut + own - (degree - own)
        first = w[side].sum()
        new_first = np.where(side, first - w, first + w)
        lighter = np.minimum(new_first, total - new_first)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(lighter > 0, new_cut / np.where(lighter > 0, lighter, 1), np.inf)
        count = int(side.sum())
        ratio[side if count == 1 else np.zeros_like(side)] = np.inf  # never empty a side
        ratio[~side if count == len(side) - 1 else np.zeros_like(side)] = np.inf
        v = int(np.argmin(ratio))
        if not ratio[v] < current * (1 - 1e-12):
            break
        side[v] = ~side[v]
        current = float(ratio[v])
    return side


def lr_cut(
    adj: sp.csr_matrix,
    w: np.ndarray,
    sweeper: Sweeper,
    options: ColaOptions,
    separate: np.ndarray | None = None,
) -> tuple[float, np.ndarray]:
    """Leighton-Rao: sweep balls of the GK metric around every vertex; keep the best prefix."""
    demand = np.outer(w, w)
    if separate is not None and len(separate):
        extra = demand.sum()
        demand[separate[:, 0], separate[:, 1]] += extra
        demand[separate[:, 1], separate[:, 0]] += extra
    np.fill_diagonal(demand, 0.0)
    metric = concurrent_flow_metric(adj, demand, options.epsilon, options.gk_max_steps)
    best: tuple[float, np.ndarray] | None = None
    for order in leighton_rao_orders(metric):
        found = sweeper.best(order)
        if best is None or found[0] < best[0]:
            best = found
    assert best is not None  # one sweep order per vertex
    return best


def fiedler_order(adj: sp.csr_matrix, w: np.ndarray, seed: int = 0) -> np.ndarray | None:
    """Order of the vertices along the second generalised eigenvector of (L, diag(w)).

    Solved as the symmetric problem M y = mu y with M = W^-1/2 L W^-1/2, x = W^-1/2 y: dense LAPACK
    for small PEs; above ``DENSE_EIGEN_MAX`` block inverse iteration with Rayleigh-Ritz on one sparse
    LU factorisation, orthogonal to M's known null vector W^1/2 1. (ARPACK's shift-invert mode gave
    different vectors from run to run on the degenerate spectra of unit graphs, which broke
    determinism.) None if the iteration does not settle (the other methods then decide the split).
    """
    n = adj.shape[0]
    degree = np.asarray(adj.sum(axis=1)).ravel()
    scale = sp.diags(1.0 / np.sqrt(w))
    matrix = scale @ (sp.diags(degree) - adj) @ scale
    if n <= DENSE_EIGEN_MAX:
        _, vectors = scipy.linalg.eigh(matrix.toarray(), subset_by_index=[1, 1], driver="evr")
        return np.argsort(vectors[:, 0] / np.sqrt(w), kind="stable")
    vector = _inverse_iteration(matrix.tocsc(), np.sqrt(w), seed)
    return None if vector is None else np.argsort(vector / np.sqrt(w), kind="stable")


def _inverse_iteration(
    matrix: sp.csc_matrix,
    null: np.ndarray,
    seed: int,
    block: int = 4,
    iterations: int = 60,
    tolerance: float = 1e-7,
) -> np.ndarray | None:
    """The eigenvector of the smallest non-zero eigenvalue of a PSD matrix whose null vector is known."""
    n = matrix.shape[0]
    null = null / np.linalg.norm(null)
    shift = 1e-3 * float(matrix.diagonal().mean())
    solve = scipy.sparse.linalg.splu(matrix + shift * sp.identity(n, format="csc")).solve
    x = np.random.default_rng(seed).standard_normal((n, block))
    previous = np.inf
    for _ in range(iterations):
        x -= np.outer(null, null @ x)
        x, _ = np.linalg.qr(solve(x))
        x -= np.outer(null, null @ x)
        x, _ = np.linalg.qr(x)
        values, ritz = np.linalg.eigh(x.T @ (matrix @ x))
        x = x @ ritz
        if abs(values[0] - previous) <= tolerance * max(abs(values[0]), 1e-300):
            return np.asarray(x[:, 0])
        previous = values[0]
    residual = np.linalg.norm(matrix @ x[:, 0] - values[0] * x[:, 0])
    return np.asarray(x[:, 0]) if residual <= 1e-3 * max(float(abs(matrix).max()), 1e-300) else None


def metis_bisection(adj: sp.csr_matrix, w: np.ndarray, seed: int = 0) -> np.ndarray:
    """pymetis 2-way partition balanced by operator weight."""
    side: np.ndarray = metis_labels(adj, 2, w, seed=seed) == 0
    if side.all() or not side.any():
        side = np.zeros(len(w), dtype=bool)
        side[int(np.argmax(w))] = True
    return side


def _group_components(
    labels: np.ndarray, count: int, w: np.ndarray, separate: np.ndarray | None
) -> np.ndarray:
    """Whole components onto two sides, heaviest first onto the lighter side; an exlocated pair that
    straddles components starts on opposite sides."""
    weight = np.bincount(labels, weights=w, minlength=count)
    side_of = np.full(count, -1)
    load = [0.0, 0.0]
    for a, b in separate if separate is not None else ():
        if labels[a] != labels[b]:
            side_of[labels[a]], side_of[labels[b]] = 0, 1
            load = [weight[labels[a]], weight[labels[b]]]
            break
    for c in np.argsort(-weight, kind="stable"):
        if side_of[c] < 0:
            s = 0 if load[0] <= load[1] else 1
            side_of[c] = s
            load[s] += weight[c]
    if (side_of == 0).all():
        side_of[int(np.argmin(weight))] = 1
    side: np.ndarray = side_of[labels] == 0
    return side


def _ensure_separation(
    adj: sp.csr_matrix,
    sweeper: Sweeper,
    separate: np.ndarray,
    candidates: dict[str, tuple[float, np.ndarray]],
) -> dict[str, tuple[float, np.ndarray]]:
    """Add a cut that surely separates the first exlocated pair if no candidate separates any pair."""

    def separates(side: np.ndarray) -> bool:
        return bool((side[separate[:, 0]] != side[separate[:, 1]]).any())

    if any(separates(side) for _, side in candidates.values()):
        return {k: v for k, v in candidates.items() if separates(v[1])}
    a, b = separate[0]
    coo = sp.triu(adj, 1).tocoo()
    length = sp.csr_matrix((1.0 / coo.data, (coo.row, coo.col)), shape=adj.shape)
    dist = dijkstra(length, directed=False, indices=a)
    order = np.argsort(dist, kind="stable")
    score, _ = sweeper.scores(order)
    rank_b = int(np.flatnonzero(order == b)[0])
    k = int(np.argmin(score[:rank_b]))  # prefixes of sizes 1..rank_b hold a but not b
    side = np.zeros(adj.shape[0], dtype=bool)
    side[order[: k + 1]] = True
    return {"separating": (float(score[k]), side)}
