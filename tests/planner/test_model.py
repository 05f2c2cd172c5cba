"""The StreamTopology model: loading, aliases, durations, and the cross-field checks naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from streamtopo.documents import load_topology
from streamtopo.planner.model import TopologyError, format_duration, parse_duration

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.yaml"))
SRC = {"name": "src", "kind": "source", "source": {"generator": "trades"}}
SINK = {"name": "out", "kind": "sink", "inputs": ["src"], "sink": {"console": {}}}


def problems(spec: dict) -> list[tuple[str, str]]:
    with pytest.raises(TopologyError) as caught:
        load_topology({"metadata": {"name": "t"}, "spec": spec})
    return caught.value.problems


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_load_and_round_trip(path: Path):
    topology = load_topology(path)
    assert topology.api_version == "streamtopo.dev/v1alpha1"
    dumped = topology.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert load_topology(yaml.safe_dump(dumped)) == topology


def test_camel_and_snake_case_are_the_same_field():
    camel = {
        "name": "src",
        "kind": "source",
        "source": {"generator": "trades", "ratePerSecond": 50},
        "keyGroups": 3,
    }
    snake = {
        "name": "src",
        "kind": "source",
        "source": {"generator": "trades", "rate_per_second": 50},
        "key_groups": 3,
    }
    a = load_topology({"metadata": {"name": "t"}, "spec": {"operators": [camel, SINK]}})
    b = load_topology({"metadata": {"name": "t"}, "spec": {"operators": [snake, SINK]}})
    assert a == b
    assert a.spec.operators[0].source.rate_per_second == 50
    assert a.spec.key_groups_of("src") == 3 and a.spec.key_groups_of("out") == 32


def test_bare_spec_is_accepted():
    topology = load_topology({"operators": [SRC, SINK]})
    assert [op.name for op in topology.spec.operators] == ["src", "out"]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("250ms", 0.25),
        ("90s", 90),
        ("5m", 300),
        ("1.5h", 5400),
        ("2d", 172800),
        (12, 12),
        ("7", 7),
        ("1m30s", 90),
        ("2h45m", 9900),
        ("1h0m0.5s", 3600.5),
        ("1m500ms", 60.5),
    ],
)
def test_durations(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)
    assert parse_duration(format_duration(parse_duration(text))) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["ten seconds", "-5s", True, "5 weeks", None, "1m 30s", "m30s", "1x", "5s5"])
def test_bad_durations_are_refused(bad):
    with pytest.raises(ValueError):
        parse_duration(bad)


def test_every_problem_is_reported_at_once():
    found = problems(
        {
            "operators": [
                SRC,
                {"name": "a", "kind": "filter", "inputs": ["nope"], "expr": "x > 0"},
                {"name": "b", "kind": "join", "inputs": ["src"], "keyBy": ["k"], "window": {"size": 5}},
                {"name": "out", "kind": "sink", "inputs": ["a", "also-nope"], "sink": {"console": {}}},
            ]
        }
    )
    paths = [path for path, _ in found]
    assert "spec.operators[1].inputs[0]" in paths
    assert "spec.operators[2].inputs" in paths
    assert "spec.operators[3].inputs[1]" in paths


def test_a_cycle_is_reported_once_with_its_path():
    found = problems(
        {
            "operators": [
                SRC,
                {"name": "a", "kind": "map", "inputs": ["src", "b"], "select": ["x"]},
                {"name": "b", "kind": "map", "inputs": ["a"], "select": ["x"]},
                {"name": "out", "kind": "sink", "inputs": ["b"], "sink": {"console": {}}},
            ]
        }
    )
    cycles = [message for _, message in found if message.startswith("cycle")]
    assert len(cycles) == 1 and "a" in cycles[0] and "b" in cycles[0]


def test_host_level_contradiction_through_pe_colocation():
    found = problems(
        {
            "operators": [
                SRC,
                {"name": "f", "kind": "filter", "inputs": ["src"], "expr": "x > 0"},
                {**SINK, "inputs": ["f"]},
            ],
            # PE colocation implies host colocation, so host exlocation of the same pair contradicts it
            "constraints": {"peColocation": [["src", "f"]], "hostExlocation": [["f", "src"]]},
        }
    )
    assert [path for path, _ in found] == ["spec.constraints.hostExlocation[0]"]


def test_an_operator_in_two_high_availability_groups():
    found = problems(
        {
            "operators": [
                SRC,
                {"name": "f", "kind": "filter", "inputs": ["src"], "expr": "x > 0"},
                {**SINK, "inputs": ["f"]},
            ],
            "constraints": {"highAvailability": [{"operators": ["f"]}, {"operators": ["f"], "replicas": 3}]},
        }
    )
    assert "spec.constraints.highAvailability[1].operators" in [path for path, _ in found]


def test_wrong_kind_and_api_version_name_their_field():
    found = problems({"operators": [SRC, {**SINK, "kind": "sinkhole"}]})
    assert found[0][0] == "spec.operators[1].kind"
    with pytest.raises(TopologyError) as caught:
        load_topology({"apiVersion": "v1", "metadata": {"name": "t"}, "spec": {"operators": [SRC, SINK]}})
    assert caught.value.problems[0][0] == "apiVersion"


@pytest.mark.parametrize(
    ("source", "key", "field", "says"),
    [
        ({"generator": "trades"}, ["symbol"], "keyBy", "only the sequence generator"),
        ({"generator": "sequence"}, ["value"], "keyBy", "by its key column only"),
        ({"generator": "sequence", "keys": 4_000_001}, ["key"], "source.keys", "at most 4000000 keys"),
    ],
)
def test_a_source_keyed_where_its_records_cannot_be_generated_by_key_is_refused(source, key, field, says):
    """keyBy on a source means each key group generates the records whose key hashes to it; where that
    cannot be done the document is refused naming the field, not run with records routed elsewhere."""
    found = problems({"operators": [{**SRC, "source": source, "keyBy": key}, SINK]})
    assert found[0][0] == f"spec.operators[0].{field}" and says in found[0][1], found


@pytest.mark.parametrize(
    ("source", "key"),
    [({"generator": "sequence", "keys": 9}, ["key"]), ({"stream": "feed"}, ["shop", "day"])],
)
def test_a_sequence_source_keyed_by_its_key_or_a_keyed_stream_source_is_accepted(source, key):
    topology = load_topology(
        {"metadata": {"name": "t"}, "spec": {"operators": [{**SRC, "source": source, "keyBy": key}, SINK]}}
    )
    assert topology.spec.operators[0].key_by == key
