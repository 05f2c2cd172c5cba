"""Generator units whose records only windows see release them at window ends (metrics.SourcePace.released,
windows.closing_windows): the same records, one step per window end instead of one per loop turn."""

from __future__ import annotations

import pytest
from runtime_support import round_robin

from streamtopo.contracts import unit_key
from streamtopo.planner.model import StreamTopology
from streamtopo.planner.source_layout import round_robin as one_of
from streamtopo.runtime.executor import Executor, ExecutorConfig
from streamtopo.runtime.hosting import Hosted
from streamtopo.runtime.metrics import SourcePace
from streamtopo.runtime.operators.windows import closing_windows
from streamtopo.runtime.state_store import UnitRecord

WINDOWED = {
    "kind": "aggregate",
    "keyBy": ["key"],
    "window": {"size": "1s"},
    "aggregations": ["count(*) AS n"],
}
SLIDING = {**WINDOWED, "window": {"size": "5s", "slide": "2s"}}
RUNNING = {"kind": "aggregate", "keyBy": ["key"], "aggregations": ["count(*) AS n"]}
SINK = {"kind": "sink", "sink": {"console": {}}}


def topology(*consumers: dict, through_filter: bool = True) -> StreamTopology:
    """numbers -> [kept (filter)] -> each of ``consumers`` (named c0, c1, ...), each aggregate into a sink."""
    head = "kept" if through_filter else "numbers"
    operators = [
        {
            "name": "numbers",
            "kind": "source",
            "source": {"generator": "sequence", "ratePerSecond": 100, "keys": 5},
        },
        *(
            [{"name": "kept", "kind": "filter", "inputs": ["numbers"], "expr": "value % 2 = 0"}]
            if through_filter
            else []
        ),
    ]
    for i, consumer in enumerate(consumers):
        operators.append({"name": f"c{i}", "inputs": [head], **consumer})
        if consumer["kind"] != "sink":
            operators.append({"name": f"out{i}", "inputs": [f"c{i}"], **SINK})
    return StreamTopology.model_validate(
        {"metadata": {"name": "release"}, "spec": {"keyGroups": 4, "operators": operators}}
    )


@pytest.mark.parametrize(
    "consumers,through_filter,closes",
    [
        ([WINDOWED], True, [(1.0, 1.0)]),
        ([WINDOWED], False, [(1.0, 1.0)]),
        ([WINDOWED, SLIDING], True, [(1.0, 1.0), (2.0, 5.0)]),
        ([WINDOWED, SINK], True, []),  # one path shows every record at once
        ([RUNNING], True, []),  # a running aggregate emits its totals each step
        ([SINK], True, []),
    ],
)
def test_closing_windows_are_those_every_path_ends_in(consumers, through_filter, closes):
    spec = topology(*consumers, through_filter=through_filter).spec
    assert [(w.slide, w.size) for w in closing_windows(spec, "numbers")] == closes


def test_released_is_the_last_window_end_while_few_records_wait():
    pace = SourcePace(t0=1000.0, rate=100.0, layout=one_of(0, 1), closes=((1.0, 1.0), (2.0, 5.0)), hold=1000)
    assert pace.released(1002.5, emitted=0) == 1002.0
    assert pace.released(1007.5, emitted=pace.due(1007.0)) == 1007.0  # 5 s windows end at 5, 7, 9...
    assert pace.released(1012.5, emitted=0) == 1012.5  # 1,251 records due: more than hold
    plain = SourcePace(t0=1000.0, rate=100.0, layout=one_of(0, 1))
    assert plain.released(1002.5, emitted=0) == 1002.5
    ending = SourcePace(
        t0=1000.0, rate=100.0, layout=one_of(0, 1), count=250, closes=((1.0, 1.0),), hold=1000
    )
    assert ending.released(1002.5, emitted=0) == 1002.5  # all 250 due: the end of stream goes out now


@pytest.mark.parametrize("consumer,held", [(WINDOWED, 100_000), (SINK, 100_000), (WINDOWED, 5)])
def test_an_executor_generates_up_to_the_last_window_end(consumer, held):
    """Through the executor's own step planning (no Spark job, no Valkey): what each source unit takes."""
    top = topology(consumer)
    executor = Executor(
        top, "unused-routing.json", "ex-0", "redis://127.0.0.1:1", config=ExecutorConfig(held_records=held)
    )
    executor.t0 = 1000.0
    for (op, kg), _ in round_robin(top, ["ex-0"]).assignment().items():
        executor.hosted[unit_key((op, kg))] = Hosted(op, kg, 1, UnitRecord(), None)
    units = sorted((u for u in executor.hosted.values() if u.op == "numbers"), key=lambda u: u.kg)
    paces = executor._paces(units)
    windowed = consumer is WINDOWED and held > 100
    requests, left = executor._requests(units, paces, 1002.5)
    taken = {kg: n for kg, _, n in requests}
    assert not left  # every unit's due records fit its cap: the step is not behind
    assert taken == {u.kg: paces[u.kg].due(1002.0 if windowed else 1002.5) for u in units}
    for unit in units:
        unit.rec.emitted = taken[unit.kg]
    assert executor._due(units, 1002.9) == (
        0 if windowed else sum(p.due(1002.9) - taken[kg] for kg, p in paces.items())
    )
    assert executor._due(units, 1003.01) == sum(
        p.due(1003.0 if windowed else 1003.01) - taken[kg] for kg, p in paces.items()
    )
