"""The fusion strategies COLA is compared with (Khandekar et al., Section 4), on COLA's inputs and outputs.

- NONE: every graph node is a PE of its own (the paper's profiling run).
- SINGLE: the whole graph is one PE (the paper names it and drops it; we keep it as the other extreme).
- FINT: the bottom-up fusion of Gedik et al. [13]: start from singletons, repeatedly fuse the adjacent
  pair of PEs whose fusion saves the most communication, as long as the fused PE still fits on a host,
  i.e. SIZE <= gamma x the capacity of the largest host (our reading, see docs/planning.md).
- METIS: k-way partitioning (pymetis) with the smallest k whose parts can be placed, found by doubling k
  then bisecting on it.

Every baseline places its PEs with the same LPT scheduler as Basic COLA (``lpt.lpt_schedule``),
restricted to the hosts that satisfy every member's resource matching, and is scored by
``plan.evaluate`` with the shared constraint checker, so violated constraints are reported, never hidden.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from typing import Any

import networkx as nx

from streamtopo.planner.cluster import Cluster
from streamtopo.planner.graph import Node
from streamtopo.planner.metis import metis_labels, weight_matrix
from streamtopo.planner.placement.constraints import GraphConstraints
from streamtopo.planner.placement.lpt import lpt_schedule
from streamtopo.planner.plan import Plan, evaluate, pe_size

ConstraintId = tuple[str, int]
"""(constraint kind, index): ``("pex", 0)`` is the first PE exlocation."""
Tag = tuple[ConstraintId, int]
"""(constraint id, side): which side of a constraint a node is on."""


def place(
    graph: nx.DiGraph,
    cluster: Cluster,
    groups: Sequence[Iterable[Node]],
    algorithm: str,
    constraints: GraphConstraints | None = None,
    details: dict[str, Any] | None = None,
) -> Plan:
    """LPT-place PEs on hosts, honouring resource matching where a PE has a matching host.

    A PE whose members' selectors no single host satisfies is placed unrestricted; the checker then
    reports the resource-matching violation in the plan.
    """
    pes = [list(g) for g in groups]
    sizes = [pe_size(graph, g) for g in pes]
    allowed = [_allowed_hosts(g, constraints, cluster) or None for g in pes]
    hosts = lpt_schedule(sizes, cluster.capacity, allowed)
    assert hosts is not None  # a PE no host matches is placed unrestricted, so LPT places every PE
    return evaluate(graph, cluster, pes, hosts, algorithm, constraints, details)


def _allowed_hosts(
    members: Iterable[Node], constraints: GraphConstraints | None, cluster: Cluster
) -> frozenset[str] | None:
    if constraints is None or not constraints.allowed_hosts:
        return None
    allowed = frozenset(cluster.capacity)
    restricted = False
    for node in members:
        if node in constraints.allowed_hosts:
            allowed &= constraints.allowed_hosts[node]
            restricted = True
    return allowed if restricted else None


def none_plan(
    graph: nx.DiGraph, cluster: Cluster, constraints: GraphConstraints | None = None, seed: int = 0
) -> Plan:
    """NONE: one PE per node."""
    return place(graph, cluster, [[n] for n in graph.nodes], "none", constraints)


def single_plan(
    graph: nx.DiGraph, cluster: Cluster, constraints: GraphConstraints | None = None, seed: int = 0
) -> Plan:
    """SINGLE: all nodes in one PE (no communication cost, one host does all the work)."""
    return place(graph, cluster, [list(graph.nodes)], "single", constraints)


def fint_plan(
    graph: nx.DiGraph,
    cluster: Cluster,
    constraints: GraphConstraints | None = None,
    seed: int = 0,
    gamma: float = 1.0,
) -> Plan:
    """FINT: greedy bottom-up fusion by largest communication saving while the PE fits on a host.

    Fusing PEs A and B removes the arcs between them, so SIZE(A u B) = SIZE(A) + SIZE(B) - 2 w(A, B)
    and C drops by w(A, B). A max-heap of adjacent pairs keyed by w(A, B) is kept lazily: entries of
    PEs that have since changed are skipped, and every pair touching a fused PE is pushed again, so a
    pair that did not fit is re-examined whenever one side changes. Where it can, FINT also respects
    the PE-level constraints: PE-colocated nodes start fused, and no fusion joins nodes that are
    PE-exlocated, PE-/host-dedicated or in different HA replicas. Ties break by node order, so FINT is
    deterministic and ``seed`` is unused.
    """
    limit = gamma * max(cluster.capacity.values())
    nodes = list(graph.nodes)
    index = {n: i for i, n in enumerate(nodes)}
    groups: dict[int, list[Node]] = {i: [n] for i, n in enumerate(nodes)}
    tags = _conflict_tags(constraints, index)
    group_tags: dict[int, frozenset[Tag]] = {i: tags.get(i, frozenset()) for i in groups}
    size = {i: pe_size(graph, [n]) for i, n in enumerate(nodes)}
    between: dict[int, dict[int, float]] = {i: {} for i in groups}
    for u, v, data in graph.edges(data=True):
        a, b = index[u], index[v]
        if a != b:
            between[a][b] = between[a].get(b, 0.0) + data["w"]
            between[b][a] = between[b].get(a, 0.0) + data["w"]
    version = dict.fromkeys(groups, 0)

    def fuse(a: int, b: int) -> int:
        """Fuse group b into a; returns a."""
        w_ab = between[a].pop(b, 0.0)
        between[b].pop(a, None)
        size[a] = size[a] + size[b] - 2 * w_ab
        groups[a].extend(groups.pop(b))
        group_tags[a] = group_tags[a] | group_tags.pop(b)
        for x, w in between.pop(b).items():
            between[x].pop(b)
            between[a][x] = between[a].get(x, 0.0) + w
            between[x][a] = between[x].get(a, 0.0) + w
        del size[b], version[b]
        version[a] += 1
        return a

    for members in _colocated(constraints, index):
        first = members[0]
        for other in members[1:]:
            if first in groups and other in groups and first != other:
                fuse(first, other)

    heap: list[tuple[float, int, int, int, int]] = []

    def push_pairs(a: int) -> None:
        for b, w in between[a].items():
            lo, hi = min(a, b), max(a, b)
            heapq.heappush(heap, (-w, lo, hi, version[lo], version[hi]))

    for a in list(groups):
        push_pairs(a)
    while heap:
        neg_w, a, b, va, vb = heapq.heappop(heap)
        if version.get(a) != va or version.get(b) != vb:
            continue
        if size[a] + size[b] + 2 * neg_w > limit + 1e-12 or _conflict(group_tags[a], group_tags[b]):
            continue
        push_pairs(fuse(a, b))
    return place(
        graph, cluster, list(groups.values()), "fint", constraints, {"size_limit": limit, "gamma": gamma}
    )


def _conflict_tags(constraints: GraphConstraints | None, index: dict[Node, int]) -> dict[int, frozenset[Tag]]:
    """Per node, tags that two fused PEs may not both carry with different values.

    A tag is (constraint id, side): each set of a PE/host exlocation, each HA replica (and the nodes
    outside every replica), and each dedicated operator (against all other nodes) is one side; two
    groups conflict when they hold the same constraint id on different sides.
    """
    if constraints is None:
        return {}
    tags: dict[int, set[Tag]] = {}

    def mark(cid: ConstraintId, side: int, nodes: Iterable[Node]) -> None:
        for n in nodes:
            tags.setdefault(index[n], set()).add((cid, side))

    for k, (_, sets) in enumerate(constraints.pe_exlocation):
        for side, members in enumerate(sets):
            mark(("pex", k), side, members)
    for k, (_, sets) in enumerate(constraints.host_exlocation):
        for side, members in enumerate(sets):
            mark(("hex", k), side, members)
    for k, group in enumerate(constraints.high_availability):
        for side, replica in enumerate(group.replicas):
            mark(("ha", k), side, replica)
        inside = {n for replica in group.replicas for n in replica}
        mark(("ha", k), -1, (n for n in index if n not in inside))
    dedicated = [*constraints.pe_dedication, *constraints.host_dedication]
    for k, (_, members) in enumerate(dedicated):
        mark(("ded", k), 1, members)
        mark(("ded", k), 0, (n for n in index if n not in members))
    return {i: frozenset(t) for i, t in tags.items()}


def _conflict(a: frozenset[Tag], b: frozenset[Tag]) -> bool:
    """True when the groups sit on different sides of one constraint."""
    sides_a: dict[ConstraintId, set[int]] = {}
    for cid, side in a:
        sides_a.setdefault(cid, set()).add(side)
    return any(cid in sides_a and sides_a[cid] != {side} for cid, side in b)


def _colocated(constraints: GraphConstraints | None, index: dict[Node, int]) -> list[list[int]]:
    if constraints is None:
        return []
    return [sorted(index[n] for n in members) for _, members in constraints.pe_colocation]


def metis_plan(
    graph: nx.DiGraph, cluster: Cluster, constraints: GraphConstraints | None = None, seed: int = 0
) -> Plan:
    """METIS k-way with the smallest k whose LPT placement is feasible.

    Feasibility is not strictly monotone in k, so the search doubles k from 1 until a feasible plan
    appears, then bisects between the last infeasible and the first feasible k. When no k up to the
    node count is feasible, the plan with the lowest U is returned (and reported infeasible).
    """
    n = graph.number_of_nodes()
    tried: dict[int, Plan] = {}

    def attempt(k: int) -> Plan:
        if k not in tried:
            tried[k] = place(graph, cluster, _metis_parts(graph, k, seed), "metis", constraints, {"k": k})
        return tried[k]

    k, low = 1, 0
    while not attempt(k).feasible and k < n:
        low, k = k, min(2 * k, n)
    if attempt(k).feasible:
        high = k
        while high - low > 1:
            mid = (low + high) // 2
            if attempt(mid).feasible:
                high = mid
            else:
                low = mid
        return attempt(high)
    return min(tried.values(), key=lambda p: (p.max_utilization, p.communication_cost))


def _metis_parts(graph: nx.DiGraph, k: int, seed: int) -> list[list[Node]]:
    """pymetis k-way parts (empty parts dropped); directed arcs merge into undirected edge weights."""
    nodes = list(graph.nodes)
    if k >= len(nodes) > 1:
        return [[n] for n in nodes]
    index = {n: i for i, n in enumerate(nodes)}
    matrix = weight_matrix(len(nodes), ((index[u], index[v], d["w"]) for u, v, d in graph.edges(data=True)))
    labels = metis_labels(matrix, k, [graph.nodes[n]["w"] for n in nodes], seed=seed)
    parts: dict[int, list[Node]] = {}
    for node, part in zip(nodes, labels):
        parts.setdefault(int(part), []).append(node)
    return [parts[p] for p in sorted(parts)]


BASELINES = {"none": none_plan, "single": single_plan, "fint": fint_plan, "metis": metis_plan}
"""Baseline name -> planner(graph, cluster, constraints, seed) -> Plan."""
