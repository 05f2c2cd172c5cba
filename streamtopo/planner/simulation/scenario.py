"""The scenario file of ``streamtopo simulate``: a job, a workload over time, costs and scaling bounds.

A scenario is plain data validated by pydantic (camelCase or snake_case keys, unknown keys refused);
:func:`load_scenario` adds the cross-field checks and raises :class:`ScenarioError` naming every
offending field, as ``parse_topology`` does for topologies. Parsing the YAML file is the CLI's job
(the planner does no I/O). Fields, units and defaults are documented in docs/simulate.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import networkx as nx
from pydantic import Field, ValidationError, model_validator

from streamtopo.planner.model import AlbicSpec, Duration, Model, RebalancePolicy, ScalingRuleSpec, problems_of

Pattern = Literal["one-to-one", "forward", "full"]


class ScenarioError(ValueError):
    """A scenario that cannot be simulated; ``problems`` lists (field path, message) pairs."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("\n".join(f"{path}: {message}" for path, message in problems))


class ExecutorsSpec(Model):
    """The executors at period 0."""

    initial: int = Field(default=4, ge=1, le=1000)
    capacity: float = Field(default=1.0, gt=0)
    """Cores of every executor (1.0 = the reference executor loads are percentages of)."""
    capacities: list[float] | None = None
    """Per-executor cores for a heterogeneous start (length = initial); new executors get ``capacity``."""
    placement: Literal["random", "round-robin"] = "random"
    """Initial key-group allocation: a seeded random even split, or key group i on executor i mod E."""
    footprint: float | None = Field(default=None, gt=0)
    """Host cores an executor takes per ``capacity`` of work, busy (with ``hosts``): ``streamtopo run``'s
    executors, a JVM and a Python driver with one Spark core, take 1.6 (planner/capacity.py); None:
    its capacity (a container held to its request)."""

    @model_validator(mode="after")
    def _capacities(self) -> ExecutorsSpec:
        if self.capacities is not None:
            if len(self.capacities) != self.initial:
                raise ValueError(
                    f"capacities lists {len(self.capacities)} executors but initial is {self.initial}"
                )
            if any(not c > 0 for c in self.capacities):
                raise ValueError("every capacity must be > 0")
        return self


class OperatorSpec(Model):
    """One operator: its key groups, its inputs and what a record costs."""

    name: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9_-]*$")
    key_groups: int = Field(default=8, ge=1, le=4096)
    inputs: list[str] = Field(default_factory=list)
    """Upstream operators; none for a source."""
    pattern: Pattern = "full"
    """How upstream key groups send to this operator's: one-to-one (same K), forward (i -> i mod K), full."""
    cost_per_record: float = Field(default=20e-6, ge=0)
    """CPU seconds per input record."""
    selectivity: float = Field(default=1.0, ge=0)
    """Output records per input record."""
    state_bytes: float = Field(default=1e6, ge=0)
    """State per key group (drives migration cost and pause)."""


class DiurnalSpec(Model):
    """A daily cycle: rate x (1 + amplitude * sin(2 pi (t - phase) / period))."""

    period: Duration = 86400.0
    amplitude: float = Field(default=0.5, ge=0, lt=1)
    phase: Duration = 0.0


class SpikeSpec(Model):
    """A burst: the named source key groups (all when absent) send ``factor`` x for ``duration`` periods."""

    at: int = Field(ge=0)
    duration: int = Field(default=1, ge=1)
    factor: float = Field(default=3.0, gt=0)
    key_groups: list[int] | None = None


class StepSpec(Model):
    """From period ``at`` on, each source's rate is ``rate``."""

    at: int = Field(ge=0)
    rate: float = Field(gt=0)


class WorkloadSpec(Model):
    """Records per second into the sources, over key groups and time."""

    rate: float = Field(default=10000.0, gt=0)
    """Records/s into each source operator at period 0, spread over its key groups."""
    skew: float = Field(default=0.0, ge=0)
    """Zipf exponent of the share of each source key group (0: uniform)."""
    noise: float = Field(default=0.0, ge=0, lt=1)
    """Relative Gaussian noise per key group and period (seeded)."""
    diurnal: DiurnalSpec | None = None
    spikes: list[SpikeSpec] = Field(default_factory=list)
    steps: list[StepSpec] = Field(default_factory=list)


class CostsSpec(Model):
    """What crossing executors costs (ALBIC: serialisation and deserialisation load CPU)."""

    serialization_per_record: float = Field(default=10e-6, ge=0)
    """CPU seconds per record crossing executors, charged to the sender and again to the receiver."""


class MigrationSpec(Model):
    """Migration bounds per round and the pause a moved key group suffers."""

    max_migrations: int | None = Field(default=10, ge=0)
    max_migration_cost: float | None = Field(default=None, ge=0)
    """Bound on the summed state bytes moved per round (ALBIC's maxMigrCost with mc_k = state bytes)."""
    pause_seconds: float = Field(default=0.5, ge=0)
    """Fixed pause of a moved key group (stop at a batch boundary, commit, resume)."""
    bytes_per_second: float = Field(default=50e6, gt=0)
    """State transfer speed: the pause grows by state_bytes / bytes_per_second."""


