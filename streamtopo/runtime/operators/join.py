"""Windowed equi-join of two keyed inputs.

Both inputs are partitioned by the join's ``keyBy`` (same hash, same key groups), so matching records
meet in the same key group. A record belongs to the windows covering its event time (the same
``Windowing`` as aggregates: size, slide, panes). Window ``n`` of a key group fires when the key group's
watermark passes its end; it then emits the inner join of the left and right records of that window on
the key, one output record per matching pair per window (a pair in two overlapping windows appears
twice, once per window, as a windowed join in SQL would).

State is the buffered records of each side (a join is not decomposable). A record is dropped once
every window containing it has fired; records arriving for already fired windows only join in the
later windows that still contain them.

The batch carries both inputs, told apart by ``_input``; :func:`combine_inputs` builds such a batch
without losing integer types to the other side's missing columns.

Output: ``window_start, window_end, <keys>``, then the left input's other columns, then the right's;
a name present on both sides is prefixed with its input's name (``trades_price``, ``quotes_price``);
``_ts = window_end``; ``_kg``.

A window's output is the product of its two sides per key, so it grows with the square of the rate
(examples/windowed-join.yaml at 50,000 records/s fires ~940M pairs per 5-second window; built at once,
they took the executor's driver past 23 GB until the kernel's OOM killer ended it). So a step emits at
most :attr:`JoinOperator.max_step_pairs` pairs (fewer for wide records: :data:`OUTPUT_SHARE`), whole left
records at a time in window order, pairs counted from group sizes before any is built. The fired windows'
records not yet paired stay in the key group's state (``pending``, committed with the step like the rest)
and the output's watermark waits at the end of the earliest of their windows, so downstream windows do
not fire before their records come: backpressure through the watermark, with memory bounded per step.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame as SparkFrame
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from streamtopo.planner.model import Operator, StreamTopologySpec
from streamtopo.runtime.memory import memory_limit
from streamtopo.runtime.operators.aggregate import WINDOW_END, WINDOW_START
from streamtopo.runtime.operators.base import (
    INPUT,
    KG,
    TS,
    OperatorError,
    OperatorResult,
    UnitOperator,
    ensure_reserved,
    lazily,
)
from streamtopo.runtime.operators.folds import normalized_keys
from streamtopo.runtime.operators.records import WINDOW, arrow_array, column, concat, to_arrow
from streamtopo.runtime.operators.state import decode_frames, encode_frames
from streamtopo.runtime.operators.windows import Windowing

STEP_PAIRS = 1_000_000
"""Pairs a join emits per step at most (as ExecutorConfig.materialized_records bounds what a step takes
out of the JVM): a step's output stays a few hundred MB in the driver whatever the windows hold."""
OUTPUT_SHARE = 0.05
"""Share of the memory this process may use (:func:`memory_limit`) one step's join output may take, for
records so wide that :data:`STEP_PAIRS` of them would not fit: the output is built in pandas next to both
sides, then copied again by the operators after it."""
PENDING = "pending"
"""State entry: (left, right) records of fired windows whose pairs are not all emitted yet."""
_PENDING_FRAMES = ("__pending.left", "__pending.right")

INPUTS = "inputs"
"""``batch.attrs`` entry of a combined batch: each input's columns as (its name, the name in the batch)."""


