"""Capacity on Kubernetes: the operator (kopf, for real) against kmock's emulator over HTTP, with a real
Prometheus scraping scripted executors. A topology whose declared rates need more than the nodes offer
gets CapacityExhausted (condition, Event, status.capacity) and only pods that fit; the SPL loop's
scale-ups stay within the nodes' room, other workloads' requests included."""

from __future__ import annotations

from typing import Any

import pytest
from controller_testkit import EmulatedKubernetes, wait_for
from test_kopf_kmock import CR_PATH, NS, condition, events, operator, pods, routing, status

from streamtopo.controller.kubernetes import committed_cpu
from streamtopo.planner.quantity import quantity

pytestmark = [pytest.mark.kube, pytest.mark.prometheus, pytest.mark.timeout(240)]

OTHER = "/api/v1/namespaces/batch/pods"


def heavy(name: str, prometheus_url: str) -> dict[str, Any]:
    """src -> agg declared at 6 cores in all: Aeolus wants ceil(6.x / 0.7) executors of one core."""
    return {
        "apiVersion": "streamtopo.dev/v1alpha1",
        "kind": "StreamTopology",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "keyGroups": 8,
            "operators": [
                {
                    "name": "src",
                    "kind": "source",
                    "source": {"generator": "sequence", "ratePerSecond": 100000},
                    "cost": {"cpu": 3.0},
                },
                {
                    "name": "agg",
                    "kind": "aggregate",
                    "inputs": ["src"],
                    "keyBy": ["key"],
                    "window": {"size": "10s"},
                    "aggregations": ["count(*) AS n"],
                    "cost": {"cpu": 3.0},
                },
            ],
            "executor": {"resources": {"cpu": 1}},
            "metrics": {"prometheus": {"url": prometheus_url}},
            "autoscaling": {
                "interval": "3s",
                "metricWindow": "3s",
                "stabilization": "3s",
                "minExecutors": 1,
                "maxExecutors": 8,
            },
        },
    }


def other_workload(node: str, cpu: str) -> dict[str, Any]:
    """A pod of another team, already scheduled: its request is room no executor may take."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "batch-job", "namespace": "batch", "labels": {"app": "batch"}},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "job", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}],
        },
        "status": {"phase": "Running"},
    }


def requested(kube: EmulatedKubernetes) -> dict[str, float]:
    """Node -> CPU requested by every pod there, through the API (executors pinned by node affinity)."""
    found = [*pods(kube, "heavy").values(), *(kube.list(OTHER) or [])]
    return committed_cpu(found)


def test_a_topology_beyond_the_nodes_is_capped_reported_and_scales_only_into_room(
    kube: EmulatedKubernetes, monkeypatch: pytest.MonkeyPatch, prometheus_factory, scripted_runtime
):
    kube.add_node("node-a", "2")
    kube.add_node("node-b", "2")
    kube.create(OTHER, other_workload("node-b", "1500m"))
    allocatable = {"node-a": 2.0, "node-b": 2.0}

    def owner() -> dict[tuple[str, int], str]:
        table = routing(kube, "heavy")
        return {(u.rsplit("/", 1)[0], int(u.rsplit("/", 1)[1])): e for u, e in table.get("units", {}).items()}

    runtime = scripted_runtime("heavy", [f"heavy-e{i}" for i in range(8)], owner)
    prometheus = prometheus_factory(runtime.targets())
    # 16 units at 0.45 busy cores each: 7.2 cores of work, whatever the executor count
    runtime.set_rates(
        {(op, kg): 0.45 for op in ("src", "agg") for kg in range(8)}, records_per_busy_second=2000.0
    )
    with operator(kube, monkeypatch):
        kube.create(CR_PATH, heavy("heavy", prometheus.url))
        exhausted = wait_for(
            lambda: (c := condition(kube, "CapacityExhausted", "heavy")).get("status") == "True" and c,
            what="CapacityExhausted=True from the plan",
        )
        planned = wait_for(lambda: routing(kube, "heavy"), what="the routing table")
        first = wait_for(
            lambda: (p := pods(kube, "heavy")) and len(p) == len(planned["executors"]) and p,
            what="a pod per planned executor",
        )
        assert all(cpu <= allocatable[node] + 1e-9 for node, cpu in requested(kube).items()), requested(kube)
        # SPL rounds see 7.2 cores of work on what fits: the rule wants more, the room has none
        measured = wait_for(
            lambda: (c := status(kube, "heavy").get("capacity")) and c["measured"] and c,
            timeout=90,
            what="a period's measured capacity figures",
        )
        assert len(pods(kube, "heavy")) == len(first)
        # the other team's job ends: its 1.5 cores are room, and the next scale-up takes exactly that
        kube.delete(f"{OTHER}/batch-job")
        grown = wait_for(
            lambda: (t := routing(kube, "heavy")) and len(t["executors"]) > len(planned["executors"]) and t,
            timeout=90,
            what="a scale-up into the freed room",
        )
        after = wait_for(
            lambda: (p := pods(kube, "heavy")) and len(p) == len(grown["executors"]) and p,
            what="a pod per executor after the scale-up",
        )
        still = condition(kube, "CapacityExhausted", "heavy")
        warnings = [e for e in events(kube, "CapacityExhausted") if e["involvedObject"]["name"] == "heavy"]
    message = exhausted["message"]
    assert "pending" in message and "cores missing" in message and "records/s demanded" in message
    assert measured["pendingExecutors"] > 0 and measured["coresMissing"] > 0
    assert measured["recordsDemanded"] > 0
    assert warnings and all(e["type"] == "Warning" for e in warnings)
    per_node = committed_cpu(after.values())
    assert all(cpu <= allocatable[node] + 1e-9 for node, cpu in per_node.items()), per_node
    added = set(grown["executors"]) - set(planned["executors"])
    assert {grown["executors"][e]["host"] for e in added} == {"node-b"}  # where the room was
    assert (
        sum(quantity(p["spec"]["containers"][0]["resources"]["requests"]["cpu"]) for p in after.values()) <= 4
    )
    assert still["status"] == "True"  # 7.2 cores of work still need more than the two nodes hold
