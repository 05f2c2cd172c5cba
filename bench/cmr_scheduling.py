"""C-MR scheduling benchmark: ODF, YDF, CTO, MEM and the ODF/MEM hybrid on one executor under a burst.

Reproduces the shape of the thesis' scheduling experiments (Backman 2013, Sec. 3.7.3, Figures 3.5 and 3.6) in
a discrete-time simulation of one executor: a few operators of different selectivities, record sizes and
costs; input at a base rate below capacity, then a burst above it, then the base rate again until the
backlog drains. Each step (dt simulated seconds, one core) the executor ranks its units' queues and serves
them with ``allot(..., budget_unit="seconds")``; the hybrid draws its policy per step with ``choose_policy``.
Memory is the bytes queued; above the memory limit the executor "swaps" and processes ``swap_slowdown``
times slower (the thesis' ODF "goes into swap space"). Latency is output time - source event time, per
output record.

Two workflows: "chain" (Fig. 3.5's shape: map -> expanding map -> windowed reduce -> reduce, a generous
limit) and "filter-first" (Fig. 3.6's shape: a selective filter early, fan-out to an expanding enrichment
and a cheap count, a tight limit). Writes docs/img/cmr_scheduling.png and the "C-MR scheduling" section
of docs/benchmarks.md. Runs in seconds; everything is simulated, nothing depends on the machine's speed.
"""

from __future__ import annotations

import argparse
import sys
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report import header, markdown, write_section
from streamtopo.planner.cmr_scheduling import UnitQueue, allot, choose_policy, cto_order

SECTION = "C-MR scheduling"
IMAGE = ROOT / "docs" / "img" / "cmr_scheduling.png"
POLICIES = ["odf", "ydf", "cto", "mem", "hybrid"]
HYBRID_SEEDS = 5
COARSE_DT = 0.05
"""The hybrid's sensitivity to the step length: it draws its policy once per step."""
PLOT_BIN = 0.5
STYLES = {"odf": "-", "ydf": ":", "cto": "--", "mem": "-", "hybrid": "-."}


@dataclass(frozen=True)
class Op:
    name: str
    selectivity: float
    in_bytes: float
    out_bytes: float
    seconds_per_record: float
    downstream: tuple[str, ...] = ()
    """Hosted consumers; empty: the output leaves the executor (a sink)."""


@dataclass(frozen=True)
class Scenario:
    name: str
    figure: str
    ops: tuple[Op, ...]
    """The first op takes the source's records."""
    base_rate: float
    burst_rate: float
    burst: tuple[float, float]
    duration: float
    limit_bytes: float
    swap_slowdown: float = 5.0
    dt: float = 0.02
    cores: float = 1.0

    def rate(self, t: float) -> float:
        return self.burst_rate if self.burst[0] <= t < self.burst[1] else self.base_rate


SCENARIOS = [
    Scenario(
        "chain",
        "Fig. 3.5",
        (
            Op("parse", 1.0, 200, 120, 0.0004, ("enrich",)),
            Op("enrich", 1.0, 120, 400, 0.0010, ("window",)),
            Op("window", 0.2, 400, 60, 0.0003, ("total",)),
            Op("total", 0.5, 60, 60, 0.0002),
        ),
        base_rate=300,
        burst_rate=1000,
        burst=(10, 16),
        duration=40,
        limit_bytes=1.5e6,
    ),
    Scenario(
        "filter-first",
        "Fig. 3.6",
        (
            Op("filter", 0.2, 1000, 1000, 0.0003, ("enrich", "count")),
            Op("enrich", 1.0, 1000, 1500, 0.0015, ("score",)),
            Op("score", 1.0, 1500, 100, 0.0020),
            Op("count", 0.05, 1000, 50, 0.0002),
        ),
        base_rate=500,
        burst_rate=2000,
        burst=(4, 10),
        duration=40,
        limit_bytes=3e6,
    ),
]


