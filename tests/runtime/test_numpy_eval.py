"""Filters and projections evaluated with numpy give what Spark gives on the same pandas batch: same rows,
same values, same dtypes; what numpy must not do (unsupported functions, ANSI errors) goes to Spark."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from streamtopo.planner.model import WindowSpec
from streamtopo.runtime.operators.aggregate import bucket_partials, numpy_partials
from streamtopo.runtime.operators.aggregations import parse_aggregations
from streamtopo.runtime.operators.base import to_pandas, to_spark
from streamtopo.runtime.operators.numpy_eval import Evaluator
from streamtopo.runtime.operators.windows import Windowing

pytestmark = pytest.mark.spark


def batch(n: int = 400, seed: int = 3) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    price = rng.choice([-1.0, 0.0, -0.0, 0.5, 2.0, 7.25, np.nan, np.inf], size=n)
    return pd.DataFrame(
        {
            "_kg": rng.integers(0, 16, size=n).astype("int32"),
            "_ts": rng.uniform(0, 100, size=n),
            "symbol": rng.choice(np.array(["AAPL", "IBM", "ÄBC", "", None], dtype=object), size=n),
            "price": price,
            "bid": rng.choice([0.5, 1.0, 2.0, np.nan], size=n),
            "volume": rng.integers(-5, 1000, size=n).astype("int64"),
            "small": rng.integers(-3, 3, size=n).astype("int32"),
            "flag": rng.choice([True, False], size=n),
            "unsure": rng.choice(np.array([True, False, None], dtype=object), size=n),
            "maybe": pd.array(rng.choice([1, 2, None], size=n), dtype="Int64"),
        }
    )


FILTERS = [
    "price > 0 AND volume > 0 AND symbol IS NOT NULL",
    "price >= bid OR volume < 10",
    "NOT (price < bid)",
    "symbol = 'IBM' OR symbol > 'B'",
    "small * 3 + volume > 100",
    "price * volume < 0.05 * bid",
    "flag AND maybe IS NULL",
    "price = price",
    "maybe + 1 = 3 OR price IS NULL",
    "-price < 1 AND volume - small <= 500",
    "volume % 3 = 0 OR small % 2 = -1",
    "unsure OR NOT unsure AND flag",
]
SELECTS = [
    ["symbol", "price", "volume", "price * volume AS pv"],
    ["*", "price * 2 AS price"],
    ["bid - price AS spread", "volume / 4 AS quarter", "small + small AS twice", "volume * small AS vs"],
    [
        "price > bid AS above",
        "symbol IS NULL AS unnamed",
        "maybe * 2 AS m2",
        "flag OR price > 1 AS any",
        "unsure AND price > 1 AS both",
    ],
    [
        "volume % 7 AS r",
        "pmod(small, 4) AS p",
        "pmod(volume, -3) AS neg",
        "price % 2.5D AS pr",
        "pmod(price, 0.75D) AS pp",
    ],
]


def spark_filter(spark, frame: pd.DataFrame, expr: str) -> pd.DataFrame:
    return to_pandas(to_spark(spark, frame).filter(expr))


def spark_select(spark, frame: pd.DataFrame, exprs: list[str]) -> pd.DataFrame:
    return to_pandas(to_spark(spark, frame).selectExpr(*exprs))


@pytest.mark.parametrize("expr", FILTERS)
def test_a_filter_keeps_the_rows_spark_keeps(spark, expr):
    frame = batch()
    out = Evaluator(lambda f: f.filter(expr))(spark, frame)
    assert out is not None, "the expression should be evaluated without Spark"
    pd.testing.assert_frame_equal(out, spark_filter(spark, frame, expr))


@pytest.mark.parametrize("exprs", SELECTS)
def test_a_projection_computes_what_spark_computes(spark, exprs):
    frame = batch()
    out = Evaluator(lambda f: f.selectExpr(*exprs))(spark, frame)
    assert out is not None, "the projection should be evaluated without Spark"
    pd.testing.assert_frame_equal(out, spark_select(spark, frame, exprs))


@pytest.mark.parametrize(
    "build",
    [
        lambda f: f.selectExpr("pmod(hash(symbol), 4) AS grp"),  # a function numpy does not have
        lambda f: f.selectExpr("CAST(price AS INT) AS p"),  # a cast ANSI may refuse
        lambda f: f.selectExpr("volume / small AS r"),  # some divisor is 0: ANSI raises, Spark names them
        lambda f: f.selectExpr("volume % small AS r"),
        lambda f: f.selectExpr("volume * 9223372036854775807 AS big"),  # overflows
    ],
)
def test_what_numpy_must_not_evaluate_goes_to_spark(spark, build):
    assert Evaluator(build)(spark, batch()) is None


def test_each_schema_is_resolved_once(spark):
    evaluate = Evaluator(lambda f: f.filter("volume > 10"))
    frame = batch()
    evaluate(spark, frame)
    evaluate(spark, frame.iloc[:10])
    evaluate(spark, frame.astype({"volume": "float64"}))
    assert len(evaluate.plans) == 2


@pytest.mark.filterwarnings("error::FutureWarning")  # NaN where Spark has None fails too
@pytest.mark.parametrize(
    "window,panes",
    [(None, False), ((6.0, 2.0), False), ((6.0, 2.0), True), ((4.0, 4.0), False), ((4.0, 4.0), True)],
)
@pytest.mark.parametrize("combining", [False, True], ids=["own", "for-another-executor"])
def test_partials_in_numpy_are_the_partials_spark_computes(spark, window, panes, combining):
    """Every decomposable aggregation over numbers, nulls, and keys with nulls and signed zeros; combining
    for another executor, also per producing unit and with the records each row stands for."""
    frame = batch()
    if combining:
        frame["__src"] = (frame["_kg"] + 1) % 3
    frame["zero"] = np.where(frame.volume % 2 == 0, 0.0, -0.0)
    aggs = parse_aggregations(
        [
            "sum(price * volume) AS pv",
            "sum(volume) AS v",
            "count(*) AS n",
            "count(bid) AS bids",
            "avg(small) AS mean",
            "min(small) AS lo",
            "max(maybe) AS hi",
            "min(bid) AS lowest",
        ]
    )
    keys = ["symbol", "zero"]
    w = None if window is None else Windowing.of(WindowSpec(size=window[0], slide=window[1]))
    carried = ["_kg", "_ts", *keys, *(["__src"] if combining else [])]
    evaluate = Evaluator(lambda f: f.selectExpr(*carried, *[f"{a.arg} AS __v{a.index}" for a in aggs]))
    typed = evaluate.typed(spark, frame)
    assert typed is not None
    ours = numpy_partials(*typed, keys, w, panes, aggs)
    theirs = to_pandas(bucket_partials(to_spark(spark, frame), keys, w, panes, aggs))
    order = [c for c in theirs.columns if c in ("_kg", "symbol", "zero", "__bucket", "__src")]

    def canon(df):
        return df[theirs.columns].sort_values(order, na_position="first").reset_index(drop=True)

    pd.testing.assert_frame_equal(canon(ours), canon(theirs))
