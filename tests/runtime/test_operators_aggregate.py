"""Windowed and running aggregates against references computed in plain Python/pandas."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from streamtopo.runtime.operators import OperatorError, build_operator
from streamtopo.runtime.operators.windows import Windowing, combine_pays, hcf

pytestmark = pytest.mark.spark

KG_OF_KEY = {"a": 0, "b": 1, "c": 1, "d": 3}  # a fixed routing: a key always lands in one key group
AGGS = ["sum(value * 2) AS s2", "count(*) AS n", "avg(value) AS mean", "min(value) AS lo", "max(value) AS hi"]


def records(n: int = 160, seed: int = 1, horizon: float = 30.0) -> pd.DataFrame:
    """Random keyed records on a 0.25 s grid (exact in binary, so no boundary depends on rounding)."""
    rng = np.random.default_rng(seed)
    keys = rng.choice(list(KG_OF_KEY), size=n)
    return (
        pd.DataFrame(
            {
                "key": keys,
                "value": rng.integers(-50, 100, size=n),
                "_ts": rng.integers(0, int(horizon * 4), size=n) / 4.0,
                "_kg": np.array([KG_OF_KEY[k] for k in keys], dtype=np.int32),
            }
        )
        .sort_values("_ts", kind="stable")
        .reset_index(drop=True)
    )


def reference(df: pd.DataFrame, size: float, slide: float, windows_of, arrived_before=None) -> pd.DataFrame:
    """Per (window, key): the aggregates over the records of that window, computed record by record.

    ``arrived_before(record_index, window_end)`` (optional) says whether the record had arrived when
    the window fired; records that had not are left out (late records)."""
    acc: dict[tuple, list[int]] = {}
    for i, row in enumerate(df.to_dict("records")):
        for start in windows_of(row["_ts"], size, slide):
            if arrived_before is None or arrived_before(i, start + size):
                acc.setdefault((start, start + size, row["key"], row["_kg"]), []).append(int(row["value"]))
    rows = [
        {
            "window_start": s,
            "window_end": e,
            "key": k,
            "s2": 2 * sum(v),
            "n": len(v),
            "mean": sum(v) / len(v),
            "lo": min(v),
            "hi": max(v),
            "_ts": e,
            "_kg": kg,
        }
        for (s, e, k, kg), v in acc.items()
    ]
    return canonical(pd.DataFrame(rows))


def canonical(df: pd.DataFrame) -> pd.DataFrame:
    df = df.astype({"s2": "int64", "n": "int64", "lo": "int64", "hi": "int64", "_kg": "int32"})
    return df.sort_values(["_kg", "window_end", "key"]).reset_index(drop=True)


def aggregate_op(make_spec, size, slide, combine, aggs=AGGS):
    window = {"size": size} if slide is None else {"size": size, "slide": slide}
    spec = make_spec(
        {"name": "src", "kind": "source", "source": {"generator": "sequence"}},
        {
            "name": "agg",
            "kind": "aggregate",
            "inputs": ["src"],
            "keyBy": ["key"],
            "window": window,
            "aggregations": aggs,
        },
    )
    return build_operator(spec.operator("agg"), spec, combine=combine)


def run(op, spark, deliveries, roundtrip: bool = False) -> pd.DataFrame:
    """Feed (batch, watermarks) deliveries, threading each key group's state through, as an executor
    would; ``roundtrip`` stores every state as bytes in between (as in Valkey)."""
    store: dict[int, object] = {}
    outputs = []
    for batch, watermarks in deliveries:
        kgs = set(watermarks) | set(batch["_kg"].tolist())
        states = {kg: store[kg] for kg in kgs if kg in store}
        result = op.process(spark, batch, states, {kg: watermarks.get(kg, -math.inf) for kg in kgs})
        for kg, state in result.states.items():
            store[kg] = op.decode_state(op.encode_state(state)) if roundtrip else state
        outputs.append(result.output)
    nonempty = [o for o in outputs if len(o)]
    return pd.concat(nonempty, ignore_index=True) if nonempty else outputs[-1]


ALL_KGS = (0, 1, 2, 3)
WINDOWS = [(5.0, None), (6.0, 2.0), (5.0, 1.5), (4.0, 4.0)]


@pytest.mark.parametrize("combine", [True, False], ids=["panes", "per-window"])
@pytest.mark.parametrize("size,slide", WINDOWS)
def test_one_batch_equals_reference(spark, make_spec, windows_of, size, slide, combine):
    df = records()
    op = aggregate_op(make_spec, size, slide, combine)
    out = run(op, spark, [(df, {kg: math.inf for kg in ALL_KGS})])
    expected = reference(df, size, slide or size, windows_of)
    pd.testing.assert_frame_equal(canonical(out), expected, check_dtype=False)


@pytest.mark.parametrize("combine", [True, False], ids=["panes", "per-window"])
def test_out_of_order_batches_and_key_group_subsets(spark, make_spec, windows_of, combine):
    """Records shuffled within 5 s epochs, each epoch delivered in two calls holding different key
    groups; the watermark after an epoch is the next epoch's start (no record is late)."""
    df = records(seed=2)
    rng = np.random.default_rng(3)
    deliveries = []
    for epoch_start in np.arange(0, 30, 5.0):
        epoch = df[(df._ts >= epoch_start) & (df._ts < epoch_start + 5)]
        epoch = epoch.sample(frac=1.0, random_state=int(rng.integers(1 << 30)))
        for subset in ({0, 1}, {2, 3}):
            part = epoch[epoch._kg.isin(subset)]
            deliveries.append((part, {kg: epoch_start + 5 for kg in subset}))
    deliveries.append((df.iloc[:0], {kg: math.inf for kg in ALL_KGS}))
    out = run(aggregate_op(make_spec, 6.0, 2.0, combine), spark, deliveries, roundtrip=True)
    pd.testing.assert_frame_equal(canonical(out), reference(df, 6.0, 2.0, windows_of), check_dtype=False)


