"""StreamTopology resources as one Benoit problem: a structural hash finds the sub-trees they share.

Two operators are the same computation when their kind, their semantic fields (generator and its
parameters, stream name, expression, select, keys, window, aggregations, function, sink) and the hashes of
their inputs, in order, are equal. Names, costs, declared rates, selectivities, record sizes, key-group
counts and placement requirements are left out: they describe how an operator runs, not what it computes.
Streams are namespace-local, so the namespace is part of the hash unless ``across_namespaces``. Sinks
are each topology's own output and never shared (the topology's name is part of their hash).

Each topology becomes one application whose nodes are its operators, each at its own input rate; an
operator's work w_i is CPU-seconds per input record (``cost.cpu`` at the declared rate, else the kind's
default) and its output delta_i bytes per input record (selectivity x record size). A source downloads one
basic object: a named stream is held outside the cluster (in Valkey) at record size x rate; a generator
is computed in place (size 0). A byte that crosses processors costs ``crossing`` CPU-seconds, the
named-stream hop's (Aeolus' n and s of :class:`~streamtopo.planner.graph.CommCostModel`, n spread over
each record of the stream). Hosts give speed s_u (CPU cores), card B_u and links bw_{u,v}
(:mod:`streamtopo.planner.cluster`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import networkx as nx

from streamtopo.planner.benoit.problem import (
    Application,
    BasicObject,
    Node,
    Operator,
    Platform,
    Problem,
    Processor,
)
from streamtopo.planner.cluster import Cluster
from streamtopo.planner.graph import (
    DEFAULT_RECORD_BYTES,
    CommCostModel,
    OperatorCostModel,
    operator_dag,
    rates,
)
from streamtopo.planner.model import StreamTopology, TopologyError

HOW_IT_RUNS = {
    "name",
    "inputs",
    "cost",
    "requires",
    "selectivity",
    "record_bytes",
    "key_groups",
    "pane_group",
}
"""Operator fields left out of the structural hash."""


@dataclass(frozen=True)
class SharedProblem:
    """The problem, and who is who: application name -> topology, operator hash -> a readable name."""

    problem: Problem
    topologies: dict[str, StreamTopology]
    labels: dict[str, str]


def topology_name(topology: StreamTopology) -> str:
    return (
        f"{topology.metadata.namespace}/{topology.metadata.name}"
        if topology.metadata.namespace
        else topology.metadata.name
    )


def structural_hashes(topology: StreamTopology, *, across_namespaces: bool = False) -> dict[str, str]:
    """Operator name -> hash of what it computes (see the module docstring)."""
    spec = topology.spec
    by_name = spec.by_name()
    scope = "" if across_namespaces else (topology.metadata.namespace or "default")
    out: dict[str, str] = {}
    for name in _order(topology):
        op = by_name[name]
        fields = op.model_dump(mode="json", exclude=HOW_IT_RUNS, exclude_none=True)
        if op.source is not None:
            fields["source"] = op.source.model_dump(
                mode="json", exclude={"rate_per_second"}, exclude_none=True
            )
            if op.source.stream is not None:
                fields["scope"] = scope
        if op.sink is not None:  # a sink is its topology's own output: never shared
            fields["topology"] = topology_name(topology)
        fields["inputs"] = [out[i] for i in op.inputs]
        digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
        out[name] = digest[:16]
    return out


def _order(topology: StreamTopology) -> list[str]:
    return list(nx.lexicographical_topological_sort(operator_dag(topology.spec)))


def stream_cycles(topologies: Sequence[StreamTopology]) -> list[str]:
    """Topologies that feed each other through named streams, in a cycle (each would wait for the other)."""
    graph = nx.DiGraph()
    for t in topologies:
        scope = t.metadata.namespace or "default"
        for op in t.spec.operators:
            if op.sink is not None and op.sink.stream:
                graph.add_edge(topology_name(t), ("stream", scope, op.sink.stream))
            if op.source is not None and op.source.stream:
                graph.add_edge(("stream", scope, op.source.stream), topology_name(t))
    order = {topology_name(t): i for i, t in enumerate(topologies)}

    def from_first(cycle: list[Any]) -> list[Any]:
        """The cycle from its topology given first, so the message is the same on every run."""
        start = min(range(len(cycle)), key=lambda i: order.get(cycle[i], len(order)))
        return cycle[start:] + cycle[:start]

    cycles = sorted((from_first(list(c)) for c in nx.simple_cycles(graph)), key=lambda c: [str(n) for n in c])
    return [" -> ".join(n if isinstance(n, str) else f"stream {n[2]}" for n in c + c[:1]) for c in cycles]


def sharing_problem(
    topologies: Sequence[StreamTopology],
    cluster: Cluster,
    *,
    across_namespaces: bool = False,
    costs: OperatorCostModel | None = None,
    comm: CommCostModel | None = None,
) -> SharedProblem:
    """The Benoit problem of running these topologies together on ``cluster``; raises TopologyError on
    duplicate names, cycles through streams, or a shared operator whose inputs differ in schema."""
    costs, comm = costs or OperatorCostModel(), comm or CommCostModel()
    names = [topology_name(t) for t in topologies]
    problems = [
        (n, "the same topology is given twice") for n in sorted({n for n in names if names.count(n) > 1})
    ]
    problems += [
        ("streams", f"topologies feed each other in a cycle: {c}") for c in stream_cycles(topologies)
    ]
    if problems:
        raise TopologyError(problems)
    operators: dict[str, Operator] = {}
    objects: dict[str, BasicObject] = {}
    labels: dict[str, str] = {}
    apps = []
    for name, topology in zip(names, topologies):
        spec = topology.spec
        hashes = structural_hashes(topology, across_namespaces=across_namespaces)
        input_rate, edge_rate = rates(spec, costs)
        record_bytes = {(s.from_, s.to): s.record_bytes for s in spec.streams if s.record_bytes}
        nodes, frequencies = [], {}
        for op in spec.operators:
            rate = input_rate[op.name]
            cpu = op.cost.cpu if op.cost and op.cost.cpu is not None else rate * costs.per_record[op.kind]
            out_edges = [
                (r, record_bytes.get(e) or op.record_bytes or DEFAULT_RECORD_BYTES)
                for e, r in edge_rate.items()
                if e[0] == op.name
            ]
            out_rate, out_size = max(out_edges, key=lambda edge: edge[0] * edge[1], default=(0.0, 0.0))
            work, output = (cpu / rate, out_rate * out_size / rate) if rate > 0 else (0.0, 0.0)
            key = hashes[op.name]
            known = operators.get(key)
            operators[key] = Operator(
                key,
                max(work, known.work if known else 0.0),
                max(output, known.output if known else 0.0),
                max(comm.per_byte_of(out_size), known.crossing if known else 0.0),
            )
            labels.setdefault(key, op.name)
            objs: tuple[str, ...] = ()
            if op.source is not None:
                obj = f"{'stream' if op.source.stream else 'generator'}:{key}"
                size = (op.record_bytes or DEFAULT_RECORD_BYTES) if op.source.stream else 0.0
                known_object = objects.get(obj)
                objects[obj] = BasicObject(
                    obj,
                    max(size, known_object.size if known_object else 0.0),
                    crossing=comm.per_byte_of(size),
                )
                frequencies[obj] = rate
                objs = (obj,)
            nodes.append(Node(op.name, key, tuple(op.inputs), objs, rate=rate))
        apps.append(Application(name, tuple(nodes), rho=1.0, frequencies=frequencies))
    platform = Platform(
        tuple(Processor(h.name, h.cpu, h.network) for h in cluster.hosts),
        link=cluster.link_bandwidth,
        links={frozenset(link.hosts): link.bandwidth for link in cluster.links},
    )
    return SharedProblem(
        Problem(tuple(apps), operators, objects, platform), dict(zip(names, topologies)), labels
    )
