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

Both are capped by the hosts' room (planner/capacity.py): a host takes at most one executor per
``executor_capacity`` cores of room, so no executor is planned that its host cannot schedule. When the
room takes fewer executors than COLA made PEs on a host, that host's PEs share executors (the largest
PE first onto the executor holding the least, as LPT scheduling does); what the declared rates need
beyond the room is the deployment's :class:`~streamtopo.planner.capacity.Shortfall`.

The local run and the operator both call :func:`deployment`, so ``streamtopo run`` and Kubernetes start
the same executors with the same units.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
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
from streamtopo.planner.capacity import Shortfall, fits, planned_shortfall, request_cpu
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
    """Executors per PE, in the plan's PE order (1 where the PE runs whole); PEs packed together for
    want of room count once."""
    wanted: int
    """Aeolus' executor count (Algorithm 1's demand at the target utilisation, within bounds)."""
    demand: float
    """Aeolus' CPU demand at the declared rates, cores."""
    capacity: Shortfall | None = None
    """The declared rates against the hosts' room (``capacity.exhausted`` when they need more than it
    takes); None when planned without a room."""
    pending: tuple[str, ...] = ()
    """Executors on a host without room for them (they would stay Pending): only when a host has no
    room at all for the PE COLA put there."""


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


def split_counts(
    sizes: Sequence[float],
    limits: Sequence[int],
    total: int,
    can_grow: Callable[[int, list[int]], bool] | None = None,
) -> list[int]:
    """Executors per PE: one each, then one more at a time to the PE with the most size per executor
    (D'Hondt's rule, so the split follows the PEs' CPU), never more than a PE's ``limits`` (its distinct
    key group indexes) nor where ``can_grow(i, counts)`` says its host has no room for one more; fewer
    than ``total`` when every PE is at a limit."""
    counts = [1 if limit > 0 else 0 for limit in limits]
    while sum(counts) < total:
        open_ = [
            i
            for i, (c, limit) in enumerate(zip(counts, limits))
            if c < limit and (can_grow is None or can_grow(i, counts))
        ]
        if not open_:
            break
        best = max(open_, key=lambda i: (sizes[i] / counts[i], -i))
        counts[best] += 1
    return counts


def pack(sizes: Sequence[float], bins: int) -> list[int]:
    """The bin of each item: the largest first, each into the bin holding the least (LPT)."""
    load = [0.0] * bins
    out = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        b = min(range(bins), key=lambda b: (load[b], b))
        out[i] = b
        load[b] += sizes[i]
    return out


