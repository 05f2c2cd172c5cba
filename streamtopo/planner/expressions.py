"""Which Spark SQL functions a tenant's expression may call: an allow-list, checked before anything runs.

Expressions (``expr``, ``select``, ``aggregations``) come from whoever may create a StreamTopology and run
inside executors. Spark SQL can call into the JVM (``reflect``, ``java_method``, ``try_reflect``), parse XML
with external entities (``xpath*``), read the executor's identity (``current_user``, ``version``) or fail a
batch on purpose (``raise_error``, ``assert_true``: a crash loop). So only the functions below are allowed:
Spark's built-ins for arithmetic, strings, dates, conditionals, hashes, collections, JSON and aggregates.
Qualified names (``catalog.db.fn``) are refused: they reach persistent, user-registered functions.
tests/runtime/test_expression_policy.py checks every allowed name is a Spark built-in and the denied ones
exist in Spark (so refusing them matters).

This is a lexical check (function calls are identifiers followed by ``(``, outside strings, quoted names and
comments); resolving columns and types is the analyzer's job (runtime/analysis.py).
"""

from __future__ import annotations

import re

ALLOWED_FUNCTIONS: frozenset[str] = frozenset(["abs", "acos", "acosh", "asin", "asinh", "atan", "atan2", "atanh", "bin", "cbrt", "ceil", "ceiling", "conv", "cos", "cosh", "cot", "csc", "degrees", "e", "exp", "expm1", "factorial", "floor", "greatest", "hex", "hypot", "least", "ln", "log", "log10", "log1p", "log2", "mod", "negative", "pi", "pmod", "positive", "pow", "power", "radians", "rint", "round", "bround", "sec", "shiftleft", "shiftright", "shiftrightunsigned", "sign", "signum", "sin", "sinh", "sqrt", "tan", "tanh", "try_add", "try_divide", "try_multiply", "try_subtract", "unhex", "width_bucket", "div", "ascii", "base64", "bit_length", "btrim", "char", "char_length", "character_length", "chr", "concat", "concat_ws", "contains", "decode", "elt", "encode", "endswith", "find_in_set", "format_number", "format_string", "initcap", "instr", "lcase", "left", "len", "length", "levenshtein", "locate", "lower", "lpad", "ltrim", "luhn_check", "mask", "octet_length", "overlay", "position", "printf", "regexp", "regexp_count", "regexp_extract", "regexp_extract_all", "regexp_instr", "regexp_like", "regexp_replace", "regexp_substr", "repeat", "replace", "reverse", "right", "rlike", "rpad", "rtrim", "sentences", "soundex", "space", "split", "split_part", "startswith", "substr", "substring", "substring_index", "to_binary", "to_char", "to_number", "to_varchar", "translate", "trim", "try_to_binary", "try_to_number", "ucase", "unbase64", "upper", "url_decode", "url_encode", "parse_url", "add_months", "convert_timezone", "current_date", "current_timestamp", "current_timezone", "date_add", "date_diff", "date_format", "date_from_unix_date", "date_part", "date_sub", "date_trunc", "dateadd", "datediff", "datepart", "day", "dayofmonth", "dayofweek", "dayofyear", "extract", "from_unixtime", "from_utc_timestamp", "hour", "last_day", "localtimestamp", "make_date", "make_dt_interval", "make_interval", "make_timestamp", "make_timestamp_ltz", "make_timestamp_ntz", "make_ym_interval", "minute", "month", "months_between", "next_day", "now", "quarter", "second", "timestamp_micros", "timestamp_millis", "timestamp_seconds", "to_date", "to_timestamp", "to_timestamp_ltz", "to_timestamp_ntz", "to_unix_timestamp", "to_utc_timestamp", "trunc", "try_to_timestamp", "unix_date", "unix_micros", "unix_millis", "unix_seconds", "unix_timestamp", "weekday", "weekofyear", "year", "window_time", "coalesce", "if", "ifnull", "isnan", "isnotnull", "isnull", "nanvl", "nullif", "nvl", "nvl2", "equal_null", "zeroifnull", "nullifzero", "crc32", "hash", "md5", "sha", "sha1", "sha2", "xxhash64", "array", "array_append", "array_compact", "array_contains", "array_distinct", "array_except", "array_insert", "array_intersect", "array_join", "array_max", "array_min", "array_position", "array_prepend", "array_remove", "array_repeat", "array_size", "array_sort", "array_union", "arrays_overlap", "arrays_zip", "cardinality", "element_at", "explode", "explode_outer", "exists", "filter", "flatten", "forall", "get", "inline", "inline_outer", "map", "map_concat", "map_contains_key", "map_entries", "map_filter", "map_from_arrays", "map_from_entries", "map_keys", "map_values", "map_zip_with", "named_struct", "posexplode", "posexplode_outer", "reduce", "aggregate", "sequence", "shuffle", "size", "slice", "sort_array", "str_to_map", "struct", "transform", "transform_keys", "transform_values", "try_element_at", "zip_with", "from_json", "get_json_object", "json_array_length", "json_object_keys", "json_tuple", "schema_of_json", "to_json", "from_csv", "schema_of_csv", "to_csv", "bit_and", "bit_count", "bit_get", "bit_or", "bit_xor", "getbit", "boolean", "tinyint", "smallint", "int", "bigint", "float", "double", "decimal", "string", "binary", "date", "timestamp", "typeof", "rand", "randn", "random", "uuid", "monotonically_increasing_id", "any", "any_value", "approx_count_distinct", "approx_percentile", "array_agg", "avg", "bool_and", "bool_or", "collect_list", "collect_set", "corr", "count", "count_if", "count_min_sketch", "covar_pop", "covar_samp", "every", "first", "first_value", "histogram_numeric", "kurtosis", "last", "last_value", "max", "max_by", "mean", "median", "min", "min_by", "mode", "percentile", "percentile_approx", "regr_avgx", "regr_avgy", "regr_count", "regr_intercept", "regr_r2", "regr_slope", "regr_sxx", "regr_sxy", "regr_syy", "skewness", "some", "std", "stddev", "stddev_pop", "stddev_samp", "sum", "try_avg", "try_sum", "var_pop", "var_samp", "variance"])
"""Spark SQL built-ins an expression may call (lower case)."""

