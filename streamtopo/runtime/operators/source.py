"""Generator sources: deterministic, replayable record streams (streamtopo/runtime/generators.py).

Key group ``kg`` of ``k`` emits the records ``seq = kg, kg + k, kg + 2k, ...``, or, for a source with
``keyBy``, the seqs whose key hashes to ``kg`` (planner/source_layout.py), so the union over all key
groups is 0, 1, 2, ... (up to ``count``). A key group's state is just how many records it has emitted:
the offset a replay or a move resumes from. Its watermark is the event time of the next record it will
emit (the stream is generated in event-time order), ``+inf`` once the count is exhausted. Records are
generated in Spark as one lazy frame for all requested key groups (see generators.py for why).
"""

from __future__ import annotations

import math
import struct
from typing import Any

import pandas as pd
from pyspark.sql import DataFrame as SparkFrame
from pyspark.sql import SparkSession

from streamtopo.planner import source_layout
from streamtopo.planner.model import Operator, SourceSpec, StreamTopologySpec
from streamtopo.runtime import generators
from streamtopo.runtime.operators.base import OperatorError, OperatorResult, UnitOperator


class SourceOperator(UnitOperator):
    def __init__(self, op: Operator, spec: StreamTopologySpec):
        super().__init__(op, spec)
        self.spec = spec
        assert op.source is not None  # a source operator has its source (the model's validator)
        self.source: SourceSpec = op.source
        if self.source.generator is not None and self.source.generator not in generators.GENERATORS:
            raise OperatorError(op.name, "source.generator", f"unknown generator {self.source.generator!r}")

    def process(
        self, spark: SparkSession, batch: pd.DataFrame, states: dict[int, Any], watermarks: dict[int, float]
    ) -> OperatorResult:
        """Records a source hands on unchanged (a stream source's input, read by the executor)."""
        return OperatorResult(batch)

    def output_frame(self, spark: SparkSession) -> SparkFrame | None:
        """The records' columns and types as a frame of no records (runtime/analysis.py); None for a stream
        source, whose records come from programs this topology does not know."""
        source = self.source
        if source.generator is None:
            return None
        return generators.frame(
            spark, source.generator, [], self.key_groups, source.rate_per_second, source.seed, source.keys
        )

    def generate(
        self, spark: SparkSession, requests: list[tuple[int, int | None, int]]
    ) -> tuple[SparkFrame | None, dict[int, tuple[int, int, float]]]:
        """Up to ``max_records`` next records of each requested ``(kg, state, max_records)``, as one lazy
        frame (``None`` when no key group has any), and per kg ``(n emitted now, new state, watermark)``,
        computed here without running a Spark job: the executor learns counts and watermarks for free
        and the records stay lazy into the next operator."""
        if self.source.generator is None:
            raise OperatorError(self.name, "source", "a stream source is read by the executor, not generated")
        k, count, rate = self.key_groups, self.source.count, self.source.rate_per_second
        parts, out = [], {}
        for kg, state, max_records in requests:
            done = state or 0
            layout = source_layout.layout(self.spec, self.name, kg)
            total = layout.total(count)  # records of this kg in all
            n = max(0, max_records if total is None else min(max_records, total - done))
            if n:
                parts.append((kg, done, n))
            done += n
            out[kg] = (n, done, math.inf if total is not None and done >= total else layout.seq(done) / rate)
        source, generator = self.source, self.source.generator
        df = (
            None
            if not parts
            else generators.frame(
                spark, generator, parts, k, rate, source.seed, source.keys, by_key=bool(self.op.key_by)
            )
        )
        return df, out

    def encode_state(self, state: Any) -> bytes:
        return b"" if state is None else struct.pack("<q", state)

    def decode_state(self, data: bytes) -> Any:
        return struct.unpack("<q", data)[0] if data else None
