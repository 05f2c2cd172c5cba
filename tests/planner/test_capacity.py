"""Capacity: hosts' room caps the first deployment and the scaling rule; saturation is not evidence;
an over-provisioned saturated host scales down; ineffective scale-ups stop; rounds within noise are
skipped (planner/capacity.py, planner/deployment.py, planner/scaling/policy.py, planner/adaptation.py)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from streamtopo.documents import load_topology
from streamtopo.planner.adaptation import AdaptationConfig, adapt
from streamtopo.planner.allocation import AllocationState, ExecutorInfo, KeyGroupStats
from streamtopo.planner.capacity import (
    booked_room,
    footprint,
    free_cores,
    place,
    placeable,
    planned_shortfall,
)
from streamtopo.planner.cluster import Cluster, Host
from streamtopo.planner.deployment import deployment
from streamtopo.planner.placement.fusion import plan_topology
from streamtopo.planner.scaling.aeolus import aeolus_plan, initial_executors
from streamtopo.planner.scaling.policy import (
    HostLoad,
    ScalingConfig,
    ScalingObservation,
    ScalingState,
    decide_target,
    overprovisioned,
)

ROOT = Path(__file__).resolve().parents[2]


def test_room_is_cpu_less_other_pods_and_own_executors_and_placement_spreads():
    cluster = Cluster(hosts=[Host(name="a", cpu=4.0), Host(name="b", cpu=2.0)])
    room = free_cores(cluster, own=[("a", 1.0), ("a", 1.0), (None, 5.0)], committed={"b": 1.5, "gone": 9})
    assert room == {"a": 2.0, "b": 0.5}
    assert placeable(1.0, room) == 2 and placeable(0.5, room) == 5
    hosts, left = place([1.0, 1.0, 1.0], room)
    assert hosts == ["a", "a", None] and left == {"a": 0.0, "b": 0.5}
    # a preferred host that fits wins; one that does not falls back to the roomiest
    assert place([0.5, 1.0], room, prefer=["b", "b"])[0] == ["b", "a"]
    with pytest.raises(ValueError, match="cpu must be > 0"):
        placeable(0.0, room)


def test_a_shortfall_says_what_is_missing():
    short = planned_shortfall(wanted=14, placed=2, executor_cpu=1.0, demand=9.5, available=2.0, rate=100_000)
    assert short.pending == 12 and short.cores_missing == 12.0 and short.exhausted
    assert short.rate_carried == pytest.approx(100_000 * 2 / 9.5)  # the placed cores at full utilisation
    text = short.message()
    assert "14 executors of 1 core;" in text and "12 pending, 12.00 cores missing" in text
    assert "100.0k records/s demanded, 21.1k carried" in text
    assert short.status()["pendingExecutors"] == 12
    enough = planned_shortfall(wanted=2, placed=2, executor_cpu=1.0, demand=1.0, available=4.0, rate=10.0)
    assert not enough.exhausted and enough.rate_carried == 10.0


def vwap():
    return load_topology(ROOT / "examples/vwap.yaml")


def test_vwap_at_its_declared_rates_on_two_cores_starts_what_fits_and_says_what_it_needs():
    """The issue's case: U = 3.85 on one 2-core host. Aeolus wants 14 executors; two of one core fit."""
    topology = vwap()
    machine = Cluster(hosts=[Host(name="vm", cpu=2.0)])
    plan = plan_topology(topology.spec, machine)
    scaling = ScalingConfig(min_executors=2, max_executors=16)
    planned = deployment(plan, topology.spec, "vwap", scaling, replicas=False, cpu=1.0, room={"vm": 2.0})
    wanted = initial_executors(aeolus_plan(topology.spec), scaling)
    assert wanted == math.ceil(aeolus_plan(topology.spec).demand / 0.7) > 10
    assert len(planned.executors) == 2 and {e.host for e in planned.executors.values()} == {"vm"}
    assert sum(e.cpu for e in planned.executors.values()) <= 2.0
    capacity = planned.capacity
    assert capacity is not None and capacity.exhausted
    assert (capacity.executors_wanted, capacity.executors_placed) == (wanted, 2)
    assert capacity.cores_missing == wanted - 2
    assert capacity.rate_demanded == pytest.approx(100_000.0)
    # every unit is routed, to one of the two
    units = {
        (op.name, kg) for op in topology.spec.operators for kg in range(topology.spec.key_groups_of(op.name))
    }
    assert set(planned.units) == units and set(planned.units.values()) == set(planned.executors)


