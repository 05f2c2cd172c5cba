"""Benoit et al.'s Experiments 1-5 at several batches of instance seeds (issue 35).

    .venv/bin/python bench/sharing_seeds.py [--batches 5] [--runs 50] [--workers 1] [--no-write]
        [--replay FILE]

The "Sharing (Benoit et al.)" section of docs/benchmarks.md draws the instances of every point with seeds
0 .. runs-1, so its verdicts may be that draw's. This runs bench/sharing.py's ``measure`` (``one_run`` on
every instance, ``summarise`` per point) for batches of ``--runs`` instances per point: batch b draws with
seeds b*runs .. b*runs+runs-1, so the batches are disjoint and batch 0 is the single-seed section's draw
(the same numbers at the same ``--runs``). Each batch is judged by bench/sharing.py's rules
(``best_heuristics``: the best mean rp with strategy 3 per experiment; ``no_reuse_judgements``: the
paper's claims on H3-H6 without reuse) and the report gives each verdict over the batches (met on every
batch / on k of n / MISSED on every batch) with every batch's figures and the reason of each miss, how
often each heuristic wins per experiment, and median (min-max) over the batches of rp with strategy 3 per
point. The integer program stays in the single-seed section (21 instances, up to 60 units of
deterministic time each). Writes the section "Sharing (Benoit et al.) at several seeds (issue 35)" of
docs/benchmarks.md and docs/img/sharing_seeds.png; a run saves its measurements
(``sharing_seeds_runs.pickle`` in the temp directory), ``--replay`` renders them again.
"""

from __future__ import annotations

import argparse
import pickle
import shlex
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from rich.console import Console
from rich.progress import Progress

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report import header, image_dir, markdown, median_range, over_repeats, publish, save_figure
from bench.sharing import (
    EXPERIMENTS,
    LABELS,
    NO_REUSE,
    RECOMMENDED,
    SEEDS_SECTION,
    VARIANTS,
    Results,
    best_heuristics,
    measure,
    no_reuse_judgements,
)
from streamtopo.planner.benoit.heuristics import HEURISTICS

console = Console()


def batch_seeds(batch: int, runs: int) -> range:
    """Batch ``batch``'s instance seeds: disjoint from every other batch's, batch 0's those of
    bench/sharing.py at the same ``runs``."""
    return range(batch * runs, (batch + 1) * runs)


def run_batches(batches: int, runs: int, workers: int) -> list[dict]:
    """Every experiment at every batch: its tables (bench/sharing.py's ``Results``) and wall seconds."""
    out = []
    with ProcessPoolExecutor(workers) as pool, Progress(console=console) as progress:
        for batch in range(batches):
            started, before = time.perf_counter(), set(progress.task_ids)
            seeds = batch_seeds(batch, runs)
            results: Results = {
                e.number: measure(pool, e, seeds, progress, f", batch {batch}") for e in EXPERIMENTS
            }
            for task in set(progress.task_ids) - before:
                progress.remove_task(task)
            seconds = time.perf_counter() - started
            progress.console.print(f"batch {batch} (seeds {seeds.start}-{seeds.stop - 1}): {seconds:.0f} s")
            out.append({"batch": batch, "results": results, "seconds": seconds})
    return out


def verdicts(batches: list[dict]) -> list[str]:
    """Each of bench/sharing.py's no-reuse judgements over the batches, with every batch's figures and,
    on a miss, what broke the claim."""
    judged = [no_reuse_judgements(b["results"]) for b in batches]
    return [
        over_repeats(
            first.claim,
            [
                (str(b["batch"]), j[i].ok, j[i].figures + ("" if j[i].ok else f" (MISSED: {j[i].why})"))
                for b, j in zip(batches, judged)
            ],
            first.what,
            unit="batch",
        )
        for i, first in enumerate(judged[0])
    ]


def winners(batches: list[dict]) -> tuple[list[str], list[list[str]]]:
    """Per experiment, the best mean rp with strategy 3 on every batch and how often each heuristic wins."""
    best = [best_heuristics(b["results"]) for b in batches]
    columns = ["experiment", *(f"batch {b['batch']}" for b in batches), "wins"]
    rows = []
    for e in EXPERIMENTS:
        wins = Counter(HEURISTICS[by[e.number]] for by in best)
        rows.append(
            [
                f"{e.number}, {e.title.lower()}",
                *(HEURISTICS[by[e.number]] for by in best),
                ", ".join(f"{name} {n}" for name, n in wins.most_common()),
            ]
        )
    return columns, rows


def rp(batches: list[dict], number: int, x: float, variant: str) -> list[float]:
    """rp with :data:`RECOMMENDED` of one variant at one point, per batch."""
    return [b["results"][number][x][(variant, RECOMMENDED)][1] for b in batches]


def spread_table(batches: list[dict], number: int) -> list[str]:
    """One experiment's rp with :data:`RECOMMENDED`, median (min-max) over the batches per point and variant."""
    e = EXPERIMENTS[number - 1]
    rows = [[f"{x:g}", *(median_range(rp(batches, number, x, v)) for v in VARIANTS)] for x in e.points]
    return markdown([e.axis, *LABELS.values()], rows)


