"""Fusing topologies that share operators into one (planner/benoit/fuse.py): each member's graph is in
the fused one, operator for operator, with the shared operators once; file sinks write where the member
alone writes; names, key groups, constraints and stream settings carry over."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from streamtopo.documents import load_topology
from streamtopo.planner.benoit.fuse import MAX_OP_NAME, fuse_shared
from streamtopo.planner.benoit.topologies import structural_hashes
from streamtopo.planner.model import StreamTopology, TopologyError

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples" / "sharing").glob("*.yaml"))


def topology(name: str, tail: list[dict[str, Any]], **spec: Any) -> StreamTopology:
    prefix = [
        {"name": "numbers", "kind": "source", "source": {"generator": "sequence", "ratePerSecond": 100}},
        {"name": "kept", "kind": "filter", "inputs": ["numbers"], "expr": "value % 3 <> 0"},
    ]
    return StreamTopology.model_validate(
        {"metadata": {"name": name}, "spec": {"keyGroups": 4, "operators": prefix + tail, **spec}}
    )


def tail(aggregation: str, key_groups: int | None = None, path: str | None = None) -> list[dict[str, Any]]:
    aggregate: dict[str, Any] = {
        "name": "totals",
        "kind": "aggregate",
        "inputs": ["kept"],
        "keyBy": ["key"],
        "aggregations": [aggregation],
    }
    if key_groups:
        aggregate["keyGroups"] = key_groups
    file = {"path": path} if path else {}
    return [aggregate, {"name": "out", "kind": "sink", "inputs": ["totals"], "sink": {"file": file}}]


def test_every_member_runs_whole_in_the_fusion_with_the_shared_operators_once() -> None:
    members = [load_topology(f) for f in EXAMPLES]
    fusion = fuse_shared(members)
    assert fusion is not None
    fused = fusion.topology
    names = [op.name for op in fused.spec.operators]
    assert len(names) == len(set(names))
    theirs = structural_hashes(fused)
    for member in members:
        mine = structural_hashes(member)
        rename = fusion.members[member.metadata.name]
        for op in member.spec.operators:
            twin = fused.spec.operator(rename[op.name])
            # what an operator computes is its inputs' computation and its own fields: equal hashes
            if op.sink is None:
                assert theirs[twin.name] == mine[op.name], (member.metadata.name, op.name)
            else:
                assert [rename[i] for i in op.inputs] == twin.inputs
            assert fused.spec.key_groups_of(twin.name) >= member.spec.key_groups_of(op.name)
            if rename[op.name] not in fusion.shared:
                assert fused.spec.key_groups_of(twin.name) == member.spec.key_groups_of(op.name)
    counted = sum(len(m.spec.operators) for m in members)
    once = sum(len(who) - 1 for who in fusion.shared.values())
    assert len(names) == counted - once
    assert set(fusion.shared) == {"trades", "trades-valid", "trades-notional"}
    assert all(len(who) == 3 for who in fusion.shared.values())


def test_file_sinks_write_where_each_topology_alone_writes_under_the_runs_output() -> None:
    a = topology("a", tail("count(*) AS n"))
    b = topology("b", tail("sum(value) AS total", path="sums/b"))
    fusion = fuse_shared([a, b])
    assert fusion is not None
    paths = {
        op.name: op.sink.file.path
        for op in fusion.topology.spec.operators
        if op.sink is not None and op.sink.file is not None
    }
    assert paths == {fusion.members["a"]["out"]: "a/out", fusion.members["b"]["out"]: "b/sums/b"}
    assert fusion.members["a"] == {"numbers": "numbers", "kept": "kept", "totals": "a-totals", "out": "a-out"}


def test_shared_operators_take_the_highest_rate_and_key_groups_own_ones_keep_theirs() -> None:
    a = topology("a", tail("count(*) AS n", key_groups=2))
    document = topology("b", tail("sum(value) AS total", key_groups=16), keyGroups=8).model_dump(
        mode="json", by_alias=True, exclude_none=True
    )
    document["spec"]["operators"][0]["source"]["ratePerSecond"] = 250.0
    b = StreamTopology.model_validate(document)
    fusion = fuse_shared([a, b])
    assert fusion is not None
    spec = fusion.topology.spec
    assert spec.operator("numbers").source.rate_per_second == 250.0  # type: ignore[union-attr]
    assert spec.key_groups_of("numbers") == 8 and spec.key_groups_of("kept") == 8
    assert spec.key_groups_of("a-totals") == 2 and spec.key_groups_of("b-totals") == 16
    assert spec.key_groups_of("a-out") == 4 and spec.key_groups_of("b-out") == 8


def test_names_stay_operator_names_however_the_topologies_are_named() -> None:
    long = "x" * 52
    a = topology(long, tail("count(*) AS n"))
    b = topology("9lives", tail("sum(value) AS total"))
    fusion = fuse_shared([a, b])
    assert fusion is not None
    for op in fusion.topology.spec.operators:
        assert len(op.name) <= MAX_OP_NAME and op.name[0].isalpha()
    assert fusion.members["9lives"]["totals"] == "t9lives-totals"
    assert fusion.members[long]["totals"] != fusion.members[long]["out"]


def test_constraints_and_stream_settings_carry_over_renamed() -> None:
    a = topology(
        "a",
        tail("count(*) AS n"),
        constraints={"peColocation": [["kept", "totals"]], "hostExlocation": [["numbers", "out"]]},
        streams=[{"from": "kept", "to": "totals", "rate": 10}],
    )
    b = topology(
        "b",
        tail("sum(value) AS total"),
        constraints={"peExlocation": [["numbers", "totals"]]},
        streams=[{"from": "numbers", "to": "kept", "rate": 50}],
    )
    fusion = fuse_shared([a, b])
    assert fusion is not None
    constraints = fusion.topology.spec.constraints
    assert constraints.pe_colocation == [["kept", "a-totals"]]
    assert constraints.host_exlocation == [["numbers", "a-out"]]
    assert constraints.pe_exlocation == [["numbers", "b-totals"]]
    edges = {(s.from_, s.to): s.rate for s in fusion.topology.spec.streams}
    assert edges == {("kept", "a-totals"): 10, ("numbers", "kept"): 50}


def test_topologies_with_nothing_in_common_are_not_fused() -> None:
    a = topology("a", tail("count(*) AS n"))
    other = a.model_dump(mode="json", by_alias=True, exclude_none=True)
    other["metadata"]["name"] = "b"
    other["spec"]["operators"][0]["source"]["generator"] = "trades"
    other["spec"]["operators"][1]["expr"] = "price > 0"
    other["spec"]["operators"][2]["keyBy"] = ["symbol"]
    assert fuse_shared([a, StreamTopology.model_validate(other)]) is None


def test_members_whose_union_is_not_a_topology_are_refused_naming_the_field() -> None:
    a = topology(
        "a",
        tail("count(*) AS n"),
        constraints={"highAvailability": [{"operators": ["kept"], "replicas": 2}]},
    )
    b = topology(
        "b",
        tail("sum(value) AS total"),
        constraints={"highAvailability": [{"operators": ["kept"], "replicas": 3}]},
    )
    with pytest.raises(TopologyError, match="highAvailability"):
        fuse_shared([a, b])


def test_topologies_of_different_namespaces_are_not_fused() -> None:
    a = topology("a", tail("count(*) AS n"))
    other = topology("b", tail("sum(value) AS total")).model_dump(mode="json", by_alias=True)
    other["metadata"]["namespace"] = "team-b"
    with pytest.raises(TopologyError, match="metadata.namespace"):
        fuse_shared([a, StreamTopology.model_validate(other)], across_namespaces=True)


def test_a_fusion_fused_again_keeps_its_name_and_each_running_operator_its_name():
    a, b = topology("a", tail("count(*) AS n", key_groups=8)), topology("b", tail("sum(value) AS s"))
    running = fuse_shared([a, b])
    assert running is not None and running.topology.spec.key_groups_of("kept") == 4
    previous = type(running).running(running.topology, running.members)
    assert previous.shared == running.shared  # what the operator records is enough to carry on

    c = topology("c", tail("max(value) AS m"))
    grown = fuse_shared([a, b, c], previous=previous)
    assert grown is not None and grown.topology.metadata.name == running.topology.metadata.name
    for member in ("a", "b"):
        assert grown.members[member] == running.members[member]
    assert grown.members["c"]["kept"] == "kept" and grown.shared["kept"] == ["a", "b", "c"]

    # b leaves and a is alone: nothing is shared any more, yet the operators a read keep running under
    # the names their state (the source's offsets) is kept by
    alone = fuse_shared([a], previous=type(grown).running(grown.topology, grown.members))
    assert alone is not None and alone.members["a"] == running.members["a"] and not alone.shared
    assert {op.name for op in alone.topology.spec.operators} == set(running.members["a"].values())


def test_a_changed_member_operator_gets_a_new_name_only_where_another_member_still_runs_the_old_one():
    a, b = topology("a", tail("count(*) AS n")), topology("b", tail("sum(value) AS s"))
    running = fuse_shared([a, b])
    assert running is not None
    previous = type(running).running(running.topology, running.members)
    doc = topology("a", tail("count(*) AS n")).model_dump(mode="json", by_alias=True, exclude_none=True)
    doc["spec"]["operators"][1]["expr"] = "value % 5 <> 0"  # a's filter differs: only the source is shared
    edited = StreamTopology.model_validate(doc)
    again = fuse_shared([edited, b], previous=previous)
    assert again is not None
    assert again.members["b"] == running.members["b"]  # b's operators read the same state
    assert again.members["a"]["numbers"] == "numbers"  # the source, still shared, keeps its offsets
    assert again.members["a"]["kept"] not in set(running.topology.spec.by_name())  # a new operator
    # a's own aggregate reads another input now: it keeps its name, and the upgrade rules judge it
    assert again.members["a"]["totals"] == running.members["a"]["totals"] == "a-totals"
