"""ALBIC's Algorithm 2: scores (step 1), sets and partitions (step 2), the three cases (step 3), the
maxPL back-off (step 4), and the collocation constraints carried across rounds."""

from __future__ import annotations

from dataclasses import replace

import pytest

from streamtopo.planner.allocation import AllocationState, ExecutorInfo, KeyGroupStats
from streamtopo.planner.rebalance.albic import AlbicConfig, MilpConfig, albic_rebalance
from streamtopo.planner.rebalance.albic.collocation import (
    Scores,
    calc_scores,
    calc_sets,
    graph_part,
    improve_collocation,
)
from streamtopo.planner.rebalance.albic.state import index_state

MILP = MilpConfig(deterministic_time=5.0, mean_rounding="exact")


def chain_state(loads: dict, where: dict, traffic: dict, executors=("e0", "e1")) -> AllocationState:
    kgs = [KeyGroupStats(id=kg, load=load) for kg, load in loads.items()]
    return AllocationState([ExecutorInfo(name=e) for e in executors], kgs, dict(where), traffic)


def test_scores_follow_lines_2_to_12():
    a0, a1, b0, b1, c0 = ("a", 0), ("a", 1), ("b", 0), ("b", 1), ("c", 0)
    traffic = {(a0, b0): 90.0, (a0, b1): 10.0, (a1, b0): 50.0, (a1, b1): 50.0, (b0, c0): 10.0}
    loads = dict.fromkeys([a0, a1, b0, b1, c0], 1.0)
    where = {a0: "e0", b0: "e0", a1: "e1", b1: "e0", c0: "e1"}
    scores = calc_scores(chain_state(loads, where, traffic), score_factor=1.5)
    # avg(a0) = 100 / 2 downstream key groups = 50; 90 > 75 qualifies, 10 does not.
    # avg(a1) = 50; 50 > 75 fails. avg(b0) = 10 / 1 = 10; 10 > 15 fails.
    assert scores.col_grps == [(a0, b0)]
    assert scores.to_be_col_grps == []
    where[b0] = "e1"
    scores = calc_scores(chain_state(loads, where, traffic), score_factor=1.5)
    assert scores.col_grps == [] and scores.to_be_col_grps == [((a0, b0), 90.0)]
    # sF = 1 admits a pair that sends exactly... more than the average only.
    assert calc_scores(chain_state(loads, where, traffic), score_factor=1.0).to_be_col_grps == [
        ((a0, b0), 90.0)
    ]


def test_sets_are_merged_into_minimal_sets():
    x, y, z, p, q = ("o", 1), ("o", 2), ("o", 3), ("o", 4), ("o", 5)
    assert calc_sets([(x, y), (p, q), (y, z)]) == [[x, y, z], [p, q]]


def test_partitions_respect_max_partition_load_and_the_migration_limit():
    members = [("o", i) for i in range(6)]
    chain = {(members[i], members[i + 1]): 10.0 for i in range(5)}
    load = dict.fromkeys(members, 10.0)
    mc = dict.fromkeys(members, 1.0)
    parts = graph_part(members, load, mc, chain, max_pl=25, max_cost=20)
    assert sorted(m for p in parts for m in p) == members
    assert all(sum(load[m] for m in p) <= 25 for p in parts)
    light = dict.fromkeys(members, 1.0)
    parts = graph_part(members, light, mc, chain, max_pl=25, max_cost=2)
    assert all(len(p) <= 2 for p in parts)  # Pmc <= maxMigrCost (count bound 2)
    assert graph_part(members, light, mc, chain, max_pl=0, max_cost=20) == [[m] for m in members]


@pytest.fixture
def three_case_state():
    # e0 holds b0 + b1 = 20, e1 holds a0 + a1 = 30. Pairs a_i -> b_i communicate.
    a0, b0, a1, b1 = ("a", 0), ("b", 0), ("a", 1), ("b", 1)
    loads = {a0: 5.0, b0: 5.0, a1: 25.0, b1: 15.0}
    where = {a0: "e1", b0: "e0", a1: "e1", b1: "e0"}
    return chain_state(loads, where, {(a0, b0): 100.0, (a1, b1): 1.0})


def test_case_1_collocates_on_the_less_loaded_node(three_case_state):
    ix = index_state(three_case_state)
    pair = (("a", 0), ("b", 0))
    [new] = improve_collocation(three_case_state, ix, Scores([], [(pair, 100.0)]), [], set(), 20, None, 0)
    assert new.case == 1 and ix.names[new.node] == "e0" and new.members == sorted(pair)


def test_case_2_collocates_where_the_set_member_is(three_case_state):
    ix = index_state(three_case_state)
    pair = (("a", 0), ("b", 0))
    part = [("a", 0), ("a", 1)]  # a0 belongs to a collocated set on e1 (the busier node)
    [new] = improve_collocation(
        three_case_state, ix, Scores([], [(pair, 100.0)]), [part], set(part), 20, None, 0
    )
    assert new.case == 2 and ix.names[new.node] == "e1"
    assert new.members == sorted([*part, ("b", 0)])
    part_b = [("b", 0), ("b", 1)]  # b0 in a set on e0
    [new] = improve_collocation(
        three_case_state, ix, Scores([], [(pair, 100.0)]), [part_b], set(part_b), 20, None, 0
    )
    assert new.case == 2 and ix.names[new.node] == "e0"


def test_case_3_moves_both_partitions_to_the_less_loaded_node(three_case_state):
    ix = index_state(three_case_state)
    pair = (("a", 0), ("b", 0))
    parts = [[("a", 0), ("a", 1)], [("b", 0), ("b", 1)]]
    sets = {m for p in parts for m in p}
    [new] = improve_collocation(three_case_state, ix, Scores([], [(pair, 100.0)]), parts, sets, 20, None, 0)
    assert new.case == 3 and ix.names[new.node] == "e0"  # e0 holds 20 < e1's 30
    assert new.members == sorted(sets)