def reading(batches: list[dict]) -> str:
    """What the batches change: verdicts and winners that hold on every batch, and where batch 0 (the
    single-seed section's draw) reads otherwise than most batches."""
    judged = [no_reuse_judgements(b["results"]) for b in batches]
    claims = list(zip(*judged))
    steady = sum(len({j.ok for j in by}) == 1 for by in claims)
    odd = [by[0].claim for by in claims if 2 * sum(j.ok != by[0].ok for j in by[1:]) > len(by) - 1]
    best = [best_heuristics(b["results"]) for b in batches]
    same = [e.number for e in EXPERIMENTS if len({by[e.number] for by in best}) == 1]
    text = (
        f"Reading. {steady} of {len(claims)} no-reuse verdicts read the same on all {len(batches)} batches; "
        f"the winner of strategy 3 is the same on every batch in {len(same)} of {len(EXPERIMENTS)} experiments"
        + (f" ({', '.join(f'Exp. {n}' for n in same)})" if same else "")
    )
    if len(batches) > 1:
        text += "; batch 0 (the single-seed section's instances) reads " + (
            f"{len(odd)} verdict(s) otherwise than most other batches: " + "; ".join(odd)
            if odd
            else "no verdict otherwise than most of the other batches"
        )
    return text + "."


def plot(batches: list[dict], runs: int, path: Path) -> str:
    """rp with :data:`RECOMMENDED` per experiment: median line and min-max band over the batches, the six
    heuristics above, H3-H6 without reuse below."""
    rows = (list(HEURISTICS), [f"{h}/no-reuse" for h in NO_REUSE])
    fig, axes = plt.subplots(2, len(EXPERIMENTS), figsize=(22, 8), sharey=True)
    for column, e in enumerate(EXPERIMENTS):
        for row, variants in enumerate(rows):
            ax = axes[row][column]
            for variant in variants:
                values = np.array([rp(batches, e.number, x, variant) for x in e.points])
                (line,) = ax.plot(
                    e.points, np.median(values, axis=1), marker="o", markersize=3, label=LABELS[variant]
                )
                ax.fill_between(
                    e.points, values.min(axis=1), values.max(axis=1), color=line.get_color(), alpha=0.15
                )
            ax.set(title=f"Exp. {e.number}: {e.title.lower()}", xlabel=e.axis)
        axes[0][column].set_xlabel("")
    axes[0][0].set_ylabel(f"rp, strategy {RECOMMENDED} (with reuse)")
    axes[1][0].set_ylabel(f"rp, strategy {RECOMMENDED} (no reuse)")
    axes[0][-1].legend(fontsize=7)
    axes[1][-1].legend(fontsize=7)
    fig.suptitle(
        f"Benoit et al., Section 6.2: median and min-max over {len(batches)} batches of {runs} instances a point"
    )
    return save_figure(fig, path, dpi=80)


def report(batches: list[dict], runs: int, command: str, image: str, rendered: str = "") -> list[str]:
    """The section; ``rendered`` says when a replayed run was measured and what rendered it again."""
    wall = sum(b["seconds"] for b in batches)
    last = batch_seeds(len(batches) - 1, runs).stop - 1
    columns, rows = winners(batches)
    lines = [
        *header(command, "pure planning: only the seconds depend on the machine" + rendered),
        "",
        f"{len(batches)} batches of {runs} instances per point, {wall / 60:.0f} min in all: batch b draws every "
        f"point's instances with seeds b*{runs} .. "
        f"b*{runs}+{runs - 1} (seeds 0-{last} in all, disjoint), so batch 0 is the instances of the "
        'single-seed section "Sharing (Benoit et al.)". Each batch runs bench/sharing.py\'s `measure` '
        "(`one_run`, `summarise`) and is judged by its rules (`best_heuristics`, `no_reuse_judgements`). "
        f"Cells: rp(h) (Proc-Power) with strategy {RECOMMENDED}, median (min-max) over the batches. The "
        "integer program is not repeated: it stays at 21 instances in the single-seed section.",
        "",
        f"![Sharing at several seeds](img/{image})",
        "",
        "### Without reuse of common sub-trees, against the paper (Section 6.2), over the batches",
        "",
        *verdicts(batches),
        "",
        f"### Best mean rp with strategy {RECOMMENDED} per experiment",
        "",
        *markdown(columns, rows),
        "",
        reading(batches),
    ]
    for e in EXPERIMENTS:
        lines += ["", f"### Experiment {e.number}, {e.title.lower()}: rp with strategy {RECOMMENDED}", ""]
        lines += spread_table(batches, e.number)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=5, help="batches of instance seeds")
    parser.add_argument("--runs", type=int, default=50, help="instances per point and batch (the paper: 50)")
    parser.add_argument("--workers", type=int, default=1, help="planning processes")
    parser.add_argument("--no-write", action="store_true", help="print the section, leave docs/ alone")
    parser.add_argument("--replay", default=None, help="render the measurements a run saved, not measure")
    args = parser.parse_args()
    command = shlex.join(["python", "bench/sharing_seeds.py", *sys.argv[1:]])
    rendered = ""
    if args.replay:
        saved = pickle.loads(Path(args.replay).read_bytes())
        batches, runs = saved["batches"], saved["runs"]
        rendered = f"; measured {saved['measured']}, rendered again by `{command}`"
        command = saved["command"]
    else:
        batches, runs = run_batches(args.batches, args.runs, args.workers), args.runs
        measured = f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
        saved_path = Path(tempfile.gettempdir()) / "sharing_seeds_runs.pickle"
        saved = {"batches": batches, "runs": runs, "command": command, "measured": measured}
        saved_path.write_bytes(pickle.dumps(saved))
        console.print(f"measurements saved to {saved_path} (--replay renders them again)")
    image = image_dir(args.no_write) / "sharing_seeds.png"
    publish(
        SEEDS_SECTION,
        report(batches, runs, command, plot(batches, runs, image), rendered),
        image,
        args.no_write,
        console,
    )


if __name__ == "__main__":
    main()
