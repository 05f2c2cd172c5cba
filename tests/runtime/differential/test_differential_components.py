"""Component-level differential properties: single hops of the data plane held to Spark batch evaluation,
in milliseconds rather than a pipeline run each (test_differential_pipelines.py is the main harness).

They call the data plane's internals as they are today (records.to_pandas and to_spark, the transport's
entries, sink.file_lines, the operators' process and state encoding): the lead's refactor of the data plane
may change those calls; the properties stay. The records and queries are the harness's (strategies.py),
the answers the reference's (reference.py).
"""

from __future__ import annotations

from collections import Counter

import pandas as pd
import pyarrow as pa
import pytest
from harness import plan
from hypothesis import given, seed
from hypothesis import strategies as st
from profiles import PROFILE
from reference import Expected, Reference, parse_line, spark_lines
from strategies import (
    ALL_COLUMNS,
    NUMPY_COLUMNS,
    Branch,
    Case,
    Records,
    aggregates,
    filters,
    maps,
    records,
    scope_of,
)

from streamtopo.runtime.operators import RecordError, build_operators
from streamtopo.runtime.operators.records import to_pandas, to_spark
from streamtopo.runtime.operators.sink import file_lines
from streamtopo.runtime.transport import Entry, entry_fields

pytestmark = pytest.mark.spark
SETTINGS = PROFILE.settings(PROFILE.component_examples)


def with_kg(table: pa.Table) -> pa.Table:
    return table.append_column("_kg", pa.array([0] * len(table), pa.int32()))


def driver_batch(spark, table: pa.Table) -> pd.DataFrame:
    """Records as the data plane holds them in the driver: Spark's output computed into pandas."""
    return to_pandas(spark.createDataFrame(with_kg(table)))


def lines_of(spark, frame: pd.DataFrame) -> Counter:
    """Spark's JSON lines of a frame the data plane made, after it enters Spark the data plane's way."""
    return spark_lines(spark, to_spark(spark, frame).toArrow())[0]


def assert_same(want: Counter, got: Counter) -> None:
    """Lines equal as multisets; else the lines each side has that the other lacks."""
    missing, extra = want - got, got - want
    assert not missing and not extra, "\n".join(
        [
            *(f"  want {dict(line)}" for line in missing.elements()),
            *(f"  got  {dict(line)}" for line in extra.elements()),
        ][:20]
    )


def types_of(df) -> dict[str, str]:
    return {f.name: f.dataType.simpleString() for f in df.schema.fields if f.name not in ("_ts", "_kg")}


def operators_of(case: Case):
    p = plan(case, stream="in")
    return p, build_operators(p.topology("components").spec)


@SETTINGS
@seed(PROFILE.seed_for("test_a_file_sink_writes_what_sparks_json_writer_writes"))
@given(records(max_records=12))
def test_a_file_sink_writes_what_sparks_json_writer_writes(spark, recs: Records):
    """The sink's lines for records in the driver are Spark's ``to_json`` lines (reference.py: null fields
    left out, NaN as "NaN", doubles in Java's notation, decimals with their scale, timestamps with
    microseconds and zone) plus ``_ts``."""
    got = Counter(parse_line(line) for line in file_lines(spark, driver_batch(spark, recs.arrow())))
    assert_same(spark_lines(spark, recs.arrow())[0], got)


@SETTINGS
@seed(PROFILE.seed_for("test_records_cross_the_wire_with_their_types_and_values"))
@given(records(max_records=12))
def test_records_cross_the_wire_with_their_types_and_values(spark, recs: Records):
    """An Arrow entry (what a producer on another executor, or a program writing a named stream, appends)
    read back and handed to Spark the data plane's way has the schema and the values it was written with."""
    table = with_kg(recs.arrow())
    fields = entry_fields("feed/0", 1, 0.0, table)
    entry = Entry.parse(b"1-1", dict(zip(fields[::2], fields[1::2])))
    frame = entry.records()
    assert frame is not None
    back = to_spark(spark, frame)
    sent = spark.createDataFrame(table)
    assert types_of(back) == types_of(sent)
    assert_same(spark_lines(spark, table)[0], lines_of(spark, frame))


@st.composite
def stage_cases(draw: st.DrawFn, kind: str) -> tuple[Records, object]:
    recs = draw(records(max_records=12, columns=draw(st.sampled_from((NUMPY_COLUMNS, ALL_COLUMNS)))))
    scope = scope_of(recs.columns)
    if kind == "filter":
        return recs, draw(filters(scope))
    if kind == "map":
        return recs, draw(maps(scope))[0]
    return recs, draw(aggregates(scope))


