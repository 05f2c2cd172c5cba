"""The executor in-process (threads of the test process, one shared SparkSession), against real Valkey.

Each test compares the file sink's output with exact expected values computed from the generator's
definition (runtime_support.expected_totals), so a lost or duplicated record fails it.
"""

from __future__ import annotations

import json
import math
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest
from prometheus_client.parser import text_string_to_metric_families
from runtime_support import (
    Running,
    assert_exactly_once,
    expected_totals,
    migrate_crash_and_finish,
    move_each,
    read_lines,
    read_pods_lines,
    round_robin,
    sequence_topology,
    totals,
    wait_finished,
    write_routing,
    write_topology,
)

from streamtopo.contracts import Keys, unit_key
from streamtopo.documents import load_topology
from streamtopo.local.runner import finalize_sinks, finished
from streamtopo.planner.benoit.fuse import fuse_shared
from streamtopo.planner.graph import unit_edges
from streamtopo.planner.model import StreamTopology
from streamtopo.runtime import combining
from streamtopo.runtime.embedded import EmbeddedValkey
from streamtopo.runtime.executor import Executor, ExecutorConfig
from streamtopo.runtime.flows import Flow
from streamtopo.runtime.handover import Pause
from streamtopo.runtime.hosting import Hosted
from streamtopo.runtime.operators.base import LazyFailure, OperatorError
from streamtopo.runtime.operators.state import ipc_to_frame
from streamtopo.runtime.state_store import Fenced, StateStore, UnitRecord
from streamtopo.runtime.transport import append, connect, entry_fields

pytestmark = [pytest.mark.valkey, pytest.mark.spark]

CONTRACT = {  # notes/controller_api.md, family names (counters without _total)
    "streamtopo_unit_busy_seconds",
    "streamtopo_unit_records_in",
    "streamtopo_unit_records_out",
    "streamtopo_kg_records",
    "streamtopo_unit_state_bytes",
    "streamtopo_unit_backlog_records",
    "streamtopo_unit_oldest_record_age_seconds",
    "streamtopo_executor_cpu_seconds",
    "streamtopo_executor_memory_bytes",
    "streamtopo_executor_cpu_capacity_cores",
    "streamtopo_routing_version",
    "streamtopo_migrations",
    "streamtopo_migration_pause_seconds",
    "streamtopo_dead_letters",
}


@pytest.fixture(scope="module")
def valkey():
    with EmbeddedValkey() as server:
        yield server


def between_source_and_totals(topology: StreamTopology, stage: dict) -> StreamTopology:
    """The sequence topology with ``stage`` (whose input is the source) feeding the aggregate."""
    spec = topology.spec.model_dump(by_alias=True)
    spec["operators"].insert(1, stage)
    spec["operators"][2]["inputs"] = [stage["name"]]
    return StreamTopology.model_validate({"metadata": {"name": topology.metadata.name}, "spec": spec})


def run_to_end(valkey, topology: StreamTopology, tmp_path, *endpoints: str) -> dict[str, tuple[int, str]]:
    """One executor hosting every unit, until every sink unit has seen the end of stream; then each of
    ``endpoints`` (``metrics``, ``healthz``, ...) read before it stops: path -> (status, body)."""
    routing = tmp_path / "routing.json"
    write_routing(routing, round_robin(topology, ["ex-0"]))
    running = Running(Executor(topology, routing, "ex-0", valkey.url, output_dir=tmp_path / "out"))
    try:
        wait_finished(running.executor.store, topology)
        base = f"http://127.0.0.1:{running.executor.server.server_port}"
        read = {path: urllib.request.urlopen(f"{base}/{path}") for path in endpoints}
        return {path: (answer.status, answer.read().decode()) for path, answer in read.items()}
    finally:
        running.stop()


def test_pipeline_output_is_exact(valkey, spark, tmp_path):
    topology = sequence_topology("ex-exact", count=600, rate=3000, keys=7, window=0.05)
    read = run_to_end(valkey, topology, tmp_path, "metrics", "healthz", "readyz")
    metrics = read["metrics"][1]
    probes = [read[p][0] for p in ("healthz", "readyz")]
    assert_exactly_once(read_lines(tmp_path / "out"), expected_totals(600, 3000, 7, 0.05))
    assert probes == [200, 200]
    exported = {f.name for f in text_string_to_metric_families(metrics)}
    assert CONTRACT <= exported, CONTRACT - exported
    totals_in = sum(
        s.value
        for f in text_string_to_metric_families(metrics)
        for s in f.samples
        if s.name == "streamtopo_unit_records_in_total" and s.labels["operator"] == "totals"
    )
    assert totals_in == 600
    texts = [p.read_text() for p in (tmp_path / "out" / "out").glob("kg-*.jsonl")]
    assert all(t.endswith("\n") for t in texts if t)


def with_interval(topology: StreamTopology, interval: str) -> StreamTopology:
    spec = topology.spec.model_dump(by_alias=True)
    spec["batching"]["interval"] = interval
    return StreamTopology.model_validate({"metadata": {"name": topology.metadata.name}, "spec": spec})


def traced_steps(valkey, topology: StreamTopology, tmp_path, config: ExecutorConfig | None = None) -> list:
    """Run ``topology`` to its end on one executor (output checked exact): per step with work, whether it
    was behind and whether the loop then paused (called ``_pause``) before its next step."""
    routing = tmp_path / "routing.json"
    write_routing(routing, round_robin(topology, ["ex-0"]))
    executor = Executor(topology, routing, "ex-0", valkey.url, output_dir=tmp_path / "out", config=config)
    steps: list[list[bool]] = []
    step, pause = executor.step, executor._pause

    def traced():
        outcome = step()
        if outcome.work:
            steps.append([executor.behind, False])
        return outcome

    def paused(stop, began):
        steps[-1][1] = True
        pause(stop, began)

    executor.step = traced  # type: ignore[method-assign]
    executor._pause = paused  # type: ignore[method-assign]
    running = Running(executor)
    try:
        wait_finished(executor.store, topology)
    finally:
        running.stop()
    source = topology.spec.operator("numbers").source
    window = topology.spec.operator("totals").window
    assert source is not None and source.count is not None and window is not None
    expected = expected_totals(source.count, source.rate_per_second, source.keys or 1, window.size)
    assert_exactly_once(read_lines(tmp_path / "out"), expected)
    return steps


def test_the_loop_pauses_after_every_step_with_work(valkey, spark, tmp_path):
    """At 1,000 records/s, which one executor keeps up with, every step with work is followed by the
    pause (spec.batching.interval, Executor._pause: its waits are tested below) and keeps up."""
    topology = with_interval(
        sequence_topology("ex-interval", count=4000, rate=1000, keys=5, window=1.0), "1s"
    )
    steps = traced_steps(valkey, topology, tmp_path)
    assert len(steps) >= 3, steps
    assert all(paused for _, paused in steps[:-1]), steps  # the last may end with the run's stop
    assert not any(behind for behind, _ in steps[1:]), steps


def test_a_step_that_leaves_records_due_is_behind(valkey, spark, tmp_path):
    """A generator capped at 100 records a step, with 20,000 due: its steps are behind (so the pause
    returns at once: below)."""
    topology = with_interval(
        sequence_topology("ex-behind", count=2000, rate=20000, keys=5, window=0.05), "5s"
    )
    config = ExecutorConfig(max_source_records=100, materialized_records=100)
    steps = traced_steps(valkey, topology, tmp_path, config)
    assert sum(behind for behind, _ in steps) >= 10, steps


