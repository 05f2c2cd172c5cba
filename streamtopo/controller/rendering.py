"""What the operator creates for a StreamTopology, as Kubernetes objects (dicts), without talking to the API.

For a StreamTopology ``<name>`` the operator owns (ownerReferences, so deleting the topology lets the
garbage collector remove them; what lives in Valkey goes in the operator's delete handler):

- Secret ``<name>-transport`` (on the platform's transport, when the operator has its admin password):
  the topology's own Valkey user and password (:mod:`~streamtopo.controller.transport_acl`).
- NetworkPolicy ``<name>-executors`` (when the chart enables them): the platform's rules for its executors.
- ConfigMap ``<name>-routing``: ``routing.json`` (the versioned routing table) and ``topology.yaml``
  (the validated spec the executors run). It is also the record of the last good deployment: a restarted
  operator reads it back instead of re-planning.
- Service ``<name>-metrics``: headless, selecting the executor pods, port ``metrics`` (the chart's
  executor ServiceMonitor and Prometheus' endpoint discovery find the executors through it).
- one Pod per executor, ``<name>-e<i>``: required node affinity to the executor's host (COLA / ALBIC
  placement), a nodeSelector for resource matching, pod anti-affinity for host exlocation and HA replicas,
  non-root with a read-only root filesystem, all capabilities dropped and RuntimeDefault seccomp.

Pods are bare pods (not a Deployment) because each executor is pinned to its own host and carries its
own name in the routing table. A pod whose identity (image, host, CPU, transport, ...) changes is
replaced; pods whose only change is the units they host are left alone: units move through the routing
table, never by restarting executors. :mod:`~streamtopo.controller.kubernetes` applies these objects.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from streamtopo.contracts import (
    MEMBERS_ANNOTATION,
    TRANSPORT_PASSWORD_ENV,
    TRANSPORT_USERNAME_ENV,
    ExecutorEntry,
    Keys,
    RoutingTable,
    fused_members,
    parse_unit,
)
from streamtopo.controller import transport_acl
from streamtopo.controller.platform import DesiredState
from streamtopo.planner.graph import operator_of, replica_name
from streamtopo.planner.model import (
    API_VERSION,
    EXECUTOR_CONFIG_DIR,
    KIND,
    StreamTopology,
    StreamTopologySpec,
    TransportSpec,
)
from streamtopo.planner.policy import PlatformPolicy
from streamtopo.planner.quantity import executor_memory_problem
from streamtopo.valkey_library import Limits

GROUP = "streamtopo.dev"
VERSION = "v1alpha1"
PLURAL = "streamtopologies"
TOPOLOGY_LABEL = f"{GROUP}/topology"
EXECUTOR_LABEL = f"{GROUP}/executor"
HASH_ANNOTATION = f"{GROUP}/pod-hash"
VERSION_ANNOTATION = f"{GROUP}/routing-version"
OPERATOR_LABEL_PREFIX = f"op.{GROUP}/"
HA_LABEL_PREFIX = f"ha.{GROUP}/"
HOSTNAME_KEY = "kubernetes.io/hostname"
CONFIG_DIR = EXECUTOR_CONFIG_DIR
TERMINATION_LOG = "/dev/termination-log"
"""Kubernetes' default terminationMessagePath, named explicitly since the executor is told to write it."""
COMPONENT_LABELS = {
    "app.kubernetes.io/name": "streamtopo",
    "app.kubernetes.io/part-of": "streamtopo",
    "app.kubernetes.io/component": "executor",
    "app.kubernetes.io/managed-by": "streamtopo-operator",
}


