"""Deciding whether any valid plan exists, and naming the constraints that rule one out.

Section 3.3: validity persists under splitting, so a valid plan exists iff the finest partition (every
super operator alone) has a valid schedule; COLA finds this by splitting down to singletons. We ask the
same question of the IP (3)-(8) on the finest partition up front (it is the corollary the paper
states), so the answer comes without the walk down the tree, and the message says why: counting
checks first ("hostExlocation[0] needs 3 hosts, the cluster has 2"), then a deletion filter over the
constraint entries that leaves a minimal set that cannot hold together.
"""

from __future__ import annotations

from dataclasses import replace

import networkx as nx

from streamtopo.planner.cluster import Cluster
from streamtopo.planner.graph import operator_of
from streamtopo.planner.placement.cola.ip_scheduler import ip_schedule
from streamtopo.planner.placement.cola.partition import AtomConstraints, Partition
from streamtopo.planner.placement.cola.preprocess import AtomGraph
from streamtopo.planner.placement.constraints import GraphConstraints

DIAGNOSE_MAX_ENTRIES = 40


def counting_problems(graph: nx.DiGraph, cluster: Cluster, constraints: GraphConstraints) -> list[str]:
    """Constraints that need more hosts than exist, or hosts that do not exist."""
    hosts = len(cluster.hosts)
    problems = []
    unmatched = sorted({operator_of(n) for n, allowed in constraints.allowed_hosts.items() if not allowed})
    for name in unmatched:
        problems.append(f"requires.nodeSelector: no host matches the labels operator {name!r} requires")
    for label, sets in constraints.host_exlocation:
        needed = sum(1 for s in sets if s)
        if needed > hosts:
            problems.append(f"{label} needs {needed} hosts, the cluster has {hosts}")
    for ha in constraints.high_availability:
        needed = sum(1 for r in ha.replicas if r)
        if needed > hosts:
            problems.append(f"{ha.name} needs {needed} hosts (one per replica), the cluster has {hosts}")
    if constraints.host_dedication:
        dedicated = set().union(*(m for _, m in constraints.host_dedication))
        needed = len(constraints.host_dedication) + (1 if set(graph.nodes) - dedicated else 0)
        if needed > hosts:
            problems.append(
                f"hostDedication needs {needed} hosts (one per dedicated operator and one for "
                f"the rest), the cluster has {hosts}"
            )
    return problems


def fused_resource_problems(atoms: AtomGraph, constraints: GraphConstraints) -> list[str]:
    """PE-colocated operators whose nodeSelectors no single host satisfies."""
    problems = []
    for label, members in constraints.pe_colocation:
        atom_ids = {atoms.atom_of[n] for n in members}
        if any(atoms.allowed[a] == frozenset() for a in atom_ids):
            problems.append(f"{label}: no host matches the nodeSelectors of all its operators")
    return problems


def valid_plan_exists(
    atoms: AtomGraph,
    cons: AtomConstraints,
    capacity: dict[str, float],
    time_limit: float,
    seed: int,
    resource_matching: bool = True,
) -> bool:
    """Does the finest partition have a valid schedule? (An undecided solve counts as yes, so COLA
    proceeds and its own phase-2 walk decides.)"""
    problem = Partition.singletons(atoms, cons).placement_problem(capacity, resource_matching)
    hosts, proven = ip_schedule(problem, time_limit, seed)
    return hosts is not None or not proven


def diagnose(
    atoms: AtomGraph, cons: AtomConstraints, capacity: dict[str, float], time_limit: float, seed: int
) -> list[str]:
    """A minimal set of constraint entries that together admit no valid plan (deletion filter)."""
    entries: list[tuple[str, str, int]] = (
        [("host_colocation", label, i) for i, (label, _) in enumerate(cons.host_colocation)]
        + [("host_exlocation", label, i) for i, (label, _) in enumerate(cons.host_exlocation)]
        + [("high_availability", ha.name, i) for i, ha in enumerate(cons.high_availability)]
        + [("dedicated", label, i) for i, (label, _, host) in enumerate(cons.dedicated) if host]
        + [("resource", "requires.nodeSelector", 0)]
    )
    if len(entries) > DIAGNOSE_MAX_ENTRIES:
        return [
            (
                "the host colocation, host exlocation, high availability, host dedication and "
                "resource matching constraints cannot all hold on this cluster"
            )
        ]

    def feasible(kept: list[tuple[str, str, int]]) -> bool:
        chosen = {(field, i) for field, _, i in kept}
        subset = replace(
            cons,
            host_colocation=[
                c for i, c in enumerate(cons.host_colocation) if ("host_colocation", i) in chosen
            ],
            host_exlocation=[
                c for i, c in enumerate(cons.host_exlocation) if ("host_exlocation", i) in chosen
            ],
            high_availability=[
                c for i, c in enumerate(cons.high_availability) if ("high_availability", i) in chosen
            ],
            dedicated=[c for i, c in enumerate(cons.dedicated) if not c[2] or ("dedicated", i) in chosen],
        )
        return valid_plan_exists(
            atoms, subset, capacity, time_limit, seed, resource_matching=("resource", 0) in chosen
        )

    kept = list(entries)
    for entry in entries:
        trial = [e for e in kept if e != entry]
        if not feasible(trial):
            kept = trial
    labels = [label for _, label, _ in kept]
    if len(labels) == 1:
        return [f"{labels[0]} cannot be met on this cluster"]
    return [f"{', '.join(labels)} cannot all be met together on this cluster"]
