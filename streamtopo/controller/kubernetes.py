"""The Kubernetes platform: a DesiredState rendered as owned objects (:mod:`~streamtopo.controller.rendering`)
and applied with the kubernetes client; hosts from Nodes, executor health from pods, and the API calls the
operator's handlers make (status, topologies, shared topologies).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from streamtopo.contracts import (
    RoutingTable,
    redis_url,
)
from streamtopo.controller import transport_acl
from streamtopo.controller.platform import DesiredState
from streamtopo.controller.rendering import (
    EXECUTOR_LABEL,
    GROUP,
    HASH_ANNOTATION,
    HOSTNAME_KEY,
    PLURAL,
    TOPOLOGY_LABEL,
    VERSION,
    RenderSettings,
    owner_keys,
    render_configmap,
    render_network_policy,
    render_pod,
    render_service,
    render_transport_secret,
    routing_name,
    selector,
    transport_password,
)
from streamtopo.documents import load_topology, object_document
from streamtopo.planner.cluster import Cluster, Host
from streamtopo.planner.model import (
    API_VERSION,
    KIND,
    StreamTopology,
)
from streamtopo.planner.quantity import quantity

# ------------------------------------------------------------------------------------------ nodes


FAILING_WAIT = frozenset(
    {
        "CrashLoopBackOff",
        "ImagePullBackOff",
        "ErrImagePull",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)
"""Waiting reasons of a container that will not start by itself (not a normal warm-up)."""


@dataclass(frozen=True)
class PodHealth:
    """One executor pod as kubelet reports it."""

    phase: str
    ready: bool
    """The pod's Ready condition: its readiness probe (/readyz) passes."""
    problem: str | None
    """Why it fails (``CrashLoopBackOff (OOMKilled)``, ``ImagePullBackOff``, ``Failed: Evicted``), or None."""
    restarts: int


def pod_health(pod: Mapping[str, Any]) -> PodHealth:
    status = pod.get("status") or {}
    phase = status.get("phase", "Pending")
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
    )
    containers = status.get("containerStatuses") or []
    restarts = sum(int(c.get("restartCount") or 0) for c in containers)
    problem = None
    for c in containers:
        waiting = (c.get("state") or {}).get("waiting") or {}
        terminated = (
            (c.get("state") or {}).get("terminated") or (c.get("lastState") or {}).get("terminated") or {}
        )
        said = (terminated.get("message") or "").strip()
        if waiting.get("reason") in FAILING_WAIT:
            problem = waiting["reason"] + (f" ({terminated['reason']})" if terminated.get("reason") else "")
            problem += f": {said}" if said else ""
        elif terminated.get("reason") == "OOMKilled":
            problem = "OOMKilled"
    if phase == "Failed":
        problem = f"Failed: {status.get('reason') or 'the executor exited'}"
    unschedulable = [
        c
        for c in status.get("conditions") or []
        if c.get("type") == "PodScheduled"
        and c.get("status") == "False"
        and c.get("reason") == "Unschedulable"
    ]
    if phase == "Pending" and unschedulable:  # the room changed between the plan and the pod
        problem = f"Pending: Unschedulable ({unschedulable[0].get('message') or 'no node has room'})"
    return PodHealth(phase, ready, problem, restarts)


def cluster_from_nodes(nodes: Sequence[Mapping[str, Any]]) -> Cluster:
    """Hosts from Node objects: schedulable, Ready (or not yet reporting), allocatable CPU > 0."""
    hosts = []
    for node in nodes:
        if (node.get("spec") or {}).get("unschedulable"):
            continue
        status = node.get("status") or {}
        ready = [c for c in status.get("conditions") or [] if c.get("type") == "Ready"]
        if ready and ready[0].get("status") != "True":
            continue
        allocatable = status.get("allocatable") or status.get("capacity") or {}
        cpu = quantity(allocatable.get("cpu", 0))
        if cpu <= 0:
            continue
        memory = quantity(allocatable["memory"]) if allocatable.get("memory") else None
        meta = node["metadata"]
        hosts.append(Host(name=meta["name"], cpu=cpu, memory=memory or None, labels=meta.get("labels") or {}))
    if not hosts:
        raise NoHosts("no schedulable Node with allocatable CPU")
    return Cluster(hosts=sorted(hosts, key=lambda h: h.name))


