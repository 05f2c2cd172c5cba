"""C-MR scheduling benchmark: ODF, YDF, CTO, MEM and the ODF/MEM hybrid on one executor under a burst.

Reproduces the shape of the thesis' scheduling experiments (Backman 2013, Sec. 3.7.3, Figures 3.5 and 3.6) in
a discrete-time simulation of one executor: a few operators of different selectivities, record sizes and
costs; input at a base rate below capacity, then a burst above it, then the base rate again until the
backlog drains, each step's arrivals drawn Poisson around the rate. Each step (dt simulated seconds, one
core) the executor ranks its units' queues and serves them with ``allot(..., budget_unit="seconds")``; the
hybrid draws its policy per step with ``choose_policy``. Memory is the bytes queued; above the memory limit
the executor "swaps" and processes ``swap_slowdown`` times slower (the thesis' ODF "goes into swap space").
Latency is output time - source event time, per output record.

Two workflows: "chain" (Fig. 3.5's shape: map -> expanding map -> windowed reduce -> reduce, a generous
limit) and "filter-first" (Fig. 3.6's shape: a selective filter early, fan-out to an expanding enrichment
and a cheap count, a tight limit).

Every policy runs at every seed of ``--seeds`` (five by default, issue 35): a seed draws the arrivals (the
same for every policy) and the hybrid's policy per step. The table gives each figure's median (min-max) over
the seeds, the plot each policy's median and min-max band, and the thesis' findings are judged per seed on
those runs (``CLAIMS``): met on every seed, on k of n, or missed, with each seed's figures and why it
missed. Writes docs/img/cmr_scheduling.png and the "C-MR scheduling" section of docs/benchmarks.md. Runs in
seconds; everything is simulated, nothing depends on the machine's speed.

    .venv/bin/python bench/cmr_scheduling.py [--seeds 0,1,2,3,4] [--no-record]
"""

from __future__ import annotations

import argparse
import shlex
import sys
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
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
from streamtopo.planner.cmr_scheduling import UnitQueue, allot, choose_policy, cto_order

SECTION = "C-MR scheduling"
POLICIES = ["odf", "ydf", "cto", "mem", "hybrid"]
COARSE_DT = 0.05
"""The hybrid's sensitivity to the step length: it draws its policy once per step."""
COARSE = f"hybrid, {COARSE_DT * 1e3:g} ms steps"
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


def arrivals(sc: Scenario, seed: int) -> np.ndarray:
    """Records arriving in each step: Poisson with the declared rate's mean (``rate(t) * dt``), drawn from
    the seed's own stream, so under one seed every policy sees the same input and a seed changes the input
    of every policy, not only the hybrid's draws."""
    rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(2)[0])
    steps = round(sc.duration / sc.dt)
    return rng.poisson([sc.rate(step * sc.dt) * sc.dt for step in range(steps)])


def simulate(sc: Scenario, policy: str, seed: int) -> dict:
    """One run: per-step memory and latency series plus the summary numbers. The seed draws the arrivals
    (:func:`arrivals`) and, from a second stream, the hybrid's policy per step."""
    ops = {o.name: o for o in sc.ops}
    bfs = cto_order({o.name: o.downstream for o in sc.ops})
    queues: dict[str, deque] = {o.name: deque() for o in sc.ops}  # FIFO of [event time, records]
    queued = dict.fromkeys(ops, 0)
    carry = dict.fromkeys(ops, 0.0)  # fractional output records (selectivity), kept exact over the run
    arriving_per_step = arrivals(sc, seed)
    rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(2)[1])
    steps = len(arriving_per_step)
    memory, lat_sum, out_count = np.zeros(steps), np.zeros(steps), np.zeros(steps)
    lat, weight, mem_share = [], [], 0
    for step in range(steps):
        t = step * sc.dt
        arriving = int(arriving_per_step[step])
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


Runs = dict[str, dict[str, list[dict]]]
"""Per workflow, per policy label (a policy, or the hybrid at coarse steps), one run per seed in seed order."""
TIE = 1.01
"""Latencies within 1 % of each other count as equal (ODF and CTO serve a chain of FIFO queues alike)."""
SUBSTANTIAL = 1.10
"""What "suffer substantially" reads as here: a mean latency more than 10 % above ODF's."""
METRICS = (
    ("peak MB", "peak_mb", "{:.2f}"),
    ("mean MB", "mean_mb", "{:.2f}"),
    ("mean latency s", "mean_latency", "{:.2f}"),
    ("p99 latency s", "p99_latency", "{:.2f}"),
    ("swapping s", "swap_s", "{:.1f}"),
    ("queued at end", "left", "{:.0f}"),
    ("MEM share", "mem_share", "{:.2f}"),
)


