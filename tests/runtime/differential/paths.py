"""The paths of the data plane the differential harness drives, and how each is forced (docs/differential.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

from harness import Drill

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
