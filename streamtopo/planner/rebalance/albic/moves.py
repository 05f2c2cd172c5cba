"""Bookkeeping shared by the move-by-move baselines (Flux, C-MR): units, loads, the migration budget."""

from __future__ import annotations

from dataclasses import dataclass

from streamtopo.contracts import KeyGroupId
from streamtopo.planner.allocation import AllocationState
from streamtopo.planner.rebalance.albic.rules import colocation_units, move_allowed
from streamtopo.planner.rebalance.albic.state import StateIndex


@dataclass
class MoveBook:
    """A working assignment with per-executor loads and the remaining migration budget.

    Units (PE-co-location classes) move whole. A key group moved back to where it started costs
    nothing, as in the MILP's constraint (2), which compares with the current allocation q.
    """

    state: AllocationState
    ix: StateIndex
    max_migrations: int | None
    max_cost: float | None

    def __post_init__(self) -> None:
        self.assignment: dict[KeyGroupId, str] = dict(self.state.assignment)
        self.units = colocation_units(self.state)
        self.cap = {n: float(c) for n, c in zip(self.ix.names, self.ix.capacity)}
        self.mem_cap = {n: float(c) for n, c in zip(self.ix.names, self.ix.memory_capacity)}
        self.marked = {n for n, m in zip(self.ix.names, self.ix.marked) if m}
        self.load = dict.fromkeys(self.ix.names, 0.0)
        self.memory = dict.fromkeys(self.ix.names, 0.0)
        for k, kg in enumerate(self.ix.kg_ids):
            ex = self.assignment[kg]
            self.load[ex] += self.ix.load[k]
            self.memory[ex] += self.ix.memory[k]
        self.count, self.cost = 0, 0.0

    def util(self, ex: str) -> float:
        """load_i in percent of the executor's capacity."""
        return self.load[ex] / self.cap[ex]

    def unit_load(self, unit: list[KeyGroupId]) -> float:
        return float(sum(self.ix.load[self.ix.kg[k]] for k in unit))

    def units_on(self, ex: str) -> list[list[KeyGroupId]]:
        return [u for u in self.units if all(self.assignment[k] == ex for k in u)]

    def _delta(self, unit: list[KeyGroupId], dest: str) -> tuple[int, float]:
        """Change of (migrations, migration cost) against the current allocation if ``unit`` moves."""
        count, cost = 0, 0.0
        for k in unit:
            orig = self.state.assignment[k]
            step = int(dest != orig) - int(self.assignment[k] != orig)
            count += step
            cost += step * float(self.ix.mc[self.ix.kg[k]])
        return count, cost

    def can_move(self, unit: list[KeyGroupId], dest: str) -> bool:
        """Budget, set B, memory cap and PlacementRules all allow moving ``unit`` to ``dest``."""
        if dest in self.marked and any(self.state.assignment[k] != dest for k in unit):
            return False
        mem = sum(self.ix.memory[self.ix.kg[k]] for k in unit)
        if self.memory[dest] + mem > self.mem_cap[dest] * (1 + 1e-9):
            return False
        dc, dcost = self._delta(unit, dest)
        if self.max_migrations is not None and self.count + dc > self.max_migrations:
            return False
        if self.max_cost is not None and self.cost + dcost > self.max_cost + 1e-9:
            return False
        return move_allowed(self.state, self.assignment, unit, dest)

    def move(self, unit: list[KeyGroupId], dest: str) -> None:
        dc, dcost = self._delta(unit, dest)
        self.count += dc
        self.cost += dcost
        for k in unit:
            src = self.assignment[k]
            i = self.ix.kg[k]
            self.load[src] -= self.ix.load[i]
            self.memory[src] -= self.ix.memory[i]
            self.load[dest] += self.ix.load[i]
            self.memory[dest] += self.ix.memory[i]
            self.assignment[k] = dest

    def budget_left(self) -> bool:
        return (self.max_migrations is None or self.count < self.max_migrations) and (
            self.max_cost is None or self.cost < self.max_cost - 1e-9
        )