def simulate(sc: Scenario, policy: str, seed: int = 0) -> dict:
    """One run: per-step memory and latency series plus the summary numbers."""
    ops = {o.name: o for o in sc.ops}
    bfs = cto_order({o.name: o.downstream for o in sc.ops})
    queues: dict[str, deque] = {o.name: deque() for o in sc.ops}  # FIFO of [event time, records]
    queued = dict.fromkeys(ops, 0)
    carry = dict.fromkeys(ops, 0.0)  # fractional output records (selectivity), kept exact over the run
    source_carry = 0.0
    rng = np.random.default_rng(seed)
    steps = round(sc.duration / sc.dt)
    memory, lat_sum, out_count = np.zeros(steps), np.zeros(steps), np.zeros(steps)
    lat, weight, mem_share = [], [], 0
    for step in range(steps):
        t = step * sc.dt
        source_carry += sc.rate(t) * sc.dt
        arriving = int(source_carry)
        source_carry -= arriving
        if arriving:
            queues[sc.ops[0].name].append([t, arriving])
            queued[sc.ops[0].name] += arriving
        in_use = sum(queued[n] * ops[n].in_bytes for n in ops)
        memory[step] = in_use
        chosen = policy
        if policy == "hybrid":
            chosen = choose_policy(in_use / sc.limit_bytes, rng)
            mem_share += chosen == "mem"
        budget = sc.cores * sc.dt / (sc.swap_slowdown if in_use > sc.limit_bytes else 1.0)
        views = [
            UnitQueue(
                unit=n,
                records=queued[n],
                bytes=int(queued[n] * ops[n].in_bytes),
                front_ts=queues[n][0][0],
                in_bytes=ops[n].in_bytes,
                out_bytes=ops[n].out_bytes * len(ops[n].downstream),
                selectivity=ops[n].selectivity,
                seconds_per_record=ops[n].seconds_per_record,
                bfs_order=bfs[n],
            )
            for n in ops
            if queued[n]
        ]
        takes = allot(views, budget, chosen, budget_unit="seconds")
        done = t + sc.dt
        out_lat, out_w = [], []
        for name, take in takes.items():
            op, q = ops[name], queues[name]
            queued[name] -= take
            while take:
                ts, n = q[0]
                k = min(n, take)
                take -= k
                if k == n:
                    q.popleft()
                else:
                    q[0][1] = n - k
                carry[name] += k * op.selectivity
                emitted = int(carry[name] + 1e-9)
                carry[name] -= emitted
                if not emitted:
                    continue
                if not op.downstream:
                    out_lat.append(done - ts)
                    out_w.append(emitted)
                for d in op.downstream:
                    queues[d].append([ts, emitted])
                    queued[d] += emitted
        if out_w:
            lat_sum[step], out_count[step] = np.dot(out_lat, out_w), sum(out_w)
            lat.extend(out_lat)
            weight.extend(out_w)
    end = steps * sc.dt
    for name, q in queues.items():  # still queued: censored at the end of the run (a lower bound)
        lat.extend(end - ts for ts, n in q)
        weight.extend(n * outputs_per_record(ops, name) for ts, n in q)
    lat_a, w_a = np.asarray(lat), np.asarray(weight, dtype=float)
    order = np.argsort(lat_a)
    cum = np.cumsum(w_a[order]) / w_a.sum()
    return {
        "memory": memory,
        "lat_sum": lat_sum,
        "out_count": out_count,
        "peak_mb": memory.max() / 1e6,
        "mean_mb": memory.mean() / 1e6,
        "mean_latency": float(np.average(lat_a, weights=w_a)),
        "p99_latency": float(lat_a[order][np.searchsorted(cum, 0.99)]),
        "swap_s": float((memory > sc.limit_bytes).sum() * sc.dt),
        "left": int(sum(queued.values())),
        "mem_share": mem_share / steps,
    }


def outputs_per_record(ops: dict[str, Op], name: str) -> float:
    """Output records one record queued at ``name`` becomes, summed over the sinks it reaches."""
    op = ops[name]
    return op.selectivity * (sum(outputs_per_record(ops, d) for d in op.downstream) if op.downstream else 1.0)


def summary(runs: list[dict]) -> dict:
    """Mean over the hybrid's seeds (one run for the deterministic policies)."""
    keys = ("peak_mb", "mean_mb", "mean_latency", "p99_latency", "swap_s", "left", "mem_share")
    return {k: float(np.mean([r[k] for r in runs])) for k in keys} | {"run": runs[0]}


