"""How many executors: a target-capacity rule in the spirit of DS2 and Flink's Kubernetes autoscaler.

DS2 (Kalavri et al., OSDI 2018) sizes an operator from its *true processing rate*: records per second of
busy time, which does not saturate when the operator is overloaded the way observed throughput does.
Here the whole job is sized at once, because executors host units of every operator:

    demand       = sum_k arrival_k / true_rate_k            cores the input needs (busy seconds / s)
    steady       = ceil(demand / (c * targetUtilization))   executors of capacity c at the target
    catch-up     = ceil((demand + backlog_work / catchUp) / c)
    required     = clamp(max(steady, catch-up), minExecutors, maxExecutors)

``backlog_work = sum_k lag_k / true_rate_k`` is the busy time the backlog needs; a source's lag (records
a generator has due but not emitted, or a source stream's queue) needs the whole job's work per input
record, ``lag_k * demand / input``. Catch-up may use the
full capacity (utilisation 1) rather than the target, so a backlog that the target's headroom drains
within ``catchUp`` adds no executor: this is what keeps a rate step from overshooting.

The safeguards users of Flink's autoscaler rely on, each with its own reason in the decision:

- a full metric window (``metric_window`` seconds of observations since the last change) before acting,
  since metrics measured across a rescale describe neither configuration;
- stabilisation: no decision for ``stabilization`` seconds after a change;
- a utilisation band: nothing happens while ``demand / capacity`` is within target +- band;
- delayed scale-down: a scale-down must be wanted for ``scale_down_delay`` seconds in a row, and then
  goes to the largest count required during that time (so a dip does not remove what the next rise
  needs; only windows that lie entirely within the wish count, so the samples from before the drop
  do not hold the count up); capped scale-down: at most ``max_scale_down_fraction`` (a half) of the
  executors per step;
- scale-up grace: no scale-down for ``scale_up_grace`` seconds after a scale-up (Flink's
  ``scale-up.grace-period``), so a peak's noise that triggered a scale-up cannot undo it right after;
- backlog mode: no scale-down while the lag exceeds ``backlog_seconds`` of input;
- ALBIC's guard (Section 4.1): no scale-down while the rebalancer's plan leaves a load distance above
  ``max_load_distance``, since removing executors from an unbalanced job overloads the rest;
- min/max executors, enforced even inside the stabilisation window.

And the ones that make it capacity-aware (design.md section 6), modelled on the Flink autoscaler's
resource check and ineffective-scaling detection:

- room: the count is capped by what the hosts' room takes (``ScalingObservation.placeable``,
  planner/capacity.py), booking each running executor at what it uses when that exceeds its request and
  each new one at the running ones' footprint (an executor is a JVM plus a Python driver: on a 2-core
  machine one takes ~1.6 cores busy, so a second would only contend); beyond it the rule keeps the
  largest count it can place and reports the
  :class:`~streamtopo.planner.capacity.Shortfall` (records/s demanded against carried, cores missing);
- saturation: a period in which an executor's host was saturated (its threads waited for a CPU more
  than ``saturation_threshold`` of their runnable time: a run queue longer than the cores, or CPU
  throttling) measured contention, not capacity: its true rates are kept out of the demand and it
  decides no scale-up. If the saturated host runs more executors than the cores they got run at their
  footprint (used plus waited for, each: over-provisioned), they are scaled down at once (no
  scale-down delay, grace or backlog mode: more executors on those cores only slow each other down),
  capped at ``max_scale_down_fraction``;
- ineffective scale-up (Flink's ``scaling.effectiveness.detection``): when a scale-up raised the
  measured true capacity by less than ``scaling_effectiveness_threshold`` of what it expected, no
  further scale-up happens until the count changes otherwise.

Pure: the time is an input and the state the rule carries between rounds (:class:`ScalingState`) is
passed in and returned. :data:`~streamtopo.planner.scaling.rules.RULES` also holds the DStreams-style
ratio rule (``dstreams``) and ``off``, all with the same signature.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Literal

from pydantic import Field

from streamtopo.contracts import KeyGroupId
from streamtopo.planner.allocation import AllocationState, ExecutorInfo, Rebalance
from streamtopo.planner.capacity import Shortfall, booked_room, footprint, over_occupied, placeable
from streamtopo.planner.model import AutoscalingSpec, ScalingRuleSpec

Direction = Literal["up", "down", "none"]
EPS = 1e-9


class ScalingConfig(ScalingRuleSpec):
    """What the rules read: the rule's spec (:class:`~streamtopo.planner.model.ScalingRuleSpec`, the one
    definition of its fields and defaults) plus what the caller knows about its platform."""

    max_load_distance: float | None = Field(default=10.0, ge=0)
    """No scale-down while the plan's load distance (percentage points) exceeds this; None: no guard."""
    executor_capacity: float = Field(default=1.0, gt=0)
    """Cores of a new executor (1.0 = the reference executor loads are measured on)."""
    dstreams_interval: float = Field(default=60.0, ge=0)
    """``dstreams``: spark.streaming.dynamicAllocation.scalingInterval (the statistics period)."""

    @classmethod
    def from_spec(cls, spec: AutoscalingSpec, **overrides: object) -> ScalingConfig:
        """The rule a StreamTopology's ``spec.autoscaling`` asks for (the metric window is one SPL at least)."""
        values: dict[str, object] = {name: getattr(spec, name) for name in ScalingRuleSpec.model_fields}
        values.update(
            metric_window=max(spec.interval, spec.metric_window),
            max_load_distance=spec.albic.max_load_distance,
            dstreams_interval=spec.interval,
        )
        return cls.model_validate({**values, **overrides})


