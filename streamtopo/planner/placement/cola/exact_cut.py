"""The exact sparsest cut by enumeration, the reference the partitioner is measured against.

Enumerates all 2^(n-1) - 1 bipartitions (vertex 0 fixed on one side) in vectorised blocks and returns
the one minimising ratio (2). Practical up to n of about 22.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

EXACT_MAX_NODES = 22
BLOCK = 1 << 16


def exact_sparsest_cut(adj: sp.spmatrix, w: np.ndarray) -> tuple[float, np.ndarray]:
    """(minimum sparsity, side mask) over all bipartitions; ties go to the lowest mask."""
    n = adj.shape[0]
    if not 2 <= n <= EXACT_MAX_NODES:
        raise ValueError(f"exact sparsest cut needs 2..{EXACT_MAX_NODES} vertices, got {n}")
    coo = sp.triu(adj, 1).tocoo()
    rows, cols, data = coo.row.astype(np.int64), coo.col.astype(np.int64), coo.data
    total = float(w.sum())
    best, best_mask = np.inf, 1
    count = 1 << (n - 1)

    for start in range(1, count, BLOCK):
        masks = np.arange(start, min(start + BLOCK, count), dtype=np.int64) << 1
        member = (masks[:, None] >> np.arange(n)) & 1
        cut = (((masks[:, None] >> rows) ^ (masks[:, None] >> cols)) & 1) @ data
        left = member @ w
        lighter = np.minimum(left, total - left)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(
                lighter > 0, cut / np.where(lighter > 0, lighter, 1), np.where(cut > 0, np.inf, 0.0)
            )
        k = int(np.argmin(ratio))
        if ratio[k] < best:
            best, best_mask = float(ratio[k]), int(masks[k])

    side = ((best_mask >> np.arange(n)) & 1).astype(bool)
    return best, side
