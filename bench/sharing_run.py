"""Sharing on the running system: topologies with a common cleaning prefix (examples/sharing/), run together
as ``streamtopo run A B C`` runs them (fused: one dataflow, the prefix once, planner/benoit/fuse.py), with
the prefix in a shared part of its own whose named streams the others read (split, what the operator does
when consumers run apart), and each whole (``--no-share``).

Cases: the examples' cheap prefix (generator, filter, map) with 2 and 3 consumers, and an expensive prefix
(the same plus a map hashing every record, SHA-512 eight times over) with 3. Each mode runs ``--repeats``
times, alternating, with generators stopping after S = ``--source-seconds`` and after 2S of records, so
every run of a length processes the same records and ends at end of stream. CPU-seconds are those of every
process the run started and waited for (executors, their JVMs, the embedded Valkey: ``RUSAGE_CHILDREN``).
A run's total includes what it pays once (a JVM and Spark session per topology: fused starts one topology,
split one more than the files, --no-share one per file); the marginal cost, (CPU(2S) - CPU(S)) / S, is what
each further second of stream costs, the steady state of a long-running pipeline. Outputs are compared
file by file (sorted lines; sums over floats may differ in the last bits, since the order of a sum follows
the key groups a record went through, so records are compared after rounding floats to 9 significant
digits). Writes the "Sharing at run time" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rich.console import Console

from bench.report import header, markdown, stop_if_interrupted, write_section
from streamtopo.documents import load_topology
from streamtopo.local.runner import RunOptions, run_topologies
from streamtopo.planner.benoit.fuse import fuse_shared
from streamtopo.planner.benoit.split import split_shared
from streamtopo.planner.model import StreamTopology

SECTION = "Sharing at run time"
FILES = sorted((ROOT / "examples" / "sharing").glob("*.yaml"))
MODES = ("fused", "split", "apart")
ROUNDS = 8
HASHED = (
    "length(" + "sha2(" * ROUNDS + "concat(symbol, cast(price AS STRING))" + ", 512)" * ROUNDS + ") AS digest"
)
"""What the expensive prefix adds to every record: SHA-512 applied :data:`ROUNDS` times over, in the JVM."""


def case(name: str) -> list[StreamTopology]:
    """The topologies of a case: ``cheap-2``, ``cheap-3`` (the example files), ``expensive-3``, or
    ``heldout-3`` (:func:`held_out`)."""
    kind, count = name.split("-")
    if kind == "heldout":
        return held_out()[: int(count)]
    topologies = [load_topology(f) for f in FILES[: int(count)]]
    return topologies if kind == "cheap" else [expensive(t) for t in topologies]


def held_out() -> list[StreamTopology]:
    """Three topologies written apart from the examples and from the fusion's tests: a keyed sequence
    (40,000 records/s, 64 keys) cleaned the same way, then a tumbling per-key count and sum, a sliding
    per-key maximum, and a filter into a file."""
    prefix = [
        {
            "name": "readings",
            "kind": "source",
            "source": {"generator": "sequence", "ratePerSecond": 40000, "keys": 64},
        },
        {"name": "valid", "kind": "filter", "inputs": ["readings"], "expr": "value % 5 <> 0"},
        {"name": "scaled", "kind": "map", "inputs": ["valid"], "select": ["key", "value", "value * 3 AS v3"]},
    ]
    tails = {
        "per-second": {
            "kind": "aggregate",
            "keyBy": ["key"],
            "window": {"size": 1.0},
            "aggregations": ["count(*) AS n", "sum(v3) AS total"],
        },
        "sliding-max": {
            "kind": "aggregate",
            "keyBy": ["key"],
            "window": {"size": 2.0, "slide": 1.0},
            "aggregations": ["max(v3) AS top"],
        },
        "sevens": {"kind": "filter", "expr": "v3 % 7 = 0"},
    }
    out = []
    for name, tail in tails.items():
        operators = [
            *prefix,
            {"name": "result", "inputs": ["scaled"], **tail},
            {"name": "out", "kind": "sink", "inputs": ["result"], "sink": {"file": {}}},
        ]
        out.append(
            StreamTopology.model_validate(
                {"metadata": {"name": name}, "spec": {"keyGroups": 8, "operators": operators}}
            )
        )
    return out


def expensive(topology: StreamTopology) -> StreamTopology:
    """``topology`` with a hashing map and a filter on the hash after the shared ``trades-notional``: the
    same in every file, so shared too, and a prefix record costs several times what it costs in the
    cheap case. The filter reads the digest (always > 0, so it keeps every record): without a reader,
    Spark prunes a column no later operator uses, and a file run apart never computed the hash."""
    document = topology.model_dump(mode="json", by_alias=True, exclude_none=True)
    operators = document["spec"]["operators"]
    for op in operators:
        op["inputs"] = ["trades-checked" if i == "trades-notional" else i for i in op.get("inputs", [])]
    at = next(i for i, op in enumerate(operators) if op["name"] == "trades-notional") + 1
    operators[at:at] = [
        {
            "name": "trades-hashed",
            "kind": "map",
            "inputs": ["trades-notional"],
            "select": ["symbol", "price", "volume", "pv", HASHED],
        },
        {"name": "trades-checked", "kind": "filter", "inputs": ["trades-hashed"], "expr": "digest > 0"},
    ]
    return StreamTopology.model_validate(document)


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
    mode: str, topologies: Sequence[StreamTopology], args: argparse.Namespace, workdir: Path, seconds: float
) -> tuple[float, float, dict[str, list[str]]]:
    """One run: CPU-seconds, wall seconds, each topology's normalised output."""
    names = [t.metadata.name for t in topologies]
    parts = list(topologies)
    outputs = {n: workdir / n for n in names}
    if mode == "fused":
        fusion = fuse_shared(topologies)
        assert fusion is not None, "the case shares nothing"
        parts, outputs = [fusion.topology], {fusion.topology.metadata.name: workdir}
    elif mode == "split":
        split = split_shared(topologies)
        parts = ([split.shared] if split.shared else []) + split.consumers
        outputs = {t.metadata.name: workdir / t.metadata.name for t in parts}
    options = RunOptions(
        executors=args.executors,
        # every topology's executors get a core of their own in the model (this machine may have fewer):
        # the benchmark measures what sharing saves, not placement
        host_cpu=float(len(parts) * args.executors),
        live=False,
        duration=900,
        rate_scale=args.rate_scale,
        source_seconds=seconds,
        seed=0,
    )
    summaries = run_topologies(parts, options, Console(quiet=True), outputs)
    stop_if_interrupted(next(iter(summaries.values())))
    failed = {n: s.failed for n, s in summaries.items() if s.failed or not s.finished}
    if failed:
        raise SystemExit(f"a run did not finish: {failed}")
    cpu = next(iter(summaries.values())).cpu_seconds or 0.0
    wall = max(s.seconds for s in summaries.values())
    return cpu, wall, {n: normalised(workdir / n) for n in names}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rate-scale", type=float, default=0.25, help="factor on the examples' 40,000 rec/s")
    parser.add_argument("--source-seconds", type=float, default=15.0)
    parser.add_argument("--executors", type=int, default=1, help="executors per topology run")
    parser.add_argument("--cases", default="cheap-2,cheap-3,expensive-3,heldout-3")
    parser.add_argument("--modes", default=",".join(MODES), help="apart is the baseline and always runs")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    modes = [m for m in MODES if m in args.modes.split(",") or m == "apart"]
    console = Console()
    lengths = (args.source_seconds, 2 * args.source_seconds)
    rows, problems = [], []
    with tempfile.TemporaryDirectory(prefix="sharing-run-") as tmp:
        for name in args.cases.split(","):
            topologies = case(name)
            results: dict[tuple[str, float], list[tuple[float, float]]] = {}
            outputs: dict[str, dict[str, list[str]]] = {}
            for i in range(args.repeats):
                for length in lengths if i % 2 == 0 else lengths[::-1]:
                    for mode in modes:
                        where = Path(tmp) / f"{name}-{i}-{mode}-{length}"
                        cpu, wall, out = run_mode(mode, topologies, args, where, length)
                        results.setdefault((mode, length), []).append((cpu, wall))
                        if length == lengths[1]:
                            outputs.setdefault(mode, out)
                        console.print(
                            f"{name}, run {i + 1}, {length:g} s of records, {mode}: {cpu:.1f} CPU-s, {wall:.1f} s"
                        )
            cpu = {k: statistics.median(c for c, _ in v) for k, v in results.items()}
            wall = {k: statistics.median(w for _, w in v) for k, v in results.items()}
            marginal = {m: (cpu[(m, lengths[1])] - cpu[(m, lengths[0])]) / lengths[0] for m in modes}
            long = lengths[1]
            for mode in modes:
                same = outputs[mode] == outputs["apart"]
                if not same:
                    problems.append(f"{name}: {mode} output differs from apart")
                rows.append(
                    [
                        name,
                        mode,
                        f"{cpu[(mode, long)]:.1f}",
                        f"{cpu[(mode, long)] / cpu[('apart', long)]:.2f}" if mode != "apart" else "1",
                        f"{wall[(mode, long)]:.1f}",
                        f"{marginal[mode]:.2f}",
                        f"{marginal[mode] / marginal['apart']:.2f}" if mode != "apart" else "1",
                        "yes" if same else "**NO**",
                    ]
                )
            records = sum(len(v) for v in outputs["apart"].values())
            console.print(f"{name}: {records:,} output records per mode")
    rate = 40000 * args.rate_scale
    lines = header(
        f"python bench/sharing_run.py --repeats {args.repeats} --rate-scale {args.rate_scale:g} "
        f"--source-seconds {args.source_seconds:g} --executors {args.executors} --cases {args.cases} "
        f"--modes {','.join(modes)}"
    ) + [
        "",
        (
            f"Topologies of examples/sharing/ at {rate:,.0f} trades/s, {args.executors} executor(s) per "
            f"topology run (fused: one topology; split: the files plus the shared part; apart: the files); "
            f"runs of {lengths[0]:g} s and {long:g} s of records, medians of {args.repeats} runs per mode and "
            "length (CPU-seconds of every executor, JVM and the embedded Valkey). Totals are for the "
            f"{long:g} s runs and include every topology's start; marginal = (CPU(2S) - CPU(S)) / S. "
            "Target (issue 34): totals <= 0.75x of apart, outputs exact."
        ),
        "",
    ]
    lines += markdown(
        [
            "case",
            "mode",
            f"CPU-seconds ({long:g} s of records)",
            "x apart",
            "wall seconds",
            "marginal CPU-s per stream second",
            "x apart",
            "outputs = apart",
        ],
        rows,
    )
    console.print("\n".join(lines))
    if not args.no_write:
        write_section(SECTION, lines)
    if problems:
        raise SystemExit("; ".join(problems))


if __name__ == "__main__":
    main()
