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

A key group's output is one byte sequence, but its owners need not share a directory: on Kubernetes each
executor pod writes to its own emptyDir, so a key group that moved in from another pod finds none of
the bytes committed before it here. Its first file, ``kg-0007.jsonl``, holds the bytes from offset 0;
an owner that does not find the committed bytes before its first write (:func:`resume`) goes on in a
segment ``kg-0007_<offset, 20 digits>.jsonl`` holding the bytes from that offset on, where writing at
the key group's offset into a shorter file would have left the missing bytes as NULs. Every committed
byte is in a file, and a file holding offset X holds the byte committed at X: two files overlap only
where an owner rewrote the last commit's bytes (the redo above) that the owner before had written on
its own pod, and there they agree. In one directory (``streamtopo run``) nothing overlaps and a key
group's files in name order are its output; across pods :func:`tile` puts the files together by their
offsets, as a Flink file sink's part files are read together.

A write that fails (a directory that cannot be created, a read-only or full disk) raises
:class:`SinkWriteError`, not the ``OSError`` the executor retries as a lost transport: retrying cannot
fix it, so the executor exits with a message naming the path and the reason, and ``streamtopo run``
checks every file sink's directory before it starts anything (:func:`check_writable`).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
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


SEGMENT = re.compile(r"(kg-\d{4})(?:_(\d{20}))?\.jsonl")
"""A key group's file: its first (from offset 0), or a segment from the offset in its name."""


def segment_path(first: Path, base: int) -> Path:
    """The file holding the key group's bytes from ``base`` on: ``first`` itself from 0."""
    return first if base == 0 else first.with_name(f"{first.stem}_{base:020d}{first.suffix}")


def segments(first: Path) -> list[tuple[int, Path]]:
    """The files of ``first``'s key group in its directory, as (offset of their first byte, path), in
    order."""
    try:
        names = os.listdir(first.parent)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        match = SEGMENT.fullmatch(name)
        if match and match.group(1) == first.stem:
            found.append((int(match.group(2) or 0), first.parent / name))
    return sorted(found)


def tile(pieces: list[tuple[int, bytes]]) -> bytes:
    """A key group's output from its files, wherever they were written: (offset of the first byte,
    content) each. Overlaps are the same bytes written twice and are read once; a gap (a file missing)
    or overlapping files that disagree raise ValueError naming the offset."""
    out = bytearray()
    for base, data in sorted(pieces):
        if base > len(out):
            raise ValueError(f"no file holds bytes {len(out)} to {base}")
        overlap = min(len(out) - base, len(data))
        if out[base : base + overlap] != data[:overlap]:
            raise ValueError(f"the file from byte {base} disagrees with the one before it")
        out += data[overlap:]
    return bytes(out)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return -1


@dataclass
class Segment:
    """Where this owner writes a key group's bytes: ``path`` holds them from offset ``base`` on."""

    first: Path
    base: int

    @property
    def path(self) -> Path:
        return segment_path(self.first, self.base)

    def write(self, offset: int, data: bytes) -> None:
        """``data`` at the key group's ``offset``; if the file lost the bytes before it meanwhile (deleted
        or cut by hand), in a new segment from ``offset``, not after a hole."""
        if _size(self.path) < offset - self.base:
            self.base = offset
        write_at(self.path, offset - self.base, data)


def resume(first: Path, sink_len: int, pending: bytes) -> Segment:
    """Bring a key group's output here to its committed content and say where its owner goes on.

    The bytes before the last commit's (``sink_len - len(pending)``: the prefix) are in the segment here
    that starts at or before the prefix and reaches it, if any: the last commit's bytes are rewritten
    there and anything beyond ``sink_len`` is cut (a crash after the commit, before or during its
    write). Where no file here holds the prefix (the key group ran on another pod, or its file was
    deleted), the output goes on in a new segment from the prefix. Later segments here are another
    epoch's (a file sink reset to offset 0 by an upgrade) and are removed: a segment starts at a prefix,
    and prefixes only grow, so no live owner writes one beyond this owner's."""
    prefix = sink_len - len(pending)
    found = segments(first)
    held = [base for base, path in found if base <= prefix <= base + _size(path)]
    segment = Segment(first, held[0] if held else prefix)
    for base, path in found:
        if base > segment.base:
            path.unlink(missing_ok=True)
    write_at(segment.path, prefix - segment.base, pending)
    try:
        os.truncate(segment.path, sink_len - segment.base)
    except OSError as error:
        raise SinkWriteError(segment.path, error) from None
    return segment


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

    A key group's files are in commit order, so its last ``n`` lines hold its latest records: a summary can
    show a sink's newest output without reading millions of lines.
    """
    lines = [
        line
        for kg in range(spec.key_groups_of(op.name))
        for line in last_lines(sink_file(output_dir, op, kg), n)
    ]
    records = [json.loads(line) for line in lines]
    records.sort(key=lambda r: r[TS] if isinstance(r.get(TS), int | float) else float("-inf"))
    return records[-n:]


def last_lines(first: Path, n: int) -> list[str]:
    """The last ``n`` lines of the key group whose first file is ``first``, over its segments here."""
    lines: list[str] = []
    for _, path in reversed(segments(first)):
        if len(lines) >= n:
            break
        lines = tail_lines(path, n - len(lines)) + lines
    return lines


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