@dataclass(frozen=True)
class HostLoad:
    """The active executors of one host over a period, as saturation evidence."""

    host: str
    executors: int
    """Executors running there (draining ones included)."""
    used: float
    """Cores they used."""
    wait: float
    """Cores' worth of their threads waiting for a CPU while runnable."""
    draining: int = 0
    """Of them, executors marked for removal (leaving already)."""

    @property
    def footprint(self) -> float:
        """Cores one of them would use on a free host: their runnable time (used plus waited) each."""
        return (self.used + self.wait) / self.executors if self.executors else 0.0

    @property
    def saturation(self) -> float:
        """Share of their runnable time spent waiting for a CPU."""
        return self.wait / (self.used + self.wait) if self.used + self.wait > 0 else 0.0


@dataclass(frozen=True)
class ScalingObservation:
    """What one statistics period says about capacity, built by :func:`observe`."""

    time: float
    """End of the period, seconds (any epoch: only differences matter)."""
    window: float
    """Seconds the period's metrics cover (the SPL)."""
    executors: int
    """Active executors (not marked for removal)."""
    capacity: float
    """Their summed capacity, cores."""
    input_rate: float
    """Records per second entering the job (arrivals of key groups no other key group sends to)."""
    demand: float
    """Cores needed to process ``input_rate``: sum of arrival / true processing rate."""
    backlog: float
    """Records waiting (lag)."""
    backlog_work: float
    """Busy seconds the backlog needs."""
    load_distance: float | None = None
    """Of the rebalancer's plan for these executors (ALBIC's scale-in guard)."""
    placeable: int | None = None
    """Executors the hosts' room takes beyond the active ones (draining ones taken back included);
    None: no limit is known."""
    carried_rate: float | None = None
    """Records per second the sources emitted (what the pipeline took in), when measured."""
    hosts: tuple[HostLoad, ...] = ()
    """Per host, what its active executors used and waited for (executors with a CPU measurement)."""
    footprint: float = 1.0
    """Cores a new executor is expected to take on its host (planner/capacity.py :func:`footprint`): what
    ``placeable`` counts executors of."""


