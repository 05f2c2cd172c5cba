"""Keyed aggregation: event-time windows with C-MR completeness and shared panes, or a running total.

Windowed (``window: {size, slide}``), per key group:
- Spark assigns each record of the batch to buckets and computes partial aggregates per
  (key group, key, bucket). A bucket is a pane (the C-MR Combine path: tumbling sub-windows of size
  HCF(w, s), shared by the w/s overlapping windows) or a window (the per-window path: each record is
  folded into each of its w/s windows). :func:`windows.combine_pays` picks the path from the spec's
  expected rates, once, at build time (state layouts differ, so it never flips mid-stream).
- The driver merges the batch's partials into the key group's state (a few rows per key).
- A window fires when the key group's watermark passes its end (C-MR 2.2.2, completeness); panes merge
  into windows only then (3.8.1). Each window fires once: the state remembers the watermark it last
  fired at, and records arriving later for an already fired window are dropped from that window
  (they still count in the later windows that contain them). Both paths give identical results.

Output columns: ``window_start, window_end, <keys>, <aliases>, _ts = window_end, _kg``.

Without a window the aggregate is a running total per key since the start of the stream: every
``process`` call emits, for each key present in the batch, its aggregate over everything seen so far,
with ``_ts`` the latest event time of that key. Intermediate emissions depend on how the stream is cut
into batches; the last emission per key (the current total) does not. Output: ``<keys>, <aliases>,
_ts, _kg``. No keyBy at all (and no inherited key) aggregates each key group's stream as one group.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql import DataFrame as SparkFrame
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from streamtopo.planner.graph import rates
from streamtopo.planner.model import Operator, StreamTopologySpec
from streamtopo.runtime.operators.aggregations import (
    Aggregation,
    finalize,
    fold,
    merge_grouped,
    merge_partials,
    parse_aggregations,
    partial_kinds,
)
from streamtopo.runtime.operators.base import (
    Batch,
    OperatorError,
    OperatorResult,
    UnitOperator,
    computed,
    ensure_reserved,
    guarded,
    is_spark,
    lazily,
)
from streamtopo.runtime.operators.folds import (
    SparkArithmeticError,
    extreme,
    group_codes,
    key_hashes,
    normalized_keys,
)
from streamtopo.runtime.operators.numpy_eval import Evaluator
from streamtopo.runtime.operators.records import (
    BUCKET,
    COUNT,
    KG,
    POS,
    SRC,
    TS,
    column,
    concat,
    to_pandas,
    to_spark,
)
from streamtopo.runtime.operators.state import decode_frames, encode_frames
from streamtopo.runtime.operators.windows import Windowing, combine_pays
from streamtopo.runtime.partitioning import partition_key
from streamtopo.runtime.spark import get_spark

WINDOW_START, WINDOW_END = "window_start", "window_end"


def values_per_second(op: Operator, spec: StreamTopologySpec) -> float:
    """C-MR's ``t`` for a keyed window: expected input records per second per key.

    The operator's input rate (the planner's rate propagation, :func:`planner.graph.rates`) split over
    its key groups, then over the keys one key group holds when an upstream generator declares its key
    count (``source.keys``); with no declared keys, one key per key group (an upper bound on ``t``).
    """
    input_rate, _ = rates(spec)
    k = spec.key_groups_of(op.name)
    sources = [spec.operator(name).source for name in _ancestors(spec, op.name)]
    declared = [source.keys for source in sources if source is not None and source.keys]
    keys_per_group = max(1.0, max(declared) / k) if declared else 1.0
    return input_rate[op.name] / k / keys_per_group


def _ancestors(spec: StreamTopologySpec, name: str) -> set[str]:
    seen: set[str] = set()
    stack = list(spec.operator(name).inputs)
    while stack:
        current = stack.pop()
        if current not in seen:
            seen.add(current)
            stack.extend(spec.operator(current).inputs)
    return seen


def bucket_partials(
    frame: SparkFrame, keys: list[str], w: Windowing | None, panes: bool, aggs: list[Aggregation]
) -> SparkFrame:
    """Partials of one batch per (_kg, keys, bucket): the record-level work, in Spark. A bucket is a pane
    (``panes``) or a window of ``w``; without a window, one row per key with the latest ``_ts``. An input
    carrying ``__src`` is grouped by it too and counted (the executor's records per unit pair); a record
    folded into several windows counts once, in its first."""
    group = [KG, *keys]
    extra = []
    first = F.lit(True)
    if w is not None:
        pane = w.pane_sql(TS)
        if panes:
            frame = frame.withColumn(BUCKET, F.expr(pane))
        elif w.a == w.b:  # windows do not overlap: the one window of each record
            frame = frame.withColumn(BUCKET, F.expr(f"CAST(FLOOR({pane} / {w.a}) AS BIGINT)"))
        else:
            frame = frame.select("*", F.posexplode(F.expr(w.windows_sql(pane))).alias(POS, BUCKET))
            first = F.col(POS) == 0
        group.append(BUCKET)
    else:
        extra.append(F.max(TS).alias(TS))
    if SRC in frame.columns:
        group.append(SRC)
        extra.append(F.sum(F.when(first, 1).otherwise(0)).alias(COUNT))
    types = argument_types(frame, aggs)
    exprs = [F.expr(sql) for agg in aggs for sql in agg.partial_sql(types.get(agg.index))]
    return frame.groupBy(*group).agg(*exprs, *extra)


def argument_types(frame: SparkFrame, aggs: list[Aggregation]) -> dict[int, str]:
    """The Spark types of the averages' arguments over ``frame`` (an average's partial sum is a double or,
    for a decimal, a decimal: aggregations.py); the analyzer's answer, no job."""
    averaged = [agg for agg in aggs if agg.averages]
    if not averaged:
        return {}
    schema = frame.select(*[F.expr(agg.arg) for agg in averaged]).schema
    return {agg.index: field.dataType.simpleString() for agg, field in zip(averaged, schema.fields)}


