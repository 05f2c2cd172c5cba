"""One semantics, Spark's: every path a batch can take gives what Spark's batch evaluation gives over the
same records, with the values ordinary data brings (edge_values.py). Property-based (hypothesis):

- types and values survive every hop: into Spark and back (small batches and the Parquet hand-off), across
  the wire as an entry, into state and back, concatenation;
- a filter or a projection evaluated with numpy (numpy_eval.py) keeps the rows and computes the values
  Spark does, or leaves the batch to Spark, never answering differently (an ANSI error included);
- an aggregate's partials, computed batch by batch in numpy or in Spark and merged in the driver
  (folds.py), finalise to what one Spark aggregation over all the records gives;
- a join matches keys as Spark's equi-join does.

``STREAMTOPO_SEMANTICS_EXAMPLES`` sets the examples per property (CI: the default); the long profile's
command is in docs/runtime.md ("One semantics").
"""

from __future__ import annotations

import math
import os
from decimal import Decimal
from unittest import mock

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from edge_values import TYPES, nullable, tables
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from pyspark.errors import PySparkException
from pyspark.sql import functions as F
from semantics_support import difference, same_rows

from streamtopo.runtime.operators import build_operator, combine_inputs, records
from streamtopo.runtime.operators.aggregate import AggregateOperator, bucket_partials
from streamtopo.runtime.operators.aggregations import finalize, merge_partials
from streamtopo.runtime.operators.base import OperatorError
from streamtopo.runtime.operators.folds import (
    SparkArithmeticError,
    first_rows,
    group_codes,
    key_hashes,
)
from streamtopo.runtime.operators.numpy_eval import Evaluator
from streamtopo.runtime.operators.records import KG, TS, from_arrow, to_arrow, to_pandas, to_spark
from streamtopo.runtime.operators.state import decode_frames, encode_frames
from streamtopo.runtime.transport import Entry, entry_fields

pytestmark = pytest.mark.spark

EXAMPLES = int(os.environ.get("STREAMTOPO_SEMANTICS_EXAMPLES", "25"))
PROPERTY = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
    derandomize=True,
)
"""Derandomized: the same examples on every run (CI stays reproducible); the long profile draws more."""


def spark_says(build) -> pd.DataFrame | Exception:
    """What Spark computes, or the error it raises (an ANSI error is an answer too)."""
    try:
        return build()
    except PySparkException as error:
        return error


def spark_answers(spark, query, frame: pd.DataFrame) -> list[pd.DataFrame | Exception]:
    """What Spark answers for ``query`` over ``frame`` as a local relation and as a scan: both are Spark's
    answers. They can differ where an expression can fail without its value being needed (``x + y IS NULL``
    folds to false for non-nullable operands, but a local relation's projection runs before that rule)."""
    answers = [spark_says(lambda: to_pandas(query(to_spark(spark, frame))))]
    with mock.patch.object(records, "PARQUET_ROWS", 0):
        answers.append(spark_says(lambda: to_pandas(query(to_spark(spark, frame)))))
    return answers


def one_of_sparks(ours: pd.DataFrame, answers: list[pd.DataFrame | Exception]) -> None:
    """``ours`` (numpy's answer) must be one of Spark's; numpy never answers where Spark only raises."""
    frames = [a for a in answers if not isinstance(a, Exception)]
    assert frames, f"numpy answered where Spark raises: {answers[0]}"
    reasons = [difference(ours, theirs, ordered=True) for theirs in frames]
    assert "" in reasons, reasons[0]


# ------------------------------------------------------------------------------------------- hops


