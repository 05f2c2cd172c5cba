"""The SPL loop fed by a real Prometheus (Debian package) scraping scripted executor exporters.

Prometheus runs as a subprocess on loopback with a temp config and data directory, scraping every
second; the exporters are prometheus_client HTTP servers publishing the runtime's metric names. The loop
runs on a recording platform, so the test sees exactly which routing tables and executor sets it applied.
"""

from __future__ import annotations

import math
import time

import pytest
from controller_testkit import MemoryPlatform, ScriptedRuntime, wait_for
from test_reconcile import initial_routing, load_distance, scenario_topology, skewed, two_hosts

from streamtopo.controller.adaptation_loop import AdaptationLoop
from streamtopo.controller.platform import MetricsUnavailable
from streamtopo.controller.prometheus import PrometheusMetricsSource
from streamtopo.documents import load_topology

pytestmark = [pytest.mark.prometheus, pytest.mark.timeout(180)]

SPARE = ["hot-e2", "hot-e3", "hot-e4", "hot-e5"]
"""Exporters for executors the loop may start, scraped from the beginning (they export nothing until
the routing table gives them units), so Prometheus needs no reload when the loop scales out."""


def ready(source: PrometheusMetricsSource, routing_units: int) -> bool:
    try:
        stats = source.collect("hot", 300.0)
    except MetricsUnavailable:
        return False
    return len(stats.units) == routing_units


def test_prometheus_driven_loop_moves_key_groups_scales_and_survives_an_outage(
    prometheus_factory, scripted_runtime
):
    platform = MemoryPlatform(two_hosts())
    routing = initial_routing()

    def owner():
        return (platform.applied[-1].routing if platform.applied else routing).assignment()

    runtime: ScriptedRuntime = scripted_runtime("hot", ["hot-e0", "hot-e1", *SPARE], owner)
    prometheus = prometheus_factory(runtime.targets())
    source = PrometheusMetricsSource(prometheus.url, timeout=2.0)
    loop = AdaptationLoop(platform, source, load_topology(scenario_topology()), routing=routing)

    # Period 1: hot-e1 carries 2.16 cores of agg, hot-e0 0.29 of src: ALBIC moves key groups off hot-e1
    # and the target rule asks for ceil(2.47 / 0.7) = 4 one-core executors (3.52: a rate that Prometheus
    # extrapolates a few percent off still gives 4).
    busy = skewed(1.8)
    runtime.set_rates(busy, records_per_busy_second=10_000)
    wait_for(
        lambda: ready(source, len(routing.units)), timeout=60, what="two samples of every unit in Prometheus"
    )
    first = loop.step(time.time())
    assert first.skipped is None, first.outcome.conditions
    wanted = min(6, math.ceil(sum(busy.values()) / 0.7 - 1e-9))
    applied = platform.applied[-1].routing
    assert first.executors_after == wanted == len(applied.executors), first.adaptation.decision
    moved = {u for u, e in applied.assignment().items() if e != routing.assignment()[u]}
    assert moved and moved == {m[0] for m in first.adaptation.rebalance.migrations}
    assert set(applied.assignment().values()) - {"hot-e0", "hot-e1"}, "new executors got key groups"
    assert load_distance(busy, applied.assignment(), sorted(applied.executors)) < load_distance(
        busy, routing.assignment(), sorted(applied.executors)
    )
    reasons = {e.reason for e in first.outcome.events}
    assert {"RebalanceReport", "ScalingReport"} <= reasons

    # Prometheus goes away: the period is skipped, nothing is applied, a condition says why.
    prometheus.stop()
    count = len(platform.applied)
    down = loop.step(time.time())
    assert down.skipped == "PrometheusUnreachable"
    assert len(platform.applied) == count and loop.routing == applied
    degraded = next(c for c in down.outcome.conditions if c.type == "Degraded")
    assert degraded.status == "True" and "no rebalancing or scaling" in degraded.message

    # It comes back (same port, same data): the loop recovers by itself on a later period.
    prometheus.start()
    wait_for(lambda: ready(source, len(applied.units)), timeout=60, what="Prometheus back with fresh samples")
    back = loop.step(time.time())
    assert back.skipped is None
    assert next(c for c in back.outcome.conditions if c.type == "Degraded").status == "False"


@pytest.mark.kube
def test_operator_daemon_moves_key_groups_in_the_routing_configmap(
    kube, prometheus_factory, scripted_runtime, monkeypatch
):
    """The kopf operator end to end: its SPL daemon reads Prometheus and writes ALBIC's moves into the
    routing ConfigMap; with Prometheus down it says why and leaves the routing alone."""
    import json

    from test_kopf_kmock import CR_PATH, NS, cluster, condition, events, operator, topology

    cluster(kube)
    doc = topology(exlocated=False)
    # maxExecutors 3: the scripted runtime exports pipe-e0..e2, and Aeolus would start 7 for 4.6 cores
    doc["spec"]["autoscaling"] = {
        "interval": "3s",
        "maxMigrationsPerRound": 2,
        "stabilization": "1h",
        "maxExecutors": 3,
    }

    def table() -> dict:
        cm = kube.get(f"/api/v1/namespaces/{NS}/configmaps/pipe-routing")
        return json.loads(cm["data"]["routing.json"]) if cm else {}

    current: dict = {}

    def owner() -> dict:
        return {
            (u.rpartition("/")[0], int(u.rpartition("/")[2])): e for u, e in current.get("units", {}).items()
        }

    runtime = scripted_runtime("pipe", ["pipe-e0", "pipe-e1", "pipe-e2"], owner)
    prometheus = prometheus_factory(runtime.targets())
    doc["spec"]["metrics"] = {"prometheus": {"url": prometheus.url}}
    with operator(kube, monkeypatch):
        kube.create(CR_PATH, doc)
        first = wait_for(table, what="the first routing table")
        assert len(first["executors"]) >= 2
        current.update(first)
        hot = min(first["executors"])
        runtime.set_rates(
            {
                (u.rpartition("/")[0], int(u.rpartition("/")[2])): 0.3 if e == hot else 0.01
                for u, e in first["units"].items()
            },
            records_per_busy_second=10_000,
        )
        moved = wait_for(
            lambda: (t := table()) and t["version"] > first["version"] and t,
            timeout=90,
            what="a routing version written by the SPL daemon",
        )
        current.clear()
        current.update(moved)
        report = wait_for(lambda: events(kube, "RebalanceReport"), what="a RebalanceReport event")
        changed = {u for u, e in moved["units"].items() if e != first["units"][u]}
        assert 0 < len(changed) <= 2 and all(first["units"][u] == hot for u in changed)
        assert "key groups moved" in report[0]["message"]

        prometheus.stop()
        down = wait_for(
            lambda: (
                condition(kube, "Degraded").get("reason") == "PrometheusUnreachable"
                and condition(kube, "Degraded")
            ),
            timeout=60,
            what="Degraded=PrometheusUnreachable",
        )
        during = table()
    assert down["status"] == "True" and "no rebalancing or scaling" in down["message"]
    assert during["version"] == table()["version"]  # nothing applied while Prometheus was away
