"""COLA's oracle: which PE to split next.

Basic COLA and phases 2-4 of Advanced COLA (Sections 2.2, 3.3): "the PE with more than one operator
which has the largest size". Phase 1: any PE that fails a PE exlocation constraint (the choice is
otherwise irrelevant). Phase 2 first takes a PE whose operators share no allowed host (resource
matching), which no schedule can make valid; see docs/cola.md.
"""

from __future__ import annotations

from streamtopo.planner.placement.cola.partition import Partition


def largest(partition: Partition) -> int | None:
    """The largest PE with more than one super operator (ties: the first)."""
    candidates = partition.splittable()
    if not candidates:
        return None
    return max(candidates, key=lambda i: (partition.sizes[i], -i))


def exlocation_violator(partition: Partition) -> int | None:
    """Phase 1: a PE holding both sides of a separation requirement."""
    return next((i for i in partition.splittable() if partition.violated_separations(i)), None)


def phase2(partition: Partition) -> int | None:
    """Phase 2: a PE without any allowed host first, else the largest."""
    unmatched = [i for i in partition.splittable() if partition.allowed(i) == frozenset()]
    return unmatched[0] if unmatched else largest(partition)
