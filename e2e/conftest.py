"""A kind cluster with the streamtopo images loaded and the chart installed, for the e2e tests.

Skips (saying why) when docker, kind, kubectl or helm is missing or docker is not running. Set
``STREAMTOPO_E2E_KEEP=1`` to keep the cluster after the run, ``STREAMTOPO_E2E_CLUSTER`` to reuse one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = os.environ.get("STREAMTOPO_E2E_CLUSTER", "streamtopo-e2e")
OPERATOR_IMAGE = "streamtopo/operator:e2e"
RUNTIME_IMAGE = "streamtopo/runtime:e2e"
NAMESPACE = "streamtopo-e2e"


def run(*args: str, check: bool = True, timeout: float = 900, **kwargs: Any) -> subprocess.CompletedProcess:
    return subprocess.run(args, check=check, timeout=timeout, text=True, capture_output=True, **kwargs)


def missing_tools() -> str | None:
    for tool in ("docker", "kind", "kubectl", "helm"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (the e2e tests need docker, kind, kubectl and helm)"
    if run("docker", "info", check=False, timeout=60).returncode != 0:
        return "docker is installed but its daemon is not reachable (`docker info` failed)"
    return None


@pytest.fixture(scope="session")
def kind_cluster() -> Iterator[str]:
    reason = missing_tools()
    if reason:
        pytest.skip(reason)
    existing = run("kind", "get", "clusters").stdout.split()
    created = CLUSTER not in existing
    if created:
        run(
            "kind",
            "create",
            "cluster",
            "--name",
            CLUSTER,
            "--config",
            str(ROOT / "e2e/kind.yaml"),
            "--wait",
            "180s",
        )
    try:
        for dockerfile, image in (
            ("docker/Dockerfile.operator", OPERATOR_IMAGE),
            ("docker/Dockerfile.runtime", RUNTIME_IMAGE),
        ):
            run("docker", "build", "-f", str(ROOT / dockerfile), "-t", image, str(ROOT), timeout=1800)
            run("kind", "load", "docker-image", image, "--name", CLUSTER)
        operator_repo, operator_tag = OPERATOR_IMAGE.split(":")
        runtime_repo, runtime_tag = RUNTIME_IMAGE.split(":")
        run(
            "helm",
            "upgrade",
            "--install",
            "streamtopo",
            str(ROOT / "charts/streamtopo"),
            "--namespace",
            "streamtopo",
            "--create-namespace",
            "--wait",
            "--timeout",
            "5m",
            "--set",
            f"image.repository={operator_repo}",
            "--set",
            f"image.tag={operator_tag}",
            "--set",
            "image.pullPolicy=Never",
            "--set",
            f"runtimeImage.repository={runtime_repo}",
            "--set",
            f"runtimeImage.tag={runtime_tag}",
            "--set",
            "valkey.enabled=true",
        )
        run("kubectl", "create", "namespace", NAMESPACE, check=False)
        yield CLUSTER
    finally:
        if created and not os.environ.get("STREAMTOPO_E2E_KEEP"):
            run("kind", "delete", "cluster", "--name", CLUSTER, check=False)


def kubectl_json(*args: str) -> Any:
    return json.loads(run("kubectl", *args, "-o", "json").stdout)


def eventually(check: Callable[[], Any], timeout: float, what: str, interval: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (subprocess.CalledProcessError, KeyError, ValueError):
            last = None
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what} (last {last!r})")
