"""COLA against NONE, FINT and METIS: the paper's Table 1, plan time, and the gap to the exact optimum.

    .venv/bin/python bench/cola.py [--quick]

1. Table 1 (Khandekar et al., Section 4): on the VWAP-like graphs VWAP1 (200 operators / 283 arcs)
   and VWAP2 (217 / 315) from bench/graphs.py, with 4, 5, 6 and 7 hosts of 4 cores (the paper's
   dual-CPU dual-core blades), each algorithm's cut size and maximum PE size as fractions of a host,
   U, feasibility and plan time. FINT runs with its size limit at a whole host (gamma = 1, our reading)
   and at half a host (gamma = 0.5, where the paper's FINT PEs ended up); COLA runs as Advanced COLA
   (the default, f(U, C) with phase 4) and as Basic COLA ("COLA-B", the variant the paper's Section 4
   measured).
2. Gap to the exact optimum (streamtopo.planner.placement.exact, CP-SAT) on seeded random layered DAGs of
   8..16 operators on 2..4 hosts, in COLA's objective f(U, C).
3. Plan time of COLA on VWAP-like graphs of 200 and 5,000 operators (1,000 with --quick), each in a
   child process with a time limit.

Prints rich tables, draws docs/img/cola_table1.png and rewrites the "COLA" section of
docs/benchmarks.md (command, machine, date, tables, targets met or missed).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import platform
import queue as queue_module
import random
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import product
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench.graphs import random_layered_dag, vwap_like
from bench.report import write_section
from streamtopo.planner.cluster import Cluster
from streamtopo.planner.placement.cola import ColaOptions
from streamtopo.planner.placement.exact import NoFeasiblePlan, exact_plan
from streamtopo.planner.placement.fusion import plan_fusion
from streamtopo.planner.plan import Plan

HOST_CPU = 4.0
GRAPHS = {"VWAP1": (200, 283), "VWAP2": (217, 315)}
HOSTS = (4, 5, 6, 7)
ALGORITHMS = {  # column -> (algorithm, options)
    "NONE": ("none", None),
    "FINT": ("fint", ColaOptions(gamma=1.0)),
    "FINT/2": ("fint", ColaOptions(gamma=0.5)),
    "METIS": ("metis", None),
    "COLA": ("cola", ColaOptions()),
    "COLA-B": ("cola", ColaOptions(advanced=False)),
}
OBJECTIVE = ColaOptions()
SECTION = "COLA"


@dataclass(frozen=True)
class Row:
    graph: str
    hosts: int
    algorithm: str
    cut: float
    """C as a fraction of one host (NaN without a plan)."""
    max_pe: float
    """Largest PE SIZE as a fraction of one host (NaN without a plan)."""
    utilization: float
    feasible: bool
    seconds: float | None
    note: str = ""
    """Why there is no plan: a time-out or an error."""


@dataclass(frozen=True)
class Outcome:
    plan: Plan | None
    seconds: float | None
    note: str


def _plan_child(graph, cluster, algorithm: str, options, queue, seed: int) -> None:
    try:
        start = time.perf_counter()
        plan = plan_fusion(graph, cluster, None, algorithm, options, seed=seed)
        queue.put(Outcome(plan, time.perf_counter() - start, ""))
    except Exception as error:  # noqa: BLE001 -- reported in the tables: the planner failed here
        queue.put(Outcome(None, None, f"error: {type(error).__name__}: {error}"[:120]))


def limited(graph, cluster, algorithm: str, options, limit: float, seed: int = 0) -> Outcome:
    """Plan in a forked child so a slow or crashing planner costs at most ``limit`` seconds."""
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_plan_child, args=(graph, cluster, algorithm, options, queue, seed))
    child.start()
    try:
        outcome = queue.get(timeout=limit)
    except queue_module.Empty:
        outcome = Outcome(
            None,
            None,
            f"timed out after {limit:g} s" if child.is_alive() else f"crashed (exit code {child.exitcode})",
        )
    if child.is_alive():
        child.kill()
    child.join()
    return outcome


def table1(progress: Progress, limit: float, seed: int = 0) -> list[Row]:
    """Table 1's rows on the VWAP-like graphs drawn with ``seed``, planned with the same seed."""
    rows = []
    task = progress.add_task("Table 1", total=len(GRAPHS) * len(HOSTS) * len(ALGORITHMS))
    for name, (operators, arcs) in GRAPHS.items():
        for hosts in HOSTS:
            graph = vwap_like(operators, arcs, seed=seed, capacity=hosts * HOST_CPU)
            cluster = Cluster.uniform(hosts, HOST_CPU)
            for column, (algorithm, options) in ALGORITHMS.items():
                progress.update(task, description=f"Table 1: {name} {hosts} hosts {column}")
                outcome = limited(graph, cluster, algorithm, options, limit, seed)
                plan = outcome.plan
                if plan is None:
                    rows.append(
                        Row(name, hosts, column, math.nan, math.nan, math.nan, False, None, outcome.note)
                    )
                else:
                    rows.append(
                        Row(
                            name,
                            hosts,
                            column,
                            plan.communication_cost / HOST_CPU,
                            max(pe.size for pe in plan.pes) / HOST_CPU,
                            plan.max_utilization,
                            plan.feasible,
                            outcome.seconds,
                        )
                    )
                progress.advance(task)
    return rows


