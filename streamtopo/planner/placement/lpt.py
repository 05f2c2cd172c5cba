"""Basic COLA's PE scheduler: Longest Processing Time first on related machines.

Khandekar et al., Section 3.1 ("PE scheduler"): take PEs in decreasing SIZE and give each to the host k
minimising (B'_k + SIZE) / B_k, where B'_k is the load already on host k and B_k its capacity. The
baselines (NONE, FINT, METIS) place with it too, so every algorithm is compared on the same scheduler.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def lpt_schedule(
    sizes: Sequence[float],
    capacity: Mapping[str, float],
    allowed: Sequence[frozenset[str] | None] | None = None,
) -> list[str] | None:
    """Host of each PE; ``allowed[i]`` restricts PE i (resource matching). None if a PE has no host."""
    load = dict.fromkeys(capacity, 0.0)
    hosts = [""] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        only = allowed[i] if allowed is not None else None
        candidates = [h for h in capacity if only is None or h in only]
        if not candidates:
            return None
        best = min(candidates, key=lambda h: ((load[h] + sizes[i]) / capacity[h], h))
        load[best] += sizes[i]
        hosts[i] = best
    return hosts