@PROPERTY
@given(tables(max_rows=30))
def test_types_and_values_survive_every_hop(spark, table):
    frame = from_arrow(table)
    entry = entry_fields("p/0", 1, 0.0, frame)
    with mock.patch.object(records, "PARQUET_ROWS", 0):
        through_parquet = to_pandas(to_spark(spark, frame))
    hops = {
        "arrow": from_arrow(to_arrow(frame)),
        "spark": to_pandas(to_spark(spark, frame)),
        "parquet": through_parquet,
        "entry": Entry.parse(b"1-0", dict(zip(entry[::2], entry[1::2]))).records(),
        "state": decode_frames(encode_frames({"rows": frame}))[0]["rows"],
        "concat": records.concat([frame.iloc[: len(frame) // 2], frame.iloc[len(frame) // 2 :]]),
    }
    for hop, out in hops.items():
        if out is None:  # an entry of no records carries none
            assert len(frame) == 0, hop
            continue
        reason = difference(out, frame, ordered=True)
        assert not reason, f"{hop}: {reason}"


# ------------------------------------------------------------------------------------ expressions

NUMERIC_COLUMNS = {"i": "int", "b": "bigint", "d": "double"}


@st.composite
def numeric(draw, depth: int = 0) -> str:
    """A numeric Spark SQL expression over columns i, b, d: literals, arithmetic, pmod, casts."""
    leaf = st.one_of(
        st.sampled_from(list(NUMERIC_COLUMNS)),
        st.sampled_from(["0", "1", "-3", "2147483647", "9223372036854775807", "0.25D", "-0.0D"]),
        st.sampled_from(["CAST('NaN' AS DOUBLE)", "CAST('Infinity' AS DOUBLE)", "CAST(NULL AS INT)"]),
    )
    if depth >= 2 or draw(st.booleans()):
        return draw(leaf)
    a, b = draw(numeric(depth + 1)), draw(numeric(depth + 1))
    return draw(
        st.sampled_from(
            [
                f"({a} + {b})",
                f"({a} - {b})",
                f"({a} * {b})",
                f"({a} / {b})",
                f"({a} % {b})",
                f"pmod({a}, {b})",
            ]
            + [f"(-({a}))", f"CAST({a} AS DOUBLE)", f"CAST({a} AS BIGINT)"]
        )
    )


@st.composite
def predicate(draw, depth: int = 0) -> str:
    """A boolean Spark SQL expression: comparisons (numbers, strings), null tests, AND/OR/NOT."""
    comparison = st.tuples(numeric(), st.sampled_from(["=", "<", "<=", ">", ">=", "!=", "<=>"]), numeric())
    leaf = st.one_of(
        comparison.map(" ".join),
        st.sampled_from(["s = 'a'", "s > 'Ä'", "s <= ''", "f", "NOT f", "s IS NULL", "m7_2 IS NOT NULL"]),
        numeric().map(lambda e: f"{e} IS NULL"),
    )
    if depth >= 2 or draw(st.booleans()):
        return draw(leaf)
    a, b = draw(predicate(depth + 1)), draw(predicate(depth + 1))
    return draw(st.sampled_from([f"({a} AND {b})", f"({a} OR {b})", f"(NOT {a})"]))


EXPRESSION_COLUMNS = ["i", "b", "d", "s", "f", "t", "m7_2"]


@PROPERTY
@given(tables(EXPRESSION_COLUMNS, max_rows=30), predicate())
def test_a_filter_in_numpy_keeps_the_rows_spark_keeps(spark, table, expr):
    note(f"records: {table.to_pylist()}")
    frame = from_arrow(table)
    build = lambda f: f.filter(expr)  # noqa: E731
    ours = Evaluator(build, "op", "expr")(spark, frame)
    if ours is not None:  # else left to Spark: whatever Spark says is the answer
        one_of_sparks(ours, spark_answers(spark, build, frame))


@PROPERTY
@given(
    tables(EXPRESSION_COLUMNS, max_rows=30),
    st.lists(st.one_of(numeric(), predicate()), min_size=1, max_size=3),
    st.booleans(),
)
def test_a_projection_in_numpy_computes_what_spark_computes(spark, table, exprs, star):
    note(f"records: {table.to_pylist()}")
    frame = from_arrow(table)
    select = (["*"] if star else []) + [f"{e} AS c{i}" for i, e in enumerate(exprs)]
    build = lambda f: f.selectExpr(*select)  # noqa: E731
    ours = Evaluator(build, "op", "expr")(spark, frame)
    if ours is not None:
        one_of_sparks(ours, spark_answers(spark, build, frame))


# ------------------------------------------------------------------------------------- aggregates

KEYS = ["s", "d", "f", "b"]
AGGREGATIONS = [
    "count(*) AS n",
    "count(d) AS nd",
    "sum(i) AS si",
    "sum(b) AS sb",
    "sum(d) AS sd",
    "sum(m38_10) AS sm",
    "sum(m7_2) AS sm7",
    "avg(i) AS ai",
    "avg(d) AS ad",
    "avg(m20_2) AS am",
    "avg(m38_0) AS am38",
    "min(d) AS lo",
    "max(d) AS hi",
    "min(s) AS first",
    "max(t) AS latest",
    "min(day) AS earliest",
    "max(f) AS anyf",
    "min(m5_5) AS small",
    "max(b) AS hb",
]
VALUE_COLUMNS = ["i", "b", "d", "m38_10", "m7_2", "m20_2", "m38_0", "s", "t", "day", "f", "m5_5"]


def aggregate_operator(make_spec, keys: list[str], aggregations: list[str]) -> AggregateOperator:
    spec = make_spec(
        {"name": "src", "kind": "source", "source": {"generator": "sequence"}},
        {"name": "agg", "kind": "aggregate", "inputs": ["src"], "keyBy": keys, "aggregations": aggregations},
    )
    operator = build_operator(spec.operator("agg"), spec)
    assert isinstance(operator, AggregateOperator)
    return operator


def spark_aggregate(spark, frame: pd.DataFrame, keys: list[str], aggs: list[str]) -> pd.DataFrame | Exception:
    """One Spark aggregation of ``frame`` by key group and ``keys``, or the error Spark raises."""
    return spark_says(
        lambda: to_pandas(to_spark(spark, frame).groupBy(KG, *keys).agg(*[F.expr(a) for a in aggs]))
    )


@PROPERTY
@given(
    tables(list(dict.fromkeys([*KEYS, *VALUE_COLUMNS])), max_rows=40),
    st.lists(st.sampled_from(KEYS), max_size=2, unique=True),
    st.lists(st.sampled_from(AGGREGATIONS), min_size=1, max_size=5, unique=True),
    st.lists(st.booleans(), min_size=1, max_size=3),
)
def test_partials_merged_in_the_driver_are_sparks_aggregate(spark, make_spec, table, keys, aggs, in_numpy):
    """The records in up to three batches, each folded in numpy or in Spark, merged and finalised: one
    Spark aggregation over all of them, grouped by key group and keys."""
    frame = from_arrow(table)
    operator = aggregate_operator(make_spec, keys, aggs)
    cuts = np.linspace(0, len(frame), len(in_numpy) + 1).astype(int)
    reference = spark_aggregate(spark, frame, keys, aggs)
    try:
        partials = []
        for numpy_path, a, b in zip(in_numpy, cuts, cuts[1:]):
            batch = frame.iloc[a:b].reset_index(drop=True)
            if not len(batch):
                continue
            partials.append(
                operator._batch_partials(spark, batch)
                if numpy_path
                else to_pandas(bucket_partials(to_spark(spark, batch), keys, None, False, operator.aggs))
            )
        ours: pd.DataFrame | Exception | None = None
        if partials:
            merged = merge_partials(records.concat(partials), [KG, *keys], operator.kinds, extra_max=(TS,))
            ours = finalize(merged, operator.aggs).drop(columns=[TS])
    except (SparkArithmeticError, OperatorError, PySparkException) as error:
        ours = error
    if isinstance(reference, Exception) or isinstance(ours, Exception):
        assert isinstance(reference, Exception) or _exceeds_somewhere(frame, keys, aggs), (
            f"we raised ({ours}) where no order of addition overflows"
        )
        return
    if ours is None:
        assert len(reference) == 0
        return
    # 0.0 and -0.0 tie in min/max: Spark keeps whichever it met first, which depends on its partitioning.
    signed = not any(a.startswith(("min(d)", "max(d)")) for a in aggs)
    same_rows(ours[reference.columns], reference, signed_zero=signed)


@PROPERTY
@given(
    tables(list(dict.fromkeys([*KEYS, *VALUE_COLUMNS])), max_rows=40),
    st.lists(st.sampled_from(KEYS), max_size=2, unique=True),
    st.lists(st.sampled_from(AGGREGATIONS), min_size=1, max_size=5, unique=True),
    st.lists(st.booleans(), min_size=1, max_size=4),
)
def test_a_running_aggregate_stepped_through_its_state_is_sparks_aggregate(
    spark, make_spec, table, keys, aggs, stored
):
    """The records cut into up to four steps of the operator, its state carried from step to step (through
    the store's encoding where ``stored`` says, so the key hashes are built anew): each key's last emitted
    values are one Spark aggregation over all the records. The step folds only the state rows of its own
    keys (aggregate.py, ``_running``): a key missed or split by the hash lookup shows here."""
    frame = from_arrow(table)
    operator = aggregate_operator(make_spec, keys, aggs)
    reference = spark_aggregate(spark, frame, keys, aggs)
    cuts = np.linspace(0, len(frame), len(stored) + 1).astype(int)
    states: dict = {}
    emitted = []
    try:
        for through_store, a, b in zip(stored, cuts, cuts[1:]):
            result = operator.process(spark, frame.iloc[a:b].reset_index(drop=True), states, {})
            emitted.append(result.output)
            states = {
                kg: operator.decode_state(operator.encode_state(state)) if through_store else state
                for kg, state in result.states.items()
            }
    except OperatorError as error:
        assert isinstance(reference, Exception) or _exceeds_somewhere(frame, keys, aggs), error
        return
    if isinstance(reference, Exception):
        assert _exceeds_somewhere(frame, keys, aggs), f"Spark raised ({reference}), we did not"
        return
    nonempty = [out for out in emitted if len(out)]
    if not nonempty:
        assert len(reference) == 0
        return
    output = records.concat(nonempty)
    codes, _ = group_codes(output, [KG, *keys])
    ours = output.iloc[_last_rows(codes)].reset_index(drop=True)
    signed = not any(a.startswith(("min(d)", "max(d)")) for a in aggs)
    same_rows(ours[reference.columns], reference, signed_zero=signed)


def _last_rows(codes: np.ndarray) -> np.ndarray:
    """The last row of each group of ``codes``."""
    reversed_first = np.unique(codes[::-1], return_index=True)[1]
    return np.sort(len(codes) - 1 - reversed_first)


@PROPERTY
@given(tables(KEYS, max_rows=40), st.lists(st.sampled_from(KEYS), min_size=1, max_size=3, unique=True))
def test_rows_of_one_group_hash_alike(table, keys):
    """key_hashes never tells apart rows group_codes puts together (the aggregate's state lookup would
    miss a key's row and count it twice); a NaN with another payload is the one NaN in both."""
    frame = from_arrow(table)
    other_nan = np.frombuffer(np.uint64(0x7FF8000000000001).tobytes(), dtype=np.float64)[0]
    extra = pd.DataFrame({"n": [math.nan, other_nan, -0.0, 0.0]})
    extra["a"] = pd.Series(pd.arrays.ArrowExtensionArray(pa.array(extra["n"].to_numpy(), pa.float64())))
    for rows, by in ((frame, keys), (extra, ["n"]), (extra, ["a"]), (extra, ["n", "a"])):
        codes, _ = group_codes(rows, by)
        hashes = key_hashes(rows, by)
        for group in set(codes.tolist()):
            assert len(set(hashes[codes == group].tolist())) == 1, (by, rows[codes == group])
    assert len(set(group_codes(extra, ["a"])[0].tolist())) == 2  # the NaNs, and 0.0 with -0.0


@given(st.lists(st.integers(0, 6), min_size=1, max_size=40))
def test_first_rows_are_each_groups_first_however_the_groups_are_numbered(values):
    """The one-pass rule (groups numbered by first appearance) and its fallback (any other numbering)."""
    sorted_codes = np.unique(values, return_inverse=True)[1].astype(np.int64)  # numbered by value
    appearance = pd.factorize(np.array(values))[0].astype(np.int64)  # numbered as ngroup(sort=False)
    for codes in (sorted_codes, appearance):
        assert np.array_equal(first_rows(codes), np.unique(codes, return_index=True)[1])


def _exceeds_somewhere(frame: pd.DataFrame, keys: list[str], aggs: list[str]) -> bool:
    """Whether, in some group, a run of consecutive values of a summed integer or decimal column leaves its
    result type: Spark's answer then depends on how it splits the records (one split overflows, another
    need not), and so does ours (a batch's partial can be such a run)."""
    limits = {"i": 2**63, "b": 2**63, "m38_10": Decimal(10) ** 28, "m7_2": Decimal(10) ** 15}
    limits |= {"m20_2": Decimal(10) ** 28, "m38_0": Decimal(10) ** 38}
    codes, _ = group_codes(frame, [KG, *keys])
    for column, limit in limits.items():
        if not any(f"({column})" in a for a in aggs):
            continue
        values = to_arrow(frame[[column]]).column(0).to_pylist()
        for group in set(codes.tolist()):
            run = [v for v, c in zip(values, codes) if c == group and v is not None]
            high = low = best_high = best_low = 0
            for v in run:  # Kadane: the largest and the smallest sum of consecutive values
                high, low = max(v, high + v), min(v, low + v)
                best_high, best_low = max(best_high, high), min(best_low, low)
            if best_high >= limit or -best_low >= limit:
                return True
    return False


# ------------------------------------------------------------------------------------------- joins

JOIN_KEYS = st.sampled_from([("s", "s"), ("d", "d"), ("b", "b"), ("i", "d"), ("i", "b")])


@PROPERTY
@given(JOIN_KEYS, st.data())
def test_join_keys_match_as_sparks_equi_join(spark, make_spec, key_types, data):
    """Null keys match nothing, NaN matches NaN, -0.0 matches 0.0, an int matches the double of its value;
    the output's key is the left input's value."""
    left_type, right_type = key_types

    def side(kind: str, extra: str) -> pa.Table:
        arrow_type, values = TYPES[kind]
        keys = data.draw(st.lists(nullable(values), min_size=0, max_size=12))
        if kind == "i" and right_type == "d":  # ints of the doubles' range, so some meet
            keys = [None if k is None else k % 8 for k in keys]
        return pa.table(
            {
                "k": pa.array(keys, arrow_type),
                extra: pa.array(range(len(keys)), pa.int64()),
                TS: pa.array([1.0] * len(keys)),
                KG: pa.array([0] * len(keys), pa.int32()),
            }
        )

    left, right = from_arrow(side(left_type, "x")), from_arrow(side(right_type, "y"))
    spec = make_spec(
        {"name": "l", "kind": "source", "source": {"generator": "trades"}},
        {"name": "r", "kind": "source", "source": {"generator": "quotes"}},
        {"name": "j", "kind": "join", "inputs": ["l", "r"], "keyBy": ["k"], "window": {"size": 5.0}},
    )
    join = build_operator(spec.operator("j"), spec)
    out = join.process(spark, combine_inputs({"l": left, "r": right}), {}, {0: math.inf}).output
    ours = out[["k", "x", "y"]] if len(out) else None
    theirs = to_pandas(
        to_spark(spark, left.drop(columns=[TS, KG])).join(
            to_spark(spark, right.drop(columns=[TS, KG])), ["k"]
        )
    )
    if ours is None:
        assert len(theirs) == 0
        return
    same_rows(ours, theirs[["k", "x", "y"]])


def test_an_overflowing_total_names_the_aggregation(spark, make_spec):
    """A running bigint total that leaves the range fails as Spark's sum does, naming the aggregation; each
    batch alone fits, the merge with the state does not."""
    operator = aggregate_operator(make_spec, [], ["count(*) AS n", "sum(b) AS total"])

    def batch(value: int) -> pd.DataFrame:
        return from_arrow(
            pa.table({KG: pa.array([0], pa.int32()), TS: [0.0], "b": pa.array([value], pa.int64())})
        )

    state = operator.process(spark, batch(2**62 + 2**61), {}, {0: 0.0}).states
    with pytest.raises(OperatorError) as error:
        operator.process(spark, batch(2**62), state, {0: 0.0})
    assert error.value.field == "aggregations[1]" and "[ARITHMETIC_OVERFLOW]" in error.value.message


def test_panes_merged_into_sliding_windows_keep_their_keys():
    """A sliding window's panes reach merge_partials with their row labels repeated (one pane row per
    window it falls in): each floating-point key must stay on its own rows. Found by the differential
    harness (tests/runtime/differential/): two double keys were merged into the first one's group."""
    panes = from_arrow(
        pa.table(
            {
                KG: pa.array([0, 0, 0, 0], pa.int32()),
                "d": [-363.0, -363.0, 51051003037.0, 51051003037.0],
                "__bucket": pa.array([-1, 0, -1, 0], pa.int64()),
                "__a0_s": [-726.0, -726.0, 102102006074.0, 102102006074.0],
            }
        )
    ).set_axis([0, 0, 1, 1])
    merged = merge_partials(panes, [KG, "d", "__bucket"], {"__a0_s": "s"})
    assert merged[["d", "__a0_s"]].to_numpy().tolist() == [
        [-363.0, -726.0],
        [-363.0, -726.0],
        [51051003037.0, 102102006074.0],
        [51051003037.0, 102102006074.0],
    ]
