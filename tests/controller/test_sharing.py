"""Sharing decisions on a platform (controller/sharing.py): who founds a shared part, who joins it, who
stays whole, what refuses, and how far a shared stream is trimmed (a real Valkey)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis

from streamtopo.contracts import Keys, UnitRecord
from streamtopo.controller.reconcile import admit
from streamtopo.controller.sharing import (
    WaitForPartners,
    decide,
    is_fused,
    is_shared,
    leave_fused,
    member_change_problems,
    members,
    owners,
    reader_units,
)
from streamtopo.controller.transport_acl import trim, trim_point
from streamtopo.planner.model import StreamTopology, TopologyError
from streamtopo.planner.upgrade import plan_upgrade
from streamtopo.runtime.embedded import EmbeddedValkey

NS = "team"
NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def topology(
    name: str, *, window: str = "10s", sharing: bool = True, age: float = 60.0, alike: bool = False
) -> dict[str, Any]:
    """sequence -> filter -> map (the common prefix) -> a per-topology aggregate -> console. Unless
    ``alike``, each topology's executors get an environment of their own, so they cannot run fused and
    share through a shared part."""
    doc = {
        "apiVersion": "streamtopo.dev/v1alpha1",
        "kind": "StreamTopology",
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"uid-{name}",
            "creationTimestamp": (NOW - timedelta(seconds=age)).isoformat().replace("+00:00", "Z"),
        },
        "spec": {
            "keyGroups": 2,
            "sharing": {"enabled": sharing},
            "operators": [
                {"name": "src", "kind": "source", "source": {"generator": "sequence", "ratePerSecond": 100}},
                {"name": "clean", "kind": "filter", "inputs": ["src"], "expr": "value % 10 <> 0"},
                {"name": "tag", "kind": "map", "inputs": ["clean"], "select": ["seq", "key", "value"]},
                {
                    "name": f"agg-{name}",
                    "kind": "aggregate",
                    "inputs": ["tag"],
                    "keyBy": ["key"],
                    "window": {"size": window},
                    "aggregations": ["count(*) AS n"],
                },
                {"name": "out", "kind": "sink", "inputs": [f"agg-{name}"], "sink": {"console": {}}},
            ],
        },
    }
    if not alike:
        doc["spec"]["executor"] = {"env": [{"name": "TEAM", "value": name}]}
    return doc


def run(doc: dict[str, Any], namespace: dict[str, dict[str, Any]], *, deployed: bool = False) -> Any:
    return decide(
        doc,
        admit(doc, None),
        {**namespace, doc["metadata"]["name"]: doc},
        deployed=deployed,
        now=NOW,
        admit=lambda d: admit(d, None),
    )


def stored(doc: dict[str, Any]) -> dict[str, Any]:
    """A shared part as the API server returns it once created."""
    out = copy.deepcopy(doc)
    out["metadata"]["resourceVersion"] = "1"
    out["metadata"]["uid"] = "uid-shared"
    return out


def test_new_topologies_found_one_shared_part_that_both_then_read():
    a, b = topology("a"), topology("b", window="20s")
    first = run(a, {"b": b})
    assert first.write and first.shared is not None and is_shared(first.shared)
    assert [r["name"] for r in owners(first.shared)] == ["a", "b"]
    shared = StreamTopology.model_validate(first.shared)
    assert sorted(op.kind for op in shared.spec.operators) == ["filter", "map", "sink", "source"]
    # a runs only its own operators, reading the published result of the prefix's last operator
    assert [op.name for op in first.deploy.spec.operators] == ["tag", "agg-a", "out"]
    stream = first.deploy.spec.operator("tag").source.stream
    assert stream and stream.startswith("shared-")
    assert first.status() == {"sharedTopology": first.shared["metadata"]["name"], "reads": [stream]}

    # b, reconciled next, is already an owner: it joins without writing anything
    second = run(b, {"a": a, first.shared["metadata"]["name"]: stored(first.shared)})
    assert not second.write
    assert second.deploy.spec.operator("tag").source.stream == stream
    assert [op.name for op in second.deploy.spec.operators] == ["tag", "agg-b", "out"]


def test_a_newcomer_joins_an_existing_part_and_a_running_topology_is_not_rewired():
    a, b = topology("a"), topology("b", window="20s")
    part = stored(run(a, {"b": b}).shared)
    name = part["metadata"]["name"]
    c = topology("c", window="30s")
    joined = run(c, {"a": a, "b": b, name: part})
    assert joined.write and [r["name"] for r in owners(joined.shared)] == ["a", "b", "c"]
    assert joined.shared["metadata"]["resourceVersion"] == "1"  # optimistic: a concurrent change conflicts
    running = run(topology("d", window="40s"), {"a": a, name: part}, deployed=True)
    assert running.shared is None and running.deploy.spec.operator("src").source.generator == "sequence"


def test_a_lone_new_topology_waits_for_partners_then_starts_whole():
    with pytest.raises(WaitForPartners) as wait:
        run(topology("a", age=4.0), {})
    assert wait.value.seconds == pytest.approx(6.0)
    alone = run(topology("a", age=11.0), {})
    assert alone.shared is None and not alone.write and len(alone.deploy.spec.operators) == 5
    unstamped = topology("a")
    del unstamped["metadata"]["creationTimestamp"]  # nothing to wait from: it starts whole at once
    assert run(unstamped, {}).deploy.spec.operator("src").source.generator == "sequence"


def test_opted_out_and_different_topologies_share_nothing():
    assert run(topology("a", sharing=False), {"b": topology("b")}).shared is None
    other = topology("b")
    other["spec"]["operators"][1]["expr"] = "value % 7 <> 0"  # another filter: only the source is common
    decision = run(topology("a"), {"b": other})
    shared = StreamTopology.model_validate(decision.shared)
    assert [op.kind for op in shared.spec.operators] == ["source", "sink"]
    assert decision.deploy.spec.operator("src").source.stream == decision.status()["reads"][0]


def test_a_member_whose_spec_no_longer_matches_leaves_and_runs_whole():
    a, b = topology("a"), topology("b", window="20s")
    part = stored(run(a, {"b": b}).shared)
    changed = topology("a")
    changed["spec"]["operators"][0]["source"]["seed"] = 7  # another feed: nothing in common any more
    left = run(changed, {"b": b, part["metadata"]["name"]: part}, deployed=True)
    assert left.write and [r["name"] for r in owners(left.shared)] == ["b"]
    assert left.status() == {} and left.deploy.spec.operator("src").source.generator == "sequence"


def test_a_cycle_through_named_streams_is_refused_naming_the_field():
    a = topology("a")
    a["spec"]["operators"][-1]["sink"] = {"stream": "x"}
    loop = topology("b")
    loop["spec"]["operators"][0]["source"] = {"stream": "x"}
    loop["spec"]["operators"][-1]["sink"] = {"stream": "y"}
    a["spec"]["operators"][0]["source"] = {"stream": "y"}
    with pytest.raises(TopologyError) as error:
        run(a, {"b": loop})
    assert error.value.problems == [
        (
            "spec.sharing",
            "topologies feed each other in a cycle: team/a -> stream x -> team/b -> stream y -> team/a",
        )
    ]


def test_a_cycle_among_other_topologies_does_not_refuse_this_one():
    x, y = topology("x", sharing=False), topology("y", sharing=False)
    x["spec"]["operators"][0]["source"] = {"stream": "p"}
    x["spec"]["operators"][-1]["sink"] = {"stream": "q"}
    y["spec"]["operators"][0]["source"] = {"stream": "q"}
    y["spec"]["operators"][-1]["sink"] = {"stream": "p"}
    decision = run(topology("a"), {"x": x, "y": y, "b": topology("b", window="20s")})
    assert decision.shared is not None and [r["name"] for r in owners(decision.shared)] == ["a", "b"]


def test_an_invalid_partner_is_left_out_and_the_others_still_found_the_part():
    bad = topology("aa-bad")
    bad["spec"]["operators"][1]["inputs"] = ["missing"]
    decision = run(topology("a"), {"aa-bad": bad, "b": topology("b", window="20s")})
    assert [r["name"] for r in owners(decision.shared)] == ["a", "b"]


def test_sharing_across_namespaces_is_refused_naming_the_field():
    doc = topology("a")
    doc["spec"]["sharing"]["scope"] = "Cluster"
    with pytest.raises(TopologyError) as error:
        admit(doc, None)
    assert error.value.problems[0][0] == "spec.sharing.scope"
    assert "across namespaces is not allowed" in error.value.problems[0][1]


def test_topologies_that_can_share_executors_found_one_fused_topology_and_run_nothing_of_their_own():
    a, b = topology("a", alike=True), topology("b", window="20s", alike=True)
    first = run(a, {"b": b})
    assert first.deploy is None and first.write and is_fused(first.shared) and not is_shared(first.shared)
    name = first.shared["metadata"]["name"]
    assert name.startswith("fused-") and [r["name"] for r in owners(first.shared)] == ["a", "b"]
    fused = StreamTopology.model_validate(first.shared)
    assert [op.name for op in fused.spec.operators] == [
        "src",
        "clean",
        "tag",
        "a-agg-a",
        "a-out",
        "b-agg-b",
        "b-out",
    ]
    assert first.shared["spec"]["upgrade"] == {"mode": "keepState", "allowNonRestoredState": True}
    assert members(first.shared)["b"]["agg-b"] == "b-agg-b"
    assert first.status() == {"fusedTopology": name, "operators": members(first.shared)["a"]}

    # b, reconciled next (or after an operator restart), finds itself a member: nothing to write
    second = run(b, {"a": a, name: stored(first.shared)})
    assert second.deploy is None and not second.write and second.operators == members(first.shared)["b"]


def test_a_newcomer_joins_a_fused_topology_as_a_spec_change_that_keeps_every_running_name():
    a, b = topology("a", alike=True), topology("b", window="20s", alike=True)
    fused = stored(run(a, {"b": b}).shared)
    name = fused["metadata"]["name"]
    joined = run(topology("c", window="30s", alike=True), {"a": a, "b": b, name: fused})
    assert joined.deploy is None and joined.write and joined.shared["metadata"]["name"] == name
    assert [r["name"] for r in owners(joined.shared)] == ["a", "b", "c"]
    assert joined.shared["metadata"]["resourceVersion"] == "1"  # optimistic: a concurrent change conflicts
    for member in ("a", "b"):
        assert members(joined.shared)[member] == members(fused)[member]
    old, new = StreamTopology.model_validate(fused), StreamTopology.model_validate(joined.shared)
    upgrade = plan_upgrade(old.spec, new.spec)
    assert not upgrade.refused and [d.name for d in upgrade.operators if d.change == "added"] == [
        "c-agg-c",
        "c-out",
    ]

    # one the running state cannot take (a faster feed would move every later record's event time) does
    # not join: with no partner left it starts whole
    faster = topology("d", alike=True)
    faster["spec"]["operators"][0]["source"]["ratePerSecond"] = 1000
    alone = run(faster, {"a": a, "b": b, name: fused})
    assert alone.shared is None and alone.deploy.spec.operator("src").source.generator == "sequence"


def test_a_member_change_the_fused_state_cannot_take_is_refused_on_the_member_naming_the_field():
    a, b = topology("a", alike=True), topology("b", window="20s", alike=True)
    fused = stored(run(a, {"b": b}).shared)
    name = fused["metadata"]["name"]
    edited = topology("a", window="15s", alike=True)  # another window: the aggregate's state is unreadable
    with pytest.raises(TopologyError) as error:
        run(edited, {"b": b, name: fused}, deployed=False)
    field, message = error.value.problems[0]
    assert field.startswith(f"{name}: spec.operators[") and "window" in field and "a-agg-a" in message
    # the admission webhook refuses the edit before it is stored, with the same problems
    namespace = {"a": edited, "b": b, name: fused}
    assert member_change_problems(edited, admit(edited, None), namespace, lambda d: admit(d, None)) == (
        error.value.problems
    )
    unedited = {"a": a, "b": b, name: fused}
    assert member_change_problems(b, admit(b, None), unedited, lambda d: admit(d, None)) == []
    # a member's executors are the fused topology's: another image is refused, naming the field
    other = topology("a", alike=True)
    other["spec"]["image"] = "registry.example/streamtopo:custom"
    [(field, message)] = member_change_problems(other, admit(other, None), unedited, lambda d: admit(d, None))
    assert field == "spec.image" and name in message
    # suspending or pinning one member would stop or pin all: set on the fused topology, it stays there
    paused = topology("a", alike=True)
    paused["spec"]["suspend"] = True
    [(field, message)] = member_change_problems(
        paused, admit(paused, None), unedited, lambda d: admit(d, None)
    )
    assert field == "spec.suspend" and f"set spec.suspend on {name}" in message
    suspended = stored(fused)
    suspended["spec"]["suspend"] = True
    assert run(b, {"a": a, name: suspended}).shared["spec"]["suspend"] is True
    edited["spec"]["upgrade"] = {"mode": "resetState"}
    taken = run(edited, {"b": b, name: fused})
    assert taken.write and taken.shared["spec"]["upgrade"]["mode"] == "resetState"
    assert members(taken.shared)["a"] == members(fused)["a"]


def test_a_deleted_member_takes_its_operators_and_their_state_out_and_the_last_one_the_topology():
    a, b = topology("a", alike=True), topology("b", window="20s", alike=True)
    fused = stored(run(a, {"b": b}).shared)
    left = leave_fused(fused, "uid-a", {"b": b, fused["metadata"]["name"]: fused}, lambda d: admit(d, None))
    assert [r["name"] for r in owners(left)] == ["b"] and list(members(left)) == ["b"]
    old, new = StreamTopology.model_validate(fused), StreamTopology.model_validate(left)
    assert [op.name for op in new.spec.operators] == ["src", "clean", "tag", "b-agg-b", "b-out"]
    upgrade = plan_upgrade(old.spec, new.spec)  # a's aggregate holds state: dropped, not refused
    assert not upgrade.refused and [d.name for d in upgrade.removed] == ["a-agg-a", "a-out"]
    last = leave_fused(stored(left), "uid-b", {}, lambda d: admit(d, None))
    assert owners(last) == []  # the operator then deletes it
    # b's spec unreadable (or b gone too): a leaves as an owner; its operators wait for the next change
    broken = copy.deepcopy(b)
    broken["spec"]["operators"][1]["inputs"] = ["missing"]
    for namespace in ({"b": broken}, {}):
        kept = leave_fused(fused, "uid-a", namespace, lambda d: admit(d, None))
        assert [r["name"] for r in owners(kept)] == ["b"] and kept["spec"] == fused["spec"]


def test_topologies_whose_executors_differ_share_through_a_shared_part_instead():
    a, b = topology("a", alike=True), topology("b", window="20s", alike=True)
    b["spec"]["executor"] = {"resources": {"memory": "4Gi"}}
    decision = run(a, {"b": b})
    assert decision.deploy is not None and is_shared(decision.shared)


@pytest.fixture
def valkey() -> Iterator[redis.Redis]:
    server = EmbeddedValkey().start()
    try:
        yield redis.Redis.from_url(server.url)
    finally:
        server.stop()


def test_trim_keeps_what_the_slowest_reader_has_not_consumed(valkey: redis.Redis):
    consumer = run(topology("a"), {"b": topology("b", window="20s")}).deploy
    stream = consumer.spec.operator("tag").source.stream
    key = Keys.of(consumer).sink_stream(stream)
    ids = [valkey.xadd(key, {"n": i}).decode() for i in range(10)]
    units = reader_units(consumer, stream)
    assert units == [Keys.of(consumer).unit("tag/0")]  # one key group: each fetches the whole stream
    other = Keys("b", NS).unit("tag/0")
    assert trim_point(valkey, key, [*units, other]) is None  # a reader that committed nothing holds it
    valkey.hset(units[0], "rec", UnitRecord(offsets={key: ids[6]}).encode())
    valkey.hset(other, "rec", UnitRecord(offsets={key: ids[3]}).encode())
    assert trim_point(valkey, key, [*units, other]) == ids[3]
    assert trim(valkey, key, [*units, other]) == 3
    assert [i.decode() for i, _ in valkey.xrange(key)] == ids[3:]
