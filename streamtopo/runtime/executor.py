"""The executor program: one process (one pod) running the units a routing table gives it.

    python -m streamtopo.runtime.executor --topology topology.yaml --routing routing.json \\
        --name ex-0 --transport redis://127.0.0.1:6379 --metrics-port 9400 [--output DIR]

Loop (one *step* = one micro-batch over every hosted unit):

1. routing: re-read the routing file when it changed; hand units it no longer gives us to their
   receivers once those are ready (the step in progress has committed), start waiting for units it now
   gives us (handover.py);
2. acquire waiting units whose donor released them (or died), loading their committed record;
3. read the hosted units' input streams (one pipelined XRANGE round trip; C-MR's policies choose which
   when the queues exceed a step's budget, scheduling.py), generate source records that are due (event
   time <= wall time since the topology's start) as a lazy Spark frame;
4. run the operators in topological order, each over all its hosted units at once. Output to units this
   executor hosts is handed over in memory, as a lazy Spark frame while it can (records never leave the
   JVM until a stateful operator folds them); everything else is materialised and appended to the
   destination unit's stream, cut into entries of the edge's batch size (Aeolus);
5. commit everything the step did in one atomic, epoch-fenced script (state_store.py), then write the
   file sinks' committed bytes (sinks.py) and update the metrics.

Any transport error or refused (fenced) commit discards the step: hosted units are reloaded from their
committed records (units taken away meanwhile are dropped) and the step is redone from there; a failure
inside a lazy chain redoes it eagerly (pandas between operators) so bad records can be isolated. The
exactly-once argument is in docs/exactly-once.md.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import signal
import threading
import time
import zlib
from collections import defaultdict
from dataclasses import dataclass, field
from functools import reduce
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np
import pandas as pd
import psutil
import pyarrow as pa
from pyspark.sql import DataFrame as SparkFrame
from pyspark.sql import functions as F

from streamtopo.planner.graph import partition_key, unit_edges
from streamtopo.planner.model import StreamTopology
from streamtopo.planner.routing import RoutingTable, parse_unit, unit_key
from streamtopo.runtime import sinks
from streamtopo.runtime.handover import Pause, acquisition_kind, pause_start
from streamtopo.runtime.metrics import ExecutorMetrics, Probe, SourcePace, serve
from streamtopo.runtime.operators import OperatorResult, RecordError, build_operator, combine_inputs
from streamtopo.runtime.operators.base import (
    INPUT,
    KG,
    SRC,
    TS,
    Batch,
    LazyFailure,
    clear_scratch,
    computed,
    is_spark,
    materialize,
    to_pandas,
    to_spark,
)
from streamtopo.runtime.operators.state import frame_to_ipc
from streamtopo.runtime.partitioning import route, route_column
from streamtopo.runtime.scheduling import DEFAULT_RECORD_BYTES, Backlog, Scheduler, UnitLoad
from streamtopo.runtime.state_store import Commit, Fenced, StateStore, UnitRecord
from streamtopo.runtime.transport import (
    CONNECTION_ERRORS,
    Entry,
    Keys,
    MalformedEntry,
    TransportUnavailable,
    connect,
    entry_fields,
    read_entries,
)

log = logging.getLogger("streamtopo.executor")

DST = "__dst"
"""Column of a lazy flow naming the consuming key group of each record."""

DEFAULT_BATCH_RECORDS = 512
"""Records per transport entry when neither the routing table (Aeolus) nor spec.batching.size says."""


def default_batch_records(spec, producer: str) -> int:
    """``spec.batching.size`` if set, else 512 records capped at ``batching.maxBytes`` (64 KB) worth."""
    if spec.batching.size:
        return spec.batching.size
    record_bytes = spec.operator(producer).record_bytes or 64
    return max(1, min(DEFAULT_BATCH_RECORDS, spec.batching.max_bytes // record_bytes))


@dataclass(frozen=True)
class ExecutorConfig:
    """Knobs of the loop; defaults suit local runs and tests."""

    max_entries: int = 256
    """Entries read per input stream per step."""
    handover_source_records: int = 20_000
    """The per-unit cap while units wait to be acquired, so a hand-over's pause stays short."""
    max_source_records: int = 500_000
    """Records one source unit generates per step at most. Generated records stay in the JVM, so a
    backlogged source catches up in large steps: Spark's fixed cost per step (planning, code
    generation, about 0.5 s of CPU) is then spread over many records."""
    punctuation_interval: float = 0.1
    """Minimum seconds between two record-less watermark entries to the same unit (+inf always goes)."""
    idle_sleep: float = 0.02
    heartbeat_ttl: float = 3.0
    handover_timeout: float = 20.0
    scheduling: str = "hybrid"
    """C-MR policy for backlogged input queues (runtime/scheduling.py): hybrid, odf, ydf, cto, mem, or all."""
    step_records: int = 200_000
    """Records a step reads from input streams at most once queues hold more (the scheduling budget)."""
    memory_limit: float = 512e6
    """Bytes of backlog plus state the hybrid policy treats as full (x = 1 in C-MR's Eq. 3.1)."""
    release_timeout: float = 90.0
    """Longest a donor keeps a unit for a receiver that is not ready yet (a pod that never starts)."""
    metrics_interval: float = 1.0


@dataclass
class Hosted:
    """A unit this executor owns: the epoch it acquired with, its committed record and live state."""

    op: str
    kg: int
    epoch: int
    rec: UnitRecord
    state: Any
    busy: float = 0.0
    """Seconds this executor spent on the unit since acquiring it (C-MR's MEM rank divides by it)."""

    @property
    def key(self) -> str:
        return unit_key((self.op, self.kg))


@dataclass
class Flow:
    """An operator's lazy output routed to a downstream operator whose units are all hosted here:
    ``frame`` has ``_kg`` (producing unit) and ``__dst`` (consuming unit). ``counts`` (records per
    (src, dst)) come from a count job, or, when ``None``, from the consumer's own job (an aggregate
    counts what it folds, so the records are computed once)."""

    producer: str
    frame: SparkFrame
    pairs: set[tuple[int, int]]
    counts: dict[tuple[int, int], int] | None
    producer_uncounted: bool = False
    """The producer's own output size is unknown too (a lazy map/filter): the consumer's count is it."""


