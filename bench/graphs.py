"""Benchmark graphs: VWAP-like jobs shaped after the COLA paper, and random layered DAGs.

VWAP-like (Khandekar et al., Section 4, Figure 6; docs/planning.md explains the shaping): a trades feed
and a quotes feed, each a short pre-processing chain (source -> parse -> filter) that splits the
stream over B symbol-group branches. A branch computes the group's VWAP (filter -> sliding aggregate ->
price map), filters the group's quotes, joins the two, keeps the bargains and scores them; every
branch then feeds two merges (bargains, VWAPs) that end in sinks. That is 10 fixed operators and 7 per
branch with 10 arcs per branch. The node and arc counts of the paper (200 / 283, 217 / 315) are met
exactly: leftover operators lengthen some branches by one map each, and leftover arcs are seeded
cross-branch links that respect the stage order (a VWAP shared with a neighbouring group's join, a
quote filter read by another group's scorer), so the graph stays a DAG. Beyond 32 branches (graphs
far larger than the paper's) each further 32 branches get their own feed pair, as a real deployment
would shard its feeds, so no single operator outgrows a host.

Costs follow the data: each branch gets a Zipf-skewed share of the symbols (hot groups are busier),
operator cost = input rate x per-kind cost, arc cost = rate; then the totals are scaled so the
operators use ``node_load`` and the arcs ``edge_load`` of the cluster's total capacity, which keeps the
job equally demanding on 4, 5, 6 or 7 hosts, as the paper's profiled runs were.
"""

from __future__ import annotations

import math
import random
from itertools import pairwise

import networkx as nx

FIXED_OPERATORS = 10
PER_BRANCH_OPERATORS = 7
PER_BRANCH_ARCS = 10
FIXED_ARCS = 6
BRANCHES_PER_FEED = 32
"""Larger graphs get one feed pair per this many branches, so no feed operator outgrows a host."""
FEED_OPERATORS = 6
FEED_ARCS = 4

_KIND_COST = {
    "source": 1.0,
    "parse": 1.5,
    "filter": 0.5,
    "aggregate": 2.0,
    "map": 0.6,
    "join": 2.5,
    "merge": 1.0,
    "sink": 0.4,
}
_BRANCH = [  # (stage, kind, input rate relative to the branch's share of the feed)
    ("trades", "filter", 1.0),
    ("vwap", "aggregate", 1.0),
    ("price", "map", 0.05),
    ("quotes", "filter", 1.5),
    ("match", "join", 0.6),
    ("bargains", "filter", 0.5),
    ("score", "map", 0.15),
]
_STAGE_RANK = {
    "trades": 1,
    "quotes": 1,
    "vwap": 2,
    "price": 3,
    "extra": 4,
    "match": 5,
    "bargains": 6,
    "score": 7,
}


