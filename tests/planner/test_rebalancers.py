"""The REBALANCERS registry and the baselines (Flux, PoTC, C-MR, COLA re-optimisation), each against a
hand computation; the shared contract (bound, set B, bad input) for every policy."""

from __future__ import annotations

import math

import pytest

from streamtopo.planner.allocation import AllocationState, ExecutorInfo, KeyGroupStats
from streamtopo.planner.rebalance.albic import AlbicConfig, MilpConfig
from streamtopo.planner.rebalance.albic.metrics import collocation_factor
from streamtopo.planner.rebalance.cmr import cmr_rebalance
from streamtopo.planner.rebalance.cola_reoptimise import ColaReoptConfig, cola_rebalance
from streamtopo.planner.rebalance.flux import flux_rebalance
from streamtopo.planner.rebalance.potc import PotcConfig, potc_rebalance
from streamtopo.planner.rebalance.registry import CONFIGS, REBALANCERS, rebalance
from streamtopo.planner.simulation.workloads import SyntheticSetting, synthetic_state

QUICK = {
    "albic": AlbicConfig(milp=MilpConfig(deterministic_time=1.0)),
    "milp": MilpConfig(deterministic_time=1.0),
}


def simple(loads: list[float], where: list[int], n_ex: int, rates=None, caps=None) -> AllocationState:
    ids = [("a", k) for k in range(len(loads))]
    kgs = [
        KeyGroupStats(id=ids[k], load=loads[k], rate=0.0 if rates is None else rates[k])
        for k in range(len(loads))
    ]
    executors = [ExecutorInfo(name=f"e{i}", capacity=1.0 if caps is None else caps[i]) for i in range(n_ex)]
    return AllocationState(executors, kgs, {ids[k]: f"e{where[k]}" for k in range(len(loads))})


def test_registry_names_and_configs():
    assert set(REBALANCERS) == {"albic", "milp", "flux", "potc", "cola", "cmr"} == set(CONFIGS)
    with pytest.raises(ValueError, match="unknown rebalancing policy"):
        rebalance("nope", simple([1], [0], 1))
    with pytest.raises(ValueError, match="expects a FluxConfig"):
        rebalance("flux", simple([1], [0], 1), config=PotcConfig())


@pytest.mark.parametrize("policy", sorted(REBALANCERS))
def test_every_policy_keeps_the_contract(policy):
    base = synthetic_state(SyntheticSetting(6, 36, 3, varies=20, one_to_one=0.5), seed=2)
    executors = [ExecutorInfo(name=e.name, marked_for_removal=e.name == "n5") for e in base.executors]
    state = AllocationState(executors, base.key_groups, base.assignment, base.traffic)
    result = rebalance(policy, state, max_migrations=5, config=QUICK.get(policy), seed=1)
    assert set(result.assignment) == {kg.id for kg in state.key_groups}
    moved = [kg for kg in result.assignment if result.assignment[kg] != state.assignment[kg]]
    assert sorted(moved) == sorted(m[0] for m in result.migrations)
    assert all(result.assignment[kg] != "n5" for kg in moved)  # set B never receives
    if policy == "cola":
        assert result.details["bound_exceeded"] == (len(moved) > 5)
    else:
        assert len(moved) <= 5
    assert 0.0 <= result.collocation_factor <= 1.0
    assert math.isfinite(result.load_distance)


@pytest.mark.parametrize("policy", sorted(REBALANCERS))
def test_every_policy_rejects_bad_statistics(policy):
    state = simple([1.0, float("nan")], [0, 1], 2)
    with pytest.raises(ValueError, match=r"key_groups\[\('a', 1\)\]\.load"):
        rebalance(policy, state, max_migrations=1, config=QUICK.get(policy))
    zero = AllocationState(
        [ExecutorInfo(name="e0", capacity=0.0)], [KeyGroupStats(id=("a", 0), load=1.0)], {("a", 0): "e0"}
    )
    with pytest.raises(ValueError, match="capacity"):
        rebalance(policy, zero, config=QUICK.get(policy))


