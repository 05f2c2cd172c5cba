"""Latency of the peers matrix at a fixed rate (issue 33, item 6): bench/peers.py's shapes, paced.

    .venv/bin/python bench/peers_latency.py [--shapes running,...] [--executors 1,2] [--parallelism 1,2]
        [--peers flink,spark] [--warmup 10] [--seconds 20] [--section TITLE] [--no-write]

bench/peers.py runs its shapes backlogged, flat out, where a record's latency is the run's length. Here
each shape's sources are endless and paced at the matrix's event-time rate, so the engines run as a
service does, and what is measured is how long a result takes to come out (:data:`METHOD` says how, for
each engine; it is also the section's text).

Writes the "Peers' latency at a fixed rate (issue 33, item 6)" section of docs/benchmarks.md and
docs/img/peers_latency.png.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from bench.peers import ENGINE_NAMES, LABELS, Worker, matrix_arguments, matrix_choices, shape_ops
from bench.peers_worker import EVENT_RATE
from bench.report import header, markdown, save_figure, section_image, write_section
from bench.runtime import ExecutorGroup, cpu_seconds, pipelines_topology, quantile, round_robin
from streamtopo.runtime.embedded import EmbeddedValkey
from streamtopo.runtime.metrics import LATENCY_BUCKETS
from streamtopo.runtime.operators.udf import UDF_PATH_ENV

console = Console(width=160)
TITLE = "Peers' latency at a fixed rate (issue 33, item 6)"
CATCH_UP_TIMEOUT = 180.0
"""Seconds a streamtopo group may take to work off the records due while its executors started."""

METHOD = f"""\
Latency of an output row = the wall time the engine emits it - the newest event time it reflects. A
record's event time is the wall time it is due at its source, paced at {EVENT_RATE:,} records/s (the
join's two inputs each); a window's result reflects its end, a running aggregate's update the latest
record it counts, a join's pair its window's end, a record written to a stream itself.

- streamtopo: its sink histogram `streamtopo_sink_latency_seconds` (the wall time of the sink's commit -
  the row's event time), scraped from the executors before and after the measured seconds and
  subtracted. A fresh group of executor processes per shape (bench/runtime.py's ExecutorGroup, as
  `streamtopo run --executors k` starts them, units round-robin, a Valkey of its own); the sources start
  with the executors, so the records due while they started are worked off before the warm-up begins.
  The default step interval (docs/runtime.md).
- PyFlink: the Flink SQL of bench/peers.py, its `datagen` paced at the rate, the event time
  `CURRENT_TIMESTAMP` at the source and `CURRENT_TIMESTAMP` again just before the `print` sink (both
  evaluated per record in streaming mode); cancelled after the measured seconds. bench/peers.py's
  configuration: mini-batches (`allow-latency` 1 s) and local-global aggregation.
- Structured Streaming: the `rate` source at the rate (its `timestamp` is when a row is due),
  micro-batches back to back, `foreachBatch` timing each batch's rows when the driver has them. Windows
  and pairs come out in append mode, once the watermark (0 s late) passes their end, as streamtopo's and
  Flink's windows fire; running aggregates in update mode.

Rows emitted during the warm-up are not counted. Cores used: CPU-seconds per second over the measured
seconds, of the executors' process trees and Valkey for streamtopo, of the worker's process tree (JVM and
Python workers) for a peer: what the latency costs. Percentiles are interpolated within the buckets of
streamtopo's histogram for every engine alike (bench/runtime.py's `quantile`, Prometheus'
`histogram_quantile`). Outputs are not checked here (the sources are endless); bench/peers.py checks every
shape's output in every engine.\
"""

Buckets = list[tuple[float, float]]
"""(upper bound, cumulative rows), the last bound infinite: a Prometheus histogram's buckets."""


@dataclass
class Latency:
    """One shape on one engine configuration: the latency histogram of the rows emitted while measured."""

    shape: str
    engine: str
    parallelism: int
    interval: float | None = None
    """streamtopo's ``spec.batching.interval`` (None: the default)."""
    buckets: Buckets | None = None
    cores: float = math.nan
    """CPU-seconds of the engine's processes per second while measured (streamtopo: the executors' trees
    and Valkey; a peer: its worker's tree, JVM and Python workers included)."""
    problem: str | None = None

    @property
    def config(self) -> tuple[str, int, float | None]:
        return self.engine, self.parallelism, self.interval

    @property
    def rows(self) -> int:
        return int(self.buckets[-1][1]) if self.buckets else 0

    def quantile(self, q: float) -> float:
        return quantile(self.buckets, q) if self.buckets and self.rows else math.nan

    @property
    def label(self) -> str:
        if self.engine == "streamtopo":
            every = "" if self.interval is None else f", interval {self.interval:g} s"
            return f"{self.parallelism} executor{'s' if self.parallelism > 1 else ''}{every}"
        return f"p={self.parallelism}" if self.engine == "flink" else f"local[{self.parallelism}]"