def vwap_like(
    operators: int = 200,
    arcs: int | None = 283,
    seed: int = 0,
    capacity: float = 16.0,
    node_load: float = 0.6,
    edge_load: float = 0.1,
) -> nx.DiGraph:
    """A VWAP-shaped logical graph with exactly ``operators`` nodes and ``arcs`` arcs.

    ``arcs=None`` takes VWAP2's density (315 / 217 arcs per operator) or the minimum the shape needs.
    ``capacity`` is the cluster's total CPU (cores); operator costs sum to ``node_load * capacity`` and
    arc costs to ``edge_load * capacity``. Node attribute ``w`` and arc attribute ``w`` are cores.
    """
    rng = random.Random(seed)
    if operators < FIXED_OPERATORS + PER_BRANCH_OPERATORS:
        raise ValueError(
            f"a VWAP-like graph needs at least {FIXED_OPERATORS + PER_BRANCH_OPERATORS} operators"
        )
    feeds = max(1, math.ceil((operators - FIXED_OPERATORS) // PER_BRANCH_OPERATORS / BRANCHES_PER_FEED))
    fixed = FIXED_OPERATORS + FEED_OPERATORS * (feeds - 1)
    branches = (operators - fixed) // PER_BRANCH_OPERATORS
    extra_nodes = operators - fixed - PER_BRANCH_OPERATORS * branches
    base_arcs = FIXED_ARCS + FEED_ARCS * (feeds - 1) + PER_BRANCH_ARCS * branches + extra_nodes
    arcs = max(base_arcs, round(operators * 315 / 217)) if arcs is None else arcs
    if arcs < base_arcs:
        raise ValueError(f"{operators} VWAP-like operators need at least {base_arcs} arcs")
    share = [1 / (b + 1) ** 0.8 for b in range(branches)]  # Zipf-like symbol-group popularity
    share = [s / sum(share) for s in share]

    graph = nx.DiGraph(name="logical")
    rank: dict[str, int] = {}
    branch_of: dict[str, int] = {}

    def node(name: str, kind: str, rate: float, stage_rank: int, branch: int = -1) -> str:
        graph.add_node(
            name,
            w=rate * _KIND_COST[kind],
            kind=kind,
            operator=name,
            replica=0,
            rate=rate,
            key_groups=1,
            requires={},
            memory=0.0,
        )
        rank[name], branch_of[name] = stage_rank, branch
        return name

    def arc(u: str, v: str, rate: float) -> None:
        graph.add_edge(u, v, w=rate, rate=rate, record_bytes=64)

    def feed_of(b: int) -> str:
        return "" if feeds == 1 else f"-{b % feeds}"

    for f in range(feeds):
        load = sum(share[b] for b in range(f, branches, feeds))
        for feed, rate in (("trades", 1.0), ("quotes", 1.5)):
            chain = [
                node(f"{feed}-{step}{feed_of(f)}", kind, rate * load, 0)
                for step, kind in (("source", "source"), ("parse", "parse"), ("filter", "filter"))
            ]
            for u, v in pairwise(chain):
                arc(u, v, rate * load)
    bargains = node("bargains-merge", "merge", 0.15 * 0.5, 8)
    vwaps = node("vwap-merge", "merge", 0.05, 8)
    arc(bargains, node("bargains-sink", "sink", 0.02, 9), 0.02)
    arc(vwaps, node("vwap-sink", "sink", 0.05, 9), 0.05)

    lengthened = (
        set(rng.sample(range(branches), extra_nodes)) if extra_nodes <= branches else set(range(branches))
    )
    for b in range(branches):
        names = {
            stage: node(f"{stage}-{b}", kind, rel * share[b], _STAGE_RANK[stage], b)
            for stage, kind, rel in _BRANCH
        }
        arc(f"trades-filter{feed_of(b)}", names["trades"], share[b])
        arc(names["trades"], names["vwap"], share[b])
        arc(names["vwap"], names["price"], 0.05 * share[b])
        price = names["price"]
        if b in lengthened:
            price = node(f"extra-{b}", "map", 0.05 * share[b], _STAGE_RANK["extra"], b)
            arc(names["price"], price, 0.05 * share[b])
        arc(f"quotes-filter{feed_of(b)}", names["quotes"], 1.5 * share[b])
        arc(price, names["match"], 0.05 * share[b])
        arc(names["quotes"], names["match"], 0.3 * share[b])
        arc(names["match"], names["bargains"], 0.5 * share[b])
        arc(names["bargains"], names["score"], 0.15 * share[b])
        arc(names["score"], bargains, 0.15 * share[b])
        arc(price, vwaps, 0.05 * share[b])

    by_branch: dict[int, list[str]] = {}
    for name, b in branch_of.items():
        by_branch.setdefault(b, []).append(name)
    candidates = [
        (u, v)
        for b in range(branches)
        for d in (-2, -1, 1, 2)
        for u in by_branch[b]
        for v in by_branch.get(b + d, ())
        if rank[u] < rank[v]
    ]
    for u, v in rng.sample(sorted(candidates), arcs - graph.number_of_edges()):
        arc(u, v, 0.5 * min(graph.nodes[u]["rate"], graph.nodes[v]["rate"]))
    _scale(graph, node_load * capacity, edge_load * capacity)
    assert graph.number_of_nodes() == operators and graph.number_of_edges() == arcs
    return graph


def random_layered_dag(
    operators: int,
    seed: int = 0,
    layers: int | None = None,
    fan_in: int = 2,
    capacity: float = 8.0,
    node_load: float = 0.6,
    edge_load: float = 0.15,
) -> nx.DiGraph:
    """A seeded random DAG in layers; every node past the first layer reads 1..fan_in nodes of earlier
    layers (mostly the previous one). Costs are uniform random, scaled like ``vwap_like``."""
    rng = random.Random(seed)
    layers = layers or max(2, round(operators**0.5))
    cuts = sorted(rng.sample(range(1, operators), min(layers - 1, operators - 1)))
    bounds = [0, *cuts, operators]
    levels = [list(range(a, b)) for a, b in pairwise(bounds)]
    graph = nx.DiGraph(name="logical")
    for depth, level in enumerate(levels):
        for i in level:
            graph.add_node(
                f"op{i}",
                w=rng.uniform(0.2, 1.0),
                kind="map",
                operator=f"op{i}",
                replica=0,
                rate=1.0,
                key_groups=1,
                requires={},
                memory=0.0,
            )
            if depth == 0:
                continue
            earlier = [j for lvl in levels[max(0, depth - 2) : depth] for j in lvl]
            previous = levels[depth - 1]
            parents = {rng.choice(previous)} | set(
                rng.sample(earlier, min(len(earlier), rng.randint(0, fan_in - 1)))
            )
            for j in sorted(parents):
                graph.add_edge(f"op{j}", f"op{i}", w=rng.uniform(0.1, 1.0), rate=1.0, record_bytes=64)
    _scale(graph, node_load * capacity, edge_load * capacity)
    return graph


def _scale(graph: nx.DiGraph, node_total: float, edge_total: float) -> None:
    nodes = sum(w for _, w in graph.nodes(data="w"))
    edges = sum(w for *_, w in graph.edges(data="w")) or 1.0
    for _, data in graph.nodes(data=True):
        data["w"] *= node_total / nodes
    for *_, data in graph.edges(data=True):
        data["w"] *= edge_total / edges
