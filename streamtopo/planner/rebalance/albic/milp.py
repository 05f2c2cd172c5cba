"""The ALBIC load-balancing MILP (Madsen et al., ICDE 2017, Section 4.3.1), as written:

    min  w1 * d - w2 * (d_u + d_l)                                       (w1 >> w2)
    (1)  for all g_k:            sum_i x_ik = 1
    (2)  sum_i sum_k (1 - q_ik) * x_ik * mc_k <= maxMigrCost            (or a count: mc_k = 1)
    (3)  for all n_i in N:       sum_k x_ik * gLoad_k <= mean + (d - d_u)
    (4)  for all n_i in A:       sum_k x_ik * gLoad_k >= mean - (d - d_l)
    (5)  mean - d >= 0

with ``mean = ceil(1/|A| * sum_i load_i)`` (``mean_rounding="ceil"``; the default drops the rounding, see
MilpConfig). Extensions named in the paper or required by streamtopo:
- heterogeneous nodes: gLoad_k is multiplied by the node's weight 1/capacity in (3)/(4);
- multi-resource: the bottleneck resource (CPU or memory, ``resource``) is balanced, the other is capped
  per node ("add a constraint on the maximum usage of each non-bottleneck resource");
- set B (nodes marked for removal): no lower bound (4) and x_ik = 0 unless g_k is already there, i.e.
  Lemma 1 ("no key group migrates from A to B") is enforced rather than left to optimality, which a
  time-limited solve does not guarantee;
- key groups are grouped into units that share one x column: PE-co-located key groups and, for ALBIC,
  the collocation partitions of Algorithm 2 ("P is migrated as a unit"); a unit can be pinned to a node;
- PlacementRules: PE/host ex-location and HA through presence indicators, host co-location by equal
  per-host sums, resource matching by removing columns;
- d_u and d_l are kept in [0, d] (the paper: they are "chosen to be greater than zero"); then
  d_u + d_l <= 2 * d, so w1 = (2 * d_max + 1) * w2 makes the objective lexicographic. Below both: the
  paper's second objective ("minimize ... and sum over B of load_i"), as 2 per key group left on B, and
  1 per migrated key group (w2 = 3|G| + 1 exceeds both together). Among equally good (d, d_u + d_l) the
  solver drains B and otherwise moves as little as it can; without the B term, a B whose groups cannot
  lower d (key-group sizes keep d where it is) never drains, since every move costs;
- (5) is dropped only when the current allocation itself violates it (e.g. a marked node holds more than
  2 * mean): then the model as written may be infeasible, and at any optimum of the relaxed model
  (5) still holds whenever the written model was feasible;
- warm start: a largest-deviation-first greedy from the current allocation, within the same constraints, is
  the solution hint (CP-SAT starts from it) and the rounds' starting incumbent; whatever the solver
  returns, the current allocation is kept unless the answer is strictly better (guaranteed valid answer);
- determinism: CP-SAT with a fixed seed and worker count, limited by deterministic time and a relative gap
  only (albic/solver.py); neighbourhood rounds are budgeted in the same deterministic time. No decision
  depends on the clock, so the same input gives the same allocation on any machine and under any load;
- solving: models up to ``full_model_limit`` x-columns are solved whole. Larger ones (40 x 800 has
  32,000 columns) are solved by neighbourhood rounds: the same MILP over a sub-cluster (set B, pinned
  nodes, the strongly deviating nodes and the most overloaded / underloaded ones), whose key groups may
  move among its nodes while every other key group keeps x_ik = q_ik; (3)/(4) range over the
  sub-cluster's nodes (the others' loads cannot change). Rounds repeat from the incumbent, compared by
  d and then by the sorted deviations (leximax), and widen when a round is optimal yet improves nothing.
  Every answer is a feasible point of the full model and migrations always count against the current
  allocation. docs/albic.md has the measurements behind this and behind the CP-SAT settings.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import numpy as np

from streamtopo.contracts import KeyGroupId
from streamtopo.planner.allocation import AllocationState, Rebalance
from streamtopo.planner.rebalance.albic.bound import budget_bound
from streamtopo.planner.rebalance.albic.metrics import build_rebalance
from streamtopo.planner.rebalance.albic.rules import colocation_units, host_of, rule_operators
from streamtopo.planner.rebalance.albic.solver import CpSatModel, SolveLimits
from streamtopo.planner.rebalance.albic.state import StateIndex, check_budget, index_state


@dataclass(frozen=True)
class MilpConfig:
    """Solver settings of the MILP (shared by ALBIC)."""

    deterministic_time: float = 0.2
    """CP-SAT deterministic time for one whole solve (all neighbourhood rounds together): a work limit
    that does not depend on the machine or its load, so the decision does not either. One unit is about
    0.5-1.1 CPU seconds on the 2-core machine of docs/albic.md; 0.2 keeps a simulated day of
    examples/scenarios/diurnal.yaml (about 120 solves) near 12 s (it took 238 s with CBC at 5 s)."""
    relative_gap: float = 1e-4
    """Stop once the objective is proven within this relative gap: d is then optimal up to 0.01 % while the
    lexicographic tail (d_u + d_l, migrations) is not chased to the last unit; 1e-4 is the default MIP
    gap of OR-Tools' pywraplp, under which CBC made the earlier decisions."""
    workers: int = 1
    """CP-SAT workers; more than one runs ``interleave_search``, which is deterministic too."""
    mean_rounding: Literal["ceil", "exact"] = "exact"
    """``ceil`` is Table 2 literally (mean rounded up to a whole percentage point); ``exact`` (default)
    uses the unrounded mean, the one load distance is measured against: the rounding biases the
    objective by up to 1 pp, which cost 0.3-0.7 pp of load distance at 60/1200 (docs/albic.md)."""
    resource: Literal["cpu", "memory", "auto"] = "cpu"
    """Balanced resource; ``auto`` picks the bottleneck (greatest total usage) as in Section 3."""
    cpu_cap: float = 100.0
    """Per-node CPU cap in percent when memory is the balanced resource."""
    scale: int = 100
    """Integer resolution of loads: 1/scale percentage points."""
    warm_start: bool = True
    """Start from a greedy incumbent built from the current allocation (``_greedy_incumbent``): it is the
    CP-SAT solution hint and the rounds' first incumbent. Off: no hint, rounds start from the current one."""
    candidate_nodes: int | None = 0
    """Nodes whose key groups may move in one solve: None = every node (the full model as written);
    0 = automatic (the full model up to ``full_model_limit`` x-columns, else neighbourhoods of
    ``lns_nodes`` most deviating nodes plus set B and pinned nodes); n > 0 = neighbourhoods of n nodes.
    Key groups on other nodes keep their place (x_ik = q_ik for them); every answer is a feasible point
    of the full model, and migrations are always counted against the current allocation."""
    full_model_limit: int = 2_500
    lns_nodes: int = 4
    """Neighbourhood size: half the most overloaded, half the most underloaded nodes."""
    lns_round_deterministic_time: float = 0.3
    """Deterministic-time limit of one neighbourhood round (all rounds stay within ``deterministic_time``);
    0.3 did best on bench/albic.py's Section 5.1 states at budget 5 (docs/albic.md)."""
    lns_max_nodes: int = 16
    """Cap on the strongly deviating nodes added to a round (when every node deviates alike, e.g. while
    set B still holds load, including them all would be the whole model); halved when a round finds
    nothing in time."""


