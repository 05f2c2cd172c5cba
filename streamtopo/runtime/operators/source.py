"""Generator sources: deterministic, replayable record streams (streamtopo/runtime/generators.py).

Key group ``kg`` of ``k`` emits the records ``seq = kg, kg + k, kg + 2k, ...`` so the union over all key
groups is 0, 1, 2, ... (up to ``count``). A key group's state is just how many records it has emitted:
the offset a replay or a move resumes from. Its watermark is the event time of the next record it will
emit (the stream is generated in event-time order), ``+inf`` once the count is exhausted.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import SparkSession

from streamtopo.planner.model import Operator, StreamTopologySpec
from streamtopo.runtime import generators
from streamtopo.runtime.operators.base import KG, OperatorError, OperatorResult, UnitOperator


class SourceOperator(UnitOperator):
    def __init__(self, op: Operator, spec: StreamTopologySpec):
        super().__init__(op, spec)
        self.source = op.source
        if self.source.generator is not None and self.source.generator not in generators.GENERATORS:
            raise OperatorError(op.name, "source.generator", f"unknown generator {self.source.generator!r}")

    def process(self, spark: SparkSession, batch: pd.DataFrame, states: dict[int, Any],
                watermarks: dict[int, float]) -> OperatorResult:
        """Records a source hands on unchanged (a stream source's input, read by the executor)."""
        return OperatorResult(batch)

    def generate(self, kg: int, k: int, state: int | None, max_records: int) -> tuple[pd.DataFrame, int, float]:
        """Up to ``max_records`` next records of key group ``kg``: (records, new state, watermark)."""
        if self.source.generator is None:
            raise OperatorError(self.name, "source", "a stream source is read by the executor, not generated")
        done = state or 0
        count = self.source.count
        # Records of this kg still to come: seq = kg + i*k < count  <=>  i < ceil((count - kg) / k).
        total = None if count is None else max(0, -(-(count - kg) // k))
        n = max(0, max_records if total is None else min(max_records, total - done))
        seq = kg + (done + np.arange(n, dtype=np.int64)) * k
        frame = generators.generate(self.source.generator, seq, self.source.rate_per_second,
                                    self.source.seed, self.source.keys)
        frame[KG] = np.int32(kg)
        done += n
        watermark = math.inf if total is not None and done >= total else (kg + done * k) / self.source.rate_per_second
        return frame, done, watermark

    def encode_state(self, state: Any) -> bytes:
        return b"" if state is None else struct.pack("<q", state)

    def decode_state(self, data: bytes) -> Any:
        return struct.unpack("<q", data)[0] if data else None
