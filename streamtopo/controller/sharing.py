"""Sharing on a platform (Benoit et al., issue 12; docs/sharing.md): which shared part an opted-in topology
reads, when a shared part is founded, who keeps it alive, and how far its streams may be trimmed.

A shared part is a StreamTopology of its own, ``shared-<hash>`` with the label :data:`SHARED_LABEL`, made
by :func:`~streamtopo.planner.benoit.split.split_shared` and reconciled like any other. Its
``ownerReferences`` are its consumers: the reference count (the API server's garbage collector deletes it
with its last owner; the operator also removes an owner itself when a consumer is deleted, so it does not
depend on the collector). A consumer deploys the rewrite of its spec that reads the shared streams
(:func:`~streamtopo.planner.benoit.split.join_shared`); its spec is left as the tenant wrote it.

When sharing starts: a running topology is never re-wired (moving its running prefix onto a shared part
without losing or repeating a record needs a drained hand-over of the prefix, which is not built). A new
opted-in topology joins a shared part that computes some of it, or founds one with other new opted-in
topologies of its namespace; with none yet, it waits ``spec.sharing.gatherSeconds`` from its creation
for topologies applied with it, then starts whole.

:func:`decide` is pure over the namespace's documents; the operator makes the API calls.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from streamtopo.contracts import Keys, unit_key
from streamtopo.controller.rendering import owner_reference
from streamtopo.planner.benoit.split import join_shared, split_shared
from streamtopo.planner.benoit.topologies import stream_cycles
from streamtopo.planner.model import API_GROUP, KIND, StreamTopology, TopologyError

SHARED_LABEL = f"{API_GROUP}/shared"
"""On the shared topologies the operator manages (value ``"true"``)."""
FIELD = "spec.sharing"


class WaitForPartners(Exception):
    """A new topology with no partner yet: decide again after ``seconds``."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        super().__init__(f"waiting {seconds:.0f} s for topologies applied with this one")


@dataclass(frozen=True)
class Sharing:
    """What to do for one topology."""

    deploy: StreamTopology
    """What its executors run: the topology itself, or its rewrite reading shared streams."""
    shared: dict[str, Any] | None = None
    """The shared topology it reads, as it must be now, else None."""
    write: bool = False
    """Whether ``shared`` differs from the cluster's (to be created, or its owners changed)."""

    def status(self) -> dict[str, Any]:
        """The consumer's ``status.sharing``: the shared topology and the streams it reads from it."""
        if self.shared is None:
            return {}
        published = {(o.get("sink") or {}).get("stream") for o in self.shared["spec"]["operators"]}
        reads = sorted(
            op.source.stream
            for op in self.deploy.spec.operators
            if op.source is not None and op.source.stream and op.source.stream in published
        )
        return {"sharedTopology": self.shared["metadata"]["name"], "reads": reads} if reads else {}


def is_shared(doc: Mapping[str, Any]) -> bool:
    return ((doc.get("metadata") or {}).get("labels") or {}).get(SHARED_LABEL) == "true"


