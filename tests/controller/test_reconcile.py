"""The platform-independent reconcile logic on a recording platform, with real planners and metrics.

References are computed in the tests from the inputs: the units of a spec (operators x key groups), the
hosts of a plan, ALBIC's load distance from scripted busy rates, and the executor count DS2's rule asks
for (ceil(demand / (capacity x target))).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from controller_testkit import MemoryPlatform, ScriptedRuntime, wait_for

from streamtopo.contracts import ExecutorEntry, RoutingTable
from streamtopo.controller.adaptation_loop import AdaptationLoop, LoopMemory, allocation_state
from streamtopo.controller.planner_worker import WorkerPlanner
from streamtopo.controller.platform import ExecutorRates, MetricsUnavailable, RuntimeStats, UnitRates
from streamtopo.controller.reconcile import (
    APPROVE_ANNOTATION,
    IN_PROCESS,
    ConditionChange,
    Planner,
    merge_conditions,
    reconcile,
)
from streamtopo.controller.scrape import ScrapeMetricsSource
from streamtopo.documents import load_topology
from streamtopo.planner.cluster import Cluster, Host
from streamtopo.planner.policy import PlatformPolicy
from streamtopo.planner.scaling.aeolus import aeolus_plan, entry_batch_sizes

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "wordcount.yaml"


def wordcount() -> dict:
    import yaml

    return yaml.safe_load(EXAMPLE.read_text())


def units_of(doc: dict) -> set[str]:
    spec = load_topology(doc).spec
    return {f"{op.name}/{kg}" for op in spec.operators for kg in range(spec.key_groups_of(op.name))}


def test_initial_plan_routes_every_unit_once_on_the_planned_hosts():
    platform = MemoryPlatform(Cluster.uniform(3, 1.5))
    doc = wordcount()
    outcome = reconcile(doc, platform)
    assert len(platform.applied) == 1
    desired = platform.applied[0]
    routing = desired.routing
    assert routing.version == 1
    assert set(routing.units) == units_of(doc)
    # Aeolus asks for ceil(demand / 0.7) executors: more than COLA's PEs, so the heaviest PE is split.
    # Every executor runs on its PE's host and holds every operator of the PE for some key groups.
    spec = load_topology(doc).spec
    demand = aeolus_plan(spec).demand
    assert (
        len(routing.executors) == max(len(outcome.plan.pes), math.ceil(demand / 0.7)) > len(outcome.plan.pes)
    )
    for pe in outcome.plan.pes:
        executors = {
            routing.units[f"{op}/{kg}"] for op in pe.operators for kg in range(spec.key_groups_of(op))
        }
        assert {routing.executors[e].host for e in executors} == {pe.host}
        for executor in executors:
            assert {u.split("/")[0] for u in routing.units if routing.units[u] == executor} == set(
                pe.operators
            )
        # requests cover the PE, each at most one executor's capacity (an executor runs one Spark core)
        assert all(routing.executors[e].cpu <= 1.0 for e in executors)
        assert sum(routing.executors[e].cpu for e in executors) >= min(pe.size, len(executors)) - 1e-9
    heaviest = max(outcome.plan.pes, key=lambda pe: pe.size)
    assert len({routing.units[f"{heaviest.operators[0]}/{kg}"] for kg in range(spec.key_groups)}) == 2
    streams = {f"{i}->{op['name']}" for op in doc["spec"]["operators"] for i in op.get("inputs", [])}
    assert set(routing.batch_sizes) == streams and all(n >= 1 for n in routing.batch_sizes.values())
    assert outcome.status["maxUtilization"] == pytest.approx(outcome.plan.max_utilization, abs=1e-4)
    planned = next(c for c in outcome.conditions if c.type == "Planned")
    assert planned.status == "True"
    assert [e.reason for e in outcome.events] == ["Planned"]


def test_reconcile_with_the_recorded_deployment_changes_nothing():
    platform = MemoryPlatform(Cluster.uniform(3, 1.5))
    first = reconcile(wordcount(), platform)
    again = reconcile(wordcount(), platform, previous=first.desired)
    assert platform.applied[-1] == first.desired  # same routing version, same executors
    assert again.plan is None and again.events == []


def test_spec_change_replans_with_a_newer_version():
    """A change the running state can take (a filter's predicate; one that cannot is refused, see
    test_upgrade_reset.py) stops the executors, re-plans and starts them again with the next routing version."""
    platform = MemoryPlatform(Cluster.uniform(3, 1.5))
    first = reconcile(wordcount(), platform)
    changed = wordcount()
    changed["spec"]["operators"][2]["expr"] = "length(word) > 1"
    second = reconcile(changed, platform, previous=first.desired)
    assert second.desired.routing.version == first.desired.routing.version + 1
    assert set(second.desired.routing.units) == units_of(changed)
    assert [a.topology.spec.suspend for a in platform.applied] == [False, True, False]


def test_suspend_stops_every_executor_and_resume_brings_back_the_same_plan():
    """A pause is not a re-plan: the routing table (version, units, executors) is kept while no executor
    runs, and resuming runs exactly the executors it names again."""
    platform = MemoryPlatform(Cluster.uniform(3, 1.5))
    first = reconcile(wordcount(), platform)
    assert platform.running and set(platform.running) == set(first.desired.routing.executors)
    paused_doc = wordcount()
    paused_doc["spec"]["suspend"] = True
    paused = reconcile(paused_doc, platform, previous=first.desired)
    assert paused.plan is None and paused.desired.routing == first.desired.routing
    assert platform.running == {} and paused.status["executors"] == 0
    resumed = reconcile(wordcount(), platform, previous=paused.desired)
    assert resumed.plan is None and resumed.desired.routing == first.desired.routing
    assert platform.running == {n: e.host for n, e in first.desired.routing.executors.items()}


@pytest.mark.parametrize("pinned", [1, 3])
def test_pinned_replicas_set_the_executor_count_and_albic_balances_within_it(pinned: int):
    """spec.replicas (the scale subresource) overrides the target rule, whose own count here is 2
    (0.81 cores at 70 % of one core each): 3 starts an executor that receives key groups; 1 drains one."""
    loop, _ = albic_loop({}, stabilization="1h")
    loop.topology = loop.topology.model_copy(
        update={"spec": loop.topology.spec.model_copy(update={"replicas": pinned})}
    )
    step = loop.step(0.0)
    assert step.adaptation is not None, step.outcome.conditions
    routing = loop.routing
    active = [n for n, e in routing.executors.items() if not e.draining]
    assert len(active) == pinned
    assert set(routing.assignment().values()) & set(active) == set(active)  # every active one hosts units
    unpinned, _ = albic_loop({}, stabilization="1h")
    assert len(unpinned.routing.executors) == 2 and unpinned.step(0.0).executors_after == 2


def test_a_new_replica_count_is_not_a_re_plan():
    platform = MemoryPlatform(Cluster.uniform(3, 1.5))
    first = reconcile(wordcount(), platform)
    scaled = wordcount()
    scaled["spec"]["replicas"] = 5
    again = reconcile(scaled, platform, previous=first.desired)
    assert again.plan is None and again.desired.routing == first.desired.routing


def test_a_suspended_topology_makes_no_decisions():
    loop, _ = albic_loop({})
    paused = loop.topology.spec.model_copy(update={"suspend": True})
    loop.topology = loop.topology.model_copy(update={"spec": paused})
    step = loop.step(0.0)
    assert step.skipped == "Suspended" and step.adaptation is None and loop.platform.applied == []


def test_invalid_spec_applies_nothing_and_names_the_field():
    platform = MemoryPlatform(Cluster.uniform(3, 1.5))
    doc = wordcount()
    doc["spec"]["operators"][2]["inputs"] = ["nosuch"]
    outcome = reconcile(doc, platform)
    assert platform.applied == []
    planned = next(c for c in outcome.conditions if c.type == "Planned")
    assert planned.status == "False" and planned.reason == "InvalidSpec"
    assert "spec.operators[2].inputs[0]" in planned.message and "nosuch" in planned.message
    assert outcome.events[0].type == "Warning" and "spec.operators[2].inputs[0]" in outcome.events[0].message


def test_udfs_come_only_from_the_platforms_modules():
    """The operator passes the chart's executor.udfModules to the one validator: a UDF from another module is
    refused naming the field and nothing is applied; listed modules (and submodules) plan."""
    doc = wordcount()
    doc["spec"]["operators"].insert(
        3, {"name": "enrich", "kind": "udf", "inputs": ["nonempty"], "function": "team_udfs.words:enrich"}
    )
    doc["spec"]["operators"][4]["inputs"] = ["enrich"]
    refused = MemoryPlatform(Cluster.uniform(3, 1.5))
    planned = next(
        c
        for c in reconcile(doc, refused, policy=PlatformPolicy(udf_modules=("other",))).conditions
        if c.type == "Planned"
    )
    assert refused.applied == [] and planned.reason == "InvalidSpec"
    assert "spec.operators[3].function" in planned.message and "team_udfs.words" in planned.message
    allowed = MemoryPlatform(Cluster.uniform(3, 1.5))
    assert reconcile(doc, allowed, policy=PlatformPolicy(udf_modules=("team_udfs",))).desired is not None
    doc["spec"]["operators"][3]["function"] = "subprocess:run"
    planned = next(
        c
        for c in reconcile(doc, allowed, policy=PlatformPolicy(udf_modules=("subprocess",))).conditions
        if c.type == "Planned"
    )
    assert planned.reason == "InvalidSpec" and "standard library" in planned.message


def test_executor_images_come_only_from_the_platforms_prefixes():
    """The chart's executor.allowedImages: on a platform a spec's image is its runtime image or starts
    with a listed prefix, else it is refused naming spec.image and nothing is applied; a local run (no
    policy) takes any image."""
    doc = wordcount()
    policy = PlatformPolicy(images=("registry.example.com/team-a/",))
    assert reconcile(doc, MemoryPlatform(Cluster.uniform(3, 1.5)), policy=policy).desired is not None
    doc["spec"]["image"] = "docker.io/someone/miner:latest"
    refused = MemoryPlatform(Cluster.uniform(3, 1.5))
    planned = next(c for c in reconcile(doc, refused, policy=policy).conditions if c.type == "Planned")
    assert refused.applied == [] and planned.reason == "InvalidSpec"
    assert "spec.image" in planned.message and "registry.example.com/team-a/" in planned.message
    doc["spec"]["image"] = "registry.example.com/team-a/runtime:2"
    assert reconcile(doc, MemoryPlatform(Cluster.uniform(3, 1.5)), policy=policy).desired is not None
    doc["spec"]["image"] = "docker.io/someone/miner:latest"
    assert reconcile(doc, MemoryPlatform(Cluster.uniform(3, 1.5))).desired is not None


def test_a_plan_over_the_time_limit_is_refused_and_the_worker_replaced():
    """Bounded work per tenant: a planning call longer than the limit (here shorter than starting the worker)
    is refused as NoValidPlan, its worker killed, and the next request plans on a fresh worker."""
    worker = WorkerPlanner(tasks_per_child=10, timeout=0.001)
    try:
        platform = MemoryPlatform(Cluster.uniform(3, 1.5))
        outcome = reconcile(wordcount(), platform, planner=worker)
        planned = next(c for c in outcome.conditions if c.type == "Planned")
        assert platform.applied == [] and planned.reason == "NoValidPlan"
        assert "did not finish within 0.001s" in planned.message
        worker.timeout = 120.0
        assert reconcile(wordcount(), platform, planner=worker).desired is not None
    finally:
        worker.shutdown()


def test_lost_host_triggers_a_replan_off_that_host():
    platform = MemoryPlatform(Cluster.uniform(3, 1.5))
    first = reconcile(wordcount(), platform)
    used = sorted({e.host for e in first.desired.executors.values()})
    lost = used[0]
    platform.cluster = Cluster(
        hosts=[h for h in platform.cluster.hosts if h.name != lost] + [Host(name="host-9", cpu=1.5)]
    )
    second = reconcile(wordcount(), platform, previous=first.desired)
    assert second.plan is not None and second.desired.routing.version == 2
    assert lost not in {e.host for e in second.desired.executors.values()}


def test_condition_transition_time_moves_only_when_the_status_flips():
    first = merge_conditions([], [ConditionChange("Ready", "False", "Pending")], now="t1", generation=1)
    same = merge_conditions(
        first, [ConditionChange("Ready", "False", "StillPending")], now="t2", generation=1
    )
    flipped = merge_conditions(same, [ConditionChange("Ready", "True", "Running")], now="t3", generation=2)
    assert same[0]["lastTransitionTime"] == "t1" and same[0]["reason"] == "StillPending"
    assert flipped[0]["lastTransitionTime"] == "t3" and flipped[0]["observedGeneration"] == 2


def test_allocation_state_uses_busy_time_and_refuses_partial_windows():
    topology = load_topology(scenario_topology())
    routing = initial_routing()
    stats = RuntimeStats(
        topology="hot",
        window_seconds=60.0,
        units={
            u: UnitRates(busy=0.05 * (i + 1), records_in=100.0, state_bytes=2048.0)
            for i, u in enumerate(sorted(routing.assignment()))
        },
    )
    state = allocation_state(stats, routing, topology.spec, two_hosts())
    by_id = {kg.id: kg for kg in state.key_groups}
    for i, unit in enumerate(sorted(routing.assignment())):
        assert by_id[unit].load == pytest.approx(100 * 0.05 * (i + 1))
        assert by_id[unit].migration_cost == 2048.0
    partial = RuntimeStats(topology="hot", window_seconds=60.0, units=dict(list(stats.units.items())[:3]))
    with pytest.raises(MetricsUnavailable) as why:
        allocation_state(partial, routing, topology.spec, two_hosts())
    assert why.value.reason == "MetricsIncomplete"


# ------------------------------------------------------------------------------ the SPL loop


def scenario_topology(max_migrations: int = 4) -> dict:
    """Two keyed operators of 8 key groups; the SPL is 5 minutes so one period fills the scaling rule's
    metric window (the test calls ``step`` itself, seconds apart: the rates are scripted constants)."""
    return {
        "metadata": {"name": "hot"},
        "spec": {
            "keyGroups": 8,
            "operators": [
                {"name": "src", "kind": "source", "source": {"generator": "sequence", "ratePerSecond": 1000}},
                {
                    "name": "agg",
                    "kind": "aggregate",
                    "inputs": ["src"],
                    "keyBy": ["key"],
                    "window": {"size": "10s"},
                    "aggregations": ["count(*) AS n"],
                },
                {"name": "out", "kind": "sink", "inputs": ["agg"], "sink": {"console": {}}, "keyGroups": 1},
            ],
            "autoscaling": {
                "interval": "5m",
                "stabilization": "0s",
                "scaleDownDelay": "1h",
                "maxMigrationsPerRound": max_migrations,
                "targetUtilization": 0.7,
                "maxExecutors": 6,
            },
        },
    }


def two_hosts() -> Cluster:
    return Cluster(hosts=[Host(name="node-a", cpu=8.0), Host(name="node-b", cpu=8.0)])


def initial_routing() -> RoutingTable:
    """hot-e0 on node-a holds src and out, hot-e1 on node-b holds agg."""
    units = {f"src/{kg}": "hot-e0" for kg in range(8)} | {f"agg/{kg}": "hot-e1" for kg in range(8)}
    units["out/0"] = "hot-e0"
    return RoutingTable(
        topology="hot",
        version=1,
        units=units,
        executors={
            "hot-e0": ExecutorEntry(host="node-a", cpu=1.0),
            "hot-e1": ExecutorEntry(host="node-b", cpu=1.0),
        },
    )


def load_distance(busy: dict, assignment: dict, executors: list[str]) -> float:
    """ALBIC's load distance: max |load_i - ceil(mean)| over executors, loads in percent of a core."""
    loads = {e: 0.0 for e in executors}
    for unit, owner in assignment.items():
        loads[owner] += 100 * busy.get(unit, 0.0)
    mean = math.ceil(sum(loads.values()) / len(loads))
    return max(abs(v - mean) for v in loads.values())


