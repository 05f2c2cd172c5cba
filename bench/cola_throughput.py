"""COLA's Table 2 and Figure 7 on the real runtime: VWAP's throughput under NONE, FINT and COLA, per
profiling iteration, relative to NONE.

    .venv/bin/python bench/cola_throughput.py [--hosts 4] [--iterations 6] [--repeats 3] [--records N]

Khandekar et al., Section 4: run NONE (every operator its own PE) in profiling mode; plan FINT and COLA on
its measured costs (iteration 1; COLA with the hosts' capacities scaled by gamma = 0.5); run each plan,
measure again and re-plan (gamma + 0.1 per iteration, up to 1.0). Table 2 reports NONE's throughput and,
for FINT and COLA, the first iteration (1st), the first local maximum (1st-local) and the best (Max).

Here a PE is an executor process (its own JVM) and the throughput is records through the job per second
of wall time. The job is VWAP with one of examples/vwap.yaml's four symbol groups (16 operators: trades
and quotes cleaned, VWAP per symbol, quotes matched against it, bargains; NONE would start 37 JVMs for
the whole file on a 2-core machine). Each run starts the plan's executors (JVM start and warm-up outside
the measurement), sets the topology's clock an hour back so every record is due at once (saturation),
hands every unit over through one routing version and times until every sink unit committed the end of
stream. The executors' metrics over the run (busy seconds per unit, records per unit pair) are the next
iteration's profile (``planner.placement.cola.profiling.Profile``, the same the SPL loop builds for
``streamtopo run --profile-iterations``). The planning cluster is ``--hosts`` hosts of ``--host-cpu``
cores; the executors all share this machine's cores, as the paper's blades do not.

Every completed series is appended to docs/data/cola_series.jsonl (its settings, commit and date), and
the report is computed from every stored series of the same settings (:func:`settings`): a series on the
bed takes 12-30 minutes here, so the five the issue asks for can be measured over several sessions
(``--repeats`` is the series this run adds; ``--repeats 0`` reports from the stored ones).

Prints the tables, draws docs/img/cola_throughput.png (Figure 7: relative throughput per iteration) and
rewrites the "COLA throughput" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from rich.console import Console
from rich.table import Table

from bench.report import header, markdown, read_section, verdict, write_section
from bench.runtime import ExecutorGroup
from streamtopo.contracts import KeyGroupId
from streamtopo.controller.adaptation_loop import measured_profile
from streamtopo.controller.platform import MetricsUnavailable, RuntimeStats
from streamtopo.controller.scrape import ScrapeMetricsSource
from streamtopo.documents import load_topology
from streamtopo.local.sources import scale_rates
from streamtopo.local.testbed import EmulatedHosts, EmulatedHostsSpec, leftovers
from streamtopo.planner.cluster import Cluster
from streamtopo.planner.deployment import deployment
from streamtopo.planner.model import StreamTopology
from streamtopo.planner.placement.cola.profiling import iteration_gamma
from streamtopo.planner.placement.fusion import plan_topology
from streamtopo.planner.plan import Plan
from streamtopo.planner.scaling.policy import ScalingConfig
from streamtopo.runtime.embedded import EmbeddedValkey
from streamtopo.runtime.spark import MEMORY_ENV, jit_scaling

SECTION = "COLA throughput"
SERIES = ROOT / "docs" / "data" / "cola_series.jsonl"
"""Every completed series, one JSON object per line: ``settings``, ``hosts``, ``commit``, ``measured``
(UTC) and ``runs`` (fusion -> its :class:`Run` s)."""
GROUPS_LEFT_OUT = ("-b", "-c", "-d")

# Table 2 of the paper (VWAP1 / VWAP2, 4-7 blades): throughput relative to NONE for FINT and COLA's
# 1st, 1st-local and Max iterations.
PAPER = {
    "VWAP1": {
        4: ((2.75, 2.96, 2.96), (2.86, 2.88, 3.05)),
        5: ((2.71, 2.87, 2.87), (2.39, 3.40, 3.40)),
        6: ((1.51, 1.51, 1.55), (1.48, 2.00, 2.06)),
        7: ((1.50, 1.80, 1.88), (1.50, 1.95, 2.03)),
    },
    "VWAP2": {
        4: ((2.29, 2.29, 2.29), (2.02, 2.56, 2.69)),
        5: ((1.47, 1.47, 1.73), (1.53, 2.22, 2.22)),
        6: ((1.55, 1.78, 1.78), (1.63, 2.37, 2.37)),
        7: ((1.46, 2.39, 2.39), (1.64, 2.35, 2.35)),
    },
}


def vwap(records: int, interval: float | None = None) -> StreamTopology:
    """examples/vwap.yaml with symbol group a only, finite sources (40 % trades, 60 % quotes, as the
    file's rates) and the declared costs kept (NONE ignores them; the iterations replace them); its
    executors' step interval ``interval`` seconds (None: the spec's default)."""
    full = load_topology(ROOT / "examples" / "vwap.yaml")
    doc = full.model_dump(mode="json", by_alias=True, exclude_none=True)
    kept = []
    for op in doc["spec"]["operators"]:
        if op["name"].endswith(GROUPS_LEFT_OUT):
            continue
        op["inputs"] = [i for i in op.get("inputs", []) if not i.endswith(GROUPS_LEFT_OUT)]
        if op["kind"] == "source":
            share = 0.4 if op["name"] == "trades" else 0.6
            op["source"]["count"] = int(records * share)
        kept.append(op)
    doc["spec"]["operators"] = kept
    if interval is not None:
        doc["spec"].setdefault("batching", {})["interval"] = f"{interval:g}s"
    doc["metadata"] = {"name": "vwap1"}
    return StreamTopology.model_validate(doc)


@dataclass(frozen=True)
class Run:
    fusion: str
    iteration: int
    gamma: float | None
    pes: int
    throughput: float
    """Records per second of wall time, from the routing version to every sink's end of stream."""
    throttled: dict[str, float] = field(default_factory=dict)
    """On the bed, per host (``valkey``: Valkey's): the share of CFS periods with work in which the host
    used its whole CPU quota over the run (EmulatedHosts.periods): how often its capacity held it back."""

    @property
    def busiest(self) -> tuple[str, float] | None:
        """The executor host most often held back and its throttled share (None off the bed)."""
        hosts = [(h, share) for h, share in self.throttled.items() if h != "valkey"]
        return max(hosts, key=lambda pair: pair[1]) if hosts else None


