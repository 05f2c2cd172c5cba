"""Where a topology runs and where its measurements come from: the two seams of the control plane.

The reconcile logic (:mod:`streamtopo.controller.reconcile`) is written once against these protocols.
A :class:`Platform` turns a :class:`DesiredState` into running executors (Kubernetes pods in
:mod:`streamtopo.controller.kubernetes`, local processes in ``streamtopo.local.platform``); a
:class:`MetricsSource` turns the executors' exported counters into per-window rates
(:mod:`streamtopo.controller.prometheus` through PromQL, :mod:`streamtopo.controller.scrape` by reading
each executor's ``/metrics``). Both sides speak the metric names of notes/controller_api.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from streamtopo.contracts import ExecutorEntry, KeyGroupId, Metric, RoutingTable, total
from streamtopo.planner.capacity import Shortfall
from streamtopo.planner.cluster import Cluster
from streamtopo.planner.model import StreamTopology


@dataclass(frozen=True)
class DesiredState:
    """Everything a platform needs to run one topology: the spec, the routing table and its executors.

    The executor set is the routing table's (one source of truth): an executor exists exactly when the
    table names it, and ``draining`` executors keep running until their units have moved away.
    """

    topology: StreamTopology
    routing: RoutingTable
    memory: str | None = None
    """The SPL loop's state (:class:`~streamtopo.controller.adaptation_loop.LoopMemory` as JSON), stored with the
    routing table in one object: a decision and the state that follows from it are written together, so
    a restarted operator neither repeats nor forgets it."""
    capacity: Shortfall | None = None
    """The declared rates against the hosts' room, when planned (planner/capacity.py)."""

    @property
    def name(self) -> str:
        return self.topology.metadata.name

    @property
    def executors(self) -> Mapping[str, ExecutorEntry]:
        return self.routing.executors

    @property
    def running(self) -> Mapping[str, ExecutorEntry]:
        """The executors a platform runs now: none while suspended (the routing table keeps them, so a
        resume brings back the same executors with the same units)."""
        return {} if self.topology.spec.suspend else self.routing.executors


@runtime_checkable
class Platform(Protocol):
    """Runs executors. ``apply`` must be idempotent: applying the same state twice changes nothing."""

    executor_footprint: float | None
    """Cores an executor is known to take on its host when busy, where that exceeds its CPU request
    (planner/capacity.py); None where executors are held to their requests or nothing is known."""

    def hosts(self) -> Cluster: ...

    def apply(self, desired: DesiredState) -> None: ...

    def running_executors(self) -> dict[str, str | None]:
        """Executor name -> host it runs on (None while unscheduled)."""
        ...

    def failing_executors(self) -> dict[str, str]:
        """Executor name -> why it will not run by itself (a crash loop, an image that cannot be pulled,
        an eviction); starting or running executors are not listed."""
        ...

    def committed(self) -> dict[str, float]:
        """Host -> CPU cores that other pods (other topologies' executors, other workloads) request
        there: room a plan and the autoscaler leave them (planner/capacity.py)."""
        ...

    def state_client(self, topology: StreamTopology) -> Any | None:
        """A Valkey client with rights over ``topology``'s keys, for an upgrade's state reset
        (controller/upgrade.py), or None where this platform cannot reach the topology's transport."""
        ...


class MetricsUnavailable(RuntimeError):
    """No trustworthy measurement for this window: the loop must neither rebalance nor scale.

    ``reason`` is a CamelCase condition reason (``PrometheusUnreachable``, ``MetricsStale``,
    ``MetricsIncomplete``, ``WarmingUp``); the message says what is missing.
    """

    def __init__(self, reason: str, message: str):
        self.reason = reason
        super().__init__(message)


@dataclass(frozen=True)
class UnitRates:
    """One unit over the window. Rates are per second; ``busy`` is CPU cores (busy seconds per second)."""

    busy: float = 0.0
    records_in: float = 0.0
    records_out: float = 0.0
    state_bytes: float = 0.0
    backlog: float = 0.0
    oldest_age: float = 0.0
    executor: str | None = None

    @property
    def load(self) -> float:
        """ALBIC's gLoad: percent of one reference (1-core) executor."""
        return 100.0 * self.busy

    @property
    def true_rate(self) -> float:
        """Records per busy second (DS2's true processing rate); 0 when the unit was idle."""
        return self.records_in / self.busy if self.busy > 0 else 0.0


@dataclass(frozen=True)
class ExecutorRates:
    cpu: float = 0.0
    """CPU cores used (rate of cpu seconds)."""
    cpu_wait: float = 0.0
    """Cores' worth of its threads waiting for a CPU while runnable (run queue, throttling)."""
    memory_bytes: float = 0.0
    capacity_cores: float | None = None
    routing_version: int | None = None


