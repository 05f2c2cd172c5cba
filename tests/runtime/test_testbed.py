"""Emulated hosts (local/testbed.py): namespaces, CPU quotas and shaped links that a run uses and leaves
nothing of, and a drilled run across two of them with exact totals."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from runtime_support import (
    assert_exactly_once,
    expected_totals,
    read_lines,
    sequence_topology,
    streamtopo_run,
)
from typer.testing import CliRunner

from streamtopo.cli import app
from streamtopo.local.testbed import (
    EmulatedHosts,
    leftovers,
    load_hosts,
    netem_available,
    sweep,
    unavailable,
)
from streamtopo.planner.model import TopologyError

# The bed's namespaces and cgroups are the machine's: the checks that nothing is left see every bed, so
# these tests keep to one worker of a parallel run.
pytestmark = [pytest.mark.xdist_group("testbed")]

needs_root = pytest.mark.skipif(unavailable() is not None, reason=f"no emulated hosts here: {unavailable()}")

HOSTS = """\
hosts:
  - {name: node-a, cpu: 1.0, network: 12500000, labels: {disk: ssd}}
  - {name: node-b, cpu: 1.0}
valkeyCpu: 0.5
"""


def test_a_bed_file_is_a_cluster_file_and_what_it_cannot_emulate_is_refused_naming_the_field():
    spec = load_hosts(HOSTS)
    assert [(h.name, h.cpu, h.labels) for h in spec.cluster().hosts] == [
        ("node-a", 1.0, {"disk": "ssd"}),
        ("node-b", 1.0, {}),
    ]
    assert load_hosts(HOSTS + "latency: 2ms\n").latency == pytest.approx(0.002)
    with pytest.raises(TopologyError) as links:
        load_hosts(HOSTS + "links: [{hosts: [node-a, node-b], bandwidth: 1000}]\n")
    assert links.value.problems[0][0] == "links"
    with pytest.raises(TopologyError) as twice:
        load_hosts("hosts: [{name: a, cpu: 1}, {name: a, cpu: 1}]\n")
    assert twice.value.problems[0] == ("hosts", "duplicate host names: a")
    with pytest.raises(TopologyError) as cpu:
        load_hosts("hosts: [{name: a, cpu: 0}]\n")
    assert cpu.value.problems[0][0] == "hosts[0].cpu"


def test_run_refuses_a_bed_with_hosts_options_or_a_bad_file_before_anything_starts(tmp_path):
    topology = tmp_path / "t.yaml"
    topology.write_text(
        Path(__file__).resolve().parents[2].joinpath("examples", "sequence-count.yaml").read_text()
    )
    bed = tmp_path / "hosts.yaml"
    bed.write_text(HOSTS)
    both = CliRunner().invoke(app, ["run", str(topology), "--testbed", str(bed), "--hosts", "2"])
    assert both.exit_code == 2 and "--testbed" in both.output and "--hosts" in both.output
    bed.write_text(HOSTS + "links: [{hosts: [node-a, node-b], bandwidth: 1000}]\n")
    links = CliRunner().invoke(app, ["run", str(topology), "--testbed", str(bed)])
    assert links.exit_code == 2 and "links" in links.output and "Traceback" not in links.output
    assert not leftovers(os.getpid())


@needs_root
def test_a_process_started_on_a_host_is_in_its_namespace_and_quota_and_nothing_is_left_after(tmp_path):
    spec = load_hosts(HOSTS.replace("cpu: 1.0, network", "cpu: 0.1, network"))
    with EmulatedHosts(spec) as bed:
        # A server on node-b, reached from the harness over the bed's bridge.
        server = bed.inside("node-b", lambda: socket.create_server((bed.address("node-b"), 0)))
        with server, socket.create_connection(server.getsockname(), timeout=5):
            pass
        # A busy process on node-a: in node-a's namespace and cgroup, and throttled to its 0.1 cores.
        busy = subprocess.Popen(
            [sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 1.0: pass"],
            preexec_fn=bed.entry("node-a"),
        )
        namespace = os.readlink(f"/proc/{busy.pid}/ns/net")
        cgroup = Path(f"/proc/{busy.pid}/cgroup").read_text()
        busy.wait()
        assert namespace == f"net:[{os.stat(Path('/run/netns') / bed.namespace('node-a')).st_ino}]"
        assert bed.namespace("node-a") in cgroup
        periods = bed.periods()
        assert set(periods) == {None, "node-a", "node-b"}
        busy_periods, throttled = periods["node-a"]
        assert 0 < throttled <= busy_periods  # a whole core's loop against 0.1 cores: held back
        assert periods["node-b"][1] == periods[None][1] == 0  # nothing busy ran there
        # node-a's card is shaped to 100 Mbit/s both ways; node-b's (no `network` given) is not.
        assert "tbf" in qdiscs(f"{bed.namespace('node-a')}o") and "100Mbit" in qdiscs(
            f"{bed.namespace('node-a')}o"
        )
        assert "tbf" in qdiscs("eth0", bed.namespace("node-a"))
        assert "tbf" not in qdiscs(f"{bed.namespace('node-b')}o")
        assert leftovers(os.getpid())
    assert not leftovers(os.getpid())


@needs_root
def test_latency_without_netem_is_refused_naming_the_field_and_leaves_nothing():
    if netem_available():
        pytest.skip("this kernel has netem: the delay is emulated, not refused")
    with pytest.raises(RuntimeError, match="latency: this kernel has no netem"):
        with EmulatedHosts(load_hosts(HOSTS + "latency: 2ms\n")):
            pass
    assert not leftovers(os.getpid())


@needs_root
def test_a_bed_whose_owner_was_killed_is_swept(tmp_path):
    """kill -9 of the process that built a bed skips its teardown; the next bed (or sweep) removes it."""
    owner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import time
                from streamtopo.local.testbed import EmulatedHosts, load_hosts
                bed = EmulatedHosts(load_hosts({HOSTS!r}))
                bed.build()
                print("built", flush=True)
                time.sleep(600)
                """
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert owner.stdout is not None and owner.stdout.readline().strip() == "built"
    left = leftovers(owner.pid)
    assert any(i.startswith("netns") for i in left) and any(i.startswith("cgroup") for i in left)
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    removed = sweep()
    assert {i for i in left if not i.startswith("link")} <= set(removed)
    deadline = time.monotonic() + 10  # the kernel drops a deleted namespace's links asynchronously
    while leftovers(owner.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not leftovers(owner.pid)


@needs_root
def test_a_drilled_run_across_two_emulated_hosts_has_exact_totals(tmp_path):
    """Two executors, one per host, each in its host's namespace and quota; records between them cross
    the bed's bridge through the Valkey host. Migrations and kills: every total exact, nothing left."""
    count, rate, keys, window = 30_000, 3_000.0, 16, 2.0
    topology = sequence_topology("bed", count=count, rate=rate, keys=keys, window=window)
    path = tmp_path / "t.yaml"
    path.write_text(topology.model_dump_json(by_alias=True, exclude_none=True))
    bed = tmp_path / "hosts.yaml"
    bed.write_text(HOSTS)
    result = streamtopo_run(
        str(path),
        "--testbed",
        str(bed),
        "--executors",
        "2",
        "--no-autoscale",
        "--migrate-every",
        "2",
        "--kill-every",
        "8",
        "--output",
        str(tmp_path / "out"),
        "--duration",
        "600",
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    plan = result.stdout.splitlines()[0]
    assert "on node-a" in plan and "on node-b" in plan, plan  # one executor per emulated host
    assert_exactly_once(read_lines(tmp_path / "out"), expected_totals(count, rate, keys, window))
    assert not leftovers()


def qdiscs(device: str, namespace: str | None = None) -> str:
    where = ["-n", namespace] if namespace else []
    return subprocess.run(
        ["tc", *where, "qdisc", "show", "dev", device], capture_output=True, text=True
    ).stdout
