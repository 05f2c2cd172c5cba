"""Map and filter against pandas, reserved columns, and how bad expressions and bad records fail."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from streamtopo.runtime.operators import OperatorError, RecordError, build_operator
from streamtopo.runtime.operators.records import canonical

pytestmark = pytest.mark.spark


def trades(n: int = 50) -> pd.DataFrame:
    """Records as the executor holds them: user columns Arrow-backed (records.py)."""
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(
        {
            "symbol": rng.choice(["AAPL", "IBM", "MSFT"], size=n),
            "price": np.round(rng.uniform(-5, 100, size=n), 2),
            "volume": rng.integers(0, 20, size=n),
            "_ts": np.arange(n) / 10.0,
            "_kg": rng.integers(0, 4, size=n).astype(np.int32),
        }
    )
    return canonical(frame)


def operator(make_spec, **fields):
    spec = make_spec(
        {"name": "src", "kind": "source", "source": {"generator": "trades"}},
        {"name": "op", "inputs": ["src"], **fields},
    )
    return build_operator(spec.operator("op"), spec)


def test_filter_equals_pandas(spark, make_spec):
    df = trades()
    out = (
        operator(make_spec, kind="filter", expr="price > 0 AND volume > 0").process(spark, df, {}, {}).output
    )
    expected = df[(df.price > 0) & (df.volume > 0)].reset_index(drop=True)
    pd.testing.assert_frame_equal(out, expected)


def test_map_equals_pandas_and_keeps_reserved_columns(spark, make_spec):
    df = trades()
    op = operator(
        make_spec, kind="map", select=["symbol", "price * volume AS notional", "upper(symbol) AS s"]
    )
    out = op.process(spark, df, {}, {}).output
    expected = pd.DataFrame(
        {
            "symbol": df.symbol,
            "notional": df.price * df.volume,
            "s": df.symbol.str.upper(),
            "_kg": df._kg,
            "_ts": df._ts,
        }
    )
    pd.testing.assert_frame_equal(out, expected, check_like=True)


def test_map_may_redefine_event_time(spark, make_spec):
    df = trades()
    out = operator(make_spec, kind="map", select=["*", "_ts + 60 AS _ts"]).process(spark, df, {}, {}).output
    assert list(out.columns).count("_ts") == 1
    np.testing.assert_allclose(out._ts, df._ts + 60)
    op = operator(make_spec, kind="map", select=["symbol", "_ts + 60 AS _ts"])
    np.testing.assert_allclose(op.process(spark, df, {}, {}).output._ts, df._ts + 60)


def test_unknown_column_is_an_operator_error(spark, make_spec):
    with pytest.raises(OperatorError) as info:
        operator(make_spec, kind="filter", expr="nope > 1").process(spark, trades(), {}, {})
    assert not isinstance(info.value, RecordError)
    assert info.value.field == "expr" and "nope" in str(info.value)


def test_records_that_fail_are_isolated(spark, make_spec):
    """ANSI arithmetic: division by zero fails only on the records with volume = 3; exactly those are
    reported, so the executor can dead-letter them and re-run the rest."""
    df = trades(40)
    volume = df.volume.to_numpy(dtype=np.int64).copy()
    volume[volume == 3] = 4
    volume[[5, 17, 18]] = 3
    df["volume"] = volume
    op = operator(make_spec, kind="map", select=["symbol", "price / (volume - 3) AS x"])
    with pytest.raises(RecordError) as info:
        op.process(spark, df, {}, {})
    assert sorted(info.value.rows.index) == [5, 17, 18]
    assert info.value.operator == "op" and "DIVIDE_BY_ZERO" in info.value.error
    rest = op.process(spark, df.drop(index=info.value.rows.index), {}, {}).output
    assert len(rest) == len(df) - 3


def test_records_holding_a_date_python_lacks_are_isolated_too(spark, make_spec):
    """Spark's dates run past Python's (``date_add(DATE'9999-12-31', 1)``): the bisection that finds the
    failing records keeps them as Arrow and never reads one as a Python date."""
    past = (dt.date(9999, 12, 31) - dt.date(1970, 1, 1)).days + 1
    df = trades(8).assign(
        day=pd.array(pa.array([past] * 8, pa.int32()).cast(pa.date32()), pd.ArrowDtype(pa.date32()))
    )
    volume = np.full(8, 4)
    volume[[0, 6]] = 3
    df["volume"] = pd.array(volume, pd.ArrowDtype(pa.int64()))
    op = operator(make_spec, kind="map", select=["day", "price / (volume - 3) AS x"])
    with pytest.raises(RecordError) as info:
        op.process(spark, df, {}, {})
    assert sorted(info.value.rows.index) == [0, 6]
    assert info.value.rows["day"].array._pa_array.cast(pa.int32()).to_pylist() == [past, past]


def test_union_of_inputs_drops_the_input_marker(spark, make_spec):
    """A non-join operator with several inputs sees their union; `_input` is the join's business only."""
    df = trades(10).assign(_input=["a", "b"] * 5)
    out = operator(make_spec, kind="filter", expr="volume >= 0").process(spark, df, {}, {}).output
    pd.testing.assert_frame_equal(out, df.drop(columns=["_input"]))
    assert out.volume.dtype == pd.ArrowDtype(pa.int64())


def test_lazy_input_gives_the_same_records_lazily(spark, make_spec):
    """A Spark frame in (records the executor kept in the JVM): the output stays lazy and, once
    computed, equals the pandas path's."""
    from pyspark.sql import DataFrame as SparkFrame

    from streamtopo.runtime.operators.records import to_spark

    df = trades()
    for fields in (
        {"kind": "filter", "expr": "price > 0 AND volume > 0"},
        {"kind": "map", "select": ["symbol", "price * volume AS notional"]},
    ):
        op = operator(make_spec, **fields)
        lazy = op.process(spark, to_spark(spark, df), {}, {}).output
        assert isinstance(lazy, SparkFrame)
        eager = op.process(spark, df, {}, {}).output
        pd.testing.assert_frame_equal(lazy.toPandas()[list(eager.columns)], eager, check_dtype=False)


def test_lazy_input_with_a_bad_expression_fails_at_once_naming_the_field(spark, make_spec):
    from streamtopo.runtime.operators.records import to_spark

    with pytest.raises(OperatorError) as info:
        operator(make_spec, kind="filter", expr="nope > 1").process(spark, to_spark(spark, trades()), {}, {})
    assert info.value.field == "expr" and "nope" in str(info.value)
