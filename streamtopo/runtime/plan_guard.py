"""The authoritative second line against tenant expressions: Spark's own analysed plan of a step, checked
before the step runs.

The door (planner/expressions.py) reads expressions with a parser that is not Spark's; whatever it
misses must fail closed here. Every plan an operator builds from a tenant's expressions goes through
:func:`check` before it runs (``operators.base.lazily`` for lazy steps, ``numpy_eval.Evaluator`` for
batches in the driver, runtime/analysis.py before ``streamtopo run`` starts): the analysed plan's every
node, subquery plans included, must be of an allowed class:

- expressions: the classes Spark's function registry gives for the allowed functions of
  planner/expressions.py, the structure around them (attributes, literals, casts, operators, predicates,
  lambdas, aggregates, generators) and the runtime's own (key-group hashing, windows, generated sources);
- plan nodes: the relational operators the runtime's operators use, and as leaves only the relations a
  step's inputs are made of (local data, an RDD, a range of a generator, the step's Parquet hand-off).

So a call into the JVM (``CallMethodViaReflection``), a subquery (``ScalarSubquery``, ``Exists``,
``ListQuery``), a relation over files (``LogicalRelation`` inside a subquery), a file name
(``InputFileName``), the executor's identity (``CurrentUser``) or a user-defined function (``ScalaUDF``,
``PythonUDF``) refuses the operator naming its field, whatever text produced it. A step's plan is checked
once per operator, field and input schema: the operator builds the same plan over every input of that
schema, and the leaves that differ between steps are made by the runtime, not by expressions.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

from pyspark.sql import DataFrame as SparkFrame
from pyspark.sql import SparkSession

from streamtopo.planner.expressions import ALLOWED_FUNCTIONS

EXPRESSIONS = frozenset(
    [
        # references, literals, names
        "AttributeReference",
        "Alias",
        "Literal",
        "BoundReference",
        "OuterReference",
        "NamedLambdaVariable",
        "LambdaFunction",
        "SortOrder",
        # casts and conversions
        "Cast",
        "TryCast",
        "UpCast",
        "AnsiCast",
        "KnownNotNull",
        "KnownFloatingPointNormalized",
        "NormalizeNaNAndZero",
        "PromotePrecision",
        "CheckOverflow",
        "CheckOverflowInSum",
        "MakeDecimal",
        "UnscaledValue",
        # arithmetic and logic
        "Add",
        "Subtract",
        "Multiply",
        "Divide",
        "IntegralDivide",
        "Remainder",
        "Pmod",
        "UnaryMinus",
        "UnaryPositive",
        "And",
        "Or",
        "Not",
        "EqualTo",
        "EqualNullSafe",
        "GreaterThan",
        "GreaterThanOrEqual",
        "LessThan",
        "LessThanOrEqual",
        "In",
        "InSet",
        "IsNull",
        "IsNotNull",
        "CaseWhen",
        "If",
        "Coalesce",
        "Like",
        "ILike",
        "RLike",
        "LikeAny",
        "NotLikeAny",
        "LikeAll",
        "NotLikeAll",
        "BitwiseAnd",
        "BitwiseOr",
        "BitwiseXor",
        "BitwiseNot",
        "ShiftLeft",
        "ShiftRight",
        "ShiftRightUnsigned",
        "Concat",
        "ConcatWs",
        "Murmur3Hash",
        "XxHash64",
        # complex types
        "CreateNamedStruct",
        "CreateArray",
        "CreateMap",
        "GetStructField",
        "GetArrayItem",
        "GetMapValue",
        "GetArrayStructFields",
        "ElementAt",
        # aggregates and generators
        "AggregateExpression",
        "Generate",
        "Explode",
        "PosExplode",
        "Inline",
        # time
        "TimeAdd",
        "DatetimeSub",
        "TimestampAddYMInterval",
        "DateAddInterval",
        "MakeInterval",
        # the classes of built-ins whose registry entry is a builder, or that resolve to another class
        "Ceil",
        "Floor",
        "Contains",
        "StartsWith",
        "EndsWith",
        "CurrentTimestamp",
        "LocalTimestamp",
        "Now",
        "StringDecode",
        "Hour",
        "Minute",
        "Second",
        "StringInstr",
        "StringLPad",
        "StringRPad",
        "MakeTimestamp",
        "Mask",
        "MaxBy",
        "MinBy",
        "Mode",
        "ToCharacter",
        "TryEval",
        "NullIfResult",
        "With",
        "CommonExpressionDef",
        "CommonExpressionRef",
        "CountMinSketchAgg",
        # what the allowed functions' builders make for other argument types (Spark documents each): a
        # scale for ceil/floor, binary strings, an occurrence for instr, a date and a time, the k of max_by
        "RoundCeil",
        "RoundFloor",
        "BinaryPredicate",
        "BinaryPad",
        "StringInstrWithOccurrence",
        "MakeTimestampFromDateTime",
        "MakeTimestampNTZ",
        "MaxMinByK",
        # datetime and interval arithmetic (ts + INTERVAL 1 HOUR, date - date, date_part('HOUR', interval))
        "TimestampAddInterval",
        "DateAddYMInterval",
        "SubtractTimestamps",
        "SubtractDates",
        "MultiplyDTInterval",
        "MultiplyYMInterval",
        "DivideDTInterval",
        "DivideYMInterval",
        "ExtractANSIIntervalYears",
        "ExtractANSIIntervalMonths",
        "ExtractANSIIntervalDays",
        "ExtractANSIIntervalHours",
        "ExtractANSIIntervalMinutes",
        "ExtractANSIIntervalSeconds",
        "SecondWithFraction",
        # the runtime's own: routing fails a record whose key cannot be hashed (partitioning.py)
        "RaiseError",
        # what analysed plans wrap built-ins in (RuntimeReplaceable implementations)
        "StaticInvoke",
        "Invoke",
        "ObjectsInvoke",
        "NewInstance",
        "ScalaAggregator",
        "InvokeLike",
    ]
)
"""Expression classes of the structure around allowed calls (the registry gives the calls' own)."""

PLAN_NODES = frozenset(
    [
        "Project",
        "Filter",
        "Aggregate",
        "Generate",
        "Join",
        "Union",
        "Repartition",
        "RepartitionByExpression",
        "Sort",
        "Window",
        "Expand",
        "Deduplicate",
        "GlobalLimit",
        "LocalLimit",
        "SubqueryAlias",
    ]
)
"""Relational operators the runtime's operators build (a tenant's expression adds none)."""

LEAVES = frozenset(["LocalRelation", "LogicalRDD", "Range", "LogicalRelation"])
"""What a step's inputs are: local data, an RDD, a generator's range, the step's Parquet hand-off."""

REFUSED = {
    "CallMethodViaReflection": "a call into the JVM (reflect, java_method)",
    "TryReflect": "a call into the JVM (try_reflect)",
    "ScalarSubquery": "a subquery",
    "Exists": "a subquery (EXISTS)",
    "ListQuery": "a subquery (IN)",
    "InSubquery": "a subquery (IN)",
    "LateralSubquery": "a subquery",
    "InputFileName": "the name of a file the executor reads",
    "InputFileBlockStart": "a file the executor reads",
    "InputFileBlockLength": "a file the executor reads",
    "CurrentUser": "the executor's identity",
    "ScalaUDF": "a user-defined function",
    "PythonUDF": "a user-defined function",
    "JavaUDF": "a user-defined function",
    "HiveSimpleUDF": "a user-defined function",
    "HiveGenericUDF": "a user-defined function",
}
"""Classes a tenant's expression might reach, and what they are (for the message)."""

_lock = threading.Lock()
_registry: frozenset[str] | None = None
_verified: set[tuple[str, str, tuple[str, ...]]] = set()


class PlanRefused(Exception):
    """A step's analysed plan holds a class outside the allow-list (``operators.base`` turns it into the
    operator's :class:`OperatorError`, naming the field)."""


def check(frame: SparkFrame, operator: str, field: str, inputs: tuple[SparkFrame, ...] = ()) -> None:
    """Refuse ``frame`` (an operator's plan of ``field``) unless every node of its analysed plan is of an
    allowed class. With ``inputs`` the verdict is kept per operator, field and input schemas."""
    key = (operator, field, tuple(i.schema.simpleString() for i in inputs)) if inputs else None
    if key is not None and key in _verified:
        return
    allowed = EXPRESSIONS | PLAN_NODES | LEAVES | registry(frame.sparkSession)
    analysed = frame._jdf.queryExecution().analyzed()
    for name in _classes(json.loads(analysed.toJSON())):
        if name not in allowed:
            what = REFUSED.get(name, "a construct outside the allow-list")
            raise PlanRefused(f"Spark's plan of it holds {name} ({what}), which is not allowed")
    if key is not None:
        _verified.add(key)


def registry(spark: SparkSession) -> frozenset[str]:
    """The expression classes of the allowed functions in this JVM's function registry (looked up once)."""
    global _registry
    with _lock:
        if _registry is None:
            jvm: Any = spark._jvm
            expressions = jvm.org.apache.spark.sql.catalyst.analysis.FunctionRegistry.expressions()
            found = set()
            for name in ALLOWED_FUNCTIONS:
                entry = expressions.get(name)
                if entry.isDefined():
                    found.add(str(entry.get()._1().getClassName()).rsplit(".", 1)[-1])
            _registry = frozenset(found - set(REFUSED))
        return _registry


def _classes(value: Any) -> Iterator[str]:
    """Every tree node's class (short name) in a plan's JSON, nested plans and expressions included."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            name = item.get("class")
            if isinstance(name, str):
                yield name.rsplit(".", 1)[-1]
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
