"""What an executor hosts and the knobs of its loop, shared by its lifecycle (executor.py), the
hand-over (handover.py) and the per-step dataflow (dataflow.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from streamtopo.planner.routing import unit_key
from streamtopo.runtime.state_store import UnitRecord

DEFAULT_BATCH_RECORDS = 512
"""Records per transport entry when neither the routing table (Aeolus) nor spec.batching.size says."""


def default_batch_records(spec, producer: str) -> int:
    """``spec.batching.size`` if set, else 512 records capped at ``batching.maxBytes`` (64 KB) worth."""
    if spec.batching.size:
        return spec.batching.size
    record_bytes = spec.operator(producer).record_bytes or 64
    return max(1, min(DEFAULT_BATCH_RECORDS, spec.batching.max_bytes // record_bytes))


@dataclass(frozen=True)
class ExecutorConfig:
    """Knobs of the loop; defaults suit local runs and tests."""

    max_entries: int = 256
    """Entries read per input stream per step."""
    handover_source_records: int = 20_000
    """The per-unit cap while units wait to be acquired, so a hand-over's pause stays short."""
    source_records: int = 250_000
    """Records one source unit generates per step at most, to begin with and whenever it keeps up."""
    max_source_records: int = 2_000_000
    """The most the per-unit step cap grows to: it doubles every step a unit still had more records due
    than the cap (a backlogged source), so Spark's fixed cost per step (planning, code generation,
    about 0.3 s of CPU) is spread over ever more records until the source catches up."""
    punctuation_interval: float = 0.1
    """Minimum seconds between two record-less watermark entries to the same unit (+inf always goes)."""
    idle_sleep: float = 0.02
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

    @property
    def key(self) -> str:
        return unit_key((self.op, self.kg))


