"""The differential harness: a case (strategies.py) as a StreamTopology, run through a path of the data plane,
its sink lines and dead letters compared with Spark batch evaluation (reference.py).

One topology per case: the records enter once (a ``sequence`` generator and a map that builds the values
in the JVM, or a named stream pre-filled with Arrow entries) and feed every branch, each ending in its
own file sink, so one executor start serves several queries. Operator names: ``rec`` the records,
``b<j>s<i>`` stage i of branch j, ``b<j>l<i>``/``b<j>r<i>`` the sides of a join ``b<j>j``, ``b<j>out``
its sink.

How a path is forced:
- *lazy JVM* (generator, ``small_step_records=0``): every step is a large one, so lazy outputs stay in
  the JVM: maps, filters and aggregates' partials run as Spark plans over the generated records (and a
  failing record makes the step redo eagerly). One exception: an output every reader takes out of the
  JVM anyway is computed into the driver once (Dataflow._taken_out_by_all), so the records' map stays
  lazy only in cases where some branch keeps it in the JVM (an aggregate's partials: every case of three
  or more branches);
- *driver batch* (generator with ``small_step_records`` huge, or a stream source): the records' map feeds
  several branches, so a small step computes it once into the driver (Dataflow._shared), and every branch
  runs on pandas: numpy_eval.py where it can, Spark from pandas otherwise; a named stream's records start
  in the driver whatever the step size;
- *crossing* (2 and 3 executors, round-robin units): keyed maps, aggregates and joins read all key groups
  of their input, so records cross as Arrow entries, aggregates' input as partials combined before the
  wire (``Partials``), joins' sides as records (build and probe in the join's state);
- *hand-over* and *kill*: stateful units move between two executors while windows are open
  (``moves``), or an executor stops without releasing (a crash) and restarts (``kill``), so state
  and offsets are restored from Valkey.
"""

from __future__ import annotations

import math
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import yaml
from reference import ERROR_CLASS, Expected, Line, Reference, event_time_last, parse_line, spark_lines
from runtime_support import round_robin, streamtopo_run, write_routing
from strategies import Case, Join, Records, Stage

from streamtopo.contracts import Keys
from streamtopo.local.runner import finalize_sinks, finished
from streamtopo.planner.model import StreamTopology
from streamtopo.runtime.hosting import ExecutorConfig
from streamtopo.runtime.operators.state import ipc_to_table
from streamtopo.runtime.transport import append, entry_fields

# ------------------------------------------------------------------------------------------- topology


@dataclass(frozen=True)
class SinkPlan:
    sink: str
    kind: str
    """What the branch is: "filter/map", "keyed map", "aggregate" or "join"."""
    operators: tuple[tuple[str, Stage | Join], ...]
    """The branch's operators in order (for messages)."""
    identity: tuple[str, ...]
    """Columns that pair an expected line with the line written for the same record, window or match."""


@dataclass
class Plan:
    """A case as operator dicts (camelCase, as users write them) and what each sink should hold."""

    case: Case
    operators: list[dict[str, Any]]
    sinks: list[SinkPlan]

    def topology(self, name: str) -> StreamTopology:
        return StreamTopology.model_validate(
            {
                "metadata": {"name": name},
                "spec": {"keyGroups": self.case.key_groups, "operators": self.operators},
            }
        )


def seconds(records: Records, window: tuple[int, int]) -> dict[str, float]:
    size, slide = window
    return {"size": size * records.unit, "slide": slide * records.unit}


def stage_operator(stage: Stage, name: str, inputs: str, records: Records) -> dict[str, Any]:
    op: dict[str, Any] = {"name": name, "kind": stage.kind, "inputs": [inputs]}
    if stage.kind == "filter":
        op["expr"] = stage.expr
    elif stage.kind == "map":
        op["select"] = list(stage.select)
        if stage.key_by:
            op["keyBy"] = list(stage.key_by)
    else:
        assert stage.window is not None
        op.update(keyBy=list(stage.key_by), window=seconds(records, stage.window))
        op["aggregations"] = list(stage.aggregations)
    return op


