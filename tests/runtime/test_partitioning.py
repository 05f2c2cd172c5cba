"""Key-group routing: Spark's own hash in numpy, identical to Spark's, type-insensitive for equal keys,
stable across processes, forward when unkeyed."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from streamtopo.runtime.partitioning import key_hash, partition_key, route, route_column

FRAME = pd.DataFrame(
    {"symbol": ["AAPL", "IBM", "MSFT", "AAPL", "ORCL", "ZZZ", "é"] * 3, "venue": list(range(21))}
)
KS = (1, 4, 7, 32)
ALPHABET = list("abcXYZ09 \x00") + ["é", "ü", "ß", "€", "中", "文", "😀", "\u0301"]  # NUL, 1- to 4-byte UTF-8


def random_frame(seed: int, n: int = 200) -> pd.DataFrame:
    """Every supported key type, with the awkward values: -0.0, NaN, None, huge, 0..9-char strings."""
    rng = np.random.default_rng(seed)
    floats = rng.choice([0.0, -0.0, 5.0, np.nan, 1e300, -1e-300, 2.0**63, np.inf, -np.inf], n)
    floats = np.where(rng.random(n) < 0.5, rng.normal(0, 1e6, n), floats)
    strings = ["".join(rng.choice(ALPHABET, rng.integers(0, 10))) for _ in range(n)]
    return pd.DataFrame(
        {
            "i64": rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64) // rng.choice([1, 2**40, 2**62], n),
            "i32": rng.integers(-(2**31), 2**31 - 1, n, dtype=np.int32),
            "f64": floats,
            "f32": np.clip(floats / 7, -3e38, 3e38).astype(np.float32),
            "b": rng.random(n) < 0.5,
            "flag": rng.choice(np.array([True, False, None], dtype=object), n),  # object bools with None
            "text": [None if rng.random() < 0.1 else s for s in strings],
        }
    )


KEYS = [
    ("i64",),
    ("i32",),
    ("f64",),
    ("f32",),
    ("b",),
    ("flag",),
    ("text",),
    ("text", "i64", "f64"),
    ("flag", "text", "i32"),
]


@pytest.mark.parametrize("seed", range(4))
def test_numpy_route_equals_spark_route_column(spark, seed):
    """The heart of it: the same frame, routed by numpy and by Spark, gives every row the same key group
    (and the same hash as Spark's own ``hash()``)."""
    df = random_frame(seed)
    sdf = spark.createDataFrame(df)
    assert dict(sdf.dtypes) == {
        "i64": "bigint",
        "i32": "int",
        "f64": "double",
        "f32": "float",
        "b": "boolean",
        "flag": "boolean",
        "text": "string",
    }
    exprs = [route_column(key, k, 0).alias(f"r{i}_{k}") for i, key in enumerate(KEYS) for k in KS]
    exprs += [F.hash(*[canonical(c) for c in key]).alias(f"h{i}") for i, key in enumerate(KEYS)]
    spark_out = sdf.select(*exprs).toPandas()
    for i, key in enumerate(KEYS):
        assert key_hash(df, key).tolist() == spark_out[f"h{i}"].tolist(), key
        for k in KS:
            assert route(df, key, k, 0).tolist() == spark_out[f"r{i}_{k}"].tolist(), (key, k)


def canonical(column: str):
    """The canonical key column written plainly for a known schema (route_column dispatches on typeof)."""
    if column == "text":
        return F.col(column)
    return F.when(~F.isnan(F.col(column).cast("double")), F.col(column).cast("double"))


def test_nan_and_null_created_inside_spark_route_as_in_pandas(spark):
    """Spark keeps NaN distinct from null; both must route like pandas' NaN/None."""
    sdf = spark.sql(
        "SELECT * FROM VALUES (CAST('NaN' AS DOUBLE), 'a'), (CAST(NULL AS DOUBLE), 'a'), "
        "(-0.0D, NULL), (0.0D, 'b') AS t(x, s)"
    )
    df = pd.DataFrame({"x": [np.nan, None, -0.0, 0.0], "s": ["a", "a", None, "b"]})
    got = [row[0] for row in sdf.select(route_column(("x", "s"), 32, 0)).collect()]
    assert got == route(df, ("x", "s"), 32, 0).tolist()
    assert got[0] == got[1]


def test_int_and_double_keys_meet_in_spark_and_pandas(spark):
    sdf = spark.sql(
        "SELECT 5 AS k UNION ALL SELECT 5.0D UNION ALL SELECT CAST(5 AS BIGINT) "
        "UNION ALL SELECT CAST(5 AS TINYINT)"
    )
    ints = pd.DataFrame({"k": np.array([5], dtype=np.int32)})
    floats = pd.DataFrame({"k": [5.0]})
    spark_groups = {row[0] for row in sdf.select(route_column(("k",), 32, 0)).collect()}
    # UNION ALL widens to one type; also evaluate each literal in its own type.
    each = spark.sql("SELECT 5 AS a, 5.0D AS b, CAST(5 AS BIGINT) AS c, true AS d, 1.0f AS e")
    kinds = each.select(*[route_column((c,), 32, 0) for c in "abcde"]).first()
    ones = pd.DataFrame({"k": [1]})
    assert spark_groups == {route(ints, ("k",), 32, 0)[0]} == {route(floats, ("k",), 32, 0)[0]}
    assert list(kinds[:3]) == [route(floats, ("k",), 32, 0)[0]] * 3
    assert list(kinds[3:]) == [route(ones, ("k",), 32, 0)[0]] * 2


def test_unkeyed_route_forwards_the_producers_key_group(spark):
    assert route(FRAME, None, 4, 6).tolist() == [6 % 4] * len(FRAME)
    sdf = spark.createDataFrame(pd.DataFrame({"_kg": [0, 5, 6, 31]}))
    got = sdf.select(route_column(None, 4, F.col("_kg")), route_column(None, 4, 6)).collect()
    assert [tuple(row) for row in got] == [(0, 2), (1, 2), (2, 2), (3, 2)]


def test_missing_key_column_is_named():
    with pytest.raises(ValueError, match="keyBy.*nope"):
        route(FRAME, ("symbol", "nope"), 4, 0)


@pytest.mark.parametrize(
    "values",
    [
        pd.to_datetime(["2024-01-01", "2024-01-02"]),
        pd.to_timedelta([1, 2], unit="s"),
        [b"ab", b"cd"],
        [pd.Timestamp("2024-01-01").date(), None],
        [1, "a"],
    ],
)
def test_unsupported_key_types_are_refused_by_name(values):
    with pytest.raises(ValueError, match="keyBy: column 'when' has type"):
        route(pd.DataFrame({"when": values}), ("when",), 4, 0)


def test_unsupported_key_types_fail_in_spark_too(spark):
    sdf = spark.sql("SELECT TIMESTAMP'2024-01-01 00:00:00' AS `when`")
    with pytest.raises(Exception, match="keyBy: column 'when' has type timestamp"):
        sdf.select(route_column(("when",), 4, 0)).collect()


def test_route_is_identical_in_a_fresh_process():
    """Another interpreter (different hash seed, fresh imports) puts every key in the same key group."""
    ours = route(FRAME, ("symbol", "venue"), 32, 0).tolist()
    code = (
        "import json, sys, pandas as pd\n"
        "from streamtopo.runtime.partitioning import route\n"
        "df = pd.DataFrame(json.loads(sys.stdin.read()))\n"
        "print(json.dumps(route(df, ('symbol', 'venue'), 32, 0).tolist()))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        input=FRAME.to_json(orient="columns"),
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345"},
    )
    assert json.loads(result.stdout) == ours


def test_equal_keys_meet_whatever_their_pandas_dtype():
    ints = pd.DataFrame({"k": np.array([1, 2, 3, 40], dtype=np.int32)})
    floats = pd.DataFrame({"k": [1.0, 2.0, 3.0, 40.0]})
    nullable = pd.DataFrame({"k": pd.array([1, 2, 3, 40], dtype="Int64")})
    objects = pd.DataFrame({"k": np.array([1, 2.0, 3, 40], dtype=object)})
    assert (
        route(ints, ("k",), 16, 0).tolist()
        == route(floats, ("k",), 16, 0).tolist()
        == route(nullable, ("k",), 16, 0).tolist()
        == route(objects, ("k",), 16, 0).tolist()
    )
    obj = pd.DataFrame({"s": ["a", "b", None]})
    arrow = pd.DataFrame({"s": pd.array(["a", "b", None], dtype="string")})
    category = pd.DataFrame({"s": pd.Categorical(["a", "b", None])})
    assert (
        route(obj, ("s",), 16, 0).tolist()
        == route(arrow, ("s",), 16, 0).tolist()
        == route(category, ("s",), 16, 0).tolist()
    )


@settings(max_examples=30, deadline=None)
@given(keys=st.lists(st.text(max_size=5), min_size=1, max_size=40), k=st.integers(1, 64))
def test_keyed_route_is_a_function_of_the_key(keys, k):
    df = pd.DataFrame({"key": keys, "n": range(len(keys))})
    kg = route(df, ("key",), k, src_kg=7)
    assert ((kg >= 0) & (kg < k)).all()
    # Same key -> same key group, wherever it sits in the batch and whatever batch it is in.
    assert all(len(set(kg[df.key == key])) == 1 for key in set(keys))
    reversed_kg = route(df.iloc[::-1], ("key",), k, src_kg=3)[::-1]
    assert (reversed_kg == kg).all()
    # With a varying seed (second key column) too: the per-(seed, string) dedup must not mix rows up.
    two = route(df, ("n", "key"), k, 0)
    singles = [route(df.iloc[[i]], ("n", "key"), k, 0)[0] for i in range(len(df))]
    assert two.tolist() == singles


@pytest.mark.parametrize("make", [lambda i: i, lambda i: f"user-{i}"], ids=["int", "string"])
def test_keys_spread_over_key_groups(make):
    df = pd.DataFrame({"k": [make(i) for i in range(10_000)]})
    counts = np.bincount(route(df, ("k",), 8, 0), minlength=8)
    assert counts.min() > 0.9 * 1250 and counts.max() < 1.1 * 1250  # binomial sd ~ 33 around 1250


COUNTED_BY_SYMBOL = (
    {"name": "src", "kind": "source", "source": {"generator": "trades"}},
    {
        "name": "agg",
        "kind": "aggregate",
        "inputs": ["src"],
        "keyBy": ["symbol"],
        "aggregations": ["count(*) AS n"],
    },
)
"""Trades counted per symbol: ``agg`` is keyed by ``symbol``, ``src`` by nothing."""


def test_partition_key_inherits_through_a_single_input(make_spec):
    spec = make_spec(
        *COUNTED_BY_SYMBOL,
        {"name": "f", "kind": "filter", "inputs": ["agg"], "expr": "n > 1"},
        {"name": "m", "kind": "map", "inputs": ["src"], "select": ["symbol"]},
    )
    assert partition_key(spec, "agg") == ("symbol",)
    assert partition_key(spec, "f") == ("symbol",)
    assert partition_key(spec, "m") is None and partition_key(spec, "src") is None


@pytest.mark.parametrize(
    ("select", "inherited"),
    [
        (["n"], None),  # the key is gone: the sink is fed forward
        (["n", "SYMBOL"], ("symbol",)),  # Spark resolves names case-insensitively
        (["upper(symbol) AS symbol", "n"], ("symbol",)),
        (["*"], ("symbol",)),
        (["n", "concat(symbol, 'x')"], None),  # Spark names it after its text, never `symbol`
    ],
)
def test_a_key_a_map_drops_is_not_inherited_past_it(make_spec, select, inherited):
    """A stateless consumer keeps a partitioning only while its records carry the key: after a map that
    leaves the key out, a sink has none (and is not refused for a key nobody asked it to have)."""
    spec = make_spec(
        *COUNTED_BY_SYMBOL,
        {"name": "m", "kind": "map", "inputs": ["agg"], "select": select},
        {"name": "out", "kind": "sink", "inputs": ["m"], "sink": {"console": {}}},
    )
    assert partition_key(spec, "m") == ("symbol",)  # the map itself runs where its input's key put it
    assert partition_key(spec, "out") == inherited
