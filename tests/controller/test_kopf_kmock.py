"""The operator for real (kopf) against kmock's Kubernetes emulator served over HTTP.

Every check reads the objects back through the API, the way ``kubectl`` would. Deletion relies on the
garbage collector the emulator shim adds (ownerReferences), not on the operator deleting owned objects.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from controller_testkit import (
    ALLOWED_PROMETHEUS_URLS,
    EmulatedKubernetes,
    free_port,
    prometheus_port,
    wait_for,
)

from streamtopo.documents import load_topology

pytestmark = [pytest.mark.kube, pytest.mark.timeout(180)]

NS = "default"
CR_PATH = f"/apis/streamtopo.dev/v1alpha1/namespaces/{NS}/streamtopologies"
PODS = f"/api/v1/namespaces/{NS}/pods"


def topology(name: str = "pipe", *, extra_ops: int = 0, exlocated: bool = True) -> dict[str, Any]:
    """Source -> map -> aggregate -> sink; 'enrich' needs an SSD node; src and agg on different nodes."""
    ops = [
        {
            "name": "src",
            "kind": "source",
            "source": {"generator": "sequence", "ratePerSecond": 1000},
            "cost": {"cpu": 1.5},
        },
        {
            "name": "enrich",
            "kind": "map",
            "inputs": ["src"],
            "select": ["seq", "key"],
            "cost": {"cpu": 1.5},
            "requires": {"nodeSelector": {"disk": "ssd"}},
        },
        {
            "name": "agg",
            "kind": "aggregate",
            "inputs": ["enrich"],
            "keyBy": ["key"],
            "window": {"size": "10s"},
            "aggregations": ["count(*) AS n"],
            "cost": {"cpu": 1.5},
        },
        {"name": "out", "kind": "sink", "inputs": ["agg"], "sink": {"console": {}}, "cost": {"cpu": 0.1}},
    ]
    for i in range(extra_ops):
        ops.append(
            {"name": f"x{i}", "kind": "filter", "inputs": ["agg"], "expr": "n > 0", "cost": {"cpu": 0.2}}
        )
    spec: dict[str, Any] = {
        "keyGroups": 4,
        "operators": ops,
        "fusion": {"algorithm": "cola"},
        "autoscaling": {"interval": "2s"},
    }
    if exlocated:
        spec["constraints"] = {"hostExlocation": [["src", "agg"]]}
    return {
        "apiVersion": "streamtopo.dev/v1alpha1",
        "kind": "StreamTopology",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }


def pods(kube: EmulatedKubernetes, name: str = "pipe") -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in kube.list(PODS, f"streamtopo.dev/topology={name}")}


def status(kube: EmulatedKubernetes, name: str = "pipe") -> dict[str, Any]:
    obj = kube.get(f"{CR_PATH}/{name}")
    return (obj or {}).get("status") or {}


def condition(kube: EmulatedKubernetes, kind: str, name: str = "pipe") -> dict[str, Any]:
    return next((c for c in status(kube, name).get("conditions", []) if c["type"] == kind), {})


def events(kube: EmulatedKubernetes, reason: str) -> list[dict[str, Any]]:
    return [e for e in kube.list(f"/api/v1/namespaces/{NS}/events") if e.get("reason") == reason]


def routing(kube: EmulatedKubernetes, name: str = "pipe") -> dict[str, Any]:
    import json

    cm = kube.get(f"/api/v1/namespaces/{NS}/configmaps/{name}-routing")
    return json.loads(cm["data"]["routing.json"]) if cm else {}


@contextmanager
def operator(
    kube: EmulatedKubernetes, monkeypatch: pytest.MonkeyPatch, namespaces: tuple[str, ...] = (NS,)
) -> Iterator[Any]:
    """kopf's own test runner (same process, its own thread and loop) with the real operator module,
    watching ``namespaces`` (all of them when empty)."""
    from kopf.testing import KopfRunner

    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig))
    monkeypatch.setenv("STREAMTOPO_TICK_SECONDS", "0.3")
    monkeypatch.setenv("STREAMTOPO_WATCH_SERVER_TIMEOUT", "30")
    # The platform lets topologies name the tests' Prometheus servers (all on loopback).
    monkeypatch.setenv("STREAMTOPO_ALLOWED_PROMETHEUS_URLS", ALLOWED_PROMETHEUS_URLS)
    runner = KopfRunner(
        [
            "run",
            "--standalone",
            *(arg for ns in namespaces for arg in ("--namespace", ns)),
            *([] if namespaces else ["--all-namespaces"]),
            "--verbose",
            "-m",
            "streamtopo.controller.operator",
        ],
        timeout=30,
    )
    try:
        with runner:
            yield runner
    finally:  # kopf's log, without the emulator's access log, for a failing test's report
        print("\n".join(line for line in runner.output.splitlines() if "aiohttp.access" not in line)[-20000:])


def cluster(kube: EmulatedKubernetes) -> None:
    kube.add_node("node-a", "4", {"disk": "ssd"})
    kube.add_node("node-b", "4")
    kube.add_node("node-c", "4")


def expected_units(doc: dict[str, Any]) -> set[str]:
    spec = load_topology(doc).spec
    return {f"{op.name}/{kg}" for op in spec.operators for kg in range(spec.key_groups_of(op.name))}


def test_create_renders_pods_configmap_service_and_status(
    kube: EmulatedKubernetes, monkeypatch: pytest.MonkeyPatch
):
    cluster(kube)
    doc = topology()
    with operator(kube, monkeypatch):
        kube.create(CR_PATH, doc)
        wait_for(lambda: condition(kube, "Planned").get("status") == "True", what="Planned=True")
        table = wait_for(lambda: routing(kube), what="routing ConfigMap")
        wait_for(lambda: len(pods(kube)) == len(table["executors"]), what="one pod per executor")
        created = pods(kube)
        st = status(kube)

    # Every unit of the spec is routed exactly once, to an executor that has a pod.
    assert set(table["units"]) == expected_units(doc)
    assert set(table["units"].values()) <= set(created)
    assert set(created) == set(table["executors"])
    owner_uid = kube.get(f"{CR_PATH}/pipe")["metadata"]["uid"]
    ops_of = {e: {u.split("/")[0] for u, owner in table["units"].items() if owner == e} for e in created}
    for name, pod in created.items():
        host = table["executors"][name]["host"]
        terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == [host]
        assert pod["metadata"]["ownerReferences"][0]["uid"] == owner_uid
        sec = pod["spec"]["containers"][0]["securityContext"]
        assert sec["readOnlyRootFilesystem"] is True and sec["capabilities"]["drop"] == ["ALL"]
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
        # Resource matching: the pod running 'enrich' may only land on an SSD node, and is planned on one.
        if "enrich" in ops_of[name]:
            assert pod["spec"]["nodeSelector"] == {"disk": "ssd"}
            assert host == "node-a"
        # Host exlocation: a pod with src refuses nodes running agg, and the other way round.
        anti = pod["spec"].get("affinity", {}).get("podAntiAffinity", {})
        refused = {
            e["key"]
            for t in anti.get("requiredDuringSchedulingIgnoredDuringExecution", [])
            for e in t["labelSelector"]["matchExpressions"]
        }
        if "src" in ops_of[name]:
            assert (
                "op.streamtopo.dev/agg" in refused
                and pod["metadata"]["labels"]["op.streamtopo.dev/src"] == "true"
            )
        if "agg" in ops_of[name]:
            assert "op.streamtopo.dev/src" in refused
    hosts_src = {table["executors"][e]["host"] for e in created if "src" in ops_of[e]}
    hosts_agg = {table["executors"][e]["host"] for e in created if "agg" in ops_of[e]}
    assert hosts_src.isdisjoint(hosts_agg)
    service = kube.get(f"/api/v1/namespaces/{NS}/services/pipe-metrics")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"]["streamtopo.dev/topology"] == "pipe"
    assert st["executors"] == len(created) and st["routingVersion"] == table["version"] == 1
    assert st["observedGeneration"] == 1 and st["pes"]
    ready = next(c for c in st["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["reason"] == "ExecutorsStarting"  # no kubelet runs the pods
    assert all(c["lastTransitionTime"] for c in st["conditions"])
    assert events(kube, "Planned")


def test_the_executor_template_reaches_the_pods_through_the_api(
    kube: EmulatedKubernetes, monkeypatch: pytest.MonkeyPatch
):
    cluster(kube)
    doc = topology(exlocated=False)
    doc["spec"]["executor"] = {
        "resources": {"memory": "1536Mi"},
        "env": [{"name": "FEED_REGION", "value": "eu"}],
        "podTemplate": {
            "metadata": {"labels": {"team": "markets"}},
            "spec": {
                "tolerations": [{"key": "dedicated", "operator": "Exists"}],
                "priorityClassName": "streaming",
            },
        },
    }
    with operator(kube, monkeypatch):
        kube.create(CR_PATH, doc)
        table = wait_for(lambda: routing(kube), what="plan")
        created = wait_for(lambda: (p := pods(kube)) and set(p) == set(table["executors"]) and p, what="pods")
        # leave only once kopf has recorded the handled spec: stopping amid its own patch can restart the
        # daemon after the stop flag, and the runner then times out on exit
        wait_for(
            lambda: (
                "streamtopo.dev/last-handled-configuration"
                in (kube.get(f"{CR_PATH}/pipe")["metadata"].get("annotations") or {})
            ),
            what="handled",
        )
        wait_for(
            lambda: condition(kube, "Ready").get("reason") == "ExecutorsStarting", what="status after pods"
        )
    for pod in created.values():
        container = pod["spec"]["containers"][0]
        assert pod["metadata"]["labels"]["team"] == "markets"
        assert pod["spec"]["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
        assert pod["spec"]["priorityClassName"] == "streaming"
        assert {"name": "FEED_REGION", "value": "eu"} in container["env"]
        assert container["resources"]["limits"] == {"memory": "1536Mi"}


def test_update_replans_and_invalid_update_keeps_last_good(
    kube: EmulatedKubernetes, monkeypatch: pytest.MonkeyPatch
):
    cluster(kube)
    doc = topology()
    with operator(kube, monkeypatch):
        kube.create(CR_PATH, doc)
        first = wait_for(lambda: routing(kube), what="first plan")
        wait_for(lambda: len(pods(kube)) == len(first["executors"]), what="pods")

        bigger = topology(extra_ops=2)
        kube.patch(f"{CR_PATH}/pipe", {"spec": bigger["spec"]})
        second = wait_for(
            lambda: (r := routing(kube)) and r["version"] > first["version"] and r, what="re-plan"
        )
        assert set(second["units"]) == expected_units(bigger)
        wait_for(lambda: status(kube).get("observedGeneration") == 2, what="observedGeneration 2")
        good_pods = wait_for(
            lambda: (p := pods(kube)) and set(p) == set(second["executors"]) and p, what="pods of the re-plan"
        )

        broken = topology(extra_ops=2)
        broken["spec"]["operators"][1]["inputs"] = ["nosuch"]
        kube.patch(f"{CR_PATH}/pipe", {"spec": broken["spec"]})
        refused = wait_for(
            lambda: condition(kube, "Planned").get("status") == "False" and condition(kube, "Planned"),
            what="Planned=False",
        )
        warning = wait_for(lambda: events(kube, "InvalidSpec"), what="InvalidSpec event")
        after_pods = pods(kube)
        after_routing = routing(kube)

    assert refused["reason"] == "InvalidSpec" and "spec.operators[1].inputs[0]" in refused["message"]
    assert "nosuch" in warning[0]["message"] and warning[0]["type"] == "Warning"
    assert after_routing == second  # the last good deployment is untouched
    assert {n: p["metadata"]["uid"] for n, p in after_pods.items()} == {
        n: p["metadata"]["uid"] for n, p in good_pods.items()
    }


@pytest.mark.parametrize("recorded", [False, True])
def test_the_period_waits_for_the_spec_handler_to_apply_a_suspend_or_resume(recorded: bool):
    """The daemon's live body can say suspend while the recorded deployment still runs (or the reverse):
    a period stepped then published a resumed phase with no executors. It waits until the handler has
    observed the generation, and then steps whatever the handler recorded (a refused edit included)."""
    from types import SimpleNamespace

    from streamtopo.controller.operator import _suspend_pending

    deployment: Any = SimpleNamespace(topology=SimpleNamespace(spec=SimpleNamespace(suspend=recorded)))

    def body(suspend: bool, observed: int) -> dict[str, Any]:
        return {
            "metadata": {"generation": 3},
            "spec": {"suspend": suspend},
            "status": {"observedGeneration": observed},
        }

    assert _suspend_pending(body(not recorded, observed=2), deployment)
    assert not _suspend_pending(body(not recorded, observed=3), deployment)
    assert not _suspend_pending(body(recorded, observed=2), deployment)


def test_suspend_deletes_the_pods_and_resume_recreates_them(
    kube: EmulatedKubernetes, monkeypatch: pytest.MonkeyPatch
):
    cluster(kube)
    with operator(kube, monkeypatch):
        kube.create(CR_PATH, topology())
        first = wait_for(lambda: routing(kube), what="first plan")
        wait_for(lambda: set(pods(kube)) == set(first["executors"]), what="pods")
        kube.patch(f"{CR_PATH}/pipe", {"spec": {"suspend": True}})
        wait_for(lambda: not pods(kube), what="every executor pod deleted")
        suspended = wait_for(
            lambda: (s := status(kube)).get("phase") == "Suspended" and s, what="phase Suspended"
        )
        paused_routing = routing(kube)
        kube.patch(f"{CR_PATH}/pipe", {"spec": {"suspend": False}})
        back = wait_for(
            lambda: (p := pods(kube)) and set(p) == set(first["executors"]) and p,
            what="the same executors again",
        )
        resumed = wait_for(
            lambda: (s := status(kube)).get("phase") not in (None, "Suspended") and s,
            what="phase after resume",
        )
    assert paused_routing == first and routing(kube) == first  # kept: same version, units and executors
    ready = next(c for c in suspended["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["reason"] == "Suspended" and suspended["executors"] == 0
    assert set(back) == set(first["executors"]) and resumed["executors"] == len(first["executors"])


def test_a_suspended_topology_counts_no_executors_whoever_publishes(
    kube: EmulatedKubernetes, monkeypatch: pytest.MonkeyPatch
):
    """publish() of a suspended topology with the SPL daemon's outcome, which still counts the routing's
    executors: the status says Suspended and 0 executors, never Suspended beside the stale 7 (what a
    reader between the pods' deletion and the spec handler's next write once saw). Resumed, the same
    outcome's count is published."""
    from kubernetes import config

    from streamtopo.controller import operator as operator_module
    from streamtopo.controller.kubernetes import KubernetesPlatform
    from streamtopo.controller.reconcile import Outcome

    api = config.new_client_from_config(config_file=str(kube.kubeconfig))
    monkeypatch.setattr(operator_module.STATE, "api", api)
    cluster(kube)
    doc = topology()
    doc["spec"]["suspend"] = True
    body = kube.create(CR_PATH, doc)
    platform = KubernetesPlatform(NS, body, api)
    daemon = Outcome(status={"executors": 7})
    operator_module.publish(body, platform, daemon, observed=False)
    suspended = status(kube)
    assert (suspended["phase"], suspended["executors"]) == ("Suspended", 0)
    resumed = kube.patch(f"{CR_PATH}/pipe", {"spec": {"suspend": False}})
    operator_module.publish(resumed, platform, daemon, observed=False)
    assert status(kube)["executors"] == 7 and status(kube)["phase"] != "Suspended"