def test_flux_moves_the_biggest_suitable_partition():
    # e0 holds 10, 6, 3 (19 %), e1 holds 1 (1 %).
    # Pass 1: pair (e0, e1), gap 18: every key group is suitable, the biggest (10) moves -> 9 / 11.
    # Pass 2: pair (e1, e0), gap 2: only a key group below 2 is suitable: the 1 moves -> 10 / 10.
    state = simple([10, 6, 3, 1], [0, 0, 0, 1], 2)
    result = flux_rebalance(state, max_migrations=5)
    assert sorted(m[0] for m in result.migrations) == [("a", 0), ("a", 3)]
    assert result.load_distance == pytest.approx(0.0)
    bounded = flux_rebalance(state, max_migrations=1)
    assert [m[0] for m in bounded.migrations] == [("a", 0)]


def test_potc_splits_and_pays_the_merge_overhead():
    # One key group of load 10 on e0; its second choice is e1. Water-filling from empty loads splits it
    # 5 / 5, and the owner e0 pays the merge: 0.1 * 10 = 1 -> loads 6 and 5, mean 5, distance 1.
    state = simple([10.0], [0], 2)
    result = potc_rebalance(state, config=PotcConfig(merge_overhead=0.1))
    assert result.details["shares"][("a", 0)] == {"e0": pytest.approx(0.5), "e1": pytest.approx(0.5)}
    assert result.details["executor_loads"] == {"e0": pytest.approx(6.0), "e1": pytest.approx(5.0)}
    assert result.load_distance == pytest.approx(1.0)
    assert result.migrations == []


def test_cmr_follows_equation_4_5():
    # One operator, e0 holds a0 (40 %, 400 rec/s) and a1 (20 %, 200 rec/s); e1 holds a2 (10 %, 100 rec/s).
    state = simple([40, 20, 10], [0, 0, 1], 2, rates=[400, 200, 100])
    P = 0.7 / 700  # CPU seconds per record
    D0, D1 = 600.0, 100.0

    def W(D):  # derived M/M/1 wait per record
        rho = D * P
        return rho * P / ((1 - rho) * D)

    W0, W1 = W(D0), W(D1)

    def total(d0, d1):  # Eq. 4.2 weighted by volume, W fixed
        return (P + W0 * d0) * d0 + (P + W1 * d1) * d1

    assert total(D0, D1) > total(D0 - 400, D1 + 400)  # Eq. 4.5 holds for a0: it moves
    assert not total(D0 - 400, D1 + 400) > total(0, D1 + 600)  # and then fails for a1: it stays
    result = cmr_rebalance(state, max_migrations=5)
    assert [m[:3] for m in result.migrations] == [(("a", 0), "e0", "e1")]


def test_cola_reoptimisation_finds_the_perfect_collocation_and_ignores_the_bound():
    ops = ["x", "y"]
    kgs = [KeyGroupStats(id=(o, j), load=10.0) for o in ops for j in range(4)]
    where = {("x", j): f"e{j}" for j in range(4)} | {("y", j): f"e{(j + 1) % 4}" for j in range(4)}
    traffic = {(("x", j), ("y", j)): 100.0 for j in range(4)}
    state = AllocationState([ExecutorInfo(name=f"e{i}") for i in range(4)], kgs, where, traffic)
    result = cola_rebalance(state, max_migrations=1)
    assert result.collocation_factor == pytest.approx(1.0)  # every x_j with its y_j
    assert result.load_distance == pytest.approx(0.0)
    assert len(result.migrations) == 4 and result.details["bound_exceeded"]


def test_cola_reoptimisation_splits_until_its_load_distance_is_within_max_ld():
    """ALBIC Section 5.3: COLA's partitions are split until the load-distance requirement holds (gamma
    falls from mean + maxLD); the plan ignores the current allocation, so nearly everything moves."""
    state = synthetic_state(SyntheticSetting(20, 400, 10, varies=0, one_to_one=0.5), seed=1)
    result = cola_rebalance(state, max_migrations=20, config=ColaReoptConfig(max_load_distance=5.0))
    assert result.details["engine"] == "cola"
    assert result.load_distance <= 5.0 and result.details["plan_load_distance"] <= 5.0
    assert result.details["gamma"] <= 0.5 + 0.05 + 1e-9  # mean utilisation 50 % plus maxLD at most
    assert len(result.migrations) > 200 and result.details["bound_exceeded"]
    assert result.collocation_factor > collocation_factor(state, state.assignment)
