"""Operator moves between PEs after the post-processor (a Fiduccia-Mattheyses-style refinement).

The paper's post-processor (Section 2.2) "partly corrects for the possibly less than perfect ordering
of the graph partitioning iterations" by merging whole PEs. A top-down sparsest cut can also put a
single super operator on the wrong side of a split (e.g. a feed cut off from its heavy fan-out), which
no merge of whole PEs repairs without overloading a host. This step moves single super operators
between PEs by Fiduccia-Mattheyses passes on f(U, C) with the placement held fixed, every host
within capacity throughout; a pass keeps only its best prefix, so f never rises. Not in the paper;
see docs/cola.md.

Moving super operator v from PE A to PE B with the placement fixed changes (conn(v, X) = weight of
v's edges into PE X, deg(v) = all its edges):
    C       by conn(v, A) - conn(v, B)
    SIZE(A) by -w_v - deg(v) + 2 conn(v, A)      SIZE(B) by w_v + deg(v) - 2 conn(v, B)
and no other PE's SIZE (an edge from v to a third PE is cut either way). Only super operators named by
no constraint move, and only between PEs outside HA replicas and dedications, so validity holds
(resource matching, colocation and exlocation sets, HA and dedication are untouched).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import scipy.sparse as sp

from streamtopo.planner.placement.cola.partition import AtomConstraints, Partition
from streamtopo.planner.placement.cola.placement import Schedule

FEASIBLE = 1.0 + 1e-9
"""U at most this counts as feasible (U <= 1 up to rounding); shared by Basic and Advanced COLA."""


def constrained_atoms(cons: AtomConstraints, n: int, restricted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(fixed, special): atoms named by any constraint, and atoms of HA replicas or dedications (PEs
    holding those may neither gain nor lose members)."""
    special = np.zeros(n, dtype=bool)
    for ha in cons.high_availability:
        for replica in ha.replicas:
            special[list(replica)] = True
    for _, members, _ in cons.dedicated:
        special[members] = True
    fixed = special | restricted
    for _, a, b in cons.separations:
        fixed |= a | b
    for _, members in cons.host_colocation:
        fixed[members] = True
    for _, sets in cons.host_exlocation:
        for s in sets:
            fixed[s] = True
    return fixed, special


