"""Aeolus (Sax, Castellanos, Chen, Hsu, ICDE 2014): degree of parallelism per operator, batch size per edge.

The paper's model of one producer/consumer pair (Section II.1):

- a consumer with input rate ``r_i`` and pure processing time ``ppt`` (seconds per record) is not
  overloaded with ``dop = min{dop | dop > ppt * r_i}`` tasks (Eq. 2);
- shipping one message costs ``n + t * s`` (``n`` seconds per message, ``s`` seconds per byte, ``t``
  bytes per record); a producer task whose input latency ``l_i = 1 / r_i`` is smaller than its actual
  processing time ``ppt + n + t * s`` batches ``b`` records per message, and then emits
  ``r_o = b / max{b * l_i, n + b * (ppt + t * s)}`` records per second (Eq. 3);
- the smallest batch that lets the producer keep up is ``min{b | b >= n / (l_i - ppt - t * s)}``
  (Eq. 4), capped by ``B_max`` bytes (``B_max / t`` records); when the cap binds, the producer's dop is
  raised until the capped batch suffices (Algorithm 1, lines 6-7).

Algorithm 1 (TopologyOptimizer) walks from the sources to the sinks: batch sizes and output rates of
the producers first (lines 3-11), then the dop of every consumer whose producers are all known
(lines 12-15), which become the next producers (line 16).

Mapping onto streamtopo: a task is one parallel instance of an operator, so ``dop`` is how many
executors' worth of parallelism the operator needs; the planner uses it to size key groups (an
operator cannot run on more tasks than it has key groups, so ``warnings`` names every operator whose
dop exceeds its ``keyGroups``; :func:`open_key_groups` sizes the operators whose count the spec leaves
open) and the initial executor count (:func:`initial_executors`: the job's
CPU demand at the planned rates, processing plus shipping, at the target utilisation). The batch size
per edge ``from->to`` is
what the runtime puts in one transport entry (``RoutingTable.batch_sizes``). Two choices the paper
leaves open:

- sources: the paper takes a user-defined source dop (footnote 3); the spec has none, and a generator
  is parallel over its key groups, so a source gets Eq. 2 on its generation rate like any node;
- selectivity: Eq. 3 assumes one output record per input record. An edge carrying ``share`` output
  records per input record (its declared rate over the producer's declared input rate) carries
  ``share * dop * r_o``; with selectivity 1 this is Eq. 3 exactly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from streamtopo.planner.graph import (
    DEFAULT_RECORD_BYTES,
    CommCostModel,
    OperatorCostModel,
    rates,
)
from streamtopo.planner.model import StreamTopologySpec
from streamtopo.planner.scaling.policy import ScalingConfig, target_count


def optimal_dop(ppt: float, input_rate: float) -> int:
    """Eq. 2: the smallest dop with ``dop > ppt * r_i`` (strict: a task busy 100 % would queue forever).

    A product within 1e-9 of an integer counts as that integer, so float noise in propagated rates
    (99999.99999999999 for 1e5) does not flip the strict inequality.
    """
    return math.floor(ppt * input_rate * (1 + 1e-9) + 1e-12) + 1


def output_rate(batch: int, input_latency: float, ppt: float, n: float, t: float, s: float) -> float:
    """Eq. 3: records per second one producer task emits with batch size ``batch``."""
    if math.isinf(input_latency):
        return 0.0
    return batch / max(batch * input_latency, n + batch * (ppt + t * s))


def optimal_batch(input_latency: float, ppt: float, n: float, t: float, s: float) -> float:
    """Eq. 4: ``min{b | b >= n / (l_i - ppt - t * s)}``; infinite when no batch can keep up."""
    slack = input_latency - ppt - t * s
    if slack <= 1e-9 * input_latency:  # zero up to float noise: no batch keeps up
        return math.inf
    return max(1, math.ceil(n / slack))


def needs_batching(input_latency: float, ppt: float, n: float, t: float, s: float) -> bool:
    """Algorithm 1, line 4: the input latency is smaller than the actual (unbatched) processing time."""
    return input_latency < ppt + n + t * s


@dataclass(frozen=True)
class AeolusPlan:
    """Algorithm 1's answer for one topology."""

    dop: dict[str, int]
    """Tasks per operator (Eq. 2, raised by Algorithm 1 line 7 where the batch cap binds)."""
    batch_sizes: dict[str, int]
    """``from->to`` -> records per message (Eq. 4 capped by B_max; 1 where batching does not help)."""
    input_rate: dict[str, float]
    """Records per second reaching each operator, from its producers' Eq. 3 output rates."""
    output_rate: dict[str, float]
    """``from->to`` -> records per second on the edge (Eq. 3 x dop x share)."""
    demand: float = 0.0
    """CPU cores the job needs at these rates: sum of r_i * ppt plus the shipping cost
    ``r_o * (n / b + t * s)`` of every edge (the initial executor count derives from it)."""
    steps: list[str] = field(default_factory=list)
    """The optimiser's decisions in order, instantiated formulas included (the paper's step view)."""
    warnings: list[str] = field(default_factory=list)


