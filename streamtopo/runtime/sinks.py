"""Exactly-once file sinks: one JSON-lines file per key group, written *after* the commit (redo log).

A micro-batch's lines are committed first, inside the unit record (``UnitRecord.pending`` plus the new
``sink_len``), and only then written to the file at their committed offset. So

- a crash before the commit leaves nothing in the file that the replay will not rewrite identically
  (nothing was written);
- a crash after the commit but before (or during) the write is repaired by whoever acquires the key group
  next: :func:`redo` writes the committed pending bytes at their offset and truncates to ``sink_len``;
- a fenced zombie never writes: its commit is refused before it would write, and the only bytes an old
  owner can still be writing are the committed ones, at the committed offset: the same bytes the new
  owner writes there, so a late write changes nothing.

Readers trust a file up to the unit's committed ``sink_len`` (always the whole file once a run ended).
"""

from __future__ import annotations

import os
from pathlib import Path

from streamtopo.planner.model import Operator


def sink_file(output_dir: Path, op: Operator, kg: int) -> Path:
    """``<output>/<sink.file.path or operator name>/kg-0007.jsonl``."""
    name = (op.sink.file.path if op.sink and op.sink.file and op.sink.file.path else None) or op.name
    return Path(output_dir) / name / f"kg-{kg:04d}.jsonl"


def write_at(path: Path, offset: int, data: bytes) -> None:
    """Write ``data`` at ``offset`` (pwrite: no append race, idempotent for identical bytes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.pwrite(fd, view, offset)
            view, offset = view[written:], offset + written
    finally:
        os.close(fd)


def redo(path: Path, sink_len: int, pending: bytes) -> None:
    """Bring the file to its committed content: rewrite the last commit's bytes, cut anything beyond."""
    write_at(path, sink_len - len(pending), pending)
    os.truncate(path, sink_len)


def lines_bytes(lines: list[str]) -> bytes:
    return "".join(line + "\n" for line in lines).encode()