def plot(results: Runs, seeds: list[int], path: Path) -> str:
    """Per workflow: queued bytes and the latency of the records output per :data:`PLOT_BIN`, each policy's
    median line and min-max band over the seeds."""
    fig, axes = plt.subplots(len(SCENARIOS), 2, figsize=(12, 4.2 * len(SCENARIOS)), squeeze=False)
    for row, sc in enumerate(SCENARIOS):
        t = np.arange(round(sc.duration / sc.dt)) * sc.dt
        per_bin = round(PLOT_BIN / sc.dt)
        t_bin = t[::per_bin] + PLOT_BIN / 2
        for policy in POLICIES:
            runs = results[sc.name][policy]
            memory = np.array([run["memory"] / 1e6 for run in runs])
            with np.errstate(invalid="ignore"):
                latency = np.array(
                    [
                        run["lat_sum"].reshape(-1, per_bin).sum(axis=1)
                        / run["out_count"].reshape(-1, per_bin).sum(axis=1)
                        for run in runs
                    ]
                )
            style = {"label": policy.upper(), "ls": STYLES[policy], "lw": 1.4}
            for ax, x, values in ((axes[row][0], t, memory), (axes[row][1], t_bin, latency)):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)  # a bin without output on every seed
                    (line,) = ax.plot(x, np.nanmedian(values, axis=0), **style)
                    low, high = np.nanmin(values, axis=0), np.nanmax(values, axis=0)
                ax.fill_between(x, low, high, color=line.get_color(), alpha=0.15)
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
    fig.suptitle(f"median and min-max over seeds {', '.join(map(str, seeds))}")
    return save_figure(fig, path, dpi=110)


def describe(sc: Scenario) -> str:
    ops = "; ".join(
        f"{o.name} sel {o.selectivity:g}, {o.in_bytes:g} B in / {o.out_bytes:g} B out, "
        f"{o.seconds_per_record * 1e3:g} ms -> {', '.join(o.downstream) or 'sink'}"
        for o in sc.ops
    )
    return (
        f"**{sc.name}** ({sc.figure} shape): {ops}. Input {sc.base_rate:g} rec/s, burst {sc.burst_rate:g} "
        f"rec/s (means of Poisson arrivals per step) during [{sc.burst[0]:g}, {sc.burst[1]:g}) s, "
        f"{sc.duration:g} s simulated in steps of "
        f"{sc.dt:g} s on {sc.cores:g} core; memory limit {sc.limit_bytes / 1e6:g} MB, "
        f"{sc.swap_slowdown:g}x slower above it."
    )


def run_all(seeds: list[int], progress: Progress) -> Runs:
    """Every policy on every workflow, plus the hybrid with coarser steps on filter-first, each at every
    seed (the same arrivals for every policy under one seed)."""
    jobs = [(sc, p, p, sc.dt) for sc in SCENARIOS for p in POLICIES]
    jobs += [(SCENARIOS[1], COARSE, "hybrid", COARSE_DT)]
    task = progress.add_task("simulating", total=len(jobs) * len(seeds))
    results: Runs = {sc.name: {} for sc in SCENARIOS}
    for sc, label, policy, dt in jobs:
        runs = []
        for seed in seeds:
            runs.append(simulate(replace(sc, dt=dt), policy, seed))
            progress.advance(task)
        results[sc.name][label] = runs
    return results


def table(results: Runs) -> tuple[list[str], list[list[str]]]:
    """Every workflow x policy: each figure's median (min-max) over the seeds."""
    columns = ["workflow", "policy", *(name for name, _, _ in METRICS)]
    rows = [
        [
            sc.name,
            label.upper() if label in POLICIES else label,
            *(
                median_range([run[key] for run in runs], fmt.format)
                if key != "mem_share" or label.startswith("hybrid")
                else "-"
                for _, key, fmt in METRICS
            ),
        ]
        for sc in SCENARIOS
        for label, runs in results[sc.name].items()
    ]
    return columns, rows


One = dict[str, dict[str, dict]]
"""One seed's runs: per workflow, per policy label."""
Judged = tuple[bool, str, str]
"""A claim on one seed: whether it holds, the figures it was judged on, and why not when it does not."""


def lat(run: dict) -> float:
    return float(run["mean_latency"])


