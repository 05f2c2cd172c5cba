"""File sinks' files: a key group's committed bytes land in exactly one file, never after a hole of NULs,
whichever directory its owner writes in (runtime/sinks.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamtopo.runtime import sinks


def files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.fixture
def first(tmp_path: Path) -> Path:
    return tmp_path / "out" / "kg-0003.jsonl"


def test_a_first_owner_writes_its_commit_into_the_first_file(first: Path) -> None:
    segment = sinks.resume(first, 5, b"a\nbb\n")
    assert (segment.path, segment.base) == (first, 0)
    assert files(first.parent) == {"kg-0003.jsonl": b"a\nbb\n"}


def test_an_owner_finding_the_prefix_rewrites_the_last_commit_and_cuts_what_was_never_committed(
    first: Path,
) -> None:
    """A crash after the commit of b"cc\\n" wrote half of it and a later, uncommitted step's bytes."""
    first.parent.mkdir(parents=True)
    first.write_bytes(b"a\nbb\nc?xxxxxxx")
    segment = sinks.resume(first, 8, b"cc\n")
    assert segment.base == 0
    assert files(first.parent) == {"kg-0003.jsonl": b"a\nbb\ncc\n"}
    segment.write(8, b"d\n")
    assert first.read_bytes() == b"a\nbb\ncc\nd\n"


@pytest.mark.parametrize("here", [None, b"a\n"], ids=["no file", "a shorter file"])
def test_an_owner_without_the_prefix_goes_on_in_a_segment_from_it(first: Path, here: bytes | None) -> None:
    """The key group's 1,000 bytes before the last commit were written on another pod (or the file was
    deleted): the commit and what follows go to a segment from byte 1,000, no NULs in front of them."""
    if here is not None:
        first.parent.mkdir(parents=True)
        first.write_bytes(here)
    segment = sinks.resume(first, 1004, b"ee\nf")
    segment.write(1004, b"g\n")
    name = "kg-0003_00000000000000001000.jsonl"
    assert segment.path.name == name and segment.base == 1000
    assert files(first.parent) == {**({"kg-0003.jsonl": here} if here else {}), name: b"ee\nfg\n"}
    assert b"\0" not in b"".join(files(first.parent).values())


def test_an_owner_that_wrote_a_segment_here_goes_on_in_it(first: Path) -> None:
    """Back on a pod that already holds a segment reaching the prefix: no new file."""
    first.parent.mkdir(parents=True)
    first.write_bytes(b"x\n")
    sinks.segment_path(first, 500).write_bytes(b"a\nb\n")
    segment = sinks.resume(first, 506, b"c\n")
    assert segment.base == 500
    assert files(first.parent) == {
        "kg-0003.jsonl": b"x\n",
        "kg-0003_00000000000000000500.jsonl": b"a\nb\nc\n",
    }


def test_a_file_deleted_while_its_owner_runs_goes_on_in_a_segment(first: Path) -> None:
    segment = sinks.resume(first, 3, b"ab\n")
    first.unlink()
    segment.write(3, b"cd\n")
    assert files(first.parent) == {"kg-0003_00000000000000000003.jsonl": b"cd\n"}


def test_segments_beyond_the_prefix_belong_to_an_earlier_epoch_and_go(first: Path) -> None:
    """A file sink reset to offset 0 (an upgrade's new path, moved back): the first file holds the
    prefix, and the old segment past it would read as output after it."""
    first.parent.mkdir(parents=True)
    first.write_bytes(b"old\nold\n")
    sinks.segment_path(first, 300).write_bytes(b"old\n")
    sinks.resume(first, 2, b"n\n")
    assert files(first.parent) == {"kg-0003.jsonl": b"n\n"}


def test_segments_read_in_name_order_are_the_output_in_order(first: Path) -> None:
    """Names sort as offsets do (zero-padded), the first file before its segments, key groups apart."""
    first.parent.mkdir(parents=True)
    for base in (0, 7, 10_000, 123):
        sinks.segment_path(first, base).write_bytes(b"")
    (first.parent / "kg-0004.jsonl").write_bytes(b"")
    (first.parent / "kg-0003.json").write_bytes(b"")  # not a segment
    assert [b for b, _ in sinks.segments(first)] == [0, 7, 123, 10_000]
    assert [p for _, p in sinks.segments(first)] == sorted(p for _, p in sinks.segments(first))


def test_the_last_lines_of_a_key_group_span_its_segments(first: Path) -> None:
    first.parent.mkdir(parents=True)
    first.write_bytes(b"1\n2\n")
    sinks.segment_path(first, 50).write_bytes(b"3\n")
    assert sinks.last_lines(first, 2) == ["2", "3"]
    assert sinks.last_lines(first, 5) == ["1", "2", "3"]


def test_tiling_reads_overlaps_once_and_refuses_gaps_and_disagreements() -> None:
    """The receiver rewrites the last commit's bytes ("c\\n") that the donor had written on its pod too."""
    assert sinks.tile([(4, b"c\nd\n"), (0, b"a\nb\nc\n")]) == b"a\nb\nc\nd\n"
    assert sinks.tile([(0, b"a\n"), (2, b"b\n")]) == b"a\nb\n"
    assert sinks.tile([]) == b""
    with pytest.raises(ValueError, match="no file holds bytes 2 to 4"):
        sinks.tile([(0, b"a\n"), (4, b"c\n")])
    with pytest.raises(ValueError, match="from byte 2 disagrees"):
        sinks.tile([(0, b"a\nb\n"), (2, b"x\n")])
