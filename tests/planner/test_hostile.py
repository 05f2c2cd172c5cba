"""Hostile documents and expressions, generated as a tenant would try them (issue 32's acceptance).

Expressions: a dangerous core (a reflective call, a subquery, a relation, the executor's identity, a file
reader, a qualified function) in every spelling the grammar allows (case, backquotes, comments and line
breaks between a name and its parenthesis, nested comments, raw and escaped strings around it, ODBC
escapes, a parser differential such as ``array(...)[i]``), wrapped in benign contexts (calls, CASE,
casts, lambdas, arithmetic), placed in every expression field (filter, select, aggregation argument).
Documents: the examples with one of those expressions, or another hostile field (loader variables, mounts
over the runtime, URLs with userinfo or look-alike hosts and ports, malformed images, reserved column
names, missing columns, sizes that cannot plan), plus garbage (unclosed quotes, deep nesting, NULs,
huge literals).

Each case must be refused by the one validator naming the field (never a traceback, never a hang), and
no expression with a dangerous core may be admitted. The counts are printed (``pytest -s``)."""

from __future__ import annotations

import copy
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_fuzz import no_hang, refusal

from streamtopo.planner.expressions import expression_problem

ROOT = Path(__file__).parents[2]
SEED = 32
EXPRESSIONS = 1200
DOCUMENTS = 1200

CORES: dict[str, list[str]] = {
    "reflective": [
        "reflect('java.lang.Runtime', 'getRuntime')",
        "java_method('java.lang.System', 'getenv', 'HOME')",
        "try_reflect('java.lang.System', 'getenv', 'HOME')",
        "{fn reflect('java.lang.System', 'getenv')}",
        "array(reflect('java.lang.System', 'getenv', 'HOME'))[0]",
        "identifier('reflect')('a', 'b')",
        "xpath_string('<a/>', '/a')",
        "spark_catalog.default.steal(1)",
        "`db`.`fn`(1)",
        "raise_error('boom')",
    ],
    "subquery": [
        "(SELECT max(value) FROM text.`/etc/hostname`)",
        "exists(SELECT 1)",
        "key IN (SELECT 1)",
        "key = ANY (SELECT 1)",
        "(WITH t AS (SELECT 1 AS c) SELECT c FROM t)",
        "(SELECT * FROM VALUES (1))",
        "(SELECT 1 FROM range(10))",
        "(SELECT value FROM json.`/var/run/secrets/token`)",
        "(TABLE secrets)",
        "(SELECT 1 UNION SELECT 2)",
    ],
    "identity": [
        "current_user",
        "current_user()",
        "user",
        "session_user",
        "session_user()",
        "CURRENT_USER /* c */ ()",
        "input_file_name()",
        "input_file_block_start()",
        "version()",
    ],
}
NAMES = [
    "reflect",
    "java_method",
    "try_reflect",
    "xpath_string",
    "current_user",
    "input_file_name",
    "version",
]
"""Called cores whose name is respelled (Spark reads bare ``current_role`` and ``current_catalog`` as
columns, so they are not cores: the typed view refuses them as missing columns)."""
GAPS = [" ", "\n", "\t", "/**/", "/* x */", "--c\n", "/* /* */ */", " /*+ hint */ "]
CONTEXTS = [
    "{}",
    "upper({})",
    "({}) IS NOT NULL",
    "coalesce({}, 1)",
    "CASE WHEN true THEN {} END",
    "transform(array(1), x -> {})",
    "1 + ({})",
    "CAST({} AS STRING)",
    "'\\\\' || {}",
    '"q" || {}',
    "concat('it''s', {})",
    "if(({}) IS NULL, 1, 2)",
    "filter(array(1), x -> ({}) IS NULL)",
]


