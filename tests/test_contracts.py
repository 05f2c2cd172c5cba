"""The contracts module is the one place names are defined: what executors export is what it declares."""

from __future__ import annotations

import pytest

from streamtopo.contracts import (
    MEMBERS_ANNOTATION,
    Metric,
    executor_index,
    executor_name,
    fused_members,
    parse_unit,
    unit_key,
)
from streamtopo.runtime.metrics import ExecutorMetrics


def test_executors_export_exactly_the_declared_metric_names() -> None:
    exported = {family.name for family in ExecutorMetrics("t", "t-e0").registry.collect()}
    declared = {value for name, value in vars(Metric).items() if name.isupper()}
    assert exported == declared


def test_executor_names_and_unit_keys_round_trip() -> None:
    assert executor_name("vwap", 3) == "vwap-e3"
    assert executor_index("vwap", "vwap-e3") == 3
    assert executor_index("vwap", "vwap-east-e3") is None and executor_index("vwap", "vwap-ex") is None
    assert parse_unit(unit_key(("join/left", 7))) == ("join/left", 7)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"a": {"src": "src", "out": "a-out"}}', {"a": {"src": "src", "out": "a-out"}}),
        ("{not json", {}),
        ("[1, 2]", {}),
        ('{"a": {"src": 1}}', {}),
        ('{"a": "src"}', {}),
        (None, {}),
    ],
)
def test_a_members_annotation_is_read_only_when_it_is_a_map_of_names(text, expected):
    """A tenant may write any annotation on its own topology: one that is not member -> operator ->
    operator reads as no members (no reconcile or executor fails on it)."""
    metadata = {"annotations": {MEMBERS_ANNOTATION: text}} if text is not None else {"name": "t"}
    assert fused_members(metadata) == expected
