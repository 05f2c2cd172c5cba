"""The reconcile logic, independent of where it runs (design.md section 3, "Flow").

Pure of I/O except through a :class:`~streamtopo.controller.platform.Platform`
and a :class:`~streamtopo.controller.platform.MetricsSource`:

- :func:`reconcile`: a StreamTopology document -> validated model -> plan (COLA through
  ``plan_topology``, batch sizes from Aeolus) -> :class:`DesiredState` (executors with hosts, routing
  table v1) -> ``Platform.apply``. An invalid spec, a spec change the running state cannot take
  (planner/upgrade.py) or an impossible plan changes nothing on the platform: the last good deployment
  keeps running and the outcome carries a condition and an Event naming the field.
- the SPL loop (:mod:`~streamtopo.controller.adaptation_loop`) uses this module's planning pieces every
  statistics period: :class:`Planner` (ALBIC's Algorithm 1 with the spec's settings,
  :func:`adaptation_config`), :func:`placement_rules`, and :func:`reconcile` for its first deployment.

Status, conditions and events are returned as data (:class:`Outcome`); the Kubernetes operator writes them
to the API, ``streamtopo run`` prints them. Conditions follow the Kubernetes API conventions: a transition
time changes only when the status does.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from streamtopo.contracts import (
    KeyGroupId,
    Keys,
    RoutingTable,
    executor_prefix,
)
from streamtopo.controller.platform import (
    DesiredState,
    Platform,
)
from streamtopo.controller.upgrade import ResetReport, reset_state, stop_for_upgrade
from streamtopo.documents import load_topology, object_document
from streamtopo.planner.allocation import AllocationState, PlacementRules
from streamtopo.planner.capacity import Shortfall, free_cores
from streamtopo.planner.cluster import Cluster, leave_room
from streamtopo.planner.graph import replica_name
from streamtopo.planner.model import StreamTopology, StreamTopologySpec, TopologyError
from streamtopo.planner.plan import Plan
from streamtopo.planner.policy import PlatformPolicy
from streamtopo.planner.scaling.aeolus import entry_batch_sizes
from streamtopo.planner.upgrade import Upgrade, plan_upgrade

if TYPE_CHECKING:
    from streamtopo.planner.adaptation import AdaptationConfig, AdaptationResult
    from streamtopo.planner.placement.cola.profiling import Profile

Collocations = tuple[tuple[KeyGroupId, KeyGroupId], ...]
"""ALBIC's collocated key-group pairs, carried from round to round."""

CONDITION_TYPES = (
    "Planned",
    "Ready",
    "Progressing",
    "Rebalancing",
    "Scaling",
    "Degraded",
    "CapacityExhausted",
)
APPROVE_ANNOTATION = "streamtopo.dev/approve"
"""Recommend mode: the annotation whose value, a decision id, approves that one decision."""


# ------------------------------------------------------------------------------------ outcome as data


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to emit (``type`` is Normal or Warning)."""

    reason: str
    message: str
    type: str = "Normal"


@dataclass(frozen=True)
class ConditionChange:
    type: str
    status: str
    reason: str
    message: str = ""


@dataclass
class Outcome:
    """What one reconcile or one SPL step decided: the state applied (if any), status and events."""

    desired: DesiredState | None = None
    plan: Plan | None = None
    conditions: list[ConditionChange] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)
    """Status fields (camelCase, StreamTopologyStatus) other than conditions."""
    cluster: Cluster | None = None
    """The hosts the decision was made for (a later change of hosts calls for a re-plan)."""
    retry_after: float | None = None
    """Seconds after which to reconcile again: an upgrade waits for the old executors to stop."""


def now_iso(now: datetime | None = None) -> str:
    return (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_conditions(
    current: Sequence[Mapping[str, Any]],
    changes: Sequence[ConditionChange],
    *,
    now: str,
    generation: int | None,
) -> list[dict[str, Any]]:
    """Conditions after ``changes``: lastTransitionTime moves only when a condition's status flips."""
    by_type = {c["type"]: dict(c) for c in current if c.get("type") in CONDITION_TYPES}
    for change in changes:
        old = by_type.get(change.type, {})
        flipped = not old or old.get("status") != change.status
        by_type[change.type] = {
            "type": change.type,
            "status": change.status,
            "reason": change.reason,
            "message": change.message,
            "lastTransitionTime": now if flipped else old.get("lastTransitionTime", now),
            **({"observedGeneration": generation} if generation is not None else {}),
        }
    return [by_type[t] for t in CONDITION_TYPES if t in by_type]