class PausingClock:
    """A clock that ``wait`` advances: Executor._pause's waits without wall time."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        self.now += seconds
        return False


def pausing(
    clock: PausingClock,
    interval: float,
    behind=False,
    moving=False,
    busy_share=0.25,
    routed=None,
    finishing=False,
):
    """What Executor._pause reads of an executor; ``routed()`` says whether the routing file changed."""
    return SimpleNamespace(
        behind=behind,
        finishing=finishing,
        waiting={"totals/0": 0.0} if moving else {},
        leaving={},
        spec=SimpleNamespace(batching=SimpleNamespace(interval=interval)),
        config=ExecutorConfig(busy_share=busy_share),
        clock=clock,
        _routing_changed=routed or (lambda: False),
    )


@pytest.mark.parametrize(
    "took, interval, behind, moving, finishing, waited",
    [
        (0.1, 4.0, False, False, False, 0.3),  # quick: up to 1 / busy_share (4x) its length from its start
        (2.0, 4.0, False, False, False, 2.0),  # slow step: the interval caps it
        (5.0, 4.0, False, False, False, 0.0),  # longer than the interval: the next at once
        (0.1, 0.0, False, False, False, 0.0),  # 0s: step again at once
        (0.1, 4.0, True, False, False, 0.0),  # behind: at once
        (0.1, 4.0, False, True, False, 0.0),  # units moving: at once
        (2.0, 4.0, False, False, True, 0.0),  # a finite input's end passing through: at once
    ],
)
def test_the_pause_waits_until_min_interval_and_four_steps_after_a_step_began(
    took, interval, behind, moving, finishing, waited
):
    clock = PausingClock(100.0 + took)
    executor = pausing(clock, interval, behind, moving, finishing=finishing)
    Executor._pause(executor, clock, 100.0)  # type: ignore[arg-type]
    assert sum(clock.waits) == pytest.approx(waited)
    assert all(w <= 5 * ExecutorConfig().idle_sleep + 1e-9 for w in clock.waits)  # a routing is seen


@pytest.mark.parametrize(
    "watermark, wm_in, finishing",
    [
        (-math.inf, {"src/0": math.inf, "src/1": 3.0}, True),  # one producer ended, the other not yet
        (-math.inf, {"src/0": 5.0, "src/1": 3.0}, False),  # none ended: the steady state
        (math.inf, {"src/0": math.inf, "src/1": math.inf}, False),  # ended itself: the next run may pause
        (-math.inf, {"*": math.inf, "sink/0": 2.0}, False),  # a named stream's "writers known" mark
    ],
)
def test_a_unit_between_its_producers_ends_is_finishing(watermark, wm_in, finishing):
    """Executor.finishing: true while a hosted unit has end of stream from some producers, not all."""
    rec = UnitRecord(watermark=watermark, wm_in=wm_in)
    quiet = Hosted("totals", 0, 1, UnitRecord(watermark=2.0, wm_in={"src/0": 2.0}), None)
    executor = SimpleNamespace(hosted={"totals/0": quiet, "totals/1": Hosted("totals", 1, 1, rec, None)})
    assert Executor.finishing.fget(executor) is finishing  # type: ignore[attr-defined]


@pytest.mark.parametrize("routing_changes, stopped, waits", [(True, False, 2), (False, True, 1)])
def test_a_new_routing_or_a_stop_ends_the_pause(routing_changes, stopped, waits):
    """A pause of 3.9 s (an interval of 4 s) ends after the routing file changed (seen at the third look)
    or at the first wait a stop ends."""
    clock = PausingClock(100.1)
    looks = iter(range(100))
    routed = lambda: routing_changes and next(looks) >= 2  # noqa: E731
    stop = SimpleNamespace(wait=lambda t: clock.wait(t) or stopped)
    Executor._pause(pausing(clock, 4.0, busy_share=0.01, routed=routed), stop, 100.0)  # type: ignore[arg-type]
    assert len(clock.waits) == waits, clock.waits


def test_a_fused_topologys_executor_says_which_member_each_operator_serves(valkey, spark, tmp_path):
    """Two topologies fused (one source computed once, windows of their own): the executor exports one
    member series per member operator, and joining the unit series on them gives each member its own
    numbers: its sink took exactly the lines it wrote, and the source it shares counts once for both."""
    a = sequence_topology("m-a", count=600, rate=3000, keys=7, window=0.05)
    b = sequence_topology("m-b", count=600, rate=3000, keys=7, window=0.1)
    fusion = fuse_shared([a, b])
    assert fusion is not None and fusion.shared == {"numbers": ["m-a", "m-b"]}
    fused = load_topology(write_topology(tmp_path, fusion.topology))  # as `streamtopo run A B` hands it over
    _, metrics = run_to_end(valkey, fused, tmp_path, "metrics")["metrics"]
    samples = [s for f in text_string_to_metric_families(metrics) for s in f.samples]
    serves = {
        (s.labels["member"], s.labels["member_operator"]): s.labels["operator"]
        for s in samples
        if s.name == "streamtopo_member_operator_info" and s.value == 1
    }
    assert serves == {
        (m, op): there for m, renamed in fusion.members.items() for op, there in renamed.items()
    }

    def member_total(member: str, operator: str, series: str) -> float:
        there = serves[(member, operator)]
        return sum(s.value for s in samples if s.name == series and s.labels.get("operator") == there)

    for member in ("m-a", "m-b"):
        lines = read_lines(tmp_path / "out", f"{member}/out")
        assert lines and member_total(member, "out", "streamtopo_unit_records_in_total") == len(lines)
        assert member_total(member, "numbers", "streamtopo_unit_records_out_total") == 600


def test_re_sent_entries_are_dropped_by_producer_sequence(valkey, spark, tmp_path):
    """Entries of an outside producer, one of them sent twice: the duplicate is not counted again."""
    topology = sequence_topology("ex-dedup", count=0, rate=1000, keys=3, window=1.0, key_groups=2)
    table = round_robin(topology, ["ex-0"])
    table = table.moved({**table.assignment(), ("numbers", 0): "elsewhere", ("numbers", 1): "elsewhere"})
    routing = tmp_path / "routing.json"
    write_routing(routing, table)
    client = connect(valkey.url)
    keys = Keys(topology.metadata.name)
    # What numbers/0 and numbers/1 would send: seq 0..19 routed by the same hash the runtime uses.
    from streamtopo.runtime.generators import frame
    from streamtopo.runtime.partitioning import route

    records = frame(spark, "sequence", [(0, 0, 20)], 1, 1000, keys=3).drop("_kg").toPandas()
    dest = route(records, ("key",), 2, 0)
    sent = {}
    for producer in (0, 1):
        mine = records[records["seq"] % 2 == producer].assign(_kg=producer)
        for j in (0, 1):
            part = mine[dest[mine.index] == j]
            fields = entry_fields(f"numbers/{producer}", 1, 0.0, part.reset_index(drop=True))
            append(client, keys.stream("numbers", "totals", j), fields)
            if producer == 0 and j == dest[0]:
                append(client, keys.stream("numbers", "totals", j), fields)  # re-sent
            append(
                client,
                keys.stream("numbers", "totals", j),
                entry_fields(f"numbers/{producer}", 2, math.inf, None),
            )
            sent[(producer, j)] = len(part)
    running = Running(Executor(topology, routing, "ex-0", valkey.url, output_dir=tmp_path / "out"))
    try:
        wait_finished(running.executor.store, topology)
    finally:
        running.stop()
    assert_exactly_once(read_lines(tmp_path / "out"), expected_totals(20, 1000, 3, 1.0))


def test_poisoned_records_go_to_the_dead_letter_stream(valkey, spark, tmp_path):
    check = {"name": "check", "kind": "udf", "inputs": ["numbers"], "function": "runtime_udfs:poison_13"}
    topology = between_source_and_totals(
        sequence_topology("ex-dead", count=400, rate=4000, keys=5, window=0.05, key_groups=2), check
    )
    run_to_end(valkey, topology, tmp_path)
    poisoned = [s for s in range(400) if s % 100 == 13]
    assert_exactly_once(
        read_lines(tmp_path / "out"), expected_totals(400, 4000, 5, 0.05, dropped=lambda s: s % 100 == 13)
    )
    client = connect(valkey.url)
    letters = client.xrange(Keys("ex-dead").dead_letters)
    assert letters and all(
        f[b"operator"] == b"check" and f[b"field"] == b"function" and f[b"error"] for _, f in letters
    )
    dead = pd.concat([ipc_to_frame(f[b"d"]) for _, f in letters])
    assert sorted(dead["seq"].tolist()) == poisoned


def overflowing(name: str) -> StreamTopology:
    """A sum over bigint values near 2**62: Spark's ANSI sum overflows on the second record."""
    return StreamTopology.model_validate(
        {
            "metadata": {"name": name},
            "spec": {
                "keyGroups": 1,
                "operators": [
                    numbers(40, 1e6, 1),
                    {
                        "name": "big",
                        "kind": "map",
                        "inputs": ["numbers"],
                        "select": ["key", f"{2**62} + seq AS b"],
                    },
                    {
                        "name": "totals",
                        "kind": "aggregate",
                        "inputs": ["big"],
                        "keyBy": ["key"],
                        "aggregations": ["sum(b) AS total"],
                    },
                    {"name": "out", "kind": "sink", "inputs": ["totals"], "sink": {"file": {}}},
                ],
            },
        }
    )


def test_a_step_whose_sum_overflows_fails_and_commits_nothing(valkey, spark, tmp_path):
    """Spark's ANSI sum raises on a total outside bigint: the step fails naming the operator, the
    aggregation and the error class, and nothing of it is committed (the source has emitted nothing, the
    sink wrote nothing), so nothing is lost: a fixed spec would find every record."""
    topology = overflowing("ex-overflow")
    routing = tmp_path / "routing.json"
    write_routing(routing, round_robin(topology, ["ex-0"]))
    executor = Executor(topology, routing, "ex-0", valkey.url, output_dir=tmp_path / "out")
    executor.start()
    try:
        executor._apply_routing()
        executor._acquire_waiting()
        before = {key: executor.store.load(key)[1] for key in executor.hosted}
        with pytest.raises(OperatorError) as error:
            for _ in range(50):  # the records come due at once; a lazy failure is redone eagerly
                try:
                    executor.step()
                except LazyFailure:
                    executor._recover()
                    executor.eager = True
        assert error.value.operator == "totals" and error.value.field.startswith("aggregations")
        assert "[ARITHMETIC_OVERFLOW]" in error.value.message
        assert {key: executor.store.load(key)[1] for key in executor.hosted} == before
        assert before["numbers/0"] is None or before["numbers/0"].emitted == 0
        assert not (tmp_path / "out").exists() or not read_lines(tmp_path / "out")
    finally:
        executor.close(release=False)


def test_an_executor_whose_loop_fails_stops_heartbeating_so_its_units_expire(valkey, spark, tmp_path):
    """The loop ends on a failure it does not retry (here Spark's overflow): the heartbeat stops with it,
    as the process's exit would stop it, so the units expire for another executor. (An executor thread
    whose loop had failed once heartbeated on for the rest of a test session, into later tests' Valkeys
    when they reused its port.)"""
    import threading

    routing = tmp_path / "routing.json"
    write_routing(routing, round_robin(overflowing("ex-overflow-loop"), ["ex-0"]))
    executor = Executor(
        overflowing("ex-overflow-loop"), routing, "ex-0", valkey.url, output_dir=tmp_path / "out"
    )
    executor.start()
    assert executor.store.alive(executor.instance)
    with pytest.raises(OperatorError):
        executor.run(threading.Event())
    deadline = time.time() + 10 * executor.config.heartbeat_ttl
    while executor.store.alive(executor.instance):
        assert time.time() < deadline, "the failed executor still heartbeats"
        time.sleep(0.2)