def refine_moves(
    partition: Partition,
    schedule: Schedule,
    capacity: Mapping[str, float],
    weights: tuple[float, float],
    passes: int = 8,
    pass_length: int | None = None,
) -> tuple[Partition, Schedule, int]:
    """Fiduccia-Mattheyses passes of single-operator moves on w_U U + w_C C / mean B, U <= 1 throughout.

    A pass repeatedly applies the best move of an operator not yet moved in the pass, even one that
    raises the objective (so two-operator chains, e.g. a filter and its aggregate, can follow their
    feed), then rolls back to the best prefix; passes repeat while one improves. At most ``passes``
    passes of ``pass_length`` moves (default min(n, 100)) bound the time.

    ``weights`` = (w_U, w_C): Advanced COLA's f(U, C); Basic COLA passes (0, 1), its objective (ii)
    (the cut) under feasibility (i).

    Returns the new partition, its (fixed-placement) schedule and the number of moves kept. Each step
    scores every (operator, target PE) pair at once; ties go to the lowest operator, then PE index, so
    the result is deterministic.
    """
    atoms = partition.atoms
    n, k = atoms.n, len(partition.pes)
    if k < 2 or schedule.utilization > FEASIBLE:
        return partition, schedule, 0
    fixed, special = constrained_atoms(partition.cons, n, atoms.restricted)
    label = np.empty(n, dtype=np.int64)
    for i, p in enumerate(partition.pes):
        label[p] = i
    closed = np.array([special[p].any() for p in partition.pes])  # PEs that keep their members
    movable = ~fixed & ~closed[label]
    if not movable.any():
        return partition, schedule, 0
    hosts = sorted(capacity)
    host_index = {h: j for j, h in enumerate(hosts)}
    cap = np.array([capacity[h] for h in hosts])
    pe_host = np.array([host_index[h] for h in schedule.hosts])
    sizes = np.array(partition.sizes, dtype=float)
    load = np.bincount(pe_host, weights=sizes, minlength=len(hosts))
    adj = sp.csr_matrix(atoms.adj)
    conn = np.asarray((adj @ sp.csr_matrix((np.ones(n), (np.arange(n), label)), shape=(n, k))).todense())
    w, deg = atoms.w, atoms.deg
    mean = float(cap.mean())
    wu, wc = weights
    rows = np.arange(n)
    cut = float(partition.cut())

    def score() -> float:
        return wu * float((load / cap).max()) + wc * cut / mean

    def move(v: int, b: int) -> None:
        nonlocal cut
        a = label[v]
        d_a = -w[v] - deg[v] + 2 * conn[v, a]
        d_b = w[v] + deg[v] - 2 * conn[v, b]
        cut += conn[v, a] - conn[v, b]
        load[pe_host[a]] += d_a
        load[pe_host[b]] += d_b
        sizes[a] += d_a
        sizes[b] += d_b
        column = adj[v].toarray().ravel()
        conn[:, a] -= column
        conn[:, b] += column
        label[v] = b

    moves = 0
    length = pass_length if pass_length is not None else min(n, 100)
    best = score()
    for _ in range(passes):
        locked = ~movable.copy()
        trail: list[tuple[int, int]] = []  # (operator, PE it came from)
        best_at = 0
        for _ in range(length):
            # Candidates: unlocked operators on a PE boundary (an interior operator's move cuts all
            # its edges), or every unlocked one when U has weight (a move may then lower U).
            free = ~locked & ((conn[rows, label] < deg - 1e-15) | (wu > 0))
            candidates = np.flatnonzero(free)
            if not len(candidates):
                break
            gain = _gains(
                load,
                cap,
                pe_host,
                label[candidates],
                conn[candidates],
                w[candidates],
                deg[candidates],
                wu,
                wc,
                mean,
            )
            gain[:, closed] = np.inf
            gain[np.arange(len(candidates)), label[candidates]] = np.inf
            j, b = np.unravel_index(int(np.argmin(gain)), gain.shape)
            if not np.isfinite(gain[j, b]):
                break
            v = candidates[j]
            trail.append((int(v), int(label[v])))
            move(int(v), int(b))
            locked[v] = True
            now = score()
            if now < best - 1e-12:
                best, best_at = now, len(trail)
        for v, a in reversed(trail[best_at:]):  # roll back to the best prefix of the pass
            move(v, a)
        moves += best_at
        if best_at == 0:
            break
    if not moves:
        return partition, schedule, 0
    keep = [i for i in range(k) if (label == i).any()]
    refined = Partition(atoms, partition.cons, [np.flatnonzero(label == i) for i in keep])
    placed = [hosts[pe_host[i]] for i in keep]
    final_load = np.bincount(pe_host[keep], weights=np.array(refined.sizes), minlength=len(hosts))
    return refined, Schedule(placed, float((final_load / cap).max()), schedule.method), moves


def _gains(
    load: np.ndarray,
    cap: np.ndarray,
    pe_host: np.ndarray,
    label: np.ndarray,
    conn: np.ndarray,
    w: np.ndarray,
    deg: np.ndarray,
    wu: float,
    wc: float,
    mean: float,
) -> np.ndarray:
    """Change of w_U U + w_C C / mean for every (operator, target PE); inf where U would exceed 1."""
    n = len(label)
    utilization = load / cap
    ha, hb = pe_host[label][:, None], pe_host[None, :]  # (n, 1), (1, k)
    own = conn[np.arange(n), label][:, None]
    d_a = (-w - deg)[:, None] + 2 * own  # SIZE(A) change, (n, 1)
    d_b = (w + deg)[:, None] - 2 * conn  # SIZE(B) change, (n, k)
    same = ha == hb
    new_a = np.where(same, (load[ha] + d_a + d_b) / cap[ha], (load[ha] + d_a) / cap[ha])
    new_b = np.where(same, new_a, (load[hb] + d_b) / cap[hb])
    new_u = np.maximum(_max_excluding(utilization, ha, hb), np.maximum(new_a, new_b))
    gain: np.ndarray = wu * (new_u - utilization.max()) + wc * (own - conn) / mean
    gain[new_u > FEASIBLE] = np.inf
    return gain


def _max_excluding(utilization: np.ndarray, ha: np.ndarray, hb: np.ndarray) -> np.ndarray:
    """max of ``utilization`` over hosts other than ha and hb (broadcast), from its top three."""
    order = np.argsort(-utilization, kind="stable")
    top = list(order[:3]) + [-1] * (3 - min(3, len(order)))
    values = [utilization[t] if t >= 0 else 0.0 for t in top]
    out = np.full(np.broadcast(ha, hb).shape, 0.0)
    chosen = np.zeros_like(out, dtype=bool)
    for t, value in zip(top, values):
        if t < 0:
            break
        hit = ~chosen & (ha != t) & (hb != t)
        out[hit] = value
        chosen |= hit
    return out