@SETTINGS
@seed(PROFILE.seed_for("test_a_driver_batch_is_filtered_and_mapped_as_spark_does"))
@given(data=st.one_of(stage_cases("filter"), stage_cases("map")))
def test_a_driver_batch_is_filtered_and_mapped_as_spark_does(spark, data):
    """A map or filter over records in the driver (numpy_eval.py where it can, Spark from pandas
    otherwise) gives Spark's output over the same records, and blames exactly the records Spark raises on."""
    recs, stage = data
    p, operators = operators_of(Case(recs, (Branch((stage,)),)))
    expected = Expected()
    want = Reference(spark, recs).stage(stage, "b0s0", recs.arrow(), expected)
    operator = operators["b0s0"]
    try:
        out = operator.process(spark, driver_batch(spark, recs.arrow()), {}, {}).output
    except RecordError as error:
        assert sorted(error.rows["seq"].tolist()) == sorted(expected.dead.get("b0s0", Counter()).elements())
        return
    assert not expected.dead, f"Spark raises on records {sorted(expected.dead['b0s0'])}; the operator did not"
    assert_same(spark_lines(spark, want)[0], lines_of(spark, out))


@SETTINGS
@seed(PROFILE.seed_for("test_partials_merged_through_restored_state_give_sparks_aggregate"))
@given(data=stage_cases("aggregate"), cut=st.floats(0, 1), lazy=st.booleans())
def test_partials_merged_through_restored_state_give_sparks_aggregate(spark, data, cut, lazy):
    """An aggregate fed the records in two batches (lazy Spark frames, or batches in the driver: numpy
    partials), its state encoded and decoded between them (what a hand-over or a restart does), fires
    Spark's windows once the watermark passes them."""
    recs, stage = data
    expected = Expected()
    ref = Reference(spark, recs)
    want = ref.stage(stage, "b0s0", recs.arrow(), expected)
    table = recs.arrow()
    if expected.dead:  # records whose arguments raise are the pipeline tests' business
        table = table.filter(
            pa.compute.invert(pa.compute.is_in(table["seq"], pa.array(list(expected.dead["b0s0"]))))
        )
    p, operators = operators_of(Case(recs, (Branch((stage,)),)))
    operator = operators["b0s0"]
    half = int(len(table) * cut)
    state = None
    outputs = []
    for part, watermark in ((table.slice(0, half), -float("inf")), (table.slice(half), float("inf"))):
        batch = spark.createDataFrame(with_kg(part)) if lazy else driver_batch(spark, part)
        try:
            result = operator.process(spark, batch, {0: state}, {0: watermark})
        except Exception as error:  # noqa: BLE001 - an overflowing sum must fail with Spark's error class
            assert expected.failures, f"Spark's aggregate does not fail, the operator raised {error!r}"
            assert expected.failures["b0s0"] in str(error)
            return
        state = operator.decode_state(operator.encode_state(result.states[0]))
        outputs.append(result.output)
    assert not expected.failures, f"Spark fails with {expected.failures['b0s0']}; the operator did not"
    assert want is not None
    got = sum((lines_of(spark, o) for o in outputs if len(o)), Counter())
    assert_same(spark_lines(spark, want)[0], got)


@PROFILE.settings(max(4, PROFILE.component_examples // 4))
@seed(PROFILE.seed_for("test_the_reference_blames_the_records_bisection_blames"))
@given(data=st.one_of(stage_cases("filter"), stage_cases("map")))
def test_the_reference_blames_the_records_bisection_blames(spark, data):
    """The reference finds the records an operator raises on in one Spark job (TryEval); bisection, which
    runs the operator on halves of the records as the data plane does, must find the same."""
    recs, stage = data
    ref = Reference(spark, recs)
    query = (
        (lambda df: df.filter(stage.expr))
        if stage.kind == "filter"
        else (lambda df: df.selectExpr(*stage.select))
    )
    table = recs.arrow()

    def fails(rows: list[int]) -> bool:
        try:
            query(ref.frame(table.take(rows))).write.format("noop").mode("overwrite").save()
        except Exception:  # noqa: BLE001 - an ANSI error of a record
            return True
        return False

    def bisect(rows: list[int]) -> list[int]:
        if not rows or not fails(rows):
            return []
        if len(rows) == 1:
            return rows
        return bisect(rows[: len(rows) // 2]) + bisect(rows[len(rows) // 2 :])

    assert sorted(ref.culprits(ref.frame(table), query)) == bisect(list(range(len(table))))