def measure(
    top: StreamTopology, plan: Plan, work: Path, bed: EmulatedHosts | None = None
) -> tuple[float, RuntimeStats, dict[KeyGroupId, str], dict[str, float]]:
    """Run ``plan`` once: (records per second, the executors' rates over the run, unit -> executor, the
    hosts' throttled shares, :attr:`Run.throttled`). On ``bed`` each executor starts in the emulated host
    its PE is placed on, Valkey on a host of its own."""
    planned = deployment(plan, top.spec, top.metadata.name, ScalingConfig(max_executors=1), replicas=False)
    ordered = sorted(planned.executors)
    names = {e: f"ex-{i}" for i, e in enumerate(ordered)}
    assignment: dict[KeyGroupId, str] = {u: names[e] for u, e in planned.units.items()}
    records = sum(op.source.count or 0 for op in top.spec.operators if op.source is not None)
    hosts = [planned.executors[e].host or "" for e in ordered] if bed is not None else []
    with (
        bed.valkey() if bed is not None else EmbeddedValkey() as valkey,
        ExecutorGroup(top, work, valkey.url, len(names), time.time() - 3600, bed, hosts) as group,
    ):
        metrics = ScrapeMetricsSource(group.platform.endpoints)
        try:
            metrics.collect(top.metadata.name, 1.0)  # the baseline: rates need two collections
        except MetricsUnavailable:
            pass
        before = bed.periods() if bed is not None else {}
        start = time.perf_counter()
        group.route(assignment)
        if not group.wait(lambda: group.done(top.spec.operators), timeout=3600.0):
            raise TimeoutError(f"{plan.algorithm} with {len(plan.pes)} PEs did not finish in an hour")
        wall = time.perf_counter() - start
        after = bed.periods() if bed is not None else {}
        stats = metrics.collect(top.metadata.name, wall)
    throttled = {
        host or "valkey": (after[host][1] - before[host][1]) / max(1, after[host][0] - before[host][0])
        for host in after
    }
    return records / wall, stats, assignment, throttled


