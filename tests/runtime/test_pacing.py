"""Source pacing (runtime/pacing.py): a step takes a few seconds of what the executor carries, a quarter
second while it waits to acquire units, and nothing while the topology's queues are full."""

from __future__ import annotations

from streamtopo.contracts import Keys
from streamtopo.runtime.embedded import EmbeddedValkey
from streamtopo.runtime.pacing import Pacing, SourceBudget
from streamtopo.runtime.transport import connect

PACING = Pacing(step_seconds=2.0, handover_seconds=0.25, first_records=20_000, min_records=5_000)


def test_the_first_step_is_small_and_the_budget_follows_the_measured_rate():
    budget = SourceBudget(PACING)
    assert budget.records(waiting=False) == 20_000  # nothing measured: a start with millions due
    budget.begin(10.0)
    budget.generated(20_000)
    budget.end(10.5)  # 40,000 records per second of step
    assert budget.rate == 40_000
    assert budget.records(waiting=False) == 80_000 and budget.records(waiting=True) == 10_000
    budget.begin(11.0)
    budget.generated(80_000)
    budget.end(12.0)  # 80,000 / s now: averaged with the last
    assert budget.rate == 0.5 * 80_000 + 0.5 * 40_000
    budget.begin(12.0)
    budget.end(12.3)  # a step that generated nothing says nothing about the rate
    assert budget.rate == 60_000
    slow = SourceBudget(PACING)
    slow.begin(0.0)
    slow.generated(100)
    slow.end(10.0)
    assert slow.records(waiting=True) == 5_000  # never below the floor


def test_backpressure_through_the_lag_reads_the_topologys_queue_counters():
    keys = Keys("pace")
    budget = SourceBudget(PACING)
    budget.rate = 100_000.0  # 4 s of it: 400,000 records queued at most
    with EmbeddedValkey() as valkey:
        client = connect(valkey.url)
        client.hset(keys.backlog, mapping={"s1": 150_000, "s2": 200_000})
        assert not budget.backpressured(client, keys.backlog, 0.0)
        client.hincrby(keys.backlog, "s2", 100_000)  # 450,000 queued
        assert not budget.backpressured(client, keys.backlog, 0.1)  # read at most every 0.25 s
        assert budget.backpressured(client, keys.backlog, 0.3)
        client.hset(keys.backlog, "s1", -5)  # a counter below zero counts as nothing
        client.hset(keys.backlog, "s2", 0)
        assert not budget.backpressured(client, keys.backlog, 0.6)
    assert not SourceBudget().backpressured(None, keys.backlog, 1.0)  # no transport: nothing queues
