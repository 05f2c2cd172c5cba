"""Benoit et al.'s Experiments 1-5 (RR-6864, Section 6): success counts and relative performance of the six
heuristics under the four processor-selection strategies, of H3-H6 without reuse of common sub-trees
(the paper's Figures 3(b) and 5(b)), and the integer program's optimum beside them.

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
from collections.abc import Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from rich.console import Console
from rich.progress import Progress

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report import header, image_dir, markdown, write_section
from streamtopo.planner.benoit.heuristics import HEURISTICS, Heuristic, place_heuristic
from streamtopo.planner.benoit.ilp import solve_ilp
from streamtopo.planner.benoit.instances import InstanceParams, random_problem, similar_pair
from streamtopo.planner.benoit.problem import Problem

SECTION = "Sharing (Benoit et al.)"
SEEDS_SECTION = f"{SECTION} at several seeds (issue 35)"
"""bench/sharing_seeds.py's section: these experiments at several batches of seeds."""
STRATEGIES = (1, 2, 3, 4)
RECOMMENDED = 3
"""The strategy the paper recommends (Section 6.2): the one the tables show and ``best_heuristics`` ranks by."""
BASE = InstanceParams()
SMALL = replace(BASE, processors=10, applications=2, size=10)
NO_REUSE = ("topdown-bfs", "topdown-dfs", "bottomup-bfs", "bottomup-dfs")
VARIANTS: dict[str, tuple[Heuristic, bool]] = {
    **{h: (h, True) for h in HEURISTICS},
    **{f"{h}/no-reuse": (h, False) for h in NO_REUSE},
}
"""What each point runs: the six heuristics, and H3-H6 without reuse of common sub-trees (Section 6.2,
Figures 3(b) and 5(b); H1 RandomNoReuse is H2 without it)."""
LABELS = {v: HEURISTICS[h] + ("" if reuse else " (no reuse)") for v, (h, reuse) in VARIANTS.items()}


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
    """Costs (Proc-Power; inf on failure) of every variant x strategy on one instance."""
    number, x, seed = job
    problem = EXPERIMENTS[number - 1].problem(x, seed)
    return {
        (v, s): place_heuristic(problem, h, s, seed, reuse).cost("proc-power")
        for v, (h, reuse) in VARIANTS.items()
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


Summary = dict[tuple[str, int], tuple[int, float]]
"""One point: (success count, rp) per variant x strategy."""
Results = dict[int, dict[float, Summary]]
"""Per experiment number, per point (the x of :attr:`Experiment.points`), its :data:`Summary`."""


def summarise(runs: list[dict[tuple[str, int], float]]) -> Summary:
    """(success count, rp) per heuristic x strategy over the runs of one point."""
    out = {}
    for key in runs[0]:
        successes = sum(run[key] < float("inf") for run in runs)
        rp = sum(min(run.values()) / run[key] for run in runs if run[key] < float("inf")) / len(runs)
        out[key] = (successes, rp)
    return out


def measure(
    pool: Executor, experiment: Experiment, seeds: Sequence[int], progress: Progress, label: str = ""
) -> dict[float, Summary]:
    """One experiment's points, each summarised over the instances drawn with ``seeds`` (one per run)."""
    task = progress.add_task(
        f"Experiment {experiment.number}{label}", total=len(experiment.points) * len(seeds)
    )
    table = {}
    for x in experiment.points:
        runs = []
        for run in pool.map(one_run, [(experiment.number, x, seed) for seed in seeds], chunksize=5):
            runs.append(run)
            progress.advance(task)
        table[x] = summarise(runs)
    return table


def plot(experiment: Experiment, table: dict[float, Summary], runs: int, directory: Path) -> Path:
    """Successes and rp(h) per strategy across the experiment's points, drawn into ``directory``."""
    fig, axes = plt.subplots(2, 4, figsize=(17, 7.5), sharex=True, sharey="row")
    xs = list(table)
    for column, strategy in enumerate(STRATEGIES):
        for (heuristic, label), color in zip(
            LABELS.items(), plt.rcParams["axes.prop_cycle"].by_key()["color"] * 2
        ):
            style = ":" if heuristic.endswith("no-reuse") else "--" if heuristic.startswith("random") else "-"
            axes[0][column].plot(
                xs,
                [table[x][(heuristic, strategy)][0] for x in xs],
                style,
                color=color,
                marker="o",
                markersize=3,
                label=label,
            )
            axes[1][column].plot(
                xs,
                [table[x][(heuristic, strategy)][1] for x in xs],
                style,
                color=color,
                marker="o",
                markersize=3,
                label=label,
            )
        axes[0][column].set_title(f"strategy {strategy}")
        axes[1][column].set_xlabel(experiment.axis)
    axes[0][0].set_ylabel(f"successes (of {runs})")
    axes[1][0].set_ylabel("relative performance rp(h)")
    axes[0][3].legend(fontsize=7)
    fig.suptitle(
        f"Experiment {experiment.number}: {experiment.title} (Benoit et al., Section 6.2.{experiment.number})"
    )
    fig.tight_layout()
    path = directory / f"sharing_exp{experiment.number}.png"
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
    results: Results = {}
    ilp_rows = []
    with ProcessPoolExecutor(args.workers) as pool, Progress(console=console) as progress:
        for experiment in EXPERIMENTS:
            results[experiment.number] = measure(pool, experiment, range(args.runs), progress)
            plot(experiment, results[experiment.number], args.runs, image_dir(args.no_write))
        task = progress.add_task("ILP (Experiment 5)", total=len(EXPERIMENTS[4].points) * args.ilp_runs)
        jobs = [(x, seed, args.ilp_time) for x in EXPERIMENTS[4].points for seed in range(args.ilp_runs)]
        for (x, seed, _), (status, ilp, best, work) in zip(jobs, pool.map(ilp_run, jobs)):
            ilp_rows.append((int(x), seed, status, ilp, best, work))
            progress.advance(task)
    lines = report(results, ilp_rows, args)
    console.print("\n".join(lines))
    if not args.no_write:
        write_section(SECTION, lines)


def report(results: Results, ilp_rows: list, args: argparse.Namespace) -> list[str]:
    command = (
        f"python bench/sharing.py --runs {args.runs} --ilp-runs {args.ilp_runs} --ilp-time {args.ilp_time:g}"
    )
    lines = header(command) + [
        "",
        (
            "Successes out of the runs and rp(h) (Proc-Power) per point; strategy 3 "
            "(the paper's recommendation) shown, all four in the plots. Instances drawn with seeds "
            f'0-{args.runs - 1}; at five disjoint batches of seeds: section "{SEEDS_SECTION}" '
            "(bench/sharing_seeds.py)."
        ),
        "",
    ]
    for experiment in EXPERIMENTS:
        table = results[experiment.number]
        plot = f"sharing_exp{experiment.number}.png"
        lines += [f"Experiment {experiment.number}, {experiment.title} (plot: [{plot}](img/{plot})):", ""]
        rows = [
            [x] + [f"{table[x][(v, RECOMMENDED)][0]} / {table[x][(v, RECOMMENDED)][1]:.2f}" for v in VARIANTS]
            for x in table
        ]
        lines += markdown([experiment.axis] + list(LABELS.values()), rows) + [""]
    lines += [
        "Best mean rp with strategy 3 per experiment: "
        + ", ".join(f"Exp. {n}: {HEURISTICS[h]}" for n, h in best_heuristics(results).items())
        + ".",
        "",
    ]
    lines += ["Without reuse of common sub-trees, against the paper (Section 6.2):", ""]
    lines += [
        f"- {j.claim}: **{'met' if j.ok else 'MISSED'}**{f' ({j.why})' if j.why else ''}; {j.what}: {j.figures}"
        for j in no_reuse_judgements(results)
    ] + [""]
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


def best_heuristics(results: Results) -> dict[int, Heuristic]:
    """Per experiment, the heuristic (with reuse) of the highest rp with :data:`RECOMMENDED` summed over the
    points: the paper recommends that strategy and TopDownBFS with it."""
    return {
        n: max(HEURISTICS, key=lambda h: sum(table[x][(h, RECOMMENDED)][1] for x in table))
        for n, table in results.items()
    }


@dataclass(frozen=True)
class Judgement:
    """One of the paper's claims judged on one set of tables: whether it holds, ``figures`` (``what`` they
    are) and, when it does not, ``why`` (the heuristics or figures that break it)."""

    claim: str
    ok: bool
    what: str
    figures: str
    why: str = ""


def first_success(table: dict[float, Summary], variant: str, strategy: int) -> float | None:
    """The first point at which ``variant`` with ``strategy`` succeeded on any run (None: at no point)."""
    return next((x for x in table if table[x][(variant, strategy)][0] > 0), None)


def shown(value: float | None) -> str:
    return "none" if value is None else f"{value:g}"


def short(heuristic: Heuristic) -> str:
    """The paper's number of a heuristic (H3 for TopDownBFS): how the judgements' figures name them."""
    return HEURISTICS[heuristic].split()[0]


def no_reuse_judgements(results: Results) -> list[Judgement]:
    """The paper's claims on H3-H6 without reuse (Section 6.2), judged on the same tables: Experiment 1
    (strategies 3 and 2: 'they do not find results until at least 35 processors ... or even 60'; whether
    that is later than with reuse at all), Experiment 3 ('they no longer find results when application
    sizes exceed 40 operators') and, in both, 'TopDown heuristics perform better'."""
    out = []
    for strategy, bound in ((3, 35), (2, 60)):
        without = {h: first_success(results[1], f"{h}/no-reuse", strategy) for h in NO_REUSE}
        with_reuse = {h: first_success(results[1], h, strategy) for h in NO_REUSE}
        what = "H3-H6's first success (processors) without reuse, with reuse"
        figures = f"{'/'.join(map(shown, without.values()))}, {'/'.join(map(shown, with_reuse.values()))}"
        not_later = [
            h
            for h in NO_REUSE
            if without[h] is not None and (with_reuse[h] is None or without[h] <= with_reuse[h])
        ]
        out.append(
            Judgement(
                f"Experiment 1, strategy {strategy}: without reuse, the first success comes later than with it",
                not not_later,
                what,
                figures,
                "; ".join(
                    f"{short(h)} {shown(without[h])} against {shown(with_reuse[h])}" for h in not_later
                ),
            )
        )
        early = [h for h in NO_REUSE if without[h] is not None and without[h] < bound]
        out.append(
            Judgement(
                f"Experiment 1, strategy {strategy}: no success without reuse below {bound} processors (the paper)",
                not early,
                what,
                figures,
                ", ".join(f"{short(h)} at {shown(without[h])}" for h in early),
            )
        )
    big = [x for x in results[3] if x > 40]
    found = {h: sum(results[3][x][(f"{h}/no-reuse", 3)][0] for x in big) for h in NO_REUSE}
    out.append(
        Judgement(
            "Experiment 3, strategy 3: no success without reuse above 40 operators (the paper)",
            not any(found.values()),
            f"H3-H6's successes without reuse at {', '.join(f'{x:g}' for x in big)} operators",
            "/".join(map(str, found.values())),
            ", ".join(f"{short(h)} {n}" for h, n in found.items() if n),
        )
    )
    for number in (1, 3):
        table = results[number]
        score = {
            h: sum(table[x][(f"{h}/no-reuse", s)][1] for x in table for s in STRATEGIES) for h in NO_REUSE
        }
        top = min(NO_REUSE[:2], key=score.__getitem__)
        bottom = max(NO_REUSE[2:], key=score.__getitem__)
        out.append(
            Judgement(
                f"Experiment {number}, every strategy: TopDown better than BottomUp without reuse (the paper)",
                score[top] >= score[bottom],
                "H3-H6's rp without reuse summed over points and strategies",
                "/".join(f"{v:.2f}" for v in score.values()),
                ""
                if score[top] >= score[bottom]
                else f"{short(top)} {score[top]:.2f} below {short(bottom)} {score[bottom]:.2f}",
            )
        )
    return out


if __name__ == "__main__":
    main()
