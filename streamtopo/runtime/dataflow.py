"""One step of an executor: a micro-batch over every hosted unit, committed atomically.

1. read the hosted units' input streams (one pipelined XRANGE round trip; C-MR's policies choose which
   when the queues exceed a step's budget, scheduling.py), generate source records that are due (event
   time <= wall time since the topology's start) as a lazy Spark frame: a backlogged source catches up
   in steps of what the executor carries in a few seconds, and not at all while the topology's queues
   are full (pacing.py: backpressure through the lag);
2. run the operators in topological order, each over all its hosted units at once, and route each one's
   output to its downstream units: in memory here, combined before the wire, or as entries (emit.py);
3. commit everything the step did in one atomic, epoch-fenced script (state_store.py), then write the
   file sinks' committed bytes (sinks.py).

:class:`Dataflow` is mixed into :class:`~streamtopo.runtime.executor.Executor`, which owns the state
declared on it; the clock is the executor's (injected).
"""

from __future__ import annotations

import logging
import math
import zlib
from collections import defaultdict
from collections.abc import Callable
from functools import reduce
from pathlib import Path
from typing import TypeVar

import numpy as np
import pandas as pd
import pyarrow as pa

from streamtopo.contracts import unit_key
from streamtopo.planner.graph import partition_key
from streamtopo.runtime import sinks
from streamtopo.runtime.flows import (
    COMBINED,
    Delivery,
    Flow,
    LazyPart,
    Partials,
    Produced,
    StepOutcome,
    consumed,
)
from streamtopo.runtime.generation import Generation
from streamtopo.runtime.hosting import Hosted
from streamtopo.runtime.inputs import Inputs
from streamtopo.runtime.metrics import observe_all
from streamtopo.runtime.operators import OperatorResult, RecordError, combine_inputs
from streamtopo.runtime.operators.base import Batch, is_spark, materialize
from streamtopo.runtime.operators.records import (
    INPUT,
    KG,
    LINE,
    SRC,
    TS,
    clear_scratch,
    concat,
    from_arrow,
    to_spark,
)
from streamtopo.runtime.operators.sink import SinkOperator
from streamtopo.runtime.operators.state import frame_to_ipc
from streamtopo.runtime.partitioning import route
from streamtopo.runtime.spark import without_reply_delay
from streamtopo.runtime.state_store import Commit, StateStore
from streamtopo.runtime.transport import (
    Entry,
    MalformedEntry,
    entry_fields,
)

log = logging.getLogger("streamtopo.executor")
T = TypeVar("T")