def test_a_pair_beyond_the_migration_limit_is_skipped(three_case_state):
    ix = index_state(three_case_state)
    parts = [[("a", 0), ("a", 1)], [("b", 0), ("b", 1)]]
    sets = {m for p in parts for m in p}
    pair = (("a", 0), ("b", 0))
    assert (
        improve_collocation(three_case_state, ix, Scores([], [(pair, 100.0)]), parts, sets, 1, None, 0) == []
    )


def many_pairs_state(pairs: int = 6) -> AllocationState:
    """``pairs`` pairs a_i -> b_i, a_i on e0 and b_i on e1, every pair apart; a_i sends 100 - i."""
    loads = {(o, i): 1.0 for o in "ab" for i in range(pairs)}
    where = {(o, i): "e0" if o == "a" else "e1" for o, i in loads}
    return chain_state(loads, where, {(("a", i), ("b", i)): 100.0 - i for i in range(pairs)})


@pytest.mark.parametrize("count, budget, chosen", [(1, 20, 1), (4, 20, 4), (10, 20, 6), (10, 3, 3)])
def test_several_new_constraints_per_round_take_the_best_disjoint_pairs_within_the_budget(
    count, budget, chosen
):
    """newCollocations > 1: Step 3 repeated in its order (the largest out() first) while the round's
    forced moves together fit the migration budget (each case-1 pair moves one key group)."""
    state = many_pairs_state()
    ix = index_state(state)
    scores = calc_scores(state, score_factor=1.0)
    new = improve_collocation(state, ix, scores, [], set(), budget, None, 0, count)
    assert [c.pair for c in new] == [(("a", i), ("b", i)) for i in range(chosen)]
    assert len({m for c in new for m in c.members}) == 2 * chosen  # no key group in two constraints
    nodes = [ix.names[c.node] for c in new]
    assert nodes.count("e0") and nodes.count("e1") or chosen == 1  # each added load steers the next


def test_a_round_with_several_new_constraints_collocates_them_all():
    state = many_pairs_state()
    config = AlbicConfig(milp=MILP, score_factor=1.0, new_collocations=4)
    result = albic_rebalance(state, max_migrations=8, config=config)
    assert len(result.details["new_constraints"]) == 4
    for c in result.details["new_constraints"]:
        a, b = c["pair"]
        assert result.assignment[a] == result.assignment[b] == c["executor"]
    assert len(result.migrations) <= 8


def test_round_collocates_the_best_pair(three_case_state):
    result = albic_rebalance(three_case_state, max_migrations=4, config=AlbicConfig(milp=MILP))
    assert result.assignment[("a", 0)] == result.assignment[("b", 0)] == "e0"
    assert [c["case"] for c in result.details["new_constraints"]] == [1]
    assert (("a", 0), ("b", 0)) in result.details["collocation_constraints"]


def backoff_state() -> AllocationState:
    """Two chains of four operators (key groups 0 and 1), chain 0 collocated on e0, chain 1 on e1."""
    ops = ["o0", "o1", "o2", "o3"]
    loads = {(o, 0): v for o, v in zip(ops, [16.0, 8.0, 8.0, 8.0])}
    loads.update({(o, 1): 1.0 for o in ops})
    where = {kg: "e0" if kg[1] == 0 else "e1" for kg in loads}
    traffic = {((ops[t], j), (ops[t + 1], j)): 100.0 for t in range(3) for j in (0, 1)}
    return chain_state(loads, where, traffic)


@pytest.mark.parametrize("max_ld", [0.0, 2.5, 100.0])
def test_backoff_lowers_max_partition_load_by_step_while_distance_too_large(max_ld):
    config = AlbicConfig(max_load_distance=max_ld, milp=MILP)
    result = albic_rebalance(backoff_state(), max_migrations=8, config=config)
    trace = result.details["trace"]
    assert trace[0][0] == 25.0
    assert [pl for pl, _ in trace] == [25.0 - 5.0 * i for i in range(len(trace))]
    assert all(ld > max_ld for _, ld in trace[:-1])
    last_pl, last_ld = trace[-1]
    assert last_ld <= max_ld or last_pl <= 0
    assert result.details["backoffs"] == len(trace) - 1
    assert result.load_distance == pytest.approx(last_ld)


def test_backoff_reaches_the_plain_milp_when_nothing_else_works():
    result = albic_rebalance(
        backoff_state(), max_migrations=8, config=AlbicConfig(max_load_distance=0.0, milp=MILP)
    )
    assert result.details["max_partition_load"] <= 0
    assert result.details["new_constraints"] == []


def test_collocation_constraints_are_carried_across_rounds():
    from streamtopo.planner.simulation.workloads import SyntheticSetting, drift, synthetic_state

    state = synthetic_state(SyntheticSetting(6, 48, 4, varies=0, one_to_one=0.5), seed=4)
    config = AlbicConfig(milp=MilpConfig(deterministic_time=1.0))
    first = albic_rebalance(state, max_migrations=6, config=config)
    kept = first.details["collocation_constraints"]
    assert kept and all(first.assignment[a] == first.assignment[b] for a, b in kept)
    nxt = drift(replace(state, assignment=first.assignment), seed=1)
    second = albic_rebalance(
        nxt, max_migrations=6, config=config.model_copy(update={"collocations": tuple(kept)}), seed=1
    )
    [pair] = [c["pair"] for c in first.details["new_constraints"]]
    assert pair in second.details["collocation_constraints"]
    assert all(
        second.assignment[a] == second.assignment[b] for a, b in second.details["collocation_constraints"]
    )
    assert len(second.migrations) <= 6
