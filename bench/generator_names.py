"""What naming a generated key costs (issue 33): synthetic names per record against one folded literal.

The trades and quotes generators name a symbol index by its ticker (16 of them), then ``SYM<i>``; the
words generator by its vocabulary word, then ``word<i>``. Built per record (``concat`` of a cast), that
was 15 % of a held-out 2,000-symbol aggregate job in JFR (docs/benchmarks.md, "Where a held-out trades
pipeline's run goes"); up to :data:`generators.NAMED_LITERAL` symbols, all names now come from one split
literal. This
runs the step a caught-up ``trade-totals`` executor runs (trades of a key group range -> sum of volume
per symbol, collected) with the literal ending where the pool does (the per-record names, as before) and
at ``NAMED_LITERAL``, interleaved, ``--repeats`` times per symbol count, and reports the median
CPU-seconds of the whole process tree (Python and its JVM) per record (each repeat alternates which
setting runs first: with a fixed order, two identical settings differed by 14 %). Both settings must give the same
result (the bench stops otherwise).

    .venv/bin/python bench/generator_names.py [--keys 2000,10000,400000] [--records 2000000] [--repeats 7]

Writes the "Naming generated keys" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from rich.progress import Progress  # noqa: E402

from bench.report import header, markdown, spread_cells, write_section  # noqa: E402
from bench.runtime import cpu_seconds  # noqa: E402
from streamtopo.runtime import generators  # noqa: E402
from streamtopo.runtime.spark import get_spark  # noqa: E402

TITLE = "Naming generated keys (issue 33)"
KEY_GROUPS = 4
SETTINGS = {"per record": len(generators.TICKERS), "literal": generators.NAMED_LITERAL}
"""Where the literal ends: at the ticker pool (every other name built per record) or at NAMED_LITERAL."""


def step(spark, keys: int, records: int) -> list[tuple[str, int]]:  # type: ignore[no-untyped-def]
    """One step's job: ``records`` trades over every key group, summed per symbol, sorted."""
    parts = [(kg, 0, records // KEY_GROUPS) for kg in range(KEY_GROUPS)]
    df = generators.frame(spark, "trades", parts, KEY_GROUPS, 1_000_000.0, seed=7, keys=keys)
    rows = df.groupBy("symbol").sum("volume").collect()
    return sorted((r[0], r[1]) for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--keys", default="2000,10000,400000", help="symbol counts")
    parser.add_argument("--records", type=int, default=2_000_000, help="records per step")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=3, help="steps per setting before measuring")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    counts = [int(k) for k in args.keys.split(",")]
    console = Console()
    spark = get_spark()
    cpu: dict[tuple[int, str], list[float]] = {}
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("generator names", total=len(counts) * (args.repeats + args.warmup + 1))
        for keys in counts:
            results = {}
            for name, literal in SETTINGS.items():
                generators.NAMED_LITERAL = literal
                results[name] = step(spark, keys, args.records)
            if results["literal"] != results["per record"]:
                raise SystemExit(f"{keys} symbols: the literal's names give another result than per record")
            for _ in range(args.warmup):
                for literal in SETTINGS.values():
                    generators.NAMED_LITERAL = literal
                    step(spark, keys, args.records)
                progress.advance(task)
            for repeat in range(args.repeats):
                order = list(SETTINGS.items())  # interleaved, first one then the other first: drift and
                for name, literal in order[:: 1 - 2 * (repeat % 2)]:  # the second run's warmth fall alike
                    generators.NAMED_LITERAL = literal
                    before = cpu_seconds()
                    step(spark, keys, args.records)
                    cpu.setdefault((keys, name), []).append(cpu_seconds() - before)
                progress.advance(task)
            progress.advance(task)
    rows = []
    for keys in counts:
        base = statistics.median(cpu[(keys, "per record")])
        for name in SETTINGS:
            rows.append(
                (f"{keys:,}", name, *spread_cells(cpu[(keys, name)], base, 1e9 / args.records, ".0f"))
            )
    lines = markdown(["symbols", "names", "CPU ns per record (median)", "min-max", "vs per record"], rows)
    console.print("\n".join(lines))
    if args.no_write:
        return
    command = "python bench/generator_names.py" + (" " + " ".join(sys.argv[1:]) if sys.argv[1:] else "")
    note = (
        f"{args.records:,} trades per step over {KEY_GROUPS} key groups, summed per symbol and collected, "
        f"Spark local[1] as in an executor; {args.repeats} repeats after {args.warmup} warm-up steps, "
        f"interleaved. 'per record': names beyond the {len(generators.TICKERS)} tickers built per record "
        f"(concat), as before; 'literal': every name one folded literal up to {SETTINGS['literal']:,} symbols "
        "(beyond, as before: a literal covering only part of them measured 1.09x at 400,000 symbols, "
        "in a run whose fixed order also put identical settings 14 % apart; not measured again)."
    )
    write_section(TITLE, [*header(command), "", note, "", *lines])


if __name__ == "__main__":
    main()
