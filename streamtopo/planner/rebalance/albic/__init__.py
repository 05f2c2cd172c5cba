"""ALBIC (Madsen, Zhou, Cao, ICDE 2017): the load-balancing MILP and the collocation heuristic.

Both entry points follow the rebalancer contract of notes/plan_api.md (see docs/albic.md):
``f(state, *, max_migrations, max_migration_cost, config, seed) -> Rebalance``.
"""

from streamtopo.planner.rebalance.albic.collocation import AlbicConfig, albic_rebalance
from streamtopo.planner.rebalance.albic.metrics import (
    collocation_factor,
    executor_loads,
    load_distance,
    load_index,
)
from streamtopo.planner.rebalance.albic.milp import MilpConfig, milp_rebalance
from streamtopo.planner.rebalance.albic.state import AllocationError

__all__ = [
    "AlbicConfig",
    "AllocationError",
    "MilpConfig",
    "albic_rebalance",
    "collocation_factor",
    "executor_loads",
    "load_distance",
    "load_index",
    "milp_rebalance",
]
