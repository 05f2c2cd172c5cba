"""What a spec change does to a running topology's state: per operator keep it, reset it, or refuse.

The anchor is the Flink Kubernetes Operator. There, a spec change on a running job is an *upgrade*: the
operator suspends the job and restores it with the new spec (``upgradeMode``: ``savepoint`` and
``last-state`` carry the state over, ``stateless`` starts empty), compares the new spec with the last one
it reconciled, classifies each field as needing no restart or an upgrade, never falls back from a
stateful mode to a stateless one by itself, and Flink refuses to restore state an operator can no longer
read (a changed max parallelism; a removed operator's state unless non-restored state is allowed).

Here the same ideas, per operator, with the state our units keep (docs/exactly-once.md):

- :func:`restarts`: whether the executors must restart at all. Fields only the control plane reads (costs,
  constraints, fusion, autoscaling, rates of stream sources, ...) re-plan without touching the data plane;
  anything else is an upgrade: every executor stops at a batch boundary and commits, then the new spec's
  executors start from the commits (Flink's suspend + restore, never a mix of old and new executors).
- :func:`state_layout`: the facts a stateful operator's committed state was written under. Sources keep an
  offset (where it points: a generator's key groups and rate, or the stream it reads), aggregates partial
  aggregates (key, key groups, inputs, aggregations, window, the sub-windows shared with aggregates of the
  same input), joins buffered records per key (key, key groups, both sides, interval), file sinks their
  position in the output files (path, key groups). State is kept by operator name.
- :func:`plan_upgrade`: per operator, ``keep`` when its layout is unchanged (a filter's predicate, a map's
  select, a UDF, declared rates of streams and stream sources, seeds, costs, constraints, autoscaling, an
  added operator, a removed stateless one), otherwise ``reset`` under ``spec.upgrade.mode: resetState``
  and ``refuse`` under ``keepState``, each with the field path and the reason; a removed stateful
  operator's state is dropped (``reset``) under ``keepState`` too when ``allowNonRestoredState`` is set. A generator's
  ``ratePerSecond`` is refused in both modes: event time is ``seq / ratePerSecond`` from the topology's
  start, so a new rate would move the event time of every record after the offset (backwards for a
  higher rate) and no reset can make that right. Nor does a change of ``spec.transport.url`` carry
  anything over (the state lives in the transport).

What a reset does to the committed records is carried out by the platform (controller/upgrade.py) while
no executor runs; the in-flight rule is decided here (:attr:`OperatorUpgrade.drop_in_flight`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from streamtopo.planner.graph import pane_group, partition_key, routing_key
from streamtopo.planner.model import Operator, StreamTopologySpec, UpgradeMode, format_duration

Action = Literal["keep", "reset", "refuse"]
Change = Literal["unchanged", "changed", "added", "removed"]

CONTROL_FIELDS = frozenset(
    {
        "suspend",
        "replicas",
        "streams",
        "constraints",
        "fusion",
        "autoscaling",
        "metrics",
        "sharing",
        "upgrade",
    }
)
"""Spec fields only the control plane reads: changing them re-plans (or rescales) without restarting an
executor. ``suspend`` and ``replicas`` have paths of their own (reconcile.py's NOT_PLANNED)."""
OPERATOR_CONTROL_FIELDS = frozenset({"cost", "requires", "selectivity", "record_bytes"})
"""Operator fields the planner alone reads (costs and placement); a stream source's ``ratePerSecond`` is
one too (a generator's is its event time)."""

RuntimeFacts = Mapping[str, Mapping[str, str]]
"""Layout facts only the runtime can compute (operator -> name -> value): the sub-window (``pane``) a
windowed aggregate keeps its state in, which depends on the aggregates it shares panes with and on their
rates (runtime/operators/shared_panes.py), where given in place of the planner's conservative stand-in;
and the state ``format`` of the runtime version, which only the executors' digest compares."""


@dataclass(frozen=True)
class Fact:
    """One thing an operator's committed state depends on."""

    value: Any
    """Compared for equality (hashable, JSON-able)."""
    field: str
    """Where the user changes it, as a document path."""
    what: str
    """Words for messages."""
    prepared: bool = True
    """Entries in flight to the operator were prepared under this fact (routed by its key and key
    groups, or combined into its partials): a reset drops them (see :class:`OperatorUpgrade`)."""
    resettable: bool = True
    """False: no reset makes a change right (a generator's rate), so it is refused in both modes."""


@dataclass(frozen=True)
class OperatorUpgrade:
    """What an upgrade does to one operator's state."""

    name: str
    action: Action
    change: Change
    field: str = ""
    """The first field whose change decided a reset or refusal (document path), else empty."""
    reason: str = ""
    drop_in_flight: bool = False
    """A reset operator whose input entries were prepared for its old layout: the entries its producers
    committed and it had not consumed when the executors stopped are dropped (and counted), and its new
    state starts with what its producers emit after the upgrade. Otherwise it reads on from its own
    committed offsets, so every input record after the upgrade point reaches the new state once."""
    stateful: bool = False


@dataclass(frozen=True)
class Upgrade:
    """The decision for one spec change (``old`` running, ``new`` applied)."""

    mode: UpgradeMode
    restart: bool
    """The data plane changes: every executor stops and the new spec's start from the commits."""
    operators: tuple[OperatorUpgrade, ...] = ()
    problems: tuple[tuple[str, str], ...] = ()
    """(field path, message) of every refusal; empty when the change may be applied."""

    @property
    def refused(self) -> bool:
        return bool(self.problems)

    @property
    def reset(self) -> tuple[OperatorUpgrade, ...]:
        """Operators (of the new spec) that start from empty state."""
        return tuple(o for o in self.operators if o.action == "reset" and o.change != "removed")

    @property
    def removed(self) -> tuple[OperatorUpgrade, ...]:
        return tuple(o for o in self.operators if o.change == "removed")

    def of(self, name: str) -> OperatorUpgrade:
        return next(o for o in self.operators if o.name == name)

    @property
    def writes_state(self) -> bool:
        """Whether carrying it out writes the committed records (a reset, a stateful operator dropped)."""
        return bool(self.reset) or any(o.stateful for o in self.removed)

    def summary(self) -> str:
        """One line for Events and the run's output: what is kept, reset, added and removed."""
        kept = [o for o in self.operators if o.action == "keep" and o.change in ("unchanged", "changed")]
        changed = [o.name for o in kept if o.change == "changed"]
        parts = [
            f"{len(kept)} operators keep their state"
            + (f" (changed: {', '.join(changed)})" if changed else "")
        ]
        if self.reset:
            parts.append("reset " + ", ".join(f"{o.name} ({o.field})" for o in self.reset))
        if added := [o.name for o in self.operators if o.change == "added"]:
            parts.append("added " + ", ".join(added))
        if self.removed:
            parts.append("removed " + ", ".join(o.name for o in self.removed))
        return "; ".join(parts)


# -------------------------------------------------------------------------------------------- facts


def has_state(op: Operator) -> bool:
    """Whether the operator's units commit state an upgrade must carry: a source's offset, an aggregate's
    partials, a join's buffered records, a file sink's position. Maps, filters, UDFs (pandas functions of
    one batch) and stream or console sinks keep none."""
    return op.kind in ("source", "aggregate", "join") or (op.sink is not None and op.sink.file is not None)


def state_layout(spec: StreamTopologySpec, name: str, prefix: str = "spec") -> dict[str, Fact]:
    """The facts operator ``name``'s committed state was written under (empty for a stateless one)."""
    op = spec.operator(name)
    if not has_state(op):
        return {}
    where = _where(spec, name, prefix)
    k = spec.key_groups_of(name)
    k_field = f"{where}.keyGroups" if op.key_groups is not None else f"{prefix}.keyGroups"
    facts = {"kind": Fact(op.kind, f"{where}.kind", "kind")}
    if op.source is not None:
        if op.source.generator is not None:
            facts["origin"] = Fact("generator", f"{where}.source.generator", "origin", prepared=False)
            facts["rate"] = Fact(
                op.source.rate_per_second,
                f"{where}.source.ratePerSecond",
                "rate (its event time is seq / ratePerSecond from the topology's start: a new rate would "
                "move the event time of every record after the offset, backwards for a higher rate)",
                prepared=False,
                resettable=False,
            )
            partition: object
            partition, which = (
                (tuple(op.key_by or ()), op.source.keys),
                "which key group generates which seqs: those whose key, seq % keys, hashes to it",
            )
        else:
            facts["origin"] = Fact(
                f"stream {op.source.stream}",
                f"{where}.source.stream",
                "stream (its offsets are positions in the stream it reads)",
                prepared=False,
            )
            partition, which = tuple(op.key_by or ()), "which records of the stream each key group takes"
        if op.key_by:
            facts["partition"] = Fact(
                partition, f"{where}.keyBy", f"partitioning by key ({which})", prepared=False
            )
        facts["keyGroups"] = Fact(k, k_field, "key groups (its records are split over them)", prepared=False)
        return facts
    if op.sink is not None:
        assert op.sink.file is not None  # has_state: a file sink
        facts["path"] = Fact(
            op.sink.file.path or op.name,
            f"{where}.sink.file.path",
            "file path (its committed position is in the files under it)",
            prepared=False,
        )
        facts["keyGroups"] = Fact(k, k_field, "key groups (one output file each)")
        return facts
    origin = _key_origin(spec, name)
    inherited = f" (inherited from {origin!r})" if origin != name else ""
    facts["key"] = Fact(partition_key(spec, name), f"{_where(spec, origin, prefix)}.keyBy", f"key{inherited}")
    facts["keyGroups"] = Fact(k, k_field, "key groups (state is partitioned by key group)")
    routes = [f"{u} ({_route(spec, u, name)})" for u in op.inputs]
    facts["inputs"] = Fact(
        tuple(routes if op.kind == "join" else sorted(routes)),
        f"{where}.inputs",
        "inputs (the streams its state was built from" + (", in side order)" if op.kind == "join" else ")"),
    )
    window = None
    if op.window is not None:
        window = f"size {format_duration(op.window.size)}, slide {format_duration(op.window.step)}"
    if op.kind == "join":
        facts["window"] = Fact(window, f"{where}.window", "join interval", prepared=False)
        return facts
    facts["aggregations"] = Fact(
        tuple(" ".join(a.split()) for a in op.aggregations or ()),
        f"{where}.aggregations",
        "aggregations (the partials its state keeps: names, kinds, arguments)",
    )
    facts["window"] = Fact(window, f"{where}.window", "window (size, slide)")
    facts["panes"] = Fact(
        _pane_candidates(spec, op),
        f"{where}.window",
        "sub-windows (shared with the windowed aggregates of the same input and key)",
    )
    return facts


def _where(spec: StreamTopologySpec, name: str, prefix: str) -> str:
    return f"{prefix}.operators[{[o.name for o in spec.operators].index(name)}]"


def _key_origin(spec: StreamTopologySpec, name: str) -> str:
    """The operator whose keyBy decides ``name``'s partition key: itself, or the one it inherits from
    (graph.partition_key's rule)."""
    origin = name
    while not spec.operator(origin).key_by and partition_key(spec, origin) is not None:
        origin = spec.operator(origin).inputs[0]
    return origin


def _route(spec: StreamTopologySpec, u: str, v: str) -> str:
    """Which of ``v``'s key groups ``u``'s records reach: a keyed ``v`` hashes its key (its ``key`` and
    ``keyGroups`` facts; a one-to-one edge is the same hash), an unkeyed one takes ``u``'s key group
    modulo its count (graph.unit_edges)."""
    if routing_key(spec, v) is not None:
        return "by key"
    return f"forward from {spec.key_groups_of(u)} key groups"


def _pane_candidates(spec: StreamTopologySpec, op: Operator) -> tuple[str, ...] | None:
    """The windowed aggregates that may share sub-windows with ``op`` (same single input, key and key
    groups), with their windows, when there are two or more: the runtime keeps their state per pane of
    the highest common factor of those windows it finds paying (shared_panes.py). Which pay depends on
    rates only the runtime weighs, so a change of the candidates stands in for a change of the pane:
    conservative where :data:`RuntimeFacts` are not given."""
    if op.window is None or len(op.inputs) != 1:
        return None
    group = pane_group(spec, op)
    candidates = sorted(
        f"{o.name} {format_duration(o.window.size)}/{format_duration(o.window.step)}"
        for o in spec.operators
        if o.kind == "aggregate"
        and o.window is not None
        and len(o.inputs) == 1
        and pane_group(spec, o) == group
    )
    return tuple(candidates) if len(candidates) > 1 else None


def layout_with(
    spec: StreamTopologySpec, name: str, runtime: RuntimeFacts | None, prefix: str = "spec"
) -> dict[str, Fact]:
    """:func:`state_layout` with the runtime's exact pane in place of the conservative stand-in."""
    facts = state_layout(spec, name, prefix)
    if runtime is not None and "panes" in facts:
        pane = runtime.get(name, {}).get("pane")
        facts["panes"] = Fact(pane, facts["panes"].field, f"sub-window (pane {pane})")
    return facts


def fingerprint(spec: StreamTopologySpec, name: str, runtime: RuntimeFacts | None = None) -> str:
    """A digest of what operator ``name``'s state layout is (its facts' values, never where they are
    written), or "" for a stateless operator: executors store it beside each unit's committed state and
    restore only state written under the same digest (runtime/state_store.py), the last line of defence
    behind :func:`plan_upgrade`."""
    facts = layout_with(spec, name, runtime)
    if not facts:
        return ""
    values = {key: fact.value for key, fact in facts.items()}
    values |= {f"runtime.{key}": value for key, value in (runtime or {}).get(name, {}).items()}
    text = json.dumps(values, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------------------- decision


def data_plane(spec: StreamTopologySpec) -> dict[str, Any]:
    """What the executors read of a spec: everything but :data:`CONTROL_FIELDS` and the operators'
    :data:`OPERATOR_CONTROL_FIELDS` (operators by name: their order in the list means nothing)."""
    operators = {}
    for op in spec.operators:
        dumped = op.model_dump(mode="json", exclude=set(OPERATOR_CONTROL_FIELDS))
        if op.source is not None and op.source.stream is not None:
            dumped["source"].pop("rate_per_second")
        operators[op.name] = dumped
    return {**spec.model_dump(mode="json", exclude={*CONTROL_FIELDS, "operators"}), "operators": operators}


def restarts(old: StreamTopologySpec, new: StreamTopologySpec) -> bool:
    """Whether the change reaches the executors (they read the spec once, when they start)."""
    return data_plane(old) != data_plane(new)


def plan_upgrade(
    old: StreamTopologySpec,
    new: StreamTopologySpec,
    runtime: tuple[RuntimeFacts, RuntimeFacts] | None = None,
    prefix: str = "spec",
) -> Upgrade:
    """The decision for replacing the running ``old`` spec by ``new`` under ``new.upgrade.mode``.

    ``runtime``: :data:`RuntimeFacts` of ``old`` and ``new`` where the caller can compute them (the local
    platform runs the runtime's own code); without them the shared sub-windows are judged conservatively.
    """
    mode = new.upgrade.mode
    problems: list[tuple[str, str]] = []
    if old.transport.url != new.transport.url:
        problems.append(
            (
                f"{prefix}.transport.url",
                f"{old.transport.url!r} -> {new.transport.url!r}: state and offsets live in the transport, "
                "so no mode carries them to another one (delete the topology and create it there)",
            )
        )
    decisions = []
    old_ops, new_ops = old.by_name(), new.by_name()
    for op in new.operators:
        if op.name not in old_ops:
            decisions.append(
                OperatorUpgrade(
                    op.name, "keep", "added", reason="new: starts from empty state", stateful=has_state(op)
                )
            )
            continue
        decisions.append(_compare(old, new, op.name, mode, runtime, prefix))
    for i, op in enumerate(old.operators):
        if op.name in new_ops:
            continue
        stateful = has_state(op)
        if stateful and mode == "keepState" and not new.upgrade.allow_non_restored_state:
            reason = (
                f"operator {op.name!r} (operators[{i}] of the running spec) is gone and holds state "
                f"({_held(op)}); state is kept by operator name, so a rename drops it too: set "
                f"{prefix}.upgrade.mode: resetState to drop it"
            )
            decisions.append(
                OperatorUpgrade(op.name, "refuse", "removed", f"{prefix}.operators", reason, stateful=True)
            )
        else:
            action: Action = "reset" if stateful else "keep"
            decisions.append(OperatorUpgrade(op.name, action, "removed", reason="removed", stateful=stateful))
    problems += [(d.field, d.reason) for d in decisions if d.action == "refuse"]
    return Upgrade(mode, restarts(old, new), tuple(decisions), tuple(problems))


def _compare(
    old: StreamTopologySpec,
    new: StreamTopologySpec,
    name: str,
    mode: UpgradeMode,
    runtime: tuple[RuntimeFacts, RuntimeFacts] | None,
    prefix: str,
) -> OperatorUpgrade:
    before, after = old.operator(name), new.operator(name)
    change: Change = "unchanged" if before == after else "changed"
    facts_old = layout_with(old, name, runtime[0] if runtime else None, prefix)
    facts_new = layout_with(new, name, runtime[1] if runtime else None, prefix)
    stateful = bool(facts_old or facts_new)
    if not facts_old or not facts_new:  # stateless on both sides: nothing to carry; on one: a new kind
        if not stateful or before.kind == after.kind:
            return OperatorUpgrade(name, "keep", change, stateful=stateful)
        held = (
            f"its state ({_held(before)}) would be dropped" if facts_old else "it has no state to start from"
        )
        return _incompatible(
            name,
            before,
            mode,
            f"{_where(new, name, prefix)}.kind",
            f"{before.kind} -> {after.kind}: {held}",
            True,
            prefix,
        )
    changed = [
        k for k in dict.fromkeys([*facts_old, *facts_new]) if _value(facts_old, k) != _value(facts_new, k)
    ]
    if not changed:
        return OperatorUpgrade(name, "keep", change, stateful=True)
    shown = {
        k: f"{(facts_new.get(k) or facts_old[k]).what}: {_shown(_value(facts_old, k))} -> "
        f"{_shown(_value(facts_new, k))}"
        for k in changed
    }
    fixed = [k for k in changed if k in facts_old and k in facts_new and not facts_new[k].resettable]
    if fixed:
        message = (
            f"{shown[fixed[0]]}; no upgrade mode carries {name!r} over (delete the topology and create it)"
        )
        return OperatorUpgrade(name, "refuse", change, facts_new[fixed[0]].field, message, stateful=True)
    fact = facts_new.get(changed[0]) or facts_old[changed[0]]
    prepared = any((facts_new.get(k) or facts_old[k]).prepared for k in changed)
    return _incompatible(name, before, mode, fact.field, shown[changed[0]], prepared, prefix)


def _incompatible(
    name: str, before: Operator, mode: UpgradeMode, field: str, reason: str, prepared: bool, prefix: str
) -> OperatorUpgrade:
    """A layout change: refused under keepState, reset under resetState."""
    if mode == "resetState":
        return OperatorUpgrade(
            name, "reset", "changed", field, reason, drop_in_flight=prepared, stateful=True
        )
    message = (
        f"{reason}: the running state of {name!r} ({_held(before)}) cannot be read by the new spec; keep "
        f"the field as it was, or set {prefix}.upgrade.mode: resetState to start {name!r} from empty state "
        "at its recorded offsets"
    )
    return OperatorUpgrade(name, "refuse", "changed", field, message, stateful=True)


def _value(facts: Mapping[str, Fact], key: str) -> Any:
    return facts[key].value if key in facts else None


def _held(op: Operator) -> str:
    return {
        "source": "its offsets",
        "aggregate": "its partial aggregates",
        "join": "its buffered records",
        "sink": "its position in the output files",
    }.get(op.kind, "no state")


def _shown(value: Any) -> str:
    if isinstance(value, tuple) and all(isinstance(v, str) for v in value):
        return "[" + ", ".join(value) + "]"
    if value is None:
        return "none"
    return str(value)
