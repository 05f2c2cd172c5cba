"""A thin linear-model adapter over OR-Tools, so the ALBIC MILP is written once for two backends.

``cp-sat`` (CP-SAT on scaled integers) is the default; ``scip``/``cbc``/``highs`` go through pywraplp
(a MIP backend). docs/albic.md records the measurement behind the default. Wall times come from the
solvers themselves (the planner reads no clock).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ortools.linear_solver import pywraplp
from ortools.sat.python import cp_model

MIP_BACKENDS = {"scip": "SCIP", "cbc": "CBC"}


class LinearBackend:
    """The operations the MILP needs; subclasses bind them to one OR-Tools solver."""

    wall_time: float = 0.0

    def bool(self) -> Any: ...
    def num(self, lo: int, hi: int) -> Any: ...
    def linear(self, vars_: Sequence[Any], coefs: Sequence[int], lo: float, hi: float) -> None: ...
    def exactly_one(self, vars_: Sequence[Any]) -> None:
        self.linear(vars_, [1] * len(vars_), 1, 1)
    def fix(self, var: Any, value: int) -> None:
        self.linear([var], [1], value, value)
    def minimize(self, vars_: Sequence[Any], coefs: Sequence[int]) -> None: ...
    def hint(self, vars_: Sequence[Any], values: Sequence[int]) -> None: ...
    def solve(self, time_limit: float, deterministic_time: float | None, seed: int, workers: int) -> str: ...
    def value(self, var: Any) -> float: ...


class CpSatBackend(LinearBackend):
    def __init__(self) -> None:
        self.model = cp_model.CpModel()
        self.solver = cp_model.CpSolver()

    def bool(self) -> Any:
        return self.model.new_bool_var("")

    def num(self, lo: int, hi: int) -> Any:
        return self.model.new_int_var(lo, hi, "")

    def linear(self, vars_, coefs, lo, hi) -> None:
        expr = cp_model.LinearExpr.weighted_sum(list(vars_), list(coefs))
        if lo == hi:
            self.model.add(expr == int(lo))
        else:
            if lo > -float("inf"):
                self.model.add(expr >= int(lo))
            if hi < float("inf"):
                self.model.add(expr <= int(hi))

    def exactly_one(self, vars_) -> None:
        self.model.add_exactly_one(vars_)

    def minimize(self, vars_, coefs) -> None:
        self.model.minimize(cp_model.LinearExpr.weighted_sum(list(vars_), list(coefs)))

    def hint(self, vars_, values) -> None:
        for v, x in zip(vars_, values):
            self.model.add_hint(v, int(x))

    def solve(self, time_limit, deterministic_time, seed, workers) -> str:
        p = self.solver.parameters
        p.max_time_in_seconds = float(time_limit)
        if deterministic_time is not None:
            p.max_deterministic_time = float(deterministic_time)
        p.random_seed = int(seed)
        p.num_workers = int(workers)
        status = self.solver.solve(self.model)
        self.wall_time = self.solver.wall_time
        return {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible",
                cp_model.INFEASIBLE: "infeasible"}.get(status, "unknown")

    def value(self, var) -> float:
        return float(self.solver.value(var))


class MipBackend(LinearBackend):
    def __init__(self, name: str) -> None:
        solver = pywraplp.Solver.CreateSolver(MIP_BACKENDS[name])
        if solver is None:
            raise ValueError(f"MIP backend {name!r} is not available in this OR-Tools build")
        self.solver = solver
        self.name = name
        self.inf = solver.infinity()
        self._hint_vars: list[Any] = []
        self._hint_vals: list[float] = []

    def bool(self) -> Any:
        return self.solver.BoolVar("")

    def num(self, lo, hi) -> Any:
        return self.solver.NumVar(lo, hi, "")

    def linear(self, vars_, coefs, lo, hi) -> None:
        c = self.solver.Constraint(-self.inf if lo == -float("inf") else lo, self.inf if hi == float("inf") else hi)
        for v, a in zip(vars_, coefs):
            c.SetCoefficient(v, float(a))

    def minimize(self, vars_, coefs) -> None:
        obj = self.solver.Objective()
        for v, a in zip(vars_, coefs):
            obj.SetCoefficient(v, float(a))
        obj.SetMinimization()

    def hint(self, vars_, values) -> None:
        self._hint_vars.extend(vars_)
        self._hint_vals.extend(float(x) for x in values)

    def solve(self, time_limit, deterministic_time, seed, workers) -> str:
        self.solver.SetTimeLimit(int(time_limit * 1000))
        if self.name != "cbc":
            self.solver.SetNumThreads(int(workers))
        if self._hint_vars:
            self.solver.SetHint(self._hint_vars, self._hint_vals)
        status = self.solver.Solve()
        self.wall_time = self.solver.wall_time() / 1000.0
        return {pywraplp.Solver.OPTIMAL: "optimal", pywraplp.Solver.FEASIBLE: "feasible",
                pywraplp.Solver.INFEASIBLE: "infeasible"}.get(status, "unknown")

    def value(self, var) -> float:
        return float(var.solution_value())


def make_backend(name: str) -> LinearBackend:
    if name == "cp-sat":
        return CpSatBackend()
    if name in MIP_BACKENDS:
        return MipBackend(name)
    raise ValueError(f"unknown solver backend {name!r}; use cp-sat, {', '.join(MIP_BACKENDS)}")
