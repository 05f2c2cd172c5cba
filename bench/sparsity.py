"""COLA's sparsest-cut partitioner against the exact optimum, method by method.

    .venv/bin/python bench/sparsity.py [--quick]

For seeded small graphs (exact enumeration is feasible up to 22 vertices) of three families:
random connected weighted graphs (Watts-Strogatz), random layered DAGs, and connected pieces of the
200-operator VWAP-like graph (bench/graphs.py), it computes the exact minimum of ratio (2) and the
sparsity each method reaches: Leighton-Rao on the Garg-Koenemann metric (``lr``), the Fiedler sweep
(``spectral``) and the pymetis bisection (``metis``), plus the one COLA keeps (``chosen``, the best of
the three). It also sweeps the GK step cap to show the quality / time trade-off behind the default.

Prints rich tables, draws docs/img/cola_sparsity.png and rewrites the "COLA sparsest cut" section
of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import networkx as nx
import numpy as np
import scipy.sparse as sp
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench.graphs import random_layered_dag, vwap_like
from bench.report import markdown, save_figure, write_section
from streamtopo.planner.placement.cola.exact_cut import exact_sparsest_cut
from streamtopo.planner.placement.cola.options import ColaOptions
from streamtopo.planner.placement.cola.ratio_cut import min_ratio_cut

SECTION = "COLA sparsest cut"
METHODS = ("lr", "spectral", "metis")
SIZES = (8, 12, 16, 20)
STEP_CAPS = (15, 30, 60, 120)


@dataclass(frozen=True)
class Sample:
    family: str
    n: int
    exact: float
    ratio: dict[str, float]
    """Method (and "chosen") -> its sparsity / exact sparsity."""
    lr_seconds: float


def undirected(graph: nx.Graph | nx.DiGraph, nodes: list) -> tuple[sp.csr_matrix, np.ndarray]:
    """Symmetric weight matrix (arcs both ways summed) and node weights of ``graph`` restricted to nodes."""
    index = {v: i for i, v in enumerate(nodes)}
    adj = sp.lil_matrix((len(nodes), len(nodes)))
    for u, v, d in graph.edges(data=True):
        if u in index and v in index and u != v:
            adj[index[u], index[v]] += d["w"]
            adj[index[v], index[u]] += d["w"]
    return sp.csr_matrix(adj), np.array([graph.nodes[v]["w"] for v in nodes], dtype=float)


def family_graphs(family: str, n: int, count: int, seed: int) -> list[tuple[sp.csr_matrix, np.ndarray]]:
    rng = random.Random(seed)
    out = []
    vwap = vwap_like(200, 283, seed=seed) if family == "vwap-piece" else None
    while len(out) < count:
        s = rng.randrange(1 << 30)
        if family == "random":
            g = nx.connected_watts_strogatz_graph(n, 4, 0.3, seed=s)
            r = np.random.default_rng(s)
            for v in g.nodes:
                g.nodes[v]["w"] = float(r.uniform(0.05, 1.0))
            for u, v in g.edges:
                g.edges[u, v]["w"] = float(r.uniform(0.05, 1.0))
            nodes = list(g.nodes)
        elif family == "layered":
            g = random_layered_dag(n, seed=s)
            nodes = list(g.nodes)
        else:  # a connected piece of VWAP1: BFS from a random operator, ignoring directions
            start = rng.choice(sorted(vwap.nodes))
            nodes = [v for v, _ in zip(nx.bfs_tree(vwap.to_undirected(as_view=True), start), range(n))]
            g = vwap
        if len(nodes) == n:
            adj, w = undirected(g, nodes)
            if nx.is_connected(nx.from_scipy_sparse_array(adj)):
                out.append((adj, w))
    return out


def measure(family: str, n: int, adj, w, options: ColaOptions) -> Sample:
    exact, _ = exact_sparsest_cut(adj, w)
    ratio = {}
    seconds = 0.0
    for method in METHODS:
        started = time.process_time()
        cut = min_ratio_cut(adj, w, replace(options, cut_methods=(method,)))
        if method == "lr":
            seconds = time.process_time() - started
        ratio[method] = cut.sparsity / exact
    ratio["chosen"] = min_ratio_cut(adj, w, options).sparsity / exact
    return Sample(family, n, exact, ratio, seconds)


def summary_rows(samples: list[Sample]) -> list[list[str]]:
    rows = []
    for family in dict.fromkeys(s.family for s in samples):
        for n in SIZES:
            group = [s for s in samples if s.family == family and s.n == n]
            if not group:
                continue
            cells = [family, str(n), str(len(group)), f"{np.mean([s.exact for s in group]):.4f}"]
            for method in (*METHODS, "chosen"):
                values = np.array([s.ratio[method] for s in group])
                cells.append(f"{values.mean():.3f} / {values.max():.3f} ({(values <= 1 + 1e-9).mean():.0%})")
            cells.append(f"{np.mean([s.lr_seconds for s in group]) * 1000:.0f}")
            rows.append(cells)
    return rows


HEADER = [
    "family",
    "n",
    "graphs",
    "exact sparsity (mean)",
    "LR/GK ratio",
    "spectral ratio",
    "METIS ratio",
    "chosen ratio",
    "LR CPU ms",
]


def step_sweep(graphs, options: ColaOptions) -> list[list[str]]:
    rows = []
    for cap in STEP_CAPS:
        ratios, seconds = [], []
        for adj, w in graphs:
            exact, _ = exact_sparsest_cut(adj, w)
            started = time.process_time()
            cut = min_ratio_cut(adj, w, replace(options, cut_methods=("lr",), gk_max_steps=cap))
            seconds.append(time.process_time() - started)
            ratios.append(cut.sparsity / exact)
        rows.append(
            [
                str(cap),
                f"{np.mean(ratios):.3f}",
                f"{np.max(ratios):.3f}",
                f"{np.mean(np.array(ratios) <= 1 + 1e-9):.0%}",
                f"{np.mean(seconds) * 1000:.0f}",
            ]
        )
    return rows


def plot(samples: list[Sample], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    for method, marker in zip((*METHODS, "chosen"), "os^D"):
        xs = sorted({s.n for s in samples})
        ys = [np.mean([s.ratio[method] for s in samples if s.n == n]) for n in xs]
        ax.plot(xs, ys, marker=marker, label=method)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("vertices in the PE")
    ax.set_ylabel("mean sparsity / exact optimum")
    ax.set_title("COLA sparsest cut: methods against the exact optimum")
    ax.legend()
    save_figure(fig, path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 graphs per size instead of 10")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    count = 4 if args.quick else 10
    options = ColaOptions()
    console = Console()
    samples: list[Sample] = []
    families = ("random", "layered", "vwap-piece")
    with Progress(console=console) as progress:
        task = progress.add_task("sparsest cuts", total=len(families) * len(SIZES) * count + len(STEP_CAPS))
        for family in families:
            for n in SIZES:
                for adj, w in family_graphs(family, n, count, args.seed + n):
                    samples.append(measure(family, n, adj, w, options))
                    progress.advance(task)
        sweep_graphs = family_graphs("random", 16, count, args.seed + 99)
        sweep = step_sweep(sweep_graphs, options)
        progress.advance(task, len(STEP_CAPS))

    table = Table(title="Sparsity / exact optimum: mean / worst (share of graphs at the optimum)")
    for column in HEADER:
        table.add_column(column)
    rows = summary_rows(samples)
    for row in rows:
        table.add_row(*row)
    console.print(table)
    steps = Table(title=f"LR/GK step cap (random graphs, n = 16, eps = {options.epsilon})")
    step_header = ["max steps", "mean ratio", "worst ratio", "at optimum", "LR CPU ms"]
    for column in step_header:
        steps.add_column(column)
    for row in sweep:
        steps.add_row(*row)
    console.print(steps)

    image = ROOT / "docs" / "img" / "cola_sparsity.png"
    plot(samples, image)
    worst_lr = max(s.ratio["lr"] for s in samples)
    lines = [
        f"Command: `.venv/bin/python bench/sparsity.py{' --quick' if args.quick else ''}`  ",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}  ",
        f"Date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "",
        (
            "Each PE split minimises ratio (2), cut / min(w(S1), w(S2)). Ratio = a method's sparsity over the "
            "exact optimum (enumeration of all bipartitions); mean / worst, and in brackets the share of graphs "
            "where the method found the optimum. `chosen` is what COLA keeps with its default options: the exact "
            f"enumeration on PEs of at most {options.exact_max_nodes} vertices, else the best of the three "
            "polished by single-vertex moves (`refine`). Times are CPU time (the machine is shared). LR/GK runs "
            f"with eps = {options.epsilon} and at most {options.gk_max_steps} steps; COLA uses it on PEs of at "
            f"most {options.gk_max_nodes} super operators, spectral up to {options.spectral_max_nodes}, METIS always."
        ),
        "",
        *markdown(HEADER, rows),
        "",
        f"Worst LR/GK ratio over all {len(samples)} graphs: {worst_lr:.3f} (test bound: 3).",
        "",
        f"GK step cap against quality and time (random graphs of 16 vertices, {count} graphs):",
        "",
        *markdown(step_header, sweep),
        "",
        "![sparsity](img/cola_sparsity.png)",
    ]
    write_section(SECTION, lines)
    console.print(f"wrote docs/benchmarks.md section {SECTION!r} and {image.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