def test_more_pes_than_room_share_executors():
    """NONE makes a PE per operator; one host with room for two executors of one core packs them."""
    topology = vwap()
    doc = topology.model_dump(by_alias=True, exclude_none=True)
    doc["spec"]["fusion"] = {"algorithm": "none"}
    spec = load_topology(doc).spec
    plan = plan_topology(spec, Cluster(hosts=[Host(name="vm", cpu=2.0)]))
    assert len(plan.pes) == len(spec.operators) > 2
    planned = deployment(plan, spec, "vwap", ScalingConfig(), replicas=False, cpu=1.0, room={"vm": 2.0})
    assert len(planned.executors) == 2
    assert {op for op, _ in planned.units} == {op.name for op in spec.operators}


def obs(executors: int, demand: float, **extra) -> ScalingObservation:
    return ScalingObservation(
        time=extra.pop("time", 600.0),
        window=60.0,
        executors=executors,
        capacity=float(executors),
        input_rate=extra.pop("input_rate", 10_000.0),
        demand=demand,
        backlog=extra.pop("backlog", 0.0),
        backlog_work=0.0,
        **extra,
    )


CFG = ScalingConfig(
    min_executors=1, max_executors=20, metric_window=60, stabilization=60, scale_down_delay=600
)


def test_scale_up_stops_at_the_room_and_reports_the_shortfall():
    decision, _ = decide_target(obs(2, 7.0, placeable=1, carried_rate=3_000.0), ScalingState(), CFG)
    assert (decision.direction, decision.executors, decision.required) == ("up", 3, 10)
    assert "capped at 3" in decision.reason
    short = decision.shortfall
    assert short is not None and (short.executors_wanted, short.executors_placed, short.pending) == (10, 3, 7)
    assert short.rate_demanded == 10_000.0 and short.rate_carried == 3_000.0 and short.measured
    held, _ = decide_target(obs(2, 7.0, placeable=0), ScalingState(), CFG)
    assert held.direction == "none" and held.reason.startswith("capacity exhausted")
    assert held.shortfall is not None and held.shortfall.pending == 8
    # minExecutors too is only what fits
    floor = CFG.model_copy(update={"min_executors": 4})
    low, _ = decide_target(obs(2, 1.0, placeable=1), ScalingState(), floor)
    assert (low.direction, low.executors) == ("up", 3) and low.shortfall is not None


def test_a_saturated_period_is_not_capacity_evidence():
    """One executor busy on a 2-core host whose other work makes it wait: demand looks like 7 cores
    (wall-time busy stretched by the wait), but it is contention: no scale-up, not even into room."""
    host = (HostLoad("vm", executors=1, used=1.2, wait=1.5),)
    decision, state = decide_target(obs(1, 7.0, placeable=4, hosts=host), ScalingState(), CFG)
    assert (
        decision.direction == "none"
        and "saturated" in decision.reason
        and "not capacity evidence" in decision.reason
    )
    assert state.history[-1][3] == 1.0  # marked in the window
    # the next, unsaturated period decides on its own demand only
    calm = (HostLoad("vm", executors=1, used=0.7, wait=0.02),)
    later, _ = decide_target(obs(1, 0.7, placeable=4, hosts=calm, time=660.0), state, CFG)
    assert later.direction == "none" and ("at target" in later.reason or "within band" in later.reason)


