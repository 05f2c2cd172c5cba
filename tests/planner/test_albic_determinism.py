"""Same input, same decision: ALBIC's MILP is limited by CP-SAT deterministic time and a gap only (no
wall-clock limit, docs/albic.md), so a solve that stops on its budget gives the same allocation when run
again and when the machine is busy."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from streamtopo.planner.allocation import Rebalance
from streamtopo.planner.rebalance.albic import AlbicConfig, MilpConfig, albic_rebalance
from streamtopo.planner.simulation.scenario import load_scenario
from streamtopo.planner.simulation.simulator import simulate
from streamtopo.planner.simulation.workloads import SyntheticSetting, synthetic_state

SCENARIOS = Path(__file__).parents[2] / "examples" / "scenarios"


def _burn(stop: threading.Event) -> None:
    block = bytes(1 << 20)
    while not stop.is_set():
        hashlib.sha256(block).digest()  # hashlib releases the GIL on large inputs: real CPU contention


@contextmanager
def busy_machine() -> Iterator[None]:
    """One CPU-burning thread per core while the body runs (a loaded machine)."""
    stop = threading.Event()
    threads = [threading.Thread(target=_burn, args=(stop,), daemon=True) for _ in range(os.cpu_count() or 2)]
    for t in threads:
        t.start()
    try:
        yield
    finally:
        stop.set()
        for t in threads:
            t.join()


def decision(result: Rebalance) -> tuple:
    """Everything ALBIC decided (not the wall seconds it took)."""
    d = result.details
    return (
        result.assignment,
        result.migrations,
        d["solver_status"],
        d["rounds"],
        d["deterministic_time"],
        d["new_constraints"],
        d["collocation_constraints"],
        d["trace"],
    )


@pytest.mark.parametrize(
    "setting, budget",
    [
        (SyntheticSetting(6, 72, 3, varies=20, one_to_one=0.5), 0.2),  # whole model, stops on its budget
        (SyntheticSetting(20, 400, 10, varies=20, one_to_one=0.5), 0.5),  # neighbourhood rounds
    ],
)
def test_same_problem_same_decision_twice_and_under_load(setting: SyntheticSetting, budget: float) -> None:
    state = synthetic_state(setting, seed=2)
    config = AlbicConfig(milp=MilpConfig(deterministic_time=budget))

    def run() -> Rebalance:
        return albic_rebalance(state, max_migrations=10, config=config, seed=2)

    first, second = run(), run()
    with busy_machine():
        loaded = run()
    assert first.migrations, "the test needs a problem on which ALBIC moves something"
    assert first.details["deterministic_time"] <= 1.5 * budget
    assert decision(first) == decision(second) == decision(loaded)


def test_whole_model_problem_stops_on_the_budget_not_on_a_proof() -> None:
    """The first case above is meaningful: the solve is cut by its budget, where a wall-clock limit
    would have cut it at a load-dependent point."""
    state = synthetic_state(SyntheticSetting(6, 72, 3, varies=20, one_to_one=0.5), seed=2)
    config = AlbicConfig(milp=MilpConfig(deterministic_time=0.2))
    result = albic_rebalance(state, max_migrations=10, config=config, seed=2)
    assert result.details["solver_status"] == "feasible"


def test_simulated_periods_repeat_exactly_under_load() -> None:
    scenario = load_scenario(yaml.safe_load((SCENARIOS / "skewed.yaml").read_text()))
    first = simulate(scenario, policy="albic", periods=6).to_dict()
    with busy_machine():
        loaded = simulate(scenario, policy="albic", periods=6).to_dict()
    assert first == loaded
    assert first["summary"]["migrations_total"] > 0
