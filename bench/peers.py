"""Peers side by side (issue 33, item 6): the same queries by streamtopo, PyFlink and Structured Streaming.

    .venv/bin/python bench/peers.py [--quick] [--records N] [--shapes running,tumbling,...]
        [--executors 1,2] [--flink-python .venv-flink/bin/python]

PyFlink is the ``bench`` extra, in a virtualenv of its own (it pins py4j and pyarrow below what PySpark 4
needs): ``python3 -m venv .venv-flink && .venv-flink/bin/pip install 'apache-flink>=2.1' 'psutil>=5.9'``.

Shapes (records of the sequence generator: ``key = seq % 1009``, ``value = seq``, 100,000 records per
event-time second), each checked against the generator's definition in every engine:

1. ``running``: map (``value % 10 AS r``) -> filter ``r <> 0`` -> running count and sum per key. Partials
   can cross: streamtopo combines before the wire, Flink aggregates local-global (mini-batches of 100k
   records), Spark partially aggregates before its shuffle.
2. ``tumbling``: filter ``value % 10 <> 0`` -> 1 s tumbling count and sum per key (Flink: window TVF with
   its local window aggregate).
3. ``rekey``: records re-keyed by a column computed from them, ``account = (seq div 4) % 1009`` (a keyed
   map in streamtopo), then 1 s tumbling count and sum per account: whole records cross (Flink:
   ``agg-phase-strategy = ONE_PHASE``; Spark: ``repartition(account)`` before the aggregate).
4. ``sliding``: filter -> 4 s windows sliding by 1 s, count and sum per key (Flink: HOP).
5. ``highcard``: as ``running`` with 1,000,003 keys: about one record per key, partials do not shrink.
6. ``udf``: as ``running`` with ``r`` computed by a pandas function (bench/peers_udf.py): streamtopo's udf
   operator keyed by key (whole records cross to it), Flink's and Spark's vectorised pandas UDF.
7. ``stream``: map -> every record into a named stream keyed by key (streamtopo: a stream sink keyed by
   key; Flink: a ``print`` sink with a primary key and a forced keyed shuffle; Spark: ``repartition``).
8. ``join``: a stream-stream join of two inputs (N / 2 records each), every pair of one key (100,003 keys)
   in one 1 s tumbling window (streamtopo's windowed join; Flink's window join; Spark's join on equal
   event-time windows).

Engines and configurations, all in one run on this machine, one after the other:

- streamtopo on k executor processes (:class:`bench.runtime.ExecutorGroup`: started as ``streamtopo run``
  starts them, units round-robin, the sources backlogged by setting the topology's clock a day back);
- PyFlink (Flink SQL, bounded ``datagen`` sequence, local mini-cluster) at parallelism p;
- Structured Streaming on ``local[p]`` (``rate-micro-batch``, ``availableNow``: one micro-batch of the run's
  records), both in a warm worker process (bench/peers_worker.py).

Per configuration and shape: a warm-up run of N records, then runs of N, 4N and N (highcard, join: N / 4).
Records per CPU-second are marginal (:func:`bench.runtime.marginal`, the slope of CPU against records, so
start-up and per-run costs drop out) over the whole process trees (:func:`bench.runtime.cpu_seconds`: Python, JVMs, Python
workers, and streamtopo's Valkey); wall time is the 4N run's. Results: docs/benchmarks.md, section "Peers
side by side (issue 33)", and docs/img/peers.png.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import selectors
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from bench import runtime
from bench.peers_worker import EVENT_RATE, KEYS, SHAPES, SOURCE_KEY_GROUPS
from bench.report import header, markdown, save_figure, section_image, write_section
from bench.runtime import ExecutorGroup, cpu_seconds, marginal, pipelines_topology
from streamtopo.runtime.embedded import EmbeddedValkey
from streamtopo.runtime.operators.udf import UDF_PATH_ENV
from streamtopo.runtime.transport import Entry

# The worker cannot import bench.runtime (PyFlink's virtualenv has no PySpark): its constants must agree.
assert (KEYS, EVENT_RATE, SOURCE_KEY_GROUPS) == (runtime.SCALE_KEYS, runtime.EVENT_RATE, runtime.KEY_GROUPS)

console = Console(width=160)  # the table has eight columns; logs are not terminals
TITLE = "Peers side by side (issue 33)"
FACTOR = 4
"""The larger run's records, in units of N."""
SHARE = {"highcard": 4, "join": 4}
"""Shapes run with N / share records: the high-cardinality running aggregate and the join cost 10-40x the
others per record in every engine (50k-200k records per CPU-second at 400k records), so at the full N
either alone would take longer than the rest of the matrix."""
RUN_TIMEOUT = 600.0
LABELS = {
    "running": "map -> filter -> running count/sum per key (partials can cross)",
    "tumbling": "filter -> 1 s tumbling count/sum per key",
    "rekey": "re-keyed by a computed column, then 1 s tumbling count/sum (whole records cross)",
    "sliding": "filter -> 4 s windows sliding by 1 s, count/sum per key",
    "highcard": "map -> filter -> running count/sum per key, 1,000,003 keys (partials do not shrink)",
    "stream": "map -> a named stream keyed by key (whole records cross to the sink)",
    "udf": "keyed pandas function (r = value % 10) -> filter -> running count/sum per key (whole records cross)",
    "join": "stream-stream join, two inputs of N/2 records, pairs per key (100,003 keys) in 1 s windows",
}
NOT_YET = (
    "Not in this bench (issue 33, item 6): the VWAP example whole is bench/vwap.py's (section \"VWAP "
    'example on executor processes", PyFlink side by side on the same records).'
)
FOUR = (
    " Nor 4 executors / parallelism 4 (`--executors 1,2,4 --parallelism 1,2,4`), which on 2 cores measure "
    "contention more than scale-out."
)
ENGINES = ("streamtopo", "keyed", "flink", "spark")
ENGINE_NAMES = {
    "streamtopo": "streamtopo",
    "keyed": "streamtopo, keyed ingest",
    "flink": "PyFlink",
    "spark": "Structured Streaming",
}

