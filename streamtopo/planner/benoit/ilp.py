"""The integer program of Benoit et al. (RR-6864, Section 4) for Proc-Nb, Proc-Power, BW-Sum and BW-Max.

Variables (Section 4.2, with the products linearised the way Section 4.3 does it):
- ``x[n, u]``: node n on processor u (each node on exactly one processor);
- ``used[u]``: some node on u (``x <= used``);
- ``load[i, u]``: what operator i costs u, in millionths of s_u, at least rate_n w_i / s_u for every node n of
  i on u, so an operator is computed once at its highest rate (constraint (1));
- ``send[i, u, v]``: bytes/s of i's result from u to v, at least rate_n delta_i (x[n,u] + x[parent,v] - 1),
  so a result crosses a pair once at its highest rate;
- ``z[j, u, v]``: u downloads object j from holder v (one holder when a node on u needs j; none when u holds
  it); ``get[j, u, v]`` its bytes/s, at least delta_j f_j^(k) (x[n,u] + z[j,u,v] - 1). Objects no processor
  holds are downloaded from outside (the downloader's card only).
- constraint (1) adds each flow's crossing (:mod:`.problem`): operations per byte, half at each end;
- constraints (5) cards and (6) links sum those flows; objectives (7) Proc-Power (speed of the processors
  used; Proc-Nb counts them), (8) BW-Sum (all bytes on links) and (9) BW-Max (the highest link use
  relative to its bandwidth).

CP-SAT needs integers: demands are rounded up and capacities down (to a millionth of the smallest capacity),
so every solution it returns satisfies the exact constraints; ``Usage.violations()`` re-checks it. Limits
are deterministic (``max_deterministic_time``, one seed), so the same instance gives the same answer on any
machine; ``hint`` starts the search from a heuristic's mapping.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from ortools.sat.python.cp_model import IntVar

from streamtopo.planner.benoit.problem import NodeRef, Objective, Problem, Usage, evaluate
from streamtopo.planner.rebalance.albic.solver import CpSatModel, SolveLimits

SCALE = 1_000_000
"""Integer resolution: compute in millionths of a processor, bandwidth in millionths of the smallest capacity."""
PEAK = 10_000
"""BW-Max resolution: the peak link use in steps of 0.01 %."""


@dataclass(frozen=True)
class IlpResult:
    status: str
    """optimal, feasible (limit reached with a solution), infeasible, or unknown (limit reached, none)."""
    objective: Objective
    usage: Usage | None
    bound: float
    """The solver's proven lower bound on the cost, in the objective's units."""
    work: float
    """CP-SAT deterministic time spent (machine-independent)."""

    @property
    def feasible(self) -> bool:
        return self.usage is not None

    def cost(self) -> float:
        return self.usage.cost(self.objective) if self.usage is not None else float("inf")

    @property
    def gap(self) -> float:
        cost = self.cost()
        return 0.0 if cost == self.bound else (cost - self.bound) / max(abs(cost), 1e-12)


def solve_ilp(
    problem: Problem,
    objective: Objective = "proc-nb",
    *,
    deterministic_time: float = 30.0,
    seed: int = 0,
    hint: Mapping[NodeRef, str] | None = None,
) -> IlpResult:
    """Solve the Section 4 program; ``hint`` is a complete placement to start from (e.g. TopDownBFS's)."""
    return _Program(problem, objective).solve(SolveLimits(deterministic_time, 0.0, seed, 1), hint)


class _Program:
    def __init__(self, problem: Problem, objective: Objective) -> None:
        self.problem, self.objective = problem, objective
        self.m = CpSatModel()
        platform = problem.platform
        self.procs = [p.name for p in platform.processors]
        capacities = [p.card for p in platform.processors] + [
            platform.bandwidth(u, v) for i, u in enumerate(self.procs) for v in self.procs[i + 1 :]
        ]
        finite = [c for c in capacities if math.isfinite(c) and c > 0]
        self.unit = min(finite) / SCALE if finite else 1.0
        self.x = {(a.name, n.name): {u: self.m.bool() for u in self.procs} for a, n in problem.nodes()}
        self.used = {u: self.m.bool() for u in self.procs}
        self.flows: dict[str, list[IntVar]] = defaultdict(list)
        """Processor -> flow variables through its card; pair key 'u|v' -> flow variables on its link."""
        self.crossings: dict[str, list[tuple[IntVar, float]]] = defaultdict(list)
        """Processor -> (flow variable, operations per byte at this end) of the flows it sends or receives."""
        for row in self.x.values():
            self.m.exactly_one(list(row.values()))
            for u, var in row.items():
                self.m.linear([var, self.used[u]], [1, -1], -math.inf, 0)
        self._compute()
        self._communication()
        self._downloads()
        self._capacities()
        self._objective()

    def _demand(self, bytes_per_second: float) -> int:
        return math.ceil(bytes_per_second / self.unit - 1e-9)

    def _at_least(self, var: IntVar, demand: int, conditions: list[IntVar]) -> None:
        """var >= demand * (sum(conditions) - (len - 1)): the demand applies when every condition holds."""
        k = len(conditions)
        self.m.linear([var, *conditions], [1, *([-demand] * k)], -demand * (k - 1), math.inf)

    def _compute(self) -> None:
        platform = self.problem.platform
        loads: dict[tuple[str, str], IntVar] = {}
        """(operator, processor) -> its load in millionths of s_u; constraint (1) is in :meth:`_capacities`."""
        for app, node in self.problem.nodes():
            work = self.problem.operators[node.operator].work
            for u in self.procs:
                need = math.ceil(app.rate(node) * work / platform.processor(u).speed * SCALE - 1e-9)
                if need > SCALE:
                    self.m.linear([self.x[(app.name, node.name)][u]], [1], 0, 0)
                    continue
                load = loads.setdefault((node.operator, u), self.m.num(0, SCALE))
                self._at_least(load, need, [self.x[(app.name, node.name)][u]])
        self.loads = loads

    def _communication(self) -> None:
        sends: dict[tuple[str, str, str], IntVar] = {}
        for app in self.problem.applications:
            for parent in app.nodes:
                for child_name in parent.children:
                    child = app.node(child_name)
                    demand = self._demand(app.rate(child) * self.problem.operators[child.operator].output)
                    if demand == 0:
                        continue
                    for u in self.procs:
                        for v in self.procs:
                            if u == v:
                                continue
                            key = (child.operator, u, v)
                            if key not in sends:  # bounded by the highest demand of any edge of this operator
                                sends[key] = self.m.num(0, self._highest_send(child.operator))
                                crossing = self.problem.operators[child.operator].crossing
                                self._flow(u, v, sends[key], crossing)
                            self._at_least(
                                sends[key],
                                demand,
                                [self.x[(app.name, child_name)][u], self.x[(app.name, parent.name)][v]],
                            )

    def _downloads(self) -> None:
        self.servers: dict[tuple[str, str], dict[str | None, IntVar]] = {}
        gets: dict[tuple[str, str, str | None], IntVar] = {}
        for app, node in self.problem.nodes():
            for obj_name in node.objects:
                obj = self.problem.objects[obj_name]
                demand = self._demand(obj.size * app.frequency(obj_name))
                for u in self.procs:
                    if u in obj.holders:
                        continue
                    x = self.x[(app.name, node.name)][u]
                    choices = self.servers.get((obj_name, u))
                    if choices is None:
                        holders: list[str | None] = [*sorted(obj.holders)] or [None]
                        choices = self.servers[(obj_name, u)] = {v: self.m.bool() for v in holders}
                    self.m.linear([*choices.values(), x], [1] * len(choices) + [-1], 0, math.inf)
                    for v, z in choices.items():
                        get = gets.get((obj_name, u, v))
                        if get is None:
                            get = gets[(obj_name, u, v)] = self.m.num(
                                0, self._demand(obj.size * self._top(obj_name))
                            )
                            self._flow(u, v, get, obj.crossing)
                        self._at_least(get, demand, [x, z])

    def _highest_send(self, operator: str) -> int:
        output = self.problem.operators[operator].output
        return max(
            self._demand(app.rate(n) * output) for app, n in self.problem.nodes() if n.operator == operator
        )

    def _top(self, obj: str) -> float:
        return max(a.frequency(obj) for a in self.problem.applications)

    def _flow(self, u: str, v: str | None, var: IntVar, crossing: float) -> None:
        """A flow between u and v (None: outside the platform) uses both cards and their link, and
        ``crossing`` operations per byte, half at each end on the platform."""
        for end in (u,) if v is None else (u, v):
            self.flows[end].append(var)
            if crossing > 0:
                self.crossings[end].append((var, crossing / 2))
        if v is not None:
            self.flows["|".join(sorted((u, v)))].append(var)

    def _capacities(self) -> None:
        platform = self.problem.platform
        self._compute_capacity()
        for p in platform.processors:
            terms = self.flows.get(p.name, [])
            if terms and math.isfinite(p.card):
                self.m.linear(terms, [1] * len(terms), -math.inf, math.floor(p.card / self.unit))
        for i, u in enumerate(self.procs):
            for v in self.procs[i + 1 :]:
                terms = self.flows.get(f"{u}|{v}", [])
                bw = platform.bandwidth(u, v)
                if terms and math.isfinite(bw):
                    self.m.linear(terms, [1] * len(terms), -math.inf, math.floor(bw / self.unit))

    def _compute_capacity(self) -> None:
        """Constraint (1): loads plus crossings within s_u. A crossing costs var * unit * c / s_u of the
        processor, in millionths a real coefficient k; the row is multiplied by ``r`` (a power of ten that
        gives the smallest k two significant digits, at most 10^6) and each k * r rounded up, so a solution
        also meets the exact constraint."""
        platform = self.problem.platform
        coefficients = {
            u: [(var, self.unit * c * SCALE / platform.processor(u).speed) for var, c in self.crossings[u]]
            for u in self.procs
        }
        smallest = min((k for terms in coefficients.values() for _, k in terms), default=100.0)
        r = 10 ** min(6, max(0, math.ceil(math.log10(100 / smallest))))
        for u in self.procs:
            loads = [var for (_, v), var in self.loads.items() if v == u]
            hops = coefficients[u]
            if not loads and not hops:
                continue
            self.m.linear(
                [*loads, *(var for var, _ in hops)],
                [r] * len(loads) + [math.ceil(k * r - 1e-9) for _, k in hops],
                -math.inf,
                SCALE * r,
            )

    def _objective(self) -> None:
        platform = self.problem.platform
        if self.objective == "proc-nb":
            self.m.minimize(list(self.used.values()), [1] * len(self.used))
        elif self.objective == "proc-power":
            slowest = min(p.speed for p in platform.processors)
            self.m.minimize(
                [self.used[p.name] for p in platform.processors],
                [round(p.speed / slowest * SCALE) for p in platform.processors],
            )
        else:
            links = {k: terms for k, terms in self.flows.items() if "|" in k}
            if self.objective == "bw-sum":
                variables = [t for terms in links.values() for t in terms]
                self.m.minimize(variables, [1] * len(variables))
            else:  # (9): peak / PEAK >= bytes on a link / its bw, i.e. sum(terms) <= peak * bw / (unit * PEAK)
                peak = self.m.num(0, PEAK)
                for key, terms in links.items():
                    bw = platform.bandwidth(*key.split("|"))
                    if math.isfinite(bw):
                        per_step = math.floor(bw / (self.unit * PEAK))
                        self.m.linear([*terms, peak], [1] * len(terms) + [-per_step], -math.inf, 0)
                self.m.minimize([peak], [1])

    def solve(self, limits: SolveLimits, hint: Mapping[NodeRef, str] | None) -> IlpResult:
        if hint:
            refs = [r for r in self.x if r in hint]
            self.m.hint(
                [self.x[r][u] for r in refs for u in self.procs],
                [int(hint[r] == u) for r in refs for u in self.procs],
            )
        status = self.m.solve(limits)
        bound = float(self.m.solver.best_objective_bound) if status in ("optimal", "feasible") else math.inf
        if status not in ("optimal", "feasible"):
            return IlpResult(status, self.objective, None, bound, self.m.deterministic_time)
        placement = {r: next(u for u, var in row.items() if self.m.value(var)) for r, row in self.x.items()}
        servers: dict[tuple[str, str], str | None] = {}
        for (obj, u), choices in self.servers.items():
            chosen = [v for v, z in choices.items() if self.m.value(z)]
            if chosen:
                servers[(obj, u)] = chosen[0]
        usage = evaluate(self.problem, placement, servers=servers)
        # integer rounding can put the bound a hair above the exact cost of the optimum it proved
        bound = min(self._bound_in_units(bound), usage.cost(self.objective))
        return IlpResult(status, self.objective, usage, bound, self.m.deterministic_time)

    def _bound_in_units(self, bound: float) -> float:
        """The solver's bound in the objective's own units (Usage.cost's)."""
        platform = self.problem.platform
        if self.objective == "proc-power":
            return bound * min(p.speed for p in platform.processors) / SCALE
        if self.objective == "bw-sum":
            return bound * self.unit
        if self.objective == "bw-max":
            return bound / PEAK
        return bound