def series(
    top: StreamTopology,
    cluster: Cluster,
    fusion: str,
    iterations: int,
    none: tuple[RuntimeStats, dict[KeyGroupId, str]],
    work: Path,
    bed: EmulatedHosts | None,
) -> list[Run]:
    """Iterations 1..N of ``fusion`` (cola or fint), each planned on the previous run's measurements."""
    out, (stats, placement), known = [], none, None
    for k in range(1, iterations + 1):
        gamma = iteration_gamma(k) if fusion == "cola" else None
        profile = measured_profile(stats, placement, gamma or 1.0, known)
        known = profile.crossing_cost  # measured on NONE, kept (as the SPL loop does)
        plan = plan_topology(top.spec, cluster, algorithm=fusion, profile=profile)
        throughput, stats, placement, throttled = measure(top, plan, work / f"{fusion}-{k}", bed)
        out.append(Run(fusion, k, gamma, len(plan.pes), throughput, throttled))
        print(
            f"  {fusion} iteration {k}: {len(plan.pes)} PEs, {throughput:,.0f} records/s{held_back(out[-1])}",
            flush=True,
        )
    return out


def held_back(run: Run) -> str:
    """``run``'s throttling on the bed in words: its busiest executor host's share and Valkey's host's."""
    if run.busiest is None:
        return ""
    host, share = run.busiest
    return (
        f"; throttled in {share:.0%} of its periods on {host} (the busiest host), "
        f"{run.throttled.get('valkey', 0.0):.0%} on Valkey's"
    )


def choices(runs: Sequence[Run]) -> tuple[float, float, float]:
    """Table 2's choices: the first iteration (1st), the first local maximum (an iteration at least as
    good as its neighbours, 1st-local) and the best (Max)."""
    values = [r.throughput for r in runs]
    local = next(
        (
            v
            for i, v in enumerate(values)
            if (i == 0 or v >= values[i - 1]) and (i + 1 == len(values) or v >= values[i + 1])
        ),
        values[-1],
    )
    return values[0], local, max(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[4], help="planning hosts (the paper: 4-7)")
    parser.add_argument("--host-cpu", type=float, default=1.0, help="cores per planning host")
    parser.add_argument("--iterations", type=int, default=6, help="profiling iterations per fusion")
    parser.add_argument("--repeats", type=int, default=3, help="runs of the whole series per host count")
    parser.add_argument("--records", type=int, default=400_000, help="source records per run")
    parser.add_argument(
        "--testbed",
        action="store_true",
        help="run on emulated hosts (local/testbed.py): a namespace and a --host-cpu CPU quota per host",
    )
    parser.add_argument("--valkey-cpu", type=float, default=0.4, help="cores of the bed's Valkey host")
    parser.add_argument(
        "--step-interval",
        type=float,
        default=None,
        help="the executors' spec.batching.interval in seconds (default: the spec's); 0 steps again at once",
    )
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/ as it is")
    parser.add_argument(
        "--executor-heap",
        default="768m",
        help="each executor's JVM heap: NONE starts one JVM per operator, and 16 at the default share of "
        "the machine's memory ran it out of memory",
    )
    args = parser.parse_args()
    # A SIGTERM unwinds the bed's with-block (its namespaces, links, qdiscs and cgroups go) as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    os.environ[MEMORY_ENV] = args.executor_heap
    console = Console(width=150)
    top = vwap(args.records, args.step_interval)
    if args.testbed:
        # The file's rates load 1-core planning hosts; on a bed the hosts have --host-cpu cores, and the
        # rates scale with them so each plan loads its hosts as it does there (unscaled, 0.4-core hosts
        # split every PE into one executor per key group: 256 JVMs).
        top = scale_rates(top, args.host_cpu)
    results: dict[int, list[dict[str, list[Run]]]] = {}
    dates: dict[int, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="streamtopo-cola-") as tmp:
        work = Path(tmp)
        for hosts in args.hosts:
            cluster = Cluster.uniform(hosts, args.host_cpu)
            spec = EmulatedHostsSpec(hosts=cluster.hosts, valkey_cpu=args.valkey_cpu)
            earlier_series = stored(args, hosts)
            results[hosts] = [runs_of(record) for record in earlier_series]
            dates[hosts] = [record["measured"] for record in earlier_series]
            if not args.repeats:
                continue
            with EmulatedHosts(spec) if args.testbed else nullcontext() as bed:
                for repeat in range(args.repeats):
                    print(
                        f"{hosts} hosts, series {repeat + 1} of {args.repeats} (stored: {len(results[hosts])})",
                        flush=True,
                    )
                    none_plan = plan_topology(top.spec, cluster, algorithm="none")
                    none_rate, none_stats, none_placement, throttled = measure(
                        top, none_plan, work / "none", bed
                    )
                    none_run = Run("none", 0, None, len(none_plan.pes), none_rate, throttled)
                    print(
                        f"  none: {len(none_plan.pes)} PEs, {none_rate:,.0f} records/s{held_back(none_run)}",
                        flush=True,
                    )
                    runs = {"none": [none_run]}
                    for fusion in ("fint", "cola"):
                        runs[fusion] = series(
                            top, cluster, fusion, args.iterations, (none_stats, none_placement), work, bed
                        )
                    results[hosts].append(runs)
                    dates[hosts].append(f"{datetime.now(UTC):%Y-%m-%d %H:%M}")
                    if not args.no_write:
                        store(args, hosts, runs)
    if args.testbed and (left := leftovers(os.getpid())):
        raise SystemExit(f"the test bed left behind: {', '.join(left)}")
    results = {hosts: series_ for hosts, series_ in results.items() if series_}
    if not results:
        raise SystemExit(
            f"no series of these settings in {SERIES.relative_to(ROOT)}; run with --repeats 1 or more"
        )
    report(console, args, top, results, dates)


