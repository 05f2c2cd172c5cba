"""Source pacing (runtime/pacing.py): a small first step, budgets that grow while that pays, short
steps while an executor waits to acquire units, and nothing while the topology's queues are full."""

from __future__ import annotations

from streamtopo.contracts import Keys
from streamtopo.runtime.embedded import EmbeddedValkey
from streamtopo.runtime.pacing import Pacing, SourceBudget
from streamtopo.runtime.transport import connect

PACING = Pacing(first_records=20_000, step_seconds=2.0, growth=1.1, handover_seconds=0.25, min_records=5_000)


def step(budget: SourceBudget, start: float, records: int, seconds: float) -> None:
    budget.begin(start)
    budget.generated(records)
    budget.end(start + seconds)


def test_the_budget_starts_small_and_grows_while_steps_are_short_or_pay():
    budget = SourceBudget(PACING)
    assert budget.records(waiting=False) == budget.records(waiting=True) == 20_000  # nothing measured yet
    step(budget, 0.0, 20_000, 0.5)  # short, and no earlier step to fit: double
    assert budget.budget == 40_000 and budget.rate == 40_000
    step(budget, 1.0, 40_000, 0.8)  # 0.2 s fixed + 15 us per record: 1.8 s of records is 120,000
    assert budget.budget == 120_000
    assert budget.records(waiting=True) == 12_500  # a quarter second of 50,000 records/s
    step(budget, 2.0, 120_000, 4.0)  # long, but 30,000/s is slower per record: it does not pay, hold
    assert budget.budget == 120_000
    step(budget, 5.0, 30_000, 0.2)  # caught up (took less than its budget): nothing to learn
    assert budget.budget == 120_000 and budget.rate == 30_000


def sizes_of(budget: SourceBudget, steps: int, seconds) -> list[int]:
    """The budgets of ``steps`` backlogged steps, each taking ``seconds(i, records)``."""
    sizes = []
    for i in range(steps):
        records = budget.records(waiting=False)
        sizes.append(records)
        step(budget, 10.0 * i, records, seconds(i, records))
    return sizes


def test_a_fixed_cost_longer_than_the_step_target_still_grows_the_steps():
    """On a busy machine a step's fixed cost alone took 6 s: 5,000-record steps crawled at 800 records/s.
    Steps keep growing while each carries more per second than the last."""
    budget = SourceBudget(PACING)
    sizes = sizes_of(budget, 6, lambda i, n: 6.0 + n / 300_000)  # 6 s fixed, 300k records/s after it
    # 40,000 in 6.13 s against 20,000 in 6.07: 6 s fixed, so 6 s of records (1.8M) would halve its share;
    # one step grows 8x at most.
    assert sizes[:4] == [20_000, 40_000, 320_000, 1_800_000] and sizes[-1] >= 3_600_000
    assert budget.rate is not None and budget.rate > 100_000


def test_steps_whose_time_is_their_fixed_cost_grow_past_doubling():
    """Measured (2026-12-02, one executor on 2 cores, a 5M-record pipeline): a cold first step of 4.2 s,
    then about 1.3 s a step plus 0.18 us a record. Doubling took 8 steps (11 s) to reach the 2.5M records
    due; read as fixed plus per-record cost, the fourth step takes them."""
    budget = SourceBudget(PACING)
    sizes = sizes_of(budget, 4, lambda i, n: 4.2 if i == 0 else 1.3 + n * 0.18e-6)
    assert sizes == [20_000, 40_000, 320_000, 2_560_000]  # 40k in less time than 20k: 8x at once


def test_backpressure_through_the_lag_reads_the_topologys_queue_counters():
    keys = Keys("pace")
    budget = SourceBudget(PACING)
    budget.rate, budget.budget = 100_000.0, 400_000  # 4 s of the rate: 400,000 records queued at most
    with EmbeddedValkey() as valkey:
        client = connect(valkey.url)
        client.hset(keys.backlog, mapping={"s1": 150_000, "s2": 200_000})
        assert not budget.backpressured(client, keys.backlog, 0.0)
        client.hincrby(keys.backlog, "s2", 100_000)  # 450,000 queued
        assert not budget.backpressured(client, keys.backlog, 0.1)  # read at most every 0.25 s
        assert budget.backpressured(client, keys.backlog, 0.3) and budget.budget == 200_000
        client.hset(keys.backlog, "s1", -5)  # a counter below zero counts as nothing
        client.hset(keys.backlog, "s2", 0)
        assert not budget.backpressured(client, keys.backlog, 0.6) and budget.budget == 200_000
    assert not SourceBudget().backpressured(None, keys.backlog, 1.0)  # no transport: nothing queues
