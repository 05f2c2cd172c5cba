"""Source pacing (runtime/pacing.py): a small first step, budgets that double while that pays, short
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


def test_the_budget_starts_small_and_doubles_while_steps_are_short_or_pay():
    budget = SourceBudget(PACING)
    assert budget.records(waiting=False) == budget.records(waiting=True) == 20_000  # nothing measured yet
    step(budget, 0.0, 20_000, 0.5)  # short: double
    assert budget.budget == 40_000 and budget.rate == 40_000
    step(budget, 1.0, 40_000, 0.8)
    assert budget.budget == 80_000
    assert budget.records(waiting=True) == 12_500  # a quarter second of 50,000 records/s
    step(budget, 2.0, 80_000, 2.5)  # long, but 32,000/s is slower per record: it does not pay, hold
    assert budget.budget == 80_000
    step(budget, 5.0, 30_000, 0.2)  # caught up (took less than its budget): nothing to learn
    assert budget.budget == 80_000 and budget.rate == 32_000


def test_a_fixed_cost_longer_than_the_step_target_still_grows_the_steps():
    """On a busy machine a step's fixed cost alone took 6 s: 5,000-record steps crawled at 800 records/s.
    Steps keep doubling while each carries more per second than the last."""
    budget = SourceBudget(PACING)
    sizes = []
    for i in range(8):
        records = budget.records(waiting=False)
        sizes.append(records)
        step(budget, 10.0 * i, records, 6.0 + records / 300_000)  # 6 s fixed, 300k records/s after it
    assert sizes[:4] == [20_000, 40_000, 80_000, 160_000] and sizes[-1] >= 1_280_000
    assert budget.rate is not None and budget.rate > 100_000


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