def make_loop(scripted_runtime, source_factory=None):
    topology = load_topology(scenario_topology())
    platform = MemoryPlatform(two_hosts())
    routing = initial_routing()

    def owner():
        return (platform.applied[-1].routing if platform.applied else routing).assignment()

    runtime: ScriptedRuntime = scripted_runtime("hot", sorted(routing.executors), owner)
    source = source_factory(runtime) if source_factory else ScrapeMetricsSource(runtime.endpoints)
    return AdaptationLoop(platform, source, topology, routing=routing), platform, runtime


def skewed(scale: float = 1.0) -> dict:
    """agg (on hot-e1) is hot, src (on hot-e0) is light: hot-e1 runs above one core."""
    busy = {("src", kg): 0.02 * scale for kg in range(8)} | {("agg", kg): 0.15 * scale for kg in range(8)}
    busy[("out", 0)] = 0.01 * scale
    return busy


def settled_step(loop: AdaptationLoop, runtime: ScriptedRuntime, warm: float = 1.5):
    """A step after one full scrape interval (the direct-scrape source needs two samples)."""
    first = loop.step(time.time())
    assert first.skipped == "WarmingUp" or first.skipped is None
    time.sleep(warm)
    return loop.step(time.time())


def test_loop_rebalances_skew_within_the_migration_budget(scripted_runtime):
    pytest.importorskip(
        "streamtopo.planner.rebalance.registry", reason="the REBALANCERS registry has not landed"
    )
    loop, platform, runtime = make_loop(scripted_runtime)
    busy = skewed(0.5)  # 0.62 cores in total: the rule keeps two executors
    runtime.set_rates(busy, records_per_busy_second=10_000)
    before = loop.routing.assignment()
    result = settled_step(loop, runtime)
    assert result.skipped is None, result.outcome.conditions
    moves = result.adaptation.rebalance.migrations
    assert 0 < len(moves) <= 4
    assert platform.applied and platform.applied[-1].routing.version == 2
    after = platform.applied[-1].routing.assignment()
    executors = sorted(platform.applied[-1].routing.executors)
    assert executors == ["hot-e0", "hot-e1"]
    assert load_distance(busy, after, executors) < load_distance(busy, before, executors)
    assert {m[0] for m in moves} == {u for u in after if after[u] != before[u]}
    report = next(e for e in result.outcome.events if e.reason == "RebalanceReport")
    assert f"{len(moves)} key groups moved" in report.message and "hot-e1" in report.message


