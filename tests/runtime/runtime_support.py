"""Helpers of the executor / exactly-once tests: a topology, its exact expected output, sink readers.

The expected output is computed here from first principles (the sequence generator's definition and
the window arithmetic written out), independently of the operator library and the executor.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import yaml

from streamtopo.contracts import ExecutorEntry, RoutingTable, unit_key
from streamtopo.planner.model import StreamTopology
from streamtopo.runtime.hosting import ExecutorConfig
from streamtopo.runtime.sinks import SEGMENT, tile
from streamtopo.runtime.state_store import StateStore

STREAMTOPO = str(Path(sys.executable).with_name("streamtopo"))
"""The installed command, as a user runs it."""


def write_topology(directory: Path, topology: StreamTopology) -> Path:
    """``topology`` as ``directory/topology.yaml``, the file a user hands to ``streamtopo run``."""
    path = directory / "topology.yaml"
    path.write_text(yaml.safe_dump(topology.model_dump(mode="json", by_alias=True, exclude_none=True)))
    return path


def streamtopo_run(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``streamtopo run ARGS`` in a process of its own, output captured (``env`` added to ours)."""
    return subprocess.run(
        [STREAMTOPO, "run", *args],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        check=False,
    )


def totals(window: float) -> dict:
    """The aggregate ``totals``: count and sum of value per key over tumbling windows of ``window`` s."""
    return {
        "name": "totals",
        "kind": "aggregate",
        "inputs": ["numbers"],
        "keyBy": ["key"],
        "window": {"size": window},
        "aggregations": ["count(*) AS n", "sum(value) AS total"],
    }


def sequence_topology(
    name: str,
    *,
    count: int,
    rate: float,
    keys: int,
    window: float,
    key_groups: int = 4,
    extra: list[dict] | None = None,
    sink_input: str = "totals",
) -> StreamTopology:
    """numbers (sequence) -> totals (keyed tumbling window: count, sum) -> out (file sink)."""
    operators = [
        {
            "name": "numbers",
            "kind": "source",
            "source": {"generator": "sequence", "ratePerSecond": rate, "count": count, "keys": keys},
        },
        totals(window),
        *(extra or []),
        {"name": "out", "kind": "sink", "inputs": [sink_input], "sink": {"file": {}}},
    ]
    return StreamTopology.model_validate(
        {"metadata": {"name": name}, "spec": {"keyGroups": key_groups, "operators": operators}}
    )


def expected_totals(
    count: int, rate: float, keys: int, window: float, dropped=lambda seq: False, key=None
) -> dict[tuple[int, float], tuple[int, int]]:
    """(key, window start) -> (count, sum of value) for seq = 0..count-1, key = seq % keys (or ``key(seq)``),
    ts = seq / rate, leaving out the records ``dropped`` says."""
    out: dict[tuple[int, float], list[int]] = defaultdict(lambda: [0, 0])
    for seq in range(count):
        if dropped(seq):
            continue
        start = math.floor((seq / rate) / window) * window
        cell = out[(seq % keys if key is None else key(seq), start)]
        cell[0] += 1
        cell[1] += seq
    return {k: (c, s) for k, (c, s) in out.items()}


def at_least(topology: StreamTopology, executors: int) -> StreamTopology:
    """``topology`` with ``minExecutors`` = ``executors``: drills move units between executors and kill
    them, so a test of them keeps its executors where the loop's saturation rule would fold two 1.6-core
    executors on a loaded 2-core machine into one (docs/scaling.md, "Footprints")."""
    auto = topology.spec.autoscaling.model_copy(update={"min_executors": executors})
    return topology.model_copy(update={"spec": topology.spec.model_copy(update={"autoscaling": auto})})


def read_lines(output: Path, sink: str = "out") -> list[dict]:
    return [
        json.loads(line)
        for path in sorted((Path(output) / sink).glob("kg-*.jsonl"))
        for line in path.read_text().splitlines()
    ]


def read_pods_lines(pods: list[Path], sink: str = "out") -> list[dict]:
    """The lines of a file sink written in several directories (pods' emptyDirs): each key group's files,
    wherever they are, put together by their offsets (sinks.tile: no byte missing, overlaps identical),
    none holding a NUL."""
    pieces: dict[str, list[tuple[int, bytes]]] = defaultdict(list)
    for pod in pods:
        for path in (Path(pod) / sink).glob("kg-*.jsonl"):
            match = SEGMENT.fullmatch(path.name)
            assert match, f"not a key group's file: {path}"
            data = path.read_bytes()
            assert b"\0" not in data, f"NUL bytes in {path}"
            pieces[match.group(1)].append((int(match.group(2) or 0), data))
    return [json.loads(line) for kg in sorted(pieces) for line in tile(pieces[kg]).decode().splitlines()]


