"""Shared fixtures of the data-plane tests: one local SparkSession for the whole test session."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from streamtopo.planner.model import StreamTopologySpec


@pytest.fixture(scope="session")
def spark():
    """The process-wide local SparkSession (started once: a JVM costs seconds, a job milliseconds)."""
    from streamtopo.runtime.spark import get_spark, stop_spark

    session = get_spark()
    yield session
    stop_spark()


@pytest.fixture(scope="session")
def make_spec() -> Callable[..., StreamTopologySpec]:
    """A validated spec from a list of operator dicts (camelCase, as users write them)."""

    def build(*operators: dict, key_groups: int = 4) -> StreamTopologySpec:
        return StreamTopologySpec.model_validate({"keyGroups": key_groups, "operators": list(operators)})

    return build


@pytest.fixture(scope="session")
def windows_of() -> Callable[[float, float, float], list[float]]:
    """Reference window assignment, written out independently of the operators: the starts ``n*slide``
    of every window ``[n*slide, n*slide + size)`` that contains ``ts``."""

    def starts(ts: float, size: float, slide: float) -> list[float]:
        n = math.floor(ts / slide)
        out = []
        while n * slide + size > ts:
            if n * slide <= ts:
                out.append(n * slide)
            n -= 1
        return sorted(out)

    return starts