def swapped(run: dict) -> str:
    """Why a hybrid run fell behind, when it did: memory crossed the limit and the executor swapped."""
    return f": HYBRID swapped {run['swap_s']:.1f} s (peak {run['peak_mb']:.2f} MB)" if run["swap_s"] else ""


def odf_lowest_latency(one: One) -> Judged:
    chain = one["chain"]
    other = min(POLICIES[1:4], key=lambda p: lat(chain[p]))
    odf, low = lat(chain["odf"]), lat(chain[other])
    figures = f"ODF {odf:.2f} s, {other.upper()} {low:.2f} s"
    return odf <= TIE * low, figures, f"{other.upper()} more than 1 % below ODF"


def others_suffer(one: One) -> Judged:
    chain = one["chain"]
    odf = lat(chain["odf"])
    ratio = {p: lat(chain[p]) / odf for p in POLICIES[1:4]}
    close = [p for p, r in ratio.items() if r <= SUBSTANTIAL]
    figures = ", ".join(f"{p.upper()} {r:.2f}x" for p, r in ratio.items())
    return not close, figures, ", ".join(f"{p.upper()} within 10 %" for p in close)


def odf_least_memory(one: One) -> Judged:
    odf, mem = one["chain"]["odf"]["peak_mb"], one["chain"]["mem"]["peak_mb"]
    return odf <= mem, f"ODF {odf:.2f} MB, MEM {mem:.2f} MB", "MEM's peak lower"


def hybrid_mimics_odf(one: One) -> Judged:
    hybrid, odf = one["chain"]["hybrid"], one["chain"]["odf"]
    figures = (
        f"HYBRID {lat(hybrid):.2f} s, ODF {lat(odf):.2f} s, MEM drawn in {hybrid['mem_share']:.0%} of steps"
    )
    return abs(lat(hybrid) - lat(odf)) <= (TIE - 1) * lat(odf), figures, "more than 1 % apart"


def hybrid_below_mem(one: One) -> Judged:
    pairs = {name: (lat(runs["hybrid"]), lat(runs["mem"])) for name, runs in one.items()}
    figures = ", ".join(f"{name} {h:.2f} s against {m:.2f} s" for name, (h, m) in pairs.items())
    above = [name for name, (h, m) in pairs.items() if h >= m]
    return (
        not above,
        figures,
        "; ".join(f"not below on {name}{swapped(one[name]['hybrid'])}" for name in above),
    )


def odf_swaps_hybrid_not(one: One) -> Judged:
    ff = one["filter-first"]
    odf, hybrid = ff["odf"]["swap_s"], ff["hybrid"]["swap_s"]
    peak = f"HYBRID crossed the limit (peak {ff['hybrid']['peak_mb']:.2f} MB)"
    why = "; ".join(text for bad, text in ((odf == 0, "ODF does not swap"), (hybrid > 0, peak)) if bad)
    return not why, f"ODF {odf:.1f} s, HYBRID {hybrid:.1f} s", why


def hybrid_lowest_latency(one: One) -> Judged:
    ff = one["filter-first"]
    other = min(POLICIES[:4], key=lambda p: lat(ff[p]))
    hybrid, low = lat(ff["hybrid"]), lat(ff[other])
    figures = f"HYBRID {hybrid:.2f} s, next {other.upper()} {low:.2f} s"
    return hybrid < low, figures, f"{other.upper()} lower{swapped(ff['hybrid'])}"


def coarse_steps_worse(one: One) -> Judged:
    coarse, mem = one["filter-first"][COARSE], one["filter-first"]["mem"]
    figures = f"swaps {coarse['swap_s']:.1f} s, {lat(coarse):.2f} s against MEM's {lat(mem):.2f} s"
    why = "; ".join(
        text
        for bad, text in (
            (coarse["swap_s"] == 0, "no swapping"),
            (lat(coarse) <= lat(mem), "not above MEM's"),
        )
        if bad
    )
    return not why, figures, why


