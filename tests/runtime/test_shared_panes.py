"""C-MR's sub-windows shared across aggregates (runtime/operators/shared_panes.py): who shares, and that
sharing changes nothing in the output, across executors, migrations and a crash."""

from __future__ import annotations

import math
from collections import defaultdict
from fractions import Fraction

import pandas as pd
import pytest
from runtime_support import (
    Running,
    migrate_crash_and_finish,
    read_lines,
    round_robin,
    wait_finished,
    write_routing,
)

from streamtopo.contracts import Keys
from streamtopo.planner.model import StreamTopology
from streamtopo.runtime.embedded import EmbeddedValkey
from streamtopo.runtime.executor import Executor, ExecutorConfig
from streamtopo.runtime.operators import AggregateOperator, SharedPanes, build_operators, sharing_groups
from streamtopo.runtime.operators.state import ipc_to_frame
from streamtopo.runtime.transport import connect

RATE = 256  # records per second of event time: ts = seq / 256 is exact in binary
COUNT = 2048  # 8 s of event time
KEYS = 5
WINDOWS = {"fast": (1.0, 0.25), "slow": (2.0, 0.5)}
"""(size, slide) of the two averages of the run test: a common pane of 0.25 s."""


def topology(name: str, rate: float = RATE, aggregates: list[dict] | None = None) -> StreamTopology:
    """numbers -> doubled -> the aggregates, each into a file sink of its own."""
    aggregates = aggregates or [
        {
            "name": "fast",
            "window": {"size": 1.0, "slide": 0.25},
            "aggregations": ["avg(value) AS mean", "count(*) AS n"],
        },
        {
            "name": "slow",
            "window": {"size": 2.0, "slide": 0.5},
            "aggregations": ["sum(value) AS total", "max(value) AS hi"],
        },
    ]
    operators: list[dict] = [
        {
            "name": "numbers",
            "kind": "source",
            "source": {"generator": "sequence", "ratePerSecond": rate, "count": COUNT, "keys": KEYS},
        },
        {"name": "doubled", "kind": "map", "inputs": ["numbers"], "select": ["key", "value * 2 AS value"]},
    ]
    for agg in aggregates:
        operators.append({"kind": "aggregate", "inputs": ["doubled"], "keyBy": ["key"], **agg})
        operators.append(
            {"name": f"{agg['name']}-out", "kind": "sink", "inputs": [agg["name"]], "sink": {"file": {}}}
        )
    return StreamTopology.model_validate(
        {"metadata": {"name": name}, "spec": {"keyGroups": 3, "operators": operators}}
    )


# ------------------------------------------------------------------------------------------ who shares


def test_aggregates_of_one_input_and_key_share_the_hcf_of_their_windows_as_pane():
    [group] = sharing_groups(topology("share").spec)
    assert group.input == "doubled" and group.members == ("fast", "slow")
    assert group.pane == Fraction(1, 4) and group.keys == ("key",)
    # avg needs Spark's Average buffer (its own sum, in double for a bigint), the count and the argument's
    # type; count(*) counts rows; avg's count and max's argument are shared once each.
    assert sorted((a.fn, a.arg) for a in group.partials) == [
        ("arg_type", "value"),
        ("avg_sum", "value"),
        ("count", "1"),
        ("count", "value"),
        ("max", "value"),
        ("sum", "value"),
    ]
    operators = build_operators(topology("share").spec, [group])
    assert [(operators[m].windowing.pane, operators[m].combine) for m in group.members] == [(0.25, True)] * 2


def test_aggregates_of_different_pane_groups_keep_their_own_panes():
    grouped = topology("share").model_dump(mode="json", by_alias=True, exclude_none=True)
    for body in grouped["spec"]["operators"]:
        if body["name"] == "slow":
            body["paneGroup"] = "b"
    assert sharing_groups(StreamTopology.model_validate(grouped).spec) == []


