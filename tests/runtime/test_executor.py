"""The executor in-process (threads of the test process, one shared SparkSession), against real Valkey.

Each test compares the file sink's output with exact expected values computed from the generator's
definition (runtime_support.expected_totals), so a lost or duplicated record fails it.
"""

from __future__ import annotations

import math
import time
import urllib.request

import pandas as pd
import pytest
from prometheus_client.parser import text_string_to_metric_families
from runtime_support import (
    Running,
    assert_exactly_once,
    expected_totals,
    read_lines,
    round_robin,
    sequence_topology,
    write_routing,
)

from streamtopo.runtime.embedded import EmbeddedValkey
from streamtopo.runtime.executor import Executor
from streamtopo.runtime.handover import Pause
from streamtopo.runtime.operators.state import ipc_to_frame
from streamtopo.runtime.runner import finalize_sinks, finished
from streamtopo.runtime.state_store import Fenced, StateStore
from streamtopo.runtime.transport import Keys, append, connect, entry_fields

pytestmark = [pytest.mark.valkey, pytest.mark.spark]

CONTRACT = {  # notes/controller_api.md, family names (counters without _total)
    "streamtopo_unit_busy_seconds", "streamtopo_unit_records_in", "streamtopo_unit_records_out",
    "streamtopo_kg_records", "streamtopo_unit_state_bytes", "streamtopo_unit_backlog_records",
    "streamtopo_unit_oldest_record_age_seconds", "streamtopo_executor_cpu_seconds",
    "streamtopo_executor_memory_bytes", "streamtopo_executor_cpu_capacity_cores", "streamtopo_routing_version",
    "streamtopo_migrations", "streamtopo_migration_pause_seconds", "streamtopo_dead_letters",
}


@pytest.fixture(scope="module")
def valkey():
    with EmbeddedValkey() as server:
        yield server


def wait_finished(store: StateStore, topology, timeout: float = 240.0) -> None:
    deadline = time.time() + timeout
    while not finished(store, topology):
        assert time.time() < deadline, "the pipeline did not reach the end of stream in time"
        time.sleep(0.2)


def test_pipeline_output_is_exact(valkey, spark, tmp_path):
    topology = sequence_topology("ex-exact", count=600, rate=3000, keys=7, window=0.05)
    routing = tmp_path / "routing.json"
    write_routing(routing, round_robin(topology, ["ex-0"]))
    running = Running(Executor(topology, routing, "ex-0", valkey.url, output_dir=tmp_path / "out"))
    try:
        wait_finished(running.executor.store, topology)
        base = f"http://127.0.0.1:{running.executor.server.server_port}"
        metrics = urllib.request.urlopen(f"{base}/metrics").read().decode()
        probes = [urllib.request.urlopen(f"{base}/{p}").status for p in ("healthz", "readyz")]
    finally:
        running.stop()
    assert_exactly_once(read_lines(tmp_path / "out"), expected_totals(600, 3000, 7, 0.05))
    assert probes == [200, 200]
    exported = {f.name for f in text_string_to_metric_families(metrics)}
    assert CONTRACT <= exported, CONTRACT - exported
    totals_in = sum(s.value for f in text_string_to_metric_families(metrics) for s in f.samples
                    if s.name == "streamtopo_unit_records_in_total" and s.labels["operator"] == "totals")
    assert totals_in == 600
    texts = [p.read_text() for p in (tmp_path / "out" / "out").glob("kg-*.jsonl")]
    assert all(t.endswith("\n") for t in texts if t)


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
    from streamtopo.runtime.generators import generate
    from streamtopo.runtime.partitioning import route

    records = generate("sequence", list(range(20)), 1000, keys=3)
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
            append(client, keys.stream("numbers", "totals", j),
                   entry_fields(f"numbers/{producer}", 2, math.inf, None))
            sent[(producer, j)] = len(part)
    running = Running(Executor(topology, routing, "ex-0", valkey.url, output_dir=tmp_path / "out"))
    try:
        wait_finished(running.executor.store, topology)
    finally:
        running.stop()
    assert_exactly_once(read_lines(tmp_path / "out"), expected_totals(20, 1000, 3, 1.0))


def test_poisoned_records_go_to_the_dead_letter_stream(valkey, spark, tmp_path):
    check = {"name": "check", "kind": "udf", "inputs": ["numbers"], "function": "runtime_udfs:poison_13"}
    topology = sequence_topology("ex-dead", count=400, rate=4000, keys=5, window=0.05, key_groups=2,
                                 extra=[])
    spec = topology.spec.model_dump(by_alias=True)
    spec["operators"].insert(1, check)
    spec["operators"][2]["inputs"] = ["check"]
    topology = type(topology).model_validate({"metadata": {"name": "ex-dead"}, "spec": spec})
    routing = tmp_path / "routing.json"
    write_routing(routing, round_robin(topology, ["ex-0"]))
    running = Running(Executor(topology, routing, "ex-0", valkey.url, output_dir=tmp_path / "out"))
    try:
        wait_finished(running.executor.store, topology)
    finally:
        running.stop()
    poisoned = [s for s in range(400) if s % 100 == 13]
    assert_exactly_once(read_lines(tmp_path / "out"),
                        expected_totals(400, 4000, 5, 0.05, dropped=lambda s: s % 100 == 13))
    client = connect(valkey.url)
    letters = client.xrange(Keys("ex-dead").dead_letters)
    assert letters and all(f[b"operator"] == b"check" and f[b"field"] == b"function" and f[b"error"]
                           for _, f in letters)
    dead = pd.concat([ipc_to_frame(f[b"d"]) for _, f in letters])
    assert sorted(dead["seq"].tolist()) == poisoned


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
    runs = {n: Running(Executor(topology, routing_path, n, valkey.url, output_dir=out)) for n in ("ex-0", "ex-1")}
    store = runs["ex-0"].executor.store
    try:
        moves = [("totals", 1), ("out", 1), ("numbers", 0), ("totals", 2), ("totals", 1), ("numbers", 3)]
        for unit in moves:
            time.sleep(0.7)
            assignment = table.assignment()
            assignment[unit] = "ex-1" if assignment[unit] == "ex-0" else "ex-0"
            table = table.moved(assignment)
            write_routing(routing_path, table)
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

    topology = sequence_topology("ex-badudf", count=10, rate=10, keys=1, window=1.0, extra=[
        {"name": "bad", "kind": "udf", "inputs": ["totals"], "function": "no_such_module_xyz:fn"}],
        sink_input="bad")
    with pytest.raises(OperatorError, match="operator 'bad', function: cannot import 'no_such_module_xyz:fn'"):
        Executor(topology, tmp_path / "routing.json", "ex-0", "redis://127.0.0.1:1")
