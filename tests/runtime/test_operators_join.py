"""Windowed equi-join against a nested-loop reference written out in plain Python."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from streamtopo.runtime.operators import build_operator, combine_inputs

pytestmark = pytest.mark.spark

KG_OF = {"AAPL": 0, "IBM": 1, "MSFT": 1, "ORCL": 2}


def side(n: int, seed: int, extra: str) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    symbols = rng.choice(list(KG_OF), size=n)
    return pd.DataFrame(
        {
            "symbol": symbols,
            "price": np.round(rng.uniform(10, 20, size=n), 2),
            extra: rng.integers(1, 100, size=n),
            "_ts": rng.integers(0, 80, size=n) / 4.0,
            "_kg": np.array([KG_OF[s] for s in symbols], dtype=np.int32),
        }
    )


def join_op(make_spec, size, slide):
    spec = make_spec(
        {"name": "trades", "kind": "source", "source": {"generator": "trades"}},
        {"name": "quotes", "kind": "source", "source": {"generator": "quotes"}},
        {
            "name": "j",
            "kind": "join",
            "inputs": ["trades", "quotes"],
            "keyBy": ["symbol"],
            "window": {"size": size, "slide": slide},
        },
    )
    return build_operator(spec.operator("j"), spec)


def reference(left, right, size, slide, windows_of) -> pd.DataFrame:
    rows = []
    for lrow in left.to_dict("records"):
        for r in right.to_dict("records"):
            if lrow["symbol"] != r["symbol"]:
                continue
            for start in set(windows_of(lrow["_ts"], size, slide)) & set(windows_of(r["_ts"], size, slide)):
                rows.append(
                    {
                        "window_start": start,
                        "window_end": start + size,
                        "symbol": lrow["symbol"],
                        "trades_price": lrow["price"],
                        "volume": lrow["volume"],
                        "quotes_price": r["price"],
                        "bid_size": r["bid_size"],
                        "_ts": start + size,
                        "_kg": lrow["_kg"],
                    }
                )
    return canonical(pd.DataFrame(rows))


def canonical(df: pd.DataFrame) -> pd.DataFrame:
    cols = [
        "window_start",
        "window_end",
        "symbol",
        "trades_price",
        "volume",
        "quotes_price",
        "bid_size",
        "_ts",
        "_kg",
    ]
    return df[cols].astype({"_kg": "int32"}).sort_values(cols).reset_index(drop=True)


@pytest.mark.parametrize("size,slide", [(5.0, 5.0), (6.0, 2.0)])
def test_join_in_one_call_equals_reference(spark, make_spec, windows_of, size, slide):
    left, right = side(40, 1, "volume"), side(40, 2, "bid_size")
    op = join_op(make_spec, size, slide)
    batch = combine_inputs({"trades": left, "quotes": right})
    out = op.process(spark, batch, {}, {kg: math.inf for kg in range(4)}).output
    assert list(out.columns[:3]) == ["window_start", "window_end", "symbol"]
    assert out.volume.dtype == pd.ArrowDtype(pa.int64())  # integer columns survive the two-input batch
    pd.testing.assert_frame_equal(
        canonical(out), reference(left, right, size, slide, windows_of), check_dtype=False
    )


def test_join_across_calls_watermarks_and_state_bytes(spark, make_spec, windows_of):
    """Each input arrives in its own calls, out of order within 5 s epochs, states stored as bytes."""
    left, right = side(60, 3, "volume"), side(60, 4, "bid_size")
    op = join_op(make_spec, 6.0, 2.0)
    store: dict[int, bytes] = {}
    outputs = []
    epochs = list(np.arange(0, 20, 5.0)) + [math.inf]
    for lo, hi in itertools.pairwise(epochs):
        for name, frame in (("trades", left), ("quotes", right)):
            part = frame[(frame._ts >= lo) & (frame._ts < hi)].sample(frac=1.0, random_state=7)
            batch = combine_inputs({name: part})
            kgs = range(4)
            states = {kg: op.decode_state(store[kg]) for kg in kgs if kg in store}
            # The watermark moves only once both inputs have passed the epoch.
            result = op.process(spark, batch, states, {kg: hi if name == "quotes" else lo for kg in kgs})
            store.update({kg: op.encode_state(s) for kg, s in result.states.items()})
            outputs.append(result.output)
    out = pd.concat([o for o in outputs if len(o)], ignore_index=True)
    pd.testing.assert_frame_equal(
        canonical(out), reference(left, right, 6.0, 2.0, windows_of), check_dtype=False
    )
    assert all(
        len(op.decode_state(b)["trades"]) == 0 for b in store.values()
    )  # all windows fired: state drained


def test_join_keys_compare_as_spark_equi_join_does(spark, make_spec):
    """Null keys match nothing (pandas' merge would pair them), -0.0 equals 0.0, and the layout is the
    Spark plan's that the fail-fast analysis resolves (output_frame): same columns, same order."""
    op = join_op(make_spec, 5.0, 5.0)
    op.keys = ["k"]
    left = pd.DataFrame({"k": [0.0, None, 1.5, 2.0], "price": [1.0, 2.0, 3.0, 4.0], "_ts": 1.0, "_kg": 0})
    right = pd.DataFrame({"k": [-0.0, None, 1.5, 3.0], "price": [5.0, 6.0, 7.0, 8.0], "_ts": 2.0, "_kg": 0})
    left, right = (f.astype({"_kg": "int32"}) for f in (left, right))
    batch = combine_inputs({"trades": left, "quotes": right})
    out = op.process(spark, batch, {}, {0: math.inf}).output
    assert sorted(zip(out.trades_price, out.quotes_price)) == [(1.0, 5.0), (3.0, 7.0)]
    planned = op.output_frame(spark.createDataFrame(left), spark.createDataFrame(right))
    assert list(out.columns) == planned.columns


def test_a_join_emits_large_windows_over_several_steps_holding_its_watermark(spark, make_spec, windows_of):
    """With a step's pairs capped, the windows that fire are emitted over several steps (state stored as
    bytes in between, no new input): every pair exactly once, no step over the cap by more than one left
    record's pairs, and the output's watermark held at the earliest pending window's end, so no record
    comes after a watermark that passed it."""
    left, right = side(60, 5, "volume"), side(60, 6, "bid_size")
    op = join_op(make_spec, 6.0, 2.0)
    op.max_step_pairs = 25
    batch = combine_inputs({"trades": left, "quotes": right})
    kgs = range(4)
    result = op.process(spark, batch, {}, {kg: math.inf for kg in kgs})
    outputs, steps, sent = [result.output], 1, dict.fromkeys(kgs, -math.inf)
    per_record = (
        canonical(reference(left, right, 6.0, 2.0, windows_of))
        .groupby(["window_start", "symbol", "trades_price", "volume"])
        .size()
        .max()
    )
    while any(op.has_pending(state) for state in result.states.values()):
        assert len(result.output) <= op.max_step_pairs + per_record
        for kg, state in result.states.items():
            held = op.output_watermark(state, math.inf)
            assert (held < math.inf) == op.has_pending(state)
            sent[kg] = max(sent[kg], held)
        states = {kg: op.decode_state(op.encode_state(s)) for kg, s in result.states.items()}
        result = op.process(
            spark, combine_inputs({"trades": left.iloc[:0]}), states, dict.fromkeys(kgs, math.inf)
        )
        for kg in kgs:  # nothing emitted now is older than a watermark already sent
            assert (result.output.loc[result.output._kg == kg, "_ts"] >= sent[kg]).all()
        outputs.append(result.output)
        steps += 1
    assert steps > 3
    out = pd.concat([o for o in outputs if len(o)], ignore_index=True)
    pd.testing.assert_frame_equal(
        canonical(out), reference(left, right, 6.0, 2.0, windows_of), check_dtype=False
    )


def test_join_edge_keys_emitted_one_pair_per_step_match_spark(spark, make_spec):
    """The capped path (pairs counted per key before they are built, the rest kept as pending state)
    pairs keys as Spark's equi-join does: -0.0 meets 0.0, NaN meets NaN (a None in a float column is NaN
    to pandas and to Spark's createDataFrame alike; null keys are the test above's), repeated keys pair
    every way; one pair per step over several steps, state stored as bytes between."""
    op = join_op(make_spec, 5.0, 5.0)
    op.keys = ["k"]
    left = pd.DataFrame(
        {"k": [0.0, None, 1.5, float("nan"), 2.0, 7.0, 7.0], "price": np.arange(7.0), "_ts": 1.0, "_kg": 0}
    )
    right = pd.DataFrame(
        {
            "k": [-0.0, None, 1.5, float("nan"), 3.0, 7.0, 7.0],
            "price": np.arange(10.0, 17.0),
            "_ts": 2.0,
            "_kg": 0,
        }
    )
    left, right = (f.astype({"_kg": "int32"}) for f in (left, right))
    batch = combine_inputs({"trades": left, "quotes": right})
    op.max_step_pairs = 1
    result = op.process(spark, batch, {}, {0: math.inf})
    outputs, steps = [result.output], 1
    while op.has_pending(result.states[0]):
        state = op.decode_state(op.encode_state(result.states[0]))
        result = op.process(spark, combine_inputs({"trades": left.iloc[:0]}), {0: state}, {0: math.inf})
        outputs.append(result.output)
        steps += 1
        assert steps < 20, "pending pairs never drained"
    pairs = sorted(zip(*(pd.concat(outputs)[c] for c in ("trades_price", "quotes_price"))))
    l_, r_ = (spark.createDataFrame(f[["k", "price"]]) for f in (left, right))
    expected = l_.withColumnRenamed("price", "lp").join(r_.withColumnRenamed("price", "rp"), "k")
    assert pairs == sorted((row.lp, row.rp) for row in expected.collect())
    assert steps >= 4 and len(pairs) >= 6  # NaN, -0.0 and the doubled 7.0 all paired
