"""Which differences from Spark a path shows, over many cases, without stopping at the first: a table of
difference kinds, each with its smallest case (what the bounded test shows one at a time).

    .venv/bin/python tests/runtime/differential/census.py PATH [PATH ...] [--examples N] [--seed S]
        [--minimize] [--columns both|all|numpy]

PATH is a name of paths.PATHS. ``--minimize`` then shrinks the smallest case of
each kind with hypothesis (``find``: the smallest case whose most telling difference is that kind),
a run per step, up to five minutes per kind.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from harness import describe, differences  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import seed as hypothesis_seed  # noqa: E402
from paths import PATHS, run_on  # noqa: E402
from strategies import ALL_COLUMNS, NUMPY_COLUMNS, Case, cases  # noqa: E402

from streamtopo.runtime.embedded import EmbeddedValkey  # noqa: E402
from streamtopo.runtime.spark import get_spark  # noqa: E402

COLUMN_SETS = {"both": (ALL_COLUMNS, NUMPY_COLUMNS), "all": (ALL_COLUMNS,), "numpy": (NUMPY_COLUMNS,)}


def size(case: Case) -> tuple[int, int]:
    return (case.records.n * len(case.branches), len(repr(case)))


def minimize(run, kind: str, rate: float, args) -> tuple:
    """Replay the survey's cases (same seed), failing on the first that shows ``kind``, and let hypothesis
    shrink it: the last case that failed is the smallest it found (at most five minutes of shrinking)."""
    smallest: list = []

    @settings(
        max_examples=args.examples,
        deadline=None,
        database=None,
        phases=[Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
    )
    @hypothesis_seed(args.seed)
    @given(cases(max_records=args.max_records, rates=(rate,), column_sets=COLUMN_SETS[args.columns]))
    def shows(case: Case) -> None:
        p, found = run(case)
        hits = [d for d in found if d.category == kind]
        if hits:
            smallest[:] = [case, p, hits]
            raise AssertionError(kind)

    try:
        shows()
    except AssertionError:
        pass
    return tuple(smallest)


def survey(path, args, spark, valkey, work: Path) -> None:
    """Run ``args.examples`` cases on ``path`` and print each kind of difference with its smallest case."""
    counter = iter(range(10**9))

    def run(case: Case):
        p, expected, outcome = run_on(path, spark, valkey.url, case, work / f"{path.name}-{next(counter)}")
        return p, differences(p, expected, outcome)

    kinds: dict[str, list] = {}
    started = time.time()

    @settings(
        max_examples=args.examples,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @hypothesis_seed(args.seed)
    @given(cases(max_records=args.max_records, rates=(path.rate,), column_sets=COLUMN_SETS[args.columns]))
    def each(case: Case) -> None:
        p, found = run(case)
        for kind in {d.category for d in found}:
            entry = kinds.setdefault(kind, [0, None, None])
            entry[0] += 1
            if entry[1] is None or size(case) < size(entry[1]):
                entry[1], entry[2] = case, (p, [d for d in found if d.category == kind])

    each()
    print(f"\n=== {path.name}: {args.examples} cases in {time.time() - started:.0f} s", flush=True)
    for kind, (count, case, (p, found)) in sorted(kinds.items(), key=lambda kv: -kv[1][0]):
        print(f"\n[{count}/{args.examples}] {kind}")
        if args.minimize:
            case, p, found = minimize(run, kind, path.rate, args)
        print(f"  records: {case.records}")
        sinks = {s.sink: s for s in p.sinks}
        for d in found[:4]:
            print(f"  {d.where}: {d.detail[:600]}")
            sink = sinks.get(d.where) or next(
                (s for s in p.sinks if any(n == d.where for n, _ in s.operators)), None
            )
            if sink is not None:
                print(describe(p, sink))
        sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("paths", nargs="+", choices=[p.name for p in PATHS])
    parser.add_argument("--examples", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-records", type=int, default=24)
    parser.add_argument("--minimize", action="store_true")
    parser.add_argument("--columns", choices=COLUMN_SETS, default="both")
    args = parser.parse_args()
    spark = get_spark()
    work = Path(tempfile.mkdtemp(prefix="census-"))
    with EmbeddedValkey() as valkey:
        for path in (p for p in PATHS if p.name in args.paths):
            survey(path, args, spark, valkey, work)


if __name__ == "__main__":
    main()
