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
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame as SparkFrame
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from streamtopo.planner.model import Operator, StreamTopologySpec
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
from streamtopo.runtime.operators.state import decode_frames, encode_frames
from streamtopo.runtime.operators.windows import Windowing

WINDOW = "__win"


def combine_inputs(frames: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One batch of both inputs with an ``_input`` column; integer columns become nullable (Int64) so
    that the other side's missing values do not turn them into floats; :func:`split_inputs` undoes it."""
    parts = []
    for name, frame in frames.items():
        ints = {
            c: f"{str(t).capitalize()}"
            for c, t in frame.dtypes.items()
            if pd.api.types.is_integer_dtype(t) and c != KG
        }
        parts.append(frame.astype(ints).assign(**{INPUT: name}))
    return pd.concat(parts, ignore_index=True)


def split_inputs(batch: pd.DataFrame, name: str) -> pd.DataFrame:
    """The records of input ``name``, without the other input's (all-null) columns."""
    rows = batch[batch[INPUT] == name].drop(columns=[INPUT])
    rows = rows[[c for c in rows.columns if c in (KG, TS) or rows[c].notna().any()]]
    restore = {
        c: str(t).lower()
        for c, t in rows.dtypes.items()
        if isinstance(t, pd.api.extensions.ExtensionDtype)
        and pd.api.types.is_integer_dtype(t)
        and rows[c].notna().all()
    }
    return rows.astype(restore).reset_index(drop=True)


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
        rows = {name: pd.concat(parts, ignore_index=True) if parts else None for name, parts in sides.items()}
        output = self._fire(rows, prev, now)
        return OperatorResult(output, self._split(rows, kgs, now))

    def _fire(
        self,
        rows: dict[str, pd.DataFrame | None],
        prev: dict[int, float],
        now: dict[int, float],
    ) -> pd.DataFrame:
        """Join the windows that fire now: window assignment, bounds, equi-join (:meth:`_join`)."""
        nothing = pd.DataFrame(columns=[WINDOW_START, WINDOW_END, *self.keys, TS, KG])
        left, right = rows[self.left], rows[self.right]
        if left is None or right is None or not any(now[kg] > prev[kg] for kg in now):
            return nothing
        # Only records inside some window that fires now are windowed, not the whole buffer.
        left, right = (frame[self._in_firing_window(frame, prev, now)] for frame in (left, right))
        if left.empty or right.empty:
            return nothing
        return self._join(left, right, prev, now)

    def _join(
        self,
        left: pd.DataFrame,
        right: pd.DataFrame,
        prev: dict[int, float],
        now: dict[int, float],
    ) -> pd.DataFrame:
        """The windows that fire now, joined in pandas: the records are in the driver already (the join's
        state lives there), and a Spark join of a few hundred buffered records cost three stages and a
        third of a second per step (docs/runtime.md). Equality as Spark's equi-join has it: null keys
        match nothing, -0.0 equals 0.0; the key types were checked before the run (runtime/analysis.py)."""
        w = self.windowing
        clash = (set(left.columns) & set(right.columns)) - {*self.keys, KG, TS}
        sides = [
            self._windowed(frame, name, clash, prev, now)
            for frame, name in ((left, self.left), (right, self.right))
        ]
        try:
            out = sides[0].merge(sides[1], on=[KG, *self.keys, WINDOW], how="inner", sort=False)
        except (ValueError, TypeError) as error:  # e.g. a string key on one side, a number on the other
            raise OperatorError(self.name, "keyBy", str(error).splitlines()[0]) from None
        n = out.pop(WINDOW).to_numpy(dtype=np.int64)
        kg = out.pop(KG)
        others = [c for c in out.columns if c not in self.keys]
        result = pd.concat(
            [pd.DataFrame({WINDOW_START: w.start(n), WINDOW_END: w.end(n)}), out[self.keys], out[others]],
            axis=1,
        )
        result[TS] = result[WINDOW_END]
        result[KG] = kg.astype("int32")
        return result.sort_values([KG, WINDOW_END, *self.keys], kind="stable").reset_index(drop=True)

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
        out = out[(end > lo) & (end <= hi) & out[self.keys].notna().all(axis=1).to_numpy()]
        for key in self.keys:
            if pd.api.types.is_float_dtype(out[key].dtype):
                out[key] = out[key] + 0.0  # -0.0 + 0.0 is 0.0: Spark normalises signed zeros in join keys
        return out

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
        self, rows: dict[str, pd.DataFrame | None], kgs: list[int], now: dict[int, float]
    ) -> dict[int, Any]:
        """Per key group: each side's records still inside a window that has not fired, and the watermark."""
        kept: dict[str, dict[int, pd.DataFrame]] = {}
        for name, frame in rows.items():
            kept[name] = {}
            if frame is None:
                continue
            alive = self._window_ends(frame)[1] > frame[KG].map(now).to_numpy(dtype=np.float64)
            for kg, part in frame[alive].groupby(KG):
                kept[name][kg] = part.drop(columns=[KG]).reset_index(drop=True)
        return {
            kg: {**{name: kept[name].get(kg, pd.DataFrame()) for name in rows}, "wm": now[kg]} for kg in kgs
        }

    def encode_state(self, state: Any) -> bytes:
        if state is None:
            return b""
        return encode_frames(
            {self.left: state[self.left], self.right: state[self.right]}, {"wm": state["wm"]}
        )

    def decode_state(self, data: bytes) -> Any:
        if not data:
            return None
        frames, meta = decode_frames(data)
        return {**frames, **meta}