KEYWORDS: frozenset[str] = frozenset(["and", "or", "not", "in", "is", "like", "ilike", "rlike", "between", "when", "then", "else", "case", "end", "cast", "try_cast", "as", "on", "by", "over", "filter", "within", "distinct", "exists", "values", "interval"])
"""SQL words that may be followed by a parenthesis without being a function call."""

_TOKENS = re.compile(
    r"""(?P<skip>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|--[^\n]*|/\*.*?\*/)"""
    r"""|(?P<name>`(?:[^`]|``)+`|[A-Za-z_][A-Za-z0-9_]*(?:\s*\.\s*(?:`(?:[^`]|``)+`|[A-Za-z_][A-Za-z0-9_]*))*)"""
    r"""(?P<call>\s*\()?""",
    re.DOTALL,
)


def called_functions(expression: str) -> list[str]:
    """Names called in ``expression`` (lower case, backquotes removed, qualified names kept dotted)."""
    calls = []
    for match in _TOKENS.finditer(expression):
        if match.group("name") and match.group("call"):
            parts = re.split(r"\s*\.\s*", match.group("name"))
            calls.append(".".join(p.strip("`").replace("``", "`") for p in parts).lower())
    return calls


def expression_problem(expression: str) -> str | None:
    """Why ``expression`` may not run (the first function outside the allow-list), or None."""
    if "\x00" in expression:
        return "contains a NUL character"
    for name in called_functions(expression):
        if name in KEYWORDS or name in ALLOWED_FUNCTIONS:
            continue
        if "." in name:
            return f"calls {name}(): qualified function names are not allowed"
        return f"calls {name}(), which is not an allowed function (docs/security.md lists them)"
    return None
