"""Key groups: which key group of a downstream operator a record goes to.

A key group is ``pmod(hash(key), K)``. The hash must agree in every process on every machine (a key group
that moves must keep receiving the same keys), so Python's salted ``hash()`` is out. It must also agree
between the two places records are routed: pandas frames in the executor (:func:`route`) and lazy Spark
DataFrames that never leave the JVM (:func:`route_column`). So the hash is Spark's own ``hash()``
(``Murmur3Hash``: Murmur3_x86_32, seed 42, key columns folded left to right, each column's hash the seed
of the next, a null column leaving the running hash unchanged), and :func:`key_hash` re-implements it in
vectorised numpy, bit for bit.

Both sides hash a canonical form of the key, so equal keys meet whatever their types (the two sides of a
join may carry ``5``, ``5.0``, an int32 or an int64 5):

* every numeric or boolean key becomes a double (integers beyond 2**53 may share a double and so a key
  group: harmless, a key group holds many keys anyway, and equal keys still always meet); ``-0.0`` and
  ``0.0`` hash alike (Spark normalises ``-0.0``);
* NaN and null are both null, and a null column is skipped by the hash;
* strings stay strings, hashed as their UTF-8 bytes.

Unsupported, on both sides: dates, timestamps, timedeltas, decimals, binary, nested and collated (non
UTF8_BINARY) strings, mixed-type object columns. Their canonical form would need exact agreement on
time zones, units or scale between pandas and Spark that nothing enforces, and keys of these types are
rare; cast them (to a string or a number) before ``keyBy``. :func:`route` raises ValueError naming
``keyBy``, the column and its type; :func:`route_column` fails when Spark runs it: via ``raise_error``
naming the same (timestamps, decimals, collated strings), or at analysis, since Spark cannot cast
dates, binary or nested values to double.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pandas.api import types as ptypes
from pyspark.sql import Column
from pyspark.sql import functions as F

from streamtopo.planner.graph import partition_key
from streamtopo.planner.murmur3 import SEED, hash_bytes, hash_doubles

__all__ = ["key_hash", "partition_key", "route", "route_column", "spark_key_kind", "unsupported_key"]
# partition_key (keyBy, else inherited through a single non-source input, else None) is the planner's
# function: the runtime must route exactly as the planner's unit graph assumes, so there is one copy.

# Spark type names (typeof) hashed as doubles; 'void' is an all-null column.
_SPARK_NUMERIC = ("tinyint", "smallint", "int", "bigint", "float", "double", "boolean", "void")
# pandas.api.types.infer_dtype results of object columns that canonicalise to doubles.
_OBJECT_NUMERIC = ("boolean", "integer", "floating", "mixed-integer-float", "empty")


def _hash_strings(values: pd.Series, h: np.ndarray) -> np.ndarray:
    """Spark's hash of a string column with per-row seeds ``h``; null rows keep their seed.

    Arrow dictionary-encodes the column (its UTF-8 bytes come for free, and unlike ``pd.factorize``,
    which stops at a NUL character, it keeps ``"a"`` and ``"a\\x00"`` apart). Each distinct (seed, string)
    pair is then hashed once: for the first key column that is each distinct string (the seed is 42
    everywhere), so a batch costs one encoding pass plus work per distinct value."""
    array = pa.array(values, type=pa.large_string(), from_pandas=True)
    encoded = (array.combine_chunks() if isinstance(array, pa.ChunkedArray) else array).dictionary_encode()
    uniques = encoded.dictionary
    offsets = np.frombuffer(uniques.buffers()[1], dtype=np.int64)[
        uniques.offset : uniques.offset + len(uniques) + 1
    ]
    data = uniques.buffers()[2]
    flat = np.concatenate(
        [
            np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8),
            np.zeros(3, np.uint8),
        ]
    )
    starts, lengths = offsets[:-1], np.diff(offsets)
    codes = pc.fill_null(encoded.indices, -1).to_numpy()
    present = codes >= 0
    out = h.copy()
    if not present.any():
        return out
    seeds, rows = h[present], codes[present]
    if (seeds == seeds[0]).all():
        out[present] = hash_bytes(flat, starts, lengths, np.full(len(uniques), seeds[0]))[rows]
        return out
    pairs, inverse = np.unique(
        (seeds.astype(np.uint64) << np.uint64(32)) | rows.astype(np.uint64), return_inverse=True
    )
    code = (pairs & np.uint64(0xFFFFFFFF)).astype(np.int64)
    hashed = hash_bytes(flat, starts[code], lengths[code], (pairs >> np.uint64(32)).astype(np.uint32))
    out[present] = hashed[inverse]
    return out


# ------------------------------------------------------------------------------- canonical form


def _unsupported(column: str, kind: object) -> ValueError:
    return ValueError(f"keyBy: {unsupported_key(column, kind)}")


def unsupported_key(column: str, kind: object) -> str:
    return (
        f"column {column!r} has type {kind}, which has no pandas/Spark-identical key-group hash; "
        "supported: numbers, booleans, strings (cast the key first)"
    )


def spark_key_kind(type_name: str) -> str | None:
    """How a key column of Spark type ``type_name`` (``typeof``, ``DataType.simpleString``) is hashed:
    as a ``double``, a ``string``, or not at all (None: routing refuses it)."""
    return "double" if type_name in _SPARK_NUMERIC else "string" if type_name == "string" else None


def _canonical(values: pd.Series, column: str) -> tuple[str, np.ndarray | pd.Series]:
    """('double', float64 array with NaN for null) or ('string', the column), per the module docstring."""
    dtype = values.dtype
    if isinstance(dtype, pd.ArrowDtype):  # records as the executor holds them (records.py)
        kind = dtype.pyarrow_dtype
        if pa.types.is_string(kind) or pa.types.is_large_string(kind):
            return "string", values
        if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
            return "double", values.to_numpy(dtype=np.float64, na_value=np.nan)
        if pa.types.is_null(kind):
            return "double", np.full(len(values), np.nan)
        raise _unsupported(column, kind)
    if ptypes.is_bool_dtype(dtype) or (ptypes.is_numeric_dtype(dtype) and not ptypes.is_complex_dtype(dtype)):
        return "double", values.to_numpy(dtype=np.float64, na_value=np.nan)
    if isinstance(dtype, pd.StringDtype):
        return "string", values
    if ptypes.is_object_dtype(dtype) or isinstance(dtype, pd.CategoricalDtype):
        objects = values.to_numpy(dtype=object)
        kind = ptypes.infer_dtype(objects, skipna=True)
        if kind == "string":
            return "string", pd.Series(objects, copy=False)
        if kind in _OBJECT_NUMERIC:
            array = pd.array(objects) if kind != "empty" else pd.array(objects, dtype="Float64")
            if ptypes.is_bool_dtype(array.dtype) or ptypes.is_numeric_dtype(array.dtype):
                return "double", array.to_numpy(dtype=np.float64, na_value=np.nan)
        raise _unsupported(column, f"object ({kind})")
    raise _unsupported(column, dtype)


def key_hash(df: pd.DataFrame, key: tuple[str, ...]) -> np.ndarray:
    """Spark's ``hash(canonical key columns...)`` of every record, as int32, identical in every process."""
    missing = [c for c in key if c not in df.columns]
    if missing:
        raise ValueError(
            f"keyBy: column(s) {', '.join(missing)} not in the records (have: {', '.join(df.columns)})"
        )
    h = np.full(len(df), SEED, dtype=np.uint32)
    for column in key:
        kind, values = _canonical(df[column], column)
        h = hash_doubles(values, h) if kind == "double" else _hash_strings(values, h)
    return h.view(np.int32)