@dataclass(frozen=True)
class RenderSettings:
    """Operator-wide rendering choices (from the chart through environment variables)."""

    metrics_port: int = 9100
    runtime_image: str | None = None
    """Executor image for topologies that keep the spec's default image (the chart's runtimeImage)."""
    transport_url: str | None = None
    """Used when a topology keeps the default transport URL (the chart's Valkey)."""
    transport_admin_password: str | None = field(default=None, repr=False)
    """The platform Valkey's admin password: with it every topology on the platform's transport gets its
    own ACL user and Secret (:mod:`~streamtopo.controller.transport_acl`); executors never see it."""
    executor_network_policy: Mapping[str, Any] | None = None
    """``{"ingress": [...], "egress": [...]}`` NetworkPolicy rules for every topology's executors (the
    chart's networkPolicy values); None renders no NetworkPolicy."""
    executor_memory: str = "2Gi"
    """Memory request and limit of executor pods whose spec sets none (the chart's executor.memory): the
    JVM's heap takes a quarter, at least 512Mi; VWAP's executors peaked at about 1.1 GiB and a windowed
    join's at 2 GiB with the heap at 512Mi (docs/operator.md, "Executor memory")."""
    transport_limits: Limits = field(default_factory=Limits)
    """What one topology (and one namespace's named streams) may hold in the platform's Valkey, and the
    largest entry or record (the chart's transport.limits): written into the function library."""
    service_labels: Mapping[str, str] = field(default_factory=dict)
    policy: PlatformPolicy = field(default_factory=PlatformPolicy)
    """What tenants may choose: UDF modules (the chart's executor.udfModules) and image prefixes
    (executor.allowedImages); nothing beyond the platform's own by default."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> RenderSettings:
        rules = env.get("STREAMTOPO_EXECUTOR_NETWORK_POLICY")
        return cls(
            metrics_port=int(env.get("STREAMTOPO_EXECUTOR_METRICS_PORT", "9100")),
            executor_memory=_executor_memory(env.get("STREAMTOPO_EXECUTOR_MEMORY") or cls.executor_memory),
            runtime_image=env.get("STREAMTOPO_RUNTIME_IMAGE") or None,
            transport_url=env.get("STREAMTOPO_TRANSPORT_URL") or None,
            transport_admin_password=env.get("STREAMTOPO_TRANSPORT_ADMIN_PASSWORD") or None,
            executor_network_policy=json.loads(rules) if rules else None,
            transport_limits=Limits(
                account_bytes=int(env.get("STREAMTOPO_TRANSPORT_ACCOUNT_BYTES") or 0),
                entry_bytes=int(env.get("STREAMTOPO_TRANSPORT_ENTRY_BYTES") or 0),
                stream_entries=int(env.get("STREAMTOPO_TRANSPORT_STREAM_ENTRIES") or 0),
            ),
            policy=PlatformPolicy(
                udf_modules=_listed(env.get("STREAMTOPO_UDF_MODULES", "")),
                images=_listed(env.get("STREAMTOPO_ALLOWED_IMAGES", "")),
                node_keys=_listed(env.get("STREAMTOPO_ALLOWED_NODE_KEYS", "")),
                max_executors=_limit(env.get("STREAMTOPO_MAX_EXECUTORS")),
                max_key_groups=_limit(env.get("STREAMTOPO_MAX_KEY_GROUPS")),
                max_operators=_limit(env.get("STREAMTOPO_MAX_OPERATORS")),
                shared_streams=_listed(env.get("STREAMTOPO_SHARED_STREAMS", "")),
                prometheus_urls=_listed(
                    ",".join(
                        (
                            env.get("STREAMTOPO_PROMETHEUS_URL", ""),
                            env.get("STREAMTOPO_ALLOWED_PROMETHEUS_URLS", ""),
                        )
                    )
                ),
            ),
        )

    def platform_transport(self, topology: StreamTopology) -> bool:
        """Whether ``topology`` runs on the platform's Valkey (it keeps the default transport)."""
        return topology.spec.transport.url == TransportSpec().url

    def own_user(self, topology: StreamTopology) -> bool:
        """Whether ``topology``'s executors authenticate as the topology's own ACL user: the operator knows
        the platform's Valkey (its URL and admin password) and the topology runs on it."""
        return bool(self.transport_admin_password and self.transport_url) and self.platform_transport(
            topology
        )

    def transport_url_of(self, topology: StreamTopology) -> str:
        url = topology.spec.transport.url
        return self.transport_url if self.transport_url and self.platform_transport(topology) else url