def settings(args: argparse.Namespace) -> dict[str, object]:
    """What makes two series comparable: the bed, the planning hosts' cores, iterations and records, and
    the executors' settings that change what a step costs: their step interval (``spec.batching.interval``;
    the runtime before it stepped again at once, 0 s) and their JIT's compile thresholds (HotSpot's, 1,
    before runtime/spark.py scaled them). NONE's throughput on the bed doubled between the series of
    2026-12-02 and those of 2026-12-07, so series of other runtimes are kept apart."""
    return {
        "testbed": args.testbed,
        "host_cpu": args.host_cpu,
        "valkey_cpu": args.valkey_cpu if args.testbed else None,
        "iterations": args.iterations,
        "records": args.records,
        "step_interval": vwap(args.records, args.step_interval).spec.batching.interval,
        "jit_scaling": jit_scaling(),
    }


def stored(args: argparse.Namespace, hosts: int) -> list[dict]:
    """The stored series of these settings and host count, oldest first."""
    if not SERIES.exists():
        return []
    lines = (json.loads(line) for line in SERIES.read_text().splitlines() if line.strip())
    return [s for s in lines if s["settings"] == settings(args) and s["hosts"] == hosts]


def store(args: argparse.Namespace, hosts: int, runs: dict[str, list[Run]]) -> None:
    """Append one completed series (so a run cut off later keeps it)."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    record = {
        "settings": settings(args),
        "hosts": hosts,
        "commit": commit,
        "measured": f"{datetime.now(UTC):%Y-%m-%d %H:%M}",
        "runs": {fusion: [asdict(r) for r in rs] for fusion, rs in runs.items()},
    }
    SERIES.parent.mkdir(parents=True, exist_ok=True)
    with SERIES.open("a") as file:
        file.write(json.dumps(record) + "\n")


def runs_of(record: dict) -> dict[str, list[Run]]:
    return {fusion: [Run(**r) for r in rs] for fusion, rs in record["runs"].items()}


def nones(series_: list[dict[str, list[Run]]]) -> list[float]:
    """NONE's throughput in each series."""
    return [s["none"][0].throughput for s in series_]


def per_series(series_: list[dict[str, list[Run]]], fusion: str) -> list[tuple[float, float, float]]:
    """Table 2's choices (1st, 1st-local, Max) within each series (repeat) of ``fusion``."""
    return [choices(s[fusion]) for s in series_]


def cell(values: list[float], none: float) -> str:
    """A choice over the repeats: the median (relative to NONE's median), then the range."""
    middle = statistics.median(values)
    return f"{middle:,.0f} ({middle / none:.2f}; {min(values):,.0f}-{max(values):,.0f})"


