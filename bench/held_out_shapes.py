"""Held-out pipelines of every shape, run as a user runs them (issue 33's last acceptance).

    .venv/bin/python bench/held_out_shapes.py [--records N] [--pipelines trade-totals,...] [--no-write]

bench/peers.py measures its shapes on queries over the sequence generator that the runtime's changes were
profiled on. These pipelines (bench/held_out/*.yaml) were written apart from them and from the tests:
other generators (trades, quotes), other keys and key counts, other expressions, windows and aggregates,
one of each shape peers.py has but the named stream (whose records leave the run with its Valkey):

- partials can cross: a running aggregate (``trade-totals``), 2 s tumbling bars (``quote-bars``), 6 s
  windows sliding by 2 s (``trade-slides``), a stream-stream join (``trade-quote-join``: its pairs cross);
- whole records cross: a keyed map re-keying by a computed column (``lot-rekey``), a keyed pandas function
  (``spread-udf``), and 400,000 keys where partials do not shrink (``symbol-highcard``: an edge that does
  not shrink ships records whole, runtime/combining.py).

Each runs as ``streamtopo run FILE --executors k --no-autoscale`` does (:func:`run_topology` in this
process, the CLI's code path: the run's own Valkey, executor processes, their JVMs), its sources given a
count of N, 4N and N records in turn, for k = 1 and 2. Records per CPU-second are marginal
(:func:`bench.runtime.marginal`: the slope of CPU against records, so the run's start-up drops out) over
the whole process trees (the run's own count, ``RunSummary.cpu_seconds``: executors, their JVMs and
Valkey, reaped when the run ends). Every run's output is checked against Spark batch evaluation of the pipeline's definition,
written as SQL beside it (:data:`PIPELINES`) over the same generated records: a running aggregate's last
row per key, a window's row per window and key, the join's pairs as a multiset; doubles to 1e-9
relative (sums merge in another order), everything else exactly. The verdict is the issue's: two
executors' marginal records per CPU-second >= 0.8x one's where partials cross, >= 0.5x where records
do, outputs exact.

Writes the "Held-out pipelines of every shape (issue 33)" section of docs/benchmarks.md and
docs/img/held_out_shapes.png.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rich.console import Console

from bench.report import header, markdown, save_figure, stop_if_interrupted, write_section
from bench.runtime import marginal
from streamtopo.documents import load_topology
from streamtopo.local.loop import local_loop
from streamtopo.local.runner import RunOptions, run_topology
from streamtopo.planner.model import StreamTopology
from streamtopo.runtime import generators
from streamtopo.runtime.spark import get_spark

TITLE = "Held-out pipelines of every shape (issue 33)"
HERE = ROOT / "bench" / "held_out"
FACTOR = 4
"""The larger run's records, in units of N."""
BOUNDS = {"partials": 0.8, "records": 0.5}
"""The issue's acceptance: two executors' marginal records per CPU-second against one's."""


@dataclass(frozen=True)
class Pipeline:
    crossing: str
    """``partials`` (combined before the wire) or ``records`` (whole records cross)."""
    group: tuple[str, ...] | None
    """Columns naming a final row (its last one in the sink counts); None: every row is one (pairs)."""
    sql: str
    """The definition: Spark SQL over the sources, each a view named after its operator."""
    share: int = 1
    """Runs of N / share records (the join and 400,000 keys cost several times the others per record)."""


