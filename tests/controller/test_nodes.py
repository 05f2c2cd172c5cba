"""Hosts from Node objects: what the planner sees of the cluster (quantities as the API writes them)."""

from __future__ import annotations

import pytest

from streamtopo.controller.kubernetes import NoHosts, cluster_from_nodes
from streamtopo.planner.quantity import quantity


def node(
    name: str,
    cpu: str,
    memory: str | None = None,
    *,
    ready: str = "True",
    unschedulable: bool = False,
    labels: dict | None = None,
) -> dict:
    allocatable = {"cpu": cpu, **({"memory": memory} if memory else {})}
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"unschedulable": unschedulable},
        "status": {"allocatable": allocatable, "conditions": [{"type": "Ready", "status": ready}]},
    }


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("3500m", 3.5),
        ("4", 4.0),
        ("16Gi", 16 * 2**30),
        ("1e3", 1000.0),
        ("100u", 1e-4),
        ("1.5k", 1500.0),
        ("512Mi", 512 * 2**20),
    ],
)
def test_quantities_parse_as_kubernetes_writes_them(text: str, value: float):
    assert quantity(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["abc", "1.2.3", "", "4 cores"])
def test_a_malformed_quantity_is_named(text: str):
    with pytest.raises(ValueError, match="not a resource quantity"):
        quantity(text)


def test_only_ready_schedulable_nodes_with_cpu_become_hosts():
    cluster = cluster_from_nodes(
        [
            node("b", "3900m", "15Gi", labels={"disk": "ssd"}),
            node("a", "2"),
            node("gone", "4", ready="False"),
            node("cordoned", "4", unschedulable=True),
            node("empty", "0"),
        ]
    )
    assert [h.name for h in cluster.hosts] == ["a", "b"]
    b = cluster.hosts[1]
    assert b.cpu == pytest.approx(3.9) and b.memory == 15 * 2**30 and b.labels == {"disk": "ssd"}
    with pytest.raises(NoHosts):
        cluster_from_nodes([node("cordoned", "4", unschedulable=True)])


def test_an_unschedulable_pod_is_an_executor_that_does_not_run():
    """A pod the scheduler could not place (the room changed between the plan and the pod) is named with
    the scheduler's message, like a crash loop: the loop waits for it, then moves its key groups away."""
    from streamtopo.controller.kubernetes import pod_health

    pending = {
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/2 nodes are available: 2 Insufficient cpu.",
                }
            ],
        }
    }
    health = pod_health(pending)
    assert health.problem == "Pending: Unschedulable (0/2 nodes are available: 2 Insufficient cpu.)"
    starting = {"status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]}}
    assert pod_health(starting).problem is None  # scheduled, pulling its image: starting, not failing