@dataclass(frozen=True)
class Gap:
    seed: int
    operators: int
    hosts: int
    optimum: float
    optimal: bool
    gaps: dict[str, float | None]
    """Algorithm -> (f - f*) / f*, None when it found no feasible plan (or none in time)."""


def gaps(count: int, progress: Progress, limit: float) -> list[Gap]:
    out = []
    task = progress.add_task("gap to optimum", total=count)
    for seed in range(count):
        rng = random.Random(seed)
        operators, hosts = rng.randint(8, 16), rng.randint(2, 4)
        cpu = 2.0
        graph = random_layered_dag(operators, seed=seed, capacity=hosts * cpu)
        cluster = Cluster.uniform(hosts, cpu)
        try:
            best = exact_plan(graph, cluster, options=OBJECTIVE, time_limit=60)
        except NoFeasiblePlan:
            progress.advance(task)
            continue
        optimum = score(best)
        found = {}
        for column in ("COLA", "FINT", "METIS"):
            algorithm, options = ALGORITHMS[column]
            plan = limited(graph, cluster, algorithm, options, limit).plan
            found[column] = (score(plan) - optimum) / optimum if plan is not None and plan.feasible else None
        out.append(Gap(seed, operators, hosts, optimum, best.details["optimal"], found))
        progress.advance(task)
    return out


def score(plan: Plan) -> float:
    return OBJECTIVE.objective(plan.max_utilization, plan.communication_cost, plan.capacity)


def scaling(
    sizes: tuple[int, ...], limit: float, progress: Progress
) -> list[tuple[int, int, int, float | None, str]]:
    """(operators, arcs, hosts, seconds or None, outcome) of COLA per size, each with a time limit."""
    out = []
    task = progress.add_task("plan time", total=len(sizes))
    for operators in sizes:
        hosts = max(4, math.ceil(operators / 300))
        progress.update(task, description=f"plan time: {operators} operators on {hosts} hosts")
        graph = vwap_like(operators, None, seed=0, capacity=hosts * HOST_CPU)
        outcome = limited(graph, Cluster.uniform(hosts, HOST_CPU), "cola", ColaOptions(), limit)
        note = outcome.note or f"feasible={outcome.plan.feasible}"
        out.append((operators, graph.number_of_edges(), hosts, outcome.seconds, note))
        progress.advance(task)
    return out


# ------------------------------------------------------------------------------------------- reporting


def table1_markdown(rows: list[Row]) -> list[str]:
    """Per graph, the paper's Table 1 layout (cut size and max PE size per algorithm), then plan seconds."""
    columns = list(ALGORITHMS)
    lines = []
    for name, (operators, arcs) in GRAPHS.items():
        lines += [
            (
                f"**{name}** ({operators} operators / {arcs} arcs): cut size and max PE size as fractions of a "
                "4-core host; `*` marks an infeasible plan (U > 1)"
            ),
            "",
            "| hosts | " + " | ".join(f"{c} cut | {c} PE" for c in columns) + " | COLA cut / FINT cut |",
            "|---|" + "---|---|" * len(columns) + "---|",
        ]
        for hosts in HOSTS:
            by = {r.algorithm: r for r in rows if r.graph == name and r.hosts == hosts}
            cells = [cell(by[c]) for c in columns]
            ratio = by["COLA"].cut / by["FINT"].cut if by["FINT"].cut else math.inf
            lines.append(f"| {hosts} | " + " | ".join(cells) + f" | {ratio:.2f} |")
        lines += [
            "",
            f"{name} plan seconds:",
            "",
            "| hosts | " + " | ".join(columns) + " |",
            "|---|" + "---|" * len(columns),
        ]
        for hosts in HOSTS:
            by = {r.algorithm: r for r in rows if r.graph == name and r.hosts == hosts}
            lines.append(
                f"| {hosts} | "
                + " | ".join(
                    f"{by[c].seconds:.2f}" if by[c].seconds is not None else by[c].note for c in columns
                )
                + " |"
            )
        lines.append("")
    return lines