def test_an_over_provisioned_saturated_host_scales_down_at_once():
    """Fourteen executors on 2 cores got 1.9 cores between them, each wanting 1.56 (used plus waited):
    one runs at full speed on them. Delay, grace and backlog mode do not hold it (they guard against
    removing capacity; this removes contention)."""
    host = (HostLoad("vm", executors=14, used=1.9, wait=20.0),)
    state = ScalingState(last_scale_up=590.0)
    decision, _ = decide_target(obs(14, 9.0, backlog=1e7, hosts=host), state, CFG)
    assert (decision.direction, decision.executors) == ("down", 7)  # halved: max_scale_down_fraction
    assert "over-provisioned by 13" in decision.reason


def test_two_executors_of_one_core_request_that_each_want_more_than_half_the_host_become_one():
    """The bench's case: on a 2-core machine two executors (a JVM and a Python driver each, requesting a
    core) want 1.5 cores each and get 1.9 between them; the requests fit, the footprints do not."""
    host = (HostLoad("vm", executors=2, used=1.9, wait=1.1),)
    decision, _ = decide_target(obs(2, 1.8, hosts=host, placeable=0), ScalingState(), CFG)
    assert (decision.direction, decision.executors) == ("down", 1)
    assert "over-provisioned by 1" in decision.reason
    # with room for both footprints the same demand is no contention, and nothing is removed
    roomy = (HostLoad("vm", executors=2, used=3.0, wait=0.05),)
    kept, _ = decide_target(obs(2, 1.8, hosts=roomy, placeable=0), ScalingState(), CFG)
    assert kept.direction != "down" or "over-provisioned" not in kept.reason


def test_a_host_whose_cores_used_land_a_rounding_error_below_a_half_keeps_its_executors():
    """Two active and three draining executors used 1.5 cores between them (a sum of measurements that
    landed at 1.4999999999999998), each wanting a core: once the draining ones leave, the cores run the two, as
    1.5 exactly says. The simulator's crowded host once scaled 2 -> 1 on that rounding error."""
    used = math.nextafter(1.5, 0.0)
    host = HostLoad("vm", executors=5, used=used, wait=1.59, draining=3)
    assert overprovisioned([host], 1.0) == overprovisioned([replace(host, used=1.5)], 1.0) == 0
    assert overprovisioned([replace(host, used=1.45)], 1.0) == 1


def test_room_books_what_executors_use_beyond_their_requests():
    """A running executor that uses 1.6 cores on a request of 1 leaves 0.4 of a 2-core host, and a new
    one is expected to take what the running ones use: none fits where the requests alone would say one."""
    room = booked_room({"vm": 1.0, "big": 6.0}, [("vm", 1.0, 1.6), ("big", 1.0, 0.3), ("vm", 1.0, None)])
    assert room == pytest.approx({"vm": 0.4, "big": 6.0})
    assert footprint(1.0, [1.6, 1.8, 0.0]) == pytest.approx(1.7) and footprint(1.0, [0.3]) == 1.0
    assert footprint(1.0, []) == 1.0
    assert placeable(footprint(1.0, [1.7]), {"vm": 0.4}) == 0 and placeable(1.0, {"vm": 1.0}) == 1


def test_an_ineffective_scale_up_blocks_the_next():
    """2 -> 4 expected twice the true capacity; a full window later it gained 5 % of that: no more
    scale-ups while the count stays (Flink's scaling effectiveness detection)."""
    decision, state = decide_target(obs(2, 4.0, input_rate=10_000.0), ScalingState(), CFG)
    assert decision.executors == 6 and state.scale_up_from == (2.0, 5_000.0)
    state = ScalingState(scale_up_from=(2.0, 5_000.0), last_change=0.0)
    # six executors now carry 5,500 rec/s at full utilisation: 500 of the 10,000 the scale-up expected to add
    after, state = decide_target(obs(6, 12.0, input_rate=11_000.0, time=120.0), state, CFG)
    assert state.ineffective and after.direction == "none" and "ineffective scaling" in after.reason
    again, _ = decide_target(obs(6, 12.0, input_rate=11_000.0, time=180.0), state, CFG)
    assert again.direction == "none" and "ineffective" in again.reason