Summary = dict[str, int]
Run = Callable[[str, str, int], tuple[float, float, Summary]]
"""(prefix, shape, records) -> (CPU-seconds, wall seconds, output summary) of one run."""


# ------------------------------------------------------------------------------------- the shapes


def shape_ops(prefix: str, name: str, count: int | None, keyed: bool = False) -> list[dict]:
    """The streamtopo operators of shape ``name`` over ``count`` records (None: endless), named ``<prefix>-...``;
    ``keyed``: the sources partitioned by key (issue 33, item 4), so where the first keyed operator keys
    by ``key`` its records stay where they are generated (every shape but ``rekey``)."""
    shape = SHAPES[name]
    numbers = {"generator": "sequence", "ratePerSecond": EVENT_RATE, "keys": shape.keys}
    by_key = {"keyBy": ["key"]} if keyed else {}
    source = {"name": f"{prefix}-numbers", "kind": "source", "source": {**numbers, "count": count}, **by_key}
    if shape.join:  # two inputs of count / 2 records, renamed so the join's output needs no prefixes
        sides = [
            op
            for side in ("l", "r")
            for op in (
                {
                    "name": f"{prefix}-{side}",
                    "kind": "source",
                    "source": {**numbers, "count": None if count is None else count // 2},
                    **by_key,
                },
                {
                    "name": f"{prefix}-{side}v",
                    "kind": "map",
                    "inputs": [f"{prefix}-{side}"],
                    "select": ["key", f"value AS {side}v"],
                },
            )
        ]
        return [
            *sides,
            {
                "name": f"{prefix}-pairs",
                "kind": "join",
                "inputs": [f"{prefix}-lv", f"{prefix}-rv"],
                "keyBy": ["key"],
                "window": {"size": 1.0},
            },
            {"name": f"{prefix}-out", "kind": "sink", "inputs": [f"{prefix}-pairs"], "sink": {"file": {}}},
        ]
    middle: list[dict] = []
    key = "key"
    if shape.rekey:  # the keyed map reads the column its input computed, so whole records cross to it
        middle = [
            {"name": "accounts", "kind": "map", "select": ["value", f"{shape.key} AS account"]},
            {"name": "kept", "kind": "map", "keyBy": ["account"], "select": ["account", "value"]},
        ]
        key = "account"
    if shape.stream:  # map -> a named stream keyed by key: whole records cross to the sink's units
        mapped = {
            "name": f"{prefix}-mapped",
            "kind": "map",
            "inputs": [source["name"]],
            "select": ["key", "value"],
        }
        sink = {"stream": stream_of(prefix)}
        return [
            source,
            mapped,
            {
                "name": f"{prefix}-out",
                "kind": "sink",
                "inputs": [mapped["name"]],
                "keyBy": ["key"],
                "sink": sink,
            },
        ]
    if shape.udf:  # a pandas function keyed by key (whole records cross to it), then the filter
        middle = [
            {"name": "tenths", "kind": "udf", "keyBy": ["key"], "function": "peers_udf:tenths"},
            {"name": "kept", "kind": "filter", "expr": "r <> 0"},
        ]
    elif shape.window is None:  # a running aggregate after map -> filter
        middle = [
            {"name": "mapped", "kind": "map", "select": ["key", "value", "value % 10 AS r"]},
            {"name": "kept", "kind": "filter", "expr": "r <> 0"},
        ]
    elif shape.kept:
        middle = [{"name": "kept", "kind": "filter", "expr": "value % 10 <> 0"}]
    chain = [source]
    for op in middle:
        chain.append({**op, "name": f"{prefix}-{op['name']}", "inputs": [chain[-1]["name"]]})
    window = {} if shape.window is None else {"window": {"size": shape.window[0], "slide": shape.window[1]}}
    return [
        *chain,
        {
            "name": f"{prefix}-totals",
            "kind": "aggregate",
            "inputs": [chain[-1]["name"]],
            "keyBy": [key],
            **window,
            "aggregations": ["count(*) AS n", "sum(value) AS total"],
        },
        {"name": f"{prefix}-out", "kind": "sink", "inputs": [f"{prefix}-totals"], "sink": {"file": {}}},
    ]


def stream_of(prefix: str) -> str:
    """The named stream the ``stream`` shape's pipeline ``prefix`` writes."""
    return f"peers-{prefix}"


@cache
def expected(name: str, count: int) -> Summary:
    """The output summary the generator's definition gives: groups (key, or window and key), the sum of
    their final counts and of their final sums (value = seq; a record counts once per window holding it)."""
    shape = SHAPES[name]
    seq = np.arange(count, dtype=np.int64)
    if shape.join:  # both inputs are seq 0 .. count/2 - 1: c * c pairs and 2 c s of values per group
        seq = seq[: count // 2]
        _, group, c = np.unique(
            (seq // EVENT_RATE) * shape.keys + seq % shape.keys, return_inverse=True, return_counts=True
        )
        s = np.bincount(group, weights=seq.astype(np.float64), minlength=len(c)).astype(np.int64)
        pairs = int((c * c).sum())
        return {"rows": pairs, "n": pairs, "total": int(2 * (c * s).sum())}
    if shape.stream:  # every record once, a group of its own
        return {"rows": count, "n": count, "total": int(seq.sum())}
    if shape.kept:
        seq = seq[seq % 10 != 0]
    keys = (seq // SOURCE_KEY_GROUPS) % shape.keys if shape.rekey else seq % shape.keys
    if shape.window is None:
        groups, copies = keys, 1
    else:  # window starts in slides: floor(ts / slide) - j for each of the size / slide windows
        size, slide = shape.window
        copies = size // slide
        last = seq // (EVENT_RATE * slide)
        groups = np.concatenate([(last - j + copies) * shape.keys + keys for j in range(copies)])
    return {"rows": len(np.unique(groups)), "n": copies * len(seq), "total": copies * int(seq.sum())}


def summarise(rows: Iterator[dict]) -> Summary:
    """streamtopo's sink rows reduced as the workers reduce theirs: the last (largest) count and sum per
    group (window start and key; a running aggregate emits a key's running value once per step); a join's
    pair is a group of its own with n = 1 and total = lv + rv."""
    final: dict[tuple, tuple[int, int]] = {}
    for row in rows:
        if "n" not in row:  # a join's pair
            row = {**row, "n": 1, "total": row["lv"] + row["rv"]}
        group = tuple(sorted((k, v) for k, v in row.items() if k not in ("n", "total", "window_end", "_ts")))
        final[group] = max(final.get(group, (0, 0)), (int(row["n"]), int(row["total"])))
    return {
        "rows": len(final),
        "n": sum(n for n, _ in final.values()),
        "total": sum(t for _, t in final.values()),
    }


class PeerGroup(ExecutorGroup):
    """The runtime bench's executor group, with this bench's check: the sink's rows summarised, kept for
    the comparison with the generator's definition and the peers."""

    def __init__(self, *args, **kwargs):
        self.summaries: dict[str, Summary] = {}
        super().__init__(*args, **kwargs)

    def check(self, prefix: str, crossing: str, count: int) -> None:
        if SHAPES[crossing].stream:  # the named stream's entries, read back from Valkey
            entries = [Entry.parse(i, fields) for i, fields in self.store.client.xrange(stream_of(prefix))]
            tables = [e.table() for e in entries if e.count]
            values = [t.column("value").to_numpy() for t in tables]
            total = sum(len(v) for v in values)
            self.summaries[prefix] = {"rows": total, "n": total, "total": int(sum(v.sum() for v in values))}
            self.store.client.delete(stream_of(prefix))
            return
        files = sorted((self.output / f"{prefix}-out").glob("kg-*.jsonl"))
        self.summaries[prefix] = summarise(
            json.loads(line) for f in files for line in f.read_text().splitlines()
        )


# ------------------------------------------------------------------------------------ the engines


class Worker:
    """A peer engine in a warm process of its own (bench/peers_worker.py), one JSON line each way."""

    def __init__(self, python: str, engine: str, parallelism: int, work: Path, udf: Path | None = None):
        self.log = work / f"{engine}-{parallelism}.log"
        command = [python, str(ROOT / "bench" / "peers_worker.py"), engine, "--parallelism", str(parallelism)]
        if engine == "flink":
            command += ["--log", str(work / f"flink-{parallelism}-print.log")]
        if udf is not None:
            command += ["--udf", str(udf)]
        self.stderr = self.log.open("w")
        self.proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True, cwd=work
        )
        self.tree = psutil.Process(self.proc.pid)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.proc.stdout, selectors.EVENT_READ)
        self.answer(300.0)

    def answer(self, timeout: float) -> dict:
        assert self.proc.stdout is not None
        if not self.selector.select(timeout):
            raise TimeoutError(f"{self.log.name}: no answer after {timeout:g} s")
        line = self.proc.stdout.readline()
        if not line:
            tail = self.log.read_text().splitlines()[-15:]
            raise RuntimeError(f"{self.log.name}: the worker exited:\n" + "\n".join(tail))
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"{self.log.name}: {reply['error']}")
        return reply

    def send(self, **request: object) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()

    def request(self, timeout: float, **request: object) -> dict:
        self.send(**request)
        return self.answer(timeout)

    def timed(self, **request: object) -> tuple[float, float]:
        """(CPU-seconds of the worker's process tree, wall seconds) of one run request to its answer."""
        cpu0, wall0 = cpu_seconds([self.tree]), time.perf_counter()
        self.request(RUN_TIMEOUT, **request)
        return cpu_seconds([self.tree]) - cpu0, time.perf_counter() - wall0

    def run(self, prefix: str, shape: str, records: int) -> tuple[float, float, Summary]:
        cpu, wall = self.timed(run=shape, records=records)
        return cpu, wall, self.request(300.0, summary=True)

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            for p in self.tree.children(recursive=True):
                p.kill()
            self.proc.kill()
            self.proc.wait()
        self.stderr.close()


@contextmanager
def streamtopo_engine(
    url: str,
    work: Path,
    executors: int,
    shapes: list[str],
    records: int,
    keyed: bool = False,
    interval: float | None = None,
) -> Iterator[Run]:
    """k executor processes over one topology holding every run's pipeline (one JVM start each)."""
    name = f"peers-{'keyed-' if keyed else ''}{executors}"
    top = pipelines_topology(
        name,
        [
            shape_ops(f"{shape}-{tag}", shape, n, keyed)
            for shape in shapes
            for tag, n in sizes(shape, records)
        ],
        interval,
    )
    os.environ[UDF_PATH_ENV] = str(ROOT / "bench")  # the executors import the udf shape's function
    with PeerGroup(top, work / name, url, executors, clock=time.time() - 86400) as group:

        def run(prefix: str, shape: str, records: int) -> tuple[float, float, Summary]:
            cpu, wall = group.run(prefix, shape, records, executors)
            return cpu, wall, group.summaries.pop(prefix)

        yield run


@contextmanager
def worker_engine(python: str, engine: str, parallelism: int, work: Path) -> Iterator[Run]:
    worker = Worker(python, engine, parallelism, work)
    try:
        yield worker.run
    finally:
        worker.close()


# ------------------------------------------------------------------------------------ measuring


@dataclass
class Point:
    """One shape on one engine configuration: its measured runs (records, CPU-s, wall s) and checks."""

    shape: str
    engine: str
    parallelism: int
    runs: list[tuple[int, float, float]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    """Output mismatches and failures; a point with any has no figures."""

    @property
    def ok(self) -> bool:
        return not self.problems and len(self.runs) >= 3

    @property
    def rate(self) -> float:
        slope = marginal(self.runs)[0] if self.ok else math.nan
        return 1 / slope if slope > 0 else math.nan

    @property
    def error(self) -> float:
        slope, se = marginal(self.runs) if self.ok else (math.nan, math.nan)
        return se / slope if slope > 0 else math.inf

    @property
    def wall(self) -> float:
        """Mean wall seconds of the largest runs."""
        top = max(n for n, _, _ in self.runs)
        return float(np.mean([w for n, _, w in self.runs if n == top]))

    @property
    def label(self) -> str:
        if self.engine in ("streamtopo", "keyed"):
            return f"{self.parallelism} executor{'s' if self.parallelism > 1 else ''}"
        if self.engine == "flink":
            return f"p={self.parallelism}"
        return f"local[{self.parallelism}]"


def sizes(shape: str, records: int) -> list[tuple[str, int]]:
    """(tag, records) of a shape's runs in order: a warm-up run of N, then N, 4N and N, with N the shape's
    share of ``--records`` (:data:`SHARE`)."""
    n = records // SHARE.get(shape, 1)
    return [("warm", n), ("run1", n), ("run2", FACTOR * n), ("run3", n)]


def measure(run: Run, point: Point, records: int, step: Callable[[], None]) -> None:
    """The shape's runs (:func:`sizes`), every output checked against the generator's definition."""
    for i, (tag, n) in enumerate(sizes(point.shape, records)):
        cpu, wall, summary = run(f"{point.shape}-{tag}", point.shape, n)
        step()
        want = expected(point.shape, n)
        if summary != want:
            point.problems.append(f"{n:,} records: output {summary}, the generator's definition {want}")
            console.print(f"  [red]{point.engine} {point.label} {point.shape}: {point.problems[-1]}[/red]")
            return
        if i > 0:
            point.runs.append((n, cpu, wall))


def configurations(args: argparse.Namespace) -> list[tuple[str, int]]:
    return [
        *(("streamtopo", k) for k in args.executors),
        *(("keyed", k) for k in args.executors if args.keyed_ingest),
        *((engine, p) for engine in ("flink", "spark") if engine in args.engines for p in args.parallelism),
    ]


def bench(args: argparse.Namespace, work: Path, done: Callable[[list[Point]], None]) -> list[Point]:
    """Every configuration's points; ``done`` gets those so far after each configuration, so a run stopped
    early has recorded what it measured."""
    points: list[Point] = []
    configs = configurations(args)
    with (
        EmbeddedValkey() as valkey,
        Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} runs"),
            TimeElapsedColumn(),
            console=console,
        ) as progress,
    ):
        task = progress.add_task("starting", total=len(configs) * len(args.shapes) * 4)
        for engine, parallelism in configs:
            progress.update(task, description=f"{ENGINE_NAMES[engine]} {parallelism}: starting")
            if engine in ("streamtopo", "keyed"):
                context = streamtopo_engine(
                    valkey.url,
                    work,
                    parallelism,
                    args.shapes,
                    args.records,
                    keyed=engine == "keyed",
                    interval=args.interval,
                )
            else:
                python = args.flink_python if engine == "flink" else sys.executable
                context = worker_engine(python, engine, parallelism, work)
            try:
                with context as run:
                    for shape in args.shapes:
                        point = Point(shape, engine, parallelism)
                        points.append(point)
                        progress.update(task, description=f"{ENGINE_NAMES[engine]} {point.label}: {shape}")
                        try:
                            measure(run, point, args.records, lambda: progress.advance(task))
                        except Exception as e:  # one configuration's failure is reported, the rest measured
                            point.problems.append(f"{type(e).__name__}: {str(e)[:500]}")
                            console.print(
                                f"  [red]{engine} {point.label} {shape}: {point.problems[-1]}[/red]"
                            )
                            if engine not in ("streamtopo", "keyed"):
                                break  # a worker that failed may be wedged: next configuration
                        if point.ok:
                            console.print(
                                f"  {ENGINE_NAMES[engine]} {point.label}, {shape}: {point.rate:,.0f} records "
                                f"per CPU-second +- {point.error:.0%}, {point.wall:.1f} s wall at "
                                f"{max(point.runs)[0]:,}"
                            )
            except Exception as e:  # start-up failed (no PyFlink virtualenv, a JVM that did not come up)
                console.print(f"  [red]{engine} {parallelism}: {type(e).__name__}: {str(e)[:500]}[/red]")
                for shape in args.shapes:
                    if not any(
                        p.shape == shape and p.engine == engine and p.parallelism == parallelism
                        for p in points
                    ):
                        points.append(
                            Point(shape, engine, parallelism, problems=[f"did not start: {e}"[:300]])
                        )
            done(points)
    return points