def numpy_partials(
    values: pd.DataFrame,
    keys: list[str],
    w: Windowing | None,
    panes: bool,
    aggs: list[Aggregation],
) -> pd.DataFrame:
    """What :func:`bucket_partials` computes, for a batch already in the driver: ``values`` has ``_kg``,
    ``_ts``, the keys and each aggregation's argument as ``__v<index>`` (numpy_eval.py evaluated them, with
    Spark's types), and ``__src`` when a producer combines for another executor (then grouped by it too and
    counted in ``__n``, a record once, in its first window). The partials fold with Spark's semantics and
    types (folds.py); an overflow raises :class:`~folds.SparkArithmeticError` as Spark would."""
    group = [KG, *keys]
    frame = values
    first = np.ones(len(frame), dtype=np.int64)
    if w is not None:
        pane = np.floor(frame[TS].to_numpy(dtype=np.float64) / w.pane).astype(np.int64)
        if panes:
            bucket = pane
        elif w.a == w.b:  # windows do not overlap: the one window of each record
            bucket = np.floor_divide(pane, w.a)
        else:
            rows, bucket = w.windows_of_panes(pane)
            first = (bucket == w.first_window(pane)[rows]).astype(np.int64)
            frame = frame.iloc[rows].reset_index(drop=True)
        frame = frame.assign(**{BUCKET: bucket})
        group.append(BUCKET)
    if SRC in frame.columns:
        group.append(SRC)
    codes, firsts = group_codes(frame, group)
    n = len(firsts)
    out = normalized_keys(frame[group]).iloc[firsts].reset_index(drop=True)
    for agg in aggs:
        argument = frame[f"__v{agg.index}"]
        for name, kind in agg.partial_columns().items():
            out[name] = fold(kind, argument, codes, n, merging=False)
    if w is None:
        out[TS] = extreme(frame[TS], codes, n, largest=True)
    if SRC in frame.columns:
        out[COUNT] = np.bincount(codes, weights=first, minlength=n).astype(np.int64)
    return out


