"""What passes between operators inside one executor step: lazy flows, parts per unit pair, partial
aggregates combined before the wire, in-memory deliveries and an operator's output."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property, reduce
from typing import TypeAlias

import pandas as pd
import pyarrow as pa
from pyspark.sql import DataFrame as SparkFrame
from pyspark.sql import functions as F

from streamtopo.runtime.operators.base import Batch, materialize
from streamtopo.runtime.operators.records import COUNT, DST, KG, SRC
from streamtopo.runtime.sinks import Segment

COMBINED = "__combined"
"""Where a consumer collects the partials producers combined for it (apart from records, by input)."""


@dataclass
class Flow:
    """An operator's lazy output routed to a downstream operator whose units are all hosted here:
    ``frame`` has ``_kg`` (producing unit) and ``__dst`` (consuming unit). ``counts`` (records per
    (src, dst)) are known without a job (a source's one-to-one edge), or, while ``None``, counted where
    the records are computed anyway: in the consumer's own job (an aggregate counts what it folds), in
    pandas when the consumer materialises them, else in the step's one count job for every flow left."""

    producer: str
    frame: SparkFrame
    pairs: set[tuple[int, int]]
    counts: dict[tuple[int, int], int] | None
    producer_uncounted: bool = False
    """The producer's own output size is unknown too (a lazy map/filter) and this flow's count gives it
    (one flow per producer does: each record goes to one unit of every consumer)."""
    took: list[tuple[Flow, set[tuple[int, int]]]] | None = None
    """For a producer that gives as many records as it takes (``keeps_count``) from flows still uncounted,
    on an edge where each producing unit feeds one consuming unit: those flows and the pairs it accepted.
    Each pair then carries what its producing unit took, known once they are counted, and the step's count
    job counts them, not this frame (:meth:`taken_counts`)."""

    def taken_counts(self) -> dict[tuple[int, int], int] | None:
        """Records per pair from what each producing unit took (None while a flow it took is uncounted)."""
        if self.took is None or any(flow.counts is None for flow, _ in self.took):
            return None
        took: dict[int, int] = defaultdict(int)  # producing unit -> records it took
        for flow, accepted in self.took:
            for pair in accepted:
                took[pair[1]] += (flow.counts or {}).get(pair, 0)
        return {(src, dst): took[src] for src, dst in self.pairs}


@dataclass(frozen=True)
class LazyPart:
    """The records unit ``src`` sends unit ``dst``, still inside a :class:`Flow`."""

    flow: Flow
    src: int
    dst: int

    @property
    def n(self) -> int | None:
        """Records in the part; None until the consumer has counted a deferred flow."""
        return None if self.flow.counts is None else self.flow.counts.get((self.src, self.dst), 0)

    def pandas(self) -> pd.DataFrame:
        frame = self.flow.frame.where((F.col(KG) == self.src) & (F.col(DST) == self.dst)).drop(DST)
        return materialize(frame)


PARTIAL_ROWS_PER_ENTRY = 65_536
"""Rows of partial aggregates per entry at most. A step's partials for a unit pair exist all at once, so
the edge's batch size (Aeolus trades latency for the cost per entry) has nothing to trade here: they go
in as few entries as keep each a few megabytes, each encoded once."""


@dataclass(frozen=True)
class Partials:
    """What unit ``src`` sends an aggregate's unit, combined before the wire: partial aggregates per key
    and bucket (``__n`` = the records each row stands for) instead of the records themselves."""

    frame: pd.DataFrame

    @cached_property
    def n(self) -> int:
        """The records these partials stand for (what backlogs, rates and kg traffic count)."""
        return int(self.frame[COUNT].sum())

    def chunks(self) -> list[Partials]:
        """Entries of at most :data:`PARTIAL_ROWS_PER_ENTRY` rows, in order."""
        size, rows = PARTIAL_ROWS_PER_ENTRY, len(self.frame)
        return [Partials(self.frame.iloc[i : i + size]) for i in range(0, rows, size)] or [self]


Part: TypeAlias = pd.DataFrame | pa.Table | LazyPart | Partials
"""What one producing unit sends one consuming unit in a step: records in pandas or Arrow, records still
in a lazy flow, or partial aggregates."""


@dataclass
class Delivery:
    """An entry handed to a local consumer in memory instead of through its stream."""

    producer: str
    seq: int
    watermark: float
    records: pd.DataFrame | LazyPart | Partials | None
    stream: str

    @property
    def n(self) -> int | None:
        return part_size(self.records)


@dataclass
class Produced:
    """What one operator's hosted units produced in a step: one frame for all of them (``_kg`` = the
    producing unit), and per unit (records out, or None while a lazy output is uncounted; watermark)."""

    frame: Batch | None
    units: dict[str, tuple[int | None, float]]
    work: dict[str, int]
    """Records each unit handled (its input, a source's output): splits the operator's busy time."""
    _pandas: pd.DataFrame | None = None
    took: list[tuple[Flow, set[tuple[int, int]]]] | None = None
    """The uncounted flows (and pairs accepted) that were all a count-keeping operator took: its units'
    output sizes are what they took from them (:attr:`Flow.took`)."""

    def pandas(self) -> pd.DataFrame | None:
        if self._pandas is None and self.frame is not None:
            self._pandas = materialize(self.frame)
        return self._pandas


@dataclass
class StepOutcome:
    work: bool = False
    sink_writes: list[tuple[Segment, int, bytes]] = field(default_factory=list)
    console: list[str] = field(default_factory=list)
    uncounted: list[tuple[str, Flow, set[tuple[int, int]]]] = field(default_factory=list)
    """Flows a lazy consumer took without counting them (consumer, flow, pairs accepted): the step
    counts them all in one Spark job before it commits."""


def part_size(part: Part | None) -> int | None:
    """Records in a part; None for a part of a flow its consumer has not counted yet."""
    return 0 if part is None else part.n if isinstance(part, (LazyPart, Partials)) else len(part)


def consumed(flow: Flow, pairs: set[tuple[int, int]], keep_source: bool) -> SparkFrame:
    """A flow as its consumer's input (``_kg`` = the consuming unit), limited to the pairs accepted;
    ``keep_source`` keeps the producing unit as ``__src`` for whoever counts the records it computes."""
    frame = flow.frame
    if pairs != flow.pairs:
        accepted = reduce(
            lambda a, b: a | b, [(F.col(KG) == s) & (F.col(DST) == d) for s, d in sorted(pairs)], F.lit(False)
        )
        frame = frame.where(accepted)
    if keep_source:
        return frame.withColumnRenamed(KG, SRC).withColumnRenamed(DST, KG)
    return frame.withColumn(KG, F.col(DST)).drop(DST)
