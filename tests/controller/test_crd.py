"""The CRD, the chart's CRD and docs/reference.md are generated from the pydantic model and agree with it.

References used here are independent of the generator: Kubernetes' own CRD JSON schema
(kubernetes-validate), the structural-schema rules written out below, a walk over the pydantic model's
fields, and the model's validation itself (what the CRD rejects, the model must reject too; defaults
the API server would fill in must not change what the model reads).
"""

from __future__ import annotations

import copy
import importlib
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import typer
import yaml
from pydantic import BaseModel
from typer.testing import CliRunner

from streamtopo.controller.crd import CRD_FILENAME, CRD_NAME, crd_manifest, render_crd
from streamtopo.controller.fieldtable import field_rows, render_reference
from streamtopo.controller.generated import generated_files, stale_files
from streamtopo.documents import load_topology
from streamtopo.planner.model import StreamTopologySpec, TopologyError
from streamtopo.planner.status import StreamTopologyStatus

ROOT = Path(__file__).resolve().parents[2]
KUBE_VERSION = "1.30.0"


def crd_schema() -> dict[str, Any]:
    return crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def as_json_schema(node: Any) -> Any:
    """The CRD's OpenAPI v3 schema as a draft-4 JSON schema, the way the API server and kubectl read it.

    ``nullable`` admits null, and objects with declared properties refuse unknown fields (kubectl's
    default strict field validation; the API server would prune them otherwise). Draft 4 has the
    boolean ``exclusiveMinimum`` that OpenAPI 3.0 uses.
    """
    if isinstance(node, list):
        return [as_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: as_json_schema(value) for key, value in node.items() if not key.startswith("x-kubernetes")}
    if out.pop("nullable", False):
        out["type"] = [out["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    if "properties" in node and "additionalProperties" not in node:
        out["additionalProperties"] = False
    out.pop("default", None)
    return out


def schema_errors(document: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft4Validator(as_json_schema(crd_schema()))
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]


def model_accepts(document: dict[str, Any]) -> bool:
    try:
        load_topology(document)
    except TopologyError:
        return False
    return True


MINIMAL = {
    "apiVersion": "streamtopo.dev/v1alpha1",
    "kind": "StreamTopology",
    "metadata": {"name": "wc"},
    "spec": {
        "operators": [
            {"name": "lines", "kind": "source", "source": {"generator": "words", "ratePerSecond": 100}},
            {
                "name": "count",
                "kind": "aggregate",
                "inputs": ["lines"],
                "keyBy": ["word"],
                "window": {"size": "60s", "slide": "10s"},
                "aggregations": ["count(*) AS n"],
            },
            {"name": "out", "kind": "sink", "inputs": ["count"], "sink": {"console": {}}},
        ],
        "autoscaling": {"interval": "30s", "maxMigrationCost": None},
    },
}


# ------------------------------------------------------------------------------------------ drift


def test_committed_crds_and_reference_match_the_model() -> None:
    stale = stale_files(ROOT, generated_files())
    assert not stale, f"regenerate with `streamtopo crd`: {[str(p.relative_to(ROOT)) for p in stale]}"
    assert (ROOT / "crds" / CRD_FILENAME).read_text() == (
        ROOT / "charts/streamtopo/crds" / CRD_FILENAME
    ).read_text()


def _cli() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        """A group, so that `crd` stays a subcommand as in the real CLI."""

    importlib.import_module("streamtopo.commands.crd").register(app)
    return app


def test_crd_command_writes_and_checks(tmp_path: Path) -> None:
    runner, app = CliRunner(), _cli()
    assert runner.invoke(app, ["crd", "--output-dir", str(tmp_path), "--check"]).exit_code == 1
    written = runner.invoke(app, ["crd", "--output-dir", str(tmp_path)])
    assert written.exit_code == 0, written.output
    assert (tmp_path / "crds" / CRD_FILENAME).read_text() == render_crd()
    assert (tmp_path / "charts/streamtopo/crds" / CRD_FILENAME).read_text() == render_crd()
    assert (tmp_path / "docs/reference.md").read_text() == render_reference()
    assert runner.invoke(app, ["crd", "--output-dir", str(tmp_path), "--check"]).exit_code == 0
    reference = tmp_path / "docs/reference.md"
    reference.write_text(reference.read_text().replace("spec.keyGroups", "spec.keygroups"))
    drifted = runner.invoke(app, ["crd", "--output-dir", str(tmp_path), "--check"])
    assert drifted.exit_code == 1 and "reference.md" in drifted.output


# ------------------------------------------------------------------------------- CRD well-formedness


def test_crd_passes_kubernetes_validate_strict() -> None:
    for document in yaml.safe_load_all((ROOT / "crds" / CRD_FILENAME).read_text()):
        kubernetes_validate.validate(document, KUBE_VERSION, strict=True)


def test_names_subresource_and_printer_columns() -> None:
    crd = crd_manifest()
    spec = crd["spec"]
    assert crd["metadata"]["name"] == CRD_NAME == "streamtopologies.streamtopo.dev"
    assert (spec["group"], spec["scope"]) == ("streamtopo.dev", "Namespaced")
    assert spec["names"]["kind"] == "StreamTopology" and spec["names"]["plural"] == "streamtopologies"
    assert spec["names"]["shortNames"] == ["stopo"]
    (version,) = spec["versions"]
    assert (
        version["name"] == "v1alpha1"
        and version["storage"]
        and set(version["subresources"]) == {"status", "scale"}
    )
    scale = version["subresources"]["scale"]
    spec_fields = crd_schema()["properties"]["spec"]["properties"]
    assert spec_fields[scale["specReplicasPath"].removeprefix(".spec.")]["type"] == "integer"
    for path in (scale["statusReplicasPath"], scale["labelSelectorPath"]):
        assert path.removeprefix(".status.") in crd_schema()["properties"]["status"]["properties"]
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert list(columns) == ["Phase", "Executors", "Pending", "U", "LoadDistance", "Age"]
    status = crd_schema()["properties"]["status"]["properties"]
    kube_type = {"string": "string", "integer": "integer", "number": "number"}
    for name in ("Phase", "Executors", "Pending", "U", "LoadDistance"):
        *parents, field = columns[name]["jsonPath"].removeprefix(".status.").split(".")
        schema = status
        for parent in parents:  # a nested field: .status.capacity.pendingExecutors
            schema = schema[parent]["properties"]
        assert field in schema, f"printer column {name} points at a missing status field {field}"
        assert kube_type[schema[field]["type"]] == columns[name]["type"]
    assert columns["Age"] == {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
    conditions = status["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map" and conditions["x-kubernetes-list-map-keys"] == [
        "type"
    ]
    assert "type" in conditions["items"]["required"]


def _walk(node: dict[str, Any], path: str = "") -> Any:
    yield path, node
    for key, child in node.get("properties", {}).items():
        yield from _walk(child, f"{path}.{key}")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}.*")
    if "items" in node:
        yield from _walk(node["items"], f"{path}[]")


def test_schema_is_structural() -> None:
    """The rules of a structural schema (Kubernetes docs, "Specifying a structural schema")."""
    for path, node in _walk(crd_schema()):
        assert not {"$ref", "$defs", "title", "const", "uniqueItems"} & node.keys(), path
        assert node.get("additionalProperties", True) is not False, path
        if node.get("x-kubernetes-int-or-string"):
            assert "type" not in node, path
            assert all(option["type"] in ("integer", "string") for option in node.get("anyOf", [])), path
        else:
            assert node.get("type") in ("object", "array", "string", "integer", "number", "boolean"), path
            assert "anyOf" not in node and "oneOf" not in node, path
        for bound in ("exclusiveMinimum", "exclusiveMaximum"):
            assert isinstance(node.get(bound, False), bool), (
                f"{path}: {bound} must be a boolean in OpenAPI 3.0"
            )
        if "properties" in node:
            assert node["type"] == "object", path


def test_every_default_is_valid_for_its_own_field() -> None:
    """The API server refuses a CRD whose defaults fail their schema (e.g. a float for a duration)."""
    defaults = [(path, node) for path, node in _walk(crd_schema()) if "default" in node]
    assert any(path.endswith("autoscaling.interval") for path, _ in defaults)
    for path, node in defaults:
        errors = list(jsonschema.Draft4Validator(as_json_schema(node)).iter_errors(node["default"]))
        assert not errors, f"{path}: default {node['default']!r}: {errors[0].message}"


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Structural defaulting as the API server does it: parents first, then inside what exists."""
    value = copy.deepcopy(value)
    if isinstance(value, dict) and "properties" in schema:
        for key, child in schema["properties"].items():
            if key not in value and "default" in child:
                value[key] = copy.deepcopy(child["default"])
            if key in value:
                value[key] = apply_defaults(child, value[key])
    elif isinstance(value, list) and "items" in schema:
        value = [apply_defaults(schema["items"], item) for item in value]
    return value


def test_server_side_defaults_mean_what_the_model_means() -> None:
    """A topology read after the API server filled in the CRD defaults is the same topology."""
    defaulted = apply_defaults(crd_schema(), MINIMAL)
    assert defaulted["spec"]["autoscaling"]["stabilization"] == "5m"  # defaulting really happened
    assert defaulted["spec"]["fusion"]["weights"] == {"utilization": 1.0, "communication": 1.0}
    assert schema_errors(defaulted) == []
    assert load_topology(defaulted).spec == load_topology(MINIMAL).spec


# -------------------------------------------------------------------------- schema vs model on input


def _mutated(path: list[Any], value: Any, *, delete: bool = False) -> dict[str, Any]:
    document = copy.deepcopy(MINIMAL)
    target = document
    for key in path[:-1]:
        target = target[key]
    if delete:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return document


MUTATIONS = {
    "unknown operator kind": (["spec", "operators", 1, "kind"], "reduce"),
    "keyGroups zero": (["spec", "keyGroups"], 0),
    "keyGroups too large": (["spec", "keyGroups"], 5000),
    "duration with spaces in words": (["spec", "operators", 1, "window", "size"], "one minute"),
    "unknown field": (["spec", "operators", 0, "parallelism"], 4),
    "negative rate": (["spec", "operators", 0, "source", "ratePerSecond"], -5),
    "zero rate (exclusive minimum)": (["spec", "operators", 0, "source", "ratePerSecond"], 0),
    "unknown generator": (["spec", "operators", 0, "source", "generator"], "stocks"),
    "operator name with a space": (["spec", "operators", 2, "name"], "my sink"),
    "target utilisation above one": (["spec", "autoscaling", "targetUtilization"], 1.5),
    "bad transport scheme": (["spec", "transport"], {"url": "http://valkey:6379"}),
    "colocation of one": (["spec", "constraints"], {"peColocation": [["lines"]]}),
    "ha with one replica": (
        ["spec", "constraints"],
        {"highAvailability": [{"operators": ["count"], "replicas": 1}]},
    ),
    "fusion algorithm typo": (["spec", "fusion"], {"algorithm": "kola"}),
    "udf function without module": (["spec", "operators", 1, "function"], "enrich"),
    "fractional seconds duration": (["spec", "autoscaling", "interval"], "1.5s"),
    "millisecond duration": (["spec", "autoscaling", "stabilization"], "250ms"),
    "optional set to null": (["spec", "operators", 1, "keyGroups"], None),
    "topology name with a dot": (["metadata", "name"], "wc.v2"),
    "topology name too long for pod names": (["metadata", "name"], "w" * 60),
    "secret reference": (
        ["spec", "transport"],
        {"url": "redis://v:6379", "passwordSecret": {"name": "vk", "key": "pw"}},
    ),
}


@pytest.mark.parametrize("name", MUTATIONS)
def test_what_the_crd_rejects_the_model_rejects(name: str) -> None:
    """The CRD is a sound first filter: it never refuses a topology the model accepts, and the
    single-field rules it can express (types, ranges, enums, patterns, unknown fields) it enforces."""
    path, value = MUTATIONS[name]
    document = _mutated(path, value)
    crd_ok, model_ok = not schema_errors(document), model_accepts(document)
    assert crd_ok == model_ok, (
        f"CRD {'accepts' if crd_ok else 'rejects'} but model {'accepts' if model_ok else 'rejects'}"
    )


def test_cross_field_rules_are_left_to_the_model() -> None:
    """What a single field cannot see passes the CRD and is reported by the model, naming the field."""
    document = _mutated(["spec", "operators", 1, "inputs"], ["nowhere"])
    assert schema_errors(document) == []
    with pytest.raises(TopologyError) as error:
        load_topology(document)
    assert any(path == "spec.operators[1].inputs[0]" for path, _ in error.value.problems)


def test_required_fields() -> None:
    assert any("spec" in e for e in schema_errors({k: v for k, v in MINIMAL.items() if k != "spec"}))
    assert any("operators" in e for e in schema_errors(_mutated(["spec", "operators"], None, delete=True)))
    assert schema_errors(_mutated(["spec", "operators"], [])), "an empty operator list is refused"


# ------------------------------------------------------------------------------------------ examples


def example_topologies() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted((ROOT / "examples").rglob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if isinstance(document, dict) and document.get("kind") == "StreamTopology":
                found.append((str(path.relative_to(ROOT)), document))
    return found


@pytest.mark.parametrize(
    "origin,document",
    example_topologies()
    or [pytest.param("", {}, marks=pytest.mark.skip("no StreamTopology in examples/ yet"))],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_examples_pass_the_crd_schema_and_the_model(origin: str, document: dict[str, Any]) -> None:
    assert schema_errors(document) == [], origin
    load_topology(document)


# ---------------------------------------------------------------------------------- reference table


def _model_paths(model: type[BaseModel], prefix: str) -> list[str]:
    """Every field path of a model, found by walking pydantic's field definitions (not the schema)."""
    paths = []
    for name, field in model.model_fields.items():
        path = f"{prefix}.{field.alias or name}"
        paths.append(path)
        nested = _nested_model(field.annotation)
        if nested is not None:
            paths.extend(_model_paths(nested[0], path + ("[]" if nested[1] else "")))
    return paths


def _nested_model(annotation: Any) -> tuple[type[BaseModel], bool] | None:
    """(model, inside a list) when the annotation is a model, an optional model or a list of models."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    args = [a for a in getattr(annotation, "__args__", ()) if a is not type(None)]
    origin = getattr(annotation, "__origin__", None)
    for arg in args:
        found = _nested_model(arg)
        if found is not None:
            return found[0], found[1] or origin is list
    return None


@pytest.mark.parametrize("model,prefix", [(StreamTopologySpec, "spec"), (StreamTopologyStatus, "status")])
def test_reference_lists_every_model_field(model: type[BaseModel], prefix: str) -> None:
    schema = crd_schema()["properties"][prefix]
    listed = [row[0] for row in field_rows(schema, prefix)]
    assert sorted(listed) == sorted(_model_paths(model, prefix))
    reference = (ROOT / "docs/reference.md").read_text()
    assert all(f"| `{path}` |" in reference for path in listed)