@dataclass(frozen=True)
class MilpOutcome:
    where: np.ndarray | None
    """Executor index per key group, or None when the solver found nothing."""
    status: str
    d: float = math.nan
    d_u: float = math.nan
    d_l: float = math.nan
    seconds: float = 0.0
    """Wall seconds CP-SAT measured (reported only: no decision reads them)."""
    relaxed_5: bool = False
    details: dict[str, object] = field(default_factory=dict)
    score_current: Score | None = None
    """:func:`score` of the allocation the solve started from."""
    score_solution: Score | None = None
    """:func:`score` of the solution (None when there is none)."""


def _balance_matrix(state: AllocationState, ix: StateIndex, resource: str) -> tuple[np.ndarray, str]:
    """Per (node, key group) share of the balanced resource in percent of that node, plus its name."""
    if resource == "auto":
        known = np.isfinite(ix.memory_capacity).all() and ix.memory_capacity[ix.active].sum() > 0
        cpu_use = ix.load.sum() / (100.0 * ix.capacity[ix.active].sum())
        mem_use = ix.memory.sum() / ix.memory_capacity[ix.active].sum() if known else -1.0
        resource = "memory" if mem_use > cpu_use else "cpu"
    if resource == "memory":
        if not (np.isfinite(ix.memory_capacity).all() and (ix.memory_capacity > 0).all()):
            raise ValueError("resource=memory needs a positive memory_capacity on every executor")
        return 100.0 * ix.memory[None, :] / ix.memory_capacity[:, None], "memory"
    return ix.load[None, :] / ix.capacity[:, None], "cpu"


def _scaled_cost(
    ix: StateIndex, max_migrations: int | None, max_migration_cost: float | None
) -> list[tuple[np.ndarray, int]]:
    """Constraint (2) as integer (coefficient per key group, bound) pairs; rounding is conservative."""
    bounds: list[tuple[np.ndarray, int]] = []
    if max_migrations is not None:
        bounds.append((np.ones(len(ix.kg_ids), dtype=np.int64), int(max_migrations)))
    if max_migration_cost is not None:
        top = max(float(max_migration_cost), float(ix.mc.max(initial=0.0)), 1e-12)
        s = 1e6 / top
        bounds.append((np.ceil(ix.mc * s - 1e-9).astype(np.int64), math.floor(max_migration_cost * s + 1e-9)))
    return bounds


@dataclass
class _Problem:
    """Everything about one MILP that does not depend on the neighbourhood being solved, computed once
    per solve rather than once per round."""

    ix: StateIndex
    units: Sequence[Sequence[int]]
    bal: np.ndarray
    resource: str
    mean: float
    mean_s: int
    d_hi: int
    """Upper bound of d, d_u, d_l in 1/scale pp (the greatest possible node load, or the mean)."""
    slack: int
    """The most one unit on set B adds to a node of A it may go to, in 1/scale pp: the d that draining B
    may cost (:func:`score`)."""
    u_bal: np.ndarray
    u_mem: np.ndarray
    u_cpu: np.ndarray
    cost_rows: list[tuple[np.ndarray, int]]
    u_cost: list[np.ndarray]
    moved: np.ndarray
    """(node, unit): key groups of the unit that migrate if it ends on that node (the w3 term)."""
    ruled: np.ndarray
    """Per unit: it has a key group of an operator some PlacementRule names (never a constant)."""
    allowed: list[list[int]]
    """Nodes each unit may be on at all (set B, resource matching, memory, pins)."""
    node_host: list[str]


