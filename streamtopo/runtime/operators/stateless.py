"""Map and filter: Spark SQL expressions applied record by record.

Both keep the reserved columns: a record's key group (``_kg``) and event time (``_ts``) pass through
unless a map's select list defines them itself (``"ts_col AS _ts"`` re-timestamps a stream). A map whose
select list defines a name twice (``"*", "price * 2 AS price"``) keeps the last definition, so ``*``
followed by overrides works as users expect.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from streamtopo.runtime.operators.base import (
    RESERVED,
    OperatorResult,
    UnitOperator,
    ensure_reserved,
    guarded,
    to_pandas,
    to_spark,
)


class MapOperator(UnitOperator):
    def process(self, spark: SparkSession, batch: pd.DataFrame, states: dict[int, Any],
                watermarks: dict[int, float]) -> OperatorResult:
        batch = ensure_reserved(batch, self.name)
        return OperatorResult(guarded(self.name, "select", lambda b: self._select(spark, b), batch))

    def _select(self, spark: SparkSession, batch: pd.DataFrame) -> pd.DataFrame:
        carried = [f"{c} AS __carry{c}" for c in RESERVED]
        frame = to_spark(spark, batch).selectExpr(*self.op.select, *carried)
        names = [n.removeprefix("__carry") if n.startswith("__carry") else n for n in frame.columns]
        # A name defined twice ("*, _ts + 60 AS _ts"): the last user definition wins, the carried
        # reserved column only when the user defines none.
        last = {name: i for i, name in enumerate(names) if not frame.columns[i].startswith("__carry")}
        for i, name in enumerate(names):
            last.setdefault(name, i)
        keep = sorted(last.values())
        frame = frame.toDF(*[f"__c{i}" for i in range(len(names))]).select(
            *[F.col(f"__c{i}").alias(names[i]) for i in keep])
        return to_pandas(frame)


class FilterOperator(UnitOperator):
    def process(self, spark: SparkSession, batch: pd.DataFrame, states: dict[int, Any],
                watermarks: dict[int, float]) -> OperatorResult:
        batch = ensure_reserved(batch, self.name)
        return OperatorResult(
            guarded(self.name, "expr", lambda b: to_pandas(to_spark(spark, b).filter(self.op.expr)), batch)
        )
