"""The state a rebalancer sees each statistics period, and the answer it gives.

Every runtime rebalancing policy (ALBIC, plain MILP, Flux, PoTC, COLA re-optimisation, the C-MR
latency model) reads an :class:`AllocationState` and returns a :class:`Rebalance`. The controller builds
the state from Prometheus metrics, the simulator from a scenario; neither knows which policy runs.

Vocabulary follows ALBIC (Madsen et al., ICDE 2017, Section 3): key groups ``g_k`` with load ``gLoad_k``
(a percentage of one executor's capacity, measured over the last SPL) and migration cost ``mc_k``,
executors ("nodes") with a capacity weight, and ``out[g_i][g_j]``, the records g_i sent to g_j.
A key group here is a *unit* of design.md: one (operator, key group) pair, identified by ``KeyGroupId``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from streamtopo.contracts import KeyGroupId


@dataclass(frozen=True)
class KeyGroupStats:
    """What one key group cost over the last period.

    ``load`` is CPU in percent of one reference executor (ALBIC's gLoad); ``memory`` is state bytes,
    which also drives the migration cost ``mc`` (moving state is what a migration costs).
    """

    id: KeyGroupId
    load: float
    memory: float = 0.0
    migration_cost: float = 1.0
    rate: float = 0.0
    """Records per second the key group processed (true rate, for the scaling policy)."""
    backlog: float = 0.0
    """Records waiting in its input streams at the end of the period."""
    output_rate: float = 0.0
    """Records per second it emitted (a source's: what the pipeline took in, against ``rate`` due)."""


@dataclass(frozen=True)
class ExecutorInfo:
    """An executor (ALBIC's node): capacity weight and where it runs.

    ``capacity`` is relative to the reference executor (1.0 = the executor gLoad is measured on);
    ALBIC multiplies a key group's load by 1/capacity on a heterogeneous node. ``memory_capacity`` bounds
    the state bytes it can hold (multi-resource extension). ``host`` and ``labels`` let host-level
    constraints (host co/ex-location, resource matching) be checked through the executor's host.
    """

    name: str
    capacity: float = 1.0
    memory_capacity: float | None = None
    host: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    marked_for_removal: bool = False
    """ALBIC's set B: the executor drains and receives no key group."""
    cpu_used: float | None = None
    """Cores it used over the period (its process tree), when measured."""
    cpu_wait: float = 0.0
    """Cores' worth of its threads waiting for a CPU while runnable (run queue, CPU throttling): with
    ``cpu_used``, how saturated its host was (planner/scaling/policy.py)."""


@dataclass(frozen=True)
class PlacementRules:
    """Topology constraints expressed on key groups (expanded from the spec's operator constraints).

    Pairs/groups are of operator names; a constraint between operators applies to their key groups:
    - ``pe_colocation``: the operators' key groups with the same index share an executor;
    - ``pe_exlocation``: no executor hosts key groups of both operators;
    - ``host_colocation`` / ``host_exlocation``: the same, through the executors' hosts;
    - ``allowed_hosts``: resource matching, operator -> hosts it may run on (absent = any);
    - ``ha_groups``: HA replica sets; replicas (lists of operator names) must not share an executor
      (nor a host, when hosts are known).
    """

    pe_colocation: list[tuple[str, str]] = field(default_factory=list)
    pe_exlocation: list[tuple[str, str]] = field(default_factory=list)
    host_colocation: list[tuple[str, str]] = field(default_factory=list)
    host_exlocation: list[tuple[str, str]] = field(default_factory=list)
    allowed_hosts: Mapping[str, frozenset[str]] = field(default_factory=dict)
    ha_groups: list[list[list[str]]] = field(default_factory=list)


@dataclass(frozen=True)
class AllocationState:
    """Input of a rebalancing round (one SPL)."""

    executors: list[ExecutorInfo]
    key_groups: list[KeyGroupStats]
    assignment: Mapping[KeyGroupId, str]
    """Current executor of every key group."""
    traffic: Mapping[tuple[KeyGroupId, KeyGroupId], float] = field(default_factory=dict)
    """out[g_i][g_j]: records per second from g_i to g_j over the period."""
    rules: PlacementRules = field(default_factory=PlacementRules)
    room: Mapping[str, float] | None = None
    """Host -> cores free for new executors (planner/capacity.py; negative where the executors there
    request more than the host has); None: no limit is known."""
    footprint: float | None = None
    """Cores an executor is known to take on its host when busy, where that exceeds its request (the
    platform's measured figure: ``streamtopo run``'s executors); None: its request."""


@dataclass(frozen=True)
class Rebalance:
    """Output of a rebalancing round: the new assignment and why."""

    assignment: dict[KeyGroupId, str]
    migrations: list[tuple[KeyGroupId, str, str]]
    """(key group, from executor, to executor) for every key group that moves."""
    load_distance: float
    """Max over executors not marked for removal of |load - mean| in percentage points (ALBIC Sec. 3)."""
    collocation_factor: float
    """Share of traffic that stays inside executors, 0..1."""
    solve_seconds: float = 0.0
    reason: str = ""
    details: dict[str, object] = field(default_factory=dict)