def _prepare(
    state: AllocationState,
    ix: StateIndex,
    units: Sequence[Sequence[int]],
    pinned: dict[int, int],
    max_migrations: int | None,
    max_migration_cost: float | None,
    config: MilpConfig,
) -> _Problem | list[KeyGroupId]:
    """Coefficients of the model; returns the unplaceable unit's key groups when one has no node."""
    n_nodes = len(ix.names)
    bal, resource = _balance_matrix(state, ix, config.resource)
    S = config.scale
    mean_exact = (
        ix.load.sum() / ix.capacity[ix.active].sum()
        if resource == "cpu"
        else 100.0 * ix.memory.sum() / ix.memory_capacity[ix.active].sum()
    )
    mean = float(math.ceil(mean_exact - 1e-9)) if config.mean_rounding == "ceil" else float(mean_exact)
    owner = np.empty(len(ix.kg_ids), dtype=int)
    for u_i, u in enumerate(units):
        owner[list(u)] = u_i
    n_units = len(units)

    def per_unit(values: np.ndarray) -> np.ndarray:
        return np.bincount(owner, weights=values, minlength=n_units)

    u_bal = np.rint(S * np.stack([per_unit(bal[i]) for i in range(n_nodes)])).astype(np.int64)
    u_mem = per_unit(ix.memory)
    u_cpu = per_unit(ix.load)[None, :] / ix.capacity[:, None]
    cost_rows = _scaled_cost(ix, max_migrations, max_migration_cost)
    u_cost = []
    for coef, _ in cost_rows:
        stay = np.zeros((n_nodes, n_units), dtype=np.int64)
        np.add.at(stay, (ix.current, owner), coef)
        u_cost.append(per_unit(coef.astype(float)).astype(np.int64)[None, :] - stay)
    home = np.zeros((n_nodes, n_units), dtype=np.int64)
    np.add.at(home, (ix.current, owner), 1)
    moved = np.bincount(owner, minlength=n_units)[None, :] - home
    ruled_ops = rule_operators(state)
    ruled = np.array([any(ix.kg_ids[k][0] in ruled_ops for k in u) for u in units], dtype=bool)
    hosts = host_of(state)
    node_host = [hosts[n] for n in ix.names]
    allowed_hosts = state.rules.allowed_hosts
    cap_memory = resource == "cpu" and np.isfinite(ix.memory_capacity).any()
    allowed: list[list[int]] = []
    unmarked = ~ix.marked
    for u_i, u in enumerate(units):
        here = {int(ix.current[k]) for k in u}
        ok = unmarked.copy()  # set B never receives (Lemma 1 enforced)
        if len(here) == 1:
            ok[next(iter(here))] = True
        for op in {ix.kg_ids[k][0] for k in u} & set(allowed_hosts):
            ok &= np.array([h in allowed_hosts[op] for h in node_host])
        if cap_memory:
            ok &= ~(u_mem[u_i] > ix.memory_capacity * (1 + 1e-9))
        cols = np.flatnonzero(ok).tolist()
        if u_i in pinned:
            cols = [pinned[u_i]] if pinned[u_i] in cols else []
        if not cols:
            return [ix.kg_ids[k] for k in u]
        allowed.append(cols)
    mean_s = round(mean * S)
    d_hi = max(mean_s, int(u_bal.sum(axis=1).max()))
    on_b = [u_i for u_i, u in enumerate(units) if ix.marked[ix.current[list(u)]].any()]
    slack = max((int(u_bal[i, u_i]) for u_i in on_b for i in allowed[u_i] if not ix.marked[i]), default=0)
    return _Problem(
        ix,
        units,
        bal,
        resource,
        mean,
        mean_s,
        d_hi,
        slack,
        u_bal,
        u_mem,
        u_cpu,
        cost_rows,
        u_cost,
        moved,
        ruled,
        allowed,
        node_host,
    )


