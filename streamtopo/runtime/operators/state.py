"""Operator state as bytes, so a key group's state can live in Valkey and move between executors.

State is a few named tables plus a little scalar metadata. Tables travel as Arrow IPC streams (typed,
columnar, zero-copy to pandas, the same format as the records on the transport); the metadata as JSON.
Layout: ``MAGIC | u32 header length | JSON header | IPC blob ...``, the header listing
``{"meta": {...}, "frames": [[name, blob length], ...]}``.
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import pandas as pd
import pyarrow as pa

from streamtopo.runtime.operators.records import from_arrow, to_arrow

MAGIC = b"STST1"


def frame_to_ipc(df: pd.DataFrame | pa.Table) -> bytes:
    """One pandas DataFrame (index dropped) or Arrow table as an Arrow IPC stream.

    Converting pandas to Arrow costs a few milliseconds per call whatever the size, so a caller cutting a
    frame into many entries converts it once and passes zero-copy slices of the table."""
    table = df if isinstance(df, pa.Table) else to_arrow(df)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def ipc_to_table(blob: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(blob)).read_all()


def ipc_to_frame(blob: bytes) -> pd.DataFrame:
    return from_arrow(ipc_to_table(blob))


def _json_safe(value: Any) -> Any:
    """JSON has no infinities; watermarks are +-inf at the ends of a stream."""
    if isinstance(value, float) and math.isinf(value):
        return {"inf": 1 if value > 0 else -1}
    return value


def _from_json(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"inf"}:
        return math.inf * value["inf"]
    return value


def encode_frames(frames: dict[str, pd.DataFrame], meta: dict[str, Any] | None = None) -> bytes:
    blobs = {name: frame_to_ipc(df) for name, df in frames.items()}
    header = json.dumps(
        {
            "meta": {k: _json_safe(v) for k, v in (meta or {}).items()},
            "frames": [[name, len(blob)] for name, blob in blobs.items()],
        }
    ).encode()
    return b"".join([MAGIC, struct.pack("<I", len(header)), header, *blobs.values()])


def decode_frames(data: bytes) -> tuple[dict[str, pd.DataFrame], dict[str, Any]]:
    if not data.startswith(MAGIC):
        raise ValueError("not a streamtopo operator state (bad magic)")
    (length,) = struct.unpack_from("<I", data, len(MAGIC))
    offset = len(MAGIC) + 4
    header = json.loads(data[offset : offset + length])
    offset += length
    frames = {}
    for name, size in header["frames"]:
        frames[name] = ipc_to_frame(data[offset : offset + size])
        offset += size
    return frames, {k: _from_json(v) for k, v in header["meta"].items()}