@dataclass(frozen=True)
class ScalingState:
    """What the rules carry from round to round (returned updated, never mutated)."""

    last_change: float | None = None
    """Time of the last executor change."""
    last_scale_up: float | None = None
    """Time of the last scale-up (the grace period runs from it)."""
    scale_down_since: float | None = None
    """When the current uninterrupted wish to scale down began."""
    scale_down_floor: int = 0
    """Largest count required while the scale-down has been wanted."""
    history: tuple[tuple[float, ...], ...] = ()
    """(time, window, demand, saturated 0/1) of the observations since the last change, within the
    metric window."""
    last_decision: float | None = None
    """Time the DStreams rule last evaluated (its scaling interval)."""
    scale_up_from: tuple[float, ...] | None = None
    """(executors, true capacity records/s) before the last scale-up, until a full window after it judged
    whether it was effective."""
    ineffective: bool = False
    """The last scale-up was ineffective: no scale-up until the count changes otherwise."""
    loads: tuple[tuple[str, float], ...] = ()
    """Algorithm 1's balancing noise (planner/adaptation.py): each active executor's load (percent of its
    capacity) the last round predicted for the allocation it applied, ``allocation`` (a digest)."""
    allocation: str = ""
    noise: float | None = None
    """Root mean square distance of the executors' measured loads from those predicted, percentage
    points (exponentially averaged): what a rebalancing round's expected gain must exceed."""


@dataclass(frozen=True)
class ScalingDecision:
    """A new executor count, which way it goes, and why."""

    executors: int
    previous: int
    direction: Direction
    reason: str
    utilization: float = 0.0
    required: int | None = None
    """The count the rule computed (before delays and caps)."""
    shortfall: Shortfall | None = None
    """What the load needs beyond what the hosts' room takes (the rule kept the largest count it could
    place)."""

    @property
    def delta(self) -> int:
        return self.executors - self.previous


Scaler = Callable[[ScalingObservation, ScalingState, ScalingConfig], tuple[ScalingDecision, ScalingState]]


def observe(
    state: AllocationState,
    plan: Rebalance | None,
    *,
    time: float,
    window: float,
    arrivals: Mapping[KeyGroupId, float] | None = None,
    new_executor_cpu: float = 1.0,
) -> ScalingObservation:
    """Summarise a period's statistics for the scaling rules.

    Per key group the true processing rate is ``rate / (load / 100)`` records per busy second.
    ``arrivals`` (records/s reaching each key group) default to the processed rate, which is exact
    unless the group falls behind; a group that did no measurable work borrows the job-wide true rate.
    The job's input rate counts the key groups that receive no kg-to-kg traffic (the sources; a
    generator's rate is the records that came due, its target rate). A source's backlog costs the whole
    job's work per input record (``demand / input_rate``), which is what catching up on it takes.
    With ``state.room`` known, ``placeable`` counts the executors the hosts take beyond the active ones
    (draining ones can be taken back at once): each new one takes the running executors' measured
    footprint (at least ``new_executor_cpu`` cores, its request, and ``state.footprint``), and the room
    is what the running ones leave, each booked at the larger of its request, ``state.footprint`` and
    what it used (planner/capacity.py).
    """
    fed = {dst for (_, dst), value in state.traffic.items() if value > 0}
    measured = [(kg.rate, kg.load / 100.0) for kg in state.key_groups if kg.load / 100.0 > 0 and kg.rate > 0]
    busy_total = sum(busy for _, busy in measured)
    job_rate = sum(rate for rate, _ in measured) / busy_total if busy_total > 0 else math.inf
    demand = backlog_work = input_rate = backlog = carried = 0.0
    source_work = source_backlog = 0.0
    for kg in state.key_groups:
        arrival = kg.rate if arrivals is None else arrivals.get(kg.id, kg.rate)
        busy = kg.load / 100.0
        true_rate = kg.rate / busy if busy > 0 and kg.rate > 0 else job_rate
        work = 0.0
        if busy > 0 and kg.rate == 0:
            demand += busy  # busy without output: the work is real, its rate unknown
        elif math.isfinite(true_rate):
            demand += arrival / true_rate
            work = kg.backlog / true_rate
        if kg.id in fed:
            backlog_work += work
        else:
            input_rate += arrival
            carried += kg.output_rate
            source_work += work
            source_backlog += kg.backlog
        backlog += kg.backlog
    # A record waiting at a source (a generator's due records, a source stream's queue) has all of the
    # job's work ahead of it, not only the source's: the job's busy seconds per input record.
    backlog_work += source_backlog * demand / input_rate if input_rate > 0 else source_work
    active = [e for e in state.executors if not e.marked_for_removal]
    known = state.footprint or 0.0
    expected = footprint(max(new_executor_cpu, known), [e.cpu_used or 0.0 for e in active])
    extra = None
    if state.room is not None:
        booked = [(e.host, e.capacity, max(known, e.cpu_used or 0.0)) for e in state.executors]
        extra = len(reclaimable(state)) + placeable(expected, booked_room(state.room, booked))
    running = [e for e in state.executors if e.cpu_used is not None]
    hosts = tuple(
        HostLoad(
            h,
            len(on),
            sum(e.cpu_used or 0.0 for e in on),
            sum(e.cpu_wait for e in on),
            sum(1 for e in on if e.marked_for_removal),
        )
        for h in sorted({e.host or "" for e in running})
        if (on := [e for e in running if (e.host or "") == h])
    )
    return ScalingObservation(
        time=time,
        window=window,
        executors=len(active),
        capacity=sum(e.capacity for e in active),
        input_rate=input_rate,
        demand=demand,
        backlog=backlog,
        backlog_work=backlog_work,
        load_distance=plan.load_distance if plan is not None else None,
        placeable=extra,
        carried_rate=carried if any(kg.output_rate for kg in state.key_groups) else None,
        hosts=hosts,
        footprint=expected,
    )


