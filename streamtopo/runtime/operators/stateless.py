"""Map and filter: Spark SQL expressions applied record by record.

Both keep the reserved columns: a record's key group (``_kg``) and event time (``_ts``) pass through
unless a map's select list defines them itself (``"ts_col AS _ts"`` re-timestamps a stream). A map whose
select list defines a name twice (``"*", "price * 2 AS price"``) keeps the last definition, so ``*``
followed by overrides works as users expect.

A lazy Spark input gives a lazy Spark output: records the executor generated or received in the JVM stay
there until a stateful operator or a transport needs them. Analysis errors (a bad expression) are raised
at once as :class:`OperatorError`; runtime failures of lazy records surface where the frame is computed,
and the executor redoes that step eagerly (pandas between operators), where :func:`guarded` isolates the
offending records. A pandas input is processed eagerly, with numpy where Spark's resolved expression
allows (numpy_eval.py), since a Spark job costs tens of milliseconds however few the records.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame as SparkFrame
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from streamtopo.planner.expressions import KG, ExpressionError, makes_rows, parse_expression
from streamtopo.planner.model import Operator, StreamTopologySpec
from streamtopo.runtime.operators.base import (
    RESERVED,
    Batch,
    OperatorResult,
    UnitOperator,
    ensure_reserved,
    guarded,
    is_spark,
    lazily,
)
from streamtopo.runtime.operators.numpy_eval import Evaluator


class MapOperator(UnitOperator):
    lazy_input = True

    def __init__(self, op: Operator, spec: StreamTopologySpec):
        super().__init__(op, spec)
        assert op.select is not None  # a map has its select list (the model's validator)
        self.select = op.select
        self.evaluate = Evaluator(self._select, op.name, "select")
        self.keeps_count = _keeps_count(op.select)

    def process(
        self, spark: SparkSession, batch: Batch, states: dict[int, Any], watermarks: dict[int, float]
    ) -> OperatorResult:
        if is_spark(batch):
            return OperatorResult(lazily(self.name, "select", lambda: self._select(batch), batch))
        if not len(batch):  # only a punctuation came: nothing to select from (and maybe no columns)
            return OperatorResult(batch)
        batch = ensure_reserved(batch, self.name)
        return OperatorResult(guarded(self.name, "select", lambda b: self.evaluate.run(spark, b), batch))

    def _select(self, frame: SparkFrame) -> SparkFrame:
        carried = [f"{c} AS __carry{c}" for c in RESERVED]
        frame = frame.selectExpr(*self.select, *carried)
        names = [n.removeprefix("__carry") if n.startswith("__carry") else n for n in frame.columns]
        # A name defined twice ("*, _ts + 60 AS _ts"): the last user definition wins, the carried
        # reserved column only when the user defines none.
        last = {name: i for i, name in enumerate(names) if not frame.columns[i].startswith("__carry")}
        for i, name in enumerate(names):
            last.setdefault(name, i)
        keep = sorted(last.values())
        return frame.toDF(*[f"__c{i}" for i in range(len(names))]).select(
            *[F.col(f"__c{i}").alias(names[i]) for i in keep]
        )


def _keeps_count(select: list[str]) -> bool:
    """Whether a select list gives one record per record of the same key group: no generator, and
    ``_kg`` not redefined (a lazy output's size is then known without a Spark job). A list the door
    refuses (an operator built past the model's validator) is not: Spark's plan guard refuses it when it
    runs, with the operator's error."""
    try:
        items = [parse_expression(text, "select") for text in select]
    except ExpressionError:
        return False
    return not any(makes_rows(item) or item.name == KG for item in items)


class FilterOperator(UnitOperator):
    lazy_input = True

    def __init__(self, op: Operator, spec: StreamTopologySpec):
        super().__init__(op, spec)
        assert op.expr is not None  # a filter has its expression (the model's validator)
        self.expr = op.expr
        self.evaluate = Evaluator(lambda frame: frame.filter(self.expr), op.name, "expr")

    def process(
        self, spark: SparkSession, batch: Batch, states: dict[int, Any], watermarks: dict[int, float]
    ) -> OperatorResult:
        if is_spark(batch):
            return OperatorResult(lazily(self.name, "expr", lambda: batch.filter(self.expr), batch))
        if not len(batch):
            return OperatorResult(batch)
        batch = ensure_reserved(batch, self.name)
        return OperatorResult(guarded(self.name, "expr", lambda b: self.evaluate.run(spark, b), batch))
