"""`streamtopo simulate`: the JSON contract, the table, the plot, and bad input (exit 2, field named)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from streamtopo.cli import app

ROOT = Path(__file__).parents[2]
STEPS = ROOT / "examples/scenarios/rate-steps.yaml"
SPIKES = ROOT / "examples/scenarios/spikes.yaml"


def simulate(*args: object):
    result = CliRunner().invoke(app, ["simulate", *map(str, args)])
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def test_json_contract() -> None:
    result = simulate(
        STEPS,
        "--policy",
        "flux",
        "--scaling",
        "dstreams",
        "--periods",
        "4",
        "--seed",
        "3",
        "--format",
        "json",
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["policy"] == "flux" and data["scaling"] == "dstreams"
    assert len(data["periods"]) == 4
    for period in data["periods"]:
        assert {
            "load_distance",
            "load_index",
            "collocation_factor",
            "migrations",
            "executors",
            "backlog",
        } <= set(period)
    summary = data["summary"]
    assert {
        "load_distance_mean",
        "load_distance_max",
        "migrations_total",
        "load_index_final",
        "executor_changes",
    } <= set(summary)
    assert summary["migrations_total"] == sum(p["migrations"] for p in data["periods"])
    assert summary["load_distance_max"] == max(p["load_distance"] for p in data["periods"])


@pytest.mark.parametrize("policy", ["albic", "milp", "flux", "potc", "cola", "cmr"])
def test_every_policy_runs_without_safe_decisions(policy: str) -> None:
    result = simulate(
        SPIKES, "--policy", policy, "--periods", "3", "--deterministic-time", "0.05", "--format", "json"
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["policy"] == policy and data["summary"]["safe_decisions"] == 0
    if policy != "cola":  # COLA re-optimisation ignores the bound by design (ALBIC Sec. 5: a full re-plan)
        assert all(p["migrations"] <= 10 for p in data["periods"])  # spikes.yaml: maxMigrations 10


def test_table_and_plot(tmp_path: Path) -> None:
    out = tmp_path / "sim.png"
    result = simulate(STEPS, "--policy", "flux", "--periods", "3", "--plot", out)
    assert result.exit_code == 0, result.output
    assert "summary" in result.stdout and "load_distance_mean" in result.stdout
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--policy", "magic"], "--policy"),
        (["--scaling", "fast"], "--scaling"),
        (["--format", "xml"], "--format"),
    ],
)
def test_bad_options_exit_2(args: list[str], message: str) -> None:
    result = simulate(STEPS, *args)
    assert result.exit_code == 2 and message in result.output


def test_bad_scenarios_exit_2_naming_the_field(tmp_path: Path) -> None:
    doc = yaml.safe_load(STEPS.read_text())
    doc["operators"][1]["inputs"] = ["nowhere"]
    doc["workload"]["rate"] = "fast"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    result = simulate(bad)
    assert result.exit_code == 2
    assert "workload.rate" in result.output

    doc = yaml.safe_load(STEPS.read_text())
    doc["operators"][1]["inputs"] = ["nowhere"]
    bad.write_text(yaml.safe_dump(doc))
    result = simulate(bad)
    assert result.exit_code == 2 and "operators[1].inputs[0]" in result.output

    broken = tmp_path / "broken.yaml"
    broken.write_text("operators: [\n")
    result = simulate(broken)
    assert result.exit_code == 2 and "not valid YAML" in result.output

    result = simulate(tmp_path / "missing.yaml")
    assert result.exit_code == 2 and "cannot read" in result.output


@pytest.mark.slow
@pytest.mark.parametrize("path", sorted((ROOT / "examples/scenarios").glob("*.yaml")), ids=lambda p: p.stem)
def test_two_runs_of_a_shipped_scenario_print_identical_json(path: Path) -> None:
    """ALBIC's limits are deterministic time, not wall time: the same scenario gives the same decisions
    on any machine and under any load, so its JSON (every period's figures) is byte-identical."""
    first, second = (simulate(path, "--policy", "albic", "--format", "json") for _ in range(2))
    assert first.exit_code == 0, first.output
    assert json.loads(first.output)["periods"]
    assert first.output == second.output
