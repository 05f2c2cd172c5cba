"""A discrete-time model of a running job, driven by a scenario, to compare rebalancing and scaling policies.

Each period of ``interval`` seconds (one SPL):

1. the workload gives every source key group a rate (steps, diurnal cycle, Zipf skew, spikes, noise),
   which propagates along the operators' kg-to-kg patterns (one-to-one, forward, full) scaled by
   selectivities: the arrivals of every unit and the kg-to-kg traffic ``out[g_i][g_j]``;
2. a unit's CPU work is ``arrival x cost_per_record`` plus, for every record it sends to or receives
   from a unit on *another* executor, ``serialization_per_record`` (ALBIC, Section 4.3.2: crossing
   executors costs serialisation and deserialisation CPU, so collocation lowers the load);
3. every executor spends its ``capacity x interval`` busy seconds on its units' pending records
   (backlog plus arrivals), shared in proportion to demand when overloaded; a unit migrated at the
   start of the period is paused for ``pause_seconds + state_bytes / bytes_per_second`` and cannot work
   meanwhile, so its backlog grows; what is not processed is the backlog of the next period. A policy
   that routes a key group's records to several executors instead of moving it (PoTC: the plan's
   ``details["shares"]``) splits its work accordingly, records cross executors with the matching
   probability, and the owner pays ``details["merge_overhead"]`` x its work for merging the partial states;
4. the statistics (gLoad_k = 100 x work, the rate, state bytes as memory and migration cost, backlog,
   traffic) go to one round of ALBIC's Algorithm 1 (:func:`adapt`) with the chosen rebalancing policy
   and scaling rule; its assignment and executor set are what the next period runs on.

The statistics are the steady-state view a true-rate measurement reconstructs (DS2): load and rate at
the arrival rate, so an overloaded executor's key groups do not look lighter than they are.

With the scenario's ``hosts``, executors run on hosts of that many cores, and the model measures what
the runtime measures (runtime/metrics.py, planner/capacity.py): each executor wants the CPU its pending
work needs (at most its capacity); a host whose executors want more than its cores (less ``contention``
of a core for every executor beyond them) shares them in proportion, so each executor gets its share,
waits for the rest (its ``cpu_wait``, the saturation evidence), and its units' busy time, wall time as
the runtime measures it, is stretched by the wait. An executor whose ``footprint`` exceeds its capacity
(``streamtopo run``'s: a JVM and a Python driver) takes that many host cores per capacity of work, as
the runtime's process-tree CPU counts it. The hosts' room (cores no executor holds) goes to
Algorithm 1 as ``AllocationState.room``, so new executors are placed, and the scaling rule capped, by
the same code as on a cluster: one decision path.

Reported per period, measured on the allocation that ran in it: load distance (max |load - mean| over
active executors, percentage points), load index (total load per input record relative to period 0;
ALBIC's "current average load / load after initialisation", normalised by the input so a changing
rate does not hide collocation), collocation factor, migrations decided, executors, utilisation,
backlog. Pure and deterministic under the scenario's seed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import cast

import numpy as np

from streamtopo.contracts import KeyGroupId, executor_name, executor_prefix
from streamtopo.planner.adaptation import AdaptationConfig, Rebalancer, adapt
from streamtopo.planner.allocation import AllocationState, ExecutorInfo, KeyGroupStats
from streamtopo.planner.capacity import free_cores
from streamtopo.planner.cluster import Cluster
from streamtopo.planner.rebalance.albic.collocation import AlbicConfig
from streamtopo.planner.scaling.policy import ScalingConfig, ScalingState
from streamtopo.planner.simulation.scenario import Scenario


@dataclass(frozen=True)
class PeriodReport:
    """One period's figures (the JSON ``periods`` entries)."""

    period: int
    time: float
    input_rate: float
    executors: int
    """Executors running in the period (draining ones included)."""
    active_executors: int
    load_distance: float
    load_index: float
    collocation_factor: float
    migrations: int
    """Key groups the round at the end of the period moves."""
    backlog: float
    """Unprocessed records at the end of the period."""
    utilization: float
    """Demand over the running executors' capacity (above 1: overloaded)."""
    scaling: str
    """up, down or none."""
    executors_next: int
    reason: str
    safe: bool = False
    """The round kept the current allocation because the statistics were unusable."""
    saturation: float = 0.0
    """Share of the executors' runnable time spent waiting for a CPU (hosts' contention)."""
    pending: int = 0
    """Executors the load needs beyond what the hosts' room takes (the round's shortfall)."""


