"""The SPL loop: every statistics period, metrics -> AllocationState -> ALBIC's Algorithm 1 -> apply.

:class:`AdaptationLoop` runs one round of ALBIC's Algorithm 1 (Madsen et al., ICDE 2017: terminate drained
nodes, lines 1-3; plan; scale; re-plan, lines 4-7; apply, line 8) with the spec's rebalancing policy, on a
:class:`~streamtopo.controller.platform.Platform` and a
:class:`~streamtopo.controller.platform.MetricsSource`. Missing or stale metrics skip the round (no
rebalancing, no scaling) and say why. Its memory (windows, collocations, history) is a value,
:class:`LoopMemory`, stored with the routing table, so a restarted operator resumes it. The local run, the
operator and the simulator drive the same class (tests/controller/test_one_decision_path.py).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from streamtopo.contracts import (
    ExecutorEntry,
    KeyGroupId,
    RoutingTable,
    executor_index,
)
from streamtopo.controller.platform import (
    DesiredState,
    MetricsSource,
    MetricsUnavailable,
    Platform,
    RuntimeStats,
    UnitRates,
)
from streamtopo.planner.allocation import AllocationState, ExecutorInfo, KeyGroupStats
from streamtopo.planner.capacity import free_cores
from streamtopo.planner.cluster import Cluster
from streamtopo.planner.model import StreamTopology, StreamTopologySpec
from streamtopo.planner.scaling.aeolus import entry_batch_sizes, resized_batches

if TYPE_CHECKING:
    from streamtopo.planner.adaptation import AdaptationResult
    from streamtopo.planner.placement.cola.profiling import Profile
    from streamtopo.planner.scaling.policy import ScalingState
from streamtopo.controller.reconcile import (
    APPROVE_ANNOTATION,
    IN_PROCESS,
    Collocations,
    ConditionChange,
    Event,
    Outcome,
    Planner,
    capacity_report,
    executor_hosts,
    now_iso,
    placement_rules,
    plan_status,
    reconcile,
)


def allocation_state(
    stats: RuntimeStats,
    routing: RoutingTable,
    spec: StreamTopologySpec,
    cluster: Cluster,
    *,
    failing: Collection[str] = (),
    lost: Collection[str] = (),
    room: Mapping[str, float] | None = None,
    footprint: float | None = None,
) -> AllocationState:
    """ALBIC's view of one period: gLoad_k = 100 * busy rate, mc_k = state bytes, out(g_i, g_j) = rate,
    each executor's CPU used and waited for (saturation evidence), and the hosts' ``room`` for new ones.

    Raises MetricsUnavailable when a unit of the routing table has no measurement (full metric window),
    except on a ``failing`` executor, which cannot report: such a unit counts with its operator's mean
    measured load and no state. ``lost`` executors (failing past the grace period) are marked for removal
    (ALBIC's B), so their key groups move to the others.
    """
    assignment = routing.assignment()
    stats = _estimate_failing(stats, [u for u, e in assignment.items() if e in failing])
    missing = [u for u in assignment if u not in stats.units]
    if missing:
        shown = ", ".join(f"{op}/{kg}" for op, kg in sorted(missing)[:5])
        raise MetricsUnavailable(
            "MetricsIncomplete",
            f"no measurement for {len(missing)} of {len(assignment)} "
            f"units over the last {stats.window_seconds:g}s (e.g. {shown})",
        )
    labels = {h.name: dict(h.labels) for h in cluster.hosts}
    measured = stats.executors
    executors = [
        ExecutorInfo(
            name=name,
            capacity=entry.cpu,
            host=entry.host,
            labels=labels.get(entry.host or "", {}),
            marked_for_removal=entry.draining or name in lost,
            cpu_used=measured[name].cpu if name in measured else None,
            cpu_wait=measured[name].cpu_wait if name in measured else 0.0,
        )
        for name, entry in sorted(routing.executors.items())
    ]
    key_groups = [
        KeyGroupStats(
            id=u,
            load=stats.units[u].load,
            memory=stats.units[u].state_bytes,
            migration_cost=stats.units[u].state_bytes,
            rate=stats.units[u].records_in,
            backlog=stats.units[u].backlog,
            output_rate=stats.units[u].records_out,
        )
        for u in sorted(assignment)
    ]
    traffic = {
        pair: rate for pair, rate in stats.traffic.items() if pair[0] in assignment and pair[1] in assignment
    }
    return AllocationState(
        executors=executors,
        key_groups=key_groups,
        assignment=assignment,
        traffic=traffic,
        rules=placement_rules(spec, cluster),
        room=room,
        footprint=footprint,
    )


def _estimate_failing(stats: RuntimeStats, units: Sequence[KeyGroupId]) -> RuntimeStats:
    """``stats`` with the unmeasured ``units`` (hosted by failing executors) at their operator's mean busy
    and input rates over its measured units, or every measured unit's when none of the operator's is."""
    unmeasured = [u for u in units if u not in stats.units]
    if not unmeasured or not stats.units:
        return stats

    def mean(rates: Sequence[UnitRates]) -> UnitRates:
        return UnitRates(
            busy=sum(r.busy for r in rates) / len(rates),
            records_in=sum(r.records_in for r in rates) / len(rates),
        )

    by_operator: dict[str, list[UnitRates]] = {}
    for (op, _), rates in stats.units.items():
        by_operator.setdefault(op, []).append(rates)
    overall = mean(list(stats.units.values()))
    estimated = dict(stats.units)
    for unit in unmeasured:
        estimated[unit] = mean(by_operator[unit[0]]) if unit[0] in by_operator else overall
    return dataclasses.replace(stats, units=estimated)


def executor_loads(
    state: AllocationState, assignment: Mapping[KeyGroupId, str], capacity: Mapping[str, float]
) -> dict[str, float]:
    """Percent of each executor's own capacity (gLoad / capacity, ALBIC's heterogeneous nodes)."""
    load = dict.fromkeys(capacity, 0.0)
    by_id = {kg.id: kg.load for kg in state.key_groups}
    for unit, executor in assignment.items():
        if executor in load:
            load[executor] += by_id.get(unit, 0.0) / (capacity[executor] or 1.0)
    return load


def next_executors(
    result: AdaptationResult, current: Mapping[str, ExecutorEntry], cluster: Cluster
) -> dict[str, ExecutorEntry]:
    """The routing table's executors after a round: terminated gone, set B draining, new ones placed.

    A new executor (it joins empty, Algorithm 1 line 6) goes to the host the round placed it on (the one
    with the most room, planner/capacity.py); without a known room, to the host with the most CPU not
    yet requested by this topology's executors.
    """
    free = {h.name: h.cpu for h in cluster.hosts}
    for entry in current.values():
        if entry.host in free:
            free[entry.host] -= entry.cpu
    out: dict[str, ExecutorEntry] = {}
    for info in result.executors:
        if info.name in current:
            out[info.name] = current[info.name].model_copy(update={"draining": info.marked_for_removal})
            continue
        host = info.host or max(cluster.hosts, key=lambda h: (free[h.name], h.name)).name
        free[host] = free.get(host, 0.0) - info.capacity
        out[info.name] = ExecutorEntry(host=host, cpu=info.capacity, draining=info.marked_for_removal)
    return out


@dataclass
class StepResult:
    """One SPL round: what changed, with the status fields and events to report."""

    applied: bool = False
    routing: RoutingTable | None = None
    outcome: Outcome = field(default_factory=Outcome)
    skipped: str | None = None
    """Why nothing was decided (a condition reason), if so."""
    adaptation: AdaptationResult | None = None
    executors_before: int = 0
    executors_after: int = 0
    profile: str | None = None
    """What a COLA profiling iteration did (its ProfileIteration event), if the period was one."""


DECISIONS_KEPT = 20


@dataclass(frozen=True)
class LoopMemory:
    """The SPL loop's state between rounds: the scaling rule's windows, ALBIC's collocations and the last
    decisions. Kept with the routing table (``DesiredState.memory``) so an operator restart resumes it."""

    scaling: ScalingState = field(default_factory=lambda: _scaling_state())
    collocations: Collocations = ()
    decisions: tuple[dict[str, Any], ...] = ()
    failing_since: Mapping[str, float] = field(default_factory=dict)
    """Executor -> when the loop first saw it failing (the failure grace period runs from there)."""
    profiled: int = 0
    """COLA profiling iterations done (``spec.fusion.profileIterations``)."""
    crossing_cost: float | None = None
    """CPU-seconds per record crossing executors, measured in the first profiling iteration."""

    def to_json(self) -> str:
        import json

        return json.dumps(
            {
                "scaling": dataclasses.asdict(self.scaling),
                "collocations": self.collocations,
                "decisions": self.decisions,
                "failing": dict(self.failing_since),
                "profiled": self.profiled,
                "crossing_cost": self.crossing_cost,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str | None) -> LoopMemory:
        """Tolerant: a missing or unreadable memory (older operator, hand edit) starts fresh."""
        import json

        if not text:
            return cls()
        try:
            data = json.loads(text)
            scaling = data.get("scaling") or {}
            scaling["history"] = tuple(tuple(h) for h in scaling.get("history") or ())
            scaling["loads"] = tuple((str(e), float(v)) for e, v in scaling.get("loads") or ())
            if scaling.get("scale_up_from") is not None:
                scaling["scale_up_from"] = tuple(scaling["scale_up_from"])
            pairs = tuple((_unit(a), _unit(b)) for a, b in data.get("collocations") or ())
            failing = {str(e): float(t) for e, t in (data.get("failing") or {}).items()}
            decisions = tuple(data.get("decisions") or ())
            profiled, cost = int(data.get("profiled") or 0), data.get("crossing_cost")
            crossing = None if cost is None else float(cost)
            return cls(_scaling_state(**scaling), pairs, decisions, failing, profiled, crossing)
        except (ValueError, TypeError, AttributeError):
            return cls()


def _scaling_state(**fields: Any) -> ScalingState:
    from streamtopo.planner.scaling.policy import ScalingState

    return ScalingState(**fields)


def _unit(value: Any) -> KeyGroupId:
    op, kg = value
    return (str(op), int(kg))


def processing_times(stats: RuntimeStats) -> dict[str, float]:
    """Aeolus' pure processing time per operator (seconds per record): its units' busy seconds over the
    records they took in; operators without input this period are left out (their declared cost stands)."""
    busy: dict[str, float] = defaultdict(float)
    records: dict[str, float] = defaultdict(float)
    for (op, _), rates in stats.units.items():
        if rates.records_in > 0:
            busy[op] += rates.busy
            records[op] += rates.records_in
    return {op: busy[op] / records[op] for op in records}


def measured_profile(
    stats: RuntimeStats, placement: Mapping[KeyGroupId, str], gamma: float, known: float | None = None
) -> Profile:
    """COLA's profile of one period (Section 4): busy cores per unit, records per unit pair, and what a
    record crossing executors costs, so the cut is priced at this runtime's cost rather than the transport
    model's: ``known`` once measured, else the executors' CPU outside operators per crossing record under
    ``placement``. It is measured once, in the NONE deployment where every arc crosses: in a fused one
    few records cross and the executors' fixed cost per step would be charged to them."""
    from streamtopo.planner.placement.cola.profiling import Profile, crossing_cost

    busy = {u: r.busy for u, r in stats.units.items()}
    if known is None:
        known = crossing_cost(sum(e.cpu for e in stats.executors.values()), busy, stats.traffic, placement)
    return Profile(busy, dict(stats.traffic), gamma, known)


