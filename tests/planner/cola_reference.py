"""Brute-force references for the COLA tests: every partition, every host assignment.

Written independently of streamtopo.planner.placement.cola: sizes and cuts are recomputed here from the graph,
validity is judged by the shared checker (streamtopo.planner.placement.constraints.violations).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import product

import networkx as nx


def set_partitions(items: Sequence) -> Iterator[list[list]]:
    """All partitions of ``items`` into non-empty blocks (Bell(n) of them)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for smaller in set_partitions(rest):
        for i in range(len(smaller)):
            yield smaller[:i] + [[first, *smaller[i]]] + smaller[i + 1 :]
        yield [[first], *smaller]


def size(graph: nx.DiGraph, block) -> float:
    """SIZE(S) = w(S) + weight of arcs with exactly one end in S."""
    inside = set(block)
    return sum(graph.nodes[n]["w"] for n in inside) + sum(
        d["w"] for u, v, d in graph.edges(data=True) if (u in inside) != (v in inside)
    )


def cut(graph: nx.DiGraph, blocks) -> float:
    where = {n: i for i, b in enumerate(blocks) for n in b}
    return sum(d["w"] for u, v, d in graph.edges(data=True) if where[u] != where[v])


def min_max_utilization(
    sizes: Sequence[float], capacity: dict[str, float], allowed=None, colocated=(), exlocated=()
) -> float | None:
    """Exact optimum of IP (3)-(8) by enumerating all assignments; None if no valid one."""
    hosts = list(capacity)
    best = None
    for assign in product(hosts, repeat=len(sizes)):
        if allowed and any(allowed[p] is not None and assign[p] not in allowed[p] for p in range(len(sizes))):
            continue
        if any(len({assign[p] for p in cls}) > 1 for cls in colocated):
            continue
        if any(assign[p] == assign[q] for a, b in exlocated for p in a for q in b):
            continue
        load = dict.fromkeys(hosts, 0.0)
        for p, h in enumerate(assign):
            load[h] += sizes[p]
        u = max(load[h] / capacity[h] for h in hosts)
        best = u if best is None else min(best, u)
    return best