def _executor_memory(value: str) -> str:
    """The chart's executor.memory, refused at the operator's start when no executor could run in it."""
    if problem := executor_memory_problem(value):
        raise ValueError(f"STREAMTOPO_EXECUTOR_MEMORY (the chart's executor.memory): {problem}")
    return value


def _limit(value: str | None) -> int | None:
    """A chart limit (an environment variable): a positive count, or None when unset or 0."""
    return int(value) if value and int(value) > 0 else None


def _listed(value: str) -> tuple[str, ...]:
    """A comma-separated chart list (an environment variable) as its items."""
    return tuple(item.strip() for item in value.split(",") if item.strip())


def executor_selector(topology: str) -> dict[str, str]:
    """Labels that select exactly ``topology``'s executor pods (Service, NetworkPolicy)."""
    return {TOPOLOGY_LABEL: topology, "app.kubernetes.io/component": "executor"}


def routing_name(topology: str) -> str:
    return f"{topology}-routing"


def service_name(topology: str) -> str:
    return f"{topology}-metrics"


def transport_secret_name(topology: str) -> str:
    """The Secret holding the topology's own Valkey user and password (keys ``username``, ``password``)."""
    return f"{topology}-transport"


def owner_reference(owner: Mapping[str, Any], *, controller: bool = True) -> dict[str, Any]:
    """The StreamTopology as owner: deleting it garbage-collects what it owns. ``controller``: the one
    owner that manages the object (its executors' pods); a shared topology has several owners, none of
    them its controller, and none blocks its own deletion on it."""
    meta = owner["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": controller,
        "blockOwnerDeletion": controller,
    }


def topology_labels(name: str) -> dict[str, str]:
    return {**COMPONENT_LABELS, "app.kubernetes.io/instance": name, TOPOLOGY_LABEL: name}


def selector(name: str) -> str:
    return f"{TOPOLOGY_LABEL}={name},app.kubernetes.io/component=executor"


def _metadata(
    name: str,
    namespace: str,
    owner: Mapping[str, Any],
    labels: Mapping[str, str],
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    meta = {
        "name": name,
        "namespace": namespace,
        "labels": dict(labels),
        "ownerReferences": [owner_reference(owner)],
    }
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


# ------------------------------------------------------------------------------------------ rendering


def render_configmap(desired: DesiredState, namespace: str, owner: Mapping[str, Any]) -> dict[str, Any]:
    """The routing table and the topology the executors run; a fused topology's members go with it, so
    its executors export them (``Metric.MEMBER_OPERATOR``)."""
    spec_doc = desired.topology.model_dump(mode="json", by_alias=True, exclude_none=True)
    spec_doc["metadata"] = {"name": desired.name, "namespace": namespace}
    members = fused_members(owner.get("metadata"))
    if members:
        spec_doc["metadata"]["annotations"] = {MEMBERS_ANNOTATION: json.dumps(members, sort_keys=True)}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(
            routing_name(desired.name),
            namespace,
            owner,
            {k: v for k, v in topology_labels(desired.name).items() if k != "app.kubernetes.io/component"},
            {VERSION_ANNOTATION: str(desired.routing.version)},
        ),
        "data": {
            "routing.json": desired.routing.to_json(),
            "topology.yaml": yaml.safe_dump(spec_doc, sort_keys=False),
            **({"state.json": desired.memory} if desired.memory is not None else {}),
        },
    }


def render_service(
    desired: DesiredState, namespace: str, owner: Mapping[str, Any], settings: RenderSettings
) -> dict[str, Any]:
    labels = {**topology_labels(desired.name), **settings.service_labels}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(service_name(desired.name), namespace, owner, labels),
        "spec": {
            "clusterIP": "None",
            "selector": executor_selector(desired.name),
            "ports": [
                {"name": "metrics", "port": settings.metrics_port, "targetPort": "metrics", "protocol": "TCP"}
            ],
            "publishNotReadyAddresses": True,
        },
    }