def batches_event(before: Mapping[str, int], after: Mapping[str, int]) -> Event:
    """What changed in the entry sizes, stream by stream."""
    changed = ", ".join(
        f"{k} {before.get(k, '-')} -> {v}" for k, v in sorted(after.items()) if before.get(k) != v
    )
    return Event(
        "BatchSizesChanged",
        f"records per transport entry from measured processing times (Aeolus Eq. 4): {changed}",
    )


def decision_record(before: RoutingTable, after: RoutingTable, result: AdaptationResult) -> dict[str, Any]:
    """One applied ALBIC decision as the history keeps it (:func:`history_entry`)."""
    kinds = [
        kind
        for kind, happened in (
            ("rebalance", bool(result.migrations)),
            ("scale-up", bool(result.added or result.unmarked)),
            ("scale-down", bool(result.marked)),
            ("terminate", bool(result.terminated)),
        )
        if happened
    ]
    rebalance = result.rebalance
    return history_entry(
        before,
        after,
        "+".join(kinds) or "reassign",
        len(result.migrations),
        result.reason,
        round(rebalance.load_distance, 4) if rebalance else None,
    )


def history_entry(
    before: RoutingTable,
    after: RoutingTable,
    kind: str,
    migrations: int,
    reason: str,
    load_distance: float | None = None,
) -> dict[str, Any]:
    """One applied decision as the history keeps it: time, kind, before/after, reason, figures."""
    return {
        "time": now_iso(),
        "kind": kind,
        "routingVersion": after.version,
        "executorsBefore": len(before.executors),
        "executorsAfter": len(after.executors),
        "migrations": migrations,
        "reason": reason,
        "loadDistance": load_distance,
    }


