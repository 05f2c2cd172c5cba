"""One decision path: the operator's SPL round, a local run's and the simulator's take their settings
through the same models (``spec.autoscaling`` is a scenario's ``scaling`` + ``albic``) into the same
function (``planner.adaptation.adapt``), so the same observations give the same decisions: the simulator
predicts what the operator does."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import yaml

from streamtopo.controller.reconcile import IN_PROCESS
from streamtopo.documents import load_topology
from streamtopo.local.loop import short_windows
from streamtopo.planner.adaptation import AdaptationResult, adapt
from streamtopo.planner.allocation import AllocationState, ExecutorInfo, KeyGroupStats
from streamtopo.planner.model import ScalingRuleSpec, StreamTopology
from streamtopo.planner.scaling.policy import ScalingState
from streamtopo.planner.simulation.scenario import load_scenario
from streamtopo.planner.simulation.simulator import adaptation_config

ROOT = Path(__file__).resolve().parents[2]
INTERVAL = 30.0
AUTOSCALING = {
    "interval": "30s",
    "policy": "albic",
    "minExecutors": 1,
    "maxExecutors": 6,
    "targetUtilization": 0.6,
    "utilizationBand": 0.1,
    "metricWindow": "30s",
    "stabilization": "30s",
    "scaleDownDelay": "90s",
    "scaleUpGrace": "90s",
    "maxMigrationsPerRound": 4,
    "albic": {"maxLoadDistance": 5, "maxPartitionLoad": 15, "stepPartitionLoad": 5, "scoreFactor": 1.2},
}
LOADS = [  # per period, the load (percent of an executor) of each of agg's 8 key groups
    [10.0] * 8,
    [40.0, 5.0, 5.0, 5.0, 30.0, 5.0, 5.0, 5.0],  # skewed: a rebalance
    [25.0] * 8,  # 200 % on 2 executors: scale up
    [30.0, 20.0] * 4,
    *[[5.0] * 8] * 6,  # 40 % in all: after the scale-up grace and the scale-down delay, scale down
    *[[6.0, 4.0] * 4] * 3,  # the marked executors drain under the migration bound, then terminate
]


def topology() -> StreamTopology:
    document = yaml.safe_load((ROOT / "examples/vwap.yaml").read_text())
    document["spec"]["autoscaling"] = AUTOSCALING
    document["spec"].pop("replicas", None)  # pinned replicas would override min/max
    return load_topology(document)


def equivalent_scenario(t: StreamTopology):
    """The same settings as a scenario file would give them."""
    rule_fields = {ScalingRuleSpec.model_fields[f].alias or f for f in ScalingRuleSpec.model_fields}
    return load_scenario(
        {
            "name": t.metadata.name,
            "interval": AUTOSCALING["interval"],
            "policy": AUTOSCALING["policy"],
            "operators": [{"name": "agg", "keyGroups": 8}],
            "executors": {"initial": 2, "capacity": t.spec.executor.resources.cpu or 1.0},
            "migration": {"maxMigrations": AUTOSCALING["maxMigrationsPerRound"]},
            "scaling": {k: v for k, v in AUTOSCALING.items() if k in rule_fields},
            "albic": AUTOSCALING["albic"],
        }
    )


def observed(loads: list[float], executors: list[ExecutorInfo], assignment: dict) -> AllocationState:
    stats = [KeyGroupStats(("agg", k), load=load, rate=1000.0 * load) for k, load in enumerate(loads)]
    traffic = {(("agg", k), ("agg", (k + 1) % 8)): 50.0 * (k % 2) for k in range(8)}
    return AllocationState(executors=executors, key_groups=stats, assignment=assignment, traffic=traffic)


def decision(result: AdaptationResult) -> tuple:
    return (
        sorted(result.assignment.items()),
        [(e.name, e.capacity, e.marked_for_removal) for e in result.executors],
        result.decision.executors,
        result.decision.direction,
    )


def test_operator_local_run_and_simulator_decide_alike() -> None:
    t = topology()
    local = short_windows(t, INTERVAL)  # what `streamtopo run` hands the same AdaptationLoop
    scenario_config = adaptation_config(equivalent_scenario(t))
    start = [
        ExecutorInfo(f"{t.metadata.name}-e{i}", capacity=t.spec.executor.resources.cpu or 1.0) for i in (0, 1)
    ]
    first = {("agg", k): start[k % 2].name for k in range(8)}

    def operator_round(spec: StreamTopology):
        """What AdaptationLoop.step does with an observation: Planner.adapt, collocations carried."""
        scaling, collocations = ScalingState(), ()

        def step(state: AllocationState, now: float) -> AdaptationResult:
            nonlocal scaling, collocations
            result = IN_PROCESS.adapt(
                spec, state, scaling, now=now, window=INTERVAL, seed=0, collocations=collocations
            )
            scaling, collocations = (
                result.scaling_state,
                tuple(getattr(result.policy_config, "collocations", ())),
            )
            return result

        return step

    def simulator_round():
        """What simulate does each period: adapt with the scenario's config, its policy config carried."""
        scaling, config = ScalingState(), scenario_config

        def step(state: AllocationState, now: float) -> AdaptationResult:
            nonlocal scaling, config
            result = adapt(state, scaling, time=now, window=INTERVAL, config=config, seed=0)
            scaling, config = result.scaling_state, replace(config, policy_config=result.policy_config)
            return result

        return step

    paths = {"operator": operator_round(t), "local": operator_round(local), "simulator": simulator_round()}
    current = {name: (list(start), dict(first)) for name in paths}
    history: dict[str, list[tuple]] = {name: [] for name in paths}
    for period, loads in enumerate(LOADS):
        for name, step in paths.items():
            executors, assignment = current[name]
            result = step(observed(loads, executors, assignment), (period + 1) * INTERVAL)
            assert not result.safe, (name, period, result.reason)
            history[name].append(decision(result))
            current[name] = (result.executors, result.assignment)
    assert history["operator"] == history["local"] == history["simulator"]
    directions = [d[3] for d in history["operator"]]
    assert "up" in directions and "down" in directions, directions
    assert any(len(d[1]) < len(before[1]) for before, d in zip(history["operator"], history["operator"][1:]))
    moved = [d[0] != before[0] for before, d in zip(history["operator"], history["operator"][1:])]
    assert any(moved)
    assert all(e.startswith(f"{t.metadata.name}-e") for d in history["operator"] for e, _, _ in d[1])


