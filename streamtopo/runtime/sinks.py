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

A write that fails (a directory that cannot be created, a read-only or full disk) raises
:class:`SinkWriteError`, not the ``OSError`` the executor retries as a lost transport: retrying cannot
fix it, so the executor exits with a message naming the path and the reason, and ``streamtopo run``
checks every file sink's directory before it starts anything (:func:`check_writable`).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from streamtopo.planner.model import Operator, StreamTopologySpec
from streamtopo.runtime.operators.records import TS


def sink_file(output_dir: Path, op: Operator, kg: int) -> Path:
    """``<output>/<sink.file.path or operator name>/kg-0007.jsonl``."""
    name = (op.sink.file.path if op.sink and op.sink.file and op.sink.file.path else None) or op.name
    return Path(output_dir) / name / f"kg-{kg:04d}.jsonl"


class SinkWriteError(Exception):
    """A file sink cannot write (not an OSError on purpose: the executor retries those as a lost transport)."""

    def __init__(self, path: Path, error: OSError):
        self.path, self.reason = Path(path), error.strerror or str(error)
        super().__init__(f"cannot write file sink output {self.path}: {self.reason}")


def write_at(path: Path, offset: int, data: bytes) -> None:
    """Write ``data`` at ``offset`` (pwrite: no append race, idempotent for identical bytes)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            view = memoryview(data)
            while view:
                written = os.pwrite(fd, view, offset)
                view, offset = view[written:], offset + written
        finally:
            os.close(fd)
    except OSError as error:
        raise SinkWriteError(Path(error.filename or path), error) from None


def redo(path: Path, sink_len: int, pending: bytes) -> None:
    """Bring the file to its committed content: rewrite the last commit's bytes, cut anything beyond."""
    write_at(path, sink_len - len(pending), pending)
    try:
        os.truncate(path, sink_len)
    except OSError as error:
        raise SinkWriteError(path, error) from None


def check_writable(directory: Path) -> None:
    """Create ``directory`` and write a file in it, so a sink that cannot write fails before a run starts,
    not after its executors started (SinkWriteError naming the path and the reason)."""
    try:
        Path(directory).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory) as probe:
            probe.write(b"streamtopo write check\n")
            probe.flush()
    except OSError as error:
        raise SinkWriteError(directory, error) from None


def check_outputs(spec: StreamTopologySpec, output_dir: Path) -> None:
    """:func:`check_writable` for the directory of every file sink of ``spec``."""
    for op in spec.operators:
        if op.sink is not None and op.sink.file is not None:
            check_writable(sink_file(output_dir, op, 0).parent)


def lines_bytes(lines: list[str]) -> bytes:
    """Each line ended by a newline (one join: no string per line)."""
    return ("\n".join(lines) + "\n").encode() if lines else b""


def last_records(output_dir: Path, spec: StreamTopologySpec, op: Operator, n: int) -> list[dict[str, Any]]:
    """The ``n`` latest records of a file sink by event time (``_ts``), read from its files' ends only.

    A key group's file is in commit order, so its last ``n`` lines hold its latest records: a summary can
    show a sink's newest output without reading millions of lines.
    """
    lines = [
        line
        for kg in range(spec.key_groups_of(op.name))
        for line in tail_lines(sink_file(output_dir, op, kg), n)
    ]
    records = [json.loads(line) for line in lines]
    records.sort(key=lambda r: r[TS] if isinstance(r.get(TS), int | float) else float("-inf"))
    return records[-n:]


def tail_lines(path: Path, n: int, block: int = 65536) -> list[str]:
    """The last ``n`` lines of a text file (none if it does not exist), reading whole blocks from its end."""
    if n <= 0:
        return []
    try:
        with open(path, "rb") as f:
            end = f.seek(0, os.SEEK_END)
            data = b""
            while end > 0 and data.count(b"\n") <= n:
                start = max(0, end - block)
                f.seek(start)
                data = f.read(end - start) + data
                end = start
    except FileNotFoundError:
        return []
    return [line.decode() for line in data.splitlines()[-n:] if line.strip()]
