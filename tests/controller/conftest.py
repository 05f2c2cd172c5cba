"""Fixtures of the controller tests; the parts themselves (emulator shims, Prometheus, exporters) are in
controller_testkit.py so test modules can import its helpers."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from controller_testkit import ALLOWED_PROMETHEUS_URLS, EmulatedKubernetes, PrometheusServer, ScriptedRuntime


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[EmulatedKubernetes]:
    pytest.importorskip("kmock")
    cluster = EmulatedKubernetes(tmp_path)
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def prometheus_factory(tmp_path: Path) -> Iterator[Callable[[list[str]], PrometheusServer]]:
    servers: list[PrometheusServer] = []

    def make(targets: list[str]) -> PrometheusServer:
        server = PrometheusServer(tmp_path, targets)
        servers.append(server)
        server.start()
        return server

    try:
        yield make
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def scripted_runtime() -> Iterator[Callable[..., ScriptedRuntime]]:
    made: list[ScriptedRuntime] = []

    def make(*args: Any, **kwargs: Any) -> ScriptedRuntime:
        runtime = ScriptedRuntime(*args, **kwargs)
        made.append(runtime)
        return runtime

    try:
        yield make
    finally:
        for runtime in made:
            runtime.close()


@pytest.fixture
def subprocess_env(kube: EmulatedKubernetes) -> dict[str, str]:
    """Environment of an operator process talking to the emulator."""
    return {
        **os.environ,
        "KUBECONFIG": str(kube.kubeconfig),
        "STREAMTOPO_TICK_SECONDS": "0.3",
        "STREAMTOPO_WATCH_SERVER_TIMEOUT": "30",
        "STREAMTOPO_ALLOWED_PROMETHEUS_URLS": ALLOWED_PROMETHEUS_URLS,
    }
