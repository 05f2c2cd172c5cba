"""ALBIC's integrative adaptation framework (Madsen, Zhou, Cao, ICDE 2017, Algorithm 1, Section 4.1).

Once per statistics period:

    1-3  terminate every executor marked for removal in an earlier period that holds no key group;
    4    plan <- keyGroupAlloc()          the rebalancer's plan on the current executors
    5    if Scaling(plan):                the scaling rule decides on that plan
    6        new executors join (empty); executors to remove are marked (ALBIC's set B)
    7        plan <- keyGroupAlloc()      re-plan with the new executor set
    8    apply(plan)

Deciding on the *plan* rather than on the current allocation is the point of Section 4.1: balancing
may cure an overloaded executor without scaling, and scale-in is not done when the remaining executors
cannot be balanced (the scaling rule's load-distance guard reads the plan's load distance). Marked
executors are drained by the rebalancer under its migration bound, never emptied at once (Lemma 1:
no key group moves onto them), and terminated by lines 1-3 of a later round.

Scale-up first takes back executors still draining (they hold state already), then starts new ones,
each on the host with the most room for it (``AllocationState.room``, planner/capacity.py: line 6's
"wait until new nodes are allocated" holds only for executors a host can take, so the scaling rule is
capped at them). Scale-down marks the active executors with the least load in the plan (the least to
move).

A round that would only rebalance is skipped when its expected gain is within the measured noise: the
plan's reduction of the load distance (or of the hottest executor's load) must exceed how far the
executors' loads a round predicts for the allocation it applies (this period's key-group loads on it)
land from the loads the next period measures there (``ScalingState.noise``). A migration pauses the key
group it moves; spending pauses on a gain that the next period's noise would undo is thrash. Rounds that
scale, drain set B, collocate more traffic or mend a constraint are never skipped.

Pure: :func:`adapt` maps (allocation state, scaling state, time) to an :class:`AdaptationResult`; the
caller (controller or simulator) applies it. Bad statistics (NaN, missing key groups, zero capacity)
yield the documented safe decision: keep the current allocation and executors, scale nothing, and say
why in ``reason`` (``safe`` is True).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from streamtopo.contracts import KeyGroupId
from streamtopo.planner.allocation import AllocationState, ExecutorInfo, Rebalance
from streamtopo.planner.capacity import Shortfall, place
from streamtopo.planner.scaling.policy import (
    ScalingConfig,
    ScalingDecision,
    ScalingObservation,
    ScalingState,
    observe,
    reclaimable,
)
from streamtopo.planner.scaling.rules import scaler

Rebalancer = Callable[..., Rebalance]
"""``rebalance(state, *, max_migrations, max_migration_cost, config, seed) -> Rebalance``."""


@dataclass(frozen=True)
class AdaptationConfig:
    """Which rebalancer and scaling rule run, and their bounds."""

    policy: str = "albic"
    """A name of streamtopo.planner.rebalance.registry.REBALANCERS."""
    scaling_config: ScalingConfig = field(default_factory=ScalingConfig)
    max_migrations: int | None = 10
    max_migration_cost: float | None = None
    policy_config: object | None = None
    """Passed to the rebalancer as ``config`` (None: the policy's defaults)."""
    executor_prefix: str = "executor-"
    """New executors are named ``<prefix><n>`` with n above every existing one."""


@dataclass(frozen=True)
class AdaptationResult:
    """What one round decided; the caller applies ``assignment`` and ``executors``."""

    assignment: dict[KeyGroupId, str]
    executors: list[ExecutorInfo]
    """The executor set after the round: terminated ones gone, new ones added, set B flagged."""
    terminated: list[str]
    added: list[str]
    marked: list[str]
    """Executors newly marked for removal this round."""
    unmarked: list[str]
    """Draining executors taken back by a scale-up."""
    decision: ScalingDecision
    scaling_state: ScalingState
    plan: Rebalance | None
    """Line 4's plan (None in a safe decision)."""
    rebalance: Rebalance | None
    """The plan applied: line 7's after a scaling change, else line 4's."""
    safe: bool = False
    reason: str = ""
    policy_config: object | None = None
    """The rebalancer's config for the next round (ALBIC's collocation constraints carried over)."""
    capacity: Shortfall | None = None
    """The round's capacity figures (executors wanted and placeable, cores, records/s demanded and
    carried); ``capacity.exhausted`` when the load needs more than the hosts' room takes. None in a
    safe decision."""

    @property
    def migrations(self) -> list[tuple[KeyGroupId, str, str]]:
        return list(self.rebalance.migrations) if self.rebalance is not None else []


def adapt(
    state: AllocationState,
    scaling_state: ScalingState,
    *,
    time: float,
    window: float,
    config: AdaptationConfig | None = None,
    rebalance: Rebalancer | None = None,
    arrivals: Mapping[KeyGroupId, float] | None = None,
    seed: int = 0,
) -> AdaptationResult:
    """One round of Algorithm 1 at ``time`` over statistics covering ``window`` seconds.

    ``rebalance`` overrides the registry lookup of ``config.policy`` (tests, custom policies);
    ``arrivals`` are records/s reaching each key group, for the scaling rule (default: the processed rate).
    """
    config = config or AdaptationConfig()
    try:
        _validate(state)
        rebalance = rebalance or _registered(config.policy)
        rule = scaler(config.scaling_config.rule)
        names = {e.name for e in state.executors}
        hosted = set(state.assignment.values())
        terminated = [e.name for e in state.executors if e.marked_for_removal and e.name not in hosted]  # 1-3
        current = cpu_loads(
            replace(state, executors=[e for e in state.executors if e.name not in terminated])
        )

        def plan_on(s: AllocationState) -> Rebalance:
            return rebalance(
                s,
                max_migrations=config.max_migrations,
                max_migration_cost=config.max_migration_cost,
                config=config.policy_config,
                seed=seed,
            )

        plan = plan_on(current)  # line 4
        observation = observe(
            current,
            plan,
            time=time,
            window=window,
            arrivals=arrivals,
            new_executor_cpu=config.scaling_config.executor_capacity,
        )
        decision, new_scaling_state = rule(observation, scaling_state, config.scaling_config)  # line 5
        new_scaling_state = _measure_noise(current, new_scaling_state)
        executors, added, marked, unmarked = _scale(current, plan, decision, config, names)
        applied = plan
        if added or marked or unmarked:  # lines 6-7
            applied = plan_on(replace(current, executors=executors))
        elif (skip := _within_noise(current, plan, new_scaling_state)) is not None:
            applied = skip
        new_scaling_state = _predict(replace(current, executors=executors), applied, new_scaling_state)
    except ValueError as error:
        return safe_decision(
            state, scaling_state, f"keeping the current allocation: {error}", config.policy_config
        )
    reason = decision.reason if not terminated else f"terminated {', '.join(terminated)}; {decision.reason}"
    if applied is not plan and not (added or marked or unmarked):
        reason = f"{reason}; {applied.reason}"
    return AdaptationResult(
        assignment=dict(applied.assignment),
        executors=executors,
        terminated=terminated,
        added=added,
        marked=marked,
        unmarked=unmarked,
        decision=decision,
        scaling_state=new_scaling_state,
        plan=plan,
        rebalance=applied,
        reason=reason,
        policy_config=carry_over(config.policy_config, applied),
        capacity=decision.shortfall or _capacity(observation, decision),
    )


def _capacity(observation: ScalingObservation, decision: ScalingDecision) -> Shortfall:
    """The round's capacity figures when nothing is missing: the executors it keeps are what it wants."""
    cpu = observation.footprint
    return Shortfall(
        executors_wanted=decision.executors,
        executors_placed=decision.executors,
        executor_cpu=cpu,
        demand=observation.demand,
        available=observation.capacity + (observation.placeable or 0) * cpu,
        rate_demanded=observation.input_rate,
        rate_carried=observation.input_rate if observation.carried_rate is None else observation.carried_rate,
        measured=True,
    )


def cpu_loads(state: AllocationState) -> AllocationState:
    """Key-group loads as CPU (ALBIC's gLoad is a CPU load): a unit's busy time is wall time, which on an
    executor whose threads waited for a CPU includes the wait, so each is scaled by the share of its
    executor's runnable time that it ran (``cpu_used / (cpu_used + cpu_wait)``). Executors without a
    measured wait keep their loads."""
    share = {
        e.name: e.cpu_used / (e.cpu_used + e.cpu_wait)
        for e in state.executors
        if e.cpu_used is not None and e.cpu_wait > 0 and e.cpu_used + e.cpu_wait > 0
    }
    if not share:
        return state
    scaled = [
        replace(kg, load=kg.load * share.get(state.assignment.get(kg.id, ""), 1.0)) for kg in state.key_groups
    ]
    return replace(state, key_groups=scaled)


def carry_over(policy_config: object | None, rebalance: Rebalance) -> object | None:
    """The policy config of the next round: ALBIC keeps the collocations it made (Algorithm 2, step 2
    maintains existing collocated pairs), which it returns in ``details["collocation_constraints"]``
    and reads back from ``AlbicConfig.collocations``. Other policies' configs pass through unchanged."""
    from streamtopo.planner.rebalance.albic.collocation import AlbicConfig

    pairs = rebalance.details.get("collocation_constraints")
    if not isinstance(pairs, list | tuple):
        return policy_config
    if policy_config is None:
        policy_config = AlbicConfig()
    if not isinstance(policy_config, AlbicConfig):
        return policy_config
    return policy_config.model_copy(update={"collocations": tuple((a, b) for a, b in pairs)})


def safe_decision(
    state: AllocationState, scaling_state: ScalingState, reason: str, policy_config: object | None = None
) -> AdaptationResult:
    """The documented safe decision: nothing moves, nothing scales, the reason says why."""
    active = sum(1 for e in state.executors if not e.marked_for_removal)
    return AdaptationResult(
        assignment=dict(state.assignment),
        executors=list(state.executors),
        terminated=[],
        added=[],
        marked=[],
        unmarked=[],
        decision=ScalingDecision(active, active, "none", reason),
        scaling_state=scaling_state,
        plan=None,
        rebalance=None,
        safe=True,
        reason=reason,
        policy_config=policy_config,
    )


def _validate(state: AllocationState) -> None:
    """The shared state check of the rebalancers (raises a ValueError naming every bad field)."""
    from streamtopo.planner.rebalance.albic.state import index_state

    index_state(state)


def _registered(policy: str) -> Rebalancer:
    try:
        from streamtopo.planner.rebalance.registry import REBALANCERS
    except ImportError as error:
        raise ValueError(f"policy: the rebalancer registry is unavailable ({error})") from None

    if policy not in REBALANCERS:
        raise ValueError(
            f"policy: unknown rebalancing policy {policy!r}; use one of {', '.join(sorted(REBALANCERS))}"
        )
    return REBALANCERS[policy]


def _scale(
    state: AllocationState,
    plan: Rebalance,
    decision: ScalingDecision,
    config: AdaptationConfig,
    taken: set[str],
) -> tuple[list[ExecutorInfo], list[str], list[str], list[str]]:
    """Line 6: the executor set after the decision (new executors join empty; removals join set B)."""
    executors = list(state.executors)
    added: list[str] = []
    marked: list[str] = []
    unmarked: list[str] = []
    load = _plan_loads(state, plan.assignment)
    if decision.delta > 0:
        draining = sorted(reclaimable(state), key=lambda e: (-load[e.name], e.name))
        for e in draining[: decision.delta]:
            unmarked.append(e.name)
        executors = [replace(e, marked_for_removal=False) if e.name in unmarked else e for e in executors]
        next_index = _next_index(taken, config.executor_prefix)
        cpu = config.scaling_config.executor_capacity
        count = decision.delta - len(unmarked)
        hosts = place([cpu] * count, state.room)[0] if state.room is not None else [None] * count
        for i, host in enumerate(h for h in hosts if h is not None or state.room is None):
            name = f"{config.executor_prefix}{next_index + i}"
            labels = next((e.labels for e in state.executors if e.host == host and host is not None), {})
            executors.append(ExecutorInfo(name=name, capacity=cpu, host=host, labels=labels))
            added.append(name)
    elif decision.delta < 0:
        active = sorted(
            (e for e in executors if not e.marked_for_removal), key=lambda e: (load[e.name], e.name)
        )
        marked = [e.name for e in active[: -decision.delta]]
        executors = [replace(e, marked_for_removal=True) if e.name in marked else e for e in executors]
    return executors, added, marked, unmarked


def _plan_loads(state: AllocationState, assignment: Mapping[KeyGroupId, str]) -> dict[str, float]:
    load = {e.name: 0.0 for e in state.executors}
    for kg in state.key_groups:
        load[assignment[kg.id]] += kg.load
    return load


def _next_index(names: set[str], prefix: str) -> int:
    """One above the largest ``<prefix><n>`` in use (including executors terminated this round)."""
    pattern = re.compile(re.escape(prefix) + r"(\d+)$")
    numbers = [int(m.group(1)) for n in names if (m := pattern.match(n))]
    return max(numbers, default=len(names) - 1) + 1


NOISE_WEIGHT = 0.5
"""Weight of the newest period in the exponentially averaged balancing noise."""
COLLOCATION_GAIN = 0.01
"""A plan that keeps this much more of the traffic inside executors is applied whatever its load gain."""


def _utilisations(state: AllocationState, assignment: Mapping[KeyGroupId, str]) -> dict[str, float]:
    """Active executors' loads in percent of their own capacity under ``assignment``."""
    load = _plan_loads(state, assignment)
    return {e.name: load[e.name] / e.capacity for e in state.executors if not e.marked_for_removal}


def _allocation(assignment: Mapping[KeyGroupId, str], executors: Mapping[str, float]) -> str:
    """A digest of an assignment over a set of active executors."""
    import hashlib

    text = repr((sorted((str(k), v) for k, v in assignment.items()), sorted(executors)))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _predict(after: AllocationState, applied: Rebalance, scaling: ScalingState) -> ScalingState:
    """Remember the executors' loads the applied allocation should show next period (this period's
    key-group loads on it), with the allocation they are predicted for."""
    loads = _utilisations(after, applied.assignment)
    allocation = _allocation(applied.assignment, loads)
    return replace(scaling, loads=tuple(sorted(loads.items())), allocation=allocation)


def _measure_noise(state: AllocationState, scaling: ScalingState) -> ScalingState:
    """The noise: how far this period's executor loads are from what the last round predicted for this
    allocation (root mean square over executors, exponentially averaged); unchanged when the allocation
    is not the one predicted for (an executor failed, a drill moved a key group)."""
    loads = _utilisations(state, state.assignment)
    if not scaling.loads or scaling.allocation != _allocation(state.assignment, loads):
        return scaling
    predicted = dict(scaling.loads)
    errors = [loads[e] - predicted[e] for e in loads if e in predicted]
    if not errors:
        return scaling
    rms = (sum(c * c for c in errors) / len(errors)) ** 0.5
    noise = rms if scaling.noise is None else NOISE_WEIGHT * rms + (1 - NOISE_WEIGHT) * scaling.noise
    return replace(scaling, noise=noise)


def _within_noise(state: AllocationState, plan: Rebalance, scaling: ScalingState) -> Rebalance | None:
    """The current allocation, kept, when ``plan``'s expected gain is below the measured noise; None to
    apply the plan (no noise measured yet, no move, or moves that drain set B or mend a constraint)."""
    if scaling.noise is None or not plan.migrations:
        return None
    if any(e.marked_for_removal for e in state.executors):
        return None
    from streamtopo.planner.rebalance.albic.metrics import collocation_factor, load_distance
    from streamtopo.planner.rebalance.albic.rules import rule_violations

    if rule_violations(state, state.assignment):
        return None
    collocated = collocation_factor(state, state.assignment)
    if plan.collocation_factor > collocated + COLLOCATION_GAIN:
        return None  # it collocates traffic: a saving the loads measured before it cannot show
    now = _utilisations(state, state.assignment)
    planned = _utilisations(state, plan.assignment)
    distance = load_distance(state, state.assignment)
    gain = max(distance - plan.load_distance, max(now.values()) - max(planned.values()))
    if gain > scaling.noise:
        return None
    return Rebalance(
        assignment=dict(state.assignment),
        migrations=[],
        load_distance=distance,
        collocation_factor=collocated,
        reason=(
            f"rebalancing skipped: the plan's expected gain {gain:.1f} pp is within the measured noise "
            f"{scaling.noise:.1f} pp ({len(plan.migrations)} key groups would have moved)"
        ),
    )