@dataclass(frozen=True)
class LazyPart:
    """The records unit ``src`` sends unit ``dst``, still inside a :class:`Flow`."""

    flow: Flow
    src: int
    dst: int

    @property
    def n(self) -> int | None:
        """Records in the part; None until the consumer has counted a deferred flow."""
        return None if self.flow.counts is None else self.flow.counts.get((self.src, self.dst), 0)

    def pandas(self) -> pd.DataFrame:
        frame = self.flow.frame.where((F.col(KG) == self.src) & (F.col(DST) == self.dst)).drop(DST)
        return materialize(frame)


@dataclass
class Delivery:
    """An entry handed to a local consumer in memory instead of through its stream."""

    producer: str
    seq: int
    watermark: float
    records: pd.DataFrame | LazyPart | None
    stream: str

    @property
    def n(self) -> int | None:
        return part_size(self.records)


@dataclass
class Produced:
    """What one operator's hosted units produced in a step: one frame for all of them (``_kg`` = the
    producing unit), and per unit (records out, or None while a lazy output is uncounted; watermark)."""

    frame: Batch | None
    units: dict[str, tuple[int | None, float]]
    work: dict[str, int]
    """Records each unit handled (its input, a source's output): splits the operator's busy time."""
    _pandas: pd.DataFrame | None = None

    def pandas(self) -> pd.DataFrame | None:
        if self._pandas is None and self.frame is not None:
            self._pandas = materialize(self.frame)
        return self._pandas


@dataclass
class StepOutcome:
    work: bool = False
    sink_writes: list[tuple[Path, int, bytes]] = field(default_factory=list)
    console: list[str] = field(default_factory=list)


