"""The kopf operator: StreamTopology handlers, the SPL daemon, node watching, status, events and /metrics.

Run with ``streamtopo operator`` (or ``kopf run -m streamtopo.controller.operator``). Handlers:

- create / update (spec changes only) / resume -> :func:`streamtopo.controller.reconcile.reconcile`
  through :class:`~streamtopo.controller.kubernetes.KubernetesPlatform`; status and Events from its outcome.
  The old spec of an update is the one the routing ConfigMap records (the last applied); an upgrade that
  waits for the old executors to stop retries the handler (kopf.TemporaryError) until they are gone.
- a daemon per topology (the SPL loop): every ``spec.autoscaling.interval`` one
  :class:`~streamtopo.controller.adaptation_loop.AdaptationLoop` step (ALBIC + scaling) on the deployment the
  routing ConfigMap records; between periods it re-plans when Nodes changed and keeps the pods converged
  (a deleted or failed executor pod is recreated). Owned objects go by garbage collection
  (ownerReferences); what Kubernetes cannot collect, the topology's Valkey user, keys and named output
  streams, goes in a delete handler before kopf releases its finalizer (:func:`remove_transport_data`).
- Node events mark the cluster as changed; each daemon compares hosts and re-plans if they differ.

Planning (COLA + Aeolus, and ALBIC's Algorithm 1 every SPL) runs in one worker process
(:mod:`streamtopo.controller.planner_worker`): this process only talks to the API and applies what the
worker computed, so it never imports the solvers (OR-Tools) and stays small with many topologies.
``STREAMTOPO_PLANNER_TASKS_PER_CHILD`` sets after how many calls the worker is replaced,
``STREAMTOPO_PLAN_TIMEOUT`` how long one planning call may run and ``STREAMTOPO_PLAN_MEMORY`` how much
address space it may use (then it is refused: NoValidPlan).

Prometheus basic auth comes from ``spec.metrics.prometheus.basicAuthSecret``: one key of one Secret in
the topology's namespace, read every period (rotation needs no restart), never logged nor written to
status or events. Reading it needs ``get`` on that Secret (the chart's ``rbac.secretNames``); when it
cannot be read the period is skipped with a condition naming the field and the API's reason.

Safety: every write is by deterministic name (create-or-patch), the routing ConfigMap is the record of
the last good deployment, and the user's spec is never written. One replica with the Recreate strategy
is the default (docs/operator.md); for standby replicas, kopf peering (``--peering``) lets exactly one
replica handle resources at a time.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import logging
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from typing import Any

import kopf
from prometheus_client import Counter, Gauge, Histogram, start_http_server

from streamtopo.controller.adaptation_loop import AdaptationLoop
from streamtopo.controller.bounded import parse_bytes
from streamtopo.controller.kubernetes import (
    KubernetesPlatform,
    NoHosts,
    PodHealth,
    TransportAdminError,
    list_topologies,
    patch_status,
    read_topology,
    write_shared,
)
from streamtopo.controller.planner_worker import (
    DEFAULT_MEMORY,
    DEFAULT_TASKS_PER_CHILD,
    DEFAULT_TIMEOUT,
    WorkerPlanner,
)
from streamtopo.controller.platform import DesiredState, MetricsSource, MetricsUnavailable
from streamtopo.controller.prometheus import PrometheusMetricsSource
from streamtopo.controller.reconcile import (
    APPROVE_ANNOTATION,
    ConditionChange,
    Event,
    Outcome,
    admit,
    merge_conditions,
    now_iso,
    problems_message,
    reconcile,
)
from streamtopo.controller.rendering import GROUP, PLURAL, VERSION, RenderSettings, selector
from streamtopo.controller.sharing import (
    FUSED_LABEL,
    SHARED_LABEL,
    Sharing,
    WaitForPartners,
    decide,
    is_fused,
    is_shared,
    leave_fused,
    member_change_problems,
    owned_by,
    owners,
    reader_units,
    with_owners,
)
from streamtopo.planner.benoit.split import join_shared
from streamtopo.planner.model import SecretKeyRef, StreamTopology, TopologyError
from streamtopo.planner.upgrade import plan_upgrade

WEBHOOK_PATH = "validate-topology"
"""The admission webhook's URL path (kopf serves a handler under its id; the chart's
ValidatingWebhookConfiguration names it)."""

RECONCILES = Counter("streamtopo_operator_reconciles_total", "Reconciles by result", ["result"])
RECONCILE_SECONDS = Histogram("streamtopo_operator_reconcile_seconds", "Duration of one reconcile")
SPL_STEPS = Counter("streamtopo_operator_spl_steps_total", "SPL rounds by outcome", ["outcome"])
MIGRATIONS = Counter("streamtopo_operator_migrations_total", "Key groups moved by the SPL loop")
SCALING = Counter("streamtopo_operator_scaling_decisions_total", "Executor set changes", ["direction"])
TOPOLOGIES = Gauge("streamtopo_operator_topologies", "StreamTopologies handled by this operator")
LOAD_DISTANCE = Gauge(
    "streamtopo_operator_load_distance",
    "ALBIC's load distance after the last period's plan",
    ["namespace", "topology"],
)
EXECUTORS = Gauge(
    "streamtopo_operator_executors",
    "Executors in the routing table after the last period",
    ["namespace", "topology"],
)


def planner_from_env() -> WorkerPlanner:
    return WorkerPlanner(
        int(os.environ.get("STREAMTOPO_PLANNER_TASKS_PER_CHILD", DEFAULT_TASKS_PER_CHILD)),
        timeout=float(os.environ.get("STREAMTOPO_PLAN_TIMEOUT", DEFAULT_TIMEOUT)),
        memory=parse_bytes(os.environ.get("STREAMTOPO_PLAN_MEMORY") or str(DEFAULT_MEMORY)),
    )


class OperatorState:
    """Process-wide state: the API client, rendering settings, and the cluster change counter."""

    def __init__(self) -> None:
        self.api: Any = None
        self.settings = RenderSettings.from_env()
        self.tick = 5.0
        """Seconds between daemon wake-ups (node changes, pod convergence); the SPL is per topology."""
        self.trim_every = 30.0
        """Seconds between trims of a shared topology's streams."""
        self.nodes_version = 0
        self.topologies: set[tuple[str, str]] = set()
        self.failures: dict[tuple[str, str], set[tuple[str, str | None, int]]] = {}
        """Executor failures already reported per topology (pod, reason, restarts): one Event each."""
        self.lock = threading.Lock()
        self.planner = planner_from_env()
        """Plans in a worker process (created on the first plan, replaced after N calls)."""

    def client(self) -> Any:
        if self.api is None:
            from kubernetes import client, config

            try:
                config.load_incluster_config()
            except config.ConfigException:  # outside a cluster: $KUBECONFIG (read now, not at import)
                config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))
            self.api = client.ApiClient()
        return self.api