def respell(core: str, rng: random.Random) -> str:
    """The same core with a name's case changed, backquoted, or a gap before its parenthesis."""
    for name in NAMES:
        if core.startswith(name + "("):
            spelled = rng.choice([name, name.upper(), f"`{name}`", name.capitalize()])
            return spelled + rng.choice(GAPS + [""]) + core[len(name) :]
    if rng.random() < 0.3:
        return core.replace("SELECT", rng.choice(["select", "SeLeCt", "SELECT /* x */"]), 1)
    return core


def hostile_expressions(n: int, rng: random.Random) -> list[tuple[str, str]]:
    """(category, expression) with a dangerous core."""
    out = []
    for _ in range(n):
        category = rng.choice(sorted(CORES))
        core = respell(rng.choice(CORES[category]), rng)
        text = rng.choice(CONTEXTS).format(core)
        if rng.random() < 0.3:
            text = "(" * (k := rng.randint(1, 20)) + text + ")" * k
        out.append((category, text))
    return out


def garbage(rng: random.Random) -> str:
    """What a fuzzer sends: unclosed quotes and comments, deep nesting, NULs, odd bytes, huge literals."""
    return rng.choice(
        [
            "'" + "a" * rng.randint(1, 4000),
            "/* " * rng.randint(1, 200),
            "(" * rng.randint(100, 4000),
            "a" + "\x00" + "b",
            "x" * 4096,
            "1" * 4000,
            "'" + "\\'" * 1000,
            "r'\\' || reflect('a', 'b') || '",
            "\u202e reflect('a', 'b')",
            "sum(" * 900 + "x" + ")" * 900,
            "a" + " AND a" * 600,
            "`" * rng.randint(1, 999),
            "${x}",
            ":x",
            "?",
            "1;2",
            "a -> b",
        ]
    )


def examples() -> list[dict[str, Any]]:
    names = ["vwap.yaml", "wordcount.yaml", "windowed-join.yaml", "sequence-count.yaml", "macd.yaml"]
    return [yaml.safe_load((ROOT / "examples" / name).read_text()) for name in names]


def place(document: dict[str, Any], text: str, rng: random.Random) -> tuple[dict[str, Any], str]:
    """``document`` with ``text`` in one expression field of one operator; the field path."""
    doc = copy.deepcopy(document)
    ops = doc["spec"]["operators"]
    i, op = rng.choice([(i, op) for i, op in enumerate(ops) if op["kind"] in ("filter", "map", "aggregate")])
    if op["kind"] == "filter":
        op["expr"] = text
        return doc, f"spec.operators[{i}].expr"
    if op["kind"] == "map":
        op["select"] = [*op["select"], f"{text} AS evil"]
        return doc, f"spec.operators[{i}].select[{len(op['select']) - 1}]"
    op["aggregations"] = [*op["aggregations"], f"sum({text}) AS evil"]
    return doc, f"spec.operators[{i}].aggregations[{len(op['aggregations']) - 1}]"