class Executor:
    """The executor of one topology; :meth:`run` loops until ``stop`` is set."""

    def __init__(self, topology: StreamTopology, routing_path: Path, name: str, transport_url: str,
                 *, metrics_port: int = 0, output_dir: Path | None = None, cpu: float = 1.0,
                 config: ExecutorConfig | None = None):
        self.topology = topology
        self.spec = topology.spec
        self.name = name
        self.routing_path = Path(routing_path)
        self.transport_url = transport_url
        self.output_dir = Path(output_dir) if output_dir else None
        self.config = config or ExecutorConfig()
        self.instance = f"{name}-{os.getpid()}-{secrets.token_hex(3)}"
        # Operators are built before anything starts: a UDF that does not import fails here, clearly.
        self.operators = {op.name: build_operator(op, self.spec) for op in self.spec.operators}
        dag = nx.DiGraph()
        dag.add_nodes_from(op.name for op in self.spec.operators)
        dag.add_edges_from((u, op.name) for op in self.spec.operators for u in op.inputs)
        self.order = list(nx.lexicographical_topological_sort(dag))
        self.downstream = {n: sorted(dag.successors(n)) for n in self.order}
        self.scheduler = Scheduler(self.downstream, self.config.scheduling, self.config.step_records,
                                   self.config.memory_limit)
        self._dests: dict[str, dict[int, dict[str, list[int]]]] = {}
        self._producers: dict[str, dict[int, list[str]]] = {}
        self.keys = Keys(topology.metadata.name)
        self.metrics = ExecutorMetrics(topology.metadata.name, name)
        self.metrics.exec(self.metrics.capacity).set(cpu)
        self.metrics_port = metrics_port
        self.hosted: dict[str, Hosted] = {}
        self.waiting: dict[str, float] = {}
        self.leaving: dict[str, tuple[str | None, float]] = {}
        """Units the routing moved away, still run here until their receiver is ready (receiver, since)."""
        self._warm = False
        self.routing: RoutingTable | None = None
        self._routing_mtime = 0.0
        self._last_punct: dict[tuple[str, str], float] = {}
        self._last_metrics = 0.0
        self._last_loop = time.time()
        self._connected = False
        self.client = None
        self.store: StateStore | None = None
        self.t0 = 0.0
        self.spark = None
        self.server = None
        self._closed = threading.Event()
        self.eager = False
        """Set after a lazy step failed: the redo materialises every operator's output (see LazyFailure)."""

    # ------------------------------------------------------------------------------------- topology

    def dests(self, op: str, kg: int) -> dict[str, list[int]]:
        """Downstream operator -> key groups unit (op, kg) feeds (planner.graph.unit_edges)."""
        if op not in self._dests:
            table: dict[int, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
            for v in self.downstream[op]:
                for i, j, _ in unit_edges(self.spec, op, v):
                    table[i][v].append(j)
            self._dests[op] = table
        return self._dests[op][kg]

    def producers(self, op: str, kg: int) -> list[str]:
        """Units whose watermarks bound unit (op, kg)'s: every upstream unit with an edge into it."""
        if op not in self._producers:
            table: dict[int, list[str]] = defaultdict(list)
            for u in self.spec.operator(op).inputs:
                for i, j, _ in unit_edges(self.spec, u, op):
                    table[j].append(unit_key((u, i)))
            self._producers[op] = table
        return self._producers[op][kg]

    def batch_records(self, producer: str, consumer: str) -> int:
        """Records per entry on ``producer->consumer``: the routing table's (Aeolus), else spec/default."""
        if self.routing and (n := self.routing.batch_sizes.get(f"{producer}->{consumer}")):
            return max(1, n)
        return default_batch_records(self.spec, producer)

    # ---------------------------------------------------------------------------------------- start

    def start(self) -> None:
        """Connect (with retries), start the exporter, the heartbeat and Spark."""
        from streamtopo.runtime.spark import get_spark

        self.client = connect(self.transport_url, log=log.warning, password=transport_password())
        self.store = StateStore(self.client, self.keys)
        self.client.set(self.keys.clock, repr(time.time()), nx=True)
        self.t0 = float(self.client.get(self.keys.clock))
        self._connected = True
        self.server = serve(self.metrics, Probe(self._healthy, self._ready), self.metrics_port)
        self.store.heartbeat(self.instance, self.config.heartbeat_ttl)
        threading.Thread(target=self._heartbeat, name="heartbeat", daemon=True).start()
        self.spark = get_spark()
        # Warm the JVM (class loading, code generation) before taking units: the first job costs seconds,
        # and a unit should not pause for it after a hand-over or a restart.
        warm = pd.DataFrame({KG: pd.Series([0, 1], dtype="int32"), TS: [0.0, 1.0], "v": [1, 2]})
        to_pandas(to_spark(self.spark, warm).groupBy(KG).agg({"v": "sum", TS: "max"}))
        self._warm = True

    def _healthy(self) -> bool:
        return time.time() - self._last_loop < 120.0

    def _ready(self) -> bool:
        return self._connected and self.routing is not None and not self.waiting

    def _heartbeat(self) -> None:
        client = None
        while not self._closed.is_set():
            try:
                client = client or connect(self.transport_url, attempts=1, password=transport_password())
                ttl = int(self.config.heartbeat_ttl * 1000)
                client.set(self.keys.heartbeat(self.instance), b"1", px=ttl)
                if self._warm:
                    client.set(self.keys.ready(self.name), self.instance.encode(), px=ttl)
            except (TransportUnavailable, *CONNECTION_ERRORS):
                client = None
            time.sleep(self.config.heartbeat_ttl / 4)

    # ----------------------------------------------------------------------------------------- loop

    def run(self, stop: threading.Event, release: bool = True) -> None:
        """Step until ``stop`` is set, then :meth:`close`."""
        delay = 0.25
        while not stop.is_set():
            self._last_loop = time.time()
            try:
                self._apply_routing()
                self._release_leaving()
                self._acquire_waiting()
                outcome = self.step()
                delay = 0.25
                if not outcome.work:
                    time.sleep(self.config.idle_sleep)
            except Fenced as error:
                log.warning("%s: commit refused, reloading: %s", self.name, error)
                self._recover()
            except LazyFailure as error:
                log.warning("%s: a lazy step failed (%s); redoing it eagerly to isolate the records", self.name, error)
                self._recover()
                self.eager = True
            except CONNECTION_ERRORS as error:
                self._connected = False
                log.warning("%s: transport lost (%s); retrying in %.2gs", self.name, error, delay)
                stop.wait(delay)
                delay = min(5.0, delay * 2)
                try:
                    self.client.ping()
                    self._connected = True
                    self._recover()
                    log.warning("%s: transport back, resumed from the last commit", self.name)
                except CONNECTION_ERRORS:
                    pass
            self._update_metrics()
        clear_scratch()
        self.close(release)

    def close(self, release: bool = True) -> None:
        """Stop heartbeating and serving; ``release`` hands every unit over at once (a clean shutdown).

        Without ``release`` the units stay owned until the heartbeat expires, as after a crash.
        """
        if release:
            try:
                for key, unit in list(self.hosted.items()):
                    self.store.release(key, unit.epoch)
                    self.hosted.pop(key)
            except (Fenced, *CONNECTION_ERRORS) as error:
                log.warning("%s: could not release every unit at shutdown: %s", self.name, error)
        self._closed.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    # ------------------------------------------------------------------------------------ hand-over

    def _apply_routing(self) -> None:
        try:
            mtime = self.routing_path.stat().st_mtime
        except FileNotFoundError:
            return
        if mtime == self._routing_mtime and self.routing is not None:
            return
        table = RoutingTable.from_json(self.routing_path.read_text())
        self._routing_mtime = mtime
        if self.routing is not None and table.version <= self.routing.version:
            return
        self.routing = table
        self.metrics.exec(self.metrics.routing_version).set(table.version)
        mine = {unit_key(u) for u in table.units_of(self.name)}
        now = time.time()
        for key in sorted(set(self.hosted) - mine):
            self.leaving[key] = (table.units.get(key), self.leaving.get(key, (None, now))[1])
        for key in mine & set(self.leaving):
            del self.leaving[key]
        self.waiting = {k: self.waiting.get(k, now) for k in sorted(mine - set(self.hosted))}

    def _release_leaving(self) -> None:
        """Hand over units the routing moved away once their receiver is ready (its JVM warm), so a unit
        moving to a starting executor keeps running here meanwhile; the step before has committed."""
        now = time.time()
        for key, (receiver, since) in list(self.leaving.items()):
            ready = receiver is None or self.client.exists(self.keys.ready(receiver))
            if not ready and now - since < self.config.release_timeout:
                continue
            del self.leaving[key]
            unit = self.hosted.pop(key, None)
            if unit is None:
                continue
            try:
                self.store.release(key, unit.epoch)
                self.metrics.migrations.labels(self.keys.topology, self.name, "donor").inc()
            except Fenced:
                pass
            self.metrics.forget_unit(unit.op, unit.kg)

    def _acquire_waiting(self) -> None:
        for key, since in list(self.waiting.items()):
            ownership = self.store.ownership(key)
            kind = acquisition_kind(ownership, self.instance, self.store.alive(ownership.owner),
                                    time.time() - since, self.config.handover_timeout)
            if kind is None:
                continue
            epoch, rec = self.store.acquire(key, self.instance)
            op, kg = parse_unit(key)
            unit = Hosted(op, kg, epoch, rec or UnitRecord(), None)
            self._load(unit)
            self.hosted[key] = unit
            # Export the unit's busy counter at once (0 while it gets no input): the controller counts a
            # unit as measured when it has a busy series, and an idle unit is a measurement too.
            self.metrics.unit(self.metrics.busy, op, kg)
            del self.waiting[key]
            if kind != "fresh":
                pause = Pause(key, time.time() - pause_start(kind, ownership, since), self.name, kind,
                              len(unit.rec.state))
                self.client.rpush(self.keys.pauses, pause.to_json())
                self.metrics.exec(self.metrics.pause).observe(pause.seconds)
                self.metrics.migrations.labels(self.keys.topology, self.name, "receiver").inc()

    def _load(self, unit: Hosted) -> None:
        """Live state from the committed record; a file sink's file brought to its committed content."""
        unit.state = self.operators[unit.op].decode_state(unit.rec.state) if unit.rec.state else None
        path = self._sink_path(unit.op, unit.kg)
        if path is not None:
            sinks.redo(path, unit.rec.sink_len, unit.rec.pending)

    def _recover(self) -> None:
        """Back to the last commit: reload every hosted unit; units fenced meanwhile wait to be re-acquired."""
        self._last_punct.clear()
        for key, unit in list(self.hosted.items()):
            epoch, rec = self.store.load(key)
            if epoch != unit.epoch:
                self.hosted.pop(key)
                self.metrics.forget_unit(unit.op, unit.kg)
                if self.routing and key in {unit_key(u) for u in self.routing.units_of(self.name)}:
                    self.waiting.setdefault(key, time.time())
                continue
            unit.rec = rec or UnitRecord()
            self._load(unit)

    def _sink_path(self, op: str, kg: int) -> Path | None:
        operator = self.spec.operator(op)
        if operator.kind == "sink" and operator.sink.file is not None and self.output_dir is not None:
            return sinks.sink_file(self.output_dir, operator, kg)
        return None

    # ----------------------------------------------------------------------------------------- step

    def step(self) -> StepOutcome:
        """One micro-batch over every hosted unit, committed atomically."""
        clear_scratch()  # Parquet hand-offs of the previous step: no lazy frame refers to them any more
        outcome = StepOutcome()
        commit = Commit()
        touched: set[str] = set()
        local: dict[str, list[Delivery]] = defaultdict(list)
        inputs = self._read_inputs()
        now = time.time()
        by_op: dict[str, list[Hosted]] = defaultdict(list)
        for unit in self.hosted.values():
            by_op[unit.op].append(unit)
        for op in self.order:
            units = sorted(by_op.get(op, []), key=lambda u: u.kg)
            if not units:
                continue
            started = time.perf_counter()
            if self.spec.operator(op).kind == "source" and self.spec.operator(op).source.generator is not None:
                produced = self._generate(units, now)
            else:
                produced = self._consume(op, units, inputs, local, commit, outcome)
            if self.spec.operator(op).kind != "sink":
                self._emit(op, produced, local, commit, now)
            busy = time.perf_counter() - started
            # The operator ran once for all its units: split the time by records (+1 for the call itself).
            weights = {key: 1 + produced.work.get(key, 0) for key in produced.units}
            for key in produced.units:
                unit = self.hosted[key]
                touched.add(key)
                share = busy * weights[key] / sum(weights.values())
                unit.busy += share
                self.metrics.unit(self.metrics.busy, unit.op, unit.kg).inc(share)
        if not touched:
            return outcome
        outcome.work = True
        for key in sorted(touched):
            unit = self.hosted[key]
            if self.operators[unit.op].stateful or self.spec.operator(unit.op).kind == "source":
                unit.rec.state = self.operators[unit.op].encode_state(unit.state)
            commit.units.append((key, unit.epoch, unit.rec.encode()))
        self.store.commit(commit)
        self.eager = False
        for path, offset, data in outcome.sink_writes:
            sinks.write_at(path, offset, data)
        for line in outcome.console:
            print(line, flush=True)
        return outcome

    def _read_inputs(self) -> dict[str, list[tuple[str, Entry]]]:
        """Every hosted unit's new entries, in one pipelined round trip; when the queues hold more than a
        step's budget, C-MR's policy decides how many entries each stream gives (runtime/scheduling.py)."""
        owners = [(key, stream) for key, unit in self.hosted.items() for stream in self._input_streams(unit)]
        counts = self._allotments(owners)
        requests = [(stream, self.hosted[key].rec.offsets.get(stream, "0-0"), counts[stream])
                    for key, stream in owners if counts[stream] > 0]
        out: dict[str, list[tuple[str, Entry]]] = defaultdict(list)
        kept = [(key, stream) for key, stream in owners if counts[stream] > 0]
        for (key, stream), entries in zip(kept, read_entries(self.client, requests)):
            out[key].extend((stream, e) for e in entries)
        return out

    def _allotments(self, owners: list[tuple[str, str]]) -> dict[str, int]:
        """Entries to read per stream: all (up to ``max_entries``) unless a policy must choose."""
        internal = [(key, stream) for key, stream in owners if stream.startswith(self.keys.prefix)]
        counts = {stream: self.config.max_entries for _, stream in owners}
        if self.config.scheduling == "all" or not internal:
            return counts
        pipe = self.client.pipeline(transaction=False)
        pipe.hmget(self.keys.backlog, [stream for _, stream in internal])
        for key, stream in internal:
            after = self.hosted[key].rec.offsets.get(stream, "0-0")
            pipe.xrange(stream, min=f"({after}" if after != "0-0" else "-", max="+", count=1)
            pipe.xlen(stream)
        replies = pipe.execute()
        queued, rest = replies[0], replies[1:]
        backlogs: dict[str, list[Backlog]] = defaultdict(list)
        for i, (key, stream) in enumerate(internal):
            first, length = rest[2 * i], rest[2 * i + 1]
            front = int(first[0][0].split(b"-")[0]) / 1000 if first else None
            backlogs[key].append(Backlog(stream, max(0, int(queued[i] or 0)), int(length), front))
        loads = [self._load_of(self.hosted[key]) for key in backlogs]
        counts.update(self.scheduler.entries(loads, backlogs, self.config.max_entries))
        if self.scheduler.last_policy is not None:
            self.metrics.scheduling.labels(self.keys.topology, self.name, self.scheduler.last_policy).inc()
        return counts

    def _load_of(self, unit: Hosted) -> UnitLoad:
        op = self.spec.operator(unit.op)
        in_bytes = max((self.spec.operator(u).record_bytes or DEFAULT_RECORD_BYTES for u in op.inputs),
                       default=DEFAULT_RECORD_BYTES)
        local = sum(1 for v in self.downstream[unit.op] if any(h.op == v for h in self.hosted.values()))
        return UnitLoad(unit.key, unit.op, in_bytes, (op.record_bytes or DEFAULT_RECORD_BYTES) * local,
                        unit.rec.records_in, unit.rec.records_out, unit.busy, len(unit.rec.state))

    def _input_streams(self, unit: Hosted) -> list[str]:
        op = self.spec.operator(unit.op)
        if op.kind == "source":
            return [self.keys.sink_stream(op.source.stream)] if op.source.stream is not None else []
        return [self.keys.stream(u, unit.op, unit.kg) for u in op.inputs]

    def _generate(self, units: list[Hosted], now: float) -> Produced:
        """Records whose event time has come: seq/rate <= now - t0 (sources are paced by wall time).

        One lazy Spark frame for all the units; it stays in the JVM unless a consumer needs pandas."""
        operator = self.operators[units[0].op]
        source = self.spec.operator(units[0].op).source
        k = self.spec.key_groups_of(units[0].op)
        paces = {u.kg: SourcePace(self.t0, source.rate_per_second, u.kg, k, source.count) for u in units}
        # While units wait to be acquired, short steps: a released unit pauses until our next step ends.
        cap = self.config.max_source_records if not self.waiting else self.config.handover_source_records
        requests = []
        for unit in units:
            if unit.rec.watermark == math.inf:
                continue
            due = max(0, min(paces[unit.kg].due(now) - unit.rec.emitted, cap))
            requests.append((unit.kg, unit.state, due))
        frame, emitted = operator.generate(self.spark, requests) if requests else (None, {})
        if frame is not None and self.eager:
            frame = materialize(frame)
        out: dict[str, tuple[int | None, float]] = {}
        for unit in units:
            if unit.kg not in emitted:
                continue
            n, state, wm = emitted[unit.kg]
            if n == 0 and wm == unit.rec.watermark:
                continue
            unit.state = state
            unit.rec.emitted += n
            unit.rec.records_out += n
            unit.rec.watermark = wm
            self.metrics.unit(self.metrics.records_out, unit.op, unit.kg).inc(n)
            out[unit.key] = (n, wm)
        for unit in units:  # backlog, oldest age and arrivals are read at scrape time (metrics.SourcePace)
            self.metrics.source_progress(unit.op, unit.kg, paces[unit.kg], unit.rec.emitted)
        return Produced(frame, out, {key: n for key, (n, _) in out.items()})

    def _consume(self, op: str, units: list[Hosted], inputs: dict[str, list[tuple[str, Entry]]],
                 local: dict[str, list[Delivery]], commit: Commit, outcome: StepOutcome) -> Produced:
        """Apply each unit's new entries (dedup by producer sequence), run the operator once for all."""
        operator = self.operators[op]
        spec_op = self.spec.operator(op)
        parts: dict[str, list[pd.DataFrame]] = defaultdict(list)
        lazy: dict[int, tuple[str, Flow, set[tuple[int, int]]]] = {}
        received: dict[str, int] = defaultdict(int)
        tables: dict[tuple[str, int], list[pa.Table]] = defaultdict(list)
        active: list[Hosted] = []
        now = time.time()
        named = spec_op.kind == "source"  # a stream source reads a user-named stream it shares
        for unit in units:
            got, oldest = False, None
            for stream, entry in inputs.get(unit.key, []):
                unit.rec.offsets[stream] = entry.id
                oldest = entry.millis / 1000 if oldest is None else oldest
                if named:
                    got = True  # the offset moved: commit it even when the entry is another unit's
                    if not self._take_named(unit, entry):
                        continue
                    if entry.producer == "" or self._accept(unit, entry.producer, entry.seq, entry.watermark):
                        records = self._named_records(unit, entry, commit)
                        if records is not None and len(records):
                            parts[op].append(_at(records, unit.kg))
                            received[unit.key] += len(records)
                    continue
                got = True
                commit.trims[stream] = entry.id
                commit.incr(self.keys.backlog, stream, -entry.count)
                if self._accept(unit, entry.producer, entry.seq, entry.watermark) and entry.data:
                    tables[(_input_of(stream), unit.kg)].append(entry.table())
                    received[unit.key] += entry.count
            for d in local.pop(unit.key, []):
                if d.seq == unit.rec.seq_in.get(d.producer, 0) + 1:
                    got = True
                    self._accept(unit, d.producer, d.seq, d.watermark)
                    received[unit.key] += d.n or 0  # a deferred flow is counted by the operator below
                    if isinstance(d.records, LazyPart):
                        lazy.setdefault(id(d.records.flow), (_input_of(d.stream), d.records.flow, set()))[2].add(
                            (d.records.src, d.records.dst))
                    elif d.records is not None and len(d.records):
                        parts[_input_of(d.stream)].append(_at(d.records, unit.kg))
                else:
                    # Older entries of this producer still wait in the stream: keep its order by going there.
                    records = d.records.pandas() if isinstance(d.records, LazyPart) else d.records
                    self._append(commit, d.stream, d.producer, d.seq, d.watermark, records)
            self.metrics.unit(self.metrics.oldest_age, op, unit.kg).set(max(0.0, now - oldest) if oldest else 0.0)
            if got:
                active.append(unit)
        for (name, kg), batch_tables in tables.items():
            # One conversion to pandas per unit and input: per entry it costs about a millisecond.
            parts[name].append(_at(pa.concat_tables(batch_tables, promote_options="default").to_pandas(), kg))
        if not active:
            return Produced(None, {}, {})
        for unit in active:
            producers = list(unit.rec.wm_in) if named else self.producers(op, unit.kg)
            wm = min((unit.rec.wm_in.get(p, -math.inf) for p in producers), default=-math.inf)
            unit.rec.watermark = max(unit.rec.watermark, wm)
        flows = [(name, _consumed(flow, pairs)) for name, flow, pairs in lazy.values()]
        if flows and operator.lazy_input:
            frames = [frame for _, frame in flows]
            frames += [to_spark(self.spark, pd.concat(p, ignore_index=True)) for p in parts.values()]
            batch: Batch = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), frames)
        else:
            for name, frame in flows:
                parts[name].append(materialize(frame))
            batch = self._pandas_batch(spec_op.kind, parts)
        result = self._process(operator, batch, active, commit)
        for _, flow, pairs in lazy.values():
            if flow.counts is None:
                self._counted(op, flow, pairs, result.input_counts or {}, received)
        for unit in active:
            unit.rec.records_in += received[unit.key]
            self.metrics.unit(self.metrics.records_in, op, unit.kg).inc(received[unit.key])
        output = result.output
        if is_spark(output):
            return Produced(output, {u.key: (None, u.rec.watermark) for u in active}, dict(received))
        out: dict[str, tuple[int | None, float]] = {}
        groups = dict(iter(output.groupby(KG))) if len(output) else {}
        for unit in active:
            df = groups.get(unit.kg)
            n = 0 if df is None else len(df)
            unit.rec.records_out += n
            self.metrics.unit(self.metrics.records_out, op, unit.kg).inc(n)
            if spec_op.kind == "sink":
                self._sink(unit, df, commit, outcome)
            out[unit.key] = (n, unit.rec.watermark)
        return Produced(output, out, dict(received), _pandas=output)

    def _counted(self, op: str, flow: Flow, pairs: set[tuple[int, int]], counts: dict[tuple[int, int], int],
                 received: dict[str, int]) -> None:
        """Book a deferred flow's sizes once its consumer has counted it: records in and out, kg traffic."""
        flow.counts = {pair: counts.get(pair, 0) for pair in pairs}
        produced: dict[int, int] = defaultdict(int)
        for (src, dst), n in flow.counts.items():
            received[unit_key((op, dst))] += n
            produced[src] += n
            if n:
                self.metrics.kg_edge(flow.producer, src, op, dst).inc(n)
        for src, n in produced.items():
            if flow.producer_uncounted and (unit := self.hosted.get(unit_key((flow.producer, src)))) is not None:
                self._count_out(unit, n)

    @staticmethod
    def _pandas_batch(kind: str, parts: dict[str, list[pd.DataFrame]]) -> pd.DataFrame:
        frames = {name: pd.concat(p, ignore_index=True) for name, p in parts.items()}
        if kind == "join":
            batch = combine_inputs(frames) if frames else pd.DataFrame({KG: [], TS: [], INPUT: []})
        else:
            batch = pd.concat(frames.values(), ignore_index=True) if frames else pd.DataFrame(
                {KG: pd.Series(dtype="int32"), TS: pd.Series(dtype="float64")})
        if len(batch):
            batch[KG] = batch[KG].astype("int32")
        return batch

    def _take_named(self, unit: Hosted, entry: Entry) -> bool:
        """Whether this unit of a stream source takes ``entry``: the stream's entries are split over the
        source's key groups by producer (keeping each producer's order in one unit), external entries by
        id. A sink's entries also say how many units write the stream: the unit then waits for the
        watermarks of those it owns (``*`` marks the set as known; alone it means +inf)."""
        k = self.spec.key_groups_of(unit.op)
        if entry.producers is not None and "*" not in unit.rec.wm_in:
            sink = entry.producer.rsplit("/", 1)[0]
            unit.rec.wm_in["*"] = math.inf
            for i in range(entry.producers):
                name = unit_key((sink, i))
                if zlib.crc32(name.encode()) % k == unit.kg:
                    unit.rec.wm_in.setdefault(name, -math.inf)
        return zlib.crc32((entry.producer or entry.id).encode()) % k == unit.kg

    def _named_records(self, unit: Hosted, entry: Entry, commit: Commit) -> pd.DataFrame | None:
        """An entry's records; a malformed external entry goes to the dead-letter stream (nothing else
        stops). External entries advance the watermark to the latest event time seen."""
        try:
            records = entry.records()
        except MalformedEntry as error:
            self._dead_letter(commit, unit.op, "source.stream", str(error), 1,
                              [b"entry", entry.id.encode(), b"raw", entry.json or b""])
            return None
        if entry.producer == "" and records is not None and len(records):
            unit.rec.wm_in[""] = max(unit.rec.wm_in.get("", -math.inf), float(records[TS].max()))
        return records

    def _dead_letter(self, commit: Commit, operator: str, field: str, error: str, n: int,
                     payload: list[bytes]) -> None:
        """Send ``n`` records (``payload``: the records, or the raw entry) to the dead-letter stream in the
        step's commit, naming the operator, field and error; processing goes on without them."""
        commit.appends.append((self.keys.dead_letters, [
            b"operator", operator.encode(), b"executor", self.name.encode(), b"error", error.encode(),
            b"field", field.encode(), b"n", str(n).encode(), *payload]))
        self.metrics.dead_letters.labels(self.keys.topology, self.name, operator).inc(n)
        log.warning("%s: %d record(s) to the dead-letter stream (%s): %s", operator, n, field, error)

    def _accept(self, unit: Hosted, producer: str, seq: int, watermark: float) -> bool:
        """Apply entry ``seq`` of ``producer`` unless already applied (a re-sent entry is dropped)."""
        last = unit.rec.seq_in.get(producer, 0)
        if seq <= last:
            return False
        if seq > last + 1:
            log.warning("%s: entry %d of %s follows %d (gap)", unit.key, seq, producer, last)
        unit.rec.seq_in[producer] = seq
        unit.rec.wm_in[producer] = max(unit.rec.wm_in.get(producer, -math.inf), watermark)
        return True

    def _process(self, operator, batch: Batch, active: list[Hosted], commit: Commit) -> OperatorResult:
        """Run the operator; records that make it raise go to the dead-letter stream, the rest goes on."""
        states = {u.kg: u.state for u in active}
        watermarks = {u.kg: u.rec.watermark for u in active}
        if not is_spark(batch):
            batch = batch.reset_index(drop=True)
        while True:
            try:
                result = operator.process(self.spark, batch, states, watermarks)
                break
            except RecordError as error:
                bad = batch.index.intersection(error.rows.index)
                rows = batch.loc[bad] if len(bad) else batch
                self._dead_letter(commit, operator.name, error.field, error.error, len(rows),
                                  [b"d", frame_to_ipc(rows)])
                batch = batch.drop(index=rows.index).reset_index(drop=True)
        for unit in active:
            if unit.kg in result.states:
                unit.state = result.states[unit.kg]
        return result

    def _sink(self, unit: Hosted, df: pd.DataFrame | None, commit: Commit, outcome: StepOutcome) -> None:
        sink = self.spec.operator(unit.op).sink
        operator = self.operators[unit.op]
        if df is not None and len(df):
            latency = self.metrics.sink_latency.labels(self.keys.topology, self.name, unit.op)
            for lag in time.time() - self.t0 - df[TS].to_numpy(dtype=float):
                latency.observe(max(0.0, lag))
        path = self._sink_path(unit.op, unit.kg)
        if path is not None:
            data = sinks.lines_bytes(operator.format(df)) if df is not None and len(df) else b""
            unit.rec.pending = data
            unit.rec.sink_len += len(data)
            if data:
                outcome.sink_writes.append((path, unit.rec.sink_len - len(data), data))
        elif sink.stream is not None:
            # Records, or a punctuation when the watermark moved (readers' windows need it to fire).
            target = self.keys.sink_stream(sink.stream)
            sent = unit.rec.wm_out.get(target, -math.inf)
            wm = unit.rec.watermark
            if self._silent(unit.key, target, 0 if df is None else len(df), wm, sent, time.time()):
                return
            seq = unit.rec.seq_out.get(target, 0) + 1
            unit.rec.seq_out[target] = seq
            unit.rec.wm_out[target] = max(sent, wm)
            records = df if df is not None and len(df) else None
            commit.appends.append((target, entry_fields(unit.key, seq, wm, records,
                                                        producers=self.spec.key_groups_of(unit.op))))
        elif sink.console is not None and df is not None and len(df):
            outcome.console.extend(operator.format_console(df))

    # ---------------------------------------------------------------------------------------- output

    def _emit(self, op: str, produced: Produced, local: dict[str, list[Delivery]], commit: Commit,
              now: float) -> None:
        """Route an operator's output to its downstream units, in entries of the edge's batch size.

        A lazy output whose consumers are all hosted here stays in the JVM (one Spark job counts it per
        unit pair); anything bound for another executor is materialised once and cut into entries."""
        units = [self.hosted[key] for key in produced.units]
        for v in self.downstream[op]:
            dest_key, dest_k = partition_key(self.spec, v), self.spec.key_groups_of(v)
            wanted = {unit_key((v, j)) for u in units for j in self.dests(op, u.kg).get(v, [])}
            parts: dict[tuple[int, int], pd.DataFrame | LazyPart] = {}
            if is_spark(produced.frame) and wanted <= set(self.hosted):
                frame = produced.frame.withColumn(DST, route_column(dest_key, dest_k, F.col(KG)).cast("int"))
                if self._counts_for(op, v):
                    pairs = {(u.kg, j) for u in units for j in self.dests(op, u.kg).get(v, [])}
                    flow = Flow(op, frame, pairs, None, any(produced.units[u.key][0] is None for u in units))
                else:
                    rows = computed(lambda frame=frame: frame.groupBy(KG, DST).count().collect())
                    counts = {(int(r[0]), int(r[1])): int(r[2]) for r in rows}
                    flow = Flow(op, frame, set(counts), counts)
                parts = {pair: LazyPart(flow, *pair) for pair in flow.pairs}
            elif (records := produced.pandas()) is not None and len(records):
                for src, part in records.groupby(KG):
                    dest = route(part, dest_key, dest_k, int(src))
                    parts.update({(int(src), int(j)): rows for j, rows in part.groupby(dest)})
            for unit in units:
                n_out, wm = produced.units[unit.key]
                sizes = [part_size(p) for (src, _), p in parts.items() if src == unit.kg]
                if n_out is None and None not in sizes:  # a lazy output learns its size here
                    self._count_out(unit, sum(sizes))
                    produced.units[unit.key] = (sum(sizes), wm)
                expected = self.dests(op, unit.kg).get(v, [])
                mine = {j: p for (src, j), p in parts.items() if src == unit.kg}
                for j in sorted(set(expected) | set(mine)):
                    self._deliver(unit, v, j, mine.get(j), wm, local, commit, now)

    def _counts_for(self, op: str, v: str) -> bool:
        """Whether ``v`` counts ``op``'s lazy records itself: a single-input consumer that reports its
        input counts (an aggregate), the only consumer of ``op`` (so the producer's output is counted once)."""
        return (self.operators[v].counts_input and len(self.spec.operator(v).inputs) == 1
                and self.downstream[op] == [v])

    def _count_out(self, unit: Hosted, n: int) -> None:
        unit.rec.records_out += n
        self.metrics.unit(self.metrics.records_out, unit.op, unit.kg).inc(n)

    def _silent(self, producer: str, target: str, n: int, wm: float, sent: float, now: float) -> bool:
        """True when an entry would say nothing new (no records, watermark not past what was sent) or be
        a punctuation moments after the last one (``+inf`` always goes); else notes the send time."""
        recent = now - self._last_punct.get((producer, target), 0.0) < self.config.punctuation_interval
        if n == 0 and (wm <= sent or (wm != math.inf and recent)):
            return True
        self._last_punct[(producer, target)] = now
        return False

    def _deliver(self, unit: Hosted, v: str, j: int, part: pd.DataFrame | LazyPart | None, wm: float,
                 local: dict[str, list[Delivery]], commit: Commit, now: float) -> None:
        """Unit ``unit``'s records and watermark for unit (v, j): in memory if hosted here, else entries."""
        dkey = unit_key((v, j))
        n = part_size(part)
        sent = unit.rec.wm_out.get(dkey, -math.inf)
        if self._silent(unit.key, dkey, 1 if n is None else n, wm, sent, now):
            return
        stream = self.keys.stream(unit.op, v, j)
        if dkey in self.hosted:
            # Batching is a transport matter: a local consumer gets the whole part in one hand-off.
            chunks = [None if n == 0 else part]
        else:
            size = self.batch_records(unit.op, v)
            table = pa.Table.from_pandas(part, preserve_index=False) if n else None  # once, then zero-copy slices
            chunks = [table.slice(i, size) for i in range(0, n, size)] if n else [None]
        for index, chunk in enumerate(chunks):
            seq = unit.rec.seq_out.get(dkey, 0) + 1
            unit.rec.seq_out[dkey] = seq
            # Only the last chunk carries the new watermark: it covers all the chunks before it.
            chunk_wm = wm if index == len(chunks) - 1 else sent
            if dkey in self.hosted:
                local[dkey].append(Delivery(unit.key, seq, chunk_wm, chunk, stream))
            else:
                self._append(commit, stream, unit.key, seq, chunk_wm, chunk)
        unit.rec.wm_out[dkey] = max(sent, wm)
        if n:
            self.metrics.kg_edge(unit.op, unit.kg, v, j).inc(n)

    def _append(self, commit: Commit, stream: str, producer: str, seq: int, wm: float,
                records: pd.DataFrame | pa.Table | None) -> None:
        commit.appends.append((stream, entry_fields(producer, seq, wm, records)))
        if records is not None and len(records):
            commit.incr(self.keys.backlog, stream, len(records))

    # --------------------------------------------------------------------------------------- metrics

    def _update_metrics(self) -> None:
        now = time.time()
        if now - self._last_metrics < self.config.metrics_interval:
            return
        self._last_metrics = now
        try:
            proc = psutil.Process()
            procs = [proc, *proc.children(recursive=True)]
            cpu = sum(p.cpu_times().user + p.cpu_times().system for p in procs)
            self.metrics.set_cpu(cpu)
            self.metrics.exec(self.metrics.memory).set(sum(p.memory_info().rss for p in procs))
        except psutil.Error:
            pass
        if not self._connected or not self.hosted:
            return
        try:
            streams = {key: [self.keys.stream(u, unit.op, unit.kg) for u in self.spec.operator(unit.op).inputs]
                       for key, unit in self.hosted.items()}
            flat = [s for ss in streams.values() for s in ss]
            counts = dict(zip(flat, self.client.hmget(self.keys.backlog, flat))) if flat else {}
        except CONNECTION_ERRORS:
            return
        for key, unit in self.hosted.items():
            if streams[key]:
                backlog = sum(int(counts.get(s) or 0) for s in streams[key])
                self.metrics.unit(self.metrics.backlog, unit.op, unit.kg).set(max(0, backlog))
            self.metrics.unit(self.metrics.state_bytes, unit.op, unit.kg).set(len(unit.rec.state))


