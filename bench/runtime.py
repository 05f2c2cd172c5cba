"""Runtime benchmark: our executor against PySpark Structured Streaming, batching, pauses, latency, scale-out.

    .venv/bin/python bench/runtime.py [--quick] [--records N] [--seconds S] [--scale-records N]
    .venv/bin/python bench/runtime.py --scale-out-only [--quick] [--scale-records N]

Measured in one run on this machine, sequentially. Items 1-4 run everything in this process and its JVM
child (executors as threads); the scale-out parts run first, on executor processes:

1. Throughput per core. The same windowed aggregation (count and sum per key over 1 s tumbling
   event-time windows, 100 keys) by (a) one streamtopo executor (sequence source -> aggregate -> file
   sink, all units in one executor, Valkey in between for nothing: one-to-one edges stay in memory, the
   aggregate's input crosses the transport since the source is unkeyed) and (b) Structured Streaming
   (rate source, ``withWatermark`` + ``groupBy(window, key)``, noop sink, as-fast-as-possible trigger).
   Records per CPU-second of the whole process tree (Python + JVM), so both are "per core".
2. Batching gain: records per second through the transport (Arrow IPC encode, XADD, XRANGE, decode)
   with one record per entry against the default batch (512 records).
3. Migration pause against state size: an aggregate key group whose state is 1 KB ... 100 MB moves
   between two executors through the normal hand-over; the receiver's measured pause.
4. End-to-end latency p50/p99: event time to sink commit at a steady rate below capacity (from the
   executor's ``streamtopo_sink_latency_seconds`` histogram, interpolated within buckets).
5. Scale-out: the same keyed pipeline on 1, 2 and 4 executor processes (started as ``streamtopo run``
   starts them, units round-robin over them) for two kinds of crossing: ``combinable`` (filter -> window
   aggregate keyed by another key than the source's partition) and ``whole`` (map -> sink keyed by a
   column the map computes). Marginal records per CPU-second of every executor's process tree and the
   Valkey server (the slope of CPU against records over runs of N and 2N records after warm-up runs, so
   start-up, JIT and per-run costs drop out) and wall throughput, against one executor in the same run
   (:func:`scale_out`).
6. End-to-end latency p50/p99 of both pipelines at 2,000 records/s across two executors.

Results: tables on stdout, docs/img/runtime_pause.png, runtime_throughput.png, runtime_scaleout.png, and the
"Runtime" section of docs/benchmarks.md (``--scale-out-only`` rewrites only its scale-out block).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

from bench.report import header, markdown, read_section, write_section
from streamtopo.contracts import ExecutorEntry, Keys, RoutingTable, unit_key
from streamtopo.local.platform import LocalPlatform
from streamtopo.local.runner import finished
from streamtopo.local.testbed import EmulatedHosts
from streamtopo.planner.cluster import Cluster
from streamtopo.planner.model import MAX_RATE_PER_SECOND, Operator, StreamTopology, StreamTopologySpec
from streamtopo.runtime.embedded import EmbeddedValkey
from streamtopo.runtime.executor import Executor, ExecutorConfig
from streamtopo.runtime.handover import Pause
from streamtopo.runtime.operators import build_operator
from streamtopo.runtime.partitioning import route
from streamtopo.runtime.spark import get_spark
from streamtopo.runtime.state_store import Commit, StateStore, UnitRecord
from streamtopo.runtime.transport import Entry, connect, entry_fields

console = Console()
KEYS = 100
WINDOW = 1.0
KEY_GROUPS = 4


def cpu_seconds(roots: Sequence[psutil.Process] = ()) -> float:
    """User + system CPU seconds of the process trees under ``roots`` (default: this process: its Python, its
    JVM, the embedded Valkey). Descendants that exited and were reaped count too (``children_*``), so a
    worker that ends between two readings does not take its CPU with it."""
    total = 0.0
    for root in roots or [psutil.Process()]:
        try:
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for p in tree:
            try:
                t = p.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
            except psutil.Error:
                pass
    return total


def topology(name: str, rate: float, count: int, key_groups: int = KEY_GROUPS) -> StreamTopology:
    return StreamTopology.model_validate(
        {
            "metadata": {"name": name},
            "spec": {
                "keyGroups": key_groups,
                "operators": [
                    {
                        "name": "numbers",
                        "kind": "source",
                        "source": {
                            "generator": "sequence",
                            "ratePerSecond": rate,
                            "count": count,
                            "keys": KEYS,
                        },
                    },
                    {
                        "name": "totals",
                        "kind": "aggregate",
                        "inputs": ["numbers"],
                        "keyBy": ["key"],
                        "window": {"size": WINDOW},
                        "aggregations": ["count(*) AS n", "sum(value) AS total"],
                    },
                    {"name": "out", "kind": "sink", "inputs": ["totals"], "sink": {"file": {}}},
                ],
            },
        }
    )


def routing_for(
    top: StreamTopology, assignment: dict[tuple[str, int], str], version: int = 1
) -> RoutingTable:
    names = sorted(set(assignment.values()))
    return RoutingTable(
        topology=top.metadata.name,
        version=version,
        executors={n: ExecutorEntry() for n in names},
        units={unit_key(u): e for u, e in assignment.items()},
    )


def write(path: Path, routing: RoutingTable) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(routing.to_json())
    tmp.replace(path)


class Threaded:
    def __init__(self, executor: Executor):
        self.executor = executor
        self.stop = threading.Event()
        executor.start()
        self.thread = threading.Thread(target=executor.run, args=(self.stop,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


def run_threaded(
    top: StreamTopology,
    routing: RoutingTable,
    work: Path,
    url: str,
    config: ExecutorConfig | None = None,
    backlogged: bool = False,
) -> tuple[float, float, list[Executor]]:
    """(wall seconds, CPU-seconds of this process, the executors) of ``top`` run to the end of its stream by
    the executors ``routing`` names, as threads of this process writing file sinks under ``work/<name>``.
    ``backlogged`` sets the topology's clock back so every source record is due at the start."""
    name = top.metadata.name
    write(work / f"{name}.json", routing)
    if backlogged:
        rate = min(op.source.rate_per_second for op in top.spec.operators if op.source is not None)
        count = max(op.source.count or 0 for op in top.spec.operators if op.source is not None)
        connect(url).set(Keys.of(top).clock, repr(time.time() - count / rate - 1.0))
    executors = [
        Executor(top, work / f"{name}.json", n, url, output_dir=work / name, config=config)
        for n in sorted(routing.executors)
    ]
    cpu0, wall0 = cpu_seconds(), time.perf_counter()
    runs = [Threaded(e) for e in executors]
    while not finished(executors[0].store, top):
        time.sleep(0.02)
    wall, cpu = time.perf_counter() - wall0, cpu_seconds() - cpu0
    for run, executor in zip(runs, executors):
        run.close()
        executor.close()
    return wall, cpu, executors


# --------------------------------------------------------------------------------------- throughput