def plan(case: Case, stream: str | None = None, key_by: tuple[str, ...] = ()) -> Plan:
    """The case's topology: records from a ``sequence`` generator (``stream`` None) or the named stream,
    partitioned by ``key_by`` when given (the stream source's ``keyBy``)."""
    recs = case.records
    if stream is None:
        ops: list[dict[str, Any]] = [
            {
                "name": "src",
                "kind": "source",
                "source": {"generator": "sequence", "ratePerSecond": recs.rate, "count": recs.n},
            },
            {"name": "rec", "kind": "map", "inputs": ["src"], "select": recs.build_select()},
        ]
    else:
        ops = [{"name": "rec", "kind": "source", "source": {"stream": stream}}]
        if key_by:
            ops[0]["keyBy"] = list(key_by)
    sinks = []

    def chain(stages: tuple[Stage, ...], prefix: str, named: list[tuple[str, Stage | Join]]) -> str:
        last = "rec"
        for i, stage in enumerate(stages):
            name = f"{prefix}{i}"
            ops.append(stage_operator(stage, name, last, recs))
            named.append((name, stage))
            last = name
        return last

    for j, branch in enumerate(case.branches):
        named: list[tuple[str, Stage | Join]] = []
        if isinstance(branch, Join):
            left, right = chain(branch.left, f"b{j}l", named), chain(branch.right, f"b{j}r", named)
            ops.append(
                {
                    "name": f"b{j}j",
                    "kind": "join",
                    "inputs": [left, right],
                    "keyBy": [branch.key],
                    "window": seconds(recs, branch.window),
                }
            )
            named.append((f"b{j}j", branch))
            last, kind = f"b{j}j", "join"
            clash = ("seq",)  # both sides carry seq: prefixed with their input's name
            identity = ("window_start", branch.key, *(f"{side}_{c}" for side in (left, right) for c in clash))
        else:
            last = chain(branch.stages, f"b{j}s", named)
            final = branch.stages[-1]
            if final.kind == "aggregate":
                kind, identity = "aggregate", ("window_start", *final.key_by)
            else:
                kind = "keyed map" if any(s.key_by for s in branch.stages) else "filter/map"
                identity = ("seq",)
        ops.append({"name": f"b{j}out", "kind": "sink", "inputs": [last], "sink": {"file": {}}})
        sinks.append(SinkPlan(f"b{j}out", kind, tuple(named), identity))
    return Plan(case, ops, sinks)


# ------------------------------------------------------------------------------------------ reference


def expected_of(spark, p: Plan) -> Expected:
    """Spark batch evaluation of every branch of ``p`` (reference.py)."""
    ref = Reference(spark, p.case.records)
    out = Expected()
    for j, (branch, sink) in enumerate(zip(p.case.branches, p.sinks)):

        def chain(stages: tuple[Stage, ...], prefix: str) -> pa.Table | None:
            table: pa.Table | None = ref.source
            for i, stage in enumerate(stages):
                assert table is not None
                table = ref.stage(stage, f"{prefix}{i}", table, out)
                if table is None:
                    return None
            return table

        if isinstance(branch, Join):
            left, right = chain(branch.left, f"b{j}l"), chain(branch.right, f"b{j}r")
            assert left is not None and right is not None  # sides are filters and maps: they never fail
            names = (f"b{j}l{len(branch.left) - 1}", f"b{j}r{len(branch.right) - 1}")
            result = ref.join(branch, f"b{j}j", names, left, right)
        else:
            result = chain(branch.stages, f"b{j}s")
        if result is not None:
            out.lines[sink.sink], out.types[sink.sink] = spark_lines(spark, result)
    return out


# ----------------------------------------------------------------------------------------- running


@dataclass
class Outcome:
    """What a run left: each sink's lines, each operator's dead letters, the error that ended it."""

    lines: dict[str, list[str]] = field(default_factory=dict)
    dead: dict[str, Counter[int]] | None = field(default_factory=dict)
    """None where the dead-letter stream cannot be read (a CLI run's embedded Valkey is gone)."""
    error: str | None = None
    """Why the run failed (an executor's exception, or a CLI run's non-zero exit and output); None if not."""
    drills: list[str] = field(default_factory=list)
    """What the drill did, in order (hand-overs, the kill)."""


