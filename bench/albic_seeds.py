"""ALBIC's Section 5.1 targets, Figure 5 and Real Job 1 verdicts at several seeds (issue 35).

    .venv/bin/python bench/albic_seeds.py [--seeds 1,2,3,4,5] [--periods 40] [--rounds 16]
        [--sizes 20/400/10,40/800/20,60/1200/30] [--quick] [--no-write] [--replay FILE]

The "ALBIC" section of docs/benchmarks.md judges these from one seed (``bench/albic.py --seed 1``), so a
verdict there may be that seed's luck. Per seed this runs bench/albic.py's own functions, with its
settings: ``section_51`` at the targets' maxMigrations and deterministic time (Flux, PoTC and C-MR on the
same states), ``scale_in`` (Figure 5, the integrated MILP against drain-first) and ``section_52`` (Real
Job 1, Figures 6-9, every policy on the same loads); it judges each seed with bench/albic.py's rules
(``target_judgements``, ``fig5_judgement``, ``real_job_figures``) and reports, per target, met on every
seed / met on k of n / MISSED / out of reach (the budget bound says no allocation within the migrations
reaches it), with the reason of each miss and median (min-max) of each figure. Results: docs/benchmarks.md,
section "ALBIC targets at several seeds (issue 35)", and docs/img/albic_seeds.png. A run saves its
measurements (``albic_seeds_runs.pickle`` in the temp directory); ``--replay`` renders them again.
"""

from __future__ import annotations

import argparse
import os
import pickle
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
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

from bench.albic import (
    HEURISTICS,
    REAL_JOB_BUDGET,
    REAL_JOB_PERIODS,
    SCALE_IN_BUDGET,
    SCALE_IN_ROUNDS,
    SIZES,
    SOLVE_SECONDS,
    TARGET_LIMIT,
    TARGET_MIGRATIONS,
    VARIES,
    WARM_UP,
    fig5_judgement,
    real_job_figures,
    scale_in,
    section_51,
    section_52,
    target_judgements,
)
from bench.report import header, image_dir, markdown, median_range, publish, save_figure

SECTION = "ALBIC targets at several seeds (issue 35)"
BOUNDS = {"milp, 10": "10", "milp": "13", "milp, 20": "20", "milp, unrestricted": "unrestricted"}
"""Figure 8's Real Job 1 runs (bench/albic.REAL_JOB_RUNS labels) by maxMigrations."""
console = Console()

Size = tuple[int, int, int]


@dataclass
class Target:
    """One verdict of the ALBIC section judged at every seed: ``outcomes[i]`` is seed i's word from
    bench/albic.py's rules (met / out of reach / MISSED / n/a, or match / miss for the paper's claims),
    ``notes[i]`` the numbers behind anything but ``good``, ``figures`` each figure per seed."""

    name: str
    part: str
    good: str = "met"
    outcomes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    figures: dict[str, list[float | None]] = field(default_factory=dict)

    def add(self, outcome: str, figures: dict[str, float | None], note: str = "") -> None:
        self.outcomes.append(outcome)
        self.notes.append(note)
        for label, value in figures.items():
            self.figures.setdefault(label, []).append(value)


def label(size: Size) -> str:
    return "/".join(map(str, size))


def measure(args: argparse.Namespace) -> list[dict]:
    """Per seed, the three parts as bench/albic.py's main runs them (Section 5.1 only at the targets'
    maxMigrations and limit, the only cells the targets read)."""
    runs = []
    with Progress(console=console) as progress:
        overall = progress.add_task("seeds", total=len(args.seeds))
        for seed in args.seeds:
            started, before = time.perf_counter(), set(progress.task_ids)
            q51 = section_51(args.sizes, VARIES, [TARGET_MIGRATIONS], [TARGET_LIMIT], seed, progress)
            scale = scale_in(args.scale_size, args.rounds, SCALE_IN_BUDGET, seed, progress)
            real = section_52(args.periods, REAL_JOB_BUDGET, seed, progress)
            for task in set(progress.task_ids) - before:
                progress.remove_task(task)
            progress.advance(overall)
            seconds = time.perf_counter() - started
            load = os.getloadavg()[0]
            progress.console.print(f"seed {seed}: {seconds:.0f} s, load average {load:.2f}")
            runs.append(
                {"seed": seed, "q51": q51, "scale": scale, "real": real, "seconds": seconds, "load": load}
            )
    return runs