# ------------------------------------------------------------------------------------- reporting


def report(
    args: argparse.Namespace, command: str, points: list[Point], started: float, final: bool = True
) -> None:
    """Prints the table (at the end); unless ``--no-write``, draws docs/img/peers.png and writes the
    section, naming the configurations not measured yet when not ``final``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def find(shape: str, engine: str, parallelism: int) -> Point | None:
        return next(
            (p for p in points if (p.shape, p.engine, p.parallelism) == (shape, engine, parallelism)), None
        )

    def ratio(a: Point | None, b: Point | None) -> str:
        if a is None or b is None or not (a.ok and b.ok) or math.isnan(a.rate / b.rate):
            return "-"
        return f"{a.rate / b.rate:.2f}x"

    def rate(p: Point) -> str:
        if not p.ok:
            return "-"
        return "noise (no slope)" if math.isnan(p.rate) else f"{p.rate:,.0f} +- {p.error:.0%}"

    def wall_ratio(a: Point, b: Point | None) -> str:
        if a is b:
            return "baseline"
        return f"{a.wall / b.wall:.2f}x" if b is not None and a.ok and b.ok else "-"

    columns = (
        "shape",
        "engine",
        "configuration",
        "records per CPU-second (marginal, +- standard error)",
        "vs the engine's first configuration",
        "streamtopo vs PyFlink at this parallelism",
        f"wall seconds at {FACTOR}N ({FACTOR * args.records:,} records, highcard and join "
        f"{FACTOR * args.records // 4:,})",
        "wall vs the engine's first configuration",
        "output",
    )
    rows = []
    order = {(e, n): i for i, (e, n) in enumerate(configurations(args))}
    for p in sorted(points, key=lambda p: (args.shapes.index(p.shape), order[(p.engine, p.parallelism)])):
        ours = p.engine in ("streamtopo", "keyed")
        first = find(p.shape, p.engine, (args.executors if ours else args.parallelism)[0])
        versus = ratio(p, find(p.shape, "flink", p.parallelism)) if ours else ""
        rows.append(
            (
                p.shape,
                ENGINE_NAMES[p.engine],
                p.label,
                rate(p),
                ratio(p, first) if p is not first else "baseline",
                versus,
                f"{p.wall:.1f}" if p.runs else "-",
                wall_ratio(p, first),
                "same as the definition" if p.ok else "; ".join(p.problems)[:300],
            )
        )
    table = Table(title="peers side by side")
    for column in (
        "shape",
        "engine",
        "config",
        "records / CPU-s",
        "vs first",
        "vs Flink",
        "wall s",
        "output",
    ):
        table.add_column(column)
    for r in rows:
        table.add_row(*r[:7], "ok" if r[8] == "same as the definition" else "[red]FAILED[/red]")
    if final:
        console.print(table)
    if args.no_write:
        console.print("[yellow]--no-write: docs/ left alone[/yellow]" if final else "")
        return

    fig, axes = plt.subplots(1, len(args.shapes), figsize=(4.2 * len(args.shapes), 4.2), squeeze=False)
    for ax, shape in zip(axes[0], args.shapes):
        for engine, marker in zip(ENGINES, "oxsd"):
            curve = [p for p in points if p.shape == shape and p.engine == engine and p.ok]
            if curve:
                ax.errorbar(
                    [p.parallelism for p in curve],
                    [p.rate for p in curve],
                    [p.rate * min(p.error, 1.0) for p in curve],
                    fmt=marker + "-",
                    capsize=3,
                    label=ENGINE_NAMES[engine],
                )
        ax.set_yscale("log")
        ax.set_xticks(sorted({*args.executors, *args.parallelism}))
        ax.set_xlabel("executors / parallelism / local[n]")
        ax.set_title(shape, fontsize=10)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("records per CPU-second (marginal)")
    img = section_image(args.section, TITLE, "peers")
    save_figure(fig, img, dpi=120)

    missing = [s for s in SHAPES if s not in args.shapes]
    lines = [
        *header(
            command,
            f"load average {psutil.getloadavg()[1]:.1f} (5 min) at the end of the run, "
            f"{(time.time() - started) / 60:.0f} min",
        ),
        "",
        *markdown(columns, rows),
        "",
        f"![peers](img/{img.name})",
        "",
        "Shapes: " + "; ".join(f"`{s}`: {LABELS[s]}" for s in args.shapes) + ".",
        "",
        (
            "Reading: every engine runs the same queries over the same records (the sequence generator's "
            f"definition: seq 0 .. N-1, key = seq % {KEYS}, value = seq, {EVENT_RATE:,} records per "
            "event-time second), one after the other in this run. streamtopo: executor processes started "
            "as `streamtopo run` starts them (bench/runtime.py's ExecutorGroup, Spark local[1] each, units "
            "round-robin, the sources backlogged by setting the topology's clock a day back; the Valkey "
            "server's CPU counts). PyFlink "
            "(the `bench` extra, its own virtualenv): Flink SQL in a local mini-cluster per job inside one "
            "warm JVM, a bounded `datagen` sequence, mini-batches of 100k records and local-global "
            "aggregation (ONE_PHASE for the re-keyed shape, so whole records cross), `print` sink to a "
            "file (an update stream prints a retraction and an update per changed key and mini-batch: "
            "the high-cardinality shape's output is about two lines per record). Structured Streaming: "
            "`rate-micro-batch` with `availableNow` (one micro-batch of the "
            "run's records, as a backlogged streamtopo source generates what is due in one step), "
            "`shuffle.partitions` = n, memory sink in update mode (`repartition(account)` before the "
            "re-keyed aggregate). Each configuration makes a warm-up run of N records (highcard, join: "
            "N / 4), then N, "
            f"{FACTOR}N and N; records per CPU-second are 1 / the least-squares slope of CPU against "
            "records (bench/runtime.py's `marginal`), over the whole process trees (psutil user + system "
            "of Python, JVMs and any Python workers), so start-up and per-run costs drop out; the +- is "
            "the slope's standard error. Every run's output is reduced to (groups, sum of final counts, "
            "sum of final sums) and must equal the generator's definition (a running aggregate's last "
            "value per key; a window's per window and key); a configuration whose output differed or "
            "failed shows no figures and says why. p99 latency is not measured here: the runs are "
            "backlogged (flat out), where latency is the run's length; bench/peers_latency.py measures "
            'it for every engine with the sources paced (section "Peers\' latency at a fixed rate"). '
            f"This machine has {os.cpu_count()} cores."
        ),
    ]
    if missing:
        lines += ["", "Not measured in this run: " + ", ".join(missing) + "."]
    measured = {(p.engine, p.parallelism) for p in points}
    if pending := [f"{ENGINE_NAMES[e]} {n}" for e, n in configurations(args) if (e, n) not in measured]:
        lines += [
            "",
            "**Partial record** (the run had not finished): not measured yet: " + ", ".join(pending),
        ]
    lines += ["", NOT_YET + ("" if 4 in args.executors and 4 in args.parallelism else FOUR)]
    write_section(args.section, lines)


def matrix_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the matrix this bench and bench/peers_latency.py share: shapes, counts and peers."""
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")

    def counts(text: str) -> list[int]:
        return [int(x) for x in text.split(",")]

    parser.add_argument("--executors", type=counts, default=[1, 2], help="streamtopo executor counts")
    parser.add_argument(
        "--parallelism", type=counts, default=[1, 2], help="PyFlink parallelism and Spark local[n]"
    )
    parser.add_argument(
        "--flink-python",
        default=str(ROOT / ".venv-flink" / "bin" / "python"),
        help="an interpreter with the bench extra (apache-flink) installed",
    )
    parser.add_argument(
        "--peers", default="flink,spark", help="comma-separated, of flink, spark; empty: streamtopo alone"
    )