def cell(row: Row) -> str:
    if row.seconds is None:
        return f"{row.note} | -"
    return f"{row.cut:.4f}{'' if row.feasible else ' *'} | {row.max_pe:.4f}"


PAIRS = list(product(("COLA", "COLA-B"), ("FINT", "FINT/2")))
"""Table 1's comparisons: (ours, FINT variant); the target is ours' cut <= CUT_SHARE x FINT's with a max
PE no larger, on every row."""
CUT_SHARE = 0.7
TABLE1_SECONDS = 2.0


def pair_rows(rows: list[Row], ours: str, fint: str) -> list[tuple[Row, Row, bool, bool]]:
    """Per Table 1 row, (ours, FINT's, cut <= CUT_SHARE x FINT's, max PE <= FINT's)."""
    out = []
    for r in rows:
        if r.algorithm != ours:
            continue
        f = next(f for f in rows if f.graph == r.graph and f.hosts == r.hosts and f.algorithm == fint)
        out.append((r, f, r.cut <= CUT_SHARE * f.cut + 1e-12, r.max_pe <= f.max_pe + 1e-9))
    return out


def slowest_cola(rows: list[Row]) -> Row:
    """The COLA row that took longest to plan (one without a plan counts as slowest)."""
    cola = [r for r in rows if r.algorithm == "COLA"]
    return max(cola, key=lambda r: math.inf if r.seconds is None else r.seconds)


def targets(rows: list[Row], gap_rows: list[Gap], scale: list) -> list[tuple[str, bool, str]]:
    out = []
    for ours, fint in PAIRS:
        pairs = pair_rows(rows, ours, fint)
        cut_ok = [cut for _, _, cut, _ in pairs]
        pe_ok = [pe for _, _, _, pe in pairs]
        both = sum(a and b for a, b in zip(cut_ok, pe_ok, strict=True))
        out.append(
            (
                f"{ours} cut <= {CUT_SHARE:g} x {fint} cut with max PE <= {fint}'s, every row",
                both == len(pairs),
                f"both {both}/{len(pairs)} rows (cut {sum(cut_ok)}/{len(pairs)}, PE {sum(pe_ok)}/{len(pairs)})",
            )
        )
    cola = [g.gaps["COLA"] for g in gap_rows]
    within = sum(1 for g in cola if g is not None and g <= 0.10)
    share = within / len(cola) if cola else 0.0
    out.append(
        (
            "COLA within 10 % of the exact optimum on >= 90 % of small graphs",
            share >= 0.9,
            f"{within}/{len(cola)} = {share:.0%}",
        )
    )
    slowest = slowest_cola(rows)
    took = slowest.note if slowest.seconds is None else f"{slowest.seconds:.2f} s"
    out.append(
        (
            f"200-217 operators planned in <= {TABLE1_SECONDS:g} s on every Table 1 row",
            slowest.seconds is not None and slowest.seconds <= TABLE1_SECONDS,
            f"slowest {took} ({slowest.graph}, {slowest.hosts} hosts)",
        )
    )
    for operators, _, hosts, seconds, outcome in scale:
        bound = 2.0 if operators <= 200 else 60.0
        text = outcome if seconds is None else f"{seconds:.2f} s"
        out.append(
            (
                f"{operators} operators planned in <= {bound:g} s",
                seconds is not None and seconds <= bound,
                f"{text} ({hosts} hosts)",
            )
        )
    return out


