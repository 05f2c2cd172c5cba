"""Measure Aeolus' n (CPU seconds per message) and s (CPU seconds per byte) through Valkey on this machine.

Aeolus (ICDE 2014, Section II.1) models shipping one message of ``b`` records of ``t`` bytes as costing
``n + b * t * s``: a fixed per-message part ``n`` and a per-byte part ``s``. We measure exactly the work
the executor does per entry: encode a pandas batch as Arrow IPC, XADD it, XRANGE it back, decode it.
CPU time of this process (the client side; the server's share is not attributed) is measured for
entries of several sizes, and ``n`` and ``s`` are the intercept and slope of a least-squares line of
seconds per message over bytes per message. ``CommCostModel(per_record=n, per_byte=s)`` takes them.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import cast

import numpy as np
import pandas as pd

from streamtopo.runtime.embedded import EmbeddedValkey
from streamtopo.runtime.transport import Entry, append, connect, entry_fields

SIZES = (1, 8, 64, 512, 4096)
"""Records per message measured (48-byte sequence-like records)."""


@dataclass(frozen=True)
class Calibration:
    per_message: float
    """n: CPU seconds per message."""
    per_byte: float
    """s: CPU seconds per byte."""
    points: list[tuple[int, int, float]]
    """(records per message, bytes per message, CPU seconds per message) measured."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)


def _records(n: int) -> pd.DataFrame:
    seq = np.arange(n, dtype=np.int64)
    return pd.DataFrame(
        {"seq": seq, "key": seq % 97, "value": seq, "_ts": seq / 1000.0, "_kg": np.zeros(n, dtype=np.int32)}
    )


def measure(url: str, sizes: tuple[int, ...] = SIZES, budget: float = 0.5) -> Calibration:
    """Round trips per size for about ``budget`` CPU seconds each; fit n and s."""
    client = connect(url)
    points = []
    for size in sizes:
        frame = _records(size)
        stream = f"st:{{calibrate}}:s:{size}"
        client.delete(stream)
        done, started = 0, time.process_time()
        nbytes = 0
        while time.process_time() - started < budget or done < 5:
            fields = entry_fields("calibrate/0", done + 1, 0.0, frame)
            nbytes = sum(len(f) for f in fields)
            entry_id = append(client, stream, fields)
            [(raw_id, raw)] = cast(
                list[tuple[bytes, dict[bytes, bytes]]], client.xrange(stream, entry_id, entry_id)
            )
            Entry.parse(raw_id, raw).records()
            done += 1
        points.append((size, nbytes, (time.process_time() - started) / done))
        client.delete(stream)
    x = np.array([p[1] for p in points], dtype=float)
    y = np.array([p[2] for p in points], dtype=float)
    slope, intercept = np.polyfit(x, y, 1)
    return Calibration(per_message=max(float(intercept), 0.0), per_byte=max(float(slope), 0.0), points=points)


def calibrate(url: str | None = None, output: Path | None = None) -> Calibration:
    """Measure against ``url``, or against a private embedded Valkey when none is given."""
    if url is None:
        with EmbeddedValkey() as valkey:
            result = measure(valkey.url)
    else:
        result = measure(url)
    if output is not None:
        Path(output).write_text(result.to_json())
    return result