def sink_totals(lines: list[dict]) -> dict[tuple[int, float], list[tuple[int, int]]]:
    """(key, window start) -> every (n, total) written: a duplicate shows as two entries."""
    out: dict[tuple[int, float], list[tuple[int, int]]] = defaultdict(list)
    for line in lines:
        out[(int(line["key"]), float(line["window_start"]))].append((int(line["n"]), int(line["total"])))
    return out


def assert_exactly_once(lines: list[dict], expected: dict) -> None:
    got = sink_totals(lines)
    duplicated = {k: v for k, v in got.items() if len(v) > 1}
    missing = sorted(set(expected) - set(got))
    wrong = {k: (got[k][0], expected[k]) for k in expected if k in got and got[k][0] != expected[k]}
    extra = sorted(set(got) - set(expected))
    assert not duplicated and not missing and not wrong and not extra, (
        f"duplicated {list(duplicated.items())[:5]}, missing {missing[:5]}, wrong {list(wrong.items())[:5]}, "
        f"unexpected {extra[:5]}"
    )


def round_robin(topology: StreamTopology, executors: list[str], version: int = 1) -> RoutingTable:
    spec = topology.spec
    units = {
        unit_key((op.name, kg)): executors[kg % len(executors)]
        for op in spec.operators
        for kg in range(spec.key_groups_of(op.name))
    }
    return RoutingTable(
        topology=topology.metadata.name,
        version=version,
        executors={e: ExecutorEntry() for e in executors},
        units=units,
    )


def write_routing(path: Path, routing: RoutingTable) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(routing.to_json())
    tmp.replace(path)


class Running:
    """An Executor run in a thread of the test process (sharing the test session's SparkSession)."""

    def __init__(self, executor):
        self.executor = executor
        self.stop_event = threading.Event()
        executor.start()
        self.thread = threading.Thread(target=executor.run, args=(self.stop_event, False), daemon=True)
        self.thread.start()

    def stop(self, release: bool = True) -> None:
        """``release=False`` abandons the units as a crashed process would (heartbeat stops, no release)."""
        self.stop_event.set()
        self.thread.join(timeout=300)
        if release:
            self.executor.close(release=True)


def wait_finished(store, topology: StreamTopology, timeout: float = 240.0) -> None:
    from streamtopo.local.runner import finished

    deadline = time.time() + timeout
    while not finished(store, topology):
        assert time.time() < deadline, "the pipeline did not reach the end of stream in time"
        time.sleep(0.2)


def move_each(
    routing_path: Path,
    table: RoutingTable,
    units: list[tuple[str, int]],
    runs: dict[str, Running] | None = None,
) -> RoutingTable:
    """Move each of ``units`` to the other of ex-0 and ex-1, one routing version 0.7 s after another;
    with ``runs``, each move also waits until its receiver hosts the unit (a move back cannot overtake
    the hand-over)."""
    for unit in units:
        time.sleep(0.7)
        assignment = table.assignment()
        assignment[unit] = receiver = "ex-1" if assignment[unit] == "ex-0" else "ex-0"
        table = table.moved(assignment)
        write_routing(routing_path, table)
        deadline = time.time() + 120
        while runs is not None and unit_key(unit) not in runs[receiver].executor.hosted:
            assert time.time() < deadline, f"{unit} did not reach {receiver} in time"
            time.sleep(0.1)
    return table


def migrate_crash_and_finish(
    topology: StreamTopology,
    routing_path: Path,
    table: RoutingTable,
    url: str,
    out: Path,
    units: list[tuple[str, int]],
    config: ExecutorConfig | None = None,
    pods: bool = False,
    until: Callable[[StateStore], bool] | None = None,
) -> None:
    """Two executors ex-0 and ex-1: move each of ``units`` to the other one, 0.7 s apart, crash ex-1 (no
    release) and start it again, then run to the end of stream and finalize the file sinks. ``pods``:
    each executor writes its file sinks under ``out/<its name>``, as pods each write to their own
    emptyDir, nothing is finalized (a cluster has no run end that would), and each move waits for its
    hand-over. ``until``: the moves wait for the committed state to say so."""
    from streamtopo.local.runner import finalize_sinks
    from streamtopo.runtime.executor import Executor

    def start(name: str) -> Running:
        output = out / name if pods else out
        return Running(Executor(topology, routing_path, name, url, output_dir=output, config=config))

    runs = {n: start(n) for n in ("ex-0", "ex-1")}
    store = runs["ex-0"].executor.store
    try:
        deadline = time.time() + 120
        while until is not None and not until(store):
            assert time.time() < deadline, "the state the moves wait for was not committed in time"
            time.sleep(0.1)
        move_each(routing_path, table, units, runs if pods else None)
        runs["ex-1"].stop(release=False)
        runs["ex-1"] = start("ex-1")
        wait_finished(store, topology)
    finally:
        for run in runs.values():
            run.stop()
    if not pods:
        finalize_sinks(store, topology, out)
