"""The unit-operator contract (notes/runtime_api.md) and what every operator shares.

An operator instance serves all the key groups of its operator that an executor hosts: ``process``
receives a batch whose ``_kg`` column says which key group each record belongs to, plus one state and
one watermark per key group. Results must not depend on which key groups share a call or how a stream
is cut into batches, so every operator computes per key group (``_kg`` is part of every grouping key).
A batch is pandas, or (for operators with ``lazy_input``) a lazy Spark frame whose records have not left
the JVM: pandas <-> JVM conversion is PySpark's most expensive step, so records stay in Spark as long as
no stateful operator or transport needs them in Python.

Errors come in three kinds the executor treats differently:
- :class:`OperatorError`: the operator itself is broken (a UDF that does not import, an expression that
  does not parse or names a missing column). Retrying does not help; report it naming the field.
- :class:`RecordError`: some records make an otherwise sound operator fail (a UDF raising on them, an ANSI
  cast or arithmetic error). It carries the offending rows, found by bisection, so the executor can send
  them to the dead-letter stream and re-run the batch without them.
- :class:`LazyFailure`: a run-time failure inside a lazy frame, where no record can be blamed; the
  executor redoes the step eagerly, where the failure becomes one of the two above.

None of them is a failure of the JVM itself: each handler asks :func:`~streamtopo.runtime.spark.check_jvm`
first, so with the JVM gone no record is sent to the dead-letter stream and no redo is tried
(:class:`~streamtopo.runtime.spark.JvmLost` instead, which the executor exits on).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import pandas as pd
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame as SparkFrame
from pyspark.sql import SparkSession
from typing_extensions import TypeIs

from streamtopo.planner.model import Operator, StreamTopologySpec
from streamtopo.runtime import plan_guard
from streamtopo.runtime.operators.records import INPUT, KG, TS, canonical, to_pandas
from streamtopo.runtime.spark import check_jvm

RESERVED = (TS, KG)

Batch: TypeAlias = pd.DataFrame | SparkFrame
"""Records between operators: pandas in the driver, or a lazy Spark DataFrame that has not left the JVM."""


class OperatorError(Exception):
    """An operator that cannot run at all; ``field`` names the spec field at fault."""

    def __init__(self, operator: str, field: str, message: str):
        self.operator, self.field, self.message = operator, field, message
        super().__init__(f"operator {operator!r}, {field}: {message}")


class LazyFailure(Exception):
    """Computing a lazy frame failed at run time: some record broke an operator upstream, but which
    operator and which record cannot be told from inside one Spark job. The executor redoes the step
    eagerly, where :func:`guarded` finds the records and the operator."""


class RecordError(OperatorError):
    """Records that make the operator fail; ``rows`` are the culprits (with their reserved columns)."""

    def __init__(self, operator: str, field: str, message: str, rows: pd.DataFrame):
        super().__init__(operator, field, f"{message} ({len(rows)} offending record(s))")
        self.rows = rows
        self.error = message


@dataclass
class OperatorResult:
    output: Batch
    states: dict[int, Any] = field(default_factory=dict)
    input_counts: dict[tuple[int, int], int] | None = None
    """Records per (producing unit, key group) of an input carrying ``__src``, counted in the operator's
    own Spark job so the executor need not run another one over the same records."""


class UnitOperator:
    """Base of all operators: identity and the stateless defaults."""

    stateful = False
    lazy_input = False
    """Whether ``process`` takes a lazy Spark frame (else the executor hands it pandas)."""
    counts_input = False
    """Whether ``process`` counts a lazy input carrying ``__src`` (:attr:`OperatorResult.input_counts`)."""
    combines = False
    """Whether a producer may combine records for this operator before the wire (``partials``, then
    ``process(partials=...)``): Spark's map-side combine, for aggregates."""
    keeps_count = False
    """Whether each key group's records out are its records in (a map without generators)."""

    def __init__(self, op: Operator, spec: StreamTopologySpec):
        self.op = op
        self.spec = spec
        self.name = op.name
        self.kind = op.kind
        self.inputs = list(op.inputs)
        self.key_groups = spec.key_groups_of(op.name)

    def process(
        self, spark: SparkSession, batch: pd.DataFrame, states: dict[int, Any], watermarks: dict[int, float]
    ) -> OperatorResult:
        raise NotImplementedError

    def encode_state(self, state: Any) -> bytes:
        return b""

    def decode_state(self, data: bytes) -> Any:
        return None

    def has_pending(self, state: Any) -> bool:
        """Whether the unit has output left to emit (a join's large windows, over several steps): the
        executor runs it again without new input."""
        return False

    def output_watermark(self, state: Any, watermark: float) -> float:
        """The watermark the unit's output carries, given its input's: held back while output is pending."""
        return watermark

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