def test_loop_scales_out_to_the_count_the_target_rule_needs(scripted_runtime):
    pytest.importorskip(
        "streamtopo.planner.rebalance.registry", reason="the REBALANCERS registry has not landed"
    )
    loop, platform, runtime = make_loop(scripted_runtime)
    # 2.47 cores of work on 2 one-core executors: ceil(2.47 / 0.7) = 4, midway between two counts, so a
    # rate scraped a few percent off (the exporter's clock against the scraper's) decides the same
    busy = skewed(1.8)
    runtime.set_rates(busy, records_per_busy_second=10_000)
    result = settled_step(loop, runtime)
    demand = sum(busy.values())
    wanted = min(6, math.ceil(demand / (1.0 * 0.7) - 1e-9))
    assert result.executors_after == wanted, result.outcome.conditions
    routing = platform.applied[-1].routing
    added = sorted(set(routing.executors) - {"hot-e0", "hot-e1"})
    assert len(added) == wanted - 2 and all(routing.executors[e].host in ("node-a", "node-b") for e in added)
    assert set(routing.assignment().values()) & set(added), "new executors receive key groups (line 7)"
    scaling = next(e for e in result.outcome.events if e.reason == "ScalingReport")
    assert f"executors 2 -> {wanted}" in scaling.message