class Threaded:
    """An Executor run in a thread of the test process; an exception that ends its loop is kept."""

    def __init__(self, executor):
        self.executor = executor
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        executor.start()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.executor.run(self.stop_event, False)
        except BaseException as error:  # noqa: BLE001 - reported by the harness, naming the executor
            self.error = error

    def stop(self, release: bool = True) -> None:
        self.stop_event.set()
        self.thread.join(timeout=120)
        if release and self.error is None:
            self.executor.close(release=True)
        elif not release:
            self.executor.close(release=False)


@dataclass(frozen=True)
class Drill:
    """What happens while a case runs on two executors, as the source makes progress: ``moves`` hand-overs
    of stateful units (each to the other executor, spread over the records' emission, so windows are open),
    then, with ``kill``, ex-1 stops without releasing its units (a crash) once half the records are out,
    and starts again."""

    moves: int = 0
    kill: bool = False


def emitted(store, topology: StreamTopology) -> int:
    """Records the topology's generator units have committed as emitted."""
    from streamtopo.contracts import unit_key

    total = 0
    for op in topology.spec.operators:
        if op.source is not None and op.source.generator is not None:
            for kg in range(topology.spec.key_groups_of(op.name)):
                rec = store.load(unit_key((op.name, kg)))[1]
                total += rec.emitted if rec is not None else 0
    return total


def stateful_units(topology: StreamTopology) -> list[tuple[str, int]]:
    spec = topology.spec
    return [
        (op.name, kg)
        for op in spec.operators
        if op.kind in ("aggregate", "join") or (op.kind == "map" and op.key_by)
        for kg in range(spec.key_groups_of(op.name))
    ]


def feed_stream(client, stream: str, records: Records, producers: int = 2, per_entry: int = 5) -> None:
    """The records as a program would write them (docs/streams.md): Arrow entries of ``producers``
    producers ``feed/<i>`` (records dealt round-robin, in event-time order per producer), each entry's
    watermark its last event time, then each producer's last punctuation (``w = inf``)."""
    table = records.arrow()
    for p in range(producers):
        rows = list(range(p, len(table), producers))
        seq = 0
        for start in range(0, len(rows), per_entry):
            part = table.take(rows[start : start + per_entry])
            seq += 1
            wm = float(part.column("_ts")[-1].as_py())
            append(client, stream, entry_fields(f"feed/{p}", seq, wm, part, producers=producers))
        append(client, stream, entry_fields(f"feed/{p}", seq + 1, math.inf, None, producers=producers))


_names = iter(range(10**9))


