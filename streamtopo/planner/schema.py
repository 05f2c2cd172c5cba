"""The typed view of a topology at the door: every operator's output columns and their Spark types,
propagated from the sources through the operators' expressions by grammar (no Spark).

design.md section 3: the schema of every edge is derived once from the sources' schemas and the
operators' expressions. Where Spark is at hand its analyser is the authority (runtime/analysis.py);
here, where it is not (the admission webhook, ``streamtopo plan``), the grammar-level reading of
planner/expressions.py infers what it can: a column's name always where the grammar says it, its type
where the expression's shape fixes it (columns, literals, casts, comparisons, arithmetic over known
types, the aggregations' partials), otherwise ``None`` (unknown). A stream source or a UDF yields an
unknown schema, and an unaliased computed select item (Spark names it after its text) leaves a schema
*open*: downstream, only what is certain is refused.

:func:`schema_problems` refuses, naming the field, what would otherwise fail only once executors run:
a missing column in an expression or a ``keyBy``, a key of a type the key-group hash cannot take, join
keys whose types hash differently, a filter that is not a predicate, and output columns that would
shadow the runtime's own (``_kg``, ``_input``, ``__*``). tests/runtime/test_schema_agreement.py holds
the inferred names and types to Spark's analysed schemas.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import networkx as nx
from sqlglot import exp

from streamtopo.planner.expressions import (
    KG,
    TS,
    ExpressionError,
    Parsed,
    ParsedAggregation,
    output_name_problem,
    parse_aggregation,
    parse_expression,
)
from streamtopo.planner.graph import partition_key
from streamtopo.planner.model import Operator, StreamTopologySpec

SparkType = str | None
"""A Spark type's simple name (``bigint``, ``double``, ``decimal(10,2)``, ``string``), None: unknown."""

WINDOW_START, WINDOW_END = "window_start", "window_end"
"""The window bounds a windowed aggregate or join puts first in its output."""

GENERATOR_SCHEMAS: dict[str, dict[str, str]] = {
    "trades": {"symbol": "string", "price": "double", "volume": "bigint"},
    "quotes": {"symbol": "string", "bid": "double", "ask": "double", "volume": "bigint"},
    "words": {"word": "string"},
    "sequence": {"seq": "bigint", "key": "bigint", "value": "bigint"},
}
"""The built-in generators' columns (runtime/generators.py makes them; a test holds the two together)."""
RESERVED_TYPES = {TS: "double", KG: "int"}
"""Every record's event time (seconds) and key group."""

NUMERIC_KEY_TYPES = ("tinyint", "smallint", "int", "bigint", "float", "double", "boolean", "void")
"""Key column types the key-group hash reads as a double (runtime/partitioning.py); strings hash as
strings; any other type has no hash identical in pandas and Spark."""

_INTEGRAL = ("tinyint", "smallint", "int", "bigint")
_FRACTIONAL = ("float", "double")


def key_kind(type_name: str) -> str | None:
    """How a key column of Spark type ``type_name`` is hashed: ``double``, ``string``, or None (refused)."""
    return "double" if type_name in NUMERIC_KEY_TYPES else "string" if type_name == "string" else None


@dataclass(frozen=True)
class Schema:
    """An operator's output as the grammar sees it."""

    columns: dict[str, SparkType] = field(default_factory=dict)
    open: bool = False
    """Whether columns the grammar cannot name may exist too (an unaliased computed select item)."""

    def has(self, name: str) -> bool | None:
        """True, False, or None where an open schema cannot say."""
        return True if name in self.columns else None if self.open else False

    def user_columns(self) -> list[str]:
        return [c for c in self.columns if c not in RESERVED_TYPES]


class _Problem(Exception):
    """One refusal, at ``field`` of the operator (``select[1]``, ``keyBy``)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field, self.message = field, message


def infer_schemas(spec: StreamTopologySpec) -> dict[str, Schema | None]:
    """Every operator's output schema (None: unknown at the door), assuming the spec is valid."""
    return _propagate(spec, [])


def schema_problems(spec: StreamTopologySpec, prefix: str = "spec") -> list[tuple[str, str]]:
    """(field path, message) for every operator the typed view refuses, in topological order."""
    problems: list[tuple[str, str]] = []
    _propagate(spec, problems, prefix)
    return problems


def _propagate(
    spec: StreamTopologySpec, problems: list[tuple[str, str]], prefix: str = "spec"
) -> dict[str, Schema | None]:
    dag = nx.DiGraph()
    dag.add_nodes_from(op.name for op in spec.operators)
    dag.add_edges_from((u, op.name) for op in spec.operators for u in op.inputs)
    index = {op.name: i for i, op in enumerate(spec.operators)}
    schemas: dict[str, Schema | None] = {}
    for name in nx.lexicographical_topological_sort(dag):
        op = spec.operator(name)
        inputs = {u: schemas[u] for u in op.inputs}
        try:
            _check_key(spec, op, inputs)
            schemas[name] = _output(spec, op, inputs)
        except _Problem as problem:
            problems.append((f"{prefix}.operators[{index[name]}].{problem.field}", problem.message))
            schemas[name] = None  # reported once: what follows is not checked against a guess
    return schemas


# ------------------------------------------------------------------------------------------ operators


def _output(spec: StreamTopologySpec, op: Operator, inputs: Mapping[str, Schema | None]) -> Schema | None:
    if op.kind == "source":
        assert op.source is not None  # the model's validator
        generated = GENERATOR_SCHEMAS.get(op.source.generator or "")
        return None if generated is None else Schema({**generated, **RESERVED_TYPES})
    if op.kind == "udf" or any(s is None for s in inputs.values()):
        return None
    known = {u: s for u, s in inputs.items() if s is not None}
    if op.kind == "join":
        return _join(op, known)
    schema = _union(list(known.values()))
    if op.kind == "filter":
        assert op.expr is not None
        parsed = _parse(op.expr, "expr")
        _reads(op, "expr", parsed, schema)
        kind = expression_type(parsed.node, schema)
        if kind is not None and kind not in ("boolean", "void"):
            raise _Problem("expr", f"{op.expr!r} is {kind}, not a predicate (boolean)")
        return schema
    if op.kind == "map":
        return _map(op, schema)
    if op.kind == "aggregate":
        return _aggregate(spec, op, schema)
    return schema  # a sink: records pass through


def _map(op: Operator, schema: Schema) -> Schema:
    columns: dict[str, SparkType] = {}
    is_open = False
    for i, text in enumerate(op.select or []):
        where = f"select[{i}]"
        parsed = _parse(text, "select", where)
        if parsed.star:
            is_open |= schema.open
            columns.update({c: t for c, t in schema.columns.items() if c not in RESERVED_TYPES})
            continue
        _reads(op, where, parsed, schema)
        if parsed.alias is not None and (problem := output_name_problem(parsed.alias, event_time=True)):
            raise _Problem(where, problem)
        name = parsed.name
        if name is None:
            is_open = True  # Spark names it after its text
            continue
        columns.pop(name, None)  # the last definition wins, in its place (runtime/operators/stateless.py)
        columns[name] = expression_type(parsed.node, schema)
    for reserved, kind in RESERVED_TYPES.items():
        columns.setdefault(reserved, kind)
    return Schema(columns, is_open)


def _aggregate(spec: StreamTopologySpec, op: Operator, schema: Schema) -> Schema:
    keys = list(partition_key(spec, op.name) or ())
    columns: dict[str, SparkType] = {}
    if op.window is not None:
        columns |= {WINDOW_START: "double", WINDOW_END: "double"}
    columns |= {k: schema.columns.get(k) for k in keys}
    for i, text in enumerate(op.aggregations or []):
        where = f"aggregations[{i}]"
        agg = _parse_aggregation(text, where)
        if agg.arg is not None:
            _reads(op, where, agg.arg, schema, text)
        if problem := output_name_problem(agg.alias, event_time=False):
            raise _Problem(where, problem)
        if agg.alias in columns:
            raise _Problem(where, f"alias {agg.alias!r} is already an output column ({', '.join(columns)})")
        columns[agg.alias] = _aggregation_type(agg, schema)
    return Schema({**columns, **RESERVED_TYPES})


def _join(op: Operator, inputs: Mapping[str, Schema]) -> Schema:
    left, right = op.inputs
    keys = list(op.key_by or ())
    clash = (set(inputs[left].columns) & set(inputs[right].columns)) - {*keys, *RESERVED_TYPES}
    columns: dict[str, SparkType] = {WINDOW_START: "double", WINDOW_END: "double"}
    columns |= {k: inputs[left].columns.get(k) for k in keys}
    for side in (left, right):
        for column, kind in inputs[side].columns.items():
            if column in (*keys, *RESERVED_TYPES):
                continue
            renamed = column in clash or column in (WINDOW_START, WINDOW_END)
            columns[f"{side}_{column}" if renamed else column] = kind
    return Schema({**columns, **RESERVED_TYPES}, inputs[left].open or inputs[right].open)


def _union(schemas: list[Schema]) -> Schema:
    """Several inputs reach an operator as one frame (a union by name, missing columns null)."""
    if len(schemas) == 1:
        return schemas[0]
    columns: dict[str, SparkType] = {}
    for schema in schemas:
        for column, kind in schema.columns.items():
            columns[column] = kind if columns.get(column, kind) == kind else None
    return Schema(columns, any(s.open for s in schemas))


# -------------------------------------------------------------------------------------------- checks


def _check_key(spec: StreamTopologySpec, op: Operator, inputs: Mapping[str, Schema | None]) -> None:
    """A keyed operator's records are routed by its key over each input's records: the columns must be in
    every input, of a type the key-group hash takes, and a join's sides must hash their keys alike."""
    key = partition_key(spec, op.name)
    if key is None:
        return
    field = "keyBy" if op.key_by else f"keyBy (inherited from {_key_origin(spec, op.name)!r})"
    kinds: dict[str, dict[str, SparkType]] = {}
    for producer, schema in inputs.items():
        if schema is None:
            continue
        missing = [c for c in key if schema.has(c) is False]
        if missing:
            raise _Problem(
                field,
                f"input {producer!r} has no column {', '.join(map(repr, missing))} "
                f"(its columns: {', '.join(schema.user_columns())})",
            )
        kinds[producer] = {c: schema.columns.get(c) for c in key}
        for column, kind in kinds[producer].items():
            if kind is not None and key_kind(kind) is None:
                raise _Problem(
                    field,
                    f"input {producer!r}: column {column!r} has type {kind}, which has no key-group hash "
                    "identical in pandas and Spark; supported: numbers, booleans, strings (cast it first)",
                )
    if op.kind == "join" and len(kinds) == 2:
        (left, lk), (right, rk) = kinds.items()
        for column in key:
            a, b = lk[column], rk[column]
            if a is not None and b is not None and "void" not in (a, b) and key_kind(a) != key_kind(b):
                raise _Problem(
                    "keyBy",
                    f"key {column!r} is {a} in {left!r} but {b} in {right!r}; cast one side so they compare",
                )


def _key_origin(spec: StreamTopologySpec, name: str) -> str:
    """The operator whose keyBy ``name`` inherits (planner.graph.partition_key's rule)."""
    while not spec.operator(name).key_by:
        name = spec.operator(name).inputs[0]
    return name


def _reads(op: Operator, where: str, parsed: Parsed, schema: Schema, text: str | None = None) -> None:
    missing = [c for c in parsed.columns if schema.has(c) is False]
    if missing:
        have = ", ".join(schema.user_columns()) or "none"
        inputs = " and ".join(map(repr, op.inputs))
        raise _Problem(
            where,
            f"{text or parsed.text!r} reads column {', '.join(map(repr, missing))}, which {inputs} "
            f"{'do' if len(op.inputs) > 1 else 'does'} not have (columns: {have})",
        )


def _parse(text: str, role: str, where: str | None = None) -> Parsed:
    try:
        return parse_expression(text, "select" if role == "select" else "expr")
    except ExpressionError as error:  # the model's validator refused it already; named here for safety
        raise _Problem(where or role, f"{text!r} {error}") from None


def _parse_aggregation(text: str, where: str) -> ParsedAggregation:
    try:
        return parse_aggregation(text)
    except ExpressionError as error:
        raise _Problem(where, f"{text!r} {error}") from None


# --------------------------------------------------------------------------------------------- types


def expression_type(node: exp.Expr, schema: Schema) -> SparkType:
    """The Spark type of ``node`` over ``schema`` where its shape fixes it, else None."""
    if isinstance(node, exp.Paren):
        return expression_type(node.this, schema)
    if isinstance(node, exp.Column):
        return schema.columns.get(node.name) if not node.table else None
    if isinstance(node, exp.Literal):
        return _literal_type(node)
    if isinstance(node, exp.Boolean):
        return "boolean"
    if isinstance(node, exp.Null):
        return "void"
    if isinstance(node, exp.Cast):  # TryCast too
        return _cast_type(node.to)
    if isinstance(node, exp.Predicate | exp.Not | exp.And | exp.Or | exp.Xor):
        return "boolean"
    if isinstance(node, exp.Neg):
        return _numeric(expression_type(node.this, schema))
    if isinstance(node, exp.Div):
        sides = _sides(node, schema)
        return "double" if all(t in _INTEGRAL + _FRACTIONAL for t in sides) else None
    if isinstance(node, exp.IntDiv):
        return "bigint" if all(t in _INTEGRAL for t in _sides(node, schema)) else None
    if isinstance(node, exp.Add | exp.Sub | exp.Mul | exp.Mod):
        return _widest(_sides(node, schema))
    if isinstance(node, exp.DPipe | exp.Concat):
        return "string"
    if isinstance(node, exp.Anonymous):
        return _call_type(node.name.lower(), [expression_type(a, schema) for a in node.expressions])
    if isinstance(node, exp.Substring | exp.Trim | exp.Overlay):
        return "string"
    if isinstance(node, exp.StrPosition | exp.Extract):
        return "int"
    if isinstance(node, exp.Case):
        branches = [i.args.get("true") for i in node.args.get("ifs", [])] + [node.args.get("default")]
        return _same([expression_type(b, schema) if b is not None else "void" for b in branches])
    return None


def _sides(node: exp.Expr, schema: Schema) -> list[SparkType]:
    return [expression_type(node.this, schema), expression_type(node.expression, schema)]


def _literal_type(node: exp.Literal) -> SparkType:
    if node.is_string:
        return "string"
    text = node.this.lower()
    if any(c in text for c in ".e"):
        return "double" if "e" in text else None  # 1.5 is a decimal of its digits
    return "int" if -(2**31) <= int(text) < 2**31 else "bigint" if -(2**63) <= int(text) < 2**63 else None


_CAST_NAMES = {
    "tinyint": "tinyint",
    "smallint": "smallint",
    "int": "int",
    "bigint": "bigint",
    "float": "float",
    "double": "double",
    "boolean": "boolean",
    "string": "string",
    "text": "string",
    "date": "date",
    "timestamp": "timestamp",
    "timestamp_ntz": "timestamp_ntz",
    "binary": "binary",
}


def _cast_type(to: exp.DataType | None) -> SparkType:
    if to is None:
        return None
    text = to.sql(dialect="spark").lower().replace(" ", "")
    if text.startswith("decimal(") or text.startswith("array<") or text.startswith("map<"):
        return text
    return _CAST_NAMES.get(text)


def _numeric(kind: SparkType) -> SparkType:
    return kind if kind in _INTEGRAL + _FRACTIONAL else None


def _widest(kinds: Iterable[SparkType]) -> SparkType:
    """Spark's result type of + - * % over integral and floating types (decimals: unknown here)."""
    kinds = list(kinds)
    if any(k not in _INTEGRAL + _FRACTIONAL for k in kinds):
        return None
    order = [*_INTEGRAL, *_FRACTIONAL]
    return max((k for k in kinds if k is not None), key=order.index, default=None)


