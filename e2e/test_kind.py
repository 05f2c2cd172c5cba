"""End to end on a kind cluster: install, apply the examples, check pods, affinity, status, and that the
SPL loop rebalances and scales out under load. Skipped where docker or kind is missing (conftest.py)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from conftest import NAMESPACE, ROOT, eventually, kubectl_json, run

pytestmark = pytest.mark.e2e

EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def apply(doc: dict, tmp: Path) -> None:
    path = tmp / f"{doc['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(doc))
    run("kubectl", "apply", "-n", NAMESPACE, "-f", str(path))


def topology_status(name: str) -> dict:
    return kubectl_json("get", "stopo", name, "-n", NAMESPACE).get("status") or {}


def events(name: str, reason: str) -> list[dict]:
    items = kubectl_json(
        "get", "events", "-n", NAMESPACE, "--field-selector", f"involvedObject.name={name},reason={reason}"
    )["items"]
    return items


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_example_runs_with_pods_pinned_to_their_planned_nodes(kind_cluster, example: Path, tmp_path: Path):
    doc = yaml.safe_load(example.read_text())
    apply(doc, tmp_path)
    name = doc["metadata"]["name"]
    eventually(lambda: topology_status(name).get("phase") == "Running", 600, f"{name} Running")
    routing = kubectl_json("get", "configmap", f"{name}-routing", "-n", NAMESPACE)["data"]["routing.json"]
    executors = yaml.safe_load(routing)["executors"]
    pods = kubectl_json("get", "pods", "-n", NAMESPACE, "-l", f"streamtopo.dev/topology={name}")["items"]
    assert {p["metadata"]["name"] for p in pods} == set(executors)
    for pod in pods:
        assert pod["spec"]["nodeName"] == executors[pod["metadata"]["name"]]["host"]
        assert pod["status"]["phase"] == "Running"
    ready = next(c for c in topology_status(name)["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"
    run("kubectl", "delete", "stopo", name, "-n", NAMESPACE, "--wait=true")


def test_rebalance_and_scale_out_under_load(kind_cluster, tmp_path: Path):
    """A skewed, rising load with a short SPL: the loop moves key groups and adds executors."""
    doc = yaml.safe_load((ROOT / "examples/sequence-count.yaml").read_text())
    doc = copy.deepcopy(doc)
    doc["metadata"]["name"] = "e2e-load"
    source = next(op for op in doc["spec"]["operators"] if op["kind"] == "source")
    source["source"]["ratePerSecond"] = 50000
    source["source"].pop("count", None)
    doc["spec"]["autoscaling"] = {
        "interval": "30s",
        "stabilization": "60s",
        "maxExecutors": 6,
        "targetUtilization": 0.6,
    }
    apply(doc, tmp_path)
    eventually(lambda: events("e2e-load", "RebalanceReport"), 900, "a RebalanceReport event")
    eventually(lambda: events("e2e-load", "ScalingReport"), 900, "a ScalingReport event")
    status = topology_status("e2e-load")
    assert status["lastRebalance"]["migrations"] > 0
    run("kubectl", "delete", "stopo", "e2e-load", "-n", NAMESPACE, "--wait=true")