def hosted_operators(routing: RoutingTable, executor: str) -> set[str]:
    """Logical nodes (operators, HA replicas keep their suffix) with at least one unit on ``executor``."""
    return {parse_unit(unit)[0] for unit, owner in routing.units.items() if owner == executor}


def _label_key(prefix: str, name: str) -> str:
    """A label key for an operator name (label names allow [A-Za-z0-9_.-], at most 63 characters)."""
    clean = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
    return prefix + (clean if len(clean) <= 63 else clean[:54] + hashlib.sha1(name.encode()).hexdigest()[:9])


def scheduling(topology: StreamTopology, routing: RoutingTable, executor: str) -> dict[str, Any]:
    """Labels, nodeSelector and pod anti-affinity of an executor from the spec's constraints.

    Host exlocation: the pod carries a label per exlocated operator it hosts and refuses nodes running a
    pod of the same topology that carries the other operators' labels. HA: a replica-r pod refuses nodes
    running another replica of the same group. Node affinity pins the planned host; the nodeSelector
    (resource matching) and anti-affinity make the scheduler refuse a wrong node instead of trusting it.
    """
    spec = topology.spec
    name = topology.metadata.name
    logical = hosted_operators(routing, executor)
    operators = {operator_of(n) for n in logical}
    by_name = spec.by_name()
    labels: dict[str, str] = {}
    node_selector: dict[str, str] = {}
    terms: list[dict[str, Any]] = []
    for op in sorted(operators):
        requires = by_name[op].requires if op in by_name else None
        if requires:
            node_selector.update(requires.node_selector)
    for group in spec.constraints.host_exlocation:
        mine = [op for op in group if op in operators]
        for op in mine:
            labels[_label_key(OPERATOR_LABEL_PREFIX, op)] = "true"
        for other in (op for op in group if op not in operators) if mine else ():
            terms.append(
                _anti_affinity(
                    name, [{"key": _label_key(OPERATOR_LABEL_PREFIX, other), "operator": "Exists"}]
                )
            )
    for i, ha in enumerate(spec.constraints.high_availability):
        replicas = {r for r in range(ha.replicas) for op in ha.operators if replica_name(op, r) in logical}
        if len(replicas) == 1:
            key = f"{HA_LABEL_PREFIX}g{i}"
            labels[key] = str(replicas.pop())
            terms.append(
                _anti_affinity(
                    name,
                    [
                        {"key": key, "operator": "Exists"},
                        {"key": key, "operator": "NotIn", "values": [labels[key]]},
                    ],
                )
            )
    return {"labels": labels, "nodeSelector": node_selector, "antiAffinity": terms}


def _anti_affinity(topology: str, expressions: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "labelSelector": {"matchLabels": {TOPOLOGY_LABEL: topology}, "matchExpressions": expressions},
        "topologyKey": HOSTNAME_KEY,
    }


def pod_identity(
    desired: DesiredState,
    executor: str,
    entry: ExecutorEntry,
    owner: Mapping[str, Any],
    settings: RenderSettings,
) -> dict:
    """What makes an executor pod what it is; a change replaces the pod (its hash is an annotation)."""
    topology = desired.topology
    own = topology.spec.transport.password_secret
    if settings.own_user(topology):
        digest = hashlib.sha256(transport_password(owner, settings).encode()).hexdigest()[:16]
        secret = {"name": transport_secret_name(desired.name), "user": "username", "key": "password"}
        secret["credential"] = digest  # a rotated admin password re-derives it: the pod is replaced
    elif own is not None:
        secret = {"name": own.name, "key": own.key}
    else:
        secret = None
    image = desired.topology.spec.image
    if settings.runtime_image and image == StreamTopologySpec.model_fields["image"].default:
        image = settings.runtime_image
    shape = desired.topology.spec.executor
    return {
        "image": image,
        "host": entry.host,
        "cpu": entry.cpu,
        "transport": settings.transport_url_of(topology),
        "secret": secret,
        "executor": executor,
        "metricsPort": settings.metrics_port,
        "memory": shape.resources.memory or settings.executor_memory,
        "template": shape.model_dump(mode="json", by_alias=True, exclude_none=True, exclude={"resources"}),
    }


