"""COLA's profiling loop on a running deployment (Khandekar et al., Section 4): measured costs -> graph
weights -> a COLA plan with the iteration's gamma -> executors that keep their names where they keep units."""

from __future__ import annotations

import pytest

from streamtopo.contracts import ExecutorEntry, RoutingTable
from streamtopo.planner.cluster import Cluster
from streamtopo.planner.deployment import Deployment, keep_names
from streamtopo.planner.graph import CommCostModel, logical_graph, unit_graph
from streamtopo.planner.model import StreamTopologySpec
from streamtopo.planner.placement.cola.profiling import (
    Profile,
    crossing_cost,
    iteration_gamma,
    measured_costs,
)
from streamtopo.planner.placement.fusion import plan_topology


def chain(profile_iterations: int = 2) -> StreamTopologySpec:
    """src -> clean -> agg (keyed) -> out, 2 key groups; declared costs make every operator heavy."""
    return StreamTopologySpec.model_validate(
        {
            "keyGroups": 2,
            "fusion": {"profileIterations": profile_iterations},
            "operators": [
                {
                    "name": "src",
                    "kind": "source",
                    "source": {"generator": "sequence", "ratePerSecond": 1000},
                    "cost": {"cpu": 0.9},
                },
                {
                    "name": "clean",
                    "kind": "filter",
                    "inputs": ["src"],
                    "expr": "seq >= 0",
                    "cost": {"cpu": 0.9},
                },
                {
                    "name": "agg",
                    "kind": "aggregate",
                    "inputs": ["clean"],
                    "keyBy": ["key"],
                    "aggregations": ["count(*) AS n"],
                    "cost": {"cpu": 0.9},
                },
                {
                    "name": "out",
                    "kind": "sink",
                    "inputs": ["agg"],
                    "sink": {"console": {}},
                    "cost": {"cpu": 0.9},
                },
            ],
        }
    )


def light_profile(gamma: float = 0.5) -> Profile:
    """What a run measured: 0.05 cores per unit, 500 records/s on each one-to-one edge (kg i -> kg i) of
    src -> clean, all-to-all 250 records/s per pair into agg, 10 records/s per pair into out."""
    busy = {(op, kg): 0.05 for op in ("src", "clean", "agg", "out") for kg in range(2)}
    traffic = {(("src", i), ("clean", i)): 500.0 for i in range(2)}
    traffic |= {(("clean", i), ("agg", j)): 250.0 for i in range(2) for j in range(2)}
    traffic |= {(("agg", i), ("out", j)): 10.0 for i in range(2) for j in range(2)}
    return Profile(busy, traffic, gamma)


def test_iteration_gamma_rises_from_half_by_a_tenth_and_stays_at_one():
    assert [iteration_gamma(k) for k in range(1, 9)] == [0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.0, 1.0]


def test_measured_costs_by_hand_on_the_logical_and_the_unit_graph():
    spec = chain()
    comm = CommCostModel()
    per_record = comm.per_record + 64 * comm.per_byte  # 64-byte records: 2.32 us
    costs = measured_costs(logical_graph(spec), light_profile(), comm)
    # w_v: the operator's units' busy cores summed; w_e: records/s x the per-record transport cost
    assert costs.operators == pytest.approx({"src": 0.1, "clean": 0.1, "agg": 0.1, "out": 0.1})
    assert costs.streams[("src", "clean")] == pytest.approx(1000 * per_record)
    assert costs.streams[("clean", "agg")] == pytest.approx(1000 * per_record)
    assert costs.streams[("agg", "out")] == pytest.approx(40 * per_record)
    units = measured_costs(unit_graph(spec), light_profile(), comm)
    assert units.operators[("agg", 1)] == pytest.approx(0.05)
    assert units.streams[(("clean", 0), ("agg", 1))] == pytest.approx(250 * per_record)
    assert (("src", 0), ("clean", 1)) not in units.streams  # one-to-one: no such arc