def test_the_pane_is_common_to_every_member_not_only_each_ones_own_hcf():
    aggregates = [
        {"name": "a", "window": {"size": 6.0, "slide": 4.0}, "aggregations": ["count(*) AS n"]},
        {"name": "b", "window": {"size": 10.0, "slide": 5.0}, "aggregations": ["count(*) AS n"]},
    ]
    [group] = sharing_groups(topology("share-hcf", aggregates=aggregates).spec)
    assert group.pane == 1  # HCF(6, 4) = 2, HCF(10, 5) = 5: only 1 divides all four
    a = build_operators(topology("share-hcf", aggregates=aggregates).spec, [group])["a"].windowing
    assert (a.pane, a.a, a.b) == (1.0, 4, 6)


@pytest.mark.parametrize(
    "other,why",
    [
        ({"window": {"size": 1.0}}, "a tumbling window gains nothing from panes: t (w - s) = 0"),
        ({"window": {"size": 2.0, "slide": 0.5}, "keyBy": ["value"]}, "another key routes records elsewhere"),
    ],
)
def test_an_aggregate_that_would_not_gain_or_is_keyed_otherwise_stays_out(other, why):
    aggregates = [
        {"name": "fast", "window": {"size": 1.0, "slide": 0.25}, "aggregations": ["count(*) AS n"]},
        {"name": "other", "aggregations": ["count(*) AS n"], **other},
    ]
    assert sharing_groups(topology("share-out", aggregates=aggregates).spec) == [], why


def test_c_mr_rule_decides_with_the_groups_pane():
    # t (w - s) > w / k with t the records per second per key: 1 s / 0.25 s windows, k = 0.25, w / k = 4.
    # At 10 records/s over 5 keys, t = 2: 2 x 0.75 = 1.5 < 4 for fast, 2 x 1.5 = 3 < 4 for slow.
    assert sharing_groups(topology("share-slow", rate=10).spec) == []
    # At 20/s, t = 4: fast 3 < 4 stays out, slow 6 > 4 alone is no group.
    assert sharing_groups(topology("share-slow", rate=20).spec) == []
    assert len(sharing_groups(topology("share-slow", rate=40).spec)) == 1  # t = 8: 6 > 4 and 12 > 4


# --------------------------------------------------------------------------------------------- the run


def reference() -> dict[str, dict[tuple[int, float], tuple]]:
    """Per sink, (key, window start) -> its values, from the generator's definition record by record."""
    cells: dict[str, dict[tuple[int, float], list[int]]] = {name: defaultdict(list) for name in WINDOWS}
    for seq in range(COUNT):
        ts = Fraction(seq, RATE)
        for name, (w, s) in WINDOWS.items():
            size, slide = Fraction(w), Fraction(s)
            for n in range(math.floor((ts - size) / slide) + 1, math.floor(ts / slide) + 1):
                cells[name][(seq % KEYS, float(n * slide))].append(2 * seq)
    return {
        "fast": {k: (sum(v) / len(v), len(v)) for k, v in cells["fast"].items()},
        "slow": {k: (sum(v), max(v)) for k, v in cells["slow"].items()},
    }


def outputs(out) -> dict[str, dict[tuple[int, float], list[tuple]]]:
    """Per sink, (key, window start) -> every value tuple written (a duplicate shows as two)."""
    got: dict[str, dict[tuple[int, float], list[tuple]]] = {}
    for name, columns in (("fast", ("mean", "n")), ("slow", ("total", "hi"))):
        got[name] = defaultdict(list)
        for line in read_lines(out, f"{name}-out"):
            got[name][(int(line["key"]), float(line["window_start"]))].append(tuple(line[c] for c in columns))
    return got


