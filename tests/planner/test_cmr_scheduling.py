"""C-MR's scheduling policies (thesis Sec. 3.7): Table 3.4's ranks on hand-made queues, Eq. 3.1's hybrid against
the Beta CDF, and the allotment contract (budget, rank order, bad input)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import betainc

from streamtopo.planner.cmr_scheduling import (
    POLICIES,
    UnitQueue,
    allot,
    choose_policy,
    cto_order,
    mem_probability,
    memory_fraction,
    ranks,
)


def q(
    unit: str,
    records: int = 10,
    front_ts: float = 0.0,
    in_bytes: float = 100.0,
    out_bytes: float = 100.0,
    selectivity: float = 1.0,
    seconds_per_record: float = 0.001,
    bfs_order: int = 0,
) -> UnitQueue:
    return UnitQueue(
        unit=unit,
        records=records,
        bytes=int(records * in_bytes),
        front_ts=front_ts,
        in_bytes=in_bytes,
        out_bytes=out_bytes,
        selectivity=selectivity,
        seconds_per_record=seconds_per_record,
        bfs_order=bfs_order,
    )


def by_rank(queues, policy) -> list[str]:
    r = ranks(queues, policy)
    return sorted(r, key=lambda u: -r[u])


def test_odf_serves_the_oldest_front_and_ydf_the_youngest():
    queues = [q("a/0", front_ts=5.0), q("b/0", front_ts=1.0), q("c/0", front_ts=3.0)]
    assert by_rank(queues, "odf") == ["b/0", "c/0", "a/0"]
    assert by_rank(queues, "ydf") == ["a/0", "c/0", "b/0"]
    assert ranks(queues, "odf")["b/0"] == -1.0 and ranks(queues, "ydf")["b/0"] == 1.0


def test_cto_order_is_a_bfs_from_the_sinks():
    # src -> parse -> {enrich -> score -> out1, agg -> out2}. BFS from the sinks (out1, out2 by name) against
    # the arcs visits out1, out2, then score (above out1), agg (above out2), enrich (above score), parse, src.
    downstream = {
        "src": ["parse"],
        "parse": ["enrich", "agg"],
        "enrich": ["score"],
        "score": ["out1"],
        "agg": ["out2"],
    }
    order = cto_order(downstream)
    assert order == {"out1": 0, "out2": 1, "score": 2, "agg": 3, "enrich": 4, "parse": 5, "src": 6}
    queues = [q(f"{op}/0", bfs_order=order[op]) for op in ("parse", "score", "agg", "enrich")]
    assert by_rank(queues, "cto") == ["score/0", "agg/0", "enrich/0", "parse/0"]


def test_mem_ranks_by_bytes_freed_per_second():
    queues = [
        # A filter: 100 B in, half the records out at 100 B, 1 ms each -> (100 - 50) / 0.001 = 50 000 B/s.
        q("filter/0", in_bytes=100, out_bytes=100, selectivity=0.5, seconds_per_record=0.001),
        # A costly reducer: (1000 - 100) / 0.1 = 9 000 B/s.
        q("reduce/0", in_bytes=1000, out_bytes=100, selectivity=1.0, seconds_per_record=0.1),
        # An expanding map grows memory: (10 - 2 * 50) / 0.001 = -90 000 B/s.
        q("explode/0", in_bytes=10, out_bytes=50, selectivity=2.0, seconds_per_record=0.001),
    ]
    r = ranks(queues, "mem")
    assert r["filter/0"] == pytest.approx(50_000)
    assert r["reduce/0"] == pytest.approx(9_000)
    assert r["explode/0"] == pytest.approx(-90_000)
    assert by_rank(queues, "mem") == ["filter/0", "reduce/0", "explode/0"]


def test_hybrid_probability_is_zero_below_the_threshold_and_the_beta_cdf_above():
    for x in (0.0, 0.2, 0.49999):
        assert mem_probability(x) == 0.0
    # With beta = 1 the Beta CDF is u ** alpha: an independent closed form of Eq. 3.1.
    for x in (0.5, 0.6, 0.75, 0.9, 1.0):
        assert mem_probability(x) == pytest.approx(((x - 0.5) / 0.5) ** 2.5, abs=1e-12)
    assert mem_probability(1.7) == 1.0  # over budget: always MEM
    assert mem_probability(0.8, threshold=0.6, alpha=2.0, beta=3.0) == pytest.approx(betainc(2.0, 3.0, 0.5))


@pytest.mark.parametrize("x", [0.3, 0.55, 0.7, 0.85, 0.95])
def test_hybrid_draws_mem_with_the_beta_cdf_frequency(x):
    rng = np.random.default_rng(7)
    n = 20_000
    hits = sum(choose_policy(x, rng) == "mem" for _ in range(n))
    p = 0.0 if x < 0.5 else float(betainc(2.5, 1.0, (x - 0.5) / 0.5))
    assert abs(hits / n - p) <= 4 * math.sqrt(p * (1 - p) / n) + 1e-12
    if x < 0.5:
        assert hits == 0


def test_choose_policy_is_reproducible_under_a_seed():
    a, b = np.random.default_rng(11), np.random.default_rng(11)
    assert [choose_policy(0.8, a) for _ in range(50)] == [choose_policy(0.8, b) for _ in range(50)]


def test_allot_serves_in_rank_order_up_to_the_budget():
    queues = [
        q("a/0", records=30, front_ts=3.0),
        q("b/0", records=50, front_ts=1.0),
        q("c/0", records=40, front_ts=2.0),
    ]
    # ODF: b (oldest) fully, then c up to what is left, a gets nothing.
    assert allot(queues, 70, "odf") == {"b/0": 50, "c/0": 20, "a/0": 0}
    assert allot(queues, 70, "ydf") == {"a/0": 30, "c/0": 40, "b/0": 0}


def test_allot_gives_everything_when_the_budget_covers_all_queues():
    queues = [q("a/0", records=30, front_ts=3.0), q("b/0", records=0, front_ts=1.0), q("c/0", records=40)]
    for policy in POLICIES:
        assert allot(queues, 70, policy) == {"a/0": 30, "b/0": 0, "c/0": 40}
        assert allot(queues, 1000, policy) == {"a/0": 30, "b/0": 0, "c/0": 40}


def test_allot_in_seconds_charges_each_record_its_processing_time():
    queues = [
        q("slow/0", records=10, front_ts=0.0, seconds_per_record=0.1),
        q("fast/0", records=100, front_ts=1.0, seconds_per_record=0.001),
    ]
    # ODF serves slow first: 0.25 s buys 2 of its records (0.2 s); the 0.05 s left buys 50 fast ones.
    assert allot(queues, 0.25, "odf", budget_unit="seconds") == {"slow/0": 2, "fast/0": 50}


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("budget_unit", ["records", "seconds"])
def test_allot_never_exceeds_the_budget_and_respects_the_ranking(policy, budget_unit):
    rng = np.random.default_rng(5)
    for trial in range(200):
        n = int(rng.integers(1, 8))
        queues = [
            q(
                f"op{i}/{trial}",
                records=int(rng.integers(0, 50)),
                front_ts=float(rng.uniform(0, 10)),
                in_bytes=float(rng.uniform(10, 500)),
                out_bytes=float(rng.uniform(10, 500)),
                selectivity=float(rng.uniform(0, 2)),
                seconds_per_record=float(rng.uniform(1e-4, 1e-2)),
                bfs_order=int(rng.integers(0, 5)),
            )
            for i in range(n)
        ]
        budget = float(rng.uniform(0, 0.3)) if budget_unit == "seconds" else int(rng.integers(0, 150))
        got = allot(queues, budget, policy, budget_unit)
        cost = {x.unit: (1.0 if budget_unit == "records" else x.seconds_per_record) for x in queues}
        assert all(0 <= got[x.unit] <= x.records for x in queues)
        used = sum(got[u] * cost[u] for u in got)
        assert used <= budget * (1 + 1e-8)
        r = ranks(queues, policy)
        ordered = sorted(queues, key=lambda x: -r[x.unit])
        for i, x in enumerate(ordered):
            if got[x.unit] < x.records:
                # Not fully served: what was left could not buy one more of its records...
                assert budget - used < cost[x.unit] + 1e-8 * budget
                if budget_unit == "records":
                    # ... and with a record budget no lower-ranked queue got anything.
                    assert all(got[y.unit] == 0 for y in ordered[i + 1 :] if r[y.unit] < r[x.unit])


def test_memory_fraction_counts_queues_and_state():
    queues = [q("a/0", records=10, in_bytes=100), q("b/0", records=5, in_bytes=40)]
    assert memory_fraction(queues, limit_bytes=4000, state_bytes=800) == pytest.approx(
        (1000 + 200 + 800) / 4000
    )


def test_bad_input_names_the_argument():
    queues = [q("a/0")]
    with pytest.raises(ValueError, match="policy"):
        ranks(queues, "lifo")
    with pytest.raises(ValueError, match="policy"):
        allot(queues, 10, "hybrid")
    with pytest.raises(ValueError, match="budget"):
        allot(queues, -1, "odf")
    with pytest.raises(ValueError, match="budget"):
        allot(queues, math.inf, "odf")
    with pytest.raises(ValueError, match="budget_unit"):
        allot(queues, 10, "odf", budget_unit="bytes")
    with pytest.raises(ValueError, match="queues"):
        allot([q("a/0"), q("a/0")], 10, "odf")
    with pytest.raises(ValueError, match="memory_fraction"):
        choose_policy(-0.1, np.random.default_rng(0))
    with pytest.raises(ValueError, match="threshold"):
        mem_probability(0.7, threshold=1.0)
    with pytest.raises(ValueError, match="alpha"):
        mem_probability(0.7, alpha=0.0)
    with pytest.raises(ValueError, match="limit_bytes"):
        memory_fraction(queues, limit_bytes=0)
    with pytest.raises(ValueError, match="records"):
        q("a/0", records=-1)
    with pytest.raises(ValueError, match="seconds_per_record"):
        q("a/0", seconds_per_record=0.0)
    with pytest.raises(ValueError, match="front_ts"):
        q("a/0", front_ts=math.nan)