def test_late_records_only_count_in_windows_not_yet_fired(spark, make_spec, windows_of):
    """A window fires once, at the first watermark past its end; records arriving after that are
    missing from it but present in later windows. Both paths agree with that reference."""
    df = records(seed=4)
    order = np.random.default_rng(5).permutation(len(df))  # fully shuffled: many late records
    chunks = np.array_split(order, 6)
    watermarks = [7.0, 11.0, 16.0, 21.0, 26.0, math.inf]  # unrelated to the data: lateness is real
    arrival = np.empty(len(df), dtype=int)
    for c, idx in enumerate(chunks):
        arrival[idx] = c

    def fired_at(end: float) -> int:
        return next(c for c, wm in enumerate(watermarks) if wm >= end)

    expected = reference(df, 6.0, 2.0, windows_of, lambda i, end: arrival[i] <= fired_at(end))
    for combine in (True, False):
        deliveries = [(df.iloc[idx], {kg: wm for kg in ALL_KGS}) for idx, wm in zip(chunks, watermarks)]
        out = run(aggregate_op(make_spec, 6.0, 2.0, combine), spark, deliveries)
        pd.testing.assert_frame_equal(canonical(out), expected, check_dtype=False)


def test_windows_fire_only_when_the_key_groups_watermark_passes_their_end(spark, make_spec):
    df = records(seed=6)
    op = aggregate_op(make_spec, 5.0, None, True)
    result = op.process(spark, df, {}, {0: 12.0, 1: 3.0, 3: -math.inf})
    assert result.output.groupby("_kg").window_end.max().to_dict() == {0: 10.0}
    assert (result.output.window_end <= 12.0).all()
    # Key group 1's windows appear as soon as its own watermark moves, without new records.
    later = op.process(spark, df.iloc[:0], result.states, {1: 10.0})
    assert set(later.output._kg) == {1} and later.output.window_end.max() == 10.0


def test_running_aggregate_emits_totals_so_far(spark, make_spec):
    spec = make_spec(
        {"name": "src", "kind": "source", "source": {"generator": "sequence"}},
        {
            "name": "agg",
            "kind": "aggregate",
            "inputs": ["src"],
            "keyBy": ["key"],
            "aggregations": ["sum(value) AS total", "count(*) AS n"],
        },
    )
    op = build_operator(spec.operator("agg"), spec)
    df = records(seed=7)
    chunks = np.array_split(np.arange(len(df)), 3)
    states: dict = {}
    for c, idx in enumerate(chunks):
        batch = df.iloc[idx]
        result = op.process(spark, batch, {kg: states[kg] for kg in states}, {})
        states.update(result.states)
        seen = df.iloc[np.concatenate(chunks[: c + 1])]
        expected = (
            seen[seen.key.isin(batch.key)]
            .groupby("key")
            .agg(total=("value", "sum"), n=("value", "size"), _ts=("_ts", "max"))
            .reset_index()
        )
        got = result.output.sort_values("key").reset_index(drop=True)
        pd.testing.assert_frame_equal(got[["key", "total", "n", "_ts"]], expected, check_dtype=False)
        assert (got._kg == got.key.map(KG_OF_KEY)).all()


def test_state_bytes_round_trip(make_spec, spark):
    op = aggregate_op(make_spec, 6.0, 2.0, True)
    state = op.process(spark, records(), {}, {kg: 9.0 for kg in ALL_KGS}).states[1]
    back = op.decode_state(op.encode_state(state))
    assert back["wm"] == state["wm"]
    pd.testing.assert_frame_equal(back["rows"], state["rows"])


def test_combine_rule_and_pane_size():
    """HCF of durations and C-MR's rule t(w - s) > w / HCF(w, s), checked against the written-out costs."""
    assert hcf(60, 15) == 15 and hcf(5, 1.5) == 0.5 and hcf(0.3, 0.2) == pytest.approx(0.1)
    for w, s, t in [(60, 15, 0.1), (60, 15, 1.0), (300, 60, 0.01), (10, 10, 100), (5, 1.5, 0.5)]:
        k = float(hcf(w, s))
        no_combine, combine = w * t, s * t + w / k  # thesis 3.8.2: average work per window
        assert combine_pays(w, s, t) == (combine < no_combine)
    win = Windowing(size=5.0, slide=1.5, pane=0.5, a=3, b=10)
    rows, n = win.windows_of_panes(np.array([0, 7, 9]))
    for p, window in zip(np.array([0, 7, 9])[rows], n):  # pane p in window n iff n*a <= p < n*a + b
        assert window * 3 <= p < window * 3 + 10


