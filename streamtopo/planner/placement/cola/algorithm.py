"""COLA's entry point: Advanced COLA (phases 1-4 with the six constraint kinds and the IP scheduler) or,
with ``ColaOptions(advanced=False)``, Basic COLA (LPT, no constraints)."""

from __future__ import annotations

import networkx as nx

from streamtopo.planner.cluster import Cluster
from streamtopo.planner.placement.cola.advanced import advanced_cola
from streamtopo.planner.placement.cola.basic import basic_cola
from streamtopo.planner.placement.cola.options import ColaOptions
from streamtopo.planner.placement.cola.preprocess import constrained_nodes
from streamtopo.planner.placement.constraints import GraphConstraints
from streamtopo.planner.plan import Plan


def cola_plan(
    graph: nx.DiGraph,
    cluster: Cluster,
    constraints: GraphConstraints | None = None,
    options: ColaOptions | None = None,
    seed: int = 0,
) -> Plan:
    """Fuse ``graph`` (logical or unit) into PEs placed on ``cluster``.

    Returns a valid plan (``plan.valid``); ``plan.feasible`` is False when no valid plan fits the
    hosts' capacities (the least utilised valid plan is returned). Raises :class:`NoValidPlan` naming
    the constraints that cannot be met.
    """
    if graph.number_of_nodes() == 0:
        raise ValueError("graph: nothing to plan (no operators)")
    options = options or ColaOptions()
    constraints = constraints or GraphConstraints()
    unknown = constrained_nodes(constraints) - set(graph.nodes)
    if unknown:
        raise ValueError(
            f"constraints: {len(unknown)} node(s) not in the graph, e.g. {min(map(str, unknown))}"
        )
    missing = [n for n, w in graph.nodes(data="w") if w is None or w < 0]
    if missing:
        raise ValueError(f"graph: node {missing[0]!r} has no non-negative cost 'w'")
    algorithm = advanced_cola if options.advanced else basic_cola
    return algorithm(graph, cluster, constraints, options, seed)
