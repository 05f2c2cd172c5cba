"""The routing table: which executor runs each unit, versioned, shared by controller and executors.

The controller writes it (a ConfigMap on Kubernetes, a file in ``streamtopo run``); every executor
watches it. A key group moves when a new version assigns its unit elsewhere: the donor sees that it
no longer owns the unit, finishes its batch, commits and releases; the receiver sees that it now owns
it and resumes from the commit. ``version`` only grows, so an executor never acts on an older table.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

from streamtopo.planner.allocation import KeyGroupId


def unit_key(unit: KeyGroupId) -> str:
    """``operator/kg``: a unit as a JSON object key and a label value."""
    return f"{unit[0]}/{unit[1]}"


def parse_unit(key: str) -> KeyGroupId:
    operator, _, kg = key.rpartition("/")
    return operator, int(kg)


def executor_prefix(topology: str) -> str:
    """What every executor name of ``topology`` starts with: ``<topology>-e``, then the index.

    The one naming scheme of the plan, the logs, the live view and Kubernetes (pod names): the local run
    and the operator name executors alike, and a restarted operator finds its own pods by name.
    """
    return f"{topology}-e"


def executor_name(topology: str, index: int) -> str:
    """Executor ``index`` of ``topology`` (:func:`executor_prefix`)."""
    return f"{executor_prefix(topology)}{index}"


def executor_index(topology: str, name: str) -> int | None:
    """The index of an executor of ``topology``, None for a name outside the scheme."""
    tail = name.removeprefix(executor_prefix(topology))
    return int(tail) if tail != name and tail.isdigit() else None


class ExecutorEntry(BaseModel):
    """One executor of the table: where it runs and how big it is."""

    model_config = ConfigDict(frozen=True)
    host: str | None = None
    cpu: float = 1.0
    draining: bool = False
    """Marked for removal (ALBIC's B): owns units until they have moved away, then it is terminated."""


class RoutingTable(BaseModel):
    """unit -> executor, the executors, and the batch size of every stream, at one version."""

    model_config = ConfigDict(frozen=True)
    topology: str
    version: int = Field(ge=0)
    executors: dict[str, ExecutorEntry]
    units: dict[str, str]
    """``operator/kg`` -> executor name."""
    batch_sizes: dict[str, int] = Field(default_factory=dict)
    """``from->to`` -> records per transport entry (Aeolus)."""

    def owner(self, unit: KeyGroupId) -> str:
        return self.units[unit_key(unit)]

    def units_of(self, executor: str) -> list[KeyGroupId]:
        return sorted(parse_unit(k) for k, e in self.units.items() if e == executor)

    def assignment(self) -> dict[KeyGroupId, str]:
        return {parse_unit(k): e for k, e in self.units.items()}

    def moved(self, assignment: Mapping[KeyGroupId, str], executors: Mapping[str, ExecutorEntry] | None = None,
              batch_sizes: Mapping[str, int] | None = None) -> RoutingTable:
        """The next version with a new assignment (and executor set / batch sizes when given)."""
        return RoutingTable(
            topology=self.topology,
            version=self.version + 1,
            executors=dict(executors if executors is not None else self.executors),
            units={unit_key(u): e for u, e in sorted(assignment.items())},
            batch_sizes=dict(batch_sizes if batch_sizes is not None else self.batch_sizes),
        )

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, indent=1)

    @classmethod
    def from_json(cls, text: str) -> RoutingTable:
        return cls.model_validate_json(text)