class AggregateOperator(UnitOperator):
    lazy_input = True
    counts_input = True
    stateful = True
    combines = True

    def __init__(
        self,
        op: Operator,
        spec: StreamTopologySpec,
        combine: bool | None = None,
        pane: Fraction | None = None,
    ):
        """``pane``: the sub-window this aggregate shares with others reading its input (shared_panes.py);
        its state is then kept per pane of that size."""
        super().__init__(op, spec)
        try:
            self.aggs = parse_aggregations(op.aggregations or [])
        except ValueError as error:
            raise OperatorError(op.name, "aggregations", str(error)) from None
        self.keys = list(partition_key(spec, op.name) or ())
        self.kinds = partial_kinds(self.aggs)
        self.windowing = Windowing.of(op.window, pane) if op.window else None
        if self.windowing is None:
            self.combine = False
        elif pane is not None:
            self.combine = True
        elif combine is None:
            self.combine = combine_pays(
                self.windowing.size, self.windowing.slide, values_per_second(op, spec)
            )
        else:
            self.combine = combine
        self.arguments = Evaluator(self._arguments, op.name, "aggregations")

    # ------------------------------------------------------------------------------------------ Spark

    def _partials(self, frame: SparkFrame) -> SparkFrame:
        return bucket_partials(frame, self.keys, self.windowing, self.combine, self.aggs)

    def _arguments(self, frame: SparkFrame) -> SparkFrame:
        """What the partials read: key group (and producing unit), event time, keys, each argument."""
        args = [F.expr(a.arg).alias(f"__v{a.index}") for a in self.aggs]
        carried = [c for c in (KG, SRC, TS, *self.keys) if c in frame.columns]
        return frame.select(*[F.col(c) for c in carried], *args)

    def _batch_partials(self, spark: SparkSession, batch: pd.DataFrame) -> pd.DataFrame:
        """Partials of a batch in the driver: numpy where Spark's resolved arguments allow, else Spark."""
        arguments = self.arguments(spark, batch)
        if arguments is not None:
            return numpy_partials(arguments, self.keys, self.windowing, self.combine, self.aggs)
        return to_pandas(self._partials(to_spark(spark, batch)))

    def output_frame(self, frame: SparkFrame) -> SparkFrame:
        """The output's columns and types over a lazy input, without running a job (runtime/analysis.py):
        the partials' Spark expressions, then the final values as :func:`finalize` gives them (an average
        is a double, any other aggregation keeps its partial's type)."""
        partials = lazily(self.name, "aggregations", lambda: self._partials(frame), frame)
        types = argument_types(frame, self.aggs)
        values = []
        for agg in self.aggs:
            first = F.col(next(iter(agg.partial_columns())))
            if agg.averages:
                kind = types[agg.index]
                first = first.cast(_average_type(kind) if kind.startswith("decimal") else "double")
            values.append(first.alias(agg.alias))
        bounds = [F.lit(0.0).alias(WINDOW_START), F.lit(0.0).alias(WINDOW_END)] if self.windowing else []
        ts = F.lit(0.0).alias(TS) if self.windowing else F.col(TS)
        return partials.select(*bounds, *self.keys, *values, ts, KG)

    def partials(self, frame: Batch) -> pd.DataFrame:
        """Map-side combine: the partials of a producer's lazy output, computed in the producer's JVM
        (one Spark job for every key group pair), or of its output in the driver, in numpy where it can
        be, so only a few rows per key and bucket cross executors.

        ``frame`` carries ``__src`` (producing unit) and ``_kg`` (consuming unit); the rows keep both and
        ``__n``, the records each row stands for. Merging them later (``process(partials=...)``) gives
        what folding the records there would: partials merge associatively (aggregations.py)."""
        if not is_spark(frame):
            return guarded(self.name, "aggregations", lambda b: self._batch_partials(get_spark(), b), frame)
        partials = lazily(self.name, "aggregations", lambda: self._partials(frame), frame)
        return computed(lambda: to_pandas(partials))

    # ---------------------------------------------------------------------------------------- process

    def process(
        self,
        spark: SparkSession,
        batch: Batch,
        states: dict[int, Any],
        watermarks: dict[int, float],
        partials: pd.DataFrame | None = None,
    ) -> OperatorResult:
        """Fold ``batch`` (records) and ``partials`` (rows :meth:`partials` made upstream, ``_kg`` = the
        consuming unit) into the key groups' states, then emit (fired windows, or running totals)."""
        fresh, counts = None, None
        if is_spark(batch):
            # Records still in the JVM: only the partials (a few rows per key and bucket) reach Python.
            lazy = lazily(self.name, "aggregations", lambda: self._partials(batch), batch)
            fresh = computed(lambda: to_pandas(lazy))
            if SRC in fresh.columns:
                sized = fresh.dropna(subset=[SRC]).groupby([SRC, KG])[COUNT].sum()
                counts = {(int(s), int(d)): int(n) for (s, d), n in sized.items()}
                fresh = fresh.drop(columns=[SRC, COUNT])
        elif len(batch):
            batch = ensure_reserved(batch, self.name)
            fresh = guarded(self.name, "aggregations", lambda b: self._batch_partials(spark, b), batch)
        if partials is not None and len(partials):
            partials = partials.drop(columns=[SRC, COUNT], errors="ignore")
            fresh = partials if fresh is None else concat([fresh, partials])
        kgs = sorted(set(states) | (set(fresh[KG].unique().tolist()) if fresh is not None else set()))
        try:
            if self.windowing is None:
                result = self._running(states, fresh, kgs)
            else:
                parts = []  # state first: what came earlier folds first, as in one Spark aggregation
                for kg in kgs:
                    state = states.get(kg)
                    if state is not None and len(state["rows"]):
                        parts.append(state["rows"].assign(**{KG: np.int32(kg)}))
                if fresh is not None and len(fresh):
                    parts.append(fresh)
                by = [KG, *self.keys, BUCKET]
                rows = merge_partials(concat(parts), by, self.kinds) if parts else None
                result = self._fire(rows, kgs, states, watermarks)
        except SparkArithmeticError as error:  # a total Spark's ANSI mode refuses: the step fails
            field, _, message = str(error).partition(": ")
            raise OperatorError(self.name, field, message) from None
        result.input_counts = counts
        return result

    def _running(self, states: dict[int, Any], fresh: pd.DataFrame | None, kgs: list[int]) -> OperatorResult:
        """Fold the step's partials into the state rows of the keys they touch and emit those keys' totals.

        A key group's other rows are only passed over by their key hashes (kept beside the rows, computed
        once per row), never regrouped: the grouping and folding cost what the step brought, not what the
        state holds. The touched rows fold first, then the step's, in order, as one Spark aggregation over
        everything seen would (folds.py)."""
        kept = {kg: _rows_of(states.get(kg)) for kg in kgs}
        if fresh is None or not len(fresh):
            return OperatorResult(self._empty_output(), kept)
        by = [KG, *self.keys]
        hashes = key_hashes(fresh, self.keys)
        owner = fresh[KG].to_numpy()
        emitted = []
        for kg in sorted(set(owner.tolist())):
            mine = owner == kg
            state = kept[kg]
            rows = state["rows"] if state else _empty_rows(None)
            stored = state.get("hashes") if state else np.zeros(0, dtype=np.uint64)
            if stored is None:  # decoded from the store: hashed once
                stored = key_hashes(rows, self.keys)
            touched = pd.Series(stored, copy=False).isin(hashes[mine]).to_numpy()
            before = rows[touched].assign(**{KG: np.int32(kg)})
            both = concat([before, fresh[mine]]) if len(before) else fresh[mine].reset_index(drop=True)
            codes, first = group_codes(both, by)
            merged = merge_grouped(both, codes, first, by, self.kinds, extra_max=(TS,))
            stepped = np.zeros(len(first), dtype=bool)
            stepped[codes[len(before) :]] = True  # a key merely colliding with one of the step's is kept
            emitted.append(merged[stepped])
            rest = rows[~touched]
            new = merged.drop(columns=[KG])
            both_hashes = np.concatenate([stored[touched], hashes[mine]])
            kept[kg] = {
                "rows": concat([rest, new], contiguous=True) if len(rest) else new,
                "hashes": np.concatenate([stored[~touched], both_hashes[first]]),
            }
        output = finalize(concat(emitted).reset_index(drop=True), self.aggs)
        return OperatorResult(self._ordered(output), kept)

    def _fire(
        self, rows: pd.DataFrame | None, kgs: list[int], states: dict[int, Any], watermarks: dict[int, float]
    ) -> OperatorResult:
        w = self.windowing
        assert w is not None  # only windowed aggregates fire
        prev = {kg: (states.get(kg) or {}).get("wm", -math.inf) for kg in kgs}
        now = {kg: max(prev[kg], watermarks.get(kg, -math.inf)) for kg in kgs}
        if rows is None or rows.empty:
            return OperatorResult(
                self._empty_output(), {kg: {"rows": _empty_rows(rows), "wm": now[kg]} for kg in kgs}
            )
        lo = rows[KG].map(prev).to_numpy(dtype=np.float64)
        hi = rows[KG].map(now).to_numpy(dtype=np.float64)
        bucket = rows[BUCKET].to_numpy(dtype=np.int64)
        if self.combine:
            # Merge the panes of every window that fires now (the "aggregate the aggregates" step).
            at, window = w.windows_of_panes(bucket)
            end = w.end(window)
            firing = (end > lo[at]) & (end <= hi[at])
            merged = rows.iloc[at[firing]].assign(**{BUCKET: window[firing]})
            windows = merge_partials(merged, [KG, *self.keys, BUCKET], self.kinds)
            keep = w.end(w.last_window(bucket)) > hi
        else:
            end = w.end(bucket)
            windows = rows[(end > lo) & (end <= hi)]
            keep = end > hi
        output = finalize(windows.reset_index(drop=True), self.aggs)
        n = output.pop(BUCKET).to_numpy(dtype=np.int64)
        output.insert(0, WINDOW_END, column(w.end(n), None, pa.float64()))
        output.insert(0, WINDOW_START, column(w.start(n), None, pa.float64()))
        output[TS] = w.end(n)
        return OperatorResult(self._ordered(output), self._split(rows[keep], kgs, now))

    # ------------------------------------------------------------------------------------------ shape

    @property
    def output_columns(self) -> list[str]:
        return (
            ([WINDOW_START, WINDOW_END] if self.windowing else [])
            + self.keys
            + [a.alias for a in self.aggs]
            + [TS, KG]
        )

    def _ordered(self, output: pd.DataFrame) -> pd.DataFrame:
        if output.empty:
            return (
                self._empty_output()
                if not len(output.columns)
                else output[self.output_columns].reset_index(drop=True)
            )
        order = [KG, WINDOW_END, *self.keys] if self.windowing else [KG, *self.keys]
        return output[self.output_columns].sort_values(order, kind="stable").reset_index(drop=True)

    def _empty_output(self) -> pd.DataFrame:
        """No records, but the output's columns (so downstream sees a consistent shape)."""
        return pd.DataFrame(
            {
                c: pd.Series(
                    dtype="float64"
                    if c in (TS, WINDOW_START, WINDOW_END)
                    else "int32"
                    if c == KG
                    else "object"
                )
                for c in self.output_columns
            }
        )

    def _split(self, rows: pd.DataFrame, kgs: list[int], wm: dict[int, float]) -> dict[int, Any]:
        """A windowed aggregate's state per key group: its partial rows (without ``_kg``) and the
        watermark it fired at."""
        by_kg = {kg: part.drop(columns=[KG]).reset_index(drop=True) for kg, part in rows.groupby(KG)}
        empty = rows.drop(columns=[KG]).iloc[:0]
        return {kg: {"rows": by_kg.get(kg, empty), "wm": wm[kg]} for kg in kgs}

    # ------------------------------------------------------------------------------------------ state

    def encode_state(self, state: Any) -> bytes:
        if state is None:
            return b""
        meta = {"wm": state["wm"]} if "wm" in state else {}
        return encode_frames({"rows": state["rows"]}, meta)

    def decode_state(self, data: bytes) -> Any:
        if not data:
            return None
        frames, meta = decode_frames(data)
        return {"rows": frames["rows"], **meta}


def _rows_of(state: dict[str, Any] | None) -> dict[str, Any] | None:
    """A running aggregate's key group state, None when it holds no rows."""
    return state if state is not None and len(state["rows"]) else None


def _average_type(argument: str) -> str:
    """Spark's Average of decimal(p, s): decimal(min(38, p + 4), min(38, s + 4))."""
    precision, scale = (int(part) for part in argument[len("decimal(") : -1].split(","))
    return f"decimal({min(38, precision + 4)},{min(38, scale + 4)})"


def _empty_rows(rows: pd.DataFrame | None) -> pd.DataFrame:
    return pd.DataFrame() if rows is None else rows.drop(columns=[KG]).iloc[:0]