def run_in_process(
    p: Plan,
    valkey_url: str,
    work: Path,
    *,
    executors: int = 1,
    config: ExecutorConfig | None = None,
    drill: Drill | None = None,
    stream: str | None = None,
    timeout: float = 120.0,
) -> Outcome:
    """Run ``p`` on ``executors`` Executors in threads of this process (sharing its SparkSession), units
    round-robin over them, until every sink saw the end of stream, an executor failed, or ``timeout``."""
    from streamtopo.runtime.executor import Executor
    from streamtopo.runtime.state_store import StateStore
    from streamtopo.runtime.transport import connect

    topology = p.topology(f"diff-{os.getpid()}-{next(_names)}")
    work.mkdir(parents=True, exist_ok=True)
    out = work / "out"
    routing_path = work / "routing.json"
    names = [f"ex-{i}" for i in range(executors)]
    table = round_robin(topology, names)
    write_routing(routing_path, table)
    client = connect(valkey_url)
    keys = Keys.of(topology)
    if stream is not None:
        feed_stream(client, keys.sink_stream(stream), p.case.records)
    store = StateStore(client, keys)

    def start(name: str) -> Threaded:
        return Threaded(Executor(topology, routing_path, name, valkey_url, output_dir=out, config=config))

    runs = {name: start(name) for name in names}
    outcome = Outcome()
    moves = stateful_units(topology) if drill else []
    deadline = time.time() + timeout
    try:
        while not finished(store, topology):
            failed = [(n, r.error) for n, r in runs.items() if r.error is not None]
            if failed:
                outcome.error = "; ".join(f"{n}: {type(e).__name__}: {e}" for n, e in failed)
                break
            if time.time() > deadline:
                outcome.error = f"timeout: no end of stream within {timeout:.0f} s"
                break
            if drill is not None:
                done = emitted(store, topology) / max(1, p.case.records.n)
                moved = sum(1 for d in outcome.drills if d.startswith("moved"))
                if moves and moved < drill.moves and done >= (moved + 1) / (drill.moves + 2):
                    unit = moves[moved % len(moves)]
                    assignment = table.assignment()
                    assignment[unit] = "ex-1" if assignment[unit] == "ex-0" else "ex-0"
                    table = table.moved(assignment)
                    write_routing(routing_path, table)
                    outcome.drills.append(f"moved {unit} to {assignment[unit]} at {done:.0%} emitted")
                elif drill.kill and done >= 0.5 and not any(d.startswith("killed") for d in outcome.drills):
                    runs["ex-1"].stop(release=False)
                    runs["ex-1"] = start("ex-1")
                    outcome.drills.append(f"killed ex-1 at {done:.0%} emitted, restarted it")
            time.sleep(0.02)
    finally:
        for run in runs.values():
            run.stop()
    if outcome.error is None:
        failed = [(n, r.error) for n, r in runs.items() if r.error is not None]
        if failed:
            outcome.error = "; ".join(f"{n}: {type(e).__name__}: {e}" for n, e in failed)
    finalize_sinks(store, topology, out)
    outcome.lines = read_sinks(out, p)
    outcome.dead = dead_letters(client, keys)
    return outcome


def read_sinks(out: Path, p: Plan) -> dict[str, list[str]]:
    return {
        s.sink: [
            line
            for path in sorted((out / s.sink).glob("kg-*.jsonl"))
            for line in path.read_text().splitlines()
        ]
        for s in p.sinks
    }


def dead_letters(client, keys: Keys) -> dict[str, Counter[int]]:
    """Per operator, the ``seq`` of every record in the dead-letter stream."""
    out: dict[str, Counter[int]] = {}
    for _, fields in client.xrange(keys.dead_letters):
        operator = fields[b"operator"].decode()
        if b"d" in fields:
            seqs = ipc_to_table(fields[b"d"]).column("seq").to_pylist()
        else:
            seqs = [-1] * int(fields.get(b"n", b"1"))
        out.setdefault(operator, Counter()).update(seqs)
    return out


def run_cli(p: Plan, work: Path, executors: int) -> Outcome:
    """``streamtopo run topology.yaml --executors N``, as a user runs it (a generator source only: the
    run's embedded Valkey is its own, so nothing can fill a named stream before it starts)."""
    topology = p.topology(f"diff-cli-{executors}")
    work.mkdir(parents=True, exist_ok=True)
    path = work / "topology.yaml"
    path.write_text(yaml.safe_dump(topology.model_dump(mode="json", by_alias=True, exclude_none=True)))
    out = work / "out"
    result = streamtopo_run(
        str(path), "--executors", str(executors), "--output", str(out), "--duration", "300"
    )
    outcome = Outcome(lines=read_sinks(out, p), dead=None)
    if result.returncode != 0:
        tail = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()][-40:]
        outcome.error = f"exit code {result.returncode}: " + "\n".join(tail)
    return outcome


# --------------------------------------------------------------------------------------- comparison

_CLASSES: dict[str, type[AssertionError]] = {}


def mismatch(category: str) -> type[AssertionError]:
    """One AssertionError subclass per kind of difference, so hypothesis tells distinct bugs apart (it
    keys a failure by exception type and place) and shrinks each to its own minimal case."""
    if category not in _CLASSES:
        _CLASSES[category] = type(f"Mismatch[{category}]", (AssertionError,), {})
    return _CLASSES[category]


PRIORITY = (
    "run failed",
    "run did not fail",
    "dead letters",
    "line missing",
    "unexpected line",
    "value",
    "left out",
    "null written",
    "notation",
    "not in Spark's output",
    "field order",
    "event time",
)
"""Which difference names a failure when a case shows several: the first kind in this order, so a
difference every line shows (an extra field) does not hide a rarer one from hypothesis."""


