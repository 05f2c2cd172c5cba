"""The drills of `streamtopo run` without a run: when kills and migrations happen, which units a kill
stops (against a real embedded Valkey) and how their recovery pause is measured."""

from __future__ import annotations

import pytest

from streamtopo.contracts import ExecutorEntry, Keys, RoutingTable
from streamtopo.local.drills import Kill, Schedule, held_by, recovery_pauses
from streamtopo.runtime.embedded import EmbeddedValkey
from streamtopo.runtime.handover import Pause
from streamtopo.runtime.state_store import StateStore
from streamtopo.runtime.transport import connect


def test_a_kill_every_20_s_comes_20_s_into_the_run_or_as_soon_as_the_warm_up_ends():
    """Timed from the run's start (not from the end of the warm-up, which left a 30 s run without its kill),
    but never while an executor is still starting; the next one comes a full interval after."""
    kills = Schedule(start=100.0, every=20.0)
    assert not kills.due(119.9, ready=True)
    assert not kills.due(120.0, ready=False)  # still warming up: wait
    assert kills.due(124.0, ready=True)
    kills.done(124.0)
    assert not kills.due(143.9, ready=True)
    assert kills.due(144.0, ready=True)


def test_the_next_kill_comes_a_full_interval_after_the_victim_runs_again():
    """Not after the kill: a restart slower than the interval would otherwise leave no moment in which every
    executor runs, and no migration in the run would be a clean hand-over."""
    kills = Schedule(start=0.0, every=4.0)
    assert kills.due(5.0, ready=True)
    kills.hold()  # killed at 5 s
    assert not kills.due(30.0, ready=True)  # the victim is back at 30 s, 25 s later
    kills.done(30.0)
    assert not kills.due(33.9, ready=True)
    assert kills.due(34.0, ready=True)


def test_a_drill_not_asked_for_is_never_due():
    assert not Schedule(start=0.0, every=None).due(1e9, ready=True)


def test_the_recovery_pause_runs_from_the_kill_to_the_next_acquisition_of_each_unit():
    """The receiver's own figure (seconds=0.01: it began waiting after its JVM started) is not what the
    unit paused; the kill at t=10 and the acquisitions at 31 and 33 are."""
    kill = Kill("t-e1", at=10.0, units=("agg/0", "agg/1", "agg/2"))
    pauses = [
        Pause("agg/0", 0.5, "t-e0", "released", 0, at=5.0),  # an earlier hand-over: not this kill's
        Pause("agg/0", 0.01, "t-e1", "recovered", 0, at=31.0),
        Pause("agg/1", 0.01, "t-e1", "recovered", 0, at=33.0),
        Pause("agg/0", 0.2, "t-e0", "released", 0, at=40.0),
    ]  # a later migration: not this kill's
    assert recovery_pauses([kill], pauses) == ([21.0, 23.0], 1)  # agg/2 never held again


@pytest.mark.valkey
def test_a_kill_stops_the_units_its_executor_holds_not_those_the_routing_sends_it():
    """agg/1 is routed to t-e1 but its donor t-e0 still holds it (it keeps running there); t-e10 is
    another executor whose name starts like t-e1's."""
    units = {"agg/0": "t-e1", "agg/1": "t-e1", "agg/2": "t-e10"}
    routing = RoutingTable(
        topology="t",
        version=2,
        units=units,
        executors={n: ExecutorEntry() for n in ("t-e0", "t-e1", "t-e10")},
    )
    with EmbeddedValkey() as valkey:
        store = StateStore(connect(valkey.url), Keys("t"))
        store.acquire("agg/0", "t-e1-4242-a1b2c3")
        store.acquire("agg/1", "t-e0-4141-d4e5f6")
        store.acquire("agg/2", "t-e10-4343-0a0b0c")
        assert held_by(store, routing, "t-e1") == ("agg/0",)