def owners(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The consumers of a shared topology (its StreamTopology ownerReferences)."""
    refs = (doc.get("metadata") or {}).get("ownerReferences") or []
    return [r for r in refs if r.get("kind") == KIND]


def with_owners(doc: Mapping[str, Any], refs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``doc`` whose StreamTopology owners are ``refs`` (sorted by name, so the same set is the same
    document)."""
    other = [r for r in (doc["metadata"].get("ownerReferences") or []) if r.get("kind") != KIND]
    unique = {r["uid"]: dict(r) for r in refs}
    return {
        **doc,
        "metadata": {
            **doc["metadata"],
            "ownerReferences": other + sorted(unique.values(), key=lambda r: (r["name"], r["uid"])),
        },
    }


def decide(
    body: Mapping[str, Any],
    topology: StreamTopology,
    namespace: Mapping[str, Mapping[str, Any]],
    *,
    deployed: bool,
    now: datetime,
    admit: Callable[[Mapping[str, Any]], StreamTopology],
) -> Sharing:
    """What ``topology`` (admitted from ``body``) runs, given every StreamTopology of its namespace by
    name, whether it already runs (``deployed``), and how the platform admits a document.

    Raises TopologyError when its named streams and the namespace's form a cycle through it (each would
    wait for the other's watermark; a cycle among other topologies is theirs to answer for), and
    :class:`WaitForPartners` while a new topology waits for partners. Nothing is created before these
    checks pass.
    """
    if not topology.spec.sharing.enabled or is_shared(body):
        return Sharing(topology)
    name, uid = body["metadata"]["name"], body["metadata"].get("uid")
    others = {n: doc for n, doc in namespace.items() if n != name and not is_shared(doc)}
    valid = list(_valid(others, admit).values())
    cycles = sorted(set(stream_cycles([topology, *valid])) - set(stream_cycles(valid)))  # through this one
    if cycles:
        raise TopologyError([(FIELD, f"topologies feed each other in a cycle: {c}") for c in cycles])
    parts = {n: doc for n, doc in sorted(namespace.items()) if is_shared(doc)}
    member = next((doc for doc in parts.values() if any(r.get("uid") == uid for r in owners(doc))), None)
    if member is not None:  # a consumer (after an operator restart, or a spec update)
        consumer = join_shared(topology, admit(member))
        if consumer is not None:
            return Sharing(consumer, dict(member))
        kept = [r for r in owners(member) if r.get("uid") != uid]
        return Sharing(topology, with_owners(member, kept), write=True)  # no longer matches: whole
    if deployed:
        return Sharing(topology)  # running whole: never re-wired
    for doc in parts.values():
        consumer = join_shared(topology, admit(doc))
        if consumer is not None:
            return Sharing(
                consumer,
                with_owners(doc, [*owners(doc), owner_reference(body, controller=False)]),
                write=True,
            )
    partners = {
        n: doc
        for n, doc in others.items()
        if _new(doc)
        and not any(r.get("uid") == doc["metadata"].get("uid") for d in parts.values() for r in owners(d))
    }
    opted = {n: t for n, t in _valid(partners, admit).items() if t.spec.sharing.enabled}
    founders = [topology, *opted.values()]
    split = split_shared(founders)
    if split.shared is not None and split.consumers[0] is not topology:
        docs = [body, *(partners[n] for n in opted)]
        refs = [
            owner_reference(d, controller=False)
            for d, t, c in zip(docs, founders, split.consumers)
            if c is not t
        ]
        doc = split.shared.model_dump(mode="json", by_alias=True, exclude_none=True)
        doc["metadata"]["labels"] = {SHARED_LABEL: "true"}
        return Sharing(split.consumers[0], with_owners(doc, refs), write=True)
    waited = (now - _created(body)).total_seconds()
    if waited < topology.spec.sharing.gather_seconds:
        raise WaitForPartners(topology.spec.sharing.gather_seconds - waited)
    return Sharing(topology)


def _valid(
    docs: Mapping[str, Mapping[str, Any]], admit: Callable[[Mapping[str, Any]], StreamTopology]
) -> dict[str, StreamTopology]:
    """The documents (by name) that pass admission: an invalid one is its own topology's problem."""
    valid = {}
    for name, doc in docs.items():
        try:
            valid[name] = admit(doc)
        except TopologyError:
            continue
    return valid


def _new(doc: Mapping[str, Any]) -> bool:
    """Not deployed yet and not being deleted: a topology that can still found a shared part."""
    meta = doc.get("metadata") or {}
    return not meta.get("deletionTimestamp") and (doc.get("status") or {}).get("observedGeneration") is None


def _created(doc: Mapping[str, Any]) -> datetime:
    """When the API server created ``doc``; without a stamp, long ago (nothing to wait for)."""
    stamp = (doc.get("metadata") or {}).get("creationTimestamp")
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")) if stamp else datetime.min.replace(tzinfo=UTC)


def reader_units(consumer: StreamTopology, stream: str) -> list[str]:
    """The Valkey unit keys of ``consumer``'s units that read the named stream ``stream``."""
    keys = Keys.of(consumer)
    return [
        keys.unit(unit_key((op.name, kg)))
        for op in consumer.spec.operators
        if op.source is not None and op.source.stream == stream
        for kg in range(consumer.spec.key_groups_of(op.name))
    ]