def matrix_choices(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``args.shapes`` and ``args.engines`` as lists, each name checked (:func:`matrix_arguments`)."""
    args.shapes = args.shapes.split(",")
    args.engines = [e for e in args.peers.split(",") if e]
    if unknown := [e for e in args.engines if e not in ("flink", "spark")]:
        parser.error(f"--peers: unknown {', '.join(unknown)} (known: flink, spark)")
    if unknown := [s for s in args.shapes if s not in SHAPES]:
        parser.error(f"--shapes: unknown {', '.join(unknown)} (known: {', '.join(SHAPES)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 1M records (default 4M)")
    parser.add_argument("--records", type=int, default=None, help="N: runs of N and 4N records")
    matrix_arguments(parser)
    parser.add_argument(
        "--keyed-ingest",
        action="store_true",
        help="also streamtopo with its sources partitioned by key (keyBy on the source, issue 33 item 4)",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=None,
        help="streamtopo's spec.batching.interval in seconds (default: the model's)",
    )
    parser.add_argument("--no-write", action="store_true", help="print the table, leave docs/ alone")
    parser.add_argument(
        "--section", default=TITLE, help="the docs/benchmarks.md section this run writes (its own record)"
    )
    args = parser.parse_args()
    args.records = args.records or (1_000_000 if args.quick else 4_000_000)
    matrix_choices(parser, args)
    command = shlex.join(["python", "bench/peers.py", *sys.argv[1:]])
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="peers-") as tmp:
        points = bench(args, Path(tmp), lambda so_far: report(args, command, so_far, started, final=False))
    report(args, command, points, started)


if __name__ == "__main__":
    main()
