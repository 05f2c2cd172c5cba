"""Topologies with a common prefix run together, the prefix once: in one dataflow (planner/benoit/fuse.py,
what ``streamtopo run A B`` does) and in a shared part whose named streams the others read
(planner/benoit/split.py, what the operator does when consumers run apart). Each consumer's output is
exactly what it is when the topologies run apart, with key-group migrations and kill -9 drills on every
executor, against a real Valkey and PySpark executors as processes."""

from __future__ import annotations

from pathlib import Path

import pytest
from runtime_support import assert_exactly_once, expected_totals, read_lines

from streamtopo.local.runner import RunOptions, run_topologies
from streamtopo.planner.benoit.fuse import fuse_shared
from streamtopo.planner.benoit.split import split_shared
from streamtopo.planner.model import StreamTopology

# One worker of a parallel run: the module's run apart (a fixture) serves every test.
pytestmark = [pytest.mark.slow, pytest.mark.valkey, pytest.mark.spark, pytest.mark.xdist_group("sharing_run")]

COUNT, RATE, KEYS = 1200, 100, 7
PREFIX = [
    {
        "name": "numbers",
        "kind": "source",
        "source": {"generator": "sequence", "ratePerSecond": RATE, "count": COUNT, "keys": KEYS},
    },
    {"name": "kept", "kind": "filter", "inputs": ["numbers"], "expr": "value % 3 <> 0"},
    {"name": "doubled", "kind": "map", "inputs": ["kept"], "select": ["key", "value", "value * 2 AS twice"]},
]


def topology(name: str, tail: list[dict]) -> StreamTopology:
    return StreamTopology.model_validate(
        {
            "metadata": {"name": name},
            "spec": {
                "keyGroups": 4,
                "operators": [
                    *PREFIX,
                    *tail,
                    {"name": "out", "kind": "sink", "inputs": [tail[-1]["name"]], "sink": {"file": {}}},
                ],
            },
        }
    )


PER_SECOND = topology(
    "per-second",
    [
        {
            "name": "totals",
            "kind": "aggregate",
            "inputs": ["doubled"],
            "keyBy": ["key"],
            "window": {"size": 1.0},
            "aggregations": ["count(*) AS n", "sum(value) AS total"],
        }
    ],
)
TWICE = topology(
    "twice",
    [
        {
            "name": "sums",
            "kind": "aggregate",
            "inputs": ["doubled"],
            "keyBy": ["key"],
            "window": {"size": 2.0},
            "aggregations": ["sum(twice) AS total2", "max(value) AS top"],
        }
    ],
)


def lines(output: Path) -> list[str]:
    return sorted(
        line for path in (output / "out").glob("kg-*.jsonl") for line in path.read_text().splitlines()
    )


def run(
    topologies: list[StreamTopology], root: Path, outputs: dict[str, Path] | None = None, **drills: float
) -> dict[str, Path]:
    outputs = outputs or {t.metadata.name: root / t.metadata.name for t in topologies}
    # Two executors per topology, three topologies: a host of 8 cores in the model (the local platform
    # starts executors only where a host has room, and this machine may have 2).
    options = RunOptions(executors=2, host_cpu=8.0, live=False, duration=600, seed=5, **drills)
    summaries = run_topologies(topologies, options, outputs=outputs)
    for name, summary in summaries.items():
        assert summary.finished and summary.failed is None, (name, summary.failed)
    if drills:
        assert sum(s.migrations for s in summaries.values()) >= 3
        assert sum(s.kills for s in summaries.values()) >= 1
    return outputs


@pytest.fixture(scope="module")
def apart(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Each consumer's output when the topologies run apart (``--no-share``)."""
    outputs = run([PER_SECOND, TWICE], tmp_path_factory.mktemp("apart"))
    out = {name: lines(path) for name, path in outputs.items()}
    assert all(out.values())
    return out


def test_a_shared_prefix_in_one_dataflow_runs_once_and_every_output_is_what_it_is_alone(
    tmp_path: Path, apart: dict[str, list[str]]
) -> None:
    fusion = fuse_shared([PER_SECOND, TWICE])
    assert fusion is not None
    assert sorted(fusion.shared) == ["doubled", "kept", "numbers"]
    fused = fusion.topology
    run([fused], tmp_path, {fused.metadata.name: tmp_path}, migrate_every=1.5, kill_every=8.0)
    for name in ("per-second", "twice"):
        assert lines(tmp_path / name) == apart[name], name
    assert_exactly_once(
        read_lines(tmp_path / "per-second"),
        expected_totals(COUNT, RATE, KEYS, 1.0, dropped=lambda seq: seq % 3 == 0),
    )


def test_a_shared_part_runs_once_and_every_output_is_what_it_is_alone(
    tmp_path: Path, apart: dict[str, list[str]]
) -> None:
    split = split_shared([PER_SECOND, TWICE])
    assert split.shared is not None
    assert [op.name for op in split.shared.spec.operators] == [
        "numbers",
        "kept",
        "doubled",
        "publish-doubled",
    ]
    for consumer in split.consumers:
        assert not any(op.source and op.source.generator for op in consumer.spec.operators)
    shared = run([split.shared, *split.consumers], tmp_path / "shared", migrate_every=1.5, kill_every=8.0)
    for name in ("per-second", "twice"):
        assert lines(shared[name]) == apart[name], name
    assert_exactly_once(
        read_lines(shared["per-second"]),
        expected_totals(COUNT, RATE, KEYS, 1.0, dropped=lambda seq: seq % 3 == 0),
    )