def cumulative(counts: list[int]) -> Buckets:
    """A worker's rows per bucket (the last: beyond every bound) as a histogram's cumulative buckets."""
    bounds = [*LATENCY_BUCKETS, math.inf]
    total, out = 0, []
    for bound, count in zip(bounds, counts, strict=True):
        total += count
        out.append((bound, float(total)))
    return out


def streamtopo_latency(
    shape: str, executors: int, interval: float | None, warmup: float, seconds: float, work: Path
) -> tuple[Buckets, float]:
    """The shape's pipeline alone on ``executors`` fresh executor processes, its sources endless and paced:
    the sink histogram's growth over ``seconds``, after the start's backlog is worked off and ``warmup``,
    and the cores the executors and Valkey used meanwhile."""
    name = (
        f"latency-{shape}-{executors}-{'default' if interval is None else f'{interval:g}'.replace('.', '-')}"
    )
    top = pipelines_topology(name, [shape_ops(shape, shape, None)], interval)
    os.environ[UDF_PATH_ENV] = str(ROOT / "bench")  # the executors import the udf shape's function
    with (
        EmbeddedValkey() as valkey,
        ExecutorGroup(top, work / top.metadata.name, valkey.url, executors) as group,
    ):
        ops = group.operators(shape)
        group.route(round_robin(ops, group.spec, executors))
        # Caught up: at most one step interval and a second of records waiting. An executor that keeps up
        # pauses up to the interval between steps, and meanwhile a stream between two executors holds
        # what its producer's last step wrote. Scraping is work for the executors: twice a second.
        sources = sum(op.kind == "source" for op in ops)
        held = sources * EVENT_RATE * (1.0 + group.spec.batching.interval)
        if not group.wait(lambda: group.backlog(ops) <= held, timeout=CATCH_UP_TIMEOUT, poll=0.5):
            raise TimeoutError(f"still more than {held:,.0f} records behind after {CATCH_UP_TIMEOUT:g} s")
        time.sleep(warmup)
        before, cpu = group.sink_latency(f"{shape}-out"), cpu_seconds(group.processes)
        time.sleep(seconds)
        after, cpu = group.sink_latency(f"{shape}-out"), cpu_seconds(group.processes) - cpu
    if not after:
        raise RuntimeError(f"no sink latency histogram after {seconds:g} s")
    return [(bound, count - before.get(bound, 0.0)) for bound, count in sorted(after.items())], cpu / seconds


def peer_latency(
    worker: Worker, shape: str, paced: dict, warmup: float, seconds: float
) -> tuple[Buckets, float]:
    """The worker's latency run of the shape, and the cores its process tree used over the measured
    seconds (read by this process while the worker runs: the worker has no psutil of ours)."""
    worker.send(latency=shape, paced=paced)
    time.sleep(warmup)
    cpu = cpu_seconds([worker.tree])
    time.sleep(seconds)
    cpu = cpu_seconds([worker.tree]) - cpu
    return cumulative(worker.answer(300.0)["counts"]), cpu / seconds


def configurations(args: argparse.Namespace) -> list[tuple[str, int, float | None]]:
    return [
        *(("streamtopo", k, interval) for interval in args.intervals for k in args.executors),
        *(
            (engine, p, None)
            for engine in ("flink", "spark")
            if engine in args.engines
            for p in args.parallelism
        ),
    ]


def bench(args: argparse.Namespace, work: Path, done: Callable[[list[Latency]], None]) -> list[Latency]:
    """Every configuration's shapes; ``done`` gets the points so far after each configuration."""
    points: list[Latency] = []
    configs = configurations(args)
    paced = {"rate": EVENT_RATE, "warmup": args.warmup, "seconds": args.seconds, "bounds": LATENCY_BUCKETS}
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} shapes"),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        task = progress.add_task("starting", total=len(configs) * len(args.shapes))
        for engine, parallelism, interval in configs:
            worker = None
            try:
                if engine != "streamtopo":
                    python = args.flink_python if engine == "flink" else sys.executable
                    worker = Worker(python, engine, parallelism, work)
                for shape in args.shapes:
                    point = Latency(shape, engine, parallelism, interval)
                    points.append(point)
                    progress.update(task, description=f"{ENGINE_NAMES[engine]} {point.label}: {shape}")
                    try:
                        if worker is None:
                            point.buckets, point.cores = streamtopo_latency(
                                shape, parallelism, interval, args.warmup, args.seconds, work
                            )
                        else:
                            point.buckets, point.cores = peer_latency(
                                worker, shape, paced, args.warmup, args.seconds
                            )
                    except Exception as e:  # reported in the table; the next shape is measured
                        point.problem = f"{type(e).__name__}: {str(e)[:300]}"
                        console.print(f"  [red]{engine} {point.label} {shape}: {point.problem}[/red]")
                    else:
                        console.print(
                            f"  {ENGINE_NAMES[engine]} {point.label}, {shape}: p50 {point.quantile(0.5):.2f} s,"
                            f" p99 {point.quantile(0.99):.2f} s over {point.rows:,} rows, {point.cores:.2f} cores"
                        )
                    progress.advance(task)
            except Exception as e:  # the worker did not start (no PyFlink virtualenv, a JVM that failed)
                console.print(f"  [red]{engine} {parallelism}: {type(e).__name__}: {str(e)[:300]}[/red]")
                for shape in args.shapes:
                    if not any(
                        p.shape == shape and p.config == (engine, parallelism, interval) for p in points
                    ):
                        points.append(
                            Latency(shape, engine, parallelism, interval, problem=f"did not start: {e}"[:300])
                        )
            finally:
                if worker is not None:
                    worker.close()
            done(points)
    return points


