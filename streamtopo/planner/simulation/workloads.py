"""Synthetic rebalancing workloads in the settings of ALBIC's experiments (Madsen et al., ICDE 2017).

Section 5.1: key groups are allocated evenly (each node the same number); every key group's load starts
at the mean and is adjusted by a random percentage in [-5 %, +5 %]; then 20 % of the nodes are shifted by
``varies``: half lose ``0.5 * varies`` percentage points, half gain it, by changing the load of a randomly
chosen set of key groups on each such node.
Section 5.3: the same, plus ``x %`` of the key groups communicate 1-1 with one downstream key group (the
rest spread their output evenly over all downstream key groups), which caps the reachable collocation
factor; between periods the load of 20 % of the nodes drifts by a random percentage in [-2 %, +2 %].

The paper does not give the mean node load; we use 50 % (``node_load``), so nodes have room both ways.
Operators form a chain O_1 -> O_2 -> ... -> O_m, each with ``key_groups / operators`` key groups.
Everything is driven by an explicit ``numpy`` seed (planner purity).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from streamtopo.contracts import KeyGroupId
from streamtopo.planner.allocation import AllocationState, ExecutorInfo, KeyGroupStats


@dataclass(frozen=True)
class SyntheticSetting:
    """One experiment configuration (nodes / key groups / operators), e.g. 20/400/10."""

    nodes: int
    key_groups: int
    operators: int
    varies: float = 20.0
    """Percentage points moved on 20 % of the nodes (half up, half down by varies/2)."""
    node_load: float = 50.0
    """Mean node load in percent of one node's capacity."""
    jitter: float = 0.05
    """Per-key-group load noise, as a fraction of the mean key-group load (paper: 5 %)."""
    shifted_fraction: float = 0.2
    one_to_one: float = 0.0
    """Share (0..1) of key groups whose output goes 1-1 to one downstream key group (Sec. 5.3's x %)."""
    rate_per_key_group: float = 1000.0
    """Records/s each non-sink key group emits (only the ratios matter to the planners)."""


def _validate(setting: SyntheticSetting) -> None:
    problems = []
    if setting.nodes < 1:
        problems.append("nodes must be >= 1")
    if setting.operators < 1 or setting.key_groups % max(setting.operators, 1):
        problems.append("key_groups must be a positive multiple of operators")
    if setting.key_groups % max(setting.nodes, 1):
        problems.append("key_groups must be a multiple of nodes (the paper allocates evenly)")
    if not 0.0 <= setting.one_to_one <= 1.0:
        problems.append("one_to_one must be within [0, 1]")
    if problems:
        raise ValueError("invalid synthetic setting: " + "; ".join(problems))


