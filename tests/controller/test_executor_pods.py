"""spec.executor: resources and a pod template shape every executor pod; the planner places executors
only on nodes the template's node affinity admits; what a tenant may not set is refused by field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from controller_testkit import MemoryPlatform

from streamtopo.controller.reconcile import adaptation_config, reconcile
from streamtopo.controller.rendering import RenderSettings, render
from streamtopo.documents import load_topology
from streamtopo.planner.cluster import Cluster, Host
from streamtopo.planner.model import TopologyError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "wordcount.yaml"
OWNER = {"metadata": {"name": "wordcount", "uid": "0b5c2f3e-0000-4000-8000-000000000002"}}

EXECUTOR = {
    "resources": {"cpu": 1.5, "memory": "2Gi"},
    "env": [
        {"name": "FEED_REGION", "value": "eu"},
        {"name": "API_TOKEN", "valueFrom": {"secretKeyRef": {"name": "feed", "key": "token"}}},
    ],
    "volumeMounts": [{"name": "reference", "mountPath": "/data/reference", "readOnly": True}],
    "podTemplate": {
        "metadata": {"labels": {"team": "markets"}, "annotations": {"example.com/owner": "markets"}},
        "spec": {
            "tolerations": [
                {"key": "dedicated", "operator": "Equal", "value": "streaming", "effect": "NoSchedule"}
            ],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["streaming"]}]}
                        ]
                    }
                }
            },
            "imagePullSecrets": [{"name": "registry"}],
            "serviceAccountName": "feed-reader",
            "priorityClassName": "streaming-high",
            "volumes": [{"name": "reference", "configMap": {"name": "reference-data"}}],
        },
    },
}


def document(executor: dict[str, Any] | None = None) -> dict[str, Any]:
    doc = yaml.safe_load(EXAMPLE.read_text())
    if executor is not None:
        doc["spec"]["executor"] = executor
    return doc


def mixed_cluster() -> Cluster:
    """Two streaming nodes among four."""
    return Cluster(
        hosts=[
            Host(name="gp-1", cpu=8.0),
            Host(name="gp-2", cpu=8.0),
            Host(name="st-1", cpu=8.0, labels={"pool": "streaming"}),
            Host(name="st-2", cpu=8.0, labels={"pool": "streaming"}),
        ]
    )


def test_the_template_is_merged_into_every_pod_and_the_pods_are_valid_kubernetes():
    import kubernetes_validate

    outcome = reconcile(document(EXECUTOR), MemoryPlatform(mixed_cluster()))
    assert outcome.desired is not None, outcome.conditions
    pods = [o for o in render(outcome.desired, "markets", OWNER) if o["kind"] == "Pod"]
    assert pods and len(pods) == len(outcome.desired.executors)
    for pod in pods:
        kubernetes_validate.validate(pod, "1.30", strict=True)
        spec, (container,) = pod["spec"], pod["spec"]["containers"]
        host = outcome.desired.executors[pod["metadata"]["name"]].host
        assert host in ("st-1", "st-2")  # placed only where the template's affinity admits
        (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ]
        assert term["matchExpressions"] == [
            {"key": "pool", "operator": "In", "values": ["streaming"]},
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [host]},
        ]
        assert container["resources"] == {
            "requests": {"cpu": "1500m", "memory": "2Gi"},
            "limits": {"memory": "2Gi"},
        }
        names = [e["name"] for e in container["env"]]
        assert names[0] == "STREAMTOPO_EXECUTOR" and names[-2:] == ["FEED_REGION", "API_TOKEN"]
        assert container["env"][-1]["valueFrom"] == {"secretKeyRef": {"name": "feed", "key": "token"}}
        assert {"name": "reference", "mountPath": "/data/reference", "readOnly": True} in container[
            "volumeMounts"
        ]
        assert {"name": "reference", "configMap": {"name": "reference-data"}} in spec["volumes"]
        assert spec["tolerations"] == EXECUTOR["podTemplate"]["spec"]["tolerations"]
        assert (
            spec["imagePullSecrets"] == [{"name": "registry"}] and spec["serviceAccountName"] == "feed-reader"
        )
        assert spec["priorityClassName"] == "streaming-high"
        assert pod["metadata"]["labels"]["team"] == "markets"
        assert pod["metadata"]["labels"]["streamtopo.dev/topology"] == "wordcount"
        assert pod["metadata"]["annotations"]["example.com/owner"] == "markets"
        # the operator's guarantees stay
        assert (
            container["securityContext"]["readOnlyRootFilesystem"] is True
            and spec["securityContext"]["runAsNonRoot"]
        )
    assert {e.cpu for e in outcome.desired.executors.values()} == {1.5}
    assert adaptation_config(load_topology(document(EXECUTOR))).scaling_config.executor_capacity == 1.5


def test_a_template_change_replaces_the_pods_and_no_template_keeps_todays_pods():
    platform = MemoryPlatform(mixed_cluster())
    plain = reconcile(document(), platform).desired
    shaped = reconcile(
        document({"env": [{"name": "FEED_REGION", "value": "eu"}]}), platform, previous=plain
    ).desired
    hashes = [
        {
            p["metadata"]["name"]: p["metadata"]["annotations"]["streamtopo.dev/pod-hash"]
            for p in render(d, "ns", OWNER)
            if p["kind"] == "Pod"
        }
        for d in (plain, shaped)
    ]
    assert set(hashes[0]) == set(hashes[1]) and all(hashes[0][n] != hashes[1][n] for n in hashes[0])
    pod = next(p for p in render(plain, "ns", OWNER) if p["kind"] == "Pod")
    assert "tolerations" not in pod["spec"] and pod["spec"]["containers"][0]["resources"]["limits"] == {
        "memory": RenderSettings.executor_memory
    }


def test_the_platform_default_memory_runs_an_executor_and_a_smaller_one_stops_the_operator_at_start():
    assert RenderSettings.from_env({}).executor_memory == RenderSettings.executor_memory
    assert RenderSettings.from_env({"STREAMTOPO_EXECUTOR_MEMORY": "1Gi"}).executor_memory == "1Gi"
    with pytest.raises(
        ValueError, match=r"STREAMTOPO_EXECUTOR_MEMORY \(the chart's executor.memory\): 512Mi"
    ):
        RenderSettings.from_env({"STREAMTOPO_EXECUTOR_MEMORY": "512Mi"})


def test_no_node_matching_the_affinity_is_refused_naming_the_field():
    executor = {
        "podTemplate": {
            "spec": {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]}]}
                            ]
                        }
                    }
                }
            }
        }
    }
    platform = MemoryPlatform(mixed_cluster())
    outcome = reconcile(document(executor), platform)
    assert platform.applied == [] and outcome.desired is None
    planned = next(c for c in outcome.conditions if c.type == "Planned")
    assert planned.reason == "NoValidPlan" and "spec.executor.podTemplate.spec.affinity" in planned.message


@pytest.mark.parametrize(
    ("executor", "field", "words"),
    [
        (
            {"podTemplate": {"metadata": {"labels": {"streamtopo.dev/topology": "other"}}}},
            "spec.executor.podTemplate.metadata.labels",
            "operator's",
        ),
        (
            {"podTemplate": {"metadata": {"labels": {"bad key!": "x"}}}},
            "spec.executor.podTemplate.metadata.labels",
            "not a valid key",
        ),
        (
            {"env": [{"name": "STREAMTOPO_TRANSPORT_PASSWORD", "value": "x"}]},
            "spec.executor.env[0].name",
            "operator's",
        ),
        (
            {"env": [{"name": "A", "value": "x", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]},
            "spec.executor.env[0].valueFrom",
            "not both",
        ),
        (
            {
                "volumeMounts": [{"name": "v", "mountPath": "/tmp/x"}],
                "podTemplate": {"spec": {"volumes": [{"name": "v", "emptyDir": {}}]}},
            },
            "spec.executor.volumeMounts[0].mountPath",
            "executor's own",
        ),
        (
            {"volumeMounts": [{"name": "v", "mountPath": "/data"}]},
            "spec.executor.volumeMounts",
            "no volume named v",
        ),
        (
            {"podTemplate": {"spec": {"volumes": [{"name": "host", "hostPath": {"path": "/"}}]}}},
            "spec.executor.podTemplate.spec.volumes[0].hostPath",
            "",
        ),
        (
            {
                "podTemplate": {
                    "spec": {"volumes": [{"name": "v", "emptyDir": {}, "configMap": {"name": "c"}}]}
                }
            },
            "spec.executor.podTemplate.spec.volumes[0].name",
            "exactly one",
        ),
        (
            {"podTemplate": {"spec": {"containers": [{"name": "sidecar", "image": "evil"}]}}},
            "spec.executor.podTemplate.spec.containers",
            "",
        ),
        ({"resources": {"memory": "lots"}}, "spec.executor.resources.memory", ""),
        # Below what a JVM and its Python driver run in: killed at the limit on every restart.
        ({"resources": {"memory": "512Mi"}}, "spec.executor.resources.memory", "less than 1Gi"),
        ({"resources": {"memory": "1e8"}}, "spec.executor.resources.memory", "less than 1Gi"),
        ({"resources": {"cpu": 0}}, "spec.executor.resources.cpu", ""),
        # Variables that make the linker, Python, PySpark, the JVM or Spark load code (issue 32).
        *(
            ({"env": [{"name": name, "value": "/mnt/x"}]}, "spec.executor.env[0].name", "load code")
            for name in (
                "LD_PRELOAD",
                "LD_AUDIT",
                "JAVA_TOOL_OPTIONS",
                "_JAVA_OPTIONS",
                "JDK_JAVA_OPTIONS",
                "PYTHONPATH",
                "PYTHONSTARTUP",
                "PYSPARK_SUBMIT_ARGS",
                "SPARK_CONF_DIR",
                "SPARK_SUBMIT_OPTS",
                "CLASSPATH",
                "HOME",
                "GCONV_PATH",
            )
        ),
        # Mounts over the runtime's code and configuration (site-packages, the JVM, ld.so.preload).
        *(
            (
                {
                    "volumeMounts": [{"name": "v", "mountPath": path}],
                    "podTemplate": {"spec": {"volumes": [{"name": "v", "configMap": {"name": "c"}}]}},
                },
                "spec.executor.volumeMounts[0].mountPath",
                "executor's own",
            )
            for path in ("/", "/usr/local/lib/python3.11/site-packages", "/etc", "/opt/java", "/usr//lib")
        ),
    ],
)
def test_what_a_tenant_may_not_set_is_refused_by_field(executor: dict, field: str, words: str):
    with pytest.raises(TopologyError) as error:
        load_topology(document(executor))
    paths = [path for path, _ in error.value.problems]
    assert field in paths, error.value.problems
    assert words in str(error.value)


CONTROL_PLANE = {
    "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}
                        ]
                    }
                ]
            }
        }
    },
}
TERM = "spec.executor.podTemplate.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"


@pytest.mark.parametrize(
    ("executor", "requires", "node_keys", "refused"),
    [
        (
            {"podTemplate": {"spec": CONTROL_PLANE}},
            None,
            (),
            {
                "spec.executor.podTemplate.spec.tolerations[0].key",
                f"{TERM}.nodeSelectorTerms[0].matchExpressions[0].key",
            },
        ),
        (
            {"podTemplate": {"spec": {"tolerations": [{"operator": "Exists"}]}}},
            None,
            (),
            {"spec.executor.podTemplate.spec.tolerations[0].key"},
        ),
        (None, {"node.kubernetes.io/unschedulable": ""}, (), {"spec.operators[0].requires.nodeSelector"}),
        (None, {"disk": "ssd"}, ("pool", "example.com/"), {"spec.operators[0].requires.nodeSelector"}),
        (
            None,
            {"example.com/disk": "ssd", "kubernetes.io/arch": "arm64"},
            ("example.com/", "kubernetes.io/arch"),
            set(),
        ),
        (None, {"topology.kubernetes.io/zone": "eu-1a", "disk": "ssd"}, (), set()),
    ],
    ids=["control-plane", "tolerate-all", "cluster-label", "not-listed", "listed", "well-known"],
)
def test_the_platform_keeps_tenants_off_the_clusters_nodes(executor, requires, node_keys, refused):
    """On a platform a tenant may not select on or tolerate the cluster's own node keys (control-plane
    role, lifecycle taints), nor tolerate every taint; with executor.allowedNodeKeys only the listed ones.
    Locally (no platform) the same document is accepted: there are no nodes to protect."""
    from streamtopo.planner.policy import PlatformPolicy

    doc = document(executor)
    if requires is not None:
        doc["spec"]["operators"][0]["requires"] = {"nodeSelector": requires}
    load_topology(doc)
    policy = PlatformPolicy(node_keys=node_keys)
    if not refused:
        load_topology(doc, policy=policy)
        return
    with pytest.raises(TopologyError) as error:
        load_topology(doc, policy=policy)
    assert {path for path, _ in error.value.problems} == refused, error.value.problems


def test_the_chart_settings_give_each_topology_a_valid_network_policy_and_its_own_transport_secret():
    """The operator's environment as the chart renders it (default values): every topology gets a
    NetworkPolicy selecting exactly its executors with the chart's rules, and a Secret with its own
    Valkey user; the pods reference that Secret, the admin password is in no object."""
    import base64

    import kubernetes_validate

    from streamtopo.controller.manifests import render_chart
    from streamtopo.controller.rendering import RenderSettings

    (deployment,) = [d.obj for d in render_chart({}) if d.kind == "Deployment"]
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    env["STREAMTOPO_TRANSPORT_ADMIN_PASSWORD"] = "4dmin-Pa55"  # what the secretKeyRef resolves to
    settings = RenderSettings.from_env({k: v for k, v in env.items() if v is not None})
    outcome = reconcile(document(), MemoryPlatform(mixed_cluster()))
    assert outcome.desired is not None, outcome.conditions
    owner = {"metadata": {**OWNER["metadata"], "namespace": "markets"}}
    objects = render(outcome.desired, "markets", owner, settings)
    for obj in objects:
        kubernetes_validate.validate(obj, "1.30", strict=True)
        assert "4dmin-Pa55" not in str(obj)
    (policy,) = [o for o in objects if o["kind"] == "NetworkPolicy"]
    assert policy["spec"]["podSelector"]["matchLabels"] == {
        "streamtopo.dev/topology": "wordcount",
        "app.kubernetes.io/component": "executor",
    }
    (to_valkey, dns) = policy["spec"]["egress"]
    assert to_valkey["ports"] == [{"port": 6379, "protocol": "TCP"}]
    assert to_valkey["to"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "valkey"
    assert {p["port"] for p in dns["ports"]} == {53}
    (ingress,) = policy["spec"]["ingress"]
    assert ingress["ports"] == [{"port": 9100, "protocol": "TCP"}]
    assert ingress["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "operator"
    (secret,) = [o for o in objects if o["kind"] == "Secret"]
    values = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert secret["metadata"]["name"] == "wordcount-transport"
    assert values["username"] == "streamtopo:markets/wordcount" and len(values["password"]) == 64
    for pod in (o for o in objects if o["kind"] == "Pod"):
        refs = {
            e["name"]: e["valueFrom"]["secretKeyRef"]
            for e in pod["spec"]["containers"][0]["env"]
            if "valueFrom" in e
        }
        assert refs == {
            "STREAMTOPO_TRANSPORT_USERNAME": {"name": "wordcount-transport", "key": "username"},
            "STREAMTOPO_TRANSPORT_PASSWORD": {"name": "wordcount-transport", "key": "password"},
        }


def test_rotating_the_admin_password_rotates_the_topologys_password_and_replaces_its_pods():
    from streamtopo.controller.rendering import HASH_ANNOTATION, RenderSettings

    outcome = reconcile(document(), MemoryPlatform(mixed_cluster()))
    assert outcome.desired is not None
    owner = {"metadata": {**OWNER["metadata"], "namespace": "markets"}}

    def rendered(admin: str) -> tuple[dict[str, str], str]:
        settings = RenderSettings(
            transport_url="redis://valkey.streamtopo.svc:6379", transport_admin_password=admin
        )
        objects = render(outcome.desired, "markets", owner, settings)
        pods = [o for o in objects if o["kind"] == "Pod"]
        hashes = {o["metadata"]["name"]: o["metadata"]["annotations"][HASH_ANNOTATION] for o in pods}
        (secret,) = [o for o in objects if o["kind"] == "Secret"]
        return hashes, secret["data"]["password"]

    before, after, again = rendered("old-Pa55"), rendered("new-Pa55"), rendered("old-Pa55")
    assert before == again  # derived, not random: re-applying changes nothing
    assert after[1] != before[1]
    assert all(after[0][pod] != before[0][pod] for pod in before[0])
    no_url = RenderSettings(transport_admin_password="old-Pa55")  # no platform Valkey to make users on
    assert not [o for o in render(outcome.desired, "markets", owner, no_url) if o["kind"] == "Secret"]
    plain = render(outcome.desired, "markets", owner, RenderSettings())
    assert not [
        o for o in plain if o["kind"] in ("Secret", "NetworkPolicy")
    ]  # nothing without the platform's settings


def test_a_topologys_prometheus_must_be_one_the_platform_allows():
    """The operator queries a topology's Prometheus from inside the cluster: on a platform only URLs under
    the chart's prometheus.allowedUrls or the platform's own Prometheus are accepted (no reaching any
    internal service through the operator)."""
    from streamtopo.controller.rendering import RenderSettings

    policy = RenderSettings.from_env(
        {
            "STREAMTOPO_PROMETHEUS_URL": "http://prometheus.monitoring:9090",
            "STREAMTOPO_ALLOWED_PROMETHEUS_URLS": "https://prom.team-a.example.com/",
        }
    ).policy
    doc = document()
    for url in ("http://prometheus.monitoring:9090", "https://prom.team-a.example.com/api"):
        doc["spec"]["metrics"] = {"prometheus": {"url": url}}
        load_topology(doc, policy=policy)
    for url in ("http://kubernetes.default.svc/api", "http://169.254.169.254/latest/meta-data"):
        doc["spec"]["metrics"] = {"prometheus": {"url": url}}
        with pytest.raises(TopologyError) as error:
            load_topology(doc, policy=policy)
        assert [path for path, _ in error.value.problems] == ["spec.metrics.prometheus.url"]
        load_topology(doc)  # locally the user's own URL is theirs to choose


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (
            lambda spec: spec.setdefault("autoscaling", {}).update(maxExecutors=9),
            "spec.autoscaling.maxExecutors",
        ),
        (lambda spec: spec.update(replicas=12), "spec.replicas"),
        (lambda spec: spec.update(keyGroups=64), "spec.keyGroups"),
        (lambda spec: spec["operators"][1].update(keyGroups=33), "spec.operators[1].keyGroups"),
        (
            lambda spec: spec["operators"].extend(
                {"name": f"f{i}", "kind": "filter", "inputs": ["words"], "expr": "true"} for i in range(8)
            ),
            "spec.operators",
        ),
    ],
    ids=["max-executors", "replicas", "key-groups", "operator-key-groups", "operators"],
)
def test_the_platforms_limits_are_kept_per_topology(edit, field):
    """The chart's limits (STREAMTOPO_MAX_*) refuse a topology above them, naming the field; the same
    document is fine locally and under the model's own bounds."""
    from streamtopo.controller.rendering import RenderSettings

    policy = RenderSettings.from_env(
        {"STREAMTOPO_MAX_EXECUTORS": "8", "STREAMTOPO_MAX_KEY_GROUPS": "32", "STREAMTOPO_MAX_OPERATORS": "10"}
    ).policy
    doc = document()
    doc["spec"]["keyGroups"] = 8
    spec = load_topology(doc, policy=policy).spec
    assert spec.autoscaling.max_executors == 8  # a default above the limit shrinks to it
    edit(doc["spec"])
    load_topology(doc)
    with pytest.raises(TopologyError) as error:
        load_topology(doc, policy=policy)
    assert [path for path, _ in error.value.problems] == [field]
    assert "the platform allows at most" in str(error.value)
    assert RenderSettings.from_env({"STREAMTOPO_MAX_EXECUTORS": "0"}).policy.max_executors is None
