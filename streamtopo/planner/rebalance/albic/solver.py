"""A thin adapter over OR-Tools CP-SAT for the ALBIC MILP (Madsen et al., ICDE 2017, Sec. 4.3.1).

Every limit is deterministic, so the same model gives the same answer on an idle or a loaded machine:
CP-SAT runs with a fixed worker count, a fixed seed, ``max_deterministic_time`` (CP-SAT's machine-independent
work measure, not seconds) and a relative gap; no wall-clock limit is set. With more than one worker,
``interleave_search`` keeps the search deterministic. The planner reads no clock: the wall time below is
CP-SAT's own measurement, reported in ``Rebalance.solve_seconds`` and never used for a decision.
docs/albic.md has the measurements (CBC, SCIP, HiGHS, CP-SAT) behind this choice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ortools.sat.python import cp_model

_STATUS = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible", cp_model.INFEASIBLE: "infeasible"}


@dataclass(frozen=True)
class SolveLimits:
    """The deterministic limits of one solve."""

    deterministic_time: float
    """CP-SAT deterministic time (``max_deterministic_time``)."""
    relative_gap: float
    """Stop once (incumbent - bound) / |incumbent| is at most this (``relative_gap_limit``)."""
    seed: int
    workers: int


class CpSatModel:
    """The operations the MILP needs (Boolean columns, bounded integers, linear rows, a hint), on CP-SAT."""

    def __init__(self) -> None:
        self.model = cp_model.CpModel()
        self.solver = cp_model.CpSolver()
        self.deterministic_time = 0.0
        """Work the last solve spent, in CP-SAT deterministic time (machine-independent)."""
        self.wall_time = 0.0
        """Wall seconds of the last solve as CP-SAT measured them; reported only."""

    def bool(self) -> cp_model.IntVar:
        return self.model.new_bool_var("")

    def num(self, lo: int, hi: int) -> cp_model.IntVar:
        return self.model.new_int_var(lo, hi, "")

    def linear(self, vars_: Sequence[cp_model.IntVar], coefs: Sequence[int], lo: float, hi: float) -> None:
        """``lo <= sum coefs * vars <= hi``; infinite sides are left out."""
        expr = cp_model.LinearExpr.weighted_sum(list(vars_), list(coefs))
        if lo == hi:
            self.model.add(expr == int(lo))
            return
        if lo > -float("inf"):
            self.model.add(expr >= int(lo))
        if hi < float("inf"):
            self.model.add(expr <= int(hi))

    def exactly_one(self, vars_: Sequence[cp_model.IntVar]) -> None:
        self.model.add_exactly_one(vars_)

    def minimize(self, vars_: Sequence[cp_model.IntVar], coefs: Sequence[int]) -> None:
        self.model.minimize(cp_model.LinearExpr.weighted_sum(list(vars_), list(coefs)))

    def hint(self, vars_: Sequence[cp_model.IntVar], values: Sequence[int]) -> None:
        """A complete start (the warm start): CP-SAT checks it and keeps it as its first solution."""
        for v, x in zip(vars_, values):
            self.model.add_hint(v, int(x))

    def solve(self, limits: SolveLimits) -> str:
        """Solve under deterministic limits only; returns optimal / feasible / infeasible / unknown.

        ``linearization_level`` 2 puts more of the model into CP-SAT's LP relaxation than the
        default 1: on the simulator's problems the same deterministic time reached better load distances
        (docs/albic.md). The gap is what lets most solves end before the budget.
        """
        p = self.solver.parameters
        p.num_workers = int(limits.workers)
        p.interleave_search = limits.workers > 1
        p.random_seed = int(limits.seed)
        p.max_deterministic_time = float(limits.deterministic_time)
        p.relative_gap_limit = float(limits.relative_gap)
        p.linearization_level = 2
        status = self.solver.solve(self.model)
        self.deterministic_time = float(self.solver.response_proto.deterministic_time)
        self.wall_time = float(self.solver.wall_time)
        return _STATUS.get(status, "unknown")

    def value(self, var: cp_model.IntVar) -> int:
        return int(self.solver.value(var))
