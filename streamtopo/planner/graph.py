"""From a validated spec to the graphs the optimisers partition.

The *logical graph* has one vertex per operator (and per HA replica of an operator), weighted by its
CPU cost w_v in cores, and one arc per stream, weighted by the CPU cost w_e of carrying that stream
between processes. The *unit graph* has one vertex per (operator, key group) and the kg-to-kg traffic
as arcs: one-to-one where consecutive operators are partitioned by the same key with the same number
of key groups, forward (kg i -> kg i mod K) into an unkeyed operator, all-to-all otherwise.

Cost model (documented in docs/cost-model.md): an operator without a profiled ``cost.cpu`` costs
``input rate x per-record cost of its kind``; a stream costs ``rate x (per_record + bytes x per_byte)``
cores, the serialisation, transport and deserialisation work Aeolus calls n and s. Rates propagate
from sources through selectivities; ``streams`` overrides win. All weights are CPU cores, so COLA's
SIZE(S) = w(S) + w(delta(S)) compares directly with a host's capacity.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field

import networkx as nx

from streamtopo.planner.expressions import ExpressionError, parse_expression
from streamtopo.planner.model import Operator, StreamTopologySpec

Node = str | tuple[str, int]
"""A logical node (operator or replica name) or a unit (logical node, key group)."""

DEFAULT_RECORD_BYTES = 64
REPLICA_SEPARATOR = "~r"


@dataclass(frozen=True)
class CommCostModel:
    """CPU seconds to move one record between processes: Aeolus' n (per message) and s (per byte).

    Defaults are what ``streamtopo calibrate`` measured on the reference machine (2-core x86_64,
    Arrow IPC through Valkey); pass measured values to plan for another machine.
    """

    per_record: float = 2e-6
    per_byte: float = 5e-9

    def stream_cost(self, rate: float, record_bytes: float) -> float:
        return rate * (self.per_record + record_bytes * self.per_byte)

    def per_byte_of(self, record_bytes: float) -> float:
        """CPU seconds per byte of a stream of ``record_bytes``-byte records (n spread over each record)."""
        return self.per_byte + self.per_record / record_bytes if record_bytes > 0 else 0.0


@dataclass(frozen=True)
class OperatorCostModel:
    """Per-record CPU seconds by kind, and default selectivities, for operators not yet profiled."""

    per_record: dict[str, float] = field(
        default_factory=lambda: {
            "source": 5e-6,
            "map": 10e-6,
            "filter": 5e-6,
            "aggregate": 20e-6,
            "join": 30e-6,
            "udf": 50e-6,
            "sink": 10e-6,
        }
    )
    selectivity: dict[str, float] = field(
        default_factory=lambda: {
            "source": 1.0,
            "map": 1.0,
            "filter": 0.5,
            "aggregate": 0.1,
            "join": 0.5,
            "udf": 1.0,
            "sink": 0.0,
        }
    )


def replica_name(operator: str, replica: int) -> str:
    """Replica 0 keeps the operator's name; replica r >= 1 is ``name~r<r>``."""
    return operator if replica == 0 else f"{operator}{REPLICA_SEPARATOR}{replica}"


def operator_of(node: Node) -> str:
    """The user's operator behind a logical node or unit."""
    name = node[0] if isinstance(node, tuple) else node
    return name.split(REPLICA_SEPARATOR)[0]


def rates(
    spec: StreamTopologySpec, ops: OperatorCostModel | None = None
) -> tuple[dict[str, float], dict[tuple[str, str], float]]:
    """Input rate of every operator and rate of every stream, records per second.

    A source's input rate is its own generation rate; others sum their input streams. A stream's rate
    is its producer's output rate (input x selectivity) unless ``spec.streams`` overrides it.
    """
    ops = ops or OperatorCostModel()
    overrides = {(s.from_, s.to): s.rate for s in spec.streams if s.rate is not None}
    by_name = spec.by_name()
    order = list(nx.topological_sort(operator_dag(spec)))
    input_rate: dict[str, float] = {}
    edge_rate: dict[tuple[str, str], float] = {}
    for name in order:
        op = by_name[name]
        if op.source is not None:
            input_rate[name] = op.source.rate_per_second
        else:
            input_rate[name] = sum(edge_rate[(u, name)] for u in op.inputs)
        out = input_rate[name] * _selectivity(op, ops)
        for downstream in by_name.values():
            if name in downstream.inputs:
                edge_rate[(name, downstream.name)] = overrides.get((name, downstream.name), out)
    return input_rate, edge_rate


