"""Section 4's profiling iterations: plan, measure, re-plan with a growing capacity factor gamma.

Khandekar et al., Section 4: profiling needs a fusion and a fusion needs profiles. They first run NONE
(every operator alone) in profiling mode; "using the NONE profiling data, we compute the fusion,
referred to as iteration 1 ... In iteration 1, we scale the CPU capacities B_i of the hosts by a factor
gamma < 1 ... gamma = 0.5 in iteration 1. Then we gradually increase gamma from 0.5 to 1.0 by 0.1
through 6 subsequent iterations", as the measured costs get more accurate.

Inputs of :func:`profile_iterations`: the graph (its w attributes are the first estimates), cluster,
constraints, COLA options, and ``measure(plan) -> MeasuredCosts``, the caller's way to run a plan in
profiling mode (the controller deploys it and reads per-operator busy CPU and per-stream
serialisation CPU). Outputs: one :class:`ProfileIteration` per run: iteration 0 is NONE, then one per
gamma, each with the plan and the graph (costs) it was planned from. The function is pure when
``measure`` is; without ``measure`` every iteration re-plans from the same costs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import networkx as nx

from streamtopo.planner.cluster import Cluster
from streamtopo.planner.graph import CommCostModel, Node, operator_of
from streamtopo.planner.placement.cola.algorithm import cola_plan
from streamtopo.planner.placement.cola.options import ColaOptions
from streamtopo.planner.placement.constraints import GraphConstraints
from streamtopo.planner.placement.lpt import lpt_schedule
from streamtopo.planner.plan import Plan, evaluate, pe_size


@dataclass(frozen=True)
class MeasuredCosts:
    """Profiled CPU cores: per graph node (w_v) and per arc (w_e); missing entries keep the estimate."""

    operators: Mapping[Node, float] = field(default_factory=dict)
    streams: Mapping[tuple[Node, Node], float] = field(default_factory=dict)


@dataclass(frozen=True)
class ProfileIteration:
    iteration: int
    gamma: float | None
    """None for iteration 0 (the NONE profiling run)."""
    plan: Plan
    graph: nx.DiGraph
    """The graph, with the costs this iteration was planned from."""


def gamma_schedule(start: float = 0.5, stop: float = 1.0, step: float = 0.1) -> list[float]:
    """0.5, 0.6, ..., 1.0 (rounded so float steps land exactly on 1.0)."""
    count = round((stop - start) / step)
    return [round(start + k * step, 10) for k in range(count + 1)]


def iteration_gamma(iteration: int) -> float:
    """gamma of profiling iteration ``iteration`` >= 1: 0.5 in the first, 0.1 more in each next one,
    1.0 from the sixth on (the paper's six iterations; more repeat the last)."""
    schedule = gamma_schedule()
    return schedule[min(iteration, len(schedule)) - 1]


@dataclass(frozen=True)
class Profile:
    """What a running deployment measured over one period, as the planner needs it: busy CPU cores per
    unit (operator, key group) and records per second from unit to unit (ALBIC's out[g_i][g_j], which the
    executors count whether the records stay in a process or cross), and the gamma to plan with."""

    busy: Mapping[tuple[str, int], float]
    traffic: Mapping[tuple[tuple[str, int], tuple[str, int]], float]
    gamma: float = 1.0
    crossing_cost: float | None = None
    """CPU-seconds one record costs when it crosses processes, as measured (:func:`crossing_cost`); None
    prices crossings by the transport model instead."""


def crossing_cost(
    executor_cores: float,
    busy: Mapping[tuple[str, int], float],
    traffic: Mapping[tuple[tuple[str, int], tuple[str, int]], float],
    placement: Mapping[tuple[str, int], str],
) -> float | None:
    """What the profiler of Section 4 measures for w_e, from what the executors export: the CPU the
    executors spent outside operators (``executor_cores`` minus the units' busy cores: encoding, the
    transport, decoding and each step's fixed cost) per record that crossed executors under ``placement``.

    It charges all of that overhead to crossings, so a run with more processes than cores over-prices
    them a little; COLA then cuts fewer arcs, which is what a runtime with a per-process cost rewards.
    None when nothing crossed or the overhead is not positive (nothing to learn from)."""
    crossing = sum(
        rate
        for (u, v), rate in traffic.items()
        if u in placement and v in placement and placement[u] != placement[v]
    )
    overhead = executor_cores - sum(busy.values())
    return overhead / crossing if crossing > 0 and overhead > 0 else None


def measured_costs(graph: nx.DiGraph, profile: Profile, comm: CommCostModel | None = None) -> MeasuredCosts:
    """Section 4's profile of ``graph``'s nodes and arcs from a running deployment: w_v = busy cores,
    w_e = records per second x what a record costs once it crosses processes (the profile's measured
    ``crossing_cost``, else the transport model's cost for the arc's record size), which is what COLA's
    cut counts.

    ``graph`` is the logical graph (a node's measure sums its operator's units) or the unit graph (one
    unit each). HA replicas r >= 1, which a local run does not start, take their primary's measure: each
    replica does the same work. Nodes and arcs the profile does not cover keep their estimates.
    """
    comm = comm or CommCostModel()
    unit_graph = graph.graph.get("name") == "unit"

    def key(node: Node) -> Node:
        """Where a graph node's measure is kept: per operator, or per (operator, key group)."""
        if unit_graph:
            assert isinstance(node, tuple)
            return (operator_of(node[0]), int(node[1]))
        return operator_of(node)

    busy: dict[Node, float] = defaultdict(float)
    for (op, kg), cores in profile.busy.items():
        busy[(op, kg) if unit_graph else op] += cores
    records: dict[tuple[Node, Node], float] = defaultdict(float)
    for ((u, i), (v, j)), rate in profile.traffic.items():
        records[((u, i), (v, j)) if unit_graph else (u, v)] += rate
    operators = {n: busy[key(n)] for n in graph.nodes if key(n) in busy}
    per_record = profile.crossing_cost
    streams = {
        (u, v): records[(key(u), key(v))] * per_record
        if per_record is not None
        else comm.stream_cost(records[(key(u), key(v))], data["record_bytes"])
        for u, v, data in graph.edges(data=True)
        if (key(u), key(v)) in records
    }
    return MeasuredCosts(operators, streams)


def with_costs(graph: nx.DiGraph, costs: MeasuredCosts) -> nx.DiGraph:
    """A copy of ``graph`` whose w attributes are the measured ones."""
    out = graph.copy()
    for node, w in costs.operators.items():
        out.nodes[node]["w"] = float(w)
    for (u, v), w in costs.streams.items():
        out.edges[u, v]["w"] = float(w)
    return out


def none_profiling_plan(graph: nx.DiGraph, cluster: Cluster, constraints: GraphConstraints) -> Plan:
    """Iteration 0: every node its own PE, placed by LPT (resource matching respected)."""
    groups = [[n] for n in graph.nodes]
    allowed = [constraints.allowed_hosts.get(n) for n in graph.nodes]
    hosts = lpt_schedule([pe_size(graph, g) for g in groups], cluster.capacity, allowed)
    return evaluate(graph, cluster, groups, hosts or [None] * len(groups), "none", constraints=constraints)


def profile_iterations(
    graph: nx.DiGraph,
    cluster: Cluster,
    constraints: GraphConstraints,
    measure: Callable[[Plan], MeasuredCosts] | None = None,
    options: ColaOptions | None = None,
    seed: int = 0,
    gammas: Sequence[float] | None = None,
) -> list[ProfileIteration]:
    """NONE, then COLA with gamma = 0.5, 0.6, ..., 1.0, each planned from the previous run's profile."""
    options = options or ColaOptions()
    plan = none_profiling_plan(graph, cluster, constraints)
    out = [ProfileIteration(0, None, plan, graph)]
    for k, gamma in enumerate(gammas if gammas is not None else gamma_schedule(), start=1):
        if measure is not None:
            graph = with_costs(graph, measure(plan))
        plan = cola_plan(graph, cluster, constraints, replace(options, gamma=gamma), seed)
        out.append(ProfileIteration(k, gamma, plan, graph))
    return out
