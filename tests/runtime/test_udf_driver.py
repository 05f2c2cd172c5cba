"""A udf operator runs its function on a driver batch in the driver; Spark's ``mapInPandas`` over the same
batch is the oracle. Every type a record carries, nulls and NaN, results whose types differ from the
sample's, and a batch larger than one Arrow chunk come out identical, types included."""

from __future__ import annotations

import datetime as dt
import importlib
import textwrap
from collections.abc import Iterator
from decimal import Decimal

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from pyspark import cloudpickle

from streamtopo.runtime.operators import RecordError, build_operator
from streamtopo.runtime.operators.records import from_arrow, to_arrow, to_pandas, to_spark
from streamtopo.runtime.operators.udf import SAMPLE_ROWS

pytestmark = pytest.mark.spark

FUNCTIONS = textwrap.dedent("""
    import datetime as dt
    from decimal import Decimal

    import numpy as np
    import pandas as pd

    def derive(df):
        out = df.copy()
        out["doubled"] = df["n"] * 2
        out["ratio"] = df["x"] / df["n"]
        out["loud"] = df["s"].str.upper()
        out["cents"] = df["d"].map(lambda v: None if v is None else v + Decimal("0.01"))
        out["later"] = df["t"] + pd.Timedelta(seconds=1)
        out["day"] = df["day"]
        out["no"] = ~df["yes"].astype(bool)
        return out

    def halves(df):
        # the sample (first key group) gives integers; other key groups give doubles the int column takes
        kg = int(df["_kg"].iloc[0])
        v = df["n"].fillna(0)
        return pd.DataFrame({"v": v if kg == 0 else v / 2, "_kg": df["_kg"], "_ts": df["_ts"]})

    def chunk_size(df):
        return pd.DataFrame({"rows": [len(df)], "first": [int(df["n"].fillna(-1).iloc[0])]})
""")


@pytest.fixture
def functions(tmp_path, monkeypatch):
    """The module, importable here; the oracle's Python workers get it by value."""
    (tmp_path / "diff_udfs.py").write_text(FUNCTIONS)
    monkeypatch.syspath_prepend(str(tmp_path))
    cloudpickle.register_pickle_by_value(importlib.import_module("diff_udfs"))
    return "diff_udfs"


def records(n: int) -> pd.DataFrame:
    """Typed as they reach an operator (Arrow-backed user columns): nulls in every column, NaN and
    infinities in x, the int64 extremes in n (doubled, they wrap in pandas), the largest decimal(12, 2),
    timestamps before 1970 and near the end of pandas' nanosecond range."""
    rng = np.random.default_rng(7)
    null = rng.random(n) < 0.1
    null[:8] = False
    n_values = rng.integers(-(2**40), 2**40, size=n)
    n_values[:4] = [2**63 - 1, -(2**63), 2**62, -(2**62) - 1]
    x = rng.normal(size=n)
    x[rng.random(n) < 0.05] = np.nan
    x[:3] = [np.inf, -np.inf, -0.0]
    decimals = [Decimal(f"{i}.{i % 100:02d}") for i in range(n)]
    decimals[:2] = [Decimal("9999999999.99"), Decimal("-9999999999.99")]
    times = [dt.datetime(2026, 1, 1) + dt.timedelta(milliseconds=i) for i in range(n)]
    times[:2] = [dt.datetime(1900, 1, 1, 0, 0, 0, 1), dt.datetime(2262, 1, 1, 0, 0, 0, 999999)]
    table = pa.table(
        {
            "n": pa.array(n_values, pa.int64(), mask=null),
            "x": pa.array(x, pa.float64(), mask=rng.random(n) < 0.05),
            "s": pa.array([f"sym{i % 17}" for i in range(n)], pa.string(), mask=null),
            "d": pa.array(decimals, pa.decimal128(12, 2), mask=null),
            "t": pa.array(times, pa.timestamp("us", tz="UTC"), mask=null),
            "day": pa.array([dt.date(2026, 1, 1 + i % 28) for i in range(n)], pa.date32(), mask=null),
            "yes": pa.array(rng.random(n) < 0.5, pa.bool_(), mask=null),
            "_ts": pa.array(np.arange(n, dtype=np.float64) / 1000),
            "_kg": pa.array(rng.integers(0, 3, size=n).astype(np.int32)),
        }
    )
    return from_arrow(table)