WINDOW = (
    "CAST(floor(_ts / {s}D) AS DOUBLE) * {s}D AS window_start, "
    "CAST(floor(_ts / {s}D) AS DOUBLE) * {s}D + {s}D AS window_end"
)
"""A tumbling window of ``s`` seconds, as the aggregate writes its bounds (doubles, in seconds)."""
PIPELINES = {
    "trade-totals": Pipeline(
        "partials",
        ("symbol",),
        "SELECT symbol, count(*) AS n, sum(volume) AS shares, sum(price * volume) AS notional "
        "FROM trades WHERE volume >= 10 GROUP BY symbol",
    ),
    "quote-bars": Pipeline(
        "partials",
        ("window_start", "symbol"),
        f"SELECT {WINDOW.format(s=2)}, symbol, count(*) AS n, min(bid) AS low, max(ask) AS high, "
        "sum(volume) AS size FROM quotes WHERE ask - bid < 0.5 GROUP BY 1, 2, symbol",
    ),
    "trade-slides": Pipeline(
        "partials",
        ("window_start", "symbol"),
        "SELECT CAST(w AS DOUBLE) * 2D AS window_start, CAST(w AS DOUBLE) * 2D + 6D AS window_end, symbol, "
        "count(*) AS n, sum(volume) AS shares, max(price) AS high FROM (SELECT *, "
        "explode(sequence(floor(_ts / 2D) - 2, floor(_ts / 2D))) AS w FROM trades) GROUP BY w, symbol",
    ),
    "trade-quote-join": Pipeline(
        "partials",
        None,
        "SELECT CAST(floor(t._ts / 2D) AS DOUBLE) * 2D AS window_start, "
        "CAST(floor(t._ts / 2D) AS DOUBLE) * 2D + 2D AS window_end, t.symbol, t.price, t.volume AS shares, "
        "q.bid, q.ask FROM trades t JOIN quotes q ON t.symbol = q.symbol "
        "AND floor(t._ts / 2D) = floor(q._ts / 2D) WHERE t.price > q.ask",
        share=4,
    ),
    "lot-rekey": Pipeline(
        "records",
        ("window_start", "lot"),
        f"SELECT {WINDOW.format(s=1)}, volume % 53 AS lot, count(*) AS n, sum(volume) AS shares, "
        "min(price) AS low FROM trades GROUP BY 1, 2, 3",
    ),
    "spread-udf": Pipeline(
        "records",
        ("symbol",),
        "SELECT symbol, count(*) AS n, max((ask - bid) / ((ask + bid) / 2D) * 10000D) AS widest "
        "FROM quotes GROUP BY symbol",
        share=2,
    ),
    "symbol-highcard": Pipeline(
        "records",
        ("symbol",),
        "SELECT symbol, count(*) AS n, sum(volume) AS shares FROM trades WHERE volume > 100 GROUP BY symbol",
        share=4,
    ),
}


READING = (
    "Reading: bench/held_out/*.yaml, written apart from bench/peers.py's queries and the tests (trades and "
    "quotes generators, other keys, expressions, windows and aggregates; nothing was tuned on them), each "
    "run as `streamtopo run FILE --executors k --no-autoscale` runs it (this process calls the CLI's "
    "run_topology: the run's own Valkey, executor processes and their JVMs), at its declared rates, its "
    "sources given counts of N, 4N and N records in turn (the join, the UDF and 400,000 keys N / 4, N / 2, "
    "N / 4). Records per CPU-second: 1 / the least-squares slope of CPU against records over the three "
    "runs, whole process trees (executors, JVMs, Valkey, reaped when a run ends), so each run's start-up "
    "drops out; the +- is the slope's standard error. Every run's output is compared with Spark batch "
    "evaluation of the pipeline's definition (SQL in bench/held_out_shapes.py) over the same generated "
    "records: a running aggregate's last row per key, a window's row per window and key, the join's pairs "
    "as a multiset; doubles to 1e-9 relative, the rest exactly. Not here: the named-stream shape (its "
    "records leave the run with its Valkey) and PyFlink (bench/peers.py measures it on its shapes)."
)


def counted(topology: StreamTopology, records: int) -> StreamTopology:
    """``topology`` with its generator sources ending after ``records`` in all, shared by their rates."""
    document = topology.model_dump(mode="json", by_alias=True, exclude_none=True)
    sources = [op for op in document["spec"]["operators"] if op.get("source", {}).get("generator")]
    total = sum(op["source"]["ratePerSecond"] for op in sources)
    for op in sources:
        op["source"]["count"] = round(records * op["source"]["ratePerSecond"] / total)
    return StreamTopology.model_validate(document)


def reference(topology: StreamTopology, pipeline: Pipeline) -> list[dict[str, Any]]:
    """The definition's rows over the records the run's sources generate (seq 0 .. count - 1 of each:
    a record is a pure function of its generator, seed and seq, whichever key group generates it)."""
    spark = get_spark()
    for op in topology.spec.operators:
        source = op.source
        if source is None or source.generator is None or source.count is None:
            continue
        frame = generators.frame(
            spark,
            source.generator,
            [(0, 0, source.count)],
            1,
            source.rate_per_second,
            source.seed,
            source.keys,
        )
        frame.createOrReplaceTempView(op.name)
    return [row.asDict() for row in spark.sql(pipeline.sql).collect()]