def test_zombie_donor_cannot_commit_or_write(valkey, spark, tmp_path):
    """A donor that keeps running after its units were taken: its step is refused, the sink untouched."""
    topology = sequence_topology("ex-zombie", count=200, rate=100000, keys=3, window=0.5, key_groups=1)
    routing = tmp_path / "routing.json"
    write_routing(routing, round_robin(topology, ["ex-0"]))
    zombie = Executor(topology, routing, "ex-0", valkey.url, output_dir=tmp_path / "out")
    zombie.start()
    try:
        zombie._apply_routing()
        zombie._acquire_waiting()
        assert set(zombie.hosted) == {"numbers/0", "totals/0", "out/0"}
        # Another executor takes every unit (as after the hand-over timeout) before the zombie's next step.
        thief = StateStore(connect(valkey.url), Keys("ex-zombie"))
        for key in zombie.hosted:
            thief.acquire(key, "thief")
        before = {key: thief.load(key) for key in zombie.hosted}
        with pytest.raises(Fenced):
            zombie.step()
        assert {key: thief.load(key) for key in zombie.hosted} == before
        assert not (tmp_path / "out").exists() or not read_lines(tmp_path / "out")
        zombie._recover()
        assert zombie.hosted == {}  # it knows it lost them; it will wait for the routing to give them back
    finally:
        zombie.close(release=False)


@pytest.mark.slow
def test_migrations_and_a_crash_lose_and_duplicate_nothing(valkey, spark, tmp_path):
    """Two executors; units move back and forth; one executor crashes and a new incarnation takes over."""
    count, rate, keys_, window = 3000, 200, 11, 0.25  # 15 s of event time: the crash comes mid-stream
    topology = sequence_topology("ex-moves", count=count, rate=rate, keys=keys_, window=window)
    routing_path = tmp_path / "routing.json"
    table = round_robin(topology, ["ex-0", "ex-1"])
    write_routing(routing_path, table)
    out = tmp_path / "out"
    runs = {
        n: Running(Executor(topology, routing_path, n, valkey.url, output_dir=out)) for n in ("ex-0", "ex-1")
    }
    store = runs["ex-0"].executor.store
    try:
        moves = [("totals", 1), ("out", 1), ("numbers", 0), ("totals", 2), ("totals", 1), ("numbers", 3)]
        move_each(routing_path, table, moves)
        crashed = set(runs["ex-1"].executor.hosted)
        assert crashed and not finished(store, topology)
        runs["ex-1"].stop(release=False)  # crash: no release, heartbeat expires
        runs["ex-1"] = Running(Executor(topology, routing_path, "ex-1", valkey.url, output_dir=out))
        wait_finished(store, topology)
    finally:
        for run in runs.values():
            run.stop()
    finalize_sinks(store, topology, out)
    assert_exactly_once(read_lines(out), expected_totals(count, rate, keys_, window))
    pauses = [Pause.from_json(p) for p in store.client.lrange(store.keys.pauses, 0, -1)]
    kinds = {p.kind for p in pauses}
    # Versions an executor has not applied yet are superseded by later ones, so not every move happens.
    assert "released" in kinds and "recovered" in kinds, pauses


@pytest.mark.slow
def test_transport_lost_mid_run_resumes_without_loss(spark, tmp_path):
    data = tmp_path / "valkey"
    data.mkdir()
    valkey = EmbeddedValkey(data_dir=data).start()
    port = valkey.port
    topology = sequence_topology("ex-lost", count=2000, rate=800, keys=5, window=0.25, key_groups=2)
    routing = tmp_path / "routing.json"
    write_routing(routing, round_robin(topology, ["ex-0"]))
    running = None
    try:
        running = Running(Executor(topology, routing, "ex-0", valkey.url, output_dir=tmp_path / "out"))
        time.sleep(1.0)
        valkey.kill()
        time.sleep(2.0)
        valkey = EmbeddedValkey(port=port, data_dir=data).start()
        wait_finished(StateStore(connect(valkey.url), Keys("ex-lost")), topology)
    finally:
        if running:
            running.stop()
        valkey.stop()
    assert_exactly_once(read_lines(tmp_path / "out"), expected_totals(2000, 800, 5, 0.25))


def test_executor_build_fails_clearly_on_a_udf_that_does_not_import(tmp_path):
    from streamtopo.runtime.operators import OperatorError

    topology = sequence_topology(
        "ex-badudf",
        count=10,
        rate=10,
        keys=1,
        window=1.0,
        extra=[{"name": "bad", "kind": "udf", "inputs": ["totals"], "function": "no_such_module_xyz:fn"}],
        sink_input="bad",
    )
    with pytest.raises(
        OperatorError, match="operator 'bad', function: cannot import 'no_such_module_xyz:fn'"
    ):
        Executor(topology, tmp_path / "routing.json", "ex-0", "redis://127.0.0.1:1")


def test_lazy_step_failing_on_a_record_is_redone_eagerly_and_dead_letters_it(valkey, spark, tmp_path):
    """Generated records stay in the JVM through a filter; one record makes the filter's expression fail
    (ANSI division by zero) inside the lazy chain. The step is redone eagerly, the record goes to the
    dead-letter stream naming the filter's expr, and everything else arrives exactly once."""
    topology = between_source_and_totals(
        sequence_topology("ex-lazy-fail", count=300, rate=3000, keys=4, window=0.05, key_groups=2),
        {
            "name": "valid",
            "kind": "filter",
            "inputs": ["numbers"],
            "expr": "value / (seq % 100 - 13) > -1000000",
        },
    )
    run_to_end(valkey, topology, tmp_path)
    assert_exactly_once(
        read_lines(tmp_path / "out"), expected_totals(300, 3000, 4, 0.05, dropped=lambda s: s % 100 == 13)
    )
    letters = connect(valkey.url).xrange(Keys("ex-lazy-fail").dead_letters)
    assert {f[b"operator"] for _, f in letters} == {b"valid"} and {f[b"field"] for _, f in letters} == {
        b"expr"
    }
    dead = pd.concat([ipc_to_frame(f[b"d"]) for _, f in letters])
    assert sorted(dead["seq"].tolist()) == [13, 113, 213]


def test_a_stream_sink_feeds_another_topologys_stream_source(valkey, spark, tmp_path):
    """Topology A writes a sequence to the stream "chain"; topology B reads it with two key groups and
    aggregates: B's windows (all of them, including the last) are exactly A's records."""
    producer = StreamTopology.model_validate(
        {
            "metadata": {"name": "chain-a"},
            "spec": {
                "keyGroups": 3,
                "operators": [
                    {
                        "name": "numbers",
                        "kind": "source",
                        "source": {"generator": "sequence", "ratePerSecond": 3000, "count": 450, "keys": 5},
                    },
                    {"name": "publish", "kind": "sink", "inputs": ["numbers"], "sink": {"stream": "chain"}},
                ],
            },
        }
    )
    consumer = StreamTopology.model_validate(
        {
            "metadata": {"name": "chain-b"},
            "spec": {
                "keyGroups": 2,
                "operators": [
                    {"name": "numbers", "kind": "source", "source": {"stream": "chain"}},
                    totals(0.05),
                    {"name": "out", "kind": "sink", "inputs": ["totals"], "sink": {"file": {}}},
                ],
            },
        }
    )
    run_chain(producer, consumer, valkey.url, tmp_path)
    assert_exactly_once(read_lines(tmp_path / "out"), expected_totals(450, 3000, 5, 0.05))


def run_chain(
    producer: StreamTopology, consumer: StreamTopology, url: str, tmp_path: Path
) -> dict[tuple[str, ...], Any]:
    """Run a topology writing a named stream and one reading it on one executor name until the reader
    ends; the reader's metric sums (:func:`metric_sums`)."""
    paths = {}
    for top in (producer, consumer):
        paths[top.metadata.name] = tmp_path / f"{top.metadata.name}.json"
        write_routing(paths[top.metadata.name], round_robin(top, ["ex-0"]))
    runs = [
        Running(Executor(top, paths[top.metadata.name], "ex-0", url, output_dir=tmp_path / "out"))
        for top in (producer, consumer)
    ]
    try:
        wait_finished(runs[1].executor.store, consumer)
        return metric_sums(runs[1].executor)
    finally:
        for run in runs:
            run.stop()


def keyed_chain(name: str, key_groups: int, operators: list[dict]) -> StreamTopology:
    return StreamTopology.model_validate(
        {"metadata": {"name": name}, "spec": {"keyGroups": key_groups, "operators": operators}}
    )


