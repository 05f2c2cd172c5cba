"""Sharing on a platform (Benoit et al., issue 12; docs/sharing.md): which shared part an opted-in topology
reads, when a shared part is founded, who keeps it alive, and how far its streams may be trimmed.

A shared part is a StreamTopology of its own, ``shared-<hash>`` with the label :data:`SHARED_LABEL`, made
by :func:`~streamtopo.planner.benoit.split.split_shared` and reconciled like any other. Its
``ownerReferences`` are its consumers: the reference count (the API server's garbage collector deletes it
with its last owner; the operator also removes an owner itself when a consumer is deleted, so it does not
depend on the collector). A consumer deploys the rewrite of its spec that reads the shared streams
(:func:`~streamtopo.planner.benoit.split.join_shared`); its spec is left as the tenant wrote it.

Where the consumers can run in one set of executors, they run *fused* instead (issue 34): one managed
``fused-<hash>`` StreamTopology (label :data:`FUSED_LABEL`) runs every member's operators, the shared ones
once (:func:`~streamtopo.planner.benoit.fuse.fuse_shared`), and the members run no executors of their own.
Records cross executors only where the fused topology's plan puts its operators apart, as any topology's
do: no shared part, no named-stream hop, no second JVM for the prefix. Its owners are its members and the
annotation ``streamtopo.dev/members`` maps each member's operators to the fused ones. A member that joins,
changes or leaves is a spec change of the fused topology, with its operators' names kept
(``previous`` of :func:`fuse_shared`), so planner/upgrade.py judges it as for any topology: a member's
change the running state cannot take is refused on the member, naming the field, and a newcomer it would
not take does not join. A departing member's operators go with their state
(``upgrade.allowNonRestoredState`` on the fused topology). Members fuse when they agree on what their
executors run (:data:`FUSABLE`: image, transport, executor, batching); otherwise, or where fusing is
refused (two highAvailability groups on one shared operator), they found a shared part as before.

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

from pydantic import ValidationError

from streamtopo.contracts import Keys, fused_members, unit_key
from streamtopo.controller.rendering import owner_reference
from streamtopo.planner.benoit.fuse import Fusion, fuse_shared
from streamtopo.planner.benoit.split import join_shared, split_shared
from streamtopo.planner.benoit.topologies import stream_cycles
from streamtopo.planner.model import (
    API_GROUP,
    API_VERSION,
    KIND,
    StreamTopology,
    StreamTopologySpec,
    TopologyError,
)
from streamtopo.planner.upgrade import plan_upgrade

SHARED_LABEL = f"{API_GROUP}/shared"
"""On the shared topologies the operator manages (value ``"true"``)."""
FUSED_LABEL = f"{API_GROUP}/fused"
"""On the fused topologies the operator manages (value ``"true"``)."""
FUSABLE = ("image", "transport", "executor", "batching")
"""Spec fields members of one fused topology must agree on: its executors run one of each."""
FIELD = "spec.sharing"


class WaitForPartners(Exception):
    """A new topology with no partner yet: decide again after ``seconds``."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        super().__init__(f"waiting {seconds:.0f} s for topologies applied with this one")


@dataclass(frozen=True)
class Sharing:
    """What to do for one topology."""

    deploy: StreamTopology | None
    """What its executors run: the topology itself, or its rewrite reading shared streams; None when it
    runs inside the fused topology ``shared``."""
    shared: dict[str, Any] | None = None
    """The shared or fused topology it reads or runs in, as it must be now, else None."""
    write: bool = False
    """Whether ``shared`` differs from the cluster's (to be created, or its owners or spec changed)."""
    operators: dict[str, str] | None = None
    """In a fused topology: each of its operators -> the fused operator that computes it."""

    def status(self) -> dict[str, Any]:
        """The consumer's ``status.sharing``: the shared topology and the streams it reads from it, or the
        fused topology it runs in and its operators' names there."""
        if self.shared is None:
            return {}
        if self.deploy is None:
            return {"fusedTopology": self.shared["metadata"]["name"], "operators": self.operators or {}}
        published = {(o.get("sink") or {}).get("stream") for o in self.shared["spec"]["operators"]}
        reads = sorted(
            op.source.stream
            for op in self.deploy.spec.operators
            if op.source is not None and op.source.stream and op.source.stream in published
        )
        return {"sharedTopology": self.shared["metadata"]["name"], "reads": reads} if reads else {}


