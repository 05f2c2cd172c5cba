"""The spec's placement constraints, expanded onto the nodes of the graph being partitioned.

COLA (Khandekar et al., Section 3) states six constraint kinds on operators. A plan works on a logical
graph (operators and HA replicas) or a unit graph ((operator, key group) pairs), so the same user
constraint becomes a constraint on sets of graph nodes. :func:`violations` checks any plan against
them; every planner and every test uses that one checker.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations

import networkx as nx

from streamtopo.planner.cluster import Cluster
from streamtopo.planner.graph import Node, operator_of
from streamtopo.planner.model import StreamTopologySpec

NodeSet = frozenset[Node]


@dataclass(frozen=True)
class HAGroup:
    """Replicas of a sub-graph: replica r's nodes. Replicas share no host; isomorphic ones also share
    the PE structure (node i of replica r is in a PE with node j iff the same holds in replica 0)."""

    replicas: tuple[tuple[Node, ...], ...]
    isomorphic: bool = True
    name: str = ""


@dataclass(frozen=True)
class GraphConstraints:
    """Constraints over graph nodes. Names say which spec entry each came from, for error messages."""

    pe_colocation: list[tuple[str, NodeSet]] = field(default_factory=list)
    host_colocation: list[tuple[str, NodeSet]] = field(default_factory=list)
    pe_exlocation: list[tuple[str, tuple[NodeSet, ...]]] = field(default_factory=list)
    """Each entry: node sets that must pairwise be in different PEs."""
    host_exlocation: list[tuple[str, tuple[NodeSet, ...]]] = field(default_factory=list)
    allowed_hosts: Mapping[Node, frozenset[str]] = field(default_factory=dict)
    """Resource matching: nodes absent here may run on any host."""
    high_availability: list[HAGroup] = field(default_factory=list)
    pe_dedication: list[tuple[str, NodeSet]] = field(default_factory=list)
    host_dedication: list[tuple[str, NodeSet]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (
            self.pe_colocation
            or self.host_colocation
            or self.pe_exlocation
            or self.host_exlocation
            or self.allowed_hosts
            or self.high_availability
            or self.pe_dedication
            or self.host_dedication
        )


def expand_constraints(spec: StreamTopologySpec, graph: nx.DiGraph, cluster: Cluster) -> GraphConstraints:
    """Map the spec's operator-level constraints onto ``graph``'s nodes.

    Co-location on a unit graph pairs key groups with the same index (kg i of a with kg i of b), the
    natural reading when both operators are partitioned alike; if their key-group counts differ the
    whole operators are co-located. Replicated operators are co-located replica by replica.
    """
    by_op: dict[str, list[Node]] = {}
    for node in graph.nodes:
        by_op.setdefault(operator_of(node), []).append(node)
    c = spec.constraints

    def nodes(name: str) -> NodeSet:
        return frozenset(by_op.get(name, ()))

    def colocated(groups: list[list[str]], label: str) -> list[tuple[str, NodeSet]]:
        out = []
        for i, names in enumerate(groups):
            for key, members in _colocation_classes(graph, names):
                out.append((f"{label}[{i}]{key}", members))
        return out

    allowed: dict[Node, frozenset[str]] = {}
    for node, data in graph.nodes(data=True):
        selector = data.get("requires") or {}
        if selector:
            allowed[node] = frozenset(h.name for h in cluster.hosts if h.matches(selector))

    ha_groups = []
    for i, ha in enumerate(c.high_availability):
        replicas = tuple(
            tuple(
                sorted(
                    (
                        n
                        for name in ha.operators
                        for n in by_op.get(name, ())
                        if graph.nodes[n]["replica"] == r
                    ),
                    key=_replica_position,
                )
            )
            for r in range(ha.replicas)
        )
        ha_groups.append(HAGroup(replicas=replicas, isomorphic=ha.isomorphic, name=f"highAvailability[{i}]"))

    return GraphConstraints(
        pe_colocation=colocated(c.pe_colocation, "peColocation"),
        host_colocation=colocated(c.host_colocation, "hostColocation"),
        pe_exlocation=[
            (f"peExlocation[{i}]", tuple(nodes(n) for n in names)) for i, names in enumerate(c.pe_exlocation)
        ],
        host_exlocation=[
            (f"hostExlocation[{i}]", tuple(nodes(n) for n in names))
            for i, names in enumerate(c.host_exlocation)
        ],
        allowed_hosts=allowed,
        high_availability=ha_groups,
        pe_dedication=[(f"peDedication[{i}]", nodes(n)) for i, n in enumerate(c.pe_dedication)],
        host_dedication=[(f"hostDedication[{i}]", nodes(n)) for i, n in enumerate(c.host_dedication)],
    )


def _replica_position(node: Node) -> tuple[str, int]:
    """Order replica nodes by (operator, key group) so node i of every replica is the same unit."""
    return operator_of(node), node[1] if isinstance(node, tuple) else 0


def _colocation_classes(graph: nx.DiGraph, names: Sequence[str]) -> list[tuple[str, NodeSet]]:
    """Split a co-location group into the node sets that must be together (by replica, by kg)."""
    classes: dict[tuple[int, int], set[Node]] = {}
    counts = {graph.nodes[n].get("key_groups") for n in graph.nodes if operator_of(n) in names}
    per_kg = graph.graph.get("name") == "unit" and len(counts) == 1
    for node, data in graph.nodes(data=True):
        if operator_of(node) in names:
            key = (data.get("replica", 0), data.get("key_group", 0) if per_kg else 0)
            classes.setdefault(key, set()).add(node)
    return [
        (_class_label(key, per_kg), frozenset(members))
        for key, members in sorted(classes.items())
        if len(members) > 1
    ]


def _class_label(key: tuple[int, int], per_kg: bool) -> str:
    replica, kg = key
    parts = ([f"replica {replica}"] if replica else []) + ([f"kg {kg}"] if per_kg else [])
    return f" ({', '.join(parts)})" if parts else ""


def violations(
    groups: Sequence[Iterable[Node]],
    hosts: Sequence[str | None],
    constraints: GraphConstraints,
) -> list[str]:
    """Every constraint a plan breaks, as readable messages naming the spec entry.

    ``groups[i]`` are the nodes of PE i and ``hosts[i]`` its host (None when not yet placed, in which
    case host-level constraints are not judged).
    """
    pe_of: dict[Node, int] = {n: i for i, members in enumerate(groups) for n in members}
    host_of: dict[Node, str | None] = {n: hosts[i] for n, i in pe_of.items()}
    placed = all(h is not None for h in hosts)
    problems: list[str] = []

    for label, members in constraints.pe_colocation:
        if len({pe_of[n] for n in members}) > 1:
            problems.append(f"{label}: operators are split over several PEs")
    for label, sets in constraints.pe_exlocation:
        for a, b in combinations(sets, 2):
            if {pe_of[n] for n in a} & {pe_of[n] for n in b}:
                problems.append(f"{label}: exlocated operators share a PE")
                break
    for label, members in constraints.pe_dedication:
        for pe in {pe_of[n] for n in members}:
            if set(groups[pe]) - members:
                problems.append(f"{label}: the operator's PE holds other operators")
                break
    problems.extend(_isomorphism_violations(pe_of, constraints))
    if not placed:
        return problems

    for label, members in constraints.host_colocation:
        if len({host_of[n] for n in members}) > 1:
            problems.append(f"{label}: operators are on several hosts")
    for label, sets in constraints.host_exlocation:
        for a, b in combinations(sets, 2):
            if {host_of[n] for n in a} & {host_of[n] for n in b}:
                problems.append(f"{label}: exlocated operators share a host")
                break
    for label, members in constraints.host_dedication:
        for host in {host_of[n] for n in members}:
            others = [n for n, h in host_of.items() if h == host and n not in members]
            if others:
                problems.append(f"{label}: host {host} also runs {operator_of(others[0])!r}")
                break
    bad = sorted(
        {
            operator_of(n)
            for n, allowed in constraints.allowed_hosts.items()
            if n in host_of and host_of[n] not in allowed
        }
    )
    if bad:
        problems.append(f"requires.nodeSelector: {', '.join(bad)} placed on a host whose labels do not match")
    for ha in constraints.high_availability:
        used = [{host_of[n] for n in replica} for replica in ha.replicas]
        if any(a & b for a, b in combinations(used, 2)):
            problems.append(f"{ha.name}: replicas share a host")
    return problems


def _isomorphism_violations(pe_of: Mapping[Node, int], constraints: GraphConstraints) -> list[str]:
    """Isomorphic HA: replica r's PE partition, mapped node by node, equals replica 0's."""
    problems = []
    for ha in constraints.high_availability:
        if not ha.isomorphic or len(ha.replicas) < 2:
            continue
        reference = _partition_shape(ha.replicas[0], pe_of)
        if any(_partition_shape(replica, pe_of) != reference for replica in ha.replicas[1:]):
            problems.append(f"{ha.name}: replicas do not have identical PE structures")
        if any(pe_of[a] == pe_of[b] for r1, r2 in combinations(ha.replicas, 2) for a in r1 for b in r2):
            problems.append(f"{ha.name}: replicas share a PE")
    return problems


def _partition_shape(replica: Sequence[Node], pe_of: Mapping[Node, int]) -> list[int]:
    """PE membership as positions: node i's label is the first index in the replica sharing its PE."""
    first: dict[int, int] = {}
    return [first.setdefault(pe_of[n], i) for i, n in enumerate(replica)]
