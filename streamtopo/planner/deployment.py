"""A fusion plan as the first routing table: COLA's PEs as executors, as many as Aeolus says the job needs.

COLA (Khandekar et al.) decides which operators share a process and where it runs; it minimises
inter-PE traffic, so on a roomy cluster it fuses a whole job into one PE. Aeolus (Sax et al., ICDE 2014,
Algorithm 1 with Eq. 2) decides how much parallelism the job needs at its declared rates:
:func:`~streamtopo.planner.scaling.aeolus.initial_executors` turns its CPU demand into an executor count
at the scaling rule's target utilisation, within ``minExecutors``/``maxExecutors`` (or ``spec.replicas``
when pinned). The first deployment takes both: when Aeolus asks for more executors than COLA made PEs,
the PEs are split, each into executors that hold every operator of the PE for a share of its key groups
(so edges inside a PE between units of one key group index stay in memory, as in the PE). Without the
split a deployment started below ``minExecutors`` and the first adaptation period scaled it up, moving
key groups while the JVMs warmed.

The local run and the operator both call :func:`deployment`, so ``streamtopo run`` and Kubernetes start
the same executors with the same units.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import linear_sum_assignment

from streamtopo.contracts import (
    ExecutorEntry,
    KeyGroupId,
    RoutingTable,
    executor_index,
    executor_name,
    unit_key,
)
from streamtopo.planner.cluster import MIN_EXECUTOR_CPU
from streamtopo.planner.graph import operator_of
from streamtopo.planner.model import StreamTopologySpec
from streamtopo.planner.plan import Plan
from streamtopo.planner.scaling.aeolus import aeolus_plan, initial_executors
from streamtopo.planner.scaling.policy import ScalingConfig


@dataclass(frozen=True)
class Deployment:
    """Executors with their units: what the routing table's first version holds."""

    executors: dict[str, ExecutorEntry]
    units: dict[KeyGroupId, str]
    splits: tuple[int, ...]
    """Executors per PE, in the plan's PE order (1 where the PE runs whole)."""
    wanted: int
    """Aeolus' executor count (Algorithm 1's demand at the target utilisation, within bounds)."""
    demand: float
    """Aeolus' CPU demand at the declared rates, cores."""


def plan_units(plan: Plan, spec: StreamTopologySpec, replicas: bool = True) -> list[list[KeyGroupId]]:
    """The units of every PE: a logical-graph PE holds all key groups of its operators. ``replicas``
    False leaves out HA replicas (r >= 1), which a local run does not start."""
    out = []
    for pe in plan.pes:
        units: list[KeyGroupId] = []
        for member in pe.members:
            node = member[0] if isinstance(member, tuple) else member
            if not replicas and operator_of(node) != node:
                continue
            if isinstance(member, tuple):
                units.append((member[0], int(member[1])))
            else:
                units.extend((member, kg) for kg in range(spec.key_groups_of(operator_of(member))))
        out.append(units)
    return out


def split_counts(sizes: Sequence[float], limits: Sequence[int], total: int) -> list[int]:
    """Executors per PE: one each, then one more at a time to the PE with the most size per executor
    (D'Hondt's rule, so the split follows the PEs' CPU), never more than a PE's ``limits`` (its distinct
    key group indexes); fewer than ``total`` when every PE is at its limit."""
    counts = [1 if limit > 0 else 0 for limit in limits]
    while sum(counts) < total:
        open_ = [i for i, (c, limit) in enumerate(zip(counts, limits)) if c < limit]
        if not open_:
            break
        best = max(open_, key=lambda i: (sizes[i] / counts[i], -i))
        counts[best] += 1
    return counts


def deployment(
    plan: Plan,
    spec: StreamTopologySpec,
    topology: str,
    scaling: ScalingConfig,
    *,
    replicas: bool = True,
    cpu: float | None = None,
) -> Deployment:
    """Executors ``<topology>-e<i>`` for ``plan``'s PEs, split up to Aeolus' count (module docstring).

    A PE split into m executors gives the unit (op, kg) to its executor ``rank(kg) mod m``, rank being
    kg's place among the PE's key group indexes. Every executor runs on its PE's host and requests ``cpu``
    cores, by default ``spec.executor.resources.cpu`` or its share of the PE's size (at least 0.1 core).
    """
    aeolus = aeolus_plan(spec)
    wanted = initial_executors(aeolus, scaling)
    pe_units = plan_units(plan, spec, replicas)
    indexes = [sorted({kg for _, kg in units}) for units in pe_units]
    counts = split_counts([pe.size for pe in plan.pes], [len(ix) for ix in indexes], wanted)
    executors: dict[str, ExecutorEntry] = {}
    assignment: dict[KeyGroupId, str] = {}
    for pe, units, index, count in zip(plan.pes, pe_units, indexes, counts):
        names = [executor_name(topology, len(executors) + j) for j in range(count)]
        for name in names:
            share = cpu or spec.executor.resources.cpu or _cpu(pe.size / count)
            executors[name] = ExecutorEntry(host=pe.host, cpu=share)
        rank = {kg: i for i, kg in enumerate(index)}
        assignment.update({unit: names[rank[unit[1]] % count] for unit in units})
    return Deployment(executors, assignment, tuple(counts), wanted, aeolus.demand)


def keep_names(planned: Deployment, previous: RoutingTable) -> Deployment:
    """``planned`` with its executors renamed after the running ones they overlap most (the Hungarian
    method on units in common, only between executors on the same host), so a re-plan moves only the
    units whose executor changes, and no executor is restarted elsewhere (on Kubernetes a pod's node is
    fixed: a name on another host would be a new pod). The others get indexes above every running one."""
    old = sorted(previous.executors)
    new = sorted(planned.executors)
    shared = np.zeros((len(new), len(old)))
    row, col = {n: i for i, n in enumerate(new)}, {n: j for j, n in enumerate(old)}
    for unit, executor in planned.units.items():
        before = previous.units.get(unit_key(unit))
        if before in col and previous.executors[before].host == planned.executors[executor].host:
            shared[row[executor], col[before]] += 1
    names: dict[str, str] = {}
    for i, j in zip(*linear_sum_assignment(shared, maximize=True)):
        if shared[i, j] > 0:
            names[new[i]] = old[j]
    indexes = [executor_index(previous.topology, n) for n in old]
    fresh = max((i for i in indexes if i is not None), default=-1) + 1
    for name in new:
        if name not in names:
            names[name] = executor_name(previous.topology, fresh)
            fresh += 1
    return replace(
        planned,
        executors={names[n]: e for n, e in planned.executors.items()},
        units={u: names[e] for u, e in planned.units.items()},
    )


def _cpu(size: float) -> float:
    """An executor's CPU request: its SIZE rounded up to a tenth of a core."""
    return max(MIN_EXECUTOR_CPU, math.ceil(size * 10 - 1e-9) / 10)