def admit(
    obj: Mapping[str, Any], policy: PlatformPolicy | None, running: StreamTopologySpec | None = None
) -> StreamTopology:
    """The StreamTopology a Kubernetes object declares, validated as the platform's ``policy`` says;
    TopologyError naming each field otherwise. The one gate: the admission webhook refuses with it what
    the reconcile would refuse, and `streamtopo plan`/`run` run the same validator (load_topology).

    ``running``: the deployed spec it would replace (open key groups keep their running count).

    Validated once per generation: the operator reads every topology on each tick, and the spec of a
    stored object changes only with its ``metadata.generation``. The verdict is kept per uid, generation,
    spec digest, policy and the running key groups (the last :data:`ADMITTED_KEPT` of them): the webhook
    reviews specs not stored yet, under the stored object's uid and generation."""
    meta = obj.get("metadata") or {}
    key: tuple[Any, ...] | None = None
    if meta.get("uid") and meta.get("generation"):
        sizes = (
            None
            if running is None
            else tuple((op.name, running.key_groups_of(op.name)) for op in running.operators)
        )
        spec = hashlib.sha256(json.dumps(obj.get("spec"), sort_keys=True, default=str).encode()).digest()
        key = (meta["uid"], meta["generation"], spec, policy, sizes)
    verdict = None
    with _ADMITTED_LOCK:
        if key is not None and key in _ADMITTED:
            verdict = _ADMITTED[key]
            _ADMITTED.move_to_end(key)
    if verdict is None:
        try:
            verdict = load_topology(object_document(obj), policy=policy, running=running)
        except TopologyError as error:
            verdict = error
        if key is not None:
            with _ADMITTED_LOCK:
                _ADMITTED[key] = verdict
                while len(_ADMITTED) > ADMITTED_KEPT:
                    _ADMITTED.popitem(last=False)
    if isinstance(verdict, TopologyError):
        raise TopologyError(verdict.problems)
    return verdict


ADMITTED_KEPT = 1024
_ADMITTED: OrderedDict[tuple[Any, ...], StreamTopology | TopologyError] = OrderedDict()
_ADMITTED_LOCK = threading.Lock()


def problems_message(problems: Sequence[tuple[str, str]]) -> str:
    return "; ".join(f"{path}: {message}" for path, message in problems)


# ----------------------------------------------------------------------------------- initial planning


def plan_deployment(
    topology: StreamTopology,
    cluster: Cluster,
    previous: RoutingTable | None = None,
    seed: int = 0,
    profile: Profile | None = None,
    room: Mapping[str, float] | None = None,
) -> tuple[DesiredState, Plan]:
    """The fusion plan on ``cluster`` as a desired state: the PEs as executors on their hosts, split up
    to Aeolus' executor count (:func:`streamtopo.planner.deployment.deployment`, shared with ``streamtopo
    run``).

    The plan is COLA's (``spec.fusion``) on the declared costs; with ``spec.fusion.profileIterations``,
    NONE first (COLA Section 4's iteration 0), and with ``profile`` COLA on the measured costs, its
    executors named after the running ones they take over (``keep_names``). The version continues
    ``previous`` (executors never act on an older table). ``room`` (host -> free cores) caps the
    executors at what the hosts take (planner/capacity.py); the desired state's ``capacity`` says what
    the declared rates need beyond it. Raises TopologyError (or COLA's NoValidPlan, a ValueError) when
    the spec cannot be planned.
    """
    from streamtopo.planner.deployment import deployment, keep_names
    from streamtopo.planner.placement.fusion import plan_topology

    name, spec = topology.metadata.name, topology.spec
    plan = plan_topology(spec, cluster, seed=seed, profile=profile)
    planned = deployment(plan, spec, name, adaptation_config(topology).scaling_config, room=room)
    if profile is not None and previous is not None:
        planned = keep_names(planned, previous)
    start = RoutingTable(topology=name, version=previous.version if previous else 0, executors={}, units={})
    routing = start.moved(planned.units, planned.executors, entry_batch_sizes(spec))
    return DesiredState(topology=topology, routing=routing, capacity=planned.capacity), plan


