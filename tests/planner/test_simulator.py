"""The discrete-time simulator and its scenario model, against hand computations."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from greedy_rebalancer import greedy_rebalance

from streamtopo.planner.allocation import AllocationState, Rebalance
from streamtopo.planner.simulation.scenario import ScenarioError, load_scenario
from streamtopo.planner.simulation.simulator import simulate

EXAMPLES = sorted((Path(__file__).parents[2] / "examples" / "scenarios").glob("*.yaml"))


def keep(state: AllocationState, **_) -> Rebalance:
    """A rebalancer that never moves anything."""
    return Rebalance(
        assignment=dict(state.assignment), migrations=[], load_distance=0.0, collocation_factor=0.0
    )


def scenario(**overrides) -> dict:
    base = {
        "name": "t",
        "periods": 3,
        "interval": 60,
        "seed": 0,
        "executors": {"initial": 2, "placement": "round-robin"},
        "operators": [
            {"name": "src", "keyGroups": 2, "costPerRecord": 1e-6},
            {"name": "agg", "keyGroups": 2, "inputs": ["src"], "pattern": "full", "costPerRecord": 2e-6},
        ],
        "workload": {"rate": 100_000},
        "costs": {"serializationPerRecord": 4e-6},
        "scaling": {"rule": "off"},
    }
    base.update(overrides)
    return base


def test_loads_traffic_and_serialisation_by_hand() -> None:
    # Each source kg gets 50k rec/s and sends 25k to each agg kg. Round-robin puts kg i of both operators
    # on executor i, so src0->agg1 and src1->agg0 (25k each) cross executors: 4e-6 s per record at both ends.
    # src0: 50k * 1e-6 + 25k * 4e-6 = 0.15 cores; agg0: 50k * 2e-6 + 25k * 4e-6 = 0.2 cores -> 35 % per executor.
    result = simulate(load_scenario(scenario()), rebalance=keep)
    p = result.periods[0]
    assert p.input_rate == pytest.approx(100_000)
    assert p.utilization == pytest.approx(0.35)
    assert p.load_distance == pytest.approx(0.0)
    assert p.collocation_factor == pytest.approx(0.5)  # 50k of 100k records stay inside an executor
    assert p.load_index == pytest.approx(1.0) and p.backlog == 0
    # One-to-one instead: nothing crosses; 0.05 + 0.1 = 0.15 cores per executor.
    ops = scenario()["operators"]
    ops[1]["pattern"] = "one-to-one"
    p = simulate(load_scenario(scenario(operators=ops)), rebalance=keep).periods[0]
    assert p.utilization == pytest.approx(0.15) and p.collocation_factor == pytest.approx(1.0)


def test_skew_splits_the_rate_by_zipf() -> None:
    # Zipf exponent 1 over 2 key groups: shares 1 and 1/2 -> 2/3 and 1/3 of 90k rec/s.
    doc = scenario(
        workload={"rate": 90_000, "skew": 1.0},
        operators=[{"name": "src", "keyGroups": 2, "costPerRecord": 1e-5}],
    )
    p = simulate(load_scenario(doc), rebalance=keep).periods[0]
    # kg0 (60k rec/s, 0.6 cores) on t-e0, kg1 (30k, 0.3 cores) on t-e1: mean 45 %, distance 15.
    assert p.load_distance == pytest.approx(15.0)


def test_overload_builds_backlog() -> None:
    # One executor, 100k rec/s at 1.2e-5 s each = 1.2 cores. Per 60 s period: 6e6 arrive, 60 / 1.2e-5 = 5e6 done.
    doc = scenario(
        executors={"initial": 1},
        operators=[{"name": "src", "keyGroups": 1, "costPerRecord": 1.2e-5}],
        scaling={"rule": "off", "minExecutors": 1},
    )
    result = simulate(load_scenario(doc), rebalance=keep)
    assert [round(p.backlog) for p in result.periods] == [1_000_000, 2_000_000, 3_000_000]


def test_a_migrated_key_group_pauses() -> None:
    # kg needs 95k * 1e-5 = 0.95 cores = 57 busy seconds per period. Moved at the end of period 0, it is paused
    # 6 s in period 1 and can work only 54 s: 3 busy seconds = 300k records stay in its backlog.
    moved = []

    def move_once(state: AllocationState, **_) -> Rebalance:
        assignment = dict(state.assignment)
        migrations = []
        if not moved:
            moved.append(True)
            assignment[("src", 0)] = "t-e1"
            migrations = [(("src", 0), "t-e0", "t-e1")]
        return Rebalance(
            assignment=assignment, migrations=migrations, load_distance=0.0, collocation_factor=0.0
        )

    doc = scenario(
        operators=[{"name": "src", "keyGroups": 1, "costPerRecord": 1e-5, "stateBytes": 0}],
        workload={"rate": 95_000},
        migration={"pauseSeconds": 6, "maxMigrations": 1},
        executors={"initial": 2, "placement": "round-robin"},
    )
    result = simulate(load_scenario(doc), rebalance=move_once)
    assert [p.migrations for p in result.periods] == [1, 0, 0]
    assert result.periods[0].backlog == 0
    assert result.periods[1].backlog == pytest.approx(300_000)


def test_split_routing_and_merge_overhead_by_hand() -> None:
    # One key group, 50k rec/s x 1e-5 = 0.5 cores, on t-e0 of two. A PoTC-like plan routes half of
    # its records to t-e1 from period 1 on, and the owner pays 10 % of the work for merging:
    # t-e0 0.25 + 0.05 = 30 %, t-e1 25 %; mean 27.5 % -> load distance 2.5 (period 0: 25).
    def split(state: AllocationState, **_) -> Rebalance:
        return Rebalance(
            assignment=dict(state.assignment),
            migrations=[],
            load_distance=0.0,
            collocation_factor=0.0,
            details={"shares": {("src", 0): {"t-e0": 0.5, "t-e1": 0.5}}, "merge_overhead": 0.1},
        )

    doc = scenario(
        operators=[{"name": "src", "keyGroups": 1, "costPerRecord": 1e-5}], workload={"rate": 50_000}
    )
    p0, p1, _ = simulate(load_scenario(doc), rebalance=split).periods
    assert p0.load_distance == pytest.approx(25.0) and p0.utilization == pytest.approx(0.25)
    assert p1.load_distance == pytest.approx(2.5) and p1.utilization == pytest.approx(0.275)
    assert p1.load_index == pytest.approx(1.1)  # 0.55 cores per 50k records instead of 0.5


def test_rate_step_scales_to_the_minimal_count() -> None:
    # One operator, no traffic: 50k rec/s x 1e-5 = 0.5 cores -> 1 executor; 150k -> 1.5 cores -> ceil(1.5/0.7) = 3.
    doc = scenario(
        periods=12,
        executors={"initial": 1},
        operators=[{"name": "src", "keyGroups": 8, "costPerRecord": 1e-5}],
        workload={"rate": 50_000, "steps": [{"at": 3, "rate": 150_000}]},
        scaling={"rule": "target", "stabilization": "1m", "metricWindow": "1m", "scaleDownDelay": "10m"},
    )
    result = simulate(load_scenario(doc), rebalance=greedy_rebalance)
    counts = [p.executors_next for p in result.periods]
    assert counts[:3] == [1, 1, 1] and counts[-1] == 3 and max(counts) == 3
    assert result.summary["executor_changes"] == 1
    assert all(p.migrations <= 10 for p in result.periods)


def test_faults_give_safe_decisions() -> None:
    doc = scenario(
        periods=4,
        faults=[
            {"at": 1, "kind": "nan-load"},
            {"at": 2, "kind": "missing-key-group"},
            {"at": 3, "kind": "zero-capacity"},
        ],
    )
    result = simulate(load_scenario(doc), rebalance=greedy_rebalance)
    assert [p.safe for p in result.periods] == [False, True, True, True]
    assert result.summary["safe_decisions"] == 3
    assert all(p.migrations == 0 for p in result.periods[1:])
    assert "load" in result.periods[1].reason and "capacity" in result.periods[3].reason


def test_deterministic_under_the_seed() -> None:
    doc = scenario(periods=4, workload={"rate": 100_000, "noise": 0.1})
    a = simulate(load_scenario(doc), rebalance=greedy_rebalance).to_dict()
    b = simulate(load_scenario(doc), rebalance=greedy_rebalance).to_dict()
    c = simulate(load_scenario(doc), rebalance=greedy_rebalance, seed=7).to_dict()
    assert a == b and a != c
    assert set(a) >= {"policy", "periods", "summary"}
    assert {
        "load_distance_mean",
        "load_distance_max",
        "migrations_total",
        "load_index_final",
        "executor_changes",
    } <= set(a["summary"])
    assert {"load_distance", "load_index", "collocation_factor", "migrations", "executors", "backlog"} <= set(
        a["periods"][0]
    )


@pytest.mark.parametrize(
    "change, field",
    [
        ({"operators": [{"name": "a", "inputs": ["ghost"]}]}, "operators[0].inputs[0]"),
        (
            {
                "operators": [
                    {"name": "a", "keyGroups": 4},
                    {"name": "b", "keyGroups": 2, "inputs": ["a"], "pattern": "one-to-one"},
                ]
            },
            "operators[1].pattern",
        ),
        ({"operators": [{"name": "a", "inputs": ["b"]}, {"name": "b", "inputs": ["a"]}]}, "operators"),
        ({"executors": {"initial": 2, "capacities": [1.0]}}, "executors"),
        ({"executors": {"initial": 0}}, "executors.initial"),
        ({"workload": {"rate": -5}}, "workload.rate"),
        ({"workload": {"spikes": [{"at": 1, "keyGroups": [99]}]}}, "workload.spikes[0].keyGroups[0]"),
        ({"interval": "soon"}, "interval"),
        ({"costs": {"serialisation": 1}}, "costs.serialisation"),
        ({"faults": [{"at": 50, "kind": "nan-load"}]}, "faults[0].at"),
    ],
)
def test_bad_scenarios_name_the_field(change, field) -> None:
    with pytest.raises(ScenarioError) as info:
        load_scenario(scenario(**change))
    assert field in [path for path, _ in info.value.problems]


def test_not_a_mapping() -> None:
    with pytest.raises(ScenarioError, match="mapping"):
        load_scenario(["operators"])


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_scenarios_run(path: Path) -> None:
    sc = load_scenario(yaml.safe_load(path.read_text()))
    result = simulate(sc, rebalance=greedy_rebalance, periods=3)
    assert len(result.periods) == 3 and result.summary["safe_decisions"] == 0


def test_examples_cover_the_workload_kinds() -> None:
    assert {p.stem for p in EXAMPLES} >= {"steady", "skewed", "diurnal", "spikes", "rate-steps"}


def example(name: str):
    return load_scenario(yaml.safe_load(next(p for p in EXAMPLES if p.stem == name).read_text()))


def test_contention_on_a_host_by_hand() -> None:
    """Four executors of one core want 4 cores on a host of 2 (contention 0.1 per executor beyond its 2
    cores): they get 2 x 0.8 = 1.6 cores in proportion and wait for the rest; their busy time, wall time
    as the runtime measures it, is stretched by 4 / 1.6."""
    from streamtopo.planner.simulation.simulator import _contention, initial_executors

    sc = load_scenario(scenario(hosts={"count": 1, "cpu": 2, "contention": 0.1}, executors={"initial": 4}))
    executors = initial_executors(sc)
    assert {e.host for e in executors} == {"host-1"}
    got, wait = _contention(sc, executors, np.ones(4))
    assert got == pytest.approx([0.4] * 4) and wait == pytest.approx([0.6] * 4)
    calm, none = _contention(sc, executors[:2], np.full(2, 0.9))
    assert calm == pytest.approx([0.9, 0.9]) and none == pytest.approx([0.0, 0.0])


def test_an_overloaded_host_keeps_what_fits_and_reports_the_shortfall() -> None:
    """7 cores of work on one host of 2: the count never exceeds the host's two one-core executors, every
    decided period says what is missing, and the round does not thrash (migrations within the noise)."""
    result = simulate(example("overload"), rebalance=greedy_rebalance)
    assert result.summary["executors_max"] == 2
    decided = result.periods[1:]
    assert all(p.pending >= 8 for p in decided)  # ceil(7 / 0.7) = 10 wanted, 2 fit
    assert all("capacity exhausted" in p.reason for p in decided), [p.reason for p in decided]
    assert result.periods[-1].backlog > result.periods[1].backlog > 0  # the lag stays at the source


def test_a_crowded_host_scales_down_to_its_cores_and_stops_waiting() -> None:
    """14 executors on 2 cores (saturated, their measured demand stretched by the wait): scaled down at
    once, at most halving, to what the cores run; then the waiting ends and no scale-up returns."""
    result = simulate(example("crowded"), rebalance=greedy_rebalance)
    first = result.periods[0]
    assert first.saturation > 0.25 and first.scaling == "down" and "over-provisioned" in first.reason
    actives = [p.active_executors for p in result.periods]
    assert actives[:4] == [14, 7, 4, 2] and set(actives[3:]) == {2}
    assert result.periods[-1].saturation == 0.0
    assert all(p.scaling != "up" for p in result.periods)


def test_executors_whose_footprint_exceeds_their_request_are_scaled_to_what_the_host_runs() -> None:
    """``streamtopo run``'s case on 2 cores: two executors of one core that take 1.6 cores each when busy.
    Overloaded, they wait for a CPU (saturated): one goes at once, and the room, booked at the footprint,
    takes no second one back, whatever the load asks for (capacity exhausted)."""
    sc = scenario(
        periods=6,
        hosts={"count": 1, "cpu": 2, "contention": 0.05},
        executors={"initial": 2, "placement": "round-robin", "footprint": 1.6},
        workload={"rate": 400_000},
        scaling={
            "rule": "target",
            "minExecutors": 1,
            "maxExecutors": 8,
            "metricWindow": 60,
            "stabilization": 60,
            "scaleDownDelay": 180,
            "scaleUpGrace": 180,
        },
    )
    result = simulate(load_scenario(sc), rebalance=greedy_rebalance)
    first = result.periods[0]
    assert first.saturation > 0.25 and first.scaling == "down" and "over-provisioned by 1" in first.reason
    assert [p.active_executors for p in result.periods[1:]] == [1] * 5
    assert all("capacity exhausted" in p.reason for p in result.periods[2:]), [
        p.reason for p in result.periods
    ]
    # held to their requests (no footprint), the same two executors fit their host and stay
    held = dict(sc, executors={"initial": 2, "placement": "round-robin"})
    kept = simulate(load_scenario(held), rebalance=greedy_rebalance)
    assert kept.periods[0].saturation == 0.0 and {p.active_executors for p in kept.periods} == {2}