def test_capacity_and_saturation_decide_alike_on_every_path() -> None:
    """The capacity inputs travel in the AllocationState every path builds (the hosts' room, each
    executor's CPU used and waited for), so the operator, a local run and the simulator cap a scale-up
    at the room and scale an over-provisioned saturated host down alike."""
    t = topology()
    local = short_windows(t, INTERVAL)
    scenario_config = adaptation_config(equivalent_scenario(t))
    start = [ExecutorInfo(f"{t.metadata.name}-e{i}", capacity=1.0, host="vm") for i in (0, 1)]
    first = {("agg", k): start[k % 2].name for k in range(8)}

    def observed_on(loads: list[float], executors, assignment, room, used, wait) -> AllocationState:
        state = observed(loads, executors, assignment)
        measured = [
            replace(e, cpu_used=used / len(executors), cpu_wait=wait / len(executors)) for e in executors
        ]
        return replace(state, executors=measured, room=room)

    periods = [  # (loads, room on the one host, cores used and waited by our executors)
        ([40.0] * 8, {"vm": 1.0}, 1.9, 0.05),  # 320 % of work: wants 5, the room takes 1 more
        ([40.0] * 8, {"vm": 0.0}, 1.95, 0.1),  # stabilised, then: capacity exhausted
        ([40.0] * 8, {"vm": 0.0}, 1.95, 0.1),
        ([90.0] * 8, {"vm": -1.0}, 1.0, 3.0),  # saturated: contention, not evidence
    ]
    histories = []
    for path in ("operator", "local", "simulator"):
        scaling, executors, assignment = ScalingState(), list(start), dict(first)
        config = scenario_config
        decisions = []
        for period, (loads, room, used, wait) in enumerate(periods):
            state = observed_on(loads, executors, assignment, room, used, wait)
            now = (period + 1) * INTERVAL
            if path == "simulator":
                result = adapt(state, scaling, time=now, window=INTERVAL, config=config, seed=0)
                config = replace(config, policy_config=result.policy_config)
            else:
                spec = t if path == "operator" else local
                result = IN_PROCESS.adapt(spec, state, scaling, now=now, window=INTERVAL, seed=0)
            scaling, executors, assignment = result.scaling_state, result.executors, result.assignment
            decisions.append((result.decision.executors, result.decision.direction, result.capacity.pending))
        histories.append(decisions)
    assert histories[0] == histories[1] == histories[2]
    counts = [d[0] for d in histories[0]]
    assert counts[0] == 3 and max(counts) == 3  # capped at the room: 2 + 1
    assert histories[0][0][2] > 0  # the shortfall is reported
