"""Run shared sub-trees once: the common part of several topologies as a topology of its own.

The operators that two or more topologies compute identically (the structural hash of :mod:`.topologies`)
move into one *shared* topology that publishes every result the rest still needs to a named stream; each
consumer is rewritten to read those streams in place of the operators it no longer runs. Named streams
give each reader its own offsets and the writer's exactly-once commits (docs/streams.md), so each
consumer's output is what it would be alone. The shared part runs at the highest rate its consumers
declare. Sinks are never shared: they are each topology's own output.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from streamtopo.planner.benoit.topologies import structural_hashes
from streamtopo.planner.model import StreamTopology

SHARED_PREFIX = "shared-"
"""Names of the shared topology and of the streams it publishes (``shared-<hash>``)."""


@dataclass(frozen=True)
class Split:
    shared: StreamTopology | None
    """The common part, or None when the topologies have nothing in common."""
    consumers: list[StreamTopology]
    """The topologies, in the order given, each reading the shared streams it needs."""
    streams: dict[str, list[str]]
    """Published stream -> the topologies that read it."""


def stream_name(digest: str) -> str:
    return f"{SHARED_PREFIX}{digest[:12]}"


def split_shared(topologies: Sequence[StreamTopology], *, across_namespaces: bool = False) -> Split:
    """The shared topology and the rewritten consumers (unchanged when nothing is shared)."""
    hashes = [structural_hashes(t, across_namespaces=across_namespaces) for t in topologies]
    shared = shared_hashes(topologies, hashes)
    if not shared:
        return Split(None, list(topologies), {})
    names, operators = shared_operators(topologies, hashes, shared)
    key_groups = max(
        t.spec.key_groups
        for t, digests in zip(topologies, hashes)
        if any(digests[op.name] in shared for op in t.spec.operators)
    )
    streams: dict[str, list[str]] = {}
    consumers = []
    for topology, digests in zip(topologies, hashes):
        needed = _needed(topology, digests, shared)
        for h in sorted(needed):
            streams.setdefault(stream_name(h), []).append(topology.metadata.name)
        consumers.append(
            _consumer(topology, digests, shared, needed)
            if any(digests[op.name] in shared for op in topology.spec.operators)
            else topology
        )
    for h in sorted({h for s in streams for h in shared if stream_name(h) == s}):
        operators.append(
            {
                "name": _unique(f"publish-{names[h]}", operators),
                "kind": "sink",
                "inputs": [names[h]],
                "sink": {"stream": stream_name(h)},
            }
        )
    first = topologies[0]
    digest = hashlib.sha256("".join(sorted(shared)).encode()).hexdigest()
    metadata: dict[str, Any] = {"name": f"{SHARED_PREFIX}{digest[:12]}"}
    if first.metadata.namespace:
        metadata["namespace"] = first.metadata.namespace
    spec = first.spec.model_dump(
        mode="json",
        by_alias=True,
        exclude_none=True,
        include={"image", "transport", "batching", "metrics", "executor", "autoscaling"},
    )
    spec |= {"keyGroups": key_groups, "operators": operators}
    return Split(StreamTopology.model_validate({"metadata": metadata, "spec": spec}), consumers, streams)


def shared_hashes(topologies: Sequence[StreamTopology], hashes: Sequence[dict[str, str]]) -> set[str]:
    """Structural hashes of the operators (sinks never) that two or more of ``topologies`` compute."""
    owners: dict[str, set[int]] = {}
    for i, (topology, digests) in enumerate(zip(topologies, hashes)):
        for op in topology.spec.operators:
            if op.kind != "sink":
                owners.setdefault(digests[op.name], set()).add(i)
    return {h for h, who in owners.items() if len(who) > 1}


def shared_operators(
    topologies: Sequence[StreamTopology], hashes: Sequence[dict[str, str]], shared: set[str]
) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """The ``shared`` operators once each: hash -> name (the first topology's name for it, made unique)
    and their documents, inputs renamed, generators at the highest rate any topology declares
    (node requirements left out: each topology states its own)."""
    names: dict[str, str] = {}
    operators: list[dict[str, Any]] = []
    rates: dict[str, float] = {}
    for topology, digests in zip(topologies, hashes):
        for op in topology.spec.operators:
            h = digests[op.name]
            if h not in shared:
                continue
            if op.source is not None and op.source.generator is not None:
                rates[h] = max(rates.get(h, 0.0), op.source.rate_per_second)
            if h in names:
                continue
            names[h] = op.name if op.name not in names.values() else f"{op.name}-{h[:6]}"
            body = op.model_dump(mode="json", by_alias=True, exclude_none=True, exclude={"requires"})
            body["name"] = names[h]
            body["inputs"] = [names[digests[i]] for i in op.inputs]
            operators.append(body)
    for body in operators:
        h = next(k for k, v in names.items() if v == body["name"])
        if h in rates:
            body["source"]["ratePerSecond"] = rates[h]
    return names, operators


def join_shared(topology: StreamTopology, shared: StreamTopology) -> StreamTopology | None:
    """``topology`` reading what an existing shared part computes for it, or None when it uses nothing
    of it.

    The shared part's operators hash as the consumers' do (names, rates and key groups are left out of
    the hash), and its sinks say what it publishes. An operator of ``topology`` that the shared part runs
    but does not publish, where ``topology``'s own operators need its output, stays in ``topology``
    (computed again), and so, in turn, may its inputs.
    """
    digests = structural_hashes(topology)
    theirs = structural_hashes(shared)
    runs = {theirs[op.name] for op in shared.spec.operators if op.sink is None}
    published = {
        theirs[op.inputs[0]]
        for op in shared.spec.operators
        if op.sink is not None and op.sink.stream == stream_name(theirs[op.inputs[0]])
    }
    mine = {digests[op.name] for op in topology.spec.operators} & runs
    while True:
        needed = _needed(topology, digests, mine)
        if not needed - published:
            break
        mine -= needed - published
    return _consumer(topology, digests, mine, needed) if needed else None


def _needed(topology: StreamTopology, digests: dict[str, str], shared: set[str]) -> set[str]:
    """The shared operators (hashes) whose output an operator of ``topology`` that is not shared reads."""
    return {
        digests[i]
        for op in topology.spec.operators
        if digests[op.name] not in shared
        for i in op.inputs
        if digests[i] in shared
    }


def _unique(name: str, operators: list[dict[str, Any]]) -> str:
    taken = {o["name"] for o in operators}
    return (
        name
        if name not in taken
        else next(f"{name}-{i}" for i in range(2, 10_000) if f"{name}-{i}" not in taken)
    )


def _consumer(
    topology: StreamTopology, digests: dict[str, str], shared: set[str], needed: set[str]
) -> StreamTopology:
    """The topology without its shared operators; those it reads become stream sources of the same name,
    so its own operators, constraints and stream overrides keep referring to the same names."""
    document = topology.model_dump(mode="json", by_alias=True, exclude_none=True)
    spec = document["spec"]
    kept = {op.name for op in topology.spec.operators if digests[op.name] not in shared}
    sources = []
    for op in topology.spec.operators:
        if digests[op.name] in needed:
            # one key group: every key group of a stream source fetches the whole stream (docs/streams.md)
            source: dict[str, Any] = {
                "name": op.name,
                "kind": "source",
                "keyGroups": 1,
                "source": {"stream": stream_name(digests[op.name])},
            }
            if op.record_bytes:
                source["recordBytes"] = op.record_bytes
            sources.append(source)
    present = kept | {s["name"] for s in sources}
    spec["operators"] = sources + [o for o in spec["operators"] if o["name"] in kept]
    constraints = spec.get("constraints", {})
    for field, groups in list(constraints.items()):
        if field == "highAvailability":
            kept_groups = [g | {"operators": [n for n in g["operators"] if n in present]} for g in groups]
            constraints[field] = [g for g in kept_groups if g["operators"]]
        elif groups and isinstance(groups[0], list):
            constraints[field] = [
                g for g in ([n for n in group if n in present] for group in groups) if len(g) > 1
            ]
        else:
            constraints[field] = [n for n in groups if n in present]
    spec["streams"] = [s for s in spec.get("streams", []) if s["from"] in present and s["to"] in present]
    return StreamTopology.model_validate(document)
