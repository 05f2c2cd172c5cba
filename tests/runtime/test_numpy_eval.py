"""Filters, projections and partial aggregates evaluated with numpy give what Spark gives on the same
batch: same rows, same values (NaN a value, null not), same Spark types; what numpy must not do
(unsupported functions, ANSI errors) goes to Spark."""

from __future__ import annotations

from decimal import Decimal

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from semantics_support import same_rows

from streamtopo.planner.model import WindowSpec
from streamtopo.runtime.operators.aggregate import bucket_partials, numpy_partials
from streamtopo.runtime.operators.aggregations import parse_aggregations
from streamtopo.runtime.operators.numpy_eval import Evaluator
from streamtopo.runtime.operators.records import column, from_arrow, to_pandas, to_spark
from streamtopo.runtime.operators.windows import Windowing

pytestmark = pytest.mark.spark


def batch(n: int = 400, seed: int = 3) -> pd.DataFrame:
    """Records as the executor holds them (Arrow-backed, records.py): NaN is a value, null is not."""
    rng = np.random.default_rng(seed)

    def nullable(values: np.ndarray, kind: pa.DataType, share: float = 0.15) -> pa.Array:
        return pa.array(values, type=kind, mask=rng.random(n) < share, from_pandas=False)

    price = rng.choice([-1.0, 0.0, -0.0, 0.5, 2.0, 7.25, np.nan, np.inf], size=n)
    return from_arrow(
        pa.table(
            {
                "_kg": pa.array(rng.integers(0, 16, size=n), pa.int32()),
                "_ts": rng.uniform(0, 100, size=n),
                "symbol": nullable(
                    rng.choice(np.array(["AAPL", "IBM", "ÄBC", ""], dtype=object), size=n), pa.string()
                ),
                "price": nullable(price, pa.float64()),
                "bid": nullable(rng.choice([0.5, 1.0, 2.0, np.nan], size=n), pa.float64()),
                "volume": pa.array(rng.integers(-5, 1000, size=n), pa.int64()),
                "small": pa.array(rng.integers(-3, 3, size=n), pa.int32()),
                "flag": pa.array(rng.choice([True, False], size=n)),
                "unsure": nullable(rng.choice([True, False], size=n), pa.bool_(), 0.3),
                "maybe": nullable(rng.choice([1, 2, 2**53 + 1], size=n), pa.int64(), 0.3),
                "amount": nullable(
                    np.array([Decimal(int(v)).scaleb(-2) for v in rng.integers(-(10**6), 10**6, size=n)]),
                    pa.decimal128(12, 2),
                ),
            }
        )
    )


FILTERS = [
    "price > 0 AND volume > 0 AND symbol IS NOT NULL",
    "price = price AND bid <=> bid",
    "amount IS NULL OR maybe > 2",
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
        "amount",
        "maybe + 0 AS same",
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
    out = Evaluator(lambda f: f.filter(expr), "op", "expr")(spark, frame)
    assert out is not None, "the expression should be evaluated without Spark"
    assert same_rows(out, spark_filter(spark, frame, expr), ordered=True)


@pytest.mark.parametrize("exprs", SELECTS)
def test_a_projection_computes_what_spark_computes(spark, exprs):
    frame = batch()
    out = Evaluator(lambda f: f.selectExpr(*exprs), "op", "expr")(spark, frame)
    assert out is not None, "the projection should be evaluated without Spark"
    assert same_rows(out, spark_select(spark, frame, exprs), ordered=True)


def test_columns_a_filter_passes_on_come_out_in_spark_s_types(spark):
    """A filter passes its columns on unchanged: one already of Spark's type is the batch's own, one that is
    not (a ``large_string``, as a UDF may return) is rebuilt, so both come out as Spark's would."""
    frame = batch().assign(wide=lambda f: f["symbol"].astype(pd.ArrowDtype(pa.large_string())))
    out = Evaluator(lambda f: f.filter("volume > 10"), "op", "expr")(spark, frame)
    expected = spark_filter(spark, frame, "volume > 10")
    assert out is not None and same_rows(out, expected, ordered=True)
    assert out.dtypes.astype(str).to_dict() == expected.dtypes.astype(str).to_dict()
    assert str(out["wide"].dtype) == "string[pyarrow]"


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
    assert Evaluator(build, "op", "expr")(spark, batch()) is None


def test_each_schema_is_resolved_once(spark):
    evaluate = Evaluator(lambda f: f.filter("volume > 10"), "op", "expr")
    frame = batch()
    evaluate(spark, frame)
    evaluate(spark, frame.iloc[:10])
    evaluate(spark, frame.assign(volume=column(np.arange(len(frame), dtype=np.float64), None, pa.float64())))
    assert len(evaluate.plans) == 2


@pytest.mark.parametrize(
    "window,panes",
    [(None, False), ((6.0, 2.0), False), ((6.0, 2.0), True), ((4.0, 4.0), False), ((4.0, 4.0), True)],
)
@pytest.mark.parametrize("combining", [False, True], ids=["own", "for-another-executor"])
def test_partials_in_numpy_are_the_partials_spark_computes(spark, window, panes, combining):
    """Every decomposable aggregation over numbers, NaN, nulls, a bigint above 2**53 and decimals, keys
    with nulls and signed zeros; combining for another executor, also per producing unit and with the
    records each row stands for. Same rows, same values, same types."""
    frame = batch()
    if combining:
        frame["__src"] = (frame["_kg"].to_numpy() + 1) % 3
    frame["zero"] = column(
        np.where(frame.volume.to_numpy(dtype=np.int64) % 2 == 0, 0.0, -0.0), None, pa.float64()
    )
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
            "max(price) AS highest",
            "sum(amount) AS total",
            "avg(amount) AS mean_amount",
            "max(symbol) AS last",
        ]
    )
    keys = ["symbol", "zero"]
    w = None if window is None else Windowing.of(WindowSpec(size=window[0], slide=window[1]))
    carried = ["_kg", "_ts", *keys, *(["__src"] if combining else [])]
    evaluate = Evaluator(
        lambda f: f.selectExpr(*carried, *[f"{a.arg} AS __v{a.index}" for a in aggs]), "op", "expr"
    )
    arguments = evaluate(spark, frame)
    assert arguments is not None
    ours = numpy_partials(arguments, keys, w, panes, aggs)
    theirs = to_pandas(bucket_partials(to_spark(spark, frame), keys, w, panes, aggs))
    assert same_rows(ours[theirs.columns], theirs)
