"""`streamtopo share`: shared prefixes found by structure, the JSON contract, exit codes, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from streamtopo.cli import app
from streamtopo.documents import load_topology
from streamtopo.planner.benoit.heuristics import place_heuristic
from streamtopo.planner.benoit.topologies import sharing_problem, stream_cycles, structural_hashes
from streamtopo.planner.cluster import Cluster
from streamtopo.planner.graph import CommCostModel

ROOT = Path(__file__).parents[2]
SHARING = sorted((ROOT / "examples/sharing").glob("*.yaml"))
PREFIX = ("trades", "trades-valid", "trades-notional")


def share(*args: object):
    result = CliRunner().invoke(app, ["share", *map(str, args)])
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def test_three_topologies_share_one_instance_per_prefix_operator() -> None:
    result = share(*SHARING, "-o", "json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["feasible"] and report["heuristic"] == "topdown-bfs" and report["strategy"] == 3
    served = [s for entry in report["instances"] for s in entry["serves"]]
    expected = {
        f"{load_topology(p).metadata.name}/{op.name}"
        for p in SHARING
        for op in load_topology(p).spec.operators
    }
    assert sorted(served) == sorted(expected)  # every operator of every topology served exactly once
    for name in PREFIX:
        serving = [e for e in report["instances"] if any(s.endswith(f"/{name}") for s in e["serves"])]
        assert len(serving) == 1 and len(serving[0]["serves"]) == 3, (name, serving)
    assert sorted(report["load"]) == report["processors"]
    assert all(0 < load["cpu"] <= 1 for load in report["load"].values())
    no_share = json.loads(share(*SHARING, "--no-share", "-o", "json").stdout)
    assert len(no_share["instances"]) == len(expected)
    assert report["cost"] <= no_share["cost"]


def test_a_dear_hop_computes_the_prefix_next_to_each_consumer_instead() -> None:
    """Each byte of a shared result read on another host costs the named-stream hop (Aeolus' n and s):
    at the calibrated cost the prefix runs once and its results cross; at 50x the per-record cost the
    crossing costs more than the prefix, and every host running a consumer computes the prefix itself."""
    topologies = [load_topology(p) for p in SHARING]
    cluster = Cluster.uniform(4, 4.0)
    for comm, copies in ((CommCostModel(), 1), (CommCostModel(per_record=1e-4), 3)):
        shared = sharing_problem(topologies, cluster, comm=comm)
        source = next(op for key, op in shared.problem.operators.items() if shared.labels[key] == "trades")
        assert source.crossing == pytest.approx(
            comm.per_byte_of(source.output)
        )  # 48-byte records, selectivity 1
        result = place_heuristic(shared.problem)
        assert result.feasible and result.usage.violations() == []
        for name in PREFIX:
            hosts = {u for (_, node), u in result.usage.placement.items() if node == name}
            assert len(hosts) == copies, (comm, name, hosts)


def test_the_ilp_places_the_same_topologies_on_no_more_hosts_than_the_heuristic() -> None:
    heuristic = json.loads(share(*SHARING, "-o", "json").stdout)
    result = share(*SHARING, "--method", "ilp", "--deterministic-time", "20", "-o", "json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["status"] == "optimal" and report["cost"] <= heuristic["cost"]
    assert sum(len(e["serves"]) for e in report["instances"]) == sum(
        len(e["serves"]) for e in heuristic["instances"]
    )


def test_the_table_names_instances_and_hosts() -> None:
    result = share(*SHARING)
    assert result.exit_code == 0
    assert "trades-notional-" in result.stdout and "host-" in result.stdout


def test_no_placement_exits_3_naming_the_constraint() -> None:
    result = share(*SHARING, "--hosts", "1", "--host-cpu", "0.5", "-o", "json")
    assert result.exit_code == 3
    assert "compute (1)" in json.loads(result.stdout)["reason"]


def test_the_hash_ignores_how_an_operator_runs_and_sees_what_it_computes(tmp_path: Path) -> None:
    doc = yaml.safe_load(SHARING[0].read_text())
    base = structural_hashes(load_topology(doc))
    renamed = yaml.safe_load(SHARING[0].read_text())
    for op in renamed["spec"]["operators"]:
        op["cost"] = {"cpu": 9.0}
        op.pop("selectivity", None)
    renamed["spec"]["operators"][0]["source"]["ratePerSecond"] = 5
    assert structural_hashes(load_topology(renamed)) == base
    changed = yaml.safe_load(SHARING[0].read_text())
    changed["spec"]["operators"][1]["expr"] = "price > 1"
    hashes = structural_hashes(load_topology(changed))
    assert hashes["trades"] == base["trades"]
    assert hashes["trades-valid"] != base["trades-valid"]
    assert hashes["trades-notional"] != base["trades-notional"]  # its input changed


def test_streams_are_namespace_local_unless_allowed(tmp_path: Path) -> None:
    def reader(namespace: str, name: str) -> Path:
        path = tmp_path / f"{namespace}-{name}.yaml"
        path.write_text(
            yaml.safe_dump(
                {
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": {
                        "operators": [
                            {"name": "in", "kind": "source", "source": {"stream": "ticks"}},
                            {
                                "name": "out",
                                "kind": "sink",
                                "inputs": ["in"],
                                "sink": {"file": {"path": name}},
                            },
                        ]
                    },
                }
            )
        )
        return path

    a, b = reader("team-a", "x"), reader("team-b", "y")
    apart = json.loads(share(a, b, "-o", "json").stdout)
    assert all(len(e["serves"]) == 1 for e in apart["instances"])
    together = json.loads(share(a, b, "--across-namespaces", "-o", "json").stdout)
    assert any(e["serves"] == ["team-a/x/in", "team-b/y/in"] for e in together["instances"])


def test_topologies_feeding_each_other_in_a_cycle_are_refused(tmp_path: Path) -> None:
    def relay(name: str, read: str, write: str) -> Path:
        path = tmp_path / f"{name}.yaml"
        path.write_text(
            yaml.safe_dump(
                {
                    "metadata": {"name": name},
                    "spec": {
                        "operators": [
                            {"name": "in", "kind": "source", "source": {"stream": read}},
                            {"name": "out", "kind": "sink", "inputs": ["in"], "sink": {"stream": write}},
                        ]
                    },
                }
            )
        )
        return path

    result = share(relay("ping", "a", "b"), relay("pong", "b", "a"))
    assert result.exit_code == 2
    assert "cycle" in result.output and "ping" in result.output and "pong" in result.output


@pytest.mark.parametrize(
    "args,field",
    [
        (["--heuristic", "greedy"], "--heuristic"),
        (["--strategy", "7"], "--strategy"),
        (["--method", "magic"], "--method"),
        (["--objective", "speed"], "--objective"),
        (["-o", "xml"], "--format"),
        (["--no-share", "--method", "ilp"], "--no-share"),
        (["--hosts", "0"], "--hosts"),
    ],
)
def test_bad_options_exit_2_naming_the_option(args: list[str], field: str) -> None:
    result = share(*SHARING, *args)
    assert result.exit_code == 2 and field in result.output


def test_bad_files_exit_2_naming_the_file(tmp_path: Path) -> None:
    # Paths longer than the console: each is printed whole (soft wrap), never folded mid-name.
    tmp_path = tmp_path / ("deep" * 20)
    tmp_path.mkdir()
    broken = tmp_path / "broken.yaml"
    broken.write_text("spec:\n  operators: [{name: x, kind: nonsense}]\n")
    result = share(SHARING[0], broken, tmp_path / "missing.yaml")
    assert result.exit_code == 2
    assert str(broken) in result.output and str(tmp_path / "missing.yaml") in result.output
    twice = share(SHARING[0], SHARING[0])
    assert twice.exit_code == 2 and "twice" in twice.output


def test_a_cycle_is_reported_from_the_topology_given_first() -> None:
    """The same files give the same message on every run (networkx may start a cycle anywhere)."""

    def relay(name: str, read: str, write: str):
        operators = [
            {"name": "in", "kind": "source", "source": {"stream": read}},
            {"name": "out", "kind": "sink", "inputs": ["in"], "sink": {"stream": write}},
        ]
        return load_topology({"metadata": {"name": name}, "spec": {"operators": operators}})

    ping, pong = relay("ping", "a", "b"), relay("pong", "b", "a")
    assert stream_cycles([ping, pong]) == ["ping -> stream b -> pong -> stream a -> ping"]
    assert stream_cycles([pong, ping]) == ["pong -> stream a -> ping -> stream b -> pong"]
