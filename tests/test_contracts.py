"""The contracts module is the one place names are defined: what executors export is what it declares."""

from __future__ import annotations

from streamtopo.contracts import Metric, executor_index, executor_name, parse_unit, unit_key
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