STATE = OperatorState()


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    """Watch timeouts (a silent watch is restarted), annotation-based progress, quiet handler events."""
    settings.watching.server_timeout = float(os.environ.get("STREAMTOPO_WATCH_SERVER_TIMEOUT", "300"))
    settings.watching.client_timeout = settings.watching.server_timeout + 30
    settings.watching.connect_timeout = 30
    settings.watching.inactivity_timeout = settings.watching.server_timeout + 60
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    settings.execution.max_workers = int(os.environ.get("STREAMTOPO_WORKERS", "8"))
    port = os.environ.get("STREAMTOPO_METRICS_PORT")
    if port:
        start_http_server(int(port))
    STATE.settings = RenderSettings.from_env()
    settings.peering.priority = peering_priority(os.environ)
    if cert_dir := os.environ.get("STREAMTOPO_WEBHOOK_CERT_DIR"):
        # The admission webhook (admit_topology); the chart's ValidatingWebhookConfiguration points at it
        # and carries the CA. kopf re-reads the files when they change (a renewed certificate).
        settings.admission.server = kopf.WebhookServer(
            addr=os.environ.get("STREAMTOPO_WEBHOOK_ADDR", "0.0.0.0"),
            port=int(os.environ.get("STREAMTOPO_WEBHOOK_PORT", "9443")),
            certfile=os.path.join(cert_dir, "tls.crt"),
            pkeyfile=os.path.join(cert_dir, "tls.key"),
        )
    else:
        settings.admission.server = no_webhook_server
    STATE.tick = float(os.environ.get("STREAMTOPO_TICK_SECONDS", "5"))
    STATE.trim_every = float(os.environ.get("STREAMTOPO_TRIM_SECONDS", "30"))
    STATE.api = None  # a new run may talk to another API server (kubeconfig re-read)
    STATE.client()
    STATE.planner = planner_from_env()


def peering_priority(env: Mapping[str, str]) -> int:
    """This replica's kopf peering priority: ``STREAMTOPO_PEERING_PRIORITY``, else a number derived from
    the pod's name. kopf pauses every replica when peers share a priority, and a Deployment's replicas
    cannot be given different arguments, so equal defaults would leave no replica acting; distinct
    names give distinct priorities, and the highest live one acts."""
    if given := env.get("STREAMTOPO_PEERING_PRIORITY"):
        return int(given)
    name = env.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big") % 1_000_000 + 1


