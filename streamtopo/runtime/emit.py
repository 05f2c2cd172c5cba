"""The output side of an executor's step: where each operator's output goes, and how.

Output to units this executor hosts is handed over in memory, as a lazy Spark frame while it can (records
never leave the JVM until a stateful operator folds them). Output for another executor's aggregate is
combined first in this JVM (partials per key and bucket, one Spark job: Spark's map-side combine), and a
step's partials for a unit pair go as one entry. Other records leave the JVM once, as Arrow, and are
appended to the destination unit's stream in entries of the edge's batch size (Aeolus), in the step's
one commit.

:class:`Emit` is mixed into :class:`~streamtopo.runtime.dataflow.Dataflow` (and so into the executor,
which owns the state declared on it).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql import DataFrame as SparkFrame
from pyspark.sql import functions as F

from streamtopo.contracts import Keys, RoutingTable, unit_key
from streamtopo.planner.graph import routing_key, unit_edges
from streamtopo.planner.model import StreamTopologySpec
from streamtopo.planner.scaling.aeolus import default_batch_records
from streamtopo.runtime.combining import Reduction
from streamtopo.runtime.counting import Counting
from streamtopo.runtime.flows import Delivery, Flow, LazyPart, Part, Partials, Produced, part_size
from streamtopo.runtime.hosting import ExecutorConfig, Hosted
from streamtopo.runtime.metrics import ExecutorMetrics
from streamtopo.runtime.operators import SharedPanes
from streamtopo.runtime.operators.aggregate import AggregateOperator
from streamtopo.runtime.operators.base import Batch, UnitOperator, computed, is_spark
from streamtopo.runtime.operators.records import COUNT, DST, KG, SRC, from_arrow, to_arrow, to_spark
from streamtopo.runtime.partitioning import route, route_column
from streamtopo.runtime.state_store import Commit
from streamtopo.runtime.transport import entry_fields


class Emit(Counting):
    """Routing an operator's output to its downstream units (see the module docstring)."""

    spec: StreamTopologySpec
    config: ExecutorConfig
    operators: dict[str, UnitOperator]
    downstream: dict[str, list[str]]
    keys: Keys
    metrics: ExecutorMetrics
    hosted: dict[str, Hosted]
    routing: RoutingTable | None
    spark: Any
    eager: bool
    sharing: list[SharedPanes]
    _dests: dict[str, dict[int, dict[str, list[int]]]]
    reductions: defaultdict[tuple[str, str], Reduction]
    """Per edge into an aggregate, whether combining before the wire shrinks it (combining.py)."""
    _last_punct: dict[tuple[str, str], float]
    _without_failing: Callable[..., Any]
    """Dataflow's: run a batch for an operator, its failing records to the dead-letter stream."""

    def dests(self, op: str, kg: int) -> dict[str, list[int]]:
        """Downstream operator -> key groups unit (op, kg) feeds (planner.graph.unit_edges)."""
        if op not in self._dests:
            table: dict[int, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
            for v in self.downstream[op]:
                for i, j, _ in unit_edges(self.spec, op, v):
                    table[i][v].append(j)
            self._dests[op] = table
        return self._dests[op][kg]

    def batch_records(self, producer: str, consumer: str) -> int:
        """Records per entry on ``producer->consumer``: the routing table's (Aeolus), else spec/default."""
        if self.routing and (n := self.routing.batch_sizes.get(f"{producer}->{consumer}")):
            return max(1, n)
        return default_batch_records(self.spec, producer)

    def _emit(
        self, op: str, produced: Produced, local: dict[str, list[Delivery]], commit: Commit, now: float
    ) -> None:
        """Route an operator's output to its downstream units, in entries of the edge's batch size.

        A lazy output whose consumers are all hosted here stays in the JVM, counted where its records are
        computed anyway or in the step's one count job (:class:`~streamtopo.runtime.flows.Flow`). Bound for
        another executor, a lazy output an aggregate consumes is combined first, in one Spark job
        (:meth:`_combined`); anything else is materialised once and cut into entries."""
        units = [self.hosted[key] for key in produced.units]
        claimed = False  # a deferred flow gives the producer's records out: no other edge books them
        shared: dict[int, pd.DataFrame] = {}
        routed: dict[tuple[tuple[str, ...] | None, int], SparkFrame] = {}
        for v in self.downstream[op]:
            dest_key, dest_k = routing_key(self.spec, v), self.spec.key_groups_of(v)
            wanted = {unit_key((v, j)) for u in units for j in self.dests(op, u.kg).get(v, [])}
            parts: dict[tuple[int, int], Part] = {}
            group = next((g for g in self.sharing if g.input == op and v in g.members), None)
            if group is not None and not self.eager and (frame := self._spark_output(produced)) is not None:
                # C-MR's shared sub-windows: one job for every member, each takes its columns. A step
                # redone eagerly hands each member its records instead, to isolate a failing one.
                if id(group) not in shared:
                    shared[id(group)] = self._combined(group.compute, frame, dest_key, dest_k)
                parts = {
                    pair: Partials(rows) for pair, rows in _by_pair(group.member_rows(shared[id(group)], v))
                }
            elif is_spark(produced.frame) and wanted <= set(self.hosted):
                # Consumers routed alike share one frame object: the step's count job counts it once.
                if (frame := routed.get((dest_key, dest_k))) is None:
                    frame = produced.frame.withColumn(
                        DST, route_column(dest_key, dest_k, F.col(KG)).cast("int")
                    )
                    routed[(dest_key, dest_k)] = frame
                counts = self._one_to_one_counts(op, v, produced, units)
                if counts is None:  # counted later, where the records are computed (Flow)
                    pairs = {(u.kg, j) for u in units for j in self.dests(op, u.kg).get(v, [])}
                    gives_out = not claimed and any(produced.units[u.key][0] is None for u in units)
                    claimed |= gives_out
                    one_each = all(len(self.dests(op, u.kg).get(v, [])) == 1 for u in units)
                    flow = Flow(op, frame, pairs, None, gives_out, produced.took if one_each else None)
                else:
                    flow = Flow(op, frame, set(counts), counts)
                parts = {pair: LazyPart(flow, *pair) for pair in flow.pairs}
            elif isinstance(aggregate := self.operators[v], AggregateOperator) and (
                is_spark(produced.frame) or not wanted <= set(self.hosted)
            ):
                reduction = self.reductions[(op, v)]
                if not reduction.combines():
                    parts = self._whole(op, produced, dest_key, dest_k)
                    reduction.sent(sum(part_size(p) or 0 for p in parts.values()))
                elif (
                    frame := produced.frame if is_spark(produced.frame) else produced.pandas()
                ) is not None and (is_spark(frame) or len(frame)):
                    rows = self._combined(aggregate.partials, frame, dest_key, dest_k, (v, commit))
                    parts = {pair: Partials(part) for pair, part in _by_pair(rows)}
                    reduction.combined(int(rows[COUNT].sum()) if len(rows) else 0, len(rows))
            else:
                parts = self._whole(op, produced, dest_key, dest_k)
            for unit in units:
                n_out, wm = produced.units[unit.key]
                sizes = [part_size(p) for (src, _), p in parts.items() if src == unit.kg]
                known = [size for size in sizes if size is not None]
                if (
                    n_out is None and len(known) == len(sizes) and not claimed
                ):  # a lazy output learns its size
                    self._count_out(unit, sum(known))
                    produced.units[unit.key] = (sum(known), wm)
                expected = self.dests(op, unit.kg).get(v, [])
                mine = {j: p for (src, j), p in parts.items() if src == unit.kg}
                for j in sorted(set(expected) | set(mine)):
                    self._deliver(unit, v, j, mine.get(j), wm, local, commit, now)

    def _whole(
        self, op: str, produced: Produced, dest_key: tuple[str, ...] | None, dest_k: int
    ) -> dict[tuple[int, int], Part]:
        """Records that travel whole, per (producing unit, consuming unit): a lazy output read by one
        operator leaves the JVM once as Arrow (:meth:`_routed`); records in the driver are routed in one
        pass and sorted by unit pair unless they come in that order (generated ones do), then sliced (a
        groupby per producing unit and destination built a frame per group, about a millisecond each;
        the sort copies every column)."""
        if is_spark(produced.frame) and len(self.downstream[op]) == 1:
            return dict(self._routed(produced.frame, dest_key, dest_k))
        records = produced.pandas()
        if records is None or not len(records):
            return {}
        src = records[KG].to_numpy(dtype=np.int64)
        dest = route(records, dest_key, dest_k, src).astype(np.int64)
        code = _pair_code(src, dest)
        if (np.diff(code) < 0).any():
            order = np.argsort(code, kind="stable")
            records, src, dest = records.iloc[order], src[order], dest[order]
        rows = records.reset_index(drop=True)
        return {pair: rows.iloc[a:b] for pair, a, b in _pair_runs(src, dest)}

    def _one_to_one_counts(
        self, op: str, v: str, produced: Produced, units: list[Hosted]
    ) -> dict[tuple[int, int], int] | None:
        """Records per unit pair without a Spark job, when each producing unit feeds one unit of ``v``
        and knows its output size (a source's generated records): a one-to-one edge carries them all."""
        counts = {}
        for unit in units:
            dests, n = self.dests(op, unit.kg).get(v, []), produced.units[unit.key][0]
            if len(dests) != 1 or n is None:
                return None
            if n:
                counts[(unit.kg, dests[0])] = n
        return counts

    def _combined(
        self,
        partials: Callable[[Batch], pd.DataFrame],
        frame: Batch,
        dest_key: tuple[str, ...] | None,
        dest_k: int,
        failing: tuple[str, Commit] | None = None,
    ) -> pd.DataFrame:
        """Map-side combine: ``partials`` (an aggregate's, or a sharing group's) of ``frame``, ``__src`` the
        producing unit and ``_kg`` the consuming one: from one Spark job in this JVM for a lazy frame, in
        numpy for a batch in the driver (a small step's). A crossing record then costs what a local one
        does; only a few rows per key and bucket are materialised and sent. In the driver, records whose
        aggregation arguments raise go to the dead-letter stream under ``failing``'s operator, as where
        the aggregate runs (:meth:`_without_failing`)."""
        if not is_spark(frame):

            def combine(records: pd.DataFrame) -> pd.DataFrame:
                src = records[KG].to_numpy()
                return partials(records.assign(**{SRC: src, KG: route(records, dest_key, dest_k, src)}))

            if failing is None:
                return combine(frame)
            return self._without_failing(failing[0], combine, frame, failing[1])
        routed = frame.withColumn(DST, route_column(dest_key, dest_k, F.col(KG)).cast("int"))
        return partials(routed.withColumnRenamed(KG, SRC).withColumnRenamed(DST, KG))

    def _spark_output(self, produced: Produced) -> SparkFrame | None:
        """An operator's output as a Spark frame (None without records): lazy as it is, or its records."""
        if is_spark(produced.frame):
            return produced.frame
        records = produced.pandas()
        return to_spark(self.spark, records) if records is not None and len(records) else None

    @staticmethod
    def _routed(
        frame: SparkFrame, dest_key: tuple[str, ...] | None, dest_k: int
    ) -> dict[tuple[int, int], pa.Table]:
        """Records that travel whole, per (producing unit, consuming unit): the destination computed in
        the producer's Spark job, the records leaving the JVM once as Arrow (no pandas, no routing in
        Python), sorted by pair and sliced without copying."""
        routed = frame.withColumn(DST, route_column(dest_key, dest_k, F.col(KG)).cast("int"))
        table = computed(lambda: routed.toArrow())
        if not table.num_rows:
            return {}
        table = table.sort_by([(KG, "ascending"), (DST, "ascending")])
        pairs = _pair_runs(table.column(KG).to_numpy(), table.column(DST).to_numpy())
        body = table.drop_columns([DST])
        return {pair: body.slice(a, b - a) for pair, a, b in pairs}

    def _silent(self, producer: str, target: str, n: int, wm: float, sent: float, now: float) -> bool:
        """True when an entry would say nothing new (no records, watermark not past what was sent) or be
        a punctuation moments after the last one (``+inf`` always goes); else notes the send time."""
        recent = now - self._last_punct.get((producer, target), 0.0) < self.config.punctuation_interval
        if n == 0 and (wm <= sent or (wm != math.inf and recent)):
            return True
        self._last_punct[(producer, target)] = now
        return False

    def _deliver(
        self,
        unit: Hosted,
        v: str,
        j: int,
        part: Part | None,
        wm: float,
        local: dict[str, list[Delivery]],
        commit: Commit,
        now: float,
    ) -> None:
        """Unit ``unit``'s records and watermark for unit (v, j): in memory if hosted here, else entries."""
        dkey = unit_key((v, j))
        n = part_size(part)
        sent = unit.rec.wm_out.get(dkey, -math.inf)
        if self._silent(unit.key, dkey, 1 if n is None else n, wm, sent, now):
            return
        stream = self.keys.stream(unit.op, v, j)
        if dkey in self.hosted:
            # Batching is a transport matter: a local consumer gets the whole part in one hand-off.
            chunks: list[Any] = [None if n == 0 else from_arrow(part) if isinstance(part, pa.Table) else part]
        else:
            if isinstance(part, Partials):
                chunks = part.chunks()
            elif not n:
                chunks = [None]
            else:
                size = self.batch_records(unit.op, v)
                # Arrow once, then zero-copy slices.
                table = part if isinstance(part, pa.Table) else to_arrow(part)
                chunks = [table.slice(i, size) for i in range(0, n, size)]
        for index, chunk in enumerate(chunks):
            seq = unit.rec.seq_out.get(dkey, 0) + 1
            unit.rec.seq_out[dkey] = seq
            # Only the last chunk carries the new watermark: it covers all the chunks before it.
            chunk_wm = wm if index == len(chunks) - 1 else sent
            if dkey in self.hosted:
                local[dkey].append(Delivery(unit.key, seq, chunk_wm, chunk, stream))
            else:
                self._append(commit, stream, unit.key, seq, chunk_wm, chunk)
        unit.rec.wm_out[dkey] = max(sent, wm)
        if n:
            self.metrics.kg_edge(unit.op, unit.kg, v, j).inc(n)

    def _append(
        self,
        commit: Commit,
        stream: str,
        producer: str,
        seq: int,
        wm: float,
        records: pd.DataFrame | pa.Table | Partials | None,
    ) -> None:
        if isinstance(records, Partials):
            n = records.n
            commit.appends.append((stream, entry_fields(producer, seq, wm, records.frame, combined=n)))
        else:
            n = 0 if records is None else len(records)
            commit.appends.append((stream, entry_fields(producer, seq, wm, records)))
        if n:
            commit.incr(self.keys.backlog, stream, n)


def _by_pair(rows: pd.DataFrame) -> Iterator[tuple[tuple[int, int], pd.DataFrame]]:
    """Rows per (producing unit ``__src``, consuming unit ``_kg``), without ``__src``: one sort, then
    slices (a groupby builds a frame per group, about a millisecond each)."""
    if rows.empty:
        return
    rows = rows.sort_values([SRC, KG], kind="stable")
    body = rows.drop(columns=[SRC]).reset_index(drop=True)
    for pair, a, b in _pair_runs(rows[SRC].to_numpy(), rows[KG].to_numpy()):
        yield pair, body.iloc[a:b]


def _pair_code(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """One int64 per row that orders rows by unit pair (src, dst): key groups fit 32 bits each."""
    return (src.astype(np.int64) << 32) | dst.astype(np.int64)


def _pair_runs(src: np.ndarray, dst: np.ndarray) -> list[tuple[tuple[int, int], int, int]]:
    """((src, dst), first row, end row) of each run of one unit pair in rows sorted by pair."""
    starts = np.flatnonzero(np.diff(_pair_code(src, dst), prepend=-1)).tolist()
    return [((int(src[a]), int(dst[a])), a, b) for a, b in zip(starts, [*starts[1:], len(src)])]
