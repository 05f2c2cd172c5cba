"""Malformed topologies at the door: hundreds generated from the examples (every leaf of every field given a
value of the wrong kind, NaN or infinity, an unknown field beside every mapping) plus the hand-written cases
security review found. Each must be refused by the one validator (``load_topology``, used by the CLI and the
operator alike) with a message naming the field, never a traceback, never a hang; the CLI exits 2."""

from __future__ import annotations

import copy
import math
import re
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from streamtopo.cli import app
from streamtopo.documents import load_topology
from streamtopo.planner.expressions import expression_problem
from streamtopo.planner.model import TopologyError, to_camel

ROOT = Path(__file__).parents[2]
BASES = ["vwap.yaml", "wordcount.yaml", "windowed-join.yaml", "ha-pipeline.yaml", "sequence-count.yaml"]
HANG_GUARD = 10
"""Seconds after which a case counts as hung (issue 14's bar); a guard against hangs, not a speed test."""


@contextmanager
def no_hang(seconds: int = HANG_GUARD) -> Iterator[None]:
    def hung(*_: Any) -> None:
        raise TimeoutError(f"validation did not finish within {seconds}s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def leaves(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(path, value) of every leaf and of every mapping and list, in the validator's path spelling."""
    yield path, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from leaves(item, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from leaves(item, f"{path}[{i}]")


def set_at(document: dict, path: str, value: Any) -> dict:
    out = copy.deepcopy(document)
    parts = re.findall(r"[^.\[\]]+|\[\d+\]", path)
    target: Any = out
    for part in parts[:-1]:
        target = target[int(part[1:-1])] if part.startswith("[") else target[part]
    last = parts[-1]
    if last.startswith("["):
        target[int(last[1:-1])] = value
    else:
        target[last] = value
    return out


def wrong_values(value: Any) -> list[Any]:
    """Values of another kind than ``value`` that no field of that kind accepts."""
    if isinstance(value, bool):
        return ["maybe", [value]]
    if isinstance(value, int | float):
        return [math.nan, math.inf, "many", [value], True]
    if isinstance(value, str):
        return [{"not": "a string"}, [value]]
    if isinstance(value, list):
        return ["not a list", {"not": "a list"}]
    if isinstance(value, dict):
        return ["not a mapping", [1, 2]]
    return []


def generated_cases() -> list[tuple[str, dict, str]]:
    """(case id, document, the field path the refusal must name)."""
    cases = []
    for base in BASES:
        document = yaml.safe_load((ROOT / "examples" / base).read_text())
        for path, value in leaves(document):
            if not path.startswith("spec") or path == "spec":
                continue  # metadata admits extra fields (labels, annotations as Kubernetes does)
            for i, wrong in enumerate(wrong_values(value)):
                cases.append((f"{base}:{path}:{i}", set_at(document, path, wrong), path))
            if isinstance(value, dict):
                cases.append(
                    (
                        f"{base}:{path}:extra",
                        set_at(document, path, {**value, "bogusField": 1}),
                        f"{path}.bogusField",
                    )
                )
    return cases[::3]  # every third keeps each field's kinds of mistakes while the suite stays quick


GENERATED = generated_cases()
MINIMAL = {
    "metadata": {"name": "t"},
    "spec": {
        "operators": [
            {"name": "s", "kind": "source", "source": {"generator": "sequence"}},
            {"name": "out", "kind": "sink", "inputs": ["s"], "sink": {"file": {}}},
        ]
    },
}


def with_operator(op: dict) -> dict:
    document = copy.deepcopy(MINIMAL)
    document["spec"]["operators"].insert(1, op)
    document["spec"]["operators"][-1]["inputs"] = [op["name"]]
    return document


HAND_WRITTEN: list[tuple[str, Any, str]] = [
    (
        "reflect",
        with_operator(
            {
                "name": "f",
                "kind": "filter",
                "inputs": ["s"],
                "expr": "reflect('java.lang.Runtime', 'getRuntime') IS NOT NULL",
            }
        ),
        "spec.operators[1].expr",
    ),
    (
        "java_method",
        with_operator(
            {
                "name": "m",
                "kind": "map",
                "inputs": ["s"],
                "select": ["key", "java_method('java.lang.System', 'getenv', 'HOME') AS h"],
            }
        ),
        "spec.operators[1].select",
    ),
    (
        "try_reflect backquoted",
        with_operator(
            {"name": "f", "kind": "filter", "inputs": ["s"], "expr": "`try_reflect`('a', 'b') = 'x'"}
        ),
        "spec.operators[1].expr",
    ),
    (
        "xpath",
        with_operator({"name": "m", "kind": "map", "inputs": ["s"], "select": ["xpath('<a/>', '/a') AS x"]}),
        "spec.operators[1].select",
    ),
    (
        "raise_error",
        with_operator(
            {"name": "f", "kind": "filter", "inputs": ["s"], "expr": "raise_error('boom') IS NULL"}
        ),
        "spec.operators[1].expr",
    ),
    (
        "qualified function",
        with_operator(
            {
                "name": "a",
                "kind": "aggregate",
                "inputs": ["s"],
                "keyBy": ["key"],
                "aggregations": ["default.steal(value) AS x"],
            }
        ),
        "spec.operators[1].aggregations",
    ),
    (
        "sink path escapes",
        {
            **MINIMAL,
            "spec": {
                "operators": [
                    MINIMAL["spec"]["operators"][0],
                    {
                        "name": "out",
                        "kind": "sink",
                        "inputs": ["s"],
                        "sink": {"file": {"path": "../../etc/cron.d/x"}},
                    },
                ]
            },
        },
        "spec.operators[1].sink.file.path",
    ),
    (
        "sink path absolute",
        {
            **MINIMAL,
            "spec": {
                "operators": [
                    MINIMAL["spec"]["operators"][0],
                    {
                        "name": "out",
                        "kind": "sink",
                        "inputs": ["s"],
                        "sink": {"file": {"path": "/etc/passwd"}},
                    },
                ]
            },
        },
        "spec.operators[1].sink.file.path",
    ),
    (
        "NaN rate",
        set_at(MINIMAL, "spec.operators[0].source", {"generator": "sequence", "ratePerSecond": math.nan}),
        "spec.operators[0].source.ratePerSecond",
    ),
    (
        "infinite cost",
        set_at(MINIMAL, "spec.operators[0].cost", {"cpu": math.inf}),
        "spec.operators[0].cost.cpu",
    ),
    ("interval 0s", set_at(MINIMAL, "spec.autoscaling", {"interval": "0s"}), "spec.autoscaling.interval"),
    (
        "interval 500ms",
        set_at(MINIMAL, "spec.autoscaling", {"interval": "500ms"}),
        "spec.autoscaling.interval",
    ),
    ("keyGroups true", set_at(MINIMAL, "spec.keyGroups", True), "spec.keyGroups"),
    (
        "maxExecutors 1e12",
        set_at(MINIMAL, "spec.autoscaling", {"maxExecutors": 10**12}),
        "spec.autoscaling.maxExecutors",
    ),
    (
        "huge generator keys",
        set_at(MINIMAL, "spec.operators[0].source", {"generator": "sequence", "keys": 10**15}),
        "spec.operators[0].source.keys",
    ),
    (
        "huge seed",
        set_at(MINIMAL, "spec.operators[0].source", {"generator": "sequence", "seed": 10**40}),
        "spec.operators[0].source.seed",
    ),
    (
        "file:// prometheus",
        set_at(MINIMAL, "spec.metrics", {"prometheus": {"url": "file:///etc/passwd"}}),
        "spec.metrics.prometheus.url",
    ),
    (
        "stream name with spaces",
        set_at(MINIMAL, "spec.operators[0].source", {"stream": "a b"}),
        "spec.operators[0].source.stream",
    ),
    (
        "too many operators",
        set_at(
            MINIMAL,
            "spec.operators",
            [{"name": f"s{i}", "kind": "source", "source": {"generator": "sequence"}} for i in range(600)],
        ),
        "spec.operators",
    ),
]


def issue_32(name: str, op: dict, field: str) -> tuple[str, dict, str]:
    """One attack of issue 32 (as found against the lexical check), in a minimal topology."""
    return (name, with_operator(op), field)


def mapped(name: str, *select: str) -> tuple[str, dict, str]:
    return issue_32(
        name, {"name": "m", "kind": "map", "inputs": ["s"], "select": list(select)}, "spec.operators[1]"
    )


def filtered(name: str, expr: str) -> tuple[str, dict, str]:
    return issue_32(
        name, {"name": "f", "kind": "filter", "inputs": ["s"], "expr": expr}, "spec.operators[1].expr"
    )


HAND_WRITTEN += [
    filtered(
        "comment before the parenthesis", "reflect /* hidden */ ('java.lang.Runtime', 'getRuntime') IS NULL"
    ),
    filtered("line comment before the parenthesis", "java_method --\n('java.lang.System', 'getenv') IS NULL"),
    filtered("raw string confusing the tokenizer", "r'\\' || reflect('a', 'b') || '' = 'x'"),
    filtered("niladic current_user", "current_user = 'root'"),
    filtered("niladic user", "user = 'root'"),
    filtered("niladic session_user", "session_user IS NOT NULL"),
    mapped(
        "subquery over a file in a select list", "key", "(SELECT max(value) FROM text.`/etc/passwd`) AS p"
    ),
    filtered("subquery over a file in a filter", "exists(SELECT value FROM text.`/proc/self/environ`)"),
    issue_32(
        "subquery over a file in an aggregation",
        {
            "name": "a",
            "kind": "aggregate",
            "inputs": ["s"],
            "keyBy": ["key"],
            "aggregations": ["count((SELECT max(value) FROM text.`/var/run/secrets/token`)) AS n"],
        },
        "spec.operators[1].aggregations",
    ),
    filtered("IN subquery", "key IN (SELECT 1)"),
    filtered("array(...)[i] hiding a call from the parser", "array(reflect('a', 'b'))[0] IS NULL"),
    filtered("missing column", "valeu > 0"),
    issue_32(
        "keyBy on a missing column",
        {
            "name": "a",
            "kind": "aggregate",
            "inputs": ["s"],
            "keyBy": ["kee"],
            "aggregations": ["count(*) AS n"],
        },
        "spec.operators[1].keyBy",
    ),
    mapped("a reserved output column", "key", "1 AS _kg"),
    (
        "join keys of different types",
        {
            "metadata": {"name": "t"},
            "spec": {
                "operators": [
                    {"name": "l", "kind": "source", "source": {"generator": "sequence"}},
                    {"name": "r", "kind": "source", "source": {"generator": "words"}},
                    {"name": "w", "kind": "map", "inputs": ["r"], "select": ["word AS key"]},
                    {
                        "name": "j",
                        "kind": "join",
                        "inputs": ["l", "w"],
                        "keyBy": ["key"],
                        "window": {"size": 1},
                    },
                    {"name": "out", "kind": "sink", "inputs": ["j"], "sink": {"file": {}}},
                ]
            },
        },
        "spec.operators[3].keyBy",
    ),
    ("image reference", set_at(MINIMAL, "spec.image", "Bad Image!!:latest"), "spec.image"),
    *(
        (
            f"env {name}",
            set_at(MINIMAL, "spec.executor", {"env": [{"name": name, "value": "/x"}]}),
            "spec.executor.env[0].name",
        )
        for name in ("LD_PRELOAD", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "PYTHONPATH", "PYTHONSTARTUP")
        + ("PYSPARK_SUBMIT_ARGS", "SPARK_CONF_DIR")
    ),
    *(
        (
            f"prometheus {url}",
            set_at(MINIMAL, "spec.metrics", {"prometheus": {"url": url}}),
            "spec.metrics.prometheus.url",
        )
        for url in ("http://allowed:9090@other/", "http://prometheus:90900", "http://u:p@prometheus:9090")
    ),
    (
        "4096 key groups at a huge rate",
        set_at(
            set_at(MINIMAL, "spec.keyGroups", 4096),
            "spec.operators",
            [
                {"name": "s", "kind": "source", "source": {"generator": "sequence", "ratePerSecond": 1e8}},
                {
                    "name": "a",
                    "kind": "aggregate",
                    "inputs": ["s"],
                    "keyBy": ["key"],
                    "aggregations": ["count(*) AS n"],
                },
                {
                    "name": "b",
                    "kind": "aggregate",
                    "inputs": ["a"],
                    "keyBy": ["n"],
                    "aggregations": ["count(*) AS m"],
                },
                {"name": "out", "kind": "sink", "inputs": ["b"], "sink": {"file": {}}},
            ],
        ),
        "spec.keyGroups",
    ),
]
UNCLOSED = "\n".join(f'    - "\'{"a" * 3900}"' for _ in range(250))
LONG_VALID = "\n".join(f'    - "concat({", ".join(["value"] * 440)}) AS c{i}"' for i in range(33))
TEXTS: list[tuple[str, bytes, str]] = [
    (
        "1 MB of unclosed quotes (issue 32: 24 s of CPU under a quadratic regular expression)",
        (
            "metadata: {name: t}\nspec:\n  operators:\n"
            "  - {name: s, kind: source, source: {generator: sequence}}\n"
            "  - name: m\n    kind: map\n    inputs: [s]\n    select:\n" + UNCLOSED + "\n"
            "  - {name: out, kind: sink, inputs: [m], sink: {file: {}}}\n"
        ).encode(),
        "characters of expressions",
    ),
    (
        "the most expression text a topology may have, the last expression unclosed: every one is read",
        (
            "metadata: {name: t}\nspec:\n  operators:\n"
            "  - {name: s, kind: source, source: {generator: sequence}}\n"
            "  - name: m\n    kind: map\n    inputs: [s]\n    select:\n" + LONG_VALID + "\n"
            '    - "\'unclosed"\n'
            "  - {name: out, kind: sink, inputs: [m], sink: {file: {}}}\n"
        ).encode(),
        "cannot be read",
    ),
    (
        "duplicate key",
        b"metadata: {name: t}\nspec:\n  keyGroups: 4\n  keyGroups: 8\n  operators: []\n",
        "given twice",
    ),
    ("non-UTF-8", b"metadata: {name: \xff\xfe}\nspec: {}\n", "not UTF-8"),
    ("deeply nested", b"metadata: {name: t}\nspec: " + b"[" * 20000 + b"]" * 20000 + b"\n", "nested deeper"),
    (
        "nested mappings",
        b"metadata: {name: t}\nspec: " + b"{a: " * 100 + b"1" + b"}" * 100 + b"\n",
        "nested deeper",
    ),
    ("not YAML", b"metadata: {name: t\nspec: [\n", "not valid YAML"),
    ("a list", b"- 1\n- 2\n", "expected a StreamTopology mapping"),
    ("huge file", b"metadata: {name: t}\n# " + b"x" * (2**21) + b"\nspec: {}\n", "larger than"),
]


def refusal(document: Any) -> list[tuple[str, str]]:
    with no_hang():
        try:
            load_topology(document)
        except TopologyError as error:
            return error.problems
    return []


def test_the_suite_has_at_least_300_cases() -> None:
    assert len(GENERATED) + len(HAND_WRITTEN) + len(TEXTS) >= 300


@pytest.mark.parametrize(
    "case,document,field", GENERATED + HAND_WRITTEN, ids=[c[0] for c in GENERATED + HAND_WRITTEN]
)
def test_malformed_topologies_are_refused_naming_the_field(case: str, document: dict, field: str) -> None:
    problems = refusal(document)
    assert problems, f"{case}: accepted"
    camel = re.sub(r"(?<=\.)[a-z]+(?:_[a-z]+)+", lambda m: to_camel(m.group(0)), field)
    assert any(
        path.startswith(camel) or (camel.startswith(path) and path.count(".") >= 2) for path, _ in problems
    ), (case, problems)
    assert not any("nan" == m.strip().lower() for _, m in problems)


@pytest.mark.parametrize("case,text,message", TEXTS, ids=[t[0] for t in TEXTS])
def test_malformed_files_are_refused_with_a_message(
    tmp_path: Path, case: str, text: bytes, message: str
) -> None:
    path = tmp_path / "topology.yaml"
    path.write_bytes(text)
    problems = refusal(path)
    assert any(message in m for _, m in problems), (case, problems)
    with no_hang():
        result = CliRunner().invoke(app, ["plan", str(path)])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(
    "case,document,field", GENERATED + HAND_WRITTEN, ids=[c[0] for c in GENERATED + HAND_WRITTEN]
)
def test_the_cli_exits_2_naming_the_field(tmp_path: Path, case: str, document: dict, field: str) -> None:
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(document, allow_unicode=True))
    with no_hang():
        result = CliRunner().invoke(app, ["plan", str(path), "-o", "json"])
    assert result.exit_code == 2, (case, result.output)
    assert "Traceback" not in result.output and result.stdout == ""
    assert field.split("[")[0] in result.output.replace("\n", "")


def test_expressions_are_read_by_grammar_not_characters() -> None:
    assert expression_problem("upper(name) || 'reflect(' -- java_method(\n") is None
    assert "java_method" in (expression_problem("`Java_Method` (1) + 1") or "")
    assert "reflect" in (expression_problem("1 + reflect /* a comment */ ('a', 'b')") or "")
    assert expression_problem("CASE WHEN (a > 1) THEN sum(x) ELSE NULL END") is None
    assert expression_problem("transform(xs, x -> x + 1)") is None
    assert "reflect" in (expression_problem("REFLECT('a', 'b')") or "")
    assert "qualified" in (expression_problem("spark_catalog.default.fn(1)") or "")