def other_hostile(document: dict[str, Any], rng: random.Random) -> tuple[dict[str, Any], str, str]:
    """(document, field, category): a hostile field that is not an expression."""
    choice = rng.randrange(8)
    if choice in (4, 5, 6):  # fields of a map, a filter and an aggregate: VWAP has all three
        document = yaml.safe_load((ROOT / "examples" / "vwap.yaml").read_text())
    doc = copy.deepcopy(document)
    spec = doc["spec"]
    if choice == 0:
        name = rng.choice(
            ["LD_PRELOAD", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "PYTHONPATH", "PYTHONSTARTUP"]
            + ["PYSPARK_SUBMIT_ARGS", "SPARK_CONF_DIR", "LD_AUDIT", "CLASSPATH", "GCONV_PATH", "HOME"]
        )
        spec["executor"] = {"env": [{"name": name, "value": "/mnt/evil"}]}
        return doc, "spec.executor.env[0].name", "loader variable"
    if choice == 1:
        path = rng.choice(
            ["/", "/usr/lib/python3.11", "/etc", "/opt/java", "/tmp/x", "/usr/local/lib", "/lib64"]
        )
        spec["executor"] = {
            "volumeMounts": [{"name": "v", "mountPath": path}],
            "podTemplate": {"spec": {"volumes": [{"name": "v", "configMap": {"name": "c"}}]}},
        }
        return doc, "spec.executor.volumeMounts[0].mountPath", "mount over the runtime"
    if choice == 2:
        url = rng.choice(
            [
                "http://prometheus:9090@evil.example/",
                "http://user:pw@prometheus:9090",
                "http://prometheus:90900",
                "http://prometheus:9090/../admin",
                "file:///etc/passwd",
                "gopher://prometheus:9090",
            ]
        )
        spec["metrics"] = {"prometheus": {"url": url}}
        return doc, "spec.metrics.prometheus.url", "URL"
    if choice == 3:
        spec["image"] = rng.choice(
            ["Bad Image!!:latest", "a b", "UPPER/app", "app:", "x@sha256:12", "-bad/app"]
        )
        return doc, "spec.image", "image reference"
    if choice == 4:
        i, op = next((i, op) for i, op in enumerate(spec["operators"]) if op["kind"] == "map")
        op["select"] = [*op["select"], f"1 AS {rng.choice(['_kg', '_input', '__src', '__carry_ts'])}"]
        return doc, f"spec.operators[{i}].select[{len(op['select']) - 1}]", "reserved column"
    if choice == 5:
        i, op = next((i, op) for i, op in enumerate(spec["operators"]) if op["kind"] == "filter")
        op["expr"] = "no_such_column > 0"
        return doc, f"spec.operators[{i}].expr", "missing column"
    if choice == 6:
        i, op = next((i, op) for i, op in enumerate(spec["operators"]) if op["kind"] == "aggregate")
        op["keyBy"] = ["no_such_key"]
        return doc, f"spec.operators[{i}].keyBy", "missing key"
    spec["keyGroups"] = 4096
    spec["fusion"] = {"graph": "unit"}
    for op in spec["operators"]:
        op.pop("keyGroups", None)
    return doc, "spec.keyGroups", "cannot plan in time"


@pytest.mark.slow
def test_hostile_expressions_and_documents_are_refused_without_traceback_or_hang() -> None:
    rng = random.Random(SEED)
    counts: Counter[str] = Counter()
    admitted = []
    for category, text in hostile_expressions(EXPRESSIONS, rng):
        counts[f"expression:{category}"] += 1
        with no_hang():
            role = rng.choice(["expr", "select", "aggregation"])
            problem = expression_problem(f"sum({text}) AS x" if role == "aggregation" else text, role)
        if problem is None:
            admitted.append(text)
    for _ in range(200):
        text = garbage(rng)
        counts["expression:garbage"] += 1
        with no_hang():
            expression_problem(text, rng.choice(["expr", "select", "aggregation"]))
    assert admitted == []

    bases, unrefused, unnamed = examples(), [], []
    for _ in range(DOCUMENTS):
        base = rng.choice(bases)
        if rng.random() < 0.6:
            category, text = hostile_expressions(1, rng)[0]
            document, field = place(base, text, rng)
        elif rng.random() < 0.5:
            document, field = place(base, garbage(rng), rng)
            category = "garbage"
        else:
            document, field, category = other_hostile(base, rng)
        counts[f"document:{category}"] += 1
        problems = refusal(document)
        if not problems and category == "garbage":
            counts["document:garbage admitted (benign: a long literal or column)"] += 1
        elif not problems:
            unrefused.append((category, field))
        elif not any(path.startswith(field) or field.startswith(path) for path, _ in problems):
            unnamed.append((field, problems))
    assert unrefused == []
    assert unnamed == []
    total = sum(n for key, n in counts.items() if "admitted" not in key)
    print(f"\nhostile fuzz (seed {SEED}): {total} cases, none hung or raised; every hostile one refused")
    for key, n in sorted(counts.items()):
        print(f"  {key}: {n}")
    assert total >= 2000