def reclaimable(state: AllocationState) -> list[ExecutorInfo]:
    """Draining executors a scale-up may take back: running already, so they need no room, unless their
    host is over-occupied (taking one back there keeps an executor its cores cannot run)."""
    room = state.room
    return [
        e
        for e in state.executors
        if e.marked_for_removal and (room is None or not over_occupied(e.host, room))
    ]


def check_observation(obs: ScalingObservation) -> None:
    for name in ("time", "window", "capacity", "input_rate", "demand", "backlog", "backlog_work"):
        value = getattr(obs, name)
        if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
            raise ValueError(f"scaling observation {name}: must be a finite number >= 0, got {value!r}")
    if obs.executors < 0:
        raise ValueError(f"scaling observation executors: must be >= 0, got {obs.executors}")


def _rate(value: float) -> str:
    return f"{value / 1000:.3g}k" if value >= 1000 else f"{value:.3g}"


def capacity_per_executor(obs: ScalingObservation, config: ScalingConfig) -> float:
    return obs.capacity / obs.executors if obs.executors and obs.capacity > 0 else config.executor_capacity


def hold(
    obs: ScalingObservation,
    reason: str,
    utilization: float = 0.0,
    required: int | None = None,
    shortfall: Shortfall | None = None,
) -> ScalingDecision:
    return ScalingDecision(obs.executors, obs.executors, "none", reason, utilization, required, shortfall)


def change_to(
    obs: ScalingObservation,
    state: ScalingState,
    new: int,
    reason: str,
    utilization: float,
    required: int | None,
    shortfall: Shortfall | None = None,
) -> tuple[ScalingDecision, ScalingState]:
    """The decision to go to ``new`` executors, and the state after a change: the windows restart and a
    scale-up remembers the true capacity it started from (ineffective-scaling detection)."""
    direction: Direction = "up" if new > obs.executors else "down"
    decision = ScalingDecision(
        new,
        obs.executors,
        direction,
        f"scale {direction} {obs.executors} -> {new}: {reason}",
        utilization,
        required,
        shortfall,
    )
    last_up = obs.time if direction == "up" else state.last_scale_up
    before = true_capacity(obs)
    start = (float(obs.executors), before) if direction == "up" and before is not None else None
    return decision, replace(
        state,
        last_change=obs.time,
        last_scale_up=last_up,
        scale_down_since=None,
        scale_down_floor=0,
        history=(),
        last_decision=obs.time,
        scale_up_from=start,
        ineffective=False,
    )


