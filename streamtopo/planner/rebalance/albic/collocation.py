"""ALBIC's collocation heuristic on top of the MILP (Madsen et al., ICDE 2017, Sec. 4.3.2, Algorithm 2).

Step 1 (lines 2-12): for every key group g_k, ``avg = output / #downstream key groups``; a pair
(g_k, g_j) with ``out[g_k][g_j] > avg * sF`` is in ``colGrps`` when already collocated, else in
``toBeColGrps``.
Step 2 (lines 14-20): colGrps are merged into minimal sets (connected components); each set is split by
balanced graph partitioning (METIS through pymetis) into ``max(p1, p2)`` parts, p1 = ceil(Pmc /
maxMigrCost), p2 = ceil(PL / maxPL); vertex weight = mc_k when Pmc/maxMigrCost > PL/maxPL, else gLoad_k;
edge weight = out(g_i, g_j); parts still violating a bound are partitioned again. Parts migrate as units.
Step 3 (lines 22-32): the pair with the largest out() in toBeColGrps (ties broken at random, seeded)
gets one collocation constraint: case 1 neither in a set -> both on the less loaded of n1, n2; case 2
one in a set -> both on that one's node (its partition with it); case 3 both in sets -> both partitions
on the less loaded node. ``newCollocations`` > 1 repeats Step 3 in that order over pairs whose members
no earlier constraint of the round holds, while the forced moves together fit the migration budget
(beyond the paper, whose one pair per round caps what 20 rounds can collocate: docs/albic.md).
Step 4 (lines 34-37): solve the MILP; while the load distance exceeds maxLD, re-run with
maxPL - stepPL; at maxPL <= 0 every key group is its own partition and ALBIC is the plain MILP.

Purity: the collocation pairs ALBIC keeps are returned in ``Rebalance.details["collocation_constraints"]``;
the caller passes them back as ``AlbicConfig.collocations`` next round. A passed-back pair that is still
collocated and still exchanges data joins colGrps even if its score dipped below the threshold this
period (the paper's "existing colocated key group pairs"), so noise does not break sets apart.
Beyond the paper (documented in docs/albic.md): a set node (B) is never chosen as the target of a new
constraint, and a candidate pair whose forced move (with the round's earlier ones) breaks the migration
bound, or that breaks a resource-matching rule or the memory cap, is skipped for the next best pair; if
the MILP is infeasible with the round's new constraints, the round is re-solved without them.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace

import networkx as nx
import numpy as np
from pydantic import Field

from streamtopo.contracts import KeyGroupId
from streamtopo.planner.allocation import AllocationState, Rebalance
from streamtopo.planner.metis import metis_labels, weight_matrix
from streamtopo.planner.model import AlbicSpec
from streamtopo.planner.rebalance.albic.metrics import load_distance
from streamtopo.planner.rebalance.albic.milp import (
    MilpConfig,
    MilpOutcome,
    solve_to_rebalance,
    solve_units,
    unit_indices,
)
from streamtopo.planner.rebalance.albic.rules import host_of
from streamtopo.planner.rebalance.albic.state import StateIndex, check_budget, index_state

Pair = tuple[KeyGroupId, KeyGroupId]


class AlbicConfig(AlbicSpec):
    """Algorithm 2's inputs (:class:`~streamtopo.planner.model.AlbicSpec`, the one definition of them and
    their paper defaults) plus the MILP settings and the constraints carried over from the last round."""

    milp: MilpConfig = Field(default_factory=MilpConfig)
    collocations: tuple[Pair, ...] = ()
    """Collocation pairs returned by the previous round (details["collocation_constraints"])."""

    @classmethod
    def from_spec(cls, spec: AlbicSpec, collocations: Sequence[Pair] = ()) -> AlbicConfig:
        """What a StreamTopology's ``spec.autoscaling.albic`` asks for, with the pairs the previous
        round kept (the caller carries them between rounds; the spec may change in between)."""
        return cls.model_validate({**spec.model_dump(), "collocations": tuple(collocations)})


@dataclass(frozen=True)
class Scores:
    """Step 1's result."""

    col_grps: list[Pair]
    to_be_col_grps: list[tuple[Pair, float]]
    """(pair, out) for communicating pairs that are not yet collocated."""