def test_crossing_cost_is_the_executors_cpu_outside_operators_per_record_that_crossed():
    profile = light_profile()
    # src and clean on e0, agg and out on e1: only clean -> agg crosses (4 pairs x 250 = 1000 records/s)
    placement = {(op, kg): ("e0" if op in ("src", "clean") else "e1") for op, kg in profile.busy}
    # the executors used 0.9 cores, their units 0.4 busy: 0.5 cores of overhead over 1000 crossing rec/s
    per_record = crossing_cost(0.9, profile.busy, profile.traffic, placement)
    assert per_record == pytest.approx(0.5 / 1000)
    measured = Profile(profile.busy, profile.traffic, 0.5, per_record)
    costs = measured_costs(logical_graph(chain()), measured)
    # every arc is priced at the measured cost (what it would cost cut), not the 2.3 us transport model
    assert costs.streams[("src", "clean")] == pytest.approx(1000 * 0.5 / 1000)
    assert costs.streams[("agg", "out")] == pytest.approx(40 * 0.5 / 1000)
    assert costs.operators["agg"] == pytest.approx(0.1)  # w_v stays the units' busy cores
    # nothing crossed, or no overhead: nothing to learn, the transport model prices the cut
    assert crossing_cost(0.9, profile.busy, profile.traffic, dict.fromkeys(profile.busy, "e0")) is None
    assert crossing_cost(0.3, profile.busy, profile.traffic, placement) is None


def test_profiling_starts_with_none_and_replans_cola_on_the_measured_costs():
    spec = chain()
    cluster = Cluster.uniform(2, 2.0)
    first = plan_topology(spec, cluster)
    assert first.algorithm == "none" and len(first.pes) == 4  # iteration 0: every operator alone
    # On the declared costs (3.6 cores) COLA cannot fuse the chain onto 2-core hosts ...
    declared = plan_topology(chain(profile_iterations=0), cluster)
    assert declared.algorithm == "cola" and len(declared.pes) >= 2
    # ... measured, the job is 0.4 cores: one PE, even at gamma 0.5 (1 core per host)
    measured = plan_topology(spec, cluster, profile=light_profile(0.5))
    assert measured.algorithm == "cola" and len(measured.pes) == 1
    assert measured.pes[0].size == pytest.approx(0.4)  # the measured busy cores; no stream is cut
    assert sorted(measured.load.values()) == pytest.approx([0.0, 0.4])


def test_keep_names_keeps_each_executor_where_it_keeps_most_units_on_its_host():
    previous = RoutingTable(
        topology="t",
        version=3,
        executors={
            "t-e0": ExecutorEntry(host="h1"),
            "t-e1": ExecutorEntry(host="h1"),
            "t-e2": ExecutorEntry(host="h2"),
        },
        units={"a/0": "t-e0", "b/0": "t-e1", "c/0": "t-e1", "d/0": "t-e2"},
    )
    planned = Deployment(
        executors={"t-e0": ExecutorEntry(host="h1"), "t-e1": ExecutorEntry(host="h2")},
        units={("a", 0): "t-e0", ("b", 0): "t-e0", ("c", 0): "t-e0", ("d", 0): "t-e1"},
        splits=(1, 1),
        wanted=1,
        demand=0.1,
    )
    kept = keep_names(planned, previous)
    # the PE of a, b, c on h1 shares 2 units with t-e1 and 1 with t-e0: it is t-e1; d stays on t-e2
    assert kept.units == {("a", 0): "t-e1", ("b", 0): "t-e1", ("c", 0): "t-e1", ("d", 0): "t-e2"}
    assert set(kept.executors) == {"t-e1", "t-e2"}
    # an executor on another host never takes a running one's name: a fresh index instead
    moved = Deployment(
        executors={"t-e0": ExecutorEntry(host="h3")},
        units={("a", 0): "t-e0", ("b", 0): "t-e0", ("c", 0): "t-e0", ("d", 0): "t-e0"},
        splits=(1,),
        wanted=1,
        demand=0.1,
    )
    assert set(keep_names(moved, previous).executors) == {"t-e3"}