RECOMMENDATIONS_KEPT = 8
"""Recommend mode: how many of the last decisions stay approvable (while made for the routing applied)."""


@dataclass(frozen=True)
class Recommendation:
    """A decision computed in Recommend mode and not applied: what approving ``id`` would apply."""

    id: str
    state: AllocationState
    result: AdaptationResult
    before: RoutingTable
    routing: RoutingTable
    """The routing table it applies (version ``before.version + 1``)."""

    @staticmethod
    def identify(routing: RoutingTable) -> str:
        """A content hash: the same decision on the same routing version gets the same id."""
        import hashlib

        return hashlib.sha256(routing.to_json().encode()).hexdigest()[:12]

    def summary(self, approved: bool = False) -> dict[str, Any]:
        rebalance = self.result.rebalance
        return {
            "id": self.id,
            "time": now_iso(),
            "routingVersion": self.before.version,
            "migrations": len(self.result.migrations),
            "executorsBefore": len(self.before.executors),
            "executorsAfter": len(self.routing.executors),
            "loadDistance": round(rebalance.load_distance if rebalance else 0.0, 4),
            "reason": self.result.reason,
            "approved": approved,
        }


class AdaptationLoop:
    """The SPL loop for one topology on any platform: ``step(now)`` once per statistics period.

    ``streamtopo run`` and the Kubernetes operator both drive it. ``routing`` is the table currently
    applied; without one, the first step plans and applies the initial deployment (:func:`reconcile`).
    ``now`` is seconds on any clock (only differences matter: stabilisation and scale-down delays).

    ``spec.autoscaling.mode`` decides what a period does with its decision: apply it (Auto), only publish
    it as ``pending`` until :meth:`approve` is called with its id (Recommend; the scaling and policy state
    stay as they were, since nothing changed), or compute nothing (Off).
    """

    def __init__(
        self,
        platform: Platform,
        metrics: MetricsSource,
        topology: StreamTopology,
        *,
        routing: RoutingTable | None = None,
        seed: int = 0,
        planner: Planner = IN_PROCESS,
    ):
        from streamtopo.planner.scaling.policy import ScalingState

        self.platform = platform
        self.metrics = metrics
        self.topology = topology
        self.routing = routing
        self.seed = seed
        self.planner = planner
        self.scaling_state = ScalingState()
        self.collocations: Collocations = ()
        """ALBIC's collocated pairs from the last round, passed into the next."""
        self.pending: Recommendation | None = None
        """Recommend mode: the last decision that would change something, until approved or replaced."""
        self.recommended: dict[str, Recommendation] = {}
        """Recommend mode: the last :data:`RECOMMENDATIONS_KEPT` decisions by id, oldest first. A user
        approves the id they read, which a newer period may have replaced by then (metrics move between
        periods): it stays approvable, and :meth:`approve` drops it as stale once the routing changed."""
        self.decisions: tuple[dict[str, Any], ...] = ()
        """The last :data:`DECISIONS_KEPT` decisions applied (persisted with the routing table)."""
        self._written: str | None = None
        """The memory last handed to the platform (a period that changes nothing writes nothing)."""
        self.history: list[StepResult] = []
        self.failing_since: dict[str, float] = {}
        """Executor -> ``now`` of the first period that saw it failing (forgotten once it runs again)."""
        self.profiled = 0
        """COLA profiling iterations done; the loop re-plans on measured costs until it reaches
        ``spec.fusion.profileIterations``, and runs ALBIC from then on."""
        self.crossing_cost: float | None = None
        """What a record crossing executors cost, measured once (:func:`measured_profile`)."""
        self.exhausted = 0
        """Executors the last period's load needed beyond the room (a CapacityExhausted Event goes out
        when this changes to a positive count, not every period)."""

    @property
    def interval(self) -> float:
        return self.topology.spec.autoscaling.interval

    def deploy(self) -> Outcome:
        """Plan and apply the initial deployment (re-applies the current one when already deployed)."""
        previous = DesiredState(self.topology, self.routing) if self.routing else None
        outcome = reconcile(
            self.topology, self.platform, previous=previous, seed=self.seed, planner=self.planner
        )
        if outcome.desired is not None:
            self.routing = outcome.desired.routing
        return outcome

    def step(self, now: float) -> StepResult:
        """One period of ALBIC's Algorithm 1; missing metrics skip the round instead of raising."""
        if self.routing is None:
            deployed = self.deploy()
            return self._record(
                StepResult(applied=deployed.desired is not None, routing=self.routing, outcome=deployed)
            )
        before = self.routing
        count = len(before.executors)
        mode = self.topology.spec.autoscaling.acting
        if self.topology.spec.suspend:
            self.pending, self.recommended = None, {}
            return self._record(
                StepResult(routing=before, skipped="Suspended", executors_before=count, executors_after=count)
            )
        profiling = self.profiled < self.topology.spec.fusion.profile_iterations
        if mode == "Off" and not profiling:
            self.pending, self.recommended = None, {}
            return self._record(
                StepResult(
                    routing=before,
                    skipped="AutoscalingDisabled",
                    executors_before=count,
                    executors_after=count,
                )
            )
        try:
            cluster = executor_hosts(self.topology.spec, self.platform.hosts())
        except ValueError as error:
            return self._record(self._skip("NoMatchingNodes", str(error), count))
        failing = {e: why for e, why in self.platform.failing_executors().items() if e in before.executors}
        previous, self.failing_since = (
            self.failing_since,
            {e: self.failing_since.get(e, now) for e in failing},
        )
        if self.failing_since != previous:
            self._publish(before)  # the failing-since times survive an operator restart
        grace = self.topology.spec.autoscaling.failure_grace
        lost = {e for e, since in self.failing_since.items() if now - since >= grace}
        if lost and lost >= set(before.executors):
            lost = set()  # nowhere to move their key groups: wait for an executor to run again
        if waiting := sorted(set(failing) - lost):
            reasons = ", ".join(f"{e} ({failing[e]})" for e in waiting)
            return self._record(
                self._skip(
                    "ExecutorFailing",
                    f"{reasons} not running: no rebalancing or scaling until it runs again or "
                    f"{grace:g}s have passed, when its key groups move to the others",
                    count,
                )
            )
        try:
            stats = self.metrics.collect(self.topology.metadata.name, self.interval)
            own = [(e.host, e.cpu) for e in before.executors.values()]
            room = free_cores(cluster, own, self.platform.committed(), clamp=False)
            state = allocation_state(
                stats,
                before,
                self.topology.spec,
                cluster,
                failing=failing,
                lost=lost,
                room=room,
                footprint=self.platform.executor_footprint,
            )
        except MetricsUnavailable as why:
            return self._record(
                self._skip(why.reason, f"{why}: no rebalancing or scaling this period", count)
            )
        if profiling:
            return self._record(self._profile(stats, cluster, before))
        result = self.planner.adapt(
            self.topology,
            state,
            self.scaling_state,
            now=now,
            window=self.interval,
            seed=self.seed,
            collocations=self.collocations,
        )
        batches = resized_batches(
            before.batch_sizes, entry_batch_sizes(self.topology.spec, processing_times(stats))
        )
        if result.safe:
            if batches is None or mode == "Recommend":
                return self._record(self._skip("AllocationKept", result.reason, count))
            return self._record(self._resize(before, batches, result.reason))
        executors = next_executors(result, before.executors, cluster)
        routing = before
        if result.assignment != before.assignment() or executors != dict(before.executors) or batches:
            routing = before.moved(result.assignment, executors, batches)
        if mode == "Recommend":
            step = self._recommend(state, before, routing, result)
        else:
            step = self._apply(state, before, routing, result)
        step.outcome.events += [
            Event(
                "ExecutorLost",
                f"{e} has not run for {now - self.failing_since[e]:.0f}s ({failing[e]}): its "
                f"{len(before.units_of(e))} key groups move to the other executors",
                "Warning",
            )
            for e in sorted(lost)
            if before.units_of(e)
        ]
        if batches and step.applied:
            step.outcome.events.append(batches_event(before.batch_sizes, batches))
        changes, events, status = capacity_report(
            result.capacity, reported=self.exhausted == _pending(result)
        )
        self.exhausted = _pending(result)
        step.outcome.conditions += changes
        step.outcome.events += events
        step.outcome.status.update(status)
        return self._record(step)

    def approvable(self, decision: str) -> bool:
        """Whether ``decision`` is one of the kept recommendations (:meth:`approve` acts on it)."""
        return decision in self.recommended

    def approve(self, decision: str) -> StepResult | None:
        """Apply the recommendation ``decision`` (Recommend mode), the pending one or one of the
        :data:`RECOMMENDATIONS_KEPT` before it; None when it is none of them (already applied, long
        replaced, or never made: nothing to do).

        A decision made for an older routing version than the one applied now is stale (the deployment
        changed since: a re-plan, or another decision approved) and is dropped with a Warning instead of
        applied."""
        if self.routing is None or (kept := self.recommended.pop(decision, None)) is None:
            return None
        if self.pending is kept:
            self.pending = None
        if self.routing.version != kept.before.version:
            count = len(self.routing.executors)
            step = StepResult(
                routing=self.routing,
                skipped="RecommendationStale",
                executors_before=count,
                executors_after=count,
            )
            step.outcome.events.append(
                Event(
                    "RecommendationStale",
                    f"decision {decision} was made for routing v{kept.before.version}, "
                    f"v{self.routing.version} is applied now: not applied",
                    "Warning",
                )
            )
            return self._record(step)
        step = self._apply(kept.state, kept.before, kept.routing, kept.result)
        step.outcome.events.insert(
            0,
            Event(
                "RecommendationApproved",
                f"decision {decision} approved: applied as routing v{kept.routing.version}",
            ),
        )
        step.outcome.status["recommendation"] = kept.summary(approved=True)
        return self._record(step)

    @property
    def memory(self) -> LoopMemory:
        """What the next round needs from this one, as a value (persisted, restorable)."""
        return LoopMemory(
            self.scaling_state,
            self.collocations,
            self.decisions,
            dict(self.failing_since),
            self.profiled,
            self.crossing_cost,
        )

    def restore(self, text: str | None) -> None:
        """Continue from a persisted :attr:`memory` (an operator restart); None or unreadable: start fresh."""
        memory = LoopMemory.from_json(text)
        self.scaling_state, self.collocations, self.decisions = (
            memory.scaling,
            memory.collocations,
            memory.decisions,
        )
        self.failing_since = dict(memory.failing_since)
        self.profiled, self.crossing_cost = memory.profiled, memory.crossing_cost
        self._written = text

    def _publish(self, routing: RoutingTable) -> None:
        """Apply ``routing`` with the loop's memory in one write, when either changed since the last."""
        memory = self.memory.to_json()
        if routing is not self.routing or memory != self._written:
            self.platform.apply(DesiredState(self.topology, routing, memory))
            self.routing, self._written = routing, memory

    def _apply(
        self, state: AllocationState, before: RoutingTable, routing: RoutingTable, result: AdaptationResult
    ) -> StepResult:
        """Line 8: apply the decision with the scaling and policy state that follow from it, in one write."""
        self.scaling_state = result.scaling_state
        self.collocations = tuple(getattr(result.policy_config, "collocations", ()))
        if routing is not before:
            self.decisions = (*self.decisions, decision_record(before, routing, result))[-DECISIONS_KEPT:]
        self._publish(routing)
        step = StepResult(
            applied=routing is not before,
            routing=routing,
            adaptation=result,
            executors_before=len(before.executors),
            executors_after=len(routing.executors),
        )
        step.outcome = report(state, before, routing, result)
        return step

    def _profile(self, stats: RuntimeStats, cluster: Cluster, before: RoutingTable) -> StepResult:
        """One iteration of COLA's profiling loop (Section 4): re-plan with the spec's fusion algorithm on
        the costs this period measured (busy cores per unit, records per unit pair) and the iteration's
        gamma, and migrate to the plan through the normal hand-over; executors keep their names where they
        keep units."""
        from streamtopo.planner.placement.cola.profiling import iteration_gamma

        iteration, total = self.profiled + 1, self.topology.spec.fusion.profile_iterations
        gamma = iteration_gamma(iteration)
        profile = measured_profile(stats, before.assignment(), gamma, self.crossing_cost)
        self.crossing_cost = profile.crossing_cost
        count = len(before.executors)
        self.profiled = iteration  # a plan that fails is not retried: the next period moves on
        try:
            desired, plan = self.planner.plan(self.topology, cluster, before, self.seed, profile)
        except ValueError as error:  # TopologyError, COLA's NoValidPlan
            self._publish(before)
            return self._skip("ProfilePlanFailed", f"profiling iteration {iteration}: {error}", count)
        routing = desired.routing
        moved = sum(routing.units.get(k) != e for k, e in before.units.items())
        if not moved and routing.executors == before.executors:
            routing = before  # the same deployment: no new routing version
        message = (
            f"{plan.algorithm.upper()} profiling iteration {iteration} of {total}"
            f"{f' (gamma {gamma:g})' if plan.algorithm == 'cola' else ''} on measured costs: "
            f"{len(plan.pes)} PEs on {len(routing.executors)} executors, U {plan.max_utilization:.3f}, "
            f"C {plan.communication_cost:.4f} cores; "
            + (
                f"{moved} key groups moved (routing v{routing.version})"
                if routing is not before
                else "no change"
            )
        )
        entry = history_entry(before, routing, "profile", moved, message)
        self.decisions = (*self.decisions, entry)[-DECISIONS_KEPT:]
        self._publish(routing)
        step = StepResult(
            applied=routing is not before,
            routing=routing,
            executors_before=count,
            executors_after=len(routing.executors),
            profile=message,
        )
        step.outcome.events.append(Event("ProfileIteration", message))
        step.outcome.status.update(plan_status(plan, routing))
        return step

    def _resize(self, before: RoutingTable, batches: Mapping[str, int], kept: str) -> StepResult:
        """A period that keeps the allocation but re-sizes transport entries (Aeolus on measured costs)."""
        routing = before.moved(before.assignment(), None, batches)
        self._publish(routing)
        count = len(before.executors)
        step = StepResult(applied=True, routing=routing, executors_before=count, executors_after=count)
        step.outcome.events.append(batches_event(before.batch_sizes, batches))
        step.outcome.conditions.append(ConditionChange("Rebalancing", "False", "AllocationKept", kept))
        step.outcome.status["routingVersion"] = routing.version
        return step

    def _recommend(
        self, state: AllocationState, before: RoutingTable, routing: RoutingTable, result: AdaptationResult
    ) -> StepResult:
        """Publish the decision, apply nothing: the report as it would read, under a Recommendation."""
        count = len(before.executors)
        step = StepResult(routing=before, adaptation=result, executors_before=count, executors_after=count)
        reported = report(state, before, routing, result)
        step.outcome.conditions.append(ConditionChange("Degraded", "False", "MetricsAvailable", ""))
        if routing is before:
            self.pending = None
            step.outcome.conditions += [
                ConditionChange(kind, "False", "NothingToRecommend", result.reason)
                for kind in ("Rebalancing", "Scaling")
            ]
            return step
        self.pending = Recommendation(Recommendation.identify(routing), state, result, before, routing)
        self.recommended.pop(self.pending.id, None)  # the same decision again: now the newest
        self.recommended[self.pending.id] = self.pending
        while len(self.recommended) > RECOMMENDATIONS_KEPT:
            del self.recommended[next(iter(self.recommended))]
        approve = (
            f"approve with: kubectl annotate stopo {self.topology.metadata.name} "
            f"{APPROVE_ANNOTATION}={self.pending.id}"
        )
        details = "; ".join(e.message for e in reported.events) or result.reason
        message = f"decision {self.pending.id} (not applied, mode Recommend): {details}; {approve}"
        step.outcome.events.append(Event("Recommendation", message))
        step.outcome.conditions += [
            ConditionChange(kind, "False", "RecommendationPending", message)
            for kind in ("Rebalancing", "Scaling")
        ]
        step.outcome.status["recommendation"] = self.pending.summary()
        return step

    def _skip(self, reason: str, message: str, count: int) -> StepResult:
        result = StepResult(
            routing=self.routing, skipped=reason, executors_before=count, executors_after=count
        )
        degraded = "False" if reason == "WarmingUp" else "True"  # executors just started: not a fault
        result.outcome.conditions += [
            ConditionChange("Degraded", degraded, reason, message),
            ConditionChange("Rebalancing", "False", reason, message),
            ConditionChange("Scaling", "False", reason, message),
        ]
        return result

    def _record(self, result: StepResult) -> StepResult:
        self.history.append(result)
        return result


