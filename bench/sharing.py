"""Benoit et al.'s Experiments 1-5 (RR-6864, Section 6): success counts and relative performance of the six
heuristics under the four processor-selection strategies, and the integer program's optimum beside them.

For each point of an experiment, ``--runs`` random instances (50 in the paper) are placed by every heuristic
with every strategy. rp(h) = mean over runs of best_cost / cost_h, with cost = Proc-Power (the summed speed
of the processors used, Section 5) and 0 when h fails; best_cost is the cheapest placement any heuristic
found on that run. Experiment 5's small instances (two applications, 10 processors) are also solved by the
integer program (Proc-Power, started from the best heuristic, deterministic limit ``--ilp-time``); where it
proves optimality its cost is compared with the heuristics'.

Writes docs/img/sharing_exp{1..5}.png and the "Sharing (Benoit et al.)" section of docs/benchmarks.md.
Pure planning: nothing depends on the machine's speed except how long it takes (about 5 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from rich.console import Console
from rich.progress import Progress

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report import header, markdown, write_section
from streamtopo.planner.benoit.heuristics import HEURISTICS, place_heuristic
from streamtopo.planner.benoit.ilp import solve_ilp
from streamtopo.planner.benoit.instances import InstanceParams, random_problem, similar_pair
from streamtopo.planner.benoit.problem import Problem

SECTION = "Sharing (Benoit et al.)"
STRATEGIES = (1, 2, 3, 4)
BASE = InstanceParams()
SMALL = replace(BASE, processors=10, applications=2, size=10)


@dataclass(frozen=True)
class Experiment:
    number: int
    title: str
    axis: str
    points: tuple[float, ...]

    def problem(self, x: float, seed: int) -> Problem:
        if self.number == 1:
            return random_problem(replace(BASE, processors=int(x)), seed)
        if self.number == 2:
            return random_problem(replace(BASE, applications=int(x)), seed)
        if self.number == 3:
            return random_problem(replace(BASE, size=int(x)), seed)
        if self.number == 4:
            return random_problem(BASE.with_ccr(x), seed)
        return similar_pair(SMALL, differ=int(x), seed=seed)


EXPERIMENTS = (
    Experiment(1, "Number of processors", "processors", (5, 10, 15, 20, 25, 30, 40, 50, 60)),
    Experiment(2, "Number of applications", "applications", (1, 2, 4, 6, 8, 10, 12, 15)),
    Experiment(3, "Application size", "operators per application (at most)", (5, 10, 20, 30, 40, 50, 60)),
    Experiment(
        4,
        "Communication-to-computation ratio",
        "CCR (MB output per GFlop of work)",
        (1, 2, 5, 10, 15, 20, 30, 40),
    ),
    Experiment(5, "Similarity of two applications", "operators that differ (of 10)", (0, 1, 2, 4, 6, 8, 10)),
)


def one_run(job: tuple[int, float, int]) -> dict[tuple[str, int], float]:
    """Costs (Proc-Power; inf on failure) of every heuristic x strategy on one instance."""
    number, x, seed = job
    problem = EXPERIMENTS[number - 1].problem(x, seed)
    return {
        (h, s): place_heuristic(problem, h, s, seed).cost("proc-power")
        for h in HEURISTICS
        for s in STRATEGIES
    }


def ilp_run(job: tuple[float, int, float]) -> tuple[str, float, float, float]:
    """Experiment 5 instance: (status, ILP cost, best heuristic cost, deterministic time)."""
    x, seed, limit = job
    problem = EXPERIMENTS[4].problem(x, seed)
    results = [place_heuristic(problem, h, s, seed) for h in HEURISTICS for s in STRATEGIES]
    best = min((r for r in results if r.feasible), key=lambda r: r.cost("proc-power"), default=None)
    ilp = solve_ilp(
        problem,
        "proc-power",
        deterministic_time=limit,
        seed=seed,
        hint=best.usage.placement if best else None,
    )
    return ilp.status, ilp.cost(), best.cost("proc-power") if best else float("inf"), ilp.work


def summarise(runs: list[dict[tuple[str, int], float]]) -> dict[tuple[str, int], tuple[int, float]]:
    """(success count, rp) per heuristic x strategy over the runs of one point."""
    out = {}
    for key in runs[0]:
        successes = sum(run[key] < float("inf") for run in runs)
        rp = sum(min(run.values()) / run[key] for run in runs if run[key] < float("inf")) / len(runs)
        out[key] = (successes, rp)
    return out


def plot(
    experiment: Experiment, table: dict[float, dict[tuple[str, int], tuple[int, float]]], runs: int
) -> Path:
    fig, axes = plt.subplots(2, 4, figsize=(17, 7.5), sharex=True, sharey="row")
    xs = list(table)
    for column, strategy in enumerate(STRATEGIES):
        for heuristic, label in HEURISTICS.items():
            style = "--" if heuristic.startswith("random") else "-"
            axes[0][column].plot(
                xs,
                [table[x][(heuristic, strategy)][0] for x in xs],
                style,
                marker="o",
                markersize=3,
                label=label,
            )
            axes[1][column].plot(
                xs,
                [table[x][(heuristic, strategy)][1] for x in xs],
                style,
                marker="o",
                markersize=3,
                label=label,
            )
        axes[0][column].set_title(f"strategy {strategy}")
        axes[1][column].set_xlabel(experiment.axis)
    axes[0][0].set_ylabel(f"successes (of {runs})")
    axes[1][0].set_ylabel("relative performance rp(h)")
    axes[0][3].legend(fontsize=8)
    fig.suptitle(
        f"Experiment {experiment.number}: {experiment.title} (Benoit et al., Section 6.2.{experiment.number})"
    )
    fig.tight_layout()
    path = ROOT / "docs" / "img" / f"sharing_exp{experiment.number}.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50, help="instances per point (the paper: 50)")
    parser.add_argument(
        "--ilp-runs", type=int, default=3, help="Experiment 5 instances per point for the ILP"
    )
    parser.add_argument("--ilp-time", type=float, default=60.0, help="ILP deterministic-time limit")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/ alone")
    args = parser.parse_args()
    console = Console()
    results: dict[int, dict[float, dict[tuple[str, int], tuple[int, float]]]] = {}
    ilp_rows = []
    with ProcessPoolExecutor(args.workers) as pool, Progress(console=console) as progress:
        for experiment in EXPERIMENTS:
            task = progress.add_task(
                f"Experiment {experiment.number}", total=len(experiment.points) * args.runs
            )
            table = {}
            for x in experiment.points:
                runs = []
                for run in pool.map(
                    one_run, [(experiment.number, x, seed) for seed in range(args.runs)], chunksize=5
                ):
                    runs.append(run)
                    progress.advance(task)
                table[x] = summarise(runs)
            results[experiment.number] = table
            plot(experiment, table, args.runs)
        task = progress.add_task("ILP (Experiment 5)", total=len(EXPERIMENTS[4].points) * args.ilp_runs)
        jobs = [(x, seed, args.ilp_time) for x in EXPERIMENTS[4].points for seed in range(args.ilp_runs)]
        for (x, seed, _), (status, ilp, best, work) in zip(jobs, pool.map(ilp_run, jobs)):
            ilp_rows.append((int(x), seed, status, ilp, best, work))
            progress.advance(task)
    lines = report(results, ilp_rows, args)
    console.print("\n".join(lines))
    if not args.no_write:
        write_section(SECTION, lines)


def report(results: dict, ilp_rows: list, args: argparse.Namespace) -> list[str]:
    command = (
        f"python bench/sharing.py --runs {args.runs} --ilp-runs {args.ilp_runs} --ilp-time {args.ilp_time:g}"
    )
    lines = header(command) + [
        "",
        (
            "Successes out of the runs and rp(h) (Proc-Power) per point; strategy 3 "
            "(the paper's recommendation) shown, all four in the plots."
        ),
        "",
    ]
    for experiment in EXPERIMENTS:
        table = results[experiment.number]
        plot = f"sharing_exp{experiment.number}.png"
        lines += [f"Experiment {experiment.number}, {experiment.title} (plot: [{plot}](img/{plot})):", ""]
        rows = [
            [x] + [f"{table[x][(h, 3)][0]} / {table[x][(h, 3)][1]:.2f}" for h in HEURISTICS] for x in table
        ]
        lines += markdown([experiment.axis] + [HEURISTICS[h] for h in HEURISTICS], rows) + [""]
    best_share = {
        n: max(HEURISTICS, key=lambda h: sum(results[n][x][(h, 3)][1] for x in results[n])) for n in results
    }
    lines += [
        "Best mean rp with strategy 3 per experiment: "
        + ", ".join(f"Exp. {n}: {HEURISTICS[h]}" for n, h in best_share.items())
        + ".",
        "",
    ]
    lines += [
        "Integer program (Proc-Power, Experiment 5 instances) against the best of the 24 heuristic runs:",
        "",
    ]
    lines += markdown(
        ["differ", "seed", "status", "ILP cost", "best heuristic", "ILP / heuristic", "work"],
        [
            [d, s, st, f"{c:.4g}", f"{b:.4g}", f"{c / b:.3f}" if b < float("inf") else "-", f"{w:.1f}"]
            for d, s, st, c, b, w in ilp_rows
        ],
    )
    return lines


if __name__ == "__main__":
    main()