AFFINITY_FIELD = "spec.executor.podTemplate.spec.affinity"


def executor_hosts(spec: StreamTopologySpec, cluster: Cluster) -> Cluster:
    """The hosts executors may run on: those the pod template's node affinity admits (the planner places
    only there, so a planned pod is never unschedulable for the template's sake). Raises ValueError
    naming the field when no host matches."""
    template = spec.executor.pod_template
    hosts = [h for h in cluster.hosts if template.allows(h.labels)]
    if not hosts:
        raise ValueError(
            f"{AFFINITY_FIELD}: no node matches the node affinity "
            f"(nodes: {', '.join(h.name for h in cluster.hosts)})"
        )
    return cluster if len(hosts) == len(cluster.hosts) else Cluster(hosts=hosts)


def plan_status(plan: Plan, routing: RoutingTable) -> dict[str, Any]:
    """The plan summary of the status (PEs with operators, host, size; U; C)."""
    return {
        "executors": len(routing.executors),
        "maxUtilization": round(plan.max_utilization, 4),
        "communicationCost": round(plan.communication_cost, 4),
        "pes": [
            {"name": pe.name, "operators": pe.operators, "host": pe.host, "size": round(pe.size, 4)}
            for pe in plan.pes
        ],
        "routingVersion": routing.version,
    }


NOT_PLANNED = {"suspend": False, "replicas": None}
"""Spec fields that change no plan: a pause, and the executor count the SPL loop's scaling follows."""


def same_deployment(previous: DesiredState, topology: StreamTopology, cluster: Cluster) -> bool:
    """Nothing to re-plan: same spec (:data:`NOT_PLANNED` aside), and every executor's host still exists
    with the labels it needs."""
    if previous.topology.spec.model_copy(update=NOT_PLANNED) != topology.spec.model_copy(update=NOT_PLANNED):
        return False
    names = {h.name for h in cluster.hosts}
    return all(e.host is None or e.host in names for e in previous.executors.values())


class Planner:
    """Where the planning computations run; this one runs them in the calling process.

    The seam keeps the reconcile logic the same wherever planning happens: ``streamtopo run`` plans in
    process, the Kubernetes operator hands the same calls to a worker process
    (:class:`streamtopo.controller.planner_worker.WorkerPlanner`) so the solvers' memory never lands in
    the long-lived kopf process. Both methods only compute; applying stays with the caller.
    """

    def plan(
        self,
        topology: StreamTopology,
        cluster: Cluster,
        previous: RoutingTable | None,
        seed: int,
        profile: Profile | None = None,
        room: Mapping[str, float] | None = None,
    ) -> tuple[DesiredState, Plan]:
        """:func:`plan_deployment` (COLA + Aeolus); raises TopologyError or ValueError like it."""
        return plan_deployment(topology, cluster, previous, seed, profile, room)

    def adapt(
        self,
        topology: StreamTopology,
        state: AllocationState,
        scaling_state: Any,
        *,
        now: float,
        window: float,
        seed: int,
        collocations: Collocations = (),
    ) -> AdaptationResult:
        """One round of ALBIC's Algorithm 1 with the spec's settings (:func:`adaptation_config`);
        ``collocations`` are the pairs the previous round kept."""
        from streamtopo.planner.adaptation import adapt

        return adapt(
            state,
            scaling_state,
            time=now,
            window=window,
            config=adaptation_config(topology, collocations),
            seed=seed,
        )


IN_PROCESS = Planner()