def route(
    df: pd.DataFrame, dest_key: tuple[str, ...] | None, dest_k: int, src_kg: int | np.ndarray
) -> np.ndarray:
    """Destination key group (int32) of every record of ``df``; ``src_kg`` its producing unit (one for
    all, or one per record).

    Keyed destination: ``pmod(key_hash, dest_k)``. Unkeyed: ``src_kg mod dest_k``, a forward edge that
    keeps a producer's records together (and its order) on one consumer unit.
    """
    if dest_k < 1:
        raise ValueError(f"keyGroups must be at least 1, got {dest_k}")
    if dest_key is None:
        return (np.broadcast_to(np.asarray(src_kg, dtype=np.int64), (len(df),)) % dest_k).astype(np.int32)
    return np.mod(key_hash(df, dest_key), np.int32(dest_k))  # numpy's mod of ints is Spark's pmod


# ------------------------------------------------------------------------------------ Spark side


def _spark_canonical(column: str) -> tuple[Column, Column]:
    """(double-or-null, string-or-null) for one key column: whichever applies to its type carries the
    value, the other is null and so skipped by the hash. ``typeof`` is foldable, so Spark's optimizer
    drops the branch that does not apply."""
    c, kind = F.col(column), F.typeof(F.col(column))
    as_double = c.cast("double")
    double = (
        F.when(kind.isin(*_SPARK_NUMERIC), F.when(~F.isnan(as_double), as_double))
        .when(kind == "string", F.lit(None))
        .otherwise(
            F.raise_error(
                F.concat(
                    F.lit(f"keyBy: column '{column}' has type "),
                    kind,
                    F.lit(
                        ", which has no pandas/Spark-identical key-group hash; "
                        "supported: numbers, booleans, strings"
                    ),
                )
            )
        )
    )
    return double, F.when(kind == "string", c.cast("string"))


def route_column(dest_key: tuple[str, ...] | None, dest_k: int, src_kg: int | Column) -> Column:
    """The Spark expression (int) giving each row exactly the key group :func:`route` gives it in pandas:
    ``pmod(hash(canonical key columns...), dest_k)``, or ``pmod(src_kg, dest_k)`` when unkeyed.
    ``src_kg`` is the producer's key group, an int or a column (e.g. ``F.col("_kg")``)."""
    if dest_k < 1:
        raise ValueError(f"keyGroups must be at least 1, got {dest_k}")
    if dest_key is None:
        kg = src_kg if isinstance(src_kg, Column) else F.lit(src_kg)
        return F.pmod(kg, F.lit(dest_k)).cast("int")
    parts = [part for column in dest_key for part in _spark_canonical(column)]
    return F.pmod(F.hash(*parts), F.lit(dest_k)).cast("int")