def test_the_loops_memory_is_stored_with_the_routing_table(kube: EmulatedKubernetes):
    """KubernetesPlatform writes DesiredState.memory into the routing ConfigMap beside routing.json and
    reads it back (what a restarted operator resumes from); a later apply without a change rewrites
    nothing."""
    from kubernetes import config

    from streamtopo.controller.kubernetes import KubernetesPlatform
    from streamtopo.controller.platform import DesiredState
    from streamtopo.controller.reconcile import reconcile

    cluster(kube)
    owner = kube.create(CR_PATH, topology())
    platform = KubernetesPlatform(NS, owner, config.new_client_from_config(config_file=str(kube.kubeconfig)))
    first = reconcile(owner, platform).desired
    assert first is not None and platform.read_deployment().memory is None
    memory = '{"collocations": [[["src", 0], ["agg", 0]]], "decisions": [], "scaling": {}}'
    platform.apply(DesiredState(first.topology, first.routing, memory))
    back = platform.read_deployment()
    assert back.memory == memory and back.routing == first.routing
    version = kube.get(f"/api/v1/namespaces/{NS}/configmaps/pipe-routing")["metadata"]["resourceVersion"]
    again = reconcile(owner, platform, previous=back).desired  # same spec: kept, memory included
    assert again.memory == memory
    assert (
        kube.get(f"/api/v1/namespaces/{NS}/configmaps/pipe-routing")["metadata"]["resourceVersion"] == version
    )


