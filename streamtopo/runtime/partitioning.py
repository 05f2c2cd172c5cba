"""Key groups: which key group of a downstream operator a record goes to.

A key group is ``hash(key) mod K``. The hash must agree in every process on every machine (a key group
that moves must keep receiving the same keys), so Python's salted ``hash()`` is out;
``pandas.util.hash_pandas_object`` uses a fixed key (SipHash with a constant) and is stable across
processes and runs. It is dtype-sensitive (``5`` and ``5.0`` hash differently), so keys are first brought
to a canonical form: every numeric or boolean key becomes float64, any string dtype becomes object. Two
upstream operators that carry the same key with different numeric types (the two sides of a join) then
still meet in the same key group. (Integers beyond 2**53 may share a float and so a key group: harmless,
a key group holds many keys anyway, and equal keys still always meet.)
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from pandas.api import types as ptypes

from streamtopo.planner.graph import partition_key

__all__ = ["canonical_keys", "key_hash", "partition_key", "route"]
# partition_key (keyBy, else inherited through a single non-source input, else None) is the planner's
# function: the runtime must route exactly as the planner's unit graph assumes, so there is one copy.


def canonical_keys(df: pd.DataFrame, key: tuple[str, ...]) -> pd.DataFrame:
    """The key columns in the canonical dtypes the hash is computed on (see the module docstring)."""
    missing = [c for c in key if c not in df.columns]
    if missing:
        raise ValueError(f"keyBy: column(s) {', '.join(missing)} not in the records (have: {', '.join(df.columns)})")
    out = {}
    for column in key:
        values = df[column]
        if ptypes.is_bool_dtype(values) or ptypes.is_numeric_dtype(values):
            values = values.astype(np.float64)
        elif ptypes.is_string_dtype(values) or ptypes.is_object_dtype(values):
            values = values.astype(object)
        out[column] = values.to_numpy()
    return pd.DataFrame(out)


def key_hash(df: pd.DataFrame, key: tuple[str, ...]) -> np.ndarray:
    """uint64 hash of each record's key, identical in every process."""
    return pd.util.hash_pandas_object(canonical_keys(df, key), index=False).to_numpy()


def route(df: pd.DataFrame, dest_key: tuple[str, ...] | None, dest_k: int, src_kg: int) -> np.ndarray:
    """Destination key group of every record of ``df``.

    Keyed destination: ``hash(key) mod dest_k``. Unkeyed: ``src_kg mod dest_k``, a forward edge that keeps
    a producer's records together (and its order) on one consumer unit.
    """
    if dest_k < 1:
        raise ValueError(f"keyGroups must be at least 1, got {dest_k}")
    if dest_key is None:
        return np.full(len(df), src_kg % dest_k, dtype=np.int32)
    if len(df) == 0:
        return np.zeros(0, dtype=np.int32)
    return (key_hash(df, dest_key) % np.uint64(dest_k)).astype(np.int32)
