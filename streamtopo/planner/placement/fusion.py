"""One entry point for every fusion-and-placement algorithm, from a graph or from a whole spec.

``plan_fusion`` dispatches a logical or unit graph to COLA or a baseline; ``plan_topology`` is what the
controller and ``streamtopo plan`` call: it builds the graph the spec asks for, expands the spec's
constraints onto that graph, and takes the algorithm, objective weights and threshold from
``spec.fusion`` unless the caller overrides them.

Graph choice ("auto", documented in docs/planning.md): the logical graph when every operator's cost
w_v fits in gamma x the smallest host, since then any operator can run whole anywhere; otherwise the
unit graph, whose (operator, key group) vertices let COLA spread one heavy operator over several hosts.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import networkx as nx

from streamtopo.planner.cluster import Cluster
from streamtopo.planner.graph import logical_graph, unit_graph
from streamtopo.planner.model import StreamTopologySpec
from streamtopo.planner.placement.baselines import BASELINES, fint_plan
from streamtopo.planner.placement.constraints import GraphConstraints, expand_constraints
from streamtopo.planner.plan import Plan

if TYPE_CHECKING:
    from streamtopo.planner.placement.cola import ColaOptions
    from streamtopo.planner.placement.cola.profiling import Profile

FUSION_ALGORITHMS = {"cola", "none", "single", "fint", "metis"}
GRAPH_KINDS = {"auto", "logical", "unit"}


def plan_fusion(
    graph: nx.DiGraph,
    cluster: Cluster,
    constraints: GraphConstraints | None = None,
    algorithm: str = "cola",
    options: ColaOptions | None = None,
    seed: int = 0,
) -> Plan:
    """Fuse and place ``graph`` on ``cluster`` with the named algorithm.

    COLA raises ``streamtopo.planner.placement.cola.NoValidPlan`` when no plan meets the constraints; the
    baselines never raise for constraints, they return a plan whose ``violations`` say what breaks.
    FINT's size limit uses ``options.gamma`` (COLA's capacity factor) when options are given.
    """
    constraints = constraints or GraphConstraints()
    if algorithm == "cola":
        from streamtopo.planner.placement.cola import cola_plan

        return cola_plan(graph, cluster, constraints, options, seed)
    if algorithm == "fint":
        return fint_plan(graph, cluster, constraints, seed, gamma=_gamma(options))
    if algorithm in BASELINES:
        return BASELINES[algorithm](graph, cluster, constraints, seed)
    raise ValueError(
        f"unknown fusion algorithm {algorithm!r}: choose one of {', '.join(sorted(FUSION_ALGORITHMS))}"
    )


def _gamma(options: Any) -> float:
    return float(getattr(options, "gamma", 1.0)) if options is not None else 1.0


def choose_graph(
    spec: StreamTopologySpec, cluster: Cluster, kind: str = "auto", gamma: float = 1.0
) -> nx.DiGraph:
    """The logical or unit graph; "auto" applies the rule in this module's docstring."""
    if kind not in GRAPH_KINDS:
        raise ValueError(f"unknown graph kind {kind!r}: choose one of {', '.join(sorted(GRAPH_KINDS))}")
    logical = logical_graph(spec)
    if kind == "logical":
        return logical
    smallest = min(h.cpu for h in cluster.hosts)
    if kind == "auto" and all(w <= gamma * smallest for _, w in logical.nodes(data="w")):
        return logical
    return unit_graph(spec)


def cola_options(spec: StreamTopologySpec) -> ColaOptions:
    """COLA's options from ``spec.fusion``: the weights of f(U, C) and the threshold T."""
    from streamtopo.planner.placement.cola import ColaOptions

    fusion = spec.fusion
    return ColaOptions(
        utilization_weight=fusion.weights.utilization,
        communication_weight=fusion.weights.communication,
        threshold=fusion.threshold,
    )


def plan_topology(
    spec: StreamTopologySpec,
    cluster: Cluster,
    algorithm: str | None = None,
    graph_kind: str | None = None,
    seed: int = 0,
    profile: Profile | None = None,
) -> Plan:
    """Plan a validated spec on ``cluster``: graph, constraints, algorithm (spec.fusion unless given).

    With ``spec.fusion.profileIterations`` the first deployment is NONE, every operator its own PE (COLA
    Section 4's iteration 0, which profiles every operator and stream apart); ``profile`` is a later
    iteration: the algorithm on the graph with the measured costs in place of the declared ones, and for
    COLA the hosts' capacities scaled by ``profile.gamma`` (the paper iterates FINT alike, without gamma).
    """
    profiling = spec.fusion.profile_iterations > 0 and profile is None
    algorithm = algorithm or ("none" if profiling else spec.fusion.algorithm)
    options = cola_options(spec) if algorithm == "cola" else None
    graph = choose_graph(spec, cluster, graph_kind or spec.fusion.graph, _gamma(options))
    if profile is not None:
        from streamtopo.planner.placement.cola.profiling import measured_costs, with_costs

        if options is not None:
            options = replace(options, gamma=profile.gamma)
        graph = with_costs(graph, measured_costs(graph, profile))
    constraints = expand_constraints(spec, graph, cluster)
    return plan_fusion(graph, cluster, constraints, algorithm, options, seed)