def _solve_neighbourhood(
    state: AllocationState,
    pb: _Problem,
    place: np.ndarray,
    movable: np.ndarray,
    config: MilpConfig,
    limits: SolveLimits,
) -> tuple[np.ndarray | None, str, dict[str, float]]:
    """One MILP solve where only units on ``movable`` nodes (under ``place``) may change node."""
    be = CpSatModel()
    ix, S = pb.ix, config.scale
    n_nodes = len(ix.names)
    columns = [cols if movable[place[u_i]] else [int(place[u_i])] for u_i, cols in enumerate(pb.allowed)]
    columns = [[i for i in cols if movable[i] or i == place[u_i]] for u_i, cols in enumerate(columns)]
    # Units that cannot move this round and touch no PlacementRule are constants, not variables.
    fixed = [len(cols) == 1 and not pb.ruled[u_i] for u_i, cols in enumerate(columns)]
    x = [{} if fixed[u_i] else {i: be.bool() for i in cols} for u_i, cols in enumerate(columns)]
    const_bal = np.zeros(n_nodes, dtype=np.int64)
    const_mem = np.zeros(n_nodes)
    const_cpu = np.zeros(n_nodes)
    for u_i in np.flatnonzero(fixed).tolist():
        i = columns[u_i][0]
        const_bal[i] += pb.u_bal[i, u_i]
        const_mem[i] += pb.u_mem[u_i]
        const_cpu[i] += pb.u_cpu[i, u_i]
    mean_s, d_hi = pb.mean_s, pb.d_hi
    d, d_u, d_l = be.num(0, d_hi), be.num(0, d_hi), be.num(0, d_hi)
    be.linear([d_u, d], [1, -1], -math.inf, 0)
    be.linear([d_l, d], [1, -1], -math.inf, 0)
    for cols in x:  # (1)
        if cols:
            be.exactly_one(list(cols.values()))
    for (_, bound), uc in zip(pb.cost_rows, pb.u_cost):  # (2)
        spent = sum(int(uc[columns[u_i][0], u_i]) for u_i in np.flatnonzero(fixed).tolist())
        terms = [(v, int(uc[i, u_i])) for u_i, cols in enumerate(x) for i, v in cols.items() if uc[i, u_i]]
        be.linear([t[0] for t in terms], [t[1] for t in terms], -math.inf, bound - spent)
    by_node: list[list[tuple[Any, int]]] = [[] for _ in range(n_nodes)]
    for u_i, cols in enumerate(x):
        for i, v in cols.items():
            by_node[i].append((v, u_i))
    mem_cap = ix.memory_capacity
    cap_memory = pb.resource == "cpu" and np.isfinite(mem_cap).any()
    mem_s = 1e6 / max(float(mem_cap[np.isfinite(mem_cap)].max(initial=1.0)), 1e-12)
    for i in range(n_nodes):
        if not movable[i]:
            continue  # its load cannot change this round; (3)/(4) range over the neighbourhood's nodes
        vs = [v for v, _ in by_node[i]]
        coefs = [int(pb.u_bal[i, u]) for _, u in by_node[i]]
        c = int(const_bal[i])
        be.linear(vs + [d, d_u], coefs + [-1, 1], -math.inf, mean_s - c)  # (3)
        if not ix.marked[i]:
            be.linear(vs + [d, d_l], coefs + [1, -1], mean_s - c, math.inf)  # (4)
        if cap_memory and np.isfinite(mem_cap[i]):
            be.linear(
                vs,
                [math.ceil(pb.u_mem[u] * mem_s) for _, u in by_node[i]],
                -math.inf,
                math.floor(mem_cap[i] * mem_s) - math.ceil(const_mem[i] * mem_s),
            )
        if pb.resource == "memory":
            be.linear(
                vs,
                [math.ceil(pb.u_cpu[i, u] * S) for _, u in by_node[i]],
                -math.inf,
                int(config.cpu_cap * S) - math.ceil(const_cpu[i] * S),
            )
    _add_rules(state, ix, pb.units, x, be, pb.node_host)

    loads_now = np.zeros(n_nodes, dtype=np.int64)
    for u_i, i in enumerate(place):
        loads_now[i] += pb.u_bal[i, u_i]
    d_now, _ = objective_terms(~ix.marked[movable], loads_now[movable].astype(float), float(mean_s))
    relaxed = d_now > mean_s
    if not relaxed:
        be.linear([d], [1], -math.inf, mean_s)  # (5)
    if config.warm_start:
        hv, hx = [], []
        for u_i, cols in enumerate(x):
            for i, v in cols.items():
                hv.append(v)
                hx.append(1 if i == place[u_i] else 0)
        top, low = int(loads_now[movable].max()), int(loads_now[movable & ~ix.marked].min())
        be.hint(
            hv + [d, d_u, d_l],
            hx
            + [
                int(d_now),
                max(min(int(d_now), mean_s + int(d_now) - top), 0),
                max(min(int(d_now), low - mean_s + int(d_now)), 0),
            ],
        )
    # w1 >> w2 as written. Below both, the paper's second objective (sum over B of load_i) as key groups
    # left on B, 2 each, and w3 = 1 per migration: among allocations with the same (d, d_u + d_l) one that
    # drains B (a move off B nets -1) with the fewest other moves (+1 each). So the budget d does not need
    # drains B even where key-group sizes keep d from falling (Lemma 2 alone then leaves B as it is), and
    # no round spends it on moves that do not help. w2 = 3|G| + 1 exceeds both terms together.
    low_vars, low_coefs = [], []
    for u_i, cols in enumerate(x):
        for i, v in cols.items():
            cost = int(pb.moved[i, u_i]) + (2 * len(pb.units[u_i]) if ix.marked[i] else 0)
            if cost:
                low_vars.append(v)
                low_coefs.append(cost)
    w2 = 3 * len(ix.kg_ids) + 1
    w1 = (2 * d_hi + 1) * w2
    be.minimize([d, d_u, d_l, *low_vars], [w1, -w2, -w2, *low_coefs])
    status = be.solve(limits)
    info = {
        "work": be.deterministic_time,
        "seconds": be.wall_time,
        "relaxed_5": relaxed,
        "columns": sum(len(c) for c in columns),
    }
    if status not in ("optimal", "feasible"):
        return None, status, info
    new = np.array(
        [max(cols, key=lambda i: be.value(cols[i])) if cols else place[u_i] for u_i, cols in enumerate(x)],
        dtype=int,
    )
    info.update(d=be.value(d) / S, d_u=be.value(d_u) / S, d_l=be.value(d_l) / S)
    return new, status, info


