"""Documents from files: the StreamTopology, cluster and other YAML a user or a pod hands over by path.

The planner parses text and data only (``planner.model.parse_document``, ``parse_topology``,
``planner.cluster.parse_cluster``): it does no I/O. Reading a file, and refusing one that cannot be read,
is larger than MAX_DOCUMENT_BYTES or not UTF-8 before it is decoded, happens here, and errors name the
file. A string that is not an existing path is YAML text.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from streamtopo.planner.cluster import Cluster, M, parse_cluster, parse_hosts
from streamtopo.planner.graph import plan_size_problems
from streamtopo.planner.model import (
    MAX_DOCUMENT_BYTES,
    StreamTopology,
    StreamTopologySpec,
    TopologyError,
    parse_topology,
)
from streamtopo.planner.policy import PlatformPolicy
from streamtopo.planner.scaling.aeolus import open_key_groups
from streamtopo.planner.schema import schema_problems

Source = str | Path | Mapping[str, Any]
"""A path (``Path``, or a string naming an existing file), YAML text, or parsed data."""


def read_text(path: str | Path) -> str:
    """The file's text; a file that cannot be read, is too large or is not UTF-8 is a TopologyError."""
    origin = str(path)
    try:
        with Path(path).open("rb") as file:
            raw = file.read(MAX_DOCUMENT_BYTES + 1)
    except OSError as error:
        raise TopologyError([(origin, f"cannot read file: {error.strerror}")]) from None
    if len(raw) > MAX_DOCUMENT_BYTES:
        raise TopologyError([(origin, f"larger than {MAX_DOCUMENT_BYTES // 2**20} MiB")])
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise TopologyError([(origin, f"not UTF-8 text (byte {error.start})")]) from None


def _text(source: Source) -> tuple[str | Mapping[str, Any], str]:
    """(text or data, origin for error messages)."""
    # An empty string is text, not the path "." (a file caught mid-rewrite reads empty).
    if isinstance(source, Path) or (
        isinstance(source, str) and source and "\n" not in source and Path(source).exists()
    ):
        return read_text(source), str(source)
    return source, "(text)"


def load_topology(
    source: Source, *, policy: PlatformPolicy | None = None, running: StreamTopologySpec | None = None
) -> StreamTopology:
    """A validated StreamTopology from a path, YAML text or data (:func:`parse_topology`), with the key
    groups the spec leaves open sized by Aeolus (:func:`~streamtopo.planner.scaling.aeolus.open_key_groups`).

    Every reader goes through here (``streamtopo run``/``plan``, the webhook, the reconcile, the
    executors), so all of them see the same key groups; a topology written back out names them, and all
    of them refuse what the typed view refuses (:func:`~streamtopo.planner.schema.schema_problems`:
    missing columns, key types, reserved column names) before anything runs.
    ``running``: the spec deployed now, when this one is to replace it: an operator both have whose key
    groups this one leaves open keeps the running count (key groups partition state, so they are fixed
    for a deployment's life, as Flink keeps a job's max parallelism; a new rate re-sizes nothing).
    """
    data, origin = _text(source)
    topology = parse_topology(data, origin=origin, policy=policy)
    if problems := schema_problems(topology.spec):
        raise TopologyError(problems)
    sized = open_key_groups(topology.spec, policy.max_key_groups if policy else None)
    if running is not None and "key_groups" not in topology.spec.model_fields_set:
        deployed = running.by_name()
        sized = {
            **sized,
            **{
                op.name: running.key_groups_of(op.name)
                for op in topology.spec.operators
                if op.key_groups is None and op.name in deployed
            },
        }
    if sized:
        operators = [
            op.model_copy(update={"key_groups": sized[op.name]}) if op.name in sized else op
            for op in topology.spec.operators
        ]
        spec = topology.spec.model_copy(update={"operators": operators})
        topology = topology.model_copy(update={"spec": spec})
    if problems := plan_size_problems(topology.spec, sized=sized):
        raise TopologyError(problems)
    return topology


def object_document(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a Kubernetes object the model validates: its name, namespace and spec (the API
    server owns the rest: uid, annotations, finalizers, status)."""
    meta = obj.get("metadata") or {}
    return {
        "apiVersion": obj.get("apiVersion", "streamtopo.dev/v1alpha1"),
        "kind": obj.get("kind", "StreamTopology"),
        "metadata": {k: meta[k] for k in ("name", "namespace") if k in meta},
        "spec": obj.get("spec"),
    }


def load_cluster(source: Source) -> Cluster:
    """A validated cluster from a path, YAML text or data (:func:`parse_cluster`)."""
    return parse_cluster(*_text(source))


def load_hosts(source: Source, model: type[M]) -> M:
    """A file that extends the cluster file, validated as ``model`` (:func:`parse_hosts`)."""
    return parse_hosts(*_text(source), model)