@dataclass
class Difference:
    category: str
    where: str
    detail: str

    @property
    def rank(self) -> int:
        return next((i for i, word in enumerate(PRIORITY) if word in self.category), len(PRIORITY))


NAMES_AND_NUMBERS = re.compile(r"'[^']*'|\d+")


def error_kind(error: str) -> str:
    """An executor's error as a category: its type and Spark's error class, or its message without
    names and numbers (so the same bug in two cases is one category)."""
    error = re.sub(r"^ex-\d+: ", "", error)
    kind, _, message = error.partition(": ")
    found = ERROR_CLASS.search(message)
    if found:
        return f"{kind} [{found.group(1)}]"
    if kind.startswith("exit code"):  # a CLI run's output: its first line is the plan, not the cause
        return kind
    return f"{kind}: {re.sub(NAMES_AND_NUMBERS, '_', message.splitlines()[0] if message else '')[:80]}"


def same_number(want: Any, got: Any, double: bool = False) -> bool:
    """Whether two JSON values are one number spelt differently (``1.0E-7`` and ``1e-07``, ``Infinity``
    and ``inf``, ``1`` and ``1.0``; for a ``double`` column also ``4.9E-324`` and ``5e-324``, which
    name the same double): a difference of notation, not of value."""
    a, b = _number(want), _number(got)
    if not (isinstance(a, Decimal) and isinstance(b, Decimal)):
        return False
    return a == b or (double and float(a) == float(b))


def line_differences(
    sink: SinkPlan, types: dict[str, str], want: Counter[Line], got: Counter[Line]
) -> list[Difference]:
    """What differs between the lines a sink should hold and those it holds, lines paired by identity."""
    extra = list((got - want).elements())
    out: list[Difference] = []
    for line in (want - got).elements():
        ident = _identity(line, sink.identity)
        twin = next((g for g in extra if _identity(g, sink.identity) == ident), None)
        if twin is None:
            out.append(Difference(f"{sink.kind}: line missing", sink.sink, f"{dict(line)}"))
            continue
        extra.remove(twin)
        w, g = dict(line), dict(twin)
        found = []
        for column in [*w, *(c for c in g if c not in w)]:
            kind = types.get(column, "undeclared")
            kind = "decimal" if kind.startswith("decimal") else kind
            if column not in g:
                found.append((f"{kind} field left out", f"{column}: want {w[column]!r}, absent"))
            elif column not in w:
                what = "null written" if g[column] is None else "field not in Spark's output"
                found.append((f"{kind} {what}", f"{column}: got {g[column]!r}"))
            elif w[column] != g[column]:
                what = "notation" if same_number(w[column], g[column], kind == "double") else "value"
                found.append((f"{kind} {what}", f"{column}: want {w[column]!r}, got {g[column]!r}"))
        if not found:
            found.append(("field order", f"want {list(w)}, got {list(g)}"))
        for category, detail in found:
            out.append(Difference(f"{sink.kind}: {category}", sink.sink, f"{detail}   (record {ident})"))
    out += [Difference(f"{sink.kind}: unexpected line", sink.sink, f"{dict(line)}") for line in extra]
    return out