def test_bad_aggregations_name_the_field(make_spec):
    for aggs, message in [
        (["median(x) AS m"], "not decomposable"),
        (["sum(x)"], r"fn\(expression\) AS alias"),
        (["sum(x) AS a", "max(y) AS a"], "used twice"),
    ]:
        with pytest.raises(OperatorError, match=message) as info:
            aggregate_op(make_spec, 5.0, None, None, aggs)
        assert info.value.field == "aggregations" and "agg" in str(info.value)


@pytest.mark.parametrize(
    "rate,keys,size,slide", [(10000, 8, 60, 10), (1, None, 6, 2), (5000, 400, 10, 1), (500, 4, 5, 5)]
)
def test_operator_applies_the_cost_rule_to_the_specs_rates(make_spec, rate, keys, size, slide):
    spec = make_spec(
        {
            "name": "src",
            "kind": "source",
            "source": {"generator": "sequence", "ratePerSecond": rate, "keys": keys},
        },
        {
            "name": "agg",
            "kind": "aggregate",
            "inputs": ["src"],
            "keyBy": ["key"],
            "window": {"size": size, "slide": slide},
            "aggregations": ["count(*) AS n"],
        },
        key_groups=4,
    )
    per_key = rate / 4 / max(1.0, (keys or 4) / 4)  # t: records per second per key of one key group
    hcf_ws = math.gcd(size, slide)
    expected = per_key * (size - slide) > size / hcf_ws
    assert build_operator(spec.operator("agg"), spec).combine == expected


@pytest.mark.parametrize("combine", [True, False], ids=["panes", "per-window"])
def test_lazy_input_equals_reference_and_counts_per_producing_unit(spark, make_spec, windows_of, combine):
    """Records arriving as a Spark frame with ``__src`` (the producing unit): same windows as the pandas
    reference, and the input counted per (producing unit, key group) in the same job."""
    from streamtopo.runtime.operators.records import SRC, to_spark

    df = records()
    src = (np.arange(len(df)) % 3).astype(np.int64)
    op = aggregate_op(make_spec, 6.0, 2.0, combine)
    result = op.process(spark, to_spark(spark, df.assign(**{SRC: src})), {}, {kg: math.inf for kg in ALL_KGS})
    pd.testing.assert_frame_equal(
        canonical(result.output), reference(df, 6.0, 2.0, windows_of), check_dtype=False
    )
    expected = df.assign(s=src).groupby(["s", "_kg"]).size()
    assert result.input_counts == {(int(s), int(kg)): int(n) for (s, kg), n in expected.items()}


@pytest.mark.parametrize("combine", [True, False], ids=["panes", "per-window"])
@pytest.mark.parametrize("size,slide", [(6.0, 2.0), (5.0, None)])
def test_partials_combined_upstream_equal_the_records(spark, make_spec, windows_of, size, slide, combine):
    """Map-side combine: partials a producer computed per (producing unit, key group), shipped through
    Arrow IPC and merged in two calls with records of another input, give the reference's windows; each
    pair's ``__n`` sums to the records it stands for."""
    from streamtopo.runtime.operators.records import COUNT, SRC, to_spark
    from streamtopo.runtime.operators.state import frame_to_ipc, ipc_to_frame

    df = records(seed=4)
    src = (np.arange(len(df)) % 3).astype(np.int64)
    op = aggregate_op(make_spec, size, slide, combine)
    shipped, direct = df.iloc[: len(df) // 2 + 7], df.iloc[len(df) // 2 + 7 :]
    partials = op.partials(to_spark(spark, shipped.assign(**{SRC: src[: len(shipped)]})))
    sent = shipped.assign(s=src[: len(shipped)]).groupby(["s", "_kg"]).size()
    assert partials.groupby([SRC, "_kg"])[COUNT].sum().to_dict() == {k: int(n) for k, n in sent.items()}
    wire = ipc_to_frame(frame_to_ipc(partials.drop(columns=[SRC])))
    early = {kg: 10.0 for kg in ALL_KGS}
    store: dict[int, object] = {}
    outputs = []
    for batch, extra, watermarks in (
        (direct.iloc[:0], wire, early),
        (direct, None, dict.fromkeys(ALL_KGS, math.inf)),
    ):
        result = op.process(spark, batch, store, watermarks, partials=extra)
        store = {kg: op.decode_state(op.encode_state(s)) for kg, s in result.states.items()}
        outputs.append(result.output)
    out = pd.concat([o for o in outputs if len(o)], ignore_index=True)
    pd.testing.assert_frame_equal(
        canonical(out), reference(df, size, slide or size, windows_of), check_dtype=False
    )