def steady(run: Callable[[int, int], tuple[float, float]], records: int) -> tuple[float, float]:
    """(records per CPU-second, wall seconds of a run of ``records``) of ``run(i, n)`` once warm and
    without start-up, as Structured Streaming is measured over a minute after its first batch: warm-up
    runs of ``records`` until two in a row cost within 10 % (:func:`settled`), then runs of N, 2N, N, 2N,
    N, and the rate is 1 / their marginal cost (:func:`marginal`). What a run pays once (an executor's
    start, acquiring units, the end of stream) is the intercept; a single run after one warm-up moved
    between 2.6M and 5.7M records per CPU-second as the JIT caught up."""
    costs: list[float] = []
    while not settled(costs, WARM_UP_RUNS):
        costs.append(records / run(len(costs), records)[0])
    runs = []
    for i, n in enumerate((records, 2 * records) * (STEADY_PAIRS - 1) + (records, 2 * records, records)):
        rate, wall = run(WARM_UP_RUNS + i, n)
        runs.append((n, n / rate, wall))
    walls = [wall for n, _, wall in runs if n == records]
    return 1 / marginal(runs)[0], sum(walls) / len(walls)


def ours(
    url: str,
    work: Path,
    records: int,
    name: str = "bench-ours",
    split: bool = False,
    unit_records: int | None = None,
) -> tuple[float, float]:
    """(records per CPU-second, wall seconds) of our executors running the pipeline flat out.

    One executor hosting every unit (records stay in the JVM from the generator to the aggregate's
    partials), or with ``split`` the source on one executor and the aggregate and sink on another, so
    every record crosses Valkey as Arrow entries and enters Spark again on the far side."""
    top = topology(name, rate=MAX_RATE_PER_SECOND, count=records)
    spec = top.spec
    units = {
        (op.name, kg): ("ex-1" if split and op.kind != "source" else "ex-0")
        for op in spec.operators
        for kg in range(spec.key_groups_of(op.name))
    }
    # The executor's defaults unless a sweep sets the records a source unit generates per step.
    config = ExecutorConfig(**({"max_source_records": unit_records * KEY_GROUPS} if unit_records else {}))
    wall, cpu, _ = run_threaded(top, routing_for(top, units), work, url, config, backlogged=True)
    return records / cpu, wall


def structured_streaming(seconds: float, rate: int) -> tuple[float, int]:
    """(records per CPU-second, records) of Structured Streaming doing the same aggregation."""
    from pyspark.sql import functions as F

    spark = get_spark()
    stream = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", rate)
        .load()
        .withColumn("key", F.col("value") % KEYS)
        .withWatermark("timestamp", "0 seconds")
        .groupBy(F.window("timestamp", f"{WINDOW:g} seconds"), "key")
        .agg(F.count("*").alias("n"), F.sum("value").alias("total"))
    )
    query = stream.writeStream.format("noop").outputMode("append").start()
    rows: dict[int, int] = {}

    def poll() -> None:
        for progress in query.recentProgress:
            rows[progress["batchId"]] = progress["numInputRows"]

    deadline = time.time() + 300
    while not any(rows.values()) and time.time() < deadline:  # warm-up: until the first non-empty batch
        time.sleep(0.5)
        poll()
    warm = set(rows)
    cpu0, end = cpu_seconds(), time.time() + seconds
    while time.time() < end:
        time.sleep(0.5)
        poll()
    cpu = cpu_seconds() - cpu0
    query.stop()
    measured = sum(n for batch, n in rows.items() if batch not in warm)
    return measured / cpu, measured


# ------------------------------------------------------------------------------------------ batching


def batching(url: str, records: int = 20000) -> tuple[float, float]:
    """Records per second through the transport: one record per entry, then 512 per entry."""
    client = connect(url)
    seq = np.arange(records, dtype=np.int64)
    frame = pd.DataFrame(
        {
            "seq": seq,
            "key": seq % KEYS,
            "value": seq,
            "_ts": seq / 1000.0,
            "_kg": np.zeros(records, dtype=np.int32),
        }
    )
    out = []
    for size, budget in ((1, min(records, 3000)), (512, records)):
        stream = f"st:{{bench}}:batch:{size}"
        client.delete(stream)
        started = time.perf_counter()
        sent = 0
        for i in range(0, budget, size):
            fields = entry_fields("bench/0", i + 1, 0.0, frame.iloc[i : i + size])
            client.xadd(stream, dict(zip(fields[::2], fields[1::2])))
            sent += min(size, budget - i)
        got = 0
        for entry_id, raw in client.xrange(stream):
            got += len(Entry.parse(entry_id, raw).records())
        assert got == sent
        out.append(sent / (time.perf_counter() - started))
        client.delete(stream)
    return out[0], out[1]


# --------------------------------------------------------------------------------------------- pause


