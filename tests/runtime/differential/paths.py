"""The paths of the data plane the differential harness drives, and how each is forced (docs/differential.md)."""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field
from pathlib import Path as FilePath

from harness import Drill, Outcome, Plan, compare, expected_of, plan, reference_session, run_in_process
from reference import Expected
from strategies import Case

from streamtopo.runtime.hosting import ExecutorConfig

LARGE_STEPS = ExecutorConfig(small_step_records=0)
"""Every step counts as large: lazy outputs stay in the JVM (maps, filters, aggregates' partials as Spark
plans over the generated records)."""
SMALL_STEPS = ExecutorConfig(small_step_records=10**12)
"""Every step counts as small: the records' map, read by every branch, is computed once into the driver
and the branches run on pandas (numpy_eval.py, or Spark from pandas)."""
DRILLS = ExecutorConfig(heartbeat_ttl=1.0)
"""A crashed executor's units are free one second after its last heartbeat."""


@dataclass(frozen=True)
class Path:
    name: str
    executors: int = 1
    config: ExecutorConfig = field(default_factory=ExecutorConfig)
    stream: bool = False
    """Records from a named stream pre-filled with Arrow entries (else a sequence generator and a map)."""
    key_by: tuple[str, ...] = ()
    """The stream source's ``keyBy``: its entries (a program's, not partitioned) are read by every key
    group, each keeping the records whose key routes to it (runtime/partitioning.py, in pandas)."""
    drill: Drill | None = None
    rate: float = 1024.0
    """Records per second (event time seq / rate): drills run at a slow rate, so windows are open while
    units move."""


PATHS = [
    Path("lazy-jvm", config=LARGE_STEPS),
    Path("driver-batch", config=SMALL_STEPS),
    Path("named-stream", stream=True),
    Path("crossing-2-small-steps", executors=2, config=SMALL_STEPS),
    Path("crossing-3-large-steps", executors=3, config=LARGE_STEPS),
    Path("named-stream-crossing-2", executors=2, stream=True),
    Path("hand-over", executors=2, drill=Drill(moves=4), rate=16.0),
    Path("kill-and-restart", executors=2, config=DRILLS, drill=Drill(moves=1, kill=True), rate=16.0),
]

HELD_OUT = {
    p.name: p
    for p in (
        Path("1-small-steps", config=SMALL_STEPS),
        Path("1-large-steps", config=LARGE_STEPS),
        Path("2-small-steps", executors=2, config=SMALL_STEPS),
        Path("3-large-steps", executors=3, config=LARGE_STEPS),
    )
}
"""Paths the hand-written cases take in-process (held_out.py)."""
BY_NAME = {p.name: p for p in (*PATHS, *HELD_OUT.values())}
_streams = itertools.count()


def run_on(path: Path, spark, valkey_url: str, case: Case, work: FilePath) -> tuple[Plan, Expected, Outcome]:
    """``case`` through ``path`` and through the reference: the plan, what Spark batch evaluation gives,
    what the run left."""
    stream = f"diff-in-{path.name}-{os.getpid()}-{next(_streams)}" if path.stream else None
    p = plan(case, stream=stream, key_by=path.key_by)
    with reference_session(spark):
        expected = expected_of(spark, p)
    outcome = run_in_process(
        p, valkey_url, work, executors=path.executors, config=path.config, drill=path.drill, stream=stream
    )
    return p, expected, outcome


def check_on(path: Path, spark, valkey_url: str, case: Case, work: FilePath) -> None:
    """Raise harness.mismatch unless ``case`` through ``path`` gives Spark batch evaluation's answers (and
    fail if a drill path's run ended before its drill, so the path cannot pass untested)."""
    p, expected, outcome = run_on(path, spark, valkey_url, case, work)
    compare(p, expected, outcome, path.name)
    assert path.drill is None or outcome.drills or case.records.n < 8, (
        f"{path.name}: the run ended before its drill ({case.records.n} records at {case.records.rate}/s)"
    )
