"""A fusion-and-placement plan and how it is scored.

COLA (Section 2) scores a plan by its maximum host utilisation U and its communication cost C. With
PE i holding node set S_i, SIZE(S_i) = w(S_i) + w(delta(S_i)): the operators' cost plus the cost of the
streams that leave or enter the PE (serialising at one end, deserialising at the other). A host's load
is the sum of its PEs' sizes; U = max load / capacity; C = sum of w_e over arcs between PEs (each arc
once; the paper's objective (ii) counts each twice, which does not change any optimum).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from streamtopo.planner.cluster import Cluster
from streamtopo.planner.graph import Node, operator_of
from streamtopo.planner.placement.constraints import GraphConstraints, violations


@dataclass(frozen=True)
class PE:
    """A processing element: graph nodes fused into one process, and the host it runs on."""

    name: str
    members: tuple[Node, ...]
    size: float
    host: str | None

    @property
    def operators(self) -> list[str]:
        """Logical node names (HA replicas keep their suffix), each once."""
        return sorted({m[0] if isinstance(m, tuple) else m for m in self.members})

    @property
    def units(self) -> list[str]:
        return [f"{m[0]}/{m[1]}" if isinstance(m, tuple) else m for m in self.members]


@dataclass(frozen=True)
class Plan:
    """What a fusion algorithm returns, scored against the graph and cluster it was made for."""

    algorithm: str
    graph_kind: str
    pes: tuple[PE, ...]
    capacity: dict[str, float]
    load: dict[str, float]
    max_utilization: float
    communication_cost: float
    violations: tuple[str, ...] = ()
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def feasible(self) -> bool:
        """Every host within capacity (U <= 1, with a tolerance for float sums)."""
        return self.max_utilization <= 1.0 + 1e-9

    @property
    def valid(self) -> bool:
        """Every constraint of the spec holds."""
        return not self.violations

    def pe_of(self) -> dict[Node, str]:
        return {m: pe.name for pe in self.pes for m in pe.members}

    def host_of(self) -> dict[Node, str | None]:
        return {m: pe.host for pe in self.pes for m in pe.members}

    def to_dict(self) -> dict[str, Any]:
        """The ``streamtopo plan --format json`` contract (keys are stable; values are plain JSON)."""
        return {
            "algorithm": self.algorithm,
            "feasible": self.feasible,
            "valid": self.valid,
            "max_utilization": round(self.max_utilization, 6),
            "communication_cost": round(self.communication_cost, 6),
            "graph": self.graph_kind,
            "pes": [
                {
                    "name": pe.name,
                    "operators": pe.operators,
                    "size": round(pe.size, 6),
                    "host": pe.host,
                    **({"units": pe.units} if self.graph_kind == "unit" else {}),
                }
                for pe in self.pes
            ],
            "hosts": [
                {
                    "name": h,
                    "capacity": cap,
                    "load": round(self.load[h], 6),
                    "utilization": round(self.load[h] / cap, 6),
                }
                for h, cap in self.capacity.items()
            ],
            "violations": list(self.violations),
            **({"details": self.details} if self.details else {}),
        }


def pe_size(graph: nx.DiGraph, members: Iterable[Node]) -> float:
    """COLA's SIZE(S) = w(S) + w(delta(S)), in CPU cores."""
    inside = set(members)
    size: float = sum(graph.nodes[n]["w"] for n in inside)
    for n in inside:
        size += sum(d["w"] for _, v, d in graph.out_edges(n, data=True) if v not in inside)
        size += sum(d["w"] for u, _, d in graph.in_edges(n, data=True) if u not in inside)
    return size


def cut_weight(graph: nx.DiGraph, groups: Sequence[Iterable[Node]]) -> float:
    """C: total weight of arcs whose ends are in different groups."""
    group_of = {n: i for i, members in enumerate(groups) for n in members}
    return float(sum(d["w"] for u, v, d in graph.edges(data=True) if group_of[u] != group_of[v]))


def evaluate(
    graph: nx.DiGraph,
    cluster: Cluster,
    groups: Sequence[Iterable[Node]],
    hosts: Sequence[str | None],
    algorithm: str,
    constraints: GraphConstraints | None = None,
    details: dict[str, Any] | None = None,
) -> Plan:
    """Score a partition of ``graph`` into PEs placed on ``hosts``; raises if a node is missing or twice."""
    pe_members = [tuple(sorted(g, key=_order_key)) for g in groups]
    seen = [n for g in pe_members for n in g]
    if len(seen) != len(set(seen)) or set(seen) != set(graph.nodes):
        missing = set(graph.nodes) - set(seen)
        raise ValueError(
            f"a plan must cover every node exactly once (missing {len(missing)}, "
            f"duplicated {len(seen) - len(set(seen))})"
        )
    if len(hosts) != len(pe_members):
        raise ValueError("one host per PE")
    pes = tuple(
        PE(name=f"pe-{i}", members=g, size=pe_size(graph, g), host=h)
        for i, (g, h) in enumerate(zip(pe_members, hosts))
    )
    load = {h.name: 0.0 for h in cluster.hosts}
    for pe in pes:
        if pe.host is not None:
            load[pe.host] += pe.size
    capacity = cluster.capacity
    return Plan(
        algorithm=algorithm,
        graph_kind=graph.graph.get("name", "logical"),
        pes=pes,
        capacity=capacity,
        load=load,
        max_utilization=max(load[h] / capacity[h] for h in capacity),
        communication_cost=cut_weight(graph, pe_members),
        violations=tuple(violations(pe_members, hosts, constraints)) if constraints else (),
        details=details or {},
    )


def _order_key(node: Node) -> tuple[str, str]:
    return (operator_of(node), str(node))
