"""Validation and indexing of an :class:`AllocationState`, shared by ALBIC and the baselines.

Every policy first calls :func:`index_state`, so bad statistics fail the same way everywhere: a
:class:`AllocationError` (a ``ValueError``) listing every problem with the field it concerns, never a
traceback from deep inside a solver. The controller turns it into a Degraded condition and keeps the
current allocation (the documented safe decision).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from streamtopo.contracts import KeyGroupId
from streamtopo.planner.allocation import AllocationState


class AllocationError(ValueError):
    """The statistics cannot be planned on; ``problems`` lists (field, message) pairs."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("invalid allocation state: " + "; ".join(f"{f}: {m}" for f, m in problems))


@dataclass(frozen=True)
class StateIndex:
    """Arrays over executors (nodes, index i) and key groups (index k) of one state."""

    names: list[str]
    kg_ids: list[KeyGroupId]
    node: dict[str, int]
    kg: dict[KeyGroupId, int]
    capacity: np.ndarray
    memory_capacity: np.ndarray
    """inf where unknown."""
    marked: np.ndarray
    """ALBIC's set B as a boolean mask."""
    load: np.ndarray
    memory: np.ndarray
    mc: np.ndarray
    rate: np.ndarray
    current: np.ndarray
    """Executor index of every key group in the current allocation."""

    @property
    def active(self) -> np.ndarray:
        return ~self.marked


def _finite_nonneg(value: float) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value >= 0


def index_state(state: AllocationState) -> StateIndex:
    """Check the state and build its arrays; raise :class:`AllocationError` naming every problem."""
    problems: list[tuple[str, str]] = []
    names = [e.name for e in state.executors]
    if not names:
        problems.append(("executors", "no executor"))
    if len(set(names)) != len(names):
        problems.append(("executors", "duplicate executor names"))
    for e in state.executors:
        if not (_finite_nonneg(e.capacity) and e.capacity > 0):
            problems.append(
                (f"executors[{e.name}].capacity", f"must be a positive number, got {e.capacity!r}")
            )
        if e.memory_capacity is not None and not _finite_nonneg(e.memory_capacity):
            problems.append(
                (f"executors[{e.name}].memory_capacity", f"must be >= 0, got {e.memory_capacity!r}")
            )
    if names and all(e.marked_for_removal for e in state.executors):
        problems.append(("executors", "every executor is marked for removal; nothing can receive key groups"))
    ids = [kg.id for kg in state.key_groups]
    if len(set(ids)) != len(ids):
        problems.append(("key_groups", "duplicate key-group ids"))
    known = set(names)
    for kg in state.key_groups:
        for fld in ("load", "memory", "migration_cost", "rate"):
            if not _finite_nonneg(getattr(kg, fld)):
                problems.append(
                    (f"key_groups[{kg.id}].{fld}", f"must be a finite number >= 0, got {getattr(kg, fld)!r}")
                )
        where = state.assignment.get(kg.id)
        if where is None:
            problems.append((f"assignment[{kg.id}]", "key group has no executor"))
        elif where not in known:
            problems.append((f"assignment[{kg.id}]", f"unknown executor {where!r}"))
    extra = set(state.assignment) - set(ids)
    for kg_id in sorted(extra, key=str)[:5]:
        problems.append((f"assignment[{kg_id}]", "key group has no statistics"))
    idset = set(ids)
    for (src, dst), value in state.traffic.items():
        if src not in idset or dst not in idset:
            problems.append((f"traffic[{src}->{dst}]", "refers to an unknown key group"))
        elif not _finite_nonneg(value):
            problems.append((f"traffic[{src}->{dst}]", f"must be a finite number >= 0, got {value!r}"))
    if problems:
        raise AllocationError(problems)

    node = {n: i for i, n in enumerate(names)}
    return StateIndex(
        names=names,
        kg_ids=ids,
        node=node,
        kg={k: i for i, k in enumerate(ids)},
        capacity=np.array([e.capacity for e in state.executors], dtype=float),
        memory_capacity=np.array(
            [np.inf if e.memory_capacity is None else e.memory_capacity for e in state.executors], dtype=float
        ),
        marked=np.array([e.marked_for_removal for e in state.executors], dtype=bool),
        load=np.array([kg.load for kg in state.key_groups], dtype=float),
        memory=np.array([kg.memory for kg in state.key_groups], dtype=float),
        mc=np.array([kg.migration_cost for kg in state.key_groups], dtype=float),
        rate=np.array([kg.rate for kg in state.key_groups], dtype=float),
        current=np.array([node[state.assignment[k]] for k in ids], dtype=int),
    )


def check_budget(max_migrations: int | None, max_migration_cost: float | None) -> None:
    """Reject negative or NaN migration bounds (a common caller slip)."""
    problems = []
    if max_migrations is not None and (not isinstance(max_migrations, int) or max_migrations < 0):
        problems.append(("max_migrations", f"must be an integer >= 0, got {max_migrations!r}"))
    if max_migration_cost is not None and not _finite_nonneg(max_migration_cost):
        problems.append(("max_migration_cost", f"must be a finite number >= 0, got {max_migration_cost!r}"))
    if problems:
        raise AllocationError(problems)
