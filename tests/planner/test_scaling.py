"""The target-capacity scaling rule, its safeguards, and the DStreams ratio baseline."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtopo.planner.allocation import AllocationState, ExecutorInfo, KeyGroupStats, Rebalance
from streamtopo.planner.model import AutoscalingSpec
from streamtopo.planner.scaling.dstreams import decide_dstreams
from streamtopo.planner.scaling.policy import (
    ScalingConfig,
    ScalingObservation,
    ScalingState,
    decide_target,
    observe,
)
from streamtopo.planner.scaling.rules import scaler

CFG = ScalingConfig(
    min_executors=1,
    max_executors=20,
    target_utilization=0.7,
    utilization_band=0.1,
    stabilization=300,
    metric_window=120,
    scale_down_delay=600,
    catch_up=300,
    backlog_seconds=30,
)


def obs(
    time: float,
    executors: int,
    demand: float,
    *,
    backlog: float = 0.0,
    backlog_work: float = 0.0,
    input_rate: float = 10_000.0,
    load_distance: float | None = None,
) -> ScalingObservation:
    return ScalingObservation(
        time=time,
        window=60,
        executors=executors,
        capacity=float(executors),
        input_rate=input_rate,
        demand=demand,
        backlog=backlog,
        backlog_work=backlog_work,
        load_distance=load_distance,
    )


def run(
    observations: list[ScalingObservation], config: ScalingConfig = CFG, state: ScalingState | None = None
):
    state = state or ScalingState()
    decisions = []
    for o in observations:
        decision, state = decide_target(o, state, config)
        decisions.append(decision)
    return decisions, state


def test_waits_for_a_full_metric_window() -> None:
    decisions, _ = run([obs(60, 2, 3.5)])
    assert decisions[0].direction == "none" and "collecting metrics: 60 of 120 s" in decisions[0].reason


def test_scale_up_to_the_target_count() -> None:
    # 3.5 cores needed on 2 executors: utilisation 1.75; target 0.7 needs ceil(3.5 / 0.7) = 5.
    decisions, state = run([obs(60, 2, 3.5), obs(120, 2, 3.5)])
    d = decisions[1]
    assert (d.direction, d.previous, d.executors) == ("up", 2, 5)
    assert (
        d.reason.startswith("scale up 2 -> 5:")
        and "utilisation 1.75" in d.reason
        and "target 0.7" in d.reason
    )
    assert state.last_change == 120 and state.history == ()


def test_window_average_not_the_last_sample() -> None:
    # Demand 1.4 then 2.8 over the 120 s window: mean 2.1 on 2 executors -> ceil(2.1 / 0.7) = 3.
    decisions, _ = run([obs(60, 2, 1.4), obs(120, 2, 2.8)])
    assert decisions[1].executors == 3


def test_band_holds() -> None:
    # Utilisation 1.5 / 2 = 0.75 is within 0.7 +- 0.1: no action even though ceil(1.5 / 0.7) = 3.
    decisions, _ = run([obs(60, 2, 1.5), obs(120, 2, 1.5)])
    assert decisions[1].direction == "none" and decisions[1].reason.startswith("within band")


def test_stabilisation_after_a_change() -> None:
    _, state = run([obs(60, 2, 3.5), obs(120, 2, 3.5)])
    later, _ = run([obs(t, 5, 7.0) for t in range(180, 480, 60)], state=state)
    # Changed at 120: 180..360 are within the 300 s stabilisation; at 420 the window is full again.
    assert [d.direction for d in later] == ["none", "none", "none", "none", "up"]
    assert all("stabilising" in d.reason for d in later[:4])
    # 7 cores: ceil(7 / 0.7) = 10.
    assert later[4].executors == 10


def test_scale_down_is_delayed_and_takes_the_largest_requirement() -> None:
    # 10 executors, demand drops to 3.5 (utilisation 0.35): ceil(3.5 / 0.7) = 5 wanted from t = 120.
    # During the 600 s delay demand rises briefly to 4.2 -> 6; the scale-down goes to 6, not 5.
    series = [obs(60, 10, 3.5), obs(120, 10, 3.5)] + [
        obs(t, 10, 4.2 if t == 300 else 3.5) for t in range(180, 780, 60)
    ]
    decisions, _ = run(series)
    first_down = next(i for i, d in enumerate(decisions) if d.direction == "down")
    assert series[first_down].time == 720  # 120 + 600
    assert all("wanted" in d.reason for d in decisions[1:first_down])
    assert decisions[first_down].executors == 6


def test_scale_down_is_capped_at_half() -> None:
    # 10 executors, 0.7 cores needed -> 1 executor, but at most halve per step: 5.
    decisions, _ = run([obs(t, 10, 0.7) for t in range(60, 780, 60)])
    down = [d for d in decisions if d.direction == "down"]
    assert down[0].executors == 5 and "capped from 1" in down[0].reason


def test_a_rise_cancels_a_pending_scale_down() -> None:
    series = [obs(60, 10, 3.5), obs(120, 10, 3.5), obs(180, 10, 3.5), obs(240, 10, 7.0), obs(300, 10, 7.0)]
    series += [obs(t, 10, 3.5) for t in range(360, 1080, 60)]
    decisions, _ = run(series)
    # Wanted from 120; at 300 the window mean is 7.0 (utilisation 0.7, exactly 10 needed): cancelled.
    # Wanted again from 360 -> down at 960. The 360 window (mean (7.0 + 3.5) / 2 = 5.25 -> 8) reaches back
    # before the wish and does not set the floor; every later window is 3.5 -> ceil(3.5 / 0.7) = 5.
    assert decisions[4].reason.startswith("at target")
    downs = [(o.time, d.executors) for o, d in zip(series, decisions) if d.direction == "down"]
    assert downs == [(960, 5)]


def test_no_scale_down_within_the_scale_up_grace() -> None:
    config = CFG.model_copy(update=dict(stabilization=0, scale_down_delay=0, scale_up_grace=600))
    series = [obs(60, 2, 3.5), obs(120, 2, 3.5)]  # up to 5 at 120
    decisions, state = run(series, config)
    assert decisions[1].executors == 5 and state.last_scale_up == 120
    later = [obs(t, 5, 1.0) for t in range(180, 900, 60)]  # demand collapses: 1 executor would do
    decisions, _ = run(later, config, state)
    downs = [o.time for o, d in zip(later, decisions) if d.direction == "down"]
    assert downs[0] == 720  # 120 + 600
    assert all("grace" in d.reason for o, d in zip(later, decisions) if 240 <= o.time < 720)


def test_backlog_mode_blocks_scale_down_and_catches_up() -> None:
    # Lag of 600 000 records = 60 s of 10k rec/s input > 30 s: no scale-down despite utilisation 0.35.
    series = [obs(t, 10, 3.5, backlog=600_000, backlog_work=60.0) for t in range(60, 900, 60)]
    decisions, _ = run(series)
    assert all(d.direction == "none" for d in decisions)
    assert "backlog mode" in decisions[-1].reason
    # Demand 1.4 on 2 executors is 0.7 (in band), but 600 busy seconds of backlog in 300 s need 2 more
    # cores at full utilisation: ceil((1.4 + 600 / 300) / 1) = 4.
    decisions, _ = run(
        [obs(60, 2, 1.4, backlog=10**6, backlog_work=600), obs(120, 2, 1.4, backlog=10**6, backlog_work=600)]
    )
    assert (decisions[1].direction, decisions[1].executors) == ("up", 4)
    assert "catch up" in decisions[1].reason


def test_plan_load_distance_guards_scale_down() -> None:
    series = [obs(t, 10, 3.5, load_distance=25.0) for t in range(60, 900, 60)]
    decisions, _ = run(series)
    assert all(d.direction == "none" for d in decisions) and "maxLD" in decisions[-1].reason


def test_min_and_max_executors() -> None:
    config = CFG.model_copy(update=dict(max_executors=4))
    decisions, _ = run([obs(60, 2, 35.0), obs(120, 2, 35.0)], config)
    assert decisions[1].executors == 4
    decisions, _ = run([obs(60, 6, 1.0)], config)  # above max: corrected at once, window or not
    assert (decisions[0].direction, decisions[0].executors) == ("down", 4)


def test_bad_observation_is_named() -> None:
    with pytest.raises(ValueError, match="demand"):
        decide_target(obs(60, 2, float("nan")), ScalingState(), CFG)


def test_config_from_spec_and_validation() -> None:
    spec = AutoscalingSpec(
        min_executors=2,
        max_executors=9,
        target_utilization=0.6,
        stabilization=120,
        scale_down_delay=900,
        interval=600,
    )
    cfg = ScalingConfig.from_spec(spec)
    assert (cfg.min_executors, cfg.max_executors, cfg.target_utilization) == (2, 9, 0.6)
    assert (cfg.stabilization, cfg.scale_down_delay, cfg.metric_window) == (120, 900, 600)
    with pytest.raises(ValueError, match="utilizationBand"):
        ScalingConfig(utilization_band=0.8)


def test_observe_uses_true_processing_rates() -> None:
    # kg a: 1000 rec/s in 20 % busy -> 5000 rec per busy second; 1500 rec/s arrive -> 0.3 cores.
    # kg b: 500 rec/s in 25 % busy -> 2000 rec/busy s; 500 arrive -> 0.25 cores; backlog 4000 -> 2 busy s.
    # kg c: idle, 100 rec/s arrive: job-wide true rate 1500 / 0.45 -> 0.03 cores.
    state = AllocationState(
        executors=[
            ExecutorInfo("e0", 1.0),
            ExecutorInfo("e1", 2.0),
            ExecutorInfo("e2", 1.0, marked_for_removal=True),
        ],
        key_groups=[
            KeyGroupStats(("a", 0), load=20, rate=1000),
            KeyGroupStats(("b", 0), load=25, rate=500, backlog=4000),
            KeyGroupStats(("c", 0), load=0, rate=0),
        ],
        assignment={("a", 0): "e0", ("b", 0): "e1", ("c", 0): "e2"},
        traffic={(("a", 0), ("b", 0)): 500.0},
    )
    plan = Rebalance(
        assignment=dict(state.assignment), migrations=[], load_distance=3.0, collocation_factor=0.0
    )
    o = observe(state, plan, time=60, window=60, arrivals={("a", 0): 1500, ("b", 0): 500, ("c", 0): 100})
    assert o.demand == pytest.approx(0.3 + 0.25 + 100 / (1500 / 0.45))
    assert o.backlog_work == pytest.approx(2.0)
    assert (o.executors, o.capacity, o.load_distance) == (2, 3.0, 3.0)
    assert o.input_rate == pytest.approx(1500 + 100)  # b is fed by a: not job input


def test_dstreams_ratio_rule() -> None:
    cfg = CFG.model_copy(update=dict(dstreams_interval=60))

    def once(executors: int, demand: float) -> tuple[str, int]:
        d, _ = decide_dstreams(obs(60, executors, demand), ScalingState(), cfg)
        return d.direction, d.executors

    assert once(4, 3.8) == ("up", 5)  # ratio 0.95 >= 0.9: + max(round(0.95), 1) = +1
    assert once(5, 12.5) == ("up", 8)  # ratio 2.5: + Math.round(2.5) = +3 (half up, as in Java)
    assert once(8, 16.0) == ("up", 10)  # ratio 2.0: +2
    assert once(7, 2.0) == ("down", 6)  # ratio 0.29 <= 0.3: -1
    assert once(6, 3.0) == ("none", 6)  # ratio 0.5 within [0.3, 0.9]
    d, state = decide_dstreams(obs(60, 4, 3.8), ScalingState(), cfg)
    d, _ = decide_dstreams(obs(100, 5, 0.1), state, cfg)  # 40 s later: inside the 60 s scaling interval
    assert d.direction == "none" and "interval" in d.reason


def test_scaler_registry() -> None:
    assert scaler("target") is decide_target and scaler("dstreams") is decide_dstreams
    d, _ = scaler("off")(obs(60, 3, 30.0), ScalingState(), CFG)
    assert d.direction == "none"
    with pytest.raises(ValueError, match="unknown scaling rule"):
        scaler("magic")


@settings(max_examples=40, deadline=None)
@given(demand=st.floats(0.05, 15.0), start=st.integers(1, 20))
def test_constant_demand_settles_without_reversal(demand: float, start: int) -> None:
    """Under constant demand the rule moves monotonically and ends in the band or at the target count."""
    count, state, directions = start, ScalingState(), []
    for i in range(80):
        decision, state = decide_target(obs(60 * (i + 1), count, demand), state, CFG)
        if decision.direction != "none":
            directions.append(decision.direction)
        count = decision.executors
    assert len(set(directions)) <= 1  # never up then down (or down then up)
    required = min(max(math.ceil(demand / 0.7 - 1e-9), 1), 20)
    utilization = demand / count
    assert count == required or abs(utilization - 0.7) <= 0.1 + 1e-9 or count == 20


def test_a_sources_backlog_costs_the_whole_jobs_work_per_record() -> None:
    # Generator src (1000 rec/s due, 10 % busy) feeds agg (1000 rec/s, 90 % busy): the job needs 1 core per
    # 1000 input rec/s, so 60k records due at src need 60 busy seconds, not src's own 6.
    state = AllocationState(
        executors=[ExecutorInfo("e0", 1.0)],
        key_groups=[
            KeyGroupStats(("src", 0), load=10, rate=1000, backlog=60_000),
            KeyGroupStats(("agg", 0), load=90, rate=1000),
        ],
        assignment={("src", 0): "e0", ("agg", 0): "e0"},
        traffic={(("src", 0), ("agg", 0)): 1000.0},
    )
    o = observe(state, None, time=60, window=60)
    assert o.input_rate == pytest.approx(1000) and o.demand == pytest.approx(1.0)
    assert o.backlog_work == pytest.approx(60.0)
    decision, _ = decide_target(o, ScalingState(), CFG.model_copy(update=dict(metric_window=60, catch_up=30)))
    assert (
        decision.executors == 3
    )  # 1 core of demand + 60 busy s in 30 s: catch-up needs 3 one-core executors
