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
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from streamtopo.contracts import MEMBERS_ANNOTATION
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

    @classmethod
    def running(cls, topology: StreamTopology, members: Mapping[str, Mapping[str, str]]) -> Fusion:
        """A fusion as it runs (the operator's managed topology and its recorded members), the
        ``previous`` of the next :func:`fuse_shared`."""
        serves: dict[str, list[str]] = {}
        for member, renamed in members.items():
            for name in dict.fromkeys(renamed.values()):
                serves.setdefault(name, []).append(member)
        shared = {name: who for name, who in serves.items() if len(who) > 1}
        return cls(topology, {m: dict(r) for m, r in members.items()}, shared, ())


def fuse_shared(
    topologies: Sequence[StreamTopology],
    *,
    across_namespaces: bool = False,
    previous: Fusion | None = None,
) -> Fusion | None:
    """The topologies as one, sharing what two or more compute; None when they compute nothing in common
    and there is no ``previous`` fusion to carry on.

    ``previous``: the fusion running now, when members join, leave or change (the operator's managed
    ``fused-<hash>`` topology, whose state is kept by operator name). The result keeps its name, and each
    operator keeps its running name where it computes what it computed (:func:`_names`), so a membership
    change is an ordinary spec change of one topology that planner/upgrade.py judges; an operator that
    served several members keeps its key groups. A fusion of one member is then valid: what the others
    shared keeps running for it under the same names.

    Raises :class:`~streamtopo.planner.model.TopologyError` when the union is not a valid topology: more
    operators than one topology may have, or members' constraints that contradict each other on a shared
    operator (two highAvailability groups replicating it), or members in different namespaces.
    """
    spaces = sorted({t.metadata.namespace or "default" for t in topologies})
    if len(spaces) > 1:  # named streams and their ACLs are per namespace: one topology has one
        raise TopologyError([("metadata.namespace", f"one dataflow runs in one namespace, not {spaces}")])
    hashes = [structural_hashes(t, across_namespaces=across_namespaces) for t in topologies]
    common = shared_hashes(topologies, hashes)
    if not common and previous is None:
        return None
    first_names, operators = shared_operators(topologies, hashes, common)
    names = _names(topologies, hashes, common, first_names, previous, across_namespaces)
    rename = {first_names[h]: names[h] for h in first_names}
    for body in operators:
        body["name"], body["inputs"] = rename[body["name"]], [rename[i] for i in body["inputs"]]
    members: dict[str, dict[str, str]] = {}
    serves: dict[str, list[str]] = {names[h]: [] for h in first_names}
    groups: dict[str, int] = {}
    """Fused operator -> its key groups: its topology's, the most of them for a shared operator."""
    if previous is not None:  # an operator that served several members keeps what it was given
        kept = previous.topology.spec
        for name in set(previous.shared) & set(kept.by_name()):
            groups[name] = kept.key_groups_of(name)
    for topology, digests in zip(topologies, hashes):
        member = topology.metadata.name
        renamed = {
            op.name: names[digests[op.name] if digests[op.name] in common else (member, op.name)]
            for op in topology.spec.operators
        }
        for op in topology.spec.operators:
            there = renamed[op.name]
            if digests[op.name] in common and member not in serves[there]:  # one thing computed twice
                serves[there].append(member)
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
        include={"image", "transport", "batching", "metrics", "executor", "autoscaling", "fusion", "upgrade"},
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
    if previous is not None:
        name = previous.topology.metadata.name
    else:
        digest = hashlib.sha256("\n".join([*sorted(members), *sorted(common)]).encode()).hexdigest()
        name = f"{FUSED_PREFIX}{digest[:12]}"
    metadata: dict[str, Any] = {
        "name": name,
        "annotations": {MEMBERS_ANNOTATION: json.dumps(members, sort_keys=True)},
    }
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


def _names(
    topologies: Sequence[StreamTopology],
    hashes: Sequence[dict[str, str]],
    common: set[str],
    first_names: dict[str, str],
    previous: Fusion | None,
    across_namespaces: bool,
) -> dict[Any, str]:
    """The fused name of each computation: a shared hash, or a member's own (topology, operator).

    Without ``previous``, a shared operator is named as :func:`.split.shared_operators` names it and every
    other ``<topology>-<operator>``. With it, a computation takes a name one of its operators ran under,
    first where that name computed exactly this (its state reads the same), then where it is the same
    operator of the same member changed (the upgrade rules judge the change, as for a topology alone);
    a name no longer claimed is free of state only once removed, so a new computation never takes one."""
    units: dict[Any, list[tuple[str, str]]] = {}
    for topology, digests in zip(topologies, hashes):
        member = topology.metadata.name
        for op in topology.spec.operators:
            h = digests[op.name]
            units.setdefault(h if h in common else (member, op.name), []).append((member, op.name))
    digest_of = {u: (u if isinstance(u, str) else hashes[_index(topologies, u[0])][u[1]]) for u in units}
    names: dict[Any, str] = {}
    reserved: set[str] = set()
    if previous is not None:
        ran = structural_hashes(previous.topology, across_namespaces=across_namespaces)
        reserved = set(ran)
        for exact in (True, False):
            for unit, pairs in units.items():
                if unit in names:
                    continue
                for member, op_name in pairs:
                    ran_as = previous.members.get(member, {}).get(op_name)
                    if (
                        ran_as in ran
                        and ran_as not in names.values()
                        and (ran[ran_as] == digest_of[unit]) == exact
                    ):
                        names[unit] = ran_as
                        break
    taken = reserved | set(names.values())
    for unit in units:
        if unit in names:
            continue
        if isinstance(unit, str):
            name = first_names[unit]
            if name in taken:
                name = f"{name[: MAX_OP_NAME - 7]}-{unit[:6]}"
        else:
            member, op_name = unit
            name = _own_name(member, op_name, taken)
        names[unit] = name
        taken.add(name)
    return names


def _index(topologies: Sequence[StreamTopology], member: str) -> int:
    return next(i for i, t in enumerate(topologies) if t.metadata.name == member)


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