def judge(runs: list[dict], sizes: list[Size]) -> list[Target]:
    """Every seed judged by bench/albic.py's rules; the notes say why a seed is not ``good``."""
    targets: dict[str, Target] = {}

    def target(name: str, part: str, good: str = "met") -> Target:
        return targets.setdefault(name, Target(name, part, good))

    for run in runs:
        for size in map(label, sizes):
            cells, secs = target_judgements(run["q51"], size)
            for c in cells:
                ld, bound, flux = c["ld"], c["bound"], c["flux"]
                where = f"{size}, varies {c['varies']}"
                note = {
                    "MISSED": f"MILP {ld:.2f} with the bound at {bound:.2f}: reachable, not found",
                    "out of reach": f"bound {bound:.2f} >= 1",
                }.get(c["absolute"], "")
                figures = {"MILP LD": ld, "bound": bound}
                target(f"{where}: load distance < 1 %", "5.1").add(c["absolute"], figures, note)
                relative = c["relative"].split(" (")[0]
                note = {
                    "n/a": f"Flux {flux:.2f} <= 1",
                    "MISSED": f"MILP {ld:.2f} > {0.5 * flux:.2f} with the bound at {bound:.2f}",
                    "out of reach": f"bound {bound:.2f} > {0.5 * flux:.2f}",
                }.get(relative, "")
                figures = {"MILP LD": ld, "Flux LD": flux, "MILP / Flux": ld / flux}
                target(f"{where}: load distance <= 0.5x Flux's", "5.1").add(relative, figures, note)
            outcome = "met" if secs <= SOLVE_SECONDS else "MISSED"
            note = f"{secs:.1f} s" if outcome != "met" else ""
            target(f"{size}: slowest solve <= 5 s", "5.1").add(outcome, {"seconds": secs}, note)
        for case in ("1OL", "5OL"):
            j = fig5_judgement(run["scale"][(case, "integrated")], run["scale"][(case, "non-integrated")])
            why = [] if j["sooner"] else [f"integrated {j['lds'][0]:.2f} >= drain-first {j['lds'][1]:.2f}"]
            if not j["similar"]:
                rounds = len(run["scale"][(case, "integrated")]["load_distance"])
                a, b = (f"in round {r}" if r else f"not in {rounds} rounds" for r in j["rounds"])
                why.append(f"B emptied {a} integrated, {b} draining first (similar: at most 1.25x)")
            figures = {
                "integrated LD after round 5": j["lds"][0],
                "drain-first LD after round 5": j["lds"][1],
                "integrated rounds to drain B": j["rounds"][0],
                "drain-first rounds to drain B": j["rounds"][1],
            }
            target(f"Figure 5, {case}: a good load distance sooner, B drained as fast", "fig5", "match").add(
                "match" if j["match"] else "miss", figures, "; ".join(why)
            )
        f = real_job_figures(run["real"])
        milp, flux, potc = f["milp"], f["flux"], f["potc"]
        why = [
            text
            for part, text in (
                (
                    "milp_below",
                    f"MILP max {max(milp):.2f}, at or above 1 % in {len(milp) - f['below']} of {len(milp)} "
                    f"periods, out of reach by the bound in {f['proven']} of them",
                ),
                ("flux_above", f"Flux max {max(flux):.2f} not above the MILP's {max(milp):.2f}"),
                ("potc_above", f"PoTC min {min(potc):.2f} not above the MILP's max {max(milp):.2f}"),
            )
            if not f[part]
        ]
        figures = {
            "MILP LD mean": float(np.mean(milp)),
            "MILP LD max": max(milp),
            "periods below 1 %": f["below"],
            "Flux LD max": max(flux),
            "PoTC LD min": min(potc),
        }
        name = "Figure 6: MILP below 1 %, Flux above it, PoTC never as good"
        target(name, "rj1", "match").add("match" if f["fig6"] else "miss", figures, "; ".join(why))
        moved = f["migrations"]
        target("Figure 7: the MILP migrates no more than Flux", "rj1", "match").add(
            "match" if f["fig7"] else "miss",
            {"MILP migrations": moved["milp"], "Flux migrations": moved["flux"]},
            f"MILP {moved['milp']} > Flux {moved['flux']}",
        )
        means = {f"LD mean, {BOUNDS[k]} migrations": v for k, v in f["means"].items()}
        target("Figure 8: the more migrations allowed, the lower the load distance", "rj1", "match").add(
            "match" if f["fig8"] else "miss",
            means,
            "by maxMigrations "
            + ", ".join(f"{BOUNDS[k]} {v:.2f}" for k, v in f["means"].items())
            + ": not decreasing",
        )
        over = f["overhead"]
        target("Figure 9: unrestricted migrations cost >= 3x the 13's", "rj1", "match").add(
            "match" if f["fig9"] else "miss",
            {"overhead 13 (s)": over["milp"], "overhead unrestricted (s)": over["milp, unrestricted"]},
            f"unrestricted {over['milp, unrestricted']:,.0f} s < 3x {over['milp']:,.0f} s",
        )
    return list(targets.values())


