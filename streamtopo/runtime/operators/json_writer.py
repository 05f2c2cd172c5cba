"""Records as Spark's JSON writer writes them (``to_json``, the json data source), without a Spark job.

Why: a file sink needs every record's line, and asking Spark for them costs a job per sink per step
(50-110 ms measured on this 2-core machine). Small steps are what keep hand-over pauses short: with the
job in every step, the local drills' donors no longer released a unit between two moves.

Exactness: each value is written as Spark 4's ``JacksonGenerator`` writes it, with the options in
:data:`JSON_OPTIONS` and the session in UTC:

- null fields are left out; field names and strings take Jackson's escapes (``\\"``, ``\\\\``, ``\\b``,
  ``\\t``, ``\\n``, ``\\f``, ``\\r``, every other character below U+0020 as ``\\u00XX`` in upper-case hex),
  everything else as it is;
- doubles and floats in Java's ``Double.toString``/``Float.toString`` notation, computed by the driver's
  own JVM (Java 17's digits are not Python's shortest repr: 5e-324 is ``4.9E-324``); NaN and the
  infinities as the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``;
- integers in decimal digits, booleans ``true``/``false``, decimals as ``BigDecimal.toString`` (Python's
  ``Decimal`` string follows the same rule: plain unless the exponent is below -6, so ``1E-8``, ``0E-10``);
- timestamps ``yyyy-MM-dd'T'HH:mm:ss.SSSSSS`` then ``Z``; dates ``yyyy-MM-dd``.

Any other type (binary, nested, intervals, zone-less timestamps) or a timestamp or date outside years 1-9999 sends
the batch to Spark's own writer (:func:`spark_json_lines`). tests/runtime/test_json_writer.py compares the
two over generated edge values of every type.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from streamtopo.runtime.operators.base import computed
from streamtopo.runtime.operators.records import to_arrow, to_spark

JSON_OPTIONS = {"timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX"}
"""The JSON writer's options: Spark's defaults but for timestamps, which keep their microseconds."""

_EPOCH = datetime.datetime(1970, 1, 1)
_MICRO = datetime.timedelta(microseconds=1)
_FIRST = (datetime.datetime(1, 1, 1) - _EPOCH) // _MICRO
_LAST = (datetime.datetime(9999, 12, 31, 23, 59, 59, 999999) - _EPOCH) // _MICRO
_DAY = 86_400_000_000
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}
_NEEDS_ESCAPE = re.compile(r'["\\\x00-\x1f]')


def json_lines(spark: SparkSession, frame: pd.DataFrame, columns: Sequence[str]) -> np.ndarray:
    """Each record's ``columns`` as one JSON line, exactly Spark's writer's (an object array).

    Assembled by Arrow's string kernels, not per record in Python: a join's 2M output rows spent 39 % of
    its executor's time building lines one by one (bench/peers.py's join shape, py-spy). Each field is
    ``,"name":value``, or empty for a null, the fields of a record are concatenated and the first comma
    dropped. (Not ``binary_join_element_wise(..., null_handling="skip")``: pyarrow 26 drops a record whose
    fields are all null from its result.)"""
    table = to_arrow(frame[list(columns)])
    texts = [_texts(spark, column.combine_chunks()) for column in table.columns]
    if any(t is None for t in texts):
        return spark_json_lines(spark, frame, columns)
    if not texts:
        return np.array(["{}"] * len(frame), dtype=object)
    fields = [
        pc.fill_null(pc.binary_join_element_wise(_text(f",{_string(name)}:"), text, _text("")), _text(""))
        for name, text in zip(columns, texts)
    ]
    body = pc.utf8_slice_codeunits(pc.binary_join_element_wise(*fields, _text("")), 1)
    return pc.binary_join_element_wise(_text("{"), body, _text("}"), _text("")).to_numpy(zero_copy_only=False)


def spark_json_lines(spark: SparkSession, frame: pd.DataFrame, columns: Sequence[str]) -> np.ndarray:
    """The same lines from Spark's ``to_json`` (one job): every type Spark has."""
    data = to_spark(spark, frame[list(columns)])
    lines = data.select(F.to_json(F.struct(*[data[c] for c in columns]), JSON_OPTIONS))
    return computed(lambda: lines.toArrow()).column(0).to_numpy(zero_copy_only=False)