def edge_key(producer: str, consumer: str) -> str:
    """The ``from->to`` key of RoutingTable.batch_sizes."""
    return f"{producer}->{consumer}"


def aeolus_plan(
    spec: StreamTopologySpec,
    measured: Mapping[str, float] | None = None,
    *,
    n: float | None = None,
    s: float | None = None,
    ops: OperatorCostModel | None = None,
) -> AeolusPlan:
    """Run Algorithm 1 over ``spec``.

    ``measured`` maps operator names to measured pure processing times (seconds per record, the
    inverse of the true processing rate the controller derives from busy time); unmeasured operators
    use their profiled ``cost.cpu`` divided by their declared input rate, else the per-kind default of
    :class:`OperatorCostModel`. ``n`` and ``s`` default to :class:`CommCostModel`'s calibrated
    per-record and per-byte costs; ``spec.batching.maxBytes`` is B_max and ``spec.batching.size``, when
    set, fixes every batch size (Eq. 3 then uses it).
    """
    comm, ops = CommCostModel(), ops or OperatorCostModel()
    n = comm.per_record if n is None else n
    s = comm.per_byte if s is None else s
    _check_nonnegative("n", n)
    _check_nonnegative("s", s)
    declared_in, declared_edge = rates(spec, ops)
    by_name = spec.by_name()
    ppt = {name: _pure_processing_time(spec, name, declared_in[name], measured, ops) for name in by_name}
    downstream: dict[str, list[str]] = {name: [] for name in by_name}
    for op in spec.operators:
        for upstream in op.inputs:
            downstream[upstream].append(op.name)
    record_bytes = _record_bytes(spec)

    dop: dict[str, int] = {}
    input_rate: dict[str, float] = {}
    batches: dict[str, int] = {}
    edge_rate: dict[str, float] = {}
    steps: list[str] = []

    def size_consumer(name: str, rate: float) -> None:
        """Algorithm 1, line 14 (and a source's dop from its generation rate)."""
        input_rate[name] = rate
        dop[name] = optimal_dop(ppt[name], rate)
        steps.append(
            f"dop({name}) = min{{dop > ppt * r_i = {ppt[name]:.3g} * {rate:.6g}}} = {dop[name]} (Eq. 2)"
        )

    sources = {op.name: op.source for op in spec.operators if op.source is not None}
    producers = list(sources)
    for name, source in sources.items():
        size_consumer(name, source.rate_per_second)
    done = set(producers)
    while producers:
        for p in producers:  # lines 3-11
            _optimise_producer(
                p,
                downstream[p],
                ppt[p],
                dop,
                input_rate[p],
                declared_in[p],
                declared_edge,
                record_bytes,
                spec,
                n,
                s,
                batches,
                edge_rate,
                steps,
            )
        ready = [
            op.name
            for op in spec.operators  # line 12
            if op.name not in done and op.inputs and all(u in done for u in op.inputs)
        ]
        for c in ready:  # lines 13-15
            size_consumer(c, sum(edge_rate[edge_key(u, c)] for u in by_name[c].inputs))
        done.update(ready)
        producers = [c for c in ready if downstream[c]]  # line 16

    warnings = [
        f"operator {name!r} needs dop {d} but has only {spec.key_groups_of(name)} key groups: raise its keyGroups"
        for name, d in dop.items()
        if d > spec.key_groups_of(name)
    ]
    demand = sum(input_rate[name] * ppt[name] for name in input_rate) + sum(
        edge_rate[edge_key(u, v)] * (n / batches[edge_key(u, v)] + t * s)
        for (u, v), t in record_bytes.items()
    )
    return AeolusPlan(
        dop=dop,
        batch_sizes=batches,
        input_rate=input_rate,
        output_rate=edge_rate,
        demand=demand,
        steps=steps,
        warnings=warnings,
    )


