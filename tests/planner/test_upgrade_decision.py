"""The upgrade decision table (planner/upgrade.py): per operator keep, reset or refuse, with the field.

Each case edits one field of a base pipeline as a user would (a dict edit of the document) and states what
the running state allows: a change the state layout does not see keeps it; one it does is refused under
keepState naming the field, reset under resetState; a generator's rate and the transport are refused in
both modes.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from streamtopo.documents import load_topology
from streamtopo.planner.model import StreamTopologySpec
from streamtopo.planner.upgrade import fingerprint, plan_upgrade, restarts

BASE: dict[str, Any] = {
    "keyGroups": 4,
    "operators": [
        {"name": "trades", "kind": "source", "source": {"generator": "trades", "ratePerSecond": 1000}},
        {"name": "quotes", "kind": "source", "source": {"stream": "quotes-in", "ratePerSecond": 500}},
        {"name": "valid", "kind": "filter", "inputs": ["trades"], "expr": "price > 0"},
        {
            "name": "notional",
            "kind": "map",
            "inputs": ["valid"],
            "select": ["symbol", "price * volume AS pv"],
        },
        {
            "name": "vwap",
            "kind": "aggregate",
            "inputs": ["notional"],
            "keyBy": ["symbol"],
            "window": {"size": "10s"},
            "aggregations": ["sum(pv) AS pv", "count(*) AS n"],
        },
        {
            "name": "keyed",
            "kind": "map",
            "inputs": ["valid"],
            "keyBy": ["symbol"],
            "select": ["symbol", "price"],
        },
        {"name": "highs", "kind": "aggregate", "inputs": ["keyed"], "aggregations": ["max(price) AS hi"]},
        {
            "name": "match",
            "kind": "join",
            "inputs": ["valid", "quotes"],
            "keyBy": ["symbol"],
            "window": {"size": "5s"},
        },
        {"name": "enrich", "kind": "udf", "inputs": ["match"], "function": "mypkg.enrich:apply"},
        {"name": "out", "kind": "sink", "inputs": ["vwap"], "sink": {"file": {"path": "vwap"}}},
        {"name": "matched", "kind": "sink", "inputs": ["enrich"], "sink": {"stream": "matched"}},
        {"name": "hi-out", "kind": "sink", "inputs": ["highs"], "sink": {"console": {}}},
    ],
}


def spec(edit: Callable[[dict[str, Any]], None] | None = None, mode: str | None = None) -> StreamTopologySpec:
    doc = copy.deepcopy(BASE)
    if edit is not None:
        edit(doc)
    if mode is not None:
        doc["upgrade"] = {"mode": mode}
    return load_topology({"metadata": {"name": "t"}, "spec": doc}).spec


def op(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(o for o in doc["operators"] if o["name"] == name)


def setter(name: str, *path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        target = op(doc, name)
        for key in path[:-1]:
            target = target.setdefault(key, {})
        target[path[-1]] = value

    return edit


def remove(name: str) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        doc["operators"] = [o for o in doc["operators"] if o["name"] != name]
        for other in doc["operators"]:
            if name in other.get("inputs", []):
                other["inputs"] = [i if i != name else "valid" for i in other["inputs"]]

    return edit


def chain(*edits: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        for e in edits:
            e(doc)

    return edit


COMPATIBLE = {
    "a filter's predicate": setter("valid", "expr", value="price > 0 AND volume > 0"),
    "a map's select": setter("notional", "select", value=["symbol", "price * volume * 1.0 AS pv"]),
    "a UDF's function": setter("enrich", "function", value="mypkg.enrich:apply_v2"),
    "a generator's seed": setter("trades", "source", "seed", value=7),
    "a generator's keys": setter("trades", "source", "keys", value=8),
    "a generator's count": setter("trades", "source", "count", value=10**6),
    "a stream sink's stream": setter("matched", "sink", value={"stream": "matched-v2"}),
    "a stateless operator's key groups": setter("enrich", "keyGroups", value=8),
    "a keyed map's key": chain(
        setter("keyed", "keyBy", value=["price"]), setter("highs", "keyBy", value=["symbol"])
    ),
    "an added operator": lambda doc: doc["operators"].append(
        {"name": "audit", "kind": "sink", "inputs": ["valid"], "sink": {"file": {}}}
    ),
    "a removed stateless operator": chain(remove("enrich"), setter("matched", "inputs", value=["match"])),
    "aggregations written with other spacing": setter(
        "vwap", "aggregations", value=["sum(pv)  AS pv", "count(*)   AS n"]
    ),
}

CONTROL_ONLY = {
    "a cost": setter("vwap", "cost", value={"cpu": 0.5}),
    "a stream source's rate": setter("quotes", "source", "ratePerSecond", value=5000),
    "a node selector": setter("vwap", "requires", value={"nodeSelector": {"disk": "ssd"}}),
    "autoscaling": lambda doc: doc.update(autoscaling={"maxExecutors": 4, "targetUtilization": 0.6}),
    "constraints": lambda doc: doc.update(constraints={"peColocation": [["valid", "notional"]]}),
    "a stream's expected rate": lambda doc: doc.update(
        streams=[{"from": "valid", "to": "notional", "rate": 9}]
    ),
    "the upgrade mode": lambda doc: doc.update(upgrade={"mode": "resetState"}),
}

# (change, operator, field named, drops in-flight entries on reset)
INCOMPATIBLE = {
    "an aggregate's aggregations": (
        setter("vwap", "aggregations", value=["sum(pv) AS pv", "count(*) AS n", "max(pv) AS top"]),
        "vwap",
        "spec.operators[4].aggregations",
        True,
    ),
    "an aggregate's window": (
        setter("vwap", "window", value={"size": "20s"}),
        "vwap",
        "spec.operators[4].window",
        True,
    ),
    "an aggregate's key": (
        chain(
            setter("notional", "select", value=["symbol", "volume", "price * volume AS pv"]),
            setter("vwap", "keyBy", value=["volume"]),
        ),
        "vwap",
        "spec.operators[4].keyBy",
        True,
    ),
    "an aggregate's key groups": (
        setter("vwap", "keyGroups", value=8),
        "vwap",
        "spec.operators[4].keyGroups",
        True,
    ),
    "an inherited key": (setter("keyed", "keyBy", value=["price"]), "highs", "spec.operators[5].keyBy", True),
    "an aggregate's inputs": (
        setter("highs", "inputs", value=["valid"]),
        "highs",
        "spec.operators[6].keyBy",
        True,
    ),
    "a join's interval": (
        setter("match", "window", value={"size": "9s"}),
        "match",
        "spec.operators[7].window",
        False,
    ),
    "a join's sides": (
        setter("match", "inputs", value=["quotes", "valid"]),
        "match",
        "spec.operators[7].inputs",
        True,
    ),
    "a file sink's path": (
        setter("out", "sink", value={"file": {"path": "vwap-v2"}}),
        "out",
        "spec.operators[9].sink.file.path",
        False,
    ),
    "a source's stream": (
        setter("quotes", "source", "stream", value="quotes-v2"),
        "quotes",
        "spec.operators[1].source.stream",
        False,
    ),
    "a stream source's partitioning by key": (
        setter("quotes", "keyBy", value=["symbol"]),
        "quotes",
        "spec.operators[1].keyBy",
        False,
    ),
    "a generator's key groups": (
        setter("trades", "keyGroups", value=8),
        "trades",
        "spec.operators[0].keyGroups",
        False,
    ),
    "an operator's kind": (
        lambda doc: op(doc, "highs").update(kind="map", select=["symbol"], aggregations=None),
        "highs",
        "spec.operators[6].kind",
        True,
    ),
}


@pytest.mark.parametrize("edit", COMPATIBLE.values(), ids=COMPATIBLE.keys())
def test_compatible_changes_keep_every_operators_state(edit):
    old, new = spec(), spec(edit)
    upgrade = plan_upgrade(old, new)
    assert not upgrade.refused, upgrade.problems
    assert upgrade.restart  # the executors read these fields: they restart, keeping state and offsets
    assert {o.action for o in upgrade.operators} == {"keep"}
    assert not upgrade.reset and not upgrade.writes_state


@pytest.mark.parametrize("edit", CONTROL_ONLY.values(), ids=CONTROL_ONLY.keys())
def test_control_plane_changes_restart_nothing(edit):
    upgrade = plan_upgrade(spec(), spec(edit))
    assert not upgrade.refused and not upgrade.restart
    assert {o.action for o in upgrade.operators} == {"keep"}


@pytest.mark.parametrize("case", INCOMPATIBLE.values(), ids=INCOMPATIBLE.keys())
def test_incompatible_changes_are_refused_naming_the_field_or_reset_on_request(case):
    edit, name, field, drops = case
    old = spec()
    kept = plan_upgrade(old, spec(edit))
    assert kept.refused and kept.of(name).action == "refuse"
    assert (field, kept.of(name).reason) in kept.problems
    assert "resetState" in kept.of(name).reason
    others = [o for o in kept.operators if o.name != name and o.action != "keep"]
    assert not others, others  # only the operator whose layout changed

    reset = plan_upgrade(old, spec(edit, mode="resetState"))
    assert not reset.refused, reset.problems
    decision = reset.of(name)
    assert decision.action == "reset" and decision.field == field and decision.drop_in_flight is drops
    assert [o.name for o in reset.reset] == [name] and reset.writes_state


def test_a_generators_rate_is_refused_in_both_modes():
    """Event time is seq / ratePerSecond from the topology's start: no reset makes a new rate right."""
    edit = setter("trades", "source", "ratePerSecond", value=2000)
    for mode in ("keepState", "resetState"):
        upgrade = plan_upgrade(spec(), spec(edit, mode=mode))
        assert upgrade.of("trades").action == "refuse"
        [(field, message)] = upgrade.problems
        assert field == "spec.operators[0].source.ratePerSecond" and "event time" in message
        assert "1000.0 -> 2000.0" in message