def reconcile(
    document: Mapping[str, Any] | StreamTopology,
    platform: Platform,
    *,
    previous: DesiredState | None = None,
    force_replan: bool = False,
    seed: int = 0,
    planner: Planner = IN_PROCESS,
    policy: PlatformPolicy | None = None,
    share: Callable[[StreamTopology], StreamTopology] | None = None,
) -> Outcome:
    """Validate, plan and apply one StreamTopology; never raises for bad input.

    With ``previous`` (the last good deployment, e.g. read back from the routing ConfigMap) and an
    unchanged spec and cluster, the previous state is re-applied as is: a restarted operator converges to
    the same objects and keeps the routing ALBIC reached instead of re-planning from scratch. A changed
    spec is an upgrade (planner/upgrade.py decides, :func:`hold_upgrade` carries out its first half): one
    the running state cannot take is refused (UpgradeRefused, naming the field); one that reaches the data
    plane first stops every executor (``retry_after`` while they stop), resets what it resets, then plans.
    ``policy``: what the platform lets tenants choose (UDF modules, images); None: no platform (a test or a
    local tool), the user's own code. ``share``: what the admitted topology's executors run instead (its
    rewrite reading a shared part's streams, :mod:`.sharing`); it refuses with TopologyError.
    """
    running = previous.topology.spec if previous is not None else None
    try:
        topology = document if isinstance(document, StreamTopology) else admit(document, policy, running)
        if share is not None:
            topology = share(topology)
    except TopologyError as error:
        return invalid_outcome("InvalidSpec", error.problems)
    upgraded: tuple[Upgrade, ResetReport | None] | None = None
    if previous is not None:
        upgrade = plan_upgrade(previous.topology.spec, topology.spec)
        held = hold_upgrade(platform, previous, topology, upgrade)
        if isinstance(held, Outcome):
            return held
        upgraded = (upgrade, held) if upgrade.restart else None
    cluster = platform.hosts()
    if previous is not None and not force_replan and same_deployment(previous, topology, cluster):
        kept = replace(previous, topology=topology)  # the spec as it is now
        platform.apply(kept)
        planned = ConditionChange("Planned", "True", "UpToDate", "the applied plan matches the spec")
        return Outcome(
            desired=kept,
            cluster=cluster,
            conditions=[planned],
            status={"executors": len(kept.running), "routingVersion": kept.routing.version},
        )
    try:
        allowed = executor_hosts(topology.spec, cluster)
    except ValueError as error:
        return invalid_outcome(
            "NoValidPlan", [(AFFINITY_FIELD, str(error).removeprefix(f"{AFFINITY_FIELD}: "))]
        )
    committed = platform.committed()
    hosts, room = leave_room(allowed, committed), free_cores(allowed, committed=committed)
    try:
        desired, plan = planner.plan(
            topology, hosts, previous.routing if previous else None, seed, None, room
        )
        if previous is not None:  # a re-plan keeps the SPL loop's windows and history
            desired = replace(desired, memory=previous.memory)
    except TopologyError as error:
        return invalid_outcome("InvalidSpec", error.problems)
    except ValueError as error:  # COLA's NoValidPlan names the constraints that cannot be met
        return invalid_outcome("NoValidPlan", [("spec.constraints", str(error))])
    platform.apply(desired)
    summary = (
        f"{len(plan.pes)} PEs on {len({pe.host for pe in plan.pes})} hosts with {plan.algorithm} "
        f"({plan.graph_kind} graph): U={plan.max_utilization:.3f}, C={plan.communication_cost:.4f}, "
        f"routing v{desired.routing.version}"
    )
    conditions = [ConditionChange("Planned", "True", "Planned", summary)]
    events = [Event("Planned", summary)]
    problems = []
    if not plan.feasible:
        problems.append(f"hosts are overloaded (U={plan.max_utilization:.2f} > 1)")
    if plan.violations:
        problems.append("constraint violations: " + "; ".join(plan.violations))
    if problems:
        conditions.append(ConditionChange("Degraded", "True", "PlanInfeasible", "; ".join(problems)))
        events.append(Event("PlanInfeasible", "; ".join(problems), "Warning"))
    else:
        conditions.append(ConditionChange("Degraded", "False", "AsPlanned", ""))
    capacity_changes, capacity_events, capacity_status = capacity_report(desired.capacity)
    status = {**plan_status(plan, desired.routing), **capacity_status}
    if upgraded is not None:
        upgrade, report = upgraded
        message = upgrade_message(upgrade, report)
        events.insert(0, Event("Upgraded", message))
        status["lastUpgrade"] = upgrade_status(upgrade, report)
    return Outcome(
        desired=desired,
        plan=plan,
        conditions=conditions + capacity_changes,
        events=events + capacity_events,
        cluster=cluster,
        status=status,
    )


