"""The file sink's lines (json_writer.py) are Spark's JSON writer's lines, value for value: generated
records of every type with their edge values (edge_values.py: years 1 to 9999 included), plus doubles and
floats of any bit pattern (Java's notation differs from Python's shortest repr) and strings with every
control character."""

from __future__ import annotations

import datetime
import math
from unittest import mock

import pyarrow as pa
import pytest
from edge_values import nullable, tables
from hypothesis import given, note
from hypothesis import strategies as st
from test_semantics import PROPERTY

from streamtopo.runtime.operators import json_writer
from streamtopo.runtime.operators.json_writer import json_lines, spark_json_lines
from streamtopo.runtime.operators.records import from_arrow

pytestmark = pytest.mark.spark

DOUBLES = st.one_of(st.floats(), st.sampled_from([5e-324, 1e-3, 9.999999e-4, 1e7, 9999999.0, 1e21, 2e-3]))
FLOATS = st.floats(width=32)
CONTROL = st.text(st.characters(max_codepoint=0x7F), max_size=8)


@st.composite
def records(draw) -> pa.Table:
    table = draw(tables())
    n = table.num_rows
    extra = {
        "x": pa.array(draw(st.lists(nullable(DOUBLES), min_size=n, max_size=n)), pa.float64()),
        "y": pa.array(draw(st.lists(nullable(FLOATS), min_size=n, max_size=n)), pa.float32()),
        'q"\n\u0001': pa.array(draw(st.lists(nullable(CONTROL), min_size=n, max_size=n)), pa.string()),
    }
    for name, array in extra.items():
        table = table.append_column(name, array)
    return table


@PROPERTY
@given(table=records())
def test_lines_are_sparks(spark, table):
    frame = from_arrow(table)
    columns = [c for c in frame.columns if c != "_kg"]
    with mock.patch.object(json_writer, "spark_json_lines", side_effect=AssertionError("left to Spark")):
        ours = json_writer.json_lines(spark, frame, columns).tolist()
    note(f"ours: {ours}")
    assert ours == spark_json_lines(spark, frame, columns).tolist()


def test_java_notation_not_pythons(spark):
    """The cases where Java 17's Double.toString is not Python's repr, and the non-numbers Jackson quotes."""
    frame = from_arrow(pa.table({"v": pa.array([5e-324, 1e7, 1e-4, math.nan, -math.inf, -0.0, None])}))
    assert json_lines(spark, frame, ["v"]).tolist() == [
        '{"v":4.9E-324}',
        '{"v":1.0E7}',
        '{"v":1.0E-4}',
        '{"v":"NaN"}',
        '{"v":"-Infinity"}',
        '{"v":-0.0}',
        "{}",
    ]


def test_a_record_with_every_field_null_keeps_its_place(spark):
    """``{}`` in its row: pyarrow 26's skipping string join drops such rows (the writer must not use it)."""
    frame = from_arrow(pa.table({"a": pa.array([1, None, 3]), "b": pa.array([None, None, "y"])}))
    ours = json_lines(spark, frame, ["a", "b"]).tolist()
    assert ours == spark_json_lines(spark, frame, ["a", "b"]).tolist()
    assert ours == ['{"a":1}', "{}", '{"a":3,"b":"y"}']


def test_a_type_it_does_not_write_goes_to_spark(spark):
    frame = from_arrow(pa.table({"b": pa.array([b"\x00\xff", None], pa.binary()), "n": [1, 2]}))
    assert json_lines(spark, frame, ["b", "n"]).tolist() == ['{"b":"AP8=","n":1}', '{"n":2}']


def test_a_timestamp_past_year_9999_goes_to_spark(spark):
    """Python's calendar stops at 9999 and Spark signs later years: the batch is Spark's to write."""
    beyond = (datetime.datetime(9999, 12, 31, 23, 59, 59) - datetime.datetime(1970, 1, 1)).total_seconds()
    micros = int(beyond + 86_400) * 1_000_000
    frame = from_arrow(pa.table({"t": pa.array([micros], pa.timestamp("us", tz="UTC"))}))
    with mock.patch.object(json_writer, "spark_json_lines", return_value="spark's") as spark_lines:
        assert json_writer.json_lines(spark, frame, ["t"]) == "spark's"
    spark_lines.assert_called_once()
