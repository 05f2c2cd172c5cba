"""Sharing on a cluster (kopf against kmock's emulator, a real Valkey): two opted-in topologies found one
managed shared StreamTopology that each deploys as a reader of; it trims its stream past both readers'
offsets; it outlives one consumer and goes with the last, stream included. A cycle creates nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
import yaml
from controller_testkit import EmulatedKubernetes, wait_for
from test_kopf_kmock import CR_PATH, NS, cluster, condition, operator, pods, status
from test_sharing import topology

from streamtopo.contracts import Keys, UnitRecord
from streamtopo.documents import load_topology
from streamtopo.runtime.embedded import EmbeddedValkey

pytestmark = [pytest.mark.kube, pytest.mark.timeout(180)]

ADMIN = "4dmin-Pa55"


def opted_in(name: str, window: str) -> dict[str, Any]:
    doc = topology(name, window=window)
    doc["metadata"] = {"name": name, "namespace": NS}  # the API server sets uid and creation time
    return doc


def shared_parts(kube: EmulatedKubernetes) -> list[dict[str, Any]]:
    return kube.list(CR_PATH, "streamtopo.dev/shared=true")


def deployed(kube: EmulatedKubernetes, name: str) -> Any:
    """The topology the operator deployed for ``name`` (its routing ConfigMap), once there is one."""
    cm = kube.get(f"/api/v1/namespaces/{NS}/configmaps/{name}-routing")
    return load_topology(yaml.safe_load(cm["data"]["topology.yaml"])) if cm else None


@pytest.fixture
def valkey(monkeypatch: pytest.MonkeyPatch) -> Iterator[redis.Redis]:
    server = EmbeddedValkey().start()
    try:
        redis.Redis.from_url(server.url).config_set("requirepass", ADMIN)
        monkeypatch.setenv("STREAMTOPO_TRANSPORT_URL", server.url)
        monkeypatch.setenv("STREAMTOPO_TRANSPORT_ADMIN_PASSWORD", ADMIN)
        monkeypatch.setenv("STREAMTOPO_TRIM_SECONDS", "0.5")
        yield redis.Redis.from_url(server.url, password=ADMIN)
    finally:
        server.stop()


def test_two_opted_in_topologies_share_one_part_that_lives_while_a_consumer_does(
    kube: EmulatedKubernetes, monkeypatch: pytest.MonkeyPatch, valkey: redis.Redis
):
    cluster(kube)
    with operator(kube, monkeypatch):
        for name, window in (("a", "10s"), ("b", "20s")):
            kube.create(CR_PATH, opted_in(name, window))
        part = wait_for(
            lambda: next(
                (p for p in shared_parts(kube) if len(p["metadata"].get("ownerReferences", [])) == 2), None
            ),
            what="one shared topology owned by both",
        )
        assert len(shared_parts(kube)) == 1
        shared = part["metadata"]["name"]
        assert sorted(r["name"] for r in part["metadata"]["ownerReferences"]) == ["a", "b"]

        # Each consumer runs its own operators and reads the prefix's result; the part runs the prefix.
        consumers = {n: wait_for(lambda n=n: deployed(kube, n), what=f"{n} deployed") for n in ("a", "b")}
        stream = consumers["a"].spec.operator("tag").source.stream
        for name, consumer in consumers.items():
            assert [op.name for op in consumer.spec.operators] == ["tag", f"agg-{name}", "out"]
            assert consumer.spec.operator("tag").source.stream == stream
            assert wait_for(lambda n=name: status(kube, n).get("sharing"), what="status.sharing") == {
                "sharedTopology": shared,
                "reads": [stream],
            }
        prefix = wait_for(lambda: deployed(kube, shared), what="the shared topology deployed")
        assert sorted(op.kind for op in prefix.spec.operators) == ["filter", "map", "sink", "source"]
        assert wait_for(lambda: pods(kube, shared), what="the shared topology's executors")
        assert wait_for(lambda: status(kube, shared).get("sharing"), what="consumers") == {
            "consumers": ["a", "b"]
        }
        # The user's specs are untouched: sharing is what the operator deploys, not what the tenant wrote.
        assert len(kube.get(f"{CR_PATH}/a")["spec"]["operators"]) == 5

        # The stream is trimmed only past what both readers have committed.
        key = Keys(shared, NS).sink_stream(stream)
        ids = [valkey.xadd(key, {"n": i}).decode() for i in range(10)]
        for name, last in (("a", 7), ("b", 4)):
            unit = Keys(name, NS).unit("tag/0")
            valkey.hset(unit, "rec", UnitRecord(offsets={key: ids[last]}).encode())
        wait_for(lambda: valkey.xlen(key) == 6, what="the stream trimmed to b's offset")
        assert valkey.xrange(key)[0][0].decode() == ids[4]

        kube.delete(f"{CR_PATH}/a")
        wait_for(lambda: kube.get(f"{CR_PATH}/a") is None, what="a deleted")
        part = wait_for(
            lambda: next((p for p in shared_parts(kube) if len(p["metadata"]["ownerReferences"]) == 1), None),
            what="the shared topology kept for b",
        )
        assert part["metadata"]["ownerReferences"][0]["name"] == "b"
        wait_for(lambda: status(kube, shared).get("sharing") == {"consumers": ["b"]}, what="consumers: b")
        assert valkey.exists(key)

        kube.delete(f"{CR_PATH}/b")
        wait_for(lambda: not shared_parts(kube), what="the shared topology deleted with its last consumer")
        wait_for(lambda: not valkey.exists(key), what="its stream removed")


def test_a_cycle_between_opted_in_topologies_creates_nothing(
    kube: EmulatedKubernetes, monkeypatch: pytest.MonkeyPatch
):
    cluster(kube)
    a, b = opted_in("a", "10s"), opted_in("b", "20s")
    a["spec"]["operators"][0]["source"] = {"stream": "y"}
    a["spec"]["operators"][-1]["sink"] = {"stream": "x"}
    b["spec"]["operators"][0]["source"] = {"stream": "x"}
    b["spec"]["operators"][-1]["sink"] = {"stream": "y"}
    with operator(kube, monkeypatch):
        kube.create(CR_PATH, a)
        kube.create(CR_PATH, b)
        for name in ("a", "b"):
            refused = wait_for(lambda n=name: condition(kube, "Planned", n).get("reason"), what="refused")
            assert refused == "InvalidSpec"
            message = condition(kube, "Planned", name)["message"]
            assert "spec.sharing" in message and "cycle" in message
        assert not shared_parts(kube)
        assert not pods(kube, "a") and not pods(kube, "b")
