"""LocalPlatform: executors as local processes, the Platform of ``streamtopo run`` (controller_api.md).

The hosts are a model of a cluster: by default this machine (:func:`machine_cluster`: its cores and
memory), or ``--hosts N --host-cpu C``. Executors start only where a host has room for their CPU request,
as the Kubernetes scheduler places pods: one that does not fit stays *pending* (``running_executors``
reports it with no host) and starts once room frees, when an executor is stopped. Several topologies of
one run share the machine through one :class:`Machine`, so each sees the others' executors
(``committed``), as topologies on one cluster see each other's pods.

Files in a work directory play the ConfigMap: ``topology.yaml`` (the validated StreamTopology) and
``routing.json`` (the routing table, replaced atomically by rename so an executor never reads half a
file). Each executor is ``python -m streamtopo executor ...`` with its own metrics port and log
file (``logs/<name>.log``). Drills use :meth:`kill` (SIGKILL) and :meth:`restart`. :meth:`close` stops
every process it started, on every exit path of its owner. Executors' temporary files (Spark's local
dirs, runtime/spark.py) go to ``tmp/`` in the work directory (their ``TMPDIR``), so even an executor
killed before it could clean up leaves nothing behind once the work directory is removed.
"""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
import yaml

from streamtopo.contracts import RoutingTable
from streamtopo.controller.platform import DesiredState
from streamtopo.planner.capacity import fits, free_cores
from streamtopo.planner.cluster import Cluster, Host
from streamtopo.planner.model import StreamTopology
from streamtopo.runtime.metrics import LOOPBACK
from streamtopo.runtime.processes import child_process_options
from streamtopo.runtime.transport import connect

if TYPE_CHECKING:
    from streamtopo.local.testbed import EmulatedHosts


def machine_cores() -> float:
    """CPU cores this process may use: the CPUs it may run on, less a cgroup CPU quota if one is set."""
    cores = float(len(os.sched_getaffinity(0)))
    for path, parse in (
        ("/sys/fs/cgroup/cpu.max", lambda text: text.split()),
        (
            "/sys/fs/cgroup/cpu/cpu.cfs_quota_us",
            lambda text: [text.strip(), _read("/sys/fs/cgroup/cpu/cpu.cfs_period_us")],
        ),
    ):
        try:
            quota, period = parse(Path(path).read_text())
            if quota not in ("max", "-1") and float(period) > 0:
                cores = min(cores, float(quota) / float(period))
        except (OSError, ValueError, TypeError):
            continue
    return cores


def _read(path: str) -> str:
    return Path(path).read_text().strip()


def machine_cluster() -> Cluster:
    """This machine as the local platform's one host: its name, cores (:func:`machine_cores`) and memory."""
    name = socket.gethostname().split(".")[0] or "localhost"
    cpu = max(machine_cores(), 0.1)
    return Cluster(hosts=[Host(name=name, cpu=cpu, memory=float(psutil.virtual_memory().total))])


EXECUTOR_FOOTPRINT = 1.6
"""Cores a busy local executor takes, though it requests one: Spark's task core, the JVM's compiler and
GC threads and the Python driver. Measured on VWAP at overload on a 2-core machine: 1.3-1.8 cores, 1.6
on average (``bench/autoscaling.py`` prints it per run). The first deployment counts executors against
the room with it, so a machine of 2 cores starts one executor, not two that slow each other down, and
the loop books at least this much per executor (planner/capacity.py)."""


class Machine:
    """The processes every :class:`LocalPlatform` of one run has started: the hosts' CPU is shared by
    all of them, as a cluster's nodes are by every topology's pods."""

    def __init__(self) -> None:
        self.platforms: list[LocalPlatform] = []

    def requested(self, exclude: LocalPlatform | None = None) -> dict[str, float]:
        """Host -> cores requested by the executors the platforms (but ``exclude``) have started."""
        out: dict[str, float] = {}
        for platform in self.platforms:
            if platform is exclude:
                continue
            for process in platform.processes.values():
                if process.host is not None and process.popen.poll() is None:
                    out[process.host] = out.get(process.host, 0.0) + process.cpu
        return out


@dataclass
class Process:
    name: str
    host: str | None
    cpu: float
    port_file: Path
    """Where the executor writes the port its endpoints listen on: it binds one the system chooses, so
    executors of runs at once on a machine never collide (a port handed out free is taken by another run
    before its executor binds it)."""
    popen: subprocess.Popen
    log: Path
    address: str = LOOPBACK
    """Where its metrics server listens: loopback, or its emulated host's address."""

    def url(self, path: str) -> str | None:
        """The endpoint's URL, None until the executor listens."""
        try:
            port = int(self.port_file.read_text())
        except (OSError, ValueError):
            return None
        return f"http://{self.address}:{port}/{path}"