def deployment(
    plan: Plan,
    spec: StreamTopologySpec,
    topology: str,
    scaling: ScalingConfig,
    *,
    replicas: bool = True,
    cpu: float | None = None,
    room: Mapping[str, float] | None = None,
    footprint: float | None = None,
) -> Deployment:
    """Executors ``<topology>-e<i>`` for ``plan``'s PEs, split up to Aeolus' count (module docstring).

    A PE split into m executors gives the unit (op, kg) to its executor ``rank(kg) mod m``, rank being
    kg's place among the PE's key group indexes. Every executor runs on its PE's host and requests ``cpu``
    cores, by default ``spec.executor.resources.cpu`` or its share of the PE's size (at least 0.1 core,
    at most ``scaling.executor_capacity``: an executor runs one Spark core).
    ``room`` (host -> free cores, planner/capacity.py) caps the executors each host takes at what their
    requests fit into (and an overloaded host's requests at its room); None plans without a cap. An
    executor counts against the room with its ``footprint`` where that exceeds its request: the cores it
    is known to take busy (``streamtopo run``'s executors, a JVM and a Python driver each, measured).
    """
    aeolus = aeolus_plan(spec)
    wanted = initial_executors(aeolus, scaling)
    pe_units = plan_units(plan, spec, replicas)
    fixed = cpu or spec.executor.resources.cpu

    def request(size: float, count: int) -> float:
        """An executor's cores: the fixed request, else its share of the group's size, at most the
        executor capacity the scaling rule reasons with (an executor runs one Spark core)."""
        return fixed or min(scaling.executor_capacity, request_cpu(size / count))

    def taken(size: float, count: int) -> float:
        """Cores an executor takes on its host's room: its request, or its footprint if larger."""
        return max(request(size, count), footprint or 0.0)

    groups = _groups(plan, pe_units, room, max(fixed or 0.0, footprint or 0.0) or None)
    sizes = [sum(plan.pes[i].size for i in group) for group in groups]
    units = [[u for i in group for u in pe_units[i]] for group in groups]
    hosts = [plan.pes[group[0]].host for group in groups]
    indexes = [sorted({kg for _, kg in us}) for us in units]

    def can_grow(i: int, counts: list[int]) -> bool:
        """One more executor for group i still fits its host's room (every executor's request counted)."""
        if room is None:
            return True
        grown = [c + (j == i) for j, c in enumerate(counts)]
        used = sum(c * taken(sizes[j], c) for j, c in enumerate(grown) if hosts[j] == hosts[i])
        return fits(used, room.get(hosts[i] or "", 0.0))

    counts = split_counts(sizes, [len(ix) for ix in indexes], max(wanted, len(groups)), can_grow)
    on_host: dict[str | None, int] = {}
    for host, count in zip(hosts, counts):
        on_host[host] = on_host.get(host, 0) + count
    executors: dict[str, ExecutorEntry] = {}
    assignment: dict[KeyGroupId, str] = {}
    pending: list[str] = []
    for size, group_units, index, count, host in zip(sizes, units, indexes, counts, hosts):
        names = [executor_name(topology, len(executors) + j) for j in range(count)]
        share = request(size, count)
        if room is not None:  # an overloaded host's room is shared by its executors
            free = room.get(host or "", 0.0)
            share = min(share, max(MIN_EXECUTOR_CPU, math.floor(free / on_host[host] * 10 + 1e-9) / 10))
            if not fits(MIN_EXECUTOR_CPU, free):
                pending += names
        for name in names:
            executors[name] = ExecutorEntry(host=host, cpu=share)
        rank = {kg: i for i, kg in enumerate(index)}
        assignment.update({unit: names[rank[unit[1]] % count] for unit in group_units})
    capacity = None
    if room is not None:
        placed = len(executors) - len(pending)
        rate = sum(aeolus.input_rate.get(op.name, 0.0) for op in spec.operators if op.source is not None)
        per_executor = max(scaling.executor_capacity, footprint or 0.0)
        capacity = planned_shortfall(wanted, placed, per_executor, aeolus.demand, sum(room.values()), rate)
    return Deployment(executors, assignment, tuple(counts), wanted, aeolus.demand, capacity, tuple(pending))


def _groups(
    plan: Plan,
    pe_units: Sequence[Sequence[KeyGroupId]],
    room: Mapping[str, float] | None,
    fixed: float | None,
) -> list[list[int]]:
    """PEs that share an executor: each PE alone, unless its host has room for fewer executors of the
    ``fixed`` request than COLA put PEs there (or for fewer than one of the least request each); then
    that host's PEs are packed into as many executors as its room takes (at least one: a host without
    room keeps one executor, which stays Pending)."""
    live = [i for i, units in enumerate(pe_units) if units]
    if room is None:
        return [[i] for i in live]
    by_host: dict[str | None, list[int]] = {}
    for i in live:
        by_host.setdefault(plan.pes[i].host, []).append(i)
    groups: list[list[int]] = []
    for host, members in by_host.items():
        slots = math.floor((room.get(host or "", 0.0) + 1e-6) / (fixed or MIN_EXECUTOR_CPU))
        bins = max(1, min(len(members), slots))
        labels = pack([plan.pes[i].size for i in members], bins)
        groups += [[i for i, b in zip(members, labels) if b == k] for k in range(bins)]
    return sorted(groups)


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