@dataclass(frozen=True)
class RuntimeStats:
    """What a :class:`MetricsSource` measured for one topology over one statistics period."""

    topology: str
    window_seconds: float
    units: Mapping[KeyGroupId, UnitRates] = field(default_factory=dict)
    traffic: Mapping[tuple[KeyGroupId, KeyGroupId], float] = field(default_factory=dict)
    """Records per second from unit to unit (ALBIC's out[g_i][g_j])."""
    executors: Mapping[str, ExecutorRates] = field(default_factory=dict)


class MetricsSource(Protocol):
    def collect(self, topology: str, window_seconds: float) -> RuntimeStats:
        """Rates over the last ``window_seconds``; raises :class:`MetricsUnavailable`."""
        ...


# ----------------------------------------------------------------- from metric series to RuntimeStats

COUNTERS = {
    "busy": total(Metric.UNIT_BUSY),
    "records_in": total(Metric.UNIT_RECORDS_IN),
    "records_out": total(Metric.UNIT_RECORDS_OUT),
    "traffic": total(Metric.KG_RECORDS),
    "executor_cpu": total(Metric.EXECUTOR_CPU),
    "executor_cpu_wait": total(Metric.EXECUTOR_CPU_WAIT),
}
"""Counters the controller turns into per-second rates over the window."""
GAUGES = {
    "state_bytes": Metric.UNIT_STATE_BYTES,
    "backlog": Metric.UNIT_BACKLOG,
    "oldest_age": Metric.UNIT_OLDEST_AGE,
    "executor_memory": Metric.EXECUTOR_MEMORY,
    "executor_capacity": Metric.EXECUTOR_CAPACITY,
    "routing_version": Metric.ROUTING_VERSION,
}
"""Gauges read as their latest value."""

Series = Mapping[str, list[tuple[Mapping[str, str], float]]]
"""Metric name -> (labels, value) samples: rates for COUNTERS, latest values for GAUGES."""


def runtime_stats(topology: str, window_seconds: float, series: Series) -> RuntimeStats:
    """RuntimeStats from per-metric samples of one topology (both metric sources share this).

    During a hand-over a unit can be exported by its donor and its receiver: counter rates add up (each
    counted its own records), gauges take the larger value, and the unit belongs to the busier executor.
    Raises MetricsUnavailable when no unit reported busy time at all.
    """

    def samples(key: str) -> list[tuple[Mapping[str, str], float]]:
        name = COUNTERS.get(key) or GAUGES[key]
        return [
            (labels, value)
            for labels, value in series.get(name, ())
            if labels.get("topology", topology) == topology
        ]

    if not samples("busy"):
        raise MetricsUnavailable(
            "MetricsIncomplete", f"no {COUNTERS['busy']} series for topology {topology!r}"
        )
    units: dict[KeyGroupId, dict[str, float]] = {}
    busiest: dict[KeyGroupId, tuple[float, str | None]] = {}
    for key in ("busy", "records_in", "records_out", "state_bytes", "backlog", "oldest_age"):
        add = key in COUNTERS
        for labels, value in samples(key):
            unit = (labels["operator"], int(labels["kg"]))
            if key != "busy" and unit not in units:
                continue  # a unit is measured when it has a busy rate; gauges alone are not a window
            fields = units.setdefault(unit, {})
            fields[key] = fields.get(key, 0.0) + value if add else max(fields.get(key, 0.0), value)
            if key == "busy" and value >= busiest.get(unit, (-1.0, None))[0]:
                busiest[unit] = (value, labels.get("executor"))
    traffic: dict[tuple[KeyGroupId, KeyGroupId], float] = {}
    for labels, value in samples("traffic"):
        pair = (
            (labels["src_operator"], int(labels["src_kg"])),
            (labels["dst_operator"], int(labels["dst_kg"])),
        )
        traffic[pair] = traffic.get(pair, 0.0) + value
    executors: dict[str, dict[str, Any]] = {}
    for key, target in (
        ("executor_cpu", "cpu"),
        ("executor_cpu_wait", "cpu_wait"),
        ("executor_memory", "memory_bytes"),
        ("executor_capacity", "capacity_cores"),
        ("routing_version", "routing_version"),
    ):
        for labels, value in samples(key):
            executors.setdefault(labels["executor"], {})[target] = (
                int(value) if target == "routing_version" else value
            )
    return RuntimeStats(
        topology=topology,
        window_seconds=window_seconds,
        units={u: UnitRates(**f, executor=busiest.get(u, (0.0, None))[1]) for u, f in units.items()},
        traffic=traffic,
        executors={name: ExecutorRates(**fields) for name, fields in executors.items()},
    )