def plot(results: dict[str, dict[str, dict]]) -> None:
    fig, axes = plt.subplots(len(SCENARIOS), 2, figsize=(12, 4.2 * len(SCENARIOS)), squeeze=False)
    for row, sc in enumerate(SCENARIOS):
        t = np.arange(round(sc.duration / sc.dt)) * sc.dt
        per_bin = round(PLOT_BIN / sc.dt)
        t_bin = t[::per_bin] + PLOT_BIN / 2
        for policy in POLICIES:
            run = results[sc.name][policy]["run"]
            style = {"label": policy.upper(), "ls": STYLES[policy], "lw": 1.4}
            axes[row][0].plot(t, run["memory"] / 1e6, **style)
            lat_sum, count = (run[k].reshape(-1, per_bin).sum(axis=1) for k in ("lat_sum", "out_count"))
            with np.errstate(invalid="ignore"):
                axes[row][1].plot(t_bin, lat_sum / count, **style)
        axes[row][0].axhline(sc.limit_bytes / 1e6, color="grey", ls="--", lw=1, label="limit")
        axes[row][0].axvspan(*sc.burst, color="orange", alpha=0.1)
        axes[row][1].axvspan(*sc.burst, color="orange", alpha=0.1)
        axes[row][0].set(title=f"{sc.name} ({sc.figure} shape): queued bytes", xlabel="s", ylabel="MB")
        axes[row][1].set(
            title=f"{sc.name}: mean latency of the records output per {PLOT_BIN:g} s",
            xlabel="s",
            ylabel="s",
            yscale="log",
        )
        axes[row][0].legend(fontsize=8)
        axes[row][1].legend(fontsize=8)
    fig.tight_layout()
    IMAGE.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(IMAGE, dpi=110)


def describe(sc: Scenario) -> str:
    ops = "; ".join(
        f"{o.name} sel {o.selectivity:g}, {o.in_bytes:g} B in / {o.out_bytes:g} B out, "
        f"{o.seconds_per_record * 1e3:g} ms -> {', '.join(o.downstream) or 'sink'}"
        for o in sc.ops
    )
    return (
        f"**{sc.name}** ({sc.figure} shape): {ops}. Input {sc.base_rate:g} rec/s, burst {sc.burst_rate:g} "
        f"rec/s during [{sc.burst[0]:g}, {sc.burst[1]:g}) s, {sc.duration:g} s simulated in steps of "
        f"{sc.dt:g} s on {sc.cores:g} core; memory limit {sc.limit_bytes / 1e6:g} MB, "
        f"{sc.swap_slowdown:g}x slower above it."
    )


def run_all(progress: Progress) -> dict[str, dict[str, dict]]:
    """Every policy on every workflow, plus the hybrid with coarser steps on filter-first."""
    jobs = [(sc, p, p, sc.dt) for sc in SCENARIOS for p in POLICIES]
    jobs += [(SCENARIOS[1], f"hybrid, {COARSE_DT * 1e3:g} ms steps", "hybrid", COARSE_DT)]
    task = progress.add_task("simulating", total=sum(HYBRID_SEEDS if j[2] == "hybrid" else 1 for j in jobs))
    results: dict[str, dict[str, dict]] = {sc.name: {} for sc in SCENARIOS}
    for sc, label, policy, dt in jobs:
        runs = []
        for seed in range(HYBRID_SEEDS if policy == "hybrid" else 1):
            runs.append(simulate(replace(sc, dt=dt), policy, seed))
            progress.advance(task)
        results[sc.name][label] = summary(runs)
    return results


