"""The validating admission webhook, served by the operator (kopf) over HTTPS on loopback, answering
AdmissionReview requests as the API server sends them: the fuzz suite's malformed topologies are denied
naming the field, valid ones admitted, and updates that leave the spec alone always admitted.

The emulator does not call webhooks, so the requests are posted the way the API server would post them
(the chart's ValidatingWebhookConfiguration routes CREATE and UPDATE of streamtopologies here).
"""

from __future__ import annotations

import importlib.util
import json
import re
import socket
import ssl
import subprocess
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from controller_testkit import EmulatedKubernetes, free_port, wait_for
from test_kopf_kmock import operator, topology

from streamtopo.controller.operator import WEBHOOK_PATH
from streamtopo.planner.model import to_camel

pytestmark = [pytest.mark.kube, pytest.mark.timeout(300)]

FUZZ = Path(__file__).resolve().parents[1] / "planner" / "test_fuzz.py"


def fuzz_cases() -> list[tuple[str, dict, str]]:
    """The fuzz suite's generated and hand-written documents (tests/planner/test_fuzz.py)."""
    spec = importlib.util.spec_from_file_location("fuzz_cases", FUZZ)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [*module.GENERATED, *module.HAND_WRITTEN]


def certificate(directory: Path) -> Path:
    """A self-signed certificate for 127.0.0.1 (what the chart generates for the webhook Service)."""
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(directory / "tls.key"),
            "-out",
            str(directory / "tls.crt"),
        ],
        check=True,
        capture_output=True,
    )
    return directory / "tls.crt"


class Webhook:
    def __init__(self, port: int, ca: Path):
        self.url = f"https://127.0.0.1:{port}/{WEBHOOK_PATH}"
        self.context = ssl.create_default_context(cafile=str(ca))

    def review(self, obj: Any, operation: str = "CREATE", old: Any = None) -> dict[str, Any]:
        """The AdmissionReview response to ``obj`` (API server's request shape, admission.k8s.io/v1)."""
        request = {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "streamtopo.dev", "version": "v1alpha1", "kind": "StreamTopology"},
            "resource": {"group": "streamtopo.dev", "version": "v1alpha1", "resource": "streamtopologies"},
            "operation": operation,
            "userInfo": {"username": "tenant-a", "groups": ["system:authenticated"]},
            "object": obj,
            "oldObject": old,
            "dryRun": False,
        }
        body = json.dumps(
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
        )
        post = urllib.request.Request(
            self.url, data=body.encode(), method="POST", headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(post, context=self.context, timeout=10) as response:
            answer = json.loads(response.read())["response"]
        assert answer["uid"] == request["uid"]
        return answer


def named(field: str, message: str) -> bool:
    """Whether the denial names ``field`` (as the fuzz suite checks the validator: the field's camelCase
    path, or a parent at least two levels deep when the problem is the mapping's)."""
    camel = re.sub(r"(?<=\.)[a-z]+(?:_[a-z]+)+", lambda m: to_camel(m.group(0)), field)
    paths = [part.split(": ", 1)[0] for part in message.split("; ")]
    return any(p.startswith(camel) or (camel.startswith(p) and p.count(".") >= 2) for p in paths)


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_the_webhook_denies_malformed_topologies_naming_the_field_and_admits_valid_ones(
    kube: EmulatedKubernetes, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    ca = certificate(tmp_path)
    port = free_port()
    monkeypatch.setenv("STREAMTOPO_WEBHOOK_CERT_DIR", str(tmp_path))
    monkeypatch.setenv("STREAMTOPO_WEBHOOK_ADDR", "127.0.0.1")
    monkeypatch.setenv("STREAMTOPO_WEBHOOK_PORT", str(port))
    monkeypatch.setenv("STREAMTOPO_ALLOWED_IMAGES", "registry.example.com/streaming/")
    cases = fuzz_cases()
    assert len(cases) >= 300
    with operator(kube, monkeypatch):
        wait_for(lambda: listening(port), what="the webhook server")
        webhook = Webhook(port, ca)

        assert webhook.review(topology())["allowed"] is True
        for case, document, field in cases:
            answer = webhook.review(document)
            assert answer["allowed"] is False, case
            message = answer["status"]["message"]
            assert named(field, message), (case, message)
            assert answer["status"]["code"] == 422 and "Traceback" not in message and "nan" != message.strip()

        # The platform's policy applies at the door: an image outside the allowed registries.
        foreign = topology()
        foreign["spec"]["image"] = "docker.io/attacker/miner:latest"
        answer = webhook.review(foreign)
        assert answer["allowed"] is False and "spec.image" in answer["status"]["message"]
        foreign["spec"]["image"] = "registry.example.com/streaming/runtime:1.0"
        assert webhook.review(foreign)["allowed"] is True

        # An update that changes the spec is checked; one that keeps it (kopf's finalizer, a deletion) is
        # admitted even when the spec would not be today, so such a topology stays deletable.
        bad = topology()
        bad["spec"]["keyGroups"] = 0
        assert webhook.review(bad, "UPDATE", old=topology())["allowed"] is False
        finalizing = json.loads(json.dumps(bad))
        finalizing["metadata"]["finalizers"] = []
        assert webhook.review(finalizing, "UPDATE", old=bad)["allowed"] is True