def owner_keys(owner: Mapping[str, Any]) -> Keys:
    """The Valkey keys of the StreamTopology ``owner``."""
    return Keys(owner["metadata"]["name"], owner["metadata"]["namespace"])


def transport_password(owner: Mapping[str, Any], settings: RenderSettings) -> str:
    """The password of ``owner``'s own Valkey user (derived, see :mod:`transport_acl`)."""
    if not settings.transport_admin_password:
        raise ValueError("per-topology Valkey users need the platform's admin password")
    return transport_acl.password(
        settings.transport_admin_password, owner_keys(owner), owner["metadata"]["uid"]
    )


def render_transport_secret(
    desired: DesiredState, namespace: str, owner: Mapping[str, Any], settings: RenderSettings
) -> dict[str, Any]:
    """The topology's Valkey user and password, for its executor pods only (secretKeyRef)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": _metadata(
            transport_secret_name(desired.name), namespace, owner, topology_labels(desired.name)
        ),
        "data": {
            key: base64.b64encode(value.encode()).decode()
            for key, value in (
                ("username", transport_acl.acl_user(owner_keys(owner))),
                ("password", transport_password(owner, settings)),
            )
        },
    }


def render_network_policy(
    desired: DesiredState, namespace: str, owner: Mapping[str, Any], rules: Mapping[str, Any]
) -> dict[str, Any]:
    """The executors' NetworkPolicy: the platform's ingress and egress rules for this topology's pods, so
    executors reach the transport (and DNS) and are reached by the operator and Prometheus, nothing else."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(f"{desired.name}-executors", namespace, owner, topology_labels(desired.name)),
        "spec": {
            "podSelector": {"matchLabels": executor_selector(desired.name)},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": list(rules.get("ingress") or []),
            "egress": list(rules.get("egress") or []),
        },
    }