KEY_GROUP_HEADROOM = 2
"""Key groups an open operator gets per task Eq. 2 asks for: room for the autoscaler to spread a load
peak or a skewed key over more executors than the declared rates need."""


def open_key_groups(spec: StreamTopologySpec, limit: int | None = None) -> dict[str, int]:
    """Key groups for the operators whose count the spec leaves open (neither ``keyGroups`` at the top
    nor on the operator): :data:`KEY_GROUP_HEADROOM` x Algorithm 1's dop (Eq. 2, raised by line 7),
    rounded up to a power of two, where that exceeds the default ``spec.keyGroups``; at most 4096 and
    ``limit`` (the platform's maxKeyGroups). An operator Eq. 2 finds light keeps the default.

    Key groups are fixed for a deployment's life (they partition state), so they are sized once, from
    the declared rates and costs, before anything runs; the executor count follows the measured load.
    """
    if "key_groups" in spec.model_fields_set:
        return {}
    ceiling = min(4096, limit or 4096)
    plan = aeolus_plan(spec)
    out = {}
    for op in spec.operators:
        if op.key_groups is None:
            wanted = min(ceiling, 1 << math.ceil(math.log2(KEY_GROUP_HEADROOM * plan.dop[op.name])))
            if wanted > spec.key_groups:
                out[op.name] = wanted
    return out


def initial_executors(plan: AeolusPlan, config: ScalingConfig) -> int:
    """Executors for a new deployment: the plan's demand at the target utilisation (the scaling rule's
    steady-state count, so the first SPL starts where the rule would put it)."""
    return target_count(plan.demand, config.executor_capacity, config)


