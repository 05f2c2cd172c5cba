"""The operator library of the data plane: one class per operator kind (notes/runtime_api.md).

``build_operator(op, spec)`` is the only entry point the executor needs; every operator's
``process(spark, batch, states, watermarks)`` runs its record-level work through Spark.
"""

from __future__ import annotations

from collections.abc import Iterable

from streamtopo.planner.model import Operator, StreamTopologySpec
from streamtopo.runtime.operators.aggregate import AggregateOperator
from streamtopo.runtime.operators.base import OperatorError, OperatorResult, RecordError, UnitOperator
from streamtopo.runtime.operators.join import JoinOperator, combine_inputs, split_inputs
from streamtopo.runtime.operators.shared_panes import SharedPanes, sharing_groups
from streamtopo.runtime.operators.sink import SinkOperator
from streamtopo.runtime.operators.source import SourceOperator
from streamtopo.runtime.operators.stateless import FilterOperator, MapOperator
from streamtopo.runtime.operators.udf import UdfOperator

OPERATORS: dict[str, type[UnitOperator]] = {
    "source": SourceOperator,
    "map": MapOperator,
    "filter": FilterOperator,
    "aggregate": AggregateOperator,
    "join": JoinOperator,
    "udf": UdfOperator,
    "sink": SinkOperator,
}


def build_operator(op: Operator, spec: StreamTopologySpec, *, combine: bool | None = None) -> UnitOperator:
    """The unit operator for ``op``. ``combine`` forces (True/False) an aggregate's pane path instead of
    C-MR's cost rule (tests and benchmarks compare both)."""
    if op.kind == "aggregate":
        return AggregateOperator(op, spec, combine=combine)
    return OPERATORS[op.kind](op, spec)


def build_operators(spec: StreamTopologySpec, sharing: Iterable[SharedPanes] = ()) -> dict[str, UnitOperator]:
    """Every operator of ``spec``; the members of a ``sharing`` group keep their state per the group's
    pane (shared_panes.py), so every executor of a topology must build them with the same groups."""
    panes = {member: group.pane for group in sharing for member in group.members}
    return {
        op.name: AggregateOperator(op, spec, pane=panes[op.name])
        if op.name in panes
        else build_operator(op, spec)
        for op in spec.operators
    }


__all__ = [
    "OPERATORS",
    "AggregateOperator",
    "FilterOperator",
    "JoinOperator",
    "MapOperator",
    "OperatorError",
    "OperatorResult",
    "RecordError",
    "SharedPanes",
    "SinkOperator",
    "SourceOperator",
    "UdfOperator",
    "UnitOperator",
    "build_operator",
    "build_operators",
    "combine_inputs",
    "sharing_groups",
    "split_inputs",
]