def capacity_report(
    capacity: Shortfall | None, reported: bool = False
) -> tuple[list[ConditionChange], list[Event], dict[str, Any]]:
    """The CapacityExhausted condition (True with the shortfall's figures, else False), a Warning Event
    when it is exhausted and ``reported`` is False (the caller saw it already), and ``status.capacity``."""
    if capacity is None or not capacity.exhausted:
        fine = ConditionChange(
            "CapacityExhausted", "False", "WithinCapacity", "the hosts have room for the load"
        )
        return [fine], [], ({"capacity": capacity.status()} if capacity is not None else {})
    message = capacity.message()
    changes = [ConditionChange("CapacityExhausted", "True", "CapacityExhausted", message)]
    events = [] if reported else [Event("CapacityExhausted", message, "Warning")]
    return changes, events, {"capacity": capacity.status()}


def hold_upgrade(
    platform: Platform, previous: DesiredState, topology: StreamTopology, upgrade: Upgrade
) -> Outcome | ResetReport | None:
    """The upgrade's first half (controller/upgrade.py): an Outcome when it stops here (refused, or the
    old executors are still stopping), else what the state reset did (None: nothing to reset, or no
    data-plane change at all) once no old executor runs.

    A refusal changes nothing, except that a deployment this reconcile had stopped for an earlier
    upgrade (and the spec now asks to run) runs again: the last good deployment keeps running.
    """
    if upgrade.refused:
        outcome = invalid_outcome("UpgradeRefused", upgrade.problems)
        if previous.topology.spec.suspend and not topology.spec.suspend:
            resumed = previous.topology.spec.model_copy(update={"suspend": False})
            again = previous.topology.model_copy(update={"spec": resumed})
            platform.apply(replace(previous, topology=again))
        return outcome
    if not upgrade.restart:
        return None
    client = platform.state_client(topology)
    if upgrade.writes_state and client is None:
        return invalid_outcome(
            "UpgradeRefused",
            [
                (
                    "spec.upgrade.mode",
                    f"resetState ({upgrade.summary()}) rewrites committed state, and this platform cannot "
                    "reach the topology's transport (on Kubernetes: only topologies on the platform's "
                    "Valkey, when the operator has its admin password)",
                )
            ],
        )
    stopping = bool(platform.running_executors()) and not previous.topology.spec.suspend
    if still := stop_for_upgrade(platform, previous):
        message = f"stopping {still} executors for an upgrade ({upgrade.mode}): {upgrade.summary()}"
        return Outcome(
            conditions=[ConditionChange("Progressing", "True", "Upgrading", message)],
            events=[Event("Upgrading", message)] if stopping else [],
            retry_after=UPGRADE_POLL_SECONDS,
        )
    if client is None:
        return None
    import redis

    try:
        return reset_state(client, Keys.of(topology), previous.topology.spec, topology.spec, upgrade)
    except redis.RedisError as error:  # nothing was written (one transaction): try again later
        message = f"the upgrade's state reset cannot reach the transport ({error}); executors stay stopped"
        return Outcome(
            conditions=[ConditionChange("Degraded", "True", "TransportUnavailable", message)],
            retry_after=30.0,
        )


UPGRADE_POLL_SECONDS = 2.0
"""How soon an upgrade looks again whether the old executors have stopped."""


def upgrade_message(upgrade: Upgrade, report: ResetReport | None) -> str:
    """What an applied upgrade did, for its Event and condition."""
    done = f"upgrade ({upgrade.mode}): {upgrade.summary()}"
    return f"{done}; {report.message()}" if report is not None and report.message() else done


def upgrade_status(upgrade: Upgrade, report: ResetReport | None) -> dict[str, Any]:
    """``status.lastUpgrade`` (UpgradeSummary)."""
    report = report or ResetReport()
    return {
        "time": now_iso(),
        "mode": upgrade.mode,
        "reset": [o.name for o in upgrade.reset],
        "removed": [o.name for o in upgrade.removed],
        "droppedRecords": report.dropped_records,
        "skippedRecords": report.skipped_records,
        "skippedEntries": report.skipped_entries,
        "message": upgrade_message(upgrade, report),
    }


