"""Files generated from a source of truth (CRD, field reference, plain manifests) and their drift check.

Generators return :class:`Generated` values; the commands either write them or, with ``--check``,
list the ones whose committed copy differs, so CI and tests catch a model or chart change that was
not regenerated.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from streamtopo.controller.crd import CHART_DIR, CRD_FILENAME, render_crd
from streamtopo.controller.fieldtable import render_reference


@dataclass(frozen=True)
class Generated:
    """One generated file: where it goes (relative to the project root) and its text."""

    path: Path
    text: str


def stale_files(root: Path, files: list[Generated]) -> list[Path]:
    """Files under ``root`` that are missing or differ from ``files``."""
    return [
        root / f.path for f in files if not (root / f.path).is_file() or (root / f.path).read_text() != f.text
    ]


def write_files(root: Path, files: list[Generated]) -> list[Path]:
    """Write ``files`` under ``root``; returns the paths that changed."""
    changed = stale_files(root, files)
    for f in files:
        if root / f.path in changed:
            (root / f.path).parent.mkdir(parents=True, exist_ok=True)
            (root / f.path).write_text(f.text)
    return changed


def apply_or_check(root: Path, files: list[Generated], *, check: bool, fix: str) -> int:
    """The commands' shared body: write (printing what changed) or check; returns the exit code."""
    if check:
        stale = stale_files(root, files)
        for path in stale:
            print(f"out of date: {path} (run `{fix}`)")
        return 1 if stale else 0
    for path in write_files(root, files):
        print(f"wrote {path}")
    return 0


def generated_files() -> list[Generated]:
    """Every artifact derived from the model: both copies of the CRD and the field reference."""
    crd = render_crd()
    return [
        Generated(Path("crds") / CRD_FILENAME, crd),
        Generated(CHART_DIR / "crds" / CRD_FILENAME, crd),
        Generated(Path("docs/reference.md"), render_reference()),
    ]
