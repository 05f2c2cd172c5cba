"""ALBIC's Algorithm 1: terminate drained executors, plan, scale on the plan, re-plan, apply."""

from __future__ import annotations

from dataclasses import replace

import pytest
from greedy_rebalancer import greedy_rebalance
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtopo.planner.adaptation import AdaptationConfig, adapt
from streamtopo.planner.allocation import AllocationState, ExecutorInfo, KeyGroupStats
from streamtopo.planner.scaling.policy import ScalingConfig, ScalingState

FAST = ScalingConfig(min_executors=1, max_executors=10, metric_window=60, stabilization=0, scale_down_delay=0)


def state_with(loads: dict[str, list[float]], marked: tuple[str, ...] = ()) -> AllocationState:
    """Executors named by ``loads``; each float is a key group's load (percent), rate 1000 rec/s."""
    executors = [ExecutorInfo(name, marked_for_removal=name in marked) for name in loads]
    stats, assignment = [], {}
    for name, kg_loads in loads.items():
        for load in kg_loads:
            kg = ("op", len(stats))
            stats.append(KeyGroupStats(kg, load=load, rate=1000.0))
            assignment[kg] = name
    return AllocationState(executors=executors, key_groups=stats, assignment=assignment)


def config(scaling: str = "target", max_migrations: int = 10) -> AdaptationConfig:
    return AdaptationConfig(
        policy="test", scaling_config=FAST.model_copy(update={"rule": scaling}), max_migrations=max_migrations
    )


def run(state: AllocationState, scaling: str = "target", max_migrations: int = 10, time: float = 60.0):
    return adapt(
        state,
        ScalingState(),
        time=time,
        window=60,
        config=config(scaling, max_migrations),
        rebalance=greedy_rebalance,
    )


def test_terminates_only_empty_marked_executors() -> None:
    state = state_with({"a": [30, 30], "b": [30, 30], "c": [], "d": [10]}, marked=("c", "d"))
    result = run(state, scaling="off")
    assert result.terminated == ["c"]
    assert [e.name for e in result.executors] == ["a", "b", "d"]
    assert "terminated c" in result.reason


def test_scale_up_adds_empty_executors_then_replans_onto_them() -> None:
    # 4 key groups of 70 % on 2 executors: 2.8 cores, ceil(2.8 / 0.7) = 4 executors.
    state = state_with({"executor-0": [70, 70], "executor-1": [70, 70]})
    result = run(state)
    assert (result.decision.direction, result.decision.executors) == ("up", 4)
    assert result.added == ["executor-2", "executor-3"]
    assert result.plan.migrations == []  # line 4: already balanced on the old executors
    # line 7: the re-plan moves load onto the new, empty executors
    receivers = {to for _, _, to in result.rebalance.migrations}
    assert receivers == {"executor-2", "executor-3"}
    assert sorted(set(result.assignment.values())) == ["executor-0", "executor-1", "executor-2", "executor-3"]


def test_scale_down_marks_the_lightest_and_never_feeds_it() -> None:
    # 0.6 cores on 4 executors (utilisation 0.15): ceil(0.6 / 0.7) = 1, capped at half: 2.
    state = state_with({"a": [20], "b": [15], "c": [5, 5], "d": [10, 5]})
    result = run(state)
    assert (result.decision.direction, result.decision.executors) == ("down", 2)
    assert result.marked == ["c", "b"]  # plan loads: a 20, b 15, c 10, d 15 -> c, then b (tie with d: name)
    marked = {e.name for e in result.executors if e.marked_for_removal}
    assert marked == {"b", "c"}
    for _kg, _, to in result.rebalance.migrations:  # Lemma 1: nothing moves onto set B
        assert to not in marked


def test_marked_executors_drain_over_rounds_then_terminate() -> None:
    state = state_with({"a": [10], "b": [10, 10, 10, 10, 10, 10]}, marked=("b",))
    scaling_state, seen_terminated, time = ScalingState(), [], 60.0
    for _ in range(5):
        result = adapt(
            state,
            scaling_state,
            time=time,
            window=60,
            config=config("off", max_migrations=2),
            rebalance=greedy_rebalance,
        )
        assert len(result.migrations) <= 2
        seen_terminated += result.terminated
        state = replace(state, executors=result.executors, assignment=result.assignment)
        scaling_state, time = result.scaling_state, time + 60
    assert seen_terminated == ["b"]
    assert set(state.assignment.values()) == {"a"}


def test_scale_up_takes_back_draining_executors_first() -> None:
    state = state_with(
        {"executor-0": [70, 70], "executor-1": [70, 70], "executor-2": [35]}, marked=("executor-2",)
    )
    result = run(state)
    # 3.15 cores -> ceil(3.15 / 0.7) = 5 active; 2 active now: +3 = executor-2 taken back + 2 new.
    assert result.decision.executors == 5
    assert result.unmarked == ["executor-2"] and result.added == ["executor-3", "executor-4"]
    assert not any(e.marked_for_removal for e in result.executors)


