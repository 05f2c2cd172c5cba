"""Run shared sub-trees once inside one dataflow: the topologies and their common part as one topology.

:mod:`.split` computes a common sub-tree once across processes: a ``shared-<hash>`` topology publishes its
results to named streams that its consumers read. That is what the operator needs when consumers run on
different executors, but each shared part costs a JVM and a Spark session, and every prefix record crosses
a named stream (Arrow out of the JVM, XADD, a reader per consumer, a decode back into Spark). With cheap
prefixes that costs more than computing them again: 1.5x the CPU-seconds of running apart in totals
(docs/sharing.md). Where the consumers run in one set of executors (``streamtopo run``), the shared
operators can feed every consumer's branch in memory instead: Benoit et al.'s reuse (Section 3, an operator
serving several applications is computed once at the highest rate they need) with no result to transfer.

:func:`fuse_shared` builds that topology. The shared operators appear once, under the names
:func:`.split.shared_operators` gives them. Every other operator of a consumer is renamed
``<topology>-<operator>`` (made unique and at most 63 characters) and reads the shared operators directly.
Each operator keeps the key groups it has in its own topology (a shared one the most any of its consumers
gives it), so records partition as they do when the topology runs alone. A file sink writes under
``<topology>/``, where running the consumers apart puts its output. Constraints and per-edge stream
overrides are renamed and united. The executors, transport, batching, metrics and scaling settings are the
first topology's; the fused topology may use as many executors as the consumers together.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from streamtopo.planner.benoit.split import shared_hashes, shared_operators
from streamtopo.planner.benoit.topologies import structural_hashes
from streamtopo.planner.model import (
    MAX_EXECUTORS,
    StreamTopology,
    TopologyError,
    check_topology,
    problems_of,
)

FUSED_PREFIX = "fused-"
"""Name of a fused topology: ``fused-<hash of its members and shared operators>``."""

MAX_OP_NAME = 63


@dataclass(frozen=True)
class Fusion:
    """Several topologies as one, each shared operator once."""

    topology: StreamTopology
    members: dict[str, dict[str, str]]
    """Topology name -> its operator name -> the operator's name in :attr:`topology`."""
    shared: dict[str, list[str]]
    """Operator of :attr:`topology` computed once for several topologies -> their names."""
    originals: tuple[StreamTopology, ...]
    """The topologies fused, as given."""