@dataclass(frozen=True)
class SimulationResult:
    policy: str
    scaling: str
    scenario: str
    periods: list[PeriodReport]
    summary: dict[str, float | int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        """The ``--format json`` contract: ``policy``, ``periods``, ``summary`` (plus names)."""
        return {
            "policy": self.policy,
            "scaling": self.scaling,
            "scenario": self.scenario,
            "periods": [asdict(p) for p in self.periods],
            "summary": dict(self.summary),
        }


class _Job:
    """The scenario's units, edges and costs as arrays (index = unit)."""

    def __init__(self, scenario: Scenario):
        self.scenario = scenario
        ops = scenario.by_name()
        self.order = scenario.order()
        self.units: list[KeyGroupId] = [(name, k) for name in self.order for k in range(ops[name].key_groups)]
        self.index = {u: i for i, u in enumerate(self.units)}
        self.cost = np.array([ops[name].cost_per_record for name, _ in self.units])
        self.selectivity = np.array([ops[name].selectivity for name, _ in self.units])
        self.state_bytes = np.array([ops[name].state_bytes for name, _ in self.units])
        src, dst, share = [], [], []
        for name in self.order:
            op = ops[name]
            for upstream in op.inputs:
                for i, j, s in _pattern(op.pattern, ops[upstream].key_groups, op.key_groups):
                    src.append(self.index[(upstream, i)])
                    dst.append(self.index[(name, j)])
                    share.append(s)
        self.src, self.dst, self.share = np.array(src, dtype=int), np.array(dst, dtype=int), np.array(share)
        self.sources = [name for name in self.order if not ops[name].inputs]
        self.source_weight = {
            name: _zipf(ops[name].key_groups, scenario.workload.skew) for name in self.sources
        }

    def arrivals(self, period: int, rng: np.random.Generator) -> np.ndarray:
        """Records/s reaching every unit in ``period`` (sources from the workload, the rest propagated)."""
        w = self.scenario.workload
        rate = w.rate
        for step in sorted(w.steps, key=lambda s: s.at):
            if step.at <= period:
                rate = step.rate
        if w.diurnal is not None:
            t = period * self.scenario.interval
            rate *= 1 + w.diurnal.amplitude * math.sin(2 * math.pi * (t - w.diurnal.phase) / w.diurnal.period)
        arrival = np.zeros(len(self.units))
        for name in self.sources:
            weights = self.source_weight[name].copy()
            for spike in w.spikes:
                if spike.at <= period < spike.at + spike.duration:
                    chosen = spike.key_groups if spike.key_groups is not None else range(len(weights))
                    for kg in chosen:
                        weights[kg] *= spike.factor
            first = self.index[(name, 0)]
            arrival[first : first + len(weights)] = rate * weights
        if w.noise > 0:
            arrival *= np.clip(1 + w.noise * rng.standard_normal(len(arrival)), 0.0, None)
        # Propagate in topological order: units are laid out by operator in that order, edges likewise.
        for s, d, share in zip(self.src, self.dst, self.share):
            arrival[d] += arrival[s] * self.selectivity[s] * share
        return arrival

    def input_rate(self, arrival: np.ndarray) -> float:
        """Records/s entering the job: the source units' arrivals."""
        return float(
            sum(
                arrival[self.index[(name, 0)] : self.index[(name, 0)] + len(self.source_weight[name])].sum()
                for name in self.sources
            )
        )

    def traffic(self, arrival: np.ndarray) -> dict[tuple[KeyGroupId, KeyGroupId], float]:
        """out[g_i][g_j] in records/s."""
        traffic: dict[tuple[KeyGroupId, KeyGroupId], float] = {}
        for s, d, rate in zip(self.src, self.dst, self.edge_rates(arrival)):
            pair = (self.units[s], self.units[d])
            traffic[pair] = traffic.get(pair, 0.0) + float(rate)
        return traffic

    def edge_rates(self, arrival: np.ndarray) -> np.ndarray:
        rates: np.ndarray = arrival[self.src] * self.selectivity[self.src] * self.share
        return rates

    def work(self, arrival: np.ndarray, share: np.ndarray) -> np.ndarray:
        """CPU seconds per second of every unit, given the share of each unit on each executor."""
        work: np.ndarray = arrival * self.cost
        crossing = (
            self.edge_rates(arrival) * self.crossing(share) * self.scenario.costs.serialization_per_record
        )
        np.add.at(work, self.src, crossing)
        np.add.at(work, self.dst, crossing)
        return work

    def crossing(self, share: np.ndarray) -> np.ndarray:
        """Per edge, the probability that a record leaves its executor (0 or 1 unless units are split)."""
        leaving: np.ndarray = 1.0 - (share[self.src] * share[self.dst]).sum(axis=1)
        return leaving


def _pattern(pattern: str, k_up: int, k_down: int) -> list[tuple[int, int, float]]:
    """(upstream kg, downstream kg, share of the upstream kg's output)."""
    if pattern == "one-to-one":
        return [(i, i, 1.0) for i in range(k_up)]
    if pattern == "forward":
        return [(i, i % k_down, 1.0) for i in range(k_up)]
    return [(i, j, 1.0 / k_down) for i in range(k_up) for j in range(k_down)]


def _zipf(n: int, exponent: float) -> np.ndarray:
    weights = 1.0 / np.arange(1, n + 1) ** exponent
    shares: np.ndarray = weights / weights.sum()
    return shares


def initial_executors(scenario: Scenario) -> list[ExecutorInfo]:
    """The executors of period 0, round-robin over the scenario's hosts (when it has hosts)."""
    spec = scenario.executors
    caps = spec.capacities or [spec.capacity] * spec.initial
    hosts = host_names(scenario)
    return [
        ExecutorInfo(
            name=executor_name(scenario.name, i),
            capacity=float(c),
            host=hosts[i % len(hosts)] if hosts else None,
        )
        for i, c in enumerate(caps)
    ]


def host_names(scenario: Scenario) -> list[str]:
    return [f"host-{i + 1}" for i in range(scenario.hosts.count)] if scenario.hosts is not None else []


def _contention(
    scenario: Scenario, executors: list[ExecutorInfo], want: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Cores each executor gets and waits for this period (module docstring): on its host, the
    executors share the cores (less the contention of every executor beyond them) in proportion to what
    they want. Without hosts, each gets what it wants."""
    if scenario.hosts is None:
        return want, np.zeros_like(want)
    got = want.copy()
    for host in host_names(scenario):
        on = np.array([e.host == host for e in executors])
        if not on.any():
            continue
        extra = max(0, int(on.sum()) - math.floor(scenario.hosts.cpu))
        cores = scenario.hosts.cpu * max(0.1, 1.0 - scenario.hosts.contention * extra)
        wanted = float(want[on].sum())
        if wanted > cores:
            got[on] = want[on] * cores / wanted
    return got, want - got


def _room(scenario: Scenario, executors: list[ExecutorInfo]) -> dict[str, float] | None:
    """Host -> cores no executor holds (planner/capacity.py), None without hosts."""
    if scenario.hosts is None:
        return None
    cluster = Cluster.uniform(scenario.hosts.count, scenario.hosts.cpu)
    return free_cores(cluster, [(e.host, e.capacity) for e in executors], clamp=False)


def initial_assignment(
    job: _Job, executors: list[ExecutorInfo], rng: np.random.Generator
) -> dict[KeyGroupId, str]:
    """Round-robin by key-group index, or a seeded random even split (the default: no free collocation)."""
    names = [e.name for e in executors]
    if job.scenario.executors.placement == "round-robin":
        return {u: names[u[1] % len(names)] for u in job.units}
    order = rng.permutation(len(job.units))
    return {job.units[k]: names[pos % len(names)] for pos, k in enumerate(order)}


def adaptation_config(
    scenario: Scenario,
    *,
    policy: str | None = None,
    scaling: str | None = None,
    policy_config: object | None = None,
) -> AdaptationConfig:
    """Algorithm 1's settings from the scenario, as the operator's ``adaptation_config`` takes them from
    ``spec.autoscaling`` (the scenario's ``scaling`` and ``albic`` sections are the same models), so the
    simulator's decisions are the operator's on the same observations (tests/controller/
    test_one_decision_path.py). ``policy``, ``scaling`` and ``policy_config`` override the scenario's."""
    policy = policy or scenario.policy
    if policy_config is None and policy == "albic":
        policy_config = AlbicConfig.from_spec(scenario.albic)
    scaling_config = ScalingConfig.model_validate(
        {
            **scenario.scaling.model_dump(),
            "rule": scaling or scenario.scaling.rule,
            "max_load_distance": scenario.albic.max_load_distance,
            "executor_capacity": scenario.executors.capacity,
            "dstreams_interval": scenario.interval,
        }
    )
    return AdaptationConfig(
        policy=policy,
        scaling_config=scaling_config,
        max_migrations=scenario.migration.max_migrations,
        max_migration_cost=scenario.migration.max_migration_cost,
        policy_config=policy_config,
        executor_prefix=executor_prefix(scenario.name),
    )


def simulate(
    scenario: Scenario,
    *,
    policy: str | None = None,
    scaling: str | None = None,
    periods: int | None = None,
    seed: int | None = None,
    rebalance: Rebalancer | None = None,
    policy_config: object | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SimulationResult:
    """Run ``scenario`` (its own policy, scaling rule, length and seed unless overridden).

    ``rebalance`` replaces the registered policy (tests, custom policies); ``policy_config`` replaces the
    policy's config (ALBIC's comes from the scenario's ``albic`` section, as the operator's comes from
    ``spec.autoscaling.albic``); ``progress(done, total)`` is called after every period (the CLI draws a
    progress bar with it).
    """
    config = adaptation_config(scenario, policy=policy, scaling=scaling, policy_config=policy_config)
    policy, rule = config.policy, config.scaling_config.rule
    total = periods or scenario.periods
    seed = scenario.seed if seed is None else seed
    rng = np.random.default_rng(seed)
    job = _Job(scenario)
    executors = initial_executors(scenario)
    assignment = initial_assignment(job, executors, rng)
    backlog = np.zeros(len(job.units))
    pause = np.zeros(len(job.units))
    scaling_state = ScalingState()
    faults = {f.at: f.kind for f in scenario.faults}
    reports: list[PeriodReport] = []
    shares: dict[KeyGroupId, dict[str, float]] | None = None
    merge_overhead = 0.0
    per_record0 = 0.0
    T = scenario.interval

    for period in range(total):
        arrival = job.arrivals(period, rng)
        names = [e.name for e in executors]
        share, owner = _shares(job, names, assignment, shares)
        capacity = np.array([e.capacity for e in executors])
        active = np.array([not e.marked_for_removal for e in executors])
        work = job.work(arrival, share)
        merge = merge_overhead * work * ((share > 0).sum(axis=1) > 1)
        executor_work = share.T @ work + np.bincount(owner, weights=merge, minlength=len(names))
        pending_work = share.T @ (work + backlog * job.cost / T)
        # An executor of footprint f takes f / capacity host cores per core of work it does.
        ratio = np.maximum(1.0, (scenario.executors.footprint or 0.0) / capacity)
        busy = np.minimum(capacity, pending_work)
        got, wait = _contention(scenario, executors, busy * ratio)
        effective = np.where(got < busy * ratio - 1e-12, got / ratio, capacity)
        backlog = _process(arrival, work, share, merge, owner, effective, backlog, pause, T, job.cost)
        # A unit's busy time is wall time: on an executor that got only part of the CPU it wanted, its
        # work took that much longer (what the runtime measures, and the saturation evidence explains).
        stretch = np.where(got > 0, (got + wait) / np.where(got > 0, got, 1.0), 1.0)
        measured = work * stretch[owner]

        stats = [
            KeyGroupStats(
                id=u,
                load=100.0 * measured[k],
                memory=float(job.state_bytes[k]),
                migration_cost=float(job.state_bytes[k]),
                rate=float(arrival[k]),
                backlog=float(backlog[k]),
            )
            for k, u in enumerate(job.units)
        ]
        state = AllocationState(
            executors=[
                replace(e, cpu_used=float(got[i]), cpu_wait=float(wait[i])) if scenario.hosts else e
                for i, e in enumerate(executors)
            ],
            key_groups=stats,
            assignment=dict(assignment),
            traffic=job.traffic(arrival),
            room=_room(scenario, executors),
            footprint=scenario.executors.footprint if scenario.hosts else None,
        )
        input_rate = job.input_rate(arrival)
        per_record = float(executor_work.sum()) / input_rate if input_rate > 0 else 0.0
        if period == 0:
            per_record0 = per_record
        result = adapt(
            _inject(state, faults.get(period)),
            scaling_state,
            time=(period + 1) * T,
            window=T,
            config=config,
            rebalance=rebalance,
            seed=seed,
        )
        edges = job.edge_rates(arrival)
        inside = float((edges * (1.0 - job.crossing(share))).sum())
        reports.append(
            PeriodReport(
                period=period,
                time=(period + 1) * T,
                input_rate=input_rate,
                executors=len(executors),
                active_executors=int(active.sum()),
                load_distance=_load_distance(100.0 * executor_work, capacity, active),
                load_index=per_record / per_record0 if per_record0 > 0 else 1.0,
                collocation_factor=inside / float(edges.sum()) if edges.sum() > 0 else 0.0,
                migrations=len(result.migrations),
                backlog=float(backlog.sum()),
                utilization=float(executor_work.sum()) / float(capacity.sum()),
                saturation=float(wait.sum() / (got.sum() + wait.sum())) if wait.sum() > 0 else 0.0,
                pending=result.capacity.pending if result.capacity is not None else 0,
                scaling=result.decision.direction,
                executors_next=len(result.executors),
                reason=result.reason,
                safe=result.safe,
            )
        )
        moved = {kg for kg, _, _ in result.migrations}
        pause = np.array(
            [
                scenario.migration.pause_seconds + job.state_bytes[k] / scenario.migration.bytes_per_second
                if u in moved
                else 0.0
                for k, u in enumerate(job.units)
            ]
        )
        assignment, executors, scaling_state = result.assignment, result.executors, result.scaling_state
        if result.rebalance is not None:  # a safe decision keeps the routing as it was
            # C-MR's rebalancer splits units across executors (details["shares"]); the others do not.
            details = result.rebalance.details
            shares = cast("dict[KeyGroupId, dict[str, float]] | None", details.get("shares"))
            merge_overhead = float(cast(float, details.get("merge_overhead", 0.0)))
        config = replace(config, policy_config=result.policy_config)
        if progress is not None:
            progress(period + 1, total)
    return SimulationResult(
        policy=policy, scaling=rule, scenario=scenario.name, periods=reports, summary=summarise(reports)
    )


def _shares(
    job: _Job,
    names: list[str],
    assignment: dict[KeyGroupId, str],
    shares: dict[KeyGroupId, dict[str, float]] | None,
) -> tuple[np.ndarray, np.ndarray]:
    """Unit x executor matrix of the share of each unit's records each executor processes, and the
    owner (state holder) of each unit. A unit sits wholly on its executor unless the policy routes it
    to several (PoTC's ``details["shares"]``)."""
    slot = {n: i for i, n in enumerate(names)}
    share = np.zeros((len(job.units), len(names)))
    owner = np.array([slot[assignment[u]] for u in job.units], dtype=int)
    for k, u in enumerate(job.units):
        split = shares.get(u) if shares else None
        if split and all(e in slot for e in split):
            for e, fraction in split.items():
                share[k, slot[e]] = fraction
        else:
            share[k, owner[k]] = 1.0
    return share, owner


def _load_distance(loads: np.ndarray, capacity: np.ndarray, active: np.ndarray) -> float:
    """ALBIC's load distance (max |load_i - mean| over active executors, percentage points) on executor
    loads that may include split key groups and merge overhead, which albic.metrics does not model."""
    utilization = loads / capacity
    mean = loads.sum() / capacity[active].sum()
    return float(np.abs(utilization[active] - mean).max())


def _process(
    arrival: np.ndarray,
    work: np.ndarray,
    share: np.ndarray,
    merge: np.ndarray,
    owner: np.ndarray,
    capacity: np.ndarray,
    backlog: np.ndarray,
    pause: np.ndarray,
    T: float,
    cost: np.ndarray,
) -> np.ndarray:
    """Step 3: spend each executor's busy seconds on its units' pending records; return the new backlog.

    Each executor shares its capacity in proportion to demand: its part of every unit's records (and
    the merge work of split units it owns); a paused unit cannot use more than ``T - pause`` seconds.
    """
    per_record = np.where(arrival > 0, work / np.where(arrival > 0, arrival, 1.0), cost)
    pending = backlog + arrival * T
    need = pending * per_record
    want = np.minimum(need[:, None] * share, np.clip(T - pause, 0.0, T)[:, None] * capacity[None, :])
    demand = want.sum(axis=0) + np.bincount(owner, weights=merge * T, minlength=len(capacity))
    scale = np.minimum(1.0, capacity * T / np.where(demand > 0, demand, 1.0))
    spent = (want * scale[None, :]).sum(axis=1)
    done = np.where(need > 0, spent / np.where(need > 0, need, 1.0), 1.0)
    return np.maximum(pending * (1.0 - done), 0.0)


def _inject(state: AllocationState, kind: str | None) -> AllocationState:
    """A scenario fault: the statistics gap the controller could see (see docs/simulate.md)."""
    if kind is None:
        return state
    first = state.key_groups[0]
    if kind == "missing-key-group":
        return replace(state, key_groups=state.key_groups[1:])
    if kind == "nan-load":
        return replace(state, key_groups=[replace(first, load=float("nan")), *state.key_groups[1:]])
    return replace(state, executors=[replace(state.executors[0], capacity=0.0), *state.executors[1:]])


def summarise(reports: list[PeriodReport]) -> dict[str, float | int]:
    """The JSON ``summary``: mean/max load distance, migrations, final load index, executor changes."""
    distances = [r.load_distance for r in reports]
    return {
        "load_distance_mean": float(np.mean(distances)),
        "load_distance_max": float(np.max(distances)),
        "migrations_total": int(sum(r.migrations for r in reports)),
        "load_index_final": reports[-1].load_index,
        "collocation_factor_final": reports[-1].collocation_factor,
        "executor_changes": int(sum(1 for r in reports if r.scaling != "none")),
        "executors_final": reports[-1].executors_next,
        "executors_max": max(max(r.executors, r.executors_next) for r in reports),
        "saturation_max": max(r.saturation for r in reports),
        "pending_max": max(r.pending for r in reports),
        "backlog_final": reports[-1].backlog,
        "backlog_max": float(max(r.backlog for r in reports)),
        "safe_decisions": int(sum(1 for r in reports if r.safe)),
    }