def solve_units(
    state: AllocationState,
    ix: StateIndex,
    units: Sequence[Sequence[int]],
    *,
    pinned: dict[int, int] | None = None,
    max_migrations: int | None = None,
    max_migration_cost: float | None = None,
    config: MilpConfig = MilpConfig(),
    seed: int = 0,
) -> MilpOutcome:
    """Solve the MILP over ``units`` (lists of key-group indices that move together).

    ``pinned`` maps a unit index to the node index it must be on (ALBIC's step 3 constraint).
    Small models are solved whole; larger ones by neighbourhoods (see ``MilpConfig.candidate_nodes``):
    each round re-solves the MILP with the most deviating nodes of the incumbent free, starting from
    the incumbent, until the deterministic-time budget is spent or a round changes nothing. Every limit is
    deterministic, so the outcome depends on the input, the config and the seed only.
    """
    pinned = pinned or {}
    n_nodes = len(ix.names)
    pb = _prepare(state, ix, units, pinned, max_migrations, max_migration_cost, config)
    if isinstance(pb, list):
        return MilpOutcome(None, "infeasible", details={"unplaceable_unit": pb})
    place = np.array(
        [
            pinned.get(u_i, int(np.bincount(ix.current[list(u)], minlength=n_nodes).argmax()))
            for u_i, u in enumerate(units)
        ]
    )

    def node_loads(pl: np.ndarray) -> np.ndarray:
        return np.bincount(pl, weights=pb.u_bal[pl, np.arange(len(units))], minlength=n_nodes) / config.scale

    def where_of(pl: np.ndarray) -> np.ndarray:
        w = ix.current.copy()
        for u_i, u in enumerate(units):
            w[list(u)] = pl[u_i]
        return w

    sizes = np.array([len(u) for u in units], dtype=np.int64)

    def scored(pl: np.ndarray) -> Score:
        return score(
            ~ix.marked, node_loads(pl), pb.mean, int(sizes[ix.marked[pl]].sum()), pb.slack / config.scale
        )

    start = scored(place)
    bound = _budget_bound(pb, units)
    if config.warm_start:
        place = _greedy_incumbent(pb, place, config.scale, config.cpu_cap)
    spent, seconds, rounds, status, info, best = 0.0, 0.0, 0, "unknown", {}, None
    size, last, proven = config.candidate_nodes or config.lns_nodes, scored(place), False
    cap = config.lns_max_nodes
    if _better(last, start):
        status, best = "feasible", place
    while config.deterministic_time - spent > 1e-3:
        movable = _candidate_nodes(ix, node_loads(place), pb.mean, units, place, pinned, config, size, cap)
        left = config.deterministic_time - spent
        budget = left if movable.all() else min(config.lns_round_deterministic_time, left)
        limits = SolveLimits(budget, config.relative_gap, seed + rounds, config.workers)
        new, st, inf = _solve_neighbourhood(state, pb, place, movable, config, limits)
        spent += inf["work"]
        seconds += inf["seconds"]
        rounds += 1
        if new is None:
            if best is None:
                status, info = st, inf
            if movable.all() or size <= 2:
                break
            size, cap = max(size // 2, 2), max(cap // 2, 2)  # nothing found within budget: a smaller round
            continue
        new_score, before = scored(new), last
        if best is None or not _better(last, new_score):  # never keep a round that ends worse than it began
            status, info, best, place, last = st, inf, new, new, new_score
        if movable.all():
            proven = st == "optimal"
            break
        if not _better(new_score, before) and st == "optimal":
            size *= 2  # optimal yet stuck: widen the neighbourhood, up to the full model
    details: dict[str, object] = {
        "mean": pb.mean,
        "resource": pb.resource,
        "rounds": rounds,
        "deterministic_time": spent,
        "columns": info.get("columns", 0),
        "lower_bound": bound,
    }
    if best is None:
        return MilpOutcome(
            None,
            status,
            seconds=seconds,
            relaxed_5=bool(info.get("relaxed_5")),
            details=details,
            score_current=start,
        )
    final = scored(best)
    if proven:  # the whole model solved within the relative gap: d is the optimum, up to the rounding
        rounding = 0.5 * int(np.bincount(best, minlength=n_nodes).max()) / config.scale
        bound = max(bound, final.d * (1 - config.relative_gap) - rounding)
    details["lower_bound"] = bound
    details["gap"] = (final.d - bound) / final.d if final.d > 1e-9 else 0.0
    loads = node_loads(best)
    top, low = float(loads.max()), float(loads[~ix.marked].min())
    return MilpOutcome(
        where_of(best),
        status,
        d=final.d,
        d_u=max(min(final.d, pb.mean + final.d - top), 0.0),
        d_l=max(min(final.d, low - pb.mean + final.d), 0.0),
        seconds=seconds,
        relaxed_5=bool(info.get("relaxed_5")),
        details=details,
        score_current=start,
        score_solution=final,
    )


def _budget_bound(pb: _Problem, units: Sequence[Sequence[int]]) -> float:
    """:func:`~streamtopo.planner.rebalance.albic.bound.budget_bound` of the problem (pp): no allocation
    within constraint (2) has a smaller d. On the exact loads, not the solver's rounded integers, so it
    holds for the load distance as reported. 0 while a unit spans several nodes (a new co-location)."""
    ix = pb.ix
    homes = [np.unique(ix.current[list(u)]) for u in units]
    if any(len(h) != 1 for h in homes):
        return 0.0
    owner = np.empty(len(ix.kg_ids), dtype=int)
    for u_i, u in enumerate(units):
        owner[list(u)] = u_i
    loads = np.stack([np.bincount(owner, weights=row, minlength=len(units)) for row in pb.bal])
    place = np.array([int(h[0]) for h in homes])
    budgets = [
        (cost.max(axis=0).astype(float), float(limit), True)
        for cost, (_, limit) in zip(pb.u_cost, pb.cost_rows)
    ]
    return budget_bound(loads, place, ix.marked, pb.mean, budgets)


def _greedy_incumbent(pb: _Problem, place: np.ndarray, scale: int, cpu_cap: float) -> np.ndarray:
    """A largest-deviation-first start for the rounds, within the same budget (2), set B and columns.

    Each step considers moving one unit from a donor (set B while it holds units, and the most
    overloaded nodes) to one of the most underloaded nodes of A, per pair the unit that leaves the pair
    closest to the mean, and makes the move that scores best (d, then leximax) if it beats the incumbent:
    lowering d comes first, so B drains while the overloaded nodes are relieved, not before. Units touching a
    PlacementRule stay put (the MILP handles them). It is CP-SAT's solution hint, so the deterministic
    budget goes to improving it instead of re-finding these moves; the current allocation is the fallback.
    Measured on the simulator's skewed-scenario problems (all pinned by ALBIC's step 3), hinting it rather
    than the current allocation (with the pin applied) lowered the mean d from 4.19 to 4.07 pp at the same
    budget, and 23 instead of 8 of the 35 solves ended within the gap before the budget.
    """
    ix, n_nodes = pb.ix, len(pb.ix.names)
    free = ~pb.ruled
    unit_idx = np.arange(len(pb.units))
    place = place.copy()
    loads = np.bincount(place, weights=pb.u_bal[place, unit_idx], minlength=n_nodes).astype(float)
    spent = [int(uc[place, unit_idx].sum()) for uc in pb.u_cost]
    cap_memory = pb.resource == "cpu" and np.isfinite(ix.memory_capacity).any()
    mem = np.bincount(place, weights=pb.u_mem[unit_idx], minlength=n_nodes)
    cpu = np.bincount(place, weights=pb.u_cpu[place, unit_idx], minlength=n_nodes)
    active = ~ix.marked
    mean_s = pb.mean * scale
    sizes = np.array([len(u) for u in pb.units], dtype=np.int64)
    on_b = int(sizes[ix.marked[place]].sum())
    current = score(active, loads, mean_s, on_b, pb.slack)
    for _ in range(4 * len(pb.units)):
        dev = loads - mean_s
        holds = np.bincount(place, minlength=n_nodes) > 0
        donors = [
            *sorted(np.flatnonzero(ix.marked & holds), key=lambda i: -loads[i])[:4],
            *[i for i in np.argsort(-dev, kind="stable") if active[i] and dev[i] > 0][:4],
        ]
        receivers = [i for i in np.argsort(dev, kind="stable") if active[i]][:4]
        step = None
        for a in donors:
            for b in receivers:
                best = None
                for u in np.flatnonzero((place == a) & free):
                    if b not in pb.allowed[u] or any(
                        s - int(uc[a, u]) + int(uc[b, u]) > bound
                        for s, uc, (_, bound) in zip(spent, pb.u_cost, pb.cost_rows)
                    ):
                        continue
                    if cap_memory and mem[b] + pb.u_mem[u] > ix.memory_capacity[b] * (1 + 1e-9):
                        continue
                    if pb.resource == "memory" and cpu[b] + pb.u_cpu[b, u] > cpu_cap * (1 - 1e-9):
                        continue
                    gap = max(
                        0.0 if ix.marked[a] else abs(dev[a] - pb.u_bal[a, u]), abs(dev[b] + pb.u_bal[b, u])
                    )
                    if best is None or gap < best[0]:
                        best = (gap, u)
                if best is None:
                    continue
                u = best[1]
                trial = loads.copy()
                trial[a] -= pb.u_bal[a, u]
                trial[b] += pb.u_bal[b, u]
                trial_score = score(
                    active, trial, mean_s, on_b - int(sizes[u]) * bool(ix.marked[a]), pb.slack
                )
                if _better(trial_score, step[4] if step else current):
                    step = (u, a, b, trial, trial_score)
        if step is None:
            break
        u, a, b, loads, current = step
        on_b = current.on_b
        spent = [s - int(uc[a, u]) + int(uc[b, u]) for s, uc in zip(spent, pb.u_cost)]
        mem[a] -= pb.u_mem[u]
        mem[b] += pb.u_mem[u]
        cpu[a] -= pb.u_cpu[a, u]
        cpu[b] += pb.u_cpu[b, u]
        place[u] = b
    return place


def _candidate_nodes(
    ix: StateIndex,
    loads: np.ndarray,
    mean: float,
    units: Sequence[Sequence[int]],
    place: np.ndarray,
    pinned: dict[int, int],
    config: MilpConfig,
    size: int,
    cap: int,
) -> np.ndarray:
    """Nodes whose units get decision columns this round (see ``MilpConfig.candidate_nodes``): set B,
    pinned nodes, then alternately the most overloaded and most underloaded nodes, as many as ``size``
    or the number of nodes deviating at least half the maximum deviation (capped by ``lns_max_nodes``),
    so the migration budget is planned over the nodes that matter, not spent on the first few."""
    n_nodes = len(ix.names)
    if config.candidate_nodes is None or (
        config.candidate_nodes == 0 and n_nodes * len(units) <= config.full_model_limit
    ):
        return np.ones(n_nodes, dtype=bool)
    want = size
    mask = ix.marked.copy()
    for u_i, node in pinned.items():
        mask[node] = True
        mask[place[u_i]] = True
    dev = np.where(ix.marked, 0.0, loads - mean)
    strong = int(np.count_nonzero(np.abs(dev) >= 0.5 * np.abs(dev).max()))
    want = max(want, min(strong, cap))  # the nodes that could decide d, within a cap
    over, under = np.argsort(-dev, kind="stable"), np.argsort(dev, kind="stable")
    for rank in range(n_nodes):
        for i in (over[rank], under[rank]):
            if mask.sum() >= min(n_nodes, want + int(ix.marked.sum()) + 2 * len(pinned)):
                return mask
            mask[i] = True
    return mask


def _add_rules(
    state: AllocationState,
    ix: StateIndex,
    units: Sequence[Sequence[int]],
    x: list[dict[int, Any]],
    be: CpSatModel,
    node_host: list[str],
) -> None:
    """PlacementRules as linear constraints (PE co-location is already inside the units)."""
    r = state.rules
    unit_ops = [{ix.kg_ids[k][0] for k in u} for u in units]
    by_host: dict[str, list[int]] = {}
    for i, h in enumerate(node_host):
        by_host.setdefault(h, []).append(i)
    known = {i for i, e in enumerate(state.executors) if e.host is not None}

    def presence(ops: set[str], nodes: list[int]) -> Any | None:
        """A boolean that is 1 when any key group of ``ops`` sits on ``nodes``."""
        terms = [x[u][i] for u, uo in enumerate(unit_ops) if uo & ops for i in nodes if i in x[u]]
        if not terms:
            return None
        p = be.bool()
        for t in terms:
            be.linear([t, p], [1, -1], -math.inf, 0)
        return p

    def at_most_one(sets: list[set[str]], locations: list[list[int]]) -> None:
        for nodes in locations:
            ps = [p for p in (presence(s, nodes) for s in sets) if p is not None]
            if len(ps) > 1:
                be.linear(ps, [1] * len(ps), -math.inf, 1)

    nodes_each = [[i] for i in range(len(ix.names))]
    for a, b in r.pe_exlocation:
        at_most_one([{a}, {b}], nodes_each)
    for a, b in r.host_exlocation:
        at_most_one([{a}, {b}], list(by_host.values()))
    for group in r.ha_groups:
        replicas = [set(rep) for rep in group]
        at_most_one(replicas, nodes_each)
        at_most_one(replicas, [[i for i in nodes if i in known] for nodes in by_host.values()])
    unit_of = {ix.kg_ids[k]: u for u, members in enumerate(units) for k in members}
    for a, b in r.host_colocation:
        for kg_id, ua in unit_of.items():
            if kg_id[0] != a or (b, kg_id[1]) not in unit_of:
                continue
            ub = unit_of[(b, kg_id[1])]
            if ua == ub:
                continue
            for nodes in by_host.values():
                va = [x[ua][i] for i in nodes if i in x[ua]]
                vb = [x[ub][i] for i in nodes if i in x[ub]]
                be.linear(va + vb, [1] * len(va) + [-1] * len(vb), 0, 0)


def unit_indices(
    state: AllocationState, ix: StateIndex, groups: Sequence[Sequence[KeyGroupId]] = ()
) -> list[list[int]]:
    """Units for the MILP: PE co-location classes merged with extra ``groups`` (ALBIC partitions)."""
    parent = list(range(len(ix.kg_ids)))

    def find(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for members in [*colocation_units(state), *groups]:
        ks = [ix.kg[m] for m in members]
        for k in ks[1:]:
            parent[find(k)] = find(ks[0])
    classes: dict[int, list[int]] = {}
    for k in range(len(ix.kg_ids)):
        classes.setdefault(find(k), []).append(k)
    return list(classes.values())


def objective_terms(active: np.ndarray, loads: np.ndarray, mean: float) -> tuple[float, float]:
    """(d, d_u + d_l) of an allocation with per-node balanced loads ``loads``: the MILP's optimum of
    d, d_u, d_l for fixed x."""
    top, low = float(loads.max()), float(loads[active].min())
    d = max(top - mean, mean - low, 0.0)
    return d, max(min(d, mean + d - top), 0.0) + max(min(d, low - mean + d), 0.0)


class Score(NamedTuple):
    """How good an allocation is (:func:`score`); compared by :func:`_better`."""

    d: float
    du_dl: float
    """d_u + d_l, the MILP's optimum for the allocation."""
    profile: tuple[float, ...]
    """|load - mean| of the nodes in A and the excess of the nodes in B, largest first."""
    on_b: int
    """Key groups still on set B."""
    level: float
    """d, or while B holds key groups the slack when d is below it."""
    above: tuple[float, ...]
    """The profile with every deviation below the level's slack raised to it."""


def score(active: np.ndarray, loads: np.ndarray, mean: float, on_b: int = 0, slack: float = 0.0) -> Score:
    """The allocation's :class:`Score`. ``slack`` is the most one unit on B adds to a node of A.

    Allocations compare by d, then by the deviation profile (leximax: a round that improves the nodes it
    may touch while another node still sets d counts as progress), then by the key groups still on B (the
    paper's second objective, sum over B of load_i), except that while B holds key groups, deviations
    below the slack count as equal in the first two. Lemma 2 has B drain because d falls as it does; with
    whole key groups it may not: in Figure 5's 1OL, 9 key groups stayed on B for good, each of which would
    have raised d from 1.18 to 1.3 pp, and a node marked for removal must go. One unit moved from B to the
    least loaded node of A (below the mean while B holds load) raises d to at most its own load, so that is
    the least slack that lets every unit leave; above it, relieving overloaded nodes still comes first.
    """
    dev = np.where(active, np.abs(loads - mean), np.maximum(loads - mean, 0.0))
    d, du_dl = objective_terms(active, loads, mean)
    floor = slack if on_b else 0.0
    profile = tuple(np.round(np.sort(dev)[::-1], 6))
    above = tuple(np.round(np.sort(np.maximum(dev, floor))[::-1], 6))
    return Score(d, du_dl, profile, on_b, max(d, floor), above)


def _better(new: Score, old: Score, tol: float = 1e-6) -> bool:
    if abs(new.level - old.level) > tol:
        return new.level < old.level
    if new.above != old.above:
        return new.above < old.above
    if new.on_b != old.on_b:
        return new.on_b < old.on_b
    if abs(new.d - old.d) > tol:
        return new.d < old.d
    return new.profile < old.profile


def solve_to_rebalance(
    state: AllocationState,
    ix: StateIndex,
    outcome: MilpOutcome,
    *,
    policy: str,
    extra: dict[str, object] | None = None,
) -> Rebalance:
    """Turn a MILP outcome into a Rebalance, keeping the current allocation unless strictly better."""
    details: dict[str, object] = {
        "solver_status": outcome.status,
        "d": outcome.d,
        "d_u": outcome.d_u,
        "d_l": outcome.d_l,
        "relaxed_constraint_5": outcome.relaxed_5,
        **outcome.details,
        **(extra or {}),
    }
    for key, value in (("score_current", outcome.score_current), ("score_solution", outcome.score_solution)):
        if value is not None:
            details[key] = (value.d, value.du_dl)  # the deviation profile stays internal
    if outcome.where is None:
        return build_rebalance(
            state,
            ix,
            dict(state.assignment),
            solve_seconds=outcome.seconds,
            reason=f"{policy}: solver {outcome.status}; kept the current allocation",
            details=details,
        )
    before, after = outcome.score_current, outcome.score_solution
    assert before is not None and after is not None  # a solution comes with both scores
    moved = int((outcome.where != ix.current).sum())
    if moved and not _better(after, before) and not extra_forces_move(extra):
        return build_rebalance(
            state,
            ix,
            dict(state.assignment),
            solve_seconds=outcome.seconds,
            reason=f"{policy}: no allocation better than the current one (d {before.d:.3f} pp); kept it",
            details=details,
        )
    assignment = {kg: ix.names[int(outcome.where[k])] for k, kg in enumerate(ix.kg_ids)}
    return build_rebalance(
        state,
        ix,
        assignment,
        solve_seconds=outcome.seconds,
        details=details,
        reason=f"{policy}: {outcome.status} solution, d {after.d:.3f} pp "
        f"(was {before.d:.3f}), {moved} migration(s)",
    )


def extra_forces_move(extra: dict[str, object] | None) -> bool:
    """ALBIC's new collocation constraint or draining set B justify moves that do not lower d."""
    return bool(extra and extra.get("force_moves"))


def milp_rebalance(
    state: AllocationState,
    *,
    max_migrations: int | None = None,
    max_migration_cost: float | None = None,
    config: MilpConfig | None = None,
    seed: int = 0,
) -> Rebalance:
    """Plain MILP rebalancing (ALBIC without collocation): one solve over PE-co-location units."""
    config = config or MilpConfig()
    check_budget(max_migrations, max_migration_cost)
    ix = index_state(state)
    outcome = solve_units(
        state,
        ix,
        unit_indices(state, ix),
        max_migrations=max_migrations,
        max_migration_cost=max_migration_cost,
        config=config,
        seed=seed,
    )
    return solve_to_rebalance(state, ix, outcome, policy="milp")
