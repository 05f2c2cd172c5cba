"""Where executors fit: hosts' CPU, what is already requested there, and what a plan or scaling asks for.

Every platform is a cluster of hosts with CPU (``planner.cluster``): the nodes' allocatable CPU on
Kubernetes, this machine's cores in ``streamtopo run``. An executor requests cores on one host; a host's
*room* is its CPU less what other pods (other topologies, other workloads) and this topology's own
executors request there. Executors are placed only into room, as the Kubernetes scheduler would place
their pods, so the planner never plans a pod that would stay Pending, nor starts a local process on a
host whose cores are all taken. What does not fit is a :class:`Shortfall`: the executors and cores the
load needs beyond the room, and the records per second demanded against those carried, which the
controller reports (the CapacityExhausted condition and Event, the run summary) instead of papering it
over with executors that cannot run. The split is the one Flink's autoscaler keeps with a cluster
autoscaler: the job asks only for what can be scheduled, and says what more it would need.

Pure: hosts, requests and room in, placements and figures out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from streamtopo.planner.cluster import MIN_EXECUTOR_CPU, Cluster

EPS = 1e-6
"""Cores: a request fits when it exceeds the room by less than this (float noise of summed requests)."""


def free_cores(
    cluster: Cluster,
    own: Iterable[tuple[str | None, float]] = (),
    committed: Mapping[str, float] | None = None,
    *,
    clamp: bool = True,
) -> dict[str, float]:
    """Host -> cores left for new executors: its CPU less ``committed`` (other pods' requests there) and
    less ``own`` (host, cores) requests of this topology's executors. Negative when more is requested
    there than the host has (an over-occupied host), unless ``clamp``."""
    room = {h.name: h.cpu - (committed or {}).get(h.name, 0.0) for h in cluster.hosts}
    for host, cpu in own:
        if host in room:
            room[host] -= cpu
    return {h: max(0.0, c) for h, c in room.items()} if clamp else room


def fits(cpu: float, room: float) -> bool:
    return cpu <= room + EPS


def over_occupied(host: str | None, room: Mapping[str, float]) -> bool:
    """More is requested on ``host`` than it has (its room is negative)."""
    return host is not None and room.get(host, 0.0) < -EPS


def booked_room(
    room: Mapping[str, float], executors: Iterable[tuple[str | None, float, float | None]]
) -> dict[str, float]:
    """``room`` (host -> cores no request holds) less what running executors use beyond their requests.

    An executor is a JVM and a Python driver with no CPU limit (a burstable pod; a local process): busy,
    it takes more than the cores it requests (Spark's task core, plus the JVM's compiler and GC threads
    and the driver's own work). The scheduler books requests; what decides whether another executor
    *runs* is what is used. ``executors`` are (host, request, cores used, or None before a measurement).
    """
    left = dict(room)
    for host, request, used in executors:
        if host in left and used is not None and used > request:
            left[host] -= used - request
    return left


def footprint(request: float, used: Iterable[float]) -> float:
    """Cores a new executor is expected to take on its host: the running executors' mean CPU used,
    never less than its ``request`` (a floor that also stands for what a saturated host did not give
    them; their waiting is not added, since a JVM's threads, runnable together, would overstate it)."""
    values = [d for d in used if d > 0]
    return max(request, sum(values) / len(values)) if values else request


def placeable(cpu: float, room: Mapping[str, float]) -> int:
    """How many executors of ``cpu`` cores the room takes (each on one host)."""
    if cpu <= 0:
        raise ValueError(f"executor cpu must be > 0, got {cpu}")
    return sum(math.floor((max(0.0, free) + EPS) / cpu) for free in room.values())


def place(
    requests: Sequence[float], room: Mapping[str, float], prefer: Sequence[str | None] | None = None
) -> tuple[list[str | None], dict[str, float]]:
    """A host for each request in order, and the room left: its preferred host (a PE's) when the request
    fits there, else the host with the most room that fits it (spreading, as the Kubernetes scheduler's
    default scoring does), else None (it would stay Pending)."""
    left = dict(room)
    hosts: list[str | None] = []
    for i, cpu in enumerate(requests):
        wanted = prefer[i] if prefer is not None else None
        if wanted is not None and fits(cpu, left.get(wanted, 0.0)):
            host: str | None = wanted
        else:
            candidates = [h for h, free in left.items() if fits(cpu, free)]
            host = max(candidates, key=lambda h: (left[h], h)) if candidates else None
        if host is not None:
            left[host] = max(0.0, left[host] - cpu)
        hosts.append(host)
    return hosts, left


@dataclass(frozen=True)
class Shortfall:
    """What the load needs beyond what can be placed.

    ``executors_wanted`` of ``executor_cpu`` cores each are what the load needs (Aeolus' count from the
    declared rates at plan time, the scaling rule's count from measured rates in the loop);
    ``executors_placed`` is how many the hosts take. ``demand`` is the CPU the load needs (cores of
    work), ``available`` the cores this topology holds or can still place. ``rate_demanded`` is the
    records per second arriving at the sources, ``rate_carried`` what the pipeline takes in (measured,
    or at plan time the demanded rate scaled by the cores that can be placed over the cores needed).
    """

    executors_wanted: int
    executors_placed: int
    executor_cpu: float
    demand: float
    available: float
    rate_demanded: float
    rate_carried: float
    measured: bool = False
    """From the loop's measurements (True) or from the declared rates and costs (False)."""

    @property
    def pending(self) -> int:
        """Executors the load needs that no host has room for (on Kubernetes, pods that would stay Pending)."""
        return max(0, self.executors_wanted - self.executors_placed)

    @property
    def cores_missing(self) -> float:
        """Cores a cluster autoscaler would have to add: the pending executors' requests."""
        return self.pending * self.executor_cpu

    @property
    def exhausted(self) -> bool:
        return self.pending > 0

    def message(self) -> str:
        source = "measured" if self.measured else "declared"
        return (
            f"the {source} rates need {self.demand:.2f} cores of work, {self.executors_wanted} executors of "
            f"{self.executor_cpu:.3g} core{'' if self.executor_cpu == 1 else 's'}; the hosts have room for "
            f"{self.executors_placed} "
            f"({self.available:.2f} cores): {self.pending} pending, {self.cores_missing:.2f} cores missing; "
            f"{_rate(self.rate_demanded)} records/s demanded, {_rate(self.rate_carried)} carried"
        )

    def status(self) -> dict[str, float | int | bool]:
        """The ``status.capacity`` fields (camelCase, planner.status.CapacitySummary)."""
        return {
            "executorsWanted": self.executors_wanted,
            "executorsPlaced": self.executors_placed,
            "pendingExecutors": self.pending,
            "executorCpu": round(self.executor_cpu, 4),
            "coresNeeded": round(self.demand, 4),
            "coresAvailable": round(self.available, 4),
            "coresMissing": round(self.cores_missing, 4),
            "recordsDemanded": round(self.rate_demanded, 2),
            "recordsCarried": round(self.rate_carried, 2),
            "measured": self.measured,
        }


def planned_shortfall(
    wanted: int, placed: int, executor_cpu: float, demand: float, available: float, rate: float
) -> Shortfall:
    """The plan-time figures: what the declared rates (``rate`` records/s at the sources, ``demand``
    cores) need against the ``placed`` executors; the carried rate assumes the placed cores run at full
    utilisation, an upper bound."""
    capacity = placed * executor_cpu
    carried = rate if demand <= capacity or demand <= 0 else rate * capacity / demand
    return Shortfall(wanted, placed, executor_cpu, demand, available, rate, carried)


def request_cpu(size: float) -> float:
    """An executor's CPU request for ``size`` cores of work: rounded up to a tenth of a core, at least
    :data:`~streamtopo.planner.cluster.MIN_EXECUTOR_CPU`."""
    return max(MIN_EXECUTOR_CPU, math.ceil(size * 10 - 1e-9) / 10)


def _rate(value: float) -> str:
    return f"{value / 1000:,.1f}k" if value >= 1000 else f"{value:,.0f}"