def report(
    console: Console,
    args: argparse.Namespace,
    top: StreamTopology,
    results: dict[int, list[dict[str, list[Run]]]],
    dates: dict[int, list[str]],
) -> None:
    rows = []
    for hosts, series_ in results.items():
        none_runs = nones(series_)
        none = statistics.median(none_runs)
        fint, cola = per_series(series_, "fint"), per_series(series_, "cola")
        paper = PAPER["VWAP1"].get(hosts)
        rows.append(
            (
                hosts,
                f"{none:,.0f} (1; {min(none_runs):,.0f}-{max(none_runs):,.0f})",
                *(cell([c[i] for c in runs], none) for runs in (fint, cola) for i in range(3)),
                "-" if paper is None else " / ".join(f"{a:.2f}" for a in paper[0]),
                "-" if paper is None else " / ".join(f"{a:.2f}" for a in paper[1]),
                len(series_),
                f"{min(dates[hosts])} - {max(dates[hosts])}",
            )
        )
    columns = [
        "hosts",
        "NONE",
        "FINT 1st",
        "FINT 1st-local",
        "FINT Max",
        "COLA 1st",
        "COLA 1st-local",
        "COLA Max",
        "paper FINT (VWAP1)",
        "paper COLA (VWAP1)",
        "repeats",
        "measured (UTC)",
    ]
    table = Table(title="records per second: median over the repeats (relative to NONE's; min-max)")
    for c in columns:
        table.add_column(c, justify="right")
    for row in rows:
        table.add_row(*(str(v) for v in row))
    console.print(table)

    measured = sorted(results)
    stem = "cola_testbed" if args.testbed else "cola_throughput"
    section = f"{SECTION} on emulated hosts (issue 35)" if args.testbed else SECTION
    image = (
        ROOT
        / "docs/img"
        / (f"{stem}.png" if measured == [4] else f"{stem}_{'-'.join(map(str, measured))}.png")
    )
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for colour, hosts in enumerate(measured):
        none = statistics.median(nones(results[hosts]))
        for offset, (fusion, marker, style) in enumerate((("fint", "s", "--"), ("cola", "o", "-"))):
            # per iteration, the series' throughputs relative to NONE's median
            iterations = list(zip(*([r.throughput / none for r in s[fusion]] for s in results[hosts])))
            middle = [statistics.median(runs) for runs in iterations]
            ax.errorbar(
                [k + 1 + (offset - 0.5) * 0.08 for k in range(len(middle))],
                middle,
                yerr=[
                    [m - min(runs) for m, runs in zip(middle, iterations)],
                    [max(runs) - m for m, runs in zip(middle, iterations)],
                ],
                marker=marker,
                linestyle=style,
                capsize=3,
                color=f"C{colour}",
                label=f"{fusion.upper()}, {hosts} hosts",
            )
    ax.axhline(1.0, color="grey", linestyle=":", label="NONE (median)")
    ax.set_xlabel("profiling iteration")
    ax.set_ylabel("throughput relative to NONE (median, min-max)")
    ax.set_title(f"Figure 7 on the runtime: VWAP (group a), {', '.join(map(str, measured))} planning hosts")
    ax.legend(fontsize=8)
    fig.tight_layout()
    if not args.no_write:
        fig.savefig(image, dpi=120)
    plt.close(fig)

    pes = [
        f"PEs (executors) per iteration at {hosts} hosts, first series: NONE {results[hosts][0]['none'][0].pes}, "
        f"FINT {[r.pes for r in results[hosts][0]['fint']]}, COLA {[r.pes for r in results[hosts][0]['cola']]}."
        for hosts in measured
    ]
    pes += [line for hosts in measured if (line := throttling(hosts, results[hosts]))]
    verdicts = []
    for hosts_, series_ in results.items():
        none_runs = nones(series_)
        cola_max = [c[2] for c in per_series(series_, "cola")]
        fint_max = [c[2] for c in per_series(series_, "fint")]
        paper = PAPER["VWAP1"].get(hosts_)
        over_none, why_none = verdict(cola_max, none_runs)
        over_fint, why_fint = verdict(cola_max, fint_max)
        verdicts.append(
            f"- {hosts_} hosts, {len(series_)} series: COLA Max against NONE: **{over_none}** ({why_none}; "
            f"median {statistics.median(cola_max) / statistics.median(none_runs):.2f}x"
            + ("" if paper is None else f", the paper {paper[1][2]:.2f}x")
            + f"); against FINT Max: **{over_fint}** ({why_fint}"
            + ("" if paper is None else f"; the paper {paper[1][2] / paper[0][2]:.2f}x")
            + ")."
        )
    kept_rows, kept_verdicts, kept_notes = earlier(section, set(results), image.name)
    command = (
        f".venv/bin/python bench/cola_throughput.py --hosts {' '.join(map(str, args.hosts))} --host-cpu "
        f"{args.host_cpu:g} --iterations {args.iterations} --repeats N --records {args.records}"
        + (f" --testbed --valkey-cpu {args.valkey_cpu:g}" if args.testbed else "")
        + (f" --step-interval {args.step_interval:g}" if args.step_interval is not None else "")
    )
    where = (
        f"each host a network namespace with a {args.host_cpu:g}-core CPU quota, Valkey on its own "
        f"{args.valkey_cpu:g}-core host (local/testbed.py), all within its 2 cores"
        if args.testbed
        else "the executors share its 2 cores"
    )
    lines = [
        *header(command, where),
        "",
        f"VWAP with symbol group a of examples/vwap.yaml ({len(top.spec.operators)} operators, "
        f"{args.records:,} source records, all due at once; executors that keep up wait "
        f"{top.spec.batching.interval:g} s between steps at most, spec.batching.interval, and their JITs "
        f"compile at {jit_scaling():g}x HotSpot's thresholds). Throughput = source records / wall seconds "
        "from the routing version to every sink's end of stream. Each cell: the median over the repeats, "
        "relative to NONE's median of the same host count, and the range (min-max); 1st, 1st-local and Max "
        "are chosen within each series. A verdict is beat when every run is above every run it is held "
        "against, miss when every run is below, match when the ranges overlap. The paper's columns are "
        "Table 2's relative gains (1st / 1st-local / Max). Series accumulate over runs of the command "
        f"(each adds N; {SERIES.relative_to(ROOT)} holds every series with its commit and date), and every "
        "figure here is computed from all stored series of these settings; the rows of other host counts "
        "are kept from earlier runs.",
        "",
        *by_hosts(markdown(columns, rows), kept_rows),
        "",
        *(
            part
            for line in sorted([*pes, *kept_notes[0]], key=lambda line: int(line.split(" at ")[1].split()[0]))
            for part in (line, "")
        ),
        *kept_notes[1],
        f"![Figure 7]({image.relative_to(ROOT / 'docs')})",
        "",
        *sorted([*verdicts, *kept_verdicts], key=lambda line: int(line.split()[1])),
        "",
        'Reading, against the paper\'s Table 2 and Figure 7: docs/cola.md, "Throughput on the runtime".',
    ]
    if not args.no_write:
        write_section(section, lines)


