"""COLA's Table 1 at several seeds (issue 35): cut and PE sizes, and the targets' verdicts, per seed.

    .venv/bin/python bench/cola_seeds.py [--seeds 0,1,2,3,4] [--limit 120] [--no-write]

The "COLA" section of docs/benchmarks.md runs Table 1 (Khandekar et al., Section 4) on one draw of the
VWAP-like graphs (``bench/graphs.vwap_like``, seed 0) planned with seed 0, so its verdicts may be that
draw's. This runs bench/cola.py's ``table1`` at every seed: the graphs drawn with the seed (same sizes,
arcs and total load, other costs and wiring of the branches) and the planners seeded with it. Per seed it
judges bench/cola.py's Table 1 targets with its rules (``pair_rows``: ours' cut <= 0.7x FINT's with a max
PE no larger, every row; ``slowest_cola``: every row planned in <= 2 s), and reports the verdict over the
seeds (met on every seed / on k of n / missed on every seed) with the rows each seed met, median (min-max)
of each cell over the seeds, and COLA's cut against FINT's per row. The gap to the exact optimum is
already over 30 seeded graphs in the COLA section and is not repeated here.

Writes the section "COLA Table 1 at several seeds (issue 35)" of docs/benchmarks.md and
docs/img/cola_seeds.png.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from rich.console import Console
from rich.progress import Progress

from bench.cola import (
    ALGORITHMS,
    CUT_SHARE,
    GRAPHS,
    HOSTS,
    PAIRS,
    TABLE1_SECONDS,
    Row,
    pair_rows,
    slowest_cola,
    table1,
)
from bench.report import header, image_dir, markdown, median_range, over_repeats, publish, save_figure

SECTION = "COLA Table 1 at several seeds (issue 35)"
console = Console()


def verdicts(runs: dict[int, list[Row]]) -> list[str]:
    """Each Table 1 target over the seeds, judged per seed by bench/cola.py's rules."""
    seeds, lines = list(runs), []
    for ours, fint in PAIRS:
        per_seed = []
        for seed in seeds:
            pairs = pair_rows(runs[seed], ours, fint)
            both = sum(cut and pe for _, _, cut, pe in pairs)
            cuts = sum(cut for _, _, cut, _ in pairs)
            pes = sum(pe for _, _, _, pe in pairs)
            per_seed.append((str(seed), both == len(pairs), f"{both}/{len(pairs)} (cut {cuts}, PE {pes})"))
        lines.append(
            over_repeats(
                f"{ours} cut <= {CUT_SHARE:g} x {fint} cut with max PE <= {fint}'s, every row",
                per_seed,
                "rows meeting both",
            )
        )
    per_seed = []
    for seed in seeds:
        slowest = slowest_cola(runs[seed])
        took = slowest.note if slowest.seconds is None else f"{slowest.seconds:.2f} s"
        per_seed.append((str(seed), slowest.seconds is not None and slowest.seconds <= TABLE1_SECONDS, took))
    lines.append(
        over_repeats(
            f"200-217 operators planned in <= {TABLE1_SECONDS:g} s on every Table 1 row",
            per_seed,
            "slowest COLA plan",
        )
    )
    return lines


def table(runs: dict[int, list[Row]], name: str) -> tuple[list[str], list[list[str]]]:
    """One graph's Table 1 as median (min-max) over the seeds; COLA / FINT cut per row likewise."""
    columns = ["hosts", "algorithm", "cut", "max PE", "infeasible on", "plan seconds"]
    rows = []
    for hosts in HOSTS:
        for algorithm in ALGORITHMS:
            found = [
                r
                for seed_rows in runs.values()
                for r in seed_rows
                if (r.graph, r.hosts, r.algorithm) == (name, hosts, algorithm)
            ]
            planned = [r for r in found if r.seconds is not None]
            if not planned:
                rows.append([str(hosts), algorithm, "-", "-", "-", found[0].note if found else "-"])
                continue
            seconds = [r.seconds for r in planned if r.seconds is not None]
            rows.append(
                [
                    str(hosts),
                    algorithm,
                    median_range([r.cut for r in planned], "{:.4f}".format),
                    median_range([r.max_pe for r in planned], "{:.4f}".format),
                    f"{sum(not r.feasible for r in planned)} of {len(planned)}"
                    + (f" ({len(found) - len(planned)} without a plan)" if len(planned) < len(found) else ""),
                    median_range(seconds),
                ]
            )
    return columns, rows


