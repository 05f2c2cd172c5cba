"""`streamtopo plan`: exit codes, the JSON contract, the table, and 20+ malformed topologies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from streamtopo.cli import app

ROOT = Path(__file__).parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
SMALL = ROOT / "examples/clusters/small.yaml"
MALFORMED = sorted((ROOT / "tests/data/malformed").glob("*.yaml"))
VWAP = ROOT / "examples/vwap.yaml"


def plan(*args: str):
    result = CliRunner().invoke(app, ["plan", *map(str, args)])
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def needs_labels(path: Path) -> bool:
    return "nodeSelector" in path.read_text()


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_plans_feasibly_with_cola(path: Path):
    pytest.importorskip("streamtopo.planner.placement.cola")
    result = plan(path, "--cluster", SMALL, "--format", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["feasible"] is True
    if not needs_labels(path):
        assert plan(path).exit_code == 0


@pytest.mark.parametrize("algorithm", ["none", "fint", "metis"])
def test_vwap_plans_feasibly_with_the_baselines(algorithm: str):
    result = plan(VWAP, "--algorithm", algorithm, "--format", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["algorithm"] == algorithm


def test_json_is_the_documented_contract():
    result = plan(VWAP, "--algorithm", "metis", "--hosts", "5", "--host-cpu", "3", "--format", "json")
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert {"algorithm", "feasible", "valid", "max_utilization", "communication_cost", "pes", "hosts"} <= set(
        data
    )
    assert all({"name", "operators", "size", "host"} <= set(pe) for pe in data["pes"])
    assert [h["name"] for h in data["hosts"]] == [f"host-{i}" for i in range(1, 6)]
    assert all(h["capacity"] == 3 for h in data["hosts"])
    # the contract is self-consistent: loads are the sums of PE sizes, U the largest load share
    for host in data["hosts"]:
        assert host["load"] == pytest.approx(
            sum(pe["size"] for pe in data["pes"] if pe["host"] == host["name"]), abs=1e-5
        )
    assert data["max_utilization"] == pytest.approx(
        max(h["load"] / h["capacity"] for h in data["hosts"]), abs=1e-5
    )
    operators = sorted(op for pe in data["pes"] for op in pe["operators"])
    assert operators == sorted(op["name"] for op in yaml.safe_load(VWAP.read_text())["spec"]["operators"])


def test_yaml_output_matches_json():
    as_json = json.loads(plan(VWAP, "--algorithm", "fint", "--format", "json").stdout)
    as_yaml = yaml.safe_load(plan(VWAP, "--algorithm", "fint", "--format", "yaml").stdout)
    assert as_yaml == as_json


def test_table_lists_pes_hosts_and_scores():
    result = plan(VWAP, "--algorithm", "none", "--hosts", "4", "--host-cpu", "4")
    assert result.exit_code == 0
    for text in (
        "trades-valid",
        "host-4",
        "utilisation",
        "U (max host utilisation)",
        "C (communication cost)",
    ):
        assert text in result.stdout


def test_infeasible_cluster_exits_3_naming_the_host():
    result = plan(VWAP, "--algorithm", "fint", "--hosts", "1", "--host-cpu", "1")
    assert result.exit_code == 3
    assert "no feasible plan" in result.stderr and "host-1" in result.stderr


def test_invalid_plan_exits_3_naming_the_constraint():
    # the HA example needs hosts labelled nic=market-data; the default cluster has none
    result = plan(ROOT / "examples/ha-pipeline.yaml", "--algorithm", "none")
    assert result.exit_code == 3
    assert "requires.nodeSelector" in result.stderr


def test_cola_without_a_valid_plan_exits_3():
    pytest.importorskip("streamtopo.planner.placement.cola")
    result = plan(ROOT / "examples/ha-pipeline.yaml", "--algorithm", "cola")
    assert result.exit_code == 3
    assert "no valid plan" in result.stderr


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--algorithm", "greedy"], "--algorithm"),
        (["--graph", "physical"], "--graph"),
        (["--format", "xml"], "--format"),
        (["--hosts", "0"], "--hosts"),
        (["--host-cpu", "-1"], "--host-cpu"),
        (["--cluster", "examples/clusters/small.yaml", "--hosts", "3"], "--cluster"),
    ],
)
def test_bad_options_exit_2(args: list[str], field: str):
    result = plan(VWAP, *args)
    assert result.exit_code == 2
    assert result.stderr.startswith(f"{field}:")


def test_bad_cluster_file_exits_2_naming_the_field(tmp_path: Path):
    cluster = tmp_path / "hosts.yaml"
    cluster.write_text("hosts:\n  - {name: a, cpu: 0}\n")
    result = plan(VWAP, "--cluster", cluster)
    assert result.exit_code == 2
    assert "hosts[0].cpu" in result.stderr


def test_missing_file_exits_2(tmp_path: Path):
    result = plan(tmp_path / "nope.yaml")
    assert result.exit_code == 2
    assert "nope.yaml" in result.stderr


def test_there_are_at_least_twenty_malformed_files():
    assert len(MALFORMED) >= 20


@pytest.mark.parametrize("path", MALFORMED, ids=lambda p: p.name)
def test_malformed_topology_exits_2_naming_the_field(path: Path):
    expected = path.read_text().splitlines()[0].removeprefix("# expect: ").strip()
    result = plan(path)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert expected in result.stderr, result.stderr


def test_planning_past_its_time_limit_exits_3_naming_the_limit():
    """`streamtopo plan` runs the planner in a process of its own under --plan-timeout (issue 32)."""
    from pathlib import Path

    from typer.testing import CliRunner

    from streamtopo.cli import app

    vwap = Path(__file__).resolve().parents[2] / "examples" / "vwap.yaml"
    result = CliRunner().invoke(app, ["plan", str(vwap), "--plan-timeout", "0.001"])
    assert result.exit_code == 3 and "did not finish within 0.001s" in result.output
    assert "Traceback" not in result.output
    refused = CliRunner().invoke(app, ["plan", str(vwap), "--plan-memory", "lots"])
    assert refused.exit_code == 2 and "--plan-memory" in refused.output
