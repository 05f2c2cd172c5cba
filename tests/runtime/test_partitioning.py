"""Key-group routing: stable across processes, type-insensitive for equal keys, forward when unkeyed."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtopo.runtime.partitioning import partition_key, route

FRAME = pd.DataFrame({"symbol": ["AAPL", "IBM", "MSFT", "AAPL", "ORCL", "ZZZ", "é"] * 3,
                      "venue": list(range(21))})


def test_route_is_identical_in_a_fresh_process():
    """Another interpreter (different hash seed, fresh imports) puts every key in the same key group."""
    ours = route(FRAME, ("symbol", "venue"), 32, 0).tolist()
    code = (
        "import json, sys, pandas as pd\n"
        "from streamtopo.runtime.partitioning import route\n"
        "df = pd.DataFrame(json.loads(sys.stdin.read()))\n"
        "print(json.dumps(route(df, ('symbol', 'venue'), 32, 0).tolist()))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], input=FRAME.to_json(orient="columns"),
                            capture_output=True, text=True, check=True, env={"PYTHONHASHSEED": "12345"})
    assert json.loads(result.stdout) == ours


def test_equal_keys_meet_whatever_their_dtype():
    ints = pd.DataFrame({"k": np.array([1, 2, 3, 40], dtype=np.int32)})
    floats = pd.DataFrame({"k": [1.0, 2.0, 3.0, 40.0]})
    nullable = pd.DataFrame({"k": pd.array([1, 2, 3, 40], dtype="Int64")})
    assert route(ints, ("k",), 16, 0).tolist() == route(floats, ("k",), 16, 0).tolist() \
        == route(nullable, ("k",), 16, 0).tolist()
    obj = pd.DataFrame({"s": ["a", "b"]})
    arrow = pd.DataFrame({"s": pd.array(["a", "b"], dtype="string")})
    assert route(obj, ("s",), 16, 0).tolist() == route(arrow, ("s",), 16, 0).tolist()


@settings(max_examples=30, deadline=None)
@given(keys=st.lists(st.text(max_size=5), min_size=1, max_size=40), k=st.integers(1, 64))
def test_keyed_route_is_a_function_of_the_key(keys, k):
    df = pd.DataFrame({"key": keys})
    kg = route(df, ("key",), k, src_kg=7)
    assert ((kg >= 0) & (kg < k)).all()
    # Same key -> same key group, wherever it sits in the batch and whatever batch it is in.
    assert all(len(set(kg[df.key == key])) == 1 for key in set(keys))
    reversed_kg = route(df.iloc[::-1], ("key",), k, src_kg=3)[::-1]
    assert (reversed_kg == kg).all()


def test_unkeyed_route_forwards_the_producers_key_group():
    assert route(FRAME, None, 4, 6).tolist() == [6 % 4] * len(FRAME)


def test_keys_spread_over_key_groups():
    df = pd.DataFrame({"k": np.arange(4000)})
    counts = np.bincount(route(df, ("k",), 8, 0), minlength=8)
    assert counts.min() > 0.8 * 500 and counts.max() < 1.2 * 500  # binomial sd ~ 21 around 500


def test_partition_key_inherits_through_a_single_input(make_spec):
    spec = make_spec(
        {"name": "src", "kind": "source", "source": {"generator": "trades"}},
        {"name": "agg", "kind": "aggregate", "inputs": ["src"], "keyBy": ["symbol"], "aggregations": ["count(*) AS n"]},
        {"name": "f", "kind": "filter", "inputs": ["agg"], "expr": "n > 1"},
        {"name": "m", "kind": "map", "inputs": ["src"], "select": ["symbol"]},
    )
    assert partition_key(spec, "agg") == ("symbol",)
    assert partition_key(spec, "f") == ("symbol",)
    assert partition_key(spec, "m") is None and partition_key(spec, "src") is None
