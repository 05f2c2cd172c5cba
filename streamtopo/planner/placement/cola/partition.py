"""COLA's state: the current PEs over super operators, the constraints restated on super operators,
and the split/merge moves that keep isomorphic HA replicas identical.

Advanced COLA (Section 3.3): the pre-processor "separates HA replicas into separate PEs", one per
replica plus a catch-all PE; PE- and host-dedicated operators start in PEs of their own ("a small change
to the COLA pre-processor", Section 3.1). With the isomorphic condition a split of one replica's PE "is
forced immediately on all the other replicas", and the partitioner sees the replicas' averaged costs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np
import scipy.sparse as sp

from streamtopo.planner.graph import Node, operator_of
from streamtopo.planner.placement.cola.options import NoValidPlan
from streamtopo.planner.placement.cola.placement import PlacementProblem
from streamtopo.planner.placement.cola.preprocess import AtomGraph
from streamtopo.planner.placement.constraints import GraphConstraints, HAGroup


@dataclass(frozen=True)
class HAReplicas:
    name: str
    replicas: tuple[frozenset[int], ...]
    isomorphic: bool
    image: np.ndarray | None
    """Isomorphic groups: image[r, j] is replica r's super operator at position j (replica 0 order)."""


@dataclass
class AtomConstraints:
    """GraphConstraints restated on super operators."""

    separations: list[tuple[str, np.ndarray, np.ndarray]] = field(default_factory=list)
    """Phase 1: (label, mask A, mask B): no PE may hold atoms of both. PE exlocation, host exlocation
    (which implies it, Section 3.1) and resource matching (operators with disjoint host sets)."""
    host_colocation: list[tuple[str, np.ndarray]] = field(default_factory=list)
    host_exlocation: list[tuple[str, tuple[np.ndarray, ...]]] = field(default_factory=list)
    high_availability: list[HAReplicas] = field(default_factory=list)
    dedicated: list[tuple[str, np.ndarray, bool]] = field(default_factory=list)
    """(label, atoms, host-dedicated?)."""

    @property
    def host_level(self) -> bool:
        return bool(
            self.host_colocation
            or self.host_exlocation
            or self.high_availability
            or any(host for *_, host in self.dedicated)
        )


def restate(atoms: AtomGraph, constraints: GraphConstraints) -> AtomConstraints:
    """Map node-level constraints to atom arrays; raise NoValidPlan on contradictions inside atoms."""

    def arr(nodes: Iterable[Node]) -> np.ndarray:
        return np.unique(np.array([atoms.atom_of[n] for n in nodes], dtype=np.int64))

    def mask(indices: np.ndarray) -> np.ndarray:
        out = np.zeros(atoms.n, dtype=bool)
        out[indices] = True
        return out

    out = AtomConstraints()
    problems = []
    for label, sets in (*constraints.pe_exlocation, *constraints.host_exlocation):
        for a, b in combinations(sets, 2):
            ma, mb = mask(arr(a)), mask(arr(b))
            if (ma & mb).any():
                problems.append(f"{label}: exlocated operators are fused by peColocation")
            out.separations.append((label, ma, mb))
    out.separations.extend(_resource_separations(atoms, mask))
    out.host_colocation = [(label, arr(members)) for label, members in constraints.host_colocation]
    out.host_exlocation = [
        (label, tuple(arr(s) for s in sets)) for label, sets in constraints.host_exlocation
    ]
    out.dedicated = [(label, arr(m), False) for label, m in constraints.pe_dedication] + [
        (label, arr(m), True) for label, m in constraints.host_dedication
    ]
    for label, nodes in (*constraints.pe_dedication, *constraints.host_dedication):
        if any(set(atoms.members[a]) - nodes for a in arr(nodes)):
            problems.append(f"{label}: peColocation fuses the operator with another")
    for ha in constraints.high_availability:
        replicas = tuple(frozenset(arr(r).tolist()) for r in ha.replicas)
        if any(a & b for a, b in combinations(replicas, 2)):
            problems.append(f"{ha.name}: peColocation fuses operators of different replicas")
            continue
        image = _replica_image(atoms, ha) if ha.isomorphic and len(ha.replicas) > 1 else None
        if ha.isomorphic and len(ha.replicas) > 1 and image is None:
            problems.append(
                f"{ha.name}: peColocation groups the replicas differently, so they cannot be isomorphic"
            )
        out.high_availability.append(HAReplicas(ha.name, replicas, ha.isomorphic, image))
    if problems:
        raise NoValidPlan(problems)
    return out


def _resource_separations(
    atoms: AtomGraph, mask: Callable[[np.ndarray], np.ndarray]
) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """Super operators whose allowed host sets are disjoint can never share a PE."""
    groups: dict[frozenset[str], list[int]] = {}
    for a, allowed in enumerate(atoms.allowed):
        if allowed is not None:
            groups.setdefault(allowed, []).append(a)
    keys = sorted(groups, key=sorted)
    out = []
    for x, y in combinations(keys, 2):
        if not x & y:
            names = sorted({operator_of(n) for a in groups[x][:1] + groups[y][:1] for n in atoms.members[a]})
            out.append(
                (
                    f"requires.nodeSelector ({' vs '.join(names)})",
                    mask(np.array(groups[x])),
                    mask(np.array(groups[y])),
                )
            )
    return out


