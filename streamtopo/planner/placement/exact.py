"""The exact optimum of COLA's fusion-and-placement problem on small graphs, with OR-Tools CP-SAT.

Khandekar et al., Section 3.2: partition V into PEs, assign PEs to hosts, so that every host's load
sum SIZE(S)/B_h <= 1 (scheduling feasibility, (i)) and the six constraint kinds hold (validity),
minimising f(U, C) with U the maximum host utilisation (iii) and C the communication cost (iv). The
objective is COLA's own, ``ColaOptions.objective``: f = w_U * U + w_C * C / (mean host capacity), C in
cores with each cut arc once; see docs/planning.md.

Model. Node v goes to slot (h, j): host h, local PE j. Two nodes share a PE iff they share a slot. The
load of host h is sum_{v on h} w_v + sum_e w_e * (on(u, h) + on(v, h) - 2 same(e, h)), i.e. every
arc leaving or entering a PE counts at its end's host (SIZE = w(S) + w(delta(S))). Without PE-level
constraints one slot per host suffices: fusing two PEs on one host removes their common arcs from
both SIZEs and from C, so it never worsens U or C. PE exlocation, PE/host dedication and isomorphic
HA make PE structure matter, and then each host gets as many slots as there are nodes.
Weights are scaled to integers (micro-cores, :func:`units`): loads rounded up and capacities down, so a
plan within the integer capacities is within the float ones (``Plan.feasible``; rounding to nearest once
let a 5e-9-core arc vanish and a plan 5e-9 over a host pass as optimal). The optimum is exact at that
resolution; the returned plan is re-scored in floats by ``plan.evaluate``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from itertools import combinations

import networkx as nx
from ortools.sat.python import cp_model
from ortools.sat.python.cp_model import IntVar, LinearExpr

from streamtopo.planner.cluster import Cluster
from streamtopo.planner.graph import Node
from streamtopo.planner.placement.cola import ColaOptions
from streamtopo.planner.placement.constraints import GraphConstraints
from streamtopo.planner.plan import Plan, evaluate

SCALE = 1_000_000
"""Integer units per core (weights) and per unit of utilisation."""
WEIGHT_SCALE = 100_000
"""Integer resolution of the objective's coefficients."""
MAX_NODES = 16
ROUNDING = 1e-6
"""Micro-cores of float error in ``weight * SCALE`` forgiven before rounding (0.3 * SCALE is 300000.00000000006)."""


def units(weight: float) -> int:
    """A node's or arc's cores as integer micro-cores, rounded up."""
    return math.ceil(weight * SCALE - ROUNDING)


def capacity_units(cpu: float) -> int:
    """A host's cores as integer micro-cores, rounded down."""
    return math.floor(cpu * SCALE + ROUNDING)


class NoFeasiblePlan(ValueError):
    """No valid plan with every host within capacity exists (or none was found in the time limit)."""


