"""Fixtures of the differential harness (the SparkSession is tests/runtime/conftest.py's)."""

from __future__ import annotations

import pytest

from streamtopo.runtime.embedded import EmbeddedValkey


@pytest.fixture(scope="module")
def valkey():
    with EmbeddedValkey() as server:
        yield server