def test_the_transport_is_refused_in_both_modes():
    edit = lambda doc: doc.update(transport={"url": "redis://elsewhere:6379"})  # noqa: E731
    for mode in ("keepState", "resetState"):
        upgrade = plan_upgrade(spec(), spec(edit, mode=mode))
        assert [field for field, _ in upgrade.problems] == ["spec.transport.url"]


def test_a_removed_or_renamed_stateful_operator_is_refused_unless_reset():
    """State is kept by operator name (Flink: non-restored state needs allowNonRestoredState)."""

    def rename(doc: dict[str, Any]) -> None:
        op(doc, "highs")["name"] = "highs-v2"
        op(doc, "hi-out")["inputs"] = ["highs-v2"]

    kept = plan_upgrade(spec(), spec(rename))
    assert kept.of("highs").action == "refuse" and kept.of("highs").change == "removed"
    assert kept.of("highs-v2").action == "keep" and kept.of("highs-v2").change == "added"
    [(field, message)] = kept.problems
    assert field == "spec.operators" and "'highs'" in message and "rename" in message
    reset = plan_upgrade(spec(), spec(rename, mode="resetState"))
    assert not reset.refused and reset.of("highs").action == "reset" and reset.writes_state
    assert [o.name for o in reset.removed] == ["highs"]

    def non_restored(doc: dict[str, Any]) -> None:
        rename(doc)
        doc["upgrade"] = {"allowNonRestoredState": True}

    dropped = plan_upgrade(spec(), spec(non_restored))  # keepState, but the removed state may go
    assert dropped.mode == "keepState" and not dropped.refused and dropped.of("highs").action == "reset"


