"""A windowed join whose windows hold more pairs than a step emits, run by two executors through
hand-overs and a crash: every pair exactly once (the pairs still to emit travel in the units' state)."""

from __future__ import annotations

from collections import Counter

import pytest
from runtime_support import migrate_crash_and_finish, read_lines, round_robin, write_routing

from streamtopo.planner.model import StreamTopology
from streamtopo.runtime.embedded import EmbeddedValkey
from streamtopo.runtime.operators import join

pytestmark = [pytest.mark.valkey, pytest.mark.spark]


def test_a_join_emitting_over_many_steps_is_exact_across_handovers_and_a_crash(spark, tmp_path, monkeypatch):
    count, rate, keys, window = 400, 40, 5, 2.0  # per window and key 16 x 16 pairs: 6,400 in all
    monkeypatch.setattr(join, "STEP_PAIRS", 60)  # each window's pairs over several steps
    source = {"generator": "sequence", "ratePerSecond": rate, "count": count, "keys": keys}
    topology = StreamTopology.model_validate(
        {
            "metadata": {"name": "join-steps"},
            "spec": {
                "keyGroups": 4,
                "operators": [
                    {"name": "a", "kind": "source", "source": source},
                    {"name": "b", "kind": "source", "source": {**source, "seed": 1}},
                    {
                        "name": "pairs",
                        "kind": "join",
                        "inputs": ["a", "b"],
                        "keyBy": ["key"],
                        "window": {"size": f"{window:g}s"},
                    },
                    {"name": "out", "kind": "sink", "inputs": ["pairs"], "sink": {"file": {}}},
                ],
            },
        }
    )
    routing_path = tmp_path / "routing.json"
    table = round_robin(topology, ["ex-0", "ex-1"])
    write_routing(routing_path, table)
    out = tmp_path / "out"
    with EmbeddedValkey() as valkey:
        migrate_crash_and_finish(
            topology, routing_path, table, valkey.url, out, [("pairs", 0), ("pairs", 3), ("pairs", 1)]
        )
    got = Counter(
        (int(line["key"]), float(line["window_start"]), int(line["a_seq"]), int(line["b_seq"]))
        for line in read_lines(out)
    )
    expected = Counter(
        (i % keys, (i / rate) // window * window, i, j)
        for i in range(count)
        for j in range(count)
        if i % keys == j % keys and (i / rate) // window == (j / rate) // window
    )
    assert sum(expected.values()) == 6_400
    assert got == expected