def invalid_outcome(reason: str, problems: Sequence[tuple[str, str]]) -> Outcome:
    """Bad input: a Planned=False condition and a Warning Event naming the fields; nothing applied."""
    message = problems_message(problems) + " (the last good deployment keeps running)"
    return Outcome(
        conditions=[
            ConditionChange("Planned", "False", reason, message),
            ConditionChange("Degraded", "True", reason, message),
        ],
        events=[Event(reason, message, "Warning")],
    )


# ---------------------------------------------------------------------------- the SPL adaptation loop


def placement_rules(spec: StreamTopologySpec, cluster: Cluster) -> PlacementRules:
    """The spec's constraints on key groups, for the runtime rebalancers (ALBIC keeps them valid)."""
    c = spec.constraints
    replicas = {name: ha.replicas for ha in c.high_availability for name in ha.operators}

    def pairs(groups: list[list[str]]) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for names in groups:
            for i, a in enumerate(names):
                for b in names[i + 1 :]:
                    count = min(replicas.get(a, 1), replicas.get(b, 1))
                    out.extend((replica_name(a, r), replica_name(b, r)) for r in range(count))
        return out

    def exclusive(groups: list[list[str]]) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for names in groups:
            for i, a in enumerate(names):
                for b in names[i + 1 :]:
                    out.extend(
                        (replica_name(a, ra), replica_name(b, rb))
                        for ra in range(replicas.get(a, 1))
                        for rb in range(replicas.get(b, 1))
                    )
        return out

    allowed = {}
    for op in spec.operators:
        if op.requires and op.requires.node_selector:
            hosts = frozenset(h.name for h in cluster.hosts if h.matches(op.requires.node_selector))
            for r in range(replicas.get(op.name, 1)):
                allowed[replica_name(op.name, r)] = hosts
    ha_groups = [
        [[replica_name(name, r) for name in ha.operators] for r in range(ha.replicas)]
        for ha in c.high_availability
    ]
    return PlacementRules(
        pe_colocation=pairs(c.pe_colocation),
        pe_exlocation=exclusive(c.pe_exlocation),
        host_colocation=pairs(c.host_colocation),
        host_exlocation=exclusive(c.host_exlocation),
        allowed_hosts=allowed,
        ha_groups=ha_groups,
    )


def adaptation_config(topology: StreamTopology, collocations: Collocations = ()) -> AdaptationConfig:
    """Algorithm 1's settings from ``spec.autoscaling`` (policy, bounds, scaling rule, ALBIC's
    Algorithm 2 parameters): the only input besides the observations, for the operator and for
    ``streamtopo run`` alike (a short local run shortens the spec's windows, local/loop.py).

    ``collocations`` are the pairs the previous round kept (``AdaptationResult.policy_config.collocations``):
    they survive the round while ALBIC's parameters follow the spec as it is now. Other policies run with
    their defaults.
    """
    from streamtopo.planner.adaptation import AdaptationConfig
    from streamtopo.planner.rebalance.albic.collocation import AlbicConfig
    from streamtopo.planner.scaling.policy import ScalingConfig

    auto = topology.spec.autoscaling
    pinned = topology.spec.replicas
    bounds: dict[str, Any] = {"min_executors": pinned, "max_executors": pinned} if pinned is not None else {}
    if topology.spec.executor.resources.cpu is not None:  # executors the loop adds request this much
        bounds["executor_capacity"] = topology.spec.executor.resources.cpu
    scaling = ScalingConfig.from_spec(auto, **bounds)
    policy_config = AlbicConfig.from_spec(auto.albic, collocations) if auto.policy == "albic" else None
    return AdaptationConfig(
        policy=auto.policy,
        scaling_config=scaling,
        max_migrations=auto.max_migrations_per_round,
        max_migration_cost=auto.max_migration_cost,
        policy_config=policy_config,
        executor_prefix=executor_prefix(topology.metadata.name),
    )
