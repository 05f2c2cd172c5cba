"""What every benchmark shares: the header of its record and its own section of docs/benchmarks.md.

Each bench rewrites only its ``## <title>`` section, so benches run at different times keep one file of
results, each with the command, machine and date that produced it.
"""

from __future__ import annotations

import os
import platform
import re
import statistics
import tempfile
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "docs" / "benchmarks.md"


def header(command: str, machine_note: str = "") -> list[str]:
    """Command, machine and date lines (markdown hard breaks) for a section."""
    machine = (
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}"
    )
    return [
        f"Command: `{command}`  ",
        f"Machine: {machine}{', ' + machine_note if machine_note else ''}  ",
        f"Date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
    ]


def markdown(columns: Sequence[str], rows: Sequence[Sequence[object]], digits: int = 3) -> list[str]:
    """A markdown table; floats get ``digits`` decimals."""

    def cell(value: object) -> str:
        return f"{value:.{digits}f}" if isinstance(value, float) else str(value)

    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)] + [
        "| " + " | ".join(cell(v) for v in row) + " |" for row in rows
    ]


def spread_cells(runs: Sequence[float], base: float, scale: float, fmt: str) -> tuple[str, str, str]:
    """Table cells of repeated measurements: the median and min-max, each times ``scale`` (e.g. 1e9 /
    records: ns per record) formatted with ``fmt``, and the median against ``base`` (another median)."""
    med = statistics.median(runs)
    return (
        f"{scale * med:{fmt}}",
        f"{scale * min(runs):{fmt}}-{scale * max(runs):{fmt}}",
        f"{med / base:.2f}x",
    )


def image_dir(no_write: bool) -> Path:
    """Where a bench draws its plot: docs/img, or the temp directory for a run that leaves docs/ alone."""
    return Path(tempfile.gettempdir()) if no_write else ROOT / "docs" / "img"


def section_image(section: str, title: str, stem: str) -> Path:
    """docs/img/``stem``.png for a bench's own section ``title``, or a name made from ``section`` when a run
    writes a section of its own (``--section``), so it does not draw over the plot the other section shows."""
    if section != title:
        stem += "_" + "_".join(re.findall(r"[a-z0-9]+", section.lower()))
    return ROOT / "docs" / "img" / f"{stem}.png"


def publish(title: str, lines: Sequence[str], image: Path, no_write: bool, console: Any) -> None:
    """Print a bench's section, then write it into docs/benchmarks.md unless ``no_write``; say where the
    plot ``image`` (drawn under :func:`image_dir`) and the section went."""
    console.print("\n".join(lines), markup=False, soft_wrap=True)
    if no_write:
        console.print(f"plot: {image}; docs/benchmarks.md left alone")
    else:
        write_section(title, lines)
        console.print(f"wrote docs/img/{image.name} and the section {title!r} of docs/benchmarks.md")


def median_range(values: Sequence[float], fmt: Callable[[float], str] = "{:.2f}".format) -> str:
    """``median (min-max)`` of repeated figures (seeds, runs), each written by ``fmt``: how the multi-seed
    sections show a figure's spread."""
    return f"{fmt(statistics.median(values))} ({fmt(min(values))}-{fmt(max(values))})"


def over_repeats(
    name: str, per_repeat: Sequence[tuple[str, bool, str]], what: str, unit: str = "seed"
) -> str:
    """A target over repeated runs (seeds, batches of seeds), each ``(label, met, figures)``: met on every
    run, on k of n, or MISSED on every run, then every run's figures (``what`` says what they are), so a
    miss reads as one beside the numbers behind it."""
    met = sum(ok for _, ok, _ in per_repeat)
    head = (
        f"met on every {unit}"
        if met == len(per_repeat)
        else f"MISSED on every {unit}"
        if met == 0
        else f"met on {met} of {len(per_repeat)} {unit}{'es' if unit.endswith('h') else 's'}"
    )
    detail = ", ".join(f"{unit} {label} {text}" for label, _, text in per_repeat)
    return f"- {name}: **{head}**; {what}: {detail}"


def read_section(title: str, path: Path = BENCHMARKS) -> list[str]:
    """The lines under ``## title`` (heading and the blank line after it excluded; empty when absent), so a
    bench that re-measures one part of its section can keep the rest as it was recorded."""
    lines = path.read_text().splitlines() if path.exists() else []
    head = f"## {title}"
    if head not in lines:
        return []
    start = lines.index(head) + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("## ")), len(lines))
    body = lines[start:end]
    while body and not body[0].strip():
        body = body[1:]
    while body and not body[-1].strip():
        body = body[:-1]
    return body


def write_section(title: str, lines: Sequence[str], path: Path = BENCHMARKS) -> None:
    """Replace the ``## title`` section of ``path`` (or append it), leaving every other section alone."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    head = f"## {title}"
    body = "\n".join([head, "", *lines]).rstrip() + "\n"
    all_lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(all_lines) if line.rstrip("\n") == head), None)
    if start is None:
        path.write_text(text.rstrip() + "\n\n" + body)
        return
    end = next(
        (i for i in range(start + 1, len(all_lines)) if all_lines[i].startswith("## ")), len(all_lines)
    )
    tail = "".join(all_lines[end:])
    path.write_text("".join(all_lines[:start]) + body + ("\n" + tail if tail else ""))


def verdict(ours: Sequence[float], theirs: Sequence[float]) -> tuple[str, str]:
    """Whether ``ours`` is ahead of ``theirs`` over the repeats of both: ``beat`` when every run of ours is
    above every run of theirs, ``miss`` when every one is below, else ``match`` (the ranges overlap, so
    the runs cannot tell the two apart); with the reason, in numbers."""
    low, high = min(ours), max(ours)
    if low > max(theirs):
        return (
            "beat",
            f"the worst of {len(ours)} runs ({low:,.0f}) above the best of {len(theirs)} ({max(theirs):,.0f})",
        )
    if high < min(theirs):
        return (
            "miss",
            f"the best of {len(ours)} runs ({high:,.0f}) below the worst of {len(theirs)} ({min(theirs):,.0f})",
        )
    return (
        "match",
        f"the ranges overlap: {low:,.0f}-{high:,.0f} against {min(theirs):,.0f}-{max(theirs):,.0f}",
    )


def save_figure(fig: Any, path: Path, dpi: int = 100) -> str:
    """Lay ``fig`` out, write it to ``path`` (its directory made) and close it; the file's name, for the
    section's image link."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path.name


def stop_if_interrupted(summary: Any) -> None:
    """End the benchmark when the run it called was stopped by Ctrl-C or SIGTERM (``RunSummary.interrupted``):
    the runner catches the signal to tear its run down, and a bench that went on would start the next run."""
    if summary.interrupted:
        raise SystemExit("interrupted")
