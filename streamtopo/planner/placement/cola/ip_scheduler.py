"""Advanced COLA's PE scheduler: the integer program (3)-(8), solved with OR-Tools CP-SAT.

Khandekar et al., Section 3.3:
    minimise   max_h sum_p SIZE(S_p) x_{p,h} / B_h                  (3)
    subject to x_{p,h} = 0                 if h not in R_p          (4) resource matching
               x_{p1,h} = x_{p2,h}  for all h, if p1 =_HC p2        (5) host colocation
               x_{p1,h} + x_{p2,h} <= 1 for all h, (p1, p2) in HE   (6) host exlocation
               sum_h x_{p,h} = 1    for all p                       (7)
               x_{p,h} in {0, 1}                                    (8)
CP-SAT needs integers: each coefficient SIZE(S_p) / B_h is scaled by ``SCALE`` and rounded, and the
objective is an integer Z bounding every host's scaled utilisation, so the optimum is exact up to
about n_p / SCALE in utilisation. Solves are deterministic: one worker, a seed, and a deterministic
time limit.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

from ortools.sat.python import cp_model

from streamtopo.planner.placement.cola.placement import PlacementProblem

SCALE = 1_000_000


def ip_schedule(
    problem: PlacementProblem,
    time_limit: float = 2.0,
    seed: int = 0,
    hint: Sequence[str] | None = None,
    gap: float = 0.0,
) -> tuple[list[str] | None, bool]:
    """(host of each PE or None, proven): ``proven`` says the answer (or infeasibility) is optimal/proven.

    ``gap`` lets CP-SAT stop once its answer is within that relative gap of its lower bound.
    """
    hosts = list(problem.capacity)
    model = cp_model.CpModel()
    x: dict[tuple[int, str], cp_model.IntVar] = {}
    for p in range(problem.count):
        allowed = problem.allowed[p]
        for h in hosts:
            if allowed is None or h in allowed:  # (4): variables outside R_p are fixed to 0 by absence
                x[p, h] = model.new_bool_var(f"x_{p}_{h}")
        model.add_exactly_one(x[p, h] for h in hosts if (p, h) in x)  # (7)
    for cls in problem.colocated:  # (5)
        first, *rest = cls
        for other in rest:
            for h in hosts:
                a, b = x.get((first, h)), x.get((other, h))
                if a is None and b is None:
                    continue
                if a is None or b is None:
                    model.add(next(v for v in (a, b) if v is not None) == 0)
                else:
                    model.add(a == b)
    for k, (group_a, group_b) in enumerate(problem.exlocated):  # (6)
        if group_a & group_b:
            return None, True
        for h in hosts:
            xa = [x[p, h] for p in sorted(group_a) if (p, h) in x]
            xb = [x[q, h] for q in sorted(group_b) if (q, h) in x]
            if len(xa) * len(xb) <= len(xa) + len(xb) + 1:
                for a in xa:
                    for b in xb:
                        model.add_at_most_one([a, b])
            elif xa and xb:
                # Same constraint for a biclique: u = "some PE of A is on h"; no PE of B may join it.
                used = model.new_bool_var(f"u_{k}_{h}")
                for a in xa:
                    model.add_implication(a, used)
                for b in xb:
                    model.add_implication(b, used.negated())
    coefficient = {(p, h): round(problem.sizes[p] * SCALE / problem.capacity[h]) for p, h in x}
    bound = sum(
        max((coefficient[p, h] for h in hosts if (p, h) in x), default=0) for p in range(problem.count)
    )
    z = model.new_int_var(0, max(bound, 1), "max_utilisation")
    load = {h: sum(coefficient[p, h] * x[p, h] for p in range(problem.count) if (p, h) in x) for h in hosts}
    for h in hosts:
        model.add(load[h] <= z)  # (3)
    for twins in _interchangeable(problem, hosts):
        # Symmetry breaking: identical hosts are used in decreasing order of load (same optimum).
        for heavier, lighter in pairwise(twins):
            model.add(load[heavier] >= load[lighter])
    model.minimize(z)
    if hint is not None:
        for (p, h), var in x.items():
            model.add_hint(var, hint[p] == h)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = seed
    solver.parameters.max_deterministic_time = time_limit
    solver.parameters.relative_gap_limit = gap
    status = solver.solve(model)
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        placement = [
            next(h for h in hosts if (p, h) in x and solver.value(x[p, h])) for p in range(problem.count)
        ]
        return placement, status == cp_model.OPTIMAL
    return None, status == cp_model.INFEASIBLE


def _interchangeable(problem: PlacementProblem, hosts: list[str]) -> list[list[str]]:
    """Classes of hosts no constraint tells apart: same capacity and same membership in every R_p."""
    classes: dict[tuple[object, ...], list[str]] = {}
    for h in hosts:
        key = (problem.capacity[h], tuple(a is None or h in a for a in problem.allowed))
        classes.setdefault(key, []).append(h)
    return [c for c in classes.values() if len(c) > 1]