def throttling(hosts: int, series_: list[dict[str, list[Run]]]) -> str | None:
    """How often the bed's CPU quotas held each plan back, from the runs that measured it (None if none)."""
    parts = []
    for fusion in ("none", "fint", "cola"):
        runs = [r for s in series_ for r in s[fusion] if r.busiest is not None]
        if runs:
            busiest = statistics.median(r.busiest[1] for r in runs if r.busiest is not None)
            valkey = statistics.median(r.throttled.get("valkey", 0.0) for r in runs)
            parts.append(f"{fusion.upper()} {busiest:.0%} / {valkey:.0%} ({len(runs)} runs)")
    if not parts:
        return None
    return (
        f"PEs held back by their hosts' CPU quotas at {hosts} hosts (the share of 100 ms periods with work "
        "in which a host used its whole quota over a run, the kernel's nr_throttled / nr_periods; median "
        "over runs, the busiest executor host / Valkey's host): " + ", ".join(parts) + "."
    )


def earlier(
    section: str, measured: set[int], image: str
) -> tuple[list[str], list[str], tuple[list[str], list[str]]]:
    """What the section has of host counts this run did not measure: table rows, verdict lines, PE lines,
    and the figures of other host sets than this run's ``image``."""
    rows, verdicts, pes, figures = [], [], [], []

    def hosts_of(words: list[str]) -> int | None:
        return next((int(w) for w in words if w.isdigit()), None)

    for line in read_section(section):
        cells = line.strip("| ").split(" | ")
        if line.startswith("| ") and cells[0].isdigit() and int(cells[0]) not in measured:
            rows.append(line)
        elif line.startswith("- ") and hosts_of(line.split()[1:2]) not in (None, *measured):
            verdicts.append(line)
        elif (
            line.startswith("PEs (executors)") and hosts_of(line.split(" at ")[1].split()[:1]) not in measured
        ):
            pes.append(line)
        elif line.startswith("![Figure 7]") and not line.endswith(f"/{image})"):
            figures.append(line)
    return rows, verdicts, (pes, figures)


def by_hosts(table: list[str], kept: list[str]) -> list[str]:
    """A markdown table (header, rule, rows) with ``kept`` rows added, rows ordered by host count."""
    body = sorted([*table[2:], *kept], key=lambda line: int(line.strip("| ").split(" | ")[0]))
    return [*table[:2], *body]


if __name__ == "__main__":
    main()
