"""Every path of the data plane gives Spark batch evaluation's answers (docs/runtime.md, "One semantics").

Generated cases (strategies.py: edge values in every type, queries from the supported grammar) run as
topologies in-process (executors in threads sharing the test session's SparkSession, a real Valkey), and
each sink's JSON lines and each operator's dead letters are compared with the reference (reference.py).
harness.py says how each path is forced. The profile (profiles.py) sets how many cases each path runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from harness import Drill, compare, expected_of, plan, reference_session, run_in_process
from hypothesis import given, seed
from profiles import PROFILE
from strategies import cases

from streamtopo.runtime.hosting import ExecutorConfig

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.valkey]

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
    Path("hand-over", executors=2, drill=Drill(moves=6, every=0.25), rate=16.0),
    Path("kill-and-restart", executors=2, config=DRILLS, drill=Drill(kill=True, every=0.4), rate=16.0),
]


@pytest.mark.parametrize("path", PATHS, ids=[p.name for p in PATHS])
def test_every_path_gives_spark_batch_answers(path: Path, spark, valkey, tmp_path_factory):
    runs = iter(range(10**6))

    @PROFILE.settings(PROFILE.pipeline_examples)
    @given(case=cases(max_records=PROFILE.max_records, rates=(path.rate,)))
    def check(case):
        stream = f"diff-in-{next(runs)}" if path.stream else None
        p = plan(case, stream=stream)
        with reference_session(spark):
            expected = expected_of(spark, p)
        outcome = run_in_process(
            p,
            valkey.url,
            tmp_path_factory.mktemp(path.name),
            executors=path.executors,
            config=path.config,
            drill=path.drill,
            stream=stream,
        )
        compare(p, expected, outcome, path.name)

    if PROFILE.seed is not None:
        check = seed(PROFILE.seed)(check)
    check()