def ratios(runs: dict[int, list[Row]], name: str, hosts: int) -> list[float]:
    """COLA's cut / FINT's on one row, per seed."""
    out = []
    for seed_rows in runs.values():
        by = {r.algorithm: r for r in seed_rows if (r.graph, r.hosts) == (name, hosts)}
        out.append(by["COLA"].cut / by["FINT"].cut if by["FINT"].cut else float("inf"))
    return out


def plot(runs: dict[int, list[Row]], path: Path) -> str:
    """Per graph: each algorithm's cut (median and min-max over the seeds) by hosts."""
    fig, axes = plt.subplots(1, len(GRAPHS), figsize=(12, 4.5), sharey=True)
    width = 0.8 / len(ALGORITHMS)
    for ax, name in zip(axes, GRAPHS):
        for i, algorithm in enumerate(ALGORITHMS):
            values = np.array(
                [
                    [
                        next(
                            r.cut
                            for r in runs[seed]
                            if (r.graph, r.hosts, r.algorithm) == (name, h, algorithm)
                        )
                        for h in HOSTS
                    ]
                    for seed in runs
                ]
            )
            med = np.median(values, axis=0)
            x = [h - 0.4 + width * (i + 0.5) for h in HOSTS]
            ax.bar(x, med, width, label=algorithm)
            ax.errorbar(
                x,
                med,
                yerr=[med - values.min(axis=0), values.max(axis=0) - med],
                fmt="none",
                ecolor="k",
                lw=0.8,
            )
        ax.set(title=f"{name}: cut size", xlabel="hosts (4 cores each)", xticks=list(HOSTS))
    axes[0].set_ylabel("cut size (hosts)")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"Table 1, median and min-max over seeds {', '.join(map(str, runs))}")
    return save_figure(fig, path)


def report(runs: dict[int, list[Row]], command: str, image: str) -> list[str]:
    lines = [
        *header(command),
        "",
        f"Seeds {', '.join(map(str, runs))}: bench/cola.py's `table1` at each (the VWAP-like graphs drawn with the "
        "seed, the planners seeded with it), judged per seed by its rules (`pair_rows`, `slowest_cola`). Cells: "
        "median (min-max) over the seeds; cut and max PE as fractions of a 4-core host.",
        "",
        f"![COLA Table 1 at several seeds](img/{image})",
        "",
        "### Verdicts over the seeds",
        "",
        *verdicts(runs),
        "",
        "### COLA's cut against FINT's per row",
        "",
        *markdown(
            ["graph", "hosts", "COLA cut / FINT cut, median (min-max)", "per seed"],
            [
                [
                    name,
                    str(h),
                    median_range(v),
                    ", ".join(f"{x:.2f}" for x in v),
                ]
                for name in GRAPHS
                for h in HOSTS
                for v in [ratios(runs, name, h)]
            ],
        ),
    ]
    for name, (operators, arcs) in GRAPHS.items():
        columns, rows = table(runs, name)
        lines += ["", f"### {name} ({operators} operators / {arcs} arcs)", "", *markdown(columns, rows)]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated seeds")
    parser.add_argument("--limit", type=float, default=120.0, help="seconds allowed per plan")
    parser.add_argument("--no-write", action="store_true", help="print the section, leave docs/ alone")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    command = shlex.join(["python", "bench/cola_seeds.py", *sys.argv[1:]])
    runs: dict[int, list[Row]] = {}
    with Progress(console=console) as progress:
        for seed in seeds:
            runs[seed] = table1(progress, args.limit, seed)
    image = image_dir(args.no_write) / "cola_seeds.png"
    publish(SECTION, report(runs, command, plot(runs, image)), image, args.no_write, console)


if __name__ == "__main__":
    main()
