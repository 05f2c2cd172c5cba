"""Advanced COLA (Khandekar et al., Section 3.3, Figure 4): constraints and the objective f(U, C).

    Run Pre-processor
    Phase 1. Repeat: if PE exlocation constraints are satisfied, go to Phase 2;
             Oracle (phase 1) picks p; Graph Partitioner (phase 1) splits p
    Phase 2. Repeat: PE scheduler computes a schedule with utilisation u; if valid, go to Phase 3;
             Oracle picks p; Graph Partitioner splits p; c <- communication cost
    Phase 3. Repeat: s <- f(u, c); if feasible, go to Phase 4;
             Oracle picks p; split; c <- cost; schedule with utilisation u
    Phase 4. Repeat: Oracle picks p; split; C <- cost; if C > (1 + T) c, go to Post-processor;
             schedule with utilisation U; S <- f(U, C); s <- min{s, S}
    Run Post-processor (then single-operator moves between PEs, refine.py; not in the paper)
The plan kept is the one achieving the final s (the paper's "stars" between phases 3 and 4, Figure 5).
"""

from __future__ import annotations

from collections.abc import Callable

import networkx as nx

from streamtopo.planner.cluster import Cluster
from streamtopo.planner.placement.cola import oracle
from streamtopo.planner.placement.cola.basic import Run, start
from streamtopo.planner.placement.cola.options import ColaOptions, NoValidPlan
from streamtopo.planner.placement.cola.partition import Partition
from streamtopo.planner.placement.cola.placement import Schedule
from streamtopo.planner.placement.cola.postprocess import postprocess
from streamtopo.planner.placement.cola.refine import FEASIBLE, refine_moves
from streamtopo.planner.placement.cola.validity import (
    counting_problems,
    diagnose,
    fused_resource_problems,
    valid_plan_exists,
)
from streamtopo.planner.placement.constraints import GraphConstraints
from streamtopo.planner.plan import Plan


def advanced_cola(
    graph: nx.DiGraph, cluster: Cluster, constraints: GraphConstraints, options: ColaOptions, seed: int = 0
) -> Plan:
    """Phases 1-4 and the post-processor; raises NoValidPlan when no plan meets the constraints."""
    problems = counting_problems(graph, cluster, constraints)
    if problems:
        raise NoValidPlan(problems)
    run = start(graph, cluster, constraints, options, seed, options.scheduler, constraints)
    problems = fused_resource_problems(run.atoms, constraints)
    if problems:
        raise NoValidPlan(problems)
    if (run.cons.host_level or any(a is not None for a in run.atoms.allowed)) and not valid_plan_exists(
        run.atoms, run.cons, run.capacity, options.ip_time_limit, seed
    ):
        raise NoValidPlan(diagnose(run.atoms, run.cons, run.capacity, options.ip_time_limit, seed))

    partition = Partition.initial(run.atoms, run.cons)
    # Phase 1: PE exlocation (and host exlocation, which implies it; and disjoint nodeSelectors).
    while (i := oracle.exlocation_violator(partition)) is not None:
        run.split(partition, i, phase=1)
    # Phase 2: validity (resource matching, host colocation/exlocation, HA, host dedication).
    while (found := run.schedule(partition)) is None:
        i = oracle.phase2(partition)
        if i is None:
            raise NoValidPlan(diagnose(run.atoms, run.cons, run.capacity, options.ip_time_limit, seed))
        run.split(partition, i, phase=2)
    # Phase 3: feasibility (U <= 1); the least utilised valid plan is kept in case none fits.
    fallback = (found.utilization, partition.copy(), found)
    while found.utilization > FEASIBLE:
        i = oracle.largest(partition)
        if i is None:
            return run.plan(fallback[1], fallback[2], {"phase": "infeasible", "phases": _phases(run)})
        run.split(partition, i, phase=3)
        found = run.schedule(partition) or found  # validity persists; an undecided IP keeps going
        if found.utilization < fallback[0]:
            fallback = (found.utilization, partition.copy(), found)
    c = partition.cut()
    s = run.objective(partition, found)
    best = (s, partition.copy(), found)
    # Phase 4: keep splitting while C <= (1 + T) c, keeping the best f(U, C).
    stop = "threshold"
    if options.threshold > 0:
        stale = 0
        while (i := oracle.largest(partition)) is not None:
            if best[0] <= _objective_floor(run, partition.cut()):
                stop = "bound"
                break
            if options.phase4_patience is not None and stale >= options.phase4_patience:
                stop = "patience"
                break
            run.split(partition, i, phase=4)
            if partition.cut() > (1 + options.threshold) * c:
                break
            current = run.schedule(partition)
            stale += 1
            if current is not None and current.utilization <= FEASIBLE:
                score = run.objective(partition, current)
                if score < best[0]:
                    best, stale = (score, partition.copy(), current), 0
        else:
            stop = "singletons"
    _, partition, found = best
    merges = 0
    if options.postprocess:
        partition, found, merges = postprocess(partition, found, _improves(run), _hopeless(run))
    found = _polish(run, partition, found)
    moved = 0
    if options.refine_moves:
        partition, found, moved = refine_moves(
            partition, found, run.capacity, (options.utilization_weight, options.communication_weight)
        )
        if moved:
            found = _polish(run, partition, found)
    return run.plan(
        partition,
        found,
        {
            "objective": run.objective(partition, found),
            "first_feasible_cut": c,
            "postprocess_merges": merges,
            "refine_moves": moved,
            "phases": _phases(run),
            "phase4_stop": stop,
        },
    )


def _polish(run: Run, partition: Partition, found: Schedule) -> Schedule:
    """The final placement by the IP, kept only if it lowers U (a time-limited solve may not)."""
    polished = run.schedule(partition, polish=True)
    return polished if polished is not None and polished.utilization < found.utilization else found


def _improves(run: Run) -> Callable[[Partition, Partition, Schedule], Schedule | None]:
    """Advanced mergeability: a valid, feasible schedule with f(U', C') <= f(U, C)."""

    def accept(trial: Partition, current: Partition, schedule: Schedule) -> Schedule | None:
        found = run.schedule(trial)
        if found is None or found.utilization > FEASIBLE:
            return None
        return found if run.objective(trial, found) <= run.objective(current, schedule) + 1e-12 else None

    return accept


def _hopeless(run: Run) -> Callable[[Schedule, float, float, float], bool]:
    """A merge whose PE alone would overload the largest host, or whose PE size already pushes
    f(U, C - saving) above the current f, can never be accepted (U >= merged SIZE / max B_h)."""
    largest = max(run.capacity.values())

    def check(schedule: Schedule, cut: float, merged: float, saving: float) -> bool:
        if merged > largest * FEASIBLE:
            return True
        floor = run.options.objective(merged / largest, cut - saving, run.capacity)
        return floor > run.options.objective(schedule.utilization, cut, run.capacity) + 1e-12

    return check


def _objective_floor(run: Run, cut: float) -> float:
    """A lower bound on f(U, C') for every C' >= cut, i.e. for every plan further down the tree.

    The hosts carry the operators plus both ends of every cut stream, w(V) + 2C, so U is at least
    that over the total capacity; f grows with U and C, and C only grows as PEs split.
    """
    capacity = run.capacity
    floor_u = (float(run.atoms.w.sum()) + 2 * cut) / sum(capacity.values())
    return run.options.objective(floor_u, cut, capacity)


def _phases(run: Run) -> dict[str, int]:
    counts: dict[str, int] = {}
    for s in run.splits:
        counts[f"phase{s['phase']}_splits"] = counts.get(f"phase{s['phase']}_splits", 0) + 1
    return counts