class Dataflow(Inputs, Generation):
    """The per-step dataflow of an executor (see the module docstring): reading (inputs.py) and generating
    (generation.py) its input, running its operators, routing their output (emit.py), one commit."""

    order: list[str]
    store: StateStore
    _whole_stage: bool | None
    small_step: bool
    output_dir: Path | None

    # ------------------------------------------------------------------------------------- topology

    def _sink_path(self, op: str, kg: int) -> Path | None:
        operator = self.spec.operator(op)
        if operator.sink is not None and operator.sink.file is not None and self.output_dir is not None:
            return sinks.sink_file(self.output_dir, operator, kg)
        return None

    # ----------------------------------------------------------------------------------------- step

    def step(self) -> StepOutcome:
        """One micro-batch over every hosted unit, committed atomically."""
        clear_scratch()  # Parquet hand-offs of the previous step: no lazy frame refers to them any more
        without_reply_delay(self.spark)
        self.behind = False
        outcome = StepOutcome()
        commit = Commit()
        touched: set[str] = set()
        local: dict[str, list[Delivery]] = defaultdict(list)
        self.pacing.begin(self.clock())
        inputs, allotted = self._read_inputs()
        now = self.clock()
        by_op: dict[str, list[Hosted]] = defaultdict(list)
        for unit in self.hosted.values():
            by_op[unit.op].append(unit)
        self._plan_for(
            sum(entry.count for entries in inputs.values() for _, entry in entries)
            + sum(self._due(units, now) for op, units in by_op.items() if self._generates(op))
        )
        for op in self.order:
            units = sorted(by_op.get(op, []), key=lambda u: u.kg)
            if not units:
                continue
            started = self.clock()
            if self._generates(op):
                produced = self._generate(units, now)
            else:
                self._read_late(units, inputs, allotted)
                produced = self._consume(op, units, inputs, local, commit, outcome)
            if self.spec.operator(op).kind != "sink":
                if (
                    is_spark(produced.frame)
                    and len(self.downstream[op]) > 1
                    and (self.small_step or self._taken_out_by_all(op))
                ):
                    produced = self._shared(op, produced)
                self._emit(op, produced, local, commit, now)
            busy = self.clock() - started
            # The operator ran once for all its units: split the time by records (+1 for the call itself).
            weights = {key: 1 + produced.work.get(key, 0) for key in produced.units}
            for key in produced.units:
                unit = self.hosted[key]
                touched.add(key)
                share = busy * weights[key] / sum(weights.values())
                unit.busy += share
                self.metrics.unit(self.metrics.busy, unit.op, unit.kg).inc(share)
        if outcome.uncounted:
            self._count_uncounted(outcome.uncounted)
        if not touched:
            self.pacing.end(self.clock())
            return outcome
        outcome.work = True
        for key in sorted(touched):
            unit = self.hosted[key]
            if self.operators[unit.op].stateful or self.spec.operator(unit.op).kind == "source":
                unit.rec.state = self.operators[unit.op].encode_state(unit.state)
            commit.units.append((key, unit.epoch, unit.rec.encode()))
        self.store.commit(commit)
        self.eager = False
        self.kept_up = not self.behind
        for segment, offset, data in outcome.sink_writes:
            segment.write(offset, data)
        for line in outcome.console:
            print(line, flush=True)
        self.pacing.end(self.clock())
        return outcome

    def _plan_for(self, records: int) -> None:
        """How a step of ``records`` runs. Whole-stage code generation only for steps of many records: a
        query whose code differs from every earlier one (a source's range bounds, a batch's own plan) is
        compiled and JIT-compiled anew, tens of milliseconds, which pays off only over a few hundred
        thousand records: small steps run Spark's interpreted operators, half the step time of VWAP at a
        few thousand records per second (and still less JVM CPU than with code generation on every step
        since operators after a source reuse their classes across steps: measured 2026-11-26,
        docs/runtime.md). A small step also computes a lazy output that several operators read once
        (:meth:`_shared`), so they run in numpy instead of a Spark job each."""
        self.small_step = records < self.config.small_step_records
        whole_stage = not self.small_step
        if whole_stage != self._whole_stage:
            self.spark.conf.set("spark.sql.codegen.wholeStage", str(whole_stage).lower())
            self._whole_stage = whole_stage

    def _shared(self, op: str, produced: Produced) -> Produced:
        """A lazy output several operators read, computed once (one Spark job) into the driver. Left lazy,
        each reader would run its own job over the whole chain before it, the source's generator included
        (VWAP's cleaned trades feed four groups' filters: four jobs over the chain); in the driver they run
        in numpy (numpy_eval.py). For small steps, and for large ones where every reader would take its
        share out of the JVM anyway (:meth:`_taken_out_by_all`): a large output some reader keeps in the
        JVM stays there."""
        records = materialize(produced.frame)
        sizes = records.groupby(KG).size()
        units: dict[str, tuple[int | None, float]] = {}
        for key, (n, wm) in produced.units.items():
            if n is None:  # the lazy output's size, known now
                n = int(sizes.get(self.hosted[key].kg, 0))
                self._count_out(self.hosted[key], n)
            units[key] = (n, wm)
        if produced.took is not None:
            self._sized_by_output(op, produced.took, sizes)
        return Produced(records, units, produced.work, _pandas=records)

    def _taken_out_by_all(self, op: str) -> bool:
        """Whether every reader of ``op``'s output takes its share of it out of the JVM this step (VWAP's
        cleaned quotes: each group's filter feeds a join, which runs in pandas): then one job for all
        costs less than one per reader, each regenerating the chain before it."""
        return not any(self._kept_in_jvm_by(op, v) for v in self.downstream[op])

    def _consume(
        self,
        op: str,
        units: list[Hosted],
        inputs: dict[str, list[tuple[str, Entry]]],
        local: dict[str, list[Delivery]],
        commit: Commit,
        outcome: StepOutcome,
    ) -> Produced:
        """Apply each unit's new entries (dedup by producer sequence), run the operator once for all."""
        operator = self.operators[op]
        spec_op = self.spec.operator(op)
        parts: dict[str, list[pd.DataFrame]] = defaultdict(list)
        lazy: dict[int, tuple[str, Flow, set[tuple[int, int]]]] = {}
        received: dict[str, int] = defaultdict(int)
        tables: dict[tuple[str, int], list[pa.Table]] = defaultdict(list)
        active: list[Hosted] = []
        now = self.clock()
        named = spec_op.kind == "source"  # a stream source reads a user-named stream it shares
        for unit in units:
            got, oldest = False, None
            if not named and not self.producers(op, unit.kg) and unit.rec.watermark != math.inf:
                # No unit feeds this one (an unkeyed operator with more key groups than its input): it is
                # complete from the start, and says so downstream, or end of stream would never come.
                got = True
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
                    source = COMBINED if entry.combined else _input_of(stream)
                    tables[(source, unit.kg)].append(entry.table())
                    received[unit.key] += entry.count
            for d in local.pop(unit.key, []):
                if d.seq == unit.rec.seq_in.get(d.producer, 0) + 1:
                    got = True
                    self._accept(unit, d.producer, d.seq, d.watermark)
                    received[unit.key] += d.n or 0  # a deferred flow is counted by the operator below
                    if isinstance(d.records, LazyPart):
                        lazy.setdefault(id(d.records.flow), (_input_of(d.stream), d.records.flow, set()))[
                            2
                        ].add((d.records.src, d.records.dst))
                    elif isinstance(d.records, Partials):
                        parts[COMBINED].append(d.records.frame)
                    elif d.records is not None and len(d.records):
                        parts[_input_of(d.stream)].append(_at(d.records, unit.kg))
                else:
                    # Older entries of this producer still wait in the stream: keep its order by going there.
                    records = d.records.pandas() if isinstance(d.records, LazyPart) else d.records
                    self._append(commit, d.stream, d.producer, d.seq, d.watermark, records)
            self.metrics.unit(self.metrics.oldest_age, op, unit.kg).set(
                max(0.0, now - oldest) if oldest else 0.0
            )
            if got or operator.has_pending(unit.state):
                active.append(unit)
        for (name, kg), batch_tables in tables.items():
            # One conversion to pandas per unit and input: per entry it costs about a millisecond.
            parts[name].append(_at(from_arrow(pa.concat_tables(batch_tables, promote_options="default")), kg))
        if not active:
            return Produced(None, {}, {})
        combined = parts.pop(COMBINED, None)
        partials = concat(combined) if combined else None
        for unit in active:
            producers = list(unit.rec.wm_in) if named else self.producers(op, unit.kg)
            idle = math.inf if not named and not producers else -math.inf
            wm = min((unit.rec.wm_in.get(p, -math.inf) for p in producers), default=idle)
            unit.rec.watermark = max(unit.rec.watermark, wm)
        frames, by_operator = [], []
        sized = all(flow.counts is not None for _, flow, _ in lazy.values())  # received is every record
        for name, flow, pairs in lazy.values():
            if not operator.lazy_input:  # the records come out here anyway: counted on the way
                records = materialize(consumed(flow, pairs, keep_source=True))
                if flow.counts is None:
                    sizes = records.groupby([SRC, KG]).size()
                    self._counted(
                        op, flow, pairs, {(int(a), int(b)): int(n) for (a, b), n in sizes.items()}, received
                    )
                parts[name].append(records.drop(columns=[SRC]))
            elif flow.counts is None and operator.counts_input and len(spec_op.inputs) == 1:
                by_operator.append((flow, pairs))
                frames.append(consumed(flow, pairs, keep_source=True))
            else:
                if flow.counts is None:
                    outcome.uncounted.append((op, flow, pairs))
                frames.append(consumed(flow, pairs, keep_source=False))
        if frames:
            frames += [to_spark(self.spark, concat(p)) for p in parts.values()]
            batch: Batch = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), frames)
        else:
            batch = self._pandas_batch(spec_op.kind, parts)
        result = self._process(operator, batch, active, commit, partials)
        for flow, pairs in by_operator:
            self._counted(op, flow, pairs, result.input_counts or {}, received)
        for unit in active:
            self._count_in(unit, received[unit.key])
        output = result.output
        if is_spark(output):
            if not (operator.keeps_count and sized):
                # Out = in, known once the flows it took are counted, when they were all it took.
                only_flows = operator.keeps_count and not any(parts.values()) and partials is None
                return Produced(
                    output,
                    {u.key: (None, self._output_watermark(u)) for u in active},
                    dict(received),
                    took=[(flow, pairs) for _, flow, pairs in lazy.values()] if only_flows else None,
                )
            for unit in active:  # as many out as in: the consumers' flows are sized without a job
                self._count_out(unit, received[unit.key])
            known: dict[str, tuple[int | None, float]] = {
                u.key: (received[u.key], self._output_watermark(u)) for u in active
            }
            return Produced(output, known, dict(received))
        out: dict[str, tuple[int | None, float]] = {}
        groups = dict(iter(output.groupby(KG))) if len(output) else {}
        for unit in active:
            df = groups.get(unit.kg)
            n = 0 if df is None else len(df)
            unit.rec.records_out += n
            self.metrics.unit(self.metrics.records_out, op, unit.kg).inc(n)
            if spec_op.kind == "sink":
                self._sink(unit, df, commit, outcome)
            out[unit.key] = (n, self._output_watermark(unit))
        return Produced(output, out, dict(received), _pandas=output)

    def _output_watermark(self, unit: Hosted) -> float:
        return self.operators[unit.op].output_watermark(unit.state, unit.rec.watermark)

    @staticmethod
    def _pandas_batch(kind: str, parts: dict[str, list[pd.DataFrame]]) -> pd.DataFrame:
        frames = {name: concat(p) for name, p in parts.items()}
        if kind == "join":
            batch = combine_inputs(frames) if frames else pd.DataFrame({KG: [], TS: [], INPUT: []})
        else:
            batch = (
                concat(frames.values())
                if frames
                else pd.DataFrame({KG: pd.Series(dtype="int32"), TS: pd.Series(dtype="float64")})
            )
        if len(batch):
            batch[KG] = batch[KG].astype("int32")
        return batch

    def _take_named(self, unit: Hosted, entry: Entry) -> bool:
        """Whether this unit of a stream source takes ``entry`` (:meth:`_owner`). A sink's entries also
        say how many units write the stream: the unit then waits for the watermarks of those it owns
        (``*`` marks the set as known; alone it means +inf)."""
        if entry.producers is not None and "*" not in unit.rec.wm_in:
            sink = entry.producer.rsplit("/", 1)[0]
            unit.rec.wm_in["*"] = math.inf
            for i in range(entry.producers):
                name = unit_key((sink, i))
                if self._owner(unit.op, name, entry) in (None, unit.kg):
                    unit.rec.wm_in.setdefault(name, -math.inf)
        return self._owner(unit.op, entry.producer or entry.id, entry) in (None, unit.kg)

    def _owner(self, op: str, producer: str, entry: Entry) -> int | None:
        """The key group of stream source ``op`` that takes the entries of ``producer`` (or the external
        entry of that id); None: every key group, each keeping the records whose key hashes to it.

        Unkeyed, entries are split by producer, keeping each producer's order in one unit, external ones
        by id. Keyed by ``keyBy`` (issue 33, item 4): sink unit ``i`` partitioned by the same key over as
        many key groups holds exactly key group ``i``'s records, so unit ``i`` takes its entries alone
        and nothing crosses to the keyed operator after it; any other entry every unit reads."""
        k = self.spec.key_groups_of(op)
        key = self.spec.operator(op).key_by
        if not key:
            return zlib.crc32(producer.encode()) % k
        index = producer.rpartition("/")[2]
        if entry.partition == tuple(key) and entry.producers == k and index.isdigit():
            return int(index)
        return None

    def _named_records(self, unit: Hosted, entry: Entry, commit: Commit) -> pd.DataFrame | None:
        """An entry's records, those whose key hashes to the unit where every unit reads the entry; a
        malformed external entry, or one without the source's key columns, goes to the dead-letter stream
        once (from the unit its id falls to; nothing else stops). External entries advance the watermark
        to the latest event time seen."""
        k = self.spec.key_groups_of(unit.op)
        key = self.spec.operator(unit.op).key_by
        split = bool(key) and self._owner(unit.op, entry.producer or entry.id, entry) is None
        field, raw = "source.stream", [b"entry", entry.id.encode(), b"raw", entry.json or entry.data or b""]
        try:
            records = entry.records()
            if records is None or not len(records):
                return records
            if entry.producer == "":
                unit.rec.wm_in[""] = max(unit.rec.wm_in.get("", -math.inf), float(records[TS].max()))
            if split:
                field = "keyBy"
                if missing := [c for c in key or () if c not in records.columns]:
                    raise MalformedEntry(f"the entry has no column {missing[0]!r} of keyBy {key}")
                records = records[route(records, tuple(key or ()), k, unit.kg) == unit.kg]
        except ValueError as error:  # MalformedEntry, Arrow's ArrowInvalid, a key type without a hash
            if zlib.crc32(entry.id.encode()) % k == unit.kg:
                self._dead_letter(commit, unit.op, field, str(error), 1, raw)
            return None
        return records

    def _without_failing(
        self, operator: str, run: Callable[[pd.DataFrame], T], batch: pd.DataFrame, commit: Commit
    ) -> T:
        """``run(batch)`` for ``operator``; the records that make it raise a :class:`RecordError` go to
        the dead-letter stream under ``operator`` and it runs again on the rest (where the operator runs,
        or where a producer combines records for it before the wire)."""
        batch = batch.reset_index(drop=True)
        while True:
            try:
                return run(batch)
            except RecordError as error:
                bad = batch.index.intersection(error.rows.index)
                rows = batch.loc[bad] if len(bad) else batch
                self._dead_letter(
                    commit, operator, error.field, error.error, len(rows), [b"d", frame_to_ipc(rows)]
                )
                batch = batch.drop(index=rows.index).reset_index(drop=True)

    def _dead_letter(
        self, commit: Commit, operator: str, field: str, error: str, n: int, payload: list[bytes]
    ) -> None:
        """Send ``n`` records (``payload``: the records, or the raw entry) to the dead-letter stream in the
        step's commit, naming the operator, field and error; processing goes on without them."""
        commit.appends.append(
            (
                self.keys.dead_letters,
                [
                    b"operator",
                    operator.encode(),
                    b"executor",
                    self.name.encode(),
                    b"error",
                    error.encode(),
                    b"field",
                    field.encode(),
                    b"n",
                    str(n).encode(),
                    *payload,
                ],
            )
        )
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

    def _process(
        self,
        operator,
        batch: Batch,
        active: list[Hosted],
        commit: Commit,
        partials: pd.DataFrame | None = None,
    ) -> OperatorResult:
        """Run the operator (with the partials producers combined for it, if any); records that make it
        raise go to the dead-letter stream, the rest goes on."""
        states = {u.kg: u.state for u in active}
        watermarks = {u.kg: u.rec.watermark for u in active}
        extra = {"partials": partials} if partials is not None else {}
        if is_spark(batch):  # records fail one by one in pandas (a Spark job fails whole: LazyFailure)
            result = operator.process(self.spark, batch, states, watermarks, **extra)
        else:
            result = self._without_failing(
                operator.name,
                lambda b: operator.process(self.spark, b, states, watermarks, **extra),
                batch,
                commit,
            )
        for unit in active:
            if unit.kg in result.states:
                unit.state = result.states[unit.kg]
        return result

    def _sink(self, unit: Hosted, df: pd.DataFrame | None, commit: Commit, outcome: StepOutcome) -> None:
        sink = self.spec.operator(unit.op).sink
        operator = self.operators[unit.op]
        assert sink is not None and isinstance(operator, SinkOperator)  # _sink runs for sink units only
        if df is not None and len(df):
            latency = self.metrics.sink_latency.labels(self.keys.topology, self.name, unit.op)
            lags = self.clock() - self.t0 - df[TS].to_numpy(dtype=float)
            observe_all(latency, np.where(lags > 0, lags, 0.0))
        if unit.segment is not None:
            data = sinks.lines_bytes(df[LINE].tolist()) if df is not None and len(df) else b""
            unit.rec.pending = data
            unit.rec.sink_len += len(data)
            if data:
                outcome.sink_writes.append((unit.segment, unit.rec.sink_len - len(data), data))
        elif sink.stream is not None:
            # Records, or a punctuation when the watermark moved (readers' windows need it to fire).
            target = self.keys.sink_stream(sink.stream)
            sent = unit.rec.wm_out.get(target, -math.inf)
            wm = unit.rec.watermark
            if self._silent(unit.key, target, 0 if df is None else len(df), wm, sent, self.clock()):
                return
            seq = unit.rec.seq_out.get(target, 0) + 1
            unit.rec.seq_out[target] = seq
            unit.rec.wm_out[target] = max(sent, wm)
            records = df if df is not None and len(df) else None
            commit.appends.append(
                (
                    target,
                    entry_fields(
                        unit.key,
                        seq,
                        wm,
                        records,
                        producers=self.spec.key_groups_of(unit.op),
                        partition=partition_key(self.spec, unit.op),
                    ),
                )
            )
        elif sink.console is not None and df is not None and len(df):
            outcome.console.extend(operator.format_console(df))

    # ---------------------------------------------------------------------------------------- output


def _at(records: pd.DataFrame, kg: int) -> pd.DataFrame:
    """Records as input of key group ``kg`` (``_kg`` names the consuming unit on input)."""
    records = records.copy(deep=False)
    records[KG] = np.int32(kg)
    return records


def _input_of(stream: str) -> str:
    """The producing operator of a stream key ``...:s:<from>-><to>:<kg>``."""
    return stream.rsplit(":s:", 1)[1].split("->", 1)[0]