def _pending(result: AdaptationResult) -> int:
    return result.capacity.pending if result.capacity is not None else 0


def report(
    state: AllocationState, before: RoutingTable, after: RoutingTable, result: AdaptationResult
) -> Outcome:
    """RebalanceReport / ScalingReport events with per-executor load before -> after (percent of capacity)."""
    rebalance = result.rebalance
    assert rebalance is not None  # a safe decision (no plan) is reported before it gets here
    capacity = {n: e.cpu for n, e in {**before.executors, **after.executors}.items()}
    load_before = executor_loads(state, before.assignment(), {n: capacity[n] for n in before.executors})
    load_after = executor_loads(state, after.assignment(), {n: capacity[n] for n in after.executors})
    order = sorted(
        capacity, key=lambda n: (-1 if (i := executor_index(before.topology, n)) is None else i, n)
    )
    figures = ", ".join(f"{n} {_pct(load_before.get(n))} -> {_pct(load_after.get(n))}" for n in order)
    outcome = Outcome()
    if rebalance.migrations:
        message = (
            f"{len(rebalance.migrations)} key groups moved (routing v{after.version}); load distance "
            f"{rebalance.load_distance:.2f}, collocation factor {rebalance.collocation_factor:.3f}; "
            f"executor load {figures}"
        )
        outcome.events.append(Event("RebalanceReport", message))
        outcome.conditions.append(ConditionChange("Rebalancing", "True", "KeyGroupsMoving", message))
        outcome.status["lastRebalance"] = {
            "time": now_iso(),
            "migrations": len(rebalance.migrations),
            "loadDistance": round(rebalance.load_distance, 4),
            "collocationFactor": round(rebalance.collocation_factor, 4),
        }
    else:
        outcome.conditions.append(
            ConditionChange(
                "Rebalancing", "False", "Balanced", f"load distance {rebalance.load_distance:.2f}"
            )
        )
    changes = [
        f"started {', '.join(f'{n} on {after.executors[n].host}' for n in result.added)}"
        if result.added
        else "",
        f"draining {', '.join(result.marked)}" if result.marked else "",
        f"kept {', '.join(result.unmarked)}" if result.unmarked else "",
        f"terminated {', '.join(result.terminated)}" if result.terminated else "",
    ]
    changes = [c for c in changes if c]
    if changes:
        message = (
            f"executors {len(before.executors)} -> {len(after.executors)}: {'; '.join(changes)}; "
            f"{result.decision.reason}; executor load {figures}"
        )
        outcome.events.append(Event("ScalingReport", message))
        outcome.conditions.append(ConditionChange("Scaling", "True", "ScalingExecutors", message))
    else:
        outcome.conditions.append(ConditionChange("Scaling", "False", "Stable", result.decision.reason))
    outcome.conditions.append(ConditionChange("Degraded", "False", "MetricsAvailable", ""))
    outcome.status.update(
        {
            "executors": len(after.executors),
            "routingVersion": after.version,
            "loadDistance": round(rebalance.load_distance, 4),
        }
    )
    return outcome


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}%"