def test_loop_skips_when_an_executor_cannot_be_scraped(scripted_runtime):
    loop, platform, runtime = make_loop(scripted_runtime)
    runtime.set_rates(skewed(), records_per_busy_second=10_000)
    loop.step(time.time())
    wait_for(lambda: True)
    runtime.close()  # every exporter goes away
    result = loop.step(time.time())
    assert result.skipped == "ScrapeFailed" and platform.applied == []
    degraded = next(c for c in result.outcome.conditions if c.type == "Degraded")
    assert degraded.status == "True" and "no rebalancing or scaling" in degraded.message


@dataclass
class StatsSource:
    """A MetricsSource that reports the stats a test sets: the loop's decisions on exact traffic."""

    stats: RuntimeStats

    def collect(self, topology: str, window_seconds: float) -> RuntimeStats:
        return self.stats


def hot_pair_stats(hot: float, busy: float = 0.05) -> RuntimeStats:
    """Even load; src/0 sends ``hot`` records/s to agg/0 and 10 to every other agg key group, and the
    other src units spread 10 records/s evenly. ALBIC's Step 1 makes (src/0, agg/0) a candidate when
    hot > avg * sF, avg = (hot + 70) / 8 (Algorithm 2, lines 2-12)."""
    units = {("src", kg): UnitRates(busy=busy, records_in=100.0) for kg in range(8)}
    units |= {("agg", kg): UnitRates(busy=busy, records_in=100.0) for kg in range(8)}
    units[("out", 0)] = UnitRates(busy=0.01, records_in=10.0)
    traffic = {(("src", i), ("agg", j)): 10.0 for i in range(8) for j in range(8)}
    traffic[(("src", 0), ("agg", 0))] = hot
    return RuntimeStats(topology="hot", window_seconds=300.0, units=units, traffic=traffic)


def albic_loop(
    albic: dict, planner: Planner = IN_PROCESS, **autoscaling: str
) -> tuple[AdaptationLoop, StatsSource]:
    doc = scenario_topology()
    doc["spec"]["autoscaling"] |= {"albic": albic, **autoscaling}
    source = StatsSource(hot_pair_stats(1000.0))
    return AdaptationLoop(
        MemoryPlatform(two_hosts()), source, load_topology(doc), routing=initial_routing(), planner=planner
    ), source


