"""C-MR's MACD workflow with and without sub-windows shared across aggregates (thesis 004, Section 3.9.2,
Figures 3.9-3.11: "the optimized C-MR workflow outperforms the simple C-MR workflow with a 31% decrease in
average latency").

    .venv/bin/python bench/cmr_macd.py [--quick]

The workflow is examples/macd.yaml: trades -> prices -> 5 s and 10 s moving averages of each symbol's
price, both sliding by 1 s (the thesis' minutes as seconds) -> a join of the two averages ending at the
same time -> their difference -> a file sink. It runs on one executor (a thread of this process hosting
every unit, records in the JVM until the aggregates' partials) in two variants, measured alternately in
one run:

- ``shared``: the executor's default. One Spark job per step computes the 1 s pane partials (sum and
  count of price per symbol) for both averages (runtime/operators/shared_panes.py), C-MR's optimised
  workflow with its Combine shared by both Reduce operators;
- ``apart``: ``ExecutorConfig(share_panes=False)``. Each average runs its own job over the same records
  (still with panes of its own), the simple C-MR workflow.

1. CPU (Figure 3.11's throughput, per core): the trades of N and 2N records are all due at the start
   (the topology's clock set back), so the executor runs flat out; marginal trades per CPU-second of the
   whole process (Python, JVM, Valkey) is the slope of CPU against N, so start-up cancels.
2. Latency (Figure 3.10): at a fixed trade rate, the mean and p99 time from a MACD value's event time
   (the end of its join window, one slide after both averages closed) to its commit in the sink, from the
   executor's sink-latency histogram. The rate is chosen so that the ``apart`` variant is busy, where the
   thesis measured its difference.

Writes docs/img/cmr_macd.png and the "C-MR shared sub-windows (MACD)" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import yaml
from rich.console import Console
from rich.progress import Progress

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report import header, markdown, write_section
from bench.runtime import marginal, quantile, routing_for, run_threaded
from streamtopo.planner.model import StreamTopology
from streamtopo.runtime.embedded import EmbeddedValkey
from streamtopo.runtime.executor import ExecutorConfig
from streamtopo.runtime.operators import sharing_groups
from streamtopo.runtime.spark import get_spark

console = Console()
SECTION = "C-MR shared sub-windows (MACD)"
VARIANTS = {"shared": True, "apart": False}
EVENT_RATE = 200_000.0
"""Trades per second of event time in the flat-out runs: 1 s panes of about 1,000 trades per symbol, so
the work per trade (generating it, folding it into panes) outweighs the work per window."""
THESIS_LATENCY_DECREASE = 0.31


def macd(name: str, rate: float, count: int) -> StreamTopology:
    """examples/macd.yaml under another name, its trades at ``rate`` per second of event time, ``count`` of
    them."""
    document = yaml.safe_load((ROOT / "examples" / "macd.yaml").read_text())
    document["metadata"]["name"] = name
    trades = next(op for op in document["spec"]["operators"] if op["name"] == "trades")
    trades["source"] = {**trades["source"], "ratePerSecond": rate, "count": count}
    return StreamTopology.model_validate(document)


def run(
    url: str, work: Path, name: str, share: bool, rate: float, count: int, backlogged: bool
) -> tuple[float, float, list[tuple[float, float]], float]:
    """(CPU-seconds, wall seconds, sink-latency buckets, latency sum) of one run of the workflow to the end
    of its stream on one executor. ``backlogged``: every trade is due at the start."""
    top = macd(name, rate, count)
    units = {
        (op.name, kg): "ex-0" for op in top.spec.operators for kg in range(top.spec.key_groups_of(op.name))
    }
    config = ExecutorConfig(share_panes=share)
    wall, cpu, [executor] = run_threaded(top, routing_for(top, units), work, url, config, backlogged)
    [family] = list(executor.metrics.sink_latency.collect())
    buckets = [(float(s.labels["le"]), s.value) for s in family.samples if s.name.endswith("_bucket")]
    total = next(s.value for s in family.samples if s.name.endswith("_sum"))
    shutil.rmtree(work / name, ignore_errors=True)
    return cpu, wall, buckets, total


def cpu_rates(url: str, work: Path, records: int, repeats: int, progress: Progress) -> dict[str, dict]:
    """Per variant: marginal trades per CPU-second and its standard error, and the runs (N, CPU, wall)."""
    sizes = [records, 2 * records] * repeats + [records]
    task = progress.add_task("CPU: flat-out runs", total=2 * (len(sizes) + 1))
    runs: dict[str, list[tuple[int, float, float]]] = {v: [] for v in VARIANTS}
    for i, n in enumerate([records, *sizes]):  # the first of each variant warms the JIT up, unmeasured
        for variant, share in VARIANTS.items():
            cpu, wall, _, _ = run(url, work, f"macd-cpu-{variant}-{i}", share, EVENT_RATE, n, backlogged=True)
            if i:
                runs[variant].append((n, cpu, wall))
            progress.advance(task)
    out = {}
    for variant, measured in runs.items():
        slope, se = marginal(measured)
        out[variant] = {"rate": 1 / slope, "error": se / slope, "runs": measured}
    return out


def latencies(
    url: str, work: Path, rates: list[float], seconds: float, repeats: int, progress: Progress
) -> dict:
    """Per rate and variant: mean, p50 and p99 sink latency and CPU per trade of ``repeats`` runs."""
    task = progress.add_task("latency: runs at fixed rates", total=2 * repeats * len(rates))
    out: dict[float, dict[str, dict[str, list[float]]]] = {}
    for rate in rates:
        out[rate] = {v: {"mean": [], "p50": [], "p99": [], "cpu": []} for v in VARIANTS}
        for i in range(repeats):
            for variant, share in VARIANTS.items():
                count = int(rate * seconds)
                name = f"macd-lat-{int(rate)}-{variant}-{i}"
                cpu, _, buckets, total = run(url, work, name, share, rate, count, backlogged=False)
                cell = out[rate][variant]
                cell["mean"].append(total / buckets[-1][1])
                cell["p50"].append(quantile(buckets, 0.5))
                cell["p99"].append(quantile(buckets, 0.99))
                cell["cpu"].append(cpu / count * 1e6)
                progress.advance(task)
    return out


def decrease(cell: dict[str, dict[str, list[float]]]) -> float:
    """How much lower the shared variant's median mean latency is than the apart one's, as a fraction."""
    return 1 - float(np.median(cell["shared"]["mean"]) / np.median(cell["apart"]["mean"]))


def plot(cpu: dict[str, dict], latency: dict[float, dict], records: int) -> Path:
    path = ROOT / "docs" / "img" / "cmr_macd.png"
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    names = list(VARIANTS)
    colours = {"shared": "tab:green", "apart": "tab:gray"}
    left.bar(
        names,
        [cpu[v]["rate"] / 1e6 for v in names],
        yerr=[cpu[v]["rate"] * cpu[v]["error"] / 1e6 for v in names],
        color=[colours[v] for v in names],
    )
    left.set_ylabel("million trades per CPU-second (marginal)")
    left.set_title(f"flat out, {records / 1e6:g}M and {2 * records / 1e6:g}M trades (Fig. 3.11)")
    rates = sorted(latency)
    for v in names:
        medians = [np.median(latency[r][v]["mean"]) for r in rates]
        right.plot([r / 1e3 for r in rates], medians, marker="o", color=colours[v], label=v)
        for r in rates:
            runs = latency[r][v]["mean"]
            right.scatter([r / 1e3] * len(runs), runs, color=colours[v], alpha=0.35, s=12)
    right.set_xlabel("thousand trades per second")
    right.set_ylabel("mean latency (s); line = median of runs")
    right.set_title("latency at fixed rates (Fig. 3.10)")
    right.legend()
    fig.suptitle("MACD: 5 s and 10 s moving averages sliding by 1 s, sub-windows shared or apart")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller runs, fewer repeats (a smoke test)")
    parser.add_argument("--records", type=int, default=4_000_000, help="N of the flat-out runs (and 2N)")
    parser.add_argument(
        "--rates",
        default="100000,400000,800000",
        help="trades per second of the latency runs, comma-separated",
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="event seconds of each latency run")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    if args.quick:
        args.records, args.seconds, args.repeats, rates = 500_000, 5.0, 1, rates[-1:]
    [group] = sharing_groups(macd("macd", rates[0], 1).spec)
    console.print(f"shared: {', '.join(group.members)} over {group.input}, pane {float(group.pane)} s")
    get_spark()
    work = Path(tempfile.mkdtemp(prefix="bench-macd-"))
    try:
        with EmbeddedValkey() as valkey, Progress(console=console) as progress:
            cpu = cpu_rates(valkey.url, work, args.records, args.repeats, progress)
            latency = latencies(valkey.url, work, rates, args.seconds, args.repeats, progress)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    image = plot(cpu, latency, args.records)
    report(args, cpu, latency, image)


def report(args: argparse.Namespace, cpu: dict[str, dict], latency: dict[float, dict], image: Path) -> None:
    rows = []
    for rate, cell in sorted(latency.items()):
        for v in VARIANTS:
            lat = cell[v]
            rows.append(
                [
                    f"{rate:,.0f}",
                    v,
                    f"{np.median(lat['mean']):.3f}",
                    f"{np.median(lat['p50']):.3f}",
                    f"{np.median(lat['p99']):.3f}",
                    f"{np.median(lat['cpu']):.2f}",
                    f"{100 * decrease(cell):.0f} %" if v == "shared" else "",
                ]
            )
    gain = cpu["shared"]["rate"] / cpu["apart"]["rate"]
    busiest = max(latency)
    lower = decrease(latency[busiest])
    verdict = (
        "beat"
        if lower > THESIS_LATENCY_DECREASE + 0.05
        else "match"
        if lower >= THESIS_LATENCY_DECREASE - 0.05
        else "miss"
    )
    command = "python bench/cmr_macd.py" + (" --quick" if args.quick else "")
    lines = [
        *header(command, "Spark local[1], one executor hosting every unit"),
        "",
        "examples/macd.yaml on one executor, shared (default) against apart (`share_panes=False`), alternated "
        f"in one run. CPU: marginal trades per CPU-second (whole process: Python, JVM, Valkey) over flat-out "
        f"runs of {args.records:,} and {2 * args.records:,} trades, {args.repeats} or more of each after a "
        "warm-up; slope +- its standard error. Latency: time from a MACD value's event time to its sink "
        f"commit, {args.repeats} runs of {args.seconds:.0f} s per rate, medians over runs; CPU us/trade is "
        f"the whole run's CPU per trade at that rate; the mean is exact (the histogram's sum over its count), "
        "p50 and p99 are interpolated within its buckets (0.3, 0.5, 0.75, 1 s ...) and so move in steps. "
        f"Plot: ![macd](img/{image.name})",
        "",
        *markdown(
            ["variant", "trades per CPU-second (marginal)"],
            [[v, f"{cpu[v]['rate']:,.0f} (+-{100 * cpu[v]['error']:.0f} %)"] for v in VARIANTS],
        ),
        "",
        *markdown(
            [
                "trades/s",
                "variant",
                "mean latency (s)",
                "p50 (s)",
                "p99 (s)",
                "CPU us/trade",
                "latency lower",
            ],
            rows,
        ),
        "",
        f"Shared over apart: {gain:.2f}x trades per CPU-second flat out; at {busiest:,.0f} trades/s the mean "
        f"latency is {100 * lower:.0f} % lower. Thesis (Figure 3.10): 31 % lower mean latency for the optimised "
        f"workflow: **{verdict}**.",
        "",
        "Reading: sharing removes one of the two Spark jobs that fold trades into panes at each window end, "
        "and with it the second computation of the lazy trades (records stay in the JVM until the partials, "
        "so without sharing each member generates and maps them again); that is the flat-out gain. Latency "
        "gains less: a window step also runs the join, three maps and the sink, each a Spark job on a few "
        "hundred rows whose fixed cost (about 50 ms) is the same in both variants, while in C-MR the "
        "redundant Reduce work dominated. The gain grows with the rate, as the folding's share of a step "
        "does.",
    ]
    write_section(SECTION, lines)
    console.print("\n".join(lines))


if __name__ == "__main__":
    main()