def test_shared_sub_windows_follow_the_aggregates_of_the_same_input():
    """Two windowed aggregates of one input and key may keep state per common pane: without the runtime's
    facts a change of one's window refuses the other too; with them only a real pane change does."""

    def two(doc: dict[str, Any]) -> None:
        doc["operators"].append(
            {
                "name": "volume",
                "kind": "aggregate",
                "inputs": ["notional"],
                "keyBy": ["symbol"],
                "window": {"size": "30s"},
                "aggregations": ["count(*) AS n"],
            }
        )

    old = spec(two)
    new = spec(chain(two, setter("volume", "window", value={"size": "20s"})))
    upgrade = plan_upgrade(old, new)
    assert {o.name for o in upgrade.operators if o.action == "refuse"} == {"vwap", "volume"}
    assert upgrade.of("vwap").field == "spec.operators[4].window"
    same_pane = ({"vwap": {"pane": "10"}, "volume": {"pane": "10"}},) * 2
    exact = plan_upgrade(old, new, runtime=same_pane)
    assert exact.of("vwap").action == "keep" and exact.of("volume").action == "refuse"
    moved = ({"vwap": {"pane": "10"}}, {"vwap": {"pane": "own"}})
    assert plan_upgrade(old, new, runtime=moved).of("vwap").action == "refuse"

    # in pane groups of their own, one's window is not the other's state
    apart = chain(two, setter("volume", "paneGroup", value="b"))
    upgrade = plan_upgrade(spec(apart), spec(chain(apart, setter("volume", "window", value={"size": "20s"}))))
    assert upgrade.of("vwap").action == "keep" and upgrade.of("volume").action == "refuse"


