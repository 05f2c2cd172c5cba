"""What the operator reports about a StreamTopology: its status subresource, as pydantic models.

The CRD's status schema is generated from :class:`StreamTopologyStatus` (controller/crd.py), so a field
the operator writes and the schema the API server prunes by cannot drift apart.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field
from pydantic.alias_generators import to_camel

from streamtopo.planner.model import Model


class Condition(Model):
    """A condition as the Kubernetes API conventions define it."""

    type: Literal["Planned", "Ready", "Progressing", "Rebalancing", "Scaling", "Degraded"]
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""
    last_transition_time: str
    observed_generation: int | None = None


class PESummary(Model):
    name: str
    operators: list[str]
    host: str | None = None
    size: float
    """CPU cores: operator costs inside plus communication cost of its cut edges (COLA's SIZE)."""


class RebalanceSummary(Model):
    time: str
    migrations: int
    load_distance: float
    collocation_factor: float


class RecommendationSummary(Model):
    """The last decision computed in Recommend mode: what it would change, and whether it was applied."""

    id: str
    """Approve it with ``kubectl annotate stopo NAME streamtopo.dev/approve=<id>``."""
    time: str
    routing_version: int
    """The routing version it applies to; a decision for an older one is stale and is not applied."""
    migrations: int
    executors_before: int
    executors_after: int
    load_distance: float
    reason: str
    approved: bool = False


class UpgradeSummary(Model):
    """The last spec change that reached the executors (docs/operator.md, "Spec changes")."""

    time: str
    mode: Literal["keepState", "resetState"]
    reset: list[str] = Field(default_factory=list)
    """Operators that started from empty state."""
    removed: list[str] = Field(default_factory=list)
    dropped_records: int = 0
    """Records in flight to a reset or removed operator that were prepared for its old layout."""
    skipped_records: int = 0
    """Generator records a changed key-group count skipped (none is generated twice)."""
    skipped_entries: int = 0
    """Stream entries a stream source's lagging key groups skipped (at most)."""
    message: str = ""


class SharingStatus(Model):
    """Where sharing stands (``spec.sharing``, docs/sharing.md)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)
    shared_topology: str | None = None
    """A consumer: the managed shared topology it reads from."""
    reads: list[str] = Field(default_factory=list)
    """A consumer: the shared streams its executors read in place of the operators the shared topology
    runs for it."""
    consumers: list[str] = Field(default_factory=list)
    """A shared topology: the topologies that read it (its owners); it is deleted with the last."""


class StreamTopologyStatus(Model):
    """What the operator reports; computed state (routing) lives in the owned ConfigMap instead."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="ignore",
        frozen=True,
        use_attribute_docstrings=True,
    )
    observed_generation: int | None = None
    phase: Literal["Pending", "Planned", "Running", "Degraded", "Failed", "Suspended"] | None = None
    conditions: list[Condition] = Field(default_factory=list)
    executors: int | None = None
    """Executors in the routing table (the scale subresource's replicas)."""
    selector: str | None = None
    """Label selector of the executor pods (the scale subresource's, for an HPA)."""
    max_utilization: float | None = None
    """COLA's U: the largest host utilisation of the plan."""
    communication_cost: float | None = None
    """COLA's C: total cost of the streams that cross PEs."""
    load_distance: float | None = None
    pes: list[PESummary] = Field(default_factory=list)
    last_rebalance: RebalanceSummary | None = None
    recommendation: RecommendationSummary | None = None
    routing_version: int | None = None
    routing_config_map: str | None = None
    sharing: SharingStatus | None = None
    last_upgrade: UpgradeSummary | None = None
