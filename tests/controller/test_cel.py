"""The CRD's CEL rules (``x-kubernetes-validations``, generated from the models' ``cel(...)`` and from
validated map keys) evaluated with a CEL interpreter (cel-python) the way the API server applies them:
after defaulting, on every object of the schema they sit on, with numbers typed as the schema says.

They restate checks of the pydantic validator, so they must never refuse what the validator accepts
(every example, every fuzz case), and each must refuse the documents it is written for.
"""

from __future__ import annotations

import copy
import importlib.util
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml

from streamtopo.controller.crd import openapi_schema
from streamtopo.documents import load_topology
from streamtopo.planner.model import TopologyError

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = openapi_schema()
CEL = celpy.Environment()
logging.getLogger("celpy").setLevel(logging.WARNING)  # its debug lines format whole documents, and an
# operator test earlier in the session (kopf --verbose) leaves the root logger at DEBUG


def defaulted(schema: dict[str, Any], value: Any) -> Any:
    """``value`` with the schema's defaults filled in, recursively (the API server's defaulting)."""
    if isinstance(value, dict) and "properties" in schema:
        value = dict(value)
        for key, child in schema["properties"].items():
            if key not in value and "default" in child:
                value[key] = copy.deepcopy(child["default"])
            if key in value:
                value[key] = defaulted(child, value[key])
    elif isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        value = {k: defaulted(schema["additionalProperties"], v) for k, v in value.items()}
    elif isinstance(value, list) and "items" in schema:
        value = [defaulted(schema["items"], v) for v in value]
    return value


def typed(schema: dict[str, Any], value: Any) -> Any:
    """Numbers as the schema types them: a ``number`` is a CEL double even when written ``1``."""
    if schema.get("type") == "number" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, dict) and "properties" in schema:
        return {k: typed(schema["properties"].get(k, {}), v) for k, v in value.items()}
    if isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        return {k: typed(schema["additionalProperties"], v) for k, v in value.items()}
    if isinstance(value, list) and "items" in schema:
        return [typed(schema["items"], v) for v in value]
    return value