def plot(rows: list[Row], path: Path) -> None:
    fig, axes = plt.subplots(2, len(GRAPHS), figsize=(11, 6.5), sharex=True)
    width = 0.8 / len(ALGORITHMS)
    for col, name in enumerate(GRAPHS):
        for row, (field, label) in enumerate(
            (("cut", "cut size (hosts)"), ("max_pe", "max PE size (hosts)"))
        ):
            ax = axes[row][col]
            for i, algorithm in enumerate(ALGORITHMS):
                values = [
                    getattr(
                        next(
                            r for r in rows if r.graph == name and r.hosts == h and r.algorithm == algorithm
                        ),
                        field,
                    )
                    for h in HOSTS
                ]
                ax.bar([h - 0.4 + width * (i + 0.5) for h in HOSTS], values, width, label=algorithm)
            ax.set_ylabel(label)
            ax.set_title(f"{name}: {label}")
            ax.set_xticks(HOSTS)
            if row == 1:
                ax.set_xlabel("hosts (4 cores each)")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="fewer gap graphs, 1,000 instead of 5,000 operators"
    )
    parser.add_argument(
        "--gap-graphs", type=int, default=None, help="number of small graphs (default 30, quick 10)"
    )
    parser.add_argument("--limit", type=float, default=120.0, help="seconds allowed per plan (Table 1, gaps)")
    args = parser.parse_args()
    count = args.gap_graphs or (10 if args.quick else 30)
    sizes = (200, 1000) if args.quick else (200, 5000)
    console = Console()
    with Progress(console=console) as progress:
        rows = table1(progress, args.limit)
        gap_rows = gaps(count, progress, args.limit)
        scale = scaling(sizes, 120.0 if args.quick else 300.0, progress)

    md = table1_markdown(rows)
    for line in md:
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    gap_table = Table(title="gap to the exact optimum, f(U, C) = U + C / host capacity")
    for column in ("seed", "operators", "hosts", "f*", "proved", "COLA gap", "FINT gap", "METIS gap"):
        gap_table.add_column(column, justify="right")
    for g in gap_rows:
        gap_table.add_row(
            str(g.seed),
            str(g.operators),
            str(g.hosts),
            f"{g.optimum:.4f}",
            str(g.optimal),
            *(("infeasible" if g.gaps[c] is None else f"{g.gaps[c]:.1%}") for c in ("COLA", "FINT", "METIS")),
        )
    console.print(gap_table)
    results = targets(rows, gap_rows, scale)
    target_table = Table(title="targets")
    for column in ("target", "met", "measured"):
        target_table.add_column(column)
    for name, met, measured in results:
        target_table.add_row(name, "yes" if met else "NO", measured)
    console.print(target_table)

    image = ROOT / "docs/img/cola_table1.png"
    plot(rows, image)
    mode = " --quick" if args.quick else ""
    lines = [
        f"Command: `.venv/bin/python bench/cola.py{mode}`  ",
        (
            f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"{platform.system()} {platform.release()}  "
        ),
        f"Date: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        "",
        (
            "Graphs from bench/graphs.py (shaping in docs/planning.md); FINT = size limit one host, FINT/2 = half a "
            "host; COLA = Advanced COLA (default options), COLA-B = Basic COLA (the paper's Section 4 variant). "
            "Plot: ![Table 1](img/cola_table1.png). Graphs and planners at seed 0; Table 1 at five seeds: section "
            '"COLA Table 1 at several seeds (issue 35)" (bench/cola_seeds.py).'
        ),
        "",
        *md,
        (
            f"Gap to the exact optimum (CP-SAT, f(U, C) = U + C / host capacity), {len(gap_rows)} random layered "
            "DAGs of 8-16 operators on 2-4 hosts of 2 cores:"
        ),
        "",
        "| algorithm | within 10 % | median gap | worst gap | infeasible |",
        "|---|---|---|---|---|",
    ]
    for column in ("COLA", "FINT", "METIS"):
        values = sorted(g.gaps[column] for g in gap_rows if g.gaps[column] is not None)
        within = sum(1 for v in values if v <= 0.10)
        median = values[len(values) // 2] if values else float("nan")
        worst = values[-1] if values else float("nan")
        lines.append(
            f"| {column} | {within}/{len(gap_rows)} | {median:.1%} | {worst:.1%} | "
            f"{len(gap_rows) - len(values)} |"
        )
    lines += [
        "",
        "COLA plan time on VWAP-like graphs (VWAP2 density, hosts = max(4, operators / 300)):",
        "",
        "| operators | arcs | hosts | seconds | outcome |",
        "|---|---|---|---|---|",
    ]
    for operators, arcs, hosts, seconds, outcome in scale:
        lines.append(
            f"| {operators} | {arcs or '-'} | {hosts} | "
            f"{'-' if seconds is None else f'{seconds:.2f}'} | {outcome} |"
        )
    lines += ["", "Targets:", "", "| target | met | measured |", "|---|---|---|"]
    lines += [f"| {name} | {'yes' if met else 'NO'} | {measured} |" for name, met, measured in results]
    write_section(SECTION, lines)
    console.print(f"wrote {image.relative_to(ROOT)} and the {SECTION} section of docs/benchmarks.md")


if __name__ == "__main__":
    main()