def _selectivity(op: Operator, ops: OperatorCostModel) -> float:
    return op.selectivity if op.selectivity is not None else ops.selectivity[op.kind]


def operator_dag(spec: StreamTopologySpec) -> nx.DiGraph:
    """The operators and their input arcs (what a topological order or a cycle check walks)."""
    dag = nx.DiGraph()
    dag.add_nodes_from(op.name for op in spec.operators)
    dag.add_edges_from((u, op.name) for op in spec.operators for u in op.inputs)
    return dag


def _replicas(spec: StreamTopologySpec) -> dict[str, int]:
    """Operator -> number of copies the HA constraints ask for (1 when not replicated)."""
    count = {op.name: 1 for op in spec.operators}
    for ha in spec.constraints.high_availability:
        for name in ha.operators:
            count[name] = ha.replicas
    return count


def logical_graph(
    spec: StreamTopologySpec,
    comm: CommCostModel | None = None,
    ops: OperatorCostModel | None = None,
) -> nx.DiGraph:
    """The operator graph with w_v and w_e in CPU cores; HA operators appear once per replica.

    An arc between two replicated operators connects replica r to replica r (each replica is a whole
    copy of the sub-graph); an arc that enters or leaves a replicated sub-graph connects every replica,
    since each replica reads the full input and each copy's output is delivered downstream.
    Node attributes: w, operator, replica, kind, rate (input records/s), key_groups, requires.
    Edge attributes: w, rate, record_bytes.
    """
    comm, ops = comm or CommCostModel(), ops or OperatorCostModel()
    input_rate, edge_rate = rates(spec, ops)
    replicas = _replicas(spec)
    record_bytes = {(s.from_, s.to): s.record_bytes for s in spec.streams if s.record_bytes is not None}
    graph = nx.DiGraph(name="logical")
    for op in spec.operators:
        cpu = (
            op.cost.cpu
            if op.cost and op.cost.cpu is not None
            else input_rate[op.name] * ops.per_record[op.kind]
        )
        for r in range(replicas[op.name]):
            graph.add_node(
                replica_name(op.name, r),
                w=cpu,
                operator=op.name,
                replica=r,
                kind=op.kind,
                rate=input_rate[op.name],
                key_groups=spec.key_groups_of(op.name),
                requires=dict(op.requires.node_selector) if op.requires else {},
                memory=op.cost.memory if op.cost and op.cost.memory is not None else 0.0,
            )
    by_name = spec.by_name()
    for (u, v), rate in edge_rate.items():
        size = record_bytes.get((u, v)) or by_name[u].record_bytes or DEFAULT_RECORD_BYTES
        for ru, rv in _replica_pairs(replicas[u], replicas[v]):
            graph.add_edge(
                replica_name(u, ru),
                replica_name(v, rv),
                w=comm.stream_cost(rate, size),
                rate=rate,
                record_bytes=size,
            )
    return graph


def _replica_pairs(nu: int, nv: int) -> list[tuple[int, int]]:
    if nu == nv:
        return [(r, r) for r in range(nu)]
    return [(a, b) for a in range(nu) for b in range(nv)]


def pane_group(spec: StreamTopologySpec, op: Operator) -> tuple[str, tuple[str, ...], int, str | None]:
    """What windowed aggregates share to share sub-windows (runtime/operators/shared_panes.py): their one
    input, key, key-group count and ``paneGroup``."""
    return (
        op.inputs[0],
        tuple(partition_key(spec, op.name) or ()),
        spec.key_groups_of(op.name),
        op.pane_group,
    )


