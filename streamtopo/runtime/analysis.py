"""Check a pipeline's expressions before anything runs: Spark's analyzer over frames of no records.

A filter naming a missing column, a map with a syntax error, an aggregate keyed by a column its input
lacks, a join whose key types differ: each would otherwise surface inside an executor, after its JVM
started and warmed up, as one line among Spark's. Here every operator is resolved against its inputs'
schemas in topological order before an executor starts. An operator's output schema is what its own
Spark code gives (``process`` on a lazy frame for map and filter, ``output_frame`` for the others, the
routing expression ``route_column`` for keys) over an empty frame of its inputs' schemas: the analyzer
resolves every name and type, no job runs, and the check cannot disagree with the run. A failure is an
:class:`OperatorError` naming the operator and the field (``select[1]``, ``aggregations[0]``, ``keyBy``).

Sources' schemas come from the generators. A stream source's records come from programs this topology
does not know, so what it feeds is left to the run, as is what follows a UDF that needs records to say
what it returns (:meth:`UdfOperator.output_frame`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial, reduce
from typing import TypeVar

import networkx as nx
from pyspark.sql import DataFrame as SparkFrame
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from streamtopo.planner.model import Operator, StreamTopologySpec
from streamtopo.runtime import spark as sparks
from streamtopo.runtime.operators import OperatorError, UnitOperator, build_operator
from streamtopo.runtime.operators.aggregate import AggregateOperator
from streamtopo.runtime.operators.base import KG, TS, lazily
from streamtopo.runtime.operators.join import JoinOperator
from streamtopo.runtime.operators.source import SourceOperator
from streamtopo.runtime.operators.stateless import FilterOperator, MapOperator
from streamtopo.runtime.operators.udf import UdfOperator
from streamtopo.runtime.partitioning import partition_key, route_column, spark_key_kind, unsupported_key


class SparkUnavailable(RuntimeError):
    """The JVM for the check did not start (no Java, say); the message carries what it printed."""


def check_expressions(
    spec: StreamTopologySpec, operators: dict[str, UnitOperator] | None = None, *, verbose: bool = False
) -> dict[str, T.StructType | None]:
    """:func:`analyze_pipeline` in this process's SparkSession. One started for the check is stopped after
    it, JVM included, and unless ``verbose`` the JVM's own console output goes to a file (its start-up
    prints a line no log level silences) and Spark logs at ERROR (spark.py). Without a class archive,
    this JVM writes it at its exit, for the executors' starts (runtime/class_archive.py)."""
    started = not sparks.running()
    jvm_log = None if verbose else sparks.temp_dir() / "check-jvm.log"
    try:
        session = sparks.get_spark(jvm_output=jvm_log, verbose=verbose, build_archive=True)
    except Exception as error:  # noqa: BLE001 - whatever keeps Spark from starting, say what it printed
        printed = jvm_log.read_text(errors="replace").strip() if jvm_log and jvm_log.exists() else ""
        message = f"cannot start Spark to check the pipeline: {error}\n{printed}"
        raise SparkUnavailable(message.strip()) from None
    try:
        schemas = analyze_pipeline(spec, session, operators)
        if sparks.building_archive():
            sparks.warm_up(session)  # the archive then has the classes an executor's first steps load
        return schemas
    finally:
        if started:
            sparks.stop_spark(jvm=True)


def analyze_pipeline(
    spec: StreamTopologySpec, spark: SparkSession, operators: dict[str, UnitOperator] | None = None
) -> dict[str, T.StructType | None]:
    """Every operator's output schema (None where it cannot be known before the run), resolving every
    expression on the way; raises :class:`OperatorError` at the first operator that cannot run."""
    operators = operators or {op.name: build_operator(op, spec) for op in spec.operators}
    dag = nx.DiGraph()
    dag.add_nodes_from(op.name for op in spec.operators)
    dag.add_edges_from((u, op.name) for op in spec.operators for u in op.inputs)
    schemas: dict[str, T.StructType | None] = {}
    for name in nx.lexicographical_topological_sort(dag):
        op = spec.operator(name)
        # Each operator sees empty frames of its inputs' schemas, never their plans: errors stay its own.
        frames = {u: spark.createDataFrame([], schemas[u]) for u in op.inputs if schemas[u] is not None}
        for producer, frame in frames.items():
            _check_key(spec, op, producer, frame)
        if len(frames) < len(op.inputs):
            schemas[name] = None
            continue
        output = _output(spark, op, operators[name], frames)
        schemas[name] = None if output is None else output.schema
    return schemas


