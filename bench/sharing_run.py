"""Sharing on the running system: three topologies with a common cleaning prefix (examples/sharing/), run
together with the prefix once (``streamtopo run A B C``) and each whole (``--no-share``).

Each mode runs ``--repeats`` times, alternating, with generators stopping after S = ``--source-seconds`` and
after 2S of records, so every run of a length processes the same records and ends at end of stream.
CPU-seconds are those of every process the run started and waited for (executors, their JVMs, the
embedded Valkey: ``RUSAGE_CHILDREN``). A run's total includes what it pays once (a JVM and Spark session
per topology: the shared mode starts four topologies, --no-share three); the marginal cost, (CPU(2S) -
CPU(S)) / S, is what each further second of stream costs, the steady state of a long-running pipeline
(bench/runtime.py measures the same way);
outputs are compared file by file (sorted lines; sums over floats may differ in the last bits, since the
order of a sum follows the key groups a record went through, so records are compared after rounding floats
to 9 significant digits). Writes the "Sharing at run time" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rich.console import Console

from bench.report import header, markdown, write_section
from streamtopo.documents import load_topology
from streamtopo.local.runner import RunOptions, run_topologies
from streamtopo.planner.benoit.split import split_shared

SECTION = "Sharing at run time"
FILES = sorted((ROOT / "examples" / "sharing").glob("*.yaml"))


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def normalised(output: Path) -> list[str]:
    """Every file sink line under ``output``, sorted, floats to 9 significant digits of the record's
    largest float: double sums differ in their last bits with the order partials merge in (Spark's
    too), and a difference of two such sums (MACD's fast - slow) carries that error at its own scale."""
    rows = []
    for path in sorted(output.rglob("kg-*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            floats = [abs(v) for v in record.values() if isinstance(v, float) and math.isfinite(v)]
            digits = 8 - math.floor(math.log10(max(floats))) if floats and max(floats) > 0 else 9
            rows.append(
                json.dumps(
                    {k: round(v, digits) + 0.0 if isinstance(v, float) else v for k, v in record.items()},
                    sort_keys=True,
                )
            )
    return sorted(rows)


def run_mode(
    share: bool, args: argparse.Namespace, workdir: Path, source_seconds: float
) -> tuple[float, float, dict[str, list[str]]]:
    topologies = [load_topology(f) for f in FILES]
    if share:
        split = split_shared(topologies)
        topologies = ([split.shared] if split.shared else []) + split.consumers
    outputs = {t.metadata.name: workdir / t.metadata.name for t in topologies}
    options = RunOptions(
        executors=args.executors,
        # every topology's executors get a core of their own in the model (this machine may have fewer):
        # the benchmark measures what sharing saves, not placement
        host_cpu=float(len(topologies) * args.executors),
        live=False,
        duration=900,
        rate_scale=args.rate_scale,
        source_seconds=source_seconds,
        seed=0,
    )
    before = children_cpu()
    summaries = run_topologies(topologies, options, Console(quiet=True), outputs)
    cpu = children_cpu() - before
    seconds = max(s.seconds for s in summaries.values())
    failed = {n: s.failed for n, s in summaries.items() if s.failed or not s.finished}
    if failed:
        raise SystemExit(f"a run did not finish: {failed}")
    names = [load_topology(f).metadata.name for f in FILES]
    return cpu, seconds, {n: normalised(outputs[n]) for n in names}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rate-scale", type=float, default=0.25, help="factor on the examples' 40,000 rec/s")
    parser.add_argument("--source-seconds", type=float, default=20.0)
    parser.add_argument("--executors", type=int, default=1, help="executors per topology")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    console = Console()
    lengths = (args.source_seconds, 2 * args.source_seconds)
    results: dict[tuple[bool, float], list[tuple[float, float]]] = {}
    outputs: dict[bool, dict[str, list[str]]] = {}
    with tempfile.TemporaryDirectory(prefix="sharing-run-") as tmp:
        for i in range(args.repeats):
            for length in lengths if i % 2 == 0 else lengths[::-1]:
                for share in (True, False):
                    cpu, seconds, out = run_mode(share, args, Path(tmp) / f"{i}-{share}-{length}", length)
                    results.setdefault((share, length), []).append((cpu, seconds))
                    if length == lengths[1]:
                        outputs.setdefault(share, out)
                    console.print(
                        f"run {i + 1}, {length:g} s of records, {'shared' if share else 'no-share'}: "
                        f"{cpu:.1f} CPU-s, {seconds:.1f} s"
                    )
    same = outputs[True] == outputs[False]
    cpu = {key: statistics.median(c for c, _ in runs) for key, runs in results.items()}
    wall = {key: statistics.median(s for _, s in runs) for key, runs in results.items()}
    marginal = {
        share: (cpu[(share, lengths[1])] - cpu[(share, lengths[0])]) / lengths[0] for share in (True, False)
    }
    records = sum(len(v) for v in outputs[True].values())
    long = lengths[1]
    rows = [
        [
            "shared (prefix once)",
            f"{cpu[(True, long)]:.1f}",
            f"{wall[(True, long)]:.1f}",
            f"{marginal[True]:.2f}",
        ],
        [
            "--no-share (each whole)",
            f"{cpu[(False, long)]:.1f}",
            f"{wall[(False, long)]:.1f}",
            f"{marginal[False]:.2f}",
        ],
        [
            "ratio shared / no-share",
            f"{cpu[(True, long)] / cpu[(False, long)]:.2f}",
            f"{wall[(True, long)] / wall[(False, long)]:.2f}",
            f"**{marginal[True] / marginal[False]:.2f}**",
        ],
    ]
    rate = 40000 * args.rate_scale
    lines = header(
        f"python bench/sharing_run.py --repeats {args.repeats} --rate-scale {args.rate_scale:g} "
        f"--source-seconds {args.source_seconds:g} --executors {args.executors}"
    ) + [
        "",
        (
            f"examples/sharing/*.yaml: three topologies, {rate:,.0f} trades/s each, {args.executors} executor(s) "
            f"per topology; runs of {lengths[0]:g} s and {long:g} s of records, medians of {args.repeats} runs "
            "per mode and length (CPU-seconds of every executor, JVM and the embedded Valkey). Totals are "
            f"for the {long:g} s runs and include each topology's start (a JVM and a Spark session; the "
            "shared mode starts four topologies, --no-share three); marginal = (CPU(2S) - CPU(S)) / S, the "
            "CPU-seconds each further second of stream costs. Target (issue 12): shared <= 0.75x."
        ),
        "",
    ]
    lines += markdown(
        [
            "mode",
            f"CPU-seconds ({long:g} s of records)",
            "wall seconds to end of stream",
            "marginal CPU-s per stream second",
        ],
        rows,
    )
    lines += [
        "",
        (
            f"Outputs of the three topologies identical in both modes (floats to 9 significant digits): "
            f"{'yes' if same else 'NO'} ({records:,} output records)."
        ),
    ]
    console.print("\n".join(lines))
    if not args.no_write:
        write_section(SECTION, lines)
    if not same:
        raise SystemExit("outputs differ between the modes")


if __name__ == "__main__":
    main()