def through_spark(spark, op, batch: pd.DataFrame) -> pd.DataFrame:
    """The oracle: the function through Spark's mapInPandas, schema from the sample as the operator
    infers it."""
    sample = op._call(batch[batch["_kg"] == batch["_kg"].iloc[0]].head(SAMPLE_ROWS))
    columns, fn = list(sample.columns), op.fn

    def per_key_group(chunk: pd.DataFrame) -> pd.DataFrame:  # the contract, written plainly
        outputs = []
        for kg, part in chunk.groupby("_kg", sort=True):
            result = fn(part.reset_index(drop=True)).copy()
            if "_kg" not in result.columns:
                result["_kg"] = kg
            if "_ts" not in result.columns:
                result["_ts"] = part["_ts"].max()
            outputs.append(result.astype({"_kg": "int32", "_ts": "float64"}))
        return pd.concat(outputs, ignore_index=True)

    def run(chunks: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for chunk in chunks:
            yield per_key_group(chunk)[columns]

    return to_pandas(to_spark(spark, batch).mapInPandas(run, op.output_schema(sample, batch)))


def operator(make_spec, function: str):
    spec = make_spec(
        {"name": "src", "kind": "source", "source": {"generator": "trades"}},
        {"name": "fn", "kind": "udf", "inputs": ["src"], "function": function},
    )
    return build_operator(spec.operator("fn"), spec)


@pytest.mark.parametrize(
    ("function", "n"), [("derive", 500), ("halves", 500), ("chunk_size", 12_345), ("chunk_size", 25_000)]
)
@pytest.mark.parametrize("layout", ["mixed", "runs"])
def test_the_driver_gives_what_spark_gives(spark, make_spec, functions, function, n, layout):
    """``runs``: the records of each key group together, key groups out of order (2, 0, 1), as a batch of
    several units arrives; ``mixed``: key groups interleaved."""
    op = operator(make_spec, f"{functions}:{function}")
    batch = records(n)
    if layout == "runs":
        batch = pd.concat([batch[batch["_kg"] == kg] for kg in (2, 0, 1)], ignore_index=True)
    driver = op.process(spark, batch, {}, {}).output
    oracle = through_spark(spark, op, batch)
    assert list(driver.columns) == list(oracle.columns)
    assert [str(t) for t in driver.dtypes] == [str(t) for t in oracle.dtypes]
    pd.testing.assert_frame_equal(driver, oracle, check_exact=True)
    if function == "chunk_size":  # one call per key group per chunk of maxRecordsPerBatch records
        calls = {(i // 10_000, kg) for i, kg in enumerate(batch["_kg"])}
        assert int(driver["rows"].sum()) == n and len(driver) == len(calls)


def test_a_timestamp_pandas_cannot_hold_fails_its_record_as_in_spark(spark, make_spec, functions):
    """Year 9999 is beyond a pandas nanosecond timestamp: Spark's worker cannot hand that record to a
    pandas function either. The driver path names exactly that record (it goes to the dead letters)."""
    op = operator(make_spec, f"{functions}:derive")
    batch = records(50)
    table = to_arrow(batch)
    times = table.column("t").to_pylist()
    times[7] = dt.datetime(9999, 12, 31, tzinfo=dt.UTC)
    batch = from_arrow(
        table.set_column(
            table.schema.get_field_index("t"), "t", pa.array(times, table.schema.field("t").type)
        )
    )
    with pytest.raises(Exception, match="out of bounds"):
        through_spark(spark, op, batch.iloc[7:8].reset_index(drop=True))
    with pytest.raises(RecordError, match="out of bounds") as info:
        op.process(spark, batch, {}, {})
    assert list(info.value.rows.index) == [7]