@pytest.mark.parametrize(
    "broken, field",
    [
        (
            lambda s: replace(s, key_groups=[replace(s.key_groups[0], load=float("nan")), *s.key_groups[1:]]),
            "load",
        ),
        (lambda s: replace(s, key_groups=s.key_groups[1:]), "no statistics"),
        (
            lambda s: replace(s, executors=[replace(s.executors[0], capacity=0.0), *s.executors[1:]]),
            "capacity",
        ),
    ],
)
def test_bad_statistics_keep_the_current_allocation(broken, field) -> None:
    state = broken(state_with({"a": [90, 90], "b": [10]}))
    result = run(state)
    assert result.safe and result.decision.direction == "none"
    assert result.assignment == dict(state.assignment) and result.executors == list(state.executors)
    assert field in result.reason and result.reason.startswith("keeping the current allocation")


def test_unknown_policy_is_a_safe_decision() -> None:
    state = state_with({"a": [50], "b": [10]})
    result = adapt(state, ScalingState(), time=60, window=60, config=AdaptationConfig(policy="nope"))
    assert result.safe and "policy" in result.reason


@settings(max_examples=30, deadline=None)
@given(
    loads=st.lists(st.lists(st.floats(0, 60), max_size=6), min_size=2, max_size=6),
    marked=st.sets(st.integers(0, 5), max_size=2),
    rule=st.sampled_from(["target", "dstreams", "off"]),
)
def test_round_invariants(loads: list[list[float]], marked: set[int], rule: str) -> None:
    names = [f"executor-{i}" for i in range(len(loads))]
    marked_names = tuple(names[i] for i in marked if i < len(names) - 1)  # keep one executor active
    state = state_with(dict(zip(names, loads)), marked=marked_names)
    result = run(state, scaling=rule, max_migrations=3)
    assert not result.safe
    running = {e.name: e for e in result.executors}
    assert set(result.assignment) == set(state.assignment)
    assert set(result.assignment.values()) <= set(running)  # nothing lands on a terminated executor
    assert not set(result.terminated) & set(state.assignment.values())  # only empty ones terminate
    assert len(result.migrations) <= 3
    for _, _, to in result.migrations:  # Lemma 1: set B receives nothing
        assert not running[to].marked_for_removal
    active = sum(1 for e in result.executors if not e.marked_for_removal)
    assert active == result.decision.executors and FAST.min_executors <= active <= FAST.max_executors


def test_albic_collocations_carry_over_to_the_next_round() -> None:
    from streamtopo.planner.rebalance.albic.collocation import AlbicConfig

    pair = (("op", 0), ("op", 1))

    def collocating(state, **kwargs):
        result = greedy_rebalance(state, **kwargs)
        result.details["collocation_constraints"] = [pair]
        return result

    state = state_with({"a": [10, 10], "b": [10]})
    result = adapt(state, ScalingState(), time=60, window=60, config=config("off"), rebalance=collocating)
    assert isinstance(result.policy_config, AlbicConfig) and result.policy_config.collocations == (pair,)
    # other policies' configs pass through untouched
    assert run(state, scaling="off").policy_config is None


@pytest.mark.parametrize("policy", ["albic", "milp", "flux", "potc", "cola", "cmr"])
def test_every_registered_policy_drains_set_b_and_fills_new_executors(policy: str) -> None:
    """Algorithm 1 with the real policies: set B drains and is terminated; a scale-up's executors get work."""
    state = state_with({"a": [10], "c": [5], "b": [10, 10, 10, 10, 10, 10]}, marked=("b",))
    scaling_state, time, terminated = ScalingState(), 60.0, []
    bound = None if policy == "cola" else 2  # COLA re-optimisation ignores migration bounds by design
    for _ in range(6):
        result = adapt(
            state,
            scaling_state,
            time=time,
            window=60,
            config=AdaptationConfig(
                policy=policy, scaling_config=FAST.model_copy(update={"rule": "off"}), max_migrations=2
            ),
        )
        assert not result.safe, result.reason
        marked = {e.name for e in result.executors if e.marked_for_removal}
        assert not [m for m in result.migrations if m[2] in marked]
        assert bound is None or len(result.migrations) <= bound
        terminated += result.terminated
        state = replace(state, executors=result.executors, assignment=result.assignment)
        scaling_state, time = result.scaling_state, time + 60
    assert terminated == ["b"] and set(state.assignment.values()) == {"a", "c"}

    hot = state_with({"executor-0": [70, 70, 70, 70], "executor-1": [70, 70, 70, 70]})  # 5.6 cores -> 8
    result = adapt(
        hot,
        ScalingState(),
        time=60,
        window=60,
        config=AdaptationConfig(policy=policy, scaling_config=FAST, max_migrations=6),
    )
    assert result.added == [f"executor-{i}" for i in range(2, 8)]
    receivers = {to for _, _, to in result.rebalance.migrations}
    receivers |= {
        e for split in result.rebalance.details.get("shares", {}).values() for e in split
    }  # PoTC routes
    assert receivers & set(result.added)
