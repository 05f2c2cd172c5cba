"""The PE placement problem COLA's schedulers solve: PE sizes, host capacities, and the host-level
constraints expressed over PEs (R_p, =_HC and HE of Section 3.3)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class PlacementProblem:
    """Everything the scheduler needs, indexed by PE."""

    sizes: list[float]
    capacity: Mapping[str, float]
    allowed: list[frozenset[str] | None]
    """R_p: hosts PE p may use (None = any)."""
    colocated: list[list[int]] = field(default_factory=list)
    """Host-colocation classes (=_HC) with at least two PEs."""
    exlocated: list[tuple[frozenset[int], frozenset[int]]] = field(default_factory=list)
    """HE as bicliques: every PE of the first set must be on another host than every PE of the second
    (host exlocation, HA replicas, host dedication). A PE in both sets makes the problem invalid."""

    def conflicts(self) -> dict[int, set[int]]:
        """PE -> PEs it may not share a host with (a PE listed as its own enemy is invalid)."""
        out: dict[int, set[int]] = {}
        for a, b in self.exlocated:
            for p in a:
                out.setdefault(p, set()).update(b)
            for q in b:
                out.setdefault(q, set()).update(a)
        return out

    @property
    def constrained(self) -> bool:
        """Anything beyond plain capacity: resource matching, host colocation or exlocation."""
        return bool(self.colocated or self.exlocated or any(a is not None for a in self.allowed))

    @property
    def count(self) -> int:
        return len(self.sizes)

    def lower_bound(self) -> float:
        """No schedule beats the average utilisation, nor the largest PE on its best host."""
        average = sum(self.sizes) / sum(self.capacity.values())
        alone = max(
            (
                s / max(b for h, b in self.capacity.items() if a is None or h in a)
                for s, a in zip(self.sizes, self.allowed)
                if a is None or a
            ),
            default=0.0,
        )
        return max(average, alone)

    def utilization(self, hosts: Sequence[str]) -> float:
        load = dict.fromkeys(self.capacity, 0.0)
        for p, h in enumerate(hosts):
            load[h] += self.sizes[p]
        return max(load[h] / self.capacity[h] for h in self.capacity)


@dataclass(frozen=True)
class Schedule:
    hosts: list[str]
    utilization: float
    method: str