def identity_hash(identity: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def render_pod(
    desired: DesiredState, executor: str, namespace: str, owner: Mapping[str, Any], settings: RenderSettings
) -> dict[str, Any]:
    entry = desired.executors[executor]
    identity = pod_identity(desired, executor, entry, owner, settings)
    sched = scheduling(desired.topology, desired.routing, executor)
    shape = desired.topology.spec.executor
    template = shape.pod_template
    labels = {
        **template.metadata.labels,
        **topology_labels(desired.name),
        EXECUTOR_LABEL: executor,
        **sched["labels"],
    }
    env: list[dict[str, Any]] = [{"name": "STREAMTOPO_EXECUTOR", "value": executor}]
    if secret := identity["secret"]:
        refs = [(TRANSPORT_PASSWORD_ENV, secret["key"])]
        if "user" in secret:
            refs.insert(0, (TRANSPORT_USERNAME_ENV, secret["user"]))
        env += [
            {"name": var, "valueFrom": {"secretKeyRef": {"name": secret["name"], "key": key}}}
            for var, key in refs
        ]
    env += _wire(shape.env)
    affinity: dict[str, Any] = {}
    terms = [_wire(t.match_expressions) for t in template.node_terms()] or [[]]
    if entry.host:  # the planned node, ANDed into each of the template's terms
        pinned = {"key": HOSTNAME_KEY, "operator": "In", "values": [entry.host]}
        terms = [[*t, pinned] for t in terms]
    if terms != [[]]:
        affinity["nodeAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": t} for t in terms]
            }
        }
    if sched["antiAffinity"]:
        affinity["podAntiAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": sched["antiAffinity"]
        }
    cpu = f"{round(entry.cpu * 1000)}m"
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Always",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 30,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 10001,
            "runAsGroup": 10001,
            "fsGroup": 10001,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": "executor",
                "image": identity["image"],
                "args": [
                    "executor",
                    "--topology",
                    f"{CONFIG_DIR}/topology.yaml",
                    "--routing",
                    f"{CONFIG_DIR}/routing.json",
                    "--name",
                    executor,
                    "--transport",
                    identity["transport"],
                    "--metrics-port",
                    str(settings.metrics_port),
                    "--cpu",
                    str(entry.cpu),
                    "--output",
                    "/tmp/output",
                    "--termination-log",
                    TERMINATION_LOG,
                ],
                # The executor writes why it failed there; kubelet puts it in the container's status, and
                # the operator into the topology's Degraded condition and Events (kubernetes.pod_health).
                "terminationMessagePath": TERMINATION_LOG,
                "terminationMessagePolicy": "FallbackToLogsOnError",
                "env": env,
                "ports": [{"name": "metrics", "containerPort": settings.metrics_port, "protocol": "TCP"}],
                "resources": {
                    "requests": {"cpu": cpu, "memory": identity["memory"]},
                    "limits": {"memory": identity["memory"]},
                },
                "readinessProbe": {"httpGet": {"path": "/readyz", "port": "metrics"}, "periodSeconds": 10},
                "livenessProbe": {
                    "httpGet": {"path": "/healthz", "port": "metrics"},
                    "periodSeconds": 20,
                    "initialDelaySeconds": 60,
                    "failureThreshold": 3,
                },
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "readOnlyRootFilesystem": True,
                    "runAsNonRoot": True,
                    "capabilities": {"drop": ["ALL"]},
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                "volumeMounts": [
                    {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
                    {"name": "tmp", "mountPath": "/tmp"},
                    *_wire(shape.volume_mounts),
                ],
            }
        ],
        "volumes": [
            {"name": "config", "configMap": {"name": routing_name(desired.name)}},
            {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
            *_wire(template.spec.volumes),
        ],
    }
    pod = template.spec
    for key, value in (
        ("tolerations", _wire(pod.tolerations)),
        ("imagePullSecrets", _wire(pod.image_pull_secrets)),
        ("serviceAccountName", pod.service_account_name),
        ("priorityClassName", pod.priority_class_name),
    ):
        if value:
            pod_spec[key] = value
    if affinity:
        pod_spec["affinity"] = affinity
    if sched["nodeSelector"]:
        pod_spec["nodeSelector"] = sched["nodeSelector"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _metadata(
            executor,
            namespace,
            owner,
            labels,
            {**template.metadata.annotations, HASH_ANNOTATION: identity_hash(identity)},
        ),
        "spec": pod_spec,
    }


def _wire(models: list[Any]) -> list[dict[str, Any]]:
    """Spec models as the Kubernetes API spells them (camelCase, unset fields left out)."""
    return [m.model_dump(mode="json", by_alias=True, exclude_none=True) for m in models]


def render(
    desired: DesiredState, namespace: str, owner: Mapping[str, Any], settings: RenderSettings | None = None
) -> list[dict[str, Any]]:
    """Every object of a desired state: the transport Secret and NetworkPolicy (when the platform sets
    them up), ConfigMap, Service, then one Pod per executor."""
    settings = settings or RenderSettings()
    return [
        *(
            [render_transport_secret(desired, namespace, owner, settings)]
            if settings.own_user(desired.topology)
            else []
        ),
        *(
            [render_network_policy(desired, namespace, owner, settings.executor_network_policy)]
            if settings.executor_network_policy is not None
            else []
        ),
        render_configmap(desired, namespace, owner),
        render_service(desired, namespace, owner, settings),
        *(render_pod(desired, e, namespace, owner, settings) for e in sorted(desired.running)),
    ]
