"""The JIT's share of an executor: held-out pipelines at several JIT compile thresholds, interleaved.

    .venv/bin/python bench/jit_scaling.py [--records N] [--pipelines a,b] [--values 1,10] [--executors 1,2]
                                          [--no-write]

An executor's JVM compiles the long tail of Spark's planner that every step runs a little of; HotSpot's
``-XX:CompileThresholdScaling`` (runtime/spark.py ``JIT_SCALING``, overridden per run here through
``STREAMTOPO_JIT_SCALING``) decides how soon. Each (pipeline, executor count) runs as bench/held_out_shapes.py
runs it (``streamtopo run FILE --executors k --no-autoscale``, its sources counted N, 4N, N, outputs held to
the Spark SQL definition), once per value, the values' order alternating between pipelines so that
neither always runs first. Records per CPU-second are marginal over the three runs (whole process trees).

Writes the "The JIT's share of an executor (issue 33)" section of docs/benchmarks.md and
docs/img/jit_scaling.png.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rich.console import Console

from bench.held_out_shapes import Measured, arguments, chosen, measure
from bench.report import header, markdown, save_figure, write_section
from streamtopo.runtime.spark import JIT_SCALING, JIT_SCALING_ENV

TITLE = "The JIT's share of an executor (issue 33)"


def run(names: list[str], executors: list[int], values: list[float], records: int) -> dict[tuple, Measured]:
    """Every (pipeline, executors, value), the values alternating their order from one pair to the next."""
    console = Console(width=160)
    results: dict[tuple, Measured] = {}
    turn = 0
    with tempfile.TemporaryDirectory(prefix="bench-jit-") as tmp:
        for name in names:
            wants: dict[int, list[dict[str, Any]]] = {}
            for k in executors:
                order = values if turn % 2 == 0 else values[::-1]
                turn += 1
                for value in order:
                    os.environ[JIT_SCALING_ENV] = f"{value:g}"
                    console.print(f"{name}, {k} executor(s), CompileThresholdScaling={value:g}")
                    results[(name, k, value)] = measure(name, k, records, Path(tmp), console, wants)
    os.environ.pop(JIT_SCALING_ENV, None)
    return results


def rows(results: dict[tuple, Measured], values: list[float]) -> list[tuple]:
    out = []
    for (name, k, value), m in results.items():
        base = results[(name, k, values[0])].per_cpu[0]
        one = results.get((name, 1, value))
        cpu, wall = (f"{m.runs[1][1]:.1f}", f"{m.runs[1][2]:.1f}") if len(m.runs) > 1 else ("-", "-")
        out.append(
            (
                name,
                k,
                f"{value:g}",
                f"{m.per_cpu[0]:,.0f} +- {m.per_cpu[1]:.0%}",
                f"{m.per_cpu[0] / base:.2f}x",
                f"{m.per_cpu[0] / one.per_cpu[0]:.2f}x" if one is not None and k != 1 else "-",
                cpu,
                wall,
                "; ".join(m.wrong)[:120] or "exact, every run",
            )
        )
    return out


def plot(results: dict[tuple, Measured], values: list[float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(name, k) for name, k, _ in results})
    fig, ax = plt.subplots(figsize=(10, 4))
    width = 0.8 / len(values)
    for j, value in enumerate(values):
        cells = [results[(name, k, value)].per_cpu for name, k in groups]
        ax.bar(
            [i + (j - (len(values) - 1) / 2) * width for i in range(len(groups))],
            [c[0] for c in cells],
            width,
            yerr=[c[0] * c[1] for c in cells],
            label=f"CompileThresholdScaling={value:g}",
        )
    ax.set_xticks(range(len(groups)), [f"{name}\n{k} executor(s)" for name, k in groups])
    ax.set_ylabel("marginal records per CPU-second")
    ax.set_title("held-out pipelines at JIT compile thresholds")
    ax.legend()
    save_figure(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    arguments(parser, 10_000_000, "trade-totals,lot-rekey")
    parser.add_argument("--values", default=f"1,{JIT_SCALING:g}", help="CompileThresholdScaling values")
    parser.add_argument("--executors", default="1,2")
    args = parser.parse_args()
    names = chosen(parser, args)
    values = [float(v) for v in args.values.split(",")]
    executors = [int(k) for k in args.executors.split(",")]
    results = run(names, executors, values, args.records)
    table = markdown(
        [
            "pipeline",
            "executors",
            "CompileThresholdScaling",
            "records per CPU-second (marginal)",
            f"vs {values[0]:g}",
            "vs 1 executor",
            "CPU-s at 4N",
            "wall s at 4N",
            "output against Spark",
        ],
        rows(results, values),
    )
    console = Console(width=160)
    for line in table:
        console.print(line)
    if args.no_write:
        return
    image = ROOT / "docs" / "img" / "jit_scaling.png"
    plot(results, values, image)
    command = (
        f"python bench/jit_scaling.py --records {args.records} --pipelines {args.pipelines} "
        f"--values {args.values} --executors {args.executors}"
    )
    reading = (
        "Reading: each row is bench/held_out_shapes.py's measurement (runs of N, 4N and N records at the "
        "pipeline's declared rates, executors as `streamtopo run --executors k --no-autoscale` starts them, "
        "outputs held to the Spark SQL definition) with every executor JVM's -XX:CompileThresholdScaling "
        "set through STREAMTOPO_JIT_SCALING; 1 is HotSpot's default, "
        f"{JIT_SCALING:g} streamtopo's (runtime/spark.py JIT_SCALING). Values interleaved, alternating which "
        "runs first."
    )
    write_section(TITLE, [*header(command), "", *table, "", f"![JIT scaling](img/{image.name})", "", reading])


if __name__ == "__main__":
    main()