def true_capacity(obs: ScalingObservation) -> float | None:
    """Records per second the active executors carry at full utilisation (their true processing rate):
    the input's records per core-second of demand times their cores; None without a measurement."""
    if obs.demand <= 0 or obs.input_rate <= 0:
        return None
    return obs.input_rate / obs.demand * obs.capacity


def room_cap(obs: ScalingObservation, config: ScalingConfig) -> int | None:
    """The most executors the hosts' room lets the job have (None: no limit known)."""
    return None if obs.placeable is None else obs.executors + obs.placeable


def shortfall_of(
    obs: ScalingObservation, config: ScalingConfig, wanted: int, demand: float
) -> Shortfall | None:
    """The measured shortfall when ``wanted`` executors exceed what the room takes, else None."""
    cap = room_cap(obs, config)
    if cap is None or wanted <= cap:
        return None
    return Shortfall(
        executors_wanted=wanted,
        executors_placed=cap,
        executor_cpu=obs.footprint,
        demand=demand,
        available=obs.capacity + (obs.placeable or 0) * obs.footprint,
        rate_demanded=obs.input_rate,
        rate_carried=obs.input_rate if obs.carried_rate is None else obs.carried_rate,
        measured=True,
    )


def scale_up_within_room(
    obs: ScalingObservation,
    state: ScalingState,
    config: ScalingConfig,
    wanted: int,
    reason: str,
    utilization: float,
    demand: float,
) -> tuple[ScalingDecision, ScalingState]:
    """Scale up to ``wanted``, or to the largest count the hosts' room takes, reporting the shortfall;
    a hold when there is no room at all. Every rule's scale-ups go through here."""
    shortfall = shortfall_of(obs, config, wanted, demand)
    cap = room_cap(obs, config)
    new = wanted if cap is None else min(wanted, cap)
    if new <= obs.executors:
        why = f"capacity exhausted: {reason}; {shortfall.message() if shortfall else 'no room'}"
        return hold(obs, why, utilization, wanted, shortfall), state
    if shortfall is not None:
        reason = f"{reason}; capped at {new}, the most the hosts have room for ({shortfall.message()})"
    return change_to(obs, state, new, reason, utilization, wanted, shortfall)


def enforce_bounds(
    obs: ScalingObservation, state: ScalingState, config: ScalingConfig
) -> tuple[ScalingDecision, ScalingState] | None:
    """minExecutors/maxExecutors hold whatever the other safeguards say (minExecutors within room)."""
    if obs.executors < config.min_executors:
        reason = f"below minExecutors {config.min_executors}"
        return scale_up_within_room(obs, state, config, config.min_executors, reason, 0.0, obs.demand)
    if obs.executors > config.max_executors:
        return change_to(
            obs, state, config.max_executors, f"above maxExecutors {config.max_executors}", 0.0, None
        )
    return None


def target_count(demand: float, per_executor: float, config: ScalingConfig) -> int:
    """Executors of ``per_executor`` cores that run ``demand`` cores at the target utilisation, within bounds."""
    count = math.ceil(demand / (per_executor * config.target_utilization) - EPS)
    return min(max(count, config.min_executors), config.max_executors)


def saturated_hosts(obs: ScalingObservation, config: ScalingConfig) -> list[HostLoad]:
    return [h for h in obs.hosts if h.saturation > config.saturation_threshold + EPS]


def overprovisioned(hosts: list[HostLoad], per_executor: float) -> int:
    """Active executors beyond what the cores the saturated ``hosts`` gave their executors run at full
    speed (at least one per host), once the draining ones have left: more processes on those cores only
    wait for each other. An executor takes its footprint, its share of the host's demand (cores used
    plus waited for), or ``per_executor`` cores if that is more; the cores used are rounded to the
    nearest count of footprints (an executor more than half of whose footprint is not there goes; exactly
    half stays, also when the cores are a sum of measurements that lands a rounding error below it)."""
    return sum(
        max(
            0,
            h.executors
            - max(1, math.floor(h.used / max(per_executor, h.footprint) + 0.5 + EPS))
            - h.draining,
        )
        for h in hosts
    )