CLAIMS: tuple[tuple[str, str, Callable[[One], Judged]], ...] = (
    (
        'Fig. 3.5 (chain): "ODF is the clear winner with respect to minimizing latency": ODF the lowest mean '
        "latency of ODF, YDF, CTO, MEM (within 1 %)",
        "mean latency of ODF and of the lowest other",
        odf_lowest_latency,
    ),
    (
        'Fig. 3.5 (chain): "the remaining policies all suffer substantially at the onset of the burst": '
        "YDF, CTO and MEM each more than 10 % above ODF's mean latency",
        "mean latency against ODF's",
        others_suffer,
    ),
    (
        'Fig. 3.5 (chain): ODF "results in the minimum memory consumption during the burst time, beating '
        "out the MEM policy\": ODF's peak memory at or below MEM's",
        "peak memory",
        odf_least_memory,
    ),
    (
        'Fig. 3.6: "the Hybrid policy mimics that of ODF" while memory is plentiful: on chain (memory '
        "under T) HYBRID's mean latency within 1 % of ODF's",
        "chain, mean latency",
        hybrid_mimics_odf,
    ),
    (
        'Fig. 3.6: HYBRID "always outperforms MEM with respect to latency": mean latency below MEM\'s on '
        "both workflows",
        "HYBRID's mean latency against MEM's",
        hybrid_below_mem,
    ),
    (
        'Fig. 3.6 (filter-first): ODF "goes into swap space", HYBRID does not',
        "seconds above the memory limit",
        odf_swaps_hybrid_not,
    ),
    (
        'Fig. 3.6 (filter-first): HYBRID "is only outdone by ODF just before ODF goes into swap space": '
        "the lowest mean latency of the five over the run",
        "mean latency",
        hybrid_lowest_latency,
    ),
    (
        f"Step length (not in the thesis): drawn per {COARSE_DT * 1e3:g} ms step, HYBRID on filter-first "
        "swaps and its mean latency is above MEM's",
        f"HYBRID at {COARSE_DT * 1e3:g} ms steps",
        coarse_steps_worse,
    ),
)
"""The thesis' findings (Sec. 3.7.3, Figures 3.5 and 3.6) and the step-length finding, each judged per seed
on the runs the table and the plot show: (claim, what the figures are, judge)."""


def verdicts(results: Runs, seeds: list[int]) -> list[str]:
    """Every claim over the seeds, each seed's figures and, on a miss, why."""
    lines = []
    for claim, what, judge in CLAIMS:
        per_seed = []
        for i, seed in enumerate(seeds):
            one = {name: {label: runs[i] for label, runs in by.items()} for name, by in results.items()}
            ok, figures, why = judge(one)
            per_seed.append((str(seed), ok, figures + ("" if ok else f" (MISSED: {why})")))
        lines.append(over_repeats(claim, per_seed, what))
    return lines


def report(results: Runs, seeds: list[int], command: str, image: str) -> list[str]:
    columns, rows = table(results)
    return [
        *header(command, "simulated time: results do not depend on the machine"),
        "",
        (
            "Discrete-time simulation of one executor (streamtopo.planner.cmr_scheduling, docs/cmr-scheduling.md): "
            "each step the executor ranks its units' queues and serves them in rank order within a CPU-seconds "
            f"budget. Seeds {', '.join(map(str, seeds))} for every policy (issue 35): a seed draws the arrivals, "
            "Poisson around the declared rate per step (the same for every policy under one seed), and "
            "HYBRID's policy per step (Eq. 3.1 with T = 0.5, alpha = 2.5, beta = 1). Cells: median (min-max) "
            "over the seeds; MEM share = fraction of steps HYBRID drew MEM. Latency is per output record; "
            "records still queued at the end count with their age then (a lower bound). Swapping s = "
            "simulated seconds above the memory limit."
        ),
        "",
        *(f"- {describe(sc)}" for sc in SCENARIOS),
        "",
        f"![C-MR scheduling](img/{image})",
        "",
        *markdown(columns, rows),
        "",
        "### Against the thesis (Sec. 3.7.3), over the seeds",
        "",
        *verdicts(results, seeds),
        "",
        "The thesis explains ODF's memory win on Fig. 3.5 by flushing punctuations to materialization points "
        "(windows); this simulation has no windows or punctuations, so MEM's byte-greedy order keeps the "
        "least queued. C-MR draws the hybrid's policy per computing node's request; an executor draws per "
        "step, so its steps must stay short against how fast a burst fills the budget (or T lower).",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated seeds, every policy at each")
    parser.add_argument(
        "--no-record", action="store_true", help="print the section, leave docs/ alone (plot to the temp dir)"
    )
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    command = shlex.join(["python", "bench/cmr_scheduling.py", *sys.argv[1:]])
    console = Console()
    with Progress(console=console) as progress:
        results = run_all(seeds, progress)
    image = image_dir(args.no_record) / "cmr_scheduling.png"
    publish(
        SECTION, report(results, seeds, command, plot(results, seeds, image)), image, args.no_record, console
    )


if __name__ == "__main__":
    main()
