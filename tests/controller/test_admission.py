"""The validating admission webhook, served by the operator (kopf) over HTTPS on loopback, answering
AdmissionReview requests as the API server sends them: the fuzz suite's malformed topologies are denied
naming the field, valid ones admitted, and updates that leave the spec alone always admitted.

The fuzz cases are posted the way the API server would post them; the last test goes through the API:
the chart's ValidatingWebhookConfiguration in the emulator, whose admission shim calls the webhook on
create (controller_testkit.py).
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


def test_the_api_refuses_a_bad_topology_through_the_charts_webhook_configuration(
    kube: EmulatedKubernetes, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    """The chart's ValidatingWebhookConfiguration (pointed at the loopback server instead of the
    Service) in the emulator, which calls it on create as the API server does: `kubectl apply` of a bad
    StreamTopology fails with the fields named and nothing is stored; a good one is created and run."""
    import base64
    import urllib.error

    from test_kopf_kmock import CR_PATH, cluster, pods

    from streamtopo.controller.manifests import render_chart

    ca = certificate(tmp_path)
    port = free_port()
    monkeypatch.setenv("STREAMTOPO_WEBHOOK_CERT_DIR", str(tmp_path))
    monkeypatch.setenv("STREAMTOPO_WEBHOOK_ADDR", "127.0.0.1")
    monkeypatch.setenv("STREAMTOPO_WEBHOOK_PORT", str(port))
    (config,) = [d.obj for d in render_chart({}) if d.kind == "ValidatingWebhookConfiguration"]
    config["webhooks"][0]["clientConfig"] = {
        "url": f"https://127.0.0.1:{port}/{WEBHOOK_PATH}",
        "caBundle": base64.b64encode(ca.read_bytes()).decode(),
    }
    cluster(kube)
    with operator(kube, monkeypatch):
        wait_for(lambda: listening(port), what="the webhook server")
        kube.create("/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations", config)
        bad = topology()
        bad["spec"]["operators"][1]["select"] = ["reflect('java.lang.Runtime', 'getRuntime')"]
        bad["spec"]["keyGroups"] = 0
        with pytest.raises(urllib.error.HTTPError) as refused:
            kube.create(CR_PATH, bad)
        body = json.loads(refused.value.read())
        assert refused.value.code == 422
        assert 'admission webhook "validate.streamtopologies.streamtopo.dev" denied' in body["message"]
        assert "spec.keyGroups" in body["message"] and "spec.operators[1].select" in body["message"]
        assert "reflect(), which is not an allowed function" in body["message"]
        assert kube.get(f"{CR_PATH}/pipe") is None
        kube.create(CR_PATH, topology())
        wait_for(lambda: pods(kube), what="the admitted topology's pods")
        # Stop only once kopf has recorded the creation as handled: stopping while the handler still
        # writes status made kopf start the daemon again during shutdown and time out (seen twice in CI).
        wait_for(
            lambda: (
                "streamtopo.dev/last-handled-configuration"
                in ((kube.get(f"{CR_PATH}/pipe") or {}).get("metadata", {}).get("annotations") or {})
            ),
            what="the creation handled",
        )