def _saturated(
    obs: ScalingObservation, state: ScalingState, config: ScalingConfig, hosts: list[HostLoad]
) -> tuple[ScalingDecision, ScalingState]:
    """A period on saturated hosts: scale an over-provisioned host down, else decide nothing on it."""
    worst = max(hosts, key=lambda h: h.saturation)
    facts = (
        f"host {worst.host or '(unnamed)'} saturated: its {worst.executors} executors used "
        f"{worst.used:.2f} cores and waited {100 * worst.saturation:.0f} % of their runnable time for a CPU"
    )
    excess = min(overprovisioned(hosts, capacity_per_executor(obs, config)), obs.executors - 1)
    if excess > 0:
        capped = math.ceil(obs.executors * (1 - config.max_scale_down_fraction) - EPS)
        new = max(obs.executors - excess, capped, config.min_executors)
        if new < obs.executors:
            note = (
                f" (capped: at most {config.max_scale_down_fraction:g} per step)"
                if capped > obs.executors - excess
                else ""
            )
            return change_to(
                obs, state, new, f"{facts}: over-provisioned by {excess}{note}", 0.0, obs.executors - excess
            )
    return hold(
        obs,
        f"{facts}: rates measured under contention are not capacity evidence; no scaling on this period",
    ), _no_scale_down(state)


def decide_target(
    obs: ScalingObservation, state: ScalingState, config: ScalingConfig
) -> tuple[ScalingDecision, ScalingState]:
    """The target-capacity rule with its safeguards (module docstring); returns the decision and new state."""
    check_observation(obs)
    if (forced := enforce_bounds(obs, state, config)) is not None:
        return forced
    saturated = saturated_hosts(obs, config)
    history = tuple(h for h in state.history if h[0] - h[1] >= obs.time - config.metric_window - EPS)
    history += ((obs.time, obs.window, obs.demand, 1.0 if saturated else 0.0),)
    state = replace(state, history=history)
    if state.last_change is not None and obs.time - state.last_change < config.stabilization - EPS:
        return hold(
            obs,
            f"stabilising: last change {obs.time - state.last_change:.0f} s ago "
            f"< stabilization {config.stabilization:.0f} s",
        ), state
    covered = sum(h[1] for h in history)
    if covered < config.metric_window - EPS:
        return hold(obs, f"collecting metrics: {covered:.0f} of {config.metric_window:.0f} s"), state
    if saturated:
        return _saturated(obs, state, config, saturated)

    evidence = [h for h in history if not (len(h) > 3 and h[3])]  # saturated periods are not evidence
    demand = sum(h[1] * h[2] for h in evidence) / sum(h[1] for h in evidence)
    per_exec = capacity_per_executor(obs, config)
    target = config.target_utilization
    steady = target_count(demand, per_exec, config)
    catch_up = math.ceil((demand + obs.backlog_work / config.catch_up) / per_exec - EPS)
    required = min(max(steady, catch_up), config.max_executors)
    utilization = demand / (obs.executors * per_exec) if obs.executors else math.inf
    true_rate = obs.input_rate / demand if demand > 0 else math.inf
    facts = (
        f"input {_rate(obs.input_rate)} rec/s, true capacity {_rate(true_rate * per_exec)} rec/s/executor, "
        f"utilisation {utilization:.2f} vs target {target:g}"
    )
    in_band = abs(utilization - target) <= config.utilization_band + EPS
    backlog_mode = obs.backlog > config.backlog_seconds * obs.input_rate and obs.backlog > 0
    state = _judge_scale_up(obs, state, config)

    if required > obs.executors:
        if in_band and catch_up <= obs.executors:
            return hold(obs, f"within band: {facts}", utilization, required), _no_scale_down(state)
        if state.ineffective:
            return hold(
                obs,
                f"ineffective scaling: the last scale-up raised the true capacity by less than "
                f"{config.scaling_effectiveness_threshold:g} of what it expected; no further scale-up "
                f"until the count changes otherwise: {facts}",
                utilization,
                required,
                shortfall_of(obs, config, required, demand),
            ), _no_scale_down(state)
        why = (
            f"backlog {obs.backlog:.0f} records to catch up within {config.catch_up:.0f} s"
            if catch_up > steady
            else f"target {target:g} needs {required}"
        )
        decision, after = scale_up_within_room(
            obs, state, config, required, f"{facts}; {why}", utilization, demand
        )
        return decision, (after if decision.direction == "up" else _no_scale_down(after))
    if required == obs.executors:
        return hold(obs, f"at target: {facts}", utilization, required), _no_scale_down(state)
    if backlog_mode:
        return hold(
            obs,
            f"backlog mode: lag {obs.backlog:.0f} records > {config.backlog_seconds:g} s of input; "
            f"no scale-down",
            utilization,
            required,
        ), _no_scale_down(state)
    if in_band:
        return hold(obs, f"within band: {facts}", utilization, required), _no_scale_down(state)
    if state.last_scale_up is not None and obs.time - state.last_scale_up < config.scale_up_grace - EPS:
        return hold(
            obs,
            f"no scale-down within scale-up grace {config.scale_up_grace:.0f} s "
            f"(scaled up {obs.time - state.last_scale_up:.0f} s ago): {facts}",
            utilization,
            required,
        ), _no_scale_down(state)
    if (
        config.max_load_distance is not None
        and obs.load_distance is not None
        and obs.load_distance > config.max_load_distance
    ):
        return hold(
            obs,
            f"no scale-down: the plan's load distance {obs.load_distance:.1f} > maxLD "
            f"{config.max_load_distance:g}",
            utilization,
            required,
        ), _no_scale_down(state)
    since = obs.time if state.scale_down_since is None else state.scale_down_since
    floor = state.scale_down_floor if state.scale_down_since is not None else 0
    if obs.time - since >= config.metric_window - EPS:  # the window lies within the wish: no pre-drop samples
        floor = max(floor, required)
    state = replace(state, scale_down_since=since, scale_down_floor=floor)
    floor = floor or required
    if obs.time - since < config.scale_down_delay - EPS:
        return hold(
            obs,
            f"scale-down to {floor} wanted for {obs.time - since:.0f} s of scaleDownDelay "
            f"{config.scale_down_delay:.0f} s: {facts}",
            utilization,
            required,
        ), state
    capped = math.ceil(obs.executors * (1 - config.max_scale_down_fraction) - EPS)
    new = max(floor, capped, config.min_executors)
    cap_note = (
        f" (capped from {floor}: at most {config.max_scale_down_fraction:g} per step)"
        if capped > floor
        else ""
    )
    return change_to(
        obs, state, new, f"{facts}; target {target:g} needs {floor}{cap_note}", utilization, required
    )