def synthetic_state(setting: SyntheticSetting, seed: int = 0) -> AllocationState:
    """Build the Section 5.1 / 5.3 state: even random allocation, jittered loads, shifted nodes, traffic."""
    _validate(setting)
    rng = np.random.default_rng(seed)
    per_op = setting.key_groups // setting.operators
    ids: list[KeyGroupId] = [(f"op{o}", j) for o in range(setting.operators) for j in range(per_op)]
    mean_kg = setting.node_load * setting.nodes / setting.key_groups
    loads = mean_kg * (1.0 + rng.uniform(-setting.jitter, setting.jitter, len(ids)))

    executors = [ExecutorInfo(name=f"n{i}") for i in range(setting.nodes)]
    order = rng.permutation(len(ids))
    per_node = setting.key_groups // setting.nodes
    node_of = {ids[k]: executors[pos // per_node].name for pos, k in enumerate(order)}
    members = {
        e.name: [int(k) for k in order[i * per_node : (i + 1) * per_node]] for i, e in enumerate(executors)
    }

    shifted = rng.choice(setting.nodes, size=round(setting.shifted_fraction * setting.nodes), replace=False)
    for pos, node in enumerate(shifted):
        sign = 1.0 if pos % 2 else -1.0
        _shift_node(loads, members[executors[node].name], sign * setting.varies / 2.0, rng)

    traffic = _traffic(ids, per_op, setting, rng)
    stats = [
        KeyGroupStats(
            id=kg, load=float(load), memory=1.0, migration_cost=1.0, rate=setting.rate_per_key_group
        )
        for kg, load in zip(ids, loads)
    ]
    return AllocationState(executors=executors, key_groups=stats, assignment=node_of, traffic=traffic)


def _shift_node(loads: np.ndarray, kgs: list[int], delta: float, rng: np.random.Generator) -> None:
    """Add ``delta`` percentage points to a node by changing a random subset of its key groups' loads."""
    chosen = rng.choice(kgs, size=max(1, len(kgs) // 2), replace=False)
    share = delta / len(chosen)
    for k in chosen:
        loads[k] = max(0.0, loads[k] + share)


def _traffic(
    ids: list[KeyGroupId], per_op: int, setting: SyntheticSetting, rng: np.random.Generator
) -> dict[tuple[KeyGroupId, KeyGroupId], float]:
    """Chain traffic: 1-1 for ``one_to_one`` of the key groups, full partitioning for the rest."""
    traffic: dict[tuple[KeyGroupId, KeyGroupId], float] = {}
    rate = setting.rate_per_key_group
    paired = set(rng.choice(per_op, size=round(setting.one_to_one * per_op), replace=False).tolist())
    for o in range(setting.operators - 1):
        up, down = f"op{o}", f"op{o + 1}"
        for j in range(per_op):
            if j in paired:
                traffic[((up, j), (down, j))] = rate
            else:
                for t in range(per_op):
                    traffic[((up, j), (down, t))] = rate / per_op
    return traffic


def drift(state: AllocationState, seed: int, fraction: float = 0.2, spread: float = 0.02) -> AllocationState:
    """Next period's loads (Sec. 5.3): 20 % of the nodes change load by a random percentage in +-2 %.

    The change scales every key group on a chosen node by the same factor, so the node's load moves by
    that percentage; the allocation itself is the caller's (the policy's) business.
    """
    rng = np.random.default_rng(seed)
    names = [e.name for e in state.executors]
    chosen = set(rng.choice(len(names), size=round(fraction * len(names)), replace=False).tolist())
    factor = {names[i]: 1.0 + rng.uniform(-spread, spread) for i in chosen}
    stats = [replace(kg, load=kg.load * factor.get(state.assignment[kg.id], 1.0)) for kg in state.key_groups]
    return replace(state, key_groups=stats)


@dataclass(frozen=True)
class RealJobSetting:
    """Section 5.2's Real Job 1 (Figures 6-9): one input and three operators of 100 key groups each on 20
    worker nodes, over the Wikipedia edit history. The operators are a GeoHash map (load even over its
    key groups), a per-article TopK and a global TopK, both over 1-minute windows."""

    nodes: int = 20
    key_groups: int = 100
    """Per operator."""
    node_load: float = 50.0
    """Mean node load in percent of one node's capacity."""
    articles: int = 100_000
    article_skew: float = 0.8
    """Zipf exponent of article popularity; articles are hashed onto the TopK key groups."""
    churn: float = 0.15
    """Sigma of each key group's edit-burst noise per period (log scale, mean-reverting by ``memory``)."""
    memory: float = 0.8
    """How much of a burst carries into the next period."""
    merge_every: int = 2
    """Periods per window: the global TopK merges every ``merge_every`` periods (1-minute windows,
    30-second periods)."""
    merge_load: float = 0.6
    """A merging key group's extra load, as a share of its own, varying with the state it merges."""
    rate_swing: float = 0.15
    """The input rate swings by this share around its mean over the run ("fluctuating", the paper)."""


def real_job(
    setting: RealJobSetting, periods: int, seed: int = 0
) -> tuple[AllocationState, list[np.ndarray]]:
    """The job's first state (even random allocation) and each period's key-group loads, in the order of
    ``state.key_groups``. The loads change the way the paper describes the job's: the per-article TopK
    follows bursts of edits to popular articles, and the global TopK's merge load "varies over time and
    from node to node", so no allocation stays balanced for long."""
    rng = np.random.default_rng(seed)
    k, n = setting.key_groups, setting.nodes
    ops = ("geohash", "topk", "global")
    ids: list[KeyGroupId] = [(op, j) for op in ops for j in range(k)]
    ranks = 1.0 / np.arange(1, setting.articles + 1) ** setting.article_skew
    base = np.bincount(rng.integers(0, k, setting.articles), weights=ranks, minlength=k)
    base = base / base.mean()
    scale = setting.node_load * n / (3 * k)  # the mean key-group load, in % of a node
    burst, loads = np.zeros(k), []
    for period in range(periods):
        burst = setting.memory * burst + rng.normal(0.0, setting.churn, k)
        share = base * np.exp(burst)
        share = share / share.mean()
        rate = 1.0 + setting.rate_swing * np.sin(2 * np.pi * period / max(periods, 1))
        geohash = rng.uniform(0.97, 1.03, k)
        merge = np.ones(k)
        if period % setting.merge_every == 0:
            merge += setting.merge_load * rng.uniform(0.0, 2.0, k)
        merged = share * merge
        loads.append(scale * rate * np.concatenate([geohash, share, merged / merged.mean()]))
    executors = [ExecutorInfo(name=f"n{i}") for i in range(n)]
    order = rng.permutation(len(ids))
    node_of = {ids[int(kg)]: executors[pos % n].name for pos, kg in enumerate(order)}
    traffic = {
        ((up, i), (down, j)): 1000.0 / k for up, down in zip(ops, ops[1:]) for i in range(k) for j in range(k)
    }
    stats = [
        KeyGroupStats(id=kg, load=float(load), memory=1.0, migration_cost=1.0, rate=1000.0)
        for kg, load in zip(ids, loads[0])
    ]
    return AllocationState(executors=executors, key_groups=stats, assignment=node_of, traffic=traffic), loads


def with_loads(state: AllocationState, loads: np.ndarray) -> AllocationState:
    """``state`` with key-group loads ``loads`` (in the order of ``state.key_groups``)."""
    return replace(state, key_groups=[replace(kg, load=float(x)) for kg, x in zip(state.key_groups, loads)])