@pytest.mark.parametrize("key_groups", [4, 3])
def test_a_stream_source_partitioned_by_key_reads_a_keyed_sinks_units_where_they_are(
    valkey, spark, tmp_path, key_groups
):
    """A sink keyed by key writes the stream "kchain" from 4 units; a source with keyBy [key] reads it
    into an aggregate keyed by key. With 4 key groups each source unit takes its own sink unit's entries
    (the same hash, the same count); with 3 every unit reads every entry and keeps the records whose key
    hashes to it. Either way nothing crosses from source to aggregate (kg i to kg i only) and the windows
    are exact."""
    count, rate, keys, window = 600, 3000, 13, 0.05
    producer = keyed_chain(
        f"kchain-a-{key_groups}",
        4,
        [
            numbers(count, rate, keys),
            {
                "name": "publish",
                "kind": "sink",
                "inputs": ["numbers"],
                "keyBy": ["key"],
                "sink": {"stream": f"kchain-{key_groups}"},
            },
        ],
    )
    consumer = keyed_chain(
        f"kchain-b-{key_groups}",
        key_groups,
        [
            {
                "name": "numbers",
                "kind": "source",
                "source": {"stream": f"kchain-{key_groups}"},
                "keyBy": ["key"],
            },
            totals(window),
            {"name": "out", "kind": "sink", "inputs": ["totals"], "sink": {"file": {}}},
        ],
    )
    assert unit_edges(consumer.spec, "numbers", "totals") == [
        (i, i, 1 / key_groups) for i in range(key_groups)
    ]
    sums = run_chain(producer, consumer, valkey.url, tmp_path)
    assert_exactly_once(read_lines(tmp_path / "out"), expected_totals(count, rate, keys, window))
    pairs = sums[("streamtopo_kg_records_total", "numbers", "totals", "pairs")]
    assert all(i == j for i, j in pairs) and sum(pairs.values()) == count, pairs


def test_an_unkeyed_operator_with_more_key_groups_than_its_input_reaches_end_of_stream(
    valkey, spark, tmp_path
):
    """Source with one key group -> unkeyed filter with four: units 1-3 of the filter have no producer. They
    are complete from the start; before, they held the watermark at -inf and the run never ended."""
    topology = StreamTopology.model_validate(
        {
            "metadata": {"name": "ex-fanin"},
            "spec": {
                "keyGroups": 4,
                "operators": [
                    {
                        "name": "numbers",
                        "kind": "source",
                        "keyGroups": 1,
                        "source": {"generator": "sequence", "ratePerSecond": 2000, "count": 400, "keys": 5},
                    },
                    {"name": "even", "kind": "filter", "inputs": ["numbers"], "expr": "value % 2 = 0"},
                    {"name": "out", "kind": "sink", "inputs": ["even"], "sink": {"file": {}}},
                ],
            },
        }
    )
    run_to_end(valkey, topology, tmp_path)
    assert sorted(r["value"] for r in read_lines(tmp_path / "out")) == list(range(0, 400, 2))


def test_two_namespaces_run_the_same_topology_name_on_one_valkey_apart(valkey, spark, tmp_path):
    """Keys are scoped by namespace: "same" in team-a and in team-b, with different inputs and the same
    named stream, run at once on one Valkey and each gets exactly its own totals."""
    runs, expected = [], {}
    for namespace, count in (("team-a", 300), ("team-b", 450)):
        base = sequence_topology("same", count=count, rate=3000, keys=5, window=0.05, key_groups=2)
        document = base.model_dump(mode="json", by_alias=True, exclude_none=True)
        document["metadata"]["namespace"] = namespace
        document["spec"]["operators"].append(
            {"name": "publish", "kind": "sink", "inputs": ["numbers"], "sink": {"stream": "numbers-out"}}
        )
        topology = StreamTopology.model_validate(document)
        routing = tmp_path / f"{namespace}.json"
        write_routing(routing, round_robin(topology, ["ex-0"]))
        runs.append(
            (
                topology,
                Running(Executor(topology, routing, "ex-0", valkey.url, output_dir=tmp_path / namespace)),
            )
        )
        expected[namespace] = expected_totals(count, 3000, 5, 0.05)
    try:
        for topology, running in runs:
            wait_finished(running.executor.store, topology)
    finally:
        for _, running in runs:
            running.stop()
    for namespace in expected:
        assert_exactly_once(read_lines(tmp_path / namespace), expected[namespace])
    client = connect(valkey.url)
    assert client.xlen("team-a/numbers-out") > 0 and client.xlen("team-b/numbers-out") > 0
    assert not client.exists("numbers-out")


@pytest.mark.parametrize("keyed", [False, True])
def test_a_stream_source_reads_external_json_entries(valkey, spark, tmp_path, keyed):
    """Entries another program XADDs (``json``: an object or a list): event time from ``ts``; a malformed
    entry goes to the dead-letter stream and the rest is processed. Keyed by shop over two key groups,
    every key group reads every entry and keeps its shops' records; an entry without a shop goes to the
    dead-letter stream once, naming keyBy."""
    name, stream = ("ex-json-keyed", "orders-keyed") if keyed else ("ex-json", "orders")
    client = connect(valkey.url)
    client.delete(stream)
    rows = [
        {"shop": s, "amount": a, "_ts": t}
        for t, (s, a) in enumerate([("a", 3), ("b", 4), ("a", 5), ("b", 6)])
    ]
    keyless = json.dumps({"amount": 1, "_ts": 1}).encode()
    client.xadd(stream, {"json": json.dumps(rows[:2])})
    client.xadd(stream, {"json": b"{not json"})
    client.xadd(stream, {"json": json.dumps(rows[2])})
    if keyed:
        client.xadd(stream, {"json": keyless})
    client.xadd(stream, {"json": json.dumps(rows[3])})
    client.xadd(stream, {"json": json.dumps({"shop": "c", "amount": 0, "_ts": 100})})  # closes windows [0, 4)
    topology = StreamTopology.model_validate(
        {
            "metadata": {"name": name},
            "spec": {
                "keyGroups": 2 if keyed else 1,
                "operators": [
                    {
                        "name": "orders",
                        "kind": "source",
                        "source": {"stream": stream},
                        **({"keyBy": ["shop"]} if keyed else {}),
                    },
                    {
                        "name": "spend",
                        "kind": "aggregate",
                        "inputs": ["orders"],
                        "keyBy": ["shop"],
                        "window": {"size": 2},
                        "aggregations": ["sum(amount) AS total"],
                    },
                    {"name": "out", "kind": "sink", "inputs": ["spend"], "sink": {"file": {}}},
                ],
            },
        }
    )
    routing = tmp_path / "routing.json"
    write_routing(routing, round_robin(topology, ["ex-0"]))
    running = Running(Executor(topology, routing, "ex-0", valkey.url, output_dir=tmp_path / "out"))
    try:
        deadline = time.time() + 120
        while len(read_lines(tmp_path / "out")) < 4:
            assert time.time() < deadline, read_lines(tmp_path / "out")
            time.sleep(0.2)
    finally:
        running.stop()
    got = sorted((r["shop"], r["window_start"], r["total"]) for r in read_lines(tmp_path / "out"))
    assert got == [("a", 0.0, 3), ("a", 2.0, 5), ("b", 0.0, 4), ("b", 2.0, 6)]
    letters = client.xrange(Keys(name).dead_letters)
    want = [(b"source.stream", b"{not json")] + ([(b"keyBy", keyless)] if keyed else [])
    assert sorted((f[b"field"], f[b"raw"]) for _, f in letters) == sorted(want)


def test_a_unit_moving_to_an_executor_that_is_not_up_keeps_running_on_its_donor(valkey, spark, tmp_path):
    """The donor hands a unit over only once the receiver is warm: until then the unit keeps working."""
    topology = sequence_topology("ex-ready", count=2400, rate=400, keys=5, window=0.25, key_groups=2)
    table = round_robin(topology, ["ex-0"])
    routing = tmp_path / "routing.json"
    write_routing(routing, table)
    out = tmp_path / "out"
    donor = Running(Executor(topology, routing, "ex-0", valkey.url, output_dir=out))
    receiver = None
    try:
        time.sleep(1.0)
        write_routing(routing, table.moved({**table.assignment(), ("totals", 0): "ex-1"}))
        time.sleep(0.5)
        before = donor.executor.hosted["totals/0"].rec.records_in
        time.sleep(1.5)
        assert "totals/0" in donor.executor.hosted and "totals/0" in donor.executor.leaving
        assert donor.executor.hosted["totals/0"].rec.records_in > before
        receiver = Running(Executor(topology, routing, "ex-1", valkey.url, output_dir=out))
        deadline = time.time() + 60
        while "totals/0" not in receiver.executor.hosted:
            assert time.time() < deadline
            time.sleep(0.1)
        wait_finished(donor.executor.store, topology)
    finally:
        for run in (donor, receiver):
            if run:
                run.stop()
    finalize_sinks(donor.executor.store, topology, out)
    assert_exactly_once(read_lines(out), expected_totals(2400, 400, 5, 0.25))
    [pause] = [
        Pause.from_json(p)
        for p in donor.executor.store.client.lrange(donor.executor.store.keys.pauses, 0, -1)
    ]
    assert pause.kind == "released" and pause.receiver == "ex-1"