# ------------------------------------------------------------------------------------- pandas <-> Spark
# (records.py: one representation of records in the driver, and the exact conversions)


def is_spark(batch: Batch | None) -> TypeIs[SparkFrame]:
    return isinstance(batch, SparkFrame)


def materialize(batch: Batch) -> pd.DataFrame:
    """A pandas frame of ``batch`` (runs the Spark job of a lazy frame)."""
    return computed(lambda: to_pandas(batch)) if is_spark(batch) else batch


def ensure_reserved(batch: pd.DataFrame, operator: str, keep_input: bool = False) -> pd.DataFrame:
    """Check the reserved columns an operator relies on and give them their canonical dtypes.

    ``_input`` (which upstream a record came from) only means something to a join; other operators
    with several inputs see the union of their inputs and drop it."""
    if INPUT in batch.columns and not keep_input:
        batch = batch.drop(columns=[INPUT])
    missing = [c for c in RESERVED if c not in batch.columns]
    if missing:
        raise OperatorError(operator, "inputs", f"records lack reserved column(s) {', '.join(missing)}")
    if batch[KG].dtype != "int32" or batch[TS].dtype != "float64":
        batch = batch.astype({KG: "int32", TS: "float64"})
    return canonical(batch)


# ---------------------------------------------------------------------------------- failure isolation


def guarded(
    operator: str,
    field: str,
    work: Callable[[pd.DataFrame], pd.DataFrame],
    batch: pd.DataFrame,
    probe: Callable[[pd.DataFrame], Any] | None = None,
) -> pd.DataFrame:
    """Run ``work`` on ``batch``; turn failures into :class:`OperatorError` or :class:`RecordError`.

    Analysis errors (syntax, unknown column, type mismatch) are the operator's fault whatever the data.
    Anything else raised while running is blamed on records: the batch is bisected, re-running ``probe``
    (default ``work``; a cheaper pandas-only check where one exists) on halves, to find every record
    that fails on its own: O(bad x log n) runs, paid only on failure. If no record fails on its own the
    failure is the operator's after all.
    """
    try:
        return work(batch)
    except OperatorError:
        raise
    except AnalysisException as error:
        raise OperatorError(operator, field, _first_line(error)) from None
    except Exception as error:  # noqa: BLE001 - any runtime failure is attributed to records below
        check_jvm(error)
        first = error
    try:
        bad = _bisect(probe or work, batch)
    except AnalysisException as error:
        raise OperatorError(operator, field, _first_line(error)) from None
    if not len(bad):
        raise OperatorError(operator, field, _first_line(first))
    raise RecordError(operator, field, _first_line(first), bad)


def lazily(operator: str, field: str, build: Callable[[], SparkFrame], *inputs: SparkFrame) -> SparkFrame:
    """Build a lazy frame over ``inputs``; an analysis error (bad expression, unknown column), or a plan
    the guard refuses (runtime/plan_guard.py: checked once per input schema), is the operator's fault."""
    try:
        frame = build()
        plan_guard.check(frame, operator, field, inputs)
        return frame
    except AnalysisException as error:
        raise OperatorError(operator, field, _first_line(error)) from None
    except plan_guard.PlanRefused as error:
        raise OperatorError(operator, field, str(error)) from None


def computed(work: Callable[[], Any]) -> Any:
    """Run a Spark action over lazy frames; a run-time failure becomes :class:`LazyFailure`."""
    try:
        return work()
    except (OperatorError, AnalysisException):
        raise
    except Exception as error:  # any run-time failure inside the lazy chain
        check_jvm(error)
        raise LazyFailure(_first_line(error)) from error


def _fails(check: Callable[[pd.DataFrame], Any], part: pd.DataFrame) -> bool:
    try:
        check(part)
    except (OperatorError, AnalysisException):
        raise
    except Exception as error:  # noqa: BLE001
        check_jvm(error)
        return True
    return False


def _bisect(check: Callable[[pd.DataFrame], Any], batch: pd.DataFrame) -> pd.DataFrame:
    """The records of ``batch`` that make ``check`` fail by themselves (empty if none does)."""
    if len(batch) == 0 or not _fails(check, batch):
        return batch.iloc[:0]
    if len(batch) == 1:
        return batch
    half = len(batch) // 2
    # by label, not pd.concat: pandas' concat reads Arrow scalars as Python objects (a date past 9999
    # would not convert), and the caller drops the culprits by their labels
    bad = _bisect(check, batch.iloc[:half]).index.append(_bisect(check, batch.iloc[half:]).index)
    return batch.loc[bad]


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