def committed_cpu(pods: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Node -> CPU cores the running and pending ``pods`` request there: a pod not scheduled yet counts on
    the node its affinity pins it to (an executor's planned host), finished pods not at all."""
    used: dict[str, float] = {}
    for pod in pods:
        spec = pod.get("spec") or {}
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        node = spec.get("nodeName") or _pinned_node(spec)
        if node is None:
            continue
        cpu = sum(
            quantity(((c.get("resources") or {}).get("requests") or {}).get("cpu", 0))
            for c in spec.get("containers") or []
        )
        used[node] = used.get(node, 0.0) + cpu
    return used


def _pinned_node(spec: Mapping[str, Any]) -> str | None:
    terms = (
        ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        or {}
    ).get("nodeSelectorTerms") or []
    hosts = {
        value
        for term in terms
        for e in term.get("matchExpressions") or []
        if e.get("key") == HOSTNAME_KEY and e.get("operator") == "In" and len(e.get("values") or []) == 1
        for value in e["values"]
    }
    return hosts.pop() if len(hosts) == 1 else None


class NoHosts(RuntimeError):
    """The cluster has no node an executor could run on."""


class TransportAdminError(RuntimeError):
    """The operator could not create or remove a topology's Valkey user (the platform's Valkey is down or
    refuses the admin password); the message names the URL, never a credential."""


@functools.lru_cache(maxsize=4)
def _admin_client(url: str, admin_password: str) -> Any:
    """One pooled admin connection to the platform's Valkey per process."""
    import redis

    return redis.Redis.from_url(
        redis_url(url), password=admin_password, socket_connect_timeout=5.0, socket_timeout=10.0
    )


# ------------------------------------------------------------------------------------------ the platform


class KubernetesPlatform:
    """:class:`~streamtopo.controller.platform.Platform` for one StreamTopology in one namespace.

    ``owner`` is the StreamTopology object (name and uid are used). Every write is create-or-patch by a
    deterministic name, so applying twice, or after a restart halfway through, yields the same objects.
    """

    executor_footprint: float | None = None
    """Pods are booked by their requests (the scheduler's view); the loop books what they measurably use
    beyond (planner/capacity.py)."""

    def __init__(
        self,
        namespace: str,
        owner: Mapping[str, Any],
        api_client: Any = None,
        settings: RenderSettings | None = None,
    ):
        from kubernetes import client

        self.namespace = namespace
        self.owner = owner
        self.name = owner["metadata"]["name"]
        self.settings = settings or RenderSettings()
        self.core = client.CoreV1Api(api_client)

    def hosts(self) -> Cluster:
        return cluster_from_nodes(self._items(self.core.list_node(_preload_content=False)))

    def running_executors(self) -> dict[str, str | None]:
        return {
            p["metadata"]["labels"][EXECUTOR_LABEL]: (p.get("spec") or {}).get("nodeName")
            for p in self._pods()
            if EXECUTOR_LABEL in (p["metadata"].get("labels") or {})
        }

    def pod_ips(self) -> dict[str, str | None]:
        """Executor -> pod IP, for the direct-scrape metrics source."""
        return {p["metadata"]["name"]: (p.get("status") or {}).get("podIP") for p in self._pods()}

    def failing_executors(self) -> dict[str, str]:
        return {name: health.problem for name, health in self.pod_health().items() if health.problem}

    def pod_health(self) -> dict[str, PodHealth]:
        """Executor pod -> readiness and what keeps it from running, read from the pods' status."""
        return {p["metadata"]["name"]: pod_health(p) for p in self._pods()}

    def apply(self, desired: DesiredState) -> None:
        """The transport user, its Secret and the NetworkPolicy first (a pod starts only with them), then
        the ConfigMap (executors read it), the Service, then the pods."""
        if self.settings.own_user(desired.topology):
            self._put(
                render_transport_secret(desired, self.namespace, self.owner, self.settings),
                self.core.create_namespaced_secret,
                self.core.patch_namespaced_secret,
            )
            self.ensure_transport_user(desired.topology)
        if self.settings.executor_network_policy is not None:
            from kubernetes import client

            net = client.NetworkingV1Api(self.core.api_client)
            self._ensure(
                render_network_policy(
                    desired, self.namespace, self.owner, self.settings.executor_network_policy
                ),
                net.read_namespaced_network_policy,
                net.create_namespaced_network_policy,
                net.patch_namespaced_network_policy,
                "spec",
            )
        self._ensure(
            render_configmap(desired, self.namespace, self.owner),
            self.core.read_namespaced_config_map,
            self.core.create_namespaced_config_map,
            self.core.patch_namespaced_config_map,
            "data",
        )
        self._ensure(
            render_service(desired, self.namespace, self.owner, self.settings),
            self.core.read_namespaced_service,
            self.core.create_namespaced_service,
            None,
            None,
        )
        existing = {p["metadata"]["name"]: p for p in self._pods()}
        for executor in sorted(desired.running):
            pod = render_pod(desired, executor, self.namespace, self.owner, self.settings)
            current = existing.get(executor)
            if current is not None:
                same = (current["metadata"].get("annotations") or {}).get(HASH_ANNOTATION) == pod["metadata"][
                    "annotations"
                ][HASH_ANNOTATION]
                finished = (current.get("status") or {}).get("phase") in ("Failed", "Succeeded")
                if same and not finished and not current["metadata"].get("deletionTimestamp"):
                    continue
                self._delete_pod(executor)
            self._create(self.core.create_namespaced_pod, pod)
        for name in sorted(set(existing) - set(desired.running)):
            self._delete_pod(name)

    def read_deployment(self) -> DesiredState | None:
        """The last applied state, from the routing ConfigMap (None before the first apply)."""
        from kubernetes.client.exceptions import ApiException

        try:
            cm = self.core.read_namespaced_config_map(routing_name(self.name), self.namespace)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        data = cm.data or {}
        if "routing.json" not in data or "topology.yaml" not in data:
            return None
        return DesiredState(
            topology=load_topology(data["topology.yaml"]),
            routing=RoutingTable.from_json(data["routing.json"]),
            memory=data.get("state.json"),
        )

    def ensure_transport_user(self, topology: StreamTopology) -> str | None:
        """(Re)create the topology's Valkey user when it has one: with every apply, and on every operator
        tick, since Valkey forgets run-time ACL users when it restarts and executors must not stay
        locked out until the next period. A topology past the platform's transport limits is suspended
        instead, and the reason returned (:func:`.transport_acl.enforce_quota`)."""
        if not self.settings.own_user(topology):
            return None
        return cast(
            str | None,
            self._with_admin(
                lambda admin: transport_acl.ensure_user(
                    admin,
                    owner_keys(self.owner),
                    transport_password(self.owner, self.settings),
                    transport_acl.shared_reads(topology),
                    self.settings.transport_limits,
                )
            ),
        )

    def state_client(self, topology: StreamTopology) -> Any | None:
        """The platform Valkey's admin connection when ``topology`` runs on it with its own user (the only
        transport the operator may reach: it never connects to a URL a tenant wrote)."""
        if not self.settings.own_user(topology):
            return None
        assert self.settings.transport_url and self.settings.transport_admin_password  # own_user says so
        return _admin_client(self.settings.transport_url, self.settings.transport_admin_password)

    def remove_transport_data(self, streams: Sequence[str]) -> int:
        """Delete the topology's Valkey user, keys and the named ``streams`` (keys deleted); nothing to do
        when the topology is not on the platform's transport with its own user."""
        try:
            topology = load_topology(object_document(self.owner))
        except ValueError:  # never valid, so never deployed: its user and keys were never made
            return 0
        if not self.settings.own_user(topology):
            return 0
        keys = owner_keys(self.owner)
        limits = self.settings.transport_limits
        return self._with_admin(lambda admin: transport_acl.remove_topology(admin, keys, streams, limits))

    def trim_streams(self, readers: Mapping[str, Sequence[str]]) -> int:
        """Trim each named stream (key -> the unit keys that read it) past every reader's committed
        offset (:func:`.transport_acl.trim`); needs the platform's Valkey admin, as the topology's own user may
        not read its consumers' unit records. Returns the entries removed."""
        topology = load_topology(object_document(self.owner))
        if not self.settings.own_user(topology):
            return 0
        return int(
            self._with_admin(
                lambda admin: sum(
                    transport_acl.trim(admin, key, units, self.settings.transport_limits)
                    for key, units in readers.items()
                )
            )
        )

    def _with_admin(self, action: Any) -> Any:
        """``action(admin client)`` on the platform's Valkey; its errors as :class:`TransportAdminError`."""
        import redis

        assert self.settings.transport_url and self.settings.transport_admin_password  # own_user says so
        try:
            return action(_admin_client(self.settings.transport_url, self.settings.transport_admin_password))
        except redis.RedisError as error:
            raise TransportAdminError(
                f"cannot manage the topology's Valkey user at {self.settings.transport_url}: {error}"
            ) from None

    # -------------------------------------------------------------------------------------- helpers

    def _put(self, obj: dict[str, Any], create: Any, patch: Any) -> None:
        """Create ``obj``, or merge-patch it over an existing one: no read, so no ``get`` permission."""
        from kubernetes.client.exceptions import ApiException

        try:
            create(self.namespace, obj)
        except ApiException as error:
            if error.status != 409:
                raise
            patch(obj["metadata"]["name"], self.namespace, obj)

    def committed(self) -> dict[str, float]:
        """CPU that every other pod requests per node (other topologies' executors and any other
        workload: a node's room is its allocatable CPU less what the scheduler has promised), in every
        namespace the operator may list pods in (all of them with the chart's cluster-wide RBAC, else
        this namespace). This topology's own executors are left out: the planner counts them itself."""
        from kubernetes.client.exceptions import ApiException

        try:
            response = self.core.list_pod_for_all_namespaces(_preload_content=False)
        except ApiException as error:
            if error.status != 403:
                raise
            response = self.core.list_namespaced_pod(self.namespace, _preload_content=False)
        mine = (self.namespace, self.name)
        return committed_cpu(
            p
            for p in self._items(response)
            if (p["metadata"].get("namespace"), (p["metadata"].get("labels") or {}).get(TOPOLOGY_LABEL))
            != mine
        )

    def _pods(self) -> list[dict[str, Any]]:
        response = self.core.list_namespaced_pod(
            self.namespace, label_selector=selector(self.name), _preload_content=False
        )
        return [
            p
            for p in self._items(response)
            if (p["metadata"].get("labels") or {}).get(TOPOLOGY_LABEL) == self.name
        ]

    @staticmethod
    def _items(response: Any) -> list[dict[str, Any]]:
        return json.loads(response.data).get("items") or []

    def _ensure(self, obj: dict[str, Any], read: Any, create: Any, patch: Any, key: str | None) -> None:
        from kubernetes.client.exceptions import ApiException

        name = obj["metadata"]["name"]
        try:
            current = json.loads(read(name, self.namespace, _preload_content=False).data)
        except ApiException as error:
            if error.status != 404:
                raise
            self._create(create, obj)
            return
        if key is not None and (
            current.get(key) != obj[key]
            or current["metadata"].get("annotations") != obj["metadata"].get("annotations")
        ):
            patch(
                name,
                self.namespace,
                {"metadata": {"annotations": obj["metadata"].get("annotations")}, key: obj[key]},
            )

    def _create(self, create: Any, obj: dict[str, Any]) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            create(self.namespace, obj)
        except ApiException as error:
            if error.status != 409:  # already there: a previous, interrupted apply created it
                raise

    def _delete_pod(self, name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self.core.delete_namespaced_pod(name, self.namespace)
        except ApiException as error:
            if error.status != 404:
                raise


def patch_status(api_client: Any, namespace: str, name: str, status: Mapping[str, Any]) -> None:
    """Write the status subresource (merge patch): the user's spec is never touched."""
    from kubernetes import client

    client.CustomObjectsApi(api_client).patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, name, {"status": dict(status)}
    )


def read_topology(api_client: Any, namespace: str, name: str) -> dict[str, Any]:
    from kubernetes import client

    found = client.CustomObjectsApi(api_client).get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name
    )
    return cast(dict[str, Any], found)


def list_topologies(api_client: Any, namespace: str) -> dict[str, dict[str, Any]]:
    """Name -> StreamTopology object of every topology in ``namespace``."""
    from kubernetes import client

    found = client.CustomObjectsApi(api_client).list_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, _preload_content=False
    )
    return {item["metadata"]["name"]: item for item in KubernetesPlatform._items(found)}


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns ``old`` into ``new``: changed keys, removed ones as
    null, nested objects patched key by key, lists whole."""
    patch: dict[str, Any] = {key: None for key in old if key not in new}
    for key, value in new.items():
        if isinstance(value, Mapping) and isinstance(old.get(key), Mapping):
            if nested := merge_patch(old[key], value):
                patch[key] = nested
        elif old.get(key, object()) != value:
            patch[key] = value
    return patch


def write_shared(api_client: Any, namespace: str, doc: Mapping[str, Any], *, whole: bool = False) -> None:
    """Create the shared or fused topology ``doc``, or bring the existing one's owners to ``doc``'s (a
    fused one's spec, labels and annotations too: ``whole``), or delete it when no owner is left
    (:mod:`~streamtopo.controller.sharing`).

    An existing ``doc`` carries the resourceVersion it was decided on, so a concurrent change (another
    consumer joining) fails the patch with a conflict and the caller decides again; two topologies
    founding the same part at once conflict on its name the same way.
    """
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    api = client.CustomObjectsApi(api_client)
    meta = doc["metadata"]
    if "resourceVersion" not in meta:
        body = {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "spec": doc["spec"]}
        api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    elif not any(r.get("kind") == KIND for r in meta.get("ownerReferences") or []):
        try:
            api.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, meta["name"])
        except ApiException as error:
            if error.status != 404:
                raise
    elif whole:
        stored = cast(
            dict[str, Any], api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, meta["name"])
        )
        kept = ("ownerReferences", "resourceVersion", "labels", "annotations")
        patch = {
            "metadata": {k: meta[k] for k in kept if k in meta},
            "spec": merge_patch(stored.get("spec") or {}, doc["spec"]),
        }
        api.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, meta["name"], patch)
    else:
        patch = {"metadata": {k: meta[k] for k in ("ownerReferences", "resourceVersion")}}
        api.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, meta["name"], patch)