class LocalPlatform:
    """Runs a topology's executors as processes on this machine."""

    executor_footprint: float | None = EXECUTOR_FOOTPRINT

    def __init__(
        self,
        workdir: Path,
        transport_url: str,
        cluster: Cluster,
        *,
        output_dir: Path | None = None,
        env: dict[str, str] | None = None,
        machine: Machine | None = None,
        bed: EmulatedHosts | None = None,
    ):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        (self.workdir / "tmp").mkdir(exist_ok=True)
        self.transport_url = transport_url
        self.cluster = cluster
        self.output_dir = Path(output_dir) if output_dir else None
        tmp = str((self.workdir / "tmp").resolve())
        self.env = {**os.environ, "STREAMTOPO_SPARK_CORES": "1", "TMPDIR": tmp, **(env or {})}
        self.processes: dict[str, Process] = {}
        self.pending: dict[str, tuple[str | None, float]] = {}
        """Executors the routing table names whose host has no room for them yet: name -> (host, cpu)."""
        self.machine = machine or Machine()
        self.machine.platforms.append(self)
        self.routing: RoutingTable | None = None
        self.topology_path = self.workdir / "topology.yaml"
        self.routing_path = self.workdir / "routing.json"
        self._state: Any = None
        self.bed = bed
        """Emulated hosts (local/testbed.py): each executor starts inside the host it is placed on."""

    # ----------------------------------------------------------------------------------- Platform

    def hosts(self) -> Cluster:
        return self.cluster

    def apply(self, desired: DesiredState) -> None:
        """Write topology and routing, stop executors no longer desired, start missing ones where their
        host has room (the rest stay pending until :meth:`schedule` finds room); idempotent."""
        self.write_topology(desired.topology)
        self.write_routing(desired.routing)
        for name in sorted(set(self.processes) - set(desired.running)):
            self.stop(name)
        self.pending = {
            name: (entry.host, entry.cpu)
            for name, entry in desired.running.items()
            if name not in self.processes or self.processes[name].popen.poll() is not None
        }
        self.schedule()

    def schedule(self) -> list[str]:
        """Start the pending executors whose host has room now (in name order); returns their names."""
        started = []
        for name, (host, cpu) in sorted(self.pending.items()):
            if host is not None and not fits(cpu, self.room().get(host, 0.0)):
                continue
            del self.pending[name]
            if name in self.processes:  # exited: its slot is its own
                self.restart(name)
            else:
                self.start(name, host, cpu)
            started.append(name)
        return started

    def room(self) -> dict[str, float]:
        """Host -> cores no started executor of this run requests."""
        own = [(p.host, p.cpu) for p in self.processes.values() if p.popen.poll() is None]
        return free_cores(self.cluster, own, self.committed())

    def running_executors(self) -> dict[str, str | None]:
        """Started executors with their host, pending ones (no room yet) with None."""
        running: dict[str, str | None] = {
            n: p.host for n, p in self.processes.items() if p.popen.poll() is None
        }
        return running | dict.fromkeys(self.pending)

    def failing_executors(self) -> dict[str, str]:
        """None: a local executor that exits is started again by the next :meth:`apply` (the drills kill
        them on purpose), and a run that cannot start one fails as a whole."""
        return {}

    def committed(self) -> dict[str, float]:
        """Host -> cores the other topologies of this run have started executors for."""
        return self.machine.requested(exclude=self)

    def state_client(self, topology: StreamTopology) -> Any:
        """A client of the run's own Valkey (every topology of a local run is on it)."""
        if self._state is None:
            self._state = connect(self.transport_url)
        return self._state

    # -------------------------------------------------------------------------------------- files

    def write_topology(self, topology: StreamTopology) -> None:
        text = yaml.safe_dump(
            topology.model_dump(mode="json", by_alias=True, exclude_none=True), sort_keys=False
        )
        if not self.topology_path.exists() or self.topology_path.read_text() != text:
            _atomic_write(self.topology_path, text)

    def write_routing(self, routing: RoutingTable) -> None:
        if self.routing is None or routing.version > self.routing.version or routing != self.routing:
            _atomic_write(self.routing_path, routing.to_json())
            self.routing = routing

    # ---------------------------------------------------------------------------------- processes

    def start(self, name: str, host: str | None = None, cpu: float = 1.0) -> Process:
        port_file = self.workdir / "ports" / f"{name}.port"
        port_file.parent.mkdir(exist_ok=True)
        port_file.unlink(missing_ok=True)  # a restart's executor writes its own
        address, enter = LOOPBACK, None
        if self.bed is not None:
            host = host or self.cluster.hosts[0].name
            address, enter = self.bed.address(host), self.bed.entry(host)
        log = self.workdir / "logs" / f"{name}.log"
        command = [
            sys.executable,
            "-m",
            "streamtopo",
            "executor",
            "--topology",
            str(self.topology_path),
            "--routing",
            str(self.routing_path),
            "--name",
            name,
            "--transport",
            self.transport_url,
            "--metrics-port",
            "0",
            "--port-file",
            str(port_file),
            "--cpu",
            str(cpu),
            "--bind",
            address,
        ]
        if self.output_dir is not None:
            command += ["--output", str(self.output_dir)]
        with open(log, "ab") as out:
            popen = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, env=self.env, **child_process_options(enter)
            )
        self.processes[name] = Process(name, host, cpu, port_file, popen, log, address)
        return self.processes[name]

    def kill(self, name: str) -> None:
        """kill -9 the executor and its JVM (its process group)."""
        process = self.processes[name]
        _signal_group(process.popen, signal.SIGKILL)
        process.popen.wait()

    def restart(self, name: str) -> Process:
        process = self.processes[name]
        if process.popen.poll() is None:
            self.kill(name)
        return self.start(name, process.host, process.cpu)

    def stop(self, name: str, timeout: float = 15.0) -> None:
        """SIGTERM (the executor releases its units), SIGKILL after ``timeout``."""
        process = self.processes.pop(name)
        if process.popen.poll() is None:
            process.popen.send_signal(signal.SIGTERM)  # the executor only: it still needs its JVM to finish
            try:
                process.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                _signal_group(process.popen, signal.SIGKILL)
                process.popen.wait()
        _signal_group(process.popen, signal.SIGKILL)  # whatever is left of its process group (the JVM)

    def close(self) -> None:
        self.pending.clear()
        for name in list(self.processes):
            self.stop(name)

    def exited(self) -> dict[str, int]:
        """Executors that exited by themselves: name -> exit code."""
        return {n: p.popen.returncode for n, p in self.processes.items() if p.popen.poll() is not None}

    def exit_text(self, name: str) -> str:
        """Why executor ``name`` ended, for a person: its exit code (a signal by name: SIGKILL is also
        how the kernel's OOM killer ends a process, see ``dmesg``) and the end of its log."""
        code = self.processes[name].popen.returncode
        how = f"exited with code {code}"
        if code is not None and code < 0:
            how = f"was killed by {signal.Signals(-code).name}"
            if -code == signal.SIGKILL:
                how += " (not by this run: the kernel's OOM killer ends processes so; see dmesg)"
        return f"executor {name} {how}:\n{self.log_tail(name)}"

    def log_tail(self, name: str, lines: int = 20) -> str:
        process = self.processes.get(name)
        if process is None or not process.log.exists():
            return ""
        return "\n".join(process.log.read_text(errors="replace").splitlines()[-lines:])

    # ------------------------------------------------------------------------------------ metrics

    def scrape(self, name: str, timeout: float = 2.0) -> str | None:
        """The executor's /metrics text, or None while it is not serving."""
        process = self.processes.get(name)
        url = process.url("metrics") if process is not None else None
        if url is None:
            return None
        try:
            with urllib.request.urlopen(url, timeout=timeout) as reply:
                return reply.read().decode()
        except OSError:
            return None

    def endpoints(self) -> dict[str, str]:
        """Executor name -> /metrics URL (controller.scrape.ScrapeMetricsSource takes this callable)."""
        urls = {n: p.url("metrics") for n, p in self.processes.items() if p.popen.poll() is None}
        return {n: url for n, url in urls.items() if url is not None}

    def scrape_all(self) -> dict[str, str]:
        return {n: text for n in list(self.processes) if (text := self.scrape(n)) is not None}

    def ready(self, name: str) -> bool:
        """The executor answers /readyz with 200 (connected, routing applied, every unit acquired)."""
        process = self.processes.get(name)
        url = process.url("readyz") if process is not None and process.popen.poll() is None else None
        if url is None:
            return False
        try:
            with urllib.request.urlopen(url, timeout=1.0):
                return True
        except OSError:
            return False

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Block until every executor answers /readyz 200 (raises on timeout or an executor exiting)."""
        deadline = time.time() + timeout
        pending = set(self.processes)
        while pending:
            for name in sorted(pending):
                process = self.processes[name]
                if process.popen.poll() is not None:
                    raise RuntimeError(self.exit_text(name))
                if self.ready(name):
                    pending.discard(name)
            if time.time() > deadline:
                raise TimeoutError(f"executors not ready after {timeout:.0f}s: {', '.join(sorted(pending))}")
            time.sleep(0.2)

    def __enter__(self) -> LocalPlatform:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _signal_group(popen: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(popen.pid, sig)
    except ProcessLookupError:
        pass


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def children_cpu() -> float:
    """CPU-seconds of the child processes this process has waited for (RUSAGE_CHILDREN): a run's executors,
    their JVMs and the embedded Valkey once they are stopped."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime
