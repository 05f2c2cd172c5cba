"""Tenant expressions read by grammar: a real SQL parser and an allow-list, before anything runs.

Expressions (``expr``, ``select``, ``aggregations``) come from whoever may create a StreamTopology and run
inside executors. Spark SQL can call into the JVM (``reflect``, ``java_method``, ``try_reflect``), read
files through a subquery over a file relation (``(SELECT value FROM text.`/etc/passwd`)``), parse XML
with external entities (``xpath*``), read the executor's identity (``current_user``, ``user`` without
parentheses) or fail a batch on purpose (``raise_error``, ``assert_true``: a crash loop). So each
expression is parsed with sqlglot's Spark dialect and admitted only when it is one expression made of an
explicit set of node types (columns, literals, operators, CASE, CAST, lambdas, calls) whose calls name
only the Spark built-ins below; never a subquery, a relation, a window, a parameter, a qualified
(``catalog.db.fn``, persistent) function or a niladic identity function.

The parser is not Spark's, so two independent readings must agree before an expression passes: the
grammar walk above, and a walk over sqlglot's tokens (which read comments, quotes, raw strings and
backslash escapes as Spark's lexer does) that refuses relation and identity keywords and any name called
outside the allow-list. A construct sqlglot would read differently from Spark fails one of the two, and
runtime/plan_guard.py checks Spark's own analysed plan of every step again (the authoritative line).
tests/runtime/test_expression_policy.py holds the allow-list to the Spark the executors run;
tests/planner/test_hostile.py fuzzes both lines with generated hostile expressions.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, ClassVar, Literal

import sqlglot
from sqlglot import exp
from sqlglot.dialects.spark import Spark
from sqlglot.errors import ParseError, TokenError
from sqlglot.parsers.spark import SparkParser
from sqlglot.tokens import Token, TokenType

ALLOWED_FUNCTIONS: frozenset[str] = frozenset(
    [
        "abs",
        "acos",
        "acosh",
        "asin",
        "asinh",
        "atan",
        "atan2",
        "atanh",
        "bin",
        "cbrt",
        "ceil",
        "ceiling",
        "conv",
        "cos",
        "cosh",
        "cot",
        "csc",
        "degrees",
        "e",
        "exp",
        "expm1",
        "factorial",
        "floor",
        "greatest",
        "hex",
        "hypot",
        "least",
        "ln",
        "log",
        "log10",
        "log1p",
        "log2",
        "mod",
        "negative",
        "pi",
        "pmod",
        "positive",
        "pow",
        "power",
        "radians",
        "rint",
        "round",
        "bround",
        "sec",
        "shiftleft",
        "shiftright",
        "shiftrightunsigned",
        "sign",
        "signum",
        "sin",
        "sinh",
        "sqrt",
        "tan",
        "tanh",
        "try_add",
        "try_divide",
        "try_multiply",
        "try_subtract",
        "unhex",
        "width_bucket",
        "div",
        "ascii",
        "base64",
        "bit_length",
        "btrim",
        "char",
        "char_length",
        "character_length",
        "chr",
        "concat",
        "concat_ws",
        "contains",
        "decode",
        "elt",
        "encode",
        "endswith",
        "find_in_set",
        "format_number",
        "format_string",
        "initcap",
        "instr",
        "lcase",
        "left",
        "len",
        "length",
        "levenshtein",
        "locate",
        "lower",
        "lpad",
        "ltrim",
        "luhn_check",
        "mask",
        "octet_length",
        "overlay",
        "position",
        "printf",
        "regexp",
        "regexp_count",
        "regexp_extract",
        "regexp_extract_all",
        "regexp_instr",
        "regexp_like",
        "regexp_replace",
        "regexp_substr",
        "repeat",
        "replace",
        "reverse",
        "right",
        "rlike",
        "rpad",
        "rtrim",
        "sentences",
        "soundex",
        "space",
        "split",
        "split_part",
        "startswith",
        "substr",
        "substring",
        "substring_index",
        "to_binary",
        "to_char",
        "to_number",
        "to_varchar",
        "translate",
        "trim",
        "try_to_binary",
        "try_to_number",
        "ucase",
        "unbase64",
        "upper",
        "url_decode",
        "url_encode",
        "parse_url",
        "add_months",
        "convert_timezone",
        "current_date",
        "current_timestamp",
        "current_timezone",
        "date_add",
        "date_diff",
        "date_format",
        "date_from_unix_date",
        "date_part",
        "date_sub",
        "date_trunc",
        "dateadd",
        "datediff",
        "datepart",
        "day",
        "dayofmonth",
        "dayofweek",
        "dayofyear",
        "extract",
        "from_unixtime",
        "from_utc_timestamp",
        "hour",
        "last_day",
        "localtimestamp",
        "make_date",
        "make_dt_interval",
        "make_interval",
        "make_timestamp",
        "make_timestamp_ltz",
        "make_timestamp_ntz",
        "make_ym_interval",
        "minute",
        "month",
        "months_between",
        "next_day",
        "now",
        "quarter",
        "second",
        "timestamp_micros",
        "timestamp_millis",
        "timestamp_seconds",
        "to_date",
        "to_timestamp",
        "to_timestamp_ltz",
        "to_timestamp_ntz",
        "to_unix_timestamp",
        "to_utc_timestamp",
        "trunc",
        "try_to_timestamp",
        "unix_date",
        "unix_micros",
        "unix_millis",
        "unix_seconds",
        "unix_timestamp",
        "weekday",
        "weekofyear",
        "year",
        "window_time",
        "coalesce",
        "if",
        "ifnull",
        "isnan",
        "isnotnull",
        "isnull",
        "nanvl",
        "nullif",
        "nvl",
        "nvl2",
        "equal_null",
        "zeroifnull",
        "nullifzero",
        "crc32",
        "hash",
        "md5",
        "sha",
        "sha1",
        "sha2",
        "xxhash64",
        "array",
        "array_append",
        "array_compact",
        "array_contains",
        "array_distinct",
        "array_except",
        "array_insert",
        "array_intersect",
        "array_join",
        "array_max",
        "array_min",
        "array_position",
        "array_prepend",
        "array_remove",
        "array_repeat",
        "array_size",
        "array_sort",
        "array_union",
        "arrays_overlap",
        "arrays_zip",
        "cardinality",
        "element_at",
        "explode",
        "explode_outer",
        "exists",
        "filter",
        "flatten",
        "forall",
        "get",
        "inline",
        "inline_outer",
        "map",
        "map_concat",
        "map_contains_key",
        "map_entries",
        "map_filter",
        "map_from_arrays",
        "map_from_entries",
        "map_keys",
        "map_values",
        "map_zip_with",
        "named_struct",
        "posexplode",
        "posexplode_outer",
        "reduce",
        "aggregate",
        "sequence",
        "shuffle",
        "size",
        "slice",
        "sort_array",
        "str_to_map",
        "struct",
        "transform",
        "transform_keys",
        "transform_values",
        "try_element_at",
        "zip_with",
        "from_json",
        "get_json_object",
        "json_array_length",
        "json_object_keys",
        "json_tuple",
        "schema_of_json",
        "to_json",
        "from_csv",
        "schema_of_csv",
        "to_csv",
        "bit_and",
        "bit_count",
        "bit_get",
        "bit_or",
        "bit_xor",
        "getbit",
        "boolean",
        "tinyint",
        "smallint",
        "int",
        "bigint",
        "float",
        "double",
        "decimal",
        "string",
        "binary",
        "date",
        "timestamp",
        "typeof",
        "rand",
        "randn",
        "random",
        "uuid",
        "monotonically_increasing_id",
        "any",
        "any_value",
        "approx_count_distinct",
        "approx_percentile",
        "array_agg",
        "avg",
        "bool_and",
        "bool_or",
        "collect_list",
        "collect_set",
        "corr",
        "count",
        "count_if",
        "count_min_sketch",
        "covar_pop",
        "covar_samp",
        "every",
        "first",
        "first_value",
        "histogram_numeric",
        "kurtosis",
        "last",
        "last_value",
        "max",
        "max_by",
        "mean",
        "median",
        "min",
        "min_by",
        "mode",
        "percentile",
        "percentile_approx",
        "regr_avgx",
        "regr_avgy",
        "regr_count",
        "regr_intercept",
        "regr_r2",
        "regr_slope",
        "regr_sxx",
        "regr_sxy",
        "regr_syy",
        "skewness",
        "some",
        "std",
        "stddev",
        "stddev_pop",
        "stddev_samp",
        "sum",
        "try_avg",
        "try_sum",
        "var_pop",
        "var_samp",
        "variance",
    ]
)
"""Spark SQL built-ins an expression may call (lower case)."""

HIGHER_ORDER: frozenset[str] = frozenset(
    [
        "transform",
        "filter",
        "exists",
        "forall",
        "aggregate",
        "reduce",
        "zip_with",
        "map_filter",
        "map_zip_with",
        "transform_keys",
        "transform_values",
        "array_sort",
    ]
)
"""Allowed functions that take a lambda (``x -> x + 1``): lambdas appear nowhere else."""

GENERATORS: frozenset[str] = frozenset(
    ["explode", "explode_outer", "posexplode", "posexplode_outer", "inline", "inline_outer", "json_tuple"]
)
"""Allowed functions that make rows (Spark's generators): a select using one is not a row per row."""

TS, KG, INPUT = "_ts", "_kg", "_input"
"""The record fields the runtime adds: event time, key group, and which input a join's record came from."""
INTERNAL_PREFIX = "__"
"""Prefix of the runtime's own temporary columns (``__src``, ``__carry_ts``, ``__bucket``)."""

DECOMPOSABLE = ("sum", "count", "avg", "mean", "min", "max")
"""Aggregations an aggregate operator folds into partials that merge (runtime/operators/aggregations.py)."""
AGGREGATION_FORM = re.compile(
    r"^\s*(?P<fn>[A-Za-z_]+)\s*\((?P<arg>.*)\)\s+(?:AS\s+)?(?P<alias>[A-Za-z_]\w*)\s*$",
    re.IGNORECASE | re.DOTALL,
)
"""``fn(expression) AS alias``: how the runtime splits an aggregation (the door reads it the same way)."""

IDENTITY_NAMES = frozenset(["user", "session_user", "current_user", "current_time", "grouping__id"])
"""Names Spark resolves as niladic functions even without parentheses (``SELECT user``): the executor's
identity and clock, or a grouping internal. A column of such a name must be backquoted."""

Role = Literal["expr", "select", "aggregation"]


class ExpressionError(ValueError):
    """Why an expression may not run; the message is written for the tenant (no field path)."""


class _Dialect(Spark):
    """Spark's grammar with every call kept under the name it was written with (``Anonymous``), so the
    allow-list reads the names Spark will resolve instead of sqlglot's normalised function classes.
    Only the syntaxes that are not plain calls keep their parsers (CAST, EXTRACT, TRIM(BOTH ...),
    POSITION(a IN b), SUBSTRING(a FROM ...), OVERLAY(... PLACING ...), CASE)."""

    class Parser(SparkParser):
        FUNCTIONS: ClassVar[dict[str, Callable[..., Any]]] = {}
        FUNCTION_PARSERS = {
            k: v
            for k, v in SparkParser.FUNCTION_PARSERS.items()
            if k in ("CAST", "TRY_CAST", "EXTRACT", "TRIM", "POSITION", "SUBSTRING", "SUBSTR", "OVERLAY")
        }
        NO_PAREN_FUNCTION_PARSERS = {
            k: v for k, v in SparkParser.NO_PAREN_FUNCTION_PARSERS.items() if k == "CASE"
        }


_DIALECT = _Dialect()

_SYNTAX_NAMES: dict[type[exp.Expr], str] = {
    exp.Cast: "cast",
    exp.TryCast: "try_cast",
    exp.Extract: "extract",
    exp.Trim: "trim",
    exp.StrPosition: "position",
    exp.Substring: "substring",
    exp.Overlay: "overlay",
    exp.CurrentDate: "current_date",
    exp.CurrentTimestamp: "current_timestamp",
}
"""Calls with a syntax of their own, parsed to their own node, and the Spark function each is."""

_STRUCTURE: tuple[type[exp.Expr], ...] = (
    exp.Column,
    exp.Identifier,
    exp.Literal,
    exp.RawString,
    exp.HexString,
    exp.Boolean,
    exp.Null,
    exp.Paren,
    exp.Tuple,
    exp.Neg,
    exp.Not,
    exp.And,
    exp.Or,
    exp.Xor,
    exp.Add,
    exp.Sub,
    exp.Mul,
    exp.Div,
    exp.Mod,
    exp.IntDiv,
    exp.EQ,
    exp.NEQ,
    exp.GT,
    exp.GTE,
    exp.LT,
    exp.LTE,
    exp.NullSafeEQ,
    exp.NullSafeNEQ,
    exp.Is,
    exp.In,
    exp.Between,
    exp.Like,
    exp.ILike,
    exp.RegexpLike,
    exp.Escape,
    exp.Case,
    exp.If,
    exp.DataType,
    exp.DataTypeParam,
    exp.ColumnDef,
    exp.Interval,
    exp.Var,
    exp.Lambda,
    exp.Bracket,
    exp.Dot,
    exp.Star,
    exp.BitwiseAnd,
    exp.BitwiseOr,
    exp.BitwiseXor,
    exp.BitwiseNot,
    exp.BitwiseLeftShift,
    exp.BitwiseRightShift,
    exp.DPipe,
    exp.Concat,
    exp.Anonymous,
    *_SYNTAX_NAMES,
)
"""Node types an expression may consist of (an ``Alias`` only at the top of a select item)."""

_REFUSED_WORDS: dict[type[exp.Expr], str] = {
    exp.Subquery: "a subquery",
    exp.Select: "a subquery",
    exp.Exists: "a subquery (EXISTS)",
    exp.Table: "a relation",
    exp.From: "a relation",
    exp.Values: "a relation (VALUES)",
    exp.Window: "a window function (OVER)",
    exp.Filter: "an aggregate FILTER clause",
    exp.Distinct: "DISTINCT",
    exp.Any: "ANY/SOME",
    exp.All: "ALL",
    exp.Placeholder: "a parameter",
    exp.Parameter: "a parameter",
    exp.CurrentUser: "current_user, the executor's identity",
    exp.SessionUser: "session_user, the executor's identity",
    exp.Array: "array(...)[i] (write element_at(array(...), i + 1))",
}

_RELATION_TOKENS = frozenset(
    [
        TokenType.SELECT,
        TokenType.FROM,
        TokenType.TABLE,
        TokenType.VALUES,
        TokenType.WITH,
        TokenType.JOIN,
        TokenType.LATERAL,
        TokenType.UNION,
        TokenType.INTERSECT,
        TokenType.EXCEPT,
    ]
)
_IDENTITY_TOKENS = frozenset(
    [
        TokenType.CURRENT_USER,
        TokenType.SESSION_USER,
        TokenType.CURRENT_ROLE,
        TokenType.CURRENT_SCHEMA,
        TokenType.CURRENT_CATALOG,
    ]
)
_PARAMETER_TOKENS = frozenset(
    [TokenType.PARAMETER, TokenType.PLACEHOLDER, TokenType.SESSION_PARAMETER, TokenType.DOLLAR]
)
_NAME_TOKENS = frozenset([TokenType.VAR, TokenType.IDENTIFIER])


@dataclass(frozen=True)
class Parsed:
    """One expression as the door read it."""

    text: str
    node: exp.Expr
    """The expression, without its alias."""
    alias: str | None
    columns: tuple[str, ...]
    """Input columns it reads (a struct field ``a.b`` reads column ``a``), each once, in order."""
    star: bool = False
    """A select item that is ``*`` (every input column)."""

    @property
    def name(self) -> str | None:
        """The output column's name where the grammar says it: the alias, or a bare column's name."""
        if self.alias is not None:
            return self.alias
        if isinstance(self.node, exp.Column) and isinstance(self.node.this, exp.Identifier):
            return self.node.name
        if isinstance(self.node, exp.Dot) and isinstance(self.node.expression, exp.Identifier):
            return self.node.expression.name
        return None


@dataclass(frozen=True)
class ParsedAggregation:
    """``fn(arg) AS alias`` of an aggregate operator."""

    fn: str
    arg: Parsed | None
    """None for ``count(*)``."""
    alias: str


def parse_expression(text: str, role: Literal["expr", "select"] = "expr") -> Parsed:
    """``text`` read by grammar as a filter predicate (``expr``) or a select item; raises
    :class:`ExpressionError` saying what is not allowed. Short expressions (most) are read once per
    process: the model's validator and the typed view (planner/schema.py) read each of them."""
    if len(text) <= CACHED_LENGTH:
        verdict = _cached(text, role)
        if isinstance(verdict, ExpressionError):
            raise ExpressionError(str(verdict))
        return verdict
    return _read(text, role)


CACHED_LENGTH = 512
"""Expressions up to this long keep their reading (at most :data:`CACHED_READINGS` of them): longer ones,
rare and bounded by the spec's total (model.MAX_EXPRESSION_TEXT), are read again when asked."""
CACHED_READINGS = 4096


@lru_cache(maxsize=CACHED_READINGS)
def _cached(text: str, role: Literal["expr", "select"]) -> Parsed | ExpressionError:
    try:
        return _read(text, role)
    except ExpressionError as error:
        return error


MAX_DEPTH = 100
"""Levels of nesting an expression may have (parentheses, calls, operator chains): deeper trees would
cost recursion in every reader (the parser's, the typed view's, Spark's analyser) for no pipeline's sake."""


def _read(text: str, role: Literal["expr", "select"]) -> Parsed:
    tokens = _tokens(text)
    _check_nesting(tokens)
    node = _parse(text)
    _check_depth(node)
    alias = None
    if isinstance(node, exp.Alias):
        if role != "select":
            raise ExpressionError("is a select item (it has an alias), not a predicate")
        if not isinstance(node.args.get("alias"), exp.Identifier):
            raise ExpressionError("has an alias that is not a name")
        alias, node = node.alias, node.this
    if isinstance(node, exp.Star):
        if role != "select" or alias is not None:
            raise ExpressionError("uses * where only a select item may")
        _check_tokens(tokens)
        return Parsed(text, node, None, (), star=True)
    _check_tree(node)
    _check_tokens(tokens)
    return Parsed(text, node, alias, _columns(node))


def parse_aggregation(text: str) -> ParsedAggregation:
    """``fn(expression) AS alias`` with ``fn`` decomposable, read as the runtime splits it
    (:data:`AGGREGATION_FORM`) and its argument by grammar; raises :class:`ExpressionError`."""
    match = AGGREGATION_FORM.match(text)
    if not match:
        raise ExpressionError("is not of the form 'fn(expression) AS alias'")
    fn, arg, alias = match.group("fn").lower(), match.group("arg").strip(), match.group("alias")
    _check_tokens(_tokens(text))
    if fn not in DECOMPOSABLE:
        raise ExpressionError(f"{fn}() is not decomposable; use one of {', '.join(DECOMPOSABLE)}")
    if not arg:
        raise ExpressionError(f"{fn}() needs an argument")
    if arg == "*":
        if fn != "count":
            raise ExpressionError("only count accepts *")
        return ParsedAggregation(fn, None, alias)
    if re.match(r"distinct\b", arg, re.IGNORECASE):
        raise ExpressionError(f"{fn}(DISTINCT ...) is not decomposable")
    if any(token.comments for token in _tokens(arg)):
        raise ExpressionError("has a comment inside the aggregation's argument")
    return ParsedAggregation(fn, parse_expression(arg), alias)


def makes_rows(parsed: Parsed) -> bool:
    """Whether a select item calls a generator (:data:`GENERATORS`): its map's output is then not one
    record per input record."""
    return any(
        isinstance(node, exp.Anonymous) and node.name.lower() in GENERATORS for node in parsed.node.walk()
    )


def expression_problem(text: str, role: Role = "expr") -> str | None:
    """Why ``text`` may not run in ``role``, or None; an alias must not shadow the runtime's columns."""
    try:
        if role == "aggregation":
            alias: str | None = parse_aggregation(text).alias
        else:
            alias = parse_expression(text, role).alias
    except ExpressionError as error:
        return str(error)
    return output_name_problem(alias, event_time=role == "select") if alias is not None else None


def output_name_problem(name: str, *, event_time: bool) -> str | None:
    """Why an operator may not produce a column called ``name``: the runtime's own fields are never
    shadowed. ``event_time``: whether ``_ts`` may be set (a map's select list re-timestamps records)."""
    if name in (KG, INPUT) or name.startswith(INTERNAL_PREFIX) or (name == TS and not event_time):
        return f"column {name!r} is reserved for the runtime ({KG}, {INPUT}, {TS} and names starting {INTERNAL_PREFIX})"
    return None


# ----------------------------------------------------------------------------------------- readings


def _tokens(text: str) -> list[Token]:
    if "\x00" in text:
        raise ExpressionError("contains a NUL character")
    try:
        return list(_DIALECT.tokenize(text))
    except TokenError:
        raise ExpressionError("cannot be read (an unclosed quote or comment?)") from None


def _parse(text: str) -> exp.Expr:
    try:
        statements = sqlglot.parse(text, read=_DIALECT)
    except ParseError as error:
        raise ExpressionError(f"cannot be parsed: {_syntax(error)}") from None
    except TokenError:
        raise ExpressionError("cannot be read (an unclosed quote or comment?)") from None
    except RecursionError:
        raise ExpressionError("is nested too deeply") from None
    if len(statements) != 1 or statements[0] is None:
        raise ExpressionError("must be exactly one expression")
    return statements[0]


def _check_nesting(tokens: list[Token]) -> None:
    """Brackets nested deeper than :data:`MAX_DEPTH`, refused before the (recursive) parser sees them."""
    depth = 0
    for token in tokens:
        if token.token_type in (TokenType.L_PAREN, TokenType.L_BRACKET, TokenType.L_BRACE):
            depth += 1
            if depth > MAX_DEPTH:
                raise ExpressionError(f"is nested more than {MAX_DEPTH} levels deep")
        elif token.token_type in (TokenType.R_PAREN, TokenType.R_BRACKET, TokenType.R_BRACE):
            depth -= 1


def _check_depth(root: exp.Expr) -> None:
    """The parsed tree at most :data:`MAX_DEPTH` deep (a chain ``a + a + ...`` nests without brackets)."""
    stack = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ExpressionError(
                f"is nested more than {MAX_DEPTH} levels deep (split it, or use a function)"
            )
        stack.extend((child, depth + 1) for child in node.iter_expressions())


def _syntax(error: ParseError) -> str:
    """A parse error in the tenant's words (sqlglot's descriptions name its own classes)."""
    first = error.errors[0] if error.errors else {}
    description = str(first.get("description") or "a syntax error")
    if description.startswith("Required keyword"):
        description = "an operand or argument is missing"
    elif description.startswith("Invalid expression / Unexpected token"):
        description = "unexpected token"
    where = f" at column {first['col']}" if first.get("col") else ""
    return f"{description}{where}"


def _check_tree(root: exp.Expr) -> None:
    """Every node of an allowed type, every call an allowed function, lambdas only as arguments of
    higher-order functions, ``*`` only as ``count(*)``'s argument."""
    for node in root.walk():
        kind = type(node)
        if kind in _REFUSED_WORDS:
            raise ExpressionError(f"contains {_REFUSED_WORDS[kind]}, which is not allowed")
        if not isinstance(node, _STRUCTURE) or (isinstance(node, exp.Alias)):
            raise ExpressionError(f"contains {kind.__name__}, which is not an allowed construct")
        if isinstance(node, exp.Anonymous):
            name = node.name.lower()
            if name not in ALLOWED_FUNCTIONS:
                raise ExpressionError(f"calls {name}(), which is not an allowed function (docs/security.md)")
        elif kind in _SYNTAX_NAMES and _SYNTAX_NAMES[kind] not in ALLOWED_FUNCTIONS | {"cast", "try_cast"}:
            raise ExpressionError(f"calls {_SYNTAX_NAMES[kind]}, which is not an allowed function")
        elif isinstance(node, exp.In) and any(node.args.get(k) for k in ("query", "unnest", "field")):
            raise ExpressionError("contains a subquery (IN), which is not allowed")
        elif isinstance(node, exp.Lambda):
            parent = node.parent
            if not (isinstance(parent, exp.Anonymous) and parent.name.lower() in HIGHER_ORDER):
                raise ExpressionError("has a lambda outside a higher-order function")
        elif isinstance(node, exp.Star):
            parent = node.parent
            if not (isinstance(parent, exp.Anonymous) and parent.name.lower() == "count"):
                raise ExpressionError("uses * outside count(*)")
        elif isinstance(node, exp.Dot) and not isinstance(node.expression, exp.Identifier):
            raise ExpressionError("calls a qualified function name, which is not allowed")
        elif isinstance(node, exp.Column) and not isinstance(node.this, exp.Identifier):
            raise ExpressionError("uses qualifier.*, which is not allowed")


def _check_tokens(tokens: list[Token]) -> None:
    """The second reading: relation, identity and parameter keywords anywhere, and calls by name."""
    for i, token in enumerate(tokens):
        kind = token.token_type
        before = tokens[i - 1].token_type if i else None
        after = tokens[i + 1].token_type if i + 1 < len(tokens) else None
        if kind in _RELATION_TOKENS:
            raise ExpressionError(f"contains {token.text.upper()}: subqueries and relations are not allowed")
        if kind in _IDENTITY_TOKENS:
            raise ExpressionError(
                f"reads {token.text.lower()}, the executor's identity, which is not allowed"
            )
        if kind in _PARAMETER_TOKENS:
            raise ExpressionError("contains a parameter, which is not allowed")
        if kind == TokenType.SEMICOLON:
            raise ExpressionError("must be exactly one expression (no ';')")
        if kind == TokenType.VAR and before != TokenType.DOT and token.text.lower() in IDENTITY_NAMES:
            raise ExpressionError(
                f"reads {token.text.lower()}, which Spark resolves as a function (the executor's "
                f"identity or clock); backquote a column of that name: `{token.text}`"
            )
        if kind in _NAME_TOKENS and after == TokenType.L_PAREN:
            name = token.text.lower()
            if before == TokenType.DOT:
                raise ExpressionError(f"calls {name}() by a qualified name, which is not allowed")
            if name not in ALLOWED_FUNCTIONS and name not in ("cast", "try_cast"):
                raise ExpressionError(f"calls {name}(), which is not an allowed function (docs/security.md)")


def _columns(root: exp.Expr) -> tuple[str, ...]:
    """The input columns an expression reads: each column reference's first part, lambda variables
    excepted (sqlglot reads those as identifiers, not columns)."""
    names: dict[str, None] = {}
    for node in root.walk(bfs=False):
        if isinstance(node, exp.Column):
            parts = [p.name for p in node.parts]
            names.setdefault(parts[0], None)
    return tuple(names)