def findings(results: dict[str, dict[str, dict]]) -> list[str]:
    """The thesis' findings (Sec. 3.7.3) next to what this simulation measured."""
    chain, ff = results["chain"], results["filter-first"]
    coarse = ff[f"hybrid, {COARSE_DT * 1e3:g} ms steps"]

    def lat(r: dict) -> str:
        return f"{r['mean_latency']:.2f} s mean / {r['p99_latency']:.2f} s p99"

    fastest = min(chain[p]["mean_latency"] for p in POLICIES[:4])
    best = "/".join(p.upper() for p in POLICIES[:4] if chain[p]["mean_latency"] <= 1.01 * fastest)
    least = min(POLICIES[:4], key=lambda p: chain[p]["peak_mb"])
    return [
        "### Against the thesis (Sec. 3.7.3)",
        "",
        (
            '- Fig. 3.5: "ODF is the clear winner with respect to minimizing latency. The remaining policies all '
            'suffer substantially at the onset of the burst" and ODF "also results in the minimum memory '
            f'consumption during the burst time, beating out the MEM policy". Here (chain): lowest mean latency '
            f"{best} (within 1 %; ODF {lat(chain['odf'])}, CTO {lat(chain['cto'])}, MEM "
            f"{lat(chain['mem'])}, YDF {lat(chain['ydf'])}); lowest peak memory {least.upper()} "
            f"({chain[least]['peak_mb']:.2f} MB against ODF's {chain['odf']['peak_mb']:.2f} MB). The thesis "
            "explains ODF's memory win by flushing punctuations to materialization points (windows); this "
            "simulation has no windows or punctuations, so MEM's byte-greedy order keeps the least queued."
        ),
        (
            '- Fig. 3.6: with a selective operator early and 2 GB of RAM, "the Hybrid policy mimics that of ODF" '
            'until memory grows, "always outperforms MEM with respect to latency and is only outdone by ODF just '
            'before ODF goes into swap space". Here (filter-first): ODF peaks at '
            f"{ff['odf']['peak_mb']:.1f} MB, swaps {ff['odf']['swap_s']:.1f} s and ends with "
            f"{ff['odf']['left']:.0f} records queued ({lat(ff['odf'])}, a lower bound); MEM peaks at "
            f"{ff['mem']['peak_mb']:.2f} MB ({lat(ff['mem'])}); HYBRID peaks at {ff['hybrid']['peak_mb']:.2f} MB, "
            f"swaps {ff['hybrid']['swap_s']:.1f} s ({lat(ff['hybrid'])}), drawing MEM in "
            f"{ff['hybrid']['mem_share']:.0%} of the steps."
        ),
        (
            f"- Step length matters: drawn once per {COARSE_DT * 1e3:g} ms step instead of {SCENARIOS[1].dt * 1e3:g} ms, "
            f"the hybrid's memory wanders more per draw; it peaks at {coarse['peak_mb']:.2f} MB, swaps "
            f"{coarse['swap_s']:.1f} s ({lat(coarse)}). C-MR draws per computing node's request; an executor "
            "should keep its steps short against how fast a burst fills the budget (or lower T)."
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--no-record", action="store_true", help="do not write the plot or docs/benchmarks.md"
    )
    args = parser.parse_args()
    console = Console()
    with Progress(console=console) as progress:
        results = run_all(progress)

    columns = [
        "workflow",
        "policy",
        "peak MB",
        "mean MB",
        "mean latency s",
        "p99 latency s",
        "swapping s",
        "queued at end",
        "MEM share",
    ]
    rows = [
        [
            sc.name,
            label.upper() if label in POLICIES else label,
            r["peak_mb"],
            r["mean_mb"],
            r["mean_latency"],
            r["p99_latency"],
            r["swap_s"],
            round(r["left"]),
            r["mem_share"] if label.startswith("hybrid") else "-",
        ]
        for sc in SCENARIOS
        for label, r in results[sc.name].items()
    ]
    table = Table(title="C-MR scheduling policies on one simulated executor")
    for c in columns:
        table.add_column(c)
    for row in rows:
        table.add_row(*(f"{v:.3f}" if isinstance(v, float) else str(v) for v in row))
    console.print(table)
    notes = findings(results)
    console.print("\n".join(notes[2:]))
    if args.no_record:
        return
    plot(results)
    lines = [
        *header("python bench/cmr_scheduling.py", "simulated time: results do not depend on the machine"),
        "",
        (
            "Discrete-time simulation of one executor (streamtopo.planner.cmr_scheduling, docs/cmr-scheduling.md): "
            "each step the executor ranks its units' queues and serves them in rank order within a CPU-seconds "
            f"budget. HYBRID is Eq. 3.1 with T = 0.5, alpha = 2.5, beta = 1, mean of {HYBRID_SEEDS} seeds (its "
            "plot is seed 0); MEM share = fraction of steps it drew MEM. Latency is per output record; records "
            "still queued at the end count with their age then (a lower bound). Swapping s = simulated seconds "
            "above the memory limit."
        ),
        "",
        *(f"- {describe(sc)}" for sc in SCENARIOS),
        "",
        f"![C-MR scheduling](img/{IMAGE.name})",
        "",
        *markdown(columns, rows, digits=2),
        "",
        *notes,
    ]
    write_section(SECTION, lines)
    console.print(f"wrote {IMAGE.relative_to(ROOT)} and the '{SECTION}' section of docs/benchmarks.md")


if __name__ == "__main__":
    main()