def _output(
    spark: SparkSession, op: Operator, operator: UnitOperator, frames: dict[str, SparkFrame]
) -> SparkFrame | None:
    """The operator's output over its inputs' frames, through the operator's own Spark code."""
    if isinstance(operator, SourceOperator):
        return operator.output_frame(spark)
    if isinstance(operator, JoinOperator):
        _check_join_keys(operator, frames)
        return operator.output_frame(*(frames[u] for u in op.inputs))
    # Several inputs reach an operator as one frame, as the executor unions them (lazy records).
    batch = lazily(
        op.name,
        "inputs",
        lambda: reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), frames.values()),
    )
    if isinstance(operator, MapOperator):
        _locate(op.name, "select", operator.select, lambda text: batch.selectExpr(text))
        return operator.process(spark, batch, {}, {}).output
    if isinstance(operator, FilterOperator):
        return operator.process(spark, batch, {}, {}).output
    if isinstance(operator, AggregateOperator):
        _locate(
            op.name,
            "aggregations",
            [agg.partial_sql() for agg in operator.aggs],
            lambda sql: batch.groupBy(KG).agg(*map(F.expr, sql)),
        )
        return operator.output_frame(batch)
    if isinstance(operator, UdfOperator):
        return operator.output_frame(batch)
    return batch  # a sink: records pass through


_Item = TypeVar("_Item")


def _locate(
    operator: str, field: str, items: Sequence[_Item], resolve: Callable[[_Item], SparkFrame]
) -> None:
    """Resolve each item of a list field alone, so an error names the item (``select[1]``)."""
    for i, item in enumerate(items):
        lazily(operator, f"{field}[{i}]", partial(resolve, item))


def _check_key(spec: StreamTopologySpec, op: Operator, producer: str, frame: SparkFrame) -> None:
    """A keyed operator's records are routed by its key over each input's records (executor ``_emit``):
    the key's columns must be in the input, of a type the key-group hash takes."""
    key = partition_key(spec, op.name)
    if key is None:
        return
    field = "keyBy" if op.key_by else f"keyBy (inherited from {_key_origin(spec, op.name)!r})"
    missing = [c for c in key if c not in frame.columns]
    if missing:
        have = ", ".join(c for c in frame.columns if c not in (KG, TS))
        lacking = ", ".join(map(repr, missing))
        raise OperatorError(
            op.name, field, f"input {producer!r} has no column {lacking} (its columns: {have})"
        )
    for column in key:
        kind = frame.schema[column].dataType.simpleString()
        if spark_key_kind(kind) is None:
            raise OperatorError(op.name, field, f"input {producer!r}: {unsupported_key(column, kind)}")
    k = spec.key_groups_of(op.name)
    lazily(op.name, field, lambda: frame.select(route_column(key, k, F.col(KG))))


def _key_origin(spec: StreamTopologySpec, name: str) -> str:
    """The operator whose keyBy ``name`` inherits (planner.graph.partition_key's rule)."""
    while not spec.operator(name).key_by:
        name = spec.operator(name).inputs[0]
    return name


def _check_join_keys(join: JoinOperator, frames: dict[str, SparkFrame]) -> None:
    """Both sides' keys must hash alike (numbers and booleans as doubles, strings as strings): Spark would
    compare a string key with a number, but the two are routed to different key groups and never meet."""
    left, right = join.left, join.right
    for column in join.keys:
        kinds = {u: frames[u].schema[column].dataType.simpleString() for u in (left, right)}
        if "void" not in kinds.values() and spark_key_kind(kinds[left]) != spark_key_kind(kinds[right]):
            raise OperatorError(
                join.name,
                "keyBy",
                f"key {column!r} is {kinds[left]} in {left!r} but "
                f"{kinds[right]} in {right!r}; cast one side so they compare",
            )