def pauses(url: str, work: Path, sizes: list[int], repeats: int) -> list[tuple[int, float, float]]:
    """(state bytes, median pause, max pause) of an aggregate key group moving between two executors."""
    rows = []
    for size in sizes:
        top = topology(f"bench-pause-{size}", rate=1.0, count=0, key_groups=1)
        spec = top.spec
        operator = build_operator(spec.operator("totals"), spec)
        n = max(1, (size - 4096) // 32)  # four int64 columns, under the nominal size with the IPC framing
        state = {
            "rows": pd.DataFrame(
                {
                    "key": np.arange(n, dtype=np.int64),
                    "__bucket": np.zeros(n, dtype=np.int64),
                    "__a0_c": np.ones(n, dtype=np.int64),
                    "__a1_s": np.arange(n, dtype=np.int64),
                }
            ),
            "wm": -math.inf,
        }
        blob = operator.encode_state(state)
        store = StateStore(connect(url), Keys.of(top))
        epoch, _ = store.acquire("totals/0", "seed")
        store.commit(Commit(units=[("totals/0", epoch, UnitRecord(state=blob).encode())]))
        store.release("totals/0", epoch)
        assignment = {("numbers", 0): "nobody", ("totals", 0): "ex-a", ("out", 0): "nobody"}
        path = work / f"routing-{size}.json"
        write(path, routing_for(top, assignment))
        runs = [
            Threaded(Executor(top, path, name, url, output_dir=work / "out")) for name in ("ex-a", "ex-b")
        ]
        version = 1
        for i in range(repeats):
            time.sleep(0.5)
            assignment[("totals", 0)] = "ex-b" if assignment[("totals", 0)] == "ex-a" else "ex-a"
            version += 1
            write(path, routing_for(top, assignment, version))
            deadline = time.time() + 120
            while store.client.llen(store.keys.pauses) < i + 2 and time.time() < deadline:
                time.sleep(0.02)
        for run in runs:
            run.close()
        measured = [Pause.from_json(p).seconds for p in store.client.lrange(store.keys.pauses, 1, -1)]
        rows.append((len(blob), float(np.median(measured)), max(measured)))
        console.print(f"  pause at {len(blob):,} B of state: p50 {rows[-1][1]:.3f}s max {rows[-1][2]:.3f}s")
    return rows


# ------------------------------------------------------------------------------------------- latency


def latency(
    url: str, work: Path, rate: float, seconds: float, config: ExecutorConfig | None = None
) -> tuple[float, float]:
    """p50 and p99 sink latency of one executor at ``rate`` records/s for ``seconds``."""
    top = topology("bench-latency", rate=rate, count=int(rate * seconds))
    spec = top.spec
    units = {(op.name, kg): "ex-0" for op in spec.operators for kg in range(spec.key_groups_of(op.name))}
    write(work / "routing-latency.json", routing_for(top, units))
    run = Threaded(
        Executor(
            top, work / "routing-latency.json", "ex-0", url, output_dir=work / "out-latency", config=config
        )
    )
    while not finished(run.executor.store, top):
        time.sleep(0.1)
    run.close()
    metric = run.executor.metrics.sink_latency
    [family] = list(metric.collect())
    buckets = [(float(s.labels["le"]), s.value) for s in family.samples if s.name.endswith("_bucket")]
    return quantile(buckets, 0.5), quantile(buckets, 0.99)


def quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """Prometheus' histogram_quantile: linear interpolation inside the bucket holding the q-th sample."""
    total = buckets[-1][1]
    target = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= target:
            if math.isinf(bound):
                return lower_bound
            return lower_bound + (bound - lower_bound) * (target - lower_count) / max(
                count - lower_count, 1e-9
            )
        lower_bound, lower_count = bound, count
    return lower_bound


# ---------------------------------------------------------------------------------------- scale-out

CROSSINGS = ("combinable", "whole")
"""How records cross executors: (a) ``combinable``: filter -> 1 s windowed count+sum keyed by ``key``, whose
partials could be combined before the wire; (b) ``whole``: map -> file sink keyed by a column the map
computes, so each record travels whole."""
SCALE_EXECUTORS = (1, 2, 4)
SCALE_KEYS = 1009
"""Keys of the scale-out pipelines: a prime, so a key (``seq % 1009``) is independent of the source's key
group (``seq % 4``) and every key's records come from every source unit."""
EVENT_RATE = 100_000.0
"""Event-time rate of the throughput runs' records: 1 s windows of about 100 records per key."""
SCALE_RECORDS = 2_000_000
"""N of a full run (times :data:`RECORDS_FACTOR`), the same in every configuration so that wall times
compare. Records travelling whole come out of the JVM, so an executor's source units generate at most 1M
of them per step together (``ExecutorConfig.materialized_records``) and their receivers read at most 200k
per step: those marginals include Spark's fixed cost per step as a backlogged run pays it."""
RECORDS_FACTOR = {"combinable": 8, "whole": 1}
"""N per crossing, in units of ``--scale-records``. The combinable crossing costs about 0.25 CPU-seconds
per million records on one executor, so at 2M its runs differ by tenths of a CPU-second and the
marginal's standard error was 25-56 %; at 16M and 32M a run's cost is several CPU-seconds. An executor's
source units generate up to 8M records per step together (``ExecutorConfig.max_source_records``), so
N = 16M is two steps on one executor and one on each of two, 2N twice that: the runs of 1 and 2
executors take steps in proportion to their records, and each marginal carries Spark's fixed cost per
step as a long backlogged run pays it (4 executors take one step per run for N and 2N alike)."""
WARM_UP_RUNS = 3
"""Most warm-up runs per crossing and group (``--quick``: 2); they stop once two in a row cost within 10 %
of each other. One was not enough: on one executor the run after a single warm-up cost 1.5x the later
ones (the JIT was still compiling), and a marginal taken from runs still speeding up comes out too good."""
MEASURED_RUNS = 5
"""Most measured runs per configuration (N, 2N, N, ..., N; ``--quick``: exactly 3): more for the cheap
one-executor runs, whose marginal is a small difference of noisy totals, within the time budget."""
STEADY_PAIRS = 2
"""Pairs of runs (N, 2N) before the last run of N in the one-executor throughput (:func:`steady`)."""
SCALE_ROUNDS = 3
"""Groups of executors per configuration (``--quick``: 1), started afresh and interleaved (1, 2, 4, 1, 2,
4, ...). Within one group a configuration's CPU per record repeats within a few percent; between groups
(new JVMs, whose JIT compiles Spark's generated code its own way) it moved by up to 30 %: with one group
each, the combinable crossing on 2 executors measured 0.86x and 0.73x one executor's on the same morning
(2026-11-26). The rate is taken over the groups' mean slope, its error from their spread."""
SCALE_HEADING = "### Scale-out across executors"
POLL = 0.025
"""Seconds between the harness's completion checks: small against the shortest run's wall time."""


def pipeline(prefix: str, crossing: str, count: int | None, rate: float) -> list[dict]:
    """The operators of one pipeline of a crossing kind, named ``<prefix>-...`` so several pipelines share
    a topology (and so the executors that run them one after the other)."""
    source = {"generator": "sequence", "ratePerSecond": rate, "keys": SCALE_KEYS}
    numbers = {
        "name": f"{prefix}-numbers",
        "kind": "source",
        "source": source if count is None else {**source, "count": count},
    }
    if crossing == "combinable":
        return [
            numbers,
            {
                "name": f"{prefix}-kept",
                "kind": "filter",
                "inputs": [numbers["name"]],
                "expr": "value % 10 <> 0",
            },
            {
                "name": f"{prefix}-totals",
                "kind": "aggregate",
                "inputs": [f"{prefix}-kept"],
                "keyBy": ["key"],
                "window": {"size": WINDOW},
                "aggregations": ["count(*) AS n", "sum(value) AS total"],
            },
            {"name": f"{prefix}-out", "kind": "sink", "inputs": [f"{prefix}-totals"], "sink": {"file": {}}},
        ]
    return [
        numbers,
        {
            "name": f"{prefix}-rekeyed",
            "kind": "map",
            "inputs": [numbers["name"]],
            "select": ["seq", "key", "value", f"(seq div {KEY_GROUPS}) % {SCALE_KEYS} AS account"],
        },
        {
            "name": f"{prefix}-out",
            "kind": "sink",
            "inputs": [f"{prefix}-rekeyed"],
            "keyBy": ["account"],
            "sink": {"file": {}},
        },
    ]


def pipelines_topology(
    name: str, pipelines: list[list[dict]], interval: float | None = None
) -> StreamTopology:
    """One topology holding several pipelines, so one group of executors (one JVM start) runs them all;
    ``interval`` sets ``spec.batching.interval`` (seconds; None: the default)."""
    spec: dict = {"keyGroups": KEY_GROUPS, "operators": [op for ops in pipelines for op in ops]}
    if interval is not None:
        spec["batching"] = {"interval": interval}
    return StreamTopology.model_validate({"metadata": {"name": name}, "spec": spec})


def round_robin(ops: list[Operator], spec: StreamTopologySpec, executors: int) -> dict[tuple[str, int], str]:
    """Unit (op, kg) on executor ``kg mod executors``, the rule of ``streamtopo run --executors N``: every
    executor gets the same share of every operator, one-to-one edges (source -> filter or map, aggregate
    -> sink) stay on one executor, and a keyed edge crosses for about (k-1)/k of its records."""
    return {(op.name, kg): f"ex-{kg % executors}" for op in ops for kg in range(spec.key_groups_of(op.name))}


def crossing_share(crossing: str, executors: int, records: int) -> float:
    """Share of the records on the pipeline's keyed edge whose producing and consuming units are on
    different executors under :func:`round_robin`, from the generator's definition (``key = seq % 1009``,
    source key group ``seq % 4``) and the runtime's own routing function: what crosses by construction,
    whatever the executor then sends (records or combined partials)."""
    seq = np.arange(min(records, 200_000), dtype=np.int64)
    if crossing == "combinable":
        seq = seq[seq % 10 != 0]
        keys = pd.DataFrame({"key": seq % SCALE_KEYS})
    else:
        keys = pd.DataFrame({"account": (seq // KEY_GROUPS) % SCALE_KEYS})
    consumer = route(keys, tuple(keys.columns), KEY_GROUPS, 0)
    return float(np.mean(seq % KEY_GROUPS % executors != consumer % executors))


def kept_totals(count: int) -> tuple[int, int]:
    """(records, sum of value) the combinable pipeline's filter keeps of seq 0 .. count-1 (value = seq)."""
    tens = -(-count // 10)  # 0, 10, ... below count
    return count - tens, count * (count - 1) // 2 - 10 * tens * (tens - 1) // 2


class ExecutorGroup:
    """``count`` executor processes started the way ``streamtopo run`` starts them (LocalPlatform: one
    process each, Spark ``local[1]``, their own JVM) on a topology of several pipelines run one at a time,
    each through a new routing version.

    The executors start with no units and the group is ready once every JVM is up and warm, so start-up
    stays outside every measurement. CPU is read over each executor's process tree (Python, JVM, any
    Python workers) plus the Valkey server; the harness (this process) only polls Valkey."""

    def __init__(
        self,
        top: StreamTopology,
        work: Path,
        url: str,
        count: int,
        clock: float | None = None,
        bed: EmulatedHosts | None = None,
        hosts: Sequence[str] = (),
    ):
        """``bed``: emulated hosts (local/testbed.py), executor ``ex-i`` started on ``hosts[i]``."""
        self.top, self.spec = top, top.spec
        self.keys = Keys.of(top)
        self.store = StateStore(connect(url), self.keys)
        if clock is not None:  # before any executor sets it (they only set a missing clock)
            self.store.client.set(self.keys.clock, repr(clock))
        self.output = work / "out"
        cluster = bed.cluster() if bed is not None else Cluster.uniform(1, float(os.cpu_count() or 1))
        self.platform = LocalPlatform(work, url, cluster, output_dir=self.output, bed=bed)
        self.platform.write_topology(top)
        self.version = 0
        self.route({})
        try:
            for i in range(count):
                self.platform.start(f"ex-{i}", hosts[i] if hosts else None)
            self.platform.wait_ready(timeout=900.0)  # JVMs under a small bed quota start slowly
        except BaseException:
            self.platform.close()
            raise
        valkey = psutil.Process(int(self.store.client.info("server")["process_id"]))
        self.processes = [psutil.Process(p.popen.pid) for p in self.platform.processes.values()] + [valkey]

    def __enter__(self) -> ExecutorGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.platform.close()

    def operators(self, prefix: str) -> list[Operator]:
        """The operators of the pipeline named ``prefix`` (:func:`pipeline`)."""
        return [op for op in self.spec.operators if op.name.startswith(f"{prefix}-")]

    def route(self, assignment: dict[tuple[str, int], str]) -> None:
        """The next routing version: the executors take ``assignment``'s units and release all others."""
        self.version += 1
        self.platform.write_routing(routing_for(self.top, assignment, self.version))

    def unit_keys(self, ops: list[Operator], kind: str | None = None) -> list[str]:
        return [
            unit_key((op.name, kg))
            for op in ops
            if kind in (None, op.kind)
            for kg in range(self.spec.key_groups_of(op.name))
        ]

    def wait(self, condition: Callable[[], bool], timeout: float, poll: float = POLL) -> bool:
        """Poll ``condition`` until it holds (True) or ``timeout`` passes (False); an executor that exits
        raises with its log's tail."""
        deadline = time.time() + timeout
        while not condition():
            if exited := self.platform.exited():
                name, code = next(iter(exited.items()))
                raise RuntimeError(
                    f"executor {name} exited with code {code}:\n{self.platform.log_tail(name)}"
                )
            if time.time() > deadline:
                return False
            time.sleep(poll)
        return True

    def done(self, ops: list[Operator]) -> bool:
        """Every sink unit committed the end-of-stream watermark. Two cheap conditions come first (no stream
        holds records, every source unit emitted its last one): a file sink's unit record carries its last
        step's output, megabytes that a poll every 25 ms should not fetch."""
        if any(int(v) for v in self.store.client.hvals(self.keys.backlog)):
            return False
        for kind in ("source", "sink"):
            for key in self.unit_keys(ops, kind):
                _, rec = self.store.load(key)
                if rec is None or rec.watermark != math.inf:
                    return False
        return True

    def release(self, ops: list[Operator]) -> None:
        """A routing version without the pipeline's units; returns once every one was released."""
        self.route({})
        keys = self.unit_keys(ops)
        if not self.wait(lambda: all(not self.store.ownership(k).owner for k in keys), timeout=120.0):
            raise TimeoutError(f"units of {ops[0].name} not released after 120 s")

    def run(self, prefix: str, crossing: str, count: int, executors: int) -> tuple[float, float]:
        """(CPU-seconds, wall seconds) of pipeline ``prefix`` from its routing version to every sink unit's
        end-of-stream commit. Then its units are released, its output checked against the generator's
        definition (a run that lost or doubled records measured nothing) and its keys and files removed."""
        ops = self.operators(prefix)
        cpu0, wall0 = cpu_seconds(self.processes), time.perf_counter()
        self.route(round_robin(ops, self.spec, executors))
        if not self.wait(lambda: self.done(ops), timeout=1800.0):
            raise TimeoutError(f"{prefix} on {executors} executors did not finish in 30 minutes")
        wall, cpu = time.perf_counter() - wall0, cpu_seconds(self.processes) - cpu0
        self.release(ops)
        self.check(prefix, crossing, count)
        client = self.store.client
        streams = [
            self.keys.stream(u, op.name, kg)
            for op in ops
            for u in op.inputs
            for kg in range(self.spec.key_groups_of(op.name))
        ]
        client.delete(*[self.keys.unit(k) for k in self.unit_keys(ops)], *streams)
        client.hdel(self.keys.backlog, *streams)
        shutil.rmtree(self.output / f"{prefix}-out", ignore_errors=True)
        return cpu, wall

    def check(self, prefix: str, crossing: str, count: int) -> None:
        """Raise unless the sink's files hold exactly what the generator's definition gives: for the
        combinable pipeline the count and sum of the values the filter keeps, for whole records one line
        per record."""
        files = sorted((self.output / f"{prefix}-out").glob("kg-*.jsonl"))
        if crossing == "combinable":
            rows = [json.loads(line) for f in files for line in f.read_text().splitlines()]
            got, want = (sum(r["n"] for r in rows), sum(r["total"] for r in rows)), kept_totals(count)
        else:
            got, want = sum(f.read_bytes().count(b"\n") for f in files), count
        if got != want:
            raise AssertionError(f"{prefix}: the sink wrote {got}, the generator's definition gives {want}")

    def families(self) -> list[Metric]:
        """Every executor's /metrics, parsed."""
        return [
            family
            for text in self.platform.scrape_all().values()
            for family in text_string_to_metric_families(text)
        ]

    def backlog(self, ops: list[Operator]) -> float:
        """Records the pipeline's units have waiting (generators: due and not generated yet); infinite
        until every unit exports its backlog (acquired, and its first step done)."""
        names = {op.name for op in ops}
        values = [
            s.value
            for f in self.families()
            if f.name == "streamtopo_unit_backlog_records"
            for s in f.samples
            if s.labels["operator"] in names
        ]
        return sum(values) if len(values) == len(self.unit_keys(ops)) else math.inf

    def sink_latency(self, sink: str) -> dict[float, float]:
        """Cumulative count per bucket bound of ``sink``'s latency histogram, summed over the executors."""
        out: dict[float, float] = defaultdict(float)
        for f in self.families():
            if f.name == "streamtopo_sink_latency_seconds":
                for s in f.samples:
                    if s.name.endswith("_bucket") and s.labels["operator"] == sink:
                        out[float(s.labels["le"])] += s.value
        return out


@dataclass(frozen=True)
class ScalePoint:
    """One configuration of the scale-out curve: its measured runs, alternately N and 2N records, in each
    of its groups of executors (fresh JVMs)."""

    crossing: str
    executors: int
    records: int
    rounds: tuple[tuple[tuple[int, float, float], ...], ...]
    """Per group, (records, CPU-seconds, wall seconds) of each measured run, in order: N, 2N, N, ..., N."""
    share: float
    """Share of the keyed edge's records that cross executors (:func:`crossing_share`)."""

    @property
    def runs(self) -> list[tuple[int, float, float]]:
        return [run for runs in self.rounds for run in runs]

    def cpu(self, records: int) -> float:
        """Mean CPU-seconds of the runs of ``records``."""
        return float(np.mean([cpu for n, cpu, _ in self.runs if n == records]))

    @property
    def slopes(self) -> list[float]:
        """CPU-seconds per record of each group (:func:`marginal`)."""
        return [marginal(runs)[0] for runs in self.rounds]

    @property
    def rate(self) -> float:
        """Marginal records per CPU-second: 1 / the groups' mean slope (nan when noise swamped it)."""
        slope = float(np.mean(self.slopes))
        return 1 / slope if slope > 0 else math.nan

    @property
    def error(self) -> float:
        """Relative standard error of :attr:`rate`: between groups when there are several (what differs
        from one JVM to the next dominates), else the one group's slope's."""
        slope = float(np.mean(self.slopes))
        if slope <= 0:
            return math.inf
        if len(self.rounds) > 1:
            return float(np.std(self.slopes, ddof=1)) / math.sqrt(len(self.rounds)) / slope
        return marginal(self.rounds[0])[1] / slope

    @property
    def wall_rate(self) -> float:
        """Records per wall second of the 2N runs."""
        return 2 * self.records / float(np.mean([wall for n, _, wall in self.runs if n == 2 * self.records]))


def marginal(runs: Sequence[tuple[int, float, float]]) -> tuple[float, float]:
    """(CPU-seconds per record, its standard error): the least-squares slope of CPU against records over
    runs of (records, CPU, wall). A run's fixed cost (acquiring units, planning its first steps) is the
    intercept and drops out; sizes alternating N, 2N, ..., N cancel a cost that drifts linearly."""
    x = np.array([n for n, _, _ in runs], dtype=float)
    y = np.array([cpu for _, cpu, _ in runs])
    dx = x - x.mean()
    slope = float(dx @ (y - y.mean()) / (dx @ dx))
    residuals = y - y.mean() - slope * dx
    return slope, float(np.sqrt(residuals @ residuals / (len(x) - 2) / (dx @ dx)))


def settled(costs: list[float], most: int) -> bool:
    """Whether warm-up can stop: two runs in a row cost within 10 % of each other, or ``most`` were run."""
    return len(costs) >= most or (len(costs) >= 2 and abs(costs[-1] - costs[-2]) <= 0.1 * costs[-1])


def measured(runs: list[tuple[int, float, float]], records: int, most: int) -> bool:
    """Whether a configuration's measurement can stop: it ended on a run of N after at least one of 2N,
    and the marginal cost is known within 5 % (standard error) or ``most`` runs were made."""
    if len(runs) < 3 or runs[-1][0] != records:
        return False
    slope, se = marginal(runs)
    return len(runs) >= most or 0 < slope and se <= 0.05 * slope


def scale_out(
    url: str,
    work: Path,
    records: int,
    warm_ups: int = WARM_UP_RUNS,
    most: int = MEASURED_RUNS,
    rounds: int = SCALE_ROUNDS,
) -> list[ScalePoint]:
    """The scale-out curve: both crossings on 1, 2 and 4 executors, with runs of ``records`` and twice that.

    ``rounds`` times, one executor group per executor count (fresh processes and JVMs) runs, per crossing,
    up to ``warm_ups`` warm-up runs of ``records`` (:func:`settled`) and then up to ``most`` measured runs,
    alternately N and 2N (:func:`measured`), all in the group's JVMs. The topology's clock is set a day
    back, so every record is due at once (the sources run backlogged, flat out) while event times still
    span ``records / EVENT_RATE`` seconds of 1 s windows."""
    sizes = {
        c: {
            **{f"warm{i}": records * RECORDS_FACTOR[c] for i in range(warm_ups)},
            **{f"run{i}": records * RECORDS_FACTOR[c] * (1 + i % 2) for i in range(most)},
        }
        for c in CROSSINGS
    }
    measured_runs: dict[tuple[str, int], list[tuple[tuple[int, float, float], ...]]] = defaultdict(list)
    for round_ in range(rounds):
        for executors in SCALE_EXECUTORS:
            top = pipelines_topology(
                f"bench-scale-{executors}-{round_}",
                [
                    pipeline(f"{c}-{tag}", c, size, EVENT_RATE)
                    for c in CROSSINGS
                    for tag, size in sizes[c].items()
                ],
            )
            console.print(f"  group {round_ + 1}/{rounds}, {executors} executor(s): starting")
            clock = time.time() - 86400
            work_dir = work / f"scale-{executors}-{round_}"
            with ExecutorGroup(top, work_dir, url, executors, clock=clock) as group:
                for crossing in CROSSINGS:
                    n_records = records * RECORDS_FACTOR[crossing]
                    warm: list[float] = []
                    while not settled(warm, warm_ups):
                        warm.append(
                            group.run(f"{crossing}-warm{len(warm)}", crossing, n_records, executors)[0]
                        )
                    runs: list[tuple[int, float, float]] = []
                    while not measured(runs, n_records, most):
                        n = sizes[crossing][f"run{len(runs)}"]
                        runs.append((n, *group.run(f"{crossing}-run{len(runs)}", crossing, n, executors)))
                    measured_runs[(crossing, executors)].append(tuple(runs))
                    slope, se = marginal(runs)
                    warm_cpu, runs_cpu = (
                        " / ".join(f"{c:.1f}" for c in costs) for costs in (warm, [c for _, c, _ in runs])
                    )
                    console.print(
                        f"  {crossing}, {executors} executor(s): {1 / slope:,.0f} records per CPU-second "
                        f"+- {se / slope:.0%} in this group (CPU-seconds of warm-up runs {warm_cpu}, of "
                        f"measured runs {runs_cpu})"
                    )
    return [
        ScalePoint(
            crossing,
            executors,
            records * RECORDS_FACTOR[crossing],
            tuple(measured_runs[(crossing, executors)]),
            crossing_share(crossing, executors, records * RECORDS_FACTOR[crossing]),
        )
        for executors in SCALE_EXECUTORS
        for crossing in CROSSINGS
    ]


def crossing_latency(
    url: str, work: Path, rate: float, seconds: float
) -> dict[str, tuple[float, float, int]]:
    """(p50, p99, samples) of event time -> sink commit for each crossing on two executors at ``rate``.

    The sources are endless and paced by the topology's clock, which starts with the executors: a pipeline
    first catches up with the records that came due meanwhile, and only the commits after it caught up
    (and 3 s more) count: the histogram is read before and after ``seconds`` and the difference kept."""
    top = pipelines_topology(
        "bench-latency-across", [pipeline(f"{c}-live", c, None, rate) for c in CROSSINGS]
    )
    out = {}
    with ExecutorGroup(top, work / "latency-across", url, 2) as group:
        for crossing in CROSSINGS:
            ops = group.operators(f"{crossing}-live")
            group.route(round_robin(ops, group.spec, 2))
            # Scraping is work for the executors: twice a second is enough to see the backlog gone.
            if not group.wait(lambda ops=ops: group.backlog(ops) <= rate, timeout=120.0, poll=0.5):
                console.print(f"  [red]{crossing}: still more than 1 s of records behind after 120 s[/red]")
            time.sleep(3.0)
            before = group.sink_latency(f"{crossing}-live-out")
            time.sleep(seconds)
            after = group.sink_latency(f"{crossing}-live-out")
            group.release(ops)
            if not after:
                raise RuntimeError(f"{crossing}: no sink latency histogram after {seconds:g} s")
            buckets = [(bound, count - before.get(bound, 0.0)) for bound, count in sorted(after.items())]
            out[crossing] = (quantile(buckets, 0.5), quantile(buckets, 0.99), int(buckets[-1][1]))
            console.print(
                f"  {crossing}: p50 {out[crossing][0]:.2f}s p99 {out[crossing][1]:.2f}s "
                f"({out[crossing][2]:,} sink records)"
            )
    return out


LABELS = {
    "combinable": "combinable (filter -> window aggregate)",
    "whole": "whole records (map -> keyed sink)",
}


def scale_out_report(
    command: str,
    points: list[ScalePoint],
    across: dict[str, tuple[float, float, int]],
    latency_seconds: float,
) -> list[str]:
    """Prints the scale-out tables, draws docs/img/runtime_scaleout.png and returns the Runtime section's
    scale-out block. The block has its own command, machine and date: ``--scale-out-only`` re-measures it
    alone and keeps the rest of the section as it was recorded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cores = os.cpu_count() or 1
    by = {(p.crossing, p.executors): p for p in points}

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    def versus_one(p: ScalePoint) -> tuple[float, float]:
        """(records per CPU-second, wall throughput) against the same crossing on one executor."""
        one = by[(p.crossing, 1)]
        return p.rate / one.rate, p.wall_rate / one.wall_rate

    def target(p: ScalePoint, short: bool = False) -> str:
        cpu, wall = versus_one(p)
        if p.executors == 1:
            return "baseline"
        if p.executors == 2:
            if short:
                return f"CPU {verdict(cpu >= 0.8)}, wall {verdict(wall >= 1.0)}"
            return f"per CPU-s >= 0.8x {verdict(cpu >= 0.8)}; wall >= 1.0x {verdict(wall >= 1.0)}"
        gain = p.wall_rate / by[(p.crossing, 2)].wall_rate
        if cores < p.executors:
            return (
                f"n/a ({cores} cores)"
                if short
                else (f"wall above 2 executors' ({gain:.2f}x): n/a, {cores} cores")
            )
        return verdict(gain > 1) if short else f"wall above 2 executors' {verdict(gain > 1)} ({gain:.2f}x)"

    columns = (
        "crossing",
        "executors",
        "keyed-edge records crossing executors",
        "records per run (N, 2N)",
        "measured runs",
        "mean CPU-s (N / 2N)",
        "records per CPU-second (marginal, +- standard error)",
        "vs 1 executor",
        "records per wall second (2N)",
        "vs 1 executor",
        "target",
    )

    def row(p: ScalePoint, label: str) -> tuple[str, ...]:
        cpu, wall = versus_one(p)
        return (
            label,
            str(p.executors),
            f"{p.share:.0%}",
            f"{p.records:,}, {2 * p.records:,}",
            f"{len(p.runs)} in {len(p.rounds)} group(s)",
            f"{p.cpu(p.records):.2f} / {p.cpu(2 * p.records):.2f}",
            f"{p.rate:,.0f} +- {p.error:.0%}",
            f"{cpu:.2f}x",
            f"{p.wall_rate:,.0f}",
            f"{wall:.2f}x",
            target(p),
        )

    latency_columns = (
        f"end-to-end latency, 2 executors, 2,000 records/s ({latency_seconds:g} s of commits)",
        "p50",
        "p99",
        "sink records",
        "target",
    )

    def latency_row(crossing: str, label: str) -> tuple[str, ...]:
        p50, p99, n = across[crossing]
        return label, f"{p50:.2f} s", f"{p99:.2f} s", f"{n:,}", f"p99 <= 1 s {verdict(p99 <= 1.0)}"

    # The terminal (80 columns) gets the numbers that decide; the markdown block has every column.
    terminal = [
        (
            p.crossing,
            str(p.executors),
            f"{p.share:.0%}",
            f"{p.rate:,.0f} +- {p.error:.0%}",
            f"{versus_one(p)[0]:.2f}x",
            f"{p.wall_rate:,.0f}",
            f"{versus_one(p)[1]:.2f}x",
            target(p, short=True),
        )
        for p in points
    ]
    for title, cols, body in (
        (
            "scale-out",
            ("crossing", "k", "cross", "records / CPU-s", "vs 1", "wall records/s", "vs 1", "target"),
            terminal,
        ),
        (
            "latency across two executors",
            ("crossing", *latency_columns[1:]),
            [latency_row(c, c) for c in across],
        ),
    ):
        table = Table(title=title)
        for column in cols:
            table.add_column(column)
        for cells in body:
            table.add_row(*cells)
        console.print(table)

    fig, (cost, wall) = plt.subplots(1, 2, figsize=(11, 4.2))
    for crossing, marker in zip(CROSSINGS, "os"):
        curve = [by[(crossing, k)] for k in SCALE_EXECUTORS]
        rates = [p.rate for p in curve]
        (line, *_) = cost.errorbar(
            SCALE_EXECUTORS,
            rates,
            [r * p.error for r, p in zip(rates, curve)],
            fmt=marker + "-",
            capsize=3,
            label=LABELS[crossing],
        )
        cost.axhline(0.8 * curve[0].rate, color=line.get_color(), lw=0.8, ls=":")
        wall.plot(SCALE_EXECUTORS, [p.wall_rate for p in curve], marker + "-", label=LABELS[crossing])
    wall.axvline(cores, color="grey", lw=0.8, ls="--", label=f"cores of this machine ({cores})")
    cost.set_ylabel("records per CPU-second (marginal)")
    cost.set_title("Cost, +- standard error (dotted: 0.8x one executor)")
    wall.set_ylabel("records per wall second (2N runs)")
    wall.set_title("Wall throughput")
    for ax in (cost, wall):
        ax.set_yscale("log")  # the crossings differ by an order of magnitude; ratios read as distances
        ax.set_xticks(SCALE_EXECUTORS)
        ax.set_xlabel("executors")
        ax.legend(fontsize=8)
    fig.tight_layout()
    img = ROOT / "docs" / "img" / "runtime_scaleout.png"
    img.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(img, dpi=120)
    plt.close(fig)

    return [
        SCALE_HEADING,
        "",
        *header(command, f"load average {psutil.getloadavg()[1]:.1f} (5 min) at the end of the run"),
        "",
        *markdown(columns, [row(p, LABELS[p.crossing]) for p in points]),
        "",
        *markdown(latency_columns, [latency_row(c, LABELS[c]) for c in across]),
        "",
        "![scale-out](img/runtime_scaleout.png)",
        "",
        (
            "Reading: the pipelines run on 1, 2 and 4 executor processes started as `streamtopo run` starts "
            "them (LocalPlatform: a Python process with its own JVM each, Spark local[1]). Units (operator, "
            "key group) go round-robin, (op, kg) on executor kg mod k as with `streamtopo run --executors k`,"
            " so source -> filter/map and aggregate -> sink stay on one executor and the keyed edge crosses "
            "for the share in the third column (from the generator's definition and the runtime's routing "
            "function; (k-1)/k expected). Combinable: sequence source (4 key groups, seq % 4) -> filter "
            f"`value % 10 <> 0` -> 1 s tumbling count and sum keyed by `key` = seq % {SCALE_KEYS} -> file "
            f"sink. Whole records: sequence source -> map adding `account` = (seq div 4) % {SCALE_KEYS} -> "
            "file sink keyed by `account`, every record written as a JSON line on the consuming side: that "
            "formatting (Python) is paid on one executor too, so the whole-record ratios weigh the crossing "
            "against it. The topology's clock is set a day back, so the sources run backlogged, flat out, "
            f"while event times still span records / {EVENT_RATE:,.0f} seconds of windows. Every configuration "
            f"runs in {SCALE_ROUNDS} groups of executors (1 with `--quick`), started afresh and interleaved "
            "(1, 2, 4, 1, 2, 4, ... executors): a JVM's CPU per record repeats within a few percent over its "
            "runs but moved by up to 30 % from one JVM to the next, so one group per configuration could not "
            "tell 0.73x from 0.86x. Each executor group"
            " starts with no units; once every JVM is up and warm, each crossing runs with N records as a "
            f"warm-up until two runs in a row cost within 10 % of each other (at most {WARM_UP_RUNS}; 2 with "
            "`--quick`), then alternately with N and 2N records (N, 2N, N, ... ending on N) until the "
            f"marginal cost is known within 5 % (standard error) or {MEASURED_RUNS} runs were made (3 with "
            "`--quick`). A run is timed from the routing version that gives out its units to every sink "
            "unit's end-of-stream commit, and its output is checked against the generator's definition (count"
            " and sum of the kept values; lines written). CPU: user + system seconds (psutil) of every "
            "executor's process tree (Python, JVM, any Python workers, exited children included) and of the "
            "Valkey server; the harness process, which only polls Valkey, is not counted. Records per "
            "CPU-second = 1 / the mean over the groups of the least-squares slope of a group's runs' CPU "
            "against their records: the marginal cost, so what a run pays once (acquiring its units, planning"
            " its first steps) is the intercept and drops out, and the alternation cancels a linear drift; "
            "the +- is the standard error of that mean from the groups' spread. N is the same for every executor count "
            "of a crossing (third column): 8x more for the combinable crossing, whose runs otherwise cost "
            "tenths of a CPU-second apart. An executor's source units generate up to 8M records per step "
            "together while they stay in the JVM (the combinable crossing), so N is two source steps on one "
            "executor and one on each of two, 2N twice that: each marginal carries Spark's fixed cost per "
            "step as a long backlogged run pays it (on 4 executors N and 2N are one step each, which favours "
            "them). Records travelling whole come out of the JVM: up to 1M per step for an executor's units, "
            "and their receivers read at most 200k per step. Wall throughput = 2N / the 2N runs' "
            "mean wall time. Latency: the same pipelines with endless sources at 2,000 records/s on 2 "
            "executors; the sink latency histograms of both executors are read once the pipeline has caught "
            "up with the records that came due while it started (plus 3 s) and again later, and p50/p99 of "
            "the difference are interpolated within buckets; a window's result has event time = the window's "
            f"end. Each executor's Spark uses one core; this machine has {cores}, so 4 executors can only beat"
            " 2 on wall throughput with at least 4 cores."
        ),
    ]


# ---------------------------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smaller inputs, pause up to 10 MB, scale-out at 200k + 400k records",
    )
    parser.add_argument(
        "--records", type=int, default=None, help="records N of the one-executor runs (N and 2N)"
    )
    parser.add_argument("--seconds", type=float, default=None, help="Structured Streaming run time")
    only = parser.add_mutually_exclusive_group()
    only.add_argument(
        "--scale-out-only",
        action="store_true",
        help="only the scale-out curve and the latency across executors; the Runtime section "
        "keeps its other measurements",
    )
    only.add_argument(
        "--skip-scale-out",
        action="store_true",
        help="everything but the scale-out curve and the latency across executors, whose section is kept",
    )
    parser.add_argument(
        "--scale-records",
        type=int,
        default=None,
        help="records of the smaller run of each scale-out configuration (default 2M, quick 200k)",
    )
    args = parser.parse_args()
    command = shlex.join(["python", "bench/runtime.py", *sys.argv[1:]])
    # N takes two steps at the default source cap, so the marginal cost carries Spark's cost per step.
    records = args.records or (1_000_000 if args.quick else 2 * ExecutorConfig().max_source_records)
    sweep_records = min(records, 4_000_000)
    split_records = max(20_000, sweep_records // 10)
    seconds = args.seconds or (20.0 if args.quick else 60.0)
    sizes = [1_000, 100_000, 1_000_000, 10_000_000] + ([] if args.quick else [100_000_000])
    scale_records = args.scale_records or (200_000 if args.quick else SCALE_RECORDS)
    latency_seconds = 10.0 if args.quick else 30.0
    with EmbeddedValkey() as valkey, tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.skip_scale_out:
            kept = read_section("Runtime")
            scale_lines = kept[kept.index(SCALE_HEADING) :] if SCALE_HEADING in kept else []
        else:
            # First, while this process has no JVM of its own idling beside the executors measured.
            console.print(
                "[bold]scale-out[/bold] ("
                + "; ".join(
                    f"{c}: {scale_records * f:,} and {2 * scale_records * f:,} records"
                    for c, f in RECORDS_FACTOR.items()
                )
                + " per configuration, after warm-up runs)"
            )
            points = scale_out(valkey.url, work, scale_records, *((2, 3, 1) if args.quick else ()))
            console.print("[bold]latency across two executors[/bold]")
            across = crossing_latency(valkey.url, work, rate=2000.0, seconds=latency_seconds)
            scale_lines = scale_out_report(command, points, across, latency_seconds)
        if args.scale_out_only:
            kept = read_section("Runtime")
            kept = kept[: kept.index(SCALE_HEADING)] if SCALE_HEADING in kept else kept
            write_section("Runtime", [*kept, *([""] if kept else []), *scale_lines])
            return
        get_spark()
        console.print("[bold]1. throughput[/bold] (warm-up runs first)")
        for sub in ("ours", "split-warm", "split"):
            (work / sub).mkdir()
        ours_rate, ours_wall = steady(
            lambda i, n: ours(valkey.url, work / "ours", n, name=f"bench-ours-{i}"), records
        )
        console.print(
            f"  ours, one executor: {records:,} records in {ours_wall:.1f}s wall, "
            f"{ours_rate:,.0f} records per CPU-second"
        )
        sweep = []
        for unit_records in (25_000, 125_000, 500_000, 1_000_000):
            (work / f"sweep-{unit_records}").mkdir()
            rate, _ = ours(
                valkey.url,
                work / f"sweep-{unit_records}",
                sweep_records,
                name=f"bench-sweep-{unit_records}",
                unit_records=unit_records,
            )
            sweep.append((unit_records * KEY_GROUPS, rate))
            console.print(
                f"  step of {unit_records * KEY_GROUPS:,} records: {rate:,.0f} records per CPU-second"
            )
        # The split path (Arrow, Valkey, Parquet into Spark) runs other code than the sweep: warm it first.
        ours(valkey.url, work / "split-warm", split_records, name="bench-split-warm-up", split=True)
        split_rate, split_wall = ours(
            valkey.url, work / "split", split_records, name="bench-split", split=True
        )
        console.print(
            f"  ours, two executors: {split_records:,} records in {split_wall:.1f}s wall, "
            f"{split_rate:,.0f} records per CPU-second"
        )
        # A rate above what either engine sustains, so both run saturated (records per CPU-second at full load).
        ss_rate, ss_rows = structured_streaming(seconds, rate=5_000_000)
        console.print(f"  Structured Streaming: {ss_rows:,} records, {ss_rate:,.0f} records per CPU-second")
        console.print("[bold]2. batching[/bold]")
        single, batched = batching(valkey.url)
        console.print("[bold]3. migration pause[/bold]")
        pause_rows = pauses(valkey.url, work, sizes, repeats=3 if args.quick else 5)
        console.print("[bold]4. latency[/bold]")
        p50, p99 = latency(valkey.url, work, rate=2000.0, seconds=latency_seconds)
    report(
        command,
        records,
        sweep_records,
        split_records,
        ours_rate,
        split_rate,
        sweep,
        ss_rate,
        single,
        batched,
        pause_rows,
        p50,
        p99,
        scale_lines,
    )


def report(
    command,
    records,
    sweep_records,
    split_records,
    ours_rate,
    split_rate,
    sweep,
    ss_rate,
    single,
    batched,
    pause_rows,
    p50,
    p99,
    scale_lines,
) -> None:
    ratio, split_ratio = ours_rate / ss_rate, split_rate / ss_rate
    table = Table(title="runtime benchmark")
    for column in ("measure", "streamtopo", "baseline", "ratio", "target"):
        table.add_column(column)
    table.add_row(
        "records / CPU-second, one executor",
        f"{ours_rate:,.0f}",
        f"{ss_rate:,.0f} (Structured Streaming)",
        f"{ratio:.2f}x",
        ">= 1.0x",
    )
    table.add_row(
        "records / CPU-second, two executors",
        f"{split_rate:,.0f}",
        f"{ss_rate:,.0f} (Structured Streaming)",
        f"{split_ratio:.2f}x",
        "",
    )
    table.add_row(
        "transport records / s",
        f"{batched:,.0f} (512 / entry)",
        f"{single:,.0f} (1 / entry)",
        f"{batched / single:.1f}x",
        ">= 10x",
    )
    for nbytes, median, worst in pause_rows:
        table.add_row(
            f"pause, {nbytes:,} B state",
            f"p50 {median:.3f}s, max {worst:.3f}s",
            "",
            "",
            "<= 1 s" if nbytes <= 10_000_000 else "",
        )
    table.add_row("latency event time -> sink", f"p50 {p50:.2f}s, p99 {p99:.2f}s", "", "", "")
    console.print(table)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    img = ROOT / "docs" / "img" / "runtime_pause.png"
    img.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.loglog([r[0] for r in pause_rows], [r[1] for r in pause_rows], "o-", label="p50")
    ax.loglog([r[0] for r in pause_rows], [r[2] for r in pause_rows], "s--", label="max")
    ax.axhline(1.0, color="grey", lw=0.8, ls=":", label="1 s target")
    ax.set_xlabel("state bytes of the moving key group")
    ax.set_ylabel("pause (s)")
    ax.set_title("Hand-over pause against state size")
    ax.legend()
    fig.tight_layout()
    fig.savefig(img, dpi=120)

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.semilogx(
        [n for n, _ in sweep], [r / ss_rate for _, r in sweep], "o-", label="streamtopo, one executor"
    )
    ax.axhline(1.0, color="grey", lw=0.8, ls=":", label="Structured Streaming (same run)")
    ax.set_xlabel("records generated per step (all key groups)")
    ax.set_ylabel("records per CPU-second / Structured Streaming's")
    ax.set_title("Throughput against step size")
    ax.legend()
    fig.tight_layout()
    fig.savefig(ROOT / "docs" / "img" / "runtime_throughput.png", dpi=120)

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    lines = [
        *header(command, f"load average {psutil.getloadavg()[1]:.1f} (5 min) at the end of the run"),
        "",
        "| measure | streamtopo | baseline (same run) | ratio | target |",
        "|---|---|---|---|---|",
        (
            "| records per CPU-second, 1 s tumbling window count+sum per key, one executor "
            f"(marginal over runs of {records:,} and {2 * records:,} records) "
            f"| {ours_rate:,.0f} | {ss_rate:,.0f} (Structured Streaming, rate source, noop sink) | {ratio:.2f}x "
            f"| >= 1.0x {verdict(ratio >= 1)} |"
        ),
        *[
            (
                f"| the same, one run of {sweep_records:,} records, at most {n:,} generated per step "
                f"| {r:,.0f} | {ss_rate:,.0f} | "
                f"{r / ss_rate:.2f}x | |"
            )
            for n, r in sweep
        ],
        (
            f"| the same with the aggregate on a second executor ({split_records:,} records through Valkey) "
            f"| {split_rate:,.0f} | {ss_rate:,.0f} | {split_ratio:.2f}x | |"
        ),
        (
            f"| transport records per second | {batched:,.0f} (512 per entry) | {single:,.0f} (1 per entry) | "
            f"{batched / single:.1f}x | >= 10x {verdict(batched / single >= 10)} |"
        ),
        *[
            (
                f"| hand-over pause, {b:,} B of state | p50 {m:.3f} s, max {w:.3f} s | | | "
                f"{('<= 1 s ' + verdict(w <= 1)) if b <= 10_000_000 else ''} |"
            )
            for b, m, w in pause_rows
        ],
        (
            f"| end-to-end latency (event time to sink commit, 2,000 records/s) | p50 {p50:.2f} s, p99 {p99:.2f} s "
            "| | | |"
        ),
        "",
        "![throughput](img/runtime_throughput.png) ![pause](img/runtime_pause.png)",
        "",
        (
            "Reading: CPU-seconds include the JVM (psutil over the process tree); both engines run one local "
            "core (local[1]) and are saturated, and both are measured warm: Structured Streaming over a "
            "minute after its first batch, ours by its marginal cost over runs of N, 2N, N, 2N, N records "
            "after warm-up runs until two in a row cost within 10 %, so a run's start-up drops out as "
            "Structured Streaming's does (one run's total after a single warm-up, as measured until "
            "2026-11-26, moved between 2.6M and 5.7M records per CPU-second). In the one-executor run "
            "the generated records never leave the "
            "JVM: the source is a lazy `spark.range` frame, routing is Spark's Murmur3 in the same plan, and the "
            "aggregate's partials (a few rows per key and window) are all that reach Python. Spark's fixed "
            "cost per step (planning and code generation, about 0.3 s of CPU) dominates small steps, as the "
            "sweep shows; by default a backlogged source generates everything due in one step, up to 8M "
            "records for all its units (the first row: two and four steps a run, so the marginal cost carries "
            "Spark's cost per step). In the two-executor run (both executors threads of "
            "this process, after a warm-up run of the same split) the source's executor combines the records "
            "for the aggregate on the other one in its own JVM (partials per key and window, one Spark job) "
            "and only those rows cross Valkey; the far side merges them without a Spark job. A window's result "
            "has event time = the window's end, so the latency is how long after a "
            "window closed its result was committed (a step's duration plus punctuation delay). The pause runs "
            "from the donor's release to the receiver holding the decoded state."
        ),
        "",
        *scale_lines,
    ]
    write_section("Runtime", lines)


if __name__ == "__main__":
    main()