@pytest.mark.valkey
@pytest.mark.spark
@pytest.mark.parametrize("share", [True, False], ids=["shared", "apart"])
def test_shared_sub_windows_give_the_output_each_aggregate_gives_alone(spark, tmp_path, monkeypatch, share):
    """Two executors; a member, the map feeding both and a source unit move; one executor crashes. With
    sharing and without, each aggregate's every window is written once, with the values computed record
    by record: partials of the common pane cross executors and hand-overs as each aggregate's own."""
    top = topology(f"panes-{'shared' if share else 'apart'}")
    assert len(sharing_groups(top.spec)) == 1  # the rule says share: ``share`` alone decides the run
    jobs: dict[str, int] = defaultdict(int)
    for cls, method in ((SharedPanes, "compute"), (AggregateOperator, "partials")):
        original = getattr(cls, method)

        def counted(self, frame, _original=original, _name=f"{cls.__name__}.{method}"):
            jobs[_name] += 1
            return _original(self, frame)

        monkeypatch.setattr(cls, method, counted)
    routing_path = tmp_path / "routing.json"
    table = round_robin(top, ["ex-0", "ex-1"])
    write_routing(routing_path, table)
    with EmbeddedValkey() as valkey:
        migrate_crash_and_finish(
            top,
            routing_path,
            table,
            valkey.url,
            tmp_path / "out",
            [("slow", 1), ("doubled", 2), ("fast", 0), ("numbers", 1)],
            ExecutorConfig(share_panes=share),
        )
    # Shared: one job per step for both members wherever they run; apart: each its own (in its consumer,
    # or as map-side combine when it runs on the other executor).
    assert (jobs["SharedPanes.compute"] > 0, jobs["AggregateOperator.partials"] > 0) == (share, not share), (
        jobs
    )
    got, expected = outputs(tmp_path / "out"), reference()
    for name in WINDOWS:
        duplicated = {k: v for k, v in got[name].items() if len(v) > 1}
        assert not duplicated, (name, list(duplicated.items())[:3])
        written = {k: v[0] for k, v in got[name].items()}
        assert written.keys() == expected[name].keys(), name
        wrong = {k: (written[k], v) for k, v in expected[name].items() if written[k] != pytest.approx(v)}
        assert not wrong, (name, list(wrong.items())[:3])


@pytest.mark.valkey
@pytest.mark.spark
def test_a_record_failing_the_shared_job_is_dead_lettered_by_each_member(spark, tmp_path):
    """An aggregation fails on some records (ANSI division by zero) inside the shared job: the step is
    redone eagerly, where each member folds its records itself, so each dead-letters them under its own
    name and every other record still counts, once."""
    failing = "sum(value / (value % 200 - 26)) AS q"  # value = 2 seq: fails where seq % 100 == 13
    aggregates = [
        {"name": "fast", "window": {"size": 1.0, "slide": 0.25}, "aggregations": ["count(*) AS n", failing]},
        {"name": "slow", "window": {"size": 2.0, "slide": 0.5}, "aggregations": ["count(*) AS n", failing]},
    ]
    top = topology("panes-poison", aggregates=aggregates)
    assert len(sharing_groups(top.spec)) == 1
    routing = tmp_path / "routing.json"
    write_routing(routing, round_robin(top, ["ex-0"]))
    with EmbeddedValkey() as valkey:
        running = Running(Executor(top, routing, "ex-0", valkey.url, output_dir=tmp_path / "out"))
        try:
            wait_finished(running.executor.store, top)
        finally:
            running.stop()
        letters = connect(valkey.url).xrange(Keys("panes-poison").dead_letters)
    bad = [seq for seq in range(COUNT) if seq % 100 == 13]
    for name in ("fast", "slow"):
        mine = [f for _, f in letters if f[b"operator"] == name.encode()]
        assert mine and {f[b"field"] for f in mine} == {b"aggregations"}, name
        dead = pd.concat([ipc_to_frame(f[b"d"]) for f in mine])
        assert sorted((dead["value"] // 2).tolist()) == bad, name
        size, slide = (Fraction(v) for v in WINDOWS[name])
        expected: dict[tuple[int, float], int] = defaultdict(int)
        for seq in set(range(COUNT)) - set(bad):
            ts = Fraction(seq, RATE)
            for n in range(math.floor((ts - size) / slide) + 1, math.floor(ts / slide) + 1):
                expected[(seq % KEYS, float(n * slide))] += 1
        written = [
            ((int(r["key"]), float(r["window_start"])), int(r["n"]))
            for r in read_lines(tmp_path / "out", f"{name}-out")
        ]
        assert sorted(written) == sorted(expected.items()), name