def crash_looping(reason: str, message: str | None = None, exit_code: int = 137) -> dict[str, Any]:
    terminated = {"reason": reason, "exitCode": exit_code, **({"message": message} if message else {})}
    return {
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [
                {
                    "name": "executor",
                    "ready": False,
                    "restartCount": 3,
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                    "lastState": {"terminated": terminated},
                }
            ],
        }
    }


def running_ready() -> dict[str, Any]:
    return {
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [
                {
                    "name": "executor",
                    "ready": True,
                    "restartCount": 0,
                    "state": {"running": {}},
                    "lastState": {},
                }
            ],
        }
    }


def test_health_follows_readiness_and_a_crash_loop_is_named(
    kube: EmulatedKubernetes, monkeypatch: pytest.MonkeyPatch
):
    """Ready counts pods whose readiness probe passes (not Running ones); an OOM-killed executor in a crash
    loop makes the topology Degraded naming the pod and reason, with one Warning Event; recovered, the
    topology is Ready and no longer Degraded for it."""
    cluster(kube)
    with operator(kube, monkeypatch):
        kube.create(CR_PATH, topology())
        table = wait_for(lambda: routing(kube), what="plan")
        names = sorted(
            wait_for(lambda: (p := pods(kube)) and set(p) == set(table["executors"]) and p, what="pods")
        )
        victim, others = names[0], names[1:]
        for name in others:
            kube.patch(f"{PODS}/{name}/status", running_ready())
        kube.patch(f"{PODS}/{victim}/status", crash_looping("OOMKilled"))
        degraded = wait_for(
            lambda: (c := condition(kube, "Degraded")).get("reason") == "ExecutorFailing" and c,
            what="Degraded=ExecutorFailing",
        )
        warned = wait_for(lambda: events(kube, "ExecutorFailing"), what="a Warning Event")
        not_ready = condition(kube, "Ready")
        kube.patch(f"{PODS}/{victim}/status", running_ready())
        ready = wait_for(
            lambda: (c := condition(kube, "Ready")).get("status") == "True" and c, what="Ready=True"
        )
        after = wait_for(
            lambda: (c := condition(kube, "Degraded")).get("reason") != "ExecutorFailing" and c,
            what="Degraded no longer ExecutorFailing",
        )
        warnings = events(kube, "ExecutorFailing")
    assert degraded["status"] == "True" and victim in degraded["message"]
    assert "CrashLoopBackOff (OOMKilled)" in degraded["message"] and "3 restarts" in degraded["message"]
    assert not_ready["status"] == "False" and not_ready["reason"] == "ExecutorsFailing"
    assert f"{len(others)} of {len(names)}" in not_ready["message"]
    assert (
        warned[0]["type"] == "Warning"
        and victim in warned[0]["message"]
        and "OOMKilled" in warned[0]["message"]
    )
    assert len(warnings) == 1  # reported once, not every period
    assert ready["reason"] == "ExecutorsReady" and f"{len(names)} of {len(names)}" in ready["message"]
    assert after["reason"] != "ExecutorFailing"