def num(value: float | None) -> str:
    """Counts as integers, the rest with two decimals; None (B never drained) as -."""
    if value is None:
        return "-"
    return f"{value:,}" if isinstance(value, int) else f"{value:,.2f}"


def spread(values: Sequence[float | None]) -> str:
    """median (min-max) of the values present, and on how many seeds there was none (B never drained)."""
    present = [v for v in values if v is not None]
    absent = f", none on {len(values) - len(present)}" if len(present) < len(values) else ""
    if not present:
        return f"none{absent}"
    counts = all(isinstance(v, int) for v in present)  # a median of counts stays a count where it is whole
    return median_range(present, lambda v: num(int(v) if counts and float(v).is_integer() else v)) + absent


def over_seeds(t: Target, seeds: list[int]) -> str:
    """The verdict across the seeds: ``good`` on every seed (where the target applies), on k of n, else
    out of reach (every remaining seed proven so by the bound) or missed; then the other seeds and why."""
    by: dict[str, list[int]] = {}
    for seed, outcome in zip(seeds, t.outcomes):
        by.setdefault(outcome, []).append(seed)
    applicable = len(seeds) - len(by.get("n/a", []))
    where = " where it applies" if applicable < len(seeds) else ""
    good, bad = len(by.get(t.good, [])), "MISSED" if t.good == "met" else "miss"
    if applicable == 0:
        head = "n/a on every seed"
    elif good == applicable:
        head = f"{t.good} on every seed{where}"
    elif good:
        head = f"{t.good} on {good} of {applicable} seeds{where}"
    elif len(set(by) - {"n/a"}) == 1:
        head = f"{next(iter(set(by) - {'n/a'}))} on every seed{where}"
    else:
        head = bad
    others = [
        f"{outcome} on seed{'s' * (len(on) > 1)} " + ", ".join(f"{s} ({t.notes[seeds.index(s)]})" for s in on)
        for outcome, on in by.items()
        if outcome != t.good
    ]
    figures = ", ".join(f"{name} {spread(values)}" for name, values in t.figures.items())
    return f"- {t.name}: **{head}**{''.join('; ' + o for o in others)}; {figures}"