def _same(kinds: list[SparkType]) -> SparkType:
    known = {k for k in kinds if k != "void"}
    return known.pop() if len(known) == 1 and None not in known else None


_STRING_FUNCTIONS = frozenset(
    "upper lower ucase lcase concat concat_ws substr substring trim ltrim rtrim btrim lpad rpad replace "
    "translate initcap reverse repeat left right split_part substring_index format_number format_string "
    "printf md5 sha sha1 sha2 hex base64 date_format from_unixtime to_json get_json_object regexp_replace "
    "regexp_extract regexp_substr soundex space string to_char to_varchar typeof mask url_encode "
    "url_decode parse_url chr char uuid current_timezone".split()
)
_INT_FUNCTIONS = frozenset(
    "length len char_length character_length bit_length octet_length instr locate position hash "
    "year month day dayofmonth dayofweek dayofyear hour minute quarter weekday weekofyear size "
    "cardinality levenshtein ascii find_in_set array_size int".split()
)
_DOUBLE_FUNCTIONS = frozenset(
    "sqrt cbrt exp expm1 ln log log10 log1p log2 pow power sin cos tan asin acos atan atan2 sinh cosh "
    "tanh asinh acosh atanh cot csc sec degrees radians rand randn random pi e hypot rint double avg "
    "mean stddev stddev_pop stddev_samp std variance var_pop var_samp corr covar_pop covar_samp "
    "skewness kurtosis".split()
)
_BIGINT_FUNCTIONS = frozenset(
    "count count_if xxhash64 bigint unix_timestamp to_unix_timestamp unix_seconds unix_millis "
    "unix_micros unix_date crc32 monotonically_increasing_id approx_count_distinct".split()
)
_BOOLEAN_FUNCTIONS = frozenset(
    "isnull isnotnull isnan contains startswith endswith like rlike regexp regexp_like array_contains "
    "arrays_overlap map_contains_key luhn_check equal_null boolean bool_and bool_or every some any "
    "exists forall".split()
)
_ARGUMENT_FUNCTIONS = frozenset(
    "abs positive negative min max first last any_value first_value last_value".split()
)
_COMMON_FUNCTIONS = frozenset("coalesce nvl ifnull nullif greatest least".split())


def _call_type(name: str, args: list[SparkType]) -> SparkType:
    """What a built-in returns over arguments of the given types, where that is fixed."""
    fixed = {
        **dict.fromkeys(_STRING_FUNCTIONS, "string"),
        **dict.fromkeys(_INT_FUNCTIONS, "int"),
        **dict.fromkeys(_DOUBLE_FUNCTIONS, "double"),
        **dict.fromkeys(_BIGINT_FUNCTIONS, "bigint"),
        **dict.fromkeys(_BOOLEAN_FUNCTIONS, "boolean"),
        "to_date": "date",
        "current_date": "date",
        "to_timestamp": "timestamp",
        "current_timestamp": "timestamp",
        "now": "timestamp",
        "float": "float",
        "tinyint": "tinyint",
        "smallint": "smallint",
    }
    if name in fixed:
        return fixed[name]
    if name in _ARGUMENT_FUNCTIONS and args:
        return args[0]
    if name in _COMMON_FUNCTIONS:
        return _same(args)
    if name == "if" and len(args) == 3:
        return _same(args[1:])
    if name in ("round", "bround") and args and args[0] in _INTEGRAL + _FRACTIONAL:
        return args[0]
    if name in ("floor", "ceil", "ceiling") and len(args) == 1 and args[0] in _INTEGRAL + _FRACTIONAL:
        return "bigint"
    if name == "sum" and args:
        return "bigint" if args[0] in _INTEGRAL else "double" if args[0] in _FRACTIONAL else None
    return None


def _aggregation_type(agg: ParsedAggregation, schema: Schema) -> SparkType:
    """The final value's type (runtime/operators/aggregations.py: an average is a double, any other
    aggregation keeps its partial's type)."""
    if agg.fn == "count":
        return "bigint"
    arg = expression_type(agg.arg.node, schema) if agg.arg is not None else None
    return _call_type(agg.fn, [arg])