def test_a_failed_step_is_named_in_the_condition_and_an_event(
    kube: EmulatedKubernetes, monkeypatch: pytest.MonkeyPatch
):
    """An executor whose step Spark's ANSI mode fails exits with code 2 and writes why to its termination
    message (the pod renders --termination-log and terminationMessagePath): the topology is Degraded
    naming the pod, the operator, the aggregation and Spark's error class, and a Warning Event says it."""
    cluster(kube)
    reason = (
        "cannot run the pipeline: operator 'totals', aggregations[1]: [ARITHMETIC_OVERFLOW] overflow. "
        "Use 'try_add' to tolerate overflow and return NULL instead."
    )
    with operator(kube, monkeypatch):
        kube.create(CR_PATH, topology())
        table = wait_for(lambda: routing(kube), what="plan")
        names = sorted(
            wait_for(lambda: (p := pods(kube)) and set(p) == set(table["executors"]) and p, what="pods")
        )
        container = kube.get(f"{PODS}/{names[0]}")["spec"]["containers"][0]
        kube.patch(f"{PODS}/{names[0]}/status", crash_looping("Error", reason, exit_code=2))
        degraded = wait_for(
            lambda: (c := condition(kube, "Degraded")).get("reason") == "ExecutorFailing" and c,
            what="Degraded=ExecutorFailing",
        )
        warned = wait_for(lambda: events(kube, "ExecutorFailing"), what="a Warning Event")
    log = container["terminationMessagePath"]
    assert container["args"][container["args"].index("--termination-log") + 1] == log
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    for said in (degraded["message"], warned[0]["message"]):
        assert names[0] in said and "operator 'totals', aggregations[1]: [ARITHMETIC_OVERFLOW]" in said


def test_node_removed_and_added_replans(kube: EmulatedKubernetes, monkeypatch: pytest.MonkeyPatch):
    cluster(kube)
    with operator(kube, monkeypatch):
        kube.create(CR_PATH, topology(exlocated=False))
        first = wait_for(lambda: routing(kube), what="first plan")
        used = sorted({e["host"] for e in first["executors"].values()} - {"node-a"})
        assert used, "the plan uses a node other than node-a"
        gone = used[0]
        kube.delete(f"/api/v1/nodes/{gone}")
        second = wait_for(
            lambda: (r := routing(kube)) and r["version"] > first["version"] and r,
            what="re-plan after node removal",
        )
        assert gone not in {e["host"] for e in second["executors"].values()}
        wait_for(
            lambda: (
                all(
                    p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
                        "nodeSelectorTerms"
                    ][0]["matchExpressions"][0]["values"][0]
                    != gone
                    for p in pods(kube).values()
                )
                and pods(kube)
            ),
            what="no pod pinned to the removed node",
        )
        kube.add_node("node-d", "16")
        third = wait_for(
            lambda: (r := routing(kube)) and r["version"] > second["version"] and r,
            what="re-plan after node addition",
        )
        assert events(kube, "NodesChanged")
    assert set(third["units"]) == set(first["units"])


def test_delete_garbage_collects_owned_objects(kube: EmulatedKubernetes, monkeypatch: pytest.MonkeyPatch):
    cluster(kube)
    with operator(kube, monkeypatch):
        kube.create(CR_PATH, topology())
        wait_for(lambda: pods(kube), what="pods")
        kube.delete(f"{CR_PATH}/pipe")
        wait_for(lambda: kube.get(f"{CR_PATH}/pipe") is None, what="the topology gone (finalizer released)")
        wait_for(lambda: not pods(kube), what="pods garbage-collected")
    assert kube.get(f"/api/v1/namespaces/{NS}/configmaps/pipe-routing") is None
    assert kube.get(f"/api/v1/namespaces/{NS}/services/pipe-metrics") is None