def is_shared(doc: Mapping[str, Any]) -> bool:
    return ((doc.get("metadata") or {}).get("labels") or {}).get(SHARED_LABEL) == "true"


def is_fused(doc: Mapping[str, Any]) -> bool:
    return ((doc.get("metadata") or {}).get("labels") or {}).get(FUSED_LABEL) == "true"


def is_managed(doc: Mapping[str, Any]) -> bool:
    """A topology the operator made (a shared part or a fused topology), not a tenant's."""
    return is_shared(doc) or is_fused(doc)


def members(doc: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """A fused topology's members: member -> its operator -> the fused operator."""
    return fused_members(doc.get("metadata"))


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
    wait for the other's watermark; a cycle among other topologies is theirs to answer for), or when it is
    a fused member whose change the fused topology's running state cannot take; and
    :class:`WaitForPartners` while a new topology waits for partners. Nothing is created before these
    checks pass.
    """
    if not topology.spec.sharing.enabled or is_managed(body):
        return Sharing(topology)
    name, uid = body["metadata"]["name"], body["metadata"].get("uid")
    others = {n: doc for n, doc in namespace.items() if n != name and not is_managed(doc)}
    valid = list(_valid(others, admit).values())
    cycles = sorted(set(stream_cycles([topology, *valid])) - set(stream_cycles(valid)))  # through this one
    if cycles:
        raise TopologyError([(FIELD, f"topologies feed each other in a cycle: {c}") for c in cycles])
    parts = {n: doc for n, doc in sorted(namespace.items()) if is_shared(doc)}
    fused = {n: doc for n, doc in sorted(namespace.items()) if is_fused(doc)}
    home = _home(namespace, uid)
    if home is not None:  # a member (after an operator restart, or a spec update)
        return _fuse_again(home, body, topology, namespace, admit, joining=False)
    member = next((doc for doc in parts.values() if owned_by(doc, uid)), None)
    if member is not None:  # a consumer (after an operator restart, or a spec update)
        consumer = join_shared(topology, admit(member))
        if consumer is not None:
            return Sharing(consumer, dict(member))
        kept = [r for r in owners(member) if r.get("uid") != uid]
        return Sharing(topology, with_owners(member, kept), write=True)  # no longer matches: whole
    if deployed:
        return Sharing(topology)  # running whole: never re-wired
    for doc in fused.values():
        try:
            return _fuse_again(doc, body, topology, namespace, admit, joining=True)
        except TopologyError:
            continue  # shares nothing with it, or the running fusion cannot take it
    for doc in parts.values():
        consumer = join_shared(topology, admit(doc))
        if consumer is not None:
            return Sharing(
                consumer,
                with_owners(doc, [*owners(doc), owner_reference(body, controller=False)]),
                write=True,
            )
    taken = {r.get("uid") for d in [*parts.values(), *fused.values()] for r in owners(d)}
    partners = {n: doc for n, doc in others.items() if _new(doc) and doc["metadata"].get("uid") not in taken}
    opted = {n: t for n, t in _valid(partners, admit).items() if t.spec.sharing.enabled}
    founded = _found_fused(body, topology, {n: (partners[n], t) for n, t in opted.items()})
    if founded is not None:
        return founded
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


def _pins_executors(topology: StreamTopology) -> bool:
    """Whether ``topology`` sets what only a topology running its own executors can: suspend, replicas."""
    return topology.spec.suspend or topology.spec.replicas is not None


def _differing(a: StreamTopology, b: StreamTopology) -> list[str]:
    """The :data:`FUSABLE` fields (camelCase) in which two topologies' specs differ."""
    first, second = (t.spec.model_dump(include=set(FUSABLE), by_alias=True) for t in (a, b))
    return [field for field in first if first[field] != second[field]]


def _found_fused(
    body: Mapping[str, Any],
    topology: StreamTopology,
    partners: Mapping[str, tuple[Mapping[str, Any], StreamTopology]],
) -> Sharing | None:
    """A new fused topology of ``topology`` and the new opted-in partners it shares operators with and
    could share executors with; None when there is none (or fusing them is refused: a shared part then)."""
    name = topology.metadata.name
    if _pins_executors(topology):
        return None
    alike = {
        n: pair
        for n, pair in partners.items()
        if not _differing(topology, pair[1]) and not _pins_executors(pair[1])
    }
    alike[name] = (body, topology)
    try:
        fusion = fuse_shared([alike[n][1] for n in sorted(alike)])  # in owner order, as fused again
    except TopologyError:
        return None
    if fusion is None:
        return None
    sharing = {m for who in fusion.shared.values() for m in who}
    if name not in sharing:
        return None
    chosen = {n: pair for n, pair in alike.items() if n in sharing}
    if len(chosen) < len(alike):  # only those that share something with another
        narrowed = fuse_shared([chosen[n][1] for n in sorted(chosen)])
        assert narrowed is not None  # each shares with another of them
        fusion = narrowed
    refs = [owner_reference(d, controller=False) for d, _ in chosen.values()]
    doc = fused_document(fusion, refs, topology.spec.upgrade.mode)
    return Sharing(None, doc, write=True, operators=fusion.members[name])


def _fuse_again(
    doc: Mapping[str, Any],
    body: Mapping[str, Any],
    topology: StreamTopology,
    namespace: Mapping[str, Mapping[str, Any]],
    admit: Callable[[Mapping[str, Any]], StreamTopology],
    *,
    joining: bool,
) -> Sharing:
    """``topology`` as a member of the running fused topology ``doc``: fused again with the other members'
    current specs, its operators keeping their running names. Raises TopologyError (fields of the fused
    topology, named as such) when the running state cannot take the result under ``topology``'s upgrade
    mode, or, ``joining``, when ``topology`` shares nothing with it or runs its executors otherwise."""
    running = admit(doc)
    fused_name = doc["metadata"]["name"]
    name, uid = body["metadata"]["name"], body["metadata"].get("uid")
    if _pins_executors(topology):  # knobs of the fused topology's
        field = "suspend" if topology.spec.suspend else "replicas"
        raise TopologyError(
            [
                (
                    f"spec.{field}",
                    f"this topology runs inside {fused_name} with others: set spec.{field} on {fused_name} "
                    "(it stops or pins every member's executors), or delete this one",
                )
            ]
        )
    differ = _differing(running, topology)
    if differ:  # one fused topology runs one kind of executor
        raise TopologyError(
            [
                (
                    f"spec.{field}",
                    f"differs from what {fused_name}, which runs this topology with others, runs",
                )
                for field in differ
            ]
        )
    refs = with_owners(
        doc, [r for r in owners(doc) if r.get("uid") != uid] + [owner_reference(body, controller=False)]
    )["metadata"]["ownerReferences"]
    specs = []
    for ref in owners({"metadata": {"ownerReferences": refs}}):
        if ref["name"] == name:
            specs.append(topology)
            continue
        other = namespace.get(ref["name"])
        if other is None:
            continue  # deleted: its delete handler takes its operators out
        try:
            specs.append(admit(other))
        except TopologyError as error:
            raise TopologyError(
                [(FIELD, f"{fused_name} also runs {ref['name']}, whose spec is invalid: {error}")]
            ) from None
    previous = Fusion.running(running, members(doc))
    fusion = fuse_shared(specs, previous=previous)
    assert fusion is not None  # with a previous fusion, always one
    if joining and name not in {m for who in fusion.shared.values() for m in who}:
        raise TopologyError([(FIELD, f"shares no operator with {fused_name}")])
    new = fused_document(fusion, refs, topology.spec.upgrade.mode, current=doc)
    check = StreamTopologySpec.model_validate(
        new["spec"] | {"upgrade": {"mode": topology.spec.upgrade.mode, "allowNonRestoredState": False}}
    )
    upgrade = plan_upgrade(running.spec, check)
    if upgrade.refused:
        raise TopologyError([(f"{fused_name}: {field}", message) for field, message in upgrade.problems])
    return Sharing(None, new, write=_differs(new, doc), operators=fusion.members[name])


def member_change_problems(
    body: Mapping[str, Any],
    topology: StreamTopology,
    namespace: Mapping[str, Mapping[str, Any]],
    admit: Callable[[Mapping[str, Any]], StreamTopology],
) -> list[tuple[str, str]]:
    """What refuses a fused member's change (the admission webhook's check, the reconcile's decision):
    empty when ``body`` is no fused member or the fused topology's running state can take it."""
    home = _home(namespace, body["metadata"].get("uid"))
    if home is None or not topology.spec.sharing.enabled:
        return []
    try:
        _fuse_again(home, body, topology, namespace, admit, joining=False)
    except TopologyError as error:
        return list(error.problems)
    return []


def leave_fused(
    doc: Mapping[str, Any],
    uid: str | None,
    namespace: Mapping[str, Mapping[str, Any]],
    admit: Callable[[Mapping[str, Any]], StreamTopology],
) -> dict[str, Any]:
    """The fused topology ``doc`` once the member ``uid`` is deleted: without its owner reference, and
    without its operators (their state dropped) where the remaining members can be fused again; with none
    left, without owners (the caller deletes it)."""
    refs = [r for r in owners(doc) if r.get("uid") != uid]
    if not refs:
        return with_owners(doc, [])
    try:
        specs = [admit(namespace[r["name"]]) for r in refs if r["name"] in namespace]
        fusion = fuse_shared(specs, previous=Fusion.running(admit(doc), members(doc))) if specs else None
    except TopologyError:
        fusion = None
    if fusion is None:  # its operators run on until the next change fuses them away
        return with_owners(doc, refs)
    return fused_document(fusion, refs, "keepState", current=doc)


def fused_document(
    fusion: Fusion,
    refs: Sequence[Mapping[str, Any]],
    mode: str,
    current: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The managed fused topology of ``fusion`` owned by ``refs``: its spec changes under ``mode`` and
    drops a departed member's state (``allowNonRestoredState``); ``current``: the stored object it
    replaces (its resourceVersion makes a concurrent change conflict)."""
    doc = fusion.topology.model_dump(mode="json", by_alias=True, exclude_none=True)
    doc["apiVersion"], doc["kind"] = API_VERSION, KIND
    doc["spec"]["upgrade"] = {"mode": mode, "allowNonRestoredState": True}
    own = {name: member for member, renamed in fusion.members.items() for name in renamed.values()}
    for body in doc["spec"]["operators"]:  # a member's panes are its own: they outlive others' changes
        if body["kind"] == "aggregate" and body.get("window") and body["name"] not in fusion.shared:
            body["paneGroup"] = own[body["name"]]
    if current is not None:  # what is set on the fused topology itself stays
        doc["spec"] |= {k: current["spec"][k] for k in ("suspend", "replicas") if k in current["spec"]}
        if _same_spec(doc["spec"], current["spec"], but="upgrade"):
            doc["spec"]["upgrade"] = current["spec"].get("upgrade")  # no change to make under a mode
    stored = dict((current or {}).get("metadata") or {})
    meta = stored | doc["metadata"]
    meta["labels"] = {**(stored.get("labels") or {}), FUSED_LABEL: "true"}
    meta["annotations"] = {**(stored.get("annotations") or {}), **doc["metadata"]["annotations"]}
    doc["metadata"] = meta
    return with_owners(doc, refs)


def _differs(new: Mapping[str, Any], old: Mapping[str, Any]) -> bool:
    """Whether writing ``new`` over the stored ``old`` changes its spec, owners or members."""
    if not _same_spec(new["spec"], old.get("spec") or {}):
        return True
    return [r["uid"] for r in owners(new)] != [r["uid"] for r in owners(old)] or members(new) != members(old)


def _same_spec(a: Mapping[str, Any], b: Mapping[str, Any], but: str | None = None) -> bool:
    """Whether two spec documents say the same (as models: defaults and number forms aside)."""
    try:
        specs = [StreamTopologySpec.model_validate({k: v for k, v in d.items() if k != but}) for d in (a, b)]
    except ValidationError:
        return False
    return specs[0] == specs[1]


def owned_by(doc: Mapping[str, Any], uid: str | None) -> bool:
    """Whether the topology ``uid`` is one of ``doc``'s StreamTopology owners (a consumer or member)."""
    return any(r.get("uid") == uid for r in owners(doc))


def _home(namespace: Mapping[str, Mapping[str, Any]], uid: str | None) -> Mapping[str, Any] | None:
    """The fused topology the topology ``uid`` is a member of, if any."""
    return next((d for _, d in sorted(namespace.items()) if is_fused(d) and owned_by(d, uid)), None)


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