def violations(schema: dict[str, Any], value: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """(path, message) of every CEL rule ``value`` breaks. A rule that cannot evaluate (a value of the
    wrong type, which the API server's schema check refuses before CEL runs) is not counted."""
    for rule in schema.get("x-kubernetes-validations", []):
        try:
            result = CEL.program(CEL.compile(rule["rule"])).evaluate({"self": celpy.json_to_cel(value)})
        except (celpy.CELEvalError, TypeError, ValueError):
            continue
        if isinstance(result, celpy.CELEvalError):  # celpy may return the error instead of raising it
            continue
        if not bool(result):
            yield path + rule.get("fieldPath", ""), rule["message"]
    if isinstance(value, dict) and "properties" in schema:
        for key, child in schema["properties"].items():
            if key in value:
                yield from violations(child, value[key], f"{path}.{key}")
    elif isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        for key, child_value in value.items():
            yield from violations(schema["additionalProperties"], child_value, f"{path}.{key}")
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            yield from violations(schema["items"], item, f"{path}[{i}]")


TYPES = {
    "object": dict,
    "array": list,
    "string": str,
    "boolean": bool,
    "integer": int,
    "number": (int, float),
}


def schema_valid(schema: dict[str, Any], value: Any) -> bool:
    """Whether ``value`` has the schema's types and keeps its size limits: what the API server checks
    before any CEL rule runs (a list item that is not an object, or an over-long list, never reaches CEL)."""
    if value is None:
        return bool(schema.get("nullable"))
    kind = schema.get("type")
    if schema.get("x-kubernetes-int-or-string"):
        return isinstance(value, int | str) and not isinstance(value, bool)
    if kind in TYPES and (
        not isinstance(value, TYPES[kind]) or (kind != "boolean" and isinstance(value, bool))
    ):
        return False
    if isinstance(value, list):
        items = schema.get("items", {})
        return len(value) <= schema.get("maxItems", len(value)) and all(schema_valid(items, v) for v in value)
    if isinstance(value, str):
        return len(value) <= schema.get("maxLength", len(value))
    if isinstance(value, dict):
        if len(value) > schema.get("maxProperties", len(value)):
            return False
        extra = schema.get("additionalProperties")
        children = schema.get("properties", {})
        return all(
            schema_valid(children.get(k, extra if isinstance(extra, dict) else {}), v)
            for k, v in value.items()
        )
    return True


def cel_refusals(document: dict[str, Any]) -> list[tuple[str, str]]:
    spec_schema = SCHEMA["properties"]["spec"]
    if not schema_valid(spec_schema, document.get("spec") or {}):
        return []
    spec = typed(spec_schema, defaulted(spec_schema, document.get("spec") or {}))
    return [(f"spec{path}", message) for path, message in violations(spec_schema, spec)]


def validator_refuses(document: Any) -> bool:
    try:
        load_topology(document)
    except TopologyError:
        return True
    return False


def fuzz_cases() -> list[tuple[str, Any, str]]:
    spec = importlib.util.spec_from_file_location("fuzz_cases", ROOT / "tests/planner/test_fuzz.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [*module.GENERATED, *module.HAND_WRITTEN]


def rules(schema: dict[str, Any]) -> Iterator[str]:
    yield from (r["rule"] for r in schema.get("x-kubernetes-validations", []))
    for child in [
        *schema.get("properties", {}).values(),
        schema.get("items"),
        schema.get("additionalProperties"),
    ]:
        if isinstance(child, dict):
            yield from rules(child)


def example(name: str) -> dict[str, Any]:
    return yaml.safe_load((ROOT / "examples" / name).read_text())


def test_every_rule_compiles_and_examples_pass_them_all():
    found = list(rules(SCHEMA))
    assert len(found) >= 12
    for rule in found:
        CEL.compile(rule)  # raises on a syntax error
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        document = yaml.safe_load(path.read_text())
        if document.get("kind") == "StreamTopology":
            assert cel_refusals(document) == [], path.name


def test_no_rule_refuses_what_the_validator_accepts():
    """Every fuzz document the API server's schema check would let through to CEL: CEL refuses it only if
    the validator does too (most fuzz documents break a type or bound, which CEL never sees)."""
    reaching_cel = 0
    for case, document, _ in fuzz_cases():
        if not isinstance(document, dict) or not schema_valid(
            SCHEMA["properties"]["spec"], document.get("spec")
        ):
            continue
        reaching_cel += 1
        cel = cel_refusals(document)
        assert not cel or validator_refuses(document), (case, cel)
    assert reaching_cel >= 50


def _set(document: dict[str, Any], edit: Any) -> dict[str, Any]:
    document = copy.deepcopy(document)
    edit(document["spec"])
    return document


def _op(spec: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(op for op in spec["operators"] if op["kind"] == kind)


VWAP = example("vwap.yaml")
CASES = {
    "min above max": (
        lambda s: s.setdefault("autoscaling", {}).update(minExecutors=9, maxExecutors=3),
        ".minExecutors",
    ),
    "min above default max": (
        lambda s: s.setdefault("autoscaling", {}).update(minExecutors=40),
        ".minExecutors",
    ),
    "band above target": (
        lambda s: s.setdefault("autoscaling", {}).update(targetUtilization=0.5, utilizationBand=0.6),
        ".utilizationBand",
    ),
    "ratios crossed": (
        lambda s: s.setdefault("autoscaling", {}).update(dstreamsUpRatio=0.2, dstreamsDownRatio=0.5),
        ".dstreamsDownRatio",
    ),
    "two origins": (lambda s: _op(s, "source")["source"].update(stream="feed"), ".source"),
    "two targets": (lambda s: _op(s, "sink")["sink"].update(stream="out", console={}), ".sink"),
    "source without source": (lambda s: _op(s, "source").pop("source"), ".source"),
    "trades partitioned by key": (lambda s: _op(s, "source").update(keyBy=["symbol"]), ".keyBy"),
    "filter with a sink": (lambda s: _op(s, "filter").update(sink={"console": {}}), ".sink"),
    "filter without expr": (lambda s: _op(s, "filter").pop("expr"), ".expr"),
    "aggregate without aggregations": (lambda s: _op(s, "aggregate").pop("aggregations"), ".aggregations"),
    "duplicate names": (lambda s: s["operators"].append(copy.deepcopy(_op(s, "filter"))), ".operators"),
    "bad node label key": (
        lambda s: _op(s, "filter").update(requires={"nodeSelector": {"bad key!": "x"}}),
        ".nodeSelector",
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_rule_refuses_what_it_is_written_for(name: str):
    assert {op["kind"] for op in VWAP["spec"]["operators"]} >= {"source", "filter", "aggregate", "sink"}
    edit, where = CASES[name]
    document = _set(VWAP, edit)
    refused = cel_refusals(document)
    assert validator_refuses(document), name
    assert any(where in path for path, _ in refused), (name, refused)


def test_a_stream_source_partitioned_by_key_passes_every_rule():
    """keyBy on a stream source is honoured (a sink's units partitioned by the same key are taken whole,
    other entries split by key): CEL and the validator both let it through."""
    document = _set(VWAP, lambda s: _op(s, "source").update(source={"stream": "feed"}, keyBy=["symbol"]))
    assert cel_refusals(document) == [] and not validator_refuses(document)
