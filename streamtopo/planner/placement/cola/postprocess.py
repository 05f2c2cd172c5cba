"""COLA's post-processor (Section 2.2): greedy PE merges that keep the plan schedulable.

"It tentatively merges S_i and S_j ... If the resulting partitioning has a feasible host-assignment
... it marks this pair of PEs as mergeable. It then greedily merges that pair of mergeable PEs which
gives the maximum reduction in the total communication cost. This process is repeated until there are
no pairs that can be merged." Only PEs joined by an edge reduce the cost, so only those are tried,
in decreasing order of saving; the first mergeable one is the one the paper merges. The caller's
``accept(merged, current, schedule)`` decides mergeability (LPT feasibility for Basic COLA; a valid,
feasible schedule that does not worsen f(U, C) for Advanced COLA, see docs/cola.md).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import scipy.sparse as sp

from streamtopo.planner.placement.cola.partition import Partition
from streamtopo.planner.placement.cola.placement import Schedule


def inter_pe_weights(partition: Partition) -> dict[tuple[int, int], float]:
    """Communication between every pair of PEs joined by an edge (i < j)."""
    label = np.empty(partition.atoms.n, dtype=np.int64)
    for k, p in enumerate(partition.pes):
        label[p] = k
    coo = sp.triu(partition.atoms.adj, 1).tocoo()
    a, b = label[coo.row], label[coo.col]
    crossing = a != b
    count = len(partition.pes)
    pair = np.minimum(a, b)[crossing] * count + np.maximum(a, b)[crossing]
    keys, index = np.unique(pair, return_inverse=True)
    sums = np.bincount(index, weights=coo.data[crossing])
    return {(int(k) // count, int(k) % count): float(w) for k, w in zip(keys, sums)}


def postprocess(
    partition: Partition,
    schedule: Schedule,
    accept: Callable[[Partition, Partition, Schedule], Schedule | None],
    hopeless: Callable[[Schedule, float, float, float], bool] | None = None,
) -> tuple[Partition, Schedule, int]:
    """Merge greedily while some mergeable pair saves communication; returns the merge count.

    ``hopeless(schedule, cut, merged_size, saving)`` may rule a pair out before any scheduling
    (a necessary condition of ``accept`` that is cheap to check; ``cut`` is the current C).
    """
    merges = 0
    while True:
        weights = inter_pe_weights(partition)
        cut = sum(weights.values())
        for (i, j), saving in sorted(weights.items(), key=lambda item: (-item[1], item[0])):
            if hopeless is not None and hopeless(
                schedule, cut, partition.sizes[i] + partition.sizes[j] - 2 * saving, saving
            ):
                continue
            moves = partition.merge_moves(i, j)
            if moves is None:
                continue
            trial = partition.copy()
            trial.merge(moves)
            found = accept(trial, partition, schedule)
            if found is not None:
                partition, schedule = trial, found
                merges += 1
                break
        else:
            return partition, schedule, merges