def table_51(runs: list[dict], sizes: list[Size]) -> tuple[list[str], list[list[str]]]:
    """Section 5.1's figures per size and varies, median (min-max) over the seeds, baselines alongside."""
    columns = ["size", "varies", "initial LD", "MILP LD", "bound", "Flux LD", "PoTC LD", "C-MR LD", "MILP s"]
    milp = f"milp@{TARGET_LIMIT:g}dt"
    cells = [(milp, "initial"), (milp, "load_distance"), (milp, "bound")]
    cells += [(policy, "load_distance") for policy in HEURISTICS] + [(milp, "seconds")]
    rows = []
    for size in map(label, sizes):
        for varies in VARIES:
            found = [r for run in runs for r in run["q51"] if r["size"] == size and r["varies"] == varies]
            rows.append(
                [size, str(varies)]
                + [spread([r[key] for r in found if r["policy"] == policy]) for policy, key in cells]
            )
    return columns, rows


def table_claims(targets: list[Target], seeds: list[int]) -> tuple[list[str], list[list[str]]]:
    """Figure 5's and Real Job 1's figures: median (min-max) and each seed's value."""
    columns = ["claim", "figure", "median (min-max)", "per seed " + ", ".join(map(str, seeds))]
    rows = [
        [t.name.split(":")[0], name, spread(values), ", ".join(map(num, values))]
        for t in targets
        if t.part != "5.1"
        for name, values in t.figures.items()
    ]
    return columns, rows


def reading(targets: list[Target], seeds: list[int]) -> str:
    """What the seeds change: how many verdicts hold on every seed, and which ones seed 1 alone (the ALBIC
    section's run) reads otherwise than the other seeds."""
    steady = sum(len(set(t.outcomes)) == 1 for t in targets)
    always = sum(set(t.outcomes) <= {t.good, "n/a"} and t.good in t.outcomes for t in targets)
    text = (
        f"Reading. {steady} of {len(targets)} verdicts read the same on all {len(seeds)} seeds; "
        f"{always} are met or matched on every seed where they apply"
    )
    # Where a target does not apply on a seed (n/a) that seed neither meets nor misses it.
    varying = [t for t in targets if len(set(t.outcomes) - {"n/a"}) > 1]
    if 1 in seeds and len(seeds) > 1:
        i = seeds.index(1)
        lucky = [t.name for t in varying if t.outcomes[i] == t.good]
        unlucky = [t.name for t in varying if t.outcomes[i] not in (t.good, "n/a") and t.good in t.outcomes]
        if lucky:
            text += (
                f"; seed 1 (the ALBIC section's run) reads {len(lucky)} as met that other seeds do not: "
                + ("; ".join(lucky))
            )
        if unlucky:
            text += f"; seed 1 misses {len(unlucky)} that other seeds meet: " + "; ".join(unlucky)
        others = [t.name for t in varying if t.name not in lucky and t.name not in unlucky]
        if others:
            text += (
                "; these change with the seed otherwise (between missed and out of reach, or seed 1 is n/a): "
                + "; ".join(others)
            )
    return (
        text + ". The MILP's answers depend only on the seed (deterministic time), the seconds also on the "
        "machine's load, so a solve-time miss on one seed can be noise where the others are well under 5 s."
    )