def combine_inputs(frames: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One batch of both inputs with an ``_input`` column, every column's type kept: a column one input
    lacks is null in its rows, and a name both inputs have with different types is kept apart (the second
    input's under ``__<input>.<name>``). :func:`split_inputs` gives each input back as it came: its own
    columns (all of them, even one that is all null in a step, so the output's never depend on the step)."""
    seen: dict[str, pa.DataType] = {}
    columns: dict[str, list[tuple[str, str]]] = {}
    parts = []
    for name, frame in frames.items():
        own = []
        for column_name in frame.columns:
            kind = to_arrow(frame[[column_name]].iloc[:0]).schema.types[0]
            target = column_name
            known = seen.get(column_name)
            if (
                known is not None
                and known != kind
                and not pa.types.is_null(kind)
                and not pa.types.is_null(known)
            ):
                target = f"__{name}.{column_name}"
            seen.setdefault(target, kind)
            own.append((column_name, target))
        columns[name] = own
        parts.append(frame.rename(columns=dict(own)).assign(**{INPUT: name}))
    batch = concat(parts)
    batch.attrs[INPUTS] = columns
    return batch


def split_inputs(batch: pd.DataFrame, name: str) -> pd.DataFrame:
    """The records of input ``name``, with its own columns under their own names."""
    own = batch.attrs.get(INPUTS, {}).get(name) or [(c, c) for c in batch.columns if c != INPUT]
    present = [(column_name, target) for column_name, target in own if target in batch.columns]
    mine = batch[INPUT].to_numpy() == name
    # Only this input's columns are taken (the other input's are null in these rows anyway).
    out = batch.loc[mine, [target for _, target in present]].reset_index(drop=True)
    out.columns = [column_name for column_name, _ in present]
    return out


class JoinOperator(UnitOperator):
    stateful = True

    def __init__(self, op: Operator, spec: StreamTopologySpec):
        super().__init__(op, spec)
        if len(op.inputs) != 2:
            raise OperatorError(op.name, "inputs", f"a join needs exactly two inputs, got {len(op.inputs)}")
        self.left, self.right = op.inputs
        assert op.key_by is not None and op.window is not None  # a join has both (the model's validator)
        self.keys = list(op.key_by)
        self.windowing = Windowing.of(op.window)
        self.max_step_pairs = STEP_PAIRS
        """Pairs one step emits at most (tests set fewer)."""
        self.output_budget = OUTPUT_SHARE * memory_limit()
        """Bytes one step's output may take."""

    def process(
        self, spark: SparkSession, batch: pd.DataFrame, states: dict[int, Any], watermarks: dict[int, float]
    ) -> OperatorResult:
        sides: dict[str, list[pd.DataFrame]] = {self.left: [], self.right: []}
        seen = set(states)
        if len(batch):
            batch = ensure_reserved(batch, self.name, keep_input=True)
            if INPUT not in batch.columns:
                raise OperatorError(self.name, "inputs", "join records lack the _input column")
            unknown = set(batch[INPUT].unique()) - set(sides)
            if unknown:
                raise OperatorError(self.name, "inputs", f"records from unknown input(s) {sorted(unknown)}")
            for name, parts in sides.items():
                rows = split_inputs(batch, name)
                missing = [k for k in self.keys if k not in rows.columns and len(rows)]
                if missing:
                    raise OperatorError(self.name, "keyBy", f"input {name!r} lacks key column(s) {missing}")
                if len(rows):
                    parts.append(rows)
            seen |= set(batch[KG].unique().tolist())
        kgs = sorted(seen)
        for kg in kgs:
            state = states.get(kg)
            if state is not None:
                for name, parts in sides.items():
                    if len(state[name]):
                        parts.append(state[name].assign(**{KG: np.int32(kg)}))
        prev = {kg: (states.get(kg) or {}).get("wm", -math.inf) for kg in kgs}
        now = {kg: max(prev[kg], watermarks.get(kg, -math.inf)) for kg in kgs}
        rows = {name: concat(parts) if parts else None for name, parts in sides.items()}
        queued = [(states.get(kg) or {}).get(PENDING) for kg in kgs]
        fired = self._fire(rows, prev, now)
        output, rest = self._emit([q for q in [*queued, fired] if q is not None])
        return OperatorResult(output, self._split(rows, kgs, now, rest))

    def has_pending(self, state: Any) -> bool:
        return bool(state) and state.get(PENDING) is not None

    def output_watermark(self, state: Any, watermark: float) -> float:
        """Held at the end of the earliest window with pairs still to emit (its output's event time)."""
        if not self.has_pending(state):
            return watermark
        return min(watermark, float(self.windowing.end(state[PENDING][0][WINDOW].min())))

    def _fire(
        self,
        rows: dict[str, pd.DataFrame | None],
        prev: dict[int, float],
        now: dict[int, float],
    ) -> tuple[pd.DataFrame, pd.DataFrame] | None:
        """Both sides' records of the windows that fire now, once per such window (:meth:`_windowed`);
        None when no pair can come of them."""
        left, right = rows[self.left], rows[self.right]
        if left is None or right is None or not any(now[kg] > prev[kg] for kg in now):
            return None
        # Only records inside some window that fires now are windowed, not the whole buffer.
        left, right = (frame[self._in_firing_window(frame, prev, now)] for frame in (left, right))
        if left.empty or right.empty:
            return None
        clash = (set(left.columns) & set(right.columns)) - {*self.keys, KG, TS}
        fired = (
            self._windowed(left, self.left, clash, prev, now),
            self._windowed(right, self.right, clash, prev, now),
        )
        return None if fired[0].empty or fired[1].empty else fired

    def _emit(
        self, queue: list[tuple[pd.DataFrame, pd.DataFrame]]
    ) -> tuple[pd.DataFrame, tuple[pd.DataFrame, pd.DataFrame] | None]:
        """Join the queued windows (those of earlier steps with pairs left, then those firing now) up to
        :meth:`step_pairs` pairs: whole left records in window order, at least one. Returns the output
        and what stays queued: the other left records, with the right records they pair with.

        The joins run in pandas: the records are in the driver already (the join's state lives there), and
        a Spark join of a few hundred buffered records cost three stages and a third of a second per step
        (docs/runtime.md). Equality as Spark's equi-join (``USING``) has it: null keys match nothing, NaN
        equals NaN, -0.0 equals 0.0, an int equals the double of the same value; the output's keys are the
        left input's values (a -0.0 stays -0.0), as Spark's are."""
        if not queue:
            return self._nothing(), None
        left, right = concat([q[0] for q in queue]), concat([q[1] for q in queue])
        matched = [f"__key{i}" for i in range(len(self.keys))]
        for i, key in enumerate(self.keys):
            kind = _common_key_type(self.name, key, left[key], right[key])
            for side in (left, right):
                side[matched[i]] = normalized_keys(pd.DataFrame({key: _cast(side[key], kind)}))[key]
        on = [KG, *matched, WINDOW]
        left = left.sort_values(WINDOW, kind="stable").reset_index(drop=True)
        sizes = right.groupby(on, sort=False, dropna=False).size().rename("__pairs").reset_index()
        pairs = left[on].merge(sizes, on=on, how="left")["__pairs"].fillna(0).to_numpy(np.int64)
        take = max(1, int(np.searchsorted(np.cumsum(pairs), self.step_pairs(left, right), side="right")))
        now, later = left.iloc[:take], left.iloc[take:][pairs[take:] > 0]  # a record with no pair is done
        out = now.merge(right.drop(columns=self.keys), on=on, how="inner", sort=False).drop(columns=matched)
        rest = None
        if len(later):
            paired = right[on].merge(later[on].drop_duplicates(), on=on, how="left", indicator=True)
            rest = (
                later.drop(columns=matched).reset_index(drop=True),
                right[(paired["_merge"] == "both").to_numpy()].drop(columns=matched).reset_index(drop=True),
            )
        if out.empty:
            return self._nothing(), rest
        w = self.windowing
        n = out.pop(WINDOW).to_numpy(dtype=np.int64)
        kg = out.pop(KG).to_numpy()
        others = [c for c in out.columns if c not in self.keys]
        result = pd.concat(
            [
                pd.DataFrame({WINDOW_START: column(w.start(n), None, pa.float64())}),
                pd.DataFrame({WINDOW_END: column(w.end(n), None, pa.float64())}),
                out[self.keys],
                out[others],
            ],
            axis=1,
        )
        result[TS] = w.end(n)
        result[KG] = kg.astype("int32")
        return result.sort_values([KG, TS], kind="stable").reset_index(drop=True), rest

    def step_pairs(self, left: pd.DataFrame, right: pd.DataFrame) -> int:
        """Pairs one step emits at most: :attr:`max_step_pairs`, fewer where records are so wide that
        these would not fit :attr:`output_budget`."""
        width = _row_bytes(left) + _row_bytes(right)
        return max(1, min(self.max_step_pairs, int(self.output_budget / max(width, 1.0))))

    def _nothing(self) -> pd.DataFrame:
        return (
            pd.DataFrame({c: pd.Series(dtype="float64") for c in (WINDOW_START, WINDOW_END)})
            .assign(**{key: pd.Series(dtype=object) for key in self.keys}, **{TS: pd.Series(dtype="float64")})
            .assign(**{KG: pd.Series(dtype="int32")})
        )

    def _windowed(
        self,
        frame: pd.DataFrame,
        name: str,
        clash: set[str],
        prev: dict[int, float],
        now: dict[int, float],
    ) -> pd.DataFrame:
        """One side's records once per window that contains them and fires now (per key group
        ``prev < end <= now``), the window index in ``__win``; a name on both sides (or an upstream
        aggregate's window bounds) prefixed with the input's name; records with a null key dropped."""
        w = self.windowing
        renamed = {c: f"{name}_{c}" for c in frame.columns if c in clash or c in (WINDOW_START, WINDOW_END)}
        frame = frame.rename(columns=renamed).reset_index(drop=True)
        pane = np.floor(frame[TS].to_numpy(dtype=np.float64) / w.pane).astype(np.int64)
        rows, n = w.windows_of_panes(pane)
        out = frame.drop(columns=[TS]).iloc[rows].reset_index(drop=True)
        out[WINDOW] = n
        end = w.end(n)
        kg = out[KG].to_numpy()
        lo = pd.Series(prev).reindex(kg).to_numpy(dtype=np.float64)
        hi = pd.Series(now).reindex(kg).to_numpy(dtype=np.float64)
        return out[(end > lo) & (end <= hi) & out[self.keys].notna().all(axis=1).to_numpy()].reset_index(
            drop=True
        )

    def _joined(self, left: SparkFrame, right: SparkFrame, bounds: SparkFrame) -> SparkFrame:
        """The join :meth:`_join` computes, as a Spark plan over lazy inputs: what the fail-fast analysis
        (:meth:`output_frame`) resolves, so the output's columns and types are known before the run."""
        w = self.windowing
        clash = (set(left.columns) & set(right.columns)) - {*self.keys, KG, TS}

        def windowed(sdf: SparkFrame, name: str) -> SparkFrame:
            renamed = {c: f"{name}_{c}" for c in sdf.columns if c in clash or c in (WINDOW_START, WINDOW_END)}
            sdf = sdf.withColumnsRenamed({**renamed, TS: "__ts"})
            sdf = sdf.withColumn(WINDOW, F.explode(F.expr(w.windows_sql(w.pane_sql("__ts"))))).drop("__ts")
            end = F.col(WINDOW).cast("double") * w.slide + w.size
            return (
                sdf.join(bounds, KG)
                .where((end > F.col("__lo")) & (end <= F.col("__hi")))
                .drop("__lo", "__hi")
            )

        return windowed(left, self.left).join(windowed(right, self.right), [KG, *self.keys, WINDOW])

    def output_frame(self, left: SparkFrame, right: SparkFrame) -> SparkFrame:
        """The output's columns and types over lazy inputs, without running a job (runtime/analysis.py):
        the Spark join :meth:`_fire` runs, laid out as it lays the output out."""
        bounds = left.sparkSession.createDataFrame([], f"{KG} int, __lo double, __hi double")
        joined = lazily(self.name, "keyBy", lambda: self._joined(left, right, bounds), left, right)
        others = [c for c in joined.columns if c not in (*self.keys, KG, WINDOW)]
        window = [F.lit(0.0).alias(WINDOW_START), F.lit(0.0).alias(WINDOW_END)]
        return joined.select(*window, *self.keys, *others, F.lit(0.0).alias(TS), KG)

    def _window_ends(self, frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """End of the first and of the last window containing each record (numpy, same rule as Spark)."""
        w = self.windowing
        pane = np.floor(frame[TS].to_numpy(dtype=np.float64) / w.pane).astype(np.int64)
        return w.end(w.first_window(pane)), w.end(w.last_window(pane))

    def _in_firing_window(
        self, frame: pd.DataFrame, prev: dict[int, float], now: dict[int, float]
    ) -> np.ndarray:
        first, last = self._window_ends(frame)
        return (first <= frame[KG].map(now).to_numpy(dtype=np.float64)) & (
            last > frame[KG].map(prev).to_numpy(dtype=np.float64)
        )

    def _split(
        self,
        rows: dict[str, pd.DataFrame | None],
        kgs: list[int],
        now: dict[int, float],
        rest: tuple[pd.DataFrame, pd.DataFrame] | None,
    ) -> dict[int, Any]:
        """Per key group: each side's records still inside a window that has not fired, the watermark, and
        the fired windows' records with pairs still to emit (``rest``, from :meth:`_emit`)."""
        pending: dict[int, tuple[pd.DataFrame, pd.DataFrame]] = {}
        if rest is not None:
            lefts, rights = (dict(iter(side.groupby(KG))) for side in rest)
            pending = {
                int(kg): (part.reset_index(drop=True), rights[kg].reset_index(drop=True))
                for kg, part in lefts.items()
            }
        kept: dict[str, dict[int, pd.DataFrame]] = {}
        for name, frame in rows.items():
            kept[name] = {}
            if frame is None:
                continue
            alive = self._window_ends(frame)[1] > frame[KG].map(now).to_numpy(dtype=np.float64)
            for kg, part in frame[alive].groupby(KG):
                kept[name][kg] = part.drop(columns=[KG]).reset_index(drop=True)
        empty = {name: _no_records(frame) for name, frame in rows.items()}  # once, not per key group
        return {
            kg: {
                **{name: kept[name].get(kg, empty[name]) for name in rows},
                "wm": now[kg],
                **({PENDING: pending[kg]} if kg in pending else {}),
            }
            for kg in kgs
        }

    def encode_state(self, state: Any) -> bytes:
        if state is None:
            return b""
        pending = dict(zip(_PENDING_FRAMES, state[PENDING])) if self.has_pending(state) else {}
        return encode_frames(
            {self.left: state[self.left], self.right: state[self.right], **pending}, {"wm": state["wm"]}
        )

    def decode_state(self, data: bytes) -> Any:
        if not data:
            return None
        frames, meta = decode_frames(data)
        pending = tuple(frames.pop(name) for name in _PENDING_FRAMES if name in frames)
        return {**frames, **meta, **({PENDING: pending} if pending else {})}


def _row_bytes(frame: pd.DataFrame) -> float:
    """Bytes one record of ``frame`` takes in pandas, strings included (an estimate of one side's share of
    an output row)."""
    return float(frame.memory_usage(index=False, deep=True).sum()) / max(1, len(frame))


def _no_records(frame: pd.DataFrame | None) -> pd.DataFrame:
    """A side's state without records, its columns and types kept (so a restored state's are the same)."""
    return pd.DataFrame() if frame is None else frame.iloc[:0].drop(columns=[KG])


def _key_type(series: pd.Series) -> pa.DataType:
    if isinstance(series.dtype, pd.ArrowDtype):
        return series.dtype.pyarrow_dtype
    return pa.from_numpy_dtype(series.dtype) if series.dtype != object else pa.string()


def _common_key_type(operator: str, key: str, left: pd.Series, right: pd.Series) -> pa.DataType:
    """The type both sides' key compares in, as Spark's coercion of ``left.key = right.key`` gives it:
    equal types as they are, integers as bigint, any floating side as double, decimals as a decimal wide
    enough for both."""
    a, b = _key_type(left), _key_type(right)
    if a == b:
        return a
    numeric = [pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t) for t in (a, b)]
    if not all(numeric):
        raise OperatorError(operator, "keyBy", f"key {key!r} is {a} on one side and {b} on the other")
    if pa.types.is_floating(a) or pa.types.is_floating(b):
        return pa.float64()
    if pa.types.is_integer(a) and pa.types.is_integer(b):
        return pa.int64()
    scale = max(t.scale for t in (a, b) if pa.types.is_decimal(t))
    return pa.decimal128(38, scale)


def _cast(series: pd.Series, kind: pa.DataType) -> pd.Series:
    if _key_type(series) == kind:
        return series.reset_index(drop=True)
    return pd.Series(pd.arrays.ArrowExtensionArray(pc.cast(arrow_array(series), kind)))
