"""UDFs: module:function, pandas in and out, through Spark; import and record failures."""

from __future__ import annotations

import textwrap

import numpy as np
import pandas as pd
import pytest

from streamtopo.runtime.operators import OperatorError, RecordError, build_operator

pytestmark = pytest.mark.spark

UDFS = textwrap.dedent("""
    import pandas as pd

    def enrich(df):
        out = df[["symbol", "price"]].copy()
        out["band"] = (df["price"] // 10).astype("int64")
        return out

    def per_group_count(df):
        return pd.DataFrame({"rows": [len(df)]})

    def picky(df):
        if (df["price"] < 0).any():
            raise ValueError("negative price")
        return df

    def not_a_frame(df):
        return 42
""")


@pytest.fixture
def udf_module(tmp_path, monkeypatch):
    """A user module outside the repository, importable only through the driver's sys.path."""
    (tmp_path / "user_udfs.py").write_text(UDFS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "user_udfs"


def udf(make_spec, function):
    spec = make_spec(
        {"name": "src", "kind": "source", "source": {"generator": "trades"}},
        {"name": "enrich", "kind": "udf", "inputs": ["src"], "function": function},
    )
    return build_operator(spec.operator("enrich"), spec)


def batch(n: int = 30) -> pd.DataFrame:
    rng = np.random.default_rng(1)
    return pd.DataFrame(
        {
            "symbol": rng.choice(["AAPL", "IBM"], size=n),
            "price": np.round(rng.uniform(1, 99, size=n), 2),
            "_ts": np.arange(n, dtype=float),
            "_kg": rng.integers(0, 3, size=n).astype(np.int32),
        }
    )


def test_udf_output_equals_calling_the_function_per_key_group(spark, make_spec, udf_module):
    import user_udfs

    df = batch()
    out = udf(make_spec, f"{udf_module}:enrich").process(spark, df, {}, {}).output
    expected = pd.concat(
        [
            user_udfs.enrich(part.reset_index(drop=True)).assign(_kg=kg, _ts=part._ts.max())
            for kg, part in df.groupby("_kg")
        ],
        ignore_index=True,
    )
    sort = ["_kg", "symbol", "price"]
    pd.testing.assert_frame_equal(
        out.sort_values(sort).reset_index(drop=True),
        expected.sort_values(sort).reset_index(drop=True),
        check_dtype=False,
    )


def test_udf_sees_one_key_group_at_a_time(spark, make_spec, udf_module):
    df = batch()
    out = udf(make_spec, f"{udf_module}:per_group_count").process(spark, df, {}, {}).output
    assert dict(zip(out._kg, out.rows)) == df.groupby("_kg").size().to_dict()


def test_udf_that_does_not_import_names_operator_and_path(make_spec, udf_module):
    with pytest.raises(OperatorError, match=r"'enrich'.*no_such_module:fn") as info:
        udf(make_spec, "no_such_module:fn")
    assert info.value.field == "function"
    with pytest.raises(OperatorError, match="has no function 'missing'"):
        udf(make_spec, f"{udf_module}:missing")


def test_udf_raising_reports_the_offending_records(spark, make_spec, udf_module):
    df = batch()
    df.loc[[3, 20], "price"] = -1.0
    with pytest.raises(RecordError, match="negative price") as info:
        udf(make_spec, f"{udf_module}:picky").process(spark, df, {}, {})
    # picky is called per key group, so the culprits are the records that fail alone: exactly 3 and 20.
    assert sorted(info.value.rows.index) == [3, 20]


def test_udf_returning_a_non_frame_is_an_operator_error(spark, make_spec, udf_module):
    with pytest.raises(OperatorError, match="expected a pandas DataFrame") as info:
        udf(make_spec, f"{udf_module}:not_a_frame").process(spark, batch(), {}, {})
    assert not isinstance(info.value, RecordError)