def fuse_shared(topologies: Sequence[StreamTopology], *, across_namespaces: bool = False) -> Fusion | None:
    """The topologies as one, sharing what two or more compute; None when they compute nothing in common.

    Raises :class:`~streamtopo.planner.model.TopologyError` when the union is not a valid topology: more
    operators than one topology may have, or members' constraints that contradict each other on a shared
    operator (two highAvailability groups replicating it), or members in different namespaces.
    """
    spaces = sorted({t.metadata.namespace or "default" for t in topologies})
    if len(spaces) > 1:  # named streams and their ACLs are per namespace: one topology has one
        raise TopologyError([("metadata.namespace", f"one dataflow runs in one namespace, not {spaces}")])
    hashes = [structural_hashes(t, across_namespaces=across_namespaces) for t in topologies]
    common = shared_hashes(topologies, hashes)
    if not common:
        return None
    names, operators = shared_operators(topologies, hashes, common)
    taken = set(names.values())
    members: dict[str, dict[str, str]] = {}
    serves: dict[str, list[str]] = {names[h]: [] for h in names}
    groups: dict[str, int] = {}
    """Fused operator -> its key groups: its topology's, the most of them for a shared operator."""
    for topology, digests in zip(topologies, hashes):
        member = topology.metadata.name
        renamed = {}
        for op in topology.spec.operators:
            h = digests[op.name]
            if h in common:
                renamed[op.name] = names[h]
                if member not in serves[names[h]]:  # a topology may compute one thing twice
                    serves[names[h]].append(member)
            else:
                renamed[op.name] = _own_name(member, op.name, taken)
                taken.add(renamed[op.name])
            there = renamed[op.name]
            groups[there] = max(groups.get(there, 0), topology.spec.key_groups_of(op.name))
        members[member] = renamed
        for op in topology.spec.operators:
            if digests[op.name] in common:
                continue
            body = op.model_dump(mode="json", by_alias=True, exclude_none=True)
            body["name"] = renamed[op.name]
            body["inputs"] = [renamed[i] for i in op.inputs]
            if op.sink is not None and op.sink.file is not None:
                body["sink"]["file"]["path"] = f"{member}/{op.sink.file.path or op.name}"
            operators.append(body)
    for body in operators:
        body["keyGroups"] = groups[body["name"]]
    first = topologies[0]
    spec = first.spec.model_dump(
        mode="json",
        by_alias=True,
        exclude_none=True,
        include={"image", "transport", "batching", "metrics", "executor", "autoscaling", "fusion"},
    )
    autoscaling = spec.setdefault("autoscaling", {})
    autoscaling["maxExecutors"] = min(
        MAX_EXECUTORS, sum(t.spec.autoscaling.max_executors for t in topologies)
    )
    autoscaling["minExecutors"] = max(t.spec.autoscaling.min_executors for t in topologies)
    spec |= {
        "keyGroups": max(t.spec.key_groups for t in topologies),
        "operators": operators,
        "constraints": _constraints(topologies, members),
        "streams": _streams(topologies, members),
    }
    digest = hashlib.sha256("\n".join([*sorted(members), *sorted(common)]).encode()).hexdigest()
    metadata: dict[str, Any] = {"name": f"{FUSED_PREFIX}{digest[:12]}"}
    if first.metadata.namespace:
        metadata["namespace"] = first.metadata.namespace
    try:
        fused = StreamTopology.model_validate({"metadata": metadata, "spec": spec})
    except ValidationError as error:
        raise TopologyError(problems_of(error)) from None
    problems = check_topology(fused.spec)
    if problems:
        raise TopologyError(problems)
    return Fusion(fused, members, {op: who for op, who in serves.items() if len(who) > 1}, tuple(topologies))


def _own_name(member: str, op: str, taken: set[str]) -> str:
    """``<topology>-<operator>``, an operator name (a letter first, at most 63 characters) no other has."""
    name = f"{member}-{op}" if member[0].isalpha() else f"t{member}-{op}"
    if len(name) <= MAX_OP_NAME and name not in taken:
        return name
    digest = hashlib.sha256(f"{member}/{op}".encode()).hexdigest()[:6]
    return f"{name[: MAX_OP_NAME - 7]}-{digest}"


def _constraints(
    topologies: Sequence[StreamTopology], members: Mapping[str, Mapping[str, str]]
) -> dict[str, Any]:
    """Every member's constraints under the fused names, each one once."""
    out: dict[str, list[Any]] = {}
    for topology in topologies:
        rename = members[topology.metadata.name]
        document = topology.spec.constraints.model_dump(mode="json", by_alias=True, exclude_none=True)
        for field, entries in document.items():
            kept = out.setdefault(field, [])
            for entry in entries:
                if isinstance(entry, str):
                    entry = rename[entry]
                elif isinstance(entry, list):
                    entry = [rename[n] for n in entry]
                else:
                    entry = entry | {"operators": [rename[n] for n in entry["operators"]]}
                if entry not in kept:
                    kept.append(entry)
    return out


def _streams(
    topologies: Sequence[StreamTopology], members: Mapping[str, Mapping[str, str]]
) -> list[dict[str, Any]]:
    """Every member's per-edge stream settings under the fused names; an edge between shared operators
    once (the first member's)."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for topology in topologies:
        rename = members[topology.metadata.name]
        for stream in topology.spec.streams:
            body = stream.model_dump(mode="json", by_alias=True, exclude_none=True)
            body["from"], body["to"] = rename[stream.from_], rename[stream.to]
            out.setdefault((body["from"], body["to"]), body)
    return list(out.values())