def exact_plan(
    graph: nx.DiGraph,
    cluster: Cluster,
    constraints: GraphConstraints | None = None,
    options: ColaOptions | None = None,
    time_limit: float = 30.0,
    workers: int = 2,
    seed: int = 0,
) -> Plan:
    """The plan minimising COLA's f(U, C) subject to U <= 1 and every constraint; raises NoFeasiblePlan.

    Only the objective weights of ``options`` matter here. ``details["optimal"]`` says whether CP-SAT
    proved optimality within ``time_limit`` seconds.
    """
    nodes = list(graph.nodes)
    if len(nodes) > MAX_NODES:
        raise ValueError(f"exact planning is for graphs of at most {MAX_NODES} nodes, got {len(nodes)}")
    constraints = constraints or GraphConstraints()
    hosts = list(cluster.capacity)
    pe_level = bool(
        constraints.pe_exlocation
        or constraints.pe_dedication
        or constraints.host_dedication
        or any(ha.isomorphic for ha in constraints.high_availability)
    )
    slots = len(nodes) if pe_level else 1
    index = {n: i for i, n in enumerate(nodes)}
    model = cp_model.CpModel()

    # a[v][h][j]: node v in PE j of host h. Symmetry breaking: node i only uses local slots j <= i.
    a = [
        [
            [model.new_bool_var(f"a{v}_{h}_{j}") if j <= v else None for j in range(slots)]
            for h in range(len(hosts))
        ]
        for v in range(len(nodes))
    ]
    for v, node in enumerate(nodes):
        allowed = constraints.allowed_hosts.get(node)
        for h, host in enumerate(hosts):
            if allowed is not None and host not in allowed:
                for var in a[v][h]:
                    if var is not None:
                        model.add(var == 0)
        model.add_exactly_one(x for row in a[v] for x in row if x is not None)

    def on(v: int, h: int) -> LinearExpr:
        return LinearExpr.sum([x for x in a[v][h] if x is not None])

    both_cache: dict[tuple[int, int], list[list[IntVar | int]]] = {}

    def both(u: int, v: int) -> list[list[IntVar | int]]:
        """both[h][j] = u and v share slot (h, j)."""
        key = (min(u, v), max(u, v))
        if key not in both_cache:
            grid = []
            for h in range(len(hosts)):
                row: list[IntVar | int] = []
                for j in range(slots):
                    x_u, x_v = a[u][h][j], a[v][h][j]
                    if x_u is None or x_v is None:
                        row.append(0)
                        continue
                    b = model.new_bool_var(f"b{key}_{h}_{j}")
                    model.add_bool_and([x_u, x_v]).only_enforce_if(b)
                    model.add_bool_or([x_u.Not(), x_v.Not(), b])
                    row.append(b)
                grid.append(row)
            both_cache[key] = grid
        return both_cache[key]

    def same_pe(u: int, v: int) -> LinearExpr:
        return LinearExpr.sum([b for row in both(u, v) for b in row])

    w_node = [units(graph.nodes[n]["w"]) for n in nodes]
    arcs = [(index[u], index[v], units(d["w"])) for u, v, d in graph.edges(data=True)]
    capacity = [capacity_units(cluster.capacity[host]) for host in hosts]
    loads = []
    for h in range(len(hosts)):
        # A variable of its own (domain: U <= 1, within capacity). Multiplying the raw expression by
        # SCALE below made coefficients ~1e12, and CP-SAT then reported a wrong OPTIMAL (seen on 2 nodes).
        load = model.new_int_var(0, capacity[h], f"load{h}")
        model.add(
            load
            == sum(w_node[v] * on(v, h) for v in range(len(nodes)))
            + sum(w * (on(u, h) + on(v, h) - 2 * sum(both(u, v)[h])) for u, v, w in arcs)
        )
        loads.append(load)
    communication = sum(w * (1 - same_pe(u, v)) for u, v, w in arcs)

    _add_constraints(model, constraints, index, len(hosts), on, same_pe)

    utilization = model.new_int_var(0, SCALE, "U")
    for h in range(len(hosts)):
        model.add(loads[h] * SCALE <= utilization * capacity[h])
    options = options or ColaOptions()
    mean_capacity = sum(cluster.capacity.values()) / len(hosts)
    model.minimize(
        round(options.utilization_weight * WEIGHT_SCALE) * utilization
        + round(options.communication_weight / mean_capacity * WEIGHT_SCALE) * communication
    )

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = seed
    status = solver.solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        why = (
            "no valid plan fits the hosts"
            if status == cp_model.INFEASIBLE
            else "no plan found in the time limit"
        )
        raise NoFeasiblePlan(why)

    groups: dict[tuple[int, int], list[Node]] = {}
    for v, node in enumerate(nodes):
        h, j = next(
            (h, j)
            for h in range(len(hosts))
            for j in range(slots)
            if (x := a[v][h][j]) is not None and solver.value(x)
        )
        groups.setdefault((h, j), []).append(node)
    keys = sorted(groups)
    return evaluate(
        graph,
        cluster,
        [groups[k] for k in keys],
        [hosts[h] for h, _ in keys],
        "exact",
        constraints,
        {"optimal": status == cp_model.OPTIMAL},
    )


def _add_constraints(
    model: cp_model.CpModel,
    constraints: GraphConstraints,
    index: dict[Node, int],
    n_hosts: int,
    on: Callable[[int, int], LinearExpr],
    same_pe: Callable[[int, int], LinearExpr],
) -> None:
    """The six constraint kinds (and dedication) as CP-SAT constraints over the slot variables."""
    hosts = range(n_hosts)
    for _, members in constraints.pe_colocation:
        first, *rest = (index[n] for n in members)
        for other in rest:
            model.add(same_pe(first, other) == 1)
    for _, members in constraints.host_colocation:
        first, *rest = (index[n] for n in members)
        for other in rest:
            for h in hosts:
                model.add(on(first, h) == on(other, h))
    for _, sets in constraints.pe_exlocation:
        for left, right in combinations(sets, 2):
            for x in left:
                for y in right:
                    model.add(same_pe(index[x], index[y]) == 0)
    for _, sets in constraints.host_exlocation:
        for left, right in combinations(sets, 2):
            for x in left:
                for y in right:
                    for h in hosts:
                        model.add(on(index[x], h) + on(index[y], h) <= 1)
    for level, entries in (("pe", constraints.pe_dedication), ("host", constraints.host_dedication)):
        for _, members in entries:
            inside = {index[n] for n in members}
            for p in inside:
                for q in set(index.values()) - inside:
                    if level == "pe":
                        model.add(same_pe(p, q) == 0)
                    else:
                        for h in hosts:
                            model.add(on(p, h) + on(q, h) <= 1)
    for ha in constraints.high_availability:
        used = [[model.new_bool_var("") for _ in hosts] for _ in ha.replicas]
        for r, replica in enumerate(ha.replicas):
            for n in replica:
                for h in hosts:
                    model.add(used[r][h] >= on(index[n], h))
        for h in hosts:
            model.add(sum(used[r][h] for r in range(len(ha.replicas))) <= 1)
        if ha.isomorphic:
            reference = [index[n] for n in ha.replicas[0]]
            for replica in ha.replicas[1:]:
                mapped = [index[n] for n in replica]
                for i, k in combinations(range(len(reference)), 2):
                    model.add(same_pe(reference[i], reference[k]) == same_pe(mapped[i], mapped[k]))