def sink_rows(output: Path) -> list[dict[str, Any]]:
    """Every file sink row under ``output``, in the order each key group's file was written."""
    return [
        json.loads(line)
        for path in sorted(output.rglob("kg-*.jsonl"))
        for line in path.read_text().splitlines()
    ]


def differences(pipeline: Pipeline, want: list[dict[str, Any]], got: list[dict[str, Any]]) -> list[str]:
    """What the run's rows get wrong against the definition's (empty: exact), at most 5 examples."""
    columns = list(want[0]) if want else []
    if pipeline.group is None:  # pairs: a multiset of whole rows
        expected = Counter(tuple(row[c] for c in columns) for row in want)
        actual = Counter(tuple(row.get(c) for c in columns) for row in got)
        missing, extra = expected - actual, actual - expected
        return [f"missing {r}" for r in list(missing)[:3]] + [f"extra {r}" for r in list(extra)[:2]]
    final = {tuple(row.get(c) for c in pipeline.group): row for row in got}  # the last row per group wins
    out = []
    for row in want:
        key = tuple(row[c] for c in pipeline.group)
        have = final.pop(key, None)
        if have is None:
            out.append(f"missing {dict(zip(pipeline.group, key))}")
        elif not all(same(row[c], have.get(c)) for c in columns):
            out.append(f"{dict(zip(pipeline.group, key))}: want {row}, got {have}")
    out += [f"extra {dict(zip(pipeline.group, key))}" for key in list(final)[:2]]
    return out[:5]


def same(want: Any, got: Any) -> bool:
    if isinstance(want, float) and isinstance(got, (int, float)):
        return math.isclose(want, got, rel_tol=1e-9, abs_tol=0.0) or (math.isnan(want) and math.isnan(got))
    return want == got


@dataclass
class Measured:
    name: str
    executors: int
    runs: list[tuple[int, float, float]]
    """(records, CPU-seconds, wall seconds) per run."""
    wrong: list[str]

    @property
    def per_cpu(self) -> tuple[float, float]:
        """Marginal records per CPU-second and its relative standard error (NaN without three runs)."""
        if len(self.runs) < 3:
            return math.nan, math.nan
        slope, error = marginal(self.runs)
        return (1 / slope, error / slope) if slope > 0 else (math.nan, math.nan)


