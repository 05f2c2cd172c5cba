"""ALBIC's metrics (Madsen et al., ICDE 2017, Sections 4.3.1 and 5): load distance, load index,
collocation factor, and the :class:`Rebalance` every policy returns.

Loads are percentages of one reference executor (``gLoad_k``). On a heterogeneous executor a key group
weighs ``gLoad_k / capacity`` (the paper's "multiply gLoad_k by a node capacity weight"), so
``load_i`` is a percentage of executor i's own capacity, and the balanced target is
``mean = sum_k gLoad_k / sum_{i in A} capacity_i``; with unit capacities this is the paper's
``mean = 1/|A| * sum_{n_i in N} load_i`` (the MILP additionally rounds it up, as written; the metric
does not, so a perfect allocation scores 0).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from streamtopo.contracts import KeyGroupId
from streamtopo.planner.allocation import AllocationState, Rebalance
from streamtopo.planner.rebalance.albic.rules import rule_violations
from streamtopo.planner.rebalance.albic.state import StateIndex


def executor_loads(state: AllocationState, assignment: Mapping[KeyGroupId, str]) -> dict[str, float]:
    """load_i per executor, in percent of its own capacity."""
    cap = {e.name: e.capacity for e in state.executors}
    loads = dict.fromkeys(cap, 0.0)
    for kg in state.key_groups:
        ex = assignment[kg.id]
        loads[ex] += kg.load / cap[ex]
    return loads


def mean_load(state: AllocationState, ceil: bool = False) -> float:
    """The balanced load over the executors not marked for removal (ALBIC's ``mean``)."""
    active = sum(e.capacity for e in state.executors if not e.marked_for_removal)
    mean = sum(kg.load for kg in state.key_groups) / active
    return float(math.ceil(mean)) if ceil else mean


def load_distance(
    state: AllocationState,
    assignment: Mapping[KeyGroupId, str],
    loads: Mapping[str, float] | None = None,
    ceil_mean: bool = False,
) -> float:
    """max_{n_i in A} |load_i - mean| in percentage points (Sec. 4.3.1, "Metric")."""
    loads = executor_loads(state, assignment) if loads is None else loads
    mean = mean_load(state, ceil_mean)
    return max(abs(loads[e.name] - mean) for e in state.executors if not e.marked_for_removal)


def collocation_factor(state: AllocationState, assignment: Mapping[KeyGroupId, str]) -> float:
    """Share of the kg-to-kg traffic whose ends share an executor (0 when there is no traffic)."""
    total = inside = 0.0
    for (src, dst), value in state.traffic.items():
        total += value
        if assignment[src] == assignment[dst]:
            inside += value
    return inside / total if total > 0 else 0.0


def load_index(average_load: float, initial_average_load: float) -> float:
    """Current average system load divided by the one right after initialisation (Sec. 5, "Metrics")."""
    if not initial_average_load > 0:
        raise ValueError("initial_average_load must be > 0")
    return average_load / initial_average_load


def build_rebalance(
    state: AllocationState,
    index: StateIndex,
    assignment: dict[KeyGroupId, str],
    *,
    reason: str,
    solve_seconds: float = 0.0,
    details: dict[str, object] | None = None,
    loads: Mapping[str, float] | None = None,
) -> Rebalance:
    """Wrap a new assignment: migrations, metrics, rule violations, per-executor loads in ``details``."""
    migrations = [
        (kg, state.assignment[kg], assignment[kg])
        for kg in index.kg_ids
        if assignment[kg] != state.assignment[kg]
    ]
    loads = executor_loads(state, assignment) if loads is None else loads
    extra = dict(details or {})
    extra.setdefault("executor_loads", dict(loads))
    extra.setdefault("migration_cost", float(sum(index.mc[index.kg[kg]] for kg, _, _ in migrations)))
    extra.setdefault("violations", sorted(rule_violations(state, assignment)))
    return Rebalance(
        assignment=assignment,
        migrations=migrations,
        load_distance=load_distance(state, assignment, loads),
        collocation_factor=collocation_factor(state, assignment),
        solve_seconds=solve_seconds,
        reason=reason,
        details=extra,
    )