def _replica_image(atoms: AtomGraph, ha: HAGroup) -> np.ndarray | None:
    """Position-wise correspondence of the replicas' super operators (None if not a bijection)."""
    sequences = [[atoms.atom_of[n] for n in replica] for replica in ha.replicas]
    first = list(dict.fromkeys(sequences[0]))
    index = {a: j for j, a in enumerate(first)}
    image = np.empty((len(sequences), len(first)), dtype=np.int64)
    for r, seq in enumerate(sequences):
        if len(seq) != len(sequences[0]):
            return None
        seen: dict[int, int] = {}
        for a0, ar in zip(sequences[0], seq):
            j = index[a0]
            if seen.setdefault(j, ar) != ar:
                return None
            image[r, j] = ar
        if len(set(image[r].tolist())) != len(first):
            return None
    return image


def _replica_keys(cons: AtomConstraints) -> dict[int, tuple[int, int]]:
    """Atom -> (HA group, replica) for every replicated atom."""
    return {
        a: (g, r)
        for g, ha in enumerate(cons.high_availability)
        for r, replica in enumerate(ha.replicas)
        for a in replica
    }


class Partition:
    """The current PEs (arrays of super operators) with cached sizes."""

    def __init__(self, atoms: AtomGraph, cons: AtomConstraints, pes: list[np.ndarray]):
        self.atoms = atoms
        self.cons = cons
        self.pes = [np.sort(p) for p in pes if len(p)]
        self.sizes = [atoms.size(p) for p in self.pes]
        self._replica = _replica_keys(cons)
        self._where: dict[int, tuple[int, int, int]] = {}
        for g, ha in enumerate(cons.high_availability):
            if ha.image is not None:
                for r, row in enumerate(ha.image):
                    for j, a in enumerate(row):
                        self._where[int(a)] = (g, r, j)

    @classmethod
    def initial(cls, atoms: AtomGraph, cons: AtomConstraints) -> Partition:
        """One PE per HA replica, per dedicated operator, and a catch-all PE for the rest."""
        taken = np.zeros(atoms.n, dtype=bool)
        replica = _replica_keys(cons)
        pes: list[np.ndarray] = []
        for _, members, _ in cons.dedicated:
            fresh = members[~taken[members]]
            taken[fresh] = True
            pieces: dict[
                tuple[int, int] | tuple[()], list[int]
            ] = {}  # a replicated dedicated operator: one PE per replica
            for a in fresh.tolist():
                pieces.setdefault(replica.get(a, ()), []).append(a)
            pes.extend(np.array(piece, dtype=np.int64) for piece in pieces.values())
        for ha in cons.high_availability:
            for atoms_of_replica in ha.replicas:
                ids = np.array(sorted(atoms_of_replica), dtype=np.int64)
                fresh = ids[~taken[ids]] if len(ids) else ids
                taken[fresh] = True
                pes.append(fresh)
        pes.append(np.flatnonzero(~taken))
        return cls(atoms, cons, pes)

    @classmethod
    def singletons(cls, atoms: AtomGraph, cons: AtomConstraints) -> Partition:
        return cls(atoms, cons, [np.array([a]) for a in range(atoms.n)])

    def copy(self) -> Partition:
        other = object.__new__(Partition)
        other.atoms, other.cons, other._where, other._replica = (
            self.atoms,
            self.cons,
            self._where,
            self._replica,
        )
        other.pes, other.sizes = list(self.pes), list(self.sizes)
        return other

    # ------------------------------------------------------------------ measures

    def cut(self) -> float:
        return self.atoms.cut(self.pes)

    def splittable(self) -> list[int]:
        return [i for i, p in enumerate(self.pes) if len(p) > 1]

    def allowed(self, i: int) -> frozenset[str] | None:
        restricted = self.pes[i][self.atoms.restricted[self.pes[i]]]
        if not len(restricted):
            return None
        return frozenset.intersection(*(self.atoms.allowed[a] for a in restricted.tolist()))

    def violated_separations(self, i: int) -> list[tuple[str, np.ndarray, np.ndarray]]:
        p = self.pes[i]
        return [(label, a, b) for label, a, b in self.cons.separations if a[p].any() and b[p].any()]

    def node_groups(self) -> list[list[Node]]:
        return [self.atoms.nodes(p) for p in self.pes]

    # ------------------------------------------------------------------ moves

    def _mirror(self, i: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(the group's image, positions) when PE i lies in an isomorphic HA replica."""
        first = int(self.pes[i][0])
        if first not in self._where:
            return None
        image = self.cons.high_availability[self._where[first][0]].image
        assert image is not None  # _where holds the atoms of isomorphic groups only
        return image, np.array([self._where[int(a)][2] for a in self.pes[i]], dtype=np.int64)

    def split_view(self, i: int) -> tuple[sp.csr_matrix, np.ndarray]:
        """The subgraph the partitioner sees for PE i: averaged over isomorphic replicas."""
        mirror = self._mirror(i)
        if mirror is None:
            p = self.pes[i]
            return self.atoms.adj[p][:, p], self.atoms.w[p]
        image, positions = mirror
        images = image[:, positions]
        adj = sum(self.atoms.adj[row][:, row] for row in images) / len(images)
        return sp.csr_matrix(adj), self.atoms.w[images].mean(axis=0)

    def split(self, i: int, side: np.ndarray) -> None:
        """Replace PE i by its two sides (and mirror the split on every isomorphic replica)."""
        mirror = self._mirror(i)
        if mirror is None:
            self._replace([i], [self.pes[i][side], self.pes[i][~side]])
            return
        image, positions = mirror
        targets = [self._pe_holding(int(image[r, positions[0]])) for r in range(len(image))]
        parts = [
            part
            for r in range(len(image))
            for part in (image[r, positions[side]], image[r, positions[~side]])
        ]
        self._replace(targets, parts)

    def merge_moves(self, i: int, j: int) -> list[tuple[int, int]] | None:
        """The PE pairs to merge when merging i and j: mirrored across isomorphic replicas.

        None when the merge would break a constraint: different HA replicas, dedication, or a PE
        exlocation pair ending up in one PE.
        """
        mi, mj = self._mirror(i), self._mirror(j)
        if (mi is None) != (mj is None):
            return None
        tag_i, tag_j = self._tag(i), self._tag(j)
        if tag_i != tag_j:
            return None
        if mi is None:
            moves = [(i, j)]
        else:
            assert mj is not None  # both mirrored or neither (checked above)
            image = mi[0]
            moves = [
                (self._pe_holding(int(image[r, mi[1][0]])), self._pe_holding(int(image[r, mj[1][0]])))
                for r in range(len(image))
            ]
        for a, b in moves:
            merged = np.concatenate([self.pes[a], self.pes[b]])
            if any(ma[merged].any() and mb[merged].any() for _, ma, mb in self.cons.separations):
                return None
        return moves

    def merge(self, moves: list[tuple[int, int]]) -> None:
        self._replace(
            [x for pair in moves for x in pair],
            [np.concatenate([self.pes[a], self.pes[b]]) for a, b in moves],
        )

    def _tag(self, i: int) -> tuple[str | None, tuple[int, int] | tuple[()]]:
        """Which HA replica and dedicated operator PE i belongs to (merges stay within one tag)."""
        first = int(self.pes[i][0])
        dedicated = next((label for label, members, _ in self.cons.dedicated if first in members), None)
        return dedicated, self._replica.get(first, ())

    def _pe_holding(self, atom: int) -> int:
        return next(k for k, p in enumerate(self.pes) if atom in p)

    def _replace(self, remove: list[int], add: list[np.ndarray]) -> None:
        gone = set(remove)
        keep = [k for k in range(len(self.pes)) if k not in gone]
        self.pes = [self.pes[k] for k in keep] + [np.sort(p) for p in add]
        self.sizes = [self.sizes[k] for k in keep] + [self.atoms.size(np.sort(p)) for p in add]

    # ------------------------------------------------------------------ placement

    def placement_problem(
        self, capacity: dict[str, float], resource_matching: bool = True
    ) -> PlacementProblem:
        """R_p, =_HC and HE over the current PEs (Section 3.3, (4)-(6)), plus host dedication."""
        pe_of = np.empty(self.atoms.n, dtype=np.int64)
        for k, p in enumerate(self.pes):
            pe_of[p] = k
        parent = list(range(len(self.pes)))

        def find(x: int) -> int:
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        for _, members in self.cons.host_colocation:
            pes = sorted(set(pe_of[members].tolist()))
            for q in pes[1:]:
                parent[find(q)] = find(pes[0])
        classes: dict[int, list[int]] = {}
        for k in range(len(self.pes)):
            classes.setdefault(find(k), []).append(k)
        exlocated: list[tuple[frozenset[int], frozenset[int]]] = []
        for _, sets in self.cons.host_exlocation:
            for a, b in combinations(sets, 2):
                exlocated.append((frozenset(pe_of[a].tolist()), frozenset(pe_of[b].tolist())))
        for ha in self.cons.high_availability:
            for one, other in combinations(ha.replicas, 2):
                exlocated.append(
                    (frozenset(int(pe_of[x]) for x in one), frozenset(int(pe_of[x]) for x in other))
                )
        for _, members, host in self.cons.dedicated:
            if host:
                mine = frozenset(pe_of[members].tolist())
                exlocated.append((mine, frozenset(range(len(self.pes))) - mine))
        return PlacementProblem(
            sizes=list(self.sizes),
            capacity=capacity,
            allowed=[self.allowed(k) if resource_matching else None for k in range(len(self.pes))],
            colocated=[c for c in classes.values() if len(c) > 1],
            exlocated=exlocated,
        )
