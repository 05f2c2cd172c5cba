"""Every path of the data plane gives Spark batch evaluation's answers (docs/runtime.md, "One semantics").

Generated cases (strategies.py: edge values in every type, queries from the supported grammar) run as
topologies in-process (executors in threads sharing the test session's SparkSession, a real Valkey), and
each sink's JSON lines and each operator's dead letters are compared with the reference (reference.py).
harness.py says how each path is forced. The profile (profiles.py) sets how many cases each path runs.
"""

from __future__ import annotations

import pytest
from hypothesis import given, seed
from paths import PATHS, Path, check_on
from profiles import PROFILE
from strategies import cases

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.valkey]


@pytest.mark.parametrize("path", PATHS, ids=[p.name for p in PATHS])
def test_every_path_gives_spark_batch_answers(path: Path, spark, valkey, tmp_path_factory):
    @PROFILE.settings(PROFILE.pipeline_examples)
    @given(case=cases(max_records=PROFILE.max_records, rates=(path.rate,)))
    def check(case):
        check_on(path, spark, valkey.url, case, tmp_path_factory.mktemp(path.name))

    seed(PROFILE.seed_for(path.name))(check)()
