"""Generator sources (replayable, partitioned by key group) and sink formatting."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from streamtopo.runtime.operators import OperatorError, build_operator
from streamtopo.runtime.operators.source import SourceOperator


def source(make_spec, generator="sequence", **fields):
    spec = make_spec(
        {"name": "src", "kind": "source", "source": {"generator": generator, "ratePerSecond": 50, **fields}}
    )
    return build_operator(spec.operator("src"), spec)


def generate(spark, op, kg, state, max_records):
    """One key group's request: (records as pandas, n, new state, watermark)."""
    df, out = op.generate(spark, [(kg, state, max_records)])
    n, state, wm = out[kg]
    return (None if df is None else df.toPandas()), n, state, wm


@pytest.mark.spark
def test_sequence_union_over_key_groups_is_0_to_count(spark, make_spec):
    """All key groups requested together, chunk by chunk until every watermark is +inf."""
    op = source(make_spec, count=103, keys=7)  # 4 key groups
    states, frames, rounds = dict.fromkeys(range(4)), [], 0
    while rounds < 100:
        rounds += 1
        df, out = op.generate(spark, [(kg, state, 10) for kg, state in states.items()])
        if df is not None:
            part = df.toPandas()
            emitted = [(kg, n) for kg, (n, _, _) in sorted(out.items()) if n]
            assert sorted(part.groupby("_kg").size().items()) == emitted
            frames.append(part)
        states = {kg: state for kg, (_, state, _) in out.items()}
        if all(math.isinf(wm) for _, _, wm in out.values()):
            break
    assert rounds == 3  # ceil(26 / 10) records per key group at most
    union = pd.concat(frames).sort_values("seq").reset_index(drop=True)
    assert union.seq.tolist() == list(range(103))
    assert (union.key == union.seq % 7).all() and (union.value == union.seq).all()
    assert (union._kg == union.seq % 4).all() and union._kg.dtype == np.int32
    np.testing.assert_allclose(union._ts, union.seq / 50)
    assert states == {0: 26, 1: 26, 2: 26, 3: 25}


@pytest.mark.spark
def test_watermark_is_the_next_records_time_then_inf(spark, make_spec):
    op = source(make_spec, count=40)  # key group 1 of 4 holds seq 1, 5, .., 37: 10 records
    frame, n, state, wm = generate(spark, op, 1, None, 3)
    assert frame.seq.tolist() == [1, 5, 9] and (n, state, wm) == (3, 3, 13 / 50)
    frame, n, state, wm = generate(spark, op, 1, 3, 0)  # nothing due: no frame, the same watermark
    assert frame is None and (n, state, wm) == (0, 3, 13 / 50)
    frame, n, state, wm = generate(spark, op, 1, 8, 5)  # only 2 left: the count is exhausted
    assert frame.seq.tolist() == [33, 37] and (n, state) == (2, 10) and math.isinf(wm)
    frame, n, state, wm = generate(spark, op, 1, 10, 5)
    assert frame is None and (n, state) == (0, 10) and math.isinf(wm)
    # The watermark after each record is the next record's event time (the source's punctuation),
    # computed without a Spark job.
    marks = [op.generate(spark, [(1, s, 1)])[1][1][2] for s in range(10)]
    times = generate(spark, op, 1, None, 10)[0]._ts.sort_values().tolist()
    assert marks[:-1] == times[1:] and math.isinf(marks[-1])


@pytest.mark.spark
@pytest.mark.parametrize("generator", ["trades", "quotes", "words", "sequence"])
def test_replay_from_any_offset_is_identical(spark, make_spec, generator):
    """Records regenerated from a stored offset, in another chunking, equal the first run's."""
    op = source(make_spec, generator, seed=11)
    first = pd.concat([generate(spark, op, 2, s, 25)[0] for s in (0, 25, 50)], ignore_index=True)
    state = op.decode_state(op.encode_state(20))
    replay = pd.concat(
        [generate(spark, op, 2, 0, 20)[0], generate(spark, op, 2, state, 55)[0]], ignore_index=True
    )
    pd.testing.assert_frame_equal(first, replay)
    other_seed = generate(spark, source(make_spec, generator, seed=12), 2, 0, 75)[0]
    if generator != "sequence":
        assert not first.drop(columns=["_ts", "_kg"]).equals(other_seed.drop(columns=["_ts", "_kg"]))


def test_unknown_generator_names_source_generator(make_spec):
    """The spec's Literal refuses unknown names; an operator built around it refuses them too."""
    spec = make_spec({"name": "src", "kind": "source", "source": {"generator": "trades"}})
    op = spec.operator("src")
    bad = op.model_copy(update={"source": op.source.model_copy(update={"generator": "nope"})})
    with pytest.raises(OperatorError) as err:
        SourceOperator(bad, spec)
    assert err.value.field == "source.generator" and "nope" in err.value.message


def sink(make_spec, target):
    spec = make_spec(
        {"name": "src", "kind": "source", "source": {"generator": "sequence"}},
        {"name": "out", "kind": "sink", "inputs": ["src"], "sink": target},
    )
    return build_operator(spec.operator("out"), spec)


@pytest.mark.spark
def test_sink_json_lines_round_trip(spark, make_spec):
    df = pd.DataFrame(
        {
            "symbol": ["A", None],
            "pv": [1 / 3, np.nan],
            "n": [3, 4],
            "_ts": [10.0, 20.0],
            "_kg": np.array([1, 2], dtype=np.int32),
        }
    )
    op = sink(make_spec, {"file": {}})
    assert op.process(spark, df, {}, {}).output is df  # the executor writes what the sink receives
    lines = op.format(df)
    assert [json.loads(line) for line in lines] == [
        {"symbol": "A", "pv": 1 / 3, "n": 3, "ts": 10.0},
        {"symbol": None, "pv": None, "n": 4, "ts": 20.0},
    ]
    console = sink(make_spec, {"console": {}}).format_console(df)
    assert console[0].startswith("out[1] symbol=A pv=0.333333 n=3")


def test_sink_records_convert_whole_columns_as_they_would_value_by_value():
    """Records are built a column at a time for speed; every dtype gives what :func:`_plain` gives per
    value (NaN and None -> null, infinities as strings, numpy scalars unboxed, timestamps ISO)."""
    from streamtopo.runtime.operators.sink import _plain, records

    n = 8
    df = pd.DataFrame(
        {
            "i": np.arange(n, dtype=np.int64),
            "small": np.arange(n, dtype=np.int16),
            "f": [0.1, np.nan, math.inf, -math.inf, 2.5, 1e300, -0.0, 3.0],
            "f32": np.linspace(0, 1, n, dtype=np.float32),
            "b": [True, False] * (n // 2),
            "s": ["a", None] * (n // 2),
            "t": pd.date_range("2026-01-01", periods=n, freq="s"),
            "mixed": [1, "x", None, 2.5, np.int64(3), np.nan, True, math.inf],
            "_ts": np.linspace(0, 7, n),
            "_kg": np.int32(1),
        }
    )
    want = [
        {
            **{c: _plain(v) for c, v in row.items() if c not in ("_ts", "_kg")},
            "ts": _plain(row["_ts"]),
        }
        for row in (dict(zip(df.columns, r)) for r in df.itertuples(index=False, name=None))
    ]
    got = records(df)
    assert json.dumps(got) == json.dumps(want)
    assert all(type(a) is type(b) for g, w in zip(got, want) for a, b in zip(g.values(), w.values()))
