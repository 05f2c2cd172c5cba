"""The first deployment: COLA's PEs as executors, split up to Aeolus' executor count (planner/deployment.py)."""

from __future__ import annotations

import math

import pytest

from streamtopo.planner.cluster import Cluster
from streamtopo.planner.deployment import deployment, split_counts
from streamtopo.planner.model import StreamTopologySpec
from streamtopo.planner.placement.fusion import plan_topology
from streamtopo.planner.scaling.aeolus import aeolus_plan
from streamtopo.planner.scaling.policy import ScalingConfig


def pipeline(rate: float = 100.0, key_groups: int = 6, cpu: float = 0.01) -> StreamTopologySpec:
    """source -> keyed aggregate -> sink, with declared costs small enough for one PE on a 4-core host."""
    return StreamTopologySpec.model_validate(
        {
            "keyGroups": key_groups,
            "operators": [
                {
                    "name": "src",
                    "kind": "source",
                    "source": {"generator": "sequence", "ratePerSecond": rate},
                    "cost": {"cpu": cpu},
                },
                {
                    "name": "agg",
                    "kind": "aggregate",
                    "inputs": ["src"],
                    "keyBy": ["value"],
                    "aggregations": ["count(*) AS n"],
                    "cost": {"cpu": cpu},
                },
                {
                    "name": "out",
                    "kind": "sink",
                    "inputs": ["agg"],
                    "sink": {"console": {}},
                    "cost": {"cpu": cpu},
                },
            ],
        }
    )


def test_split_counts_follow_size_per_executor_and_stop_at_each_pes_key_groups():
    # [1, 1] -> 3/1 > 1/1: [2, 1] -> 3/2 > 1/1: [3, 1]
    assert split_counts([3.0, 1.0], [8, 8], 4) == [3, 1]
    # the first PE has one key group index: it cannot be split, the second takes the rest
    assert split_counts([3.0, 1.0], [1, 8], 3) == [1, 2]
    # more executors than key group indexes anywhere: as many as there are
    assert split_counts([1.0, 1.0], [2, 1], 10) == [2, 1]
    # fewer wanted than PEs: every PE keeps its executor
    assert split_counts([1.0, 1.0, 1.0], [4, 4, 4], 1) == [1, 1, 1]


def test_one_pe_is_split_round_robin_by_key_group_up_to_min_executors():
    spec = pipeline()
    plan = plan_topology(spec, Cluster.uniform(1, 4.0))
    assert len(plan.pes) == 1  # COLA fuses the light job into one PE
    planned = deployment(plan, spec, "t", ScalingConfig(min_executors=3), cpu=1.0)
    assert planned.wanted == 3 and planned.splits == (3,)
    assert sorted(planned.executors) == ["t-e0", "t-e1", "t-e2"]
    # unit (op, kg) on executor kg mod 3: the one-to-one edges of a key group stay on one executor
    assert planned.units == {(op, kg): f"t-e{kg % 3}" for op in ("src", "agg", "out") for kg in range(6)}
    assert {e.host for e in planned.executors.values()} == {plan.pes[0].host}
    assert all(e.cpu == 1.0 for e in planned.executors.values())


def test_the_count_is_aeolus_demand_at_the_target_utilisation_within_bounds():
    spec = pipeline(rate=50_000.0, cpu=0.5)
    plan = plan_topology(spec, Cluster.uniform(1, 64.0))
    demand = aeolus_plan(spec).demand
    assert demand > 1.5  # declared 1.5 cores plus shipping
    planned = deployment(plan, spec, "t", ScalingConfig(target_utilization=0.5))
    assert planned.wanted == len(planned.executors) == math.ceil(demand / 0.5)
    assert planned.demand == pytest.approx(demand)
    capped = deployment(plan, spec, "t", ScalingConfig(target_utilization=0.5, max_executors=2))
    assert len(capped.executors) == 2
    # the executors request their share of the PE's size, at least a tenth of a core
    share = plan.pes[0].size / len(planned.executors)
    assert all(
        e.cpu == pytest.approx(max(0.1, math.ceil(share * 10) / 10)) for e in planned.executors.values()
    )


def test_a_local_run_leaves_ha_replicas_out():
    doc = pipeline().model_dump(by_alias=True, exclude_none=True)
    doc["constraints"] = {"highAvailability": [{"operators": ["agg"], "replicas": 2}]}
    spec = StreamTopologySpec.model_validate(doc)
    plan = plan_topology(spec, Cluster.uniform(2, 4.0))
    everything = deployment(plan, spec, "t", ScalingConfig())
    local = deployment(plan, spec, "t", ScalingConfig(), replicas=False)
    assert {op for op, _ in everything.units} == {"src", "agg", "agg~r1", "out"}
    assert {op for op, _ in local.units} == {"src", "agg", "out"}
    assert set(local.executors) <= set(everything.executors)