def partition_key(spec: StreamTopologySpec, name: str) -> tuple[str, ...] | None:
    """The columns an operator's key groups hash: its keyBy, else inherited through a single input.

    A stateless operator fed by one keyed operator (a source partitioned by key included) keeps that
    partitioning, so the pair is one-to-one in the unit graph; a source without keyBy, or an operator
    with several unkeyed inputs, has none.
    Nor does one whose input is a map that drops a key column: its records no longer carry the key, so
    nothing downstream can be partitioned by it (a sink after ``keyBy: [i]`` and ``select: [s]`` is
    unkeyed and fed forward, as a Flink stream is no longer keyed after a map).
    The runtime routes records with the same rule, so the planner's unit graph is the real traffic.
    """
    op = spec.operator(name)
    if op.key_by:
        return tuple(op.key_by)
    if len(op.inputs) != 1:
        return None
    producer = spec.operator(op.inputs[0])
    key = partition_key(spec, producer.name)
    return None if key is not None and _drops(producer, key) else key


def _drops(op: Operator, key: tuple[str, ...]) -> bool:
    """Whether a map's select certainly leaves out a column of ``key``. Spark names an unaliased computed
    item after its text (``(n + 1)``, ``upper(s)``), which is never a plain identifier; so such an item
    can hold the key only when a key column's name is not one, and then it keeps the key, as a ``*`` or
    an item that does not parse does (the door's and the analyser's key checks name the field)."""
    if op.kind != "map" or not op.select:
        return False
    plain = all(_IDENTIFIER.fullmatch(k) for k in key)
    names: set[str] = set()
    for text in op.select:
        try:
            parsed = parse_expression(text, "select")
        except ExpressionError:
            return False
        if parsed.star or (parsed.name is None and not plain):
            return False
        if parsed.name is not None:
            names.add(parsed.name.casefold())
    return not {k.casefold() for k in key} <= names  # Spark resolves names case-insensitively


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


STATELESS_KINDS = frozenset({"map", "filter"})
"""Kinds whose output does not depend on which key group ran them (a UDF may group its batch by key)."""


def routing_key(spec: StreamTopologySpec, name: str) -> tuple[str, ...] | None:
    """The columns records are routed to ``name``'s key groups by: its partition key, except for a
    stateless map or filter every consumer of which is an aggregate keyed by its own keyBy.

    There the keyBy can only cost: the aggregates re-partition the map's output anyway, and nothing
    inherits its partitioning. Routed forward instead, like an unkeyed operator, it runs where its input
    was produced, and what crosses is the aggregates' partial aggregates (the runtime's map-side
    combine) rather than whole records: partial aggregation pushed below the keyed map. Its keyBy is
    still checked against its input's columns (schema.py), as written."""
    key = partition_key(spec, name)
    op = spec.operator(name)
    if key is None or op.kind not in STATELESS_KINDS or not op.key_by:
        return key
    consumers = [o for o in spec.operators if name in o.inputs]
    if consumers and all(o.kind == "aggregate" and o.key_by for o in consumers):
        return None
    return key


def unit_edges(spec: StreamTopologySpec, u: str, v: str) -> list[tuple[int, int, float]]:
    """(kg of u, kg of v, share of the u->v stream) for every kg-to-kg pair that carries records.

    One-to-one when u and v are routed by the same key (:func:`routing_key`) with the same K; forward
    (i -> i mod K_v) into an unkeyed v; all-to-all otherwise (hash partitioning spreads each upstream
    kg over every downstream kg).
    """
    ku, kv = spec.key_groups_of(u), spec.key_groups_of(v)
    key_u, key_v = routing_key(spec, u), routing_key(spec, v)
    if key_v is not None and key_u == key_v and ku == kv:
        return [(i, i, 1.0 / ku) for i in range(ku)]
    if key_v is None:
        return [(i, i % kv, 1.0 / ku) for i in range(ku)]
    return [(i, j, 1.0 / (ku * kv)) for i in range(ku) for j in range(kv)]