def plot(runs: list[dict], args: argparse.Namespace, path: Path) -> str:
    """Median and min-max over the seeds: Section 5.1 (MILP, bound, Flux), Figure 5 per round, Real Job 1
    per period (Figure 6) and by maxMigrations (Figure 8)."""
    fig, axes = plt.subplots(2, 2, figsize=(13, 8))
    ax = axes[0][0]
    keys = [(label(s), v) for s in args.sizes for v in VARIES]
    for offset, (policy, key, name) in enumerate(
        [
            (f"milp@{TARGET_LIMIT:g}dt", "load_distance", "MILP"),
            (f"milp@{TARGET_LIMIT:g}dt", "bound", "bound"),
            ("flux", "load_distance", "Flux"),
        ]
    ):
        values = np.array(
            [
                [
                    next(r[key] for r in run["q51"] if (r["size"], r["varies"], r["policy"]) == (*k, policy))
                    for k in keys
                ]
                for run in runs
            ]
        )
        med = np.median(values, axis=0)
        x = np.arange(len(keys)) + (offset - 1) * 0.2
        ax.errorbar(
            x, med, yerr=[med - values.min(axis=0), values.max(axis=0) - med], fmt="o", capsize=3, label=name
        )
    ax.axhline(1.0, color="grey", ls=":", lw=0.8)
    ax.set_xticks(range(len(keys)), [f"{s}\nv{v}" for s, v in keys], fontsize=7)
    ax.set(
        title=f"Sec. 5.1: {TARGET_MIGRATIONS} migrations, deterministic time {TARGET_LIMIT}",
        ylabel="load distance (pp)",
    )
    ax.legend(fontsize=7)

    def band(ax: plt.Axes, series: list[list[float]], name: str) -> None:
        data = np.array(series)
        x = np.arange(1, data.shape[1] + 1)
        (line,) = ax.plot(x, np.median(data, axis=0), marker=".", label=name)
        ax.fill_between(x, data.min(axis=0), data.max(axis=0), color=line.get_color(), alpha=0.2)

    for case in ("1OL", "5OL"):
        for mode in ("integrated", "non-integrated"):
            band(axes[0][1], [run["scale"][(case, mode)]["load_distance"] for run in runs], f"{case} {mode}")
    axes[0][1].set(
        title=f"Fig. 5: scale-in on {label(args.scale_size)}", xlabel="round", ylabel="load distance (pp)"
    )
    axes[0][1].legend(fontsize=7)
    for policy in ("milp", "flux", "potc"):
        band(axes[1][0], [[r["load_distance"] for r in run["real"][policy]] for run in runs], policy)
    axes[1][0].axhline(1.0, color="grey", ls=":", lw=0.8)
    axes[1][0].set(
        title="Real Job 1, Fig. 6: 13 migrations a period", xlabel="period", ylabel="load distance (pp)"
    )
    axes[1][0].legend(fontsize=7)
    means = np.array(
        [[np.mean([r["load_distance"] for r in run["real"][k][WARM_UP:]]) for k in BOUNDS] for run in runs]
    )
    med = np.median(means, axis=0)
    axes[1][1].errorbar(
        list(BOUNDS.values()),
        med,
        yerr=[med - means.min(axis=0), means.max(axis=0) - med],
        fmt="o",
        capsize=3,
    )
    axes[1][1].set(title="Real Job 1, Fig. 8: mean load distance", xlabel="maxMigrations", ylabel="pp")
    fig.suptitle(f"median and min-max over seeds {', '.join(map(str, args.seeds))}")
    return save_figure(fig, path)