def _optimise_producer(
    p: str,
    consumers: list[str],
    ppt: float,
    dop: dict[str, int],
    rate: float,
    declared_rate: float,
    declared_edge: Mapping[tuple[str, str], float],
    record_bytes: Mapping[tuple[str, str], int],
    spec: StreamTopologySpec,
    n: float,
    s: float,
    batches: dict[str, int],
    edge_rate: dict[str, float],
    steps: list[str],
) -> None:
    """Algorithm 1, lines 4-10 for one producer: its batch size per outgoing edge and output rates.

    The dop is raised first for the edge whose capped batch needs the most tasks, so every edge's
    batch (Eq. 4) and output rate (Eq. 3) are computed with the producer's final dop.
    """
    fixed = spec.batching.size
    for c in consumers:  # lines 5-7: the batch cap may force more tasks
        t = record_bytes[(p, c)]
        b_max = max(1, spec.batching.max_bytes // t)
        latency = dop[p] / rate if rate > 0 else math.inf
        if (
            fixed is None
            and needs_batching(latency, ppt, n, t, s)
            and optimal_batch(latency, ppt, n, t, s) > b_max
        ):
            needed = math.ceil(rate * (ppt + t * s + n / b_max))
            if needed > dop[p]:
                steps.append(
                    f"batch({p}->{c}) capped at B_max/t = {b_max}: dop({p}) {dop[p]} -> {needed} "
                    f"so that l_i >= ppt + t*s + n/B (Algorithm 1, line 7)"
                )
                dop[p] = needed
    for c in consumers:  # lines 5-10 with the final dop
        key, t = edge_key(p, c), record_bytes[(p, c)]
        b_max = max(1, spec.batching.max_bytes // t)
        latency = dop[p] / rate if rate > 0 else math.inf
        if fixed is not None:
            batch = fixed
        elif needs_batching(latency, ppt, n, t, s):
            batch = int(min(optimal_batch(latency, ppt, n, t, s), b_max))
            steps.append(
                f"batch({key}) = ceil(n / (l_i - ppt - t*s)) = ceil({n:.3g} / ({latency:.3g} - {ppt:.3g} "
                f"- {t}*{s:.3g})) -> {batch} (Eq. 4, B_max/t = {b_max})"
            )
        else:
            batch = 1
        share = declared_edge[(p, c)] / declared_rate if declared_rate > 0 else 0.0
        batches[key] = batch
        edge_rate[key] = share * dop[p] * output_rate(batch, latency, ppt, n, t, s)
        steps.append(
            f"r_o({key}) = {share:.3g} * {dop[p]} * b / max(b*l_i, n + b*(ppt + t*s)) = "
            f"{edge_rate[key]:.6g} records/s (Eq. 3, b = {batch})"
        )


def _pure_processing_time(
    spec: StreamTopologySpec,
    name: str,
    declared_rate: float,
    measured: Mapping[str, float] | None,
    ops: OperatorCostModel,
) -> float:
    if measured and name in measured:
        return _check_nonnegative(f"measured[{name!r}]", measured[name])
    op = spec.operator(name)
    if op.cost and op.cost.cpu is not None and declared_rate > 0:
        return op.cost.cpu / declared_rate
    return ops.per_record[op.kind]


def _record_bytes(spec: StreamTopologySpec) -> dict[tuple[str, str], int]:
    """t per edge: the stream override, else the producer's recordBytes, else the default."""
    override = {(st.from_, st.to): st.record_bytes for st in spec.streams if st.record_bytes is not None}
    by_name = spec.by_name()
    return {
        (u, op.name): override.get((u, op.name)) or by_name[u].record_bytes or DEFAULT_RECORD_BYTES
        for op in spec.operators
        for u in op.inputs
    }


def _check_nonnegative(name: str, value: float) -> float:
    """Bad cost figures are named, never propagated into NaN dops."""
    if isinstance(value, bool) or not (
        isinstance(value, int | float) and math.isfinite(value) and value >= 0
    ):
        raise ValueError(f"{name}: must be a finite number >= 0, got {value!r}")
    return float(value)


DEFAULT_BATCH_RECORDS = 512
"""Records per transport entry when neither Aeolus' plan nor ``spec.batching.size`` says more."""


def default_batch_records(spec: StreamTopologySpec, producer: str) -> int:
    """``spec.batching.size`` if set, else 512 records capped at ``batching.maxBytes`` (64 KB) worth."""
    if spec.batching.size:
        return spec.batching.size
    record_bytes = spec.operator(producer).record_bytes or 64
    return max(1, min(DEFAULT_BATCH_RECORDS, spec.batching.max_bytes // record_bytes))


def entry_batch_sizes(
    spec: StreamTopologySpec, measured: Mapping[str, float] | None = None
) -> dict[str, int]:
    """Records per transport entry for every stream ``from->to``, as the routing table carries them (the
    one rule of the local run and the operator): Aeolus' batch (Algorithm 1, Eq. 4, capped by B_max =
    ``batching.maxBytes``), raised to :func:`default_batch_records`. ``measured``: pure processing times
    per operator (seconds per record), as the adaptation loop measures them every period; the declared
    costs stand in for the rest.

    Aeolus' model has only the per-message cost n and often gives 1 at moderate rates; a micro-batch
    executor also pays a fixed cost per step and reads a bounded number of entries per step, so entries
    much smaller than the default only add overhead.
    """
    planned = aeolus_plan(spec, measured).batch_sizes
    return {
        edge_key(u, op.name): max(int(planned.get(edge_key(u, op.name), 1)), default_batch_records(spec, u))
        for op in spec.operators
        for u in op.inputs
    }


BATCH_TOLERANCE = 0.25
"""A re-computed batch size replaces the applied one only when it differs by more than this fraction, so
measurement noise does not publish a new routing version every period."""


def resized_batches(applied: Mapping[str, int], planned: Mapping[str, int]) -> dict[str, int] | None:
    """``planned`` when some stream's batch moved by more than :data:`BATCH_TOLERANCE` of the applied one,
    else None: the applied sizes stay. Streams the applied table does not size are not compared (a table
    without sizes uses the defaults; a new stream comes with a re-plan, not with a period)."""
    for key, old in applied.items():
        if abs(planned.get(key, old) - old) > BATCH_TOLERANCE * old:
            return dict(planned)
    return None
