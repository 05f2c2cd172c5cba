"""`streamtopo run` fails fast and clearly: what can be wrong is found before an executor starts, a sink
that cannot write stops the run, a run shorter than the warm-up says so, and nothing is left in TMPDIR.

Each failure mode asserts the exit code, the operator and field (or path) in the message, and a short
output without Spark's log lines or a traceback. Runs are real: PySpark in local mode, embedded Valkey.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from runtime_support import sequence_topology, streamtopo_run, write_topology
from typer.testing import CliRunner

from streamtopo.cli import app
from streamtopo.documents import load_topology
from streamtopo.runtime.analysis import analyze_pipeline

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NOISE = ("log4j", "Traceback", " WARN ", "SQLQueryContextLogger", "py4j")


def write(directory: Path, name: str, operators: list[dict]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    data = {
        "apiVersion": "streamtopo.dev/v1alpha1",
        "kind": "StreamTopology",
        "metadata": {"name": name},
        "spec": {"keyGroups": 2, "operators": operators},
    }
    (directory / "topology.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return directory / "topology.yaml"


def numbers(name: str = "numbers", count: int = 200) -> dict:
    return {
        "name": name,
        "kind": "source",
        "source": {"generator": "sequence", "ratePerSecond": 100, "count": count, "keys": 3},
    }


def op(name: str, kind: str, inputs: list[str], **fields) -> dict:
    return {"name": name, "kind": kind, "inputs": inputs, **fields}


def console(of: str) -> dict:
    return op("out", "sink", [of], sink={"console": {}})


def assert_short_and_quiet(output: str, lines: int = 30) -> None:
    assert len(output.splitlines()) < lines, output
    assert not [n for n in NOISE if n in output], output


@pytest.mark.spark
def test_a_filter_naming_a_missing_column_is_refused_before_any_executor_starts(tmp_path):
    """The real command in its own process: exit 2 naming the field (the typed view at the door,
    planner/schema.py), and nothing from the JVM on the console (its start-up line, log4j's banner,
    PySpark's JSON error record)."""
    path = write(
        tmp_path,
        "ff-filter",
        [numbers(), op("valid", "filter", ["numbers"], expr="valeu > 0"), console("valid")],
    )
    result = streamtopo_run(str(path), "--duration", "60", cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "spec.operators[1].expr: 'valeu > 0' reads column 'valeu', which 'numbers' does not have" in output
    assert "summary" not in output and "executors" not in output  # refused before anything ran
    assert_short_and_quiet(output)
    assert "jdk.incubator" not in output


BAD_PIPELINES = {
    "map select syntax": (
        [numbers(), op("scaled", "map", ["numbers"], select=["key", "value *"]), console("scaled")],
        "spec.operators[1].select[1]: 'value *' cannot be parsed: an operand or argument is missing",
    ),
    "aggregate keyed by a missing column": (
        [
            numbers(),
            op(
                "totals",
                "aggregate",
                ["numbers"],
                keyBy=["kee"],
                window={"size": 1},
                aggregations=["count(*) AS n"],
            ),
            console("totals"),
        ],
        # refused at the door, by the grammar-level typed view (planner/schema.py), as the webhook does
        "spec.operators[1].keyBy: input 'numbers' has no column 'kee' (its columns: seq, key, value)",
    ),
    "aggregation naming a missing column": (
        [
            numbers(),
            op(
                "totals",
                "aggregate",
                ["numbers"],
                keyBy=["key"],
                aggregations=["count(*) AS n", "sum(valu) AS total"],
            ),
            console("totals"),
        ],
        "spec.operators[1].aggregations[1]: 'sum(valu) AS total' reads column 'valu', which 'numbers' does "
        "not have (columns: seq, key, value)",
    ),
    "join keys of different types": (
        [
            numbers("left"),
            numbers("right"),
            op("text", "map", ["right"], select=["CAST(key AS STRING) AS key", "value"]),
            op("pairs", "join", ["left", "text"], keyBy=["key"], window={"size": 1}),
            console("pairs"),
        ],
        "spec.operators[3].keyBy: key 'key' is bigint in 'left' but string in 'text'",
    ),
    "column a udf does not return": (
        [
            numbers(),
            op("same", "udf", ["numbers"], function="runtime_udfs:poison_13"),
            op("big", "filter", ["same"], expr="big > 0"),
            console("big"),
        ],
        "operator 'big', expr: [UNRESOLVED_COLUMN",
    ),
}


@pytest.mark.spark
@pytest.mark.parametrize("case", list(BAD_PIPELINES))
def test_bad_expressions_are_refused_naming_operator_and_field(spark, tmp_path, case):
    operators, message = BAD_PIPELINES[case]
    result = CliRunner().invoke(app, ["run", str(write(tmp_path, "ff-bad", operators))])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert_short_and_quiet(result.output)


@pytest.mark.spark
@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_every_example_passes_the_check(spark, example):
    schemas = analyze_pipeline(load_topology(EXAMPLES / example).spec, spark)
    assert all(schema is None or "_ts" in schema.names for schema in schemas.values())


def test_an_output_directory_that_cannot_be_created_is_refused_before_starting(tmp_path):
    (tmp_path / "file").write_text("not a directory\n")
    path = write_topology(tmp_path, sequence_topology("ff-output", count=10, rate=10, keys=1, window=1.0))
    result = CliRunner().invoke(app, ["run", str(path), "--output", str(tmp_path / "file" / "out")])
    assert result.exit_code == 2, result.output
    blocked = tmp_path / "file" / "out" / "out"
    assert f"cannot write file sink output {blocked}: Not a directory" in result.output
    assert_short_and_quiet(result.output)


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.valkey
def test_a_sink_write_failing_inside_an_executor_fails_the_run_instead_of_retrying(tmp_path):
    """The directory takes writes (the check passes) but key group 0's file is a directory: the executor
    exits with the path and the OS reason, and the run fails rather than retrying as a lost transport."""
    topology = sequence_topology("ff-write", count=200, rate=100, keys=3, window=1.0, key_groups=2)
    blocked = tmp_path / "out" / "out" / "kg-0000.jsonl"
    blocked.mkdir(parents=True)
    result = streamtopo_run(
        str(write_topology(tmp_path, topology)),
        "--output",
        str(tmp_path / "out"),
        "--duration",
        "300",
        cwd=tmp_path,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "exited with code 4" in output
    assert f"cannot write file sink output {blocked}: Is a directory" in output
    assert_short_and_quiet(output)


@pytest.mark.parametrize("executors", ["2"])
def test_a_sum_that_overflows_fails_the_run_naming_operator_aggregation_and_error_class(tmp_path, executors):
    """Each record fits a bigint, a key's running total does not: Spark's ANSI sum raises, so the run
    fails, saying which operator, which aggregation and Spark's error class, on one executor or across two
    (where the map's records cross to the aggregate's executor and the partials merge there)."""
    path = write(
        tmp_path,
        "ff-overflow",
        [
            numbers(count=60),
            op("big", "map", ["numbers"], select=["key", f"{2**62} + seq AS big"]),
            op(
                "totals", "aggregate", ["big"], keyBy=["key"], aggregations=["count(*) AS n", "sum(big) AS s"]
            ),
            op("out", "sink", ["totals"], sink={"file": {}}),
        ],
    )
    result = streamtopo_run(
        str(path),
        "--executors",
        executors,
        "--output",
        str(tmp_path / "out"),
        "--duration",
        "300",
        cwd=tmp_path,
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "exited with code 2" in output, output
    assert "cannot run the pipeline: operator 'totals', aggregations" in output, output
    assert "[ARITHMETIC_OVERFLOW]" in output, output


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.valkey
def test_a_udf_beside_the_file_runs_output_defaults_to_streamtopo_output_and_tmp_stays_clean(tmp_path):
    """No PYTHONPATH, no --output, started from another directory: the UDF package beside the topology
    file imports (in the command and in its executors, helper module included), the sink writes under
    ./streamtopo-output/<name>/, the summary says so, and TMPDIR holds nothing of Spark's afterwards."""
    package = tmp_path / "pipeline" / "ffpkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "helpers.py").write_text("def double(s):\n    return s * 2\n")
    (package / "enrich.py").write_text(
        "from ffpkg.helpers import double\n\n\ndef apply(df):\n    return df.assign(big=double(df.total))\n"
    )
    path = write(
        package.parent,
        "ff-udf",
        [
            numbers(count=300),
            op(
                "totals",
                "aggregate",
                ["numbers"],
                keyBy=["key"],
                window={"size": 1},
                aggregations=["sum(value) AS total"],
            ),
            op("enrich", "udf", ["totals"], function="ffpkg.enrich:apply"),
            op("out", "sink", ["enrich"], sink={"file": {}}),
        ],
    )
    work, tmp = tmp_path / "elsewhere", tmp_path / "tmp"
    work.mkdir()
    tmp.mkdir()
    result = streamtopo_run(str(path), "--duration", "300", cwd=work, env={"TMPDIR": str(tmp)})
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "file sinks: streamtopo-output/ff-udf/<sink>/kg-NNNN.jsonl" in output
    files = sorted((work / "streamtopo-output" / "ff-udf" / "out").glob("kg-*.jsonl"))
    lines = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    # Key k, window s: the values v < 300 with v % 3 == k and event time v / 100 in [s, s + 1), doubled.
    big = {
        (k, s): 2 * sum(v for v in range(300) if v % 3 == k and v // 100 == s)
        for k in range(3)
        for s in range(3)
    }
    assert {(r["key"], int(r["window_start"])): r["big"] for r in lines} == big
    assert_short_and_quiet(output, lines=50)  # a run that ran shows its plan and latest records too
    assert sorted(p.name for p in tmp.iterdir()) == []


@pytest.mark.spark
@pytest.mark.valkey
def test_a_run_shorter_than_the_warm_up_says_so_and_fails(tmp_path):
    """One second cannot start and warm an executor's JVM: the summary says the run ended during warm-up
    and the exit code is 1, rather than 0 with empty output and no word why."""
    topology = sequence_topology("ff-short", count=200, rate=100, keys=3, window=1.0)
    result = streamtopo_run(str(write_topology(tmp_path, topology)), "--duration", "1", cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "the run ended during warm-up: executor(s) " in output and "were not running yet" in output
    assert "give a longer --duration" in output
    assert_short_and_quiet(output)


def test_a_suspended_topology_is_refused_before_anything_starts(tmp_path):
    topology = sequence_topology("paused", count=10, rate=10, keys=2, window=1.0)
    path = write_topology(
        tmp_path, topology.model_copy(update={"spec": topology.spec.model_copy(update={"suspend": True})})
    )
    result = CliRunner().invoke(app, ["run", str(path), "--duration", "5"])
    assert result.exit_code == 2 and "spec.suspend" in result.output
    assert not any(noise in result.output for noise in NOISE)