@pytest.fixture(params=["in-process", "worker"])
def planner(request) -> Iterator[Planner]:
    """Where rounds are computed: in process (``streamtopo run``) or, as the operator does, in a worker
    process replaced after every call (so nothing survives a round there)."""
    if request.param == "in-process":
        yield IN_PROCESS
        return
    worker = WorkerPlanner(tasks_per_child=1)
    try:
        yield worker
    finally:
        worker.shutdown()


HOT_PAIR = (("src", 0), ("agg", 0))


def test_albic_spec_fields_change_the_loops_decisions(planner: Planner):
    """spec.autoscaling.albic reaches Algorithm 2: with the paper's sF = 1.5 the hot pair is collocated;
    with sF above hot / avg (1000 / 133.75 = 7.5) no pair qualifies; with maxPL = 0 no set is kept whole."""
    default = albic_loop({}, planner)[0].step(0.0).adaptation
    assert default is not None and HOT_PAIR in default.rebalance.details["collocation_constraints"]
    assert default.assignment[HOT_PAIR[0]] == default.assignment[HOT_PAIR[1]]
    strict = albic_loop({"scoreFactor": 8.0}, planner)[0].step(0.0).adaptation
    assert strict is not None and strict.rebalance.details["collocation_constraints"] == []
    assert strict.rebalance.details["new_constraints"] == []
    no_sets = albic_loop({"maxPartitionLoad": 0, "maxLoadDistance": 0}, planner)[0].step(0.0).adaptation
    assert no_sets is not None and no_sets.rebalance.details["max_partition_load"] == 0


def test_albic_collocations_persist_across_rounds(planner: Planner):
    """A pair collocated in one round stays a collocation while it still exchanges data, though its score
    fell below the threshold (the paper's "existing colocated key group pairs"): the loop passes the
    round's policy state into the next."""
    loop, source = albic_loop({}, planner)
    first = loop.step(0.0).adaptation
    assert first is not None and HOT_PAIR in first.rebalance.details["collocation_constraints"]
    source.stats = hot_pair_stats(10.0)  # the pair's traffic is now like every other pair's
    second = loop.step(300.0).adaptation
    assert second is not None and HOT_PAIR in second.rebalance.details["collocation_constraints"]
    fresh, fresh_source = albic_loop({}, planner)
    fresh_source.stats = hot_pair_stats(10.0)
    forgetful = fresh.step(0.0).adaptation  # the same stats without the carried state: nothing to keep
    assert forgetful is not None and forgetful.rebalance.details["collocation_constraints"] == []


def restarted(loop: AdaptationLoop, stats: RuntimeStats) -> AdaptationLoop:
    """A new loop (an operator restart) from what ``loop`` last applied: routing table and memory."""
    written = loop.platform.applied[-1]
    fresh = AdaptationLoop(
        MemoryPlatform(two_hosts()), StatsSource(stats), loop.topology, routing=written.routing
    )
    fresh.restore(written.memory)
    return fresh


def test_a_restarted_loop_keeps_the_stabilisation_window_and_the_decisions():
    """What a loop applies carries its memory; a loop restored from it holds the stabilisation window
    the first one opened, where a loop without the memory scales at once."""
    first, source = albic_loop({}, stabilization="1h")
    source.stats = hot_pair_stats(1000.0, busy=0.2)  # 3.21 cores: 5 executors at 70 %
    assert first.step(0.0).executors_after == 5
    written = first.platform.applied[-1]
    assert written.routing == first.routing and written.memory is not None
    memory = LoopMemory.from_json(written.memory)
    assert memory == first.memory and memory.scaling.last_change == 0.0
    assert [(d["kind"], d["executorsBefore"], d["executorsAfter"]) for d in memory.decisions] == [
        ("rebalance+scale-up", 2, 5)
    ]
    hotter = hot_pair_stats(1000.0, busy=0.3)  # 4.81 cores: 7 wanted, 6 at most
    again = restarted(first, hotter)
    assert again.memory == memory
    held = again.step(300.0)
    assert held.executors_after == 5 and "stabilising" in held.adaptation.decision.reason
    forgetful = AdaptationLoop(
        MemoryPlatform(two_hosts()), StatsSource(hotter), first.topology, routing=written.routing
    )
    assert forgetful.step(300.0).executors_after == 6


def test_a_restarted_loop_keeps_albics_collocations():
    first, _ = albic_loop({})
    assert HOT_PAIR in first.step(0.0).adaptation.rebalance.details["collocation_constraints"]
    assert HOT_PAIR in LoopMemory.from_json(first.platform.applied[-1].memory).collocations
    second = restarted(first, hot_pair_stats(10.0)).step(300.0)  # the pair is no longer hot: kept anyway
    assert HOT_PAIR in second.adaptation.rebalance.details["collocation_constraints"]


def test_an_unreadable_memory_starts_fresh():
    for text in (None, "", "{not json", '{"scaling": {"nosuch": 1}}', '{"collocations": [[1]]}'):
        assert LoopMemory.from_json(text) == LoopMemory()


