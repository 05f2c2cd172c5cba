"""What a step's records count: records in and out per unit and traffic per unit pair (the metrics the
load balancer and the autoscaler read, and the unit records a hand-over carries), booked without a Spark
job where the sizes are known or computed anyway, and in one job per step for the rest.

Known: a one-to-one edge from a source (a generator knows what it made); a flow a count-keeping map took,
from the map's output when that is computed into the driver. Computed anyway: an aggregate counts its lazy
input in its own job, a consumer that takes records out counts them on the way. Every other flow (into a
map or filter that stays lazy) is counted in the step's one count job (docs/runtime.md).

:class:`Counting` is mixed into :class:`~streamtopo.runtime.emit.Emit`, and so into the dataflow.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from functools import reduce

import pandas as pd
from pyspark.sql import DataFrame as SparkFrame
from pyspark.sql import functions as F

from streamtopo.contracts import unit_key
from streamtopo.planner.model import StreamTopologySpec
from streamtopo.runtime.flows import Flow
from streamtopo.runtime.hosting import Hosted
from streamtopo.runtime.metrics import ExecutorMetrics
from streamtopo.runtime.operators.base import computed
from streamtopo.runtime.operators.records import DST, EDGE, KG


class Counting:
    """Booking a step's record counts (see the module docstring)."""

    spec: StreamTopologySpec
    metrics: ExecutorMetrics
    hosted: dict[str, Hosted]

    def _count_in(self, unit: Hosted, n: int) -> None:
        unit.rec.records_in += n
        self.metrics.unit(self.metrics.records_in, unit.op, unit.kg).inc(n)

    def _count_out(self, unit: Hosted, n: int) -> None:
        unit.rec.records_out += n
        self.metrics.unit(self.metrics.records_out, unit.op, unit.kg).inc(n)

    def _sized_by_output(
        self, op: str, took: list[tuple[Flow, set[tuple[int, int]]]], sizes: pd.Series
    ) -> None:
        """Count the flows a count-keeping operator took from its output, computed into the driver: where
        each of its units took from one producing unit, that pair carried what the unit put out. VWAP's
        cleaned quotes: their filter's output is then not counted again in the step's count job, which
        regenerated every quote only to count them."""
        feeds = Counter(dst for _, pairs in took for _, dst in pairs)
        if any(n > 1 for n in feeds.values()):
            return
        received: dict[str, int] = defaultdict(int)
        for flow, pairs in took:
            self._counted(op, flow, pairs, {(s, d): int(sizes.get(d, 0)) for s, d in pairs}, received)
        for key, n in received.items():
            self._count_in(self.hosted[key], n)

    def _counted(
        self,
        op: str,
        flow: Flow,
        pairs: set[tuple[int, int]],
        counts: dict[tuple[int, int], int],
        received: dict[str, int],
    ) -> None:
        """Book a deferred flow's sizes once they are counted: records into ``received`` (per consuming
        unit), kg traffic, and the producer's records out when this flow gives them."""
        flow.counts = {pair: counts.get(pair, 0) for pair in pairs}
        produced: dict[int, int] = defaultdict(int)
        for (src, dst), n in flow.counts.items():
            received[unit_key((op, dst))] += n
            produced[src] += n
            if n:
                self.metrics.kg_edge(flow.producer, src, op, dst).inc(n)
        for src, n in produced.items():
            if (
                flow.producer_uncounted
                and (unit := self.hosted.get(unit_key((flow.producer, src)))) is not None
            ):
                self._count_out(unit, n)

    def _count_uncounted(self, uncounted: list[tuple[str, Flow, set[tuple[int, int]]]]) -> None:
        """Count the flows lazy consumers took (map, filter) in one Spark job: the union of their (producing
        unit, consuming unit) columns grouped once. A step pays one job for all of them instead of one per
        edge; each chain is recomputed, once per distinct frame: consumers of one output routed alike
        share it (Emit._emit), as VWAP's four symbol-group filters of the cleaned trades do."""
        # A flow from a count-keeping map is sized by what the map took (Flow.took) when those flows are
        # counted here or before it: VWAP's cleaned trades and quotes are then counted once, not twice.
        uncounted = [taken for taken in uncounted if taken[1].counts is None]  # some sized since taken
        index: dict[int, int] = {}  # id(frame) -> its place in the union
        frames: list[SparkFrame] = []
        known = {id(flow) for _, flow, _ in uncounted}
        taken: set[int] = set()
        for _, flow, _ in uncounted:
            if flow.took is not None and all(f.counts is not None or id(f) in known for f, _ in flow.took):
                taken.add(id(flow))
            elif id(flow.frame) not in index:
                index[id(flow.frame)] = len(frames)
                frames.append(flow.frame.select(F.lit(len(frames)).alias(EDGE), F.col(KG), F.col(DST)))
        counts: dict[int, dict[tuple[int, int], int]] = defaultdict(dict)
        if frames:
            union = reduce(lambda a, b: a.unionByName(b), frames)
            for edge, src, dst, n in computed(lambda: union.groupBy(EDGE, KG, DST).count().collect()):
                counts[int(edge)][(int(src), int(dst))] = int(n)
        for op, flow, pairs in uncounted:  # in the order taken: a map's input flows come before its output
            got = flow.taken_counts() if id(flow) in taken else counts[index[id(flow.frame)]]
            received: dict[str, int] = defaultdict(int)
            self._counted(op, flow, pairs, got or {}, received)
            for key, n in received.items():
                self._count_in(self.hosted[key], n)