class HostsSpec(Model):
    """The hosts executors run on (the platform's cluster): room for new executors, and contention when
    more executors run on a host than its cores carry."""

    count: int = Field(default=1, ge=1, le=1000)
    cpu: float = Field(gt=0, allow_inf_nan=False)
    """Cores per host (hosts are named host-1 .. host-N)."""
    contention: float = Field(default=0.05, ge=0, lt=1)
    """Share of a host's cores lost to switching for every executor beyond its cores (processes and
    their JVMs' threads fighting over the same cores)."""


class FaultSpec(Model):
    """A statistics gap injected at one period, to see the safe decision at work."""

    at: int = Field(ge=0)
    kind: Literal["missing-key-group", "nan-load", "zero-capacity"]


class Scenario(Model):
    """A whole simulation."""

    name: str = "scenario"
    description: str = ""
    periods: int = Field(default=60, ge=1, le=100000)
    interval: Duration = 60.0
    """SPL: seconds per period."""
    seed: int = 0
    policy: RebalancePolicy = "albic"
    """Default rebalancing policy (``--policy`` overrides)."""
    executors: ExecutorsSpec = Field(default_factory=ExecutorsSpec)
    operators: list[OperatorSpec] = Field(min_length=1)
    workload: WorkloadSpec = Field(default_factory=WorkloadSpec)
    costs: CostsSpec = Field(default_factory=CostsSpec)
    migration: MigrationSpec = Field(default_factory=MigrationSpec)
    scaling: ScalingRuleSpec = Field(default_factory=ScalingRuleSpec)
    albic: AlbicSpec = Field(default_factory=AlbicSpec)
    """ALBIC's Algorithm 2 parameters (``--policy albic``); maxLoadDistance also guards scale-down."""
    faults: list[FaultSpec] = Field(default_factory=list)
    hosts: HostsSpec | None = None
    """Without hosts, executors run on hosts of unlimited room and never contend."""

    def by_name(self) -> dict[str, OperatorSpec]:
        return {op.name: op for op in self.operators}

    def order(self) -> list[str]:
        """Operators from sources to sinks."""
        dag = nx.DiGraph()
        dag.add_nodes_from(op.name for op in self.operators)
        dag.add_edges_from((u, op.name) for op in self.operators for u in op.inputs)
        return list(nx.topological_sort(dag))


def check_scenario(scenario: Scenario) -> list[tuple[str, str]]:
    """Cross-field problems: names, inputs, cycles, patterns, spikes and the executor bounds."""
    problems: list[tuple[str, str]] = []
    seen: dict[str, int] = {}
    for i, op in enumerate(scenario.operators):
        if op.name in seen:
            problems.append((f"operators[{i}].name", f"duplicate operator name {op.name!r}"))
        seen.setdefault(op.name, i)
    by_name = scenario.by_name()
    dag = nx.DiGraph()
    for i, op in enumerate(scenario.operators):
        for j, upstream in enumerate(op.inputs):
            if upstream not in seen:
                problems.append((f"operators[{i}].inputs[{j}]", f"unknown operator {upstream!r}"))
                continue
            dag.add_edge(upstream, op.name)
            if op.pattern == "one-to-one" and by_name[upstream].key_groups != op.key_groups:
                problems.append(
                    (
                        f"operators[{i}].pattern",
                        (
                            f"one-to-one needs as many key groups as "
                            f"{upstream!r} ({by_name[upstream].key_groups}), got {op.key_groups}"
                        ),
                    )
                )
    if dag.number_of_nodes() and not nx.is_directed_acyclic_graph(dag):
        cycle = " -> ".join(u for u, _ in nx.find_cycle(dag))
        problems.append(("operators", f"cycle: {cycle}"))
    source_kgs = min((op.key_groups for op in scenario.operators if not op.inputs), default=0)
    for i, spike in enumerate(scenario.workload.spikes):
        for j, kg in enumerate(spike.key_groups or []):
            if not 0 <= kg < source_kgs:
                problems.append(
                    (
                        f"workload.spikes[{i}].keyGroups[{j}]",
                        f"key group {kg} does not exist (sources have {source_kgs})",
                    )
                )
    if not scenario.scaling.min_executors <= scenario.executors.initial <= scenario.scaling.max_executors:
        problems.append(
            (
                "executors.initial",
                (
                    f"{scenario.executors.initial} is outside scaling.minExecutors.."
                    f"maxExecutors ({scenario.scaling.min_executors}..{scenario.scaling.max_executors})"
                ),
            )
        )
    for i, fault in enumerate(scenario.faults):
        if fault.at >= scenario.periods:
            problems.append((f"faults[{i}].at", f"period {fault.at} is beyond periods ({scenario.periods})"))
    return problems


def load_scenario(data: Any) -> Scenario:
    """Validate a parsed scenario document; raise :class:`ScenarioError` naming every offending field."""
    if not isinstance(data, Mapping):
        raise ScenarioError([("(document)", "expected a mapping with at least `operators`")])
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as error:
        raise ScenarioError(problems_of(error)) from None
    problems = check_scenario(scenario)
    if problems:
        raise ScenarioError(problems)
    return scenario