def measure(
    name: str,
    executors: int,
    records: int,
    work: Path,
    console: Console,
    wants: dict[int, list[dict[str, Any]]],
) -> Measured:
    """Three runs of ``name`` on ``executors``; ``wants``: the definition's rows per size, computed once
    for both executor counts (20M records of the definition take Spark minutes in this process)."""
    pipeline = PIPELINES[name]
    base = load_topology(HERE / f"{name}.yaml")
    sizes = [records // pipeline.share * f for f in (1, FACTOR, 1)]
    result = Measured(name, executors, [], [])
    for i, size in enumerate(sizes):
        topology = counted(base, size)
        output = work / f"{name}-{executors}-{i}"
        options = RunOptions(  # what `streamtopo run FILE --executors k --no-autoscale` passes
            executors=executors,
            autoscale=False,
            output=output,
            live=False,
            udf_dirs=(HERE,),
            adaptation=local_loop,
        )
        started = time.monotonic()
        summary = run_topology(topology, options, Console(quiet=True))
        stop_if_interrupted(summary)
        cpu, wall = summary.cpu_seconds or math.nan, time.monotonic() - started
        if summary.failed or not summary.finished:
            result.wrong.append(f"run of {size:,}: {summary.failed or 'did not finish'}")
            continue
        if size not in wants:
            wants[size] = reference(topology, pipeline)
        wrong = differences(pipeline, wants[size], sink_rows(output))
        result.wrong += [f"run of {size:,}: {w}" for w in wrong]
        result.runs.append((size, cpu, wall))
        console.print(
            f"  {name}, {executors} executor(s), {size:,} records: {cpu:.1f} CPU-s, {wall:.1f} s, "
            f"{len(wants[size]):,} rows {'exact' if not wrong else 'WRONG: ' + wrong[0]}"
        )
    return result


def verdict(one: Measured, two: Measured) -> tuple[float, str]:
    ratio = two.per_cpu[0] / one.per_cpu[0]
    bound = BOUNDS[PIPELINES[one.name].crossing]
    exact = not one.wrong and not two.wrong and len(one.runs) == len(two.runs) == 3
    ok = exact and ratio >= bound
    return ratio, f"{'met' if ok else 'MISSED'} (>= {bound:g}x{'' if exact else ', outputs not exact'})"


def plot(pairs: list[tuple[Measured, Measured]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4))
    names = [one.name for one, _ in pairs]
    for offset, index, label in ((-0.2, 0, "1 executor"), (0.2, 1, "2 executors")):
        values = [pair[index].per_cpu[0] for pair in pairs]
        errors = [pair[index].per_cpu[0] * pair[index].per_cpu[1] for pair in pairs]
        ax.bar([i + offset for i in range(len(pairs))], values, 0.4, yerr=errors, label=label)
    for i, (one, two) in enumerate(pairs):
        ax.annotate(f"{verdict(one, two)[0]:.2f}x", (i, max(one.per_cpu[0], two.per_cpu[0])), ha="center")
    ax.set_xticks(range(len(pairs)), names, rotation=15)
    ax.set_ylabel("marginal records per CPU-second")
    ax.set_title("held-out pipelines: two executors against one (label: the ratio)")
    ax.legend()
    save_figure(fig, path)


def arguments(parser: argparse.ArgumentParser, records: int, pipelines: str) -> None:
    """The options every bench over these pipelines takes: N, which pipelines, whether to write docs/."""
    parser.add_argument("--records", type=int, default=records, help="N: runs of N, 4N and N records")
    parser.add_argument("--pipelines", default=pipelines, help=f"comma-separated, of {', '.join(PIPELINES)}")
    parser.add_argument("--no-write", action="store_true", help="print the table, leave docs/ alone")


def chosen(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The pipelines ``--pipelines`` names (an unknown one is a usage error naming the known ones)."""
    names: list[str] = args.pipelines.split(",")
    unknown = [n for n in names if n not in PIPELINES]
    if unknown:
        parser.error(f"--pipelines: unknown {', '.join(unknown)} (known: {', '.join(PIPELINES)})")
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    arguments(parser, 5_000_000, ",".join(PIPELINES))
    args = parser.parse_args()
    names = chosen(parser, args)
    console = Console(width=160)
    pairs = []
    with tempfile.TemporaryDirectory(prefix="bench-held-out-") as tmp:
        for name in names:
            wants: dict[int, list[dict[str, Any]]] = {}
            pairs.append(tuple(measure(name, k, args.records, Path(tmp), console, wants) for k in (1, 2)))
    rows = []
    for one, two in pairs:
        ratio, judged = verdict(one, two)
        rows.append(
            (
                one.name,
                PIPELINES[one.name].crossing,
                f"{args.records // PIPELINES[one.name].share * FACTOR:,}",
                *(f"{m.per_cpu[0]:,.0f} +- {m.per_cpu[1]:.0%}" for m in (one, two)),
                f"{ratio:.2f}x {judged}",
                *(f"{m.runs[1][2]:.1f}" if len(m.runs) > 1 else "-" for m in (one, two)),
                "; ".join(one.wrong + two.wrong)[:200] or "exact, every run",
            )
        )
    table = markdown(
        [
            "pipeline",
            "what crosses",
            "records (4N)",
            "1 executor: records per CPU-second",
            "2 executors",
            "2 vs 1",
            "wall s at 4N, 1 executor",
            "2 executors",
            "output against Spark",
        ],
        rows,
    )
    for line in table:
        console.print(line)
    if args.no_write:
        return
    image = ROOT / "docs" / "img" / "held_out_shapes.png"
    plot(pairs, image)
    command = f"python bench/held_out_shapes.py --records {args.records}"
    if names != list(PIPELINES):
        command += f" --pipelines {','.join(names)}"
    lines = [*header(command), "", *table, "", f"![held-out shapes](img/{image.name})", "", READING]
    write_section(TITLE, lines)


if __name__ == "__main__":
    main()
