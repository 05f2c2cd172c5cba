"""COLA's pre-processor: PE-colocation fusion and the Lemma 1 fusions, producing "super operators".

Khandekar et al., Section 2.2 (Lemma 1): an edge e = (u, v) may be collapsed when
    w_e >= min{ w_u + w(delta({u}) - {e}),  w_v + w(delta({v}) - {e}) },
because some optimum keeps u and v together (moving u next to v shrinks both PEs and the cut). Fused
operators get w_U = w_u + w_v and their edges add up; the test is repeated on the result. Advanced
COLA (Section 3.3) applies it to unconstrained operators only and also fuses PE-colocated operators.

The pre-processor works on the undirected "atom graph": arcs u->v and v->u become one edge with the
summed weight, which is all SIZE and the cut see. With antiparallel arcs the lemma's proof still holds
for the summed edge (moving u removes the whole u-v weight from both PEs' cuts).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import networkx as nx
import numpy as np
import scipy.sparse as sp

from streamtopo.planner.graph import Node
from streamtopo.planner.placement.constraints import GraphConstraints

Find = Callable[[Node], Node]
"""Union-find's find: the representative of a node's class."""

LEMMA_TOLERANCE = 1e-12


@dataclass
class AtomGraph:
    """The graph COLA partitions: super operators ("atoms") with summed weights, undirected edges."""

    members: list[tuple[Node, ...]]
    w: np.ndarray
    adj: sp.csr_matrix
    """Symmetric, zero diagonal: adj[a, b] = total weight of arcs between atoms a and b."""
    allowed: list[frozenset[str] | None]
    """Resource matching: hosts every member may use (None = any host)."""
    atom_of: dict[Node, int]
    fusions: list[tuple[Node, Node]] = field(default_factory=list)
    """Lemma 1 fusions, as representative node pairs, in the order they were made."""

    def __post_init__(self) -> None:
        self.deg = np.asarray(self.adj.sum(axis=1)).ravel()
        upper = sp.triu(self.adj, 1).tocoo()
        self._rows, self._cols, self._weights = upper.row, upper.col, upper.data
        self.restricted = np.array([a is not None for a in self.allowed], dtype=bool)

    @property
    def n(self) -> int:
        return len(self.members)

    def size(self, atoms: np.ndarray) -> float:
        """SIZE(S) = w(S) + w(delta(S)) (equation (1))."""
        inner = self.adj[atoms][:, atoms].sum()
        return float(self.w[atoms].sum() + self.deg[atoms].sum() - inner)

    def cut(self, pes: Sequence[np.ndarray]) -> float:
        """C: weight of edges between different PEs (each edge once)."""
        label = np.empty(self.n, dtype=np.int64)
        for i, atoms in enumerate(pes):
            label[atoms] = i
        return float(self._weights[label[self._rows] != label[self._cols]].sum())

    def nodes(self, atoms: Iterable[int]) -> list[Node]:
        return [n for a in atoms for n in self.members[a]]


def constrained_nodes(constraints: GraphConstraints) -> set[Node]:
    """Nodes named by any constraint: Lemma 1 leaves them alone (Section 3.3, "unconstrained")."""
    c = constraints
    named: set[Node] = set(c.allowed_hosts)
    for _, members in (*c.pe_colocation, *c.host_colocation, *c.pe_dedication, *c.host_dedication):
        named |= members
    for _, sets in (*c.pe_exlocation, *c.host_exlocation):
        for s in sets:
            named |= s
    for ha in c.high_availability:
        for replica in ha.replicas:
            named.update(replica)
    return named


def preprocess(graph: nx.DiGraph, constraints: GraphConstraints, lemma1: bool = True) -> AtomGraph:
    """Fuse PE-colocated nodes, then apply Lemma 1 to unconstrained nodes until nothing changes."""
    parent: dict[Node, Node] = {n: n for n in graph.nodes}

    def find(x: Node) -> Node:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for _, members in constraints.pe_colocation:
        first, *rest = sorted(members, key=str)
        for other in rest:
            parent[find(other)] = find(first)
    _mirror_colocation(constraints, find, parent)
    fusions: list[tuple[Node, Node]] = []
    if lemma1:
        fusions = _lemma1(
            graph,
            constraints_free=set(graph.nodes) - constrained_nodes(constraints),
            find=find,
            parent=parent,
        )
    return build_atoms(graph, constraints, find, fusions)


def _mirror_colocation(constraints: GraphConstraints, find: Find, parent: dict[Node, Node]) -> None:
    """Isomorphic HA replicas share their PE structure, so operators PE-colocated in one replica are
    colocated at the same positions in every replica."""
    for ha in constraints.high_availability:
        if not ha.isomorphic or len({len(r) for r in ha.replicas}) != 1:
            continue
        size = len(ha.replicas[0])
        for i in range(size):
            for j in range(i + 1, size):
                if any(find(r[i]) == find(r[j]) for r in ha.replicas):
                    for r in ha.replicas:
                        parent[find(r[j])] = find(r[i])


def _lemma1(
    graph: nx.DiGraph, constraints_free: set[Node], find: Find, parent: dict[Node, Node]
) -> list[tuple[Node, Node]]:
    """Iterated Lemma 1 on the undirected weighted graph of unconstrained nodes.

    Only an edge carrying at least half of an endpoint's w + incident weight can qualify on that
    endpoint's side, so a worklist over endpoints finds every qualifying edge.
    """
    weight: dict[Node, float] = {n: float(graph.nodes[n]["w"]) for n in graph.nodes}
    nbr: dict[Node, dict[Node, float]] = {n: {} for n in graph.nodes}
    for u, v, d in graph.edges(data=True):
        if u != v:
            nbr[u][v] = nbr[u].get(v, 0.0) + float(d["w"])
            nbr[v][u] = nbr[v].get(u, 0.0) + float(d["w"])
    free = set(constraints_free)  # PE-colocated nodes are constrained, so every free node is a root
    degree = {n: sum(nbr[n].values()) for n in graph.nodes}
    fusions: list[tuple[Node, Node]] = []
    work = sorted(free, key=str)
    queued = set(work)
    while work:
        u = work.pop()
        queued.discard(u)
        if u not in free:
            continue
        for v in sorted(nbr[u], key=str):
            if v not in free:
                continue
            e = nbr[u][v]
            bound = min(weight[u] + degree[u] - e, weight[v] + degree[v] - e)
            if e + LEMMA_TOLERANCE * max(e, bound) < bound:
                continue
            fusions.append((u, v))
            parent[v] = u
            free.discard(v)
            weight[u] += weight[v]
            for x, wx in nbr.pop(v).items():
                del nbr[x][v]
                if x != u:
                    nbr[u][x] = nbr[u].get(x, 0.0) + wx
                    nbr[x][u] = nbr[x].get(u, 0.0) + wx
            for x in (u, *nbr[u]):
                degree[x] = sum(nbr[x].values())
                if x in free and x not in queued:
                    work.append(x)
                    queued.add(x)
            break
    return fusions


def build_atoms(
    graph: nx.DiGraph, constraints: GraphConstraints, find: Find, fusions: Sequence[tuple[Node, Node]] = ()
) -> AtomGraph:
    """Contract every class of ``find`` into one atom (deterministic atom order)."""
    classes: dict[Node, list[Node]] = {}
    for n in graph.nodes:
        classes.setdefault(find(n), []).append(n)
    members = sorted((tuple(sorted(ms, key=str)) for ms in classes.values()), key=lambda ms: str(ms[0]))
    atom_of = {n: i for i, ms in enumerate(members) for n in ms}
    w = np.array([sum(float(graph.nodes[n]["w"]) for n in ms) for ms in members])
    rows, cols, vals = [], [], []
    for u, v, d in graph.edges(data=True):
        a, b = atom_of[u], atom_of[v]
        if a != b:
            rows += [a, b]
            cols += [b, a]
            vals += [float(d["w"]), float(d["w"])]
    adj = sp.csr_matrix((vals, (rows, cols)), shape=(len(members), len(members)))
    adj.sum_duplicates()
    adj.eliminate_zeros()
    allowed: list[frozenset[str] | None] = []
    for ms in members:
        sets = [constraints.allowed_hosts[n] for n in ms if n in constraints.allowed_hosts]
        allowed.append(frozenset.intersection(*sets) if sets else None)
    return AtomGraph(members=members, w=w, adj=adj, allowed=allowed, atom_of=atom_of, fusions=list(fusions))