def _texts(spark: SparkSession, array: pa.Array) -> pa.Array | None:
    """Each value's JSON text (null for null) as a ``large_string`` array, or None when the type is not
    one written here."""
    kind = array.type
    if pa.types.is_floating(kind):
        return _with_nulls(array, _java_numbers(spark, array))
    if pa.types.is_integer(kind) or pa.types.is_boolean(kind):  # decimal digits; true, false
        return array.cast(pa.large_string())
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        text = array.cast(pa.large_string())
        if pc.any(pc.match_substring_regex(text, _NEEDS_ESCAPE.pattern)).as_py():
            return _column([None if v is None else _string(v) for v in text.to_pylist()])
        return pc.binary_join_element_wise(_text('"'), text, _text('"'), _text(""))
    if pa.types.is_decimal(kind):
        return _column([None if v is None else str(v) for v in array.to_pylist()])
    if pa.types.is_timestamp(kind) and kind.tz in ("UTC", "+00:00", "Etc/UTC"):
        return _calendar(array.cast(pa.int64()).to_pylist(), with_time=True)
    if pa.types.is_date32(kind):
        days = array.cast(pa.int32()).to_pylist()
        return _calendar([None if d is None else d * _DAY for d in days], with_time=False)
    return None


def _text(value: str | None) -> pa.Scalar:
    return pa.scalar(value, pa.large_string())


def _column(texts: list[str | None]) -> pa.Array:
    return pa.array(texts, pa.large_string())


def _with_nulls(array: pa.Array, texts: pa.Array) -> pa.Array:
    return pc.if_else(array.is_null(), _text(None), texts) if array.null_count else texts


def _java_numbers(spark: SparkSession, array: pa.Array) -> pa.Array:
    """Java's own notation for each value: the values cross to the driver's JVM as big-endian bytes in
    one call, and ``java.util.Arrays.toString`` formats them with ``Double.toString``/``Float.toString``;
    Arrow splits the one string it returns."""
    if not len(array):
        return _column([])
    single = array.type == pa.float32()
    values = pc.fill_null(array, 0).to_numpy(zero_copy_only=False).astype(">f4" if single else ">f8")
    jvm, gateway = spark._jvm, spark.sparkContext._gateway  # noqa: SLF001 - PySpark's JVM handle
    assert jvm is not None and gateway is not None
    buffer = jvm.java.nio.ByteBuffer.wrap(bytearray(values.tobytes()))
    numbers = gateway.new_array(gateway.jvm.float if single else gateway.jvm.double, len(values))
    (buffer.asFloatBuffer() if single else buffer.asDoubleBuffer()).get(numbers)
    listed = str(jvm.java.util.Arrays.toString(numbers))
    texts = pc.split_pattern(pa.array([listed[1:-1]], pa.large_string()), ", ").values
    if "N" in listed or "I" in listed:  # NaN, Infinity: Jackson writes them as strings
        texts = pc.replace_substring_regex(texts, "^(NaN|-?Infinity)$", '"\\1"')
    return texts


def _string(value: str) -> str:
    return '"' + _NEEDS_ESCAPE.sub(lambda m: _escape(m.group()), value) + '"'


def _escape(char: str) -> str:
    return _ESCAPES.get(char) or f"\\u{ord(char):04X}"


def _calendar(micros: list[int | None], with_time: bool) -> pa.Array | None:
    """Texts of a timestamp or date column (microseconds since the epoch), or None if a value lies outside
    years 1-9999 (Spark's ``yyyy`` signs years beyond them, and Python's calendar stops there: such a
    batch goes to Spark)."""
    out: list[str | None] = []
    for count in micros:
        if count is None:
            out.append(None)
        elif _FIRST <= count <= _LAST:
            out.append(_format(_EPOCH + datetime.timedelta(microseconds=count), with_time))
        else:
            return None
    return _column(out)


def _format(moment: datetime.datetime, with_time: bool) -> str:
    day = f"{moment.year:04d}-{moment.month:02d}-{moment.day:02d}"
    if not with_time:
        return f'"{day}"'
    return f'"{day}T{moment.hour:02d}:{moment.minute:02d}:{moment.second:02d}.{moment.microsecond:06d}Z"'
