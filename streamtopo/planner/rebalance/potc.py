"""Power of Two Choices / "power of both choices" (Nasir et al., ICDE 2015) as a rebalancing baseline.

Modelling (ALBIC Sec. 2.2 and 5.2.1, documented in docs/albic.md): each key group g_k keeps its state
owner h1 (its current executor) and gets a second choice h2, a seeded hash over the other executors not
marked for removal. Records of g_k are routed to whichever of the two is less loaded, which in a fluid
model splits gLoad_k between h1 and h2 so as to equalise them (greedy, largest key groups first, over
loads starting from zero, as the routing decides afresh). A key group that really is split pays a merge
overhead ``merge_overhead * gLoad_k`` on h1: the partial states must be merged before the final
computation, and that merge cannot be balanced. There is no state migration, except that a key group
whose owner is marked for removal gets a new owner (its first choice becomes h2's sibling in A), which
counts as a migration within the same bound as the other policies.

The result's ``assignment`` is the owner h1; ``details["shares"]`` gives every key group's split
{executor: fraction}; ``load_distance`` and ``details["executor_loads"]`` include the split loads and
the merge overhead; the collocation factor is the expected share of traffic whose sender and receiver
records meet on the same executor.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

from streamtopo.contracts import KeyGroupId
from streamtopo.planner.allocation import AllocationState, Rebalance
from streamtopo.planner.rebalance.albic.metrics import build_rebalance
from streamtopo.planner.rebalance.albic.state import check_budget, index_state


@dataclass(frozen=True)
class PotcConfig:
    merge_overhead: float = 0.1
    """Extra load on the owner, as a fraction of a split key group's load."""


def _second_choice(kg: KeyGroupId, owner: str, candidates: list[str], seed: int) -> str:
    others = [c for c in candidates if c != owner] or candidates
    digest = hashlib.blake2b(f"{seed}:{kg[0]}:{kg[1]}".encode(), digest_size=8).digest()
    return others[int.from_bytes(digest, "big") % len(others)]


def potc_rebalance(
    state: AllocationState,
    *,
    max_migrations: int | None = None,
    max_migration_cost: float | None = None,
    config: PotcConfig | None = None,
    seed: int = 0,
) -> Rebalance:
    """One PoTC period: owners, second choices and the fluid split of every key group's load."""
    config = config or PotcConfig()
    check_budget(max_migrations, max_migration_cost)
    ix = index_state(state)
    active = [n for n, m in zip(ix.names, ix.marked) if not m]
    cap = dict(zip(ix.names, ix.capacity))
    owner = dict(state.assignment)
    count, cost = 0, 0.0
    for k, kg in enumerate(ix.kg_ids):
        if owner[kg] in active:
            continue
        step = float(ix.mc[k])
        if (max_migrations is None or count < max_migrations) and (
            max_migration_cost is None or cost + step <= max_migration_cost + 1e-9
        ):
            owner[kg] = _second_choice(kg, "", active, seed + 1)
            count, cost = count + 1, cost + step
    load = dict.fromkeys(ix.names, 0.0)
    shares: dict[KeyGroupId, dict[str, float]] = {}
    for k in sorted(range(len(ix.kg_ids)), key=lambda k: (-ix.load[k], k)):
        kg, size = ix.kg_ids[k], float(ix.load[k])
        h1 = owner[kg]
        h2 = _second_choice(kg, h1, active, seed) if h1 in active else h1
        if h2 == h1 or size <= 0:
            load[h1] += size
            shares[kg] = {h1: 1.0}
            continue
        # Water-filling: x to h1 and size - x to h2 so that their utilisations meet, clipped to [0, size].
        u1, u2 = load[h1] / cap[h1], load[h2] / cap[h2]
        x = (u2 - u1 + size / cap[h2]) / (1 / cap[h1] + 1 / cap[h2])
        x = min(max(x, 0.0), size)
        load[h1] += x
        load[h2] += size - x
        if 0 < x < size:
            load[h1] += config.merge_overhead * size
        shares[kg] = {h: v for h, v in ((h1, x / size), (h2, 1 - x / size)) if v > 0}
    utils = {n: load[n] / cap[n] for n in ix.names}
    result = build_rebalance(
        state,
        ix,
        owner,
        loads=utils,
        details={"shares": shares, "merge_overhead": config.merge_overhead},
        reason=f"potc: {sum(1 for s in shares.values() if len(s) > 1)} key group(s) split, "
        f"{count} owner change(s)",
    )
    return _with_split_collocation(state, result, shares)


def _with_split_collocation(
    state: AllocationState, result: Rebalance, shares: dict[KeyGroupId, dict[str, float]]
) -> Rebalance:
    total = inside = 0.0
    for (src, dst), value in state.traffic.items():
        total += value
        inside += value * sum(f * shares[dst].get(ex, 0.0) for ex, f in shares[src].items())
    return replace(result, collocation_factor=inside / total if total > 0 else 0.0)