@kopf.on.cleanup()
def stop_planner(**_: Any) -> None:
    """The planning worker goes with the operator (no orphan process)."""
    STATE.planner.shutdown()


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In-cluster service account, else $KUBECONFIG as it is now (kopf's client login reads it at import)."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


# ------------------------------------------------------------------------------------ admission


async def no_webhook_server(_: Any) -> AsyncIterator[Any]:
    """The admission server when the platform turned the webhook off: it listens nowhere and never calls
    :func:`admit_topology` (kopf insists on a server once a validating handler exists); the reconcile is
    then the gate, with the same messages."""
    await asyncio.Event().wait()
    yield  # never reached: the yield makes this the async generator kopf iterates


@kopf.on.validate(GROUP, VERSION, PLURAL, id=WEBHOOK_PATH, operations=["CREATE", "UPDATE"])
def admit_topology(body: kopf.Body, **kwargs: Any) -> None:
    """Refuse an invalid StreamTopology at the API server, with every field named: the same validator
    (and platform policy) as the reconcile and the CLI, so nothing the webhook admits is refused later
    for its spec.

    An update that leaves the spec as it was (kopf's finalizer and annotations, labels, a deletion) is
    admitted: a topology admitted under an older platform policy must stay deletable. An update the
    running state cannot take (planner/upgrade.py, against the deployment the routing ConfigMap records,
    as Flink's operator validates a spec change against the last reconciled one) is refused here too,
    naming the field; a sharing consumer's is left to the reconcile, which sees its rewrite, except a
    fused member's, checked against the fused topology's running state as the reconcile will.
    """
    old = kwargs.get("old")
    if old is not None and (old.get("spec") == body.get("spec") or body.metadata.get("deletionTimestamp")):
        return
    previous = _recorded(body) if old is not None else None
    try:
        topology = admit(body, STATE.settings.policy, previous.topology.spec if previous else None)
    except TopologyError as error:
        raise kopf.AdmissionError(problems_message(error.problems), code=422) from None
    if previous is not None and not topology.spec.sharing.enabled:
        upgrade = plan_upgrade(previous.topology.spec, topology.spec)
        if upgrade.refused:
            raise kopf.AdmissionError(problems_message(upgrade.problems), code=422)
    if old is not None and topology.spec.sharing.enabled:  # a fused member: against the fused state
        namespace = list_topologies(STATE.client(), body.metadata.namespace or "")
        if problems := member_change_problems(dict(body), topology, namespace, _admit):
            raise kopf.AdmissionError(problems_message(problems), code=422)


# ------------------------------------------------------------------------------------ create / update


def _lock(memo: Any) -> threading.Lock:
    with STATE.lock:
        if getattr(memo, "lock", None) is None:
            memo.lock = threading.Lock()
        return memo.lock


def _key(body: kopf.Body) -> tuple[str, str]:
    """(namespace, name) of a StreamTopology (namespaced: it always has a namespace)."""
    return body.metadata.namespace or "", body.metadata.name or ""


def _platform(body: Mapping[str, Any]) -> KubernetesPlatform:
    return KubernetesPlatform(body["metadata"]["namespace"], body, STATE.client(), STATE.settings)


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
def reconcile_topology(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Plan and apply the spec; an invalid spec leaves the last good deployment untouched."""
    STATE.topologies.add(_key(body))
    TOPOLOGIES.set(len(STATE.topologies))
    with _lock(memo), RECONCILE_SECONDS.time():
        platform = _platform(body)
        nodes_version = STATE.nodes_version  # node events from now on are looked at by the daemon
        previous = _previous(platform)
        shares: list[Sharing] = []

        def share(topology: StreamTopology) -> StreamTopology:
            shares.append(_share(body, topology, deployed=previous is not None))
            if (deploy := shares[-1].deploy) is None:
                raise RunsFused(shares[-1])
            return deploy

        try:
            outcome = reconcile(
                body,
                platform,
                previous=previous,
                planner=STATE.planner,
                policy=STATE.settings.policy,
                share=share,
            )
        except (NoHosts, TransportAdminError) as error:
            reason = "NoHosts" if isinstance(error, NoHosts) else "TransportUnavailable"
            publish(
                body,
                platform,
                Outcome(conditions=[ConditionChange("Degraded", "True", reason, str(error))]),
                observed=True,
            )
            raise kopf.TemporaryError(str(error), delay=30) from None
        except RunsFused as fused:
            publish(body, platform, fused.outcome(), observed=True)
            return
        except WaitForPartners as wait:
            waiting = ConditionChange("Sharing", "False", "WaitingForPartners", str(wait))
            publish(body, platform, Outcome(conditions=[waiting]), observed=False)
            raise kopf.TemporaryError(str(wait), delay=max(1.0, wait.seconds)) from None
        if outcome.retry_after is not None:  # an upgrade waits for the old executors to stop
            publish(body, platform, outcome, observed=False)
            raise kopf.TemporaryError(outcome.conditions[0].message, delay=outcome.retry_after)
        if outcome.cluster is not None:
            memo.cluster = outcome.cluster.model_dump_json()
            memo.nodes_version = nodes_version
        if shares and (sharing := shares[-1].status()):
            outcome.status["sharing"] = sharing
        publish(body, platform, outcome, observed=True)
    RECONCILES.labels("applied" if outcome.desired else "refused").inc()


def _share(body: kopf.Body, topology: StreamTopology, *, deployed: bool) -> Sharing:
    """The sharing decision for ``topology`` (:mod:`.sharing`), the shared topology written first: a
    consumer never runs before what it reads exists."""
    if not topology.spec.sharing.enabled:
        return Sharing(topology)
    namespace = body.metadata.namespace or ""
    decision = decide(
        dict(body),
        topology,
        list_topologies(STATE.client(), namespace),
        deployed=deployed,
        now=datetime.now(UTC),
        admit=_admit,
    )
    if decision.write and decision.shared is not None:
        _write_shared(namespace, decision.shared)
    return decision


class RunsFused(Exception):
    """The topology runs inside a fused topology: it deploys nothing of its own."""

    def __init__(self, sharing: Sharing):
        self.sharing = sharing
        super().__init__(f"runs inside {sharing.status()['fusedTopology']}")

    def outcome(self) -> Outcome:
        """The member's status: where it runs and under which names; its phase is the fused topology's."""
        status = self.sharing.status()
        message = f"runs inside the fused topology {status['fusedTopology']} (status.sharing.operators)"
        return Outcome(
            conditions=[ConditionChange("Planned", "True", "Fused", message)],
            status={"sharing": status},
        )


def _admit(doc: Mapping[str, Any]) -> StreamTopology:
    return admit(doc, STATE.settings.policy)


def _write_shared(namespace: str, doc: Mapping[str, Any]) -> None:
    """:func:`write_shared`; a conflict (another consumer changed the shared topology meanwhile) retries
    the handler, and so the whole decision, in a second."""
    from kubernetes.client.exceptions import ApiException

    try:
        write_shared(STATE.client(), namespace, doc, whole=is_fused(doc))
    except ApiException as error:
        if error.status != 409:
            raise
        raise kopf.TemporaryError("the shared topology changed meanwhile", delay=1) from None


@kopf.on.field(GROUP, VERSION, PLURAL, field="metadata.ownerReferences", labels={SHARED_LABEL: "true"})
@kopf.on.field(GROUP, VERSION, PLURAL, field="metadata.ownerReferences", labels={FUSED_LABEL: "true"})
def count_consumers(body: kopf.Body, **_: Any) -> None:
    """A shared or fused topology's status lists its consumers (its owners) as they come and go."""
    consumers = sorted(r["name"] for r in owners(body))
    patch_status(
        STATE.client(),
        body.metadata.namespace or "",
        body.metadata.name or "",
        {"sharing": {"consumers": consumers}},
    )


@kopf.on.delete(GROUP, VERSION, PLURAL, retries=20, backoff=5)
def leave_shared(body: kopf.Body, **_: Any) -> None:
    """A deleted consumer leaves the shared topologies it reads; the last one out deletes them (their own
    delete handler then removes their streams). The API server's garbage collector would do the latter
    through the ownerReferences; doing it here does not depend on it. A fused member's operators leave
    the fused topology with it, their state dropped, the others' kept (:func:`leave_fused`)."""
    namespace, uid = body.metadata.namespace or "", body.metadata.uid
    topologies = list_topologies(STATE.client(), namespace)
    remaining = {n: doc for n, doc in topologies.items() if doc["metadata"].get("uid") != uid}
    for doc in topologies.values():
        if not owned_by(doc, uid):
            continue
        if is_shared(doc):
            _write_shared(namespace, with_owners(doc, [r for r in owners(doc) if r.get("uid") != uid]))
        elif is_fused(doc):
            _write_shared(namespace, leave_fused(doc, uid, remaining, _admit))


def _fused_phase(namespace: str, name: str) -> tuple[str, Any]:
    """The phase and executors of the fused topology ``name``, which its members show as theirs."""
    from kubernetes.client.exceptions import ApiException

    try:
        status = read_topology(STATE.client(), namespace, name).get("status") or {}
    except ApiException as error:
        if error.status != 404:
            raise
        status = {}
    return status.get("phase", "Pending"), status.get("executors")


def _mirror(namespace: str, members: list[dict[str, Any]], phase: str, executors: Any) -> None:
    """A fused topology's phase and executors on its members' statuses (a deleted member is skipped)."""
    from kubernetes.client.exceptions import ApiException

    for ref in members:
        try:
            patch_status(STATE.client(), namespace, ref["name"], {"phase": phase, "executors": executors})
        except ApiException as error:
            if error.status != 404:
                raise


def _recorded(body: kopf.Body) -> DesiredState | None:
    """The webhook's view of a topology's running deployment; None when there is none or it cannot be
    read now (the reconcile remains the last gate)."""
    from kubernetes.client.exceptions import ApiException

    if not body.metadata.get("namespace"):
        return None
    try:
        return _previous(_platform(body))
    except ApiException:
        return None


def _previous(platform: KubernetesPlatform) -> DesiredState | None:
    """The deployment the routing ConfigMap records; an unreadable one counts as none (re-plan)."""
    try:
        return platform.read_deployment()
    except ValueError:
        return None


def publish(body: kopf.Body, platform: KubernetesPlatform, outcome: Outcome, *, observed: bool) -> None:
    """Write the outcome: status (conditions merged per API conventions, Ready from the pods), Events.

    Called under the topology's lock, so the handlers' and the daemon's writes never interleave. The
    current status is read from the API, not from ``body``: the daemon's body can lag behind a status
    the handler has just written, and merging into a stale one would drop its conditions. ``observed``:
    only the spec handlers, which act on the spec, advance ``observedGeneration`` (API conventions); the
    SPL daemon and node re-plans keep it.
    """
    from kubernetes.client.exceptions import ApiException

    meta = body["metadata"]
    try:
        current = dict(read_topology(STATE.client(), meta["namespace"], meta["name"]).get("status") or {})
    except ApiException as error:
        if error.status == 404:
            return  # deleted meanwhile: nothing to report on
        raise
    generation = meta.get("generation") if observed else current.get("observedGeneration")
    health = platform.pod_health()
    deployment = outcome.desired
    changes = list(outcome.conditions)
    events = list(outcome.events)
    executors = outcome.status.get("executors", current.get("executors"))
    suspended = bool((body.get("spec") or {}).get("suspend"))
    if suspended:
        # Whoever publishes (the spec handler or the SPL daemon, whose outcome still counts the routing's
        # executors), a suspended topology runs none: never "Suspended" beside a stale count.
        executors = 0
        changes.append(ConditionChange("Ready", "False", "Suspended", "spec.suspend: no executor runs"))
    elif executors:
        health_changes, health_events = executor_health(
            meta, health, executors, current.get("conditions") or [], decided={c.type for c in changes}
        )
        changes += health_changes
        events += health_events
    conditions = merge_conditions(
        current.get("conditions") or [], changes, now=now_iso(), generation=generation
    )
    by_type = {c["type"]: c for c in conditions}
    if by_type.get("Planned", {}).get("status") == "False":
        phase = "Degraded" if health else "Failed"
    elif suspended:
        phase = "Suspended"
    elif by_type.get("Degraded", {}).get("status") == "True":
        phase = "Degraded"
    elif by_type.get("Ready", {}).get("status") == "True":
        phase = "Running"
    else:
        phase = "Planned" if deployment or current.get("phase") else "Pending"
    fused = (outcome.status.get("sharing") or current.get("sharing") or {}).get("fusedTopology")
    if fused is not None and by_type.get("Planned", {}).get("reason") == "Fused":
        phase, executors = _fused_phase(meta["namespace"], fused)
    status = {
        **outcome.status,
        "executors": executors,
        "conditions": conditions,
        "phase": phase,
        "selector": selector(meta["name"]),
        "observedGeneration": generation,
        "routingConfigMap": f"{meta['name']}-routing"
        if health or deployment
        else current.get("routingConfigMap"),
    }
    patch_status(
        STATE.client(), meta["namespace"], meta["name"], {k: v for k, v in status.items() if v is not None}
    )
    if is_fused(body):
        _mirror(meta["namespace"], owners(body), phase, executors)
    for event in events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message[:1000])


def executor_health(
    meta: Mapping[str, Any],
    health: Mapping[str, PodHealth],
    executors: int,
    current: list[Mapping[str, Any]],
    decided: set[str],
) -> tuple[list[ConditionChange], list[Event]]:
    """Ready from the pods' readiness probes; a failing executor (crash loop, OOM kill, image pull, a
    failed pod) makes the topology Degraded with the pod and reason, and gets one Warning Event per new
    failure (pod, reason, restart count); starting executors are Progressing, not Degraded. Once no
    executor fails, Degraded clears unless this outcome already decided it (``decided``: condition types)."""
    ready = sum(1 for h in health.values() if h.ready)
    failing = {name: h for name, h in sorted(health.items()) if h.problem}
    counts = f"{ready} of {executors} executors ready"
    changes = [
        ConditionChange("Ready", "True", "ExecutorsReady", counts)
        if ready >= executors
        else ConditionChange("Ready", "False", "ExecutorsFailing" if failing else "ExecutorsStarting", counts)
    ]
    if ready >= executors:
        changes.append(ConditionChange("Progressing", "False", "ExecutorsReady", counts))
    elif not failing:
        changes.append(ConditionChange("Progressing", "True", "ExecutorsStarting", counts))
    events = []
    if failing:
        message = "; ".join(f"pod {name}: {h.problem} ({h.restarts} restarts)" for name, h in failing.items())
        changes += [
            ConditionChange("Progressing", "False", "ExecutorFailing", message),
            ConditionChange("Degraded", "True", "ExecutorFailing", message),
        ]
        key = (meta["namespace"], meta["name"])
        seen = STATE.failures.setdefault(key, set())
        for name, h in failing.items():
            if (name, h.problem, h.restarts) not in seen:
                seen.add((name, h.problem, h.restarts))
                events.append(
                    Event("ExecutorFailing", f"pod {name}: {h.problem} ({h.restarts} restarts)", "Warning")
                )
    elif "Degraded" not in decided and any(
        c.get("type") == "Degraded" and c.get("reason") == "ExecutorFailing" for c in current
    ):
        changes.append(ConditionChange("Degraded", "False", "ExecutorsRecovered", counts))
    return changes, events


@kopf.on.delete(GROUP, VERSION, PLURAL, optional=True)
def forget_topology(body: kopf.Body, **_: Any) -> None:
    """Owned objects are garbage-collected through their ownerReferences; only our own memory goes."""
    STATE.topologies.discard(_key(body))
    STATE.failures.pop(_key(body), None)
    for gauge in (LOAD_DISTANCE, EXECUTORS):
        try:
            gauge.remove(body.metadata.namespace, body.metadata.name)
        except KeyError:  # never measured
            pass
    TOPOLOGIES.set(len(STATE.topologies))


@kopf.on.delete(GROUP, VERSION, PLURAL, retries=20, backoff=15)
def remove_transport_data(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    """Delete the topology's Valkey user, its keys and the named streams its sinks write that no other
    topology of the namespace reads.

    Under the topology's lock: the daemon (already told to stop) finishes a running period first, and a
    later one sees ``stopped`` and applies nothing, so no user is re-created after this. While the platform's
    Valkey is unreachable the deletion waits (retried for about 5 minutes, then kopf gives up and releases
    the finalizer, logging the error: a topology must not be undeletable).
    """
    platform = _platform(body)
    others = list_topologies(STATE.client(), body.metadata.namespace or "")
    others.pop(body.metadata.name or "", None)
    streams = _named_outputs(body, others)
    with _lock(memo):
        try:
            deleted = platform.remove_transport_data(streams)
        except TransportAdminError as error:
            raise kopf.TemporaryError(str(error), delay=15) from None
    if deleted:
        logger.info(f"removed the topology's Valkey user and {deleted} keys")


def _named_outputs(body: Mapping[str, Any], others: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The namespace-local stream keys ``body``'s sinks write that none of ``others`` (name -> topology)
    reads: the topology's own output, which goes with it."""
    from streamtopo.contracts import Keys

    def streams(doc: Mapping[str, Any], side: str) -> set[str]:
        operators = (doc.get("spec") or {}).get("operators")
        return {
            str(op[side]["stream"])
            for op in (operators if isinstance(operators, list) else [])
            if isinstance(op, Mapping) and isinstance(op.get(side), Mapping) and op[side].get("stream")
        }

    read = set().union(*(streams(doc, "source") for doc in others.values()))
    keys = Keys(body["metadata"]["name"], body["metadata"]["namespace"])
    return sorted(keys.sink_stream(name) for name in streams(body, "sink") - read)


# ----------------------------------------------------------------------------------------- nodes


@kopf.on.event("", "v1", "nodes")
def node_event(type: str | None, **_: Any) -> None:
    """A Node came, went or changed: daemons compare hosts on their next tick and re-plan if needed."""
    if type in ("ADDED", "MODIFIED", "DELETED"):
        STATE.nodes_version += 1


def _signature(platform: KubernetesPlatform) -> str:
    return platform.hosts().model_dump_json()


# ------------------------------------------------------------------------------------- the SPL loop


def metrics_source(deployment: DesiredState, platform: KubernetesPlatform) -> MetricsSource:
    """Prometheus when the spec or the operator names one, else direct scrape of the executor pods.

    Basic auth: the spec's ``basicAuthSecret`` (read from the topology's namespace every period); the
    operator-wide credentials of the chart's ``prometheus.basicAuth`` (environment) go only to the
    platform's own Prometheus URL, never to a URL a tenant wrote in the spec.
    """
    prometheus = deployment.topology.spec.metrics.prometheus
    platform_url = os.environ.get("STREAMTOPO_PROMETHEUS_URL")
    url = prometheus.url if prometheus else platform_url
    if url:
        if prometheus and prometheus.basic_auth_secret:
            namespace, ref = platform.namespace, prometheus.basic_auth_secret
            return PrometheusMetricsSource(url, credentials=lambda: read_basic_auth(namespace, ref))
        user = os.environ.get("STREAMTOPO_PROMETHEUS_USERNAME")
        password = os.environ.get("STREAMTOPO_PROMETHEUS_PASSWORD")
        ours = platform_url is not None and url.rstrip("/") == platform_url.rstrip("/")
        return PrometheusMetricsSource(url, auth=(user, password) if ours and user and password else None)
    from streamtopo.controller.scrape import ScrapeMetricsSource

    port = STATE.settings.metrics_port
    return ScrapeMetricsSource(
        lambda: {name: f"http://{ip}:{port}/metrics" for name, ip in platform.pod_ips().items() if ip}
    )


AUTH_FIELD = "spec.metrics.prometheus.basicAuthSecret"


def read_basic_auth(namespace: str, ref: SecretKeyRef) -> tuple[str, str]:
    """``user:password`` from one key of one Secret; MetricsUnavailable (never the value) when unreadable.

    The reason is the API's (Forbidden: the operator may not get this Secret, see ``rbac.secretNames``;
    NotFound) prefixed with ``Secret``; the message names the field, the Secret and the key.
    """
    from kubernetes.client import CoreV1Api
    from kubernetes.client.exceptions import ApiException

    where = f"{AUTH_FIELD}: key {ref.key!r} of Secret {namespace}/{ref.name}"
    try:
        secret = CoreV1Api(STATE.client()).read_namespaced_secret(ref.name, namespace)
    except ApiException as error:
        reason = {401: "Unauthorized", 403: "Forbidden", 404: "NotFound"}.get(
            error.status, f"Http{error.status}"
        )
        raise MetricsUnavailable(f"Secret{reason}", f"{where} cannot be read ({reason})") from None
    encoded = (secret.data or {}).get(ref.key)
    if encoded is None:
        raise MetricsUnavailable("SecretKeyNotFound", f"{where}: the Secret has no such key (NotFound)")
    try:
        user, colon, password = base64.b64decode(encoded, validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        user, colon, password = "", "", ""
    if not colon:
        raise MetricsUnavailable("SecretInvalid", f"{where} does not hold 'user:password'")
    return user, password


async def _nap(stopped: kopf.DaemonStopped, seconds: float) -> None:
    """Sleep ``seconds`` or until ``stopped``. Not ``stopped.wait(seconds)``: kopf times that wait out with
    ``asyncio.wait_for`` in a task of its own, and on Python 3.11 a cancellation landing as the timeout
    fires leaves that task failed with TimeoutError, which kopf's shutdown re-raises from the hung tasks
    (the operator then exits with an error). An untimed wait raced by ``asyncio.wait`` has no such race."""
    waiter = asyncio.ensure_future(stopped.wait())
    try:
        await asyncio.wait({waiter}, timeout=seconds)
    finally:
        waiter.cancel()


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_backoff=10.0, cancellation_timeout=10.0)
async def spl_loop(
    stopped: kopf.DaemonStopped, body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    """Every SPL: one AdaptationLoop step. Every tick: re-plan on node changes, keep pods converged.

    The daemon itself is a coroutine that holds no thread while it waits; a period's blocking work (API
    calls, planners) runs in a worker thread. A sync daemon would pin one of kopf's worker threads per
    topology for its whole life and starve the create/update handlers once topologies outnumber workers.

    On deletion kopf first only signals ``stopped`` and waits (``cancellation_backoff``) before it
    cancels: cancelling would abandon a period's thread mid-apply, which could then recreate owned
    objects after kopf released the finalizer. An idle daemon exits at once; a busy one after its period.
    """
    period = Period(next_step=time.monotonic() + _interval(body))
    while not stopped:
        await _nap(stopped, min(STATE.tick, max(0.05, period.next_step - time.monotonic())))
        if stopped:
            break
        if STATE.settings.transport_admin_password:
            await asyncio.to_thread(_keep_transport_user, body, memo, logger, stopped)
            if is_shared(body) and time.monotonic() >= getattr(memo, "next_trim", 0.0):
                memo.next_trim = time.monotonic() + STATE.trim_every
                await asyncio.to_thread(_trim_shared, body, memo, logger, stopped)
        nodes_changed = getattr(memo, "nodes_version", STATE.nodes_version) != STATE.nodes_version
        if not nodes_changed and time.monotonic() < period.next_step and not period.approved(body):
            continue  # nothing to do: no API call between periods
        try:
            await asyncio.to_thread(period.run, body, memo, nodes_changed, stopped)
        except Exception:  # one bad period must not end the loop
            logger.exception("SPL period failed")
            SPL_STEPS.labels("error").inc()


def _keep_transport_user(
    body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, stopped: kopf.DaemonStopped
) -> None:
    """Re-assert the topology's Valkey user (one command): a restarted Valkey has forgotten it, and its
    executors reconnect within seconds. Under the topology's lock and never once stopped, so it cannot
    re-create a user the delete handler removed. An invalid spec has no deployment to keep; an
    unreachable Valkey is logged once per outage."""
    try:
        topology = admit(body, STATE.settings.policy)
    except TopologyError:
        return
    try:
        with _lock(memo):
            if stopped:
                return
            suspended = _platform(body).ensure_transport_user(topology)
        if suspended and not getattr(memo, "transport_suspended", False):
            logger.warning(suspended)  # an Event on the topology, once per suspension
        memo.transport_suspended = bool(suspended)
    except TransportAdminError as error:
        if not getattr(memo, "transport_down", False):
            logger.warning(str(error))
        memo.transport_down = True
    else:
        memo.transport_down = False


def _trim_shared(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, stopped: kopf.DaemonStopped) -> None:
    """Trim a shared topology's streams up to what its slowest consumer has committed: they would grow
    without bound otherwise, since readers never trim a named stream. A consumer whose spec no longer
    admits holds the trim back (what it reads is not known)."""
    from streamtopo.contracts import Keys

    try:
        shared = admit(body, STATE.settings.policy)
        namespace = list_topologies(STATE.client(), body.metadata.namespace or "")
        consumers = [
            admit(namespace[r["name"]], STATE.settings.policy) for r in owners(body) if r["name"] in namespace
        ]
    except TopologyError:
        return
    keys = Keys.of(shared)
    joined = [j for j in (join_shared(c, shared) for c in consumers) if j is not None]
    readers = {
        keys.sink_stream(op.sink.stream): [u for j in joined for u in reader_units(j, op.sink.stream)]
        for op in shared.spec.operators
        if op.sink is not None and op.sink.stream
    }
    try:
        with _lock(memo):
            if stopped:
                return
            removed = _platform(body).trim_streams(readers)
    except TransportAdminError as error:
        logger.warning(str(error))
        return
    if removed:
        logger.info(f"trimmed {removed} entries its consumers have all read")


class Period:
    """The SPL loop's state between wake-ups: the next period's time and the AdaptationLoop."""

    def __init__(self, next_step: float):
        self.next_step = next_step
        self.loop: AdaptationLoop | None = None

    def approved(self, body: Mapping[str, Any]) -> str | None:
        """The id the topology's approve annotation names, when it is a recommendation the loop keeps."""
        wanted = ((body.get("metadata") or {}).get("annotations") or {}).get(APPROVE_ANNOTATION)
        return wanted if wanted and self.loop is not None and self.loop.approvable(wanted) else None

    def run(self, body: kopf.Body, memo: kopf.Memo, nodes_changed: bool, stopped: kopf.DaemonStopped) -> None:
        """One wake-up in a worker thread.

        A stopped daemon (the topology is being deleted) neither applies nor publishes: the thread can
        outlive the daemon's wait, and an apply after kopf released the finalizer would recreate owned
        objects of a deleted owner; a status write would race the finalizer removal.
        """
        platform = _platform(body)
        with _lock(memo):
            if stopped:
                return
            deployment = _previous(platform)
            if deployment is None:
                return  # not planned yet (or the spec was never valid)
            if _suspend_pending(body, deployment):
                return
            if nodes_changed:
                _replan_if_cluster_changed(body, memo, platform, deployment)
                deployment = _previous(platform) or deployment
            if (decision := self.approved(body)) is not None and self.loop is not None:
                self.loop.platform, self.loop.routing = platform, deployment.routing
                approval = self.loop.approve(decision)
                if approval is not None and not stopped:
                    publish(body, platform, approval.outcome, observed=False)
                    _count(approval, body)
                    deployment = _previous(platform) or deployment  # the approved routing, not the one before
            if time.monotonic() < self.next_step:
                return
            self.next_step = time.monotonic() + _interval(body)
            if self.loop is None or self.loop.topology != deployment.topology:
                self.loop = AdaptationLoop(
                    platform,
                    metrics_source(deployment, platform),
                    deployment.topology,
                    routing=deployment.routing,
                    planner=STATE.planner,
                )
                self.loop.restore(deployment.memory)  # windows, collocations, history: kept in the ConfigMap
            self.loop.platform, self.loop.routing = platform, deployment.routing
            if stopped:
                return
            platform.apply(deployment)  # recreate executor pods that died since the last period
            result = self.loop.step(time.time())
            if not stopped:
                publish(body, platform, result.outcome, observed=False)
        _count(result, body)


def _suspend_pending(body: Mapping[str, Any], deployment: DesiredState) -> bool:
    """A suspend or resume the spec handler has not handled yet: the live body and the recorded
    deployment disagree, and a period stepped on either half would be wrong (a resumed phase with no
    executors, or pods recreated just before they are deleted). Once the handler has seen the generation
    (even refusing it), the recorded deployment is what runs and the period goes on."""
    wanted = bool((body.get("spec") or {}).get("suspend"))
    generation = (body.get("metadata") or {}).get("generation")
    seen = (body.get("status") or {}).get("observedGeneration") == generation
    return wanted != deployment.topology.spec.suspend and not seen


def _interval(body: Mapping[str, Any]) -> float:
    from streamtopo.planner.model import parse_duration

    try:
        return parse_duration(((body.get("spec") or {}).get("autoscaling") or {}).get("interval", 60))
    except ValueError:
        return 60.0


def _replan_if_cluster_changed(
    body: kopf.Body, memo: Any, platform: KubernetesPlatform, deployment: DesiredState
) -> None:
    memo.nodes_version = STATE.nodes_version
    try:
        signature = _signature(platform)
    except NoHosts:
        return
    if signature == getattr(memo, "cluster", None):
        return
    outcome = reconcile(
        deployment.topology, platform, previous=deployment, force_replan=True, planner=STATE.planner
    )
    if outcome.cluster is not None:
        memo.cluster = outcome.cluster.model_dump_json()
    if outcome.desired is not None:
        outcome.events.insert(0, Event("NodesChanged", "the set of schedulable nodes changed: re-planned"))
    publish(body, platform, outcome, observed=False)


def _count(result: Any, body: Mapping[str, Any]) -> None:
    SPL_STEPS.labels(result.skipped or ("applied" if result.applied else "unchanged")).inc()
    where = (body["metadata"]["namespace"], body["metadata"]["name"])
    EXECUTORS.labels(*where).set(result.executors_after)
    if result.adaptation is not None and result.adaptation.rebalance is not None:
        LOAD_DISTANCE.labels(*where).set(result.adaptation.rebalance.load_distance)
    if result.adaptation is not None:
        MIGRATIONS.inc(len(result.adaptation.migrations))
        if result.adaptation.added or result.adaptation.unmarked:
            SCALING.labels("up").inc()
        if result.adaptation.marked:
            SCALING.labels("down").inc()