def test_restarts_reads_the_data_plane_only():
    assert not restarts(spec(), spec())
    reordered = lambda doc: doc["operators"].reverse()  # noqa: E731
    assert not restarts(spec(), spec(reordered))
    assert restarts(spec(), spec(lambda doc: doc.update(image="streamtopo/runtime:0.2.0")))


def test_the_fingerprint_is_the_layout_and_nothing_else():
    base = spec()
    assert fingerprint(base, "valid") == ""  # stateless: nothing to check
    same = spec(chain(setter("valid", "expr", value="price > 1"), lambda doc: doc["operators"].reverse()))
    assert fingerprint(base, "vwap") == fingerprint(same, "vwap") != ""
    changed = spec(setter("vwap", "aggregations", value=["sum(pv) AS pv"]))
    assert fingerprint(base, "vwap") != fingerprint(changed, "vwap")
    assert fingerprint(base, "trades") != fingerprint(spec(setter("trades", "keyGroups", value=8)), "trades")


def test_open_key_groups_keep_the_running_count():
    """Key groups a spec leaves open are sized from the declared rates (Aeolus); once running they stay, as
    Flink keeps a job's max parallelism, so a rate change stays an upgrade that keeps state."""
    doc = {
        "metadata": {"name": "t"},
        "spec": {
            "operators": [
                {"name": "src", "kind": "source", "source": {"generator": "sequence", "ratePerSecond": 1000}},
                {
                    "name": "sum",
                    "kind": "aggregate",
                    "inputs": ["src"],
                    "keyBy": ["key"],
                    "aggregations": ["sum(value) AS total"],
                    "cost": {"cpu": 0.01},
                },
            ]
        },
    }
    running = load_topology(doc).spec
    faster = copy.deepcopy(doc)
    faster["spec"]["operators"][1]["cost"] = {"cpu": 200.0}
    resized = load_topology(faster).spec
    assert resized.key_groups_of("sum") > running.key_groups_of("sum")  # sized afresh: more key groups
    carried = load_topology(faster, running=running).spec
    assert carried.key_groups_of("sum") == running.key_groups_of("sum")
    assert not plan_upgrade(running, carried).refused
    pinned = copy.deepcopy(faster)
    pinned["spec"]["keyGroups"] = 64
    assert load_topology(pinned, running=running).spec.key_groups_of("sum") == 64
