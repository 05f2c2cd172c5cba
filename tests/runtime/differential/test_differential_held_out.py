"""Hand-written cases (held_out.py) through the paths and as a user runs them (``streamtopo run``), held to
Spark batch evaluation: the issue's reports (decimals, dates and timestamps in a file sink, a nullable
bigint above 2**53, NaN in sums and maxima, a user column named ``ts``, a timestamp batch crossing through
Parquet) and a sum that overflows, which must fail the run naming the operator and Spark's error class.
"""

from __future__ import annotations

import dataclasses

import pytest
from harness import compare, expected_of, plan, reference_session, run_cli
from held_out import EVERY_EDGE, MANY, MINIMAL, MINIMAL_PATHS, OVERFLOW, REGRESSIONS
from hypothesis import given, seed
from paths import BY_NAME, check_on
from profiles import PROFILE
from strategies import Case, cases

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.valkey]


@pytest.mark.parametrize("path", ["3-large-steps"])
def test_every_edge_value_in_process(path, spark, valkey, tmp_path):
    check_on(BY_NAME[path], spark, valkey.url, EVERY_EDGE, tmp_path)


@pytest.mark.parametrize("key", ["s", "b", "f"])
def test_every_edge_value_through_a_stream_source_partitioned_by_key(key, spark, valkey, tmp_path):
    """A stream source with ``keyBy`` reading a program's entries (no partition of its own): each key group
    decodes every entry and keeps the records whose key routes to it, in pandas. Keyed by strings (empty,
    unicode, null), bigints (2**63 - 1, -2**63, null) or booleans (null) on two executors, the answers are
    Spark batch evaluation's: the pandas route and Spark's hash agree on them, or the aggregate keyed by
    ``f`` (reading an ``f``-keyed source one to one) and the keyed map by ``s`` would split their keys."""
    path = dataclasses.replace(
        BY_NAME["named-stream-crossing-2"], name=f"named-stream-keyed-{key}", key_by=(key,)
    )
    check_on(path, spark, valkey.url, EVERY_EDGE, tmp_path)


@pytest.mark.parametrize("path", ["2-small-steps"])
def test_a_large_batch_crossing_executors(path, spark, valkey, tmp_path):
    check_on(BY_NAME[path], spark, valkey.url, MANY, tmp_path)


@pytest.mark.parametrize("path", ["1-small-steps", "1-large-steps", "2-small-steps"])
def test_an_overflowing_sum_fails_the_run_naming_the_operator(path, spark, valkey, tmp_path):
    """Spark raises ARITHMETIC_OVERFLOW for the sum: the run must fail naming the aggregate and the error
    class (in-process: an executor's loop ends with an exception saying both)."""
    check_on(BY_NAME[path], spark, valkey.url, OVERFLOW, tmp_path)


def through_cli(spark, case: Case, work, executors: int) -> None:
    p = plan(case)
    with reference_session(spark):
        expected = expected_of(spark, p)
    compare(p, expected, run_cli(p, work, executors), f"streamtopo run --executors {executors}")


@pytest.mark.parametrize("executors", [2] if PROFILE.name == "bounded" else [1, 2])
def test_every_edge_value_with_streamtopo_run(executors, spark, tmp_path):
    """Two executor processes (their JVMs); one executor in the long profile too."""
    through_cli(spark, EVERY_EDGE, tmp_path, executors)


def test_an_overflowing_sum_fails_streamtopo_run(spark, tmp_path):
    """``streamtopo run`` exits non-zero, naming the aggregate and ARITHMETIC_OVERFLOW."""
    through_cli(spark, OVERFLOW, tmp_path, 2)


@pytest.mark.skipif(PROFILE.cli_examples == 0, reason="generated cases through streamtopo run: long profile")
@pytest.mark.parametrize("executors", [1, 2])
def test_generated_cases_with_streamtopo_run(executors, spark, tmp_path_factory):
    """Generated cases as a user runs them: executors as processes, the run's own Valkey."""

    @PROFILE.settings(PROFILE.cli_examples)
    @given(case=cases(max_records=PROFILE.max_records, branches=(3, 4)))
    def run(case):
        through_cli(spark, case, tmp_path_factory.mktemp("cli"), executors)

    seed(PROFILE.seed_for(f"cli-{executors}"))(run)()


@pytest.mark.parametrize(
    ("name", "path"),
    [
        pytest.param(
            n,
            p,
            marks=[]
            if n in REGRESSIONS
            else [pytest.mark.skipif(PROFILE.name != "long", reason="long profile (fixed on main)")],
        )
        for n in MINIMAL
        for p in MINIMAL_PATHS.get(n, ("driver-batch",))
    ],
)
def test_minimal_cases(name, path, spark, valkey, tmp_path):
    """Each failure the harness found on main (2026-11-27), as small as it shows, on a path showing it;
    those found after items 1-3 (held_out.REGRESSIONS) in every profile."""
    check_on(BY_NAME[path], spark, valkey.url, MINIMAL[name], tmp_path)