def unit_arcs(spec: StreamTopologySpec, u: str, v: str) -> int:
    """How many pairs :func:`unit_edges` gives, without listing them."""
    ku, kv = spec.key_groups_of(u), spec.key_groups_of(v)
    key_u, key_v = routing_key(spec, u), routing_key(spec, v)
    if key_v is None or (key_u == key_v and ku == kv):
        return ku
    return ku * kv


MAX_UNITS = 65_536
"""Units (operator, key group) one topology may have: each is a routing-table entry, a state record
and a vertex of every plan."""
MAX_UNIT_ARCS = 1_000_000
"""Unit-graph arcs COLA partitions within the default planning time limit (120 s; about 35 CPU-seconds
per million arcs on the reference machine, docs/security.md)."""


def plan_size_problems(
    spec: StreamTopologySpec, prefix: str = "spec", sized: Collection[str] = ()
) -> list[tuple[str, str]]:
    """Sizes that cannot plan in time, refused before any planning starts: more units than
    :data:`MAX_UNITS`, or (unless ``spec.fusion.graph`` is ``logical``) a unit graph of more than
    :data:`MAX_UNIT_ARCS` arcs. The field named is the key groups of the operator that weighs most
    (``spec.keyGroups`` for the operators in ``sized``, whose key groups Aeolus chose)."""
    index = {op.name: i for i, op in enumerate(spec.operators)}
    replicas = _replicas(spec)

    def where(name: str) -> str:
        if spec.operator(name).key_groups is not None and name not in sized:
            return f"{prefix}.operators[{index[name]}].keyGroups"
        return f"{prefix}.keyGroups"

    units = {op.name: spec.key_groups_of(op.name) * replicas.get(op.name, 1) for op in spec.operators}
    if sum(units.values()) > MAX_UNITS:
        heaviest = max(units, key=lambda n: units[n])
        return [
            (
                where(heaviest),
                f"{sum(units.values())} units (operators x key groups), more than the {MAX_UNITS} a "
                f"topology may have ({heaviest!r} alone has {units[heaviest]}): fewer key groups",
            )
        ]
    if spec.fusion.graph == "logical":
        return []
    arcs = {
        (u, op.name): unit_arcs(spec, u, op.name) * max(replicas.get(u, 1), replicas.get(op.name, 1))
        for op in spec.operators
        for u in op.inputs
    }
    if sum(arcs.values()) <= MAX_UNIT_ARCS:
        return []
    u, v = max(arcs, key=lambda e: arcs[e])
    return [
        (
            where(v),
            f"the unit graph would have {sum(arcs.values())} arcs, more than the {MAX_UNIT_ARCS} that plan "
            f"within the time limit ({u!r} -> {v!r} alone has {arcs[(u, v)]}: every key group of one to "
            "every key group of the other): fewer key groups, the same keyBy and key groups on both ends "
            "(one to one), or spec.fusion.graph: logical",
        )
    ]


def unit_graph(
    spec: StreamTopologySpec,
    comm: CommCostModel | None = None,
    ops: OperatorCostModel | None = None,
) -> nx.DiGraph:
    """One vertex per (logical node, key group); operator cost split evenly over its key groups."""
    logical = logical_graph(spec, comm, ops)
    graph = nx.DiGraph(name="unit")
    for node, data in logical.nodes(data=True):
        k = data["key_groups"]
        for kg in range(k):
            graph.add_node(
                (node, kg),
                **{
                    **data,
                    "w": data["w"] / k,
                    "rate": data["rate"] / k,
                    "memory": data["memory"] / k,
                    "key_group": kg,
                },
            )
    for u, v, data in logical.edges(data=True):
        for i, j, share in unit_edges(spec, operator_of(u), operator_of(v)):
            graph.add_edge(
                (u, i),
                (v, j),
                w=data["w"] * share,
                rate=data["rate"] * share,
                record_bytes=data["record_bytes"],
            )
    return graph