def _no_scale_down(state: ScalingState) -> ScalingState:
    return replace(state, scale_down_since=None, scale_down_floor=0)


def _judge_scale_up(obs: ScalingObservation, state: ScalingState, config: ScalingConfig) -> ScalingState:
    """Once a full unsaturated window follows a scale-up: was it effective? The share of the expected
    gain in true capacity that arrived (Flink's scaling effectiveness) below the threshold marks it
    ineffective, which blocks scale-ups until the count changes."""
    if state.scale_up_from is None:
        return state
    before_executors, before = state.scale_up_from
    now = true_capacity(obs)
    if now is None or before_executors <= 0:
        return replace(state, scale_up_from=None)
    expected = before * obs.executors / before_executors
    gained = (now - before) / (expected - before) if expected > before else 1.0
    return replace(state, scale_up_from=None, ineffective=gained < config.scaling_effectiveness_threshold)


def decide_off(
    obs: ScalingObservation, state: ScalingState, config: ScalingConfig
) -> tuple[ScalingDecision, ScalingState]:
    """No scaling: the executor count stays (only min/max are enforced)."""
    check_observation(obs)
    return enforce_bounds(obs, state, config) or (hold(obs, "scaling off"), state)


__all__ = [
    "Scaler",
    "ScalingConfig",
    "ScalingDecision",
    "ScalingObservation",
    "ScalingState",
    "decide_off",
    "decide_target",
    "observe",
    "target_count",
]