def differences(p: Plan, expected: Expected, outcome: Outcome) -> list[Difference]:
    """Every difference of a run from the reference, most telling first (:data:`PRIORITY`)."""
    out: list[Difference] = []
    if expected.failures:
        error = outcome.error or ""
        if not any(op in error and cls in error for op, cls in expected.failures.items()):
            want = ", ".join(f"{op} with {cls}" for op, cls in expected.failures.items())
            out.append(
                Difference(
                    "aggregate overflow: run did not fail as Spark",
                    "run",
                    f"want a failure naming {want}; got {outcome.error or 'a run that ended normally'}",
                )
            )
        return out
    if outcome.error is not None:
        return [Difference(f"run failed: {error_kind(outcome.error)}", "run", outcome.error[:4000])]
    for sink in p.sinks:
        lines = outcome.lines.get(sink.sink, [])
        untimed = [line for line in lines if not event_time_last(line)]
        if untimed:
            detail = f"{len(untimed)} of {len(lines)} line(s), e.g. {untimed[0][:300]}"
            out.append(Difference(f"{sink.kind}: event time not the last field _ts", sink.sink, detail))
        got = Counter(parse_line(line) for line in lines)
        out += line_differences(
            sink, expected.types.get(sink.sink, {}), expected.lines.get(sink.sink, Counter()), got
        )
    if outcome.dead is not None:
        order = [op["name"] for op in p.operators]  # upstream first: its dead letters explain those after it
        for op in sorted(
            set(expected.dead) | set(outcome.dead), key=lambda o: order.index(o) if o in order else -1
        ):
            want, got_dead = expected.dead.get(op, Counter()), outcome.dead.get(op, Counter())
            if want != got_dead:
                stage = stage_of(p, op)
                kind = (
                    "join" if isinstance(stage, Join) else stage.kind if stage is not None else "records' map"
                )
                detail = f"want seq {sorted(want.elements())}, got {sorted(got_dead.elements())}"
                out.append(Difference(f"{kind}: dead letters", op, detail))
    return sorted(out, key=lambda d: d.rank)


def compare(p: Plan, expected: Expected, outcome: Outcome, path: str) -> None:
    """Raise a :func:`mismatch` of the most telling difference, every difference listed with the queries
    of the branches they are in."""
    found = differences(p, expected, outcome)
    if not found:
        return
    by_sink = {s.sink: s for s in p.sinks}
    by_op = {name: s for s in p.sinks for name, _ in s.operators}
    lines = [f"path {path}: {len(found)} difference(s) from Spark batch evaluation"]
    if outcome.drills:
        lines.append(f"  drills: {'; '.join(outcome.drills)}")
    shown: set[str] = set()
    for diff in found[:30]:
        lines.append(f"  [{diff.category}] {diff.where}: {diff.detail}")
        sink = by_sink.get(diff.where) or by_op.get(diff.where)
        if sink is not None and sink.sink not in shown:
            shown.add(sink.sink)
            lines.append(describe(p, sink))
    raise mismatch(found[0].category)("\n".join(lines))


def describe(p: Plan, sink: SinkPlan) -> str:
    ops = {op["name"]: op for op in p.operators}
    return "\n".join(
        f"      {yaml.safe_dump(ops[name], default_flow_style=True, width=10**6, allow_unicode=True).strip()}"
        for name, _ in sink.operators
    )


def _identity(line: Line, columns: tuple[str, ...]) -> tuple:
    """The values that pair a line with its twin, numbers by value (``1.0E7`` is ``10000000.0``) so a
    difference of notation in a key still pairs the lines."""
    values = dict(line)
    return tuple(_number(values.get(c)) for c in columns)


SPELLINGS = {"NaN": "NaN", "Infinity": Decimal("Infinity"), "-Infinity": Decimal("-Infinity")}
SPELLINGS |= {"nan": "NaN", "inf": Decimal("Infinity"), "-inf": Decimal("-Infinity")}
"""Strings that stand for doubles: Spark's spellings, and Python's (what a writer using repr puts)."""


def _number(value: Any) -> Any:
    """A number token's value (a Decimal), a double spelt as a string likewise; anything else as it is."""
    if isinstance(value, tuple) and value[0] in ("number", "constant"):
        return SPELLINGS.get(value[1]) or Decimal(value[1])
    if isinstance(value, str) and value in SPELLINGS:
        return SPELLINGS[value]
    return value


def stage_of(p: Plan, op: str) -> Stage | Join | None:
    for sink in p.sinks:
        for name, stage in sink.operators:
            if name == op:
                return stage
    return None


@contextmanager
def reference_session(spark) -> Iterator[None]:
    """The reference evaluates without whole-stage code generation (as the product's small steps do; the
    answers are the same, and each generated query is compiled in a third of the time), restored after:
    executors of this process share the session and set it per step themselves."""
    key = "spark.sql.codegen.wholeStage"
    old = spark.conf.get(key)
    spark.conf.set(key, "false")
    try:
        yield
    finally:
        spark.conf.set(key, old)