def part_size(part: pd.DataFrame | LazyPart | None) -> int | None:
    """Records in a part; None for a part of a flow its consumer has not counted yet."""
    return 0 if part is None else part.n if isinstance(part, LazyPart) else len(part)


def _consumed(flow: Flow, pairs: set[tuple[int, int]]) -> SparkFrame:
    """A flow as its consumer's input (``_kg`` = the consuming unit), limited to the pairs accepted; a
    flow the consumer counts keeps the producing unit as ``__src``."""
    frame = flow.frame
    if pairs != flow.pairs:
        accepted = reduce(lambda a, b: a | b, [(F.col(KG) == s) & (F.col(DST) == d) for s, d in sorted(pairs)],
                          F.lit(False))
        frame = frame.where(accepted)
    if flow.counts is None:
        return frame.withColumnRenamed(KG, SRC).withColumnRenamed(DST, KG)
    return frame.withColumn(KG, F.col(DST)).drop(DST)


def _at(records: pd.DataFrame, kg: int) -> pd.DataFrame:
    """Records as input of key group ``kg`` (``_kg`` names the consuming unit on input)."""
    records = records.copy(deep=False)
    records[KG] = np.int32(kg)
    return records


def _input_of(stream: str) -> str:
    """The producing operator of a stream key ``...:s:<from>-><to>:<kg>``."""
    return stream.rsplit(":s:", 1)[1].split("->", 1)[0]


