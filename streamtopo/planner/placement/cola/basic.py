"""Basic COLA (Khandekar et al., Section 2.2) and the machinery Advanced COLA builds on.

    1. Run Pre-processor
    2. Use PE scheduler to compute an LPT schedule
    3. Repeat until the schedule is feasible:
       (a) Use Oracle to identify PE p to split next
       (b) Use Graph Partitioner to split p into two PEs
       (c) Use PE scheduler to compute an LPT schedule
    4. Run Post-processor
Basic COLA ignores user constraints (Advanced COLA handles them); its plan is still scored against
them, so a violated constraint shows in ``Plan.violations``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import numpy as np

from streamtopo.planner.cluster import Cluster
from streamtopo.planner.placement.cola import oracle
from streamtopo.planner.placement.cola.options import ColaOptions
from streamtopo.planner.placement.cola.partition import AtomConstraints, Partition, restate
from streamtopo.planner.placement.cola.placement import Schedule
from streamtopo.planner.placement.cola.postprocess import postprocess
from streamtopo.planner.placement.cola.preprocess import AtomGraph, preprocess
from streamtopo.planner.placement.cola.ratio_cut import min_ratio_cut
from streamtopo.planner.placement.cola.refine import FEASIBLE, refine_moves
from streamtopo.planner.placement.cola.scheduler import schedule
from streamtopo.planner.placement.constraints import GraphConstraints
from streamtopo.planner.plan import Plan, evaluate


@dataclass
class Run:
    """One COLA run: inputs, the capacity the planner sees (gamma * B_h), and a log for Plan.details."""

    graph: nx.DiGraph
    cluster: Cluster
    constraints: GraphConstraints
    options: ColaOptions
    seed: int
    atoms: AtomGraph
    cons: AtomConstraints
    scheduler: str
    splits: list[dict[str, Any]] = field(default_factory=list)

    @property
    def capacity(self) -> dict[str, float]:
        return {h: b * self.options.gamma for h, b in self.cluster.capacity.items()}

    def split(self, partition: Partition, i: int, phase: int) -> None:
        """Graph partitioner: the sparsest cut of PE i (phase 1 adds demand between exlocated pairs)."""
        adj, w = partition.split_view(i)
        separate = _local_pairs(partition, i) if phase == 1 else None
        cut = min_ratio_cut(adj, w, self.options, separate, seed=self.seed + len(self.splits))
        self.splits.append(
            {
                "phase": phase,
                "operators": len(w),
                "method": cut.method,
                "sparsity": cut.sparsity,
                "by_method": cut.by_method,
            }
        )
        partition.split(i, cut.side)

    def schedule(self, partition: Partition, polish: bool = False) -> Schedule | None:
        problem = partition.placement_problem(self.capacity)
        return schedule(
            problem,
            self.scheduler,
            self.options.ip_max_pes,
            self.options.ip_time_limit,
            self.seed,
            self.options.ip_gap,
            polish,
        )

    def objective(self, partition: Partition, found: Schedule) -> float:
        return self.options.objective(found.utilization, partition.cut(), self.capacity)

    def plan(self, partition: Partition, found: Schedule | None, details: dict[str, Any]) -> Plan:
        """Score the result with the shared evaluator (its violations come from the shared checker)."""
        hosts = found.hosts if found is not None else [None] * len(partition.pes)
        info = {
            "variant": "advanced" if self.options.advanced else "basic",
            "gamma": self.options.gamma,
            "scheduler": found.method if found else None,
            "lemma1_fusions": len(self.atoms.fusions),
            "super_operators": self.atoms.n,
            "splits": len(self.splits),
            "cut_methods": _method_summary(self.splits),
            **details,
        }
        return evaluate(
            self.graph,
            self.cluster,
            partition.node_groups(),
            hosts,
            "cola",
            constraints=self.constraints,
            details=info,
        )


def _local_pairs(partition: Partition, i: int, limit: int = 4096) -> np.ndarray:
    """Phase-1 exlocated pairs inside PE i, as local indices (capped; any one pair guides the cut)."""
    p = partition.pes[i]
    pairs: list[np.ndarray] = []
    for _, a, b in partition.violated_separations(i):
        left, right = np.flatnonzero(a[p]), np.flatnonzero(b[p])
        grid = np.array(np.meshgrid(left, right, indexing="ij")).reshape(2, -1).T
        pairs.append(grid[: max(1, limit - sum(len(x) for x in pairs))])
    return np.concatenate(pairs) if pairs else np.zeros((0, 2), dtype=np.int64)


def _method_summary(splits: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for s in splits:
        counts[s["method"]] = counts.get(s["method"], 0) + 1
    return counts


def start(
    graph: nx.DiGraph,
    cluster: Cluster,
    constraints: GraphConstraints,
    options: ColaOptions,
    seed: int,
    scheduler: str,
    planned: GraphConstraints,
) -> Run:
    """Pre-process and set up a run. ``planned`` are the constraints COLA plans for (none in Basic
    COLA); ``constraints`` are the ones the result is scored against."""
    atoms = preprocess(graph, planned)
    cons = restate(atoms, planned)
    return Run(graph, cluster, constraints, options, seed, atoms, cons, scheduler)


def basic_cola(
    graph: nx.DiGraph, cluster: Cluster, constraints: GraphConstraints, options: ColaOptions, seed: int = 0
) -> Plan:
    """Split the largest PE until LPT finds a feasible schedule, then post-process."""
    run = start(graph, cluster, constraints, options, seed, "lpt", GraphConstraints())
    partition = Partition.initial(run.atoms, run.cons)
    found = _lpt(run, partition)
    best = (found.utilization, partition.copy(), found)
    while found.utilization > FEASIBLE:
        i = oracle.largest(partition)
        if i is None:  # every PE is one (super) operator and still no fit: the best infeasible plan
            return run.plan(best[1], best[2], {"phase": "infeasible"})
        run.split(partition, i, phase=3)
        found = _lpt(run, partition)
        if found.utilization < best[0]:
            best = (found.utilization, partition.copy(), found)
    merges = 0
    if options.postprocess:

        def feasible(trial: Partition, *_: object) -> Schedule | None:
            s = _lpt(run, trial)
            return s if s.utilization <= FEASIBLE else None

        largest = max(run.capacity.values())
        partition, found, merges = postprocess(
            partition, found, feasible, lambda _s, _c, merged, _saving: merged > largest * FEASIBLE
        )
    moved = 0
    if options.refine_moves:
        partition, found, moved = refine_moves(partition, found, run.capacity, (0.0, 1.0))
    return run.plan(partition, found, {"postprocess_merges": merges, "refine_moves": moved})


def _lpt(run: Run, partition: Partition) -> Schedule:
    """Basic COLA's schedule: LPT with no resource matching, which always finds every PE a host."""
    found = run.schedule(partition)
    assert found is not None, "LPT without resource matching places every PE"
    return found
