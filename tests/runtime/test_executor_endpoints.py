"""`streamtopo executor` as a pod runs it serves its endpoints on every interface (kubelet's probes and
Prometheus reach the pod IP); the local runner keeps them on loopback. The socket table says where it
listens; the only traffic goes to 127.0.0.1."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import psutil
import pytest
import yaml
from runtime_support import round_robin, sequence_topology, write_routing

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


def executor_args(tmp_path, transport: str, port: int, *extra: str) -> list[str]:
    """``streamtopo executor`` on a small sequence topology, as a pod's command runs it."""
    topology = sequence_topology("bind", count=100, rate=50, keys=3, window=1.0)
    (tmp_path / "topology.yaml").write_text(
        yaml.safe_dump(topology.model_dump(mode="json", by_alias=True, exclude_none=True))
    )
    write_routing(tmp_path / "routing.json", round_robin(topology, ["bind-e0"]))
    return [
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
        transport,
        "--metrics-port",
        str(port),
        "--cpu",
        "1",
        "--output",
        str(tmp_path / "out"),
        *extra,
    ]


@pytest.mark.parametrize(("bind", "expected"), [(None, {"0.0.0.0"}), ("127.0.0.1", {"127.0.0.1"})])
def test_endpoints_bind_all_interfaces_as_a_pod_runs_it(tmp_path, bind, expected):
    port_file = tmp_path / "port"
    stderr_path = tmp_path / "stderr"
    with EmbeddedValkey() as valkey, stderr_path.open("wb") as stderr:
        # Port 0: the kernel's choice, written to the port file, so no other test can hold it.
        args = executor_args(tmp_path, valkey.url, 0, "--port-file", str(port_file))
        process = subprocess.Popen(
            args + (["--bind", bind] if bind else []), stdout=subprocess.DEVNULL, stderr=stderr
        )
        try:
            deadline = time.time() + 240
            while not (
                port_file.exists() and (addresses := listening(process.pid, int(port_file.read_text())))
            ):
                assert process.poll() is None, (
                    f"the executor exited with {process.returncode}: {stderr_path.read_text()[-2000:]}"
                )
                assert time.time() < deadline, "the executor never listened"
                time.sleep(0.5)
            assert addresses == expected
            port = int(port_file.read_text())
            assert answer(port, "/healthz") in (200, 503) and answer(port, "/readyz") in (200, 503)
            assert answer(port, "/metrics") == 200
        finally:
            process.terminate()
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()


def test_a_port_another_process_holds_exits_clearly(tmp_path):
    with socket.socket() as held, EmbeddedValkey() as valkey:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        args = executor_args(tmp_path, valkey.url, port, "--bind", "127.0.0.1")
        result = subprocess.run(args, capture_output=True, text=True, timeout=240)
    assert result.returncode == 3, result.stderr[-2000:]
    assert f"cannot serve metrics and probes on 127.0.0.1:{port}: Address already in use" in result.stderr
    assert "Traceback" not in result.stderr