@pytest.mark.parametrize(
    "policy, served, kept_up",
    [
        ("odf", {"totals/0"}, False),
        ("ydf", {"totals/1"}, False),
        ("all", {"totals/0", "totals/1"}, False),
        ("odf", {"totals/0", "totals/1"}, True),
    ],
)
def test_backlogged_queues_are_served_by_the_c_mr_policy(valkey, spark, tmp_path, policy, served, kept_up):
    """Two aggregate units with 300 queued records each, a step budget of 100: ODF serves the queue whose
    first entry arrived first, YDF the other; without a policy both are read in full. An entry another
    executor appends during the step is read late, before the aggregate runs, only within the allotment.
    A step that leaves entries queued is behind (no pause before the next, Executor._pause). After a step
    that kept up, what is queued came during the pause: read in full, whatever the policy, and not behind."""
    name = f"ex-sched-{policy}{'-kept-up' * kept_up}"
    topology = sequence_topology(name, count=0, rate=1000, keys=3, window=1.0, key_groups=2)
    table = round_robin(topology, ["ex-0"])
    table = table.moved({**table.assignment(), ("numbers", 0): "elsewhere", ("numbers", 1): "elsewhere"})
    routing = tmp_path / "routing.json"
    write_routing(routing, table)
    client = connect(valkey.url)
    keys = Keys(name)
    for j in (0, 1):  # totals/0's queue first: its front is older
        stream = keys.stream("numbers", "totals", j)
        for seq in range(1, 4):
            records = pd.DataFrame(
                {
                    "seq": range(100),
                    "key": [0] * 100,
                    "value": range(100),
                    "_ts": [0.0] * 100,
                    "_kg": [j] * 100,
                }
            )
            append(client, stream, entry_fields(f"numbers/{j}", seq, 0.0, records))
            time.sleep(0.01)
        client.hincrby(keys.backlog, stream, 300)
    executor = Executor(
        topology, routing, "ex-0", valkey.url, config=ExecutorConfig(scheduling=policy, step_records=100)
    )
    executor.start()
    try:
        executor._apply_routing()
        executor._acquire_waiting()
        executor.behind, executor.kept_up = False, kept_up
        inputs, allotted = executor._read_inputs()
        got = {key: [entry.count for _, entry in entries] for key, entries in inputs.items() if entries}
        behind = executor.behind
        for j in (0, 1):  # meanwhile, the producers' executor commits one more entry per queue
            late = pd.DataFrame({"seq": [7], "key": [0], "value": [7], "_ts": [0.5], "_kg": [j]})
            append(client, keys.stream("numbers", "totals", j), entry_fields(f"numbers/{j}", 4, 0.5, late))
        executor._read_late(sorted(executor.hosted.values(), key=lambda u: u.key), inputs, allotted)
    finally:
        executor.close()
    assert set(got) == served
    # Entries left queued make the step behind: the executor steps again at once, without a pause.
    chooses = policy != "all" and not kept_up
    assert behind == chooses and executor.behind == behind
    after = {key: [entry.count for _, entry in entries] for key, entries in inputs.items() if entries}
    if chooses:
        assert got == {unit: [100] for unit in served}  # the budget, in whole entries
        assert after == got  # the budget is spent: nothing late
    else:
        assert after == {unit: [100, 100, 100, 1] for unit in served}