def report(
    runs: list[dict],
    targets: list[Target],
    args: argparse.Namespace,
    command: str,
    image: str,
    rendered: str = "",
) -> list[str]:
    """The section; ``rendered`` says when a replayed run was measured and what rendered it again."""
    seeds, wall = args.seeds, sum(run["seconds"] for run in runs)
    fewer = [
        f"{what} {ours} (the ALBIC section: {theirs})"
        for what, ours, theirs in (
            ("Real Job 1 periods", args.periods, REAL_JOB_PERIODS),
            ("scale-in rounds", args.rounds, SCALE_IN_ROUNDS),
            ("Section 5.1 sizes", ", ".join(map(label, args.sizes)), ", ".join(map(label, SIZES))),
            ("scale-in size", label(args.scale_size), label(SIZES[2])),
        )
        if ours != theirs
    ]
    loads = [run["load"] for run in runs]
    note = (
        f"1-minute load average after each seed {min(loads):.2f}-{max(loads):.2f} (this run about 1 of it)"
        + rendered
    )
    columns51, rows51 = table_51(runs, args.sizes)
    columns_c, rows_c = table_claims(targets, seeds)
    return [
        *header(command, note),
        "",
        f"Seeds {', '.join(map(str, seeds))}, {wall:.0f} s in all. Per seed, bench/albic.py's functions with its "
        f"settings: `section_51` at {TARGET_MIGRATIONS} migrations and deterministic time {TARGET_LIMIT} "
        f"({', '.join(map(label, args.sizes))}; varies {', '.join(map(str, VARIES))}; Flux, PoTC and C-MR on "
        f"the same states), `scale_in` (Figure 5, {label(args.scale_size)}, {args.rounds} rounds of 20 "
        f"migrations, deterministic time {SCALE_IN_BUDGET:g}, drain-first on the same states) and `section_52` "
        f"(Real Job 1, {args.periods} periods, deterministic time {REAL_JOB_BUDGET:g}, the first {WARM_UP} "
        "left out of the verdicts). Each seed is judged by bench/albic.py's own rules (`target_judgements`, "
        "`fig5_judgement`, `real_job_figures`); out of reach = the budget bound is above the target, so no "
        "allocation within the migrations reaches it. Cells: median (min-max) over the seeds; LD = load "
        "distance in percentage points; seconds are wall seconds."
        + (f" Reduced from the ALBIC section's run: {'; '.join(fewer)}." if fewer else ""),
        "",
        f"![ALBIC at several seeds](img/{image})",
        "",
        f"### Section 5.1 at {TARGET_MIGRATIONS} migrations, deterministic time {TARGET_LIMIT}",
        "",
        *markdown(columns51, rows51),
        "",
        "### Figure 5 and Real Job 1",
        "",
        *markdown(columns_c, rows_c),
        "",
        "### Verdicts over the seeds",
        "",
        *(over_seeds(t, seeds) for t in targets),
        "",
        reading(targets, seeds),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1,2,3,4,5", help="comma-separated seeds")
    parser.add_argument(
        "--periods", type=int, default=None, help=f"Real Job 1 periods (default {REAL_JOB_PERIODS})"
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help=f"scale-in rounds (default {SCALE_IN_ROUNDS})"
    )
    parser.add_argument(
        "--sizes", default=None, help="Section 5.1 sizes, e.g. 20/400/10,40/800/20 (default all)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke test: the first 2 seeds, 20/400/10 only (5.1 and scale-in), 8 Real Job 1 periods; no docs",
    )
    parser.add_argument("--no-write", action="store_true", help="print the section, leave docs/ alone")
    parser.add_argument(
        "--replay", default=None, help="render the measurements a run saved (same other options), not measure"
    )
    args = parser.parse_args()
    args.seeds = [int(s) for s in args.seeds.split(",")]
    sizes = [tuple(int(v) for v in s.split("/")) for s in args.sizes.split(",")] if args.sizes else SIZES
    args.sizes, args.scale_size = sizes, SIZES[2]
    if args.quick:
        args.seeds, args.sizes, args.scale_size, args.no_write = args.seeds[:2], [SIZES[0]], SIZES[0], True
    args.periods = args.periods or (8 if args.quick else REAL_JOB_PERIODS)
    args.rounds = args.rounds or SCALE_IN_ROUNDS
    command = shlex.join(["python", "bench/albic_seeds.py", *sys.argv[1:]])
    rendered = ""
    if args.replay:
        saved = pickle.loads(Path(args.replay).read_bytes())
        runs, rendered = saved["runs"], f"; measured {saved['measured']}, rendered again by `{command}`"
        command = saved["command"]
    else:
        runs = measure(args)
        measured = f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
        saved_path = Path(tempfile.gettempdir()) / "albic_seeds_runs.pickle"
        saved_path.write_bytes(pickle.dumps({"runs": runs, "command": command, "measured": measured}))
        console.print(f"measurements saved to {saved_path} (--replay renders them again)")
    targets = judge(runs, args.sizes)
    image = image_dir(args.no_write) / "albic_seeds.png"
    lines = report(runs, targets, args, command, plot(runs, args, image), rendered)
    publish(SECTION, lines, image, args.no_write, console)


if __name__ == "__main__":
    main()