def test_recommend_mode_applies_nothing_until_its_decision_is_approved():
    """Recommend computes what Auto would apply, publishes it with an id and applies it only on approval,
    once; an unknown id changes nothing."""
    loop, _ = albic_loop({}, mode="Recommend")
    platform = loop.platform
    step = loop.step(0.0)
    assert platform.applied == [] and loop.routing.version == 1 and step.applied is False
    pending = loop.pending
    summary = step.outcome.status["recommendation"]
    assert pending is not None and summary["id"] == pending.id and summary["approved"] is False
    assert summary["migrations"] == len(step.adaptation.migrations) > 0 and summary["routingVersion"] == 1
    event = next(e for e in step.outcome.events if e.reason == "Recommendation")
    assert pending.id in event.message and f"{APPROVE_ANNOTATION}={pending.id}" in event.message
    auto, _ = albic_loop({}, mode="Auto")
    auto.step(0.0)
    assert pending.routing == auto.routing and auto.routing.version == 2  # the decision Auto applies
    assert loop.approve("0123456789ab") is None and platform.applied == []
    approved = loop.approve(pending.id)
    assert approved is not None and approved.applied
    assert [d.routing for d in platform.applied] == [pending.routing] and loop.routing == pending.routing
    assert any(e.reason == "RecommendationApproved" for e in approved.outcome.events)
    assert approved.outcome.status["recommendation"]["approved"] is True
    assert loop.approve(pending.id) is None and len(platform.applied) == 1  # once


def test_a_recommendation_for_an_older_routing_version_is_not_applied():
    loop, _ = albic_loop({}, mode="Recommend")
    loop.step(0.0)
    pending = loop.pending
    assert pending is not None
    loop.routing = loop.routing.moved(loop.routing.assignment())  # re-planned meanwhile: v2, as it was
    stale = loop.approve(pending.id)
    assert stale is not None and stale.skipped == "RecommendationStale" and loop.platform.applied == []
    assert any(e.type == "Warning" and pending.id in e.message for e in stale.outcome.events)


def test_a_recommendation_a_newer_period_replaced_stays_approvable_until_the_routing_changes():
    """A user approves the id they read; by then a newer period may have published another decision
    (the metrics moved). The one approved is applied, once; the other, made for the routing replaced
    since, is then stale; a decision older than the last RECOMMENDATIONS_KEPT is forgotten."""
    from streamtopo.controller.adaptation_loop import RECOMMENDATIONS_KEPT

    loop, source = albic_loop({}, mode="Recommend")
    loop.step(0.0)
    first = loop.pending
    source.stats = hot_pair_stats(1000.0, busy=0.2)
    loop.step(1.0)
    second = loop.pending
    assert first is not None and second is not None and first.id != second.id
    assert loop.approvable(first.id) and loop.approvable(second.id)
    approved = loop.approve(first.id)
    assert approved is not None and approved.applied and loop.routing == first.routing
    assert [d.routing for d in loop.platform.applied] == [first.routing]
    assert not loop.approvable(first.id) and loop.approve(first.id) is None  # once
    stale = loop.approve(second.id)
    assert stale is not None and stale.skipped == "RecommendationStale" and len(loop.platform.applied) == 1

    recent: list[str] = []  # ids by their last decision, oldest first; the hot pair moves around
    for n, (i, j) in enumerate((i, j) for i in range(8) for j in range(8)):
        traffic = dict(hot_pair_stats(10.0).traffic) | {(("src", i), ("agg", j)): 1000.0}
        source.stats = replace(hot_pair_stats(10.0), traffic=traffic)
        loop.step(2.0 + n)
        if loop.pending is not None:
            recent = [d for d in recent if d != loop.pending.id] + [loop.pending.id]
    assert len(recent) > RECOMMENDATIONS_KEPT
    assert list(loop.recommended) == recent[-RECOMMENDATIONS_KEPT:]
    assert not loop.approvable(recent[0]) and loop.approve(recent[0]) is None


# ----------------------------------------------------------------------------- Kubernetes rendering


def measured_src(ppt: float, busy: float = 0.05) -> RuntimeStats:
    """Even load; every src unit takes 100 records/s at ``ppt`` seconds per record."""
    units = {("src", kg): UnitRates(busy=ppt * 100.0, records_in=100.0) for kg in range(8)}
    units |= {("agg", kg): UnitRates(busy=busy, records_in=100.0) for kg in range(8)}
    units[("out", 0)] = UnitRates(busy=0.01, records_in=10.0)
    return RuntimeStats(topology="hot", window_seconds=300.0, units=units, traffic={})


def test_batch_sizes_follow_the_measured_processing_times_each_period():
    """Aeolus Eq. 4 on the measured ppt of src: at 1,000 records/s and one task (Eq. 2: ppt * r < 1),
    l_i = 1 ms, so the slack l_i - ppt - t*s = 2.5 ns gives b = ceil(n / slack) = ceil(2 us / 2.5 ns) = 800
    records per entry on src->agg, above the 512 default and below B_max / t = 65536 / 64 = 1024."""
    topology = load_topology(scenario_topology())
    applied = entry_batch_sizes(topology.spec)
    assert applied["src->agg"] == 512  # the declared (default) costs: Eq. 4 says 1, the floor says 512
    routing = initial_routing().moved(initial_routing().assignment(), batch_sizes=applied)
    slack = 2.5e-9
    ppt = 1e-3 - 64 * 5e-9 - slack
    source = StatsSource(measured_src(ppt))
    platform = MemoryPlatform(two_hosts())
    loop = AdaptationLoop(platform, source, topology, routing=routing)
    step = loop.step(1000.0)
    resized = platform.applied[-1].routing
    assert abs(resized.batch_sizes["src->agg"] - 800) <= 1
    assert {k: v for k, v in resized.batch_sizes.items() if k != "src->agg"} == {
        k: v for k, v in applied.items() if k != "src->agg"
    }
    assert resized.version == routing.version + 1 and step.applied
    assert any(
        e.reason == "BatchSizesChanged" and "src->agg 512 -> 80" in e.message for e in step.outcome.events
    )
    # the same measurement again, and one within the 25 % tolerance: the sizes stay, no new version
    for again in (ppt, 1e-3 - 64 * 5e-9 - 2.2e-9):  # b = 910, 14 % above 800
        source.stats = measured_src(again)
        loop.step(2000.0)
        assert loop.routing is not None and loop.routing.batch_sizes == resized.batch_sizes


