"""Generator sources (replayable, partitioned by key group) and sink formatting."""

from __future__ import annotations

import datetime
import math
from decimal import Decimal

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from streamtopo.runtime.operators import OperatorError, build_operator
from streamtopo.runtime.operators.json_writer import JSON_OPTIONS
from streamtopo.runtime.operators.records import LINE, from_arrow, to_spark
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
def test_file_sink_lines_are_what_sparks_json_writer_writes(spark, make_spec, tmp_path):
    """Every type as Spark's writer writes it (null fields left out, NaN and infinities, -0.0, a bigint
    above 2**53, a decimal with its scale, microsecond timestamps in UTC, unicode), event time last as
    ``_ts``; a user column named ``ts`` is the user's."""
    utc = datetime.UTC
    df = from_arrow(
        pa.table(
            {
                "symbol": ["A", None, 'ü"x\n\u0001', ""],
                "pv": [1 / 3, None, -0.0, math.inf],
                "nan": pa.array([math.nan, 5e-324, 2.0e-3, 1e22], pa.float64()),
                "big": pa.array([9007199254741025, None, -(2**63), 2**63 - 1], pa.int64()),
                "price": pa.array(
                    [Decimal("1.10"), None, Decimal("-0.01"), Decimal("0E-9")], pa.decimal128(20, 9)
                ),
                "when": pa.array(
                    [
                        datetime.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=utc),
                        None,
                        datetime.datetime(1, 1, 1, tzinfo=utc),
                        datetime.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=utc),
                    ],
                    pa.timestamp("us", tz="UTC"),
                ),
                "day": pa.array([datetime.date(2024, 1, 2), None, datetime.date(1, 1, 1), None]),
                "ts": [1.5, 2.5, None, 3.0],
                "_ts": [10.0, 20.0, 0.25, 1e-7],
                "_kg": pa.array([1, 2, 0, 3], pa.int32()),
            }
        )
    )
    out = sink(make_spec, {"file": {}}).process(spark, df, {}, {}).output
    frame = to_spark(spark, df[[c for c in df.columns if c != "_kg"]]).coalesce(1)
    frame.write.options(**JSON_OPTIONS).json(str(tmp_path / "spark"))
    [part] = (tmp_path / "spark").glob("part-*.json")
    assert out[LINE].tolist() == part.read_text().splitlines()
    assert out[LINE].iloc[1] == '{"nan":4.9E-324,"ts":2.5,"_ts":20.0}'  # Java's digits, not Python's 5e-324
    console = sink(make_spec, {"console": {}}).format_console(df)
    assert console[0].startswith("out[1] symbol=A pv=0.333333 nan=nan big=9007199254741025 price=1.100000000")