def calc_scores(state: AllocationState, score_factor: float) -> Scores:
    """Step 1 (Algorithm 2, lines 2-12). Downstream operators are read off the measured traffic."""
    kgs_of: dict[str, int] = defaultdict(int)
    for kg in state.key_groups:
        kgs_of[kg.id[0]] += 1
    down: dict[str, set[str]] = defaultdict(set)
    output: dict[KeyGroupId, float] = defaultdict(float)
    for (src, dst), value in state.traffic.items():
        if value > 0 and src[0] != dst[0]:
            down[src[0]].add(dst[0])
            output[src] += value
    col, to_be = [], []
    for (src, dst), value in state.traffic.items():
        if src[0] == dst[0] or value <= 0:
            continue
        avg = output[src] / sum(kgs_of[o] for o in down[src[0]])
        if value > avg * score_factor:
            if state.assignment[src] == state.assignment[dst]:
                col.append((src, dst))
            else:
                to_be.append(((src, dst), value))
    return Scores(col, to_be)


def calc_sets(pairs: Sequence[Pair]) -> list[list[KeyGroupId]]:
    """Merge pairs into the minimum number of sets: sets that intersect are replaced by their union."""
    g = nx.Graph()
    g.add_edges_from(pairs)
    return [sorted(c) for c in sorted(nx.connected_components(g), key=lambda c: min(c))]


def _split(
    members: list[KeyGroupId], parts: int, weight: dict[KeyGroupId, float], traffic: dict[Pair, float]
) -> list[list[KeyGroupId]]:
    """Balanced k-way graph partitioning of one set with METIS (pymetis); min edge cut on out()."""
    if parts <= 1:
        return [members]
    if parts >= len(members):
        return [[m] for m in members]
    pos = {m: i for i, m in enumerate(members)}
    matrix = weight_matrix(
        len(members),
        ((pos[a], pos[b], value) for (a, b), value in traffic.items() if a in pos and b in pos and a != b),
    )
    labels = metis_labels(matrix, parts, [weight[m] for m in members])
    out: dict[int, list[KeyGroupId]] = defaultdict(list)
    for m, lab in zip(members, labels):
        out[lab].append(m)
    return [sorted(p) for _, p in sorted(out.items())]