def profiled_stats() -> RuntimeStats:
    """What the NONE deployment measured: light operators (0.17 busy cores), src -> agg all-to-all at 125
    records/s per pair, and executors using 0.8008 cores more than their operators: 1e-4 CPU-seconds per
    crossing record (8,008 records/s cross)."""
    units = {(op, kg): UnitRates(busy=0.01, records_in=100.0) for op in ("src", "agg") for kg in range(8)}
    units[("out", 0)] = UnitRates(busy=0.01, records_in=10.0)
    traffic = {(("src", i), ("agg", j)): 125.0 for i in range(8) for j in range(8)}
    traffic |= {(("agg", i), ("out", 0)): 1.0 for i in range(8)}
    executors = {"hot-e0": ExecutorRates(cpu=0.5), "hot-e1": ExecutorRates(cpu=0.4708)}
    return RuntimeStats("hot", 300.0, units=units, traffic=traffic, executors=executors)


def test_the_loop_runs_colas_profiling_iterations_then_albic():
    """spec.fusion.profileIterations = 2: NONE first (one executor per operator), then one COLA re-plan
    per period on the measured costs (gamma 0.5, then 0.6), executors keeping their names where they keep
    units; the memory counts the iterations across a restart; then ALBIC's periods as usual."""
    doc = scenario_topology()
    doc["spec"]["fusion"] = {"profileIterations": 2}
    topology = load_topology(doc)
    platform = MemoryPlatform(two_hosts())
    source = StatsSource(profiled_stats())
    loop = AdaptationLoop(platform, source, topology)
    loop.step(0.0)
    none = platform.applied[-1].routing
    owners = {
        op: {none.units[f"{op}/{kg}"] for kg in range(topology.spec.key_groups_of(op))}
        for op in ("src", "agg")
    }
    assert len(none.executors) == 3 and all(len(e) == 1 for e in owners.values())  # NONE: one per operator
    first = loop.step(300.0)
    assert first.profile is not None and "iteration 1 of 2 (gamma 0.5)" in first.profile
    fused = platform.applied[-1].routing
    assert fused.version == none.version + 1
    assert len(fused.executors) == 1  # 0.17 measured cores and 1,000 records/s between src and agg: one PE
    # the fused executor keeps the name of one it took most units from (src's or agg's, 8 each)
    assert set(fused.executors) <= set(none.executors)
    assert [e.reason for e in first.outcome.events] == ["ProfileIteration"]
    assert len(first.outcome.status["pes"]) == 1 and first.outcome.status["routingVersion"] == fused.version
    assert loop.memory.profiled == 1 and loop.decisions[-1]["kind"] == "profile"
    # the crossing cost is measured on NONE, where every arc crosses, and kept for the next iterations
    assert loop.memory.crossing_cost == pytest.approx(0.8008 / 8008)
    restarted = AdaptationLoop(platform, source, topology, routing=fused)
    restarted.restore(platform.applied[-1].memory)
    assert restarted.memory.crossing_cost == pytest.approx(1e-4)
    second = restarted.step(600.0)
    assert second.profile is not None and "iteration 2 of 2 (gamma 0.6)" in second.profile
    assert restarted.memory.crossing_cost == pytest.approx(1e-4)  # fused, nothing crosses: not re-measured
    third = restarted.step(900.0)
    assert third.profile is None and restarted.memory.profiled == 2  # ALBIC from now on


