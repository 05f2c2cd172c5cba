"""What an executor hosts and the knobs of its loop, shared by its lifecycle (executor.py), the
hand-over (handover.py) and the per-step dataflow (dataflow.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from streamtopo.contracts import unit_key
from streamtopo.runtime.combining import MIN_RECORDS, RATIO
from streamtopo.runtime.pacing import Pacing
from streamtopo.runtime.sinks import Segment
from streamtopo.runtime.state_store import UnitRecord


@dataclass(frozen=True)
class ExecutorConfig:
    """Knobs of the loop; defaults suit local runs and tests."""

    max_entries: int = 256
    """Entries read per input stream per step."""
    handover_entries: int = 4
    """... while units wait to be acquired (the receiver's step is a released unit's pause)."""
    handover_source_records: int = 20_000
    """The per-unit cap while units wait to be acquired, so a hand-over's pause stays short."""
    max_source_records: int = 8_000_000
    """Records all hosted units of a source generate per step together at most while they stay in the JVM
    (every consumer an aggregate, or lazy here and so on). Backlogged units take all that is due up to
    this, so Spark's fixed cost per step (planning, code generation, about 0.3 s of CPU) is spread over
    the backlog. It bounds the executor's step, which runs one Spark job for all the units: an executor
    hosting half the units takes as many records per step, and so pays that fixed cost as often per
    record, as one hosting all of them."""
    materialized_records: int = 1_000_000
    """Records all units of a source generate per step at most when they must come out of the JVM (a sink,
    a UDF, records travelling whole): the driver's heap (512 MB by default) bounds what one step collects."""
    held_records: int = 100_000
    """Records a generator unit whose output only windows see holds back at most until the next window
    end (metrics.SourcePace.released): small steps between window ends cost Spark's fixed cost each and
    delay the step that closes the window, while beyond this the work left at a window's end grows."""
    small_step_records: int = 250_000
    """Below this many records a step expects (entries read plus generator records due), Spark's fixed
    costs outweigh its speed per record: the step runs Spark's operators interpreted (no whole-stage code
    generation), computes a lazy output several operators read once, and leaves the rest to numpy where
    it can (dataflow.Dataflow._plan_for)."""
    combine_min_records: int = MIN_RECORDS
    """Records an edge into an aggregate combines before it is judged (runtime/combining.py)."""
    combine_ratio: float = RATIO
    """Partial rows per record above which such an edge ships its records whole instead."""
    punctuation_interval: float = 0.1
    """Minimum seconds between two record-less watermark entries to the same unit (+inf always goes)."""
    busy_share: float = 0.25
    """An executor that keeps up waits after a step up to ``1 / busy_share`` times the step's length from
    its start (at most ``spec.batching.interval``): the share of its time its steps take at least, where
    their fixed cost dominates (executor.Executor._pause)."""
    idle_sleep: float = 0.02
    """Seconds between steps that found no work while a generator is due to produce or units move."""
    idle_block: float = 0.5
    """Longest wait for input once nothing else can bring work (runtime/executor.py: Executor._idle): an
    entry ends it at once; a routing change or a stop is seen at most this late."""
    heartbeat_ttl: float = 3.0
    handover_timeout: float = 20.0
    scheduling: str = "hybrid"
    """C-MR policy for backlogged input queues (runtime/scheduling.py): hybrid, odf, ydf, cto, mem, or all."""
    step_records: int = 200_000
    """Records a step reads from input streams at most once queues hold more (the scheduling budget)."""
    memory_limit: float = 512e6
    """Bytes of backlog plus state the hybrid policy treats as full (x = 1 in C-MR's Eq. 3.1)."""
    release_timeout: float = 90.0
    """Longest a donor keeps a unit for a receiver that is not ready yet (a pod that never starts)."""
    metrics_interval: float = 1.0
    pacing: Pacing = Pacing()
    """How many due records a step's generators take (runtime/pacing.py)."""
    share_panes: bool = True
    """Aggregates reading one input share their sub-windows (runtime/operators/shared_panes.py). Off only
    to measure what sharing saves: every executor of a topology must agree (it decides the state layout)."""


@dataclass
class Hosted:
    """A unit this executor owns: the epoch it acquired with, its committed record and live state."""

    op: str
    kg: int
    epoch: int
    rec: UnitRecord
    state: Any
    busy: float = 0.0
    """Seconds this executor spent on the unit since acquiring it (C-MR's MEM rank divides by it)."""
    segment: Segment | None = None
    """A file sink unit's file here (sinks.resume, when acquired or recovered)."""

    @property
    def key(self) -> str:
        return unit_key((self.op, self.kg))