def test_emulator_collects_garbage_as_a_delete_that_finalizers_hold(kube: EmulatedKubernetes):
    """The emulator's garbage collector must not skip a dependent's finalizer, as the API server's does not:
    a shared topology deleted with its last consumer still runs its own delete handler (its streams)."""
    configmaps = f"/api/v1/namespaces/{NS}/configmaps"
    owner = kube.create(configmaps, {"metadata": {"name": "owner"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
    for name, finalizers in (("held", ["streamtopo.dev/test"]), ("free", [])):
        kube.create(
            configmaps, {"metadata": {"name": name, "ownerReferences": [ref], "finalizers": finalizers}}
        )
    kube.delete(f"{configmaps}/owner")
    assert kube.get(f"{configmaps}/free") is None
    held = kube.get(f"{configmaps}/held")
    assert held is not None and held["metadata"].get("deletionTimestamp")
    kube.patch(f"{configmaps}/held", {"metadata": {"finalizers": []}})
    assert kube.get(f"{configmaps}/held") is None


@pytest.mark.slow
def test_killed_mid_reconcile_converges_without_duplicates(
    kube: EmulatedKubernetes, subprocess_env: dict[str, str]
):
    """SIGKILL the operator process while it is creating pods; a new process finishes the same objects."""
    cluster(kube)
    kube.set_pod_create_delay(0.4)  # a slow API server makes "mid-reconcile" a wide window
    doc = topology(extra_ops=3, exlocated=False)
    health = f"http://127.0.0.1:{free_port()}/healthz"
    command = [
        sys.executable,
        "-c",
        "from streamtopo.cli import main; main()",
        "operator",
        "--namespace",
        NS,
        "--liveness",
        health,
    ]
    first = subprocess.Popen(
        command,
        env=subprocess_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        kube.create(CR_PATH, doc)
        table = wait_for(lambda: routing(kube), timeout=60, what="routing ConfigMap from the first operator")
        wait_for(lambda: pods(kube), timeout=30, what="the first pod")
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(10)
    partial = set(pods(kube))
    assert 0 < len(partial) < len(table["executors"]), "the kill did not land mid-reconcile"

    kube.set_pod_create_delay(0.0)
    second = subprocess.Popen(
        command,
        env=subprocess_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        done = wait_for(
            lambda: (p := pods(kube)) and len(p) == len(table["executors"]) and p,
            timeout=60,
            what="all pods after restart",
        )
        final_routing = routing(kube)
        with urllib.request.urlopen(health, timeout=5) as probe:  # `streamtopo operator --liveness`
            assert probe.status == 200
    finally:
        os.killpg(second.pid, signal.SIGTERM)
        try:
            second.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(second.pid, signal.SIGKILL)
            second.wait(10)
    names = [p["metadata"]["name"] for p in kube.list(PODS)]
    assert len(names) == len(set(names)) == len(table["executors"])  # no duplicates, nothing extra
    assert set(done) == set(table["executors"])
    assert final_routing == table  # the restart re-applied the recorded deployment, not a new plan


def test_two_replicas_with_peering_one_acts_and_the_other_takes_over(
    kube: EmulatedKubernetes, subprocess_env: dict[str, str], tmp_path
):
    """Two operator processes as the chart's HA mode runs them (`--peering`, pods of one Deployment:
    same arguments, different names): exactly one handles topologies while the other pauses; when the
    leader stops (a rolling update, a drained node), the standby resumes and handles the next change."""
    cluster(kube)
    kube.create(
        f"/apis/kopf.dev/v1/namespaces/{NS}/kopfpeerings",
        {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": "streamtopo"}},
    )
    command = [sys.executable, "-c", "from streamtopo.cli import main; main()", "operator", "--namespace", NS]
    command += ["--peering", "streamtopo", "--verbose"]
    replicas = {}
    for name in ("streamtopo-7d9f-a", "streamtopo-7d9f-b"):
        log = (tmp_path / f"{name}.log").open("w")
        env = {**subprocess_env, "POD_NAME": name}
        replicas[name] = (
            subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True),
            tmp_path / f"{name}.log",
        )
    from streamtopo.controller.operator import peering_priority

    leader, standby = sorted(replicas, key=lambda n: peering_priority({"POD_NAME": n}), reverse=True)

    def handled(name: str) -> int:
        return replicas[name][1].read_text().count("Handler 'reconcile_topology' succeeded")

    def acting(name: str) -> bool:
        """kopf's latest peering verdict in the replica's log (both start paused; the first one up
        acts alone until it sees the other)."""
        log = replicas[name][1].read_text()
        return log.rfind("Resuming operations") > log.rfind("Pausing operations")

    try:
        wait_for(
            lambda: acting(leader) and not acting(standby) and "Pausing" in replicas[standby][1].read_text(),
            timeout=60,
            what="the peering settled: the higher priority acts, the other pauses",
        )
        kube.create(CR_PATH, topology())
        first = wait_for(lambda: pods(kube), timeout=60, what="pods from the leader")
        wait_for(lambda: handled(leader) >= 1, what="the leader's reconcile")
        assert handled(standby) == 0 and not acting(standby)

        leader_process = replicas[leader][0]
        os.killpg(leader_process.pid, signal.SIGTERM)  # graceful: it leaves the peering at once
        leader_process.wait(30)
        wait_for(lambda: acting(standby), timeout=60, what="the standby resuming")
        kube.patch(f"{CR_PATH}/pipe", {"spec": topology(extra_ops=1)["spec"]})  # an operator added
        wait_for(lambda: handled(standby) >= 1, timeout=60, what="the standby handling the update")
        wait_for(
            lambda: set(expected_units(topology(extra_ops=1))) <= set(routing(kube)["units"]),
            timeout=60,
            what="the update applied by the standby",
        )
    finally:
        for process, _ in replicas.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
    assert first


class BasicAuthPrometheus:
    """A stand-in for Prometheus's HTTP API behind basic auth (as with its web.config.file): requests
    without the right ``Authorization`` header get 401; authorised queries get an empty result. It
    records the header of every request, so the test sees exactly what the operator sent on the wire."""

    def __init__(self, user: str, password: str):
        import base64
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        seen = self.authorizations = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                seen.append(self.headers.get("Authorization"))
                ok = self.headers.get("Authorization") == expected
                body = (
                    b'{"status":"success","data":{"resultType":"vector","result":[]}}'
                    if ok
                    else b"Unauthorized"
                )
                self.send_response(200 if ok else 401)
                self.send_header("Content-Type", "application/json" if ok else "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_GET

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", prometheus_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.expected = expected
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_prometheus_basic_auth_comes_from_the_secret_reference(
    kube: EmulatedKubernetes, monkeypatch: pytest.MonkeyPatch
):
    """spec.metrics.prometheus.basicAuthSecret: absent Secret -> the SPL loop skips with a condition naming
    the field (NotFound) and sends nothing; once the Secret exists its `user:password` reaches Prometheus
    as basic auth, and the value appears nowhere in status or events."""
    import base64
    import json

    user, password = "reader", "s3cret-Pa55"
    prometheus = BasicAuthPrometheus(user, password)
    cluster(kube)
    doc = topology(exlocated=False)
    doc["spec"]["metrics"] = {
        "prometheus": {"url": prometheus.url, "basicAuthSecret": {"name": "prom-auth", "key": "auth"}}
    }
    try:
        with operator(kube, monkeypatch):
            kube.create(CR_PATH, doc)
            missing = wait_for(
                lambda: (c := condition(kube, "Degraded")).get("reason") == "SecretNotFound" and c,
                what="Degraded=SecretNotFound",
            )
            assert prometheus.authorizations == []  # no query goes out without the credentials
            kube.create(
                f"/api/v1/namespaces/{NS}/secrets",
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": "prom-auth", "namespace": NS},
                    "data": {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()},
                },
            )
            wait_for(
                lambda: prometheus.expected in prometheus.authorizations, what="basic auth sent to Prometheus"
            )
            # Authorised, Prometheus answers; it just has no series yet: the loop says so, not "unreachable".
            after = wait_for(
                lambda: (c := condition(kube, "Degraded")).get("reason") == "MetricsIncomplete" and c,
                what="Degraded=MetricsIncomplete once the Secret is readable",
            )
            published = json.dumps([status(kube), kube.list(f"/api/v1/namespaces/{NS}/events")])
    finally:
        prometheus.close()
    assert missing["status"] == "True"
    assert (
        "spec.metrics.prometheus.basicAuthSecret" in missing["message"] and "NotFound" in missing["message"]
    )
    assert "prom-auth" in missing["message"] and "no rebalancing or scaling" in missing["message"]
    assert set(prometheus.authorizations) == {
        prometheus.expected
    }  # never a request without or with other auth
    assert after["status"] == "True"
    assert (
        password not in published
        and base64.b64encode(f"{user}:{password}".encode()).decode() not in published
    )


def test_platform_prometheus_credentials_never_reach_a_tenants_url(
    kube: EmulatedKubernetes, monkeypatch: pytest.MonkeyPatch
):
    """The chart's operator-wide Prometheus credentials go to the platform's Prometheus only: a topology
    naming its own Prometheus URL without a basicAuthSecret gets unauthenticated queries there."""
    platform = BasicAuthPrometheus("platform", "pl4tform-Secret")
    tenant = BasicAuthPrometheus("unused", "unused")
    monkeypatch.setenv("STREAMTOPO_PROMETHEUS_URL", platform.url)
    monkeypatch.setenv("STREAMTOPO_PROMETHEUS_USERNAME", "platform")
    monkeypatch.setenv("STREAMTOPO_PROMETHEUS_PASSWORD", "pl4tform-Secret")
    cluster(kube)
    doc = topology(exlocated=False)
    doc["spec"]["metrics"] = {"prometheus": {"url": tenant.url}}
    try:
        with operator(kube, monkeypatch):
            kube.create(CR_PATH, doc)
            wait_for(lambda: tenant.authorizations, what="the SPL loop queries the tenant's Prometheus")
    finally:
        platform.close()
        tenant.close()
    assert set(tenant.authorizations) == {None}  # no Authorization header at all
    assert platform.authorizations == []


WORKER_SCRIPT = """
import json, sys
import streamtopo.controller.operator  # the kopf process's imports
from streamtopo.controller.planner_worker import WorkerPlanner
from streamtopo.planner.cluster import Cluster, Host
from streamtopo.documents import load_topology
from streamtopo.planner.model import TopologyError

heavy = sorted(m for m in ("ortools", "pyspark", "pymetis") if m in sys.modules)
topology = load_topology(json.loads(sys.argv[1]))
cluster = Cluster(hosts=[Host(name="node-a", cpu=4.0, labels={"disk": "ssd"}), Host(name="node-b", cpu=4.0),
                         Host(name="node-c", cpu=4.0)])
planner = WorkerPlanner(tasks_per_child=1)  # a fresh worker for every call
try:
    plans = [planner.plan(topology, cluster, None, 0)[0].routing.model_dump(mode="json") for _ in range(2)]
    crowded = Cluster(hosts=[Host(name="node-a", cpu=8.0, labels={"disk": "ssd"})])  # exlocation needs 2 hosts
    try:
        planner.plan(topology.model_copy(update={"spec": topology.spec.model_copy(update={
            "constraints": topology.spec.constraints.model_copy(update={"host_exlocation": [["src", "agg"]]})})}),
            crowded, None, 0)
        refused = None
    except ValueError as error:
        refused = [type(error).__name__, str(error)]
finally:
    planner.shutdown()
heavy_after = sorted(m for m in ("ortools", "pyspark", "pymetis") if m in sys.modules)
print(json.dumps({"heavy": heavy, "heavy_after": heavy_after, "plans": plans, "refused": refused}))
"""


def test_operator_process_never_imports_the_planning_stack():
    """The kopf process imports neither OR-Tools nor PySpark, also after planning: plans come from the
    worker process, and they equal the same plan computed in process (the reference, here in pytest)."""
    import json

    from streamtopo.controller.reconcile import IN_PROCESS
    from streamtopo.planner.cluster import Cluster, Host

    doc = topology(exlocated=False)
    run = subprocess.run(
        [sys.executable, "-c", WORKER_SCRIPT, json.dumps(doc)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["heavy"] == [] and result["heavy_after"] == []
    cluster = Cluster(
        hosts=[
            Host(name="node-a", cpu=4.0, labels={"disk": "ssd"}),
            Host(name="node-b", cpu=4.0),
            Host(name="node-c", cpu=4.0),
        ]
    )
    reference = IN_PROCESS.plan(load_topology(doc), cluster, None, 0)[0].routing.model_dump(mode="json")
    assert result["plans"] == [reference, reference]
    assert result["refused"] is not None and result["refused"][0] in ("ValueError", "TopologyError")


def test_planning_worker_is_replaced_after_n_calls_without_deadlock():
    """Calls queued from several threads (as kopf's handlers and daemons do) all finish, and the worker is
    replaced every ``tasks_per_child`` calls: 12 calls at 2 per worker are served by 12 / 2 = 6 processes,
    none of them this one. (``max_tasks_per_child`` would hang here on Python 3.11: CPython gh-115634.)"""
    import os
    from concurrent.futures import ThreadPoolExecutor

    from streamtopo.controller.planner_worker import WorkerPlanner

    planner = WorkerPlanner(tasks_per_child=2)
    try:
        with ThreadPoolExecutor(6) as threads:
            pids = list(threads.map(lambda _: planner._call(os.getpid), range(12)))
    finally:
        planner.shutdown()
    assert len(pids) == 12 and os.getpid() not in pids
    assert len(set(pids)) == 6 and all(pids.count(pid) == 2 for pid in set(pids))


HOT_PAIR = [["agg", 0], ["src", 0]]
"""The pair src/0 -> agg/0 as the loop's state stores a collocation (sorted)."""


def hot_topology(name: str, prometheus_url: str, albic: dict[str, Any]) -> dict[str, Any]:
    """Two keyed operators of 8 key groups; src/0 sends far more to agg/0 than any other pair."""
    return {
        "apiVersion": "streamtopo.dev/v1alpha1",
        "kind": "StreamTopology",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "keyGroups": 8,
            "operators": [
                {"name": "src", "kind": "source", "source": {"generator": "sequence", "ratePerSecond": 1000}},
                {
                    "name": "agg",
                    "kind": "aggregate",
                    "inputs": ["src"],
                    "keyBy": ["key"],
                    "window": {"size": "10s"},
                    "aggregations": ["count(*) AS n"],
                },
            ],
            "fusion": {"algorithm": "none"},
            "metrics": {"prometheus": {"url": prometheus_url}},
            "autoscaling": {
                "interval": "3s",
                "metricWindow": "3s",
                "rule": "off",
                "minExecutors": 1,
                "maxExecutors": 8,
                "albic": albic,
            },
        },
    }


@pytest.mark.prometheus
def test_albic_fields_reach_the_operators_decisions(
    kube: EmulatedKubernetes, monkeypatch: pytest.MonkeyPatch, prometheus_factory, scripted_runtime
):
    """spec.autoscaling.albic on Kubernetes: two topologies see the same metrics (a real Prometheus
    scraping scripted executors) and differ only in scoreFactor. With the paper's 1.5 the hot pair is
    collocated and kept for the next rounds (the loop's state in the routing ConfigMap); with 8, above
    hot / avg, no pair ever qualifies."""
    import json

    cluster(kube)
    executors = {name: [f"{name}-e{i}" for i in range(8)] for name in ("paper", "strict")}

    def owner(name: str):
        def units() -> dict[tuple[str, int], str]:
            table = routing(kube, name)
            return {
                (u.rsplit("/", 1)[0], int(u.rsplit("/", 1)[1])): e for u, e in table.get("units", {}).items()
            }

        return units

    runtimes = {name: scripted_runtime(name, executors[name], owner(name)) for name in executors}
    prometheus = prometheus_factory([t for r in runtimes.values() for t in r.targets()])
    busy = {(op, kg): 0.05 for op in ("src", "agg") for kg in range(8)}
    traffic = {(("src", i), ("agg", j)): 10.0 for i in range(8) for j in range(8)}
    traffic[(("src", 0), ("agg", 0))] = 1000.0
    for runtime in runtimes.values():
        runtime.set_rates(busy, records_per_busy_second=2000.0)
        runtime.set_traffic(traffic)

    def memory(name: str) -> dict[str, Any]:
        cm = kube.get(f"/api/v1/namespaces/{NS}/configmaps/{name}-routing") or {}
        return json.loads((cm.get("data") or {}).get("state.json") or "{}")

    with operator(kube, monkeypatch):
        kube.create(CR_PATH, hot_topology("paper", prometheus.url, {"scoreFactor": 1.5}))
        kube.create(CR_PATH, hot_topology("strict", prometheus.url, {"scoreFactor": 8.0}))
        wait_for(
            lambda: (
                len(memory("paper").get("decisions", [])) >= 3
                and len(memory("strict").get("decisions", [])) >= 3
            ),
            timeout=150,
            what="three applied rounds of each topology",
        )
        paper, strict, table = memory("paper"), memory("strict"), routing(kube, "paper")
    assert HOT_PAIR in [sorted(pair) for pair in paper["collocations"]]  # made, then kept round after round
    assert table["units"]["src/0"] == table["units"]["agg/0"]
    assert strict.get("collocations", []) == []  # no pair passes out > avg * 8


def hot_runtime(name: str, kube: EmulatedKubernetes, prometheus_factory, scripted_runtime):
    """Scripted executors for topology ``name`` (as many as it may get) exporting the hot-pair load,
    each unit from the executor the topology's routing ConfigMap names, and a Prometheus scraping them."""

    def owner() -> dict[tuple[str, int], str]:
        table = routing(kube, name)
        return {(u.rsplit("/", 1)[0], int(u.rsplit("/", 1)[1])): e for u, e in table.get("units", {}).items()}

    runtime = scripted_runtime(name, [f"{name}-e{i}" for i in range(8)], owner)
    busy = {(op, kg): 0.05 for op in ("src", "agg") for kg in range(8)}
    traffic = {(("src", i), ("agg", j)): 10.0 for i in range(8) for j in range(8)}
    traffic[(("src", 0), ("agg", 0))] = 1000.0
    runtime.set_rates(busy, records_per_busy_second=2000.0)
    runtime.set_traffic(traffic)
    return prometheus_factory(runtime.targets())


@pytest.mark.prometheus
def test_recommend_mode_acts_on_nothing_until_a_decision_is_approved(
    kube: EmulatedKubernetes, monkeypatch: pytest.MonkeyPatch, prometheus_factory, scripted_runtime
):
    """spec.autoscaling.mode Recommend through the API: every period's decision is published in
    status.recommendation and as an Event, the routing table stays as planned; annotating the topology
    with streamtopo.dev/approve: <id> applies that decision, once."""
    cluster(kube)
    prometheus = hot_runtime("rec", kube, prometheus_factory, scripted_runtime)
    doc = hot_topology("rec", prometheus.url, {})
    doc["spec"]["autoscaling"]["mode"] = "Recommend"
    with operator(kube, monkeypatch):
        kube.create(CR_PATH, doc)
        planned = wait_for(lambda: routing(kube, "rec"), what="the initial routing table")
        pending = wait_for(
            lambda: (r := status(kube, "rec").get("recommendation")) and not r["approved"] and r,
            timeout=120,
            what="a published recommendation",
        )
        assert [e for e in events(kube, "Recommendation") if "rec" in e["involvedObject"]["name"]]
        assert routing(kube, "rec")["version"] == planned["version"]  # nothing applied meanwhile
        kube.patch(f"{CR_PATH}/rec", {"metadata": {"annotations": {"streamtopo.dev/approve": pending["id"]}}})
        # The Event, not status.recommendation: the next period (3 s) may publish a newer decision there.
        wait_for(
            lambda: [e for e in events(kube, "RecommendationApproved") if pending["id"] in e["message"]],
            timeout=60,
            what="the approved decision applied",
        )
        after = routing(kube, "rec")
    assert after["version"] > planned["version"]
    assert after["units"] != planned["units"]


@pytest.mark.prometheus
def test_replicas_pin_the_executor_count_and_albic_balances_within(
    kube: EmulatedKubernetes, monkeypatch: pytest.MonkeyPatch, prometheus_factory, scripted_runtime
):
    """`kubectl scale stopo NAME --replicas N` (a merge patch of the scale subresource, which the
    emulator maps as the CRD declares: spec.replicas, status.executors, status.selector): the SPL loop
    brings the executor count to N and keeps it there while it rebalances."""
    cluster(kube)
    prometheus = hot_runtime("pin", kube, prometheus_factory, scripted_runtime)
    doc = hot_topology("pin", prometheus.url, {})
    with operator(kube, monkeypatch):
        kube.create(CR_PATH, doc)
        wait_for(lambda: routing(kube, "pin"), what="the initial routing table")
        scale = kube.patch(f"{CR_PATH}/pin/scale", {"spec": {"replicas": 4}})  # what `kubectl scale` sends
        assert scale["kind"] == "Scale" and scale["spec"]["replicas"] == 4
        table = wait_for(
            lambda: (t := routing(kube, "pin")) and len(t["executors"]) == 4 and t,
            timeout=120,
            what="4 executors after scaling to 4",
        )
        wait_for(lambda: kube.get(f"{CR_PATH}/pin/scale")["status"]["replicas"] == 4, what="the scale status")
        assert kube.get(f"{CR_PATH}/pin/scale")["status"]["selector"] == status(kube, "pin")["selector"]
        version = table["version"]
        later = wait_for(
            lambda: (t := routing(kube, "pin"))["version"] >= version + 2 and t,
            timeout=60,
            what="two more rounds",
        )
    assert len(later["executors"]) == 4
    assert set(later["units"].values()) <= set(later["executors"])


def all_pods(kube: EmulatedKubernetes, name: str) -> dict[str, dict[str, Any]] | None:
    """The topology's pods once there is one for every executor of its routing table, else None."""
    found, table = pods(kube, name), routing(kube, name)
    return found if table and len(found) == len(table["executors"]) else None


def test_plans_leave_room_for_other_topologies_executors(
    kube: EmulatedKubernetes, monkeypatch: pytest.MonkeyPatch
):
    """Two topologies on three 4-core nodes: the second is planned on what the first's executors leave,
    so no node is asked for more CPU than it has (each alone would take most of node-a and node-b). No
    operator needs the one SSD node here: a requirement only node-a meets would put it there anyway."""
    from streamtopo.controller.kubernetes import committed_cpu

    def anywhere(name: str) -> dict[str, Any]:
        doc = topology(name)
        for op in doc["spec"]["operators"]:
            op.pop("requires", None)
        return doc

    cluster(kube)
    with operator(kube, monkeypatch):
        kube.create(CR_PATH, anywhere("first"))
        first = wait_for(lambda: all_pods(kube, "first"), what="every pod of the first topology")
        kube.create(CR_PATH, anywhere("second"))
        second = wait_for(lambda: all_pods(kube, "second"), what="every pod of the second topology")
    alone, both = committed_cpu(first.values()), committed_cpu([*first.values(), *second.values()])
    assert max(alone.values()) > 2.0  # the first alone fills more than half a node
    assert all(cpu <= 4.0 + 1e-9 for cpu in both.values()), both
    assert set(both) == {"node-a", "node-b", "node-c"}