def test_rendered_objects_are_valid_kubernetes_and_keep_ha_replicas_apart():
    """The HA example on its cluster: every object passes Kubernetes 1.30's schema (strict), and every
    pod carrying an HA replica refuses nodes running another replica of the same group."""
    import kubernetes_validate

    from streamtopo.controller.rendering import render
    from streamtopo.documents import load_cluster

    root = EXAMPLE.parents[1]
    platform = MemoryPlatform(load_cluster(root / "examples/clusters/small.yaml"))
    outcome = reconcile(yaml_doc(root / "examples/ha-pipeline.yaml"), platform)
    assert outcome.desired is not None, outcome.conditions
    owner = {"metadata": {"name": "ha-vwap", "uid": "0b5c2f3e-0000-4000-8000-000000000001"}}
    objects = render(outcome.desired, "prod", owner)
    for obj in objects:
        kubernetes_validate.validate(obj, "1.30", strict=True)
    pods = [o for o in objects if o["kind"] == "Pod"]
    assert len(pods) == len(outcome.desired.executors)
    routing = outcome.desired.routing
    assert {p["metadata"]["labels"].get("ha.streamtopo.dev/g0") for p in pods} >= {"0", "1"}
    for pod in pods:
        name = pod["metadata"]["name"]
        replicas = {
            u.split("/")[0].partition("~r")[2] or "0"
            for u, e in routing.units.items()
            if e == name and u.split("/")[0].split("~r")[0] in {"valid", "vwap", "price"}
        }
        label = pod["metadata"]["labels"].get("ha.streamtopo.dev/g0")
        if len(replicas) == 1:
            assert label == replicas.pop()
            terms = pod["spec"]["affinity"]["podAntiAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"
            ]
            assert any(
                {"key": "ha.streamtopo.dev/g0", "operator": "NotIn", "values": [label]}
                in t["labelSelector"]["matchExpressions"]
                for t in terms
            )
        host = routing.executors[name].host
        selector = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert selector["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == [host]


def yaml_doc(path: Path) -> dict:
    import yaml

    return yaml.safe_load(path.read_text())


@pytest.mark.parametrize("rate", [50.0, 200_000.0])
def test_local_run_and_operator_route_alike(rate):
    """The same topology and cluster: `streamtopo run`'s routing v1 and the operator's name the same
    executors (``<topology>-e<i>``), give them the same units, and cut streams into the same entry sizes
    (one batching rule, planner.scaling.aeolus.entry_batch_sizes), at a rate where Aeolus alone would say 1."""
    from streamtopo.local.start import initial_routing
    from streamtopo.planner.model import StreamTopology

    doc = wordcount()
    for op in doc["spec"]["operators"]:
        if op["kind"] == "source":
            op["source"]["ratePerSecond"] = rate
    doc["spec"]["executor"] = {"resources": {"cpu": 1}}  # a local executor requests one core
    cluster = Cluster.uniform(3, 1.5)
    platform = MemoryPlatform(cluster)
    reconcile(doc, platform)
    operator_routing = platform.applied[0].routing
    local_routing = initial_routing(StreamTopology.model_validate(doc), cluster, None).routing
    assert local_routing.batch_sizes == operator_routing.batch_sizes
    assert local_routing.units == operator_routing.units
    assert all(n >= 2 for n in local_routing.batch_sizes.values())


def failing_loop() -> tuple[AdaptationLoop, MemoryPlatform, dict, StatsSource]:
    """The hot scenario with a 10-minute failure grace; only hot-e0's units report (src, out), as when
    hot-e1's pod fails and exports nothing."""
    doc = scenario_topology(max_migrations=10)
    doc["spec"]["autoscaling"]["failureGrace"] = "10m"
    platform = MemoryPlatform(two_hosts())
    measured = {("src", kg): UnitRates(busy=0.05, records_in=100.0) for kg in range(8)}
    measured[("out", 0)] = UnitRates(busy=0.01, records_in=10.0)
    source = StatsSource(RuntimeStats(topology="hot", window_seconds=300.0, units=measured, traffic={}))
    return (
        AdaptationLoop(platform, source, load_topology(doc), routing=initial_routing()),
        platform,
        doc,
        source,
    )


def test_a_crash_looping_executor_loses_its_key_groups_after_the_grace_period():
    """hot-e1 crash-loops (kubelet's reason through the platform) and reports nothing: within
    autoscaling.failureGrace the loop waits (a restart may cure it; no unit moves to or from it); past
    it, hot-e1 is marked for removal and ALBIC, with its units' loads estimated from the measured ones,
    moves every one of its key groups to running executors, with a Warning naming it and the reason."""
    loop, platform, _, _ = failing_loop()
    platform.failing = {"hot-e1": "CrashLoopBackOff (Error)"}

    first = loop.step(0.0)
    agg = {("agg", kg) for kg in range(8)}
    assert first.skipped == "ExecutorFailing"  # within the grace period: nothing moves on its account
    assert all(loop.routing.owner(u) == "hot-e1" for u in agg)
    assert not [e for e in first.outcome.events if e.reason == "ExecutorLost"]

    second = loop.step(700.0)
    assert second.applied
    assert not loop.routing.units_of("hot-e1")
    assert all(loop.routing.owner(u) != "hot-e1" for u in agg)
    (lost,) = [e for e in second.outcome.events if e.reason == "ExecutorLost"]
    assert lost.type == "Warning" and "hot-e1" in lost.message and "CrashLoopBackOff" in lost.message
    assert platform.applied[-1].routing == loop.routing

    platform.failing = {}
    loop.step(1400.0)
    assert loop.failing_since == {}  # running again: a later failure starts a new grace period


def test_the_failure_grace_period_survives_an_operator_restart():
    """The time an executor was first seen failing is written with the routing table: a loop restored
    from it (a restarted operator) moves the key groups when the original grace period ends, not a
    whole grace period after the restart."""
    loop, platform, doc, source = failing_loop()
    platform.failing = {"hot-e1": "ImagePullBackOff"}
    assert loop.step(1000.0).skipped == "ExecutorFailing"
    written = platform.applied[-1]
    assert written.routing == initial_routing() and '"failing": {"hot-e1": 1000.0}' in written.memory

    restarted = AdaptationLoop(platform, source, load_topology(doc), routing=written.routing)
    restarted.restore(written.memory)
    assert restarted.step(1700.0).applied  # 700 s after the first sighting, not after the restart
    assert not restarted.routing.units_of("hot-e1")


def test_a_stored_topology_is_validated_once_per_generation(monkeypatch):
    """The operator reads every topology on each tick: its spec is validated once per uid and generation
    (issue 32: validation cost), and a new generation is validated again."""
    from streamtopo.controller import reconcile as module
    from streamtopo.planner.model import TopologyError

    calls = []
    real = module.load_topology
    monkeypatch.setattr(module, "load_topology", lambda *a, **k: calls.append(1) or real(*a, **k))
    doc = wordcount()
    doc["metadata"].update(uid="u-1", generation=1)
    for _ in range(3):
        assert module.admit(doc, None).metadata.name == doc["metadata"]["name"]
    assert len(calls) == 1
    doc["metadata"]["generation"] = 2
    doc["spec"]["operators"][0]["name"] = "Bad Name!"
    for _ in range(2):
        with pytest.raises(TopologyError):
            module.admit(doc, None)
    assert len(calls) == 2