def loads_state(loads: list[float], executors: list[ExecutorInfo], assignment, room=None) -> AllocationState:
    stats = [KeyGroupStats(("op", k), load=load, rate=100.0) for k, load in enumerate(loads)]
    return AllocationState(executors=executors, key_groups=stats, assignment=assignment, room=room)


def test_new_executors_go_where_there_is_room():
    executors = [ExecutorInfo("t-e0", host="a"), ExecutorInfo("t-e1", host="a")]
    assignment = {("op", k): f"t-e{k % 2}" for k in range(8)}
    state = loads_state([60.0] * 8, executors, assignment, room={"a": 0.2, "b": 1.0, "c": 0.0})
    config = AdaptationConfig(policy="albic", scaling_config=CFG, executor_prefix="t-e")
    result = adapt(state, ScalingState(), time=600.0, window=60.0, config=config)
    assert result.decision.executors == 3 and result.added == ["t-e2"]
    assert next(e for e in result.executors if e.name == "t-e2").host == "b"
    assert result.capacity is not None and result.capacity.pending == 4  # 480 % at 0.7 wants 7


def test_a_rebalance_whose_gain_is_within_the_measured_noise_is_skipped():
    """Two executors; the plan would move key groups for a 2 pp gain while loads land 5 pp from what the
    last round predicted: kept. A 30 pp imbalance is rebalanced whatever the noise."""
    executors = [ExecutorInfo("t-e0"), ExecutorInfo("t-e1")]
    assignment = {("op", k): f"t-e{k % 2}" for k in range(8)}
    config = AdaptationConfig(
        policy="albic", scaling_config=CFG.model_copy(update={"rule": "off"}), executor_prefix="t-e"
    )
    noisy = ScalingState(noise=5.0)
    slight = [10.0, 9.0] * 4  # 40 % vs 36 %
    kept = adapt(loads_state(slight, executors, assignment), noisy, time=60.0, window=60.0, config=config)
    assert kept.migrations == [] and "within the measured noise" in kept.reason
    skewed = [20.0, 5.0] * 4  # 80 % vs 20 %
    moved = adapt(loads_state(skewed, executors, assignment), noisy, time=60.0, window=60.0, config=config)
    assert moved.migrations and "noise" not in moved.reason
    # the noise itself: the next period's loads against those the round predicted for its allocation
    same = adapt(
        loads_state(slight, executors, assignment), kept.scaling_state, time=120.0, window=60.0, config=config
    )
    assert same.scaling_state.noise == pytest.approx(0.5 * 0.0 + 0.5 * 5.0)


def test_the_footprint_counts_against_the_room_where_it_exceeds_the_request():
    """``streamtopo run``'s executors request a core but take ~1.6 busy: a 2-core machine starts one,
    and the shortfall counts the executors the declared rates need at that footprint."""
    topology = vwap()
    plan = plan_topology(topology.spec, Cluster(hosts=[Host(name="vm", cpu=2.0)]))
    scaling = ScalingConfig(min_executors=1, max_executors=16)
    planned = deployment(
        plan, topology.spec, "vwap", scaling, replicas=False, cpu=1.0, room={"vm": 2.0}, footprint=1.6
    )
    assert len(planned.executors) == 1 and [e.cpu for e in planned.executors.values()] == [1.0]
    capacity = planned.capacity
    assert capacity is not None and capacity.executor_cpu == 1.6 and capacity.executors_placed == 1
    assert capacity.cores_missing == pytest.approx(1.6 * (capacity.executors_wanted - 1))
    roomy = deployment(
        plan, topology.spec, "vwap", scaling, replicas=False, cpu=1.0, room={"vm": 4.0}, footprint=1.6
    )
    assert len(roomy.executors) == 2