def graph_part(
    members: list[KeyGroupId],
    load: dict[KeyGroupId, float],
    mc: dict[KeyGroupId, float],
    traffic: dict[Pair, float],
    max_pl: float,
    max_cost: float | None,
) -> list[list[KeyGroupId]]:
    """Step 2 for one set (lines 16-20), re-applied to parts that still violate a bound."""
    pl = sum(load[m] for m in members)
    pmc = sum(mc[m] for m in members)
    if len(members) == 1:
        return [members]
    if max_pl <= 0:
        return [[m] for m in members]
    cost_ratio = pmc / max_cost if max_cost else 0.0
    load_ratio = pl / max_pl
    if cost_ratio <= 1 and load_ratio <= 1:
        return [members]
    p1 = math.ceil(cost_ratio) if max_cost else 1
    p2 = math.ceil(load_ratio)
    weight = mc if cost_ratio > load_ratio else load
    parts = _split(members, max(p1, p2, 2), weight, traffic)
    if len(parts) == 1:  # METIS could not separate it: fall back to halves by order
        parts = [members[: len(members) // 2], members[len(members) // 2 :]]
    return [q for p in parts for q in graph_part(p, load, mc, traffic, max_pl, max_cost)]


def _budget_cost(ix: StateIndex, max_migrations: int | None, max_cost: float | None) -> float | None:
    """maxMigrCost in the units of mc (a count bound means mc_k = 1)."""
    if max_cost is not None:
        return max_cost
    return float(max_migrations) if max_migrations is not None else None


@dataclass(frozen=True)
class NewConstraint:
    """Step 3's decision: ``members`` must end up on executor ``node`` (index)."""

    pair: Pair
    case: int
    members: list[KeyGroupId]
    node: int


def improve_collocation(
    state: AllocationState,
    ix: StateIndex,
    scores: Scores,
    partitions: list[list[KeyGroupId]],
    in_sets: set[KeyGroupId],
    max_migrations: int | None,
    max_cost: float | None,
    seed: int,
    count: int = 1,
) -> list[NewConstraint]:
    """Step 3 (lines 22-32): a new collocation constraint by the three cases, for up to ``count`` pairs
    (the paper: one) that share no key group, chosen in Step 3's order, while their forced moves together
    fit the budget. Each choice adds its moved load to its node before the next picks "the less loaded"."""
    if not scores.to_be_col_grps:
        return []
    rng = np.random.default_rng(seed)
    part_of = {m: p for p in partitions for m in p}
    loads = np.bincount(ix.current, weights=ix.load, minlength=len(ix.names)) / ix.capacity
    hosts = host_of(state)
    best = max(v for _, v in scores.to_be_col_grps)
    ranked = sorted(scores.to_be_col_grps, key=lambda pv: -pv[1])
    top = [p for p, v in ranked if v >= best]
    rest = [p for p, v in ranked if v < best]
    order = [top[i] for i in rng.permutation(len(top))] + rest
    chosen: list[NewConstraint] = []
    held: set[KeyGroupId] = set()
    moved: list[KeyGroupId] = []
    for gi, gj in order:
        if len(chosen) == count:
            break
        n1, n2 = int(ix.current[ix.kg[gi]]), int(ix.current[ix.kg[gj]])
        a, b = gi in in_sets, gj in in_sets
        if not a and not b:
            case, members, nodes = 1, [gi, gj], [n1, n2]
        elif a and not b:
            case, members, nodes = 2, [*part_of[gi], gj], [n1]
        elif b and not a:
            case, members, nodes = 2, [*part_of[gj], gi], [n2]
        else:
            case, members, nodes = 3, sorted({*part_of[gi], *part_of[gj]}), [n1, n2]
        if held.intersection(members):
            continue
        nodes = [n for n in sorted(set(nodes), key=lambda n: (loads[n], n)) if not ix.marked[n]]
        for node in nodes[:1]:
            moving = [m for m in members if ix.current[ix.kg[m]] != node]
            if _pin_feasible(state, ix, members, [*moved, *moving], node, hosts, max_migrations, max_cost):
                chosen.append(NewConstraint((gi, gj), case, sorted(set(members)), node))
                held.update(members)
                moved += moving
                for m in moving:
                    k = ix.kg[m]
                    loads[ix.current[k]] -= ix.load[k] / ix.capacity[ix.current[k]]
                    loads[node] += ix.load[k] / ix.capacity[node]
    return chosen


def _pin_feasible(
    state: AllocationState,
    ix: StateIndex,
    members: list[KeyGroupId],
    moving: list[KeyGroupId],
    node: int,
    hosts: dict[str, str],
    max_migrations: int | None,
    max_cost: float | None,
) -> bool:
    """Cheap checks that the forced moves (``moving``: this round's so far, this one's included) are
    allowed: migration bound, matching, memory."""
    if max_migrations is not None and len(moving) > max_migrations:
        return False
    if max_cost is not None and sum(ix.mc[ix.kg[m]] for m in moving) > max_cost + 1e-9:
        return False
    host = hosts[ix.names[node]]
    for m in members:
        allowed = state.rules.allowed_hosts.get(m[0])
        if allowed is not None and host not in allowed:
            return False
    return bool(sum(ix.memory[ix.kg[m]] for m in members) <= ix.memory_capacity[node] * (1 + 1e-9))


def albic_rebalance(
    state: AllocationState,
    *,
    max_migrations: int | None = None,
    max_migration_cost: float | None = None,
    config: AlbicConfig | None = None,
    seed: int = 0,
) -> Rebalance:
    """One ALBIC round (Algorithm 2). Stable signature: the REBALANCERS contract of plan_api.md."""
    config = config or AlbicConfig()
    check_budget(max_migrations, max_migration_cost)
    ix = index_state(state)
    scores = calc_scores(state, config.score_factor)
    kept = [
        p
        for p in config.collocations
        if p[0] in ix.kg
        and p[1] in ix.kg
        and state.assignment[p[0]] == state.assignment[p[1]]
        and state.traffic.get(p, 0.0) + state.traffic.get((p[1], p[0]), 0.0) > 0
    ]
    col_grps = list(dict.fromkeys([*scores.col_grps, *kept]))
    sets = calc_sets(col_grps)
    in_sets = {m for s in sets for m in s}
    load = {kg: float(ix.load[k]) for k, kg in enumerate(ix.kg_ids)}
    mc = {kg: (1.0 if max_migration_cost is None else float(ix.mc[k])) for k, kg in enumerate(ix.kg_ids)}
    traffic = dict(state.traffic)
    max_cost = _budget_cost(ix, max_migrations, max_migration_cost)

    max_pl, backoffs, spent, work, trace = config.max_partition_load, 0, 0.0, 0.0, []
    while True:
        partitions = [p for s in sets for p in graph_part(s, load, mc, traffic, max_pl, max_cost)]
        new = (
            improve_collocation(
                state,
                ix,
                scores,
                partitions,
                in_sets,
                max_migrations,
                max_migration_cost,
                seed,
                config.new_collocations,
            )
            if max_pl > 0
            else []
        )
        outcome = _solve(state, ix, partitions, new, max_migrations, max_migration_cost, config.milp, seed)
        spent, work = spent + outcome.seconds, work + _work(outcome)
        if outcome.where is None and new:
            new = []
            outcome = _solve(state, ix, partitions, [], max_migrations, max_migration_cost, config.milp, seed)
            spent, work = spent + outcome.seconds, work + _work(outcome)
        if outcome.where is None:
            break
        solution = {kg: ix.names[int(outcome.where[k])] for k, kg in enumerate(ix.kg_ids)}
        trace.append((max_pl, load_distance(state, solution)))
        if trace[-1][1] <= config.max_load_distance or max_pl <= 0:
            break
        max_pl -= config.step_partition_load  # line 36: back-off
        backoffs += 1
    details: dict[str, object] = {
        "max_partition_load": max_pl,
        "backoffs": backoffs,
        "trace": trace,
        "sets": len(sets),
        "partitions": sum(1 for p in partitions if len(p) > 1),
        "new_constraints": [
            {"pair": c.pair, "case": c.case, "executor": ix.names[c.node], "members": c.members} for c in new
        ],
        "force_moves": bool(new),
        "deterministic_time": work,
    }
    result = solve_to_rebalance(state, ix, _with_seconds(outcome, spent), policy="albic", extra=details)
    pairs = col_grps + [c.pair for c in new]
    result.details["collocation_constraints"] = [
        p for p in dict.fromkeys(pairs) if result.assignment[p[0]] == result.assignment[p[1]]
    ]
    result.details.pop("force_moves", None)
    return result


def _solve(
    state: AllocationState,
    ix: StateIndex,
    partitions: list[list[KeyGroupId]],
    new: list[NewConstraint],
    max_migrations: int | None,
    max_cost: float | None,
    milp: MilpConfig,
    seed: int,
) -> MilpOutcome:
    groups = [p for p in partitions if len(p) > 1] + [c.members for c in new]
    units = unit_indices(state, ix, groups)
    pinned = {}
    for c in new:
        k0 = ix.kg[c.members[0]]
        pinned.update({u_i: c.node for u_i, u in enumerate(units) if k0 in u})
    return solve_units(
        state,
        ix,
        units,
        pinned=pinned,
        max_migrations=max_migrations,
        max_migration_cost=max_cost,
        config=milp,
        seed=seed,
    )


def _work(outcome: MilpOutcome) -> float:
    """The deterministic time a solve spent (the work measure its limits count; reported in details)."""
    spent = outcome.details.get("deterministic_time", 0.0)
    return float(spent) if isinstance(spent, int | float) else 0.0


def _with_seconds(outcome: MilpOutcome, seconds: float) -> MilpOutcome:
    return replace(outcome, seconds=seconds)