def plot(args: argparse.Namespace, points: list[Latency]) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = configurations(args)
    fig, ax = plt.subplots(figsize=(max(8.0, 1.3 * len(args.shapes)), 4.2))
    width = 0.8 / len(configs)
    for j, config in enumerate(configs):
        values = [
            next((p.quantile(0.99) for p in points if (p.shape, p.config) == (s, config)), math.nan)
            for s in args.shapes
        ]
        label = f"{ENGINE_NAMES[config[0]]} {Latency('', *config).label}"
        ax.bar(
            [i + (j - (len(configs) - 1) / 2) * width for i in range(len(args.shapes))],
            values,
            width,
            label=label,
        )
    ax.set_xticks(range(len(args.shapes)), args.shapes)
    ax.set_yscale("log")
    ax.set_ylabel("p99 latency, seconds (log)")
    ax.set_title(f"p99 latency at {EVENT_RATE:,} records/s per source, after a {args.warmup:g} s warm-up")
    ax.legend(fontsize=8, ncol=2)
    return save_figure(fig, section_image(args.section, TITLE, "peers_latency"))


def report(
    args: argparse.Namespace, command: str, points: list[Latency], started: float, final: bool
) -> None:
    """Prints the table; unless ``--no-write``, draws the plot and writes the section."""

    def versus_flink(p: Latency) -> str:
        flink = next(
            (f for f in points if (f.shape, f.config) == (p.shape, ("flink", p.parallelism, None))), None
        )
        if p.engine != "streamtopo" or flink is None or not flink.rows or not p.rows:
            return ""
        return f"{p.quantile(0.99) / flink.quantile(0.99):.2f}x"

    columns = (
        "shape",
        "engine",
        "configuration",
        "p50 s",
        "p99 s",
        "rows measured",
        "cores used",
        "p99 vs PyFlink at this parallelism",
    )
    rows = [
        (
            p.shape,
            ENGINE_NAMES[p.engine],
            p.label,
            *(
                (
                    f"{p.quantile(0.5):.2f}",
                    f"{p.quantile(0.99):.2f}",
                    f"{p.rows:,}",
                    f"{p.cores:.2f}",
                    versus_flink(p),
                )
                if p.problem is None
                else (p.problem, "", "", "", "")
            ),
        )
        for shape in args.shapes
        for p in points
        if p.shape == shape
    ]
    if final:
        console.print("\n".join(markdown(columns, rows)), markup=False)
    if args.no_write:
        return
    img = plot(args, points)
    lines = [
        *header(
            command,
            f"load average {os.getloadavg()[1]:.1f} (5 min) at the end of the run, {(time.time() - started) / 60:.0f} min",
        ),
        "",
        f"Each shape's sources paced at {EVENT_RATE:,} records/s (the join's two inputs each), "
        f"{args.warmup:g} s of warm-up, then {args.seconds:g} s measured.",
        "",
        *markdown(columns, rows),
        "",
        f"![peers latency](img/{img})",
        "",
        "Shapes: " + "; ".join(f"`{s}`: {LABELS[s]}" for s in args.shapes) + ".",
        "",
        METHOD,
    ]
    measured = {p.config for p in points}
    if not final and (
        pending := [
            f"{ENGINE_NAMES[c[0]]} {Latency('', *c).label}" for c in configurations(args) if c not in measured
        ]
    ):
        lines += [
            "",
            "**Partial record** (the run had not finished): not measured yet: " + ", ".join(pending),
        ]
    write_section(args.section, lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    matrix_arguments(parser)
    parser.add_argument(
        "--intervals",
        default="default",
        help="streamtopo's spec.batching.interval in seconds, comma-separated ('default': the model's)",
    )
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds run before measuring")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds measured")
    parser.add_argument("--no-write", action="store_true", help="print the table, leave docs/ alone")
    parser.add_argument(
        "--section", default=TITLE, help="the docs/benchmarks.md section this run writes (its own record)"
    )
    args = parser.parse_args()
    matrix_choices(parser, args)
    args.intervals = [None if i == "default" else float(i) for i in args.intervals.split(",")]
    command = shlex.join(["python", "bench/peers_latency.py", *sys.argv[1:]])
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="peers-latency-") as tmp:
        points = bench(args, Path(tmp), lambda so_far: report(args, command, so_far, started, final=False))
    report(args, command, points, started, final=True)


if __name__ == "__main__":
    main()