@pytest.mark.slow
def test_records_travelling_whole_across_executors_arrive_once(valkey, spark, tmp_path):
    """A re-keyed map into a keyed file sink on two executors: most records leave the producer's JVM as
    Arrow and cross through Valkey. Units move and an executor crashes: every record is written once."""
    count, rate = 4000, 400
    topology = StreamTopology.model_validate(
        {
            "metadata": {"name": "ex-whole"},
            "spec": {
                "keyGroups": 4,
                "operators": [
                    {
                        "name": "numbers",
                        "kind": "source",
                        "source": {
                            "generator": "sequence",
                            "ratePerSecond": rate,
                            "count": count,
                            "keys": 13,
                        },
                    },
                    {
                        "name": "rekeyed",
                        "kind": "map",
                        "inputs": ["numbers"],
                        "select": ["seq", "(seq div 4) % 7 AS account"],
                    },
                    {
                        "name": "out",
                        "kind": "sink",
                        "inputs": ["rekeyed"],
                        "keyBy": ["account"],
                        "sink": {"file": {}},
                    },
                ],
            },
        }
    )
    routing_path = tmp_path / "routing.json"
    table = round_robin(topology, ["ex-0", "ex-1"])
    write_routing(routing_path, table)
    out = tmp_path / "out"
    migrate_crash_and_finish(
        topology,
        routing_path,
        table,
        valkey.url,
        out,
        [("out", 1), ("rekeyed", 2), ("out", 3), ("numbers", 0)],
    )
    lines = read_lines(out)
    assert sorted(int(line["seq"]) for line in lines) == list(range(count))
    assert all(int(line["account"]) == (int(line["seq"]) // 4) % 7 for line in lines)
    files_of: dict[
        int, set[str]
    ] = {}  # keyed routing: each account in one key group's file, from any producer
    for path in (out / "out").glob("kg-*.jsonl"):
        for line in path.read_text().splitlines():
            files_of.setdefault(json.loads(line)["account"], set()).add(path.name)
    assert len(files_of) == 7 and all(len(names) == 1 for names in files_of.values()), files_of


@pytest.mark.parametrize(
    "consumer,executors,cap",
    [
        ("aggregate", 1, 2_000_000),
        ("aggregate", 2, 4_000_000),  # filter -> aggregate: partials, in the JVM
        ("sink", 1, 250_000),
        ("sink", 2, 500_000),  # filter -> keyed sink: records come out (1M per step)
    ],
)
def test_source_steps_take_the_backlog_while_records_stay_in_the_jvm(consumer, executors, cap):
    """A backlogged source's units together may take up to max_source_records when their records only ever
    meet aggregates or lazy local operators, up to materialized_records when they come out: an executor
    hosting half the units takes as many records per step."""
    from streamtopo.runtime.hosting import Hosted

    last = (
        {"kind": "aggregate", "keyBy": ["key"], "aggregations": ["count(*) AS n"]}
        if consumer == "aggregate"
        else {"kind": "sink", "keyBy": ["key"], "sink": {"file": {}}}
    )
    topology = StreamTopology.model_validate(
        {
            "metadata": {"name": "ex-cap"},
            "spec": {
                "keyGroups": 4,
                "operators": [
                    {
                        "name": "numbers",
                        "kind": "source",
                        "source": {"generator": "sequence", "ratePerSecond": 10, "keys": 5},
                    },
                    {"name": "kept", "kind": "filter", "inputs": ["numbers"], "expr": "value % 2 = 0"},
                    {"name": "last", "inputs": ["kept"], **last},
                ],
            },
        }
    )
    executor = Executor(
        topology,
        "unused-routing.json",
        "ex-0",
        "redis://127.0.0.1:1",
        config=ExecutorConfig(max_source_records=8_000_000, materialized_records=1_000_000),
    )
    for (op, kg), owner in round_robin(topology, [f"ex-{i}" for i in range(executors)]).assignment().items():
        if owner == "ex-0":
            executor.hosted[unit_key((op, kg))] = Hosted(op, kg, 1, UnitRecord(), None)
    assert executor._source_cap("numbers", 4 // executors) == cap
    executor.waiting = {"numbers/0": 0.0}
    assert executor._source_cap("numbers", 4 // executors) == executor.config.handover_source_records


def numbers(count: int, rate: float, keys: int) -> dict:
    """The sequence source ``numbers`` of the topologies written out here."""
    source = {"generator": "sequence", "ratePerSecond": rate, "count": count, "keys": keys}
    return {"name": "numbers", "kind": "source", "source": source}


def finished_counts(
    topology: StreamTopology, url: str, tmp_path, config: ExecutorConfig | None = None
) -> dict[tuple[str, ...], Any]:
    """Run ``topology`` to its end on one executor; its records in and out per operator and kg traffic
    per edge, summed over units from its /metrics (and under ``(..., "pairs")`` per kg pair)."""
    routing = tmp_path / "routing.json"
    write_routing(routing, round_robin(topology, ["ex-0"]))
    executor = Executor(topology, routing, "ex-0", url, output_dir=tmp_path / "out", config=config)
    running = Running(executor)
    try:
        wait_finished(running.executor.store, topology)
        return metric_sums(executor)
    finally:
        running.stop()


def metric_sums(executor: Executor) -> dict[tuple[str, ...], Any]:
    """An executor's records in and out per operator and kg traffic per edge, summed over units from its
    /metrics (and under ``(..., "pairs")`` per kg pair)."""
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{executor.server.server_port}/metrics").read()
    sums: dict[tuple[str, ...], Any] = {}
    for family in text_string_to_metric_families(metrics.decode()):
        for s in family.samples:
            if s.name in ("streamtopo_unit_records_in_total", "streamtopo_unit_records_out_total"):
                key = (s.name, s.labels["operator"])
            elif s.name == "streamtopo_kg_records_total":
                key = (s.name, s.labels["src_operator"], s.labels["dst_operator"])
                pair = (s.name, s.labels["src_operator"], s.labels["dst_operator"], "pairs")
                pairs = sums.setdefault(pair, {})  # kg pairs that carried records, one edge's
                pairs[(int(s.labels["src_kg"]), int(s.labels["dst_kg"]))] = s.value
            else:
                continue
            sums[key] = sums.get(key, 0) + s.value
    return sums


METRICS = {
    "in": "streamtopo_unit_records_in_total",
    "out": "streamtopo_unit_records_out_total",
    "traffic": "streamtopo_kg_records_total",
}


def booked(sums: dict[tuple[str, ...], Any], metric: str, names: list) -> dict:
    """:func:`finished_counts`' sums of ``metric`` (in, out: per operator; traffic: per edge) for ``names``."""
    return {
        n: sums[(METRICS[metric], *n)] if isinstance(n, tuple) else sums[(METRICS[metric], n)] for n in names
    }


KEPT_IN_JVM = (
    {
        "name": "totals",
        "kind": "aggregate",
        "inputs": ["scaled"],
        "keyBy": ["key"],
        "window": {"size": 1.0},
        "aggregations": ["count(*) AS n"],
    },
    {"name": "totals-out", "kind": "sink", "inputs": ["totals"], "sink": {"file": {}}},
)
"""A reader of ``scaled`` that keeps its share in the JVM (an aggregate combines it there), so a large
step leaves ``scaled``'s output lazy for its other readers rather than computing it once for all."""


def kept_and_scaled(
    name: str, count: int, rate: float, keys: int, value: str, *after: dict
) -> StreamTopology:
    """numbers -> kept (drops every third record) -> scaled (``key`` and ``value``, a lazy map after a
    filter) -> ``after``, on 4 key groups."""
    scaled = {"name": "scaled", "kind": "map", "inputs": ["kept"], "select": ["key", value]}
    kept = {"name": "kept", "kind": "filter", "inputs": ["numbers"], "expr": "value % 3 <> 0"}
    return StreamTopology.model_validate(
        {
            "metadata": {"name": name},
            "spec": {"keyGroups": 4, "operators": [numbers(count, rate, keys), kept, scaled, *after]},
        }
    )


LOW_AND_HIGH = (
    {"name": "low", "kind": "filter", "inputs": ["scaled"], "expr": "value % 4 = 0"},
    {"name": "high", "kind": "filter", "inputs": ["scaled"], "expr": "value % 4 = 2"},
    {"name": "lows", "kind": "sink", "inputs": ["low"], "sink": {"file": {}}},
    {"name": "highs", "kind": "sink", "inputs": ["high"], "sink": {"file": {}}},
)
"""Two filters of :func:`kept_and_scaled`'s ``scaled`` (with ``value * 2 AS value``), each into a sink."""


def assert_low_and_high_exact(sums: dict[tuple[str, ...], Any], out: Path, count: int) -> int:
    """:data:`LOW_AND_HIGH`'s sinks hold exactly their records, and every record in and out and all kg
    traffic of the chain is booked once; the records ``kept`` let through."""
    kept = [2 * seq for seq in range(count) if seq % 3]
    lows = sorted(int(line["value"]) for line in read_lines(out, "lows"))
    highs = sorted(int(line["value"]) for line in read_lines(out, "highs"))
    assert lows == [v for v in kept if v % 4 == 0] and highs == [v for v in kept if v % 4 == 2]
    n = len(kept)
    assert booked(sums, "in", ["kept", "scaled", "low", "high"]) == {
        "kept": count,
        "scaled": n,
        "low": n,
        "high": n,
    }
    assert booked(sums, "out", ["kept", "scaled", "low", "high"]) == {
        "kept": n,
        "scaled": n,
        "low": len(lows),
        "high": len(highs),
    }
    edges = [("kept", "scaled"), ("scaled", "low"), ("scaled", "high")]
    assert booked(sums, "traffic", edges) == dict.fromkeys(edges, n)
    return n


def test_lazy_consumers_of_one_output_are_counted_exactly_from_one_shared_frame(valkey, spark, tmp_path):
    """Two filters take one map's output lazily in large steps (no step materialises it: an aggregate
    keeps its share in the JVM): both flows share one routed frame, counted once by the step's count job,
    and each consumer still books exactly what it took (records in, kg traffic) and the map what it gave
    (records out, once)."""
    count, rate, keys = 900, 3000, 7
    topology = StreamTopology.model_validate(
        {
            "metadata": {"name": "ex-fanout-counts"},
            "spec": {
                "keyGroups": 4,
                "operators": [
                    numbers(count, rate, keys),
                    {"name": "scaled", "kind": "map", "inputs": ["numbers"], "select": ["key", "value"]},
                    {"name": "even", "kind": "filter", "inputs": ["scaled"], "expr": "value % 2 = 0"},
                    {"name": "odd", "kind": "filter", "inputs": ["scaled"], "expr": "value % 2 = 1"},
                    {"name": "evens", "kind": "sink", "inputs": ["even"], "sink": {"file": {}}},
                    {"name": "odds", "kind": "sink", "inputs": ["odd"], "sink": {"file": {}}},
                    *KEPT_IN_JVM,
                ],
            },
        }
    )
    sums = finished_counts(topology, valkey.url, tmp_path, ExecutorConfig(small_step_records=0))
    evens = [int(line["value"]) for line in read_lines(tmp_path / "out", "evens")]
    odds = [int(line["value"]) for line in read_lines(tmp_path / "out", "odds")]
    assert len(evens) + len(odds) == count and all(v % 2 == 0 for v in evens) and all(v % 2 for v in odds)
    records_in, records_out = "streamtopo_unit_records_in_total", "streamtopo_unit_records_out_total"
    assert {op: sums[(records_in, op)] for op in ("scaled", "even", "odd", "evens", "odds")} == {
        "scaled": count,
        "even": count,
        "odd": count,
        "evens": len(evens),
        "odds": len(odds),
    }
    assert {op: sums[(records_out, op)] for op in ("numbers", "scaled", "even", "odd")} == {
        "numbers": count,
        "scaled": count,
        "even": len(evens),
        "odd": len(odds),
    }
    traffic = "streamtopo_kg_records_total"
    assert {edge: sums[(traffic, *edge)] for edge in [("scaled", "even"), ("scaled", "odd")]} == {
        ("scaled", "even"): count,
        ("scaled", "odd"): count,
    }


def test_a_maps_lazy_outputs_are_sized_by_what_it_took_from_uncounted_flows(
    valkey, spark, tmp_path, monkeypatch
):
    """A filter feeds a map whose output two filters take lazily (VWAP's cleaned trades -> notional ->
    symbol groups): the step's count job counts the first filter's output, and the map's flows take their
    sizes from what each of its units took (Flow.took) instead of being counted again; every record in and
    out and all kg traffic stay exact."""
    sized: list[dict[tuple[int, int], int]] = []
    taken_counts = Flow.taken_counts

    def spy(flow: Flow) -> dict[tuple[int, int], int] | None:
        counts = taken_counts(flow)
        if counts is not None:
            sized.append(counts)
        return counts

    monkeypatch.setattr(Flow, "taken_counts", spy)
    count = 900
    topology = kept_and_scaled(
        "ex-taken-counts",
        count,
        3000,
        7,
        "value * 2 AS value",
        *LOW_AND_HIGH,
        *KEPT_IN_JVM,
    )
    sums = finished_counts(topology, valkey.url, tmp_path, ExecutorConfig(small_step_records=0))
    n = assert_low_and_high_exact(sums, tmp_path / "out", count)
    assert sized and sum(sum(c.values()) for c in sized) == 2 * n  # both flows, every record once


def rekeyed(name: str, count: int, rate: float, window: float) -> StreamTopology:
    """numbers -> accounts (a computed key) -> kept (a map keyed by it) -> totals (tumbling count and sum
    by it) -> out: the keyed map feeds only an aggregate with its own keyBy (graph.routing_key)."""
    return StreamTopology.model_validate(
        {
            "metadata": {"name": name},
            "spec": {
                "keyGroups": 4,
                "operators": [
                    numbers(count, rate, 13),
                    {
                        "name": "accounts",
                        "kind": "map",
                        "inputs": ["numbers"],
                        "select": ["value", "(seq div 4) % 7 AS key"],
                    },
                    {
                        "name": "kept",
                        "kind": "map",
                        "inputs": ["accounts"],
                        "keyBy": ["key"],
                        "select": ["*"],
                    },
                    {
                        "name": "totals",
                        "kind": "aggregate",
                        "inputs": ["kept"],
                        "keyBy": ["key"],
                        "window": {"size": window},
                        "aggregations": ["count(*) AS n", "sum(value) AS total"],
                    },
                    {"name": "out", "kind": "sink", "inputs": ["totals"], "sink": {"file": {}}},
                ],
            },
        }
    )


def rekeyed_totals(count: int, rate: float, window: float) -> dict[tuple[int, float], tuple[int, int]]:
    """(account, window start) -> (count, sum of value) for :func:`rekeyed`: account = (seq div 4) % 7."""
    return expected_totals(count, rate, 7, window, key=lambda seq: (seq // 4) % 7)


def test_a_keyed_map_feeding_an_aggregate_runs_where_its_records_are(valkey, spark, tmp_path):
    """The keyed map takes its input forward (kg i from kg i: no record crosses to it) and the aggregate's
    partials are what is routed by the key; every count stays exact, and the output is the windows'.
    Large steps (no small-step path): the lazy chain is sized from the source's counts through the maps."""
    count, rate, window = 1200, 3000, 0.1
    config = ExecutorConfig(small_step_records=0)
    sums = finished_counts(rekeyed("ex-rekey-counts", count, rate, window), valkey.url, tmp_path, config)
    assert_exactly_once(read_lines(tmp_path / "out"), rekeyed_totals(count, rate, window))
    traffic = "streamtopo_kg_records_total"
    forward = sums[(traffic, "accounts", "kept", "pairs")]
    assert set(forward) == {(i, i) for i in range(4)} and sum(forward.values()) == count
    assert len(sums[(traffic, "kept", "totals", "pairs")]) == 16  # every kept kg holds every account
    records_in, records_out = "streamtopo_unit_records_in_total", "streamtopo_unit_records_out_total"
    assert {op: sums[(records_in, op)] for op in ("accounts", "kept", "totals")} == dict.fromkeys(
        ("accounts", "kept", "totals"), count
    )
    # the maps' outputs are sized from their inputs (no generator): booked once, without a count job
    assert {op: sums[(records_out, op)] for op in ("numbers", "accounts", "kept")} == dict.fromkeys(
        ("numbers", "accounts", "kept"), count
    )


def test_a_map_that_makes_rows_is_counted_as_it_makes_them(valkey, spark, tmp_path):
    """A map calling a generator (``explode``) gives two records per record: its output is counted,
    not taken for its input's size, and the aggregate after it sees every record it made."""
    count, rate, keys = 600, 3000, 5
    select = ["key", "explode(array(value, value + 1)) AS value"]
    topology = StreamTopology.model_validate(
        {
            "metadata": {"name": "ex-explode"},
            "spec": {
                "keyGroups": 4,
                "operators": [
                    numbers(count, rate, keys),
                    {"name": "pairs", "kind": "map", "inputs": ["numbers"], "select": select},
                    {
                        "name": "totals",
                        "kind": "aggregate",
                        "inputs": ["pairs"],
                        "keyBy": ["key"],
                        "window": {"size": 0.05},
                        "aggregations": ["count(*) AS n", "sum(value) AS total"],
                    },
                    {"name": "out", "kind": "sink", "inputs": ["totals"], "sink": {"file": {}}},
                ],
            },
        }
    )
    sums = finished_counts(topology, valkey.url, tmp_path, ExecutorConfig(small_step_records=0))
    lines = read_lines(tmp_path / "out")
    assert sum(int(line["n"]) for line in lines) == 2 * count
    assert sum(int(line["total"]) for line in lines) == 2 * sum(range(count)) + count
    assert sums[("streamtopo_unit_records_out_total", "pairs")] == 2 * count
    assert sums[("streamtopo_unit_records_in_total", "totals")] == 2 * count


def test_partials_of_a_keyed_map_cross_executors_exactly_once(valkey, spark, tmp_path):
    """The same pipeline on two executors: the kept -> totals edge crosses (combined before the wire)
    while units move and an executor crashes; every window is written once, with its exact totals."""
    rekeyed_through_moves_and_a_crash("ex-rekey", valkey, tmp_path)


def test_a_file_sink_moving_between_pods_tiles_its_output_across_their_directories(valkey, spark, tmp_path):
    """Each executor writes its file sinks in its own directory, as pods each write to their emptyDir: sink
    units move from one to the other and back, and one crashes. Each key group's output is in segments
    that tile it exactly across both directories (no NUL bytes where the bytes before were written on the
    other pod, none lost, none twice), and every window is written once with its exact totals."""
    count, rate, keys, window = 3000, 400, 13, 1.0
    topology = sequence_topology("ex-sink-pods", count=count, rate=rate, keys=keys, window=window)
    routing_path = tmp_path / "routing.json"
    table = round_robin(topology, ["ex-0", "ex-1"])
    write_routing(routing_path, table)
    out = tmp_path / "out"
    moves = [("out", 1), ("out", 2), ("out", 1), ("totals", 3), ("out", 2)]

    def written(store: StateStore) -> bool:  # the moving sink units have committed output: they move it
        return all((store.load(unit_key(("out", kg)))[1] or UnitRecord()).sink_len > 0 for kg in (1, 2))

    migrate_crash_and_finish(topology, routing_path, table, valkey.url, out, moves, pods=True, until=written)
    pods = [out / "ex-0", out / "ex-1"]
    assert_exactly_once(read_pods_lines(pods), expected_totals(count, rate, keys, window))
    for kg in (1, 2):  # each moved key group's output starts in one pod and goes on in the other's segment
        names = [sorted(p.name for p in (pod / "out").glob(f"kg-000{kg}*")) for pod in pods]
        assert all(names) and any("_" in name for pod in names for name in pod), names


def rekeyed_through_moves_and_a_crash(
    name: str, valkey, tmp_path, config: ExecutorConfig | None = None
) -> None:
    """:func:`rekeyed` on two executors while four units move and one executor crashes: every window
    is written once, with its exact totals."""
    count, rate, window = 3000, 400, 1.0
    topology = rekeyed(name, count, rate, window)
    routing_path = tmp_path / "routing.json"
    table = round_robin(topology, ["ex-0", "ex-1"])
    write_routing(routing_path, table)
    out = tmp_path / "out"
    moves = [("kept", 1), ("totals", 2), ("kept", 0), ("numbers", 3)]
    migrate_crash_and_finish(topology, routing_path, table, valkey.url, out, moves, config)
    assert_exactly_once(read_lines(out), rekeyed_totals(count, rate, window))


def keyed_ingest(name: str, count: int, rate: float, window: float, keys: int = 11) -> StreamTopology:
    """numbers, partitioned by key (keyBy on the source) -> big (a filter, keyed by inheritance) -> a
    keyed udf -> totals (tumbling count and sum by key) -> out: every edge is one-to-one, none crosses."""
    source = numbers(count, rate, keys)
    return StreamTopology.model_validate(
        {
            "metadata": {"name": name},
            "spec": {
                "keyGroups": 4,
                "operators": [
                    {**source, "keyBy": ["key"]},
                    {"name": "big", "kind": "filter", "inputs": ["numbers"], "expr": "value >= 0"},
                    {
                        "name": "same",
                        "kind": "udf",
                        "inputs": ["big"],
                        "keyBy": ["key"],
                        "function": "runtime_udfs:unchanged",
                    },
                    {
                        "name": "totals",
                        "kind": "aggregate",
                        "inputs": ["same"],
                        "keyBy": ["key"],
                        "window": {"size": window},
                        "aggregations": ["count(*) AS n", "sum(value) AS total"],
                    },
                    {"name": "out", "kind": "sink", "inputs": ["totals"], "sink": {"file": {}}},
                ],
            },
        }
    )


def test_a_source_partitioned_by_key_feeds_its_keyed_operators_where_its_records_are(valkey, spark, tmp_path):
    """Key group i of the keyed source generates the records whose key routes to i, so every edge after
    it carries records only from kg i to kg i (whole records included: a keyed udf's input) and the
    output is exactly the windows'; the planner's unit graph says the same (one-to-one edges)."""
    count, rate, window = 1200, 3000, 0.1
    topology = keyed_ingest("ex-keyed-source", count, rate, window)
    spec = topology.spec
    for u, v in (("numbers", "big"), ("big", "same"), ("same", "totals")):
        assert unit_edges(spec, u, v) == [(i, i, 0.25) for i in range(4)]
    sums = finished_counts(topology, valkey.url, tmp_path, ExecutorConfig(small_step_records=0))
    assert_exactly_once(read_lines(tmp_path / "out"), expected_totals(count, rate, 11, window))
    for u, v in (("numbers", "big"), ("big", "same"), ("same", "totals")):
        pairs = sums[("streamtopo_kg_records_total", u, v, "pairs")]
        assert all(i == j for i, j in pairs) and sum(pairs.values()) == count, (u, v, pairs)


@pytest.mark.parametrize("keys", [11, 1009])
def test_a_source_partitioned_by_key_stays_exact_through_moves_and_a_crash(valkey, spark, tmp_path, keys):
    """The keyed-ingest pipeline on two executors while source and aggregate units move apart and back and
    one executor crashes: a moved source unit resumes its own seqs, every window is written once. With
    11 keys a step's records are a few long runs; with 1,009 (about three records a key) they are
    one-record runs, generated as a span of seqs filtered by key group (generators.SPAN_RATIO)."""
    count, rate, window = 3000, 400, 1.0
    topology = keyed_ingest(f"ex-keyed-moves-{keys}", count, rate, window, keys)
    routing_path = tmp_path / "routing.json"
    table = round_robin(topology, ["ex-0", "ex-1"])
    write_routing(routing_path, table)
    out = tmp_path / "out"
    moves = [("numbers", 1), ("totals", 2), ("numbers", 2), ("same", 0)]
    migrate_crash_and_finish(topology, routing_path, table, valkey.url, out, moves)
    assert_exactly_once(read_lines(out), expected_totals(count, rate, keys, window))


def test_an_edge_that_stops_combining_ships_its_records_whole_exactly_once(
    valkey, spark, tmp_path, monkeypatch
):
    """The kept -> totals edge judged not to shrink after every step it combines (a ratio of 0 is never
    met) ships its records whole, and combines again after ten records shipped: both kinds of
    entry reach the aggregate, while units move and an executor crashes; every window is written once,
    with its exact totals."""
    calls = {"combined": 0, "sent": 0}
    original_combined, original_sent = combining.Reduction.combined, combining.Reduction.sent

    def combined(self, records, rows):
        calls["combined"] += records > 0
        original_combined(self, records, rows)

    def sent(self, records):
        calls["sent"] += records > 0
        original_sent(self, records)

    monkeypatch.setattr(combining.Reduction, "combined", combined)
    monkeypatch.setattr(combining.Reduction, "sent", sent)
    config = ExecutorConfig(combine_min_records=1, combine_ratio=0.0)
    rekeyed_through_moves_and_a_crash("ex-rekey-whole", valkey, tmp_path, config)
    assert calls["combined"] and calls["sent"], calls


def test_lazy_chains_are_counted_exactly_without_a_job_per_edge(valkey, spark, tmp_path):
    """Records in and out and kg traffic stay exact when flows are counted where they are computed: by an
    aggregate's own job, in pandas by a sink that materialises them, and by the step's one count job for
    flows a map or filter takes lazily (a filter feeding a map whose output has two consumers)."""
    count, rate, keys = 900, 3000, 7
    topology = kept_and_scaled(
        "ex-counts",
        count,
        rate,
        keys,
        "value",
        {
            "name": "totals",
            "kind": "aggregate",
            "inputs": ["scaled"],
            "keyBy": ["key"],
            "window": {"size": 0.05},
            "aggregations": ["count(*) AS n", "sum(value) AS total"],
        },
        {"name": "out", "kind": "sink", "inputs": ["totals"], "sink": {"file": {}}},
        {"name": "raw", "kind": "sink", "inputs": ["scaled"], "sink": {"file": {}}},
    )
    sums = finished_counts(topology, valkey.url, tmp_path)
    kept = sum(1 for seq in range(count) if seq % 3)
    assert_exactly_once(
        read_lines(tmp_path / "out"),
        expected_totals(count, rate, keys, 0.05, dropped=lambda seq: seq % 3 == 0),
    )
    assert len(read_lines(tmp_path / "out", "raw")) == kept
    assert booked(sums, "in", ["kept", "scaled", "totals", "raw"]) == {
        "kept": count,
        "scaled": kept,
        "totals": kept,
        "raw": kept,
    }
    assert booked(sums, "out", ["numbers", "kept", "scaled"]) == {
        "numbers": count,
        "kept": kept,
        "scaled": kept,
    }
    edges = [("numbers", "kept"), ("kept", "scaled"), ("scaled", "totals"), ("scaled", "raw")]
    assert booked(sums, "traffic", edges) == {**dict.fromkeys(edges, kept), ("numbers", "kept"): count}


def test_executors_run_as_their_topologys_acl_user_through_migrations_and_a_crash(
    spark, tmp_path, monkeypatch
):
    """The operator's per-topology Valkey user (controller/transport_acl.py) is enough to run: two executors
    authenticate as it (the environment a pod gets from the topology's Secret) on a Valkey whose default
    user needs the admin password, units move and an executor crashes, and every record arrives once."""
    import redis

    from streamtopo.controller import transport_acl

    count, rate, keys, window = 1200, 400, 7, 0.5
    plain = sequence_topology("ex-acl", count=count, rate=rate, keys=keys, window=window)
    topology = StreamTopology.model_validate(
        {**plain.model_dump(by_alias=True), "metadata": {"name": "ex-acl", "namespace": "team-a"}}
    )
    names = Keys.of(topology)
    with EmbeddedValkey() as server:
        admin = redis.Redis.from_url(server.url)
        transport_acl.ensure_user(admin, names, "t3nant-Pa55")
        admin.config_set("requirepass", "4dmin-Pa55")  # nothing runs as the default user without it
        admin = redis.Redis.from_url(server.url, password="4dmin-Pa55")
        monkeypatch.setenv("STREAMTOPO_TRANSPORT_USERNAME", transport_acl.acl_user(names))
        monkeypatch.setenv("STREAMTOPO_TRANSPORT_PASSWORD", "t3nant-Pa55")
        routing_path = tmp_path / "routing.json"
        table = round_robin(topology, ["ex-0", "ex-1"])
        write_routing(routing_path, table)
        out = tmp_path / "out"
        migrate_crash_and_finish(
            topology, routing_path, table, server.url, out, [("totals", 1), ("numbers", 2), ("out", 3)]
        )
        denied = admin.execute_command("ACL", "LOG")
        written = [k.decode() for k in admin.scan_iter()]
    assert_exactly_once(read_lines(out), expected_totals(count, rate, keys, window))
    assert not denied, denied  # no command of the executors was refused and retried
    assert written and all(k.startswith(names.prefix) for k in written), written


def test_a_small_step_computes_a_shared_output_once_and_the_rest_without_spark(valkey, spark, tmp_path):
    """A map read by three filters, each feeding an aggregate: left lazy, each aggregate would run its own
    Spark job over the whole chain. A small step computes the map's output once (one job) and runs the
    filters and the aggregates' partials in numpy (numpy_eval.py); totals stay exact. The file sink's lines
    are Spark's JSON writer's (one more job in a step that writes)."""
    count, rate, keys = 900, 3000, 7

    def branch(r: int) -> tuple[dict, ...]:
        return (
            {"name": f"r{r}", "kind": "filter", "inputs": ["scaled"], "expr": f"value % 3 = {r}"},
            {
                "name": f"t{r}",
                "kind": "aggregate",
                "inputs": [f"r{r}"],
                "keyBy": ["key"],
                "window": {"size": 0.05},
                "aggregations": ["count(*) AS n", "sum(value) AS total"],
            },
        )

    out = {"name": "out", "kind": "sink", "inputs": ["t0", "t1", "t2"], "sink": {"file": {}}}
    topology = fanned_out("ex-shared", numbers(count, rate, keys), ["key", "value * 2 AS value"], branch, out)
    jobs = jobs_per_step(topology, valkey.url, spark, tmp_path)
    lines = read_lines(tmp_path / "out")
    assert sum(line["n"] for line in lines) == count
    assert sum(line["total"] for line in lines) == 2 * sum(range(count))
    assert jobs and max(jobs) <= 2, f"Spark jobs per step: {jobs}"


def fanned_out(
    name: str, source: dict, select: list[str], branch: Callable[[int], tuple[dict, ...]], *after: dict
) -> StreamTopology:
    """``source`` -> ``scaled`` (a map of ``select``) -> three branches, ``branch(r)``'s operators each,
    then ``after``."""
    scaled = {"name": "scaled", "kind": "map", "inputs": [source["name"]], "select": select}
    return StreamTopology.model_validate(
        {
            "metadata": {"name": name},
            "spec": {
                "keyGroups": 4,
                "operators": [source, scaled, *(op for r in range(3) for op in branch(r)), *after],
            },
        }
    )


def jobs_per_step(
    topology: StreamTopology, url: str, spark, tmp_path, config: ExecutorConfig | None = None
) -> list[int]:
    """Run ``topology`` to its end on one executor in this process; the Spark jobs of each step that
    worked."""
    routing = tmp_path / "routing.json"
    write_routing(routing, round_robin(topology, ["ex-0"]))
    executor = Executor(topology, routing, "ex-0", url, output_dir=tmp_path / "out", config=config)
    jobs: list[int] = []
    step = executor.step

    def counted():
        tracker = spark.sparkContext.statusTracker()
        before = max(tracker.getJobIdsForGroup(None), default=-1)
        outcome = step()
        if outcome.work:
            jobs.append(max(tracker.getJobIdsForGroup(None), default=-1) - before)
        return outcome

    executor.step = counted
    running = Running(executor)
    try:
        wait_finished(executor.store, topology)
    finally:
        running.stop()
    return jobs


def test_an_output_every_reader_takes_out_is_computed_once_in_a_large_step_too(valkey, spark, tmp_path):
    """A map read by three filters, each into a sink (which takes records out of the JVM): left lazy, each
    filter's output would be a job over the whole chain, the source's generator included. Where every
    reader takes its share out anyway, a large step computes the map's output once and the filters run in
    numpy; each sink's records stay exact."""
    count, rate, keys = 3000, 3000, 7

    def branch(r: int) -> tuple[dict, ...]:
        return (
            {"name": f"r{r}", "kind": "filter", "inputs": ["scaled"], "expr": f"value % 3 = {r}"},
            {"name": f"out{r}", "kind": "sink", "inputs": [f"r{r}"], "sink": {"file": {}}},
        )

    topology = fanned_out(
        "ex-shared-large", numbers(count, rate, keys), ["seq", "value * 2 AS value"], branch
    )
    jobs = jobs_per_step(topology, valkey.url, spark, tmp_path, ExecutorConfig(small_step_records=0))
    for r in range(3):
        seqs = sorted(line["seq"] for line in read_lines(tmp_path / "out", f"out{r}"))
        assert seqs == [s for s in range(count) if 2 * s % 3 == r]
    assert jobs and max(jobs) <= 1, f"Spark jobs per step: {jobs}"  # one per filter when left lazy


def test_a_count_keeping_map_computed_once_sizes_what_it_took_without_a_count_job(valkey, spark, tmp_path):
    """numbers -> kept (a filter: its output size is unknown) -> scaled (a map) -> two filters into sinks.
    Every reader takes ``scaled`` out, so a large step computes it into the driver; its units' output
    sizes are then what each took from ``kept``, so the step runs no count job for ``kept`` (it ran two
    jobs a step before: ``scaled``, then the count, which regenerated every record), and every count the
    metrics book stays exact."""
    count, rate, keys = 3000, 3000, 7

    def taken_out(name: str) -> StreamTopology:
        return kept_and_scaled(name, count, rate, keys, "value * 2 AS value", *LOW_AND_HIGH)

    large = ExecutorConfig(small_step_records=0)
    (tmp_path / "jobs").mkdir()
    (tmp_path / "counts").mkdir()
    jobs = jobs_per_step(taken_out("ex-sized-jobs"), valkey.url, spark, tmp_path / "jobs", large)
    assert jobs and max(jobs) <= 1, f"Spark jobs per step: {jobs}"
    sums = finished_counts(taken_out("ex-sized-counts"), valkey.url, tmp_path / "counts", large)
    assert_low_and_high_exact(sums, tmp_path / "counts" / "out", count)
