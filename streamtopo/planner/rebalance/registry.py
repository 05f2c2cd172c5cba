"""The registry of runtime rebalancing policies (plan_api.md).

Every entry is ``f(state, *, max_migrations=None, max_migration_cost=None, config=None, seed=0)
-> Rebalance``; ``config=None`` means the policy's defaults (``CONFIGS[name]()``). The simulator, the
adaptation framework (Algorithm 1) and the controller select a policy by name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from streamtopo.planner.allocation import AllocationState, Rebalance
from streamtopo.planner.rebalance.albic import AlbicConfig, MilpConfig, albic_rebalance, milp_rebalance
from streamtopo.planner.rebalance.cmr import CmrConfig, cmr_rebalance
from streamtopo.planner.rebalance.cola_reoptimise import ColaReoptConfig, cola_rebalance
from streamtopo.planner.rebalance.flux import FluxConfig, flux_rebalance
from streamtopo.planner.rebalance.potc import PotcConfig, potc_rebalance

Rebalancer = Callable[..., Rebalance]

REBALANCERS: dict[str, Rebalancer] = {
    "albic": albic_rebalance,
    "milp": milp_rebalance,
    "flux": flux_rebalance,
    "potc": potc_rebalance,
    "cola": cola_rebalance,
    "cmr": cmr_rebalance,
}

CONFIGS: dict[str, type] = {
    "albic": AlbicConfig,
    "milp": MilpConfig,
    "flux": FluxConfig,
    "potc": PotcConfig,
    "cola": ColaReoptConfig,
    "cmr": CmrConfig,
}


def rebalance(
    policy: str,
    state: AllocationState,
    *,
    max_migrations: int | None = None,
    max_migration_cost: float | None = None,
    config: Any = None,
    seed: int = 0,
) -> Rebalance:
    """Run the named policy; an unknown name is a ValueError listing the known ones."""
    if policy not in REBALANCERS:
        raise ValueError(
            f"policy: unknown rebalancing policy {policy!r}; use one of {', '.join(sorted(REBALANCERS))}"
        )
    if config is not None and not isinstance(config, CONFIGS[policy]):
        raise ValueError(
            f"config: {policy} expects a {CONFIGS[policy].__name__}, got {type(config).__name__}"
        )
    return REBALANCERS[policy](
        state, max_migrations=max_migrations, max_migration_cost=max_migration_cost, config=config, seed=seed
    )