def transport_password() -> str | None:
    """The transport's password from ``STREAMTOPO_TRANSPORT_PASSWORD`` (a secretKeyRef on Kubernetes).

    Passed to the client, never put into the URL, so no log line or error message can carry it.
    """
    return os.environ.get("STREAMTOPO_TRANSPORT_PASSWORD") or None


def run_executor(topology_path: Path, routing_path: Path, name: str, transport_url: str, *,
                 metrics_port: int = 0, output_dir: Path | None = None, cpu: float = 1.0) -> int:
    """The ``streamtopo executor`` program; returns the exit code (clear messages, no tracebacks)."""
    from streamtopo.planner.model import TopologyError, load_topology
    from streamtopo.runtime.operators import OperatorError

    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s {name} %(levelname)s %(message)s")
    try:
        topology = load_topology(topology_path)
        executor = Executor(topology, routing_path, name, transport_url, metrics_port=metrics_port,
                            output_dir=output_dir, cpu=cpu)
    except TopologyError as error:
        log.error("invalid topology %s:\n%s", topology_path, error)
        return 2
    except OperatorError as error:
        log.error("cannot build the pipeline: %s", error)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        executor.start()
    except TransportUnavailable as error:
        log.error("%s", error)
        return 3
    try:
        executor.run(stop)
    except OperatorError as error:  # e.g. an expression naming a column its input does not have
        log.error("cannot run the pipeline: %s", error)
        executor.close()
        return 2
    return 0


if __name__ == "__main__":
    from streamtopo.commands.executor import main

    main()
